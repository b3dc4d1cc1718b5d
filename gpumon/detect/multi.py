"""The run-level rules: what several GPUs show together overrides what each shows alone.

Each rule reads every working GPU's window and may replace their candidates:

- ``busy_wait``: GPUs pinned at high utilisation while their SMs idle (GPM counters) or,
  without them, while drawing little power spin in a collective (NCCL busy-wait), waiting
  on a peer that works less -- the straggler.
- ``partial_busy_wait``: every GPU pinned while most compute at a fraction of what one
  does (SM activity, else power): the peers spin for part of each step on that one.
- ``pinned_peers``: without power or SM activity to tell, a minority of GPUs at a starved duty cycle
  while all their peers read pinned is the same picture in data-parallel training.
- ``waited_on_rhythm``: a GPU whose periodic gaps its peers wait through (they were seen
  waiting on it during its latest gap) is a straggler on a rhythm -- rank 0 writing a
  checkpoint every N steps -- not a starved GPU, even between its gaps.
- ``all_gpu_pauses``: every GPU pausing together for seconds, repeatedly, is a sync stall
  (a checkpoint, an evaluation, a host-side sync) -- unless the CPU fills the pauses: then
  they are the input pipeline's (DataLoader workers starting anew each epoch), starved.
- ``hang``: every GPU spinning and none computing for ``hang_after_s`` is no progress at
  all: the rank they wait on is not here, or stuck (it also applies to a single GPU whose
  GPM counters show its SMs idle at 100 % utilisation).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gpumon.detect.config import DetectorConfig
from gpumon.detect.gpu import GpuTrack, Window, sm_active_peak
from gpumon.detect.pauses import PauseTracker
from gpumon.detect.rules import Candidate, GpuDecision
from gpumon.model import Cause, Reason, State


@dataclass(slots=True, kw_only=True)
class RunContext:
    """All GPUs at one eval: their readings, what the detector has decided about each so
    far, their windows and candidates (the run rules rewrite the candidates, and the
    fields marked out, nothing else)."""

    t: float
    prev_eval_s: float
    tracks: dict[int, GpuTrack]  # their readings: read, never written, by the rules
    decided: dict[int, GpuDecision]
    wins: dict[int, Window]
    cands: dict[int, Candidate]
    run_peak_watts: float | None
    cfg: DetectorConfig
    pauses: PauseTracker
    # When each GPU was last seen waited on (named the straggler): kept across evals.
    waited_on_s: dict[int, float] = field(default_factory=dict)
    # When each GPU was last seen computing (SMs busy, or real power): kept across evals.
    computed_s: dict[int, float] = field(default_factory=dict)
    busywait: set[int] = field(default_factory=set)  # out: GPUs spinning on a peer
    straggler: int | None = None  # out: the GPU the others wait on
    # Since when every working GPU has been spinning with none computing (in and out:
    # kept across evals by the detector); None while some GPU computes.
    spinning_since: float | None = None
    # Whether the CPU fills the current all-GPU pauses: (the host's cause, in words) if so
    # (the detector reads its host history for it), else None.
    pauses_filled: Callable[[float], tuple[Cause, str] | None] | None = None
    _working: list[int] | None = field(default=None, repr=False)

    def working(self) -> list[int]:
        """GPUs past start-up, with data, and not known to be free of processes (found
        once per eval: the rules rewrite candidates, never tracks or windows)."""
        if self._working is None:
            wins = self.wins
            self._working = [
                i
                for i, tr in self.tracks.items()
                if self.decided[i].seen_work and wins[i].duty is not None and tr.held() is not False
            ]
        return self._working


RunRule = Callable[[RunContext], None]


def _stall(c: RunContext, i: int, reason: Reason, detail: str | None, clear: bool) -> None:
    c.cands[i] = Candidate(
        state=State.SYNC_STALL,
        reason=reason,
        detail=detail,
        since_s=c.t,
        backdate_s=c.wins[i].span_s * 0.5,
        clear=clear,
    )


def busy_wait(c: RunContext) -> None:
    """High utilisation with idle SMs is a GPU waiting on a peer, not computing; the peer
    with the lowest duty cycle among those not waiting is the straggler.

    Where the GPU has GPM counters, SM activity tells it directly (100 % utilisation with
    few SMs active, well below what the run's GPUs show when they compute, is NCCL
    spinning), whatever the power; without them, low power does (a spinning GPU draws
    little)."""
    cfg = c.cfg
    sm_peak = sm_active_peak(c.tracks.values())
    waiting = {i for i in c.wins if _spinning(c, i, sm_peak)}
    c.busywait = waiting
    if not waiting:
        return
    working = c.working()
    others = [i for i in working if i not in waiting]
    strag = [i for i in others if (c.wins[i].duty or 0.0) * 100 < cfg.busywait_util_pct]
    if not strag and others and len(waiting) >= len(working) / 2:
        # Everyone reads busy, but most spin while the rest compute (SMs busy, real power):
        # those compute the whole step while their peers wait (uneven work).
        strag = [max(others, key=lambda i: _computing(c, i))]
    if not (strag or len(waiting) == len(working)):
        return
    # Most peers pinned and spinning: no borderline case, confirm at once.
    clear = len(waiting) >= max(1, len(working) // 2)
    for i in waiting:
        told = "idle SMs" if c.tracks[i].sm_active_ratio is not None else "low power"
        _stall(c, i, Reason.BUSY_WAIT, f"high utilisation, {told}", clear)
    if strag:
        s = min(strag, key=lambda i: c.wins[i].duty or 0.0)
        c.straggler = s
        _stall(c, s, Reason.STRAGGLER, "its peers busy-wait on it", clear)


def _spinning(c: RunContext, idx: int, sm_peak: float | None) -> bool:
    """Pinned at high utilisation while few of its SMs are active (GPM) or, without GPM,
    at low power, now and over the last few seconds."""
    cfg, tr, w = c.cfg, c.tracks[idx], c.wins[idx]
    if not c.decided[idx].seen_work or w.duty is None:
        return False
    if w.duty * 100 < cfg.busywait_util_pct - 10 and not _busy_run(c, idx):
        return False
    if not tr.spinning_now(c.run_peak_watts, sm_peak):
        return False  # SMs busy or real power now, or neither read: never taken for a wait
    pinned = _pinned_window(c, idx)
    if pinned is None:
        return False
    if tr.sm_active_ratio is not None:  # GPM: SM activity over the last tick says it
        return True
    ref = tr.power_ref_watts(c.run_peak_watts)
    return (
        pinned.power_watts is not None
        and ref is not None
        and (pinned.power_watts <= cfg.busywait_power_share * ref)
    )


def _pinned_window(c: RunContext, idx: int) -> Window | None:
    """The GPU's last ``busywait_window_s`` (a short window will do: power is a 1 s mean),
    if its utilisation over it reads pinned (or it is in a busy run: ``_busy_run``); else
    None."""
    cfg, w = c.cfg, c.wins[idx]
    if w.span_s > cfg.busywait_window_s:
        w = c.tracks[idx].window(c.t, cfg.busywait_window_s)
    if w.duty is None or (w.duty * 100 < cfg.busywait_util_pct and not _busy_run(c, idx)):
        return None
    return w


def _busy_run(c: RunContext, idx: int) -> bool:
    """Busy without a break for ``busy_run_s`` at least, on a GPU whose SM activity reads:
    pinned, though its windows (aligned to evals) still reach into the idle before the run
    (a run's first seconds).  Not on power alone: the idle in the window would lower its
    mean power, which reads as spinning."""
    tr = c.tracks[idx]
    return tr.sm_active_ratio is not None and tr.run_busy and c.t - tr.run_start >= c.cfg.busy_run_s


def partial_busy_wait(c: RunContext) -> None:
    """Every GPU pinned, but most compute at a fraction of what one of them does (SM
    activity where GPM reads, else power): data-parallel peers doing the same work spend
    the difference spinning in the collective each step -- the rest of the step they wait
    on the GPU that computes throughout, the straggler.  (A whole-step spin is
    ``busy_wait``'s; this is the same wait, shorter than a step.)"""
    if c.straggler is not None or c.busywait:
        return
    cfg = c.cfg
    pinned = c.working()
    if len(pinned) < 2:
        return
    sm = {i: c.tracks[i].sm_active_ratio for i in pinned}
    power = {i: c.wins[i].power_watts for i in pinned}
    gpm = all(v is not None for v in sm.values())
    if not gpm and any(v is None for v in power.values()):
        return  # nothing tells computing from spinning
    # The same measure for every GPU: SM activity where all read it, else power.
    level = {i: float((sm if gpm else power)[i] or 0.0) for i in pinned}
    top = max(level.values())
    share = cfg.partial_wait_sm_share if gpm else cfg.partial_wait_power_share
    waiting = [i for i in pinned if level[i] <= share * top]
    busiest = [i for i in pinned if level[i] > share * top]
    if top <= 0 or len(waiting) < len(busiest) or not busiest:
        return
    # (Asked last: a window each, and GPUs that all compute alike never get this far.)
    if any(_pinned_window(c, i) is None for i in pinned):
        return  # a GPU not pinned: starvation or idleness is the story, not this
    s = max(busiest, key=lambda i: level[i])
    c.straggler = s
    c.busywait = set(waiting)
    told = "SM activity" if gpm else "power"
    clear = all(level[i] <= (share - cfg.partial_wait_clear_margin) * top for i in waiting)
    for i in waiting:
        part = 100 * level[i] / top
        _stall(c, i, Reason.BUSY_WAIT, f"pinned, at {part:.0f} % of GPU {s}'s {told}", clear)
    _stall(c, s, Reason.STRAGGLER, "its peers busy-wait on it for part of each step", clear)


def _computing(c: RunContext, idx: int) -> float:
    """How hard a GPU computes, to tell the one doing the work: SM activity where GPM is
    read, else its power."""
    sm = c.tracks[idx].sm_active_ratio
    if sm is not None:
        return 1e6 * sm  # any GPM reading ranks above any power reading
    return c.wins[idx].power_watts or 0.0


def pinned_peers(c: RunContext) -> None:
    """A minority of GPUs at a starved duty cycle while every peer reads pinned, and no
    peer is seen drawing computing power: in data-parallel training the peers wait in the
    collective for the slow ones."""
    if c.straggler is not None or c.busywait:
        return
    cfg = c.cfg
    working = c.working()
    if len(working) < 2:
        return
    low = [i for i in working if (c.wins[i].duty or 0.0) < cfg.starved_duty]
    high = [i for i in working if (c.wins[i].duty or 0.0) >= cfg.pinned_duty]
    if not low or not high or len(low) + len(high) != len(working):
        return
    if len(low) > len(working) // 2:
        return  # most GPUs are slow: they are starved, not waiting on each other
    # The peers must stay pinned over a long window, with no long gaps of their own:
    # GPUs starving independently also take turns being busy.
    span = cfg.pinned_window_s
    for i in low:
        rh = c.tracks[i].rhythm()
        if rh is not None:
            span = max(span, 2.5 * rh.period_s)
    for i in high:
        tr, w = c.tracks[i], c.wins[i]
        sm = tr.sm_active_ratio
        if sm is not None and sm > cfg.busywait_sm_active_ratio:
            return  # its SMs work (GPM): separate work, not waiting (busy_wait saw no spin)
        ref = tr.power_ref_watts(c.run_peak_watts)
        if w.power_watts is not None and ref and w.power_watts >= cfg.computing_power_share * ref:
            return  # a peer draws computing power: separate work, not waiting
        wl = tr.window(c.t, min(span, cfg.rhythm_window_max_s))
        if wl.duty is None or wl.duty < cfg.pinned_duty:
            return
        if tr.long_gaps and tr.long_gaps[-1][1] > c.t - span:
            return
    s = min(low, key=lambda i: c.wins[i].duty or 0.0)
    c.straggler = s
    clear = (c.wins[s].duty or 0.0) < cfg.starved_duty - cfg.clear_margin
    for i in low:
        _stall(c, i, Reason.STRAGGLER, "its peers read busy while it idles", clear)
    for i in high:
        _stall(c, i, Reason.BUSY_WAIT, f"reads busy while GPU {s} idles", clear)


def waited_on_rhythm(c: RunContext) -> None:
    """Periodic gaps that the peers wait through are a straggler's, not starvation."""
    if c.straggler is not None:
        c.waited_on_s[c.straggler] = c.t
    for i, cand in c.cands.items():
        if cand.state is not State.STARVED or cand.reason is not Reason.PERIODIC_GAPS:
            continue
        rh = c.tracks[i].rhythm()
        seen = c.waited_on_s.get(i)
        if rh is None or seen is None or seen < rh.last_end_s - rh.gap_s - c.cfg.eval_interval_s:
            continue
        detail = f"its peers wait through its {rh.gap_s:.0f} s gaps every {rh.period_s:.0f} s"
        c.cands[i] = Candidate(
            state=State.SYNC_STALL,
            reason=Reason.STRAGGLER,
            detail=detail,
            since_s=c.t,
            backdate_s=cand.backdate_s,
        )
        if c.straggler is None:
            c.straggler = i


def all_gpu_pauses(c: RunContext) -> None:
    """Every working GPU pausing together, for seconds at a time and often enough, is a
    sync stall: a checkpoint, an evaluation, or a host-side sync.  Pauses that the CPU
    fills (the job's, or the host's, surging in each of them) are the input pipeline's:
    every rank's loader starting over at an epoch's start -- starved, its cause read from
    the host over the pauses as for any starvation."""
    working = c.working()
    began = [s for i in working if (s := c.decided[i].work_began_s) is not None]
    if not c.pauses.step(
        c.t,
        c.prev_eval_s,
        [c.tracks[i] for i in working],
        c.run_peak_watts,
        max(began, default=None),
    ):
        return
    since = max(0.0, c.t - c.pauses.first_s)  # from the first pause on
    filled = c.pauses_filled(c.t) if c.pauses_filled is not None else None
    for i in working:
        if c.cands[i].reason is Reason.STRAGGLER:
            continue  # its peers pause for it: it stays the straggler
        if filled is not None:
            cause, detail = filled
            c.cands[i] = Candidate(
                state=State.STARVED,
                cause=cause,
                reason=Reason.SYNC_PAUSES,
                detail=detail,
                since_s=c.t,
                backdate_s=since,
            )
            continue
        c.cands[i] = Candidate(
            state=State.SYNC_STALL,
            reason=Reason.SYNC_PAUSES,
            detail="checkpoint or host sync",
            since_s=c.t,
            backdate_s=since,
        )


def hang(c: RunContext) -> None:
    """Every GPU spinning in a collective and none computing, for longer than
    ``hang_after_s``: no progress.  A long wait that recovers before then is a stall."""
    cfg, t = c.cfg, c.t
    working = c.working()
    if len(c.tracks) >= 2:
        spinning = c.busywait if c.straggler is None else set()
    else:  # one GPU: only GPM can tell a spin from light work at full utilisation
        peak = sm_active_peak(c.tracks.values())
        spinning = {
            i for i in working if c.tracks[i].sm_active_ratio is not None and _spinning(c, i, peak)
        }
    computing = [i for i in working if i not in spinning]
    if computing:
        sm_peak = sm_active_peak(c.tracks.values())
        for i in computing:
            if c.tracks[i].spinning_now(c.run_peak_watts, sm_peak) is False:
                c.computed_s[i] = t
    if not working or not set(working) <= spinning:
        c.spinning_since = None
        return
    if c.spinning_since is None:
        # Since the last eval that saw one of them compute, if within the window they were
        # seen spinning over (a spin is told from the latest tick, its pinned utilisation
        # from the window): a hang is called once it has lasted hang_after_s, not before.
        last = max((c.computed_s.get(i, -math.inf) for i in working), default=-math.inf)
        c.spinning_since = max(t - cfg.busywait_window_s, last)
    stuck = t - c.spinning_since
    if stuck < cfg.hang_after_s:
        return
    detail = f"no GPU has computed for {_minutes(stuck)}"
    for i in working:
        c.cands[i] = Candidate(
            state=State.SYNC_STALL,
            reason=Reason.HANG,
            detail=detail,
            since_s=t,
            backdate_s=stuck,
            clear=True,
        )


def _minutes(seconds: float) -> str:
    m = seconds / 60.0
    return f"{m:.0f} min" if m >= 10 else f"{m:.1f} min"


RUN_RULES: tuple[RunRule, ...] = (
    busy_wait,
    partial_busy_wait,
    pinned_peers,
    waited_on_rhythm,
    all_gpu_pauses,
    hang,
)


def apply_run_rules(c: RunContext) -> None:
    """Each rule in turn; a later rule overrides what an earlier one decided."""
    for rule in RUN_RULES:
        rule(c)
