"""Where a session's snapshots come from: the machine, a trace played against the clock, or
a caller that feeds them.  Three sources, one protocol, so the session never asks which.

- ``LiveSource``: NVML, the host and a process tree, sampled once per ``poll()``.
- ``ReplaySource``: a recorded trace played against the wall clock (``gpumon demo``); every
  recorded tick that fell due is handed over on its own, so a replay is judged tick by tick
  as ``gpumon analyze`` judges the same trace, whatever the interval a face polls at.
- ``FedSource``: nothing to poll; the caller feeds snapshots (``gpumon analyze``).

Facts only a live source has (the driver's error counts, pids NVML lists that /proc does
not) are empty elsewhere, never missing: a face asks every source the same questions.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpumon.model import GpuIdentity, Snapshot, TraceHeader

if TYPE_CHECKING:
    from gpumon.sample.host import ProcessTreeSampler
    from gpumon.sample.monitor import Monitor
    from gpumon.sample.replay import Replay


@dataclass(frozen=True, slots=True)
class Polled:
    """One poll: what the detector judges (in order) and what a face shows."""

    due: tuple[Snapshot, ...]  # every tick to judge (one live; zero or more replayed)
    view: Snapshot  # the tick as a face shows it (several replayed ticks merged)
    sample_duration_s: float = 0.0  # how long reading the machine took


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """What a source knows about the run it reads, fixed once it is open."""

    gpus: tuple[GpuIdentity, ...] = ()
    driver_version: str | None = None
    nvml_version: str | None = None
    command: tuple[str, ...] | None = None
    interval_s: float | None = None
    root_pid: int | None = None


class Source(Protocol):
    """A source of snapshots behind a session."""

    @property
    def info(self) -> SourceInfo: ...

    @property
    def gpus(self) -> tuple[GpuIdentity, ...]:
        """The GPUs known now (a live source finds new ones while it runs)."""
        ...

    def poll(self) -> Polled:
        """What is new since the last poll."""
        ...

    def header(self, source: str = "gpumon", **extra: Any) -> TraceHeader:
        """The trace header a recording of this source starts with."""
        ...

    @property
    def finished(self) -> bool:
        """A replay has played its last tick (a live source never finishes by itself)."""
        ...

    def now(self) -> float:
        """The source's clock (a replay's runs at its speed)."""
        ...

    @property
    def played_s(self) -> float:
        """Seconds of the run handed out so far (a replay's trace seconds)."""
        ...

    @property
    def tree_gpu_uuids(self) -> frozenset[str]:
        """The GPUs the watched run used (all GPUs seen, where no tree is watched)."""
        ...

    @property
    def invisible_gpu_pids(self) -> frozenset[int]:
        """Pids in NVML's process lists that do not exist here (a container's view)."""
        ...

    @property
    def nvml_errors(self) -> dict[str, int]:
        """Failed NVML calls by kind, so far."""
        ...

    @property
    def known_error_kinds(self) -> tuple[str, ...]:
        """Every kind of NVML error the source counts (exported at 0 from the start)."""
        ...

    def close(self) -> None: ...


class LiveSource:
    """The machine: NVML, the host and (optionally) one process tree, read per poll."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        nvml = monitor.nvml
        tree = monitor.tree
        self.info = SourceInfo(
            gpus=() if nvml is None else tuple(nvml.gpus),
            driver_version=None if nvml is None else nvml.driver_version,
            nvml_version=None if nvml is None else nvml.nvml_version,
            command=monitor.command,
            interval_s=monitor.interval_s,
            root_pid=None if tree is None else tree.root_pid,
        )

    @property
    def gpus(self) -> tuple[GpuIdentity, ...]:
        nvml = self.monitor.nvml
        return self.info.gpus if nvml is None else tuple(nvml.gpus)

    def poll(self) -> Polled:
        started = time.monotonic()
        snap = self.monitor.sample()
        return Polled((snap,), snap, time.monotonic() - started)

    def header(self, source: str = "gpumon", **extra: Any) -> TraceHeader:
        from gpumon.sample.host import cpu_count
        from gpumon.traces.jsonl import FORMAT_VERSION

        m = self.monitor
        return TraceHeader(
            version=FORMAT_VERSION,
            source=source,
            hostname=socket.gethostname(),
            started_wall_s=m.started_wall_s,
            started_mono_s=m.started_mono_s,
            interval_s=m.interval_s,
            driver_version=self.info.driver_version,
            nvml_version=self.info.nvml_version,
            cpu_count=cpu_count(),
            watched_pid=self.info.root_pid,
            command=m.command,
            gpus=self.gpus,
            extra=dict(extra),
        )

    @property
    def finished(self) -> bool:
        return False

    def now(self) -> float:
        return time.monotonic()

    @property
    def played_s(self) -> float:
        return time.monotonic() - self.monitor.started_mono_s

    @property
    def tree_gpu_uuids(self) -> frozenset[str]:
        return frozenset(self.monitor.tree_gpu_uuids)

    @property
    def invisible_gpu_pids(self) -> frozenset[int]:
        return frozenset(self.monitor.invisible_gpu_pids)

    @property
    def nvml_errors(self) -> dict[str, int]:
        nvml = self.monitor.nvml
        return {} if nvml is None else dict(nvml.errors)

    @property
    def known_error_kinds(self) -> tuple[str, ...]:
        nvml = self.monitor.nvml
        return () if nvml is None else tuple(nvml.known_error_kinds)

    def close(self) -> None:
        tree = self.monitor.tree
        if tree is not None:
            tree.close()


class _Recorded:
    """What a source without a machine says of it: no driver errors, no pids; the GPUs the
    run used are those its snapshots carried."""

    _seen: set[str]

    @property
    def tree_gpu_uuids(self) -> frozenset[str]:
        return frozenset(self._seen)

    @property
    def invisible_gpu_pids(self) -> frozenset[int]:
        return frozenset()

    @property
    def nvml_errors(self) -> dict[str, int]:
        return {}

    @property
    def known_error_kinds(self) -> tuple[str, ...]:
        return ()

    def close(self) -> None:
        pass


class ReplaySource(_Recorded):
    """A recorded trace played ``speed`` times faster than it was recorded."""

    def __init__(
        self,
        replay: Replay,
        header: TraceHeader,
        *,
        interval_s: float | None = None,
        command: tuple[str, ...] | None = None,
    ) -> None:
        self.replay = replay
        self._header = header
        self.info = SourceInfo(
            gpus=tuple(replay.gpu_identities),
            driver_version=header.driver_version,
            nvml_version=header.nvml_version,
            command=command if command is not None else header.command,
            interval_s=interval_s,
            root_pid=replay.root_pid,
        )
        self._seen: set[str] = set()

    @property
    def gpus(self) -> tuple[GpuIdentity, ...]:
        return self.info.gpus

    def poll(self) -> Polled:
        due, view = self.replay.advance_each()
        for g in view.gpus:
            self._seen.add(g.uuid)
        return Polled(tuple(due), view)

    def header(self, source: str = "gpumon", **extra: Any) -> TraceHeader:
        return self._header

    @property
    def finished(self) -> bool:
        return self.replay.finished

    def now(self) -> float:
        return self.replay.now()

    @property
    def played_s(self) -> float:
        return self.replay.played_s


class FedSource(_Recorded):
    """No machine and no clock: the caller feeds a trace's snapshots to the session
    (``Session.feed``), or ``push``es them to be polled as a live source's would be."""

    def __init__(self, header: TraceHeader) -> None:
        self._header = header
        self.info = SourceInfo(
            gpus=tuple(header.gpus),
            driver_version=header.driver_version,
            nvml_version=header.nvml_version,
            command=header.command,
            interval_s=header.interval_s,
            root_pid=header.watched_pid,
        )
        self._seen: set[str] = set()
        self._last_t = 0.0
        self._queue: deque[Snapshot] = deque()

    @property
    def gpus(self) -> tuple[GpuIdentity, ...]:
        return self.info.gpus

    def push(self, snapshot: Snapshot) -> None:
        """A snapshot for the next poll (a program driving a session from its own stream)."""
        self._queue.append(snapshot)

    def poll(self) -> Polled:
        if not self._queue:
            raise RuntimeError("a fed session has nothing to poll: push() or feed() snapshots")
        snap = self._queue.popleft()
        self.saw(snap)
        return Polled((snap,), snap)

    def saw(self, snapshot: Snapshot) -> None:
        """Note a fed snapshot (which GPUs the run used, how far it reached)."""
        self._last_t = snapshot.t_s
        for g in snapshot.gpus:
            self._seen.add(g.uuid)

    def header(self, source: str = "gpumon", **extra: Any) -> TraceHeader:
        return self._header

    @property
    def finished(self) -> bool:
        return False

    def now(self) -> float:
        return self._last_t

    @property
    def played_s(self) -> float:
        return 0.0


@dataclass(frozen=True, slots=True)
class LiveOptions:
    """What a live source reads and how: one value from the face that asks for a live
    session down to the samplers (it travelled as seven loose keywords through three
    signatures)."""

    pid: int | None = None  # the process tree to watch (None: the node, no tree)
    command: tuple[str, ...] | None = None  # the command to show (None: the pid's own)
    interval_s: float | None = None  # the pace ticks are made for (None: 1 s)
    tree_gpus_only: bool = False  # the GPUs the tree uses, not every GPU seen
    host: bool = True  # the host's CPU, iowait and reads (the dstat columns: not)
    # The first poll hands over the driver's whole sample buffer (~20 s), so the detector
    # can judge at once (the dstat plugin).
    backlog: bool = False
    # The GPUs' hardware health (temperatures, ECC, energy, ...), which nothing but a face
    # shows (the daemon with its hardware group off: not).
    hardware: bool = True


def live_monitor(options: LiveOptions) -> Monitor:
    """NVML + host (+ the tree of ``options.pid``): the samplers of a live source.

    The process tree is opened first, so a wrong pid is reported before NVML starts.
    """
    from gpumon.sample.host import HostSampler, ProcessTreeSampler
    from gpumon.sample.monitor import Monitor
    from gpumon.sample.nvml import NvmlSampler
    from gpumon.sample.outside import OutsideScanner

    o = options
    tree = None if o.pid is None else ProcessTreeSampler(o.pid)
    command = o.command
    if command is None and tree is not None:
        command = tree.cmdline()
    nvml = NvmlSampler(start_s=float("-inf") if o.backlog else None, hardware=o.hardware)
    return Monitor(
        nvml,
        HostSampler() if o.host else None,
        tree,
        tree_gpus_only=o.tree_gpus_only,
        interval_s=o.interval_s,
        command=command,
        # Whose load it is, when the host is busy and a job is watched.
        outside=OutsideScanner() if o.host and tree is not None else None,
    )


def replay_of(
    header: TraceHeader,
    snapshots: Iterable[Snapshot],
    *,
    speed: float,
    live_start_s: float | None,
    interval_s: float | None,
    command: tuple[str, ...] | None,
) -> ReplaySource:
    """A trace as a source played against the clock."""
    from gpumon.sample.replay import Replay

    rp = Replay(snapshots, header=header, speed=speed, live_start_s=live_start_s)
    return ReplaySource(rp, header, interval_s=interval_s, command=command)


def process_tree(root_pid: int, procfs: str = "/proc") -> ProcessTreeSampler:
    """A sampler of one process tree (the job table keeps one per job)."""
    from gpumon.sample.host import ProcessTreeSampler

    return ProcessTreeSampler(root_pid, procfs=procfs)


def check_driver() -> None:
    """Raise ``NoDriverError`` now if no NVIDIA driver can be loaded."""
    from gpumon.sample.nvml import nvml_init

    nvml_init()
