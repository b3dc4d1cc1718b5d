"""The HTTP side of `gpumon serve`: the metrics, a landing page, health endpoints, TLS, auth.

It behaves as the exporters admins already run (node_exporter, dcgm-exporter): the
metrics at ``--web.telemetry-path`` (``/metrics``), an HTML landing page at ``/``,
``/-/healthy`` and ``/-/ready`` as Prometheus has them, 404 for every other path, GET and
HEAD; basic auth, TLS and extra headers from an exporter-toolkit web configuration.  No
``Server`` header: node_exporter sends none, and a version is a hint to an attacker.

Why not ``prometheus_client.start_http_server`` itself: it wraps the listening socket, so
the TLS handshake runs inside ``accept()`` on the one serving thread, and a client that
connects and says nothing holds every other scrape.  Here connections come in through
``door.py`` (a silent client holds no thread, a slow one is cut at a deadline), and
credentials are checked by ``auth.py`` (a wrong password costs its sender, not the next
scrape).  A client that stays silent, resets or fails its handshake is counted by kind
(``gpumon_http_connection_errors_total``) and logged at debug level, never a traceback on
stderr.
"""

from __future__ import annotations

import errno
import gzip
import ipaddress
import os
import socket
import ssl
import stat
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any, Protocol, cast
from urllib.parse import parse_qs
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from gpumon import __version__
from gpumon.errors import ConfigError, GpumonError
from gpumon.faces.serve.auth import FAILURE_REFILL_S, BasicAuth, RateLimit, Verdict
from gpumon.faces.serve.config import ServeConfig
from gpumon.faces.serve.door import CONNECTION_ERROR_KINDS as CONNECTION_ERROR_KINDS
from gpumon.faces.serve.door import ConnectionStats as ConnectionStats  # MetricsServer takes one
from gpumon.faces.serve.door import FrontDoorMixIn, error_kind
from gpumon.faces.serve.exposition import choose
from gpumon.files import PEM_LIMIT, checked_path

_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}


class Pages(Protocol):
    """What the server asks the daemon: the landing page and whether sampling is fresh."""

    def landing(self, telemetry_path: str) -> str: ...

    def ready(self) -> tuple[bool, str]: ...


# --------------------------------------------------------------------------- the application
_Response = tuple[str, list[tuple[str, str]], bytes]


def _text(status: str, body: str, extra: list[tuple[str, str]] | None = None) -> _Response:
    headers = [("Content-Type", "text/plain; charset=utf-8"), *(extra or [])]
    return status, headers, body.encode()


class WebApp:
    """The WSGI application: auth, rate limit and headers around a handful of routes."""

    def __init__(
        self, cfg: ServeConfig, registry: CollectorRegistry, pages: Pages | None = None
    ) -> None:
        self.cfg = cfg
        self.registry = registry
        self.pages = pages
        self.auth = BasicAuth(cfg.basic_auth_users) if cfg.basic_auth_users else None
        self.limit = (
            RateLimit(cfg.rate_limit_interval_s, cfg.rate_limit_burst)
            if cfg.rate_limit_interval_s > 0
            else None
        )
        self.headers = list(cfg.http_headers)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        status, headers, body = self._respond(environ, method)
        headers = [*headers, *self.headers, ("Content-Length", str(len(body)))]
        start_response(status, headers)
        return [] if method == "HEAD" else [body]

    def _respond(self, environ: dict[str, Any], method: str) -> _Response:
        if self.auth is not None:
            verdict = self.auth.check(
                environ.get("HTTP_AUTHORIZATION"), environ.get("REMOTE_ADDR", "")
            )
            if verdict is Verdict.THROTTLED:
                return _text(
                    "429 Too Many Requests",
                    "Too many failed logins from this address\n",
                    [("Retry-After", f"{FAILURE_REFILL_S:g}")],
                )
            if verdict is not Verdict.OK:
                return _text("401 Unauthorized", "Unauthorized\n", [("WWW-Authenticate", "Basic")])
        # After the credentials: only requests that passed them spend the shared bucket.
        if self.limit is not None and not self.limit.allow():
            return _text("429 Too Many Requests", "Too Many Requests\n")
        if method not in ("GET", "HEAD"):
            return _text("405 Method Not Allowed", "Method Not Allowed\n", [("Allow", "GET, HEAD")])
        path = environ.get("PATH_INFO", "") or "/"
        if path == self.cfg.telemetry_path:
            return self._metrics(environ)
        if path == "/-/healthy":
            return _text("200 OK", "gpumon is Healthy.\n")
        if path == "/-/ready":
            ok, why = (True, "") if self.pages is None else self.pages.ready()
            if ok:
                return _text("200 OK", "gpumon is Ready.\n")
            return _text("503 Service Unavailable", f"gpumon is not ready: {why}\n")
        if path == "/":
            page = (
                self.pages.landing(self.cfg.telemetry_path)
                if self.pages is not None
                else _minimal_landing(self.cfg.telemetry_path)
            )
            return "200 OK", [("Content-Type", "text/html; charset=utf-8")], page.encode()
        return _text("404 Not Found", "404 page not found\n")

    def _metrics(self, environ: dict[str, Any]) -> _Response:
        """The exposition in the format asked for (Accept), only the series named by
        ``name[]`` when given, gzip-compressed where the client accepts it."""
        encoder, content_type = choose(environ.get("HTTP_ACCEPT", ""))
        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        body = encoder(_Only(self.registry, set(names)) if names else self.registry)
        headers = [("Content-Type", content_type), ("Vary", "Accept-Encoding")]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            body = gzip.compress(body)
            headers.append(("Content-Encoding", "gzip"))
        return "200 OK", headers, body


