"""``nvidia-smi dmon`` logs: any ``-s`` selection, optional ``-o D``/``-o T``/``-o DT`` columns.

dmon prints a pair of ``#`` header lines (names, then units) and repeats it every few
ticks; columns are mapped by name from each pair.  ``-`` is no reading.  Without ``-o T``
rows carry no time: ticks are then counted (a GPU index seen again starts a new one) and
placed ``-d`` seconds apart, 1 s (dmon's default) unless the caller says otherwise; the
header's ``extra`` says so.  Also reads ``dmon --format csv`` (the same, comma-separated).
"""

from __future__ import annotations

import calendar
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from math import isfinite

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, GpuSample, Point, Snapshot, TraceHeader
from gpumon.traces._common import (
    MIB,
    Assembler,
    bad_line,
    cut_short_warning,
    is_cut_short,
    median_interval,
)
from gpumon.traces.reader import Reader
from gpumon.traces.source import Source, numbered_lines

FORMAT = "dmon"
PREFIX_ROWS = 200

# dmon column -> GpuSample field.  pclk is the graphics/SM clock; fb is framebuffer MiB
# used ("MB" in dmon's units line); rxpci/txpci are MB/s.
_FIELDS = {
    "sm": "util",
    "mem": "mem_util",
    "pwr": "power",
    "gtemp": "temp",
    "temp": "temp",
    "pclk": "sm_clock",
    "fb": "mem_used",
    "rxpci": "pcie_rx",
    "txpci": "pcie_tx",
}


def _split(line: str) -> list[str]:
    return line.replace(",", " ").split()


def is_name_line(line: str) -> bool:
    """``# gpu   pwr gtemp ...`` or ``#Date       Time        gpu ...``."""
    if not line.startswith("#"):
        return False
    names = [n.lower() for n in _split(line.lstrip("#"))]
    return "gpu" in names  # the units line has "Idx" where the names line has "gpu"


def sniff(head: list[str]) -> bool:
    lines = [ln.lstrip("\ufeff") for ln in head if ln.strip()]
    return (
        len(lines) >= 2
        and is_name_line(lines[0])
        and lines[1].startswith("#")
        and "idx" in lines[1].lower()
    )


class Columns:
    """Positions of the fields in one header pair's rows."""

    def __init__(self, names: list[str]):
        self.names = names
        self.count = len(names)
        self.at: dict[str, int] = {}
        lower = [n.lower() for n in names]
        self.gpu_at = lower.index("gpu")
        self.date_at = lower.index("date") if "date" in lower else None
        self.time_at = lower.index("time") if "time" in lower else None
        for i, name in enumerate(lower):
            fld = _FIELDS.get(name)
            if fld is not None and fld not in self.at:
                self.at[fld] = i
        self.util_at = self.at.get("util")
        self.build = _compile(self)


def _val(cells: list[str], i: int | None) -> float | None:
    if i is None:
        return None
    cell = cells[i]
    if cell == "-" or cell == "N/A":
        return None
    value = float(cell)
    return value if isfinite(value) else None  # "nan": no reading, never a number


def _compile(
    cols: Columns,
) -> Callable[[int, float, float | None, tuple[Point, ...], list[str]], GpuSample]:
    """A GpuSample builder for one header pair: column positions looked up once."""
    at = cols.at
    i_mutil, i_fb, i_power = at.get("mem_util"), at.get("mem_used"), at.get("power")
    i_clock, i_rx, i_tx, i_temp = (
        at.get("sm_clock"),
        at.get("pcie_rx"),
        at.get("pcie_tx"),
        at.get("temp"),
    )

    def build(
        gpu: int, t: float, util: float | None, points: tuple[Point, ...], cells: list[str]
    ) -> GpuSample:
        fb = _val(cells, i_fb)
        clock = _val(cells, i_clock)
        rx = _val(cells, i_rx)
        tx = _val(cells, i_tx)
        return GpuSample(
            t_s=t,
            gpu=gpu,
            uuid=f"gpu{gpu}",
            util_samples=points,
            util_pct=util,
            mem_util_pct=_val(cells, i_mutil),
            mem_used_bytes=None if fb is None else int(fb * MIB),
            power_watts=_val(cells, i_power),
            sm_clock_mhz=None if clock is None else int(clock),
            pcie_rx_bytes_per_s=None if rx is None else rx * MIB,
            pcie_tx_bytes_per_s=None if tx is None else tx * MIB,
            temperature_c=_val(cells, i_temp),
        )

    return build


