"""CSV from home-made loggers: a time column and a utilisation column recognised by name.

Time: epoch seconds (or milliseconds), ISO 8601, nvidia-smi's ``2024/05/01 12:00:00.123``,
or seconds since start.  Utilisation in percent (or as a 0-1 fraction, detected and said
in the header's ``extra``).  Optional: a GPU index column, memory used (unit from the name:
``_mb``/``_mib`` MiB, ``_gb``/``_gib`` GiB, ``_bytes``; MiB otherwise), power in watts.
Comma, semicolon or tab separated.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from itertools import chain
from math import isfinite

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, GpuSample, Point, Snapshot, TraceHeader
from gpumon.traces._common import (
    Assembler,
    bad_line,
    cut_short_warning,
    is_cut_short,
    median_interval,
    num,
)

FORMAT = "csv"
PREFIX_ROWS = 400

_TIME_NAMES = (
    "timestamp",
    "time",
    "t",
    "ts",
    "elapsed",
    "elapsed_s",
    "time_s",
    "seconds",
    "t_s",
    "datetime",
    "date_time",
    "wall_time",
    "epoch",
    "unix_time",
    "secs",
)
_UTIL_NAMES = (
    "gpu_util",
    "util",
    "utilization",
    "gpu_utilization",
    "utilization.gpu",
    "gpu_util_pct",
    "util_pct",
    "gpu_util_percent",
    "utilization_gpu",
    "gpu_utilisation",
    "utilisation",
    "gpu_usage",
    "gpu_load",
    "sm_util",
    "gpu",
    "gpu_pct",
    "gpu_percent",
    "usage",
)
_INDEX_NAMES = (
    "gpu_index",
    "gpu_id",
    "index",
    "gpu_idx",
    "device",
    "device_id",
    "gpu",
    "cuda_device",
    "rank",
    "local_rank",
    "idx",
)
_MEM_NAMES = (
    "mem_used",
    "memory_used",
    "gpu_mem",
    "gpu_memory",
    "mem",
    "memory",
    "memory.used",
    "gpu_mem_used",
    "fb_used",
)
_POWER_NAMES = (
    "power",
    "power_w",
    "power_watts",
    "power_draw",
    "power.draw",
    "gpu_power",
    "watts",
    "pwr",
)
_UNIT_SUFFIX_RE = re.compile(
    r"[\s_]*[\[(]?(%|pct|percent|mib|mb|gib|gb|bytes|b|w|watts|s|"
    r"sec|ms)[\])]?$"
)


def _norm(name: str) -> str:
    return name.strip().strip('"').strip().lower().replace(" ", "_").replace("-", "_")


def _base(name: str) -> str:
    """``gpu_util_%`` / ``power (W)`` / ``mem_used_mb`` -> ``gpu_util`` / ``power`` / ..."""
    return _UNIT_SUFFIX_RE.sub("", name).rstrip("_") or name


def _find(names: list[str], wanted: tuple[str, ...], skip: set[int]) -> int | None:
    for want in wanted:
        for i, n in enumerate(names):
            if i not in skip and (n == want or _base(n) == want):
                return i
    return None


def _delimiter(line: str) -> str:
    return max(",;\t", key=line.count)


class Columns:
    def __init__(self, cells: list[str]):
        names = [_norm(c) for c in cells]
        self.count = len(names)
        self.time_at = _find(names, _TIME_NAMES, set())
        self.time_ms = self.time_at is not None and names[self.time_at].endswith("ms")
        used = {self.time_at} if self.time_at is not None else set()
        self.util_at = _find(names, _UTIL_NAMES, used)
        if self.util_at is not None:
            used.add(self.util_at)
        self.index_at = _find(names, _INDEX_NAMES, used)
        if self.index_at is not None:
            used.add(self.index_at)
        self.mem_at = _find(names, _MEM_NAMES, used)
        self.mem_scale = 1 << 20
        if self.mem_at is not None:
            used.add(self.mem_at)
            n = names[self.mem_at]
            if n.endswith(("gb", "gib", "gib)", "gb)", "gib]", "gb]")):
                self.mem_scale = 1 << 30
            elif n.endswith(("bytes", "_b")):
                self.mem_scale = 1
        self.power_at = _find(names, _POWER_NAMES, used)


def sniff(head: list[str]) -> bool:
    lines = [ln for ln in head if ln.strip()]
    if len(lines) < 2:
        return False
    first = lines[0].lstrip("\ufeff")
    cols = Columns(first.rstrip("\r\n").split(_delimiter(first)))
    return cols.time_at is not None and cols.util_at is not None and cols.count >= 2


def _time_parser(sample: str) -> tuple[str, object]:
    """How to read this file's time column: ('num', scale) or ('iso', None)."""
    s = sample.strip().strip('"')
    try:
        v = float(s)
    except ValueError:
        return "iso", None
    if v > 1e12:
        return "num", 1e-3  # epoch milliseconds
    return "num", 1.0