class _Only:
    """The registry's families, keeping only those series ``names`` asks for: a family by
    its name (a histogram's buckets, sum and count) or its series by theirs (``_total``)."""

    def __init__(self, registry: CollectorRegistry, names: set[str]) -> None:
        self.registry = registry
        self.names = names

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            if family.name in self.names:
                yield family
                continue
            samples = [s for s in family.samples if s.name in self.names]
            if samples:
                kept = Metric(family.name, family.documentation, family.type, family.unit)
                kept.samples = samples
                yield kept


def gzip_accepted(header: str) -> bool:
    """Whether an Accept-Encoding header accepts gzip (RFC 9110: ``q=0`` refuses it, ``*``
    stands for every coding not named)."""
    named: dict[str, float] = {}
    for item in header.split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if coding:
            named[coding.lower()] = q
    for coding in ("gzip", "x-gzip", "*"):
        if coding in named:
            return named[coding] > 0
    return False


def _minimal_landing(telemetry_path: str) -> str:
    return (
        f"<!DOCTYPE html><html><head><title>gpumon</title></head><body><h1>gpumon "
        f'{__version__}</h1><p><a href="{telemetry_path}">Metrics</a></p></body></html>\n'
    )


# --------------------------------------------------------------------------- connections
class _QuietServerHandler(ServerHandler):
    """wsgiref's response writer, with its exception report counted instead of printed."""

    server_software = ""  # no Server header (wsgiref would send its and Python's version)
    stats: ConnectionStats | None = None

    def log_exception(self, exc_info: Any) -> None:
        if self.stats is not None:
            self.stats.count(error_kind(exc_info[1]), exc_info[1])


class _Handler(WSGIRequestHandler):
    """One request per connection (HTTP/1.0), no access log, faults counted."""

    timeout = None  # the front door's deadline holds (a timeout per read would not)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_response(self, code: int, message: str | None = None) -> None:
        """The status line and Date, without the Server header (a 400 or 414 goes out here)."""
        self.send_response_only(code, message)
        self.send_header("Date", self.date_time_string())

    def handle(self) -> None:
        self.raw_requestline = self.rfile.readline(65537)
        if not self.raw_requestline:  # connected and closed without a word (a port check)
            return
        if len(self.raw_requestline) > 65536:
            self.requestline, self.request_version, self.command = "", "", ""
            self.send_error(414)
            return
        if not self.parse_request():  # answered with 400 already
            return
        if not self.server.answering():  # type: ignore[attr-defined]
            return  # cut by the front door meanwhile
        handler = _QuietServerHandler(
            self.rfile,
            cast(IO[bytes], self.wfile),
            self.get_stderr(),
            self.get_environ(),
            multithread=True,
        )
        handler.stats = self.server.stats  # type: ignore[attr-defined]
        handler.request_handler = self  # type: ignore[attr-defined]
        handler.run(self.server.get_app())  # type: ignore[attr-defined]


class _Server(FrontDoorMixIn, WSGIServer):
    allow_reuse_address = True


def _v6(host: str) -> bool:
    return ":" in host


