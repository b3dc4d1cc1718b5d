"""Every comma/tab/semicolon-separated GPU log: nvidia-smi --query-gpu CSV, W&B CSV exports,
home-made loggers -- one reader, three vocabularies (``columns.py``).

The header names the columns (any order, any subset; repeated mid-file when nvidia-smi was
restarted or logs were concatenated, re-mapped when it changes).  Without a header the
columns are named from their values' units (``92 %``, ``49140 MiB``).  Times in any form
``timefmt`` reads, or none (then rows are ``--interval`` apart, 1 s unless said).  Rows
carry one GPU each (an index, uuid or bus id column -- or none, and ``identity`` finds the
cycle), or every GPU at once (a wide file: ``gpu0_util, gpu1_util``).  A ``CPU`` column
becomes the host sample.

The rooms: ``tab_header`` recognises a table and its header, ``tab_guess`` lays out one
without a header, ``tab_samples`` builds samples from rows, ``tab_rows`` is the reading
loop.  This module reads the first ``PREFIX_LINES``, which fix everything a header says
(the columns, the time format, which GPU a row is, the interval), and hands the rest to
the loop.  Per row only the time, the GPU and the utilisation are parsed; other fields
only for the rows that become samples: 4 M rows stay within seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from itertools import chain

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, Snapshot, TraceHeader
from gpumon.traces import identity as ident
from gpumon.traces._common import (
    MIB,
    add_note,
    cell_text,
    fnum,
    median_interval,
    mem_mib,
    split_number,
)
from gpumon.traces.columns import Layout, resolve
from gpumon.traces.reader import Reader, Sniff
from gpumon.traces.source import MAX_LINE, Source, as_source, too_long
from gpumon.traces.tab_guess import guess_layout, index_that_names
from gpumon.traces.tab_header import (
    FORMAT,
    NVSMI,
    PREAMBLE,
    WANDB,
    between_rows,
    content,
    gpu_fields,
    header_index,
    is_header,
    label,
    sniff_format,
)
from gpumon.traces.tab_rows import MAX_GPUS, Numbered, fit, snapshots
from gpumon.traces.tab_samples import Table, scale_of
from gpumon.traces.table import join_quoted, open_quote, sniff_delimiter, split_plain, split_quoted
from gpumon.traces.timefmt import TimeParser, date_column, line_time, pick, pick_most, rolling

__all__ = ["FORMAT", "NVSMI", "PREFIX_LINES", "READERS", "WANDB", "read", "sniff_format"]

PREFIX_LINES = 600  # lines read ahead to name the columns, the GPUs and the interval
TIME_SAMPLES = 64  # cells of a time column its parser is chosen from

Record = tuple[int, list[str], str]  # (line number, cells, the record's text)


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
    src = as_source(lines, path)
    return read_table(enumerate(src.lines(checked=False), 1), path, warnings, interval_s)


def read_named(
    lines: Iterable[str] | Source,
    path: str,
    warnings: list[str] | None,
    interval_s: float | None,
    columns: Sequence[str],
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """A table whose columns are named by the caller (``--columns``), in any vocabulary
    ``columns.classify`` knows (nvidia-smi's query names first)."""
    src = as_source(lines, path)
    return read_table(
        enumerate(src.lines(checked=False), 1), path, warnings, interval_s, columns=columns
    )


def read_table(
    lines: Numbered,
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
    *,
    columns: Sequence[str] | None = None,
    delim: str | None = None,
    source: str | None = None,
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Read numbered table lines (``read``'s work): ``columns`` names the columns of a
    table without a header (``--columns``, or the keys of JSON objects made rows);
    ``delim`` fixes the delimiter; ``source`` the format the header reports."""
    warns = warnings if warnings is not None else []
    prefix, numbered = _read_prefix(lines, path)
    rows_text = content(ln for _, ln in prefix)
    if not rows_text:
        raise TraceFormatError("no rows found", path=path)
    delim = delim or sniff_delimiter(rows_text) or ","
    records, markers = _prefix_records(prefix, delim, path)
    extra: dict[str, object] = {}
    lay, fmt, tab, data, header_no = _layout_of(records, path, warns, extra, columns)
    fmt = source or fmt
    if lay.ignored:
        extra["ignored_columns"] = lay.ignored
    rows = [f for _, c, _ in data if (f := fit(c, lay.count, tab)) is not None]
    index_that_names(lay, rows)
    over = [c for _, c, _ in data if len(c) == lay.count + 1 and c[-1].strip()]
    _pick_time(tab, rows, path, extra, over, data)
    if tab.time is not None:  # now an ISO time split by its comma fraction can be mended
        rows = [f for _, c, _ in data if (f := fit(c, lay.count, tab)) is not None]

    if not gpu_fields(lay) or (
        not any("util" in f for f in tab.gpu_columns().values()) and not lay.series
    ):
        warns.append(_no_utilisation(tab, path))
    _read_fractions(tab, rows, extra)
    _memory_in_gib(tab, rows, extra)
    times, rows = _prefix_times(tab, rows, extra)
    if times is None and any(t is not None for _, t in markers):
        times, rows = _marker_times(tab, data, markers, extra)
    gpu_ids = _gpu_ids(tab, rows, times, extra)
    identities = _identities(tab, gpu_ids, _first_rows(tab, rows, gpu_ids), extra)
    interval, sub_stamp = _interval(tab, rows, times, interval_s, extra)
    t0 = times[0] if times else 0.0
    absolute = (
        tab.time.absolute if tab.time is not None else (tab.clock is not None or tab.marker_times)
    )
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
    return header, snapshots(body, tab, delim, header, t0, sub_stamp, path, warns)


def _read_prefix(numbered: Numbered, path: str) -> tuple[list[tuple[int, str]], Numbered]:
    """The first ``PREFIX_LINES`` numbered lines that can say something, and the numbered
    lines after them.  Blank lines, comments and a header repeated line after line say
    nothing and are passed over (the row loop would skip them too): however many there
    are, the prefix reaches the rows and memory stays bounded.  Lengths are checked here
    and by the row loop, not by the source."""
    prefix: list[tuple[int, str]] = []
    last = ""  # the last line kept
    quoted = False  # a quoted field is open at the end of the lines kept
    for no, line in numbered:
        if len(line) > MAX_LINE:
            if not prefix:
                raise too_long(path, no)
            numbered = _raising(too_long(path, no))  # after the rows before it
            break
        if not quoted and _says_nothing(line, last):
            continue
        prefix.append((no, line))
        last = line
        if '"' in line and open_quote(line):
            quoted = not quoted
        if len(prefix) >= PREFIX_LINES:
            break
    return prefix, numbered


_NUMBER_START = frozenset("0123456789+-.")


def _says_nothing(line: str, last: str) -> bool:
    """Blank, a ``#`` comment, or the line of names just kept, again."""
    s = line.strip()
    if not s or s[0] == "#":
        return True
    if line != last or not (s[0].isalpha() or s[0] == '"'):
        return False
    words = s.replace(",", " ").replace(";", " ").split()
    return not any(w[0] in _NUMBER_START for w in words)


def _prefix_records(
    prefix: list[tuple[int, str]], delim: str, path: str
) -> tuple[list[Record], list[tuple[int, float | None]]]:
    """The prefix as records (a quoted field may span lines); blank and comment lines and
    empty records left out; and the lines between rows (separators, time lines), with the
    time each gives."""
    records: list[Record] = []
    markers: list[tuple[int, float | None]] = []
    pit = iter(prefix)
    for no, line in pit:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if between_rows(line):
            markers.append((no, line_time(line)))
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
    return records, markers


def _marker_times(
    tab: Table,
    data: list[Record],
    markers: list[tuple[int, float | None]],
    extra: dict[str, object],
) -> tuple[list[float] | None, list[list[str]]]:
    """A table without a time column whose rows come under time lines (``date`` printed
    before each sample): each row takes the time of the line above it."""
    stamps = iter(sorted((no, t) for no, t in markers if t is not None))
    nxt = next(stamps, None)
    now: float | None = None
    times: list[float] = []
    rows: list[list[str]] = []
    for no, cells, _ in data:
        while nxt is not None and nxt[0] < no:
            now = nxt[1]
            nxt = next(stamps, None)
        fitted = fit(cells, tab.lay.count, tab)
        if now is not None and fitted is not None:
            times.append(now)
            rows.append(fitted)
    if not times:
        return None, rows
    tab.marker_times = True
    extra["timestamps"] = "local time of the logging machine, read as UTC"
    add_note(extra, "the rows take their time from the date line printed above them")
    return times, rows


def _layout_of(
    records: list[Record],
    path: str,
    warns: list[str],
    extra: dict[str, object],
    columns: Sequence[str] | None = None,
) -> tuple[Layout, str, Table, list[Record], int]:
    """The columns, from names given (``--columns``), the header line, or (without one)
    guessed from the values: (layout, format label, table, data records, the header's line
    number or 0)."""
    if columns is not None:
        return _named_layout(records, list(columns), path, warns)
    at = header_index([r[1] for r in records[: PREAMBLE + 1]])
    if at is not None:
        first_cells = records[at][1]
        header_no = records[at][0]
        if at:
            warns.append(f"{path}: lines 1-{header_no - 1} come before the header line; skipped")
        lay = resolve(first_cells)
        data = [r for r in records[at + 1 :] if not is_header(r[1])]
        return lay, label(first_cells, lay), Table(lay, first_cells), data, header_no
    guessed = guess_layout([r[1] for r in records])
    if guessed is None:
        raise TraceFormatError(
            "a table without a header line whose values carry no units: its columns "
            "cannot be named from its values. Name them with --columns, in nvidia-smi's "
            "query names and the order of --query-gpu (e.g. --columns "
            "timestamp,index,utilization.gpu,memory.used,memory.total), or re-run "
            "nvidia-smi with --format=csv (keeping the header line)",
            path=path,
            line=records[0][0],
        )
    named = dict(guessed.at)
    if guessed.time_at is not None:
        named["time"] = guessed.time_at
    named = dict(sorted(named.items(), key=lambda x: x[1]))
    extra["columns_guessed"] = named
    warns.append(f"{path}: no header line; columns named from their values ({', '.join(named)})")
    for note in guessed.notes:
        add_note(extra, note)
    return guessed, NVSMI, Table(guessed, None), records, 0


def _named_layout(
    records: list[Record], names: list[str], path: str, warns: list[str]
) -> tuple[Layout, str, Table, list[Record], int]:
    """The layout of names given for a table's columns; a header line the file has anyway
    is passed over (said), and rows of another width are refused at once."""
    lay = resolve(names)
    data = records
    header_no = 0
    if data and is_header(data[0][1]):
        header_no = data[0][0]
        warns.append(
            f"{path}:{header_no}: the file's own header line is passed over: its columns "
            "are read by the names given"
        )
        data = data[1:]
    widths = [len(c) for _, c, _ in data[:64]]
    if widths and max(set(widths), key=widths.count) not in (len(names), len(names) + 1):
        width = max(set(widths), key=widths.count)
        raise TraceFormatError(
            f"{len(names)} column name(s) given, but the rows have {width} cells: name "
            "every column, in order",
            path=path,
            line=data[0][0],
        )
    return lay, label(names, lay), Table(lay, names), data, header_no


_WHAT_IS_READ = (
    ("power", "power draw"),
    ("mem_used", "memory used"),
    ("mem_free", "memory used"),
    ("mem_total", "memory size"),
    ("temp", "temperature"),
    ("sm_clock", "SM clock"),
)


def _no_utilisation(tab: Table, path: str) -> str:
    """What a log without a utilisation column can and cannot say."""
    have = {f for cols in tab.gpu_columns().values() for f in cols}
    read = list(dict.fromkeys(word for fld, word in _WHAT_IS_READ if fld in have))
    head = (
        f"{path}: no GPU utilisation column (utilization.gpu, gpu_util, ...): whether the "
        "GPUs computed or waited cannot be judged (their state is unknown)"
    )
    if not read:
        return head
    shown = ", ".join(read)
    return f"{head}; what the log holds is read and reported per GPU ({shown}): " + (
        "power tells a GPU drawing working power from one at rest, not whether the "
        "work kept it busy"
        if "power draw" in read
        else "it tells memory held from memory free, not whether the GPUs worked"
    )


def _read_fractions(tab: Table, rows: list[list[str]], extra: dict[str, object]) -> None:
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


SMALLEST_GPU_MIB = 256.0  # no GPU holds less memory: a smaller bare total is in GiB
LARGEST_GPU_MIB = float(1 << 22)  # 4 TiB: a larger bare amount is in bytes


def _memory_in_gib(tab: Table, rows: list[list[str]], extra: dict[str, object]) -> None:
    """Memory logged in GB or in bytes without saying so (``"mem_total": 48.6``,
    ``"mem_used": 31573671936``): a memory total (or, without one, memory used) that no
    GPU could hold in MiB, in columns whose names give no unit, sets the unit of every
    memory column: GiB below the smallest GPU, bytes above the largest."""
    lay = tab.lay
    fields = tab.gpu_columns()
    mem = [
        (fld, i)
        for f in fields.values()
        for fld in ("mem_used", "mem_total", "mem_free")
        if (i := f.get(fld)) is not None and i < len(lay.columns)
    ]
    if not mem or any(lay.columns[i].scale != 1.0 for _, i in mem):
        return
    probe = [i for fld, i in mem if fld == "mem_total"] or [
        i for fld, i in mem if fld == "mem_used"
    ]
    values = []
    for r in rows[:200]:
        for i in probe:
            try:
                got = split_number(r[i])
            except (ValueError, IndexError):
                return
            if got is not None:
                if got[1]:
                    return  # the cell says its unit
                values.append(got[0])
    totals = bool([i for fld, i in mem if fld == "mem_total"])
    if values and totals and all(0 < v < SMALLEST_GPU_MIB for v in values):
        scale, unit = 1024.0, "GiB"
    elif values and all(v > LARGEST_GPU_MIB for v in values if v) and any(values):
        scale, unit = 1.0 / MIB, "bytes"
    else:
        return
    for _, i in mem:
        lay.columns[i] = replace(lay.columns[i], scale=scale)
    what = "memory totals" if totals else "memory used"
    lo, hi = (f"{v:,.0f}" if unit == "bytes" else f"{v:g}" for v in (min(values), max(values)))
    add_note(extra, f"{what} of {lo}-{hi}: no GPU holds that in MiB, so memory is read in {unit}")


def _prefix_times(
    tab: Table, rows: list[list[str]], extra: dict[str, object]
) -> tuple[list[float] | None, list[list[str]]]:
    """The times of the prefix rows (None without a time column), and the rows that have
    one: a row whose time does not parse is left for the row loop to name."""
    times: list[float] | None = None
    if tab.time is not None or tab.clock is not None:
        timed: list[tuple[float, list[str]]] = []
        parse = rolling(tab.time.parse) if tab.time is not None and tab.time.time_of_day else None
        for r in rows:
            try:
                t = tab.row_time(r, parse)
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
    tab: Table, rows: list[list[str]], times: list[float] | None, extra: dict[str, object]
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
            return sorted({n for k in seen if (n := _gpu_index(k)) is not None}) or [0]
        return list(range(len(seen))) or [0]
    fps = [tab.fingerprint(r) for r in rows]
    tab.cycle = ident.infer(times if times is not None and len(times) == len(rows) else None, fps)
    if tab.cycle.n > 1 or not (lay.aggregate):
        extra["gpus_inferred"] = tab.cycle.note
    if tab.cycle.mode == "key":
        tab.key_cols = tuple(lay.at[f] for f in tab.cycle.key_fields)
    return list(range(tab.cycle.n))


def _first_rows(tab: Table, rows: list[list[str]], gpu_ids: list[int]) -> dict[int, list[str]]:
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
        gpu = _gpu_index(k) if lay.key == "index" else order.setdefault(k, len(order))
        if gpu is not None:
            first_row.setdefault(gpu, r)
    return first_row


def _identities(
    tab: Table, gpu_ids: list[int], first_row: dict[int, list[str]], extra: dict[str, object]
) -> dict[int, GpuIdentity]:
    lay = tab.lay
    identities: dict[int, GpuIdentity] = {}
    for g in gpu_ids:
        r = first_row.get(g, [])
        uuid = tab.uuid(g, r)
        name = cell_text(r, lay.at.get("name")) if not lay.wide else None
        if lay.aggregate and not lay.wide:
            name = "all GPUs (aggregate column 'GPU')"
        total = limit = None
        cols = tab.gpu_columns().get(g if lay.wide else -1, {})
        try:
            if "mem_total" in cols and r:
                v = mem_mib(r[cols["mem_total"]], scale_of(lay, cols["mem_total"]))
                total = None if v is None else int(v * MIB)
            if "power_limit" in cols and r:
                limit = fnum(r[cols["power_limit"]])
        except (ValueError, IndexError, OverflowError):
            pass
        identities[g] = GpuIdentity(
            index=g,
            uuid=uuid,
            name=name,
            pci_bus_id=cell_text(r, lay.at.get("bus")) if not lay.wide else None,
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
    tab: Table,
    rows: list[list[str]],
    times: list[float] | None,
    interval_s: float | None,
    extra: dict[str, object],
) -> tuple[float, float | None]:
    """The seconds between ticks (measured, else ``--interval``, else 1 s, said so), and
    the spacing given to ticks that share one whole-second timestamp (None: they do not)."""
    interval = median_interval(_tick_times(times, tab, rows)) if times else None
    if tab.time is None and tab.clock is None and not tab.marker_times:
        interval = interval_s or 1.0
        extra["interval_assumed"] = f"no time column: rows assumed {interval:g} s apart" + (
            "" if interval_s else " (say otherwise with --interval)"
        )
    elif interval is None:
        interval = interval_s or 1.0
    sub_stamp = ident.whole_second_spacing(_tick_times(times, tab, rows)) if times else None
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
    yield from ()  # a generator: raises when iteration reaches it
    raise exc


def _tick_times(times: list[float], tab: Table, rows: list[list[str]]) -> list[float]:
    """One time per tick (``identity.tick_times``), keyed by the GPU column where there is one."""
    lay = tab.lay
    keys = None
    if lay.key is not None and not lay.wide:
        key_at = lay.at[lay.key]
        keys = [r[key_at].strip() for r in rows]
    return ident.tick_times(times, keys, tab.cycle)


def _time_samples(rows: list[list[str]], i: int) -> list[str]:
    return [r[i] for r in rows if i < len(r) and r[i].strip()][:TIME_SAMPLES]


def _pick_time(
    tab: Table,
    rows: list[list[str]],
    path: str,
    extra: dict[str, object],
    split: list[list[str]],
    data: list[Record],
) -> None:
    """How the log writes its times: one time column, or a date and a time-of-day column."""
    lay = tab.lay
    if lay.time_at is not None:
        tab.time = _time_column(lay, rows, split, path, data)
    elif lay.clock_at is not None:
        dates = _time_samples(rows, lay.date_at) if lay.date_at is not None else []
        tab.date, note = date_column(dates)
        if note:
            add_note(extra, note)
        tab.clock = pick(_time_samples(rows, lay.clock_at))


def _time_column(
    lay: Layout, rows: list[list[str]], split: list[list[str]], path: str, data: list[Record]
) -> TimeParser | None:
    """The parser of the time column, from its first cells (None: they are all empty)."""
    i = lay.time_at
    assert i is not None
    samples = _time_samples(rows, i)
    if len(split) > len(rows):  # one cell too many: a time split at its comma fraction?
        joined = [r[i] + "," + r[i + 1] for r in split[:TIME_SAMPLES] if i + 1 < len(r)]
        if pick(joined) is not None:
            samples = joined
    name = lay.columns[i].label.lower() if lay.columns else ""
    # A garbled cell (the first row of a log copied from mid-line, a typo) does not decide:
    # most of them do, and the row loop names the row that holds it.
    got, bad = pick_most(samples, name)
    if got is None and samples:
        cell = samples[bad or 0]
        line = next((no for no, c, _ in data if i < len(c) and c[i] == cell), None)
        raise TraceFormatError(
            f"the time column {lay.columns[i].label!r} holds "
            f"{cell.strip()!r}, not a time gpumon reads (nvidia-smi's "
            "2024/05/01 12:00:00.123, ISO 8601, epoch seconds or ms, seconds since start)",
            path=path,
            line=line,
        )
    return got


def _sniffs(fmt: str) -> Sniff:
    def sniff(head: list[str]) -> bool:
        return sniff_format(head) == fmt

    return sniff


def _any_table(head: list[str]) -> bool:
    """``--format csv`` reads every table this reader does (nvidia-smi's and W&B's are
    tables too); detection asks the more particular readers first."""
    return sniff_format(head) is not None


READERS = (
    Reader(
        NVSMI,
        "nvidia-smi --query-gpu CSV (a header of query names, or rows starting with a "
        "'YYYY/MM/DD hh:mm:ss' timestamp)",
        _sniffs(NVSMI),
        read,
    ),
    Reader(
        WANDB, "a W&B CSV export of system metrics (system/gpu.N.* columns)", _sniffs(WANDB), read
    ),
    Reader(
        FORMAT,
        "CSV or tab/space-separated table with GPU columns named in its header "
        "(gpu_util, utilization, power, memory, time, ...)",
        _any_table,
        read,
    ),
)
