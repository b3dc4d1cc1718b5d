"""W&B system metrics: ``wandb-events.jsonl`` (one JSON object per line, as the SDK wrote it
beside a run) and the same keys from the API (``system/gpu.0.gpu``).

Per GPU N: ``system.gpu.N.gpu`` (utilisation %), ``.memory`` (memory activity %),
``.memoryAllocated`` (% of its memory) or ``.memoryAllocatedBytes``, ``.powerWatts``,
``.enforcedPowerLimitWatts`` (or ``.powerPercent``: the limit follows), ``.temp``,
``.smClock``; ``system.gpu.process.N.*`` (the run's own process) stands in where the
device-level key is absent.  ``system.cpu`` is the host's CPU.  Time: ``_timestamp``
(epoch seconds), else ``_runtime`` (seconds since the run started).  W&B averages each
metric over its sampling period (~15-30 s): short gaps are invisible, and the header says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from itertools import chain
from math import isfinite
from typing import Any

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, GpuSample, HostSample, Snapshot, TraceHeader
from gpumon.traces._common import (
    Tally,
    add_note,
    cut_short_warning,
    is_cut_short,
    median_interval,
    non_finite_times,
)
from gpumon.traces.columns import WANDB_GPU_FIELDS
from gpumon.traces.reader import Reader
from gpumon.traces.source import Source, numbered_lines
from gpumon.traces.timefmt import NonFiniteTime

FORMAT = "wandb"
PREFIX_LINES = 64


def _is_system_key(key: str) -> bool:
    return key.startswith(("system.gpu.", "system/gpu.", "system.cpu", "system/cpu"))


def sniff(head: list[str]) -> bool:
    for ln in head[:20]:
        s = ln.strip()
        if not s:
            continue
        if not s.startswith("{"):
            return False
        return ('"system.gpu.' in s or '"system/gpu.' in s) and (
            "_timestamp" in s or "_runtime" in s
        )
    return False


# gpu -> field -> value, from one event's keys.
Fields = dict[int, dict[str, float]]


def _fields(obj: dict[str, Any]) -> tuple[Fields, float | None]:
    gpus: Fields = {}
    process: Fields = {}
    cpu = None
    for key, value in obj.items():
        if not _is_system_key(key) or isinstance(value, bool) or value is None:
            continue
        if not isinstance(value, int | float):
            raise ValueError(f"{key} is {value!r}, not a number")
        value = float(value)  # an int too large for a float: OverflowError, said by the caller
        rest = key[7:]  # after "system." / "system/"
        if rest in ("cpu", "cpu_percent"):
            cpu = float(value)
            continue
        parts = rest.split(".")
        target = gpus
        if len(parts) == 4 and parts[1] == "process":
            parts = [parts[0], parts[2], parts[3]]
            target = process
        if len(parts) != 3 or parts[0] != "gpu" or not parts[1].isdecimal() or len(parts[1]) > 4:
            continue
        fld = WANDB_GPU_FIELDS.get(parts[2].lower())
        if fld is not None:
            target.setdefault(int(parts[1]), {})[fld] = float(value)
    for g, per in process.items():
        mine = gpus.setdefault(g, {})
        for fld, v in per.items():
            mine.setdefault(fld, v)
    return gpus, cpu


def _time(obj: dict[str, Any]) -> tuple[float, bool]:
    """The event's time (``_timestamp``, else ``_runtime``) and whether it is absolute;
    NonFiniteTime for a NaN or infinite one (JSON from Python writes them)."""
    for key, absolute in (("_timestamp", True), ("_runtime", False)):
        v = obj.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool):
            t = float(v)
            if not isfinite(t):
                raise NonFiniteTime(f"{key} is {v!r}, not a finite time")
            return t, absolute
    raise ValueError("no _timestamp or _runtime")


def _sample(gpu: int, t: float, f: dict[str, float]) -> GpuSample:
    used = f.get("mem_used_bytes")
    total = f.get("mem_total_bytes")
    limit = f.get("power_limit")
    power = f.get("power")
    if limit is None and power is not None and f.get("power_pct"):
        limit = power * 100 / f["power_pct"]
    clock = f.get("sm_clock")
    return GpuSample(
        t_s=t,
        gpu=gpu,
        uuid=f"gpu{gpu}",
        util_pct=f.get("util"),
        mem_util_pct=f.get("mem_util"),
        mem_used_bytes=None if used is None else int(used),
        mem_total_bytes=None if total is None else int(total),
        power_watts=power,
        power_limit_watts=limit,
        sm_clock_mhz=None if clock is None else int(clock),
        temperature_c=f.get("temp"),
    )


def read(
    lines: Iterable[str] | Source,
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse W&B system-metric events: the header now, the snapshots lazily."""
    warns, numbered = numbered_lines(lines, path, warnings)
    prefix: list[tuple[int, str]] = []
    times: list[float] = []
    absolute = True
    gpus: set[int] = set()
    for no, line in numbered:
        prefix.append((no, line))
        try:
            obj = json.loads(line)
            t, absolute = _time(obj)
            fields, _cpu = _fields(obj)
        except (ValueError, TypeError, AttributeError, OverflowError, RecursionError):
            continue
        if fields:
            times.append(t)
            gpus.update(fields)
        if len(prefix) >= PREFIX_LINES:
            break
    if not gpus:
        raise TraceFormatError("no W&B GPU metrics (system.gpu.N.*) found", path=path)
    extra: dict[str, object] = {
        "timestamps": "epoch seconds (_timestamp)"
        if absolute
        else "seconds since the run started (_runtime)"
    }
    interval = median_interval(times) or interval_s or 30.0
    add_note(
        extra,
        f"W&B averages system metrics over its sampling period ({interval:g} s here): "
        "gaps shorter than that do not show",
    )
    header = TraceHeader(
        version=1,
        source=FORMAT,
        started_wall_s=times[0] if (times and absolute) else None,
        started_mono_s=0.0,
        interval_s=interval,
        gpus=tuple(GpuIdentity(index=g, uuid=f"gpu{g}") for g in sorted(gpus)),
        extra=extra,
    )
    return header, _snapshots(chain(prefix, numbered), times[0] if times else 0.0, path, warns)


def _snapshots(
    lines: Iterator[tuple[int, str]], t0: float, path: str, warns: list[str]
) -> Iterator[Snapshot]:
    non_finite = non_finite_times()
    try:
        yield from _events(lines, t0, path, warns, non_finite)
    finally:
        non_finite.say(path, warns)


def _events(
    lines: Iterator[tuple[int, str]], t0: float, path: str, warns: list[str], non_finite: Tally
) -> Iterator[Snapshot]:
    for no, line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            fields, cpu = _fields(obj)
            if not fields and cpu is None:
                continue  # an event of other metrics (network, disk) or a run marker
            t, _absolute = _time(obj)
        except NonFiniteTime:
            non_finite.note(no, line)
            continue
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            if is_cut_short(line):
                warns.append(cut_short_warning(path, no))
                return
            raise TraceFormatError(f"malformed W&B event ({exc})", path=path, line=no) from None
        t = round(t - t0, 6)
        samples = tuple(_sample(g, t, f) for g, f in sorted(fields.items()))
        host = None
        if cpu is not None and 0 <= cpu <= 100:
            host = HostSample(t_s=t, cpu_pct=cpu)
        yield Snapshot(t_s=t, gpus=samples, host=host)


READER = Reader(
    FORMAT, "W&B system metrics (wandb-events.jsonl with system.gpu.N.* keys)", sniff, read
)
