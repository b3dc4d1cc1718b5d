"""The burst/stall detector: snapshots in, episodes out; incremental and bounded.

Per tick, each GPU's driver points are folded into running totals (``gpu.GpuTrack``: its
readings, which only the track writes).  Once per ``eval_interval_s`` the per-GPU rules
(``rules``) propose a state for every GPU from its readings, its window and what was
decided about it so far (``rules.GpuDecision``, which only the detector writes); the
run-level rules (``multi``: busy-waiting peers, all-GPU pauses) override where they apply,
and hysteresis turns candidates into episodes whose start is backdated to the candidate's
onset.  Closed episodes feed the run summary (``summary``), which every face reads.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

from gpumon.detect import activities
from gpumon.detect.activities import ActivityTrack
from gpumon.detect.advice import advice_for
from gpumon.detect.config import DetectorConfig
from gpumon.detect.evidence import gpu_evidence, host_evidence, multi_evidence
from gpumon.detect.gpu import GpuTrack, Window
from gpumon.detect.host import HostTrack, HostWindow, busiest_outside, host_cause
from gpumon.detect.multi import RunContext, apply_run_rules, hang
from gpumon.detect.pauses import PauseTracker
from gpumon.detect.rules import (
    Candidate,
    GpuContext,
    GpuDecision,
    GpuReadings,
    bursty,
    enter_work,
    judge_before_work,
    judge_work,
    unbroken_since_first_activity,
)
from gpumon.detect.summary import AdviceWeights, GpuFacts, RunSummary, Tally, summarize
from gpumon.model import (
    Advice,
    Cause,
    Episode,
    Evidence,
    GpuIdentity,
    GpuVerdict,
    Point,
    Reason,
    Snapshot,
    State,
    Verdict,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class DetectorUpdate:
    """What changed in one update: episodes opened/closed, bursts and gaps completed."""

    opened: tuple[Episode, ...] = ()
    closed: tuple[Episode, ...] = ()
    bursts: tuple[tuple[int, float], ...] = ()
    gaps: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuTotals:
    """One GPU's running totals since the stream began (what a report sums over time)."""

    uuid: str
    samples: int  # utilisation readings folded in (driver points, or tick readings)
    covered_s: float  # seconds those readings cover
    busy_s: float  # utilisation-weighted busy seconds within them
    lost_s: float = 0.0  # GPU-seconds idle or busy-waiting while a process held it


@dataclass(slots=True)
class GpuSpent:
    """How one GPU's time was spent, as the detector counts it from its decisions: the
    seconds lost while held, and those covered and computing while it worked (for the
    speed-up if fed)."""

    lost_s: float = 0.0  # GPU-seconds idle or busy-waiting while held (the run's sum)
    work_cov: float = 0.0
    work_busy: float = 0.0


def note_of(reason: Reason | None, detail: str | None) -> str | None:
    """The words people read for a reason: ``"straggler: its peers busy-wait on it"``."""
    if reason is None:
        return detail
    return f"{reason.value}: {detail}" if detail else reason.value


_ALL_STATES = tuple(State)
_WORK = (State.HEALTHY, State.STARVED, State.SYNC_STALL)
_NO_UPDATE = DetectorUpdate()
# Reasons that mark a phase of a GPU's life, not a finding.
_PHASES = (Reason.START_UP, Reason.JUDGING)
# Reasons an episode changes with, even in the same state (a wait that becomes a hang,
# pauses that the stacks show to be checkpoints, a straggler that now waits with its
# peers, or whose place another GPU took: its advice was about its own slowness).
_DISTINCT = (*_PHASES, Reason.HANG, Reason.CHECKPOINT, Reason.EVALUATION, Reason.STRAGGLER)


def _phase(reason: Reason | None) -> Reason | None:
    return reason if reason in _DISTINCT else None


def _busy_from_the_first(tr: GpuTrack, cfg: DetectorConfig) -> bool:
    """One unbroken burst since the GPU's first activity, ``busy_run_s`` long so far."""
    last = tr.last_t
    if last is None or not unbroken_since_first_activity(tr):
        return False
    return last - tr.run_start >= cfg.busy_run_s


def _cpu_surge(
    paused: HostWindow, working: HostWindow, cpu_count: int | None, cfg: DetectorConfig
) -> str | None:
    """The CPU surging in the pauses against the work between, in words (None if not): the
    job's own CPU where its tree is read, else the host's."""
    job_p, job_w = paused.get("tree_cpu_pct"), working.get("tree_cpu_pct")
    if job_p is not None and job_w is not None:
        p, w, who = job_p / 100.0, job_w / 100.0, "the job's"  # in cores
    else:
        host_p, host_w = paused.get("host_cpu_pct"), working.get("host_cpu_pct")
        if host_p is None or host_w is None or not cpu_count:
            return None
        p, w, who = host_p * cpu_count / 100.0, host_w * cpu_count / 100.0, "the host's"
    if p < cfg.pause_cpu_surge_ratio * w or p - w < cfg.pause_cpu_surge_cores:
        return None
    return f"{who} CPU fills each pause ({p:.1f} cores, {w:.1f} in the work between)"


