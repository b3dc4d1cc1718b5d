"""The loop of a live face: a stop flag set by signals, and ticks paced without drift."""

from __future__ import annotations

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

    def install(self, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: object) -> None:
        self.signal = signum
        # Not event.set() here: the handler runs in the main thread, which may be holding
        # the event's own (non-reentrant) lock inside wait(); set() would then deadlock.
        threading.Thread(target=self.event.set, name="gpumon-stop", daemon=True).start()

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
) -> Iterator[float]:
    """Yield the monotonic time of each tick, every ``interval_s``, without drift.

    A slow tick does not shift the schedule: missed ticks are skipped, not bunched.
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
        wake = next_at if deadline is None else min(next_at, deadline)
        if stop.wait(max(0.0, wake - now)):
            return
