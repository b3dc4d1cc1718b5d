"""Fixed-size buffers: the detector's memory stays bounded on a stream of any length."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any


class Ring(deque):
    """The last ``size`` floats pushed: a bounded deque (its append runs in C)."""

    def __init__(self, size: int) -> None:
        super().__init__(maxlen=size)

    push = deque.append

    def __reduce__(self) -> tuple[Any, ...]:  # rebuild with our one-argument init
        return (Ring, (self.maxlen,), None, iter(self))

    def values(self) -> list[float]:
        return list(self)

    def newest(self) -> float | None:
        return self[-1] if self else None


class History:
    """The last ``size`` eval records (time first), searchable backwards by time.

    Records hold running totals, so any window's sum is one subtraction: O(window) lookup
    at most, no per-point storage.
    """

    __slots__ = ("buf", "i", "n", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.buf: list[tuple[float, ...] | None] = [None] * size
        self.i = 0
        self.n = 0

    def push(self, rec: tuple[float, ...]) -> None:
        self.buf[self.i] = rec
        self.i = (self.i + 1) % self.size
        if self.n < self.size:
            self.n += 1

    def at_or_before(self, t: float) -> tuple[float, ...] | None:
        """The newest record with time <= t, or the oldest kept if none is that old.

        Records come at a near-constant pace, so the index is guessed from the mean
        spacing and corrected by a step or two: O(1) on a steady stream.
        """
        n = self.n
        if n == 0:
            return None
        size, buf = self.size, self.buf
        newest = buf[(self.i - 1) % size]
        oldest = buf[(self.i - n) % size]
        if newest[0] <= t:  # type: ignore[index]
            return newest
        if oldest[0] >= t:  # type: ignore[index]
            return oldest
        # Position k counts back from the newest (0 = newest).
        pace = (newest[0] - oldest[0]) / (n - 1)  # type: ignore[index]
        k = int((newest[0] - t) / pace) if pace > 0 else 0  # type: ignore[index]
        k = min(max(k, 0), n - 1)
        base = self.i - 1
        rec = buf[(base - k) % size]
        while rec[0] > t and k < n - 1:  # type: ignore[index]
            k += 1
            rec = buf[(base - k) % size]
        while k > 0:
            nxt = buf[(base - k + 1) % size]
            if nxt[0] <= t:  # type: ignore[index]
                k -= 1
                rec = nxt
            else:
                break
        return rec

    def __len__(self) -> int:
        return self.n


def quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile of a small sample; None for no sample (never 0)."""
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return s[k]
