"""When, and whose, Python stacks a live session reads (``watch --stacks``, serve's
``[stacks]``).

Only while a GPU waits: a GPU in a starved or sync-stall episode, idle with its memory
held after work (a long pause), or in a gap right now.  A healthy job is never read.

Whose: the processes that drive the GPUs (the one on a GPU is the main process, several
are ranks; where NVML lists none of the job's, the watched root is the main process) and
their descendants, the DataLoader workers.  A launcher above the ranks (torchrun's agent)
is left out.  Workers of one loader run the same code: a couple per main process stand
for all, taken in turn window after window, so a stuck one is still seen.

How much: windows of ``every_s`` seconds whose process count and sampling rate are sized
from py-spy's measured cost (``sample/stacks.py``) to stay within ``budget`` of one core,
py-spy's CPU and gpumon's own for the stacks together.  py-spy costs what the machine
makes it cost (a loaded or slower host, a deeper stack), so each window's real cost is
measured as it ends -- py-spy's CPU from ``RUSAGE_CHILDREN`` once its processes are
reaped, gpumon's from its own clock while it gathers them -- and the next windows are
sized by what the last ones really cost against the model (``StackWatch.cost_scale``).
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpumon.errors import StacksRefusedError, StacksUnavailableError
from gpumon.model import Episode, ProcessRole, ProcTreeSample, Reason, Snapshot, StackSample, State
from gpumon.sample.stacks import (
    ATTACH_CPU_S,
    INSTALL_HINT,
    MAX_RATE_HZ,
    SAMPLE_CPU_S,
    Target,
    find_py_spy,
)

if TYPE_CHECKING:
    from gpumon.sample.stacks import StackSampler

log = logging.getLogger("gpumon")
_WAITING_STATES = (State.STARVED, State.SYNC_STALL)
_HELD_IDLE = (Reason.MEMORY_HELD, Reason.NO_WORK)


@dataclass(frozen=True, slots=True)
class StackOptions:
    """How a live session reads the job's stacks."""

    every_s: float = 10.0  # one window: stacks arrive this often while a GPU waits
    budget: float = 0.02  # py-spy's CPU while it reads, as a share of one core
    workers_per_main: int = 2
    py_spy: str | None = None  # the py-spy binary (found beside gpumon, else on PATH)


@dataclass(frozen=True, slots=True)
class Plan:
    """One window: which processes, how often each is sampled."""

    targets: tuple[tuple[int, ProcessRole], ...]
    rate_hz: int
    seconds: int


def roles(trees: Iterable[ProcTreeSample], gpu_pids: Iterable[int]) -> dict[int, ProcessRole]:
    """Each process of the job with what it is for (module docstring); processes that
    drive no GPU and descend from none that does (a launcher) are not in it."""
    parent: dict[int, int | None] = {}
    roots: list[int] = []
    for tree in trees:
        roots.append(tree.root_pid)
        for p in tree.processes:
            parent[p.pid] = p.ppid
    on_gpu = sorted(set(gpu_pids))
    drivers = [p for p in on_gpu if p in parent] or (on_gpu if not parent else [])
    if not drivers:
        drivers = [r for r in roots if r in parent]
    role = ProcessRole.RANK if len(drivers) >= 2 else ProcessRole.MAIN
    out = dict.fromkeys(drivers, role)
    for pid in parent:
        if pid in out:
            continue
        seen: set[int] = set()
        up = parent.get(pid)
        while up is not None and up not in seen:
            if up in out and out[up] is not ProcessRole.WORKER:
                out[pid] = ProcessRole.WORKER
                break
            seen.add(up)
            up = parent.get(up)
    return out


def plan(
    found: Mapping[int, ProcessRole],
    options: StackOptions,
    turn: int = 0,
    skip: Iterable[int] = (),
    cost_scale: float = 1.0,
) -> Plan | None:
    """The processes of one window and their rate, within the budget: every driver
    first, then ``workers_per_main`` workers each (the ``turn``-th in rotation); as many
    as py-spy's model says leave each a rate of at least 2 samples a second.
    ``cost_scale``: what windows have really cost against that model (2: twice as much):
    the rate those processes are read at is what the budget allows at that real cost, at
    least 2 samples a second (the few processes that say what the job does are always
    read: a window too short or a machine too slow for the budget is read slowly, not
    left unread)."""
    left_out = set(skip)
    seconds = max(1, round(options.every_s))
    per_process = ATTACH_CPU_S / seconds + 2 * SAMPLE_CPU_S
    most = max(1, int(options.budget / per_process))
    drivers = [p for p, r in sorted(found.items()) if r is not ProcessRole.WORKER]
    drivers = [p for p in drivers if p not in left_out]
    workers = [p for p, r in sorted(found.items()) if r is ProcessRole.WORKER]
    workers = [p for p in workers if p not in left_out]
    chosen = drivers[:most]
    want = options.workers_per_main * max(1, len(chosen))
    if workers and want:
        k = turn * want % len(workers)
        rotated = workers[k:] + workers[:k]
        chosen += rotated[: max(0, min(want, most - len(chosen)))]
    if not chosen:
        return None
    attach_s, sample_s = ATTACH_CPU_S * cost_scale, SAMPLE_CPU_S * cost_scale
    rate = (options.budget / len(chosen) - attach_s / seconds) / sample_s
    rate_hz = max(2, min(MAX_RATE_HZ, int(rate)))
    return Plan(tuple((p, found[p]) for p in chosen), rate_hz, seconds)


