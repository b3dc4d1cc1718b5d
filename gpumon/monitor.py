"""The one place that wires the samplers to the detector.

Faces (record, watch, serve, the dstat plugin) ask a ``Monitor`` for ticks and render
them; none of them talks to NVML or psutil directly, and none re-implements detection.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpumon.model import GpuSample, Snapshot, TraceHeader
from gpumon.traces.jsonl import FORMAT_VERSION

if TYPE_CHECKING:
    from gpumon.detect import Detector, DetectorUpdate
    from gpumon.sample.host import HostSampler, ProcessTreeSampler
    from gpumon.sample.nvml import NvmlSampler


@dataclass(frozen=True, slots=True)
class Tick:
    """What one tick produced: the snapshot and, where a detector runs, its update."""

    snapshot: Snapshot
    update: DetectorUpdate | None = None
    sample_duration_s: float = 0.0


class Monitor:
    """Samples GPUs, host and an optional process tree once per ``tick()``.

    With ``tree_gpus_only`` (``gpumon watch``), a GPU is shown only once a pid of the
    watched tree appears in its NVML process list, and stays shown afterwards: other
    users' GPUs are never reported as this run's.
    """

    def __init__(
        self,
        nvml: NvmlSampler | None,
        host: HostSampler | None = None,
        tree: ProcessTreeSampler | None = None,
        detector: Detector | None = None,
        *,
        tree_gpus_only: bool = False,
        interval_s: float | None = None,
        command: tuple[str, ...] | None = None,
    ) -> None:
        self.nvml = nvml
        self.host = host
        self.tree = tree
        self.detector = detector
        self.tree_gpus_only = tree_gpus_only and tree is not None
        self.interval_s = interval_s
        self.command = command
        self.started_wall_s = time.time()
        self.started_mono_s = time.monotonic()
        self.tree_gpu_uuids: set[str] = set()
        # GPU pids that exist in NVML's lists but not in our /proc: a sign of running in a
        # container without the host PID namespace (NVML reports host pids).
        self.invisible_gpu_pids: set[int] = set()

    def header(self, source: str = "gpumon", **extra: Any) -> TraceHeader:
        from gpumon.sample.host import cpu_count

        nvml = self.nvml
        return TraceHeader(
            version=FORMAT_VERSION,
            source=source,
            hostname=socket.gethostname(),
            started_wall_s=self.started_wall_s,
            started_mono_s=self.started_mono_s,
            interval_s=self.interval_s,
            driver_version=None if nvml is None else nvml.driver_version,
            nvml_version=None if nvml is None else nvml.nvml_version,
            cpu_count=cpu_count(),
            watched_pid=None if self.tree is None else self.tree.root_pid,
            command=self.command,
            gpus=() if nvml is None else nvml.gpus,
            extra=dict(extra),
        )

    def tick(self) -> Tick:
        started = time.monotonic()
        gpus = () if self.nvml is None else self.nvml.sample()
        host = None if self.host is None else self.host.sample()
        tree = None if self.tree is None else self.tree.sample()
        if self.tree_gpus_only and tree is not None:
            gpus = self._tree_gpus(gpus, {p.pid for p in tree.processes})
        t_s = gpus[0].t_s if gpus else (host.t_s if host else time.monotonic())
        snapshot = Snapshot(t_s=t_s, gpus=gpus, host=host, tree=tree)
        duration = time.monotonic() - started
        update = None if self.detector is None else self.detector.update(snapshot)
        return Tick(snapshot=snapshot, update=update, sample_duration_s=duration)

    def _tree_gpus(self, gpus: tuple[GpuSample, ...], tree_pids: set[int]) -> tuple[GpuSample, ...]:
        for g in gpus:
            for p in g.processes or ():
                if p.pid in tree_pids:
                    self.tree_gpu_uuids.add(g.uuid)
                elif len(self.invisible_gpu_pids) < 64 and not os.path.exists(f"/proc/{p.pid}"):
                    self.invisible_gpu_pids.add(p.pid)  # a handful is proof enough: bounded
        return tuple(g for g in gpus if g.uuid in self.tree_gpu_uuids)


class StopFlag:
    """Set by SIGINT/SIGTERM (or a face), polled by the tick loop; restores handlers."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: object) -> None:
        self.signal = signum
        # Not event.set() here: the handler runs in the main thread, which may be holding
        # the event's own (non-reentrant) lock inside wait(); set() would then deadlock.
        threading.Thread(target=self.event.set, name="gpumon-stop", daemon=True).start()

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def __bool__(self) -> bool:
        return self.event.is_set()


def paced(
    interval_s: float,
    stop: threading.Event,
    *,
    duration_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[float]:
    """Yield the monotonic time of each tick, every ``interval_s``, without drift.

    A slow tick does not shift the schedule: missed ticks are skipped, not bunched.
    """
    start = clock()
    deadline = None if duration_s is None else start + duration_s
    next_at = start
    while not stop.is_set():
        now = clock()
        if deadline is not None and now >= deadline:
            return
        yield now
        next_at += interval_s
        now = clock()
        if next_at < now:
            next_at = now + (interval_s - (now - next_at) % interval_s)
        wake = next_at if deadline is None else min(next_at, deadline)
        if stop.wait(max(0.0, wake - now)):
            return
