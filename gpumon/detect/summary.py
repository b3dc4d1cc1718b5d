"""The one run summary: what a whole run (or one GPU of it) amounts to, for every face.

The detector's verdict is the state *now*; a run is summed up by what took its time.
``gpumon analyze``, the watch summary, ``gpumon demo``, the daemon's stop line and the
dstat plugin all read this one summary, so one run never gets two answers.

The rule, in words: a problem (starved, sync stall) is the verdict once it takes at least
``PROBLEM_SHARE`` of the working time (healthy + starved + sync stall; start-up and idle
are not work) -- the bigger problem if both do; else healthy if the GPUs worked at all;
else idle, or unknown if nothing could be classified.  A provisional reading (reason
``judging``) that the verdict then confirmed is counted as that state (the confirmed
episode begins where it did); one that was not is start-up.  A starved verdict's cause is the
cause that held most of the starved time.

Everything is kept as running totals over closed episodes (bounded, however long the
run); open episodes are counted up to "now" when a summary is asked for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpumon.detect.advice import GENERAL_LEVERS
from gpumon.model import Advice, Cause, Episode, Lever, Reason, State

# Share of the working time a problem must take to become a run's verdict: a few minutes
# of starvation in a day-long healthy run are episodes worth listing, not the verdict.
PROBLEM_SHARE = 0.1
WORK = (State.HEALTHY, State.STARVED, State.SYNC_STALL)
_MAX_ADVICE = 64  # distinct advice weighed (texts carry numbers, so they vary)


def run_verdict(
    seconds: Mapping[State, float], by_cause: Mapping[Cause, float] | None = None
) -> tuple[State, Cause | None]:
    """The state (and cause) that sums up a run or one GPU, by the rule above."""
    work = sum(seconds.get(s, 0.0) for s in WORK)
    starved, stall = seconds.get(State.STARVED, 0.0), seconds.get(State.SYNC_STALL, 0.0)
    if work > 0 and max(starved, stall) >= PROBLEM_SHARE * work:
        if stall >= starved:
            return State.SYNC_STALL, None
        causes = by_cause or {}
        return State.STARVED, max(causes, key=causes.__getitem__, default=Cause.UNKNOWN)
    if seconds.get(State.HEALTHY, 0.0) > 0:
        return State.HEALTHY, None
    idle, unknown = seconds.get(State.IDLE, 0.0), seconds.get(State.UNKNOWN, 0.0)
    if idle > 0 and idle >= unknown:
        return State.IDLE, None
    return State.UNKNOWN, None


@dataclass(slots=True)
class Tally:
    """Running totals over one key's episodes (the run's, or one GPU's)."""

    seconds: dict[State, float] = field(default_factory=lambda: dict.fromkeys(State, 0.0))
    starved_by_cause: dict[Cause, float] = field(default_factory=dict)
    # (state, reason) -> [seconds, longest duration, that episode's note]
    reasons: dict[tuple[State, Reason], list] = field(default_factory=dict)
    startup_s: float = 0.0
    episodes: int = 0

    def add(self, ep: Episode, end_s: float) -> None:
        dur = max(0.0, end_s - ep.start_s)
        self.episodes += 1
        if ep.reason is Reason.JUDGING:
            # A provisional reading the verdict did not take over (a confirmed one is
            # backdated over it): the work was still warming up, so start-up.
            self.seconds[State.IDLE] += dur
            self.startup_s += dur
            return
        self.seconds[ep.state] += dur
        if ep.state is State.STARVED:
            c = ep.cause or Cause.UNKNOWN
            self.starved_by_cause[c] = self.starved_by_cause.get(c, 0.0) + dur
        if ep.reason is Reason.START_UP:
            self.startup_s += dur
        if ep.reason is not None:
            row = self.reasons.setdefault((ep.state, ep.reason), [0.0, -1.0, None])
            row[0] += dur
            if dur > row[1]:
                row[1], row[2] = dur, ep.note

    def copy(self) -> Tally:
        return Tally(
            dict(self.seconds),
            dict(self.starved_by_cause),
            {k: list(v) for k, v in self.reasons.items()},
            self.startup_s,
            self.episodes,
        )

    def verdict(self) -> tuple[State, Cause | None]:
        return run_verdict(self.seconds, self.starved_by_cause)

    def reason_s(self, state: State, reason: Reason) -> float:
        row = self.reasons.get((state, reason))
        return row[0] if row else 0.0

    def main_reason(self, state: State) -> tuple[Reason, str | None] | None:
        """The reason that held most of ``state``'s time, with its longest note."""
        rows = [(v[0], r, v[2]) for (s, r), v in self.reasons.items() if s is state and v[0] > 0]
        if not rows:
            return None
        _, reason, note = max(rows, key=lambda x: x[0])
        return reason, note


