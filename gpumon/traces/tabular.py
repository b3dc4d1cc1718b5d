"""Every comma/tab/semicolon-separated GPU log: nvidia-smi --query-gpu CSV, W&B CSV exports,
home-made loggers -- one reader, three vocabularies (``columns.py``).

The header names the columns (any order, any subset; repeated mid-file when nvidia-smi was
restarted or logs were concatenated, re-mapped when it changes).  Without a header the
columns are named from their values' units (``92 %``, ``49140 MiB``).  Times in any form
``timefmt`` reads, or none (then rows are ``--interval`` apart, 1 s unless said).  Rows
carry one GPU each (an index, uuid or bus id column -- or none, and ``identity`` finds the
cycle), or every GPU at once (a wide file: ``gpu0_util, gpu1_util``).  A ``CPU`` column
becomes the host sample.

Per row only the time, the GPU and the utilisation are parsed; other fields only for the
rows that become samples (the last of each GPU in a tick or ~1 s window): 4 M rows stay
within seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from math import isfinite
from typing import Any

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, GpuSample, HostSample, Point, Snapshot, TraceHeader
from gpumon.traces import identity as ident
from gpumon.traces._common import (
    MIB,
    Assembler,
    add_note,
    bad_line,
    cut_short_warning,
    fnum,
    is_cut_short,
    median_interval,
    mem_mib,
    num,
    shown,
    split_number,
)
from gpumon.traces.columns import Layout, is_nvsmi_name, resolve
from gpumon.traces.reader import Reader
from gpumon.traces.source import MAX_LINE, Source, as_source, too_long
from gpumon.traces.table import (
    WS,
    join_quoted,
    open_quote,
    sniff_delimiter,
    split_plain,
    split_quoted,
)
from gpumon.traces.timefmt import TimeParser, date_only, day_first_date, pick, rolling

FORMAT = "csv"
MAX_GPUS = 1024  # a GPU index beyond this is a malformed cell, not a machine
NVSMI = "nvidia-smi-csv"
WANDB = "wandb-csv"
PREFIX_LINES = 600  # lines read ahead to name the columns, the GPUs and the interval

GPU_FIELDS = (
    "util",
    "mem_util",
    "mem_used",
    "mem_total",
    "mem_free",
    "mem_pct",
    "mem_used_bytes",
    "power",
    "power_limit",
    "power_pct",
    "temp",
    "sm_clock",
)


# --- recognising a table -----------------------------------------------------------------


def _content(lines: Iterable[str]) -> list[str]:
    return [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def _cells(line: str, delim: str) -> list[str]:
    return split_quoted(line, delim) if '"' in line else split_plain(line.rstrip("\r\n"), delim)


def _is_value(cell: str) -> bool:
    """A number (or a no-reading mark) or a time, not a name."""
    s = cell.strip().strip('"').strip()
    if not s:
        return True
    try:
        split_number(s)
    except ValueError:
        return pick([s]) is not None
    return True


def is_header(cells: list[str]) -> bool:
    """A row of names: no cell reads as a value, and its names are ours -- every one
    nvidia-smi's, or at least two (a quarter of them) fields we know."""
    named = [c for c in cells if c.strip()]
    if not named:
        return False
    for c in named:
        s = c.strip().strip('"').strip()
        if _is_value(s) and not s[:1].isalpha():
            return False
    if all(is_nvsmi_name(c) for c in named):
        return True
    lay = resolve(cells)
    known = sum(1 for col in lay.columns if col.field is not None)
    return known >= min(2, len(named)) and known >= 0.25 * len(named)


def _gpu_fields(lay: Layout) -> bool:
    return bool(lay.wide or lay.series or any(f in lay.at for f in GPU_FIELDS))


def sniff_format(head: list[str]) -> str | None:
    """nvidia-smi-csv / wandb-csv / csv when these lines are such a table, else None."""
    lines = _content(head)
    if not lines or lines[0].lstrip("\ufeff").lstrip()[:1] in ("{", "["):
        return None  # JSON, not a table
    delim = sniff_delimiter(lines) or ","
    first = _cells(lines[0].lstrip("\ufeff"), delim)
    at = header_index([_cells(ln, delim) for ln in lines[: PREAMBLE + 1]])
    if at is not None:
        cells = _cells(lines[at], delim)
        rows = [_cells(ln, delim) for ln in lines[at + 1 : at + 20]]
        if not any(len(r) in (len(cells), len(cells) + 1) for r in rows):
            return None  # names, but no rows under them
        return _label(cells, resolve(cells))
    if len(lines) >= 2 and delim != WS and guess_layout([_cells(ln, delim) for ln in lines[:64]]):
        return NVSMI
    if len(first) > 1 and _nvsmi_stamp(first[0]):
        return NVSMI  # nvidia-smi rows without header or units: read() says how to re-run
    return None


PREAMBLE = 8  # lines of text (a banner, a note) allowed before the header


def header_index(rows: list[list[str]]) -> int | None:
    """Which of the first rows is the header (naming GPU fields), after at most PREAMBLE
    lines that are neither a header nor data; None when there is none."""
    for k, cells in enumerate(rows[: PREAMBLE + 1]):
        if is_header(cells):
            return k if _gpu_fields(resolve(cells)) else None
        if any(_is_value(c) and c.strip() and not c.strip()[:1].isalpha() for c in cells):
            return None  # a data row before any header: not a preamble
    return None


def _nvsmi_stamp(cell: str) -> bool:
    s = cell.strip()
    return len(s) >= 19 and s[4] == "/" and s[7] == "/" and s[10] == " " and s[13] == ":"


def _label(cells: list[str], lay: Layout) -> str:
    if all(is_nvsmi_name(c) for c in cells if c.strip()):
        return NVSMI
    if any(c.label and "system" in c.label.lower() and c.gpu is not None for c in lay.columns):
        return WANDB
    return FORMAT


# --- no header: name the columns from the units of their values --------------------------


def _unit(cell: str) -> str | None:
    try:
        got = split_number(cell)
    except ValueError:
        return None
    return None if got is None else got[1]


