"""Which job holds which GPU, each job's process tree, and a detector per job.

On a shared node the daemon reports per job, not only per GPU: a Slurm job or a pod on
two of eight GPUs has a state of its own, judged on its GPUs with its own process tree
(its DataLoader workers name the cause).  A job on every GPU of the node is judged by the
node's detector, given that job's tree: a second detector over the same data would only
double the cost.

A tick's job work comes in two halves, so a face can keep its lock short: ``read()`` does
the /proc reads (labels of new pids, each tracked job's tree) and changes nothing a reader
sees; ``fold()`` and ``judge()`` change the table.  Only the thread that ticks calls them.

A job's process tree starts at its top process where the resolver followed the GPU
process's ancestors (a container, a unit, a session, a process tree: the process ``gpumon
watch --pid`` would be given, so the DataLoader workers and the job's own CPU are seen as
watch sees them), and at its lowest GPU pid for a Slurm job or a pod (rank 0, usually).

Each job's GPU time is counted tick by tick (``JobTime``): the GPU-seconds its GPUs spent
in each state and why (the starved cause, or the state's reason), and of those the
GPU-seconds lost (idle or busy-waiting while held, as its detector counts them), so a
fleet can say which jobs, users and causes waste GPU time.

Everything is bounded: the table holds at most ``max_jobs`` and forgets a job
``linger_s`` after its last GPU process left; a GPU lists at most ``MAX_JOBS_PER_GPU``
jobs; the resolver forgets pids that left the GPUs; jobs left untracked are remembered
(to count each once) up to ``MAX_UNTRACKED_REMEMBERED``; a job's time is kept per state
and cause or reason, a fixed vocabulary.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from gpumon.detect import Detector, DetectorConfig, DetectorUpdate, GpuTotals
from gpumon.engine.memory import MAX_TICK_GAP_S
from gpumon.errors import GpumonError
from gpumon.model import (
    Cause,
    Episode,
    GpuIdentity,
    JobLabels,
    ProcTreeSample,
    Reason,
    Snapshot,
    State,
)

if TYPE_CHECKING:
    from gpumon.sample.host import ProcessTreeSampler
    from gpumon.sample.joblabels import JobResolver

JobKey = tuple[str, ...]
# A job's tree root: its pid and, where the resolver found it, its start time (the pid
# may be reused by another process: a new start time is a new root).
TreeRoot = tuple[int, int | None]

# Jobs left untracked (max_jobs reached) are remembered so that each is counted once.
MAX_UNTRACKED_REMEMBERED = 4096
# Jobs listed per GPU (gpumon_gpu_job_info): a GPU shared by more is listed by its first
# (lowest pids); the series stay bounded whatever runs on it.
MAX_JOBS_PER_GPU = 16


@dataclass(frozen=True, slots=True)
class JobOptions:
    """How a session follows jobs (the daemon's ``job_sources``, ``max_jobs``, ...)."""

    sources: tuple[str, ...] = ("slurm", "kubernetes", "containers", "units", "processes")
    max_jobs: int = 64
    linger_s: float = 60.0
    process_trees: bool = True
    procfs: str | None = None  # where process trees are read (the resolver's by default)


# Where a job's GPU time went: its GPUs' state and, within it, why -- a starved GPU's
# cause, else the state's reason (straggler, busy-wait, hang, memory held, start-up, ...),
# None where the state says it all.
SpentKey = tuple[State, Cause | Reason | None]


def spent_key(ep: Episode) -> SpentKey:
    """The state and why of an episode, as a job's time is counted under it."""
    if ep.state is State.STARVED:
        return ep.state, ep.cause or Cause.UNKNOWN
    return ep.state, ep.reason


@dataclass(slots=True)
class JobTime:
    """A job's GPU time on this node since it was first seen, tick by tick: counters
    that never decrease (Prometheus counters; the log's backdated episodes would not).

    ``seconds``: GPU-seconds its GPUs spent under each state and why; ``lost``: of
    those, GPU-seconds idle or busy-waiting while the job held the GPU, the detector's
    own count (``GpuTotals.lost_s``) taken tick by tick from the detector that judges the
    job: its own, or the node's for a job on every GPU.
    """

    seconds: dict[SpentKey, float] = field(default_factory=dict)
    lost: dict[SpentKey, float] = field(default_factory=dict)
    last_t: float | None = None
    # The detector whose totals ``base`` holds (a new one starts a new baseline), and each
    # GPU's lost seconds by its count at the last tick.
    source: object | None = None
    base: dict[int, float] = field(default_factory=dict)

    def add(
        self,
        t: float,
        gpus: frozenset[int],
        episodes: Mapping[int | None, Episode],
        totals: Mapping[int, GpuTotals],
        source: object,
    ) -> None:
        """One tick of the job's GPUs, each under the episode it is in now."""
        now = {g: totals[g].lost_s for g in gpus if g in totals}
        if source is not self.source:  # a new detector: its totals start a new baseline
            self.source, self.base, self.last_t = source, now, t
            return
        dt = 0.0 if self.last_t is None else t - self.last_t
        timed = 0.0 < dt < MAX_TICK_GAP_S  # a stalled loop adds no seconds
        self.last_t = t
        for g in gpus:
            ep = episodes.get(g)
            if ep is None:
                continue
            key = spent_key(ep)
            if timed:
                self.seconds[key] = self.seconds.get(key, 0.0) + dt
            was, cur = self.base.get(g), now.get(g)
            grew = 0.0 if was is None or cur is None or cur < was else cur - was
            if timed or grew > 0:
                self.seconds.setdefault(key, 0.0)
                self.lost[key] = self.lost.get(key, 0.0) + grew
        self.base = now

    def pause(self) -> None:
        """The job was not seen this tick (lingering): its next tick starts afresh."""
        self.last_t = None


@dataclass(slots=True)
class Job:
    """A job seen on this node: its labels, GPUs and (when it has a subset) a detector.

    ``detector is None`` means the job holds every GPU of the node: its state is the
    node's.
    """

    labels: JobLabels
    gpus: frozenset[int]
    last_seen_s: float
    detector: Detector | None = None
    episode: Episode | None = None  # the job's open run-level episode (own detector)
    tree_sample: ProcTreeSample | None = None
    time: JobTime = field(default_factory=JobTime)


@dataclass(slots=True)
class GpuJobs:
    """Who holds one GPU: its processes and their jobs, as last read."""

    pids: frozenset[int] = frozenset()
    jobs: tuple[JobLabels, ...] = ()
    processes: int | None = None  # None: the process list could not be read this tick


@dataclass(slots=True)
class JobsRead:
    """A tick's /proc work, done before the fold: labels, the table's plan, trees."""

    # Per GPU with a process list this tick: its pids and, where they changed, its jobs.
    fresh: dict[int, tuple[frozenset[int], tuple[JobLabels, ...] | None]]
    # The jobs on the GPUs now, in GPU order: labels and GPUs.
    by_job: dict[JobKey, tuple[JobLabels, frozenset[int]]]
    admitted: frozenset[JobKey]  # jobs in by_job not tracked yet that get a place
    trees: dict[JobKey, ProcTreeSample | None] = field(default_factory=dict)


JobUpdate = tuple[JobLabels, DetectorUpdate]
# The node's detector, as the source of a whole-node job's time.
_NODE = object()


class JobTracker:
    """The node's jobs, kept tick by tick."""

    def __init__(
        self,
        resolver: JobResolver,
        options: JobOptions,
        config: DetectorConfig,
        identities: Callable[[frozenset[int]], Sequence[GpuIdentity]],
        tree_factory: Callable[[int, str], ProcessTreeSampler],
    ) -> None:
        self.resolver = resolver
        self.options = options
        self.config = config
        self._identities = identities
        self._tree_factory = tree_factory
        self.procfs = options.procfs if options.procfs is not None else resolver.procfs
        self.jobs: dict[JobKey, Job] = {}
        self.gpus: dict[int, GpuJobs] = {}
        self.dropped_total = 0  # jobs not tracked because max_jobs was reached
        self._untracked: OrderedDict[JobKey, None] = OrderedDict()
        self._all_pids: frozenset[int] = frozenset()
        self._expired: list[JobKey] = []
        # Each tracked job's tree sampler and its root (None: the root is unreadable).
        self._trees: dict[JobKey, tuple[TreeRoot, ProcessTreeSampler | None]] = {}

    # --- reading (no visible change) ---------------------------------------------------

    def read(self, snap: Snapshot) -> JobsRead:
        """Labels of pids not seen before (the resolver caches the rest), then each
        tracked job's process tree."""
        fresh: dict[int, tuple[frozenset[int], tuple[JobLabels, ...] | None]] = {}
        jobs_now: list[tuple[int, tuple[JobLabels, ...]]] = []  # each GPU's jobs after it
        all_pids: set[int] = set()
        reused = self.resolver.recheck()  # pids another process took (now and then)
        for g in snap.gpus:
            held = self.gpus.get(g.gpu)
            if g.lost:
                continue
            if g.processes is None:
                if held is not None:  # unreadable this tick: keep the last known
                    all_pids.update(held.pids)
                    jobs_now.append((g.gpu, held.jobs))
                continue
            pids = frozenset(p.pid for p in g.processes)
            all_pids.update(pids)
            if held is None or pids != held.pids or not reused.isdisjoint(pids):
                # The GPU's UUID lets the kubelet's pod-resources socket name the pod.
                jobs = self._jobs_of(pids, g.uuid)
                fresh[g.gpu] = (pids, jobs)
            else:
                fresh[g.gpu] = (pids, None)
                jobs = held.jobs
            jobs_now.append((g.gpu, jobs))
        frozen = frozenset(all_pids)
        if frozen != self._all_pids:
            self._all_pids = frozen
            self.resolver.retain(frozen)
        read = JobsRead(fresh, {}, frozenset())
        if self.options.max_jobs > 0:
            self._plan(read, jobs_now, frozen)
        for key in [k for k in self._trees if k not in self.jobs and k not in read.admitted]:
            self._drop_tree(key)  # its job expired (or was never given a place)
        return read

    def _jobs_of(self, pids: frozenset[int], uuid: str) -> tuple[JobLabels, ...]:
        """The jobs of one GPU's processes, each once (a pod's containers apart), in the
        labels of the table's job where it is tracked (its processes may differ in, say,
        their command: the job's series must not)."""
        found: dict[tuple[JobKey, str], JobLabels] = {}
        for pid in sorted(pids):
            lb = self.resolver.labels(pid, uuid)
            if not lb.known:
                continue
            key = lb.job_key()
            if (key, lb.container) in found or len(found) >= MAX_JOBS_PER_GPU:
                continue
            tracked = self.jobs.get(key)
            if tracked is not None and not lb.pod:
                lb = tracked.labels
            found[(key, lb.container)] = lb
        return tuple(sorted(found.values(), key=_order))

    def _plan(
        self,
        read: JobsRead,
        jobs_now: list[tuple[int, tuple[JobLabels, ...]]],
        pids: frozenset[int],
    ) -> None:
        gpus_of: dict[JobKey, tuple[JobLabels, set[int]]] = {}
        for gpu, jobs in jobs_now:
            for lb in jobs:
                # A pod is one job whatever container holds the GPU.
                job_labels = replace(lb, container="") if lb.pod else lb
                entry = gpus_of.setdefault(lb.job_key(), (job_labels, set()))
                entry[1].add(gpu)
        read.by_job = {k: (lb, frozenset(gpus)) for k, (lb, gpus) in gpus_of.items()}
        room = self.options.max_jobs - len(self.jobs)
        admitted: set[JobKey] = set()
        for key in read.by_job:
            if key not in self.jobs and room > 0:
                admitted.add(key)
                room -= 1
        read.admitted = frozenset(admitted)
        if self.options.process_trees:
            job_pids: dict[JobKey, set[int]] = {}
            for pid in pids:
                lb = self.resolver.labels(pid)  # cached: no /proc read
                if lb.known:
                    job_pids.setdefault(lb.job_key(), set()).add(pid)
            for key in read.by_job:
                if key in self.jobs or key in admitted:
                    read.trees[key] = self._sample_tree(key, self._root(job_pids.get(key)))

    def _root(self, pids: set[int] | None) -> TreeRoot | None:
        """Where a job's tree starts: the top process the resolver found above its lowest
        GPU pid, else that pid (a Slurm job's or a pod's rank 0, usually)."""
        if not pids:
            return None
        lowest = min(pids)
        top = self.resolver.root(lowest)  # cached: no /proc read
        return (lowest, None) if top is None else top

    def _sample_tree(self, key: JobKey, root: TreeRoot | None) -> ProcTreeSample | None:
        """The job's root and its descendants (its workers)."""
        if root is None:
            return None
        kept = self._trees.get(key)
        if kept is None or kept[0] != root:
            self._drop_tree(key)
            try:
                opened = self._tree_factory(root[0], self.procfs)
            except GpumonError:  # gone or not readable: no tree for this root
                self._trees[key] = (root, None)
                return None
            except (OSError, ValueError, IndexError):  # no fd left, say: try next tick
                return None
            kept = self._trees[key] = (root, opened)
        sampler = kept[1]
        if sampler is None:
            return None
        sample = sampler.sample()
        return sample if sample.root_alive else None

    def _drop_tree(self, key: JobKey) -> None:
        kept = self._trees.pop(key, None)
        if kept is not None and kept[1] is not None:
            kept[1].close()  # its kept /proc files go back to the shared budget

    # --- folding (the table changes) ----------------------------------------------------

    def fold(self, snap: Snapshot, read: JobsRead) -> list[JobUpdate]:
        """Each GPU's processes and jobs, then the job table: create, refresh, expire.

        Returns the last updates of job detectors replaced because a job's GPUs changed
        (their open episodes close)."""
        self._attribute(snap, read)
        out: list[JobUpdate] = []
        if self.options.max_jobs == 0:
            return out
        t = snap.t_s
        all_gpus = frozenset(g.gpu for g in snap.gpus if not g.lost)
        for key, (labels, gpus) in read.by_job.items():
            job = self.jobs.get(key)
            if job is None:
                if key not in read.admitted:
                    self._count_untracked(key)
                    continue
                job = self.jobs[key] = Job(labels, gpus, t)
                if gpus != all_gpus:
                    job.detector = self._detector(gpus)
            else:
                job.last_seen_s = t
                if gpus != job.gpus:
                    # The job's detector tracks the GPUs it was built for: one it left would
                    # read as unknown, one it joined would have no identity.  Start afresh.
                    job.gpus = gpus
                    if job.detector is not None:
                        out.append((job.labels, run_level(job.detector.finish())))
                        job.detector, job.episode = None, None
                    if gpus != all_gpus:
                        job.detector = self._detector(gpus)
            job.tree_sample = read.trees.get(key)
        for job in self.jobs.values():
            if job.last_seen_s != t:
                job.tree_sample = None  # lingering: its processes left the GPUs
        linger = self.options.linger_s
        self._expired = [k for k, j in self.jobs.items() if t - j.last_seen_s > linger]
        return out

    def _attribute(self, snap: Snapshot, read: JobsRead) -> None:
        for g in snap.gpus:
            held = self.gpus.get(g.gpu)
            if held is None:
                held = self.gpus[g.gpu] = GpuJobs()
            if g.lost:
                held.jobs, held.processes, held.pids = (), None, frozenset()
                continue
            if g.processes is None:  # unreadable this tick: no count, the last known jobs
                held.processes = None
                continue
            pids, jobs = read.fresh[g.gpu]
            held.processes = len(pids)
            if jobs is not None:  # read afresh (new pids, or a pid reused)
                held.pids, held.jobs = pids, jobs

    def whole_node_tree(self) -> ProcTreeSample | None:
        """The process tree of the one job that holds every GPU (its DataLoader workers
        are the node's), for the node's detector; None when no single job does."""
        whole = [j for j in self.jobs.values() if j.detector is None and j.tree_sample]
        return whole[0].tree_sample if len(whole) == 1 else None

    def one_job(self) -> bool:
        """Whether the node's GPUs may be compared as one job's peers: no two jobs hold
        GPUs of it (no job known at all is a single user's node)."""
        return len(self.jobs) <= 1 or any(j.detector is None for j in self.jobs.values())

    def judge(self, snap: Snapshot) -> list[JobUpdate]:
        """Each job with a detector of its own judges its GPUs with its own tree; expired
        jobs close."""
        out: list[JobUpdate] = []
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
            upd = run_level(job.detector.update(sub))
            if upd.opened:
                job.episode = upd.opened[-1]
            out.append((job.labels, upd))
        for key in self._expired:
            job = self.jobs.pop(key)
            if job.detector is not None:
                out.append((job.labels, run_level(job.detector.finish())))
        self._expired = []
        return out

    def account(
        self,
        t: float,
        node_open: Mapping[int | None, Episode],
        node_totals: Callable[[], Mapping[int, GpuTotals]] | None,
    ) -> None:
        """Each job seen this tick counts its GPUs' time under their episodes: its own
        detector's, or the node's (``node_open``, ``node_totals``) for a job on every GPU.
        Call after ``judge``."""
        totals: Mapping[int, GpuTotals] | None = None
        for job in self.jobs.values():
            if job.last_seen_s != t:
                job.time.pause()
                continue
            det = job.detector
            if det is not None:
                job.time.add(t, job.gpus, det.open_episodes(), det.gpu_totals(), det)
                continue
            if node_totals is None:
                continue
            if totals is None:
                totals = node_totals()
            job.time.add(t, job.gpus, node_open, totals, _NODE)

    def episode_of(self, job: Job, node: Episode | None) -> Episode | None:
        """The job's open episode: its own detector's, or the node's for a whole-node job."""
        return job.episode if job.detector is not None else node

    def finish(self) -> list[JobUpdate]:
        """Close every job's open episodes (the end of the daemon)."""
        out = [
            (job.labels, run_level(job.detector.finish()))
            for job in self.jobs.values()
            if job.detector is not None
        ]
        self.close()
        return out

    def close(self) -> None:
        for key in list(self._trees):
            self._drop_tree(key)

    def _count_untracked(self, key: JobKey) -> None:
        """Count a job left untracked once, however many ticks it stays (bounded memory)."""
        if key in self._untracked:
            self._untracked.move_to_end(key)
            return
        self._untracked[key] = None
        self.dropped_total += 1
        while len(self._untracked) > MAX_UNTRACKED_REMEMBERED:
            self._untracked.popitem(last=False)

    def _detector(self, gpus: frozenset[int]) -> Detector:
        return Detector(self.config, self._identities(gpus))

    @property
    def trees_open(self) -> int:
        return len(self._trees)


def run_level(update: DetectorUpdate) -> DetectorUpdate:
    """A job detector's per-GPU episodes repeat the node detector's: keep the job's own."""
    return DetectorUpdate(
        opened=tuple(e for e in update.opened if e.gpu is None),
        closed=tuple(e for e in update.closed if e.gpu is None),
    )


def job_name(labels: JobLabels) -> str:
    """One string for a job: the Slurm id, namespace/pod, else the job's name (a
    container's or unit's name; a process tree's top pid)."""
    if labels.hpc_job:
        return labels.hpc_job
    if labels.pod:
        return f"{labels.namespace}/{labels.pod}" if labels.namespace else labels.pod
    return labels.name


def _order(lb: JobLabels) -> tuple[str, ...]:
    return (lb.hpc_job, lb.namespace, lb.pod, lb.container, lb.kind, lb.name, lb.user)