@dataclass(slots=True)
class AdviceWeights:
    """Seconds behind each piece of advice, per (state, cause): the verdict's advice is the
    advice of the episodes that made it, most time first."""

    weights: dict[tuple[State, Cause | None], dict[Advice, float]] = field(default_factory=dict)

    def add(self, ep: Episode, end_s: float) -> None:
        if not ep.advice:
            return
        dur = max(0.0, end_s - ep.start_s)
        row = self.weights.setdefault((ep.state, ep.cause), {})
        for a in ep.advice:
            row[a] = row.get(a, 0.0) + dur
        if len(row) > _MAX_ADVICE:
            for a in sorted(row, key=row.__getitem__)[: len(row) - _MAX_ADVICE]:
                del row[a]

    def copy(self) -> AdviceWeights:
        return AdviceWeights({k: dict(v) for k, v in self.weights.items()})

    def for_verdict(self, state: State, cause: Cause | None) -> tuple[Advice, ...]:
        """The verdict's advice: one line per lever, in its most-held wording, the causes'
        remedies in order of the time behind them, then the general ones.  For a starved
        run, every cause that held at least ``PROBLEM_SHARE`` of the starved time (a run
        starved on the CPU, then on the GIL, gets both remedies)."""
        rows = {c: row for (s, c), row in self.weights.items() if s is state and row}
        if cause is not None and state is State.STARVED:
            held = {c: max(row.values()) for c, row in rows.items()}
            total = sum(held.values())
            rows = {
                c: row
                for c, row in rows.items()
                if c == cause or (total > 0 and held[c] >= PROBLEM_SHARE * total)
            }
        elif cause is not None:
            rows = {c: row for c, row in rows.items() if c == cause}
        weight: dict[Lever, float] = {}
        best: dict[Lever, tuple[float, Advice]] = {}
        for c, row in rows.items():
            bonus = 1.0 if c == cause else 0.0  # ties go to the verdict's own cause
            for a, w in row.items():
                weight[a.lever] = weight.get(a.lever, 0.0) + w + bonus
                if a.lever not in best or w > best[a.lever][0]:
                    best[a.lever] = (w, a)
        # A remedy behind a tenth of the time of the main one is noise (a moment's
        # straggler before a long hang); the causes' remedies first, then the general ones.
        top = max(weight.values(), default=0.0)
        kept = [lv for lv in weight if weight[lv] >= PROBLEM_SHARE * top]
        order = sorted(kept, key=lambda lv: (lv in GENERAL_LEVERS, -weight[lv]))
        return tuple(best[lv][1] for lv in order)


