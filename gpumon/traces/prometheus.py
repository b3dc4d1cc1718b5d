"""Prometheus ``api/v1/query_range`` JSON: what an admin pulls from the cluster's Prometheus.

Series of dcgm-exporter (``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``,
``DCGM_FI_DEV_POWER_USAGE``, ``DCGM_FI_DEV_FB_USED`` ...), nvidia_gpu_exporter
(``nvidia_smi_utilization_gpu_ratio`` ...) and gpumon itself (``gpumon_gpu_utilization_ratio``
...), one response or several (concatenated, one per line, or in a JSON array).  A GPU is
its (host, GPU label) pair: ``Hostname``/``instance`` and ``gpu``/``UUID``/``uuid``.  Every
distinct timestamp is a tick.

The export is scanned series by series (a response is one line of many MB), each series'
points kept as two float arrays; a query_range series holds at most 11,000 points, and all
series together at most ``MAX_POINTS`` (a named error beyond).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from math import isfinite
from typing import Any

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, GpuSample, HostSample, Snapshot, TraceHeader
from gpumon.traces import dcgm_fields
from gpumon.traces._common import MIB, Tally, add_note, median_interval
from gpumon.traces.jsonstream import Buffer
from gpumon.traces.reader import Reader
from gpumon.traces.source import Source, as_source

FORMAT = "prometheus"
MAX_POINTS = 4_000_000

_MEMORY = frozenset(("mem_used", "mem_free", "mem_total"))
_EXPORTED = (
    frozenset(
        ("util", "util_prof", "sm_active", "sm_occupancy", "tensor_active", "mem_util", "power")
    )
    | _MEMORY
    | frozenset(("power_limit", "temp", "sm_clock"))
)

# metric name -> (field, scale to gpumon's unit): dcgm-exporter's from DCGM's one table
# (its memory in MiB, kept here in bytes), then nvidia_gpu_exporter's and gpumon's own.
METRICS: dict[str, tuple[str, float]] = {
    **{
        f.fi: (f.field, f.scale * (MIB if f.field in _MEMORY else 1.0))
        for f in dcgm_fields.FIELDS
        if f.field in _EXPORTED and f.rank == 0
    },
    "nvidia_smi_utilization_gpu_ratio": ("util", 100.0),
    "nvidia_smi_utilization_memory_ratio": ("mem_util", 100.0),
    "nvidia_smi_memory_used_bytes": ("mem_used", 1.0),
    "nvidia_smi_memory_total_bytes": ("mem_total", 1.0),
    "nvidia_smi_memory_free_bytes": ("mem_free", 1.0),
    "nvidia_smi_power_draw_watts": ("power", 1.0),
    "nvidia_smi_enforced_power_limit_watts": ("power_limit", 1.0),
    "nvidia_smi_power_limit_watts": ("power_limit", 1.0),
    "nvidia_smi_temperature_gpu": ("temp", 1.0),
    "nvidia_smi_clocks_current_sm_clock_hz": ("sm_clock", 1e-6),
    "gpumon_gpu_utilization_ratio": ("util", 100.0),
    "gpumon_gpu_memory_used_bytes": ("mem_used", 1.0),
    "gpumon_gpu_memory_total_bytes": ("mem_total", 1.0),
    "gpumon_gpu_power_watts": ("power", 1.0),
    "gpumon_gpu_power_limit_watts": ("power_limit", 1.0),
    "gpumon_host_cpu_ratio": ("host_cpu", 100.0),
    "gpumon_host_iowait_ratio": ("host_iowait", 100.0),
}
_HOST_LABELS = ("Hostname", "hostname", "instance", "node", "kubernetes_node")
_GPU_LABELS = ("gpu", "minor_number", "index", "UUID", "uuid", "device")


def sniff(head: list[str]) -> bool:
    text = "".join(head)[: 1 << 16]
    s = text.lstrip()
    return s[:1] in "{[" and '"resultType"' in text and '"result"' in text


@dataclass
class _Series:
    fld: str
    scale: float
    host: str
    gpu_label: str | None
    labels: dict[str, str]
    times: array = field(default_factory=lambda: array("d"))
    values: array = field(default_factory=lambda: array("d"))


def _value(v: Any) -> float:
    if isinstance(v, str):
        x = float(v)  # "NaN", "+Inf" parse; NaN is no reading, Inf is dropped too
        return x if isfinite(x) else float("nan")
    if isinstance(v, int | float) and not isinstance(v, bool):
        return float(v)
    raise ValueError(f"value {v!r} is not a number")


def _series_of(
    obj: Any, total: list[int], path: str, line: int, non_finite: Tally
) -> _Series | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("metric"), dict):
        raise TraceFormatError("a result entry without its metric labels", path=path, line=line)
    labels = {str(k): str(v) for k, v in obj["metric"].items()}
    name = labels.get("__name__", "")
    known = METRICS.get(name)
    if known is None:
        return None
    host = next((labels[k] for k in _HOST_LABELS if k in labels), "")
    gpu = next((labels[k] for k in _GPU_LABELS if k in labels), None)
    s = _Series(known[0], known[1], host, gpu, labels)
    points = obj.get("values")
    if points is None and "value" in obj:
        points = [obj["value"]]
    if not isinstance(points, list):
        raise TraceFormatError(f"series {name} has no values", path=path, line=line)
    last = float("-inf")
    try:
        for p in points:
            t = float(p[0])
            if not isfinite(t):  # NaN, 1e999: no place in time; the point is skipped
                non_finite.note(line, f"{name} [{p[0]!r}, {p[1]!r}]")
                continue
            if t < last:
                raise ValueError("timestamps go backwards")
            last = t
            s.times.append(t)
            s.values.append(_value(p[1]))
    except (ValueError, TypeError, IndexError, KeyError, OverflowError) as exc:
        raise TraceFormatError(
            f"series {name}: malformed point ({exc})", path=path, line=line
        ) from None
    total[0] += len(points)
    if total[0] > MAX_POINTS:
        raise TraceFormatError(
            f"the export holds more than {MAX_POINTS:,} points: query a shorter range or a "
            "coarser step",
            path=path,
            line=line,
        )
    return s


def _all_series(buf: Buffer, path: str, non_finite: Tally) -> tuple[list[_Series], set[str]]:
    """Every known series in every response of the export (unknown metrics are named)."""
    out: list[_Series] = []
    unknown: set[str] = set()
    total = [0]
    while buf.find('"result"'):
        if buf.skip() != ":":
            raise buf.error('expected ":" after "result"')
        buf.take(":")
        if buf.skip() != "[":
            raise buf.error('"result" is not a list (an instant "vector" query? use query_range)')
        buf.take("[")
        while True:
            c = buf.skip(" \t\r\n,")
            if c is None:
                raise EOFError("the export is cut short")
            if c == "]":
                buf.take("]")
                break
            line = buf.line
            obj = buf.value()
            s = _series_of(obj, total, path, line, non_finite)
            if s is None:
                unknown.add(str(obj.get("metric", {}).get("__name__", "(unnamed)")))
            elif len(s.times):
                out.append(s)
    return out, unknown


def read(
    lines: Iterable[str] | Source,
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse a Prometheus query_range export: the header now, the snapshots lazily."""
    warns = warnings if warnings is not None else []
    buf = Buffer(as_source(lines, path).chunks(), path)
    non_finite = Tally("point(s) whose time is not a finite number (NaN, inf): skipped")
    try:
        series, unknown = _all_series(buf, path, non_finite)
    except EOFError:
        raise TraceFormatError(
            "the Prometheus export is cut short", path=path, line=buf.line
        ) from None
    non_finite.say(path, warns)
    gpu_series = [s for s in series if not s.fld.startswith("host_")]
    if not gpu_series:
        names = ", ".join(sorted(unknown)[:5]) or "none"
        raise TraceFormatError(
            f"no GPU series gpumon reads in this export (found: {names}); query "
            "DCGM_FI_DEV_GPU_UTIL, nvidia_smi_utilization_gpu_ratio or "
            "gpumon_gpu_utilization_ratio",
            path=path,
        )
    keys = sorted({(s.host, s.gpu_label) for s in gpu_series}, key=_order)
    index = {k: i for i, k in enumerate(keys)}
    hosts = {k[0] for k in keys}
    identities = []
    for k, i in index.items():
        labels = next(s.labels for s in gpu_series if (s.host, s.gpu_label) == k)
        uuid = labels.get("UUID") or labels.get("uuid") or f"gpu{i}"
        name = labels.get("modelName") or labels.get("name")
        if len(hosts) > 1:
            name = f"{k[0]} {name or ''}".strip()
        identities.append(
            GpuIdentity(index=i, uuid=uuid, name=name, pci_bus_id=labels.get("pci_bus_id"))
        )
    extra: dict[str, object] = {}
    if unknown:
        extra["ignored_series"] = sorted(unknown)
    if len(hosts) > 1:
        add_note(
            extra, f"the export holds {len(hosts)} hosts; each host's GPUs are numbered in turn"
        )
    fields = {s.fld for s in gpu_series}
    if "util" not in fields and "util_prof" in fields:
        add_note(
            extra, "utilisation read from DCGM_FI_PROF_GR_ENGINE_ACTIVE (no DCGM_FI_DEV_GPU_UTIL)"
        )
    elif "util" not in fields:
        warns.append(f"{path}: no GPU utilisation series; the GPUs' activity cannot be judged")
    steps = median_interval(sorted({t for s in gpu_series for t in s.times[:200]}))
    interval = steps or interval_s or 15.0
    add_note(
        extra,
        f"Prometheus samples every {interval:g} s (the scrape interval or query step): gaps "
        "shorter than that do not show",
    )
    t0 = min(s.times[0] for s in series)
    header = TraceHeader(
        version=1,
        source=FORMAT,
        hostname=next(iter(hosts)) if len(hosts) == 1 and next(iter(hosts)) else None,
        started_wall_s=t0,
        started_mono_s=0.0,
        interval_s=interval,
        gpus=tuple(identities),
        extra=extra,
    )
    return header, _snapshots(series, index, t0, [g.uuid for g in identities])


