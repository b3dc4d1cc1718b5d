"""Replay a recorded trace through the live pipeline (``gpumon demo``, tests).

``gpumon.engine.Session.replay`` plays a trace against the wall clock with this: each
tick takes every recorded tick that fell due, one by one (the session judges each as it
was recorded) and merged (what a face shows).  Nothing here imports ``pynvml`` or needs a
GPU.

Time.  The trace plays in real time scaled by ``speed``: after ``w`` wall seconds the
replay has reached trace time ``t0 + w * speed``.  Sample times are re-based onto the live
monotonic clock *without* scaling (``t_live = live0 + (t - t0)``), so the detector sees
the recorded run's own durations -- bursts, gaps, confirmation delays and time-in-state are
the recording's, not shrunk by the speed-up -- while the stream starts "now".  The stream
therefore runs ``speed`` times faster than ``time.monotonic()``; ``Replay.now()`` is the
stream's current time for a face that needs a "now" consistent with the samples.

Ticks.  Like the real NVML sampler (which returns every driver buffer point since the
previous call), each ``advance()`` returns everything recorded since the previous call:
the utilisation points of every trace tick that fell due, the newest scalar readings,
and host/process rates averaged over those ticks.  So a face may tick at any interval and
no recorded point is lost.  When the trace is exhausted the watched tree's root reads as
exited, which is how a live face learns that the run is over.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from gpumon.model import (
    GpuIdentity,
    GpuSample,
    HostSample,
    ProcessSample,
    ProcTreeSample,
    Snapshot,
    TraceHeader,
)

# The pid shown for the watched process when the trace recorded none.
DEFAULT_PID = 1


# --- shifting and merging samples ---------------------------------------------------------


def shift_gpu(g: GpuSample, dt: float) -> GpuSample:
    """A GPU sample moved by ``dt`` seconds, its driver points included."""
    points = tuple((t + dt, u) for t, u in g.util_samples)
    return replace(g, t_s=g.t_s + dt, util_samples=points)


def _mean(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got else None


def merge_gpu(samples: list[GpuSample], t_s: float) -> GpuSample:
    """Several ticks of one GPU as one: every driver point, the newest scalar readings."""
    last = samples[-1]
    points = tuple(p for s in samples for p in s.util_samples)
    return replace(last, t_s=t_s, util_samples=points, lost=any(s.lost for s in samples))


def merge_host(samples: list[HostSample], t_s: float) -> HostSample:
    """Rates and percentages averaged over the ticks (as a longer psutil delta would be)."""
    last = samples[-1]
    if len(samples) == 1:
        return replace(last, t_s=t_s)
    cores = [s.cpu_pct_per_core for s in samples if s.cpu_pct_per_core]
    per_core: tuple[float, ...] = ()
    if cores and all(len(c) == len(cores[0]) for c in cores):
        per_core = tuple(sum(col) / len(cores) for col in zip(*cores, strict=True))
    return replace(
        last,
        t_s=t_s,
        cpu_pct_per_core=per_core,
        cpu_pct=_mean(s.cpu_pct for s in samples),
        iowait_pct=_mean(s.iowait_pct for s in samples),
        disk_read_bytes_per_s=_mean(s.disk_read_bytes_per_s for s in samples),
        disk_write_bytes_per_s=_mean(s.disk_write_bytes_per_s for s in samples),
    )


def merge_tree(samples: list[ProcTreeSample], t_s: float, alive: bool) -> ProcTreeSample:
    """The newest tree, each process's rates averaged over the ticks it was seen in."""
    last = samples[-1]
    seen: dict[int, list[ProcessSample]] = {}
    for s in samples:
        for p in s.processes:
            seen.setdefault(p.pid, []).append(p)
    procs = []
    for p in last.processes:
        hist = seen[p.pid]
        if len(hist) > 1:
            p = replace(
                p,
                cpu_pct=_mean(h.cpu_pct for h in hist),
                read_bytes_per_s=_mean(h.read_bytes_per_s for h in hist),
                write_bytes_per_s=_mean(h.write_bytes_per_s for h in hist),
            )
        procs.append(p)
    return ProcTreeSample(
        t_s=t_s,
        root_pid=last.root_pid,
        processes=tuple(procs),
        root_alive=alive and last.root_alive,
    )


# --- the replay ---------------------------------------------------------------------------


