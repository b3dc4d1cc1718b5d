"""``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits] -l N | -lms N`` logs.

Columns are mapped by header name (any order, any subset; ``utilization.gpu [%]`` and
``utilization.gpu`` alike), once per header -- headers repeated mid-file (nvidia-smi
restarted, logs concatenated) re-map them.  Per row only the time, the GPU and the
utilisation are parsed; other fields are parsed for the rows that become samples (the
last of each GPU in a tick or ~1 s window), which keeps 4 M rows within seconds.

Without an ``index``/``uuid``/``pci.bus_id`` column, GPUs are consecutive rows of one
tick: their count is inferred from the row times (rows of a tick are milliseconds apart,
ticks an interval apart) or, without times, from the repeating pattern of slow-moving
values.  Without a header, columns are guessed from the units of their values; without a
header *and* without units that is impossible and the error says how to re-run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from math import isfinite

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, GpuSample, Point, Snapshot, TraceHeader
from gpumon.traces._common import (
    MIB,
    NVSMI_TIME_RE,
    Assembler,
    Positional,
    bad_line,
    cut_short_warning,
    is_cut_short,
    median_interval,
    num,
    nvsmi_time,
    repeat_period,
    split_threshold,
)

FORMAT = "nvidia-smi-csv"
PREFIX_ROWS = 600  # rows read ahead to name the GPUs and measure the interval

# Header name (as nvidia-smi prints it, or as it can be queried) -> (field, priority).
# Lower priority wins when several columns give the same field.
_FIELDS: dict[str, tuple[str, int]] = {
    "timestamp": ("time", 0),
    "index": ("index", 0),
    "uuid": ("uuid", 0),
    "gpu_uuid": ("uuid", 0),
    "name": ("name", 0),
    "gpu_name": ("name", 0),
    "pci.bus_id": ("bus", 0),
    "gpu_bus_id": ("bus", 0),
    "utilization.gpu": ("util", 0),
    "utilization.memory": ("mem_util", 0),
    "memory.used": ("mem_used", 0),
    "memory.total": ("mem_total", 0),
    "memory.free": ("mem_free", 0),
    "power.draw": ("power", 0),
    "power.draw.instant": ("power", 1),
    "power.draw.average": ("power", 2),
    "enforced.power.limit": ("power_limit", 0),
    "power.limit": ("power_limit", 1),
    "temperature.gpu": ("temp", 0),
    "clocks.sm": ("sm_clock", 0),
    "clocks.current.sm": ("sm_clock", 0),
    "clocks_event_reasons.active": ("reasons", 0),
    "clocks_throttle_reasons.active": ("reasons", 0),
}

# Any of these starts a header cell: recognises a header even when no column is one we use.
_KNOWN_PREFIXES = (
    "timestamp",
    "driver_version",
    "count",
    "name",
    "gpu_name",
    "gpu_uuid",
    "gpu_bus_id",
    "gpu_serial",
    "serial",
    "uuid",
    "index",
    "pci.",
    "pcie.",
    "display_",
    "persistence_mode",
    "accounting.",
    "driver_model.",
    "vbios_version",
    "inforom.",
    "gom.",
    "fan.speed",
    "pstate",
    "clocks",
    "memory.",
    "compute_mode",
    "compute_cap",
    "utilization.",
    "encoder.",
    "fbc.",
    "ecc.",
    "retired_pages.",
    "remapped_rows.",
    "temperature.",
    "power.",
    "enforced.power",
    "mig.",
    "reset_status.",
    "protected_memory",
    "module_id",
    "addressing_mode",
)


def _canonical(cell: str) -> str:
    """``" utilization.gpu [%]"`` -> ``"utilization.gpu"``."""
    name = cell.strip().lower()
    bracket = name.find(" [")
    return name[:bracket] if bracket >= 0 else name


def is_header(line: str) -> bool:
    first = line.lstrip("\ufeff").split(",", 1)[0]
    return bool(first[:1].isalpha()) and _canonical(first).startswith(_KNOWN_PREFIXES)


@dataclass
class Columns:
    """Where each field sits in a row, built once per header."""

    count: int
    at: dict[str, int] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    guessed: bool = False  # named from value shapes (no header)
    _builder: Callable[..., GpuSample] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_header(cls, cells: list[str]) -> Columns:
        cols = cls(count=len(cells))
        best: dict[str, int] = {}
        for i, cell in enumerate(cells):
            name = _canonical(cell)
            known = _FIELDS.get(name)
            if known is None:
                cols.ignored.append(name)
                continue
            fld, prio = known
            if fld not in cols.at or prio < best[fld]:
                cols.at[fld] = i
                best[fld] = prio
        return cols

    @property
    def builder(
        self,
    ) -> Callable[[int, float, float | None, tuple[Point, ...], list[str]], GpuSample]:
        if self._builder is None:
            self._builder = _compile(self)
        return self._builder

    def key_column(self) -> str | None:
        for fld in ("index", "uuid", "bus"):
            if fld in self.at:
                return fld
        return None


# --- no header: name the columns by the shapes of their values --------------------------

_UUID_RE = re.compile(r"^\s*(GPU|MIG)-[0-9a-fA-F-]+\s*$")
_BUS_RE = re.compile(r"^\s*[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]\s*$")
_INT_RE = re.compile(r"^\s*\d+\s*$")
_UNIT_RE = re.compile(r"^\s*-?[\d.]+ (%|MiB|W|MHz)\s*$")


def guess_columns(rows: list[list[str]], path: str) -> Columns:
    """Columns of a headerless log, from the units in its values (``92 %``, ``49140 MiB``)."""
    ncols = len(rows[0])
    sample = [r for r in rows[:64] if len(r) == ncols]
    kinds: list[str] = []
    for i in range(ncols):
        values = [r[i] for r in sample]
        if all(NVSMI_TIME_RE.match(v) for v in values):
            kinds.append("time")
        elif all(_UUID_RE.match(v) for v in values):
            kinds.append("uuid")
        elif all(_BUS_RE.match(v) for v in values):
            kinds.append("bus")
        elif all(_INT_RE.match(v) for v in values):
            ints = {int(v) for v in values}
            kinds.append("index" if ints == set(range(len(ints))) else "int")
        else:
            units = {m.group(1) if (m := _UNIT_RE.match(v)) else None for v in values}
            units.discard(None) if len(units) > 1 else None
            unit = units.pop() if len(units) == 1 else None
            if unit is not None:
                kinds.append(unit)
            elif all(v.strip()[:1].isalpha() and not v.strip().startswith("[") for v in values):
                kinds.append("name")
            else:
                kinds.append("?")
    if not any(k in ("%", "MiB", "W", "MHz") for k in kinds):
        raise TraceFormatError(
            "nvidia-smi CSV without a header and without units: its columns cannot be named. "
            "Re-run nvidia-smi with --format=csv (keeping the header line), or at least "
            "without 'nounits'",
            path=path,
            line=1,
        )
    cols = Columns(count=ncols, guessed=True)

    def constant(i: int) -> bool:
        return len({r[i].strip() for r in sample}) == 1

    def first(kind: str) -> list[int]:
        return [i for i, k in enumerate(kinds) if k == kind]

    for kind, fld in (
        ("time", "time"),
        ("uuid", "uuid"),
        ("bus", "bus"),
        ("index", "index"),
        ("name", "name"),
    ):
        if first(kind):
            cols.at[fld] = first(kind)[0]
    pct = first("%")
    if pct:
        cols.at["util"] = pct[0]
    if len(pct) > 1:
        cols.at["mem_util"] = pct[1]
    mib = first("MiB")
    totals = [i for i in mib if constant(i)]
    if totals and len(mib) > 1:
        total = max(totals, key=lambda i: num(sample[0][i]) or 0.0)
        cols.at["mem_total"] = total
        rest = [i for i in mib if i != total]
        cols.at["mem_used"] = rest[0]
        if len(rest) > 1:
            cols.at["mem_free"] = rest[1]
    elif mib:
        cols.at["mem_used"] = mib[0]
    watts = first("W")
    varying = [i for i in watts if not constant(i)]
    if watts:
        cols.at["power"] = (varying or watts)[0]
        limits = [i for i in watts if i != cols.at["power"] and constant(i)]
        if limits:
            cols.at["power_limit"] = limits[0]
    if first("MHz"):
        cols.at["sm_clock"] = first("MHz")[0]
    temps = [i for i in first("int") if all(5 <= int(r[i]) <= 120 for r in sample)]
    if temps:
        cols.at["temp"] = temps[0]
    return cols


# --- reading ----------------------------------------------------------------------------


def sniff(head: list[str]) -> bool:
    """True when the first lines look like nvidia-smi --query-gpu CSV output.

    Every header cell must be an nvidia-smi query name: a home-made ``timestamp,gpu_util``
    log is left to the simple CSV reader.
    """
    lines = [ln.lstrip("\ufeff") for ln in head if ln.strip()]
    if not lines:
        return False
    cells = lines[0].rstrip("\r\n").split(",")
    if is_header(lines[0]):
        names = [_canonical(c) for c in cells]
        return all(n.startswith(_KNOWN_PREFIXES) for n in names) and any(
            n in _FIELDS and n not in ("timestamp", "name") for n in names
        )
    if len(cells) > 1 and NVSMI_TIME_RE.match(cells[0]):
        return True
    # noheader without a timestamp first: rows of the same width with nvidia-smi units.
    rows = [ln.rstrip("\r\n").split(",") for ln in lines[:8]]
    return (
        len(rows) >= 2
        and len(cells) > 1
        and all(len(r) == len(cells) and any(_UNIT_RE.match(c) for c in r) for r in rows)
    )


def _field(cells: list[str], at: dict[str, int], fld: str) -> float | None:
    i = at.get(fld)
    return None if i is None else num(cells[i])


def _text(cells: list[str], at: dict[str, int], fld: str) -> str | None:
    i = at.get(fld)
    if i is None:
        return None
    value = cells[i].strip()
    return None if not value or value.startswith("[") or value == "N/A" else value


def _reasons(cells: list[str], at: dict[str, int]) -> int | None:
    value = _text(cells, at, "reasons")
    return None if value is None else int(value, 16 if value.lower().startswith("0x") else 10)


def _fnum(cell: str) -> float | None:
    """``num`` with a fast path for the common ``49140 MiB`` / ``150.20 W`` / ``92``."""
    try:
        value = float(cell.rstrip(" %WMiBHzC\r\n"))
    except ValueError:
        return num(cell)
    return value if isfinite(value) else num(cell)  # "nan" is no reading, "inf" an error


def _compile(
    cols: Columns,
) -> Callable[[int, float, float | None, tuple[Point, ...], list[str]], GpuSample]:
    """A GpuSample builder for one header: the column positions are looked up once here,
    not for every sample (a day of 8 GPUs makes ~700 k of them)."""
    at = cols.at
    i_used, i_total, i_free = at.get("mem_used"), at.get("mem_total"), at.get("mem_free")
    i_mutil, i_power, i_limit = at.get("mem_util"), at.get("power"), at.get("power_limit")
    i_clock, i_temp, i_util = at.get("sm_clock"), at.get("temp"), at.get("util")
    has_reasons = "reasons" in at
    uuids: dict[int, str] = {}

    def build(
        gpu: int, t: float, util: float | None, points: tuple[Point, ...], cells: list[str]
    ) -> GpuSample:
        uuid = uuids.get(gpu)
        if uuid is None:  # a GPU's identity does not change under one header
            uuid = uuids[gpu] = _text(cells, at, "uuid") or _text(cells, at, "bus") or f"gpu{gpu}"
        mem_used = None if i_used is None else _fnum(cells[i_used])
        mem_total = None if i_total is None else _fnum(cells[i_total])
        if mem_used is None and mem_total is not None and i_free is not None:
            free = _fnum(cells[i_free])
            mem_used = None if free is None else mem_total - free
        clock = None if i_clock is None else _fnum(cells[i_clock])
        return GpuSample(
            t_s=t,
            gpu=gpu,
            uuid=uuid,
            util_samples=points,
            util_pct=util,
            mem_util_pct=None if i_mutil is None else _fnum(cells[i_mutil]),
            mem_used_bytes=None if mem_used is None else int(mem_used * MIB),
            mem_total_bytes=None if mem_total is None else int(mem_total * MIB),
            power_watts=None if i_power is None else _fnum(cells[i_power]),
            power_limit_watts=None if i_limit is None else _fnum(cells[i_limit]),
            sm_clock_mhz=None if clock is None else int(clock),
            clock_event_reasons=_reasons(cells, at) if has_reasons else None,
            temperature_c=None if i_temp is None else _fnum(cells[i_temp]),
            # A GPU that fell off the bus reads "[GPU is lost]" in every cell.
            lost=util is None and i_util is not None and cells[i_util].strip() == "[GPU is lost]",
        )

    return build


def make_sample(
    gpu: int,
    t: float,
    util: float | None,
    points: tuple[Point, ...],
    cols: Columns,
    cells: list[str],
) -> GpuSample:
    """A GpuSample from one row's cells (raises ValueError on a malformed cell)."""
    return cols.builder(gpu, t, util, points, cells)


