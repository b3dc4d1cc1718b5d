"""What the readers of foreign logs (nvidia-smi CSV, dmon, tables, home-made CSV) share.

Pure helpers: cell parsing where "no reading" becomes ``None`` (never 0), timestamp
parsing cached per day, inference of the GPU count when a log has no index column, and
the assembler that groups per-GPU rows into one ``Snapshot`` per tick -- or, for
sub-second logs, per ~1 s window with one point per row, which is how gpumon's own
sampler hands the detector the driver's utilisation buffer.
"""

from __future__ import annotations

import calendar
import itertools
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gpumon.errors import TraceFormatError
from gpumon.model import GpuSample, Point, Snapshot

MIB = 1 << 20

# A log whose rows come faster than this is "sub-second": rows are gathered into windows of
# WINDOW_S seconds, each GPU's rows becoming the util_samples of one GpuSample.
SUB_SECOND_S = 0.9
WINDOW_S = 1.0


def num(cell: str) -> float | None:
    """A numeric cell with or without its unit (``92 %``, ``150.20 W``, ``34C``).

    ``[N/A]``, ``N/A``, ``[Not Supported]``, ``-``, ``ERR!`` and empty cells are no reading.
    Anything else that is not a number raises ``ValueError`` (the caller names the line).
    """
    s = cell.strip()
    if not s:
        return None
    c = s[0]
    if c == "[" or c == "N" or c == "E" or c == "U" or s == "-" or c == "n":
        return None
    end = s.find(" ")
    if end > 0:
        s = s[:end]
    while s and not (s[-1].isdigit() or s[-1] == "."):
        s = s[:-1]  # trailing unit glued to the number: 34C, 61W, 4MiB, 0%
    return float(s)


def mib_bytes(value: float | None) -> int | None:
    return None if value is None else int(value * MIB)


# --- timestamps -------------------------------------------------------------------------

_day_cache: dict[str, int] = {}


def nvsmi_time(cell: str) -> float:
    """``2024/05/01 12:00:00.123`` (nvidia-smi's CSV timestamp) as Unix seconds.

    nvidia-smi writes the logging machine's local time without a zone; it is read as UTC
    (the header says so), which keeps durations right and results reproducible.  The
    per-day epoch is cached: parsing must stay cheap for millions of rows.
    """
    s = cell.strip()
    day = s[:10]
    base = _day_cache.get(day)
    if base is None:
        y, m, d = int(day[0:4]), int(day[5:7]), int(day[8:10])
        base = calendar.timegm((y, m, d, 0, 0, 0, 0, 0, 0))
        _day_cache[day] = base
    return base + int(s[11:13]) * 3600 + int(s[14:16]) * 60 + float(s[17:])


NVSMI_TIME_RE = re.compile(r"^\s*\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}(\.\d+)?\s*$")


# --- GPU count inference ----------------------------------------------------------------


def split_threshold(times: Sequence[float]) -> tuple[int, float] | None:
    """From row times of a log without a GPU column: (GPUs per tick, split threshold).

    The rows of one tick are close together (often equal); ticks are one interval apart.
    The threshold sits in the widest ratio gap of the sorted deltas.  None when every delta
    looks the same (one GPU) or there are too few rows to tell.
    """
    deltas = sorted(b - a for a, b in itertools.pairwise(times))
    if len(deltas) < 2:
        return None
    best_ratio, split = 0.0, None
    for a, b in itertools.pairwise(deltas):
        ratio = (b + 1e-6) / (a + 1e-6)
        if ratio > best_ratio:
            best_ratio, split = ratio, (a + b) / 2
    if split is None or best_ratio < 4.0:
        return None
    runs: list[int] = []
    run = 1
    for a, b in itertools.pairwise(times):
        if b - a > split:
            runs.append(run)
            run = 1
        else:
            run += 1
    # Complete ticks only (the prefix may end mid-tick); a rare long pause in a one-GPU
    # log also makes a "gap", but then the runs do not agree on one length.
    if len(runs) < 3:
        return None
    counts: dict[int, int] = {}
    for r in runs:
        counts[r] = counts.get(r, 0) + 1
    n = max(counts, key=lambda k: (counts[k], k))
    if n < 2 or n > 64 or counts[n] < 0.6 * len(runs):
        return None
    return n, split