def _index_that_names(lay: Layout, rows: list[list[str]]) -> None:
    """A bare "GPU" column taken for the index holds the GPU's name (``NVIDIA GeForce
    RTX 3070 Laptop GPU``) in some home-made logs: read it as the name, by its values."""
    at = lay.at.get("index")
    if at is None or not rows:
        return
    cells = [r[at].strip() for r in rows[:64] if at < len(r)]
    if cells and not all(c.isdigit() for c in cells if c):
        del lay.at["index"]
        lay.at.setdefault("name", at)


def guess_layout(rows: list[list[str]]) -> Layout | None:
    """Columns of a headerless nvidia-smi log, from the units in its values; None if the
    values carry none (then nothing tells utilisation from memory)."""
    if not rows:
        return None
    ncols = len(rows[0])
    sample = [r for r in rows[:64] if len(r) == ncols]
    if len(sample) < 1 or ncols < 2:
        return None
    kinds: list[str] = []
    for i in range(ncols):
        values = [r[i].strip() for r in sample]
        if all(pick([v]) is not None and not v.replace(".", "").isdecimal() for v in values):
            kinds.append("time")
        elif all(v.startswith(("GPU-", "MIG-")) for v in values):
            kinds.append("uuid")
        elif all(v.count(":") == 2 and "." in v and " " not in v for v in values):
            kinds.append("bus")
        elif all(v.isdecimal() for v in values):
            ints = {int(v) for v in values}
            kinds.append("index" if ints == set(range(len(ints))) else "int")
        else:
            units = {_unit(v) for v in values} - {None}
            if len(units) == 1 and units != {""}:
                kinds.append(units.pop())  # type: ignore[arg-type]
            elif all(v[:1].isalpha() and not v.startswith("[") for v in values):
                kinds.append("name")
            else:
                kinds.append("?")
    if not any(k in ("%", "mib", "w", "mhz") for k in kinds):
        return None
    lay = Layout(count=ncols, columns=[])

    def constant(i: int) -> bool:
        return len({r[i].strip() for r in sample}) == 1

    def of(kind: str) -> list[int]:
        return [i for i, k in enumerate(kinds) if k == kind]

    for kind, fld in (("uuid", "uuid"), ("bus", "bus"), ("index", "index"), ("name", "name")):
        if of(kind):
            lay.at[fld] = of(kind)[0]
    if of("time"):
        lay.time_at = of("time")[0]
    pct = of("%")
    if pct:
        lay.at["util"] = pct[0]
    if len(pct) > 1:
        lay.at["mem_util"] = pct[1]
    mib = of("mib")
    totals = [i for i in mib if constant(i)]
    if totals and len(mib) > 1:
        total = max(totals, key=lambda i: num(sample[0][i]) or 0.0)
        lay.at["mem_total"] = total
        rest = [i for i in mib if i != total]
        lay.at["mem_used"] = rest[0]
        if len(rest) > 1:
            lay.at["mem_free"] = rest[1]
    elif mib:
        lay.at["mem_used"] = mib[0]
    watts = of("w")
    varying = [i for i in watts if not constant(i)]
    if watts:
        lay.at["power"] = (varying or watts)[0]
        limits = [i for i in watts if i != lay.at["power"] and constant(i)]
        if limits:
            lay.at["power_limit"] = limits[0]
    if of("mhz"):
        lay.at["sm_clock"] = of("mhz")[0]
    temps = [i for i in of("int") if all(5 <= int(r[i]) <= 120 for r in sample)]
    if temps:
        lay.at["temp"] = temps[0]
    return lay


# --- building samples ---------------------------------------------------------------------


def _text(cells: list[str], i: int | None) -> str | None:
    if i is None or i >= len(cells):
        return None
    value = cells[i].strip().strip('"').strip()
    return None if not value or value.startswith("[") or value.upper() == "N/A" else value


def _reasons(cell: str) -> int | None:
    value = cell.strip()
    if not value or value.startswith("[") or value.upper() == "N/A":
        return None
    return int(value, 16 if value.lower().startswith("0x") else 10)


def _scale_of(lay: Layout, i: int | None) -> float:
    return lay.columns[i].scale if i is not None and i < len(lay.columns) else 1.0


Build = Callable[[int, float, float | None, tuple[Point, ...], tuple[Any, ...]], GpuSample]


def compile_builder(
    lay: Layout,
    fields: dict[str, int],
    uuids: dict[int, str],
    uuid_of: Callable[[int, list[str]], str],
) -> Build:
    """A GpuSample builder for one GPU's columns: positions looked up once, not per sample
    (a day of 8 GPUs at -lms 167 makes ~700 k samples).  It takes the row's payload
    ``(table, cells, line_no, line)``; a cell it cannot read raises ValueError naming the
    column."""
    get = fields.get
    i_used, i_total, i_free = get("mem_used"), get("mem_total"), get("mem_free")
    i_mutil, i_power, i_limit = get("mem_util"), get("power"), get("power_limit")
    i_clock, i_temp, i_util = get("sm_clock"), get("temp"), get("util")
    i_pct, i_ppct, i_bytes = get("mem_pct"), get("power_pct"), get("mem_used_bytes")
    i_reasons = get("reasons")
    s_used, s_total, s_free = (
        _scale_of(lay, i_used),
        _scale_of(lay, i_total),
        _scale_of(lay, i_free),
    )
    derived = i_bytes is not None or i_free is not None or i_pct is not None or i_ppct is not None

    def build(
        gpu: int, t: float, util: float | None, points: tuple[Point, ...], payload: tuple
    ) -> GpuSample:
        cells = payload[2]
        try:
            used = None if i_used is None else mem_mib(cells[i_used], s_used)
            total = None if i_total is None else mem_mib(cells[i_total], s_total)
            power = None if i_power is None else fnum(cells[i_power])
            limit = None if i_limit is None else fnum(cells[i_limit])
            if derived:
                used, limit = _derive(cells, used, total, power, limit)
            clock = None if i_clock is None else fnum(cells[i_clock])
            sample = GpuSample(
                t_s=t,
                gpu=gpu,
                uuid=uuids.get(gpu) or uuid_of(gpu, cells),
                util_samples=points,
                util_pct=util,
                mem_util_pct=None if i_mutil is None else fnum(cells[i_mutil]),
                mem_used_bytes=None if used is None else int(used * MIB),
                mem_total_bytes=None if total is None else int(total * MIB),
                power_watts=power,
                power_limit_watts=limit,
                sm_clock_mhz=None if clock is None else int(clock),
                clock_event_reasons=None if i_reasons is None else _reasons(cells[i_reasons]),
                temperature_c=None if i_temp is None else fnum(cells[i_temp]),
                # A GPU that fell off the bus reads "[GPU is lost]" in every cell.
                lost=util is None and i_util is not None and "lost" in cells[i_util].lower(),
            )
        except ValueError as exc:
            raise ValueError(_which_cell(lay, fields, cells) or str(exc)) from None
        return sample

    def _derive(
        cells: list[str],
        used: float | None,
        total: float | None,
        power: float | None,
        limit: float | None,
    ) -> tuple[float | None, float | None]:
        """Memory used from bytes, total - free or a percent; the limit from a percent."""
        if used is None and i_bytes is not None:
            b = fnum(cells[i_bytes])
            used = None if b is None else b / MIB
        if used is None and total is not None and i_free is not None:
            free = mem_mib(cells[i_free], s_free)
            used = None if free is None else total - free
        if used is None and total is not None and i_pct is not None:
            pct = fnum(cells[i_pct])
            used = None if pct is None else total * pct / 100
        if limit is None and power is not None and i_ppct is not None:
            share = fnum(cells[i_ppct])
            limit = power * 100 / share if share else None
        return used, limit

    return build


