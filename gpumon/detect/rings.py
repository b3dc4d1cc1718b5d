"""Fixed-size buffers: the detector's memory stays bounded on a stream of any length."""

from __future__ import annotations

from collections.abc import Sequence


class Ring:
    """The last ``size`` floats pushed (order kept only for ``newest``)."""

    __slots__ = ("buf", "i", "n", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.buf = [0.0] * size
        self.i = 0
        self.n = 0

    def push(self, x: float) -> None:
        self.buf[self.i] = x
        self.i = (self.i + 1) % self.size
        if self.n < self.size:
            self.n += 1

    def values(self) -> list[float]:
        return self.buf[: self.n] if self.n < self.size else list(self.buf)

    def newest(self) -> float | None:
        return None if self.n == 0 else self.buf[(self.i - 1) % self.size]

    def __len__(self) -> int:
        return self.n


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
        """The newest record with time <= t, or the oldest kept if none is that old."""
        size, buf = self.size, self.buf
        j = self.i
        rec = None
        for _ in range(self.n):
            j = (j - 1) % size
            rec = buf[j]
            if rec is not None and rec[0] <= t:
                return rec
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
