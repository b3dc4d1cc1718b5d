"""A session: one source of snapshots, judged by one detector, remembered once.

A face asks a ``Session`` for ticks and for what the run amounts to; it never builds a
sampler, a detector or a job table itself (tests/test_architecture.py checks the imports):

    session = Session.live(LiveOptions(pid=1234, interval_s=1.0, tree_gpus_only=True))
    tick = session.tick()                     # read, judge, remember (now)
    for tick in session.ticks(20): ...        # or 20 of them, one per interval
    session.verdict(), session.summary()      # the detector's view now, and of the run
    session.memory                            # timelines, histograms, episodes, seconds

A tick comes in two halves for a face that holds a lock while others read the memory
(the daemon's scrapes, the live view's refresh): ``read()`` does the slow reads (NVML, the
host, /proc for jobs) and changes nothing a reader sees; ``fold()`` judges and remembers.
``tick()`` is both.  Offline, ``feed()`` takes one snapshot of a trace at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Self

from gpumon.detect import Detector, DetectorConfig, DetectorUpdate, RunSummary
from gpumon.engine.jobs import JobOptions, JobsRead, JobTracker, JobUpdate
from gpumon.engine.memory import GpuEvent, RunMemory
from gpumon.engine.sources import (
    FedSource,
    LiveOptions,
    LiveSource,
    Polled,
    Source,
    SourceInfo,
    check_driver,
    live_monitor,
    process_tree,
    replay_of,
)
from gpumon.engine.stacks import StackOptions, StackWatch, check_stacks
from gpumon.loop import paced
from gpumon.model import Episode, GpuIdentity, Snapshot, TraceHeader, Verdict

if TYPE_CHECKING:
    from gpumon.sample.joblabels import JobResolver

# Offline (and replayed), an eval may be skipped while every GPU's work since the last one
# is what its state already says (up to four in a row): a day's trace judges about twice as
# fast.  Anything else is judged at the live cadence, so analyze of watch's recording tells
# watch's own story (skipping calm evals blindly placed a change after a calm stretch up
# to 4 s off, and the two summaries of one run disagreed).
OFFLINE_CONFIG = DetectorConfig(calm_factor=5.0)

_NO_UPDATE = DetectorUpdate()
# A live session's pace when none was given: what `gpumon watch --plain` ticks at.
DEFAULT_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class Tick:
    """What one tick produced: the snapshot shown, the detector's update, and what
    changed (GPUs appearing, lost or back; the jobs' own updates)."""

    snapshot: Snapshot
    update: DetectorUpdate | None = None
    sample_duration_s: float = 0.0
    events: tuple[GpuEvent, ...] = ()
    job_updates: tuple[JobUpdate, ...] = ()


@dataclass(frozen=True, slots=True)
class Reading:
    """A tick's reads, done and not yet folded in."""

    polled: Polled
    jobs: JobsRead | None = None


def merge_updates(updates: Sequence[DetectorUpdate]) -> DetectorUpdate:
    """Several detector updates (one per replayed tick) as one."""
    if len(updates) == 1:
        return updates[0]
    return DetectorUpdate(
        opened=tuple(e for u in updates for e in u.opened),
        closed=tuple(e for u in updates for e in u.closed),
        bursts=tuple(b for u in updates for b in u.bursts),
        gaps=tuple(g for u in updates for g in u.gaps),
    )


class Session:
    """Snapshots from one source, judged by one detector (unless told not to judge),
    remembered in one ``RunMemory``; optionally the jobs on the GPUs, each judged too."""

    def __init__(
        self,
        source: Source,
        *,
        config: DetectorConfig | None = None,
        judge: bool = True,
        live: bool = True,
        jobs: JobOptions | None = None,
        resolver: JobResolver | None = None,
        detector: Detector | None = None,
        stacks: StackOptions | None = None,
    ) -> None:
        self.source = source
        self.config = config or DetectorConfig()
        if detector is None and judge:
            detector = Detector(self.config, source.gpus)
        self.detector = detector  # (tests may hand in their own)
        det = self.detector
        self.memory = RunMemory(
            source.gpus,
            (lambda: {}) if det is None else det.gpu_totals,
            live=live,
            stacks=det.stacks if isinstance(det, Detector) else None,  # (a test's stub: none)
            known=lambda: source.gpus,
        )
        self.jobs: JobTracker | None = None
        if jobs is not None:
            if resolver is None:
                from gpumon.sample.joblabels import JobResolver

                resolver = JobResolver(jobs.sources)
            self.jobs = JobTracker(resolver, jobs, self.config, self._identities, process_tree)
        # The job's Python stacks, read while a GPU waits (--stacks).
        self.stacks: StackWatch | None = None
        if stacks is not None:
            self.stacks = StackWatch(stacks, self.config.busy_util_pct)

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def live(
        cls,
        options: LiveOptions | None = None,
        *,
        judge: bool = True,
        config: DetectorConfig | None = None,
        jobs: JobOptions | None = None,
        stacks: StackOptions | None = None,
    ) -> Self:
        """NVML + host (+ the tree of ``options.pid``), read once per tick, as ``options``
        say (``LiveOptions()``: the whole node, every second).  ``jobs``: follow the jobs
        on the GPUs (the daemon).  ``stacks``: read the job's Python stacks while a GPU
        waits (py-spy)."""
        monitor = live_monitor(options or LiveOptions())
        source = LiveSource(monitor)
        try:
            return cls(source, config=config, judge=judge, jobs=jobs, stacks=stacks)
        except BaseException:
            source.close()
            raise

    @classmethod
    def replay(
        cls,
        header: TraceHeader,
        snapshots: Iterable[Snapshot],
        *,
        speed: float = 1.0,
        live_start_s: float | None = None,
        interval_s: float | None = None,
        command: tuple[str, ...] | None = None,
        config: DetectorConfig | None = None,
        judge: bool = True,
    ) -> Self:
        """A recorded trace, played ``speed`` times faster than it was recorded
        (``command``: what to show as the watched command)."""
        source = replay_of(
            header,
            snapshots,
            speed=speed,
            live_start_s=live_start_s,
            interval_s=interval_s,
            command=command,
        )
        return cls(source, config=config or OFFLINE_CONFIG, judge=judge)

    @classmethod
    def offline(
        cls,
        header: TraceHeader,
        config: DetectorConfig | None = None,
        *,
        live: bool = False,
        jobs: JobOptions | None = None,
        resolver: JobResolver | None = None,
    ) -> Self:
        """No source: the caller ``feed()``s a trace's snapshots in order (or hands
        ``read()`` a snapshot; ``live``: remember it as a live face would)."""
        return cls(
            FedSource(header),
            config=config or (DetectorConfig() if live else OFFLINE_CONFIG),
            live=live,
            jobs=jobs,
            resolver=resolver,
        )

    @staticmethod
    def check_stacks(options: StackOptions) -> None:
        """Raise ``StacksUnavailableError`` now if py-spy cannot be found (before a face
        starts a command that ``--stacks`` was asked for)."""
        check_stacks(options.py_spy)

    @staticmethod
    def check_driver() -> None:
        """Raise ``NoDriverError`` now if no NVIDIA driver can be loaded (before a face
        starts anything it would have to stop again)."""
        check_driver()

    # --- ticks ----------------------------------------------------------------------------

    def tick(self) -> Tick:
        """Read (or replay what fell due), judge and remember, now: it does not wait, so
        a loop of ticks needs its own pace (``ticks()`` keeps one)."""
        return self.fold(self.read())

    def ticks(
        self,
        count: int | None = None,
        *,
        interval_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> Iterator[Tick]:
        """``count`` ticks (None: until ``stop`` is set or a replay ends), one every
        ``interval_s`` (the session's interval, else 1 s) without drift: the pace the
        driver's samples and the detector's windows are made for.  A live loop of bare
        ``tick()`` calls reads the same few samples many times and judges nothing."""
        every = interval_s or self.interval_s or DEFAULT_INTERVAL_S
        if count is not None and count <= 0:
            return
        for done, _ in enumerate(paced(every, stop or threading.Event()), start=1):
            yield self.tick()
            if done == count or self.finished:
                return

    def read(self, snapshot: Snapshot | None = None) -> Reading:
        """The tick's reads: the source polled (or ``snapshot`` given), and the /proc
        reads of the jobs on its GPUs.  Nothing a reader of the memory sees changes."""
        polled = self.source.poll() if snapshot is None else Polled((snapshot,), snapshot)
        jobs = None
        if self.jobs is not None and polled.due:
            jobs = self.jobs.read(polled.due[-1])
        if self.stacks is not None and polled.due:
            polled = self._read_stacks(polled, jobs)
        return Reading(polled, jobs)

    def _read_stacks(self, polled: Polled, jobs: JobsRead | None) -> Polled:
        """The stacks of windows that ended ride on the tick's snapshot (and a window
        starts if a GPU waits): the watched tree's processes, else the jobs' trees."""
        assert self.stacks is not None
        last = polled.due[-1]
        trees = [last.tree] if last.tree is not None else []
        if jobs is not None:
            trees += [t for t in jobs.trees.values() if t is not None]
        got = self.stacks.read(last, trees, self.memory.open)
        if not got:
            return polled
        snap = replace(last, stacks=got)
        view = snap if polled.view is last else polled.view
        return Polled((*polled.due[:-1], snap), view, polled.sample_duration_s)

    def fold(self, reading: Reading) -> Tick:
        """Judge what was read, tick by recorded tick, and remember it."""
        polled = reading.polled
        judged_updates: list[DetectorUpdate] = []
        events: list[GpuEvent] = []
        job_updates: list[JobUpdate] = []
        for snap in polled.due:
            judged = snap
            if self.jobs is not None and reading.jobs is not None and snap is polled.due[-1]:
                job_updates += self.jobs.fold(snap, reading.jobs)
                if self.detector is not None:
                    self.detector.one_job = self.jobs.one_job()
                tree = self.jobs.whole_node_tree()
                if tree is not None:
                    # One job holding every GPU: its process tree (DataLoader workers) is
                    # the node's, so the node's detector can name the cause.
                    judged = replace(snap, tree=tree)
            one, brought = self._judge(judged)
            judged_updates.append(one)
            events += brought
            if self.jobs is not None and reading.jobs is not None and snap is polled.due[-1]:
                job_updates += self.jobs.judge(snap)
                det = self.detector
                totals = None if det is None else det.gpu_totals
                self.jobs.account(snap.t_s, self.memory.open, totals)
        update = None
        if judged_updates and self.detector is not None:
            update = merge_updates(judged_updates)
        return Tick(
            polled.view, update, polled.sample_duration_s, tuple(events), tuple(job_updates)
        )

    def feed(self, snapshot: Snapshot) -> DetectorUpdate:
        """Judge one snapshot and remember it (``gpumon analyze`` feeds a trace so)."""
        if isinstance(self.source, FedSource):
            self.source.saw(snapshot)
        return self._judge(snapshot)[0]

    def _judge(self, snap: Snapshot) -> tuple[DetectorUpdate, tuple[GpuEvent, ...]]:
        memory = self.memory
        memory.before(snap.t_s)
        det = self.detector
        update = _NO_UPDATE if det is None else det.update(snap)
        return update, memory.after(snap, update)

    def conclude(self) -> DetectorUpdate:
        """The stream has ended: judge what never could be (a short log), episodes still
        open, so ``verdict()`` says what the end of the run was."""
        update = _NO_UPDATE if self.detector is None else self.detector.conclude()
        self.memory.take(update)
        return update

    def finish(self) -> DetectorUpdate:
        """The stream ended: judge what never could be, close every open episode (the
        jobs' too: their last updates are in ``finish_jobs()``)."""
        update = _NO_UPDATE if self.detector is None else self.detector.finish()
        self.memory.finish(update)
        return update

    def finish_jobs(self) -> list[JobUpdate]:
        """Close every job's open episodes and its process trees."""
        return [] if self.jobs is None else self.jobs.finish()

    def close(self) -> None:
        """Let go of what the source holds open (kept /proc files)."""
        if self.jobs is not None:
            self.jobs.close()
        if self.stacks is not None:
            self.stacks.close()
        self.source.close()

    # --- what the detector says -----------------------------------------------------------

    @property
    def judging(self) -> bool:
        return self.detector is not None

    def verdict(self) -> Verdict | None:
        return None if self.detector is None else self.detector.verdict()

    def summary(self) -> RunSummary | None:
        return None if self.detector is None else self.detector.summary()

    def open_episodes(self) -> dict[int | None, Episode]:
        """The episode each GPU (and the run: key None) is in now."""
        return dict(self.memory.open)

    def lost_gpu_seconds(self) -> float:
        return 0.0 if self.detector is None else self.detector.lost_gpu_seconds()

    def gpu_count(self) -> int:
        return 0 if self.detector is None else self.detector.gpu_count()

    # --- what the source knows ------------------------------------------------------------

    @property
    def info(self) -> SourceInfo:
        return self.source.info

    @property
    def gpus(self) -> tuple[GpuIdentity, ...]:
        return self.source.gpus

    @property
    def driver_version(self) -> str | None:
        return self.source.info.driver_version

    @property
    def nvml_version(self) -> str | None:
        return self.source.info.nvml_version

    @property
    def root_pid(self) -> int | None:
        return self.source.info.root_pid

    @property
    def command(self) -> tuple[str, ...] | None:
        return self.source.info.command

    @property
    def interval_s(self) -> float | None:
        return self.source.info.interval_s

    @property
    def nvml_errors(self) -> dict[str, int]:
        return self.source.nvml_errors

    @property
    def known_error_kinds(self) -> tuple[str, ...]:
        return self.source.known_error_kinds

    @property
    def tree_gpu_uuids(self) -> frozenset[str]:
        """The GPUs the watched tree used (every GPU seen, where no tree is watched)."""
        return self.source.tree_gpu_uuids

    @property
    def invisible_gpu_pids(self) -> frozenset[int]:
        return self.source.invisible_gpu_pids

    @property
    def finished(self) -> bool:
        """A replay has played its last tick."""
        return self.source.finished

    def now(self) -> float:
        """The source's clock: a replay's current time on the samples' clock."""
        return self.source.now()

    @property
    def played_s(self) -> float:
        return self.source.played_s

    def header(self, source: str = "gpumon", **extra: Any) -> TraceHeader:
        """The trace header a recording of this session starts with."""
        return self.source.header(source, **extra)

    def _identities(self, gpus: frozenset[int]) -> list[GpuIdentity]:
        known = {g.index: g for g in self.source.gpus}
        for idx, mem in self.memory.gpus.items():
            known[idx] = mem.identity
        return [known[i] for i in sorted(gpus) if i in known]
