"""Timing for shared, noisy machines: contenders measured in the same run, interleaved.

Each round runs one batch of every contender, in an order that rotates from round to
round (so none always runs first, after the cache-cold gap, or last); each batch records
wall-clock and process CPU time per call.  Figures are medians over rounds, and a ratio
is the median of the per-round ratios: two batches a few milliseconds apart see the same
machine load, so the ratio survives noise that moves the absolute figures by 2x.

Process CPU time (``time.process_time``: every thread of this process, user + system)
leaves out the time the process sat waiting for a core, which on an oversubscribed box is
most of the wall-clock noise; it is also what a monitor costs the node it runs on.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

#: A benchmark's exit status when it ran to its table and missed a target; any other
#: non-zero status means it did not run through (a crash: Python exits 1 on one), and
#: ``run_all.py`` says which.
EXIT_MISSED = 3


def exit_status(ok: bool) -> int:
    """0 when every target was met, ``EXIT_MISSED`` when one was not."""
    return 0 if ok else EXIT_MISSED


def machine_load() -> str:
    """The machine's load as ``uptime`` prints it, with its CPU count: every figure is
    reported with it (a shared 2-core machine at load 6 is not a quiet one)."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} CPUs"


def say_load(when: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {when}: {machine_load()}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Timing:
    """Per-call medians over rounds of one contender (microseconds)."""

    wall_us: float
    cpu_us: float
    walls: tuple[float, ...]
    cpus: tuple[float, ...]


def batch_us(fn: Callable[[], object], per_batch: int) -> tuple[float, float]:
    """(wall, CPU) microseconds per call of ``fn`` over one batch."""
    cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
    for _ in range(per_batch):
        fn()
    wall1, cpu1 = time.perf_counter_ns(), time.process_time_ns()
    return (wall1 - wall0) / per_batch / 1000.0, (cpu1 - cpu0) / per_batch / 1000.0


def interleaved(
    contenders: Mapping[str, Callable[[], object]],
    *,
    rounds: int,
    per_batch: int | Mapping[str, int],
    warmup: int = 3,
) -> dict[str, Timing]:
    """Time every contender in rotating order, ``rounds`` batches each, after a warm-up.

    ``per_batch`` may differ per contender (a slow one needs fewer calls per batch).
    """
    names = list(contenders)
    sizes = {n: per_batch if isinstance(per_batch, int) else per_batch[n] for n in names}
    for name in names:  # warm-up: caches filled, first-call costs paid, not timed
        for _ in range(warmup):
            contenders[name]()
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            wall, cpu = batch_us(contenders[name], sizes[name])
            walls[name].append(wall)
            cpus[name].append(cpu)
    return {
        n: Timing(
            wall_us=statistics.median(walls[n]),
            cpu_us=statistics.median(cpus[n]),
            walls=tuple(walls[n]),
            cpus=tuple(cpus[n]),
        )
        for n in names
    }


@dataclass
class Ticks:
    """One contender's calls at a real cadence: CPU and wall microseconds of each call,
    and of its parts where the contender times them (``part``)."""

    cpus: list[float] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=dict)

    def run_means(self, runs: int, values: Sequence[float] | None = None) -> list[float]:
        """The mean of each of ``runs`` consecutive runs of calls: a mean, so what comes
        every few calls (a scan every 5 s, health readings every 10 s) is counted."""
        vals = list(self.cpus if values is None else values)
        runs = max(1, min(runs, len(vals)))
        size = len(vals) // runs
        return [statistics.fmean(vals[i * size : (i + 1) * size]) for i in range(runs)]

    def figure(self, runs: int, part: str | None = None) -> float:
        """Median over runs of the mean CPU microseconds per call (of one part)."""
        vals = self.cpus if part is None else self.parts.get(part, [0.0] * len(self.cpus))
        return statistics.median(self.run_means(runs, vals))

    def spread(self, runs: int, part: str | None = None) -> tuple[float, float]:
        vals = self.cpus if part is None else self.parts.get(part, [0.0] * len(self.cpus))
        means = self.run_means(runs, vals)
        return min(means), max(means)