class Replay:
    """Plays snapshots against the wall clock: ``advance()`` hands out what fell due."""

    def __init__(
        self,
        snapshots: Iterable[Snapshot],
        *,
        header: TraceHeader | None = None,
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        live_start_s: float | None = None,
    ) -> None:
        if not speed > 0:
            raise ValueError("speed must be greater than 0")
        self.speed = speed
        self.header = header
        self._clock = clock
        self._it = iter(snapshots)
        self._pending: Snapshot | None = next(self._it, None)
        if self._pending is None:
            raise ValueError("the trace holds no samples")
        self.trace_start_s = self._pending.t_s
        self.live_start_s = clock() if live_start_s is None else live_start_s
        self.offset_s = self.live_start_s - self.trace_start_s  # trace time -> stream time
        self._lock = threading.Lock()
        self.frame = 0
        self.current = Snapshot(t_s=self.live_start_s)
        self.finished = False
        self.ticks_replayed = 0
        self._last_gpus: dict[str, GpuSample] = {}
        self._last_host: HostSample | None = None
        self._last_tree: ProcTreeSample | None = None
        first = self._pending
        self.gpu_identities = _identities(header, first)
        self.root_pid = _root_pid(header, first)

    # --- time ---------------------------------------------------------------------------

    def now(self) -> float:
        """The stream's current time: where the replay has reached, on the samples' clock."""
        return self.live_start_s + (self._clock() - self.live_start_s) * self.speed

    def trace_time(self) -> float:
        """How far into the trace the replay clock is, in trace seconds."""
        return self.now() - self.live_start_s

    @property
    def played_s(self) -> float:
        """Trace seconds handed out so far (up to the last tick a sampler was given)."""
        return max(0.0, self.current.t_s - self.live_start_s)

    def _due(self, snap: Snapshot) -> float:
        return snap.t_s + self.offset_s

    # --- advancing ----------------------------------------------------------------------

    def advance(self) -> Snapshot:
        """Consume every trace tick due by now and merge them into one re-based snapshot."""
        return self.advance_each()[1]

    def advance_each(self) -> tuple[list[Snapshot], Snapshot]:
        """Every trace tick due by now, re-based, one by one (to judge each as it was
        recorded, whatever the interval a face ticks at) and merged (to show)."""
        with self._lock:
            now = self.now()
            # The run "exits" on the tick after its last recorded one, as a live one would.
            self.finished = self._pending is None
            due: list[Snapshot] = []
            while self._pending is not None and self._due(self._pending) <= now:
                due.append(self._shift(self._pending))
                self._pending = next(self._it, None)
            self.ticks_replayed += len(due)
            self.current = self._merge(due, now)
            self.frame += 1
            return due, self.current

    def _shift(self, snap: Snapshot) -> Snapshot:
        dt = self.offset_s
        return Snapshot(
            t_s=snap.t_s + dt,
            gpus=tuple(shift_gpu(g, dt) for g in snap.gpus),
            host=None if snap.host is None else replace(snap.host, t_s=snap.host.t_s + dt),
            tree=None if snap.tree is None else replace(snap.tree, t_s=snap.tree.t_s + dt),
        )

    def _merge(self, due: list[Snapshot], now: float) -> Snapshot:
        t_s = due[-1].t_s if due else max(now, self.current.t_s)
        by_gpu: dict[str, list[GpuSample]] = {}
        for snap in due:
            for g in snap.gpus:
                by_gpu.setdefault(g.uuid, []).append(g)
        gpus = []
        for uuid, last in self._last_gpus.items():
            if uuid not in by_gpu:  # nothing new recorded: current readings, empty buffer
                gone = () if self.finished and last.processes is not None else last.processes
                gpus.append(replace(last, t_s=t_s, util_samples=(), processes=gone))
        for uuid, samples in by_gpu.items():
            merged = merge_gpu(samples, t_s)
            self._last_gpus[uuid] = merged
            gpus.append(merged)
        gpus.sort(key=lambda g: g.gpu)
        hosts = [s.host for s in due if s.host is not None]
        if hosts:
            self._last_host = merge_host(hosts, t_s)
        host = None if self._last_host is None else replace(self._last_host, t_s=t_s)
        self._last_host = host
        trees = [s.tree for s in due if s.tree is not None]
        if trees:
            self._last_tree = merge_tree(trees, t_s, alive=not self.finished)
        tree = self._last_tree
        if tree is not None:
            tree = replace(tree, t_s=t_s, root_alive=tree.root_alive and not self.finished)
        else:  # a trace recorded without a tree: its root still 'exits' when it ends
            tree = ProcTreeSample(t_s=t_s, root_pid=self.root_pid, root_alive=not self.finished)
        return Snapshot(t_s=t_s, gpus=tuple(gpus), host=host, tree=tree)


def _identities(header: TraceHeader | None, first: Snapshot) -> tuple[GpuIdentity, ...]:
    if header is not None and header.gpus:
        return header.gpus
    return tuple(
        GpuIdentity(
            index=g.gpu,
            uuid=g.uuid,
            mem_total_bytes=g.mem_total_bytes,
            power_limit_watts=g.power_limit_watts,
        )
        for g in first.gpus
    )


def _root_pid(header: TraceHeader | None, first: Snapshot) -> int:
    if header is not None and header.watched_pid is not None:
        return header.watched_pid
    if first.tree is not None:
        return first.tree.root_pid
    # No tree recorded: the first process seen on a GPU stands for the run.
    pids = sorted(p.pid for g in first.gpus for p in g.processes or ())
    return pids[0] if pids else DEFAULT_PID
