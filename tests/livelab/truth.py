"""Ground truth: what a lab workload did, second by second, and the state that makes it.

Each training process (one per rank, each on its own GPU) keeps a ``TruthLog``: the GPU
activity it caused (from its ``EmulatedDevice``: compute and spin intervals) and what its
main process waited on when it was not feeding the GPU (``waiting("loader_cpu")`` around
``next(loader)``, ...).  Every completed second becomes one JSON line::

    {"t": 12345.0, "gpu": 0, "rank": 0, "phase": "starved-cpu", "compute": 0.41,
     "spin": 0.0, "wait": {"loader_cpu": 0.55}, "design": {"state": "starved", ...}}

and each phase ends with a ``phase_end`` line whose ``label`` is the state its measured
activity makes, by the rules of ``derive`` (a person could state them):

- no context on the GPU: **idle** (no process); a GPU busy under 5 % of the phase: **idle**
  (memory held, or no work);
- spinning at a barrier at least 25 % of the phase: **sync_stall** (busy-wait); the rank
  the others wait on (last at the barrier in most steps, hardly spinning): **sync_stall**
  (straggler) -- gpumon's vocabulary for both;
- computing at least 85 % of the phase: **healthy**;
- otherwise **starved**, caused by what the main process waited on most: workers busy
  building batches (``loader_cpu``) or starting up (``worker_start``): ``cpu``; the main
  process building them itself (``main_cpu``): ``gil``; reads or writes to disk
  (``loader_io``, ``checkpoint``): ``io``; something outside the job (``remote``):
  ``unknown``.

A phase is designed to be one of these, far from the lines; ``phase_end`` says whether the
measured label matches the design (``valid``), so a phase that an overloaded machine kept
from doing what it was designed to do is reported, not scored as if it had.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from livelab.emulator import COMPUTE, SPIN, EmulatedDevice

#: What the main process waited on -> the starvation cause it makes.
WAIT_CAUSE = {
    "loader_cpu": "cpu",
    "worker_start": "cpu",
    "main_cpu": "gil",
    "loader_io": "io",
    "checkpoint": "io",
    "remote": "unknown",
}

IDLE_BUSY = 0.05
SPIN_STALL = 0.25
HEALTHY_COMPUTE = 0.85


@dataclass(frozen=True)
class Label:
    """A state in gpumon's vocabulary: state, cause (starved only), reason."""

    state: str
    cause: str | None = None
    reason: str | None = None


@dataclass
class PhaseTotals:
    """What one rank measured over one phase."""

    seconds: float = 0.0
    compute_s: float = 0.0
    spin_s: float = 0.0
    waits: dict[str, float] | None = None
    has_context: bool = True
    mem_held: bool = False
    barriers: int = 0
    last_at_barrier: int = 0


def derive(p: PhaseTotals) -> Label:
    """The state a phase's measured activity makes (the module docstring's rules)."""
    dur = max(p.seconds, 1e-9)
    compute, spin = p.compute_s / dur, p.spin_s / dur
    if not p.has_context:
        return Label("idle", None, "no process")
    if compute + spin < IDLE_BUSY:
        return Label("idle", None, "memory allocated, no work" if p.mem_held else "no work")
    if p.barriers and p.last_at_barrier >= 0.8 * p.barriers and spin < 0.1:
        return Label("sync_stall", None, "straggler")
    if spin >= SPIN_STALL:
        return Label("sync_stall", None, "busy-wait")
    if compute >= HEALTHY_COMPUTE:
        return Label("healthy")
    waits = p.waits or {}
    why = max(waits, key=lambda k: waits[k]) if waits else None
    return Label("starved", WAIT_CAUSE.get(why or "", "unknown"))


