"""``--http.config.file``: how to reach a secured Prometheus, as promtool and amtool take it.

The file is Prometheus' ``http_config`` (YAML): ``basic_auth`` (``username``,
``username_file``, ``password``, ``password_file``), ``authorization`` (``type``,
``credentials``, ``credentials_file``), the older ``bearer_token`` and
``bearer_token_file``, and ``tls_config`` (``ca_file``, ``cert_file``, ``key_file``,
``server_name``, ``insecure_skip_verify``, ``min_version``).  Relative file names are read
from the file's folder, as Prometheus reads them.  What gpumon does not do (OAuth 2,
proxies, inline certificates) is refused by name, not ignored: a report sent without the
credentials the admin wrote down would fail later and less clearly.  Every error names
the file, the line and the key.
"""

from __future__ import annotations

import base64
import ssl
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpumon.errors import ConfigError
from gpumon.files import CONFIG_LIMIT, PEM_LIMIT, SECRET_LIMIT, checked_path, read_text_bounded

_UNSUPPORTED = {
    "oauth2": "OAuth 2 is not supported by gpumon report; use a bearer token file",
    "proxy_url": "proxies are not supported by gpumon report",
    "proxy_from_environment": "proxies are not supported by gpumon report",
    "no_proxy": "proxies are not supported by gpumon report",
    "proxy_connect_header": "proxies are not supported by gpumon report",
    "http_headers": "extra headers are not supported by gpumon report",
}
_ACCEPTED_IGNORED = ("follow_redirects", "enable_http2")
_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """What to send and how to verify: no field set means plain, anonymous HTTP(S)."""

    authorization: str | None = None  # the Authorization header's value
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    insecure_skip_verify: bool = False
    min_version: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context for https:// URLs (the system's CAs unless ``ca_file``)."""
        with (
            checked_path(self.ca_file, PEM_LIMIT) as ca,
            checked_path(self.cert_file, PEM_LIMIT) as cert,
            checked_path(self.key_file, PEM_LIMIT) as key,
        ):
            ctx = ssl.create_default_context(cafile=ca)
            if self.insecure_skip_verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if cert:
                ctx.load_cert_chain(cert, key)
        if self.min_version:
            ctx.minimum_version = _TLS_VERSIONS[self.min_version]
        return ctx


class _Doc:
    """A YAML document with positions, for errors that say where."""

    def __init__(self, path: str, base: Path) -> None:
        self.path = path
        self.base = base

    def error(self, node: yaml.Node, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}:{node.start_mark.line + 1}: {key}: {message}")

    def mapping(self, node: yaml.Node, key: str, allowed: tuple[str, ...]) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, key, "must be a mapping")
        out: dict[str, yaml.Node] = {}
        for k, v in node.value:
            name = str(k.value)
            full = f"{key}.{name}" if key else name
            if name in out:
                raise self.error(k, full, "is given twice")
            if name in _UNSUPPORTED and not key:
                raise self.error(k, full, _UNSUPPORTED[name])
            if name not in allowed:
                raise self.error(k, full, "is not a key of Prometheus' http_config")
            out[name] = v
        return out

    def string(self, node: yaml.Node, key: str) -> str:
        if not isinstance(node, yaml.ScalarNode) or not str(node.value):
            raise self.error(node, key, "must be a non-empty string")
        return str(node.value)

    def file(self, node: yaml.Node, key: str) -> str:
        p = Path(self.string(node, key)).expanduser()
        p = p if p.is_absolute() else self.base / p
        if not p.is_file():
            raise self.error(node, key, f"{p} is not a readable file")
        return str(p)

    def secret(self, node: yaml.Node, key: str) -> str:
        path = self.file(node, key)
        try:
            return read_text_bounded(path, SECRET_LIMIT).strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            raise self.error(node, key, f"cannot read {path} ({why})") from None


