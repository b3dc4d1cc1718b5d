"""Long-format tables: one row per GPU, time and field, pivoted into samples.

    GPUId,TimeStampUs,Field,Values
    0,1733224517123456,power_usage_instant,62.45
    0,1733224517123460,gpu_utilization,97
    1,1733224517123502,power_usage_instant,58.10

as DCGM's API examples print what ``dcgmGetValuesSince`` hands them (``fieldMeta->tag``),
and as tidy exports write metrics (``timestamp,gpu,metric,value``).  The header names a
GPU column, a time column, a field column and a value column (in any order, among
others).  Field names are DCGM's (any of its three names: ``dcgm_fields``) or any name a
table's header may use (``columns.classify``); fields gpumon has no use for (the clock
event reasons, ECC counters) are named as not read.

The rows of one sample need not share a timestamp (each field is sampled on its own,
microseconds apart) nor come together (DCGM hands over one field's samples at a time):
a GPU's rows within half the sampling interval of each other are one sample, gathered in
a bounded window and handed over in time order.  The samples are then rows of a wide
table under nvidia-smi's names, read by the table reader.  A log of power without
utilisation is read, and says what it can and cannot judge.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, pairwise

from gpumon.errors import TraceFormatError
from gpumon.model import Snapshot, TraceHeader
from gpumon.traces import dcgm_fields
from gpumon.traces._common import Tally, cut_short_warning, fnum, is_cut_short
from gpumon.traces.columns import GPU_WORDS, NVSMI_FIELDS, classify, decamel, tokens
from gpumon.traces.reader import Reader
from gpumon.traces.source import Source, as_source
from gpumon.traces.table import sniff_delimiter, split_plain
from gpumon.traces.tabular import read_table
from gpumon.traces.timefmt import pick

FORMAT = "long-table"
PREFIX_LINES = 4000  # rows read ahead: the fields, the GPUs, the sampling interval
MAX_PENDING = 1 << 15  # samples gathered before the oldest are handed over
HORIZON_S = 8.0  # a sample is complete once rows this much newer arrive
MAX_FIELDS = 64
SEP = "\x1f"

_GPU_KEY_WORDS = GPU_WORDS | frozenset(("id", "index", "idx", "num", "no", "number"))
_FIELD_WORDS = frozenset(("field", "metric", "key", "counter", "measure", "name", "tag"))
_VALUE_WORDS = frozenset(("value", "values", "val", "reading", "measurement"))
# gpumon's field -> nvidia-smi's name for it (the table reader's own vocabulary).
_NVSMI_NAME = {fld: name for name, (fld, rank) in reversed(NVSMI_FIELDS.items()) if rank == 0}
_NVSMI_NAME["util_prof"] = "utilization.gpu"  # the graphics engine's activity, if no util
_PREFERENCE = {"util_prof": 5}  # ranks below every direct reading of its field


class _Header:
    """Where a long table keeps the GPU, the time, the field and the value."""

    def __init__(self, cells: list[str]):
        self.count = len(cells)
        self.gpu = self.time = self.field = self.value = -1
        self.gpu_name = "index"  # what the GPU column holds, by nvidia-smi's name for it
        for i, cell in enumerate(cells):
            words = set(tokens(decamel(cell)))
            col = classify(decamel(cell))
            if self.gpu < 0 and words and words <= _GPU_KEY_WORDS and words & GPU_WORDS:
                self.gpu = i  # "gpu", "GPU ID", "device": the GPU's number
            elif col.field in ("index", "uuid", "bus") and self.gpu < 0:
                self.gpu = i
                self.gpu_name = {"index": "index", "uuid": "uuid", "bus": "pci.bus_id"}[col.field]
            elif col.field == "time" and self.time < 0:
                self.time = i
            elif words & _FIELD_WORDS and self.field < 0:
                self.field = i
            elif words & _VALUE_WORDS and self.value < 0:
                self.value = i

    @property
    def complete(self) -> bool:
        return min(self.gpu, self.time, self.field, self.value) >= 0


def _field(name: str) -> tuple[str, float, int] | None:
    """(nvidia-smi's column name, scale to its unit, rank) of a long table's field name;
    None for a field gpumon has no use for."""
    d = dcgm_fields.lookup(name)
    if d is not None:
        target = _NVSMI_NAME.get(d.field)
        return None if target is None else (target, d.scale, d.rank + _PREFERENCE.get(d.field, 0))
    col = classify(decamel(name))
    target = _NVSMI_NAME.get(col.field or "")
    if target is None or col.gpu is not None:
        return None
    return target, col.scale, 0


def sniff(head: list[str]) -> bool:
    """A header naming a GPU, a time, a field and a value column, and rows under it whose
    field cells are names."""
    lines = [ln for ln in head[:64] if ln.strip() and not ln.lstrip().startswith("#")]
    if len(lines) < 2:
        return False
    delim = sniff_delimiter(lines) or ","
    hdr = _Header(split_plain(lines[0].rstrip("\r\n"), delim))
    if not hdr.complete:
        return False
    rows = [split_plain(ln.rstrip("\r\n"), delim) for ln in lines[1:]]
    rows = [r for r in rows if len(r) == hdr.count]
    return bool(rows) and all(r[hdr.field].strip()[:1].isalpha() for r in rows)


class _Row:
    """One sample being gathered: its time (its first row's), line, cells and the rank of
    the field each cell holds."""

    __slots__ = ("cells", "no", "ranks", "stamp", "t")

    def __init__(self, t: float, stamp: str, no: int, width: int):
        self.t = t
        self.stamp = stamp
        self.no = no
        self.cells = [""] * width
        self.ranks: dict[int, int] = {}


class _Pivot:
    """Long rows to wide rows: a GPU's rows in one sampling slot (within half an interval
    of the slot's time) are one sample, however they are ordered; samples are handed over
    oldest first once ``HORIZON`` seconds older than the newest row, or once
    ``MAX_PENDING`` are gathered."""

    def __init__(self, hdr: _Header, delim: str, names: list[str], spacing: float, path: str):
        self.hdr = hdr
        self.delim = delim
        self.width = len(names)
        self.at = {n: i for i, n in enumerate(names)}
        self.spacing = spacing
        self.horizon = max(HORIZON_S, 256 * spacing)
        self.path = path
        self.parse: Callable[[str], float] = float
        self.base: float | None = None
        self.newest = float("-inf")
        self.open: dict[tuple[str, int], _Row] = {}
        self.order: list[tuple[float, int, str, int]] = []  # heap: (t, seq, gpu, slot)
        self.seq = 0
        self.unread_fields: dict[str, None] = {}
        self.malformed = Tally("row(s) that are not a GPU, a time, a field and a value: skipped")
        self.later = Tally("row(s) of fields the first rows lack: not read")

    def rows(
        self, numbered: Iterator[tuple[int, str]], warns: list[str]
    ) -> Iterator[tuple[int, str]]:
        """The wide rows (numbered by their first long row), in time order."""
        for no, line in numbered:
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            got = self._parse(no, line, s, warns)
            if got is None:
                if is_cut_short(line) and not line.endswith("\n"):
                    break
                continue
            gpu, t, stamp, spec, value, raw = got
            self._take(no, gpu, t, stamp, spec, value, raw)
            while self.order and (
                len(self.open) > MAX_PENDING or self.order[0][0] < self.newest - self.horizon
            ):
                yield self._pop()
        while self.order:
            yield self._pop()

    def _parse(
        self, no: int, line: str, s: str, warns: list[str]
    ) -> tuple[str, float, str, tuple[str, float, int], float | None, str] | None:
        hdr = self.hdr
        cells = split_plain(line.rstrip("\r\n"), self.delim)
        if len(cells) != hdr.count:
            if is_cut_short(line):
                warns.append(cut_short_warning(self.path, no))
            else:
                self.malformed.note(no, s)  # a row run into another, a banner
            return None
        name = cells[hdr.field].strip()
        gpu = cells[hdr.gpu].strip()
        if not gpu or not name[:1].isalpha() or classify(cells[hdr.time]).field == "time":
            self.malformed.note(no, s)  # the header again, or a row missing its GPU
            return None
        spec = _field(name)
        if spec is None:
            if len(self.unread_fields) < MAX_FIELDS:
                self.unread_fields.setdefault(name)
            return None
        if spec[0] not in self.at:
            self.later.note(no, s)
            return None
        try:
            t = self.parse(cells[hdr.time])
            value = fnum(cells[hdr.value])
        except (ValueError, OverflowError):
            self.malformed.note(no, s)
            return None
        return gpu, t, cells[hdr.time].strip(), spec, value, cells[hdr.value].strip()

    def _take(
        self,
        no: int,
        gpu: str,
        t: float,
        stamp: str,
        spec: tuple[str, float, int],
        value: float | None,
        raw: str,
    ) -> None:
        if self.base is None:
            self.base = t
        self.newest = max(self.newest, t)
        slot = round((t - self.base) / self.spacing)
        key = (gpu, slot)
        row = self.open.get(key)
        if row is None:
            row = self.open[key] = _Row(t, stamp, no, self.width)
            self.seq += 1
            heapq.heappush(self.order, (t, self.seq, gpu, slot))
        target, scale, rank = spec
        i = self.at[target]
        if rank < row.ranks.get(i, 99):
            row.cells[i] = "" if value is None else raw if scale == 1.0 else repr(value * scale)
            row.ranks[i] = rank

    def _pop(self) -> tuple[int, str]:
        _, _, gpu, slot = heapq.heappop(self.order)
        row = self.open.pop((gpu, slot))
        return row.no, SEP.join([gpu, row.stamp, *row.cells]) + "\n"

    def say(self, warns: list[str]) -> None:
        self.malformed.say(self.path, warns)
        self.later.say(self.path, warns)


def read(
    lines: Iterable[str] | Source,
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse a long-format table: the header now, the snapshots lazily."""
    warns = warnings if warnings is not None else []
    numbered = enumerate(as_source(lines, path).lines(), 1)
    prefix: list[tuple[int, str]] = []
    for item in numbered:
        prefix.append(item)
        if len(prefix) >= PREFIX_LINES:
            break
    content = [(no, ln) for no, ln in prefix if ln.strip() and not ln.lstrip().startswith("#")]
    if len(content) < 2:
        raise TraceFormatError("no rows under the long table's header", path=path)
    delim = sniff_delimiter([ln for _, ln in content]) or ","
    header_no, header_line = content[0]
    hdr = _Header(split_plain(header_line.rstrip("\r\n"), delim))
    if not hdr.complete:
        raise TraceFormatError(
            "not a long table: the header names no GPU, time, field and value columns",
            path=path,
            line=header_no,
        )
    rows = [split_plain(ln.rstrip("\r\n"), delim) for _, ln in content[1:]]
    rows = [r for r in rows if len(r) == hdr.count and r[hdr.field].strip()[:1].isalpha()]
    parser = pick(
        [r[hdr.time] for r in rows[:64]], split_plain(header_line, delim)[hdr.time].lower()
    )
    if parser is None:
        raise TraceFormatError(
            "the long table's time column holds no time gpumon reads", path=path, line=header_no
        )
    names: dict[str, None] = {}
    series: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        spec = _field(r[hdr.field].strip())
        if spec is None:
            continue
        names.setdefault(spec[0])
        try:
            series.setdefault((r[hdr.gpu].strip(), r[hdr.field].strip()), []).append(
                parser.parse(r[hdr.time])
            )
        except ValueError:
            continue
    if not names:
        raise TraceFormatError(
            "the long table names no field gpumon reads (utilisation, memory, power, ...)",
            path=path,
            line=header_no,
        )
    spacing = _field_spacing(series) or interval_s or 1.0
    pivot = _Pivot(hdr, delim, list(names), spacing, path)
    pivot.parse = parser.parse
    columns = [hdr.gpu_name, "timestamp", *names]
    body = (item for item in chain(prefix, numbered) if item[0] > header_no)
    header, snapshots = read_table(
        pivot.rows(body, warns),
        path,
        warns,
        interval_s,
        columns=columns,
        delim=SEP,
        source=FORMAT,
    )
    unread = list(pivot.unread_fields)
    if unread:
        header.extra["ignored_columns"] = unread
    return header, _saying(snapshots, pivot, warns)


def _field_spacing(series: dict[tuple[str, str], list[float]]) -> float | None:
    """The median spacing of one field's samples on one GPU: the sampling interval."""
    gaps = sorted(b - a for times in series.values() for a, b in pairwise(times) if b > a)
    return gaps[len(gaps) // 2] if gaps else None


def _saying(snapshots: Iterator[Snapshot], pivot: _Pivot, warns: list[str]) -> Iterator[Snapshot]:
    try:
        yield from snapshots
    finally:
        pivot.say(warns)


READER = Reader(
    FORMAT,
    "long tables, one row per GPU, time and field (GPUId,TimeStampUs,Field,Values as DCGM's "
    "examples print; timestamp,gpu,metric,value)",
    sniff,
    read,
)
