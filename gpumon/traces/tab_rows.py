"""The reading loop of a table-shaped log: each row to its time, its GPU and its
utilisation, handed to the assembler; everything else in a row is parsed only for the rows
that become samples (``tab_samples``).

Rows of an nvidia-smi-like log (a time, an index, a utilisation) take a fast path inline;
anything it cannot read -- a header again, a quote, a row that almost fits, a bad cell --
takes the general path, which reads it or says what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from math import isfinite

from gpumon.errors import TraceFormatError
from gpumon.model import Snapshot, TraceHeader
from gpumon.traces import identity as ident
from gpumon.traces._common import (
    Assembler,
    Tally,
    bad_line,
    cut_short_warning,
    fnum,
    is_cut_short,
    non_finite_times,
    num,
    out_of_range_utils,
    shown,
)
from gpumon.traces.columns import resolve
from gpumon.traces.source import MAX_LINE, too_long
from gpumon.traces.tab_header import between_rows, is_header
from gpumon.traces.tab_samples import Table, compile_builder, host_sample
from gpumon.traces.table import WS, join_quoted, open_quote, split_quoted
from gpumon.traces.timefmt import NonFiniteTime, line_time, rolling

MAX_GPUS = 1024  # a GPU index beyond this is a malformed cell, not a machine

Numbered = Iterator[tuple[int, str]]
FastPath = tuple[int, int | None, int | None, Callable[[str], float]]
# What the general path makes of a line besides its cells (compared by identity).
SKIP: list[str] = []  # nothing to read on it (blank, a comment, the header again)
SWITCHED: list[str] = []  # a new header: the loop re-reads what it keeps
STOP: list[str] = []  # the last line, cut short


def fit(cells: list[str], count: int, tab: Table | None) -> list[str] | None:
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


def snapshots(
    lines: Numbered,
    tab: Table,
    delim: str,
    header: TraceHeader,
    t0: float,
    sub_stamp: float | None,
    path: str,
    warns: list[str],
) -> Iterator[Snapshot]:
    """The snapshots of the rows ``lines`` hold, read with what ``tab`` fixed; what was
    skipped is said once the reading ends, however it ends."""
    interval = header.interval_s or 1.0
    rows = RowReader(tab, t0, sub_stamp, interval, path, delim, warns)
    asm = Assembler(None, interval, path, host_sample)
    try:
        yield from _read_rows(lines, rows, delim, t0, asm)
    except TraceFormatError:
        # A row that cannot be read ends the reading: the tick the rows before it were
        # gathering is still theirs.
        snap = asm.flush()
        if snap is not None:
            yield snap
        raise
    finally:
        rows.finish()


def _read_rows(
    lines: Numbered, rows: RowReader, delim: str, t0: float, asm: Assembler
) -> Iterator[Snapshot]:
    add = asm.add
    max_gpus = MAX_GPUS
    fast, count, frac, builder = rows.loop_state()
    tab = rows.tab
    valid = 0
    split = str.split
    last_stamp, last_t = "", 0.0  # the GPUs of one tick share their timestamp text
    for no, line in lines:
        # The fast path: a plain row of an nvidia-smi-like log (time, index, utilisation).
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
                        if not 0.0 <= util <= 100.0 or frac:
                            raise ValueError  # nan, inf, out of range, a fraction: the general path
                except (ValueError, IndexError):
                    pass
                else:
                    valid += 1
                    snap = add(last_t, gpu, util, (builder, tab, cells, no, line))
                    if snap is not None:
                        yield snap
                    continue
        rows.valid = valid
        got = rows.general(no, line, lines)
        if got is None:
            if rows.switched:  # a new header: what the loop keeps, re-made
                fast, count, frac, builder = rows.loop_state()
                tab = rows.tab
            elif rows.stopped:
                break
            continue
        valid += 1
        t, gpus, cells, line = got
        builders = tab.builders
        for gpu, util in gpus:
            snap = add(t, gpu, util, (builders.get(gpu) or builders[-1], tab, cells, no, line))
            if snap is not None:
                yield snap
    snap = asm.flush()
    if snap is not None:
        yield snap


class RowReader:
    """Per-row work on the general path: a line to its cells, a row to its time, GPU and
    utilisation; what a header fixed (``tab``), re-made when the header changes."""

    def __init__(
        self,
        tab: Table,
        t0: float,
        sub_stamp: float | None,
        interval: float,
        path: str,
        delim: str,
        warns: list[str],
    ):
        self.tab = tab
        self.t0 = t0
        self.sub_stamp = sub_stamp
        self.interval = interval
        self.path = path
        self.delim = delim
        self.warns = warns
        self.valid = 0  # rows read so far (the loop keeps the count)
        self.text = ""  # the record the last line began (quoted fields may span lines)
        self.stopped = False  # the last line was cut short: nothing after it to read
        self.switched = False  # the last line was a new header
        self.no = 0  # the line of the row being read
        self.non_finite = non_finite_times()
        self.not_rows = Tally(
            "line(s) between rows that are no rows (separators, time lines, banners): skipped"
        )
        self.marker_t: float | None = None  # the time line last seen
        self.out_of_range = out_of_range_utils()
        self.skipped: list[int] = []  # the garbled first row skipped, if any
        self.tick = -1
        self.last_stamp = ""
        self.last_t = 0.0
        self.sub = 0
        self.sub_gpus: set[int] = set()
        self.assigners: list[ident.Assigner] = []
        self._setup(tab)

    def _setup(self, tab: Table) -> None:
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
        self.wide = [(g, f.get("util")) for g, f in per.items()] if lay.wide else []
        self.u_at = per.get(-1, {}).get("util") if not lay.wide else None
        self.series = list(tab.series_gpus.items())
        tab.builders = {}
        for g, fields in per.items():
            tab.builders[g] = compile_builder(lay, fields, tab.uuids, tab.uuid)
        for col, g in tab.series_gpus.items():
            tab.builders[g] = compile_builder(lay, {"util": col}, tab.uuids, tab.uuid)

    def loop_state(self) -> tuple[FastPath | None, int, bool, object]:
        """What the row loop keeps in locals: the fast path, the column count, whether
        utilisation is a fraction, the builder of a long layout's rows."""
        tab = self.tab
        return self._fast_path(), tab.count, self.fraction, tab.builders.get(-1)

    def _fast_path(self) -> FastPath | None:
        """(time, index, utilisation columns, time parser) when rows can take the fast
        path: one GPU per row known by an index column (or a single GPU), absolute or
        elapsed times, nothing to spread or infer."""
        tab = self.tab
        lay = tab.lay
        if self.delim == WS or lay.wide or lay.series or self.sub_stamp is not None:
            return None
        if self.t_at is None or tab.time is None or tab.time.time_of_day:
            return None
        if self.key_at is not None or self.assigner is not None:
            return None
        if self.index_at is None and tab.cycle is not None and tab.cycle.n > 1:
            return None
        return self.t_at, self.index_at, self.u_at, tab.time.parse

    # --- a line to its cells -------------------------------------------------------------

    def general(
        self, no: int, line: str, lines: Numbered
    ) -> tuple[float, list[tuple[int, float | None]], list[str], str] | None:
        """A line the fast path did not take: (time, (GPU, utilisation) pairs, cells, the
        record's text), or None when it holds no row -- ``switched`` when it was a new
        header, ``stopped`` when it was the last line, cut short."""
        self.switched = False
        cells = self.cells(no, line, lines)
        if cells is SKIP or cells is STOP:
            self.stopped = cells is STOP
            return None
        if cells is SWITCHED:
            self.switched = True
            return None
        got = self.read(cells, no, self.text)
        return None if got is None else (got[0], got[1], cells, self.text)

    def cells(self, no: int, line: str, lines: Numbered) -> list[str]:
        """The cells of a line the fast path did not take, or SKIP, SWITCHED or STOP."""
        if len(line) > MAX_LINE:
            raise too_long(self.path, no)
        if not line.strip():
            return SKIP  # a blank line is no row, even in a table of one column
        self.text = line
        if '"' in line:
            cells, line = self._quoted(no, line, lines)
            self.text = line
        else:
            cells = line.split() if self.delim == WS else line.split(self.delim)
        tab = self.tab
        if len(cells) != tab.count:
            return self._misfit(no, line, cells)
        if (line[:1].isalpha() or line[:1] == '"') and tab.header_text is not None:
            again = self._header_again(cells)
            if again is not None:
                return again
        return cells

    def _quoted(self, no: int, line: str, lines: Numbered) -> tuple[list[str], str]:
        """A record with quotes (a quoted field may run over several lines)."""
        text = line
        if open_quote(line):
            text = join_quoted(line, lines, no, self.path)
        cells = split_quoted(text, self.delim)
        if "\n" in text.rstrip("\r\n"):
            cells = self._first_lines(cells, no)
        return cells, text

    def _first_lines(self, cells: list[str], no: int) -> list[str]:
        """Cells holding a line break (a logger quoted a value with a newline in it): their
        first line is the value; said once."""
        tab = self.tab
        out = []
        for i, c in enumerate(cells):
            if "\n" in c:
                first = c.split("\n", 1)[0]
                if not tab.multiline_said:
                    tab.multiline_said = True
                    label = tab.lay.columns[i].label if i < len(tab.lay.columns) else f"#{i + 1}"
                    self.warns.append(
                        f"{self.path}:{no}: cells of column {label!r} span lines ({shown(c)!r}): "
                        "each is read as its first line"
                    )
                c = first
            out.append(c)
        return out

    def _misfit(self, no: int, line: str, cells: list[str]) -> list[str]:
        """A line whose cells do not fit the header: blank, a comment, a line between rows
        (a separator, a time line, a banner), nearly fitting, the header again or a new one,
        or a row that cannot be read."""
        if not line.strip() or line.lstrip().startswith("#"):
            return SKIP
        if self._between_rows(no, line):
            return SKIP
        tab = self.tab
        fitted = fit([c.rstrip("\r\n") for c in cells], tab.count, tab)
        if fitted is not None:
            return fitted
        if tab.header_text is not None and [c.strip() for c in cells] == tab.header_text:
            return SKIP
        if (line[:1].isalpha() or line[:1] == '"') and is_header(cells):
            self.new_header(cells)
            return SWITCHED
        err = bad_line(self.path, no, line, f"expected {tab.count} columns, found {len(cells)}")
        return STOP if self._unreadable(no, line, "does not fit the header", err) else SKIP

    def _between_rows(self, no: int, line: str) -> bool:
        """A line a logger printed between rows -- a separator, a framed banner, a time
        line (its time is the rows' after it, in a table without a time column) -- is
        skipped and counted."""
        if not between_rows(line):
            return False
        t = line_time(line)
        if t is not None:
            self.marker_t = t
        self.not_rows.note(no, line.strip())
        return True

    def _header_again(self, cells: list[str]) -> list[str] | None:
        """SKIP for the header repeated, SWITCHED for a new one, None for a row."""
        if [c.strip() for c in cells] == self.tab.header_text:
            return SKIP
        if is_header(cells):
            self.new_header(cells)
            return SWITCHED
        return None

    def _unreadable(self, no: int, line: str, why: str, err: TraceFormatError) -> bool:
        """A row that cannot be read: the last line cut short stops the reading (True); a
        garbled first row is skipped (False); anything else is the error naming it."""
        if is_cut_short(line):
            self.warns.append(cut_short_warning(self.path, no))
            return True
        if self.valid == 0 and not self.skipped:
            self.skipped.append(no)
            self.warns.append(
                f"{self.path}:{no}: first row {why} (the log starts mid-line?); skipped"
            )
            return False
        raise err

    def new_header(self, cells: list[str]) -> Table:
        """A different header mid-file: re-map the columns (the same time form is kept)."""
        lay = resolve(cells)
        tab = Table(lay, cells)
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

    # --- a row to its time, GPU and utilisation ------------------------------------------

    def read(
        self, cells: list[str], no: int, line: str
    ) -> tuple[float, list[tuple[int, float | None]]] | None:
        """The row's time and (GPU, utilisation) pairs; None for a garbled first row
        skipped or a last line cut short (``stopped``); any other row that cannot be read
        raises the error naming it."""
        try:
            got = self.row(cells, no)
        except NonFiniteTime:
            self.non_finite.note(no, line)
            return None
        except (ValueError, IndexError, TypeError, OverflowError) as exc:
            err = bad_line(self.path, no, line, f"malformed value ({exc})")
            self.stopped = self._unreadable(no, line, f"is malformed ({exc})", err)
            return None
        return got

    def _util(self, cells: list[str], i: int) -> float | None:
        cell = cells[i]
        util: float | None
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
        if util is not None and not 0.0 <= util <= 100.0:
            self.out_of_range.note(self.no, cell.strip())
            return None
        return util

    def _time(self, cells: list[str]) -> float | None:
        """The row's time since the start (None: the log has no time column); a new
        timestamp restarts the spreading of ticks under one whole second."""
        tab = self.tab
        if self.t_at is not None:
            stamp = cells[self.t_at]
            if stamp != self.last_stamp:
                self.last_t = round(self.parse_time(stamp) - self.t0, 6)  # type: ignore[misc]
                self._new_stamp(stamp)
            return self.last_t
        if tab.marker_times:
            return None if self.marker_t is None else round(self.marker_t - self.t0, 6)
        if tab.clock is not None:
            stamp = cells[tab.lay.clock_at] + cells[tab.lay.date_at]  # type: ignore[index]
            if stamp != self.last_stamp:
                self.last_t = round(tab.row_time(cells) - self.t0, 6)  # type: ignore[operator]
                self._new_stamp(stamp)
            return self.last_t
        return None

    def _new_stamp(self, stamp: str) -> None:
        self.last_stamp = stamp
        self.sub = 0
        self.sub_gpus.clear()

    def _gpu(self, cells: list[str], t: float | None, no: int) -> int:
        """Which GPU a long layout's row is: its index, key, or place in the cycle."""
        if self.index_at is not None:
            gpu = int(float(cells[self.index_at]))
            if not 0 <= gpu < MAX_GPUS:
                raise ValueError(f"GPU index {cells[self.index_at].strip()!r} is not one")
            return gpu
        if self.key_at is not None:
            k = cells[self.key_at].strip()
            known = self.ordinals.get(k)
            if known is None:
                known = self.ordinals[k] = len(self.ordinals)
            return known
        if self.assigner is not None:
            return self._assigned(cells, t, no, self.assigner)
        return 0

    def _assigned(
        self, cells: list[str], t: float | None, no: int, assigner: ident.Assigner
    ) -> int:
        cyc = self.tab.cycle
        if cyc.mode == "key" and self.tab.key_cols:  # type: ignore[union-attr]
            return assigner.by_key(tuple(cells[i].strip() for i in self.tab.key_cols))
        if cyc.mode == "time" and t is not None:  # type: ignore[union-attr]
            return assigner.by_time(t, no)
        mem = None
        if self.mem_at is not None:
            try:
                mem = fnum(cells[self.mem_at])
            except ValueError:
                mem = None
        return assigner.by_cycle(mem, no)

    def _spread(self, t: float | None, gpu: int) -> float:
        """The row's tick time: counted in intervals without a time column; spread
        ``sub_stamp`` apart when several ticks share one whole-second timestamp."""
        if t is None:
            if gpu in self.sub_gpus or not self.sub_gpus:
                self.sub_gpus.clear()
                self.tick += 1
            self.sub_gpus.add(gpu)
            return self.tick * self.interval
        if self.sub_stamp is not None:
            if gpu in self.sub_gpus:
                self.sub_gpus.clear()
                self.sub += 1
            self.sub_gpus.add(gpu)
            return round(t + self.sub * self.sub_stamp, 6)
        return t

    def _all_gpus(
        self, cells: list[str], t: float | None
    ) -> tuple[float, list[tuple[int, float | None]]]:
        """A wide row (every GPU's columns) or a row of utilisation series."""
        if t is None:
            self.tick += 1
            t = self.tick * self.interval
        out = [(g, None if u is None else self._util(cells, u)) for g, u in self.wide]
        if self.u_at is not None and not self.wide:
            out.append((0, self._util(cells, self.u_at)))
        out.extend((g, self._util(cells, c)) for c, g in self.series)
        return t, out

    def row(self, cells: list[str], no: int) -> tuple[float, list[tuple[int, float | None]]]:
        self.no = no
        t = self._time(cells)
        if self.wide or self.series:
            return self._all_gpus(cells, t)
        gpu = self._gpu(cells, t, no)
        t = self._spread(t, gpu)
        util = None if self.u_at is None else self._util(cells, self.u_at)
        return t, [(gpu, util)]

    def finish(self) -> None:
        self.not_rows.say(self.path, self.warns)
        self.non_finite.say(self.path, self.warns)
        self.out_of_range.say(self.path, self.warns)
        for a in self.assigners:
            if a.breaks:
                self.warns.append(
                    f"{self.path}:{a.first_break}: the cycle of GPUs broke {a.breaks} time(s) "
                    "(a tick with more or fewer rows than GPUs, or a GPU's values turning up "
                    "in another's row); each time the next row was re-synced"
                )
