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
  ``unknown``.  A job held back by processes outside it is ``contention``, whatever it
  waited on: the job's processes waited on the run queue at least 30 % of the time they
  wanted a CPU (schedstat), and for at least a tenth of the time its main process waited,
  while processes outside the job used at least 60 % of the machine (a job that sleeps
  on a remote source wants so little CPU that what it waits for it is no part of its GPU's
  wait; workers whose reads come back to a CPU they wait for are slowed by the CPUs as
  much as by the disk); with them between 40 and 60 % the truth cannot tell
  (``ambiguous``: the phase is not scored);
- every rank spinning and none computing (a phase of nothing but spin): **sync_stall**
  (hang) once the spinning has gone on, without a step computed, for ``HANG_AFTER_S``
  when the phase begins -- the threshold every face is given (watch's ``--hang-after``,
  serve's ``[detector] hang_after_s``; analyze reads it from watch's recording) -- and
  before that **sync_stall** (busy-wait): a wait that may still end.

Twice a second a ``cpu`` line records the CPU the job ran and waited for and the machine's
busy CPU since the last: the load on a shared machine comes and goes within a phase, and
the scorer tells the seconds other processes held the job back (by ``held_back``, the rule
above, over a few seconds) from the rest.

A phase is designed to be one of these, far from the lines; ``phase_end`` says whether the
measured label matches the design (``valid``), so a phase that an overloaded machine kept
from doing what it was designed to do is reported, not scored as if it had (contention
matches a CPU-bound design: whose the CPUs were is the machine's doing; an I/O-bound phase
it turned into contention is reported).
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

#: Seconds every rank spins, none computing, before the run is a hang: the lab gives every
#: face this threshold (the least they take), so that a phase of minutes can show one.
HANG_AFTER_S = 10.0
#: A phase starts within this of the threshold it was designed to start at.
HANG_AFTER_SLACK_S = 1.0

IDLE_BUSY = 0.05
SPIN_STALL = 0.25
HEALTHY_COMPUTE = 0.85
CONTENDED_WAIT = 0.3  # share of its wanted CPU time the job spent on the run queue
CONTENDED_OF_WAITS = 0.1  # ... and that queueing against the time its main process waited
OUTSIDE_SHARE = (0.4, 0.6)  # machine share used outside the job: the job's / can't tell / theirs
CPU_BOUND = ("cpu", "gil")  # causes that contention can take the place of


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
    job_run_s: float = 0.0  # CPU the job's processes ran (schedstat)
    job_wait_s: float = 0.0  # time they were runnable but waited for a CPU
    host_busy_s: float = 0.0  # CPU-seconds the whole machine was busy (/proc/stat)
    host_total_s: float = 0.0  # CPU-seconds the machine had
    spun_before_s: float = 0.0  # seconds of nothing but spin just before the phase began

    @property
    def outside_share(self) -> float | None:
        """Share of the machine's CPU used by processes outside the job."""
        if self.host_total_s <= 0:
            return None
        return max(0.0, self.host_busy_s - self.job_run_s) / self.host_total_s

    @property
    def wait_share(self) -> float | None:
        """Share of the CPU time the job wanted that it spent waiting on the run queue."""
        want = self.job_run_s + self.job_wait_s
        return None if want <= 0 else self.job_wait_s / want


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
    if _only_spin(p):
        hung = p.spun_before_s >= HANG_AFTER_S - HANG_AFTER_SLACK_S
        return Label("sync_stall", None, "hang" if hung else "busy-wait")
    if spin >= SPIN_STALL:
        return Label("sync_stall", None, "busy-wait")
    if compute >= HEALTHY_COMPUTE:
        return Label("healthy")
    waits = p.waits or {}
    why = max(waits, key=lambda k: waits[k]) if waits else None
    return Label("starved", held_back(p) or WAIT_CAUSE.get(why or "", "unknown"))


def _only_spin(p: PhaseTotals) -> bool:
    """Nothing but spin over the phase: every rank waits, none computes."""
    dur = max(p.seconds, 1e-9)
    return p.spin_s / dur >= 0.95 and p.compute_s / dur < 0.01


def held_back(p: PhaseTotals) -> str | None:
    """``contention`` where processes outside the job held it back (the module docstring's
    rule), ``ambiguous`` where its own and others' alike did, else None."""
    out, wait = p.outside_share, p.wait_share
    queued = p.job_wait_s >= CONTENDED_OF_WAITS * sum((p.waits or {}).values())
    if out is None or wait is None or wait < CONTENDED_WAIT or not queued:
        return None
    if out >= OUTSIDE_SHARE[1]:  # held back by other processes
        return "contention"
    if out >= OUTSIDE_SHARE[0]:  # by its own and others' alike: no truth to score
        return "ambiguous"
    return None