@dataclass(frozen=True, slots=True)
class GpuRun:
    """One GPU over the run."""

    gpu: int
    uuid: str
    verdict: State
    cause: Cause | None
    duty_cycle: float | None  # busy share of all its samples, 0-1
    samples: int
    seconds: dict[State, float]
    off_bus_s: float = 0.0  # time it was off the bus (unknown, GPU lost)
    # GPU-seconds it waited (idle or busy-waiting) while a process held it; the GPUs'
    # add up to the run's ``lost_gpu_seconds``.
    lost_gpu_seconds: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuFacts:
    """What the detector knows of one GPU at summary time (its tally and totals)."""

    gpu: int
    uuid: str
    tally: Tally
    samples: int
    covered_s: float
    busy_s: float
    work_covered_s: float  # within working states (healthy, starved, sync stall)
    work_busy_s: float  # ... really computing (busy-waiting does not count)
    lost_gpu_seconds: float = 0.0  # idle or busy-waiting while held


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What the run amounts to: the verdict every face reports, with its numbers."""

    verdict: State
    cause: Cause | None
    reason: Reason | None  # the verdict's main reason (periodic gaps, straggler, ...)
    seconds: dict[State, float]  # the run's time per state
    startup_s: float  # of the idle time, the start-up before the first work
    duty_cycle: float | None  # mean over the GPUs
    effective_gpus: float | None  # GPUs of work delivered (sum of duty cycles)
    lost_gpu_seconds: float
    straggler: int | None
    advice: tuple[Advice, ...]
    notes: tuple[str, ...]  # what the verdict rests on, and what it cannot tell
    gpus: tuple[GpuRun, ...]
    # How much faster the run would go if its GPUs never waited on the host or on peers:
    # 1 / duty cycle over the working time (start-up and idle excluded); None when there
    # was too little work to say.
    speedup_if_fed: float | None = None
    work_duty_cycle: float | None = None  # the duty cycle that speed-up rests on

    @property
    def working_s(self) -> float:
        return sum(self.seconds.get(s, 0.0) for s in WORK)

    def share(self, states: Iterable[State]) -> float:
        """Share of all classified time spent in ``states`` (0 when nothing classified)."""
        total = sum(self.seconds.values())
        return 0.0 if total <= 0 else sum(self.seconds.get(s, 0.0) for s in states) / total


# Alternatives a person should weigh when the verdict cannot tell them apart alone.
_ALTERNATIVES = {
    Reason.PERIODIC_GAPS: (
        "a regular gap like this is either the input pipeline stalling once per epoch (a "
        "DataLoader restarting its workers: persistent_workers=True fixes it) or a "
        "checkpoint or evaluation every N steps; host data tells them apart (gpumon watch "
        "--pid: a loader restart shows workers starting, a checkpoint shows disk writes)"
    ),
    Reason.SYNC_PAUSES: (
        "all GPUs pausing together is a checkpoint, an evaluation, a host-side sync -- or "
        "an input pipeline stalling on every rank at once (e.g. at epoch boundaries); "
        "host data tells them apart (disk writes for a checkpoint, workers starting for "
        "a loader restart)"
    ),
}


def notes_for(
    verdict: State, tally: Tally, host_seen: bool, coarse_period_s: float | None
) -> tuple[str, ...]:
    """What the verdict rests on and what it cannot tell, in sentences."""
    out: list[str] = []
    main = tally.main_reason(verdict)
    if verdict is State.UNKNOWN:
        if main is not None and main[1]:
            out.append(f"unknown: {main[1]}")
        elif tally.startup_s > 0 or tally.seconds.get(State.IDLE, 0.0) > 0:
            out.append("too few samples of work to judge (the log ends in start-up)")
        else:
            out.append("too few samples to judge")
    if main is not None:
        reason, note = main
        if reason is Reason.SHORT_LOG and note:
            out.append(f"{note}: too few to be sure")
        elif reason in _ALTERNATIVES:
            if note:
                out.append(note)
            if not host_seen:
                out.append(_ALTERNATIVES[reason])
        elif (
            reason is Reason.STRAGGLER
            and note
            and "read busy" in note
            and verdict is State.SYNC_STALL
        ):
            out.append(
                "the straggler's peers read busy while it idles (no power reading shows "
                "them waiting): in data-parallel training they wait on it; if these GPUs "
                "run separate jobs, it is simply starved"
            )
    if coarse_period_s is not None and verdict in (State.STARVED, State.HEALTHY):
        out.append(
            f"one sample per {coarse_period_s:.1f} s: bursts and gaps shorter than that are "
            "not seen, the verdict rests on the duty cycle"
        )
    return tuple(out)


# Below this much working time (GPU-seconds) a speed-up figure would be noise.
MIN_WORK_S = 10.0
# A speed-up claim is capped: beyond it, the duty cycle says little about the cure.
MAX_SPEEDUP = 20.0


def speedup_if_fed(gpus: Iterable[GpuFacts]) -> tuple[float | None, float | None]:
    """(speed-up, working duty cycle): if every GPU computed all of its working time."""
    cov = busy = 0.0
    for g in gpus:
        cov += g.work_covered_s
        busy += g.work_busy_s
    if cov < MIN_WORK_S:
        return None, None
    duty = min(1.0, max(0.0, busy / cov))
    if duty <= 0.0:
        return None, duty
    return round(min(MAX_SPEEDUP, 1.0 / duty), 2), round(duty, 4)


def summarize(
    run: Tally,
    gpus: list[GpuFacts],
    advice: AdviceWeights,
    lost_gpu_seconds: float,
    host_seen: bool,
    coarse_period_s: float | None,
) -> RunSummary:
    """The run summary from the tallies (the run's and each GPU's) and the GPU totals.

    Pure: the detector calls it with its own tallies; a reader of exported metrics can
    build the same tallies and get the same summary.
    """
    state, cause = run.verdict()
    main = run.main_reason(state)
    runs = []
    duties = []
    straggler, most = None, 0.0
    for g in sorted(gpus, key=lambda g: g.gpu):
        gstate, gcause = g.tally.verdict()
        duty = None
        if g.covered_s > 0:
            duty = min(1.0, max(0.0, g.busy_s / g.covered_s))
            duties.append(duty)
        off_bus_s = g.tally.reason_s(State.UNKNOWN, Reason.GPU_LOST)
        runs.append(
            GpuRun(
                g.gpu,
                g.uuid,
                gstate,
                gcause,
                duty,
                g.samples,
                dict(g.tally.seconds),
                off_bus_s,
                g.lost_gpu_seconds,
            )
        )
        strag_s = g.tally.reason_s(State.SYNC_STALL, Reason.STRAGGLER)
        if strag_s > most:
            straggler, most = g.gpu, strag_s
    speedup, work_duty = speedup_if_fed(gpus)
    notes = list(notes_for(state, run, host_seen, coarse_period_s))
    scaling = scaling_note(gpus)
    if scaling is not None and state in (State.STARVED, State.SYNC_STALL):
        notes.append(scaling)
    if state is State.HEALTHY or state is State.IDLE:
        speedup = None if state is State.IDLE else speedup
    adv = advice.for_verdict(state, cause) if state is not State.HEALTHY else ()
    return RunSummary(
        verdict=state,
        cause=cause,
        reason=main[0] if main else None,
        seconds=dict(run.seconds),
        startup_s=run.startup_s,
        duty_cycle=sum(duties) / len(duties) if duties else None,
        effective_gpus=effective_gpus(gpus, duties),
        lost_gpu_seconds=lost_gpu_seconds,
        straggler=straggler,
        advice=adv,
        notes=tuple(notes),
        gpus=tuple(runs),
        speedup_if_fed=speedup,
        work_duty_cycle=work_duty,
    )


# What data-parallel training usually delivers on n GPUs, as GPUs of work: 2.5-3x the
# speed of one on 4 GPUs is common, 3.6-3.8x for well-optimised code (so ~0.62n-0.95n).
SCALING_USUAL = (0.62, 0.95)


def effective_gpus(gpus: Iterable[GpuFacts], duties: list[float]) -> float | None:
    """GPUs of work delivered: each GPU's computing share of its working time (busy-waiting
    is no work), summed; the plain duty cycles where no GPU has worked yet."""
    working = [g for g in gpus if g.work_covered_s > 0]
    if working:
        return round(sum(min(1.0, g.work_busy_s / g.work_covered_s) for g in working), 2)
    return round(sum(duties), 2) if duties else None


def scaling_note(gpus: Iterable[GpuFacts]) -> str | None:
    """Several GPUs: the work they deliver beside what data-parallel training usually does."""
    facts = [g for g in gpus if g.work_covered_s > 0]
    n = len(facts)
    if n < 2:
        return None
    eff = effective_gpus(facts, []) or 0.0
    lo, hi = (n * f for f in SCALING_USUAL)
    return (
        f"{n} GPUs deliver {eff:.1f} GPUs of work while working; data-parallel training "
        f"usually reaches {lo:.1f}-{hi:.1f} on {n}"
    )
