"""The daemon's state: ticks in, detector + job attribution + histograms + log lines out.

One ``ServeState`` lives for the daemon's lifetime.  The sampling loop calls ``step()``:
NVML reads, then the /proc reads (job labels of new pids, each job's process tree) outside
the lock, then the fold into the state under it, then the log lines after it.  The
Prometheus collector reads under the same lock, so every scrape sees one tick's
consistent state and never waits on /proc or the disk.

Everything here is bounded: the detectors keep rings, histograms are fixed bucket arrays,
the job table is capped (``max_jobs``) and forgets a job ``job_linger_s`` after its last
GPU process left, the pid cache forgets pids that left the GPUs, and the untracked jobs
are remembered (to count each once) up to ``MAX_UNTRACKED_REMEMBERED``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpumon import __version__
from gpumon.detect import Detector, DetectorUpdate
from gpumon.errors import GpumonError
from gpumon.faces.serve.config import ServeConfig
from gpumon.faces.serve.log import EventLog
from gpumon.model import (
    Episode,
    GpuIdentity,
    GpuSample,
    HostSample,
    JobLabels,
    ProcTreeSample,
    Snapshot,
    State,
)
from gpumon.session import Session, Tick

# Gaps: a DataLoader hiccup is 50-500 ms, a starved step 0.2-2 s, a checkpoint or an
# evaluation tens of seconds to minutes.  Bursts: one step's kernels, 50 ms to seconds.
# Few buckets on purpose: every bucket is a series per GPU, and formatting series is most
# of a scrape's cost.
GAP_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0)
BURST_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0)

JobKey = tuple[str, str, str]

# Jobs left untracked (max_jobs reached) are remembered so that each is counted once.
MAX_UNTRACKED_REMEMBERED = 4096

# Distinct XID codes counted per GPU under their own label; any further code counts as
# "other" (a flapping driver must not grow the series without bound).
MAX_XID_LABELS = 32


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
    lost_since_s: float | None = None  # when its samples started saying lost
    # XID errors seen since the daemon started, by code (None: the GPU's are not watched).
    xid_counts: dict[str, int] | None = None
    last_xid: int | None = None


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
    tree_sample: ProcTreeSample | None = None


@dataclass(slots=True)
class Prepared:
    """A tick's /proc work, done before the lock: job labels, the job table's plan, trees.

    Only the sampling thread changes the job table and the GPUs' pids, so reading them
    here, outside the lock, sees what the fold that follows will see.
    """

    # Per GPU with a process list this tick: its pids and, where they changed, its jobs.
    fresh: dict[int, tuple[frozenset[int], tuple[JobLabels, ...] | None]]
    # The jobs on the GPUs now, in GPU order: labels and GPUs.
    by_job: dict[JobKey, tuple[JobLabels, frozenset[int]]]
    admitted: frozenset[JobKey]  # jobs in by_job not tracked yet that get a place
    trees: dict[JobKey, ProcTreeSample | None]


class ServeState:
    """Everything `gpumon serve` knows; mutated by the sampling thread under ``lock``."""

    def __init__(
        self,
        session: Session,
        cfg: ServeConfig,
        log: EventLog,
        *,
        resolver: Any | None = None,
        gpus: Sequence[GpuIdentity] | None = None,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
        procfs: str | None = None,
    ) -> None:
        self.session = session
        self.cfg = cfg
        self.log = log
        self.resolver = resolver if resolver is not None else session.job_resolver(cfg.job_sources)
        # Where process trees are read: the resolver's procfs unless told otherwise.
        self.procfs = procfs if procfs is not None else self.resolver.procfs
        idents = tuple(gpus if gpus is not None else session.gpus)
        self.identities = idents
        # The node's detector (the session's, or one for the GPUs given).
        det = session.detector if gpus is None else session.new_detector(idents)
        assert det is not None, "the daemon's session must judge"
        self.detector: Detector = det
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
        self.driver_version = session.driver_version
        self.version = __version__
        self.ticks_total = 0
        self.tick_errors_total = 0
        self.jobs_dropped_total = 0  # jobs not tracked because max_jobs was reached
        self._untracked: OrderedDict[JobKey, None] = OrderedDict()  # counted already
        self.last_sample_wall_s: float | None = None
        self.last_sample_duration_s: float | None = None
        self.nvml_errors: dict[str, int] = {}
        self.scrape_errors_total = 0
        self._last_summary_mono = mono()
        self._all_pids: frozenset[int] = frozenset()
        self._tick_error_kinds: set[str] = set()
        self._expired: list[JobKey] = []
        # Each tracked job's process-tree sampler and its root pid (None: the root could
        # not be read); only the sampling thread touches it.
        self._trees: dict[JobKey, tuple[int, Any | None]] = {}
        # Seconds per state each GPU (None: the node) was reported in, tick by tick: the
        # exported counters only ever grow (the detector's own totals move back when it
        # backdates an episode to its onset, which Prometheus would take for a reset).
        self.reported_seconds: dict[int | None, dict[State, float]] = {}
        self._last_t: float | None = None

    # --- time ------------------------------------------------------------------------------

    def wall_of(self, t_mono: float | None) -> float | None:
        return None if t_mono is None else t_mono + self._wall_minus_mono

    # --- the loop's body -------------------------------------------------------------------

    def step(self) -> None:
        """One tick: sample, read /proc, fold it in (lock), write the log.  Never raises."""
        try:
            tick = self.session.sample()  # judged in _fold, with the jobs' process trees
        except Exception as exc:  # a bug or an unforeseen driver/proc fault: skip the tick
            self._tick_failed("sampling", exc)
            return
        try:
            self.ingest(tick)
        except Exception as exc:
            self._tick_failed("processing", exc)

    def _tick_failed(self, where: str, exc: BaseException) -> None:
        self.tick_errors_total += 1
        kind = f"{where}:{type(exc).__name__}"
        if kind not in self._tick_error_kinds and len(self._tick_error_kinds) < 32:
            self._tick_error_kinds.add(kind)
            import sys

            print(
                f"gpumon: a tick failed while {where} ({type(exc).__name__}: {exc}); "
                "skipped, sampling goes on (counted in gpumon_sample_errors_total).",
                file=sys.stderr,
                flush=True,
            )

    def ingest(self, tick: Tick) -> DetectorUpdate:
        """Fold one tick in: /proc reads first, then the state under ``lock`` (which the
        caller must not hold), then the log lines once the lock is released."""
        prepared = self.prepare(tick.snapshot)
        with self.lock:
            update, records = self._fold(tick, prepared)
        for record in records:
            self.log.write(record)
        return update

    def _fold(self, tick: Tick, prepared: Prepared) -> tuple[DetectorUpdate, list[dict[str, Any]]]:
        """The state's part of a tick (under ``lock``): no /proc read, no log write."""
        snap = tick.snapshot
        self.host = snap.host
        gpu_records = [self._gpu_change(g, snap.t_s) for g in snap.gpus]
        gpu_records += self._count_xids(snap)
        self._attribute(snap, prepared)
        job_updates = self._update_job_table(snap, prepared)
        if tick.update is not None:
            update = tick.update
        else:
            # One job holding every GPU: its process tree (DataLoader workers) is the node's,
            # so the node's detector can name the cause (saturated workers, GIL, iowait).
            whole = [j for j in self.jobs.values() if j.detector is None and j.tree_sample]
            tree = whole[0].tree_sample if len(whole) == 1 else None
            update = self.detector.update(snap if tree is None else replace(snap, tree=tree))
        _track(self.episodes, update)
        self._count_seconds(snap.t_s)
        for gpu, seconds in update.gaps:
            if gpu in self.gpus:
                self.gpus[gpu].gaps.observe(seconds)
        for gpu, seconds in update.bursts:
            if gpu in self.gpus:
                self.gpus[gpu].bursts.observe(seconds)
        job_updates += self._update_job_detectors(snap)
        records = [r for r in gpu_records if r is not None and self.log.path is not None]
        records += self._log_records(update, None)
        for labels, upd in job_updates:
            records += self._log_records(upd, labels)
        self.ticks_total += 1
        self.last_sample_wall_s = self.wall_of(snap.t_s)
        self.last_sample_duration_s = tick.sample_duration_s
        self.nvml_errors = self.session.nvml_errors
        now = self._mono()
        if now - self._last_summary_mono >= self.cfg.summary_interval_s:
            self._last_summary_mono = now
            records.append(self.summary("summary"))
        return update, records

    # --- GPUs lost, back, new -----------------------------------------------------------------

    def _gpu_change(self, g: GpuSample, t: float) -> dict[str, Any] | None:
        """Keep the GPU's sample; the log line of a GPU appearing, lost or back, if any."""
        rt = self.gpus.get(g.gpu)
        event = None
        if rt is None:  # found by the sampler's re-enumeration while the daemon runs
            rt = self.gpus[g.gpu] = GpuRuntime(self._identity_of(g))
            event = "gpu_appeared"
        elif rt.identity.uuid != g.uuid:  # lost at start-up, now known by its UUID
            rt.identity = self._identity_of(g)
        was_lost = rt.sample is not None and rt.sample.lost
        rt.sample = g
        if g.lost and not was_lost:
            rt.lost_since_s = t
            event = "gpu_lost"
        elif was_lost and not g.lost:
            event = "gpu_recovered"
        if event is None:
            return None
        record: dict[str, Any] = {
            "time": self.wall_of(t),
            "event": event,
            "gpu": g.gpu,
            "uuid": rt.identity.uuid,
            "name": rt.identity.name,
        }
        if event == "gpu_recovered" and rt.lost_since_s is not None:
            record["lost_since"] = self.wall_of(rt.lost_since_s)
            record["lost_s"] = round(t - rt.lost_since_s, 3)
            rt.lost_since_s = None
        return record

    def _count_xids(self, snap: Snapshot) -> list[dict[str, Any]]:
        """Count each GPU's XID errors (kept while it is lost: XID 79 is how a GPU goes);
        a log line per error."""
        out: list[dict[str, Any]] = []
        for g in snap.gpus:
            rt = self.gpus[g.gpu]
            counts = rt.xid_counts
            if counts is None:
                if not g.xid_errors and (g.lost or "xid_events" in g.unsupported):
                    continue
                counts = rt.xid_counts = {}
            for code in g.xid_errors:
                label = str(code)
                if label not in counts and len(counts) >= MAX_XID_LABELS:
                    label = "other"
                counts[label] = counts.get(label, 0) + 1
                rt.last_xid = code
                out.append(
                    {
                        "time": self.wall_of(g.t_s),
                        "event": "xid",
                        "gpu": g.gpu,
                        "uuid": rt.identity.uuid,
                        "xid": code,
                    }
                )
        return out

    def _identity_of(self, g: GpuSample) -> GpuIdentity:
        """The sampler's identity of the GPU (name, bus id, ...), else index and UUID."""
        for ident in self.session.gpus:
            if ident.index == g.gpu and ident.uuid == g.uuid:
                return ident
        return GpuIdentity(index=g.gpu, uuid=g.uuid)

    # --- jobs --------------------------------------------------------------------------------

    def prepare(self, snap: Snapshot) -> Prepared:
        """The tick's /proc reads, outside the lock: labels of pids not seen before (the
        resolver caches the rest), then each tracked job's process tree."""
        fresh: dict[int, tuple[frozenset[int], tuple[JobLabels, ...] | None]] = {}
        jobs_now: list[tuple[int, tuple[JobLabels, ...]]] = []  # each GPU's jobs after it
        all_pids: set[int] = set()
        for g in snap.gpus:
            rt = self.gpus.get(g.gpu)
            if g.lost:
                continue
            if g.processes is None:
                if rt is not None:  # unreadable this tick: keep the last known
                    all_pids.update(rt.pids)
                    jobs_now.append((g.gpu, rt.jobs))
                continue
            pids = frozenset(p.pid for p in g.processes)
            all_pids.update(pids)
            if rt is None or pids != rt.pids:
                # The GPU's UUID lets the kubelet's pod-resources socket name the pod.
                labels = {self.resolver.labels(pid, g.uuid) for pid in sorted(pids)}
                jobs = tuple(
                    sorted(
                        (lb for lb in labels if lb.known),
                        key=lambda lb: (lb.hpc_job, lb.namespace, lb.pod, lb.container),
                    )
                )
                fresh[g.gpu] = (pids, jobs)
            else:
                fresh[g.gpu] = (pids, None)
                jobs = rt.jobs
            jobs_now.append((g.gpu, jobs))
        frozen = frozenset(all_pids)
        if frozen != self._all_pids:
            self._all_pids = frozen
            self.resolver.retain(frozen)
        by_job: dict[JobKey, tuple[JobLabels, frozenset[int]]] = {}
        admitted: set[JobKey] = set()
        trees: dict[JobKey, ProcTreeSample | None] = {}
        if self.cfg.max_jobs > 0:
            gpus_of: dict[JobKey, tuple[JobLabels, set[int]]] = {}
            for gpu, jobs in jobs_now:
                for lb in jobs:
                    entry = gpus_of.setdefault(
                        lb.job_key(), (JobLabels(lb.hpc_job, lb.pod, lb.namespace), set())
                    )
                    entry[1].add(gpu)
            by_job = {k: (lb, frozenset(gpus)) for k, (lb, gpus) in gpus_of.items()}
            room = self.cfg.max_jobs - len(self.jobs)
            for key in by_job:
                if key not in self.jobs and room > 0:
                    admitted.add(key)
                    room -= 1
            if self.cfg.process_trees:
                job_pids: dict[JobKey, set[int]] = {}
                for pid in frozen:
                    lb = self.resolver.labels(pid)  # cached: no /proc read
                    if lb.known:
                        job_pids.setdefault(lb.job_key(), set()).add(pid)
                for key in by_job:
                    if key in self.jobs or key in admitted:
                        trees[key] = self._sample_tree(key, job_pids.get(key))
        for key in [k for k in self._trees if k not in self.jobs and k not in admitted]:
            self._drop_tree(key)  # its job expired (or was never given a place)
        return Prepared(fresh, by_job, frozenset(admitted), trees)

    def _attribute(self, snap: Snapshot, prepared: Prepared) -> None:
        """Each GPU's processes and jobs, from what ``prepare`` read."""
        for g in snap.gpus:
            rt = self.gpus[g.gpu]
            if g.lost:
                rt.jobs, rt.processes, rt.pids = (), None, frozenset()
                continue
            if g.processes is None:  # unreadable this tick: no count, the last known jobs
                rt.processes = None
                continue
            pids, jobs = prepared.fresh[g.gpu]
            rt.processes = len(pids)
            if pids != rt.pids and jobs is not None:
                rt.pids, rt.jobs = pids, jobs

    def _update_job_table(
        self, snap: Snapshot, prepared: Prepared
    ) -> list[tuple[JobLabels, DetectorUpdate]]:
        """Jobs seen now: create, refresh (GPUs, process tree), expire, all bounded.

        Returns the last updates of the job detectors replaced because a job's GPUs
        changed (their open episodes close).
        """
        out: list[tuple[JobLabels, DetectorUpdate]] = []
        if self.cfg.max_jobs == 0:
            return out
        t = snap.t_s
        all_gpus = frozenset(g.gpu for g in snap.gpus if not g.lost)
        for key, (labels, gpus) in prepared.by_job.items():
            job = self.jobs.get(key)
            if job is None:
                if key not in prepared.admitted:
                    self._count_untracked(key)
                    continue
                job = self.jobs[key] = JobRuntime(labels, gpus, t)
                if gpus != all_gpus:
                    job.detector = self._job_detector(gpus)
            else:
                job.last_seen_s = t
                if gpus != job.gpus:
                    # The job's detector tracks the GPUs it was built for: one it left would
                    # read as unknown, one it joined would have no identity.  Start afresh.
                    job.gpus = gpus
                    if job.detector is not None:
                        out.append((job.labels, _run_level(job.detector.finish())))
                        job.detector, job.episode = None, None
                    if gpus != all_gpus:
                        job.detector = self._job_detector(gpus)
            job.tree_sample = prepared.trees.get(key)
        for job in self.jobs.values():
            if job.last_seen_s != t:
                job.tree_sample = None  # lingering: its processes left the GPUs
        linger = self.cfg.job_linger_s
        self._expired = [k for k, j in self.jobs.items() if t - j.last_seen_s > linger]
        return out

    def _count_untracked(self, key: JobKey) -> None:
        """Count a job left untracked once, however many ticks it stays (bounded memory)."""
        if key in self._untracked:
            self._untracked.move_to_end(key)
            return
        self._untracked[key] = None
        self.jobs_dropped_total += 1
        while len(self._untracked) > MAX_UNTRACKED_REMEMBERED:
            self._untracked.popitem(last=False)

    def _sample_tree(self, key: JobKey, pids: set[int] | None) -> ProcTreeSample | None:
        """The job's lowest GPU pid (rank 0, usually) and its descendants (its workers)."""
        if not pids:
            return None
        root = min(pids)
        kept = self._trees.get(key)
        if kept is None or kept[0] != root:
            self._drop_tree(key)
            try:
                tree = self.session.process_tree(root, procfs=self.procfs)
            except GpumonError:  # gone or not readable: no tree for this root
                self._trees[key] = (root, None)
                return None
            except (OSError, ValueError, IndexError):  # no fd left, say: try next tick
                return None
            kept = self._trees[key] = (root, tree)
        tree = kept[1]
        if tree is None:
            return None
        sample = tree.sample()
        return sample if sample.root_alive else None

    def _drop_tree(self, key: JobKey) -> None:
        kept = self._trees.pop(key, None)
        if kept is not None and kept[1] is not None:
            kept[1].close()  # its kept /proc files go back to the shared budget

    def _update_job_detectors(self, snap: Snapshot) -> list[tuple[JobLabels, DetectorUpdate]]:
        out: list[tuple[JobLabels, DetectorUpdate]] = []
        t = snap.t_s
        for job in self.jobs.values():
            if job.detector is None or job.last_seen_s != t:
                continue
            sub = Snapshot(
                t_s=t,
                gpus=tuple(g for g in snap.gpus if g.gpu in job.gpus),
                host=snap.host,
                tree=job.tree_sample,
            )
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
        return self.session.new_detector(idents)

    def _count_seconds(self, t: float) -> None:
        """Add the time since the last tick to the state each GPU (and the node) is in."""
        last, self._last_t = self._last_t, t
        if last is None or not 0 < t - last < 60.0:  # (a stalled loop adds nothing)
            return
        dt = t - last
        for key, ep in self.episodes.items():
            per = self.reported_seconds.get(key)
            if per is None:
                per = self.reported_seconds[key] = dict.fromkeys(State, 0.0)
            per[ep.state] += dt

    # --- the log -------------------------------------------------------------------------------

    def _log_records(self, update: DetectorUpdate, job: JobLabels | None) -> list[dict[str, Any]]:
        """The log lines of an update, built under the lock, written after it."""
        if self.log.path is None:
            return []
        return [self._episode_record("episode_end", ep, job) for ep in update.closed] + [
            self._episode_record("episode_start", ep, job) for ep in update.opened
        ]

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
            "reason": None if ep.reason is None else str(ep.reason),
        }

    def summary(self, event: str = "summary") -> dict[str, Any]:
        """A periodic (and final) line: each GPU's state and time per state, jobs, health."""
        verdict = self.detector.verdict()
        seconds = self.reported_seconds
        gpus = []
        for v in verdict.gpus:
            rt = self.gpus.get(v.gpu)
            gpus.append(
                {
                    "gpu": v.gpu,
                    "uuid": v.uuid,
                    "state": str(v.state),
                    "cause": None if v.cause is None else str(v.cause),
                    "seconds": {str(k): round(s, 1) for k, s in seconds.get(v.gpu, {}).items()},
                    "jobs": [] if rt is None else [lb.as_dict() for lb in rt.jobs],
                    "lost": bool(rt and rt.sample and rt.sample.lost),
                }
            )
            last, since = self.last_sample_wall_s, rt and self.wall_of(rt.lost_since_s)
            if last is not None and since is not None:
                gpus[-1]["lost_for_s"] = round(last - since, 1)
        run = self.detector.summary()
        return {
            "time": self._wall(),
            "event": event,
            "version": self.version,
            "node_state": str(verdict.state),
            "node_cause": None if verdict.cause is None else str(verdict.cause),
            # The node's run so far, as `gpumon analyze` and the watch summary say it.
            "verdict": str(run.verdict),
            "cause": None if run.cause is None else str(run.cause),
            "reason": None if run.reason is None else str(run.reason),
            "effective_gpus": run.effective_gpus,
            "speedup_if_fed": run.speedup_if_fed,
            "advice": list(run.advice),
            "gpus": gpus,
            "jobs": [dict(j.labels.as_dict(), gpus=sorted(j.gpus)) for j in self.jobs.values()],
            "lost_gpu_seconds": round(self.detector.lost_gpu_seconds(), 1),
            "ticks": self.ticks_total,
            "nvml_errors": dict(self.nvml_errors),
            "log_write_errors": self.log.errors_total,
            "log_reopens": dict(self.log.reopens),
        }

    def finish(self, reason: str) -> None:
        """Close every open episode and write the final line (SIGTERM, end of run)."""
        with self.lock:
            record = self.summary("stop")  # the states as they were, before closing them
            records = self._log_records(_only_closed(self.detector.finish()), None)
            for job in self.jobs.values():
                if job.detector is not None:
                    records += self._log_records(_run_level(job.detector.finish()), job.labels)
            record["reason"] = reason
        for key in list(self._trees):
            self._drop_tree(key)
        for line in [*records, record]:
            self.log.write(line)


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
