"""Building samples from a table's rows: everything one header fixes (``Table``), and the
``GpuSample`` / ``HostSample`` builders the assembler calls for the rows that become
samples -- column positions looked up once per header, not once per row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpumon.model import GpuSample, HostSample, Point
from gpumon.traces import identity as ident
from gpumon.traces._common import MIB, cell_text, fnum, mem_mib, num
from gpumon.traces.columns import Layout
from gpumon.traces.tab_header import GPU_FIELDS
from gpumon.traces.timefmt import TimeParser


def _reasons(cell: str) -> int | None:
    value = cell.strip()
    if not value or value.startswith("[") or value.upper() == "N/A":
        return None
    return int(value, 16 if value.lower().startswith("0x") else 10)


def scale_of(lay: Layout, i: int | None) -> float:
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
        scale_of(lay, i_used),
        scale_of(lay, i_total),
        scale_of(lay, i_free),
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


class Table:
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
        self.marker_times = False  # no time column: rows take the time line above them

    def gpu_columns(self) -> dict[int, dict[str, int]]:
        """GPU index -> its fields' columns (one entry for a long layout: key -1)."""
        lay = self.lay
        if lay.wide:
            out = {g: dict(f) for g, f in sorted(lay.wide.items())}
        else:
            out = {-1: {f: i for f, i in lay.at.items() if f in GPU_FIELDS or f == "reasons"}}
        return out

    def row_time(
        self, cells: list[str], parse: Callable[[str], float] | None = None
    ) -> float | None:
        """A row's time in seconds (``parse``: the time column's parser, when it keeps state)."""
        lay = self.lay
        if self.time is not None:
            return (parse or self.time.parse)(cells[lay.time_at])  # type: ignore[index]
        if self.clock is not None and self.date is not None:
            return self.date(cells[lay.date_at]) + self.clock.parse(cells[lay.clock_at])  # type: ignore[index]
        return None

    def uuid(self, gpu: int, cells: list[str]) -> str:
        """A GPU's uuid (or bus id), read from its first row and kept; ``gpuN`` without one."""
        got = self.uuids.get(gpu)
        if got is None:
            lay = self.lay
            if not lay.wide:
                got = cell_text(cells, lay.at.get("uuid")) or cell_text(cells, lay.at.get("bus"))
            if got is None and lay.aggregate and not lay.wide:
                got = "aggregate"
            got = got or f"gpu{gpu}"
            self.uuids[gpu] = got
        return got

    def fingerprint(self, cells: list[str]) -> ident.Fingerprint:
        """The row's values that tell GPUs apart (``identity.FP_FIELDS``)."""
        return ident.fingerprint(self.lay.at, cells)


def host_sample(payload: tuple[Any, ...], t: float) -> HostSample | None:
    """The host's CPU from a row's CPU columns (the assembler's host builder)."""
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