class _Gpus:
    """Maps a row to its GPU index: the index column, else an ordinal of uuid/bus id, else
    the row's position within its tick."""

    def __init__(self, cols: Columns, positional: Positional | None):
        self.key = cols.key_column()
        self.key_at = cols.at.get(self.key) if self.key else None
        self.ordinals: dict[str, int] = {}
        self.positional = positional

    def of(self, cells: list[str], t: float | None) -> int:
        if self.key == "index":
            return int(cells[self.key_at])  # type: ignore[index]
        if self.key is not None:
            k = cells[self.key_at].strip()  # type: ignore[index]
            gpu = self.ordinals.get(k)
            if gpu is None:
                gpu = self.ordinals[k] = len(self.ordinals)
            return gpu
        assert self.positional is not None
        return self.positional.gpu(t)


def read(
    lines: Iterable[str], path: str = "<input>", warnings: list[str] | None = None
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse an nvidia-smi CSV log: the header now, the snapshots lazily.

    ``lines`` keep their line endings (a last line without one was cut short).
    """
    warns = warnings if warnings is not None else []
    numbered = enumerate(lines, 1)
    prefix: list[tuple[int, str]] = []
    header_cells: list[str] | None = None
    rows: list[list[str]] = []
    for no, line in numbered:
        prefix.append((no, line))
        if not line.strip():
            continue
        if is_header(line):
            if header_cells is None and not rows:
                header_cells = line.lstrip("\ufeff").rstrip("\r\n").split(",")
            continue
        cells = line.rstrip("\r\n").split(",")
        if header_cells is None or len(cells) == len(header_cells):
            rows.append(cells)
        if len(rows) >= PREFIX_ROWS:
            break
    if header_cells is None and not rows:
        raise TraceFormatError("no nvidia-smi CSV rows found", path=path)

    extra: dict[str, object] = {"timestamps": "local time of the logging machine, read as UTC"}
    if header_cells is not None:
        cols = Columns.from_header(header_cells)
    else:
        cols = guess_columns(rows, path)
        extra["columns_guessed"] = {f: i for f, i in sorted(cols.at.items(), key=lambda x: x[1])}
        warns.append(
            f"{path}: no header line; columns named from their values "
            f"({', '.join(sorted(cols.at, key=cols.at.__getitem__))})"
        )
    if cols.ignored:
        extra["ignored_columns"] = cols.ignored
    if "util" not in cols.at:
        warns.append(f"{path}: no utilization.gpu column; the GPUs' activity cannot be judged")
    rows = [r for r in rows if len(r) == cols.count]
    t_at = cols.at.get("time")
    times: list[float] | None = None
    if t_at is not None:
        try:
            times = [nvsmi_time(r[t_at]) for r in rows]
        except (ValueError, IndexError):
            times = None  # the row loop below names the bad line

    positional = None
    if cols.key_column() is None:
        n, split = 1, None
        inferred = split_threshold(times) if times else None
        if inferred is not None:
            n, split = inferred
            how = "from the row times"
        else:
            slow = [
                cols.at[f] for f in ("name", "mem_total", "mem_used", "power_limit") if f in cols.at
            ]
            period = repeat_period([tuple(r[i] for i in slow) for r in rows]) if slow else None
            if times is None and period is not None:
                n, how = period, "from the repeating pattern of memory and power values"
            else:
                how = "one GPU assumed"
        positional = Positional(n, split)
        extra["gpus_inferred"] = f"{n} ({how}; no index, uuid or pci.bus_id column)"

    # GPU identities and the interval, from the prefix.
    gpus = _Gpus(cols, positional)
    identities: dict[int, GpuIdentity] = {}
    tick_times: list[float] = []
    seen: set[int] = set()
    try:
        for i, r in enumerate(rows):
            t = times[i] if times is not None else None
            gpu = gpus.of(r, t)
            if gpu in seen or not seen:
                seen.clear()
                if t is not None:
                    tick_times.append(t)
            seen.add(gpu)
            if gpu not in identities:
                s = make_sample(gpu, 0.0, None, (), cols, r)
                identities[gpu] = GpuIdentity(
                    index=gpu,
                    uuid=s.uuid,
                    name=_text(r, cols.at, "name"),
                    pci_bus_id=_text(r, cols.at, "bus"),
                    mem_total_bytes=s.mem_total_bytes,
                    power_limit_watts=s.power_limit_watts,
                )
    except (ValueError, IndexError):
        pass  # the row loop below names the bad line
    interval = median_interval(tick_times) if tick_times else None
    if t_at is None:
        interval = 1.0
        extra["interval_assumed"] = "no timestamp column: rows assumed 1 s apart"
    header = TraceHeader(
        version=1,
        source=FORMAT,
        started_wall_s=times[0] if times else None,
        started_mono_s=0.0,
        interval_s=interval,
        gpus=tuple(identities[g] for g in sorted(identities)),
        extra=extra,
    )
    return header, _snapshots(chain(prefix, numbered), cols, header, path, warns)


def _snapshots(
    lines: Iterator[tuple[int, str]],
    cols: Columns,
    header: TraceHeader,
    path: str,
    warns: list[str],
) -> Iterator[Snapshot]:
    t0 = header.started_wall_s or 0.0
    interval = header.interval_s or 1.0
    positional_n = None
    if cols.key_column() is None:
        positional_n = len(header.gpus) or 1

    def build(
        gpu: int, t: float, util: float | None, points: tuple[Point, ...], payload: tuple
    ) -> GpuSample:
        row_cols, cells = payload[:2]
        return make_sample(gpu, t, util, points, row_cols, cells)

    asm = Assembler(build, interval, path)
    add = asm.add
    split = 0.5 * interval
    tick = -1
    seen: set[int] = set()
    header_names: list[str] | None = None
    # Per-header state, rebuilt when a different header appears mid-file.
    gpus = _Gpus(cols, Positional(positional_n or 1, split) if cols.key_column() is None else None)
    t_at, u_at, ncols = cols.at.get("time"), cols.at.get("util"), cols.count
    index_at = cols.at.get("index") if gpus.key == "index" else None
    last_stamp, last_t = "", 0.0  # the GPUs of one tick share their timestamp text
    for no, line in lines:
        if line[:1].isalpha() and is_header(line):
            cells = line.lstrip("\ufeff").rstrip("\r\n").split(",")
            names = [_canonical(c) for c in cells]
            if names == header_names:
                continue  # the same header again (nvidia-smi restarted, logs concatenated)
            header_names = names
            cols = Columns.from_header(cells)
            gpus = _Gpus(
                cols, Positional(positional_n or 1, split) if cols.key_column() is None else None
            )
            t_at, u_at, ncols = cols.at.get("time"), cols.at.get("util"), cols.count
            index_at = cols.at.get("index") if gpus.key == "index" else None
            continue
        cells = line.split(",")  # the last cell keeps the newline; every parser strips
        if len(cells) != ncols:
            if not line.strip():
                continue
            if is_cut_short(line):
                warns.append(cut_short_warning(path, no))
                break
            raise bad_line(path, no, line, f"expected {ncols} columns, found {len(cells)}")
        try:
            if t_at is not None:
                stamp = cells[t_at]
                if stamp != last_stamp:
                    last_t = round(nvsmi_time(stamp) - t0, 6)  # no float noise of 1.7e9
                    last_stamp = stamp
                t = last_t
                gpu = int(cells[index_at]) if index_at is not None else gpus.of(cells, t)
            else:
                gpu = int(cells[index_at]) if index_at is not None else gpus.of(cells, None)
                if gpu in seen or not seen:
                    seen.clear()
                    tick += 1
                seen.add(gpu)
                t = tick * interval
            if u_at is None:
                util = None
            else:
                cell = cells[u_at]
                try:  # the common case, "92 %" or "92", without the general parser
                    util = float(cell.rstrip(" %\r\n"))
                    if not isfinite(util):
                        util = num(cell)  # "nan" is no reading, "inf" an error
                except ValueError:
                    util = num(cell)
        except (ValueError, IndexError) as exc:
            if is_cut_short(line):
                warns.append(cut_short_warning(path, no))
                break
            raise bad_line(path, no, line, f"malformed value ({exc})") from None
        snap = add(t, gpu, util, (cols, cells, no, line))
        if snap is not None:
            yield snap
    snap = asm.flush()
    if snap is not None:
        yield snap