class TruthLog:
    """One rank's truth: per-second lines and per-phase labels, appended to ``path``."""

    def __init__(self, path: Path, dev: EmulatedDevice | None, gpu: int, rank: int = 0) -> None:
        self.path = Path(path)
        self.dev = dev
        self.gpu, self.rank = gpu, rank
        self._f = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        self._pid = os.getpid()
        self._waits: list[tuple[int, int, str]] = []  # (start_ns, end_ns, reason)
        self._next_s: int | None = None  # the next whole second to write
        self._phase: str | None = None
        self._design: Label | None = None
        self._phase_start_ns = 0
        self._acc_ns = 0  # the phase's totals hold everything before this instant
        self._totals = PhaseTotals()
        self.mem_held = False
        self.has_context = True

    # --- what the loop says ----------------------------------------------------------------

    def event(self, event: str, **fields: Any) -> None:
        self._write(
            {"event": event, "t": time.monotonic(), "gpu": self.gpu, "rank": self.rank, **fields}
        )

    def phase(self, name: str, design: Label) -> None:
        """A new phase begins now (the previous one ends)."""
        now = time.monotonic_ns()
        self.tick(now)
        self.end_phase(now)
        self._phase, self._design = name, design
        self._phase_start_ns = self._acc_ns = now
        self._totals = PhaseTotals(waits={})
        if self._next_s is None:
            self._next_s = now // 1_000_000_000
        self.event("phase_start", phase=name, design=asdict(design), t=now * 1e-9)

    @contextmanager
    def waiting(self, reason: str) -> Iterator[None]:
        """The main process waits on ``reason`` (its GPU waits with it, unless queued)."""
        start = time.monotonic_ns()
        try:
            yield
        finally:
            self._waits.append((start, time.monotonic_ns(), reason))

    def barrier(self, last: bool) -> None:
        self._totals.barriers += 1
        self._totals.last_at_barrier += int(last)

    # --- writing ---------------------------------------------------------------------------

    def _shares(self, a: int, b: int) -> tuple[float, float, dict[str, float]]:
        compute = spin = 0.0
        if self.dev is not None:
            compute = self.dev.busy_between(a, b, COMPUTE)
            spin = self.dev.busy_between(a, b, SPIN)
        waits: dict[str, float] = {}
        for s, e, why in self._waits:
            lo, hi = max(s, a), min(e, b)
            if hi > lo:
                waits[why] = waits.get(why, 0.0) + (hi - lo) * 1e-9
        return compute, spin, waits

    def _account(self, a: int, b: int) -> None:
        compute, spin, waits = self._shares(a, b)
        t = self._totals
        t.seconds += (b - a) * 1e-9
        t.compute_s += compute
        t.spin_s += spin
        assert t.waits is not None
        for k, v in waits.items():
            t.waits[k] = t.waits.get(k, 0.0) + v

    def tick(self, now_ns: int | None = None) -> None:
        """Write every second completed since the last call (call it often: each step)."""
        if os.getpid() != self._pid or self._next_s is None or self._phase is None:
            return
        now = time.monotonic_ns() if now_ns is None else now_ns
        self._account(self._acc_ns, now)
        self._acc_ns = now
        while (self._next_s + 1) * 1_000_000_000 <= now:
            a = self._next_s * 1_000_000_000
            b = a + 1_000_000_000
            compute, spin, waits = self._shares(a, b)
            self._write(
                {
                    "t": float(self._next_s),
                    "gpu": self.gpu,
                    "rank": self.rank,
                    "phase": self._phase,
                    "compute": round(compute, 3),
                    "spin": round(spin, 3),
                    "wait": {k: round(v, 3) for k, v in waits.items()},
                    "design": asdict(self._design) if self._design else None,
                }
            )
            self._next_s += 1
        self._prune(min(self._acc_ns, self._next_s * 1_000_000_000))

    def _prune(self, before_ns: int) -> None:
        if self._waits and self._waits[0][1] < before_ns:
            self._waits = [w for w in self._waits if w[1] >= before_ns]
        if self.dev is not None and self.dev.intervals and self.dev.intervals[0][1] < before_ns:
            self.dev.intervals = [iv for iv in self.dev.intervals if iv[1] >= before_ns]

    def end_phase(self, now_ns: int | None = None) -> None:
        """Close the current phase: its measured totals and the label they make."""
        if self._phase is None or os.getpid() != self._pid:
            return
        now = time.monotonic_ns() if now_ns is None else now_ns
        self._account(self._acc_ns, now)
        self._acc_ns = now
        tot = self._totals
        tot.has_context, tot.mem_held = self.has_context, self.mem_held
        label = derive(tot)
        design = self._design
        valid = design is not None and (label.state, label.cause) == (design.state, design.cause)
        self._write(
            {
                "event": "phase_end",
                "t": now * 1e-9,
                "start": self._phase_start_ns * 1e-9,
                "gpu": self.gpu,
                "rank": self.rank,
                "phase": self._phase,
                "design": asdict(design) if design else None,
                "label": asdict(label),
                "valid": valid,
                "measured": {
                    "seconds": round(tot.seconds, 3),
                    "compute": round(tot.compute_s / max(tot.seconds, 1e-9), 3),
                    "spin": round(tot.spin_s / max(tot.seconds, 1e-9), 3),
                    "waits": {k: round(v, 3) for k, v in (tot.waits or {}).items()},
                    "barriers": tot.barriers,
                    "last_at_barrier": tot.last_at_barrier,
                },
            }
        )
        self._phase = None

    def close(self) -> None:
        now = time.monotonic_ns()
        self.tick(now)
        self.end_phase(now)
        self.event("exit")
        self._f.close()

    def _write(self, record: dict[str, Any]) -> None:
        if os.getpid() == self._pid:
            self._f.write(json.dumps(record, separators=(",", ":")) + "\n")


def read_truth(path: Path) -> list[dict[str, Any]]:
    """Every line of a truth file (a cut last line is skipped)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
