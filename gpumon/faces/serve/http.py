"""The HTTP side of `gpumon serve`: the metrics, a landing page, health endpoints, TLS, auth.

It behaves as the exporters admins already run (node_exporter, dcgm-exporter): the
metrics at ``--web.telemetry-path`` (``/metrics``), an HTML landing page at ``/``,
``/-/healthy`` and ``/-/ready`` as Prometheus has them, 404 for every other path, GET and
HEAD; basic auth, TLS and extra headers from an exporter-toolkit web configuration.

Why not ``prometheus_client.start_http_server`` itself: it wraps the listening socket, so
the TLS handshake runs inside ``accept()`` on the one serving thread, and a client that
connects and says nothing holds every other scrape.  Here each connection gets a thread
of its own (at most ``MAX_CONNECTIONS`` at once; the kernel's backlog of ``BACKLOG`` holds
the rest instead of resetting them) with a timeout.  A client that stays silent, resets
or fails its handshake is counted by kind (``gpumon_http_connection_errors_total``) and
logged at debug level, never a traceback on stderr.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import ipaddress
import logging
import socket
import ssl
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any, Protocol
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.registry import CollectorRegistry

from gpumon import __version__
from gpumon.errors import ConfigError, GpumonError
from gpumon.faces.serve.config import ServeConfig

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0
# The listen backlog: Prometheus, probes and curl loops connecting at once wait in it.
BACKLOG = 1024
# Connections served at once; more wait in the backlog.  Bounded so that a flood of
# clients cannot exhaust the unit's TasksMax (64) or memory.
MAX_CONNECTIONS = 32
# Kinds of failed connections (the labels of gpumon_http_connection_errors_total).
CONNECTION_ERROR_KINDS = ("timeout", "reset", "tls", "overload", "other")

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


class ConnectionStats:
    """Failed connections by kind; shared by the server's threads and the collector."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.errors: dict[str, int] = dict.fromkeys(CONNECTION_ERROR_KINDS, 0)
        self._said: set[str] = set()

    def count(self, kind: str, exc: BaseException | None = None) -> None:
        """Count one failed connection; a client's fault is a debug line, ours is said once."""
        with self._lock:
            self.errors[kind] += 1
            first = kind == "other" and exc is not None and type(exc).__name__ not in self._said
            if first:
                self._said.add(type(exc).__name__)
        if exc is None:
            return
        log.debug("HTTP connection failed (%s): %s: %s", kind, type(exc).__name__, exc)
        if first:  # not a client's doing: say it (once per kind of exception)
            print(
                f"gpumon: an HTTP request failed ({type(exc).__name__}: {exc}); the server "
                "goes on (counted in gpumon_http_connection_errors_total).",
                file=sys.stderr,
                flush=True,
            )

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.errors)


