"""The numbers behind a finding (evidence), in base units, absent where not measured.

Pure functions of a GPU's track and window: the detector calls them when an episode opens,
every 30th eval while it holds, and for the live verdict.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise
from typing import Literal

from gpumon.detect.config import DetectorConfig
from gpumon.detect.gpu import GpuTrack, Window
from gpumon.detect.host import HostWindow, outside_cpu_pct
from gpumon.detect.pauses import PauseTracker
from gpumon.detect.rings import quantile
from gpumon.model import Evidence

_GPM_KEYS: tuple[Literal["sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio"], ...] = (
    "sm_active_ratio",
    "sm_occupancy_ratio",
    "tensor_active_ratio",
)


def gpu_evidence(
    tr: GpuTrack,
    w: Window,
    cfg: DetectorConfig,
    run_peak_watts: float | None,
    host: HostWindow,
    cpu_count: int | None,
) -> Evidence:
    """One GPU's numbers over its current window (plus the host's over the same span)."""
    ev: Evidence = {}
    if w.duty is not None:
        ev["duty_cycle"] = round(w.duty, 4)
    ev["window_s"] = round(w.span_s, 2)
    coarse = tr.period_s is None or tr.period_s >= cfg.coarse_period_s
    if not coarse:
        b, g = tr.bursts.values(), tr.gaps.values()
        b50, b90, g50, g90 = (quantile(v, q) for v in (b, g) for q in (0.5, 0.9))
        if b50 is not None and b90 is not None:
            ev["burst_p50_s"], ev["burst_p90_s"] = round(b50, 3), round(b90, 3)
        if g50 is not None and g90 is not None:
            ev["gap_p50_s"], ev["gap_p90_s"] = round(g50, 3), round(g90, 3)
        per = tr.cycle_period_s()
        if per is not None:
            ev["period_s"] = round(per, 3)
    rh = tr.rhythm()
    if rh is not None and rh.period_s >= 10.0:
        ev["pause_interval_p50_s"] = round(rh.period_s, 1)
        ev["pause_p50_s"] = round(rh.gap_s, 1)
    if tr.period_s is not None:
        ev["sample_period_s"] = round(tr.period_s, 3)
    ev["samples"] = tr.readings
    if w.power_watts is not None:
        ev["power_watts"] = round(w.power_watts, 1)
        ref = tr.power_ref_watts(run_peak_watts)
        if tr.power_peak_watts is not None:
            ev["power_peak_watts"] = round(tr.power_peak_watts, 1)
        if ref:
            ev["power_share_of_peak"] = round(w.power_watts / ref, 3)
    if tr.power_limit_watts is not None:
        ev["power_limit_watts"] = tr.power_limit_watts
    # Hopper's GPM counters over the latest tick, where the GPU has them.
    for key in _GPM_KEYS:
        v = getattr(tr, key)
        if v is not None:
            ev[key] = round(v, 3)
    used, total = tr.mem_used_bytes, tr.mem_total_bytes
    if used is not None:
        ev["mem_used_bytes"] = used
    if total:
        ev["mem_total_bytes"] = total
        if used is not None:
            head = 1.0 - used / total
            ev["mem_headroom_ratio"] = round(head, 3)
            ev["larger_batch_fits"] = "yes" if head >= cfg.batch_headroom_ratio else "no"
    if tr.processes is not None:
        ev["processes"] = tr.processes
    ev.update(host_evidence(host, cpu_count))
    if cpu_count is not None:
        ev["cpu_count"] = cpu_count
    return ev


def host_evidence(host: HostWindow, cpu_count: int | None = None) -> Evidence:
    """Host readings rounded for people (bytes per second whole, percentages to 0.1), and
    what processes outside the job take, where the job's tree and the host are read."""
    ev: Evidence = {}
    for k, v in host.items():
        ev[k] = round(v) if k == "read_bytes_per_s" else round(v, 1)
    outside = outside_cpu_pct(host, cpu_count)
    if outside is not None:
        ev["outside_cpu_pct"] = round(outside, 1)
    return ev


def multi_evidence(
    duties: Iterable[float | None], straggler: int | None, pauses: PauseTracker
) -> Evidence:
    """Run-wide numbers: GPUs of work delivered, the straggler, all-GPU pauses."""
    ev: Evidence = {}
    known = [d for d in duties if d is not None]
    if known:
        ev["effective_gpus"] = round(sum(known), 2)
    if straggler is not None:
        ev["straggler_gpu"] = straggler
    spans = list(pauses.pauses)
    if spans:
        ev["pauses"] = len(spans)
        ev["pause_p50_s"] = round(quantile([b - a for a, b in spans], 0.5) or 0.0, 2)
        if len(spans) >= 2:
            starts = [a for a, _ in spans]
            gaps = [b - a for a, b in pairwise(starts)]
            ev["pause_interval_p50_s"] = round(quantile(gaps, 0.5) or 0.0, 2)
    if pauses.skew_s is not None:
        ev["skew_s"] = round(pauses.skew_s, 3)
    return ev
