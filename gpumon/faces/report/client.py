"""A small client of the Prometheus HTTP API: instant and range queries, nothing else.

The standard library's ``http.client`` is enough for two form POSTs (POST, because a
job's instance list makes long queries), and it lets ``tls_config.server_name`` set the
name the certificate is checked against.  Every way a query can fail becomes one
sentence: Prometheus unreachable, the credentials refused, an answer that is not the
Prometheus API, a query Prometheus rejects (with its own error text).

What comes back is not trusted: each answer is read in pieces up to ``MAX_ANSWER_BYTES``
and within ``--timeout`` seconds from connecting to its last byte (a deadline that cuts
the connection, whatever the server trickles), every point is checked to be a time and a
number, and text from the server is made printable before it is said.  Credentials in the
URL (``http://user:password@host``) are sent as basic auth and never printed.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from gpumon.errors import GpumonError
from gpumon.faces.report.httpconfig import HttpConfig
from gpumon.terminal import printable

# The most one answer may hold.  The largest answer of a report is the presence query,
# about 21 bytes a point and at most 1,000 points per node: 21 MiB for a job of 1,000 nodes.
MAX_ANSWER_BYTES = 32 * 2**20
_CHUNK = 64 * 1024
# How long an error text from the server may be when it is said.
_MAX_SAID = 300


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


class _BadAnswer(ValueError):
    """A part of an answer that is not what the Prometheus API sends."""


class _Deadline:
    """The time one query may take: when it is up, the connection's socket is shut down,
    so whatever read or write waits on it ends there (a timeout per read would let a
    server that sends a byte a second hold the report for ever)."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.expired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        return max(0.001, self.at - time.monotonic())

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.expired:
                self._shut()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            self._shut()

    def _shut(self) -> None:
        if self._sock is not None:
            # socket.socket's own shutdown, not SSLSocket's (that one would drop the TLS
            # state under the reading thread): the read sees the end of the stream.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._sock = None


class _Connection(http.client.HTTPConnection):
    """HTTP or HTTPS whose socket a deadline watches; the certificate is checked against
    ``server_name`` (tls_config.server_name) where one is given."""

    def __init__(
        self,
        host: str,
        port: int | None,
        deadline: _Deadline,
        ctx: ssl.SSLContext | None,
        server_name: str | None,
    ) -> None:
        if ctx is not None:
            self.default_port = http.client.HTTPS_PORT
        super().__init__(host, port, timeout=deadline.left())
        self._deadline = deadline
        self._ctx = ctx
        self._server_name = server_name or host

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self._deadline.left())
        self._deadline.watch(sock)
        if self._ctx is not None:
            sock = self._ctx.wrap_socket(
                sock, server_hostname=self._server_name, do_handshake_on_connect=False
            )
            self._deadline.watch(sock)
            sock.do_handshake()
        self.sock = sock