class Parts:
    """Process CPU time of the parts of one call, timed where they run (``timed``):
    wrappers put around a sampler's methods, so a tick's NVML, host, tree and judging
    parts are measured inside the very tick that is timed whole."""

    def __init__(self) -> None:
        self.now: dict[str, float] = {}

    def timed(self, name: str, fn: Callable[..., object]) -> Callable[..., object]:
        clock = time.process_time_ns
        now = self.now

        def wrapper(*args: object, **kwargs: object) -> object:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                now[name] = now.get(name, 0.0) + (clock() - t0) / 1000.0

        return wrapper

    def take(self) -> dict[str, float]:
        out = dict(self.now)
        self.now.clear()
        return out


def children_cpu_s() -> float:
    """CPU seconds of this process's children that have been waited for (py-spy's)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def at_cadence(
    contenders: Mapping[str, Callable[[], object]],
    *,
    calls: int,
    period_s: float = 1.0,
    warmup: int = 2,
    parts: Mapping[str, Parts] | None = None,
) -> dict[str, Ticks]:
    """Call each contender once every ``period_s``, as a daemon's loop calls its tick,
    ``calls`` times after ``warmup`` untimed calls; the CPU and wall time of each call.

    Within a period the contenders take evenly spaced slots in an order that rotates
    from period to period, and the process sleeps in between: each call finds its caches
    as cold as a 1 Hz tick finds them (other processes ran meanwhile), reads the driver
    samples of a real second, and runs its periodic work (a scan every 5 s) when it falls
    due.  CPU time is the process's (``time.process_time``, every thread: user + system)
    plus its waited-for children's, so it leaves out the wait for a core.
    """
    names = list(contenders)
    slot = period_s / len(names)
    out = {n: Ticks() for n in names}
    start = time.monotonic()
    for k in range(warmup + calls):
        r = k % len(names)
        for i, name in enumerate(names[r:] + names[:r]):
            due = start + k * period_s + i * slot
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            timer = None if parts is None else parts.get(name)
            if timer is not None:
                timer.take()
            c0, w0, k0 = time.process_time_ns(), time.perf_counter_ns(), children_cpu_s()
            contenders[name]()
            w1, c1, k1 = time.perf_counter_ns(), time.process_time_ns(), children_cpu_s()
            if k < warmup:
                continue
            ticks = out[name]
            ticks.cpus.append((c1 - c0) / 1000.0 + (k1 - k0) * 1e6)
            ticks.walls.append((w1 - w0) / 1000.0)
            if timer is not None:
                for part, us in timer.take().items():
                    ticks.parts.setdefault(part, [0.0] * (len(ticks.cpus) - 1)).append(us)
                for values in ticks.parts.values():
                    if len(values) < len(ticks.cpus):
                        values.append(0.0)
    return out


def run_ratio(num: Ticks, den: Ticks, runs: int, part: str | None = None) -> float:
    """Median over runs of (num's mean / den's mean): both called in the same seconds
    (``part``: of that part of num's calls)."""
    nums = num.run_means(runs, None if part is None else num.parts.get(part, []))
    pairs = zip(nums, den.run_means(runs), strict=True)
    return statistics.median(a / b for a, b in pairs if b > 0)


@dataclass(frozen=True)
class Cadence:
    """How long a benchmark runs at its cadence: calls a contender, runs they are cut
    into (a figure is the median of the runs' means), seconds between calls."""

    calls: int
    runs: int
    period_s: float


def add_modes(parser: argparse.ArgumentParser, quick_help: str) -> None:
    """``--quick`` and ``--smoke`` (every benchmark has both; run_all passes either)."""
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help=quick_help)
    mode.add_argument("--smoke", action="store_true", help="every figure once, numbers moot")


def cadence_of(
    args: argparse.Namespace, *, full: tuple[int, int], quick: tuple[int, int]
) -> Cadence:
    """(calls, runs) of the full or quick run, a second apart; a smoke run makes 3 calls
    50 ms apart (only to prove every figure is produced)."""
    if args.smoke:
        return Cadence(3, 1, 0.05)
    calls, runs = quick if args.quick else full
    return Cadence(calls, runs, 1.0)