def _which_cell(lay: Layout, fields: dict[str, int], cells: list[str]) -> str | None:
    """Which of a row's cells is malformed, and why (the error path only)."""
    for fld, i in fields.items():
        if fld in ("util", "name", "uuid", "bus", "index") or i >= len(cells):
            continue
        try:
            _reasons(cells[i]) if fld == "reasons" else num(cells[i])
        except ValueError as exc:
            return f"column {lay.columns[i].label!r}: {exc}"
    return None


# --- reading -------------------------------------------------------------------------------


class _Table:
    """Everything fixed by one header: layout, time parsing, GPU mapping, builders."""

    def __init__(self, lay: Layout, header_cells: list[str] | None):
        self.lay = lay
        self.header_text = None if header_cells is None else [c.strip() for c in header_cells]
        self.count = lay.count
        self.time: TimeParser | None = None
        self.date: Callable[[str], int] | None = None
        self.clock: TimeParser | None = None
        self.fraction = False
        self.cycle: ident.Cycle | None = None
        self.key_cols: tuple[int, ...] = ()
        self.uuids: dict[int, str] = {}
        self.builders: dict[int, Build] = {}
        self.series_gpus: dict[int, int] = {}  # column -> GPU index of an extra series
        self.multiline_said = False

    def gpu_columns(self) -> dict[int, dict[str, int]]:
        """GPU index -> its fields' columns (one entry for a long layout: key -1)."""
        lay = self.lay
        if lay.wide:
            out = {g: dict(f) for g, f in sorted(lay.wide.items())}
        else:
            out = {-1: {f: i for f, i in lay.at.items() if f in GPU_FIELDS or f == "reasons"}}
        return out


def _time_samples(rows: list[list[str]], i: int) -> list[str]:
    return [r[i] for r in rows if i < len(r) and r[i].strip()][:64]


def _pick_time(
    tab: _Table, rows: list[list[str]], path: str, extra: dict[str, object], split: list[list[str]]
) -> None:
    lay = tab.lay
    if lay.time_at is not None:
        samples = _time_samples(rows, lay.time_at)
        if len(split) > len(rows):  # one cell too many: a time split at its comma fraction?
            i = lay.time_at
            joined = [r[i] + "," + r[i + 1] for r in split[:64] if i + 1 < len(r)]
            if pick(joined) is not None:
                samples = joined
        name = lay.columns[lay.time_at].label.lower() if lay.columns else ""
        # The first row may be garbled (a log copied from mid-line): the rest decide.
        tab.time = pick(samples, name) or (pick(samples[1:], name) if len(samples) > 2 else None)
        if tab.time is None and samples:
            raise TraceFormatError(
                f"the time column {lay.columns[lay.time_at].label!r} holds "
                f"{samples[0].strip()!r}, not a time gpumon reads (nvidia-smi's "
                "2024/05/01 12:00:00.123, ISO 8601, epoch seconds or ms, seconds since start)",
                path=path,
            )
    elif lay.clock_at is not None:
        dates = _time_samples(rows, lay.date_at) if lay.date_at is not None else []
        day_first = any(int(d.strip()[:2]) > 12 for d in dates if d.strip()[:2].isdecimal())
        if dates and dates[0].strip()[2:3] in ("-", "/", "."):
            tab.date = lambda c: day_first_date(c, day_first)
            add_note(extra, f"dates read as {'DD-MM-YYYY' if day_first else 'MM-DD-YYYY'}")
        else:
            tab.date = date_only
        tab.clock = pick(_time_samples(rows, lay.clock_at))


def _row_time(
    tab: _Table, cells: list[str], parse: Callable[[str], float] | None = None
) -> float | None:
    if tab.time is not None:
        return (parse or tab.time.parse)(cells[tab.lay.time_at])  # type: ignore[index]
    if tab.clock is not None and tab.date is not None:
        return tab.date(cells[tab.lay.date_at]) + tab.clock.parse(cells[tab.lay.clock_at])  # type: ignore[index]
    return None


def _fingerprint(tab: _Table, cells: list[str]) -> ident.Fingerprint:
    at = tab.lay.at

    def val(fld: str) -> object:
        i = at.get(fld)
        if i is None or i >= len(cells):
            return None
        if fld == "name":
            return _text(cells, i)
        try:
            return fnum(cells[i])
        except ValueError:
            return None

    return tuple(val(f) for f in ident.FP_FIELDS)


