"""``--web.config.file``: the web configuration file node_exporter and most exporters share.

The format is the Prometheus exporter-toolkit's (YAML): ``tls_server_config`` (certificate,
key, client CA and policy, TLS versions), ``http_server_config`` (extra response headers),
``basic_auth_users`` (bcrypt hashes) and ``rate_limit``, so an admin reuses the file their
node_exporter already has.  It is checked whole before anything starts, strictly (an
unknown or duplicate key is an error, as the toolkit's strict YAML is), and every problem
names the file, the line and the key, as the TOML configuration's errors do.  Relative
file names are read from the configuration file's folder, as the toolkit reads them.

What gpumon cannot do the way the toolkit does (inline ``cert``/``key``, Go cipher-suite
and curve names, certificates accepted unverified) is refused by name rather than
silently ignored: a daemon on half a security configuration is worse than one that stops.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpumon.errors import ConfigError
from gpumon.files import CONFIG_LIMIT, read_text_bounded

# client_auth_type -> (a client CA is needed, a client certificate is required).
CLIENT_AUTH_TYPES = {
    "NoClientCert": (False, False),
    "VerifyClientCertIfGiven": (True, False),
    "RequireAndVerifyClientCert": (True, True),
}
# Accepted by the toolkit, refused here: Python's TLS verifies any certificate it asks for.
_UNVERIFIED_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
TLS_VERSIONS = ("TLS10", "TLS11", "TLS12", "TLS13")
# The only headers the toolkit lets a file set, and the values allowed where it limits them.
HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
_BCRYPT = re.compile(r"^\$2[abxy]?\$(\d{2})\$[./A-Za-z0-9]{53}$")
# The bcrypt costs accepted.  4 is bcrypt's least; each step doubles the work, and at 16 a
# check takes about 4 s on one core: above it, the first scrape with a password (checks
# that succeed are cached) would miss Prometheus' default 10 s scrape timeout, and cost 31
# would take days.  Outside the range every login would fail, or hang: refused at start.
BCRYPT_COSTS = range(4, 17)
# A header value: printable ASCII and spaces (no line break can smuggle a header in).
_HEADER_VALUE = re.compile(r"^[\x20-\x7e\t]*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

_TLS_KEYS = (
    "cert_file",
    "key_file",
    "client_ca_file",
    "client_ca",
    "client_auth_type",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
)
_TLS_UNSUPPORTED = {
    "cert": "an inline certificate is not supported by gpumon; put it in a file for cert_file",
    "key": "an inline key is not supported by gpumon; put it in a file for key_file",
    "cipher_suites": "Go cipher-suite names are not supported by gpumon (Python's TLS keeps "
    "OpenSSL's secure defaults); remove the key",
    "curve_preferences": "Go curve names are not supported by gpumon; remove the key",
    "client_allowed_sans": "matching client certificate SANs is not supported by gpumon; "
    "sign Prometheus' certificate with a CA of its own for client_ca_file",
}
_SECTIONS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")


@dataclass(frozen=True, slots=True)
class WebConfig:
    """What a web configuration file asks for; every field empty means plain HTTP."""

    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    tls_client_ca_pem: str | None = None
    client_auth_type: str = "NoClientCert"
    tls_min_version: str = "TLS12"
    tls_max_version: str = "TLS13"
    basic_auth_users: tuple[tuple[str, str], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    rate_limit_interval_s: float = 0.0
    rate_limit_burst: int = 0
    source: str | None = None

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None


# libyaml's composer where PyYAML has it: a large file (thousands of users) is read in a
# fraction of the pure-Python composer's time; both keep every node's line.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Doc:
    """The YAML node tree of one file, kept for the line of each key."""

    def __init__(self, text: str, path: str) -> None:
        self.path = path
        self._loader = yaml.SafeLoader("")
        try:
            self.root = yaml.compose(text, Loader=_LOADER)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else path
            problem = getattr(exc, "problem", None) or str(exc)
            raise ConfigError(
                f"{where}: not valid YAML: {problem}; gpumon serve did not start."
            ) from None

    def error(self, node: yaml.Node | None, key: str, reason: str) -> ConfigError:
        where = self.path if node is None else f"{self.path}:{node.start_mark.line + 1}"
        return ConfigError(f"{where}: {key}: {reason}; gpumon serve did not start.")

    def mapping(self, node: yaml.Node, key: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """The entries of a mapping node: name -> (key node, value node); strict."""
        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, key or "the file", "must be a mapping of keys to values")
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):
                raise self.error(k, key or "the file", "keys must be plain names")
            name = str(k.value)
            if name in out:
                raise self.error(k, _join(key, name), "appears twice")
            out[name] = (k, v)
        return out

    def value(self, node: yaml.Node) -> Any:
        try:
            return self._loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
            # A tag no one knows (!foo), a timestamp that is not a date: said, with the line.
            problem = getattr(exc, "problem", None) or str(exc)
            raise ConfigError(
                f"{self.path}:{node.start_mark.line + 1}: not a value gpumon reads: {problem}; "
                "gpumon serve did not start."
            ) from None


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def parse_duration(text: str) -> float:
    """A Go duration ("1s", "250ms", "1m30s", "0") in seconds; ValueError if it is not one."""
    s = text.strip()
    if s == "0":
        return 0.0
    if not s:
        raise ValueError("must not be empty")
    pos, total = 0, 0.0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if m is None:
            raise ValueError(f"{text!r} is not a duration such as 1s, 250ms or 1m30s")
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    return total


def parse(text: str, path: str = "<web config>") -> WebConfig:
    """Build a WebConfig from the file's text; any problem raises ConfigError naming the line."""
    doc = _Doc(text, path)
    if doc.root is None:  # an empty file: plain HTTP, no auth (as the toolkit reads it)
        return WebConfig(source=path)
    base = Path(path).parent
    values: dict[str, Any] = {}
    for section, (knode, vnode) in doc.mapping(doc.root, "").items():
        if section not in _SECTIONS:
            raise doc.error(knode, section, f"unknown key (known: {', '.join(_SECTIONS)})")
        if section == "tls_server_config":
            values.update(_tls(doc, vnode, base))
        elif section == "http_server_config":
            values.update(_http(doc, vnode))
        elif section == "basic_auth_users":
            values["basic_auth_users"] = _users(doc, vnode)
        else:
            values.update(_rate_limit(doc, vnode))
    return WebConfig(**values, source=path)


