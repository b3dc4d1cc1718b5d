"""The exporter-toolkit web configuration (``--web.config.file``) on text: what it reads,
what it refuses, and that every refusal names the file, the line and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumon.errors import ConfigError
from gpumon.faces.serve import config as c
from gpumon.faces.serve.webconfig import load, parse, parse_duration

# bcrypt hashes: of "secret" (made with bcrypt), and the toolkit example's $2y$ (htpasswd) one.
HASH = "$2b$10$LAXEOO7/ytnBEZyXUcNlNeVLpvL/M5SwfvuyAYMukPzBtjaHHptIa"
HASH_2Y = "$2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze"


def err(text: str, path: str = "/etc/gpumon/web.yml") -> str:
    with pytest.raises(ConfigError) as info:
        parse(text, path)
    return str(info.value)


def test_the_toolkits_own_example_reads() -> None:
    """The shape of the toolkit's docs/web-config.yml: TLS, two users, a rate limit."""
    web = parse(
        "# TLS and basic authentication configuration example.\n"
        "tls_server_config:\n"
        "  cert_file: server.crt\n"
        "  key_file: server.key\n"
        "basic_auth_users:\n"
        f"  alice: {HASH_2Y}\n"
        f"  bob: {HASH}\n"
        "rate_limit:\n"
        '  interval: "1s"\n'
        "  burst: 20\n",
        "/etc/gpumon/web.yml",
    )
    assert web.tls and web.tls_cert_file == "/etc/gpumon/server.crt"  # beside the file
    assert web.tls_key_file == "/etc/gpumon/server.key"
    assert dict(web.basic_auth_users) == {"alice": HASH_2Y, "bob": HASH}
    assert (web.rate_limit_interval_s, web.rate_limit_burst) == (1.0, 20)


def test_mtls_headers_and_versions() -> None:
    web = parse(
        "tls_server_config:\n"
        "  cert_file: /tls/gpumon.crt\n"
        "  key_file: /tls/gpumon.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        "  client_ca_file: /tls/ca.crt\n"
        "  min_version: TLS13\n"
        "  prefer_server_cipher_suites: true\n"
        "http_server_config:\n"
        "  http2: false\n"
        "  headers:\n"
        "    X-Frame-Options: deny\n"
        "    Strict-Transport-Security: max-age=31536000\n",
    )
    assert web.client_auth_type == "RequireAndVerifyClientCert"
    assert web.tls_client_ca_file == "/tls/ca.crt" and web.tls_min_version == "TLS13"
    assert web.headers == (
        ("X-Frame-Options", "deny"),
        ("Strict-Transport-Security", "max-age=31536000"),
    )
    cfg = c.with_web_config(c.ServeConfig(), web)
    assert cfg.tls and cfg.tls_client_auth_required and cfg.tls_client_ca_file == "/tls/ca.crt"
    assert cfg.http_headers == web.headers and cfg.tls_min_version == "TLS13"