def _iso(s: str) -> float:
    s = s.strip().strip('"').replace("/", "-")
    if s.endswith("Z"):
        s = s[:-1] + "+00:00"
    dt = datetime.fromisoformat(s)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def read(
    lines: Iterable[str], path: str = "<input>", warnings: list[str] | None = None
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse a home-made CSV log: the header now, the snapshots lazily."""
    warns = warnings if warnings is not None else []
    numbered = enumerate(lines, 1)
    prefix: list[tuple[int, str]] = []
    header_line = None
    for no, line in numbered:
        prefix.append((no, line))
        if line.strip():
            header_line = line.lstrip("\ufeff").rstrip("\r\n")
            break
    if header_line is None:
        raise TraceFormatError("empty file", path=path)
    delim = _delimiter(header_line)
    cols = Columns(header_line.split(delim))
    if cols.time_at is None or cols.util_at is None:
        raise TraceFormatError(
            "CSV without a recognisable time column (time, timestamp, t, elapsed, ...) and "
            f"utilisation column (gpu_util, util, utilization, ...): header is {header_line!r}",
            path=path,
            line=prefix[-1][0],
        )
    rows: list[list[str]] = []
    for no, line in numbered:
        prefix.append((no, line))
        if line.strip():
            rows.append(line.rstrip("\r\n").split(delim))
        if len(rows) >= PREFIX_ROWS:
            break
    good = [r for r in rows if len(r) == cols.count]
    kind, scale = _time_parser(good[0][cols.time_at]) if good else ("num", 1.0)
    if kind == "num" and cols.time_ms:
        scale = 1e-3
    extra: dict[str, object] = {}
    fraction = False
    try:
        utils = [num(r[cols.util_at]) for r in good]
        values = [u for u in utils if u is not None]
        if values and max(values) <= 1.0 and any(0 < u < 1 for u in values):
            fraction = True
            extra["util_scale"] = "utilisation logged as a 0-1 fraction; read as percent x100"
        times = [
            _iso(r[cols.time_at]) if kind == "iso" else float(r[cols.time_at]) * scale for r in good
        ]
    except (ValueError, IndexError):
        times, utils = [], []
    relative = kind == "num" and bool(times) and times[0] < 1e8
    if relative:
        extra["timestamps"] = "seconds since the start of the log"
    if cols.index_at is None:
        extra["gpus_inferred"] = "1 (no GPU index column)"
    gpu_ids: list[int] = []
    try:
        gpu_ids = (
            sorted({int(float(r[cols.index_at])) for r in good})
            if cols.index_at is not None
            else [0]
        )
    except ValueError:
        gpu_ids = [0]
    if cols.index_at is None:
        gpu_ids = [0]
    # Tick times: one per distinct time.
    interval = median_interval(times) if times else None
    header = TraceHeader(
        version=1,
        source=FORMAT,
        started_wall_s=None if relative or not times else times[0],
        started_mono_s=0.0,
        interval_s=interval,
        gpus=tuple(GpuIdentity(index=g, uuid=f"gpu{g}") for g in gpu_ids),
        extra=extra,
    )
    t0 = times[0] if times else 0.0
    return header, _snapshots(
        chain(prefix[1:], numbered), cols, delim, kind, scale, t0, fraction, interval, path, warns
    )


def _snapshots(
    lines: Iterator[tuple[int, str]],
    cols: Columns,
    delim: str,
    kind: str,
    scale: object,
    t0: float,
    fraction: bool,
    interval: float | None,
    path: str,
    warns: list[str],
) -> Iterator[Snapshot]:
    def build(
        gpu: int, t: float, util: float | None, points: tuple[Point, ...], payload: tuple
    ) -> GpuSample:
        cells = payload[0]
        mem = num(cells[cols.mem_at]) if cols.mem_at is not None else None
        power = num(cells[cols.power_at]) if cols.power_at is not None else None
        return GpuSample(
            t_s=t,
            gpu=gpu,
            uuid=f"gpu{gpu}",
            util_samples=points,
            util_pct=util,
            mem_used_bytes=None if mem is None else int(mem * cols.mem_scale),
            power_watts=power,
        )

    asm = Assembler(build, interval, path)
    t_at, u_at, i_at = cols.time_at, cols.util_at, cols.index_at
    assert t_at is not None and u_at is not None
    num_scale = scale if isinstance(scale, float) else 1.0
    for no, line in lines:
        cells = line.rstrip("\r\n").split(delim)
        if len(cells) != cols.count:
            if not line.strip():
                continue
            if is_cut_short(line):
                warns.append(cut_short_warning(path, no))
                break
            raise bad_line(path, no, line, f"expected {cols.count} columns, found {len(cells)}")
        try:
            raw_t = cells[t_at]
            t = round((_iso(raw_t) if kind == "iso" else float(raw_t) * num_scale) - t0, 6)
            if not isfinite(t):
                raise ValueError(f"time {raw_t.strip()!r} is not a number")
            gpu = int(float(cells[i_at])) if i_at is not None else 0
            util = num(cells[u_at])
            if fraction and util is not None:
                util *= 100.0
        except (ValueError, IndexError) as exc:
            if is_cut_short(line):
                warns.append(cut_short_warning(path, no))
                break
            raise bad_line(path, no, line, f"malformed value ({exc})") from None
        snap = asm.add(t, gpu, util, (cells, no, line))
        if snap is not None:
            yield snap
    snap = asm.flush()
    if snap is not None:
        yield snap