def modelled_cpu_s(p: Plan) -> float:
    """CPU seconds a window should cost by py-spy's modelled cost."""
    return len(p.targets) * (ATTACH_CPU_S + SAMPLE_CPU_S * p.rate_hz * p.seconds)


def _children_cpu_s() -> float:
    """CPU seconds of this process's reaped children (py-spy's, once a window ends)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def waiting(snap: Snapshot, episodes: Mapping[int | None, Episode], busy_util_pct: float) -> bool:
    """A GPU of the run waits: in a starved or sync-stall episode, idle with memory held
    after work, or in a gap now (its latest driver sample below the busy line) once it
    has worked."""
    for key, ep in episodes.items():
        if key is None:
            continue
        if ep.state in _WAITING_STATES or (ep.state is State.IDLE and ep.reason in _HELD_IDLE):
            return True
    for g in snap.gpus:
        now = episodes.get(g.gpu)
        if now is None or now.state is State.IDLE:
            continue  # starting up, or nothing runs on it
        latest = g.util_samples[-1][1] if g.util_samples else g.util_pct
        if latest is not None and latest < busy_util_pct:
            return True
    return False


def check_stacks(py_spy: str | None = None) -> None:
    """Raise ``StacksUnavailableError`` if py-spy cannot be found."""
    if py_spy is None and find_py_spy() is None:
        raise StacksUnavailableError(
            f"--stacks needs py-spy, which is not installed here: {INSTALL_HINT}."
        )


class StackWatch:
    """Reads the job's stacks while its GPUs wait; never blocks a tick on py-spy."""

    def __init__(
        self, options: StackOptions, busy_util_pct: float, sampler: StackSampler | None = None
    ) -> None:
        if sampler is None:
            from gpumon.sample.stacks import StackSampler

            sampler = StackSampler(options.py_spy)
        self.options = options
        self.busy_util_pct = busy_util_pct
        self.sampler = sampler
        self.refusal: str | None = None  # the one sentence said when stacks were refused
        self._turn = 0
        # What the windows so far really cost against the model (1: as modelled), and the
        # window being recorded: its modelled CPU and what it has cost so far.  Before
        # the first is measured, twice the model: py-spy measured 1.3x its model on a quiet
        # machine, 1.8x on a loaded one, and the first window must not overrun the budget.
        self.cost_scale = 2.0
        self._windows_seen = 0
        self._window: tuple[float, float] | None = None

    @property
    def off(self) -> bool:
        return self.sampler.off

    def read(
        self,
        snap: Snapshot,
        trees: Sequence[ProcTreeSample],
        episodes: Mapping[int | None, Episode],
    ) -> tuple[StackSample, ...]:
        """The samples of windows that ended; a new window when none runs and a GPU waits."""
        children0, own0 = _children_cpu_s(), time.process_time()
        try:
            got = self.sampler.collect()
        except StacksRefusedError as exc:
            self.refusal = str(exc)
            log.warning("%s", exc)
            got = []
        self._account(_children_cpu_s() - children0 + time.process_time() - own0)
        if self.sampler.off or self.sampler.busy:
            return tuple(got)
        if not waiting(snap, episodes, self.busy_util_pct):
            return tuple(got)
        gpu_pids = [p.pid for g in snap.gpus for p in g.processes or ()]
        found = roles(trees, gpu_pids)
        skip = [p for p in found if self.sampler.skip(p)]
        chosen = plan(found, self.options, self._turn, skip, self.cost_scale)
        if chosen is not None:
            self._turn += 1
            try:
                targets = [Target(pid, role) for pid, role in chosen.targets]
                if self.sampler.start(targets, rate_hz=chosen.rate_hz, seconds=chosen.seconds):
                    self._window = (modelled_cpu_s(chosen), 0.0)
            except StacksUnavailableError as exc:
                self.refusal = str(exc)
                log.warning("%s", exc)
        return tuple(got)

    def _account(self, spent_s: float) -> None:
        """Add what gathering cost to the window being recorded; once it has ended (its
        py-spy processes reaped), learn how its real cost compares with the model's."""
        if self._window is None:
            return
        modelled, so_far = self._window
        so_far += spent_s
        if self.sampler.busy:
            self._window = (modelled, so_far)
            return
        self._window = None
        if modelled > 0 and so_far > 0:
            seen = min(20.0, max(0.25, so_far / modelled))
            self.cost_scale = seen if self._windows_seen == 0 else 0.5 * (self.cost_scale + seen)
            self._windows_seen += 1

    def close(self) -> None:
        self.sampler.close()
