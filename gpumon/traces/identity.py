"""Which GPU a row is, for logs whose rows carry no index, uuid or pci.bus_id.

nvidia-smi prints one row per GPU per tick, GPUs in order.  Without a GPU column the cycle
has to be found, and reading an 8-GPU log as one GPU turns a sync stall into "starved".
The evidence, from a prefix of the log:

* times: the rows of one tick share one timestamp (nvidia-smi stamps them together), or
  come a few ms apart while ticks are an interval apart (``split_threshold``);
* fingerprints: each GPU's own values recur every n rows -- memory.total, name and power
  limit are constant per GPU, memory.used nearly so, temperature and an idle GPU's power
  too, but only where utilisation does not move with them (``cycle_period``): a starving
  GPU's temperature and power follow its bursts, which is no second GPU.

Strong time evidence (sub-second stamps) decides alone; whole-second stamps shared by runs
of rows are also what one GPU sampled faster than its clock looks like, so they need the
values to agree.  Where constant values tell every GPU apart they become its key, which
holds whatever rows go missing.  ``Assigner`` then follows the cycle through the file and
counts where it breaks (a tick with too few or too many rows), re-syncing at the next tick.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpumon.traces._common import cell_text, fnum, split_threshold, tick_runs

# Fingerprint fields, in the order of trust: constant per GPU first; utilisation last, never
# evidence itself (it is what the log measures) but what temperature and power are checked
# against.
FP_FIELDS = ("name", "mem_total", "power_limit", "mem_used", "temp", "power", "util")
EVIDENCE = FP_FIELDS[:6]
FOLLOWS_LOAD = ("temp", "power")  # rise and fall with a GPU's own bursts
_UTIL = FP_FIELDS.index("util")
FP_LABELS = {
    "name": "name",
    "mem_total": "memory.total",
    "power_limit": "power limit",
    "mem_used": "memory.used",
    "temp": "temperature",
    "power": "power",
    "util": "utilisation",
}
STATIC = ("name", "mem_total", "power_limit")
Fingerprint = tuple[object, ...]  # one value per FP_FIELDS entry (None: not logged)


def fingerprint(at: Mapping[str, int], cells: list[str]) -> Fingerprint:
    """A row's fingerprint from the columns ``at`` names (a value it cannot read: None)."""

    def val(fld: str) -> object:
        i = at.get(fld)
        if i is None or i >= len(cells):
            return None
        if fld == "name":
            return cell_text(cells, i)
        try:
            return fnum(cells[i])
        except ValueError:
            return None

    return tuple(val(f) for f in FP_FIELDS)


@dataclass(frozen=True)
class Cycle:
    """How rows map to GPUs.  ``mode``: ``one`` (a single GPU), ``key`` (constant values
    tell the GPUs apart: ``key_fields``), ``time`` (rows of a tick are within ``split``
    seconds, GPUs in row order) or ``cycle`` (every n rows, GPUs in row order)."""

    n: int
    mode: str
    note: str
    split: float | None = None
    key_fields: tuple[str, ...] = ()
    sub_stamp: bool = False  # several ticks share one whole-second timestamp


def _distances(values: Sequence[object], max_lag: int, numeric: bool) -> list[float] | None:
    """Mean distance between a value and the one ``p`` rows later, for p = 1..max_lag,
    normalised by the spread of the values; None when the field says nothing."""
    if sum(v is None for v in values) > len(values) // 4:
        return None
    if numeric:
        nums = [v for v in values if isinstance(v, float)]
        if len(nums) < 6:
            return None
        mean = sum(nums) / len(nums)
        scale = sum(abs(v - mean) for v in nums) / len(nums)
        if scale <= 1e-9 * (abs(mean) + 1.0):
            return None  # constant: no evidence
    out = []
    for p in range(1, max_lag + 1):
        total, pairs = 0.0, 0
        for a, b in zip(values, itertools.islice(values, p, None), strict=False):
            if a is None or b is None:
                continue
            pairs += 1
            if numeric:
                total += abs(a - b)  # type: ignore[operator]
            elif a != b:
                total += 1.0
        if pairs == 0:
            return None
        out.append(total / pairs / (scale if numeric else 1.0))
    return out