def _kind(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timeout"
    if isinstance(exc, ConnectionError) or getattr(exc, "errno", None) in (
        errno.ECONNRESET,
        errno.EPIPE,
        errno.ECONNABORTED,
    ):
        return "reset"
    if isinstance(exc, ssl.SSLError):
        return "tls"
    return "other"


# --------------------------------------------------------------------------- authentication
class BasicAuth:
    """Checks ``Authorization: Basic`` against bcrypt hashes, as the exporter-toolkit does.

    bcrypt is slow on purpose (~70 ms at cost 10), and Prometheus sends the same
    credentials every scrape: results are cached (bounded) by a digest of the user, hash
    and password, and one check runs at a time.  An unknown user is checked against a
    fixed hash so the answer takes as long as for a known one.
    """

    CACHE_SIZE = 256

    def __init__(self, users: Iterable[tuple[str, str]]) -> None:
        import bcrypt

        self._bcrypt = bcrypt
        self.users = dict(users)
        self._lock = threading.Lock()
        self._cache: OrderedDict[bytes, bool] = OrderedDict()
        self._decoy: bytes | None = None

    def check(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        known = hashed is not None
        with self._lock:
            if not known:
                if self._decoy is None:
                    self._decoy = self._bcrypt.hashpw(b"gpumon-decoy", self._bcrypt.gensalt(10))
                target = self._decoy
            else:
                target = hashed.encode()  # type: ignore[union-attr]
            key = hashlib.sha256(b"\0".join((user.encode(), target, password.encode()))).digest()
            ok = self._cache.get(key)
            if ok is None:
                try:
                    ok = self._bcrypt.checkpw(password.encode(), target) and known
                except ValueError:  # a hash bcrypt cannot read: refused, never a crash
                    ok = False
                self._cache[key] = ok
                while len(self._cache) > self.CACHE_SIZE:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
        return ok


class RateLimit:
    """A token bucket (the toolkit's rate_limit): ``burst`` requests, one more per interval."""

    def __init__(self, interval_s: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) / self.interval_s)
            self._at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False


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
        self.metrics_app = make_wsgi_app(registry)
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
        if self.limit is not None and not self.limit.allow():
            return _text("429 Too Many Requests", "Too Many Requests\n")
        if self.auth is not None and not self.auth.check(environ.get("HTTP_AUTHORIZATION")):
            return _text("401 Unauthorized", "Unauthorized\n", [("WWW-Authenticate", "Basic")])
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
        captured: list[Any] = []

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            captured[:] = [status, headers]

        get = dict(environ, REQUEST_METHOD="GET")  # HEAD: the same headers, no body
        body = b"".join(self.metrics_app(get, start))
        return captured[0], list(captured[1]), body


def _minimal_landing(telemetry_path: str) -> str:
    return (
        f"<!DOCTYPE html><html><head><title>gpumon</title></head><body><h1>gpumon "
        f'{__version__}</h1><p><a href="{telemetry_path}">Metrics</a></p></body></html>\n'
    )


# --------------------------------------------------------------------------- connections
class _QuietServerHandler(ServerHandler):
    """wsgiref's response writer, with its exception report counted instead of printed."""

    stats: ConnectionStats | None = None

    def log_exception(self, exc_info: Any) -> None:
        if self.stats is not None:
            self.stats.count(_kind(exc_info[1]), exc_info[1])


class _Handler(WSGIRequestHandler):
    """One request per connection (HTTP/1.0), no access log, faults counted."""

    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass

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
        handler = _QuietServerHandler(
            self.rfile, self.wfile, self.get_stderr(), self.get_environ(), multithread=True
        )
        handler.stats = self.server.stats  # type: ignore[attr-defined]
        handler.request_handler = self  # type: ignore[attr-defined]
        handler.run(self.server.get_app())  # type: ignore[attr-defined]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = BACKLOG
    ssl_context: ssl.SSLContext | None = None
    stats: ConnectionStats

    def server_activate(self) -> None:
        self.socket.listen(self.request_queue_size)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        # Every worker busy: the accept loop waits here (new clients wait in the backlog)
        # as long as a worker can take, then gives up on this one.
        if not self._slots.acquire(timeout=REQUEST_TIMEOUT_S + 1.0):
            self.stats.count("overload")
            self.shutdown_request(request)
            return
        try:
            threading.Thread(
                target=self._serve_one, args=(request, client_address), daemon=True
            ).start()
        except RuntimeError as exc:  # no thread to be had (TasksMax): refuse this one
            self._slots.release()
            self.stats.count("overload", exc)
            self.shutdown_request(request)

    def _serve_one(self, request: Any, client_address: Any) -> None:
        try:
            if self.ssl_context is not None:
                try:
                    request.settimeout(REQUEST_TIMEOUT_S)
                    request = self.ssl_context.wrap_socket(request, server_side=True)
                except OSError as exc:  # ssl.SSLError is one
                    # Plain HTTP on the TLS port, a refused client certificate, a silent
                    # client: closed without an answer, counted.
                    self.stats.count(_kind(exc), exc)
                    self.shutdown_request(request)
                    return
            self.process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        self.stats.count("other" if exc is None else _kind(exc), exc)


def _v6(host: str) -> bool:
    return ":" in host


def tls_context(cfg: ServeConfig) -> ssl.SSLContext:
    """Server context: our certificate; with a client CA, verify (and require) clients."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _TLS_VERSIONS[cfg.tls_min_version]
    ctx.maximum_version = _TLS_VERSIONS[cfg.tls_max_version]
    try:
        ctx.load_cert_chain(certfile=cfg.tls_cert_file or "", keyfile=cfg.tls_key_file)
    except (OSError, ssl.SSLError) as exc:
        # A configuration error (exit 2): restarting would not fix it.
        raise ConfigError(
            f"cannot load the TLS certificate {cfg.tls_cert_file} / key {cfg.tls_key_file}: "
            f"{getattr(exc, 'strerror', None) or exc}."
        ) from None
    if cfg.tls_client_ca_file is not None or cfg.tls_client_ca_pem is not None:
        what = cfg.tls_client_ca_file or "(inline client_ca)"
        try:
            ctx.load_verify_locations(cafile=cfg.tls_client_ca_file, cadata=cfg.tls_client_ca_pem)
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
        server_cls = type("GpumonServer", (_Server,), {})
        server_cls.address_family = socket.AF_INET6 if _v6(cfg.address) else socket.AF_INET
        try:
            self.httpd = make_server(
                cfg.address,
                cfg.port,
                WebApp(cfg, registry, pages),
                server_cls,
                handler_class=_Handler,
            )
        except OSError as exc:
            raise GpumonError(_bind_error(cfg, exc)) from None
        self.httpd.ssl_context = ctx  # type: ignore[attr-defined]
        self.httpd.stats = self.stats  # type: ignore[attr-defined]
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
