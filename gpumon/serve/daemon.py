"""The daemon's state: ticks in, detector + job attribution + histograms + log lines out.

One ``ServeState`` lives for the daemon's lifetime.  The sampling loop calls ``step()``
(NVML and /proc reads outside the lock, then ``ingest()`` under it); the Prometheus
collector reads under the same lock, so every scrape sees one tick's consistent state.

Everything here is bounded: the detectors keep rings, histograms are fixed bucket arrays,
the job table is capped (``max_jobs``) and forgets a job ``job_linger_s`` after its last
GPU process left, the pid cache forgets pids that left the GPUs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpumon import __version__
from gpumon.detect import Detector, DetectorConfig, DetectorUpdate
from gpumon.errors import GpumonError
from gpumon.model import (
    Episode,
    GpuIdentity,
    GpuSample,
    HostSample,
    ProcTreeSample,
    Snapshot,
)
from gpumon.monitor import Monitor, Tick
from gpumon.sample.host import ProcessTreeSampler
from gpumon.serve.config import ServeConfig
from gpumon.serve.joblabels import JobLabels, JobResolver
from gpumon.serve.logfile import EventLog

# Gaps: a DataLoader hiccup is 50-500 ms, a starved step 0.2-2 s, a checkpoint or an
# evaluation tens of seconds to minutes.  Bursts: one step's kernels, 50 ms to seconds.
# Few buckets on purpose: every bucket is a series per GPU, and formatting series is most
# of a scrape's cost.
GAP_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0)
BURST_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0)

JobKey = tuple[str, str, str]


class Histogram:
    """A fixed-bucket Prometheus histogram kept as plain counts (no list grows)."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # last: above the largest bound
        self.sum = 0.0
        self.count = 0

    def observe(self, x: float) -> None:
        if not x >= 0.0:  # NaN or negative: not a duration
            return
        for i, b in enumerate(self.bounds):
            if x <= b:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.sum += x
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """[(le, cumulative count)] ending with +Inf, as exposition wants."""
        out = []
        acc = 0
        for b, c in zip(self.bounds, self.counts, strict=False):
            acc += c
            out.append((_fmt_bound(b), acc))
        out.append(("+Inf", acc + self.counts[-1]))
        return out


def _fmt_bound(b: float) -> str:
    return repr(float(b))


@dataclass(slots=True)
class GpuRuntime:
    """What the daemon keeps per GPU between ticks (the detector keeps the rest)."""

    identity: GpuIdentity
    sample: GpuSample | None = None
    gaps: Histogram = field(default_factory=lambda: Histogram(GAP_BUCKETS_S))
    bursts: Histogram = field(default_factory=lambda: Histogram(BURST_BUCKETS_S))
    jobs: tuple[JobLabels, ...] = ()
    processes: int | None = None
    pids: frozenset[int] = frozenset()


@dataclass(slots=True)
class JobRuntime:
    """A job seen on this node: its labels, GPUs and (when it has a subset) a detector.

    ``detector is None`` means the job holds every GPU of the node: its state is the
    node's, and a second detector over the same data would only double the cost.
    """

    labels: JobLabels
    gpus: frozenset[int]
    last_seen_s: float
    detector: Detector | None = None
    episode: Episode | None = None  # the job's open run-level episode (own detector)
    tree_root: int | None = None
    tree: ProcessTreeSampler | None = None
    tree_sample: ProcTreeSample | None = None