def _vote(d: list[float]) -> int | None:
    """The cycle one field shows (1: none), or None when it cannot tell."""
    lo, hi = min(d), max(d)
    if hi - lo <= 1e-9:
        return None
    best = next(p for p, v in enumerate(d, 1) if v <= lo + 0.05 * (hi - lo))
    if best == 1:
        return 1 if len(d) > 1 and d[0] < 0.5 * min(d[1:]) else None
    if d[best - 1] < 0.5 * min(d[: best - 1]):
        return best
    return None


def cycle_period(
    fps: Sequence[Fingerprint], max_gpus: int = 16, trusted: tuple[str, ...] = EVIDENCE
) -> tuple[int | None, str]:
    """The row cycle the values show: (n, field that showed it); n None when none can tell.

    Fields are asked in order of trust; the first that shows a clear cycle decides.  Only
    ``trusted`` fields are asked.  Temperature and power count only where the GPUs they
    would make work alike (power also needs utilisation to be logged): one GPU whose
    bursts come every n rows heats and draws every n rows too, while idle GPUs each keep
    their own draw to the hundredth of a watt.
    """
    max_lag = min(max_gpus, len(fps) // 3)
    if max_lag < 2:
        return None, ""
    for f, name in enumerate(FP_FIELDS):
        if name not in trusted:
            continue
        values = [fp[f] if f < len(fp) else None for fp in fps]
        d = _distances(values, max_lag, numeric=name != "name")
        if d is None:
            continue
        vote = _vote(d)
        if vote is None:
            continue
        if name in FOLLOWS_LOAD and vote > 1 and not _apart_from_load(fps, name, vote):
            continue
        return vote, name
    return None, ""


LOAD_APART = 10.0  # percentage points of utilisation between GPUs that work alike


def _apart_from_load(fps: Sequence[Fingerprint], name: str, n: int) -> bool:
    """Whether a cycle of n rows in temperature or power can be n GPUs of their own: the
    GPUs it would make work alike (their mean utilisations within ``LOAD_APART``).  If it
    would make one busy and another idle, it is one GPU heating and drawing with its
    bursts.  Without utilisation logged, temperature is taken (as before utilisation was
    asked) and power is not."""
    sums = [0.0] * n
    counts = [0] * n
    for i, fp in enumerate(fps):
        u = fp[_UTIL] if len(fp) > _UTIL else None
        if isinstance(u, float):
            sums[i % n] += u
            counts[i % n] += 1
    if sum(counts) < len(fps) * 3 // 4 or not all(counts):
        return name == "temp"
    means = [s / c for s, c in zip(sums, counts, strict=True)]
    return max(means) - min(means) < LOAD_APART


def _positions(n: int, times: Sequence[float] | None, split: float | None) -> list[int]:
    """Each prefix row's position in its tick (rows with times and a split only)."""
    if times is None or split is None:
        return []
    out, pos, last = [], -1, float("-inf")
    for t in times:
        pos = 0 if t - last > split or t < last or pos + 1 >= n else pos + 1
        last = t if pos == 0 else last
        out.append(pos)
    return out


def static_key(fps: Sequence[Fingerprint], positions: Sequence[int], n: int) -> tuple[str, ...]:
    """The constant fields that tell the n GPUs apart (empty when they cannot)."""
    chosen: list[int] = []
    modes: list[list[object]] = [[] for _ in range(n)]
    for f, name in enumerate(FP_FIELDS):
        if name not in STATIC:
            continue
        per: list[dict[object, int]] = [{} for _ in range(n)]
        for fp, pos in zip(fps, positions, strict=False):
            v = fp[f]
            if v is not None:
                per[pos][v] = per[pos].get(v, 0) + 1
        if not all(per):
            continue
        constant = all(max(c.values()) >= 0.95 * sum(c.values()) for c in per)
        if not constant:
            continue
        chosen.append(f)
        for pos in range(n):
            modes[pos].append(max(per[pos], key=per[pos].__getitem__))
        if len({tuple(m) for m in modes}) == n:
            return tuple(FP_FIELDS[i] for i in chosen)
    return ()


def infer(
    times: Sequence[float] | None,
    fps: Sequence[Fingerprint],
    interval_hint: str = "",
) -> Cycle:
    """The GPU cycle of a log's first rows (times None: the log has no time column)."""
    none = "no index, uuid or pci.bus_id column"
    n_t = split = None
    equal = fine = False
    if times is not None and len(times) >= 4:
        got = split_threshold(times)
        if got is not None:
            n_t, split = got
            inside = [b - a for a, b in itertools.pairwise(times) if 0 <= b - a <= split]
            equal = bool(inside) and max(inside) == 0.0
        fine = any(abs(t - round(t)) > 1e-6 for t in times)
    # Rows a regular interval apart, each with its own time, are one GPU's unless a value
    # that belongs to one GPU (not the workload's rhythm) says otherwise.
    regular = times is not None and len(times) >= 4 and n_t is None
    trusted = ("name", "mem_total", "power_limit", "mem_used", "power") if regular else EVIDENCE
    n_f, by = cycle_period(fps, trusted=trusted)
    if n_t is not None:
        weak = equal and not fine
        if weak and n_f is not None and n_f >= 2 and n_f != n_t and n_t % n_f == 0:
            # Several ticks of n_f GPUs under each whole-second timestamp.
            positions = [i % n_f for i in range(len(fps))]
            key = static_key(fps, positions, n_f)
            how = (
                f"each GPU's {FP_LABELS[by]} recurs every {n_f} rows, {n_t // n_f} ticks "
                "under each whole-second timestamp"
            )
            c = _cycle(n_f, None, key, how, none)
            return Cycle(c.n, c.mode, c.note, None, c.key_fields, sub_stamp=True)
        if not weak or n_f == n_t:
            positions = _positions(n_t, times, split)
            key = static_key(fps, positions, n_t)
            how = (
                "the rows of each tick share one timestamp"
                if equal
                else f"rows come in groups of {n_t} a few ms apart, ticks further apart"
            )
            if n_f == n_t:
                how += f", and each GPU's {FP_LABELS[by]} recurs every {n_t} rows"
            return _cycle(n_t, split, key, how, none)
        note = (
            f"1 GPU assumed ({none}): runs of {n_t} rows share whole-second timestamps, but "
            "the values do not cycle with them, so the rows are read as one GPU sampled "
            "faster than its clock"
        )
        return Cycle(1, "one", note, sub_stamp=True)
    if n_f is not None and n_f >= 2:
        positions = [i % n_f for i in range(len(fps))]
        key = static_key(fps, positions, n_f)
        how = f"each GPU's {FP_LABELS[by]} recurs every {n_f} rows"
        return _cycle(n_f, None, key, how, none)
    why = "neither the row times nor the values show a cycle of GPUs"
    if times is None and n_f is None:
        why = "no row times, and the values show no cycle of GPUs"
    return Cycle(1, "one", f"1 GPU assumed ({none}; {why})")


def _cycle(n: int, split: float | None, key: tuple[str, ...], how: str, none: str) -> Cycle:
    if key:
        names = " and ".join(FP_LABELS[k] for k in key)
        note = f"{n} GPUs inferred ({none}): {how}; each GPU known by its {names}"
        return Cycle(n, "key", note, split, key)
    mode = "time" if split is not None else "cycle"
    note = f"{n} GPUs inferred ({none}): {how}; GPUs taken in row order"
    return Cycle(n, mode, note, split)


class Assigner:
    """Follows a Cycle through the rows: ``gpu(t, key, mem, line_no)`` -> GPU index.

    ``breaks`` counts ticks that did not hold exactly n rows (``time``) or rows whose
    memory.used matched another GPU's better (``cycle``); each re-syncs the cycle.
    """

    __slots__ = ("_last_mem", "_n", "_ordinals", "_pos", "_split", "_t", "breaks", "first_break")

    def __init__(self, cycle: Cycle):
        self._n = cycle.n
        self._split = cycle.split
        self._pos = -1
        self._t = float("-inf")
        self._ordinals: dict[object, int] = {}
        self._last_mem: list[float | None] = [None] * cycle.n
        self.breaks = 0
        self.first_break: int | None = None

    def _broke(self, line_no: int) -> None:
        self.breaks += 1
        if self.first_break is None:
            self.first_break = line_no

    def by_key(self, key: object) -> int:
        gpu = self._ordinals.get(key)
        if gpu is None:
            gpu = self._ordinals[key] = len(self._ordinals)
        return gpu

    def by_time(self, t: float, line_no: int) -> int:
        pos = self._pos + 1
        gap = t - self._t > self._split or t < self._t  # type: ignore[operator]
        if gap or pos >= self._n:
            if self._pos >= 0 and (pos != self._n or not gap):
                self._broke(line_no)
            pos = 0
            self._t = t
        self._pos = pos
        return pos

    def by_cycle(self, mem: float | None, line_no: int) -> int:
        n = self._n
        pos = (self._pos + 1) % n
        last = self._last_mem
        prev = last[pos]
        if mem is not None and prev is not None:
            tol = max(64.0, 0.02 * mem)
            if abs(mem - prev) > tol:
                fits = [q for q, m in enumerate(last[:n]) if m is not None and abs(mem - m) <= tol]
                if len(fits) == 1:
                    pos = fits[0]
                    self._broke(line_no)
        if mem is not None:
            last[pos] = mem
        self._pos = pos
        return pos

    def reset(self) -> None:
        """A new header (nvidia-smi restarted): the next row is the first GPU."""
        self._pos = -1
        self._t = float("-inf")


def runs_of_equal(times: Sequence[float]) -> list[int]:
    """Lengths of the runs of identical times (several ticks under one whole second)."""
    return tick_runs(times, 0.0)


def tick_times(
    times: Sequence[float], keys: Sequence[str] | None, cycle: Cycle | None
) -> list[float]:
    """One time per tick: rows of a multi-GPU tick collapse into its first row's time.

    ``keys``: each row's GPU key (index, uuid, bus id) where the log has one; a tick ends
    where a GPU turns up again.  Without, the ``cycle`` says how rows make ticks."""
    if keys is not None and len(keys) == len(times):
        out: list[float] = []
        seen: set[str] = set()
        for k, t in zip(keys, times, strict=True):
            if k in seen or not seen:
                seen.clear()
                out.append(t)
            seen.add(k)
        return out
    if cycle is None or cycle.n <= 1:
        return list(times)
    if cycle.split is not None:
        out, last = [], float("-inf")
        for t in times:
            if t - last > cycle.split or t < last:
                out.append(t)
                last = t
        return out
    return list(times[:: cycle.n])


def whole_second_spacing(ticks: Sequence[float]) -> float | None:
    """The spacing to give ticks that share one whole-second timestamp (a logger at ~4
    rows a second stamping ``%H:%M:%S``), or None when ticks do not share them."""
    if len(ticks) < 6 or any(abs(t - round(t)) > 1e-6 for t in ticks):
        return None
    if len(set(ticks)) < 3:
        return None  # a clock that does not advance is not one of whole seconds
    runs = runs_of_equal(ticks)
    inner = runs[1:-1] if len(runs) > 3 else runs
    if not inner:
        return None
    inner.sort()
    typical = inner[len(inner) // 2]
    if typical < 2:
        return None
    return 1.0 / typical
