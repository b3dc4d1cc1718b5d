"""`gpumon serve`'s configuration: defaults, overrides, and errors that name key and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumon.errors import ConfigError
from gpumon.faces.serve import config as c


def err(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        c.parse(text, "gpumon.toml")
    assert info.value.exit_status == 2
    return str(info.value)


def test_missing_default_file_means_defaults(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(c, "DEFAULT_PATH", tmp_path / "absent.toml")
    cfg = c.load(None)
    assert cfg == c.ServeConfig()
    assert (cfg.address, cfg.port, cfg.interval_s) == ("127.0.0.1", 9977, 1.0)
    assert cfg.port not in (9400, 9835, 8000)  # dcgm-exporter, nvidia_gpu_exporter, nvitop


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such configuration file"):
        c.load(str(tmp_path / "absent.toml"))


def test_full_file(tmp_path: Path) -> None:
    p = tmp_path / "g.toml"
    p.write_text(
        '[http]\naddress = "::1"\nport = 9100\ntls_cert_file = "/c.pem"\n'
        'tls_key_file = "/k.pem"\ntls_client_ca_file = "/ca.pem"\n'
        "tls_client_auth_required = false\n"
        "[sampling]\ninterval_s = 0.1\n"
        '[log]\npath = ""\nsummary_interval_s = 60\n'
        '[jobs]\nsources = ["slurm"]\nlinger_s = 5\nmax_jobs = 3\n'
    )
    cfg = c.load(str(p))
    assert cfg.address == "::1" and cfg.port == 9100 and cfg.tls
    assert cfg.tls_client_ca_file == "/ca.pem" and cfg.tls_client_auth_required is False
    assert cfg.interval_s == 0.1 and cfg.log_path is None and cfg.summary_interval_s == 60
    assert cfg.job_sources == ("slurm",) and cfg.job_linger_s == 5 and cfg.max_jobs == 3


def test_syntax_error_has_the_line() -> None:
    msg = err("[http]\nport = 9977\naddress = \n")
    assert "line 3" in msg and "gpumon.toml" in msg and "did not start" in msg


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("[http]\nport = 99999\n", "gpumon.toml:2: [http] port: must be an integer"),
        ('[http]\nport = "9977"\n', "gpumon.toml:2: [http] port"),
        ("[sampling]\n\ninterval_s = 0\n", "gpumon.toml:3: [sampling] interval_s: must be between"),
        ("[sampling]\ninterval_s = true\n", "gpumon.toml:2: [sampling] interval_s"),
        (
            '# c\n[jobs]\nsources = ["slurm", "lsf"]\n',
            "gpumon.toml:3: [jobs] sources: unknown source 'lsf'",
        ),
        ("[http]\nprot = 1\n", "gpumon.toml:2: [http] prot: unknown key (known: address, port"),
        ("\n\n[htp]\nport = 1\n", "gpumon.toml:3: [htp]: unknown section"),
        ("sampling.interval_s = -1\n", "gpumon.toml:1: [sampling] interval_s"),
        (
            '[http]\ntls_cert_file = "/c"\n',
            "gpumon.toml:2: [http] tls_cert_file: needs tls_key_file",
        ),
        (
            '[http]\ntls_client_ca_file = "/ca"\n',
            "[http] tls_client_ca_file: client certificates (mTLS) need",
        ),
        ("http = 3\n", "[http]: must be a table"),
    ],
)
def test_bad_values_name_key_and_line(text: str, where: str) -> None:
    assert where in err(text)


def test_key_line_finds_quoted_and_dotted_keys() -> None:
    text = '[a]\nx = 1\n[ "b" ]\n"y" = 2\n'
    assert c.key_line(text, "a", "x") == 2
    assert c.key_line(text, "b", "y") == 4
    assert c.key_line(text, "b") == 3
    assert c.key_line(text, "b", "zz") is None


@pytest.mark.parametrize(
    ("listen", "host", "port"),
    [
        ("127.0.0.1:9977", "127.0.0.1", 9977),
        (":80", "0.0.0.0", 80),
        ("[::1]:9", "::1", 9),
        ("node-1.example:1234", "node-1.example", 1234),
    ],
)
def test_listen_forms(listen: str, host: str, port: int) -> None:
    assert c.parse_listen(listen) == (host, port)


@pytest.mark.parametrize("listen", ["9977", "host:", "host:70000", "::1:9977"])
def test_bad_listen(listen: str) -> None:
    with pytest.raises(ConfigError, match="--listen"):
        c.parse_listen(listen)


def test_command_line_wins() -> None:
    base = c.parse('[http]\nport = 1000\n[log]\npath = "/a"\n[sampling]\ninterval_s = 5\n')
    cfg = c.with_overrides(base, listen="0.0.0.0:2000", log="/b", interval_s=0.5)
    assert (cfg.address, cfg.port, cfg.log_path, cfg.interval_s) == ("0.0.0.0", 2000, "/b", 0.5)
    assert c.with_overrides(base, log="").log_path is None
    assert c.with_overrides(base) == base
    with pytest.raises(ConfigError, match="--interval"):
        c.with_overrides(base, interval_s=0.001)