def tls_context(cfg: ServeConfig) -> ssl.SSLContext:
    """Server context: our certificate; with a client CA, verify (and require) clients."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _TLS_VERSIONS[cfg.tls_min_version]
    ctx.maximum_version = _TLS_VERSIONS[cfg.tls_max_version]
    try:
        with (
            checked_path(cfg.tls_cert_file or "", PEM_LIMIT) as cert,
            checked_path(cfg.tls_key_file, PEM_LIMIT) as key,
        ):
            ctx.load_cert_chain(certfile=cert or "", keyfile=key)
    except (OSError, ssl.SSLError) as exc:
        # A configuration error (exit 2): restarting would not fix it.
        raise ConfigError(
            f"cannot load the TLS certificate {cfg.tls_cert_file} / key {cfg.tls_key_file}: "
            f"{getattr(exc, 'strerror', None) or exc}."
        ) from None
    if cfg.tls_client_ca_file is not None or cfg.tls_client_ca_pem is not None:
        what = cfg.tls_client_ca_file or "(inline client_ca)"
        try:
            with checked_path(cfg.tls_client_ca_file, PEM_LIMIT) as ca:
                ctx.load_verify_locations(cafile=ca, cadata=cfg.tls_client_ca_pem)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load the client CA {what}: {getattr(exc, 'strerror', None) or exc}."
            ) from None
        ctx.verify_mode = ssl.CERT_REQUIRED if cfg.tls_client_auth_required else ssl.CERT_OPTIONAL
    return ctx


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost'; a name or a wildcard is not."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def exposure_warning(cfg: ServeConfig) -> str | None:
    """One sentence when the metrics are reachable beyond this host with no TLS or auth."""
    if is_loopback(cfg.address) or (cfg.tls and cfg.basic_auth):
        return None
    missing = " or ".join(
        w for w, have in (("TLS", cfg.tls), ("authentication", cfg.basic_auth)) if not have
    )
    return (
        f"gpumon: warning: serving on {cfg.address}:{cfg.port}, beyond this host, without "
        f"{missing}; anyone who reaches the port reads the node's jobs (set tls_server_config "
        "and basic_auth_users in a --web.config.file, or listen on 127.0.0.1)."
    )


def key_file_warning(cfg: ServeConfig) -> str | None:
    """One sentence when the TLS key can be read by every user of the node."""
    if not cfg.tls or cfg.tls_key_file is None:
        return None
    try:
        mode = os.stat(cfg.tls_key_file).st_mode
    except OSError:
        return None  # tls_context() has said why already
    if not mode & stat.S_IROTH:
        return None
    return (
        f"gpumon: warning: the TLS key {cfg.tls_key_file} is readable by every user of "
        f"this node (mode {stat.S_IMODE(mode):04o}), so any of them can pose as this "
        f"daemon; make it readable by gpumon only (chmod o-r {cfg.tls_key_file})."
    )


class MetricsServer:
    """Serves ``registry`` (and the other pages) on ``cfg.address:cfg.port`` from a thread."""

    def __init__(
        self,
        cfg: ServeConfig,
        registry: CollectorRegistry,
        *,
        pages: Pages | None = None,
        stats: ConnectionStats | None = None,
    ) -> None:
        ctx = tls_context(cfg) if cfg.tls else None  # bad files fail before binding
        self.stats = stats if stats is not None else ConnectionStats()
        family = socket.AF_INET6 if _v6(cfg.address) else socket.AF_INET
        server_cls: type[_Server] = type("GpumonServer", (_Server,), {"address_family": family})
        try:
            self.httpd: _Server = make_server(
                cfg.address,
                cfg.port,
                WebApp(cfg, registry, pages),
                server_cls,
                handler_class=_Handler,
            )
        except OSError as exc:
            raise GpumonError(_bind_error(cfg, exc)) from None
        self.httpd.ssl_context = ctx
        self.httpd.stats = self.stats
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="gpumon-http", daemon=True
        )

    def start(self) -> MetricsServer:
        self.thread.start()
        return self

    def close(self) -> None:
        if self.thread.is_alive():  # shutdown() waits for serve_forever: never if not started
            self.httpd.shutdown()
        self.httpd.server_close()


def _bind_error(cfg: ServeConfig, exc: OSError) -> str:
    where = f"{cfg.address}:{cfg.port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {where}: the port is already in use (another gpumon or "
            "exporter?); choose another with --web.listen-address HOST:PORT or [http] port."
        )
    if exc.errno == errno.EACCES:
        return f"cannot listen on {where}: permission denied (ports below 1024 need root)."
    if exc.errno in (errno.EADDRNOTAVAIL, socket.EAI_NONAME) or isinstance(exc, socket.gaierror):
        return f"cannot listen on {where}: no such local address."
    return f"cannot listen on {where}: {exc.strerror or exc}."
