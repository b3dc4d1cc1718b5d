"""The burst/stall detector: snapshots in, episodes out; incremental and bounded.

Per tick, each GPU's driver points are folded into running totals (``gpu.GpuTrack``).
Once per ``eval_interval_s`` the rules classify every GPU over a window, the run-level
rules (busy-waiting peers, all-GPU pauses) override where they apply, and hysteresis
turns candidate states into episodes whose start is backdated to the candidate's onset.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

from gpumon.detect.advice import advice_for
from gpumon.detect.config import DetectorConfig
from gpumon.detect.gpu import GpuTrack, Window
from gpumon.detect.host import HostTrack
from gpumon.detect.pauses import PauseTracker
from gpumon.detect.rings import quantile
from gpumon.model import (
    Cause,
    Episode,
    Evidence,
    GpuIdentity,
    GpuVerdict,
    Point,
    Snapshot,
    State,
    Verdict,
)


@dataclass(frozen=True, slots=True)
class DetectorUpdate:
    """What changed in one update: episodes opened/closed, bursts and gaps completed."""

    opened: tuple[Episode, ...] = ()
    closed: tuple[Episode, ...] = ()
    bursts: tuple[tuple[int, float], ...] = ()
    gaps: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class GpuTotals:
    """One GPU's running totals since the stream began (what a report sums over time)."""

    uuid: str
    samples: int  # utilisation readings folded in (driver points, or tick readings)
    covered_s: float  # seconds those readings cover
    busy_s: float  # utilisation-weighted busy seconds within them


@dataclass(slots=True)
class _Candidate:
    state: State
    cause: Cause | None
    note: str | None
    since_s: float
    backdate_s: float = 0.0
    clear: bool = False  # far past the threshold: confirm at the next eval


_ALL_STATES = tuple(State)
_NO_UPDATE = DetectorUpdate()