def ratio(num: Timing, den: Timing | tuple[Timing, ...], *, cpu: bool = True) -> float:
    """Median over rounds of num / den (den: the per-round minimum of several)."""
    dens = den if isinstance(den, tuple) else (den,)
    pick = (lambda t: t.cpus) if cpu else (lambda t: t.walls)
    per_round = [
        a / min(bs)
        for a, *bs in zip(pick(num), *(pick(d) for d in dens), strict=True)
        if min(bs) > 0
    ]
    return statistics.median(per_round) if per_round else float("nan")


def table(rows: list[tuple[str, str, str, str, str, str]]) -> str:
    """The compact results table every benchmark prints last."""
    head = ("figure", "gpumon", "baseline", "ratio", "target", "pass")
    allrows = [head, *rows]
    widths = [max(len(r[i]) for r in allrows) for i in range(len(head))]
    lines = []
    for i, r in enumerate(allrows):
        cells = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


class OneHertz:
    """Makes back-to-back gpumon ticks cost what ticks one second apart cost.

    gpumon's modules see a monotonic clock that gains one second per tick, and before each
    tick every GPU's sample-buffer and process-utilisation cursors move back one second,
    so each tick reads a second of driver samples (mapped onto the advancing clock, so the
    detector sees a coherent 1 Hz stream) and the detector runs its 1 Hz schedule.

    Several contenders, each with its own samplers, each get their own ``OneHertz``: the
    clock gpumon's modules see is the real one plus the offset of the one that stepped
    last, so each contender's ticks are one second apart on its own clock whatever the
    others did in between (a shared clock would give each stream holes).  Every contender
    that reads the clock (a host sampler's rates too) needs its own, stepped before each
    call: the clock moves back when another contender's is further ahead.
    """

    _active: OneHertz | None = None

    def __init__(self, samplers: object, modules: list[types.ModuleType]) -> None:
        self.offset_s = 0.0
        self._samplers = list(samplers) if isinstance(samplers, list | tuple) else [samplers]
        self._modules = modules

    @staticmethod
    def _now() -> float:
        active = OneHertz._active
        return _REAL_MONOTONIC() + (0.0 if active is None else active.offset_s)

    @contextmanager
    def installed(self) -> Iterator[OneHertz]:
        """gpumon's modules read the stepped clock inside (nesting is fine)."""
        saved = [m.time for m in self._modules]  # type: ignore[attr-defined]
        for m in self._modules:
            m.time = _CLOCK  # type: ignore[attr-defined]
        try:
            yield self
        finally:
            for m, t in zip(self._modules, saved, strict=True):
                m.time = t  # type: ignore[attr-defined]

    def step(self) -> None:
        OneHertz._active = self
        self.offset_s += 1.0
        for sampler in self._samplers:
            for st in sampler._gpus:  # type: ignore[attr-defined]
                if st.last_sample_ts_us:
                    st.last_sample_ts_us -= 1_000_000
                if st.last_proc_ts_us:
                    st.last_proc_ts_us -= 1_000_000


_REAL_MONOTONIC = time.monotonic
_CLOCK = types.ModuleType("time")
_CLOCK.__dict__.update(time.__dict__)
_CLOCK.monotonic = OneHertz._now  # type: ignore[attr-defined]


def nvml_sampler_of(session: object) -> object:
    """The NVML sampler a live ``gpumon.engine.Session`` built (its cursors are moved back
    by ``OneHertz``; a benchmark may reach where a face may not)."""
    monitor = session.source.monitor  # type: ignore[attr-defined]
    assert monitor is not None and monitor.nvml is not None, "a live session with NVML"
    return monitor.nvml


#: gpumon's modules that read the monotonic clock while sampling (OneHertz patches them).
def clock_modules() -> list[types.ModuleType]:
    import gpumon.engine.sources
    import gpumon.sample.host
    import gpumon.sample.monitor
    import gpumon.sample.nvml

    return [gpumon.sample.monitor, gpumon.sample.host, gpumon.sample.nvml, gpumon.engine.sources]