def _fit(cells: list[str], count: int, tab: _Table | None) -> list[str] | None:
    """A row that almost fits the header: a trailing delimiter, an ISO time whose comma
    fraction (GNU date --iso-8601=ns) split it in two.  None when it does not fit."""
    n = len(cells)
    if n == count:
        return cells
    if n == count + 1 and not cells[-1].strip():
        return cells[:-1]
    if n == count - 1 and tab is not None and tab.header_text and not tab.header_text[-1]:
        return [*cells, ""]
    if n == count + 1 and tab is not None and tab.lay.time_at is not None:
        i = tab.lay.time_at
        merged = [*cells[:i], cells[i] + "," + cells[i + 1], *cells[i + 2 :]]
        try:
            if tab.time is not None:
                tab.time.parse(merged[i])
                return merged
        except (ValueError, IndexError):
            return None
    return None


def read(
    lines: Iterable[str] | Source,
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse a table-shaped GPU log: the header now, the snapshots lazily.

    ``lines`` keep their line endings (a last line without one was cut short).  The first
    ``PREFIX_LINES`` fix everything a header says (the columns, the time format, which GPU
    a row is, the interval); the rest are read as they come.
    """
    warns = warnings if warnings is not None else []
    prefix, numbered = _read_prefix(as_source(lines, path), path)
    content = [ln for _, ln in prefix if ln.strip() and not ln.lstrip().startswith("#")]
    if not content:
        raise TraceFormatError("no rows found", path=path)
    delim = sniff_delimiter(content) or ","
    records = _prefix_records(prefix, delim, path)
    extra: dict[str, object] = {}
    lay, fmt, tab, data, header_no = _layout_of(records, path, warns, extra)
    if lay.ignored:
        extra["ignored_columns"] = lay.ignored
    rows = [f for _, c, _ in data if (f := _fit(c, lay.count, tab)) is not None]
    _index_that_names(lay, rows)
    over = [c for _, c, _ in data if len(c) == lay.count + 1 and c[-1].strip()]
    _pick_time(tab, rows, path, extra, over)
    if tab.time is not None:  # now an ISO time split by its comma fraction can be mended
        rows = [f for _, c, _ in data if (f := _fit(c, lay.count, tab)) is not None]

    if not _gpu_fields(lay) or (
        not any("util" in f for f in tab.gpu_columns().values()) and not lay.series
    ):
        warns.append(
            f"{path}: no GPU utilisation column (utilization.gpu, gpu_util, ...); the GPUs' "
            "activity cannot be judged"
        )
    _read_fractions(tab, rows, extra)
    times, rows = _prefix_times(tab, rows, extra)
    gpu_ids = _gpu_ids(tab, rows, times, extra)
    identities = _identities(tab, gpu_ids, _first_rows(tab, rows, gpu_ids), extra)
    interval, sub_stamp = _interval(tab, rows, times, interval_s, extra)
    t0 = times[0] if times else 0.0
    absolute = tab.time.absolute if tab.time is not None else tab.clock is not None
    header = TraceHeader(
        version=1,
        source=fmt,
        started_wall_s=t0 if (times and absolute) else None,
        started_mono_s=0.0,
        interval_s=interval,
        gpus=tuple(identities[g] for g in sorted(identities)),
        extra=extra,
    )
    body = chain((p for p in prefix if p[0] > header_no), numbered)
    return header, _snapshots(body, tab, delim, header, t0, sub_stamp, path, warns)


Numbered = Iterator[tuple[int, str]]
Record = tuple[int, list[str], str]  # (line number, cells, the record's text)


def _read_prefix(src: Source, path: str) -> tuple[list[tuple[int, str]], Numbered]:
    """The first ``PREFIX_LINES`` numbered lines, and the numbered lines after them."""
    numbered: Numbered = enumerate(src.lines(checked=False), 1)  # the row loop checks lengths
    prefix: list[tuple[int, str]] = []
    for no, line in numbered:
        if len(line) > MAX_LINE:
            if not prefix:
                raise too_long(path, no)
            numbered = _raising(too_long(path, no))  # after the rows before it
            break
        prefix.append((no, line))
        if len(prefix) >= PREFIX_LINES:
            break
    return prefix, numbered


def _prefix_records(prefix: list[tuple[int, str]], delim: str, path: str) -> list[Record]:
    """The prefix as records (a quoted field may span lines); blank and comment lines and
    empty records left out."""
    records: list[Record] = []
    pit = iter(prefix)
    for no, line in pit:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        text = line
        if '"' in line and open_quote(line):
            try:
                text = join_quoted(line, pit, no, path)
            except TraceFormatError:
                break  # the record runs past the prefix: the row loop reads it
        cells = (
            split_quoted(text, delim) if '"' in text else split_plain(text.rstrip("\r\n"), delim)
        )
        cells = [c.split("\n", 1)[0] if "\n" in c else c for c in cells]
        records.append((no, cells, text))
    records = [r for r in records if r[1]]
    if not records:
        raise TraceFormatError("no rows found", path=path)
    records[0][1][0] = records[0][1][0].lstrip("\ufeff")
    return records


def _layout_of(
    records: list[Record], path: str, warns: list[str], extra: dict[str, object]
) -> tuple[Layout, str, _Table, list[Record], int]:
    """The columns, from the header line or (without one) guessed from the values:
    (layout, format label, table, data records, the header's line number or 0)."""
    at = header_index([r[1] for r in records[: PREAMBLE + 1]])
    if at is not None:
        first_cells = records[at][1]
        header_no = records[at][0]
        if at:
            warns.append(f"{path}: lines 1-{header_no - 1} come before the header line; skipped")
        lay = resolve(first_cells)
        data = [r for r in records[at + 1 :] if not is_header(r[1])]
        return lay, _label(first_cells, lay), _Table(lay, first_cells), data, header_no
    guessed = guess_layout([r[1] for r in records])
    if guessed is None:
        raise TraceFormatError(
            "a table without a header line whose values carry no units: its columns "
            "cannot be named. Re-run nvidia-smi with --format=csv (keeping the header "
            "line), or at least without 'nounits'",
            path=path,
            line=records[0][0],
        )
    named = dict(guessed.at)
    if guessed.time_at is not None:
        named["time"] = guessed.time_at
    named = dict(sorted(named.items(), key=lambda x: x[1]))
    extra["columns_guessed"] = named
    warns.append(f"{path}: no header line; columns named from their values ({', '.join(named)})")
    return guessed, NVSMI, _Table(guessed, None), records, 0


def _read_fractions(tab: _Table, rows: list[list[str]], extra: dict[str, object]) -> None:
    """Utilisation logged as a 0-1 fraction (a ratio column, or values all within 0-1 and
    some strictly between) is read as percent."""
    lay = tab.lay
    util_cols = [f["util"] for f in tab.gpu_columns().values() if "util" in f]
    values: list[float] = []
    for r in rows[:200]:
        for i in util_cols:
            try:
                v = fnum(r[i])
            except (ValueError, IndexError):
                continue
            if v is not None:
                values.append(v)
    ratio_named = (
        any("ratio" in lay.columns[i].label.lower() for i in util_cols) if lay.columns else False
    )
    if values and (ratio_named or (max(values) <= 1.0 and any(0 < u < 1 for u in values))):
        tab.fraction = True
        extra["util_scale"] = "utilisation logged as a 0-1 fraction; read as percent x100"


def _prefix_times(
    tab: _Table, rows: list[list[str]], extra: dict[str, object]
) -> tuple[list[float] | None, list[list[str]]]:
    """The times of the prefix rows (None without a time column), and the rows that have
    one: a row whose time does not parse is left for the row loop to name."""
    times: list[float] | None = None
    if tab.time is not None or tab.clock is not None:
        timed: list[tuple[float, list[str]]] = []
        parse = rolling(tab.time.parse) if tab.time is not None and tab.time.time_of_day else None
        for r in rows:
            try:
                t = _row_time(tab, r, parse)
            except (ValueError, IndexError, TypeError):
                continue  # the row loop names it (or skips a garbled first row)
            if t is not None:
                timed.append((t, r))
        times = [t for t, _ in timed] or None
        rows = [r for _, r in timed] if timed else rows
    if tab.time is not None and tab.time.note:
        extra["timestamps"] = tab.time.note
    elif tab.time is not None and tab.time.absolute:
        extra["timestamps"] = "local time of the logging machine, read as UTC"
    return times, rows


def _gpu_ids(
    tab: _Table, rows: list[list[str]], times: list[float] | None, extra: dict[str, object]
) -> list[int]:
    """Which GPUs the log holds: one set of columns each (a wide file), a key column
    (index, uuid, pci.bus_id), or, without either, the cycle the rows repeat in."""
    lay = tab.lay
    if lay.wide or lay.series:
        gpu_ids = sorted(lay.wide) if lay.wide else ([0] if "util" in lay.at else [])
        nxt = (max(gpu_ids) + 1) if gpu_ids else 0
        for i in lay.series:
            tab.series_gpus[i] = nxt
            nxt += 1
        if lay.wide:
            add_note(extra, f"{len(gpu_ids)} GPU(s), one set of columns each (a wide file)")
        return gpu_ids
    if lay.key is not None:
        key_at = lay.at[lay.key]
        seen: list[str] = []
        for r in rows:
            k = r[key_at].strip()
            if k and k not in seen:
                seen.append(k)
        if lay.key == "index":
            return sorted({i for k in seen if (i := _gpu_index(k)) is not None}) or [0]
        return list(range(len(seen))) or [0]
    fps = [_fingerprint(tab, r) for r in rows]
    tab.cycle = ident.infer(times if times is not None and len(times) == len(rows) else None, fps)
    if tab.cycle.n > 1 or not (lay.aggregate):
        extra["gpus_inferred"] = tab.cycle.note
    if tab.cycle.mode == "key":
        tab.key_cols = tuple(lay.at[f] for f in tab.cycle.key_fields)
    return list(range(tab.cycle.n))


def _first_rows(tab: _Table, rows: list[list[str]], gpu_ids: list[int]) -> dict[int, list[str]]:
    """Each GPU's first row, where its identity (name, uuid, memory total) is read."""
    lay = tab.lay
    first_row: dict[int, list[str]] = {}
    if lay.wide or lay.series or lay.key is None:
        for g in gpu_ids:
            first_row[g] = rows[0] if rows else []
        if tab.cycle is not None and tab.cycle.n > 1 and rows:
            for j, r in enumerate(rows[: tab.cycle.n]):
                first_row[j] = r
        return first_row
    key_at = lay.at[lay.key]
    order: dict[str, int] = {}
    for r in rows:
        k = r[key_at].strip()
        if lay.key == "index":
            index = _gpu_index(k)
            if index is None:
                continue
            g = index
        else:
            g = order.setdefault(k, len(order))
        first_row.setdefault(g, r)
    return first_row


def _identities(
    tab: _Table, gpu_ids: list[int], first_row: dict[int, list[str]], extra: dict[str, object]
) -> dict[int, GpuIdentity]:
    lay = tab.lay
    identities: dict[int, GpuIdentity] = {}
    for g in gpu_ids:
        r = first_row.get(g, [])
        uuid = _uuid(tab, g, r)
        name = _text(r, lay.at.get("name")) if not lay.wide else None
        if lay.aggregate and not lay.wide:
            name = "all GPUs (aggregate column 'GPU')"
        total = limit = None
        cols = tab.gpu_columns().get(g if lay.wide else -1, {})
        try:
            if "mem_total" in cols and r:
                v = mem_mib(r[cols["mem_total"]], _scale_of(lay, cols["mem_total"]))
                total = None if v is None else int(v * MIB)
            if "power_limit" in cols and r:
                limit = fnum(r[cols["power_limit"]])
        except (ValueError, IndexError, OverflowError):
            pass
        identities[g] = GpuIdentity(
            index=g,
            uuid=uuid,
            name=name,
            pci_bus_id=_text(r, lay.at.get("bus")) if not lay.wide else None,
            mem_total_bytes=total,
            power_limit_watts=limit,
        )
    for i, g in tab.series_gpus.items():
        label = lay.columns[i].label
        identities[g] = GpuIdentity(
            index=g, uuid=f"series:{label}", name=f"{label} (a series of its own)"
        )
    if lay.aggregate and not lay.wide:
        add_note(extra, "the 'GPU' column is one aggregate utilisation series for the machine")
    if lay.host_cpu is not None:
        add_note(
            extra, f"the {lay.columns[lay.host_cpu].label!r} column is read as host CPU, not a GPU"
        )
    return identities


def _interval(
    tab: _Table,
    rows: list[list[str]],
    times: list[float] | None,
    interval_s: float | None,
    extra: dict[str, object],
) -> tuple[float, float | None]:
    """The seconds between ticks (measured, else ``--interval``, else 1 s, said so), and
    the spacing given to ticks that share one whole-second timestamp (None: they do not)."""
    interval = median_interval(_tick_times(times, tab, rows)) if times else None
    if tab.time is None and tab.clock is None:
        interval = interval_s or 1.0
        extra["interval_assumed"] = f"no time column: rows assumed {interval:g} s apart" + (
            "" if interval_s else " (say otherwise with --interval)"
        )
    elif interval is None:
        interval = interval_s or 1.0
    sub_stamp = _sub_stamp(times, tab, rows) if times else None
    if sub_stamp is not None:
        add_note(
            extra,
            f"timestamps have whole-second resolution while ticks come ~{1 / sub_stamp:.0f} per "
            f"second: ticks under one timestamp are spread {sub_stamp:.3g} s apart",
        )
        interval = sub_stamp
    return interval, sub_stamp


def _gpu_index(cell: str) -> int | None:
    """The GPU index a cell holds (``0``, ``1.0``), or None when it holds none."""
    try:
        v = float(cell)
    except ValueError:
        return None
    return int(v) if 0 <= v < MAX_GPUS else None


def _raising(exc: Exception) -> Iterator[tuple[int, str]]:
    raise exc
    yield  # a generator: raises when iteration reaches it


def _uuid(tab: _Table, gpu: int, cells: list[str]) -> str:
    got = tab.uuids.get(gpu)
    if got is None:
        lay = tab.lay
        got = None
        if not lay.wide:
            got = _text(cells, lay.at.get("uuid")) or _text(cells, lay.at.get("bus"))
        if got is None and lay.aggregate and not lay.wide:
            got = "aggregate"
        got = got or f"gpu{gpu}"
        tab.uuids[gpu] = got
    return got


def _tick_times(times: list[float], tab: _Table, rows: list[list[str]]) -> list[float]:
    """One time per tick: rows of a multi-GPU tick collapse into its first row's time."""
    lay = tab.lay
    cyc = tab.cycle
    if lay.key is not None and not lay.wide and len(rows) == len(times):
        key_at = lay.at[lay.key]
        out, seen = [], set()
        for r, t in zip(rows, times, strict=True):
            k = r[key_at].strip()
            if k in seen or not seen:
                seen.clear()
                out.append(t)
            seen.add(k)
        return out
    if cyc is None or cyc.n <= 1:
        return times
    if cyc.split is not None:
        out, last = [], float("-inf")
        for t in times:
            if t - last > cyc.split or t < last:
                out.append(t)
                last = t
        return out
    return times[:: cyc.n]


def _sub_stamp(times: list[float], tab: _Table, rows: list[list[str]]) -> float | None:
    """The spacing to give ticks sharing one whole-second timestamp (None: they do not)."""
    ticks = _tick_times(times, tab, rows)
    if len(ticks) < 6 or any(abs(t - round(t)) > 1e-6 for t in ticks):
        return None
    if len(set(ticks)) < 3:
        return None  # a clock that does not advance is not one of whole seconds
    runs = ident.runs_of_equal(ticks)
    inner = runs[1:-1] if len(runs) > 3 else runs
    if not inner:
        return None
    inner.sort()
    typical = inner[len(inner) // 2]
    if typical < 2:
        return None
    return 1.0 / typical


def _snapshots(
    lines: Iterator[tuple[int, str]],
    tab: _Table,
    delim: str,
    header: TraceHeader,
    t0: float,
    sub_stamp: float | None,
    path: str,
    warns: list[str],
) -> Iterator[Snapshot]:
    interval = header.interval_s or 1.0
    state = _RowState(tab, header, t0, sub_stamp, interval, path)
    asm = Assembler(None, interval, path, state.host)
    add = asm.add
    count = tab.count
    valid = 0
    header_text = tab.header_text

    skipped: list[int] = []  # the garbled first row skipped, if any
    max_gpus = MAX_GPUS
    fast = state.fast_path(delim)
    frac = state.fraction
    builder = tab.builders.get(-1)
    split = str.split
    last_stamp, last_t = "", 0.0  # the GPUs of one tick share their timestamp text
    for no, line in lines:
        # The fast path: a plain row of an nvidia-smi-like log (time, index, utilisation).
        # Anything it cannot read (a header again, a quote, a bad cell) takes the general
        # path below, which reads it or says what is wrong.
        if fast is not None and line[-1:] == "\n" and '"' not in line:
            cells = split(line, delim)
            if len(cells) == count:
                t_at, i_at, u_at, parse = fast
                try:
                    stamp = cells[t_at]
                    if stamp != last_stamp:
                        last_t = round(parse(stamp) - t0, 6)
                        last_stamp = stamp
                    gpu = 0 if i_at is None else int(cells[i_at])
                    if not 0 <= gpu < max_gpus:
                        raise ValueError
                    if u_at is None:
                        util = None
                    else:
                        util = float(cells[u_at].rstrip(" %\r\n"))
                        if not -1e300 < util < 1e300 or frac:
                            raise ValueError  # nan, inf, a fraction: the general path
                except (ValueError, IndexError):
                    pass
                else:
                    valid += 1
                    snap = add(last_t, gpu, util, (builder, tab, cells, no, line))
                    if snap is not None:
                        yield snap
                    continue
        if len(line) > MAX_LINE:
            raise too_long(path, no)
        if '"' in line:
            text = line
            if open_quote(line):
                text = join_quoted(line, lines, no, path)
            cells = split_quoted(text, delim)
            if "\n" in text.rstrip("\r\n"):
                cells = _first_lines(cells, tab, no, path, warns)
            line = text
        else:
            cells = line.split() if delim == WS else line.split(delim)
        if len(cells) != count:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            fitted = _fit([c.rstrip("\r\n") for c in cells], count, tab)
            if fitted is None:
                stripped = [c.strip() for c in cells]
                if header_text is not None and stripped == header_text:
                    continue
                if (line[:1].isalpha() or line[:1] == '"') and is_header(cells):
                    tab, count, header_text, fast, frac, builder = _switch(state, cells, delim)
                    continue
                err = bad_line(path, no, line, f"expected {count} columns, found {len(cells)}")
                if _unreadable(
                    no, line, "does not fit the header", err, valid == 0, skipped, warns
                ):
                    break
                continue
            cells = fitted
        elif (line[:1].isalpha() or line[:1] == '"') and header_text is not None:
            stripped = [c.strip() for c in cells]
            if stripped == header_text:
                continue
            if is_header(cells):
                tab, count, header_text, fast, frac, builder = _switch(state, cells, delim)
                continue
        try:
            got = state.row(cells, no)
        except (ValueError, IndexError, TypeError, OverflowError) as exc:
            err = bad_line(path, no, line, f"malformed value ({exc})")
            if _unreadable(no, line, f"is malformed ({exc})", err, valid == 0, skipped, warns):
                break
            continue
        valid += 1
        t = got[0]
        builders = tab.builders
        for gpu, util in got[1]:
            snap = add(t, gpu, util, (builders.get(gpu) or builders[-1], tab, cells, no, line))
            if snap is not None:
                yield snap
    snap = asm.flush()
    if snap is not None:
        yield snap
    state.finish(warns)


def _unreadable(
    no: int,
    line: str,
    why: str,
    err: TraceFormatError,
    first: bool,
    skipped: list[int],
    warns: list[str],
) -> bool:
    """A row that cannot be read: the last line cut short stops the reading (True); a
    garbled first row is skipped (False); anything else is the error naming it."""
    path = err.path
    if is_cut_short(line):
        warns.append(cut_short_warning(str(path), no))
        return True
    if first and not skipped:
        skipped.append(no)
        warns.append(f"{path}:{no}: first row {why} (the log starts mid-line?); skipped")
        return False
    raise err


def _switch(
    state: _RowState, cells: list[str], delim: str
) -> tuple[_Table, int, list[str] | None, Any, bool, Any]:
    """A different header mid-file: everything the row loop keeps, re-made."""
    new = state.new_header(cells)
    fast = state.fast_path(delim)
    return new, new.count, new.header_text, fast, state.fraction, new.builders.get(-1)


def _first_lines(cells: list[str], tab: _Table, no: int, path: str, warns: list[str]) -> list[str]:
    """Cells holding a line break (a logger quoted a value with a newline in it): their
    first line is the value; said once."""
    out = []
    for i, c in enumerate(cells):
        if "\n" in c:
            first = c.split("\n", 1)[0]
            if not tab.multiline_said:
                tab.multiline_said = True
                label = tab.lay.columns[i].label if i < len(tab.lay.columns) else f"#{i + 1}"
                warns.append(
                    f"{path}:{no}: cells of column {label!r} span lines ({shown(c)!r}): "
                    "each is read as its first line"
                )
            c = first
        out.append(c)
    return out


class _RowState:
    """Per-row work: time, GPU, utilisation; and the builders the assembler calls."""

    def __init__(
        self,
        tab: _Table,
        header: TraceHeader,
        t0: float,
        sub_stamp: float | None,
        interval: float,
        path: str,
    ):
        self.tab = tab
        self.t0 = t0
        self.sub_stamp = sub_stamp
        self.interval = interval
        self.path = path
        self.tick = -1
        self.last_stamp = ""
        self.last_t = 0.0
        self.sub = 0
        self.sub_gpus: set[int] = set()
        self.assigners: list[ident.Assigner] = []
        self._setup(tab)

    def _setup(self, tab: _Table) -> None:
        lay = tab.lay
        self.tab = tab
        self.fraction = tab.fraction
        self.parse_time: Callable[[str], float] | None = None
        if tab.time is not None:
            self.parse_time = rolling(tab.time.parse) if tab.time.time_of_day else tab.time.parse
        self.t_at = lay.time_at
        self.index_at = lay.at.get("index") if lay.key == "index" else None
        self.key_at = lay.at.get(lay.key) if lay.key in ("uuid", "bus") else None
        self.ordinals: dict[str, int] = {}
        self.assigner = (
            ident.Assigner(tab.cycle) if tab.cycle is not None and tab.cycle.n > 1 else None
        )
        if self.assigner is not None:
            self.assigners.append(self.assigner)
        self.mem_at = lay.at.get("mem_used")
        per = tab.gpu_columns()
        if lay.wide:
            self.wide = [(g, f.get("util")) for g, f in per.items()]
        else:
            self.wide = []
        self.u_at = per.get(-1, {}).get("util") if not lay.wide else None
        self.series = list(tab.series_gpus.items())
        tab.builders = {}

        def uuid_of(gpu: int, cells: list[str]) -> str:
            return _uuid(tab, gpu, cells)

        for g, fields in per.items():
            tab.builders[g] = compile_builder(lay, fields, tab.uuids, uuid_of)
        for col, g in tab.series_gpus.items():
            tab.builders[g] = compile_builder(lay, {"util": col}, tab.uuids, uuid_of)

    def fast_path(
        self, delim: str
    ) -> tuple[int, int | None, int | None, Callable[[str], float]] | None:
        """(time, index, utilisation columns, time parser) when rows can take the fast
        path: one GPU per row known by an index column (or a single GPU), absolute or
        elapsed times, nothing to spread or infer."""
        tab = self.tab
        lay = tab.lay
        if delim == WS or lay.wide or lay.series or self.sub_stamp is not None:
            return None
        if self.t_at is None or tab.time is None or tab.time.time_of_day:
            return None
        if self.key_at is not None or self.assigner is not None:
            return None
        if self.index_at is None and tab.cycle is not None and tab.cycle.n > 1:
            return None
        return self.t_at, self.index_at, self.u_at, tab.time.parse

    def new_header(self, cells: list[str]) -> _Table:
        """A different header mid-file: re-map the columns (the same time form is kept)."""
        lay = resolve(cells)
        tab = _Table(lay, cells)
        old = self.tab
        if lay.time_at is not None and old.time is not None:
            tab.time = old.time
        tab.clock, tab.date, tab.fraction = old.clock, old.date, old.fraction
        tab.cycle, tab.uuids = old.cycle, old.uuids
        if tab.cycle is not None and tab.cycle.mode == "key":
            try:
                tab.key_cols = tuple(lay.at[f] for f in tab.cycle.key_fields)
            except KeyError:
                tab.key_cols = ()
        by_label = {old.lay.columns[i].label: g for i, g in old.series_gpus.items()}
        nxt = max([*old.series_gpus.values(), *lay.wide, 0]) + 1
        for i in lay.series:
            label = lay.columns[i].label
            if label not in by_label:
                by_label[label] = nxt
                nxt += 1
            tab.series_gpus[i] = by_label[label]
        self._setup(tab)
        return tab

    def _util(self, cells: list[str], i: int) -> float | None:
        cell = cells[i]
        try:
            util = float(cell.rstrip(" %\r\n"))
            if not isfinite(util):
                util = num(cell)
        except ValueError:
            try:
                util = num(cell)
            except ValueError as exc:
                raise ValueError(f"column {self.tab.lay.columns[i].label!r}: {exc}") from None
        if util is not None and self.tab.fraction:
            util *= 100.0
        return util

    def row(self, cells: list[str], no: int) -> tuple[float, list[tuple[int, float | None]]]:
        tab = self.tab
        # Time.
        if self.t_at is not None:
            stamp = cells[self.t_at]
            if stamp != self.last_stamp:
                self.last_t = round(self.parse_time(stamp) - self.t0, 6)  # type: ignore[misc]
                self.last_stamp = stamp
                self.sub = 0
                self.sub_gpus.clear()
            t: float | None = self.last_t
        elif tab.clock is not None:
            stamp = cells[tab.lay.clock_at] + cells[tab.lay.date_at]  # type: ignore[index]
            if stamp != self.last_stamp:
                self.last_t = round(_row_time(tab, cells) - self.t0, 6)  # type: ignore[operator]
                self.last_stamp = stamp
                self.sub = 0
                self.sub_gpus.clear()
            t = self.last_t
        else:
            t = None
        # GPU.
        if self.wide or self.series:
            if t is None:
                self.tick += 1
                t = self.tick * self.interval
            out = [(g, None if u is None else self._util(cells, u)) for g, u in self.wide]
            if self.u_at is not None and not self.wide:
                out.append((0, self._util(cells, self.u_at)))
            out.extend((g, self._util(cells, c)) for c, g in self.series)
            return t, out
        if self.index_at is not None:
            gpu = int(float(cells[self.index_at]))
            if not 0 <= gpu < MAX_GPUS:
                raise ValueError(f"GPU index {cells[self.index_at].strip()!r} is not one")
        elif self.key_at is not None:
            k = cells[self.key_at].strip()
            gpu = self.ordinals.get(k)  # type: ignore[assignment]
            if gpu is None:
                gpu = self.ordinals[k] = len(self.ordinals)
        elif self.assigner is not None:
            a = self.assigner
            cyc = tab.cycle
            if cyc.mode == "key" and tab.key_cols:  # type: ignore[union-attr]
                gpu = a.by_key(tuple(cells[i].strip() for i in tab.key_cols))
            elif cyc.mode == "time" and t is not None:  # type: ignore[union-attr]
                gpu = a.by_time(t, no)
            else:
                mem = None
                if self.mem_at is not None:
                    try:
                        mem = fnum(cells[self.mem_at])
                    except ValueError:
                        mem = None
                gpu = a.by_cycle(mem, no)
        else:
            gpu = 0
        if t is None:
            if gpu in self.sub_gpus or not self.sub_gpus:
                self.sub_gpus.clear()
                self.tick += 1
            self.sub_gpus.add(gpu)
            t = self.tick * self.interval
        elif self.sub_stamp is not None:
            if gpu in self.sub_gpus:
                self.sub_gpus.clear()
                self.sub += 1
            self.sub_gpus.add(gpu)
            t = round(t + self.sub * self.sub_stamp, 6)
        util = None if self.u_at is None else self._util(cells, self.u_at)
        return t, [(gpu, util)]

    def host(self, payload: tuple[Any, ...], t: float) -> HostSample | None:
        tab, cells = payload[1], payload[2]
        lay = tab.lay
        if lay.host_cpu is None and not lay.host_cores:
            return None
        cpu = None if lay.host_cpu is None else num(cells[lay.host_cpu])
        cores = tuple(v for i in lay.host_cores if (v := num(cells[i])) is not None)
        if cpu is None and cores:
            cpu = sum(cores) / len(cores)
        if cpu is not None and not 0 <= cpu <= 100:
            cpu = None  # percent of one core (> 100): not the machine's share
        return HostSample(t_s=t, cpu_pct=cpu, cpu_pct_per_core=cores)

    def finish(self, warns: list[str]) -> None:
        for a in self.assigners:
            if a.breaks:
                warns.append(
                    f"{self.path}:{a.first_break}: the cycle of GPUs broke {a.breaks} time(s) "
                    "(a tick with more or fewer rows than GPUs, or a GPU's values turning up "
                    "in another's row); each time the next row was re-synced"
                )


def _sniff_nvsmi(head: list[str]) -> bool:
    return sniff_format(head) == NVSMI


def _sniff_wandb(head: list[str]) -> bool:
    return sniff_format(head) == WANDB


def _sniff_csv(head: list[str]) -> bool:
    return sniff_format(head) == FORMAT


READERS = (
    Reader(
        NVSMI,
        "nvidia-smi --query-gpu CSV (a header of query names, or rows starting with a "
        "'YYYY/MM/DD hh:mm:ss' timestamp)",
        _sniff_nvsmi,
        read,
    ),
    Reader(
        WANDB, "a W&B CSV export of system metrics (system/gpu.N.* columns)", _sniff_wandb, read
    ),
    Reader(
        FORMAT,
        "CSV or tab/space-separated table with GPU columns named in its header "
        "(gpu_util, utilization, power, memory, time, ...)",
        _sniff_csv,
        read,
    ),
)
