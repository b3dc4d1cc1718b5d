"""Per-GPU readings: driver points folded into running totals and burst/gap runs.

A ``GpuTrack`` holds what one GPU showed, and only its own methods write it (``ingest``
each tick, ``record`` at each eval, ``reset_cycles`` when the detector says work began);
what the detector decides about the GPU lives apart (``rules.GpuDecision``), and
tests/test_architecture.py holds every other module to reading a track, never writing it.

The per-point loop is the hot path (millions of points per analysed trace): it touches
only local floats and appends a tuple per completed burst or gap, never per point.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpumon.detect.config import DetectorConfig
from gpumon.detect.rings import History, Ring, quantile
from gpumon.model import GpuSample, Point

# Not held, and less memory in use than any CUDA context takes (see GpuTrack._holding).
_NO_CONTEXT = "no context"

# Indices into a History record (running totals at one eval).
H_T, H_COV, H_BUSY, H_GAPS, H_PW, H_PWCOV, H_BURSTS, H_ACT = range(8)


@dataclass(slots=True)  # by position in ``GpuTrack.window``, the hot path (keywords cost 2x)
class Window:
    """What one GPU did over the last window: the numbers every rule reads."""

    span_s: float
    coverage: float  # share of the window covered by samples, 0-1
    duty: float | None  # util-weighted busy share, 0-1; None without samples
    gaps: int  # gaps completed in the window (+1 for a gap still open)
    bursts: int
    power_watts: float | None
    active: float  # share of covered time with any activity (util >= 5 %), 0-1


@dataclass(slots=True, kw_only=True)  # immutable by convention (a frozen one costs 2x to build)
class Rhythm:
    """Gaps that recur at a regular interval: the signature of a periodic stall."""

    period_s: float  # median start-to-start interval
    gap_s: float  # median gap length
    gaps: int  # how many recent gaps form it
    first_start_s: float  # when the first of them began
    last_end_s: float  # when the latest one ended
    cv: float  # coefficient of variation of the intervals


class GpuTrack:
    """What one GPU has shown: bounded, written only by its own ingest (per tick) and
    record (per eval); the detector and its rules read it."""

    def __init__(
        self,
        index: int,
        uuid: str,
        cfg: DetectorConfig,
        power_limit_watts: float | None = None,
        mem_total_bytes: int | None = None,
    ) -> None:
        self.index = index
        self.uuid = uuid
        self.cfg = cfg
        self.last_t: float | None = None  # time of the last point folded in
        self.run_busy = False
        self.run_start = 0.0
        self.period_s: float | None = None
        self.has_fine = False  # ever delivered driver-buffer points
        self.cum_cov = 0.0
        self.cum_busy = 0.0  # util-weighted busy seconds
        self.cum_act = 0.0  # seconds with any activity (util >= 5 %)
        self.was_act = False
        self.act_on = 0.0  # start of the current stretch of activity
        self.cum_gaps = 0
        self.cum_bursts = 0
        self.samples = 0
        self.bursts = Ring(cfg.ring_events)
        self.gaps = Ring(cfg.ring_events)
        self.cycles = Ring(cfg.ring_events)
        self.cycle_ends = Ring(cfg.ring_events)
        self.long_gaps: Ring = Ring(cfg.ring_long_gaps)  # (start, end) of rhythm-sized gaps
        self._rh_key: object = None
        self._rh_val: Rhythm | None = None
        self.first_active_t: float | None = None  # first sample with any activity
        # (covered, busy, gaps, bursts) totals just before it: a short log's work is
        # judged from there on.
        self.first_active_totals: tuple[float, float, int, int] | None = None
        self.first_active_mem: int | None = None  # memory in use when it began
        self._cp_key = -1
        self._cp_t = 0.0
        self._cp_val: float | None = None
        self._gp_t: float | None = None
        self._gp_val: float | None = None
        self.last_burst: float | None = None
        self.cum_pw = 0.0
        self.cum_pw_cov = 0.0
        self.latest: GpuSample | None = None  # the latest tick's readings, as read
        self.sm_active_peak: float | None = None  # highest GPM SM activity seen
        self.power_peak_watts: float | None = None
        self.power_limit_watts = power_limit_watts
        self.mem_used_bytes: int | None = None
        self.mem_total_bytes = mem_total_bytes
        self._held: bool | str | None = None
        self._held_raw: bool | str | None = None
        self._held_ticks = 0
        self.hist = History(cfg.ring_evals)
        self.hist_long = History(cfg.ring_long)
        self._long_t = float("-inf")
        # Memory in use at recent ticks (the last ``warmup_mem_window_s``, and the one
        # before): whether a job is still filling its memory, however often it is sampled.
        self._mem_marks: deque[tuple[float, int]] = deque()
        self.first_t: float | None = None
        # A stream's first reading, while it is the only one: how long a reading lasts is
        # unknown until the second, so it is folded in with that one (see ``_fold``).
        self._lone_first: tuple[Point, bool] | None = None
        self._lead: tuple[float, float] = (0.0, 0.0)  # (covered, busy) s before first_t

    # --- ingestion -----------------------------------------------------------------------

    def ingest(self, g: GpuSample, out_bursts: list, out_gaps: list) -> tuple[float, float]:
        """Fold one tick of one GPU in; completed bursts/gaps go to the two lists.

        Returns the seconds covered and busy it added within the run's own time: the
        duty cycle counts the first reading's whole period, but time lost or worked is
        counted from the stream's start, as the time in each state is."""
        cov0, busy0 = self.cum_cov, self.cum_busy
        if self.first_t is None:  # the stream's start: its first tick, or its backlog's
            pts = g.util_samples
            self.first_t = g.t_s if len(pts) < 2 else min(g.t_s, 2 * pts[0][0] - pts[1][0])
        pts = g.util_samples
        if pts:
            self.has_fine = True
        elif (
            self.has_fine
            and (last := self._last_point_t()) is not None
            and g.t_s - last < 2.5 * (self.period_s or 1.0)
        ):
            pts = ()  # the driver's next sample is simply not due yet
        else:
            # Coarse source, or a buffer silent for longer than its period ("possibly idle",
            # NVML NotFound): fall back on the instantaneous reading, else on power.
            u = g.util_pct
            if (
                (u is None or self.has_fine)
                and g.processes == ()
                and self._looks_powered_down(g.power_watts)
            ):
                # No utilisation reading at all, or a driver buffer gone quiet while the
                # instantaneous reading lags: a GPU that nothing holds and that draws idle
                # power is known to be idle.  With a process on it, no reading stays
                # unknown: "no reading" must never pass for 0 %.
                u = 0.0
            pts = () if u is None else ((g.t_s, u),)
        mem = g.mem_used_bytes
        if mem is not None:  # before the samples: the memory a tick's work began with is its own
            self.mem_used_bytes = mem
            self._mark_mem(g.t_s, mem)
        if pts:
            # A stand-in point for a quiet buffer says nothing about the driver's period.
            self._fold(pts, self.cfg, out_bursts, out_gaps, pts is not g.util_samples)
        lead_cov, lead_busy = self._lead
        self._lead = (0.0, 0.0)
        added = (self.cum_cov - cov0 - lead_cov, self.cum_busy - busy0 - lead_busy)
        # Tick-level readings.
        t_s = g.t_s
        last_tick = None if self.latest is None else self.latest.t_s
        self.latest = g
        p = g.power_watts
        if p is not None:
            if last_tick is not None:
                tick_dt = t_s - last_tick
                if 0 < tick_dt < 10.0:
                    self.cum_pw += p * tick_dt
                    self.cum_pw_cov += tick_dt
            peak = self.power_peak_watts
            if peak is None or p > peak:
                self.power_peak_watts = p
        v = g.power_limit_watts
        if v is not None:
            self.power_limit_watts = v
        v = g.sm_active_ratio
        if v is not None and (self.sm_active_peak is None or v > self.sm_active_peak):
            self.sm_active_peak = v
        v = g.mem_total_bytes
        if v is not None:
            self.mem_total_bytes = v
        # Held or not as it has been for the last few ticks: memory that flickers (a
        # desktop's apps on a GPU the run has left) does not flip it on each reading.  A
        # process the driver lists holds it at once: a job that has just started is not
        # "idle, no process" while it computes.
        raw = self._holding()
        if raw == self._held_raw:
            self._held_ticks += 1
        else:
            self._held_raw, self._held_ticks = raw, 1
        listed = raw is True and (self.processes or 0) > 0
        if listed or self._held_ticks >= 3 or self.samples <= 3 or self._held is None:
            self._held = raw
        return added

    # Readings of the latest tick (None before the first, or where not read).

    @property
    def last_tick_t(self) -> float | None:
        return None if self.latest is None else self.latest.t_s

    @property
    def power_watts(self) -> float | None:
        return None if self.latest is None else self.latest.power_watts

    @property
    def processes(self) -> int | None:
        """How many processes hold the GPU; None where the list could not be read."""
        procs = None if self.latest is None else self.latest.processes
        return None if procs is None else len(procs)

    @property
    def sm_active_ratio(self) -> float | None:
        return None if self.latest is None else self.latest.sm_active_ratio

    @property
    def sm_occupancy_ratio(self) -> float | None:
        return None if self.latest is None else self.latest.sm_occupancy_ratio

    @property
    def tensor_active_ratio(self) -> float | None:
        return None if self.latest is None else self.latest.tensor_active_ratio

    @property
    def lost(self) -> bool:
        """NVML said GpuIsLost on the latest tick."""
        return self.latest is not None and self.latest.lost

    @property
    def readings(self) -> int:
        """Utilisation readings taken in: those folded, and a lone first one waiting."""
        return self.samples + (self._lone_first is not None)

    def totals(self) -> tuple[int, float, float]:
        """(readings, seconds covered, busy seconds) for a summary.  A lone first reading,
        still waiting to learn its length, is the stream's only one: its level is the
        stream's whatever its weight, so it counts as one period of the default length."""
        if self._lone_first is None:  # (it is folded in with the second reading)
            return self.samples, self.cum_cov, self.cum_busy
        (_, u), _ = self._lone_first
        if not 0.0 <= u <= 100.0:
            return self.samples, self.cum_cov, self.cum_busy
        return 1, 1.0, u * 0.01

    def _last_point_t(self) -> float | None:
        """Time of the latest reading taken in, folded or still waiting to be."""
        if self.last_t is None and self._lone_first is not None:
            return self._lone_first[0][0]
        return self.last_t

    def _looks_powered_down(self, p: float | None) -> bool:
        if p is None:
            return False
        refs = [r for r in (self.power_peak_watts, self.power_limit_watts) if r is not None]
        return bool(refs) and p < 0.3 * max(refs)

    def _fold(
        self,
        pts: Sequence[Point],
        cfg: DetectorConfig,
        out_bursts: list[tuple[int, float]],
        out_gaps: list[tuple[int, float]],
        stand_in: bool = False,
    ) -> None:
        if self.last_t is None and self.period_s is None:
            # A reading covers the time since the one before.  The first has none before
            # it, and a lone first reading does not say how long readings last: counted as
            # a guessed second it weighed six times a driver sample, a short run's duty
            # cycle skewed towards whatever the GPU did first.  It waits for the second.
            if self._lone_first is None and len(pts) == 1:
                self._lone_first = (pts[0], stand_in)
                return
            if self._lone_first is not None:
                first, first_stand_in = self._lone_first
                self._lone_first = None
                pts = (first, *pts)
                stand_in = stand_in and first_stand_in
        thr = cfg.busy_util_pct
        last_t = self.last_t
        n = len(pts)
        # Period estimate: spacing of this tick's points, else the step from the last point.
        if stand_in and self.has_fine:
            p_est = None
        elif n >= 2:
            p_est = (pts[-1][0] - pts[0][0]) / (n - 1)
        elif last_t is not None:
            p_est = pts[0][0] - last_t
        else:
            p_est = None
        if p_est is not None and p_est > 0:
            per = self.period_s
            self.period_s = p_est if per is None else per + 0.2 * (p_est - per)
        period = self.period_s or 1.0
        hole = cfg.hole_periods * period if cfg.hole_periods * period > 2.5 else 2.5
        run_busy = self.run_busy
        run_start = self.run_start
        cov = 0.0
        busy = 0.0
        act = 0.0
        was_act = self.was_act
        act_on = self.act_on
        events = []
        if last_t is None:
            first_t, first_u = pts[0]
            last_t = first_t - period
            run_busy = first_u >= thr
            run_start = last_t
            if self.first_t is not None and 0.0 <= first_u <= 100.0:
                # The part of the first reading's period before the stream began (a lone
                # first reading's, all of it): its level is known, but no run time holds it.
                lead = min(period, max(0.0, self.first_t - last_t))
                self._lead = (lead, lead * first_u * 0.01)
        for t, u in pts:
            dt = t - last_t
            if dt <= 0.0:
                continue
            if not 0.0 <= u <= 100.0:
                continue  # NaN or out of range is no reading; it must not poison the sums
            b = u >= thr
            if dt > hole:  # a hole in the data: close the run, count one period only
                events.append((run_busy, last_t - run_start, last_t))
                last_t = t - period
                dt = period
                run_busy = b
                run_start = last_t
            cov += dt
            busy += dt * u
            if u >= 5.0:
                act += dt
                if not was_act:
                    act_on = last_t
                    was_act = True
                    if self.first_active_t is None:
                        self.first_active_t = last_t
                        self.first_active_totals = (
                            self.cum_cov + cov - dt,
                            self.cum_busy + (busy - dt * u) * 0.01,
                            self.cum_gaps,
                            self.cum_bursts,
                        )
                        self.first_active_mem = self.mem_used_bytes
            elif was_act:
                was_act = False
            if b is not run_busy:
                events.append((run_busy, last_t - run_start, last_t))
                run_busy = b
                run_start = last_t
            last_t = t
        self.samples += n
        self.cum_cov += cov
        self.cum_busy += busy * 0.01
        self.cum_act += act
        self.was_act = was_act
        self.act_on = act_on
        self.last_t = last_t
        self.run_busy = run_busy
        self.run_start = run_start
        if events:
            self._events(events, out_bursts, out_gaps)

    def _events(self, events: list, out_bursts: list, out_gaps: list) -> None:
        """Completed bursts and gaps into the rings (and out to the update)."""
        idx = self.index
        last_burst = self.last_burst
        bursts, gaps = self.bursts.append, self.gaps.append
        long_min = self.cfg.rhythm_gap_periods * (self.period_s or 1.0)
        nb = ng = 0
        for was_busy, length, end in events:
            if length <= 0.0:
                continue
            if was_busy:
                bursts(length)
                nb += 1
                last_burst = length
                out_bursts.append((idx, length))
            else:
                gaps(length)
                ng += 1
                if last_burst is not None:
                    self.cycles.append(last_burst + length)
                    self.cycle_ends.append(end)
                if length >= long_min:
                    self.long_gaps.append((end - length, end))
                out_gaps.append((idx, length))
        self.last_burst = last_burst
        self.cum_bursts += nb
        self.cum_gaps += ng

    # --- windows -------------------------------------------------------------------------

    def record(self, t: float) -> None:
        """Push the running totals at an eval time (one record per eval), and every
        ``long_record_s`` into the long history that long windows read."""
        rec = (
            t,
            self.cum_cov,
            self.cum_busy,
            self.cum_gaps,
            self.cum_pw,
            self.cum_pw_cov,
            self.cum_bursts,
            self.cum_act,
        )
        self.hist.push(rec)
        if t - self._long_t >= self.cfg.long_record_s or self.hist_long.n == 0:
            self.hist_long.push(rec)
            self._long_t = t

    def window(self, t: float, span_s: float) -> Window:
        """Totals over the last ``span_s`` seconds before ``t`` (after ``record(t)``).

        Spans the per-eval history no longer reaches are read from the long history
        (a record every ``long_record_s``): a rhythm of minutes needs minutes of window.
        """
        cut = t - span_s
        old = self.hist.at_or_before(cut)
        if old is not None and old[H_T] > cut + self.cfg.eval_interval_s and self.hist_long.n:
            far = self.hist_long.at_or_before(cut)
            if far is not None and far[H_T] < old[H_T]:
                old = far
        if old is None:
            return Window(span_s, 0.0, None, 0, 0, None, 0.0)  # (fields in order)
        span = t - old[H_T]
        if span <= 0:
            span = span_s
        cov = self.cum_cov - old[H_COV]
        if cov > 0:
            duty = (self.cum_busy - old[H_BUSY]) / cov
            # Clamped to [0, 1] (NaN reads 0, as min(1, max(0, x)) would have it).
            if duty >= 0.0:
                if duty > 1.0:
                    duty = 1.0
            else:
                duty = 0.0
            act = (self.cum_act - old[H_ACT]) / cov
            if not act < 1.0:
                act = 1.0
        else:
            duty = None
            act = 0.0
        gaps = self.cum_gaps - int(old[H_GAPS]) + (0 if self.run_busy else 1)
        pwc = self.cum_pw_cov - old[H_PWCOV]
        pw = (self.cum_pw - old[H_PW]) / pwc if pwc > 0 else self.power_watts
        c = cov / span
        if not c < 1.0:
            c = 1.0
        return Window(span, c, duty, gaps, self.cum_bursts - int(old[H_BURSTS]), pw, act)

    def rhythm(self) -> Rhythm | None:
        """The recent long gaps, if they recur at a regular interval (cached per gap).

        A gap in progress counts once it is long enough: the rhythm is seen when its third
        gap begins, not when it ends.
        """
        long_min = self.cfg.rhythm_gap_periods * (self.period_s or 1.0)
        open_long = not self.run_busy and self.open_gap_s() >= long_min
        key = (self.cum_gaps, self.run_start if open_long else None)
        if key == self._rh_key:
            return self._rh_val
        self._rh_key = key
        gaps = list(self.long_gaps)
        if open_long:
            gaps.append((self.run_start, self.last_t))
        self._rh_val = find_rhythm(gaps, self.cfg)
        return self._rh_val

    def rhythm_shorter_than(self, limit_s: float) -> bool:
        """Whether no rhythm of the recent long gaps can last ``limit_s`` or more, known
        without looking for one: a rhythm always takes in the newest interval between
        long gaps, and its intervals lie within ``rhythm_max_ratio`` of each other, so its
        period is at most that ratio times the newest interval.  (A starved GPU's gaps
        complete every step: ``find_rhythm`` is then not run each eval to learn that.)"""
        gaps = self.long_gaps
        cfg = self.cfg
        if not self.run_busy and self.open_gap_s() >= cfg.rhythm_gap_periods * (
            self.period_s or 1.0
        ):
            if not gaps:
                return True  # one gap is no rhythm
            newest = self.run_start - gaps[-1][0]  # the open gap counts (see ``rhythm``)
        elif len(gaps) < 2:
            return True
        else:
            newest = gaps[-1][0] - gaps[-2][0]
        return max(cfg.rhythm_max_ratio, cfg.rhythm_max_ratio_2) * newest < limit_s

    def open_gap_s(self) -> float:
        """Length of the gap in progress (0 while busy)."""
        if self.run_busy or self.last_t is None:
            return 0.0
        return self.last_t - self.run_start

    def cycle_period_s(self, t: float | None = None, recent_s: float = 90.0) -> float | None:
        """Median burst+gap cycle, of cycles that ended in the last ``recent_s``.

        Cached: recomputed when a gap completed or 10 s passed (quantiles are not free).
        """
        if t is None:
            return self._cycle_period(None, recent_s)
        key = self.cum_gaps
        if (key == self._cp_key or self._cp_val is not None) and t - self._cp_t < 5.0:
            return self._cp_val
        self._cp_key, self._cp_t = key, t
        self._cp_val = self._cycle_period(t, recent_s)
        return self._cp_val

    def reset_cycles(self) -> None:
        """Forget the cycle pattern (start-up blips are no pattern)."""
        self.cycles = Ring(self.cfg.ring_events)
        self.cycle_ends = Ring(self.cfg.ring_events)
        self.long_gaps = Ring(self.cfg.ring_long_gaps)
        self._cp_key = -1
        self._rh_key = None

    def _cycle_period(self, t: float | None, recent_s: float) -> float | None:
        vals = self.cycles.values()
        if t is not None:
            # Cycle ends are pushed in stream order (non-decreasing): the recent ones are
            # a tail, found by bisection instead of a scan of the whole ring.
            ends = self.cycle_ends
            cut = t - recent_s
            if ends and not ends[0] >= cut:
                vals = vals[bisect_left(ends, cut) :]
        if len(vals) < 3:
            return None
        vals.sort()
        return vals[len(vals) // 2]

    def duty_between(self, a: float, b: float) -> float | None:
        """Duty cycle over [a, b] from the eval history (None once a left the ring)."""
        ra, rb = self.hist.at_or_before(a), self.hist.at_or_before(b)
        if ra is None or rb is None or ra[H_T] > a + self.cfg.eval_interval_s * 2:
            return None
        cov = rb[H_COV] - ra[H_COV]
        if cov <= 0:
            return None
        return min(1.0, max(0.0, (rb[H_BUSY] - ra[H_BUSY]) / cov))

    def gap_p90_s(self, t: float) -> float | None:
        """90th percentile of the recent gaps (cached for 5 s)."""
        if self._gp_t is not None and t - self._gp_t < 5.0:
            return self._gp_val
        self._gp_t = t
        vals = self.gaps.values()
        # The same quantile as the evidence's, so the rules and the report agree.
        self._gp_val = quantile(vals, 0.9) if len(vals) >= 3 else None
        return self._gp_val

    def _mark_mem(self, t: float, mem: int) -> None:
        marks = self._mem_marks
        marks.append((t, mem))
        horizon = t - self.cfg.warmup_mem_window_s
        while len(marks) >= 2 and marks[1][0] <= horizon:
            marks.popleft()

    def mem_at(self, t: float) -> int | None:
        """Memory in use at ``t`` (the last reading by then), or the oldest reading kept
        when ``t`` is before it; None without readings."""
        at = None
        for mt, mem in self._mem_marks:
            if mt > t:
                break
            at = mem
        if at is None and self._mem_marks:
            at = self._mem_marks[0][1]
        return at

    def held(self) -> bool | None:
        """Whether a process holds this GPU (as of the last few ticks folded in)."""
        h = self._held
        return False if h == _NO_CONTEXT else h  # type: ignore[return-value]

    def no_context(self) -> bool:
        """Not held because less memory is in use than any CUDA context takes (over the
        last few ticks): nothing that computes can be running on it."""
        return self._held == _NO_CONTEXT

    def _holding(self) -> bool | str | None:
        """Whether a process holds this GPU: the process list, else memory in use
        (``_NO_CONTEXT``: not held, and less memory in use than any CUDA context takes)."""
        procs = self.processes
        if procs is not None and procs > 0:
            return True
        used, total = self.mem_used_bytes, self.mem_total_bytes
        cfg = self.cfg
        if used is not None and total:
            if used > min(cfg.held_mem_share * total, cfg.held_mem_bytes):
                return True
            if used < cfg.no_context_mem_bytes:
                return _NO_CONTEXT  # (less than any CUDA context takes: nothing holds it)
            return False if procs == 0 else None
        if procs == 0:
            return False
        # No process list and no memory reading (a W&B or dmon log): power well above
        # idle says something runs on it.
        return True if self.powered_up() else None

    def powered_up(self) -> bool:
        """Drawing well above idle power (a share of its limit): something runs on it."""
        p, lim = self.power_watts, self.power_limit_watts
        return p is not None and lim is not None and p >= self.cfg.working_power_share * lim

    def power_ref_watts(self, run_peak: float | None) -> float | None:
        """What this GPU draws when really computing: run peak, or a share of the limit."""
        ref = run_peak
        lim = self.power_limit_watts
        if lim is not None:
            alt = self.cfg.power_ref_of_limit * lim
            ref = alt if ref is None or alt > ref else ref
        return ref

    def spinning_now(self, run_peak_watts: float | None, run_sm_peak: float | None) -> bool | None:
        """Whether the latest tick looks like a spin in a collective (callers check that
        utilisation is pinned): few SMs active where GPM reads, well below what the run's
        GPUs reach when they compute; without GPM, little power.  None: neither is read."""
        cfg = self.cfg
        sm = self.sm_active_ratio
        if sm is not None:
            share = cfg.busywait_sm_share * (run_sm_peak or 0.0)
            return sm <= max(cfg.busywait_sm_active_ratio, share)
        ref = self.power_ref_watts(run_peak_watts)
        p = self.power_watts
        if ref is None or p is None:
            return None
        return p <= cfg.busywait_power_share * ref


def sm_active_peak(tracks: Iterable[GpuTrack]) -> float | None:
    """The highest SM activity any of these GPUs has shown (None: none reads GPM)."""
    peaks = [tr.sm_active_peak for tr in tracks if tr.sm_active_peak is not None]
    return max(peaks) if peaks else None


def find_rhythm(gaps: list[tuple[float, float]], cfg: DetectorConfig) -> Rhythm | None:
    """Regular recurrence among ``(start, end)`` gaps, newest last: the longest recent run
    of at least ``rhythm_min_gaps`` gaps whose start-to-start intervals agree.

    One pass backwards from the newest gap with running sums (it runs whenever a gap
    completes, which on a starved stream is several times a second: plain comparisons,
    no calls, in the loop).
    """
    n_min = cfg.rhythm_min_gaps
    n = len(gaps)
    if n < n_min:
        return None
    max_cv, max_ratio, max_ratio_2 = cfg.rhythm_max_cv, cfg.rhythm_max_ratio, cfg.rhythm_max_ratio_2
    best_k = 0
    best_cv = 0.0
    total = total_sq = 0.0
    lo, hi = float("inf"), 0.0
    ivs: list[float] = []  # the run's intervals, newest first
    later = gaps[-1][0]
    for k in range(2, n + 1):  # the run is gaps[-k:]; its newest interval joins each step
        start = gaps[n - k][0]
        iv = later - start
        later = start
        if iv <= 0:
            break
        ivs.append(iv)
        total += iv
        total_sq += iv * iv
        if iv < lo:
            lo = iv
        if iv > hi:
            hi = iv
        m = k - 1  # intervals in the run
        if k < n_min:
            continue
        mean = total / m
        var = total_sq / m - mean * mean
        cv = (var if var > 0.0 else 0.0) ** 0.5 / mean
        if cv > max_cv or hi > (max_ratio if m > 2 else max_ratio_2) * lo:
            break
        best_k, best_cv = k, cv
    if not best_k:
        return None
    run = gaps[n - best_k :]
    ivs = sorted(ivs[: best_k - 1])
    lens = sorted([b - a for a, b in run])
    return Rhythm(
        period_s=ivs[len(ivs) // 2],
        gap_s=lens[len(lens) // 2],
        gaps=best_k,
        first_start_s=run[0][0],
        last_end_s=run[-1][1],
        cv=best_cv,
    )
