"""--stacks stays within its budget where py-spy costs more than its model says: each
window's real cost (py-spy's CPU once reaped, gpumon's while gathering) sizes the next."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

from gpumon.engine.stacks import StackOptions, StackWatch, modelled_cpu_s, plan
from gpumon.model import ProcessRole
from gpumon.sample.stacks import ATTACH_CPU_S, SAMPLE_CPU_S

MAIN, WORKER = ProcessRole.MAIN, ProcessRole.WORKER
FOUND = {1: MAIN, **{p: WORKER for p in range(2, 10)}}  # a main process and 8 workers


def cost(p: object, scale: float) -> float:
    """CPU share of one core a window of ``p`` takes where py-spy costs ``scale`` x its
    model."""
    return modelled_cpu_s(p) * scale / p.seconds  # type: ignore[attr-defined]


def test_a_costlier_py_spy_is_read_less_often_within_the_same_budget() -> None:
    options = StackOptions(every_s=10.0)
    as_modelled = plan(FOUND, options)
    assert as_modelled is not None and cost(as_modelled, 1.0) <= options.budget
    for scale in (1.5, 2.0):
        dearer = plan(FOUND, options, cost_scale=scale)
        assert dearer is not None and cost(dearer, scale) <= options.budget
        assert dearer.rate_hz < as_modelled.rate_hz  # fewer samples
        assert dearer.targets == as_modelled.targets  # the same processes
    # Far dearer than the budget allows: the same few processes, at the least rate (read
    # slowly, never left unread).
    slowest = plan(FOUND, options, cost_scale=6.0)
    assert slowest is not None and slowest.targets == as_modelled.targets
    assert slowest.rate_hz == 2
    cheaper = plan(FOUND, options, cost_scale=0.5)
    assert cheaper is not None and cheaper.rate_hz >= as_modelled.rate_hz
    assert modelled_cpu_s(as_modelled) == len(as_modelled.targets) * (
        ATTACH_CPU_S + SAMPLE_CPU_S * as_modelled.rate_hz * as_modelled.seconds
    )


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Recorder:
    """A sampler whose windows are real child processes that cost ``scale`` times what the
    model says a window costs, reaped by ``collect`` as py-spy's are."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.procs: list[subprocess.Popen[bytes]] = []
        self.off = False
        self.windows = 0
        before = children_cpu_s()
        subprocess.run([sys.executable, "-S", "-c", "pass"], check=True)
        self.startup_s = children_cpu_s() - before  # a child's own start, burning nothing

    @property
    def busy(self) -> bool:
        return bool(self.procs)

    def skip(self, pid: int) -> bool:
        return False

    def start(self, targets: list[object], *, rate_hz: int, seconds: int) -> int:
        each = self.scale * (ATTACH_CPU_S + SAMPLE_CPU_S * rate_hz * seconds) - self.startup_s
        code = f"import time\nend = time.process_time() + {max(0.0, each)}\n"
        code += "while time.process_time() < end: pass\n"
        self.procs = [subprocess.Popen([sys.executable, "-S", "-c", code]) for _ in targets]
        self.windows += 1
        return len(targets)

    def collect(self) -> list[object]:
        if all(p.poll() is not None for p in self.procs):
            self.procs = []
        return []

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def test_the_watch_learns_what_a_window_really_costs() -> None:
    """Windows that cost ~4x the model make the next ones sparser than the first."""
    from gpumon.model import (
        Episode,
        GpuProcess,
        GpuSample,
        ProcessSample,
        ProcTreeSample,
        Snapshot,
        State,
    )

    options = StackOptions(every_s=10.0)
    first = plan({os.getpid(): MAIN}, options, cost_scale=2.0)  # (unmeasured: 2x the model)
    assert first is not None
    sampler = Recorder(scale=4.0)
    watch = StackWatch(options, 50.0, sampler=sampler)  # type: ignore[arg-type]
    me = ProcessSample(os.getpid(), 1, "python", 50.0, 1, None, None, "running")
    tree = ProcTreeSample(0.0, os.getpid(), (me,))
    snap = Snapshot(0.0, (GpuSample(0.0, 0, "GPU-0", processes=(GpuProcess(os.getpid()),)),))
    waiting = {
        0: Episode(gpu=0, uuid="GPU-0", state=State.STARVED, cause=None, start_s=0.0, end_s=None)
    }
    try:
        watch.read(snap, [tree], waiting)  # the first window, sized by the model
        assert sampler.busy and watch.cost_scale == 2.0
        deadline = time.monotonic() + 60
        while sampler.windows < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
            watch.read(snap, [tree], waiting)  # gathers each once reaped, starts the next
        assert 3.0 <= watch.cost_scale <= 5.5, watch.cost_scale
        second = plan({os.getpid(): MAIN}, options, cost_scale=watch.cost_scale)
        assert second is not None and second.rate_hz < first.rate_hz
    finally:
        watch.close()
