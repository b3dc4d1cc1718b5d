"""The /metrics endpoint: client_python's WSGI app on a threaded server, TLS optional.

Why not ``prometheus_client.start_http_server`` itself: it wraps the listening socket, so
the TLS handshake runs inside ``accept()`` on the one serving thread, and a client that
connects and says nothing holds every other scrape.  Here the handshake runs in the
request's own thread with a timeout; the TLS context (certificate, key, client CA for
mTLS) is built the same way client_python builds it.
"""

from __future__ import annotations

import errno
import socket
import ssl
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.registry import CollectorRegistry

from gpumon.errors import ConfigError, GpumonError
from gpumon.faces.serve.config import ServeConfig

REQUEST_TIMEOUT_S = 10.0


class _Handler(WSGIRequestHandler):
    """No access log on stderr (a scrape every 15 s would drown real messages)."""

    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    ssl_context: ssl.SSLContext | None = None

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        if self.ssl_context is not None:
            try:
                request.settimeout(REQUEST_TIMEOUT_S)
                request = self.ssl_context.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError):
                # Plain HTTP on the TLS port, a failed client certificate, a silent client:
                # refused without an answer.
                self.shutdown_request(request)
                return
        super().process_request_thread(request, client_address)


def _v6(host: str) -> bool:
    return ":" in host


def tls_context(cfg: ServeConfig) -> ssl.SSLContext:
    """Server context: our certificate; with a client CA, verify (and require) clients."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(certfile=cfg.tls_cert_file or "", keyfile=cfg.tls_key_file)
    except (OSError, ssl.SSLError) as exc:
        # A configuration error (exit 2): restarting would not fix it.
        raise ConfigError(
            f"cannot load the TLS certificate {cfg.tls_cert_file} / key {cfg.tls_key_file}: "
            f"{getattr(exc, 'strerror', None) or exc}."
        ) from None
    if cfg.tls_client_ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=cfg.tls_client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load the client CA {cfg.tls_client_ca_file}: "
                f"{getattr(exc, 'strerror', None) or exc}."
            ) from None
        ctx.verify_mode = ssl.CERT_REQUIRED if cfg.tls_client_auth_required else ssl.CERT_OPTIONAL
    return ctx


class MetricsServer:
    """Serves ``registry`` on ``cfg.address:cfg.port`` from a daemon thread."""

    def __init__(self, cfg: ServeConfig, registry: CollectorRegistry) -> None:
        ctx = tls_context(cfg) if cfg.tls else None  # bad files fail before binding
        server_cls = type("GpumonServer", (_Server,), {})
        server_cls.address_family = socket.AF_INET6 if _v6(cfg.address) else socket.AF_INET
        try:
            self.httpd = make_server(
                cfg.address, cfg.port, make_wsgi_app(registry), server_cls, handler_class=_Handler
            )
        except OSError as exc:
            raise GpumonError(_bind_error(cfg, exc)) from None
        self.httpd.ssl_context = ctx  # type: ignore[attr-defined]
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
            "exporter?); choose another with --listen HOST:PORT or [http] port."
        )
    if exc.errno == errno.EACCES:
        return f"cannot listen on {where}: permission denied (ports below 1024 need root)."
    if exc.errno in (errno.EADDRNOTAVAIL, socket.EAI_NONAME) or isinstance(exc, socket.gaierror):
        return f"cannot listen on {where}: no such local address."
    return f"cannot listen on {where}: {exc.strerror or exc}."