def matches(label: Label, design: Label | None) -> bool:
    """Whether a phase did what it was designed to: the same state and cause -- where it
    was designed CPU-bound, contention counts (whether the CPUs were the job's or taken by
    other processes is the machine's doing, not the design's)."""
    if design is None or label.state != design.state:
        return False
    return label.cause == design.cause or (
        design.cause in CPU_BOUND and label.cause == "contention"
    )


class CpuMeter:
    """CPU of a process tree (schedstat: time run, time waiting for a CPU) and of the whole
    machine (/proc/stat), as deltas between reads."""

    def __init__(self, root_pid: int) -> None:
        self.root = root_pid
        self._last: dict[int, tuple[int, int]] = {}
        self._primed = False  # after the first read, a new process counts from its birth
        self._host = _host_ticks()
        self.read()
        self._primed = True

    def read(self) -> tuple[float, float, float, float]:
        """Since the last read: (tree run s, tree run-queue wait s, host busy CPU-s,
        host CPU-s)."""
        run = wait = 0
        seen: dict[int, tuple[int, int]] = {}
        for pid in _tree(self.root):
            cur = _schedstat(pid)
            if cur is None:
                continue
            seen[pid] = cur
            old = self._last.get(pid, (0, 0) if self._primed else cur)
            run += max(0, cur[0] - old[0])
            wait += max(0, cur[1] - old[1])
        self._last = seen
        host = _host_ticks()
        busy, total = host[0] - self._host[0], host[1] - self._host[1]
        self._host = host
        hz = os.sysconf("SC_CLK_TCK")
        return run * 1e-9, wait * 1e-9, busy / hz, total / hz


def _tree(root: int) -> list[int]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def _schedstat(pid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as f:
            run, wait, _ = f.read().split()
        return int(run), int(wait)
    except (OSError, ValueError):
        return None


def busy_share(seconds: float = 2.0) -> float:
    """Share of the machine's CPU busy over ``seconds`` (before a run: all of it others')."""
    a = _host_ticks()
    time.sleep(seconds)
    b = _host_ticks()
    return (b[0] - a[0]) / max(1, b[1] - a[1])


def too_busy_for_a_run(seconds: float = 2.0) -> str | None:
    """Why a lab run would not keep to its design on this machine now (None: it may):
    other processes already hold the share of the CPUs that makes every phase of a job
    that needs them ``contention`` by ``derive``'s rule."""
    share = busy_share(seconds)
    if share < OUTSIDE_SHARE[1]:
        return None
    return (
        f"other processes keep {share:.0%} of this machine's CPUs busy: a lab job's phases "
        f"would be contention, not their design (the truth's line: {OUTSIDE_SHARE[1]:.0%})"
    )


def _host_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs since boot."""
    with open("/proc/stat", encoding="ascii") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    total = sum(vals[:8])  # guest time is already in user
    return total - idle, total


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
        self._spun_s = 0.0  # seconds of nothing but spin up to the current phase
        self.mem_held = False
        self.has_context = True
        self._meter = CpuMeter(os.getpid())
        self._meter_t = time.monotonic()

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
        self._totals = PhaseTotals(waits={}, spun_before_s=self._spun_s)
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
        run, wait, busy, total = self._meter.read()
        # The CPU over [a, b] too, for the scorer: the load on a shared machine can change
        # within a phase (its seconds held back by others are told apart from the rest).
        self.event(
            "cpu",
            start=a * 1e-9,
            t=b * 1e-9,
            job_run_s=round(run, 4),
            job_wait_s=round(wait, 4),
            host_busy_s=round(busy, 3),
            host_total_s=round(total, 3),
        )
        t.job_run_s += run
        t.job_wait_s += wait
        t.host_busy_s += busy
        t.host_total_s += total
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
        if now * 1e-9 - self._meter_t >= 0.5:  # the CPU meter reads /proc: twice a second
            self._meter_t = now * 1e-9
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
        self._spun_s = self._spun_s + tot.seconds if _only_spin(tot) else 0.0
        design = self._design
        valid = matches(label, design)
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
                    "spun_before": round(tot.spun_before_s, 3),
                    "outside_share": _r3(tot.outside_share),
                    "wait_share": _r3(tot.wait_share),
                    "job_run_s": round(tot.job_run_s, 3),
                    "job_wait_s": round(tot.job_wait_s, 3),
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


def _r3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def read_truth(path: Path) -> list[dict[str, Any]]:
    """Every line of a truth file (a cut last line is skipped)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