def parse(text: str, path: str = "<http config>") -> HttpConfig:
    """The configuration in ``text`` (read from ``path``), or a ConfigError saying where."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(
            f"{path}{line}: not valid YAML ({getattr(exc, 'problem', exc)})"
        ) from None
    if root is None:
        return HttpConfig()
    doc = _Doc(path, Path(path).resolve().parent)
    top = doc.mapping(
        root,
        "",
        (
            "basic_auth",
            "authorization",
            "bearer_token",
            "bearer_token_file",
            "tls_config",
            *_ACCEPTED_IGNORED,
        ),
    )
    auths = [
        k for k in ("basic_auth", "authorization", "bearer_token", "bearer_token_file") if k in top
    ]
    auths.sort(key=lambda k: top[k].start_mark.line)  # the later one is the error
    if len(auths) > 1:
        raise doc.error(top[auths[1]], auths[1], f"cannot be combined with {auths[0]}")
    header = None
    if "basic_auth" in top:
        header = _basic(doc, top["basic_auth"])
    elif "authorization" in top:
        header = _authorization(doc, top["authorization"])
    elif "bearer_token" in top:
        header = "Bearer " + doc.string(top["bearer_token"], "bearer_token")
    elif "bearer_token_file" in top:
        header = "Bearer " + doc.secret(top["bearer_token_file"], "bearer_token_file")
    tls: dict[str, object] = {}
    if "tls_config" in top:
        tls = _tls(doc, top["tls_config"])
    return HttpConfig(authorization=header, **tls)  # type: ignore[arg-type]


def _basic(doc: _Doc, node: yaml.Node) -> str:
    keys = ("username", "username_file", "password", "password_file")
    m = doc.mapping(node, "basic_auth", keys)
    if "username" in m and "username_file" in m:
        raise doc.error(
            m["username_file"], "basic_auth.username_file", "cannot be combined with username"
        )
    if "password" in m and "password_file" in m:
        raise doc.error(
            m["password_file"], "basic_auth.password_file", "cannot be combined with password"
        )
    if "username" in m:
        user = doc.string(m["username"], "basic_auth.username")
    elif "username_file" in m:
        user = doc.secret(m["username_file"], "basic_auth.username_file")
    else:
        raise doc.error(node, "basic_auth", "needs username or username_file")
    password = ""
    if "password" in m:
        password = doc.string(m["password"], "basic_auth.password")
    elif "password_file" in m:
        password = doc.secret(m["password_file"], "basic_auth.password_file")
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _authorization(doc: _Doc, node: yaml.Node) -> str:
    m = doc.mapping(node, "authorization", ("type", "credentials", "credentials_file"))
    kind = doc.string(m["type"], "authorization.type") if "type" in m else "Bearer"
    if "credentials" in m and "credentials_file" in m:
        raise doc.error(
            m["credentials_file"],
            "authorization.credentials_file",
            "cannot be combined with credentials",
        )
    if "credentials" in m:
        cred = doc.string(m["credentials"], "authorization.credentials")
    elif "credentials_file" in m:
        cred = doc.secret(m["credentials_file"], "authorization.credentials_file")
    else:
        raise doc.error(node, "authorization", "needs credentials or credentials_file")
    return f"{kind} {cred}"


def _tls(doc: _Doc, node: yaml.Node) -> dict[str, object]:
    inline = {"ca": "ca_file", "cert": "cert_file", "key": "key_file"}
    m = doc.mapping(
        node,
        "tls_config",
        (
            *inline,
            "ca_file",
            "cert_file",
            "key_file",
            "server_name",
            "insecure_skip_verify",
            "min_version",
            "max_version",
        ),
    )
    out: dict[str, object] = {}
    for k, instead in inline.items():
        if k in m:
            raise doc.error(
                m[k],
                f"tls_config.{k}",
                f"inline PEM is not supported by gpumon report; put it in a file for {instead}",
            )
    for k in ("ca_file", "cert_file", "key_file"):
        if k in m:
            out[k] = doc.file(m[k], f"tls_config.{k}")
    if ("cert_file" in out) != ("key_file" in out):
        missing = "key_file" if "cert_file" in out else "cert_file"
        raise doc.error(
            node, f"tls_config.{missing}", "is needed with the other of cert_file/key_file"
        )
    if "server_name" in m:
        out["server_name"] = doc.string(m["server_name"], "tls_config.server_name")
    if "insecure_skip_verify" in m:
        v = doc.string(m["insecure_skip_verify"], "tls_config.insecure_skip_verify").lower()
        if v not in ("true", "false"):
            raise doc.error(
                m["insecure_skip_verify"],
                "tls_config.insecure_skip_verify",
                "must be true or false",
            )
        out["insecure_skip_verify"] = v == "true"
    for k in ("min_version", "max_version"):
        if k in m:
            v = doc.string(m[k], f"tls_config.{k}")
            if v not in _TLS_VERSIONS:
                raise doc.error(
                    m[k], f"tls_config.{k}", f"must be one of {', '.join(_TLS_VERSIONS)}"
                )
            if k == "min_version":
                out[k] = v
    return out


def load(path: str) -> HttpConfig:
    try:
        text = read_text_bounded(path, CONFIG_LIMIT)
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"{path}: cannot read the HTTP configuration ({why})") from None
    return parse(text, path)