class _Clock:
    """Row times from dmon's Date (YYYYMMDD) and Time (HH:MM:SS) columns.

    With Time alone the day is unknown: a time earlier than the previous one is the next day.
    """

    def __init__(self) -> None:
        self._day_base = 0
        self._last = float("-inf")
        self._dates: dict[str, int] = {}

    def of(self, cols: Columns, cells: list[str]) -> float | None:
        if cols.time_at is None:
            return None
        hms = cells[cols.time_at]
        secs = int(hms[0:2]) * 3600 + int(hms[3:5]) * 60 + int(hms[6:8])
        if cols.date_at is not None:
            d = cells[cols.date_at]
            base = self._dates.get(d)
            if base is None:
                base = calendar.timegm((int(d[0:4]), int(d[4:6]), int(d[6:8]), 0, 0, 0, 0, 0, 0))
                self._dates[d] = base
            t = float(base + secs)
        else:
            t = float(self._day_base + secs)
            if t < self._last - 43200:
                self._day_base += 86400
                t += 86400
        self._last = t
        return t


def read(
    lines: Iterable[str] | Source,
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse a dmon log: the header now, the snapshots lazily."""
    warns, numbered = numbered_lines(lines, path, warnings)
    prefix: list[tuple[int, str]] = []
    cols: Columns | None = None
    rows: list[list[str]] = []
    for no, line in numbered:
        prefix.append((no, line))
        if line.startswith("#") or line.startswith("\ufeff#"):
            if cols is None and is_name_line(line.lstrip("\ufeff")):
                cols = Columns(_split(line.lstrip("\ufeff#")))
            continue
        if line.strip() and cols is not None:
            rows.append(_split(line))
            if len(rows) >= PREFIX_ROWS:
                break
    if cols is None:
        raise TraceFormatError("no dmon header ('# gpu ...') found", path=path)

    extra: dict[str, object] = {}
    clock = _Clock()
    times: list[float] = []
    identities: dict[int, GpuIdentity] = {}
    seen: set[int] = set()
    try:
        for r in rows:
            if len(r) != cols.count:
                continue
            gpu = int(r[cols.gpu_at])
            identities.setdefault(gpu, GpuIdentity(index=gpu, uuid=f"gpu{gpu}"))
            t = clock.of(cols, r)
            if t is not None and (gpu in seen or not seen):
                seen.clear()
                times.append(t)
            seen.add(gpu)
    except ValueError:
        pass  # the row loop names the bad line
    if cols.time_at is None:
        interval = interval_s or 1.0
        extra["interval_assumed"] = (
            f"no time column (dmon without -o T): ticks assumed {interval:g} s apart"
        )
        started = None
    else:
        interval = interval_s or median_interval(times) or 1.0
        started = times[0] if times else None
        extra["timestamps"] = "local time of the logging machine, read as UTC"
        if cols.date_at is None:
            extra["date"] = "no date column (dmon -o T): the first day is 1970-01-01"
    header = TraceHeader(
        version=1,
        source=FORMAT,
        started_wall_s=started if cols.date_at is not None else None,
        started_mono_s=0.0,
        interval_s=interval,
        gpus=tuple(identities[g] for g in sorted(identities)),
        extra=extra,
    )
    return header, _snapshots(chain(prefix, numbered), cols, interval, started, path, warns)


def _snapshots(
    lines: Iterator[tuple[int, str]],
    cols: Columns,
    interval: float,
    started: float | None,
    path: str,
    warns: list[str],
) -> Iterator[Snapshot]:
    def build(
        gpu: int, t: float, util: float | None, points: tuple[Point, ...], payload: tuple
    ) -> GpuSample:
        row_cols, cells = payload[:2]
        return row_cols.build(gpu, t, util, points, cells)

    asm = Assembler(build, interval, path)
    clock = _Clock()
    t0 = started or 0.0
    tick = -1
    seen: set[int] = set()
    pending_names = False
    for no, line in lines:
        if line[:1] == "#" or line[:2] == "\ufeff#":
            text = line.lstrip("\ufeff")
            if is_name_line(text):
                names = _split(text.lstrip("#"))
                if names != cols.names:
                    cols = Columns(names)
                pending_names = True
            elif not pending_names:
                raise bad_line(path, no, line, "dmon units line without its names line")
            else:
                pending_names = False
            continue
        cells = _split(line)
        if len(cells) != cols.count:
            if not cells:
                continue
            if is_cut_short(line):
                warns.append(cut_short_warning(path, no))
                break
            raise bad_line(path, no, line, f"expected {cols.count} columns, found {len(cells)}")
        try:
            gpu = int(cells[cols.gpu_at])
            t = clock.of(cols, cells)
            if t is None:
                if gpu in seen or not seen:
                    seen.clear()
                    tick += 1
                seen.add(gpu)
                t = tick * interval
            else:
                t -= t0
            u_at = cols.util_at
            util = _val(cells, u_at)
        except (ValueError, IndexError, OverflowError) as exc:
            if is_cut_short(line):
                warns.append(cut_short_warning(path, no))
                break
            raise bad_line(path, no, line, f"malformed value ({exc})") from None
        snap = asm.add(t, gpu, util, (cols, cells, no, line))
        if snap is not None:
            yield snap
    snap = asm.flush()
    if snap is not None:
        yield snap


READER = Reader(
    FORMAT, "nvidia-smi dmon output ('# gpu ...' and '# Idx ...' header lines)", sniff, read
)