class Detector:
    """Classifies each GPU and the run; feed it snapshots in time order."""

    def __init__(
        self, config: DetectorConfig | None = None, gpus: Sequence[GpuIdentity] = ()
    ) -> None:
        self.cfg = config or DetectorConfig()
        self._ident = {g.index: g for g in gpus}
        self._tracks: dict[int, GpuTrack] = {}  # what each GPU shows (its readings)
        self._decided: dict[int, GpuDecision] = {}  # what was decided about each GPU
        self._spent: dict[int, GpuSpent] = {}
        self._host = HostTrack(self.cfg.ring_evals)
        self._run_peak_watts: float | None = None
        self._last_eval: float | None = None
        self._t: float | None = None
        self._episodes: dict[int | None, Episode] = {}
        self._pending: dict[int | None, Candidate] = {}
        self._evidence: dict[int | None, Evidence] = {}
        self._evidence_age: dict[int | None, int] = {}
        self._tallies: dict[int | None, Tally] = {}
        self._advice = AdviceWeights()
        self._lost = 0.0
        self._busywait: set[int] = set()
        self._pauses = PauseTracker(self.cfg)
        self._straggler: int | None = None
        self._waited_on: dict[int, float] = {}  # GPU -> when last named the straggler
        self._computed: dict[int, float] = {}  # GPU -> the last eval that saw it compute
        self._opened: list[Episode] = []
        self._closed: list[Episode] = []
        self._multi_cache: tuple[float, Evidence] | None = None
        self._cause_cache: tuple[tuple[float, int, Cause | None], Cause] | None = None
        self._cause_span_s = 0.0  # how far back the host was read for the latest cause
        self._calm = 0  # consecutive evals with nothing pending
        self._skipped = 0  # evals skipped in a row while steady (offline, calm_factor > 1)
        # Each GPU's totals and whether it was held, at the last eval.
        self._at_eval: dict[int, tuple[float, float, bool | None]] = {}
        self._concluded = False
        self._spinning_since: float | None = None  # every GPU spinning, none computing
        # The job's Python stacks (--stacks), weighted by the GPUs' waiting; the pids on
        # each GPU, to tell whose stacks are whose.
        self.stacks = ActivityTrack()
        self._gpu_pids: dict[int, frozenset[int]] = {}
        # Whether the GPUs are one job's: the run rules compare them as peers (a straggler,
        # a rank's spin).  On a node several jobs share (the daemon knows) each job's GPUs
        # are compared by that job's own detector, never across jobs.
        self.one_job = True
        self._stack_windows: dict[tuple[float, float], activities.StackWindow] = {}

    # --- public API ----------------------------------------------------------------------

    def update(self, snapshot: Snapshot) -> DetectorUpdate:
        """Fold one tick in; classify when an eval interval has passed."""
        bursts: list[tuple[int, float]] = []
        gaps: list[tuple[int, float]] = []
        self._opened, self._closed = [], []
        gap_w = 0.0
        gap_n = 0
        tracks = self._tracks
        decided, spent = self._decided, self._spent
        peak = self._run_peak_watts
        lost = self._lost
        for g in snapshot.gpus:
            tr = tracks.get(g.gpu)
            if tr is None:
                tr = self._new_track(g.gpu, g.uuid, snapshot.t_s, g.util_samples)
            cov, busy = tr.ingest(g, bursts, gaps)
            if cov > 0:
                gap_w += 1.0 - busy / cov
                gap_n += 1
                waiting = g.gpu in self._busywait
                sp = spent[g.gpu]
                if tr.held():
                    wasted = (cov - busy if cov > busy else 0.0) + (busy if waiting else 0.0)
                    sp.lost_s += wasted
                    lost += wasted
                if decided[g.gpu].state in _WORK:
                    sp.work_cov += cov
                    if not waiting:
                        sp.work_busy += busy
            p = tr.power_watts
            if p is not None and (peak is None or p > peak):
                peak = p
        self._run_peak_watts = peak
        self._lost = lost
        if snapshot.host is not None or snapshot.tree is not None:
            weight = gap_w / gap_n if gap_n else 0.02
            weight = weight if weight > 0.02 else 0.02
            self._host.ingest(snapshot.host, snapshot.tree, weight, snapshot.t_s)
        t = snapshot.t_s
        self.stacks.tick(t, gap_w / gap_n if gap_n else None)
        if snapshot.stacks:
            self._ingest_stacks(snapshot)
        if self._t is None or t > self._t:
            self._t = t
        if self._last_eval is None:
            self._last_eval = t
            for tr in tracks.values():
                tr.record(t)
            self._host.record(t)
        elif t - self._last_eval >= 0.9 * self.cfg.eval_interval_s:  # 0.9: ticks jitter
            if self._steady():
                self._skipped += 1  # calm: the history as an eval keeps it, no rules
                for tr in tracks.values():
                    tr.record(t)
                self._host.record(t)
            else:
                self._evaluate(t)
            self._last_eval = t
        if not (bursts or gaps or self._opened or self._closed):
            return _NO_UPDATE  # the common tick: nothing to report (frozen, so shared)
        return DetectorUpdate(
            opened=tuple(self._opened),
            closed=tuple(self._closed),
            bursts=tuple(bursts),
            gaps=tuple(gaps),
        )

    def conclude(self) -> DetectorUpdate:
        """The stream has ended: judge what never could be (a short log, a GPU still being
        judged) on all it showed, so the view at its end says what it was.  Episodes stay
        open; ``finish`` closes them.  Once only."""
        self._opened, self._closed = [], []
        t = self._t
        if t is not None and not self._concluded:
            self._concluded = True
            self._judge_short(t)
        return DetectorUpdate(opened=tuple(self._opened), closed=tuple(self._closed))

    def finish(self) -> DetectorUpdate:
        """End of stream: conclude (if not yet), then close every open episode at the last
        time seen."""
        concluded = self.conclude()
        self._opened, self._closed = list(concluded.opened), list(concluded.closed)
        t = self._t
        if t is not None:
            for key in list(self._episodes):
                self._close(key, t)
        return DetectorUpdate(opened=tuple(self._opened), closed=tuple(self._closed))

    def verdict(self) -> Verdict:
        """The current view: each GPU's state with fresh evidence and advice, and the run's."""
        t = self._t
        gv = []
        for idx in sorted(self._tracks):
            ep = self._episodes.get(idx)
            tr, now = self._tracks[idx], self._decided[idx]
            state = ep.state if ep else State.UNKNOWN
            cause = ep.cause if ep else None
            reason = ep.reason if ep else None
            note = ep.note if ep else "no evaluation yet"
            if ep is not None and reason is not None and now.reason is reason and now.detail:
                note = note_of(reason, now.detail)  # its numbers now, not at its start
            ev = self._gpu_evidence(tr, t) if t is not None else {}
            gv.append(
                GpuVerdict(
                    gpu=idx,
                    uuid=tr.uuid,
                    state=state,
                    cause=cause,
                    since_s=ep.start_s if ep else None,
                    evidence=ev,
                    advice=self._advice_for(state, cause, ev, reason),
                    note=note,
                    reason=reason,
                )
            )
        run = self._episodes.get(None)
        rev = self._run_evidence(t) if t is not None else {}
        if run is None:
            return Verdict(
                t_s=t,
                state=State.UNKNOWN,
                cause=None,
                gpus=tuple(gv),
                evidence=rev,
                advice=(),
                note="no evaluation yet",
            )
        adv: list[Advice] = []
        for v in gv:
            for a in v.advice:
                if a not in adv:
                    adv.append(a)
        note = run.note
        if run.reason is not None and run.reason is not Reason.START_UP:
            # The run's reason in a GPU's current words (its numbers now, as the GPU's).
            note = next((v.note for v in gv if v.reason is run.reason and v.note), note)
        return Verdict(
            t_s=t,
            state=run.state,
            cause=run.cause,
            gpus=tuple(gv),
            evidence=rev,
            advice=tuple(adv),
            note=note,
            reason=run.reason,
        )

    def summary(self) -> RunSummary:
        """The run so far, as every face reports it (open episodes counted up to now)."""
        t = self._t
        tallies = {k: v.copy() for k, v in self._tallies.items()}
        advice = self._advice.copy()
        for key, ep in self._episodes.items():
            if t is None:
                break
            tallies.setdefault(key, Tally()).add(ep, t)
            if key is not None:
                advice.add(ep, t)
        facts = [
            GpuFacts(
                gpu=idx,
                uuid=tr.uuid,
                tally=tallies.get(idx, Tally()),
                samples=(totals := tr.totals())[0],
                covered_s=totals[1],
                busy_s=totals[2],
                work_covered_s=self._spent[idx].work_cov,
                work_busy_s=self._spent[idx].work_busy,
                lost_gpu_seconds=self._spent[idx].lost_s,
            )
            for idx, tr in self._tracks.items()
        ]
        coarse = [tr.period_s for tr in self._tracks.values() if tr.period_s is not None]
        coarse_s = max(coarse) if coarse and max(coarse) >= self.cfg.coarse_period_s else None
        return summarize(
            tallies.get(None, Tally()), facts, advice, self._lost, self._host.seen, coarse_s
        )

    def seconds_in_state(self) -> dict[int | None, dict[State, float]]:
        """Seconds per state per GPU (None = the run), open episodes counted to now."""
        out: dict[int | None, dict[State, float]] = {}
        for key in set(self._tallies) | set(self._episodes):
            d = dict(self._tallies[key].seconds) if key in self._tallies else {}
            d = {s: d.get(s, 0.0) for s in _ALL_STATES}
            ep = self._episodes.get(key)
            if ep is not None and self._t is not None:
                d[ep.state] += max(0.0, self._t - ep.start_s)
            out[key] = d
        return out

    def gpu_count(self) -> int:
        """GPUs seen so far (cheap: a report checks it every tick)."""
        return len(self._tracks)

    def gpu_totals(self) -> dict[int, GpuTotals]:
        """Per GPU, the readings folded in so far and the time and work they cover.

        A report takes its duty cycles and timelines from these, so it need not walk every
        driver sample a second time.
        """
        return {
            idx: GpuTotals(
                uuid=tr.uuid,
                samples=(totals := tr.totals())[0],
                covered_s=totals[1],
                busy_s=totals[2],
                lost_s=self._spent[idx].lost_s,
            )
            for idx, tr in self._tracks.items()
        }

    def lost_gpu_seconds(self) -> float:
        """GPU-seconds spent idle (or busy-waiting) while a process held the GPU."""
        return self._lost

    def open_episodes(self) -> dict[int | None, Episode]:
        """The episode each GPU (and the run, key None) is in now."""
        return dict(self._episodes)

    # --- internals -----------------------------------------------------------------------

    def _new_track(self, index: int, uuid: str, t: float, points: Sequence[Point]) -> GpuTrack:
        ident = self._ident.get(index)
        tr = GpuTrack(
            index,
            uuid,
            self.cfg,
            power_limit_watts=ident.power_limit_watts if ident else None,
            mem_total_bytes=ident.mem_total_bytes if ident else None,
        )
        if self._last_eval is not None:
            tr.record(self._last_eval)
        elif len(points) >= 2:
            # The stream opens with a backlog of driver samples (dstat asks NVML for all it
            # kept, ~20 s): the totals are zero where it begins, so the first eval's window
            # reaches over that history instead of waiting for a window of live time.
            tr.record(min(t, points[0][0] - (points[1][0] - points[0][0])))
        self._tracks[index] = tr
        self._decided[index] = GpuDecision()
        self._spent[index] = GpuSpent()
        return tr

    def _window_s(self, tr: GpuTrack) -> float:
        cfg = self.cfg
        per = tr.cycle_period_s(self._t)
        w = cfg.window_s
        if per is not None and per * cfg.window_periods > w:
            w = per * cfg.window_periods
        w = min(w, cfg.window_max_s)
        if tr.period_s is not None and tr.period_s * 4 > w:
            w = tr.period_s * 4  # at least four samples, however coarse the log
        ws = self._decided[tr.index].work_start_s
        if ws is not None and self._t is not None and self._t - ws < w:
            w = max(2 * cfg.eval_interval_s, self._t - ws)  # never reach into start-up
        return w

    def _steady(self) -> bool:
        """Whether this eval may be skipped (``calm_factor`` > 1): calm for ``calm_evals``
        evals, fewer than ``calm_factor`` skipped in a row, and every GPU's work since the
        last eval what its state already says (healthy at a healthy duty cycle, idle below
        the idle line, held or not as it was).  Anything else -- a gap on a healthy GPU,
        work on an idle one, a process come or gone, a GPU in any other state -- is judged
        at once, and at every eval until calm again, as live, so a change is placed where
        the live detector places it."""
        cfg = self.cfg
        if cfg.calm_factor <= 1.0 or self._calm < cfg.calm_evals:
            return False
        if self._skipped + 1 >= cfg.calm_factor:
            return False
        for idx, tr in self._tracks.items():
            cov0, busy0, held0 = self._at_eval.get(idx, (0.0, 0.0, None))
            cov = tr.cum_cov - cov0
            now = self._decided[idx]
            if cov <= 0 or tr.held() is not held0:
                steady = False
            elif now.state is State.HEALTHY and now.reason is None:
                steady = (tr.cum_busy - busy0) / cov >= cfg.healthy_duty
            elif now.state is State.IDLE and now.reason is not Reason.START_UP:
                steady = (tr.cum_busy - busy0) / cov < cfg.idle_duty
            else:
                steady = False
            if not steady:
                self._calm = 0  # a change: judged at the live cadence until calm again
                return False
        return True

    def _classify(self, tr: GpuTrack, w: Window, t: float) -> tuple[Candidate, Window]:
        """Ask one GPU's rules in order (rules.py); the work they find begun or resumed is
        applied between those that need no work and those that judge it.  Returns the
        candidate and the window it was judged on (from the work, where it just began:
        the run rules read the same)."""
        c = GpuContext(
            tr=tr,
            now=self._decided[tr.index],
            w=w,
            t=t,
            cfg=self.cfg,
            cause_of=self._cause,
            isolated=self._isolated,
        )
        found = judge_before_work(c)
        if found is not None:
            return found, c.w
        now = enter_work(c)
        if now is not None:
            if not c.now.seen_work and now.work_start_s is not None:
                # Its first work: start-up's blips are no pattern, and its window reaches
                # back no further than the work.
                tr.reset_cycles()
                c.w = tr.window(t, max(self.cfg.eval_interval_s * 2, t - now.work_start_s))
                if c.w.duty is not None:
                    c.duty = c.w.duty
            self._decided[tr.index] = c.now = now
        return judge_work(c), c.w

    def _evaluate(self, t: float) -> None:
        self._skipped = 0
        for idx, tr in self._tracks.items():
            tr.record(t)
            self._at_eval[idx] = (tr.cum_cov, tr.cum_busy, tr.held())
        self._host.record(t)
        cands: dict[int, Candidate] = {}
        wins: dict[int, Window] = {}
        for idx, tr in self._tracks.items():
            cands[idx], wins[idx] = self._classify(tr, tr.window(t, self._window_s(tr)), t)
        prev = self._last_eval if self._last_eval is not None else t
        rc = RunContext(
            t=t,
            prev_eval_s=prev,
            tracks=self._tracks,
            decided=self._decided,
            wins=wins,
            cands=cands,
            run_peak_watts=self._run_peak_watts,
            cfg=self.cfg,
            pauses=self._pauses,
            waited_on_s=self._waited_on,
            computed_s=self._computed,
            spinning_since=self._spinning_since,
            pauses_filled=self._pauses_filled if self._host.seen else None,
        )
        if len(self._tracks) >= 2 and self.one_job:
            apply_run_rules(rc)
        else:
            hang(rc)  # one GPU alone can still spin on a rank elsewhere, forever
        if self.stacks.seen:
            self._judge_by_stacks(rc, t)
        self._busywait, self._straggler = rc.busywait, rc.straggler
        self._spinning_since = rc.spinning_since
        switched: list[float] = []
        for idx, c in cands.items():
            start = self._apply(idx, self._tracks[idx].uuid, c, t)
            if start is not None:
                switched.append(start)
        self._run_state(t, switched)
        # Calm: nothing pending, nothing changed, and every GPU past start-up (its end is
        # not backdated, so it is looked for at the full rate).
        starting = any(not now.seen_work for now in self._decided.values())
        self._calm = 0 if (switched or self._pending or starting) else self._calm + 1

    def _isolated(self, tr: GpuReadings, now: GpuDecision, t: float, w: Window) -> bool:
        """A dip, not a pattern: the window's idle time sits in one gap (open or just
        closed), and at most one gap completed in the isolation window."""
        if w.duty is not None:
            per = tr.period_s or 1.0
            last = tr.open_gap_s() or (tr.gaps.newest() or 0.0)
            idle = (1.0 - w.duty) * w.coverage * w.span_s
            quiet = (1.0 - w.active) * w.coverage * w.span_s  # samples with no activity
            if idle > min(last, quiet) + 1.0 * per + 0.5:
                return False  # idle spread over many short gaps (or partial samples)
            began = now.work_began_s
            if now.startup_gaps and began is not None and t - began < w.span_s + idle:
                # Idle just before, and less than a window of work since: start-up's
                # idleness is no gap, but a dip this soon cannot be told from a pattern.
                return False
        span = max(self.cfg.dip_isolation_s, w.span_s)
        old = tr.hist.at_or_before(t - span)
        # Gaps before the GPU's first work are its start-up's, not dips.
        base = max(int(old[3]) if old is not None else 0, now.startup_gaps)
        return tr.cum_gaps - base <= 1

    def _pauses_filled(self, t: float) -> tuple[Cause, str] | None:
        """Whether the CPU fills the current all-GPU pauses (the input pipeline starting
        over, not a checkpoint): the job's CPU -- the host's, without its tree -- in the
        pauses well above what it is in the work between them, and no disk writes or
        iowait in the pauses that would say a checkpoint.  Returns the host's cause over
        the pauses and the surge in words, if so."""
        cfg = self.cfg
        spans = self._pauses.recent(t)
        if not spans:
            return None
        edge = cfg.eval_interval_s  # a pause is known to the eval: trim its edges
        inside = [(a + edge, b - edge) for a, b in spans if b - a > 2 * edge]
        work = [(b + edge, a2 - edge) for (_, b), (a2, _) in pairwise(spans) if a2 - b > 2 * edge]
        lo = max(t - cfg.sync_window_s, spans[0][0] - cfg.dip_isolation_s)
        if spans[0][0] - edge > lo + edge:
            work.append((lo, spans[0][0] - edge))  # the work before the first pause
        if self._pauses.open_since is None and t - spans[-1][1] > 2 * edge:
            work.append((spans[-1][1] + edge, t))  # and since the last
        paused, written = self._host.over(inside)
        working, _ = self._host.over(work)
        surge = _cpu_surge(paused, working, self._host.cpu_count, cfg)
        if surge is None:
            return None
        if written is not None and written >= cfg.pause_write_bytes_per_s:
            return None  # writing: a checkpoint
        iowait = paused.get("iowait_pct")
        if iowait is not None and iowait >= cfg.io_iowait_pct:
            return None  # waiting on the disk (a checkpoint's writes, unread)
        current = next(
            (now.cause for now in self._decided.values() if now.reason is Reason.SYNC_PAUSES),
            None,
        )
        return host_cause(paused, cfg, current, self._host.cpu_count), surge

    def _cause(self, t: float, span: float, current: Cause | None = None) -> Cause:
        """The host's cause over the GPUs' latest ``cause_wait_s`` of waiting within
        ``span``: what the host did while the GPUs waited lately, read over no more of the
        past than that needs (a phase's cause follows within seconds of its change, and a
        long stretch without gaps keeps the cause of the last ones)."""
        key = (t, round(span), current)
        if self._cause_cache is not None and self._cause_cache[0] == key:
            return self._cause_cache[1]
        cfg = self.cfg
        lo = min(span, cfg.cause_min_span_s)
        span = self._host.recent_waits_span(
            t, cfg.cause_wait_s, cfg.cause_min_readings, lo, max(span, lo)
        )
        self._cause_span_s = span
        cause = host_cause(self._host.window(t, span), cfg, current, self._host.cpu_count)
        self._cause_cache = (key, cause)
        return cause

    def _advice_for(
        self, state: State, cause: Cause | None, ev: Evidence, reason: Reason | None
    ) -> tuple[Advice, ...]:
        spinning = None
        if self._spinning_since is not None and self._t is not None:
            spinning = (self._t - self._spinning_since, self.cfg.hang_after_s)
        return advice_for(state, cause, ev, reason, self._host.seen, spinning)

    def _apply(self, key: int, uuid: str, c: Candidate, t: float) -> float | None:
        """Hysteresis: switch the GPU's episode once its candidate has lasted long enough."""
        tr = self._tracks[key]
        ep = self._episodes.get(key)
        if (
            ep is not None
            and c.state is ep.state
            and c.cause == ep.cause
            and _phase(c.reason) is _phase(ep.reason)
            and not (c.state is State.IDLE and c.reason is not None and c.reason != ep.reason)
        ):
            self._pending.pop(key, None)
            self._refresh_evidence(key, tr, t)
            now = self._decided[key]
            if c.reason is not None and (c.reason, c.detail) != (now.reason, now.detail):
                self._decided[key] = replace(now, reason=c.reason, detail=c.detail)
            return None
        pend = self._pending.get(key)
        if pend is None or pend.state is not c.state or pend.cause != c.cause:
            pend = c
            if ep is not None and c.state is ep.state and c.cause != ep.cause:
                # The cause alone changes: it began within the host readings that named
                # it, not a window of the GPU's rhythm back (minutes, for slow cycles).
                pend = replace(pend, backdate_s=min(pend.backdate_s, self._cause_span_s))
            self._pending[key] = pend
        elif c.clear:
            # The case became clear while pending.
            self._pending[key] = pend = replace(pend, clear=True)
        # Evals come every tick that is >= 0.9 interval on: jittered tick times must not
        # cost a whole extra interval, so the confirmation time allows the same slack.
        if (
            ep is not None
            and t - pend.since_s < self._confirm_s(ep, pend, tr) - 0.1 * self.cfg.eval_interval_s
        ):
            return None
        start = pend.since_s - pend.backdate_s
        if ep is not None:
            start = max(start, ep.start_s)
            if c.state is State.IDLE is ep.state and ep.reason not in _PHASES:
                # Idle for a new reason (memory held, then no process): it begins when it
                # is seen, not over the idleness before it.  (A wait that turns out to be
                # a hang is backdated: it was one since the ranks stopped computing.)
                start = max(start, pend.since_s)
            if ep.reason is Reason.JUDGING and c.state is ep.state:
                start = ep.start_s  # the provisional reading confirmed: it was so all along
            self._close(key, start)
        elif tr.first_t is not None:
            start = max(start, tr.first_t)
        self._pending.pop(key, None)
        self._open(key, uuid, tr, c, start, t)
        return start

    def _open(
        self, key: int, uuid: str, tr: GpuTrack, c: Candidate, start: float, t: float
    ) -> None:
        ev = self._gpu_evidence(tr, t)
        self._evidence[key] = ev
        self._evidence_age[key] = 0
        new = Episode(
            gpu=key,
            uuid=uuid,
            state=c.state,
            cause=c.cause,
            start_s=start,
            end_s=None,
            evidence=ev,
            advice=self._advice_for(c.state, c.cause, ev, c.reason),
            note=note_of(c.reason, c.detail),
            reason=c.reason,
        )
        self._episodes[key] = new
        self._opened.append(new)
        now = self._decided[key]
        self._decided[key] = replace(
            now,
            state=c.state,
            cause=c.cause,
            reason=c.reason,
            detail=c.detail,
            resume_armed=c.state is State.IDLE and now.seen_work,
        )

    def _confirm_s(self, ep: Episode, c: Candidate, tr: GpuTrack) -> float:
        cfg = self.cfg
        if c.reason is Reason.GPU_LOST:
            return 0.0  # its readings mean nothing from now on
        if c.reason is Reason.JUDGING:
            return 0.0  # a busy GPU is shown as such at once, never as idle
        if ep.reason in _PHASES:
            # Work has begun: healthy at once when the GPU has been busy without a break
            # since its first activity, for the seconds a first judgment needs (busy from
            # its first sample); else at the next eval; starved once it outlasts the ramp;
            # a clear case (peers spinning on one GPU, every one far below the line) at the
            # next eval: the first judgment is no time to hold back what is plain.
            if c.state is not State.HEALTHY:
                return cfg.eval_interval_s if c.clear else cfg.confirm_s
            return 0.0 if _busy_from_the_first(tr, cfg) else cfg.eval_interval_s
        if c.state is ep.state and c.cause != ep.cause and c.reason == ep.reason:
            return cfg.confirm_cause_s  # the cause alone changes: it has hysteresis too
        if c.clear:
            return cfg.eval_interval_s
        if c.state is State.IDLE:
            return cfg.confirm_idle_s
        if c.state is State.UNKNOWN:
            return cfg.confirm_unknown_s
        return cfg.confirm_s

    def _close(self, key: int | None, end: float) -> None:
        ep = self._episodes.pop(key, None)
        if ep is None:
            return
        end = max(end, ep.start_s)
        ev = self._evidence.get(key, ep.evidence)
        if key is not None and key in self._tracks:
            ev = Evidence(**ev)
            ev["duration_s"] = round(end - ep.start_s, 3)
            duty = self._tracks[key].duty_between(ep.start_s, end)
            if duty is not None:
                ev["duty_cycle"] = round(duty, 4)  # over the episode, not the last window
        if self.stacks.seen:  # what the job's processes did over the episode's gaps
            win = self.stacks.window(ep.start_s, end)
            ev = Evidence(**ev)
            ev.update(activities.evidence(win, self._pids(key), self.cfg.stack_min_s))
        # A judging phase's provisional reading is over once it closes: say only that it was.
        note = note_of(ep.reason, None) if ep.reason is Reason.JUDGING else ep.note
        closed = replace(
            ep,
            end_s=end,
            evidence=ev,
            advice=self._advice_for(ep.state, ep.cause, ev, ep.reason),
            note=note,
        )
        self._tallies.setdefault(key, Tally()).add(closed, end)
        if key is not None:
            self._advice.add(closed, end)
        self._closed.append(closed)

    def _refresh_evidence(self, key: int | None, tr: GpuTrack, t: float) -> None:
        """Re-read evidence every 30th eval while a state holds (quantiles are not free)."""
        age = self._evidence_age.get(key, 0) + 1
        if age >= 30:
            self._evidence[key] = self._gpu_evidence(tr, t)
            age = 0
        self._evidence_age[key] = age

    def _run_state(self, t: float, switched: list[float]) -> None:
        if not switched and None in self._episodes:
            return  # no GPU changed: neither did the run
        states = [ep for k, ep in self._episodes.items() if k is not None]
        if not states:
            return
        kinds = {ep.state for ep in states}
        cause = None
        reason = None
        if State.SYNC_STALL in kinds:
            st = State.SYNC_STALL
            reasons = {ep.reason for ep in states if ep.state is State.SYNC_STALL}
            for reason in (
                Reason.HANG,
                Reason.STRAGGLER,
                Reason.CHECKPOINT,
                Reason.EVALUATION,
                Reason.SYNC_PAUSES,
                None,
            ):
                if reason in reasons:
                    break
        elif State.STARVED in kinds:
            st = State.STARVED
            starved = [ep for ep in states if ep.state is State.STARVED]
            cause = Counter(ep.cause for ep in starved).most_common(1)[0][0]
            reason = Counter(ep.reason for ep in starved).most_common(1)[0][0]
        elif State.HEALTHY in kinds:
            st = State.HEALTHY
            if all(ep.reason is Reason.JUDGING for ep in states if ep.state is st):
                reason = Reason.JUDGING  # healthy so far, not yet confirmed
        elif kinds == {State.IDLE}:
            st = State.IDLE
            reasons = {ep.reason for ep in states}
            if len(reasons) == 1:
                reason = reasons.pop()  # start-up, memory held, no process: all alike
        else:
            st = State.UNKNOWN
            reason = Reason.NOT_CLASSIFIED
        cur = self._episodes.get(None)
        if cur is not None and cur.state is st and cur.cause == cause and cur.reason is reason:
            return
        start = min(switched) if switched else t
        if cur is not None:
            if cur.reason not in _PHASES:  # a start-up may be judged over from its start
                start = max(start, cur.start_s)
            self._close(None, start)
        else:
            start = min(ep.start_s for ep in states)
        ev = self._run_evidence(t)
        self._evidence[None] = ev
        detail = None
        if reason is not None and reason is not Reason.START_UP:
            detail = next((ep.note for ep in states if ep.reason is reason), None)
            detail = detail.split(": ", 1)[1] if detail and ": " in detail else None
        new = Episode(
            gpu=None,
            uuid=None,
            state=st,
            cause=cause,
            start_s=start,
            end_s=None,
            evidence=ev,
            advice=self._advice_for(st, cause, ev, reason),
            note=note_of(reason, detail),
            reason=reason,
        )
        self._episodes[None] = new
        self._opened.append(new)

    # --- the end of a short stream -------------------------------------------------------

    def _judge_short(self, t: float) -> None:
        """A stream that ends before its work could be judged is judged on all it shows
        after its first activity: start-up is only the stretch before work begins."""
        cfg = self.cfg
        switched = []
        for idx, tr in self._tracks.items():
            ep = self._episodes.get(idx)
            if ep is None or ep.reason not in _PHASES:
                continue
            idle_from = self._short_and_idle(idx, tr, ep, t)
            if idle_from is not None:
                switched.append(idle_from)
                continue
            base = tr.first_active_totals
            if base is None or tr.first_active_t is None:
                continue
            cov = tr.cum_cov - base[0]
            per = tr.period_s or 1.0
            n = round(cov / per)
            if n < cfg.short_log_min_samples or cov <= 0:
                continue
            duty = min(1.0, max(0.0, (tr.cum_busy - base[1]) / cov))
            gaps, bursts = tr.cum_gaps - base[2], tr.cum_bursts - base[3]
            mem0, mem = tr.first_active_mem, tr.mem_used_bytes
            if mem0 is not None and mem is not None and mem > cfg.warmup_mem_growth * max(mem0, 1):
                continue  # memory still filling up: the job is warming up, not yet working
            w = Window(
                span_s=cov,
                coverage=1.0,
                duty=duty,
                gaps=gaps + (0 if tr.run_busy else 1),
                bursts=bursts,
                power_watts=None,
                active=1.0,
            )
            detail = f"judged at its end on {n} samples ({cov:.0f} s of work)"
            if duty < cfg.idle_duty:
                continue
            if duty >= cfg.healthy_duty:
                c = Candidate(
                    state=State.HEALTHY, reason=Reason.SHORT_LOG, detail=detail, since_s=t
                )
            elif (
                tr.held() is not True
                and not bursty(w)
                and (tr.period_s is None or tr.period_s >= cfg.coarse_period_s)
                and duty < cfg.small_work_duty
            ):
                # Flat, low and coarse with no sign of a process: could be small work (as
                # the coarse rule says); above it the GPU plainly works below capacity.
                c = Candidate(
                    state=State.UNKNOWN, reason=Reason.SHORT_LOG, detail=detail, since_s=t
                )
            else:
                cause = self._cause(t, t - tr.first_active_t)
                c = Candidate(
                    state=State.STARVED,
                    cause=cause,
                    reason=Reason.SHORT_LOG,
                    detail=detail,
                    since_s=t,
                )
            start = max(ep.start_s, tr.first_active_t)
            self._close(idx, start)
            self._pending.pop(idx, None)
            self._open(idx, tr.uuid, tr, c, start, t)
            if c.state in _WORK:  # its work, for the speed-up if fed
                sp = self._spent[idx]
                sp.work_cov, sp.work_busy = cov, tr.cum_busy - base[1]
            switched.append(start)
        if switched:
            self._run_state(t, switched)

    def _short_and_idle(self, idx: int, tr: GpuTrack, ep: Episode, t: float) -> float | None:
        """A short stream in which a GPU shows nothing but idleness (its whole log below the
        idle duty cycle) is idle, not starting up: judged on all it shows.  Returns when
        the idleness began (the stream's start), if so."""
        cfg = self.cfg
        if tr.first_t is None or tr.cum_cov <= 0 or ep.reason is not Reason.START_UP:
            return None
        per = tr.period_s or 1.0
        n = max(tr.samples, round(tr.cum_cov / per))
        if n < 2 or tr.cum_busy / tr.cum_cov >= cfg.idle_duty:
            return None
        held = tr.held()
        reason = (
            Reason.NO_PROCESS if held is False else Reason.MEMORY_HELD if held else Reason.NO_WORK
        )
        detail = f"judged at its end on {n} samples, all idle"
        start = min(ep.start_s, tr.first_t)  # the whole log (start-up opens at an eval)
        self._close(idx, start)
        self._pending.pop(idx, None)
        idle = Candidate(state=State.IDLE, reason=reason, detail=detail, since_s=t)
        self._open(idx, tr.uuid, tr, idle, start, t)
        return start

    # --- evidence ------------------------------------------------------------------------

    def _gpu_evidence(self, tr: GpuTrack, t: float | None) -> Evidence:
        if t is None:
            return {}
        span = self._window_s(tr)
        w = tr.window(t, span)
        ev = gpu_evidence(
            tr, w, self.cfg, self._run_peak_watts, self._host.window(t, span), self._host.cpu_count
        )
        if tr.index == self._straggler:
            ev["straggler_gpu"] = tr.index
        if len(self._tracks) >= 2:
            ev.update(self._multi_evidence(t))
        self._outside_evidence(ev, t, span)
        if self.stacks.seen:
            win = self._stack_window(tr, t)
            ev.update(activities.evidence(win, self._pids(tr.index), self.cfg.stack_min_s))
        return ev

    # --- Python stacks (--stacks) ----------------------------------------------------------

    def _ingest_stacks(self, snapshot: Snapshot) -> None:
        for g in snapshot.gpus:
            if g.processes is not None:
                self._gpu_pids[g.gpu] = frozenset(p.pid for p in g.processes)
        self.stacks.ingest(snapshot.stacks)
        self._stack_windows.clear()

    def _pids(self, key: int | None) -> frozenset[int]:
        return frozenset() if key is None else self._gpu_pids.get(key, frozenset())

    def _stack_window(self, tr: GpuTrack, t: float) -> activities.StackWindow:
        """The stacks over this GPU's recent gaps: ``stack_window_s``, or 2.5 periods of
        its rhythm (a checkpoint every minute needs its last pauses in view)."""
        span = self.cfg.stack_window_s
        rh = tr.rhythm()
        if rh is not None:
            span = min(self.cfg.rhythm_window_max_s, max(span, 2.5 * rh.period_s))
        key = (t, span)
        win = self._stack_windows.get(key)
        if win is None:
            if len(self._stack_windows) > 16:
                self._stack_windows.clear()
            win = self._stack_windows[key] = self.stacks.window(t - span, t)
        return win

    def _judge_by_stacks(self, rc: RunContext, t: float) -> None:
        """What the job's processes did during the gaps names the waits (activities.py):
        checkpoints and evaluations are sync stalls, a loader waited on is starvation with
        its decode named, ranks waiting in a collective on one rank name the straggler."""
        for idx, cand in rc.cands.items():
            tr = self._tracks[idx]
            r = activities.reading(self._stack_window(tr, t), self._pids(idx))
            rc.cands[idx] = activities.judge(cand, r, self.cfg, self._decided[idx].seen_work)
        if rc.straggler is not None or len(self._tracks) < 2:
            return
        found = activities.straggler_gpus(
            self.stacks.window(t - self.cfg.stack_window_s, t), self._gpu_pids, self.cfg.stack_share
        )
        if found is None:
            return
        strag, waiting, place = found
        if rc.cands[strag].state not in (State.STARVED, State.SYNC_STALL):
            return  # its GPU works: the ranks wait, but not on this GPU's rank
        rc.straggler = strag
        detail = f"its peers wait in a collective while its rank is in {place}"
        rc.cands[strag] = Candidate(
            state=State.SYNC_STALL, reason=Reason.STRAGGLER, detail=detail, since_s=t
        )
        for i in waiting:
            if rc.cands[i].state in (State.STARVED, State.SYNC_STALL):
                rc.cands[i] = Candidate(
                    state=State.SYNC_STALL,
                    reason=Reason.BUSY_WAIT,
                    detail=f"its rank waits on GPU {strag}'s",
                    since_s=t,
                )

    def _outside_evidence(self, ev: Evidence, t: float, span: float) -> None:
        """Who takes the host's CPUs, where the job's tree leaves them to others."""
        if ev.get("outside_cpu_pct", 0.0) >= 100.0:  # at least a core's worth
            top = busiest_outside(self._host, t, span)
            if top is not None:
                ev["outside_top"] = top

    def _multi_evidence(self, t: float) -> Evidence:
        """Run-wide numbers (computed once per eval, shared by every GPU's evidence)."""
        if self._multi_cache is not None and self._multi_cache[0] == t:
            return self._multi_cache[1]
        # A GPU spinning in a collective delivers no work, however busy it reads.
        duties = [
            0.0 if idx in self._busywait else tr.window(t, self._window_s(tr)).duty
            for idx, tr in self._tracks.items()
        ]
        ev = multi_evidence(duties, self._straggler, self._pauses)
        self._multi_cache = (t, ev)
        return ev

    def _run_evidence(self, t: float | None) -> Evidence:
        if t is None:
            return {}
        ev: Evidence = {"gpus": len(self._tracks)}
        if self._tracks:
            ev.update(self._multi_evidence(t))
        ev["lost_gpu_seconds"] = round(self._lost, 1)
        span = self.cfg.window_s * 2
        ev.update(host_evidence(self._host.window(t, span), self._host.cpu_count))
        self._outside_evidence(ev, t, span)
        if self.stacks.seen:
            win = self.stacks.window(t - self.cfg.stack_window_s, t)
            ev.update(activities.evidence(win, (), self.cfg.stack_min_s))
        return ev
