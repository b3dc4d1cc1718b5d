"""Host and process-tree readings, averaged over the GPUs' gaps, to name a starvation cause.

Each tick's readings are weighted by how much of that tick the GPUs spent waiting, so a
window's mean is "CPU during the gaps" (what starves the GPU), not CPU during compute.

Where the job's process tree is read, a cause comes from the job's own processes: a host
saturated by processes outside the job is contention, never "raise num_workers" for a
job whose workers idle.  Causes have hysteresis as states do: a cause holds until its
sign falls well below the line that named it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

from gpumon.detect.config import DetectorConfig
from gpumon.detect.rings import History
from gpumon.model import Cause, HostSample, ProcessSample, ProcTreeSample

# Quantities tracked, in evidence-key names: the rows of gpumon.evidence_fields marked
# host_window (a test holds the two to each other).
HostKey = Literal[
    "main_cpu_pct",
    "workers_cpu_pct",
    "workers",
    "host_cpu_pct",
    "iowait_pct",
    "read_bytes_per_s",
    "max_core_pct",
    "tree_cpu_pct",
    "tree_runnable",
]
HostWindow = dict[HostKey, float]  # gap-weighted means over a window; never read: absent
KEYS: tuple[HostKey, ...] = get_args(HostKey)
NK = len(KEYS)


def _tree_readings(
    tree: ProcTreeSample,
) -> tuple[
    float | None,
    float | None,
    float | None,
    float | None,
    float | None,
    float | None,
    float | None,
]:
    """(main CPU, mean CPU per worker, worker count, tree read bytes/s, the whole tree's
    CPU, its processes running or runnable, tree write bytes/s) of one tree sample; CPU in
    % of one core."""
    main = None
    wsum = 0.0
    wn = 0
    read = None
    written = None
    total = None
    runnable = None
    root = tree.root_pid
    for p in tree.processes:  # (every tick, every process of the job: each field read once)
        status, bytes_read, cpu = p.status, p.read_bytes_per_s, p.cpu_pct
        if status is not None:
            runnable = (runnable or 0.0) + (status == "running")
        if bytes_read is not None:
            read = (read or 0.0) + bytes_read
        if p.write_bytes_per_s is not None:
            written = (written or 0.0) + p.write_bytes_per_s
        if cpu is not None:
            total = (total or 0.0) + cpu
        if p.pid == root:
            main = cpu
        elif cpu is not None:
            wsum += cpu
            wn += 1
    workers_mean = wsum / wn if wn else None
    return main, workers_mean, float(wn), read, total, runnable, written


class HostTrack:
    """Running gap-weighted sums of host/tree readings, with a bounded history for windows.

    Bytes written are summed beside them (not evidence of a cause: what tells a checkpoint
    from the input pipeline in the GPUs' pauses)."""

    def __init__(self, ring_evals: int) -> None:
        self.cum_w = [0.0] * NK
        self.cum_wx = [0.0] * NK
        self.cum_write_w = 0.0
        self.cum_write_wx = 0.0
        self.cum_wait_s = 0.0  # seconds the GPUs spent waiting, over every host reading
        self.readings = 0  # ticks with host or tree readings
        self._last_t: float | None = None
        self.hist = History(ring_evals)
        self.seen = False
        self.cpu_count: int | None = None
        # The busiest process outside the job when last looked for: (time, its sample).
        self.outside: tuple[float, ProcessSample] | None = None

    def ingest(
        self, host: HostSample | None, tree: ProcTreeSample | None, weight: float, t: float
    ) -> None:
        """One tick's readings, ``weight`` the share of the tick the GPUs waited."""
        if host is None and tree is None:
            return
        if self._last_t is not None and t > self._last_t:
            self.cum_wait_s += weight * min(t - self._last_t, 10.0)  # a hole: one tick
        self._last_t = t
        self.readings += 1
        vals: list[float | None] = [None] * NK
        written = None
        if tree is not None and tree.processes:
            main, wmean, wn, read, total, runnable, written = _tree_readings(tree)
            vals[0], vals[1], vals[2], vals[5], vals[7] = main, wmean, wn, read, total
            vals[8] = runnable
        if host is not None:
            if host.busiest_outside:
                self.outside = (host.t_s, host.busiest_outside[0])
            vals[3] = host.cpu_pct
            vals[4] = host.iowait_pct
            if host.cpu_pct_per_core:
                vals[6] = max(host.cpu_pct_per_core)
                self.cpu_count = len(host.cpu_pct_per_core)
            if vals[5] is None and host.disk_read_bytes_per_s is not None:
                vals[5] = host.disk_read_bytes_per_s
            if written is None:
                written = host.disk_write_bytes_per_s
        if written is not None:
            self.cum_write_w += weight
            self.cum_write_wx += weight * written
        self.seen = True
        cw, cx = self.cum_w, self.cum_wx
        for k in range(NK):
            v = vals[k]
            if v is not None:
                cw[k] += weight
                cx[k] += weight * v

    def record(self, t: float) -> None:
        if self.seen:
            self.hist.push(
                (
                    t,
                    *self.cum_w,
                    *self.cum_wx,
                    self.cum_write_w,
                    self.cum_write_wx,
                    self.readings,
                    self.cum_wait_s,
                )
            )

    def over(self, spans: Iterable[tuple[float, float]]) -> tuple[HostWindow, float | None]:
        """Gap-weighted means over the union of ``spans`` (from the eval history; a span
        it no longer reaches is left out), and the bytes written per second over them
        (None where never read): what the host did in those stretches alone."""
        n = 2 * NK + 2  # after the time: weights, weighted sums, then the same for writes
        acc = [0.0] * n
        for a, b in spans:
            ra, rb = self.hist.at_or_before(a), self.hist.at_or_before(b)
            if ra is None or rb is None or rb[0] <= ra[0]:
                continue
            acc = [s + y - x for s, x, y in zip(acc, ra[1 : 1 + n], rb[1 : 1 + n], strict=True)]
        out: HostWindow = {KEYS[k]: acc[NK + k] / acc[k] for k in range(NK) if acc[k] > 1e-9}
        written = acc[n - 1] / acc[n - 2] if acc[n - 2] > 1e-9 else None
        return out, written

    def recent_waits_span(
        self, t: float, wait_s: float, min_readings: int, min_s: float, max_s: float
    ) -> float:
        """How far back from ``t`` the GPUs' last ``wait_s`` seconds of waiting reach, over
        ``min_readings`` host readings at least (at least ``min_s``, at most ``max_s``): a
        cause is read over the latest waits, however long ago the last gap was, no further
        back than they need, and not on a reading or two of noise."""
        if not self.seen:
            return max_s
        now, count = self.cum_wait_s, self.readings
        span = min_s
        while True:
            old = self.hist.at_or_before(t - span)
            if old is None or old[0] > t - span:
                return span  # the history reaches no further back
            if span >= max_s or (count - old[-2] >= min_readings and now - old[-1] >= wait_s):
                return span  # enough waiting over enough readings, or the GPU's window
            span = min(max_s, span * 1.5)

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


def host_cause(
    h: HostWindow,
    cfg: DetectorConfig,
    current: Cause | None = None,
    cpu_count: int | None = None,
) -> Cause:
    """Why a starved GPU waits, from host readings averaged over its gaps.

    Storage when iowait or reads are high and the CPUs are not saturated; the CPU when the
    job's workers are saturated, or the host is and the job uses most of it; the GIL when
    the job's main process is pinned at one core while its workers (if any) idle;
    contention when the host is saturated by processes outside the job and the job asks
    for the CPU (its processes use some, or are runnable: one asleep waits on something
    else); unknown
    otherwise, or without host data.  Without the job's process tree (a log with host
    CPU only), a saturated host is taken as the job's.  ``current``: the cause named so
    far, which holds until its sign falls ``cause_release`` below its line.
    """
    if not h:
        return Cause.UNKNOWN

    def line(cause: Cause, threshold: float) -> float:
        return threshold * (cfg.cause_release if cause is current else 1.0)

    wmean = h.get("workers_cpu_pct")
    nworkers = h.get("workers", 0.0)
    host_cpu = h.get("host_cpu_pct")
    main = h.get("main_cpu_pct")
    iowait = h.get("iowait_pct")
    read = h.get("read_bytes_per_s")
    workers_sat = (
        wmean is not None
        and nworkers >= 0.5
        and wmean >= line(Cause.CPU, cfg.cpu_worker_saturated_pct)
    )
    busy_host = host_cpu is not None and host_cpu >= line(Cause.CPU, cfg.cpu_host_saturated_pct)
    outsiders = False
    share = job_share(h, cpu_count)
    if busy_host and not workers_sat and share is not None:
        outsiders = share < 0.5  # the job uses less than half of what keeps the host busy
    cpu_sat = workers_sat or (busy_host and not outsiders)
    io = (iowait is not None and iowait >= line(Cause.IO, cfg.io_iowait_pct)) or (
        read is not None and read >= line(Cause.IO, cfg.io_read_bytes_per_s)
    )
    if io and not cpu_sat:
        return Cause.IO
    if cpu_sat:
        return Cause.CPU
    if (
        main is not None
        and main >= line(Cause.GIL, cfg.gil_main_pct)
        and (wmean is None or nworkers < 0.5 or wmean < cfg.gil_rest_max_pct)
    ):
        return Cause.GIL
    contended = host_cpu is not None and host_cpu >= line(
        Cause.CONTENTION, cfg.cpu_host_saturated_pct
    )
    tree_cpu, runnable = h.get("tree_cpu_pct"), h.get("tree_runnable")
    asks = (
        tree_cpu is None
        or tree_cpu >= line(Cause.CONTENTION, cfg.contention_min_tree_pct)
        or (runnable is not None and runnable >= 0.5)  # runnable, and held back
    )
    if contended and share is not None and share < 0.5 and asks:
        return Cause.CONTENTION
    return Cause.UNKNOWN


def busiest_outside(track: HostTrack, t: float, span_s: float) -> str | None:
    """The busiest process outside the job, if one was seen within the window, in words:
    ``stress-ng (pid 4242, 196 %)``."""
    if track.outside is None or track.outside[0] < t - span_s:
        return None
    p = track.outside[1]
    cpu = "" if p.cpu_pct is None else f", {p.cpu_pct:.0f} %"
    return f"{p.name} (pid {p.pid}{cpu})"


def job_share(h: HostWindow, cpu_count: int | None) -> float | None:
    """The job's share (0-1) of the CPU time the host spends busy, where both are read."""
    tree_cpu, host_cpu = h.get("tree_cpu_pct"), h.get("host_cpu_pct")
    if tree_cpu is None or host_cpu is None or not cpu_count or host_cpu <= 0:
        return None
    return min(1.0, tree_cpu / (host_cpu * cpu_count))


def outside_cpu_pct(h: HostWindow, cpu_count: int | None) -> float | None:
    """CPU used by processes outside the job, in % of one core (300 = three cores)."""
    tree_cpu, host_cpu = h.get("tree_cpu_pct"), h.get("host_cpu_pct")
    if tree_cpu is None or host_cpu is None or not cpu_count:
        return None
    return max(0.0, host_cpu * cpu_count - tree_cpu)
