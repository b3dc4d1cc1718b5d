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

import statistics
import time
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass


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