def test_an_empty_file_is_plain_http() -> None:
    web = parse("# nothing yet\n")
    assert not web.tls and not web.basic_auth_users


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  cert_flie: c\n", ":4: "
         "tls_server_config.cert_flie: unknown key"),
        ("tls_server_config:\n  cert_file: a\n", ":2: tls_server_config.key_file: missing"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: Bogus\n",
         ":4: tls_server_config.client_auth_type: unknown policy 'Bogus'"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: "
         "RequireAnyClientCert\n", ":4: tls_server_config.client_auth_type: RequireAnyClientCert"
         " accepts client certificates without verifying"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: ca\n",
         ":4: tls_server_config.client_ca_file: a client CA is set but client_auth_type is "
         "NoClientCert"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: "
         "RequireAndVerifyClientCert\n", ":4: tls_server_config.client_auth_type: "
         "RequireAndVerifyClientCert needs client_ca_file"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS14\n",
         ":4: tls_server_config.min_version: unknown TLS version 'TLS14'"),
        ("tls_server_config:\n  cert: '-----BEGIN'\n", ":2: tls_server_config.cert: an inline "
         "certificate is not supported"),
        ("basic_auth_users:\n  alice: secret\n", ":2: basic_auth_users.alice: must be a bcrypt "
         "hash"),
        ("http_server_config:\n  headers:\n    Content-Type: foo\n", ":3: "
         "http_server_config.headers.Content-Type: this header cannot be set"),
        ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n", ":3: "
         "http_server_config.headers.X-Frame-Options: must be one of deny, sameorigin"),
        ("rate_limit:\n  interval: soon\n  burst: 2\n", ":2: rate_limit.interval: 'soon' is "
         "not a duration"),
        ("basic_auth:\n  alice: x\n", ":1: basic_auth: unknown key (known: tls_server_config"),
        (f"basic_auth_users:\n  alice: {HASH}\n  alice: {HASH}\n", ":3: basic_auth_users.alice:"
         " appears twice"),
        ("tls_server_config: [a, b]\n", ":1: tls_server_config: must be a mapping"),
        ("tls_server_config:\n  cert_file: [\n", ": not valid YAML"),
        # bcrypt refuses cost 03 and 99 at every login, and cost 31 takes days: at start.
        (f"basic_auth_users:\n  a: {HASH.replace('$10$', '$03$')}\n", ":2: basic_auth_users.a: "
         "bcrypt cost 03 is outside 4 to 16"),
        (f"basic_auth_users:\n  a: {HASH}\n  b: {HASH.replace('$10$', '$99$')}\n", ":3: "
         "basic_auth_users.b: bcrypt cost 99 is outside 4 to 16"),
        (f"basic_auth_users:\n  a: {HASH.replace('$10$', '$31$')}\n", ":2: basic_auth_users.a: "
         "bcrypt cost 31 is outside"),
        (f"basic_auth_users:\n  a: {HASH.replace('$2b$', '$2$')}\n", ":2: basic_auth_users.a: "
         "must be a bcrypt hash"),  # the format's shape, but no prefix bcrypt reads
        # A line break in a header value would write a header of the file's choosing.
        ('http_server_config:\n  headers:\n    Strict-Transport-Security: "max-age=1\\r\\n'
         'Set-Cookie: a=b"\n', ":3: http_server_config.headers.Strict-Transport-Security: "
         "'max-age=1\\r\\nSet-Cookie: a=b' has a line break"),
        ("http_server_config:\n  headers:\n    Content-Security-Policy: \"default-src 'self' "
         '\\u00e9"\n', ":3: http_server_config.headers.Content-Security-Policy: "),
    ],
)  # fmt: skip
def test_bad_files_name_line_and_key(text: str, where: str) -> None:
    message = err(text)
    assert message.startswith("/etc/gpumon/web.yml")
    assert where in message, message
    assert message.endswith("gpumon serve did not start.")


def test_tls_in_both_files_is_refused() -> None:
    toml = c.parse('[http]\ntls_cert_file = "/a.crt"\ntls_key_file = "/a.key"\n', "/g.toml")
    web = parse("tls_server_config:\n  cert_file: /b.crt\n  key_file: /b.key\n", "/w.yml")
    with pytest.raises(ConfigError, match=r"TLS is configured twice, in /g\.toml"):
        c.with_web_config(toml, web)


def test_toml_tls_keys_keep_working_beside_web_auth() -> None:
    toml = c.parse('[http]\ntls_cert_file = "/a.crt"\ntls_key_file = "/a.key"\n', "/g.toml")
    cfg = c.with_web_config(toml, parse(f"basic_auth_users:\n  prom: {HASH}\n"))
    assert cfg.tls_cert_file == "/a.crt" and cfg.basic_auth


def test_missing_file_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such web configuration file"):
        load(str(tmp_path / "absent.yml"))


@pytest.mark.parametrize(
    ("text", "seconds"), [("1s", 1.0), ("250ms", 0.25), ("1m30s", 90.0), ("0", 0.0), ("2h", 7200)]
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("path", ["metrics", "/", "/-/ready", "/a b", "/m?x"])
def test_bad_telemetry_paths(path: str) -> None:
    with pytest.raises(ConfigError, match=r"--web\.telemetry-path"):
        c.with_overrides(c.ServeConfig(), telemetry=path)


def test_telemetry_path_from_flag_and_toml() -> None:
    assert c.with_overrides(c.ServeConfig(), telemetry="/gpu/metrics").telemetry_path == (
        "/gpu/metrics"
    )
    assert c.parse('[http]\ntelemetry_path = "/x"\n').telemetry_path == "/x"
    with pytest.raises(ConfigError, match=r"<config>:2: \[http\] telemetry_path"):
        c.parse('[http]\ntelemetry_path = "x"\n')


def test_the_sample_hashes_verify_with_bcrypt() -> None:
    """The hashes above are real: the test data itself cannot be wrong."""
    import bcrypt

    assert bcrypt.checkpw(b"secret", HASH.encode())