class Detector:
    """Classifies each GPU and the run; feed it snapshots in time order."""

    def __init__(
        self, config: DetectorConfig | None = None, gpus: Sequence[GpuIdentity] = ()
    ) -> None:
        self.cfg = config or DetectorConfig()
        self._ident = {g.index: g for g in gpus}
        self._tracks: dict[int, GpuTrack] = {}
        self._host = HostTrack(self.cfg.ring_evals)
        self._run_peak_watts: float | None = None
        self._last_eval: float | None = None
        self._t: float | None = None
        self._episodes: dict[int | None, Episode] = {}
        self._pending: dict[int | None, _Candidate] = {}
        self._evidence: dict[int | None, Evidence] = {}
        self._evidence_age: dict[int | None, int] = {}
        self._seconds: dict[int | None, dict[State, float]] = {}
        self._lost = 0.0
        self._busywait: set[int] = set()
        self._pauses = PauseTracker(self.cfg)
        self._straggler: int | None = None
        self._opened: list[Episode] = []
        self._closed: list[Episode] = []
        self._multi_cache: tuple[float, Evidence] | None = None
        self._cause_cache: tuple[tuple[float, int], Cause] | None = None
        self._calm = 0  # consecutive evals with nothing pending

    # --- public API ----------------------------------------------------------------------

    def update(self, snapshot: Snapshot) -> DetectorUpdate:
        """Fold one tick in; classify when an eval interval has passed."""
        bursts: list[tuple[int, float]] = []
        gaps: list[tuple[int, float]] = []
        self._opened, self._closed = [], []
        gap_w = 0.0
        gap_n = 0
        tracks = self._tracks
        peak = self._run_peak_watts
        lost = self._lost
        for g in snapshot.gpus:
            tr = tracks.get(g.gpu)
            if tr is None:
                tr = self._new_track(g.gpu, g.uuid, snapshot.t_s, g.util_samples)
            cov0, busy0 = tr.cum_cov, tr.cum_busy
            tr.ingest(g, bursts, gaps)
            cov = tr.cum_cov - cov0
            if cov > 0:
                busy = tr.cum_busy - busy0
                gap_w += 1.0 - busy / cov
                gap_n += 1
                if tr.held():
                    if cov > busy:
                        lost += cov - busy
                    if g.gpu in self._busywait:
                        lost += busy
            p = tr.power_watts
            if p is not None and (peak is None or p > peak):
                peak = p
        self._run_peak_watts = peak
        self._lost = lost
        if snapshot.host is not None or snapshot.tree is not None:
            weight = gap_w / gap_n if gap_n else 0.02
            self._host.ingest(snapshot.host, snapshot.tree, weight if weight > 0.02 else 0.02)
        t = snapshot.t_s
        if self._t is None or t > self._t:
            self._t = t
        if self._last_eval is None:
            self._last_eval = t
            for tr in tracks.values():
                tr.record(t)
            self._host.record(t)
        elif t - self._last_eval >= 0.9 * self._interval():  # 0.9: ticks jitter
            self._evaluate(t)
            self._last_eval = t
        if not (bursts or gaps or self._opened or self._closed):
            return _NO_UPDATE  # the common tick: nothing to report (frozen, so shared)
        return DetectorUpdate(tuple(self._opened), tuple(self._closed), tuple(bursts), tuple(gaps))

    def finish(self) -> DetectorUpdate:
        """Close every open episode at the last time seen (end of stream)."""
        self._opened, self._closed = [], []
        t = self._t
        if t is not None:
            for key in list(self._episodes):
                self._close(key, t)
        return DetectorUpdate((), tuple(self._closed))

    def verdict(self) -> Verdict:
        """The current view: each GPU's state with fresh evidence and advice, and the run's."""
        t = self._t
        gv = []
        for idx in sorted(self._tracks):
            ep = self._episodes.get(idx)
            tr = self._tracks[idx]
            state = ep.state if ep else State.UNKNOWN
            cause = ep.cause if ep else None
            note = ep.note if ep else "no evaluation yet"
            ev = self._gpu_evidence(tr, t) if t is not None else {}
            gv.append(
                GpuVerdict(
                    idx,
                    tr.uuid,
                    state,
                    cause,
                    ep.start_s if ep else None,
                    ev,
                    advice_for(state, cause, ev, note),
                    note,
                )
            )
        run = self._episodes.get(None)
        rev = self._run_evidence(t) if t is not None else {}
        if run is None:
            return Verdict(t, State.UNKNOWN, None, tuple(gv), rev, (), "no evaluation yet")
        adv: list[str] = []
        for v in gv:
            for a in v.advice:
                if a not in adv:
                    adv.append(a)
        return Verdict(t, run.state, run.cause, tuple(gv), rev, tuple(adv), run.note)

    def seconds_in_state(self) -> dict[int | None, dict[State, float]]:
        """Seconds per state per GPU (None = the run), open episodes counted to now."""
        out: dict[int | None, dict[State, float]] = {}
        keys = set(self._seconds) | set(self._episodes)
        for key in keys:
            d = dict.fromkeys(_ALL_STATES, 0.0)
            for s, v in self._seconds.get(key, {}).items():
                d[s] += v
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
            idx: GpuTotals(tr.uuid, tr.samples, tr.cum_cov, tr.cum_busy)
            for idx, tr in self._tracks.items()
        }

    def lost_gpu_seconds(self) -> float:
        """GPU-seconds spent idle (or busy-waiting) while a process held the GPU."""
        return self._lost

    # --- internals -----------------------------------------------------------------------

    def _new_track(self, index: int, uuid: str, t: float, points: Sequence[Point]) -> GpuTrack:
        ident = self._ident.get(index)
        tr = GpuTrack(
            index,
            uuid,
            self.cfg,
            ident.power_limit_watts if ident else None,
            ident.mem_total_bytes if ident else None,
        )
        if self._last_eval is not None:
            tr.record(self._last_eval)
        elif len(points) >= 2:
            # The stream opens with a backlog of driver samples (dstat asks NVML for all it
            # kept, ~20 s): the totals are zero where it begins, so the first eval's window
            # reaches over that history instead of waiting for a window of live time.
            tr.record(min(t, points[0][0] - (points[1][0] - points[0][0])))
        self._tracks[index] = tr
        return tr

    def _window_s(self, tr: GpuTrack) -> float:
        cfg = self.cfg
        per = tr.cycle_period_s(self._t)
        w = cfg.window_s
        if per is not None and per * cfg.window_periods > w:
            w = per * cfg.window_periods
        if tr.period_s is not None and tr.period_s * 4 > w:
            w = tr.period_s * 4  # at least four driver samples
        w = min(w, cfg.window_max_s)
        ws = tr.work_start_s
        if ws is not None and self._t is not None and self._t - ws < w:
            w = max(2 * cfg.eval_interval_s, self._t - ws)  # never reach into start-up
        return w

    def _interval(self) -> float:
        """Eval interval: stretched while calm (nothing pending, nothing changed)."""
        cfg = self.cfg
        if self._calm >= cfg.calm_evals:
            return cfg.eval_interval_s * cfg.calm_factor
        return cfg.eval_interval_s

    def _evaluate(self, t: float) -> None:
        for tr in self._tracks.values():
            tr.record(t)
        self._host.record(t)
        cands: dict[int, _Candidate] = {}
        wins: dict[int, Window] = {}
        for idx, tr in self._tracks.items():
            span = self._window_s(tr)
            w = tr.window(t, span)
            wins[idx] = w
            cands[idx] = self._classify(tr, w, t)
        if len(self._tracks) >= 2:
            self._run_rules(t, cands, wins)
        switched: list[float] = []
        for idx, c in cands.items():
            start = self._apply(idx, self._tracks[idx].uuid, c, t)
            if start is not None:
                switched.append(start)
        self._run_state(t, switched)
        self._calm = 0 if (switched or self._pending) else self._calm + 1

    def _classify(self, tr: GpuTrack, w: Window, t: float) -> _Candidate:
        """The per-GPU rules: one candidate state from this GPU's window alone."""
        cfg = self.cfg
        d = w.duty
        cur = tr.state
        if tr.lost:
            return _Candidate(State.UNKNOWN, None, "GPU lost (fell off the bus)", t)
        if (
            (d is None or w.coverage < cfg.min_coverage)
            and not tr.seen_work
            and tr.samples > 0
            and tr.first_t is not None
            and t - tr.first_t < cfg.window_s
        ):
            return _Candidate(State.IDLE, None, "start-up", t)  # the stream just began
        if d is None or w.coverage < cfg.min_coverage:
            note = (
                "no utilisation data"
                if tr.samples == 0
                else f"too little utilisation data in the last {w.span_s:.0f} s"
            )
            return _Candidate(State.UNKNOWN, None, note, t)
        held = tr.held()
        if not tr.seen_work:
            full = tr.first_t is not None and t - tr.first_t >= 0.9 * cfg.window_s
            if (
                (
                    d >= cfg.startup_duty
                    or w.active >= cfg.startup_active
                    or w.bursts >= cfg.startup_bursts
                )
                and full
                and w.coverage >= 0.9
            ):
                tr.seen_work = True
                # Later windows never reach back into start-up.
                # (skipping the first, partial sample of the work).
                onset = t - w.active * w.span_s
                if (
                    tr.was_act
                    and t - tr.act_on >= max(2.0, 2 * (tr.period_s or 0.0))
                    and tr.act_on > onset
                ):
                    onset = tr.act_on  # continuous work since then: blips before are no work
                tr.work_start_s = onset + (tr.period_s or 0.0)
                w = tr.window(t, max(cfg.eval_interval_s * 2, t - tr.work_start_s))
                d = w.duty if w.duty is not None else d
                tr.reset_cycles()
            else:
                note = "no process" if held is False else "start-up"
                return _Candidate(State.IDLE, None, note, t)
        if cur is State.IDLE and tr.resume_armed and tr.run_busy:
            tr.resume_armed = False
            # Work resumes after idleness: judge it from this burst on, not with the idle
            # stretch still in the window (that would read as starvation).
            tr.work_start_s = tr.run_start
        per = tr.period_s or 1.0
        young = 2.0 if per < cfg.coarse_period_s else max(3.0, 1.5 * per)
        if tr.work_start_s is not None and cur is State.IDLE and t - tr.work_start_s < young:
            return _Candidate(State.IDLE, None, tr.note, t)  # too little work to judge yet
        if tr.work_start_s is not None and (
            cur is State.IDLE or (cur is State.STARVED and t - w.span_s < tr.work_start_s + per)
        ):
            # First judgment of new work: its latest samples decide if it is healthy, so a
            # ramp-up sample or an early work-start estimate does not read as starvation
            # (nor keep a GPU starved while its window still reaches back to that start).
            wy = tr.window(t, max(young, 2 * per))
            if (
                wy.duty is not None
                and wy.duty >= cfg.healthy_duty
                and (wy.gaps == 0 or per >= cfg.coarse_period_s)
            ):
                return _Candidate(State.HEALTHY, None, None, t, young)
        gap = tr.open_gap_s()
        long_gap = cfg.idle_gap_s if held is False else cfg.dip_max_s
        if cur is State.STARVED and gap >= long_gap:
            # A starved GPU's own gaps are long: idleness is a gap well beyond them.
            p90 = tr.gap_p90_s(t)
            if p90 is not None:
                long_gap = max(long_gap, 2.5 * p90)
        if d >= cfg.idle_duty and gap >= long_gap:
            # A long gap in progress: judge idleness on the gap itself, not the window.
            wg = tr.window(t, gap - cfg.eval_interval_s)  # records are per eval
            if wg.duty is not None and wg.duty < cfg.idle_duty and wg.coverage >= 0.5:
                d = wg.duty
        if d < cfg.idle_duty:
            if (
                held is not False
                and cur in (State.HEALTHY, State.SYNC_STALL)
                and gap < cfg.dip_max_s
                and self._isolated(tr, t, w)
            ):
                return _Candidate(cur, None, tr.note, t)  # a dip: keep the state
            note = (
                "no process"
                if held is False
                else "memory allocated, no work"
                if held
                else "no work"
            )
            return _Candidate(State.IDLE, None, note, t, gap)
        if d >= cfg.healthy_duty or (d >= cfg.starved_duty and cur is not State.STARVED):
            return _Candidate(State.HEALTHY, None, None, t, w.span_s * 0.5)
        # In between: starved, unless it is one isolated dip of a healthy GPU.
        if cur is State.HEALTHY and self._isolated(tr, t, w) and tr.open_gap_s() < cfg.dip_max_s:
            return _Candidate(cur, None, None, t)
        coarse = tr.period_s is None or tr.period_s >= cfg.coarse_period_s
        if coarse and held is not True:
            per = tr.period_s or 0.0
            why = "no process information" if held is None else "no visible process"
            return _Candidate(
                State.UNKNOWN,
                None,
                f"data too coarse (one sample per {per:.1f} s) and {why}: a "
                "low flat duty cycle could be small work",
                t,
            )
        cause = self._cause(t, w.span_s)
        note = (
            f"coarse data (one sample per {tr.period_s:.1f} s): judged on the duty cycle alone"
            if coarse
            else None
        )
        return _Candidate(
            State.STARVED,
            cause,
            note,
            t,
            w.span_s * 0.4,
            clear=d < cfg.starved_duty - cfg.clear_margin,
        )

    def _isolated(self, tr: GpuTrack, t: float, w: Window) -> bool:
        """A dip, not a pattern: the window's idle time sits in one gap (open or just
        closed), and at most one gap completed in the isolation window."""
        if w.duty is not None:
            per = tr.period_s or 1.0
            last = tr.open_gap_s() or (tr.gaps.newest() or 0.0)
            idle = (1.0 - w.duty) * w.coverage * w.span_s
            quiet = (1.0 - w.active) * w.coverage * w.span_s  # samples with no activity
            if idle > min(last, quiet) + 1.0 * per + 0.5:
                return False  # idle spread over many short gaps (or partial samples)
        span = max(self.cfg.dip_isolation_s, w.span_s)
        old = tr.hist.at_or_before(t - span)
        done = tr.cum_gaps - (int(old[3]) if old is not None else 0)
        return done <= 1

    def _cause(self, t: float, span: float) -> Cause:
        key = (t, round(span))
        if self._cause_cache is not None and self._cause_cache[0] == key:
            return self._cause_cache[1]
        cause = self._compute_cause(t, span)
        self._cause_cache = (key, cause)
        return cause

    def _compute_cause(self, t: float, span: float) -> Cause:
        cfg = self.cfg
        h = self._host.window(t, span)
        if not h:
            return Cause.UNKNOWN
        wmean = h.get("workers_cpu_pct")
        nworkers = h.get("workers", 0.0)
        host_cpu = h.get("host_cpu_pct")
        main = h.get("main_cpu_pct")
        iowait = h.get("iowait_pct")
        read = h.get("read_bytes_per_s")
        cpu_sat = (
            wmean is not None and nworkers >= 0.5 and wmean >= cfg.cpu_worker_saturated_pct
        ) or (host_cpu is not None and host_cpu >= cfg.cpu_host_saturated_pct)
        io = (iowait is not None and iowait >= cfg.io_iowait_pct) or (
            read is not None and read >= cfg.io_read_bytes_per_s
        )
        if io and not cpu_sat:
            return Cause.IO
        if cpu_sat:
            return Cause.CPU
        if (
            main is not None
            and main >= cfg.gil_main_pct
            and (wmean is None or nworkers < 0.5 or wmean < cfg.gil_rest_max_pct)
        ):
            return Cause.GIL
        return Cause.UNKNOWN

    def _run_rules(self, t: float, cands: dict[int, _Candidate], wins: dict[int, Window]) -> None:
        """Multi-GPU overrides: busy-waiting peers next to a straggler; all-GPU pauses."""
        cfg = self.cfg
        busywait: set[int] = set()
        for idx, w in wins.items():
            tr = self._tracks[idx]
            ref = tr.power_ref_watts(self._run_peak_watts)
            if ref is None or w.power_watts is None:
                continue  # no power reading: a busy GPU is never taken for a waiting one
            if (
                tr.power_watts is None
                or tr.power_watts > cfg.busywait_power_share * ref
                or w.duty is None
                or w.duty * 100 < cfg.busywait_util_pct - 10
            ):
                continue  # drawing real power now, or not pinned: not waiting
            if w.span_s > cfg.busywait_window_s:  # power is a 1 s mean: a short window will do
                w = tr.window(t, cfg.busywait_window_s)
            if (
                w.duty is not None
                and w.power_watts is not None
                and ref
                and tr.seen_work
                and w.duty * 100 >= cfg.busywait_util_pct
                and w.power_watts <= cfg.busywait_power_share * ref
            ):
                busywait.add(idx)
        self._busywait = busywait
        self._straggler = None
        working = [
            i
            for i, tr in self._tracks.items()
            if tr.seen_work and wins[i].duty is not None and tr.held() is not False
        ]
        if busywait:
            others = [i for i in working if i not in busywait]
            strag = [i for i in others if (wins[i].duty or 0.0) * 100 < cfg.busywait_util_pct]
            if strag or len(busywait) == len(working):
                # Most peers pinned at low power: no borderline case, confirm at once.
                clear = len(busywait) >= max(1, len(working) // 2)
                for i in busywait:
                    cands[i] = _Candidate(
                        State.SYNC_STALL,
                        None,
                        "busy-waiting on a peer (high utilisation, low power)",
                        t,
                        wins[i].span_s * 0.5,
                        clear,
                    )
                if strag:
                    s = min(strag, key=lambda i: wins[i].duty or 0.0)
                    self._straggler = s
                    cands[s] = _Candidate(
                        State.SYNC_STALL,
                        None,
                        "straggler: its peers wait on it",
                        t,
                        wins[s].span_s * 0.5,
                        clear,
                    )
        # All-GPU pauses (checkpoints, host syncs), eval by eval.
        prev = self._last_eval if self._last_eval is not None else t
        if self._pauses.step(t, prev, [self._tracks[i] for i in working], self._run_peak_watts):
            for i in working:
                cands[i] = _Candidate(
                    State.SYNC_STALL,
                    None,
                    "all GPUs pause together (checkpoint or host sync)",
                    t,
                    max(0.0, t - self._pauses.first_s),
                )  # first pause on

    def _apply(self, key: int, uuid: str, c: _Candidate, t: float) -> float | None:
        """Hysteresis: switch the GPU's episode once its candidate has lasted long enough."""
        tr = self._tracks[key]
        ep = self._episodes.get(key)
        if ep is not None and c.state is ep.state and c.cause == ep.cause:
            self._pending.pop(key, None)
            self._refresh_evidence(key, tr, t)
            tr.note = c.note if c.note is not None else tr.note
            return None
        pend = self._pending.get(key)
        if pend is None or pend.state is not c.state or pend.cause != c.cause:
            pend = c
            self._pending[key] = pend
        elif c.clear:
            pend.clear = True  # the case became clear while pending
        # Evals come every tick that is >= 0.9 interval on: jittered tick times must not
        # cost a whole extra interval, so the confirmation time allows the same slack.
        if (
            ep is not None
            and t - pend.since_s < self._confirm_s(ep, pend) - 0.1 * self.cfg.eval_interval_s
        ):
            return None
        start = pend.since_s - pend.backdate_s
        if ep is not None:
            start = max(start, ep.start_s)
            self._close(key, start)
        elif tr.first_t is not None:
            start = max(start, tr.first_t)
        self._pending.pop(key, None)
        ev = self._gpu_evidence(tr, t)
        self._evidence[key] = ev
        self._evidence_age[key] = 0
        new = Episode(
            key,
            uuid,
            c.state,
            c.cause,
            start,
            None,
            ev,
            advice_for(c.state, c.cause, ev, c.note),
            c.note,
        )
        self._episodes[key] = new
        self._opened.append(new)
        tr.state = c.state
        tr.note = c.note
        tr.resume_armed = c.state is State.IDLE and tr.seen_work
        return start

    def _confirm_s(self, ep: Episode, c: _Candidate) -> float:
        cfg = self.cfg
        if ep.note == "start-up" and ep.state is State.IDLE:
            # Work has begun: healthy at once; starved only once it outlasts the ramp-up.
            return cfg.eval_interval_s if c.state is State.HEALTHY else cfg.confirm_s
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
            ev = dict(ev)
            ev["duration_s"] = round(end - ep.start_s, 3)
            duty = self._tracks[key].duty_between(ep.start_s, end)
            if duty is not None:
                ev["duty_cycle"] = round(duty, 4)  # over the episode, not the last window
        closed = replace(
            ep, end_s=end, evidence=ev, advice=advice_for(ep.state, ep.cause, ev, ep.note)
        )
        secs = self._seconds.setdefault(key, dict.fromkeys(_ALL_STATES, 0.0))
        secs[ep.state] += end - ep.start_s
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
        note = None
        if State.SYNC_STALL in kinds:
            st = State.SYNC_STALL
        elif State.STARVED in kinds:
            st = State.STARVED
            cause = Counter(ep.cause for ep in states if ep.state is State.STARVED).most_common(1)[
                0
            ][0]
        elif State.HEALTHY in kinds:
            st = State.HEALTHY
        elif kinds == {State.IDLE}:
            st = State.IDLE
            if all(ep.note == "start-up" for ep in states):
                note = "start-up"
        else:
            st = State.UNKNOWN
            note = "no GPU could be classified"
        cur = self._episodes.get(None)
        if cur is not None and cur.state is st and cur.cause == cause:
            return
        start = min(switched) if switched else t
        if cur is not None:
            start = max(start, cur.start_s)
            self._close(None, start)
        else:
            start = min(ep.start_s for ep in states)
        ev = self._run_evidence(t)
        self._evidence[None] = ev
        new = Episode(None, None, st, cause, start, None, ev, advice_for(st, cause, ev, note), note)
        self._episodes[None] = new
        self._opened.append(new)

    # --- evidence ------------------------------------------------------------------------

    def _gpu_evidence(self, tr: GpuTrack, t: float | None) -> Evidence:
        cfg = self.cfg
        ev: Evidence = {}
        if t is None:
            return ev
        span = self._window_s(tr)
        w = tr.window(t, span)
        if w.duty is not None:
            ev["duty_cycle"] = round(w.duty, 4)
        ev["window_s"] = round(w.span_s, 2)
        coarse = tr.period_s is None or tr.period_s >= cfg.coarse_period_s
        if not coarse:
            b, g = tr.bursts.values(), tr.gaps.values()
            for name, vals in (("burst", b), ("gap", g)):
                p50, p90 = quantile(vals, 0.5), quantile(vals, 0.9)
                if p50 is not None and p90 is not None:
                    ev[f"{name}_p50_s"] = round(p50, 3)
                    ev[f"{name}_p90_s"] = round(p90, 3)
            per = tr.cycle_period_s()
            if per is not None:
                ev["period_s"] = round(per, 3)
        if tr.period_s is not None:
            ev["sample_period_s"] = round(tr.period_s, 3)
        ev["samples"] = tr.samples
        if w.power_watts is not None:
            ev["power_watts"] = round(w.power_watts, 1)
            ref = tr.power_ref_watts(self._run_peak_watts)
            if tr.power_peak_watts is not None:
                ev["power_peak_watts"] = round(tr.power_peak_watts, 1)
            if ref:
                ev["power_share_of_peak"] = round(w.power_watts / ref, 3)
        if tr.power_limit_watts is not None:
            ev["power_limit_watts"] = tr.power_limit_watts
        used, total = tr.mem_used_bytes, tr.mem_total_bytes
        if used is not None:
            ev["mem_used_bytes"] = used
        if total:
            ev["mem_total_bytes"] = total
            if used is not None:
                head = 1.0 - used / total
                ev["mem_headroom_ratio"] = round(head, 3)
                ev["larger_batch_fits"] = "yes" if head >= cfg.batch_headroom_ratio else "no"
        if tr.processes is not None:
            ev["processes"] = tr.processes
        h = self._host.window(t, span)
        for k, v in h.items():
            ev[k] = round(v, 1) if k != "read_bytes_per_s" else round(v)
        if self._host.cpu_count is not None:
            ev["cpu_count"] = self._host.cpu_count
        if tr.index == self._straggler:
            ev["straggler_gpu"] = tr.index
        if len(self._tracks) >= 2:
            ev.update(self._multi_evidence(t))
        return ev

    def _multi_evidence(self, t: float) -> Evidence:
        """Run-wide numbers (computed once per eval, shared by every GPU's evidence)."""
        if self._multi_cache is not None and self._multi_cache[0] == t:
            return self._multi_cache[1]
        ev = self._compute_multi(t)
        self._multi_cache = (t, ev)
        return ev

    def _compute_multi(self, t: float) -> Evidence:
        ev: Evidence = {}
        duties = [tr.window(t, self._window_s(tr)).duty for tr in self._tracks.values()]
        known = [d for d in duties if d is not None]
        if known:
            ev["effective_gpus"] = round(sum(known), 2)
        if self._straggler is not None:
            ev["straggler_gpu"] = self._straggler
        spans = list(self._pauses.pauses)
        if spans:
            ev["pauses"] = len(spans)
            ev["pause_p50_s"] = round(quantile([b - a for a, b in spans], 0.5) or 0.0, 2)
            if len(spans) >= 2:
                starts = [a for a, _ in spans]
                gaps = [b - a for a, b in pairwise(starts)]
                ev["pause_interval_p50_s"] = round(quantile(gaps, 0.5) or 0.0, 2)
        if self._pauses.skew_s is not None:
            ev["skew_s"] = round(self._pauses.skew_s, 3)
        return ev

    def _run_evidence(self, t: float | None) -> Evidence:
        if t is None:
            return {}
        ev: Evidence = {"gpus": len(self._tracks)}
        if self._tracks:
            ev.update(self._multi_evidence(t))
        ev["lost_gpu_seconds"] = round(self._lost, 1)
        h = self._host.window(t, self.cfg.window_s * 2)
        for k, v in h.items():
            ev[k] = round(v, 1) if k != "read_bytes_per_s" else round(v)
        return ev
