"""A small client of the Prometheus HTTP API: instant and range queries, nothing else.

The standard library's ``http.client`` is enough for two form POSTs (POST, because a
job's instance list makes long queries), and it lets ``tls_config.server_name`` set the
name the certificate is checked against.  Every way a query can fail becomes one
sentence: Prometheus unreachable, the credentials refused, an answer that is not the
Prometheus API, a query Prometheus rejects (with its own error text).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import urllib.parse
from dataclasses import dataclass

from gpumon.errors import GpumonError
from gpumon.faces.report.httpconfig import HttpConfig


class PrometheusError(GpumonError):
    """Prometheus could not be asked, or its answer could not be used."""


class PrometheusUnreachableError(PrometheusError):
    """No answer: connection refused, a name that does not resolve, a timeout, TLS."""


class PrometheusAuthError(PrometheusError):
    """Prometheus (or the proxy before it) refused the credentials: HTTP 401 or 403."""


class JobNotFoundError(GpumonError):
    """No series of the job in the range: the thing to report on is not there."""

    exit_status = 4


@dataclass(frozen=True, slots=True)
class Series:
    """One series of an answer: its labels and its (time, value) points."""

    labels: dict[str, str]
    points: tuple[tuple[float, float], ...]

    @property
    def value(self) -> float:
        """The value of an instant query's sample."""
        return self.points[-1][1]


class _NamedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS whose certificate is checked against ``server_name`` (tls_config.server_name)."""

    def __init__(self, host: str, port: int | None, server_name: str, **kw: object) -> None:
        super().__init__(host, port, **kw)  # type: ignore[arg-type]
        self._server_name = server_name

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self._server_name)  # type: ignore[attr-defined]


class PrometheusClient:
    def __init__(self, url: str, http: HttpConfig | None = None, timeout_s: float = 30.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise GpumonError(f"--prometheus {url!r} is not an http:// or https:// URL")
        self.url = url.rstrip("/")
        self._parts = parts
        self._http = http or HttpConfig()
        self._timeout = timeout_s
        self._ctx: ssl.SSLContext | None = None
        if parts.scheme == "https":
            try:
                self._ctx = self._http.ssl_context()
            except (OSError, ssl.SSLError) as exc:
                raise GpumonError(f"cannot set up TLS for {url} ({exc})") from None
        self.requests = 0
        self.bytes_received = 0

    # --- the two queries ----------------------------------------------------------------------

    def query(self, expr: str, at: float) -> list[Series]:
        """An instant query at ``at`` (Unix seconds)."""
        return _series(self._ask("query", {"query": expr, "time": _ts(at)}, expr))

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[Series]:
        """A range query, one point per ``step_s`` seconds."""
        params = {"query": expr, "start": _ts(start), "end": _ts(end), "step": f"{step_s:g}"}
        return _series(self._ask("query_range", params, expr))

    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        """The label sets of the series ``match`` selects in [start, end] (names included,
        which every function of a query drops)."""
        params = {"match[]": match, "start": _ts(start), "end": _ts(end)}
        data = self._ask("series", params, match)
        return [dict(x) for x in data if isinstance(x, dict)]

    # --- transport ------------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        p = self._parts
        if p.scheme == "http":
            return http.client.HTTPConnection(p.hostname, p.port, timeout=self._timeout)
        if self._http.server_name:
            return _NamedHTTPSConnection(
                p.hostname, p.port, self._http.server_name, timeout=self._timeout, context=self._ctx
            )
        return http.client.HTTPSConnection(
            p.hostname, p.port, timeout=self._timeout, context=self._ctx
        )

    def _ask(self, endpoint: str, params: dict[str, str], expr: str) -> object:
        path = (self._parts.path.rstrip("/") or "") + f"/api/v1/{endpoint}"
        body = urllib.parse.urlencode(params).encode()
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
        }
        if self._http.authorization:
            headers["Authorization"] = self._http.authorization
        conn = self._connection()
        try:
            conn.request("POST", path, body, headers)
            resp = conn.getresponse()
            data = resp.read()
        except ssl.SSLError as exc:
            raise PrometheusUnreachableError(
                f"the TLS handshake with Prometheus at {self.url} failed ({exc.reason or exc})"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            raise PrometheusUnreachableError(
                f"cannot reach Prometheus at {self.url} ({_why(exc)})"
            ) from None
        finally:
            conn.close()
        self.requests += 1
        self.bytes_received += len(data)
        return self._parse(resp.status, data, expr)

    def _parse(self, status: int, data: bytes, expr: str) -> object:
        if status in (401, 403):
            raise PrometheusAuthError(
                f"Prometheus at {self.url} refused the credentials (HTTP {status}); give them "
                "with --http.config.file (basic_auth, authorization or bearer_token_file)"
            )
        try:
            answer = json.loads(data)
            ok = isinstance(answer, dict) and answer.get("status") in ("success", "error")
        except ValueError:
            ok = False
        if not ok:
            raise PrometheusError(
                f"{self.url} answered HTTP {status} but not as the Prometheus HTTP API (is it "
                "Prometheus, and is the URL its root?)"
            )
        if answer["status"] == "error":
            raise PrometheusError(
                f"Prometheus at {self.url} could not run a query (HTTP {status}, "
                f"{answer.get('errorType', 'error')}: {answer.get('error', '')}); the query was: "
                f"{' '.join(expr.split())}"
            )
        return answer.get("data")


def _series(result: object) -> list[Series]:
    """A query's answer (a vector or a matrix) as series."""
    if not isinstance(result, dict):
        return []
    kind, rows = result.get("resultType"), result.get("result", [])
    out = []
    for row in rows:
        if kind == "vector":
            pts = (_point(row["value"]),)
        elif kind == "matrix":
            pts = tuple(_point(v) for v in row.get("values", ()))
        else:
            continue
        out.append(Series(dict(row.get("metric", {})), pts))
    return out


def _point(v: list) -> tuple[float, float]:
    return float(v[0]), float(v[1])


def _ts(t: float) -> str:
    return f"{t:.3f}"


def _why(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.timeout | TimeoutError):
        return "no answer in time"
    if isinstance(exc, socket.gaierror):
        return f"the name does not resolve: {exc.strerror}"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
