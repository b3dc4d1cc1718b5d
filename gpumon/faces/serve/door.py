"""The HTTP server's front door: connections accepted, held and handed to workers, bounded.

A connection costs a thread only once it has spoken.  One thread accepts and watches every
connection that has not sent a byte yet (a selector, no thread each); when it sends its
first bytes (a request, or a TLS ClientHello) it waits for one of ``MAX_CONNECTIONS``
workers, which does the TLS handshake and reads the request head, then answers.  Bounds:

- each connection has ``REQUEST_TIMEOUT_S`` from its accept to the end of its request
  head, handshake included; a deadline, not a timeout per read, so a client trickling a
  byte at a time is cut at it like a silent one (counted as ``timeout``);
- ``MAX_WAITING`` connections are held before a worker takes them; when the table is
  full, the oldest silent one that has had ``SILENT_GRACE_S`` to speak is closed to make
  room (counted as ``overload``); until one has, new clients wait in the kernel's
  backlog of ``BACKLOG`` (a burst of 300 connects is answered, not reset);
- when a connection that spoke waits for a worker and none is free, the worker that has
  been reading one request head the longest (``SILENT_GRACE_S`` at least: a handshake
  and a head take milliseconds) is cut for it (``overload``).

So a client that connects and says nothing, or starts a handshake and stops, or trickles
its request, holds no scrape: the next scrape is accepted, spoken and answered at once.
A worker that is writing an answer is never cut; its writes have a timeout of their own.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import ssl
import sys
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0
# The listen backlog: Prometheus, probes and curl loops connecting at once wait in it.
BACKLOG = 1024
# Connections served at once by a thread each.  Bounded so that a flood of clients
# cannot exhaust the unit's TasksMax (64) or memory.
MAX_CONNECTIONS = 32
# Connections accepted and not yet with a worker (one file descriptor each; the
# default soft limit is 1024).
MAX_WAITING = 512
# Time a connection has to say its first bytes, or to finish its request head, before it
# may be closed to make room for another.
SILENT_GRACE_S = 1.0
# Kinds of failed connections (the labels of gpumon_http_connection_errors_total).
CONNECTION_ERROR_KINDS = ("timeout", "reset", "tls", "overload", "other")
# How often the door looks at deadlines while connections are pending.
_TICK_S = 0.1
# Connections accepted per pass of the loop, so deadlines are looked at during a burst.
_ACCEPTS_PER_PASS = 64


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


def error_kind(exc: BaseException) -> str:
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


class _Conn:
    """One accepted connection on its way to an answer."""

    __slots__ = ("addr", "answering", "closed", "cut", "deadline", "since", "sock")

    def __init__(self, sock: socket.socket, addr: Any, now: float) -> None:
        self.sock = sock
        self.addr = addr
        self.since = now
        self.deadline = now + REQUEST_TIMEOUT_S
        self.answering = False  # its request is read: never cut from here on
        self.cut: str | None = None  # why the door closed it: "timeout" or "overload"
        self.closed = False  # its worker closed the socket: the door leaves it alone


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


class FrontDoorMixIn:
    """``serve_forever`` and ``shutdown`` for a socketserver TCP server, as described above.

    The server class supplies ``socket``, ``finish_request`` and ``shutdown_request``
    (socketserver's), and ``stats`` and ``ssl_context``.
    """

    socket: socket.socket
    request_queue_size = BACKLOG
    stats: ConnectionStats
    ssl_context: ssl.SSLContext | None = None

    if TYPE_CHECKING:  # socketserver's, in the server class this is mixed into

        def finish_request(self, request: Any, client_address: Any) -> None: ...

        def shutdown_request(self, request: Any) -> None: ...

    def server_activate(self) -> None:
        self.socket.listen(self.request_queue_size)
        self.socket.setblocking(False)
        self._lock = threading.Lock()  # guards _working, _free and each _Conn's flags
        self._waiting: dict[_Conn, None] = {}  # silent so far; oldest first (loop's own)
        self._ready: deque[_Conn] = deque()  # spoke, no worker yet (loop's own)
        self._working: set[_Conn] = set()
        self._free = MAX_CONNECTIONS
        self._local = threading.local()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._listening = False
        self._paused_until = 0.0

    # --- the loop (one thread) ------------------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        sel = self._selector
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                self._listen(now)
                pending = self._waiting or self._ready or self._working or not self._listening
                for key, _ in sel.select(_TICK_S if pending else None):
                    if key.fileobj is self.socket:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        self._spoke(key.data)
                now = time.monotonic()
                self._expire(now)
                self._dispatch(now)
        finally:
            for conn in [*self._waiting, *self._ready]:
                _close(conn.sock)
            self._waiting.clear()
            self._ready.clear()
            sel.close()
            self._stopped.set()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake()
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()  # type: ignore[misc]
        for end in (getattr(self, "_wake_r", None), getattr(self, "_wake_w", None)):
            if end is not None:  # not when the bind failed, before server_activate
                _close(end)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full: the loop is woken already
            self._wake_w.send(b"\0")

    def _listen(self, now: float) -> None:
        """Watch the listening socket while there is room (or room can be made)."""
        want = now >= self._paused_until and (
            len(self._waiting) + len(self._ready) < MAX_WAITING or self._silent_one(now) is not None
        )
        if want != self._listening:
            if want:
                self._selector.register(self.socket, selectors.EVENT_READ, None)
            else:
                self._selector.unregister(self.socket)
            self._listening = want

    def _silent_one(self, now: float) -> _Conn | None:
        """The oldest silent connection, if it has had its grace to speak."""
        oldest = next(iter(self._waiting), None)
        return oldest if oldest is not None and now - oldest.since >= SILENT_GRACE_S else None

    def _drop_waiting(self, conn: _Conn, kind: str) -> None:
        del self._waiting[conn]
        self._selector.unregister(conn.sock)
        _close(conn.sock)
        self.stats.count(kind)

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_PASS):
            now = time.monotonic()
            if len(self._waiting) + len(self._ready) >= MAX_WAITING:
                oldest = self._silent_one(now)
                if oldest is None:
                    return  # full of clients that just came: the rest wait in the backlog
                self._drop_waiting(oldest, "overload")
            try:
                sock, addr = self.socket.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    oldest = next(iter(self._waiting), None)
                    if oldest is not None:  # out of descriptors: the oldest silent one goes
                        self._drop_waiting(oldest, "overload")
                    else:
                        self._paused_until = now + _TICK_S
                    self.stats.count("overload", exc)
                    return
                self.stats.count(error_kind(exc), exc)  # ECONNABORTED: gone before accepted
                continue
            conn = _Conn(sock, addr, now)
            self._waiting[conn] = None
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _spoke(self, conn: _Conn) -> None:
        """Its first bytes (or its end) arrived: on to a worker."""
        if conn not in self._waiting:  # closed for room earlier in the same pass
            return
        del self._waiting[conn]
        self._selector.unregister(conn.sock)
        self._ready.append(conn)

    def _expire(self, now: float) -> None:
        while self._waiting:
            oldest = next(iter(self._waiting))
            if oldest.deadline > now:
                break
            self._drop_waiting(oldest, "timeout")
        while self._ready and self._ready[0].deadline <= now:
            conn = self._ready.popleft()
            _close(conn.sock)
            self.stats.count("timeout")
        with self._lock:
            for conn in self._working:
                if not conn.answering and conn.deadline <= now:
                    conn.cut = conn.cut or "timeout"
                if conn.cut is not None:  # again each pass: the TLS socket replaces the plain
                    self._cut(conn)

    def _dispatch(self, now: float) -> None:
        while self._ready:
            with self._lock:
                if self._free == 0:
                    victim = self._slowest_head(now)
                    if victim is not None:
                        victim.cut = "overload"
                        self._cut(victim)
                    return
                self._free -= 1
                conn = self._ready.popleft()
                self._working.add(conn)
            try:
                threading.Thread(target=self._work, args=(conn,), daemon=True).start()
            except RuntimeError as exc:  # no thread to be had (TasksMax): refuse this one
                with self._lock:
                    self._working.discard(conn)
                    self._free += 1
                _close(conn.sock)
                self.stats.count("overload", exc)
                return

    def _slowest_head(self, now: float) -> _Conn | None:
        """The worker reading one request head the longest, past the grace; under the lock."""
        heads = [
            c
            for c in self._working
            if not c.answering and c.cut is None and now - c.since >= SILENT_GRACE_S
        ]
        return min(heads, key=lambda c: c.since, default=None)

    @staticmethod
    def _cut(conn: _Conn) -> None:
        """Wake the worker blocked on ``conn`` (under the lock, so never a closed socket)."""
        if not conn.closed:
            # socket.socket's own shutdown, never SSLSocket's: that one would take the
            # TLS state away from under the worker's thread.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)

    # --- a worker (one thread per connection that spoke) ------------------------------------

    def _work(self, conn: _Conn) -> None:
        sock = conn.sock
        self._local.conn = conn
        try:
            sock.settimeout(max(0.001, conn.deadline - time.monotonic()))
            if self.ssl_context is not None:
                sock = self.ssl_context.wrap_socket(
                    sock, server_side=True, do_handshake_on_connect=False
                )
                with self._lock:
                    conn.sock = sock
                sock.do_handshake()
            self.finish_request(sock, conn.addr)
            if conn.cut is not None:
                self.stats.count(conn.cut)
        except Exception as exc:
            # Plain HTTP on the TLS port, a refused client certificate, a silent or
            # resetting client: closed without an answer, counted.
            self.stats.count(conn.cut or error_kind(exc), exc)
        finally:
            with self._lock:
                conn.closed = True
                self._working.discard(conn)
                self._free += 1
            self.shutdown_request(sock)
            self._wake()

    def answering(self) -> bool:
        """Called by the request handler once the request head is read: from here on the
        connection is not cut; False when it was cut meanwhile (no answer then)."""
        conn: _Conn = self._local.conn
        with self._lock:
            if conn.cut is not None:
                return False
            conn.answering = True
        with contextlib.suppress(OSError):
            conn.sock.settimeout(REQUEST_TIMEOUT_S)  # for writing the answer
        return True
