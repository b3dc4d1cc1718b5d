"""What the readers of foreign logs share: cells to numbers, errors naming the line, and the
assembler that groups per-GPU rows into one ``Snapshot`` per tick.

Pure helpers.  "No reading" becomes ``None``, never 0.  Every parser here is linear in its
input (no regular expression that can backtrack): the cells come from files people send.
Sub-second logs are gathered into ~1 s windows with one utilisation point per row, which is
how gpumon's own sampler hands the detector the driver's utilisation buffer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from math import isfinite
from typing import Any, TypeVar

from gpumon.errors import TraceFormatError
from gpumon.model import GpuSample, Point, Snapshot

MIB = 1 << 20
MAX_MIB = 1e12  # an exabyte: more is not a GPU's memory, and would overflow as bytes

# A log whose rows come faster than this is "sub-second": rows are gathered into windows of
# WINDOW_S seconds, each GPU's rows becoming the util_samples of one GpuSample.
SUB_SECOND_S = 0.9
WINDOW_S = 1.0

# The cells every tool writes for "no reading", lower-cased.
_NO_READING = frozenset(
    (
        "-",
        "--",
        "n/a",
        "na",
        "nan",
        "none",
        "null",
        "??",
        "?",
        "err!",
        "unknown",
        "not supported",
        "notsupported",
        "not active",
    )
)
_NUMBER_CHARS = frozenset("0123456789.,+-eE")
_UNIT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ%°'/ µ")
# Unit -> factor to MiB for memory cells (nvidia-smi and gpustat "MB" are MiB).
_MEMORY_UNITS = {
    "": 1.0,
    "mib": 1.0,
    "mb": 1.0,
    "m": 1.0,
    "gib": 1024.0,
    "gb": 1024.0,
    "g": 1024.0,
    "kib": 1 / 1024,
    "kb": 1 / 1024,
    "k": 1 / 1024,
    "b": 1 / MIB,
    "bytes": 1 / MIB,
    "tib": 1024.0 * 1024,
    "tb": 1024.0 * 1024,
}


def is_no_reading(cell: str) -> bool:
    s = cell.strip().lower()
    return not s or s in _NO_READING or s[0] == "[" or s.startswith(("n/a", "err"))


def split_number(cell: str) -> tuple[float, str] | None:
    """``"150.20 W"`` -> ``(150.2, "w")``; ``None`` for a no-reading cell.

    Accepts units glued or spaced (``34C``, ``45'C``, ``80°C``, ``4MiB``), a decimal comma
    (``12,5``), surrounding quotes.  Raises ``ValueError`` naming the cell for anything else.
    One pass over the cell: linear whatever it holds.
    """
    s = cell.strip().strip('"').strip()
    if not s:
        return None
    try:
        v = float(s)
    except ValueError:
        pass
    else:
        if isfinite(v):
            return v, ""
        if v != v:
            return None  # "nan": no reading
        raise ValueError(f"{s!r} is not a finite number")
    if is_no_reading(s):
        return None
    end = 0
    n = len(s)
    while end < n and s[end] in _NUMBER_CHARS:
        end += 1
    # An exponent letter followed by no digit belongs to the unit ("12e", "5 E:").
    while end > 0 and s[end - 1] in "eE+-,.":
        end -= 1
    unit = s[end:].strip()
    if end == 0 or len(unit) > 16 or any(c not in _UNIT_CHARS for c in unit):
        raise ValueError(f"{s!r} is not a number")
    text = s[:end]
    if "," in text:
        text = text.replace(",", ".") if "." not in text else text.replace(",", "")
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{s!r} is not a number") from None
    if not isfinite(v):
        raise ValueError(f"{s!r} is not a finite number")
    return v, unit.lower()


def num(cell: str) -> float | None:
    """A numeric cell with or without its unit (``92 %``, ``150.20 W``, ``34C``).

    ``[N/A]``, ``N/A``, ``[Not Supported]``, ``??``, ``-``, ``ERR!``, ``nan`` and empty cells
    are no reading.  Anything else that is not a number raises ``ValueError`` saying so.
    """
    got = split_number(cell)
    return None if got is None else got[0]


def fnum(cell: str) -> float | None:
    """``num`` with a fast path for the common ``92``, ``49140 MiB``, ``150.20 W``."""
    try:
        v = float(cell.rstrip(" %WMiBHzC\r\n"))
    except ValueError:
        return num(cell)
    return v if isfinite(v) else num(cell)  # "nan" is no reading, "inf" an error


def cell_text(cells: list[str], i: int | None) -> str | None:
    """The text of cell ``i`` (a name, a uuid), None where it is missing or no reading."""
    if i is None or i >= len(cells):
        return None
    value = cells[i].strip().strip('"').strip()
    return None if not value or value.startswith("[") or value.upper() == "N/A" else value


def mem_mib(cell: str, default_scale: float = 1.0) -> float | None:
    """A memory cell in MiB, whatever unit it carries (``24 GiB``, ``7982 MB``, ``512``);
    a bare number is scaled by ``default_scale`` (the unit named in the header)."""
    if cell.endswith(" MiB"):  # nvidia-smi's own: the common case, without the general parser
        try:
            v = float(cell[:-4])
        except ValueError:
            pass
        else:
            if -MAX_MIB <= v <= MAX_MIB:  # also false for nan and inf
                return v * default_scale
    got = split_number(cell)
    if got is None:
        return None
    value, unit = got
    if not unit:
        return _sane_mib(value * default_scale, cell)
    factor = _MEMORY_UNITS.get(unit)
    if factor is None:
        raise ValueError(f"{cell.strip()!r} is not an amount of memory")
    return _sane_mib(value * factor, cell)


def _sane_mib(value: float, cell: str) -> float:
    if not -MAX_MIB <= value <= MAX_MIB:
        raise ValueError(f"{cell.strip()!r} is not an amount of GPU memory")
    return value


def mib_bytes(value: float | None) -> int | None:
    return None if value is None else int(value * MIB)


# --- GPU count from row times (used when rows carry no GPU column) ----------------------


def split_threshold(times: Sequence[float]) -> tuple[int, float] | None:
    """From row times of a log without a GPU column: (rows per tick, split threshold).

    The rows of one tick are close together (often equal); ticks are one interval apart.
    The threshold sits in the widest ratio gap of the sorted deltas (a gap that a twentieth
    of them, rows come late, may fall into).  None when every delta
    looks the same (one GPU) or there are too few rows to tell.
    """
    deltas = sorted(b - a for a, b in itertools.pairwise(times))
    if len(deltas) < 2:
        return None
    best_ratio, split = 0.0, None
    # A few rows of a tick come late (nvidia-smi waits on a busy GPU: 8, 30, 90 ms where
    # the others take 1-4) and would fill the gap between rows and ticks: the widest gap
    # may hold up to one delta in twenty.
    w = max(1, len(deltas) // 20)
    for i in range(len(deltas) - w):
        a, b = deltas[i], deltas[i + w]
        if a < 0:
            continue
        # 1 ms of slack: nvidia-smi stamps have ms resolution, so 0 and 2 ms apart are alike.
        ratio = (b + 1e-3) / (a + 1e-3)
        if ratio > best_ratio:
            best_ratio, split = ratio, (a + b) / 2
    if split is None or best_ratio < 4.0:
        return None
    runs = tick_runs(times, split)
    # Complete ticks only (the prefix may start and end mid-tick); a rare long pause in a
    # one-GPU log also makes a "gap", but then the runs do not agree on one length.
    inner = runs[1:-1] if len(runs) > 4 else runs
    if len(inner) < 3:
        return None
    counts: dict[int, int] = {}
    for r in inner:
        counts[r] = counts.get(r, 0) + 1
    n = max(counts, key=lambda k: (counts[k], k))
    if n < 2 or n > 64 or counts[n] < 0.75 * len(inner):
        return None
    return n, split


def tick_runs(times: Sequence[float], split: float) -> list[int]:
    """Lengths of the runs of rows whose successive times are within ``split``."""
    runs: list[int] = []
    run = 1
    for a, b in itertools.pairwise(times):
        if b - a > split or b < a:
            runs.append(run)
            run = 1
        else:
            run += 1
    runs.append(run)
    return runs


# --- grouping rows into snapshots -------------------------------------------------------


# build(gpu, t_s, util_pct, util_points, payload) -> GpuSample; payload is whatever the
# reader kept of the row, ending with its line number and text: fields other than the
# utilisation are parsed only for the rows that become samples, and a ValueError or
# IndexError doing so becomes the error naming that line.
Builder = Callable[[int, float, float | None, tuple[Point, ...], tuple[Any, ...]], GpuSample]
# host(payload, t) -> HostSample | None for the snapshot a tick closes (logs with a CPU column).
HostBuilder = Callable[[tuple[Any, ...], float], Any]


class Assembler:
    """Turns per-GPU rows into snapshots, one tick (or one ~1 s window) at a time.

    ``add(t, gpu, util, payload)`` takes one row and returns the snapshot it closed, if
    any; ``flush()`` returns the last one.  ``build`` None: each payload's first item is
    the builder for its row (a reader whose columns change mid-file).  Memory is bounded
    by one window, whatever the length of the log.  Both are closures over their state:
    called once per log row, they
    are the hottest code of ``gpumon analyze`` on a CSV log.  A row that ``build`` cannot
    read raises ``TraceFormatError`` naming its line in ``path``.
    """

    def __init__(
        self,
        build: Builder | None,
        interval_s: float | None,
        path: str,
        host: HostBuilder | None = None,
    ):
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
            last_payload: tuple[Any, ...] | None = None
            for gpu in sorted(done):
                points, (t, util, payload) = done[gpu]
                try:
                    make = payload[0] if build is None else build
                    samples.append(make(gpu, t, util, tuple(points) if points else (), payload))
                except (ValueError, IndexError, OverflowError) as exc:
                    no, line = payload[-2:]
                    raise bad_line(path, no, line, f"malformed value ({exc})") from None
                if t > t_max:
                    t_max = t
                    last_payload = payload
            host_sample = None
            if host is not None and last_payload is not None:
                try:
                    host_sample = host(last_payload, t_max)
                except (ValueError, IndexError, OverflowError) as exc:
                    no, line = last_payload[-2:]
                    raise bad_line(path, no, line, f"malformed value ({exc})") from None
            return Snapshot(t_s=t_max, gpus=tuple(samples), host=host_sample)

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
    return round(deltas[len(deltas) // 2], 6)


def shown(line: str, width: int = 80) -> str:
    text = line.rstrip("\r\n")
    return text if len(text) <= width else text[: width - 3] + "..."


def bad_line(path: str, line_no: int, line: str, why: str) -> TraceFormatError:
    return TraceFormatError(f"{why}: {shown(line)!r}", path=path, line=line_no)


def is_cut_short(line: str) -> bool:
    """A line without its newline can only be the last one: the logger was stopped mid-write."""
    return not line.endswith("\n")


def cut_short_warning(path: str, line_no: int) -> str:
    return f"{path}:{line_no}: last line is incomplete (the logger stopped mid-write); ignored"


class Tally:
    """Lines skipped (or readings dropped) for one reason: counted as they come, the first
    one named, said once in a warning when the reading ends -- never one warning a line."""

    __slots__ = ("count", "first_line", "first_text", "why")

    def __init__(self, why: str):
        self.why = why  # e.g. "row(s) whose time is not a finite number; skipped"
        self.count = 0
        self.first_line: int | None = None
        self.first_text = ""

    def note(self, line_no: int | None, text: str) -> None:
        self.count += 1
        if self.count == 1:
            self.first_line, self.first_text = line_no, text

    def say(self, path: str, warns: list[str]) -> None:
        if not self.count:
            return
        where = path if self.first_line is None else f"{path}:{self.first_line}"
        warns.append(f"{where}: {self.count:,} {self.why} (the first: {shown(self.first_text)!r})")


def non_finite_times() -> Tally:
    return Tally("row(s) whose time is not a finite number (NaN, inf): skipped, the rest read")


def out_of_range_utils() -> Tally:
    return Tally("utilisation reading(s) outside 0-100 %: read as no reading")


def add_note(extra: dict[str, object], note: str) -> None:
    """A sentence ``gpumon analyze`` prints as ``gpumon: note: ...`` (header ``extra``)."""
    notes = extra.setdefault("notes", [])
    assert isinstance(notes, list)
    if note not in notes:
        notes.append(note)


T = TypeVar("T")


def read_ahead(
    numbered: Iterator[tuple[int, str]],
    feed: Callable[[int, str], T | None],
    flush: Callable[[], T | None],
    limit: int,
) -> tuple[list[tuple[int, str]], list[T]]:
    """A reader's look ahead: the first ``limit`` numbered lines, and the items (blocks,
    reports) ``feed`` closed on them and ``flush`` closed after them."""
    prefix: list[tuple[int, str]] = []
    items: list[T] = []
    for no, line in numbered:
        prefix.append((no, line))
        done = feed(no, line)
        if done is not None:
            items.append(done)
        if len(prefix) >= limit:
            break
    last = flush()
    if last is not None:
        items.append(last)
    return prefix, items


def closed_items(
    numbered: Iterable[tuple[int, str]],
    feed: Callable[[int, str], T | None],
    flush: Callable[[], T | None],
) -> Iterator[T]:
    """Every item (block, report, tick) ``feed`` closes line by line, then the last one."""
    for no, line in numbered:
        done = feed(no, line)
        if done is not None:
            yield done
    last = flush()
    if last is not None:
        yield last


def assume_interval(extra: dict[str, object], what: str, interval_s: float | None) -> float:
    """The interval of a log that carries no time (``what``: ``no time lines: blocks``):
    ``--interval``, else 1 s, said."""
    interval = interval_s or 1.0
    extra["interval_assumed"] = f"{what} assumed {interval:g} s apart" + (
        "" if interval_s else " (say otherwise with --interval)"
    )
    return interval
