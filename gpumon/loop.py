"""The loop of a live face: a stop flag set by signals, ticks paced without drift, and a
pace that ends the moment the watched process exits.

A face waits a whole interval between ticks; a command that ends (``watch -- sleep 1``
at ``--interval 30``) or a signal must not wait that long: ``StopFlag`` and
``ExitWatch`` both set the event a pace waits on, so either ends the wait at once.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any


class StopFlag:
    """Set by SIGINT/SIGTERM (or a face), polled by the tick loop; restores handlers."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}
        # Set with the stop too: the events paces wait on (``paced(wake=...)``).
        self.wakes: list[threading.Event] = []

    def install(self, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: object) -> None:
        self.signal = signum
        # Not event.set() here: the handler runs in the main thread, which may be holding
        # the event's own (non-reentrant) lock inside wait(); set() would then deadlock.
        threading.Thread(target=self._set, name="gpumon-stop", daemon=True).start()

    def _set(self) -> None:
        self.event.set()
        for wake in self.wakes:
            wake.set()

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def __bool__(self) -> bool:
        return self.event.is_set()


def paced(
    interval_s: float,
    stop: threading.Event,
    *,
    duration_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    wake: threading.Event | None = None,
) -> Iterator[float]:
    """Yield the monotonic time of each tick, every ``interval_s``, without drift.

    A slow tick does not shift the schedule: missed ticks are skipped, not bunched.
    ``wake`` (set by an ``ExitWatch``, and by whatever sets ``stop``) ends a wait at once:
    the next tick comes now (which sees the process gone), or none if ``stop`` is set.
    """
    start = clock()
    deadline = None if duration_s is None else start + duration_s
    next_at = start
    while not stop.is_set():
        now = clock()
        if deadline is not None and now >= deadline:
            return
        yield now
        next_at += interval_s
        now = clock()
        if next_at < now:
            next_at = now + (interval_s - (now - next_at) % interval_s)
        wake_at = next_at if deadline is None else min(next_at, deadline)
        if wake is None:
            if stop.wait(max(0.0, wake_at - now)):
                return
        elif wake.wait(max(0.0, wake_at - now)):
            if stop.is_set():
                return
            wake.clear()
            next_at = clock()  # the process ended: its last tick now, not at the next beat


class ExitWatch:
    """Sets ``event`` when process ``pid`` exits (a pidfd, Linux 5.3+: no polling, and a
    child is not reaped).  Where a pidfd cannot be had, it does nothing: the loop sees the
    exit at its next tick, as before."""

    def __init__(self, pid: int, event: threading.Event) -> None:
        self.event = event
        self._pidfd: int | None = None
        self._quit_r, self._quit_w = os.pipe2(os.O_CLOEXEC)
        # Gone already (the loop's next tick says so), or no pidfd here: nothing to watch.
        with contextlib.suppress(OSError, AttributeError):
            self._pidfd = os.pidfd_open(pid)
        self._thread = threading.Thread(target=self._run, name="gpumon-exitwatch", daemon=True)
        if self._pidfd is not None:
            self._thread.start()

    def _run(self) -> None:
        assert self._pidfd is not None
        ready, _, _ = select.select([self._pidfd, self._quit_r], [], [])
        if self._pidfd in ready:
            self.event.set()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._quit_w, b"x")
        if self._thread.is_alive():
            self._thread.join()
        for fd in (self._pidfd, self._quit_r, self._quit_w):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._pidfd = None

    def __enter__(self) -> ExitWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