class ServeState:
    """Everything `gpumon serve` knows; mutated by the sampling thread under ``lock``."""

    def __init__(
        self,
        monitor: Monitor,
        cfg: ServeConfig,
        log: EventLog,
        *,
        resolver: JobResolver | None = None,
        detector_config: DetectorConfig | None = None,
        gpus: Sequence[GpuIdentity] | None = None,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.monitor = monitor
        self.cfg = cfg
        self.log = log
        self.resolver = resolver if resolver is not None else JobResolver(cfg.job_sources)
        self.detector_config = detector_config or DetectorConfig()
        idents = tuple(gpus if gpus is not None else
                       (monitor.nvml.gpus if monitor.nvml is not None else ()))
        self.identities = idents
        self.detector = Detector(self.detector_config, idents)
        self.gpus: dict[int, GpuRuntime] = {g.index: GpuRuntime(g) for g in idents}
        self.jobs: dict[JobKey, JobRuntime] = {}
        # The open episode per GPU (and None: the node), kept from the detector's updates:
        # a scrape reads states from here instead of recomputing a full verdict.
        self.episodes: dict[int | None, Episode] = {}
        self.host: HostSample | None = None
        self.lock = threading.Lock()
        self._wall = wall
        self._mono = mono
        self.started_wall_s = wall()
        self._wall_minus_mono = self.started_wall_s - mono()
        self.driver_version = None if monitor.nvml is None else monitor.nvml.driver_version
        self.version = __version__
        self.ticks_total = 0
        self.tick_errors_total = 0
        self.jobs_dropped_total = 0  # jobs not tracked because max_jobs was reached
        self.last_sample_wall_s: float | None = None
        self.last_sample_duration_s: float | None = None
        self.nvml_errors: dict[str, int] = {}
        self.scrape_errors_total = 0
        self._last_summary_mono = mono()
        self._all_pids: frozenset[int] = frozenset()
        self._tick_error_kinds: set[str] = set()
        self._expired: list[JobKey] = []

    # --- time ------------------------------------------------------------------------------

    def wall_of(self, t_mono: float | None) -> float | None:
        return None if t_mono is None else t_mono + self._wall_minus_mono

    # --- the loop's body -------------------------------------------------------------------

    def step(self) -> None:
        """One tick: sample (no lock), then fold it in (lock).  Never raises."""
        try:
            tick = self.monitor.tick()
        except Exception as exc:  # a bug or an unforeseen driver/proc fault: skip the tick
            self._tick_failed("sampling", exc)
            return
        try:
            with self.lock:
                self.ingest(tick)
        except Exception as exc:
            self._tick_failed("processing", exc)

    def _tick_failed(self, where: str, exc: BaseException) -> None:
        self.tick_errors_total += 1
        kind = f"{where}:{type(exc).__name__}"
        if kind not in self._tick_error_kinds and len(self._tick_error_kinds) < 32:
            self._tick_error_kinds.add(kind)
            import sys

            print(f"gpumon: a tick failed while {where} ({type(exc).__name__}: {exc}); "
                  "skipped, sampling goes on (counted in gpumon_sample_errors_total).",
                  file=sys.stderr, flush=True)

    def ingest(self, tick: Tick) -> DetectorUpdate:
        """Fold one tick in; the caller holds ``lock``."""
        snap = tick.snapshot
        self.host = snap.host
        for g in snap.gpus:
            rt = self.gpus.get(g.gpu)
            if rt is None:  # a GPU not seen at discovery (should not happen; stay robust)
                rt = self.gpus[g.gpu] = GpuRuntime(GpuIdentity(index=g.gpu, uuid=g.uuid))
            rt.sample = g
        job_pids = self._attribute(snap)
        self._update_job_table(snap, job_pids)
        if tick.update is not None:
            update = tick.update
        else:
            # One job holding every GPU: its process tree (DataLoader workers) is the node's,
            # so the node's detector can name the cause (saturated workers, GIL, iowait).
            whole = [j for j in self.jobs.values() if j.detector is None and j.tree_sample]
            tree = whole[0].tree_sample if len(whole) == 1 else None
            update = self.detector.update(snap if tree is None else replace(snap, tree=tree))
        _track(self.episodes, update)
        for gpu, seconds in update.gaps:
            if gpu in self.gpus:
                self.gpus[gpu].gaps.observe(seconds)
        for gpu, seconds in update.bursts:
            if gpu in self.gpus:
                self.gpus[gpu].bursts.observe(seconds)
        job_updates = self._update_job_detectors(snap)
        self._log_update(update, None)
        for labels, upd in job_updates:
            self._log_update(upd, labels)
        self.ticks_total += 1
        self.last_sample_wall_s = self.wall_of(snap.t_s)
        self.last_sample_duration_s = tick.sample_duration_s
        if self.monitor.nvml is not None:
            self.nvml_errors = dict(self.monitor.nvml.errors)
        now = self._mono()
        if now - self._last_summary_mono >= self.cfg.summary_interval_s:
            self._last_summary_mono = now
            self.log.write(self.summary("summary"))
        return update

    # --- jobs --------------------------------------------------------------------------------

    def _attribute(self, snap: Snapshot) -> dict[JobKey, set[int]]:
        """Processes -> job labels per GPU; /proc is read only for pids not seen before.

        Returns each job's GPU pids (for its process tree).
        """
        all_pids: set[int] = set()
        for g in snap.gpus:
            rt = self.gpus[g.gpu]
            if g.lost:
                rt.jobs, rt.processes, rt.pids = (), None, frozenset()
                continue
            if g.processes is None:
                all_pids.update(rt.pids)  # unreadable this tick: keep the last known
                continue
            pids = frozenset(p.pid for p in g.processes)
            all_pids.update(pids)
            rt.processes = len(pids)
            if pids != rt.pids:
                rt.pids = pids
                labels = {self.resolver.labels(pid) for pid in sorted(pids)}
                rt.jobs = tuple(sorted((lb for lb in labels if lb.known),
                                       key=lambda lb: (lb.hpc_job, lb.namespace, lb.pod,
                                                       lb.container)))
        frozen = frozenset(all_pids)
        if frozen != self._all_pids:
            self._all_pids = frozen
            self.resolver.retain(frozen)
        job_pids: dict[JobKey, set[int]] = {}
        for pid in frozen:
            lb = self.resolver.labels(pid)  # cached: no /proc read
            if lb.known:
                job_pids.setdefault(lb.job_key(), set()).add(pid)
        return job_pids

    def _update_job_table(self, snap: Snapshot, job_pids: dict[JobKey, set[int]]) -> None:
        """Jobs seen now: create, refresh (GPUs, process tree), expire, all bounded."""
        if self.cfg.max_jobs == 0:
            return
        t = snap.t_s
        by_job: dict[JobKey, tuple[JobLabels, set[int]]] = {}
        for g in snap.gpus:
            for lb in self.gpus[g.gpu].jobs:
                key = lb.job_key()
                entry = by_job.setdefault(key, (JobLabels(lb.hpc_job, lb.pod, lb.namespace),
                                                set()))
                entry[1].add(g.gpu)
        all_gpus = frozenset(g.gpu for g in snap.gpus if not g.lost)
        for key, (labels, gpus) in by_job.items():
            job = self.jobs.get(key)
            frozen = frozenset(gpus)
            if job is None:
                if len(self.jobs) >= self.cfg.max_jobs:
                    self.jobs_dropped_total += 1
                    continue
                job = self.jobs[key] = JobRuntime(labels, frozen, t)
                if frozen != all_gpus:
                    job.detector = self._job_detector(frozen)
            else:
                job.last_seen_s = t
                if frozen != job.gpus:
                    job.gpus = frozen
                    if job.detector is None and frozen != all_gpus:
                        job.detector = self._job_detector(frozen)
            job.tree_sample = self._sample_tree(job, job_pids.get(key, set()))
        for job in self.jobs.values():
            if job.last_seen_s != t:
                job.tree_sample = None  # lingering: its processes left the GPUs
        linger = self.cfg.job_linger_s
        self._expired = [k for k, j in self.jobs.items() if t - j.last_seen_s > linger]

    def _sample_tree(self, job: JobRuntime, pids: set[int]) -> ProcTreeSample | None:
        """The job's lowest GPU pid (rank 0, usually) and its descendants (its workers)."""
        if not self.cfg.process_trees or not pids:
            return None
        root = min(pids)
        if root != job.tree_root:
            job.tree_root, job.tree = root, None
            try:
                job.tree = ProcessTreeSampler(root)
            except GpumonError:  # gone or not readable: no tree for this root
                return None
        if job.tree is None:
            return None
        sample = job.tree.sample()
        return sample if sample.root_alive else None

    def _update_job_detectors(self, snap: Snapshot) -> list[tuple[JobLabels, DetectorUpdate]]:
        out: list[tuple[JobLabels, DetectorUpdate]] = []
        t = snap.t_s
        for job in self.jobs.values():
            if job.detector is None or job.last_seen_s != t:
                continue
            sub = Snapshot(t_s=t, gpus=tuple(g for g in snap.gpus if g.gpu in job.gpus),
                           host=snap.host, tree=job.tree_sample)
            upd = _run_level(job.detector.update(sub))
            if upd.opened:
                job.episode = upd.opened[-1]
            out.append((job.labels, upd))
        for key in self._expired:
            job = self.jobs.pop(key)
            if job.detector is not None:
                out.append((job.labels, _run_level(job.detector.finish())))
        self._expired = []
        return out

    def job_episode(self, job: JobRuntime) -> Episode | None:
        """The job's open episode: its own detector's, or the node's for a whole-node job."""
        return job.episode if job.detector is not None else self.episodes.get(None)

    def _job_detector(self, gpus: frozenset[int]) -> Detector:
        idents = [rt.identity for i, rt in self.gpus.items() if i in gpus]
        return Detector(self.detector_config, idents)

    # --- the log -------------------------------------------------------------------------------

    def _log_update(self, update: DetectorUpdate, job: JobLabels | None) -> None:
        if self.log.path is None:
            return
        for ep in update.closed:
            self.log.write(self._episode_record("episode_end", ep, job))
        for ep in update.opened:
            self.log.write(self._episode_record("episode_start", ep, job))

    def _episode_record(self, event: str, ep: Episode, job: JobLabels | None) -> dict[str, Any]:
        if job is not None:
            jobs = [job.as_dict()]
        elif ep.gpu is not None and ep.gpu in self.gpus:
            jobs = [lb.as_dict() for lb in self.gpus[ep.gpu].jobs]
        else:
            jobs = []
        at = ep.end_s if event == "episode_end" else ep.start_s
        return {
            "time": self.wall_of(at),
            "event": event,
            "scope": "job" if job is not None else ("gpu" if ep.gpu is not None else "node"),
            "gpu": ep.gpu,
            "uuid": ep.uuid,
            "job": _job_name(jobs[0]) if len(jobs) == 1 else None,
            "jobs": jobs,
            "state": str(ep.state),
            "cause": None if ep.cause is None else str(ep.cause),
            "start": self.wall_of(ep.start_s),
            "end": self.wall_of(ep.end_s),
            "duration_s": None if ep.duration_s is None else round(ep.duration_s, 3),
            "evidence": dict(ep.evidence),
            "advice": list(ep.advice),
            "note": ep.note,
        }

    def summary(self, event: str = "summary") -> dict[str, Any]:
        """A periodic (and final) line: each GPU's state and time per state, jobs, health."""
        verdict = self.detector.verdict()
        seconds = self.detector.seconds_in_state()
        gpus = []
        for v in verdict.gpus:
            rt = self.gpus.get(v.gpu)
            gpus.append({
                "gpu": v.gpu,
                "uuid": v.uuid,
                "state": str(v.state),
                "cause": None if v.cause is None else str(v.cause),
                "seconds": {str(k): round(s, 1) for k, s in seconds.get(v.gpu, {}).items()},
                "jobs": [] if rt is None else [lb.as_dict() for lb in rt.jobs],
                "lost": bool(rt and rt.sample and rt.sample.lost),
            })
        return {
            "time": self._wall(),
            "event": event,
            "version": self.version,
            "node_state": str(verdict.state),
            "node_cause": None if verdict.cause is None else str(verdict.cause),
            "gpus": gpus,
            "jobs": [dict(j.labels.as_dict(), gpus=sorted(j.gpus)) for j in self.jobs.values()],
            "lost_gpu_seconds": round(self.detector.lost_gpu_seconds(), 1),
            "ticks": self.ticks_total,
            "nvml_errors": dict(self.nvml_errors),
            "log_write_errors": self.log.errors_total,
        }

    def finish(self, reason: str) -> None:
        """Close every open episode and write the final line (SIGTERM, end of run)."""
        with self.lock:
            record = self.summary("stop")  # the states as they were, before closing them
            self._log_update(_only_closed(self.detector.finish()), None)
            for job in self.jobs.values():
                if job.detector is not None:
                    self._log_update(_run_level(job.detector.finish()), job.labels)
            record["reason"] = reason
            self.log.write(record)


def _run_level(update: DetectorUpdate) -> DetectorUpdate:
    """A job detector's per-GPU episodes repeat the node detector's: keep the job's own."""
    return DetectorUpdate(
        tuple(e for e in update.opened if e.gpu is None),
        tuple(e for e in update.closed if e.gpu is None),
    )


def _job_name(labels: dict[str, str]) -> str:
    """One string for a job: the Slurm id, else namespace/pod."""
    if labels["hpc_job"]:
        return labels["hpc_job"]
    return f"{labels['namespace']}/{labels['pod']}" if labels["namespace"] else labels["pod"]


def _track(open_episodes: dict[int | None, Episode], update: DetectorUpdate) -> None:
    for ep in update.closed:
        if open_episodes.get(ep.gpu) is not None and open_episodes[ep.gpu].start_s == ep.start_s:
            del open_episodes[ep.gpu]
    for ep in update.opened:
        open_episodes[ep.gpu] = ep


def _only_closed(update: DetectorUpdate) -> DetectorUpdate:
    return DetectorUpdate((), update.closed)