def repeat_period(keys: Sequence[object], max_gpus: int = 16) -> int | None:
    """The smallest p such that row i and row i+p agree (≥ 90 %) on slow-moving values.

    Used when a log has neither a GPU column nor usable times: a GPU's memory use and
    power cap barely change from tick to tick, so the per-GPU pattern repeats.  None when
    nothing repeats.
    """
    n = len(keys)
    for p in range(1, min(max_gpus, n // 3) + 1):
        pairs = n - p
        same = sum(1 for i in range(pairs) if keys[i] == keys[i + p])
        if same >= 0.9 * pairs:
            return p
    return None


class Positional:
    """GPU index by position within a tick, for logs that print GPUs as consecutive rows."""

    __slots__ = ("_n", "_pos", "_split", "_t")

    def __init__(self, n: int, split: float | None):
        self._n = n
        self._split = split
        self._pos = -1
        self._t = float("-inf")

    def gpu(self, t: float | None) -> int:
        pos = self._pos + 1
        if pos >= self._n or (
            t is not None and self._split is not None and t - self._t > self._split
        ):
            pos = 0
        if pos == 0 and t is not None:
            self._t = t
        self._pos = pos
        return pos

    def reset(self) -> None:
        self._pos = -1


# --- grouping rows into snapshots -------------------------------------------------------


# build(gpu, t_s, util_pct, util_points, payload) -> GpuSample; payload is whatever the
# reader kept of the row, ending with its line number and text: fields other than the
# utilisation are parsed only for the rows that become samples, and a ValueError or
# IndexError doing so becomes the error naming that line.
Builder = Callable[[int, float, float | None, tuple[Point, ...], tuple[Any, ...]], GpuSample]


class Assembler:
    """Turns per-GPU rows into snapshots, one tick (or one ~1 s window) at a time.

    ``add(t, gpu, util, payload)`` takes one row and returns the snapshot it closed, if
    any; ``flush()`` returns the last one.  Memory is bounded by one window, whatever the
    length of the log.  Both are closures over their state: called once per log row, they
    are the hottest code of ``gpumon analyze`` on a CSV log.  A row that ``build`` cannot
    read raises ``TraceFormatError`` naming its line in ``path``.
    """

    def __init__(self, build: Builder, interval_s: float | None, path: str):
        self.windowed = interval_s is not None and interval_s < SUB_SECOND_S
        split = 0.5 * interval_s if interval_s else 0.5
        # gpu -> [util points (windowed) or None, (t, util, payload) of its last row]
        rows: dict[int, list[Any]] = {}
        start = float("-inf")

        def flush() -> Snapshot | None:
            nonlocal rows
            if not rows:
                return None
            done, rows = rows, {}
            samples = []
            t_max = float("-inf")
            for gpu in sorted(done):
                points, (t, util, payload) = done[gpu]
                try:
                    samples.append(build(gpu, t, util, tuple(points) if points else (), payload))
                except (ValueError, IndexError) as exc:
                    no, line = payload[-2:]
                    raise bad_line(path, no, line, f"malformed value ({exc})") from None
                if t > t_max:
                    t_max = t
            return Snapshot(t_s=t_max, gpus=tuple(samples))

        def add_windowed(t: float, gpu: int, util: float | None, payload: Any) -> Snapshot | None:
            nonlocal start
            out = None
            if t - start >= WINDOW_S or t < start:
                out = flush()
                start = t
            entry = rows.get(gpu)
            if entry is None:
                entry = rows[gpu] = [[], None]
            entry[1] = (t, util, payload)
            if util is not None:
                entry[0].append((t, util))
            return out

        def add_tick(t: float, gpu: int, util: float | None, payload: Any) -> Snapshot | None:
            nonlocal start
            out = None
            if gpu in rows or t - start > split or t < start:
                out = flush()
                start = t
            rows[gpu] = [None, (t, util, payload)]
            return out

        self.add: Callable[[float, int, float | None, Any], Snapshot | None] = (
            add_windowed if self.windowed else add_tick
        )
        self.flush: Callable[[], Snapshot | None] = flush


def median_interval(times: Iterable[float]) -> float | None:
    """The median spacing of distinct tick times (None with fewer than two)."""
    distinct = sorted(set(times))
    deltas = sorted(b - a for a, b in itertools.pairwise(distinct) if b > a)
    if not deltas:
        return None
    return deltas[len(deltas) // 2]


def bad_line(path: str, line_no: int, line: str, why: str) -> TraceFormatError:
    shown = line.rstrip("\r\n")
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return TraceFormatError(f"{why}: {shown!r}", path=path, line=line_no)


def is_cut_short(line: str) -> bool:
    """A line without its newline can only be the last one: the logger was stopped mid-write."""
    return not line.endswith("\n")


def cut_short_warning(path: str, line_no: int) -> str:
    return f"{path}:{line_no}: last line is incomplete (the logger stopped mid-write); ignored"
