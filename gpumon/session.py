"""The one place that builds samplers and the detector, live or replayed.

A face asks a ``Session`` for ticks and for what the detector made of them; it never
builds a sampler or a detector itself (tests/test_architecture.py checks the imports):

    session = Session.live(pid=1234, interval_s=1.0, tree_gpus_only=True)
    tick = session.tick()                     # sample, then judge
    session.verdict(), session.summary()      # the detector's view now, and of the run

Sources:

- ``Session.live``: NVML, the host and a process tree (of a pid) sampled once per tick.
- ``Session.replay``: a recorded trace played against the wall clock (``gpumon demo``).
  Every recorded tick is judged on its own, whatever the interval the face ticks at, so
  a replay gives the verdict ``gpumon analyze`` gives for the same trace.
- ``Session.offline``: no source; the caller feeds snapshots (``gpumon analyze``).

The daemon (``gpumon serve``) also gets from here what it builds per job: a detector for
a job's GPUs (the session's own configuration), a process-tree sampler, the job-label
resolver.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpumon.detect import Detector, DetectorConfig, DetectorUpdate, RunSummary
from gpumon.detect.detector import GpuTotals
from gpumon.model import Episode, GpuIdentity, Snapshot, TraceHeader, Verdict

if TYPE_CHECKING:
    from gpumon.sample.host import ProcessTreeSampler
    from gpumon.sample.joblabels import JobResolver
    from gpumon.sample.monitor import Monitor
    from gpumon.sample.replay import Replay

# Offline (and replayed), calm stretches are re-evaluated only every third second:
# episodes are backdated to their onset, so detection latency costs nothing there and a
# day-long trace analyses several times faster.
OFFLINE_CONFIG = DetectorConfig(calm_factor=5.0)


@dataclass(frozen=True, slots=True)
class Tick:
    """What one tick produced: the snapshot and, where a detector runs, its update."""

    snapshot: Snapshot
    update: DetectorUpdate | None = None
    sample_duration_s: float = 0.0


def merge_updates(updates: Sequence[DetectorUpdate]) -> DetectorUpdate:
    """Several detector updates (one per replayed tick) as one."""
    if len(updates) == 1:
        return updates[0]
    return DetectorUpdate(
        tuple(e for u in updates for e in u.opened),
        tuple(e for u in updates for e in u.closed),
        tuple(b for u in updates for b in u.bursts),
        tuple(g for u in updates for g in u.gaps),
    )


class Session:
    """Snapshots from one source, judged by one detector (unless told not to judge)."""

    def __init__(
        self,
        *,
        monitor: Monitor | None = None,
        replay: Replay | None = None,
        header: TraceHeader | None = None,
        config: DetectorConfig | None = None,
        judge: bool = True,
        detector: Detector | None = None,
    ) -> None:
        self._monitor = monitor
        self._replay = replay
        self._header = header
        self.config = config or DetectorConfig()
        if detector is None and judge:
            detector = Detector(self.config, self.gpus)
        self.detector = detector  # (tests may hand in their own)
        self._seen_uuids: set[str] = set()

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def live(
        cls,
        *,
        pid: int | None = None,
        command: tuple[str, ...] | None = None,
        interval_s: float | None = None,
        tree_gpus_only: bool = False,
        host: bool = True,
        judge: bool = True,
        window_s: float | None = None,
        backlog: bool = False,
        config: DetectorConfig | None = None,
    ) -> Session:
        """NVML + host (+ the tree of ``pid``), sampled once per ``tick()``.

        The process tree is opened first, so a wrong pid is reported before NVML starts.
        ``backlog``: the first tick hands over the driver's whole sample buffer (~20 s),
        so the detector can judge at once (the dstat plugin).
        """
        from gpumon.sample.host import HostSampler, ProcessTreeSampler
        from gpumon.sample.monitor import Monitor
        from gpumon.sample.nvml import NvmlSampler

        tree = None if pid is None else ProcessTreeSampler(pid)
        if command is None and tree is not None:
            command = tree.cmdline()
        nvml = NvmlSampler(start_s=float("-inf")) if backlog else NvmlSampler()
        monitor = Monitor(
            nvml,
            HostSampler() if host else None,
            tree,
            tree_gpus_only=tree_gpus_only,
            interval_s=interval_s,
            command=command,
        )
        cfg = config or DetectorConfig()
        if window_s is not None:
            cfg = replace(cfg, window_s=window_s)
        return cls(monitor=monitor, config=cfg, judge=judge)

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
    ) -> Session:
        """A recorded trace, played ``speed`` times faster than it was recorded
        (``command``: what to show as the watched command)."""
        from gpumon.sample.replay import Replay

        rp = Replay(snapshots, header=header, speed=speed, live_start_s=live_start_s)
        s = cls(replay=rp, header=header, config=config or OFFLINE_CONFIG, judge=judge)
        s._interval_s = interval_s
        s._command = command
        return s

    @classmethod
    def offline(cls, header: TraceHeader, config: DetectorConfig | None = None) -> Session:
        """No source: the caller ``feed()``s the snapshots of a trace, in order."""
        return cls(header=header, config=config or OFFLINE_CONFIG)

    @staticmethod
    def check_driver() -> None:
        """Raise ``NoDriverError`` now if no NVIDIA driver can be loaded (before a face
        starts anything it would have to stop again)."""
        from gpumon.sample.nvml import nvml_init

        nvml_init()

    # --- ticks ----------------------------------------------------------------------------

    def tick(self) -> Tick:
        """Sample (or replay what fell due) and judge it."""
        if self._replay is not None:
            due, view = self._replay.advance_each()
            updates = [self.feed(s) for s in due] if self.detector is not None else []
            self._seen(view)
            return Tick(view, merge_updates(updates) if updates else None, 0.0)
        tick = self.sample()
        update = self.feed(tick.snapshot) if self.detector is not None else None
        return Tick(tick.snapshot, update, tick.sample_duration_s)

    def sample(self) -> Tick:
        """One tick of the live samplers, not judged (the daemon judges it after adding a
        job's process tree)."""
        if self._replay is not None:  # what fell due, merged (as one long live tick)
            view = self._replay.advance_each()[1]
            self._seen(view)
            return Tick(view, None, 0.0)
        if self._monitor is None:
            raise RuntimeError("an offline session has no samplers: feed() it snapshots")
        started = time.monotonic()
        snap = self._monitor.sample()
        return Tick(snap, None, time.monotonic() - started)

    def feed(self, snapshot: Snapshot) -> DetectorUpdate:
        """Judge one snapshot (analyze feeds a trace this way, tick by tick)."""
        assert self.detector is not None, "a session built with judge=False does not judge"
        return self.detector.update(snapshot)

    def finish(self) -> DetectorUpdate:
        """The stream ended: judge what never could be, close every open episode."""
        return DetectorUpdate() if self.detector is None else self.detector.finish()

    # --- what the detector says -----------------------------------------------------------

    def verdict(self) -> Verdict | None:
        return None if self.detector is None else self.detector.verdict()

    def summary(self) -> RunSummary | None:
        return None if self.detector is None else self.detector.summary()

    def open_episodes(self) -> dict[int | None, Episode]:
        return {} if self.detector is None else self.detector.open_episodes()

    def gpu_totals(self) -> dict[int, GpuTotals]:
        """Per GPU, the readings judged so far and the time and work they cover."""
        return {} if self.detector is None else self.detector.gpu_totals()

    def gpu_count(self) -> int:
        return 0 if self.detector is None else self.detector.gpu_count()

    def new_detector(self, gpus: Sequence[GpuIdentity]) -> Detector:
        """A detector for some of the GPUs (one job's), configured as the session's."""
        return Detector(self.config, gpus)

    # --- what the sources know ------------------------------------------------------------

    @property
    def gpus(self) -> tuple[GpuIdentity, ...]:
        if self._monitor is not None and self._monitor.nvml is not None:
            return tuple(self._monitor.nvml.gpus)
        if self._replay is not None:
            return tuple(self._replay.gpu_identities)
        return () if self._header is None else tuple(self._header.gpus)

    @property
    def driver_version(self) -> str | None:
        nvml = None if self._monitor is None else self._monitor.nvml
        if nvml is not None:
            return nvml.driver_version
        return None if self._header is None else self._header.driver_version

    @property
    def nvml_errors(self) -> dict[str, int]:
        nvml = None if self._monitor is None else self._monitor.nvml
        return {} if nvml is None else dict(nvml.errors)

    @property
    def known_error_kinds(self) -> tuple[str, ...]:
        """Every kind of NVML error the sampler counts (exported at 0 from the start)."""
        nvml = None if self._monitor is None else self._monitor.nvml
        return tuple(getattr(nvml, "known_error_kinds", ()))

    @property
    def nvml_version(self) -> str | None:
        nvml = None if self._monitor is None else self._monitor.nvml
        if nvml is not None:
            return nvml.nvml_version
        return None if self._header is None else self._header.nvml_version

    @property
    def root_pid(self) -> int | None:
        if self._replay is not None:
            return self._replay.root_pid
        tree = None if self._monitor is None else self._monitor.tree
        return None if tree is None else tree.root_pid

    @property
    def command(self) -> tuple[str, ...] | None:
        if self._monitor is not None:
            return self._monitor.command
        if getattr(self, "_command", None) is not None:
            return self._command
        return None if self._header is None else self._header.command

    @property
    def interval_s(self) -> float | None:
        if self._monitor is not None:
            return self._monitor.interval_s
        return getattr(self, "_interval_s", None)

    @property
    def tree_gpu_uuids(self) -> frozenset[str]:
        """The GPUs the watched tree used (every GPU of a replay)."""
        if self._monitor is not None:
            return frozenset(self._monitor.tree_gpu_uuids)
        return frozenset(self._seen_uuids)

    @property
    def invisible_gpu_pids(self) -> frozenset[int]:
        return frozenset(() if self._monitor is None else self._monitor.invisible_gpu_pids)

    @property
    def replay_finished(self) -> bool:
        return self._replay is not None and self._replay.finished

    def replay_now(self) -> float:
        """A replay's current time, on the samples' clock (the live clock otherwise)."""
        return time.monotonic() if self._replay is None else self._replay.now()

    @property
    def replay_played_s(self) -> float:
        """Trace seconds a replay has handed out so far."""
        return 0.0 if self._replay is None else self._replay.played_s

    def header(self, source: str = "gpumon", **extra: Any) -> TraceHeader:
        """The trace header a recording of this session starts with."""
        if self._monitor is not None:
            return self._monitor.header(source, **extra)
        assert self._header is not None
        return self._header

    def _seen(self, snap: Snapshot) -> None:
        for g in snap.gpus:
            self._seen_uuids.add(g.uuid)

    # --- what the daemon builds per job ---------------------------------------------------

    @staticmethod
    def process_tree(root_pid: int, procfs: str = "/proc") -> ProcessTreeSampler:
        """A sampler of one job's process tree (the daemon keeps one per job)."""
        from gpumon.sample.host import ProcessTreeSampler

        return ProcessTreeSampler(root_pid, procfs=procfs)

    @staticmethod
    def job_resolver(sources: Sequence[str], **kw: Any) -> JobResolver:
        """Job labels (Slurm, Kubernetes, ...) of the processes on the GPUs."""
        from gpumon.sample.joblabels import JobResolver

        return JobResolver(sources, **kw)
