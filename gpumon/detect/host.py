"""Host and process-tree readings, averaged over the GPUs' gaps, to name a starvation cause.

Each tick's readings are weighted by how much of that tick the GPUs spent waiting, so a
window's mean is "CPU during the gaps" (what starves the GPU), not CPU during compute.
"""

from __future__ import annotations

from typing import Literal

from gpumon.detect.config import DetectorConfig
from gpumon.detect.rings import History
from gpumon.model import Cause, HostSample, ProcTreeSample

# Quantities tracked, in evidence-key names.
HostKey = Literal[
    "main_cpu_pct",
    "workers_cpu_pct",
    "workers",
    "host_cpu_pct",
    "iowait_pct",
    "read_bytes_per_s",
    "max_core_pct",
]
HostWindow = dict[HostKey, float]  # gap-weighted means over a window; never read: absent
KEYS: tuple[HostKey, ...] = (
    "main_cpu_pct",
    "workers_cpu_pct",
    "workers",
    "host_cpu_pct",
    "iowait_pct",
    "read_bytes_per_s",
    "max_core_pct",
)
NK = len(KEYS)


def _tree_readings(
    tree: ProcTreeSample,
) -> tuple[float | None, float | None, float | None, float | None]:
    """(main CPU, mean CPU per worker, worker count, tree read bytes/s) of one tree sample."""
    main = None
    wsum = 0.0
    wn = 0
    read = None
    for p in tree.processes:
        if p.read_bytes_per_s is not None:
            read = (read or 0.0) + p.read_bytes_per_s
        if p.pid == tree.root_pid:
            main = p.cpu_pct
        elif p.cpu_pct is not None:
            wsum += p.cpu_pct
            wn += 1
    workers_mean = wsum / wn if wn else None
    return main, workers_mean, float(wn), read


class HostTrack:
    """Running gap-weighted sums of host/tree readings, with a bounded history for windows."""

    def __init__(self, ring_evals: int) -> None:
        self.cum_w = [0.0] * NK
        self.cum_wx = [0.0] * NK
        self.hist = History(ring_evals)
        self.seen = False
        self.cpu_count: int | None = None

    def ingest(self, host: HostSample | None, tree: ProcTreeSample | None, weight: float) -> None:
        if host is None and tree is None:
            return
        vals: list[float | None] = [None] * NK
        if tree is not None and tree.processes:
            main, wmean, wn, read = _tree_readings(tree)
            vals[0], vals[1], vals[2], vals[5] = main, wmean, wn, read
        if host is not None:
            vals[3] = host.cpu_pct
            vals[4] = host.iowait_pct
            if host.cpu_pct_per_core:
                vals[6] = max(host.cpu_pct_per_core)
                self.cpu_count = len(host.cpu_pct_per_core)
            if vals[5] is None and host.disk_read_bytes_per_s is not None:
                vals[5] = host.disk_read_bytes_per_s
        self.seen = True
        cw, cx = self.cum_w, self.cum_wx
        for k in range(NK):
            v = vals[k]
            if v is not None:
                cw[k] += weight
                cx[k] += weight * v

    def record(self, t: float) -> None:
        if self.seen:
            self.hist.push((t, *self.cum_w, *self.cum_wx))

    def window(self, t: float, span_s: float) -> HostWindow:
        """Gap-weighted means over the window; a quantity never read is absent (not 0)."""
        if not self.seen:
            return {}
        old = self.hist.at_or_before(t - span_s)
        out: HostWindow = {}
        for k in range(NK):
            w = self.cum_w[k] - (old[1 + k] if old is not None else 0.0)
            if w > 1e-9:
                x = self.cum_wx[k] - (old[1 + NK + k] if old is not None else 0.0)
                out[KEYS[k]] = x / w
        return out


def host_cause(h: HostWindow, cfg: DetectorConfig) -> Cause:
    """Why a starved GPU waits, from host readings averaged over its gaps.

    Storage when iowait or reads are high and the CPUs are not saturated; the CPU when the
    workers (or all cores) are saturated; the GIL when the main process is pinned at one
    core while the workers (if any) idle; unknown otherwise, or without host data.
    """
    if not h:
        return Cause.UNKNOWN
    wmean = h.get("workers_cpu_pct")
    nworkers = h.get("workers", 0.0)
    host_cpu = h.get("host_cpu_pct")
    main = h.get("main_cpu_pct")
    iowait = h.get("iowait_pct")
    read = h.get("read_bytes_per_s")
    cpu_sat = (wmean is not None and nworkers >= 0.5 and wmean >= cfg.cpu_worker_saturated_pct) or (
        host_cpu is not None and host_cpu >= cfg.cpu_host_saturated_pct
    )
    io = (iowait is not None and iowait >= cfg.io_iowait_pct) or (
        read is not None and read >= cfg.io_read_bytes_per_s
    )
    if io and not cpu_sat:
        return Cause.IO
    if cpu_sat:
        return Cause.CPU
    if (
        main is not None
        and main >= cfg.gil_main_pct
        and (wmean is None or nworkers < 0.5 or wmean < cfg.gil_rest_max_pct)
    ):
        return Cause.GIL
    return Cause.UNKNOWN