def _string(doc: _Doc, node: yaml.Node, key: str) -> str | None:
    """A string value; None for an empty (null or "") one."""
    value = doc.value(node)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise doc.error(node, key, f"must be a string, not {value!r}")
    return value


def _tls(doc: _Doc, node: yaml.Node, base: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    entries = doc.mapping(node, "tls_server_config")
    for name, (knode, vnode) in entries.items():
        key = f"tls_server_config.{name}"
        if name in _TLS_UNSUPPORTED:
            if doc.value(vnode) not in (None, "", []):
                raise doc.error(knode, key, _TLS_UNSUPPORTED[name])
            continue
        if name not in _TLS_KEYS:
            known = ", ".join((*_TLS_KEYS, *_TLS_UNSUPPORTED))
            raise doc.error(knode, key, f"unknown key (known: {known})")
        if name == "prefer_server_cipher_suites":
            if not isinstance(doc.value(vnode), bool):
                raise doc.error(knode, key, "must be true or false")
            continue
        value = _string(doc, vnode, key)
        if value is None:
            continue
        if name in ("cert_file", "key_file", "client_ca_file"):
            out[f"tls_{name}"] = str(base / value)
        elif name == "client_ca":
            out["tls_client_ca_pem"] = value
        elif name == "client_auth_type":
            if value in _UNVERIFIED_AUTH:
                raise doc.error(
                    knode,
                    key,
                    f"{value} accepts client certificates without verifying them, which "
                    "gpumon does not do; use RequireAndVerifyClientCert with client_ca_file",
                )
            if value not in CLIENT_AUTH_TYPES:
                raise doc.error(
                    knode, key, f"unknown policy {value!r} (known: {', '.join(CLIENT_AUTH_TYPES)})"
                )
            out["client_auth_type"] = value
        else:  # min_version, max_version
            if value not in TLS_VERSIONS:
                raise doc.error(
                    knode, key, f"unknown TLS version {value!r} (known: {', '.join(TLS_VERSIONS)})"
                )
            out[f"tls_{name}"] = value
    return _check_tls(doc, entries, out)


def _check_tls(
    doc: _Doc, entries: dict[str, tuple[yaml.Node, yaml.Node]], out: dict[str, Any]
) -> dict[str, Any]:
    """The toolkit's rules: both files; a client CA only with a policy that uses it."""

    def at(name: str) -> yaml.Node | None:
        return entries[name][0] if name in entries else None

    if not out:
        return out
    if "tls_cert_file" not in out or "tls_key_file" not in out:
        missing = "key_file" if "tls_cert_file" in out else "cert_file"
        first = next(iter(entries))
        raise doc.error(at(first), f"tls_server_config.{missing}", "missing (TLS needs both files)")
    policy = out.get("client_auth_type", "NoClientCert")
    has_ca = "tls_client_ca_file" in out or "tls_client_ca_pem" in out
    needs_ca, _ = CLIENT_AUTH_TYPES[policy]
    if has_ca and not needs_ca:
        name = "client_ca_file" if "client_ca_file" in entries else "client_ca"
        raise doc.error(
            at(name),
            f"tls_server_config.{name}",
            "a client CA is set but client_auth_type is NoClientCert; set it to "
            "RequireAndVerifyClientCert",
        )
    if needs_ca and not has_ca:
        raise doc.error(
            at("client_auth_type"),
            "tls_server_config.client_auth_type",
            f"{policy} needs client_ca_file (the CA that signs Prometheus' certificate)",
        )
    lo, hi = out.get("tls_min_version", "TLS12"), out.get("tls_max_version", "TLS13")
    if TLS_VERSIONS.index(lo) > TLS_VERSIONS.index(hi):
        raise doc.error(at("min_version"), "tls_server_config.min_version", f"{lo} is above {hi}")
    return out


def _http(doc: _Doc, node: yaml.Node) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (knode, vnode) in doc.mapping(node, "http_server_config").items():
        key = f"http_server_config.{name}"
        if name == "http2":  # gpumon serves HTTP/1: nothing to turn off
            if not isinstance(doc.value(vnode), bool):
                raise doc.error(knode, key, "must be true or false")
        elif name == "headers":
            headers = []
            for header, (hk, hv) in doc.mapping(vnode, key).items():
                hkey = f"{key}.{header}"
                if header not in HEADERS:
                    raise doc.error(
                        hk, hkey, f"this header cannot be set (allowed: {', '.join(HEADERS)})"
                    )
                value = _string(doc, hv, hkey)
                if value is None:
                    continue
                if not _HEADER_VALUE.match(value):
                    raise doc.error(
                        hk,
                        hkey,
                        f"{value!r} has a line break, a control or a non-ASCII character; a "
                        "header value is printable ASCII on one line",
                    )
                allowed = HEADERS[header]
                if allowed and value not in allowed:
                    raise doc.error(hk, hkey, f"must be one of {', '.join(allowed)}, not {value!r}")
                headers.append((header, value))
            out["headers"] = tuple(headers)
        else:
            raise doc.error(knode, key, "unknown key (known: http2, headers)")
    return out


def _users(doc: _Doc, node: yaml.Node) -> tuple[tuple[str, str], ...]:
    users = []
    for user, (knode, vnode) in doc.mapping(node, "basic_auth_users").items():
        key = f"basic_auth_users.{user}"
        hashed = _string(doc, vnode, key)
        match = _BCRYPT.match(hashed) if hashed is not None else None
        if hashed is None or match is None or not _readable(hashed):
            raise doc.error(knode, key, f"must be a bcrypt hash such as $2y$10$... ({_MAKE_ONE})")
        cost = int(match.group(1))
        if cost not in BCRYPT_COSTS:
            raise doc.error(
                knode,
                key,
                f"bcrypt cost {match.group(1)} is outside {BCRYPT_COSTS[0]} to "
                f"{BCRYPT_COSTS[-1]} (below, bcrypt refuses it; above, every check takes "
                f"more than a scrape may: {_MAKE_ONE})",
            )
        users.append((user, hashed))
    return tuple(users)


_MAKE_ONE = "make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n'"


def bcrypt_cost(hashed: str) -> int:
    """The cost of a hash this module accepted (the two digits after the prefix)."""
    match = _BCRYPT.match(hashed)
    assert match is not None
    return int(match.group(1))


def _readable(hashed: str) -> bool:
    """Whether bcrypt reads the hash's prefix and salt.  bcrypt judges only the prefix
    ("$2$" fits the format and bcrypt refuses it) and the salt's last character (its low
    bits must be zero); the rest of a hash that fits the format is always read.  So the
    check is made on a stand-in of the least cost with the same prefix and last salt
    character, once per such pair: instant, and a file of thousands of users costs no
    more than a few hundred checks."""
    prefix, _, rest = hashed[1:].partition("$")
    return _readable_shape(prefix, rest[3 + 21])


@functools.lru_cache(maxsize=512)
def _readable_shape(prefix: str, salt_last: str) -> bool:
    import bcrypt

    stand_in = f"${prefix}$04${'.' * 21}{salt_last}{'.' * 31}".encode()
    try:
        bcrypt.checkpw(b"", stand_in)
    except ValueError:
        return False
    return True


def _rate_limit(doc: _Doc, node: yaml.Node) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (knode, vnode) in doc.mapping(node, "rate_limit").items():
        key = f"rate_limit.{name}"
        value = doc.value(vnode)
        if name == "interval":
            try:
                seconds = parse_duration(str(value)) if isinstance(value, str | int) else None
            except ValueError as exc:
                raise doc.error(knode, key, str(exc)) from None
            if seconds is None:
                raise doc.error(knode, key, f"must be a duration such as 1s, not {value!r}")
            out["rate_limit_interval_s"] = seconds
        elif name == "burst":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise doc.error(knode, key, f"must be a whole number, not {value!r}")
            out["rate_limit_burst"] = value
        else:
            raise doc.error(knode, key, "unknown key (known: interval, burst)")
    if out.get("rate_limit_interval_s") and not out.get("rate_limit_burst"):
        raise doc.error(node, "rate_limit.burst", "must be at least 1 with an interval")
    return out


def load(path: str) -> WebConfig:
    """Read and check the file named with ``--web.config.file``."""
    try:
        text = read_text_bounded(path, CONFIG_LIMIT)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such web configuration file.") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"{path}: cannot read the web configuration: {reason}.") from None
    return parse(text, path)