class PrometheusClient:
    def __init__(self, url: str, http: HttpConfig | None = None, timeout_s: float = 30.0) -> None:
        parts = urllib.parse.urlsplit(url)
        try:
            hostname, _ = parts.hostname, parts.port
        except ValueError:  # a port that is not a number
            hostname = None
        if parts.scheme not in ("http", "https") or not hostname:
            raise GpumonError(f"--prometheus {_redacted(url)!r} is not an http:// or https:// URL")
        self.url = _redacted(url).rstrip("/")
        self._parts = parts
        self._host = hostname
        self._http = http or HttpConfig()
        self._authorization = self._http.authorization or _url_credentials(parts)
        self._timeout = timeout_s
        self._ctx: ssl.SSLContext | None = None
        if parts.scheme == "https":
            try:
                self._ctx = self._http.ssl_context()
            except (OSError, ssl.SSLError) as exc:
                raise GpumonError(f"cannot set up TLS for {self.url} ({exc})") from None
        self.requests = 0
        self.bytes_received = 0

    # --- the two queries ----------------------------------------------------------------------

    def query(self, expr: str, at: float) -> list[Series]:
        """An instant query at ``at`` (Unix seconds)."""
        return self._series(self._ask("query", {"query": expr, "time": _ts(at)}, expr), expr)

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[Series]:
        """A range query, one point per ``step_s`` seconds."""
        params = {"query": expr, "start": _ts(start), "end": _ts(end), "step": f"{step_s:g}"}
        return self._series(self._ask("query_range", params, expr), expr)

    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        """The label sets of the series ``match`` selects in [start, end] (names included,
        which every function of a query drops)."""
        params = {"match[]": match, "start": _ts(start), "end": _ts(end)}
        data = self._ask("series", params, match)
        try:
            if not isinstance(data, list):
                raise _BadAnswer(f"a list of label sets, not {_short(data)}")
            return [_labels(x) for x in data]
        except _BadAnswer as exc:
            raise self._bad(exc, match) from None

    def _series(self, result: object, expr: str) -> list[Series]:
        try:
            return _series(result)
        except _BadAnswer as exc:
            raise self._bad(exc, expr) from None

    def _bad(self, exc: _BadAnswer, expr: str) -> PrometheusError:
        return PrometheusError(
            f"{self.url} answered a query with {exc}, not as the Prometheus HTTP API does "
            f"(is it Prometheus?); the query was: {' '.join(expr.split())}"
        )

    # --- transport ------------------------------------------------------------------------------

    def _ask(self, endpoint: str, params: dict[str, str], expr: str) -> object:
        path = (self._parts.path.rstrip("/") or "") + f"/api/v1/{endpoint}"
        body = urllib.parse.urlencode(params).encode()
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
        }
        if self._authorization:
            headers["Authorization"] = self._authorization
        deadline = _Deadline(self._timeout)
        conn = _Connection(
            self._host, self._parts.port, deadline, self._ctx, self._http.server_name
        )
        try:
            conn.request("POST", path, body, headers)
            resp = conn.getresponse()
            data = self._read(resp, deadline)
        except ssl.SSLError as exc:
            if deadline.expired:
                raise self._late() from None
            raise PrometheusUnreachableError(
                f"the TLS handshake with Prometheus at {self.url} failed "
                f"({_printable(str(exc.reason or exc))})"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            if deadline.expired:
                raise self._late() from None
            raise PrometheusUnreachableError(
                f"cannot reach Prometheus at {self.url} ({_why(exc)})"
            ) from None
        finally:
            deadline.cancel()
            conn.close()
        self.requests += 1
        self.bytes_received += len(data)
        return self._parse(resp.status, data, expr)

    def _read(self, resp: http.client.HTTPResponse, deadline: _Deadline) -> bytes:
        """The answer's body, in pieces, refused past MAX_ANSWER_BYTES."""
        length = resp.getheader("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > MAX_ANSWER_BYTES:
            raise self._too_large()
        data = bytearray()
        while chunk := resp.read(_CHUNK):
            data += chunk
            if len(data) > MAX_ANSWER_BYTES:
                raise self._too_large()
        if deadline.expired:  # cut short by the deadline, not ended by the server
            raise self._late()
        return bytes(data)

    def _too_large(self) -> PrometheusError:
        return PrometheusError(
            f"{self.url} sent more than {MAX_ANSWER_BYTES // 2**20} MiB in answer to one "
            "query, far more than a report needs; gpumon stopped reading (is it Prometheus?)"
        )

    def _late(self) -> PrometheusUnreachableError:
        return PrometheusUnreachableError(
            f"cannot reach Prometheus at {self.url} (no complete answer within "
            f"{self._timeout:g} s; --timeout gives a query more time)"
        )

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
            kind = _printable(str(answer.get("errorType", "error")))
            raise PrometheusError(
                f"Prometheus at {self.url} could not run a query (HTTP {status}, "
                f"{kind}: {_printable(str(answer.get('error', '')))}); the query was: "
                f"{' '.join(expr.split())}"
            )
        return answer.get("data")


def _series(result: object) -> list[Series]:
    """A query's answer (a vector or a matrix) as series; _BadAnswer for one that is not."""
    if not isinstance(result, dict):
        return []
    kind, rows = result.get("resultType"), result.get("result", [])
    if not isinstance(rows, list):
        raise _BadAnswer(f"a result that is not a list ({_short(rows)})")
    out = []
    for row in rows:
        if not isinstance(row, dict):
            raise _BadAnswer(f"a series that is not an object ({_short(row)})")
        if kind == "vector":
            pts: tuple[tuple[float, float], ...] = (_point(row.get("value")),)
        elif kind == "matrix":
            values = row.get("values", [])
            if not isinstance(values, list):
                raise _BadAnswer(f"values that are not a list ({_short(values)})")
            pts = tuple(_point(v) for v in values)
        else:
            continue
        out.append(Series(_labels(row.get("metric", {})), pts))
    return out


def _labels(labels: object) -> dict[str, str]:
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise _BadAnswer(f"labels that are not names and strings ({_short(labels)})")
    return dict(labels)


def _point(v: object) -> tuple[float, float]:
    """A ``[time, "value"]`` pair (the value a string, as Prometheus writes NaN and Inf;
    a bare number is taken too)."""
    if isinstance(v, list) and len(v) == 2 and all(_number(x) for x in v):
        try:
            return float(v[0]), float(v[1])
        except ValueError:
            pass
    raise _BadAnswer(f'a point that is not [time, "number"] ({_short(v)})')


def _number(x: object) -> bool:
    return isinstance(x, int | float | str) and not isinstance(x, bool)


def _short(value: Any) -> str:
    """A value from the answer, short and printable, to say what was wrong with it."""
    return _printable(json.dumps(value)[:80] if _jsonable(value) else repr(value)[:80])


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _printable(text: str, limit: int = _MAX_SAID) -> str:
    """Text from the server as it may be said on a terminal (see ``gpumon.terminal``)."""
    return printable(text, limit)


def _redacted(url: str) -> str:
    """``url`` with the password of its user info written as xxxxx (as Go's URL.Redacted)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user_info, _, host = parts.netloc.rpartition("@")
    user = user_info.partition(":")[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:xxxxx@{host}"))


def _url_credentials(parts: urllib.parse.SplitResult) -> str | None:
    """The Authorization header for credentials given in the URL, as Prometheus' own
    clients send them; None without."""
    if parts.username is None:
        return None
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _ts(t: float) -> str:
    return f"{t:.3f}"


def _why(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.timeout | TimeoutError):
        return "no answer in time"
    if isinstance(exc, socket.gaierror):
        return f"the name does not resolve: {exc.strerror}"
    # An HTTP exception can quote the server's bytes (a bad status line): made printable.
    return _printable(getattr(exc, "strerror", None) or str(exc) or type(exc).__name__)