def _order(key: tuple[str, str | None]) -> tuple[str, int, str]:
    host, gpu = key
    return (host, int(gpu) if gpu is not None and gpu.isdecimal() else 1 << 30, gpu or "")


def _snapshots(
    series: list[_Series], index: dict[tuple[str, str | None], int], t0: float, uuids: list[str]
) -> Iterator[Snapshot]:
    """One snapshot per distinct timestamp, merging all series in time order."""
    heap = [(s.times[0], k, 0) for k, s in enumerate(series)]
    heapq.heapify(heap)
    while heap:
        t = heap[0][0]
        per_gpu: dict[int, dict[str, float]] = {}
        host: dict[str, float] = {}
        while heap and heap[0][0] == t:
            _t, k, i = heapq.heappop(heap)
            s = series[k]
            v = s.values[i]
            if v == v:  # NaN: no reading
                if s.fld.startswith("host_"):
                    host[s.fld] = v * s.scale
                else:
                    per_gpu.setdefault(index[(s.host, s.gpu_label)], {})[s.fld] = v * s.scale
            if i + 1 < len(s.times):
                heapq.heappush(heap, (s.times[i + 1], k, i + 1))
        rel = round(t - t0, 6)
        samples = tuple(_sample(g, rel, f, uuids[g]) for g, f in sorted(per_gpu.items()))
        h = None
        if host:
            h = HostSample(
                t_s=rel, cpu_pct=host.get("host_cpu"), iowait_pct=host.get("host_iowait")
            )
        if samples or h is not None:
            yield Snapshot(t_s=rel, gpus=samples, host=h)


def _sample(gpu: int, t: float, f: dict[str, float], uuid: str) -> GpuSample:
    util = f.get("util", f.get("util_prof"))
    used, total = f.get("mem_used"), f.get("mem_total")
    if used is None and total is not None and "mem_free" in f:
        used = total - f["mem_free"]
    if total is None and used is not None and "mem_free" in f:
        total = used + f["mem_free"]
    clock = f.get("sm_clock")
    return GpuSample(
        t_s=t,
        gpu=gpu,
        uuid=uuid,
        util_pct=util,
        mem_util_pct=f.get("mem_util"),
        mem_used_bytes=None if used is None else int(used),
        mem_total_bytes=None if total is None else int(total),
        power_watts=f.get("power"),
        power_limit_watts=f.get("power_limit"),
        sm_clock_mhz=None if clock is None else int(clock),
        temperature_c=f.get("temp"),
        sm_active_ratio=f.get("sm_active"),
        sm_occupancy_ratio=f.get("sm_occupancy"),
        tensor_active_ratio=f.get("tensor_active"),
    )


READER = Reader(
    FORMAT,
    "Prometheus api/v1/query_range JSON (dcgm-exporter, nvidia_gpu_exporter, gpumon series)",
    sniff,
    read,
)
