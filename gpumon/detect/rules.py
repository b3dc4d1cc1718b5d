"""The per-GPU rules: each reads one GPU at one eval and returns a candidate state, or None.

A rule reads a ``GpuContext``: the GPU's readings (``c.tr``: the ``GpuReadings`` of its
``GpuTrack``, which only the track's own ingest writes), what the detector has decided
about it so far (``c.now``, a frozen ``GpuDecision``), its window, the time and the
config; it returns a ``Candidate`` (the state it proposes and why) or None, and writes
nothing.  The detector asks them in order (``judge_before_work``, then ``judge_work``);
the first that answers decides, and hysteresis turns a candidate into an episode.
Between the two, ``enter_work`` says whether the GPU's work has begun or resumed; the
detector applies what it returns.

Each rule is one statement a person could make about a GPU ("a GPU that fell off the bus is
unknown", "gaps that recur at a regular interval are starvation even at a high duty
cycle"), and each is tested on data alone (tests/test_rules.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from gpumon.detect.config import DetectorConfig
from gpumon.detect.gpu import Rhythm, Window
from gpumon.detect.rings import History, Ring
from gpumon.model import Cause, Reason, State


class GpuReadings(Protocol):
    """What the rules may read of one GPU's track (``gpu.GpuTrack``), all read-only."""

    @property
    def period_s(self) -> float | None: ...  # the driver's sample period (None: unknown)
    @property
    def samples(self) -> int: ...  # utilisation readings folded in
    @property
    def readings(self) -> int: ...  # ... and a lone first one, waiting for its length
    @property
    def first_t(self) -> float | None: ...  # when its stream began
    @property
    def first_active_t(self) -> float | None: ...  # its first sample with any activity
    @property
    def run_busy(self) -> bool: ...  # busy in the run of samples now
    @property
    def run_start(self) -> float: ...  # when that run began
    @property
    def was_act(self) -> bool: ...  # active in the latest sample
    @property
    def act_on(self) -> float: ...  # when that stretch of activity began
    @property
    def cum_gaps(self) -> int: ...  # gaps completed since the stream began
    @property
    def bursts(self) -> Ring: ...  # recent burst lengths
    @property
    def gaps(self) -> Ring: ...  # recent gap lengths
    @property
    def long_gaps(self) -> Ring: ...  # (start, end) of recent rhythm-sized gaps
    @property
    def hist(self) -> History: ...  # running totals at each eval
    @property
    def mem_used_bytes(self) -> int | None: ...
    @property
    def lost(self) -> bool: ...  # NVML said GpuIsLost on the latest tick

    def window(self, t: float, span_s: float) -> Window: ...
    def rhythm(self) -> Rhythm | None: ...
    def rhythm_shorter_than(self, limit_s: float) -> bool: ...
    def open_gap_s(self) -> float: ...
    def gap_p90_s(self, t: float) -> float | None: ...
    def mem_at(self, t: float) -> int | None: ...
    def held(self) -> bool | None: ...
    def no_context(self) -> bool: ...


@dataclass(slots=True, kw_only=True)  # a value: never changed once built (frozen costs 4x)
class Candidate:
    """A state a rule proposes, with why; hysteresis decides whether it becomes an episode."""

    state: State
    cause: Cause | None = None
    reason: Reason | None = None
    detail: str | None = None  # numbers for the note ("a 4.5 s gap every 27 s")
    since_s: float = 0.0
    backdate_s: float = 0.0  # how far before ``since_s`` the state began
    clear: bool = False  # far past the threshold: confirm at the next eval


@dataclass(slots=True, frozen=True, kw_only=True)
class GpuDecision:
    """What the detector has decided about one GPU so far: the state it shows and where
    its work began.  The detector owns it and replaces it as it decides; the rules read
    it (a rule proposes, the detector decides)."""

    state: State = State.IDLE
    cause: Cause | None = None
    reason: Reason | None = Reason.START_UP
    detail: str | None = None
    seen_work: bool = False  # past start-up: its first sustained work has begun
    work_start_s: float | None = None  # start of the current stretch of work
    work_began_s: float | None = None  # the first work after start-up
    # Gaps completed by then: the idle before a GPU's first work is start-up, never a
    # gap (a healthy run's first dip is isolated however soon after start-up it comes).
    startup_gaps: int = 0
    resume_armed: bool = False  # idle after work: the next burst restarts the window


# Whether the GPU's latest idle time is one dip, not a pattern (the detector's judgment).
Isolated = Callable[[GpuReadings, GpuDecision, float, Window], bool]


@dataclass(slots=True, kw_only=True)
class GpuContext:
    """What the rules read about one GPU at one eval (built once, shared by the rules)."""

    tr: GpuReadings  # its readings: read, never written, by the rules
    now: GpuDecision  # what the detector has decided about it so far
    w: Window
    t: float
    cfg: DetectorConfig
    # The host cause over (t, span), given the cause named so far (causes have hysteresis).
    cause_of: Callable[[float, float, Cause | None], Cause]
    isolated: Isolated  # one dip, not a pattern
    duty: float | None = field(default=None, init=False)
    held: bool | None = field(default=None, init=False)
    period_s: float = field(default=1.0, init=False)
    coarse: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.duty = self.w.duty
        self.held = self.tr.held()
        self.period_s = self.tr.period_s or 1.0
        self.coarse = self.tr.period_s is None or self.tr.period_s >= self.cfg.coarse_period_s

    def keep(self) -> Candidate:
        """The GPU's current state, unchanged (a dip, or too soon to tell)."""
        now = self.now
        return Candidate(
            state=now.state, cause=now.cause, reason=now.reason, detail=now.detail, since_s=self.t
        )

    def is_isolated(self) -> bool:
        """Whether the window's idle time is one dip, not a pattern."""
        return self.isolated(self.tr, self.now, self.t, self.w)


Rule = Callable[[GpuContext], Candidate | None]


# --- rules that need no work ------------------------------------------------------------


def lost_gpu(c: GpuContext) -> Candidate | None:
    """A GPU that fell off the bus is unknown at once: its last readings mean nothing."""
    if c.tr.lost:
        return Candidate(
            state=State.UNKNOWN,
            reason=Reason.GPU_LOST,
            detail="fell off the bus",
            since_s=c.t,
            clear=True,
        )
    return None


def stream_begins(c: GpuContext) -> Candidate | None:
    """Too little data in the first seconds of a stream: start-up, not unknown."""
    tr, cfg = c.tr, c.cfg
    if (
        (c.duty is None or c.w.coverage < cfg.min_coverage)
        and not c.now.seen_work
        and tr.readings > 0
        and tr.first_t is not None
        and c.t - tr.first_t < cfg.window_s
    ):
        return Candidate(state=State.IDLE, reason=Reason.START_UP, since_s=c.t)
    return None


def no_data(c: GpuContext) -> Candidate | None:
    """No reading, or readings covering too little of the window: unknown, never idle."""
    if c.duty is not None and c.w.coverage >= c.cfg.min_coverage:
        return None
    if c.tr.readings == 0:
        return Candidate(state=State.UNKNOWN, reason=Reason.NO_DATA, since_s=c.t)
    return Candidate(
        state=State.UNKNOWN,
        reason=Reason.TOO_LITTLE_DATA,
        detail=f"too few samples in the last {c.w.span_s:.0f} s",
        since_s=c.t,
    )


# --- start-up ---------------------------------------------------------------------------


def enter_work(c: GpuContext) -> GpuDecision | None:
    """The GPU's decision with its first sustained work begun (out of start-up), or with
    its window restarted where work resumes after idleness (so the idle stretch does not
    read as starvation); None when neither.  The detector applies it (and, where work
    began, forgets the start-up's cycles: its blips are no pattern) before ``judge_work``."""
    tr, now = c.tr, c.now
    assert c.duty is not None
    if not now.seen_work:
        onset = _first_work(c)
        if onset is None:
            return None
        start = onset + (tr.period_s or 0.0)  # skip the first, partial sample
        return replace(
            now,
            seen_work=True,
            work_start_s=start,
            work_began_s=start,
            startup_gaps=tr.cum_gaps,
        )
    if now.state is State.IDLE and now.resume_armed and tr.run_busy:
        return replace(now, resume_armed=False, work_start_s=tr.run_start)
    return None


def _first_work(c: GpuContext) -> float | None:
    """When the GPU's first sustained work began, if it has: the latest seconds at the
    healthy level with no gap (a GPU busy from its first sample needs no full window), or
    a full window mostly active (bursts and gaps need one to be judged)."""
    tr, cfg, t, w = c.tr, c.cfg, c.t, c.w
    if tr.first_t is None:
        return None
    span = t - tr.first_t
    young = _young_s(c)
    if span >= young:
        wy = tr.window(t, young)
        if (
            wy.duty is not None
            and wy.duty >= cfg.healthy_duty
            and wy.gaps == 0
            and wy.coverage >= 0.9
        ):
            # Since the busy stretch began (not the warm-up's blips before it).
            onset = tr.run_start if tr.run_busy else t - young
            return max(tr.first_t, min(onset, t - young))
    d = c.duty or 0.0
    working = d >= cfg.startup_duty or w.active >= cfg.startup_active
    full = span >= 0.9 * cfg.window_s
    if not ((working or w.bursts >= cfg.startup_bursts) and full and w.coverage >= 0.9):
        return None
    # The work began where the window's activity did; continuous work since a later
    # point means the blips before it were no work.
    onset = t - w.active * w.span_s
    if tr.was_act and t - tr.act_on >= max(2.0, 2 * (tr.period_s or 0.0)) and tr.act_on > onset:
        onset = tr.act_on
    return onset


def before_work(c: GpuContext) -> Candidate | None:
    """Until its first sustained work a GPU is starting up; after ``startup_max_s`` without
    work it is just idle: holding memory with nothing running, or held by no one.  A GPU
    that is already active, with too little of it yet to judge, is being judged: never
    called idle, shown with what it looks like so far."""
    tr, cfg = c.tr, c.cfg
    if c.now.seen_work:
        return None
    if c.held is False:  # held by no one since the stream began: idle since then
        since = c.t - tr.first_t if tr.first_t is not None else 0.0
        return Candidate(state=State.IDLE, reason=Reason.NO_PROCESS, since_s=c.t, backdate_s=since)
    if tr.first_t is not None and c.t - tr.first_t >= cfg.startup_max_s:
        # No work came: it was never starting up, just idle (backdated to the start).
        reason = Reason.MEMORY_HELD if c.held else Reason.NO_WORK
        return Candidate(state=State.IDLE, reason=reason, since_s=c.t, backdate_s=c.t - tr.first_t)
    w, recent = c.w, tr.window(c.t, cfg.eval_interval_s)  # the window; the latest second
    if recent.duty is not None and recent.duty >= cfg.busy_util_pct / 100.0:
        w = recent  # busy now: work has just begun, however quiet the window before it
    elif not (
        w.duty is not None
        and (w.duty >= cfg.startup_duty or w.active >= cfg.startup_active or bursty(w))
    ):
        return Candidate(state=State.IDLE, reason=Reason.START_UP, since_s=c.t)
    return provisional(c, w)


def provisional(c: GpuContext, w: Window) -> Candidate:
    """A GPU being judged, shown as what it looks like so far (reason ``judging``): healthy
    while it is busy, else starved with the cause the host shows so far -- the state a
    person watching would name, marked as not yet confirmed (never unknown, never idle).
    A GPU that has looked starved stays so until it is judged (healthy once busy for the
    seconds a first judgment needs), so a warm-up's reading does not flicker."""
    tr, now, cfg = c.tr, c.now, c.cfg
    d = w.duty or 0.0
    detail = f"duty {100 * d:.0f} % so far"
    looked_starved = now.reason is Reason.JUDGING and now.state is State.STARVED
    if not looked_starved and (d >= cfg.healthy_duty or unbroken_since_first_activity(tr)):
        return Candidate(state=State.HEALTHY, reason=Reason.JUDGING, detail=detail, since_s=c.t)
    current = now.cause if looked_starved else None
    cause = c.cause_of(c.t, max(w.span_s, cfg.eval_interval_s), current)
    return Candidate(
        state=State.STARVED, cause=cause, reason=Reason.JUDGING, detail=detail, since_s=c.t
    )


def unbroken_since_first_activity(tr: GpuReadings) -> bool:
    """Busy without a break since its first activity (its ramp-up sample aside): a GPU
    that has not yet waited once does not look starved, whatever its first partial sample
    does to the duty."""
    first = tr.first_active_t
    if not tr.run_busy or first is None:
        return False
    return tr.run_start <= first + 2 * (tr.period_s or 0.0)


def _unjudged(now: GpuDecision) -> bool:
    """Idle before this work, or being judged: the work has no verdict of its own yet."""
    return now.state is State.IDLE or now.reason is Reason.JUDGING


def _young_s(c: GpuContext) -> float:
    """How much work a first judgment needs: 2 s of fine samples, 1.5 coarse ones."""
    return 2.0 if c.period_s < c.cfg.coarse_period_s else max(3.0, 1.5 * c.period_s)


def too_young(c: GpuContext) -> Candidate | None:
    """Work that has just begun is not judged yet, nor a job whose memory is still filling
    up after its first work (it is loading, warming up): the GPU stays as it was."""
    tr, start = c.tr, c.now.work_start_s
    if start is None or not _unjudged(c.now):
        return None
    if c.t - start < _young_s(c):
        return c.keep()
    # Memory still rising over the last seconds (since the work began, at most): the job
    # is loading and warming up, judged once it stops.
    mem0 = tr.mem_at(max(c.t - c.cfg.warmup_mem_window_s, start))
    mem = tr.mem_used_bytes
    if (
        mem0 is not None
        and mem is not None
        and mem > c.cfg.warmup_mem_rise * max(mem0, 1)
        and c.t - start < c.cfg.startup_max_s
    ):
        return c.keep()
    return None


def first_judgment(c: GpuContext) -> Candidate | None:
    """New work is healthy if its latest samples are (a ramp-up sample or an early start
    estimate must not read as starvation, nor keep a GPU starved while its window still
    reaches back to that start)."""
    tr, now, cfg = c.tr, c.now, c.cfg
    start = now.work_start_s
    if start is None:
        return None
    cur = now.state
    if not (_unjudged(now) or (cur is State.STARVED and c.t - c.w.span_s < start + c.period_s)):
        return None
    young = _young_s(c)
    if now.reason is Reason.JUDGING and cur is State.STARVED:
        # It has waited already: the busy stretch now must outlast the bursts between its
        # waits so far (a warm-up's blips, not the next burst of a rhythm) to be healthy.
        longest = max(tr.bursts, default=0.0)
        if not tr.run_busy or c.t - tr.run_start < max(young, 1.5 * longest):
            return None
    wy = tr.window(c.t, max(young, 2 * c.period_s))
    if (
        wy.duty is not None
        and wy.duty >= cfg.healthy_duty
        and (wy.gaps == 0 or c.period_s >= cfg.coarse_period_s)
    ):
        # Healthy since the work began: a stream that opens busy has no start-up to show.
        return Candidate(state=State.HEALTHY, since_s=c.t, backdate_s=max(young, c.t - start))
    return None


# --- judging work -----------------------------------------------------------------------


def idle(c: GpuContext) -> Candidate | None:
    """Almost no activity over the window -- or a gap in progress longer than any dip or
    than this GPU's own starvation gaps -- is idleness; one short dip of a healthy GPU is
    not a state change."""
    tr, state, cfg, t = c.tr, c.now.state, c.cfg, c.t
    d = c.duty
    assert d is not None
    gap = tr.open_gap_s()
    long_gap = cfg.idle_gap_s if c.held is False else cfg.dip_max_s
    if state is State.STARVED and gap >= long_gap:
        p90 = tr.gap_p90_s(t)
        if p90 is not None:
            long_gap = max(long_gap, 2.5 * p90)
        rh = tr.rhythm()
        if rh is not None:
            long_gap = max(long_gap, 2.0 * rh.gap_s + 2 * c.period_s)
    if d >= cfg.idle_duty and gap >= long_gap:
        wg = tr.window(t, gap - cfg.eval_interval_s)  # records are per eval
        if wg.duty is not None and wg.duty < cfg.idle_duty and wg.coverage >= 0.5:
            d = wg.duty
    if d >= cfg.idle_duty:
        return None
    if c.held is True and c.w.active >= 0.5 and tr.open_gap_s() < long_gap:
        return None  # a little work in most samples, from a process that holds the GPU
    if (
        c.held is not False
        and state in (State.HEALTHY, State.SYNC_STALL)
        and gap < cfg.dip_max_s
        and c.is_isolated()
    ):
        return c.keep()  # a dip: keep the state
    if state is State.STARVED and gap < long_gap and tr.rhythm() is not None:
        return c.keep()  # inside one of the rhythm's own gaps
    reason = (
        Reason.NO_PROCESS if c.held is False else Reason.MEMORY_HELD if c.held else Reason.NO_WORK
    )
    return Candidate(state=State.IDLE, reason=reason, since_s=t, backdate_s=gap)


def no_run(c: GpuContext) -> Candidate | None:
    """A GPU with less memory in use than any CUDA context takes, and no process, for
    several ticks running, has no run to starve: whatever reads on it (a
    display, a monitoring client, a desktop) is no compute workload -- the run has ended."""
    tr, cfg = c.tr, c.cfg
    if tr.no_context() and c.duty is not None and c.duty < cfg.starved_duty:
        return Candidate(
            state=State.IDLE, reason=Reason.NO_PROCESS, since_s=c.t, backdate_s=tr.open_gap_s()
        )
    # (An empty process list alone is not enough: some containers list no process at
    # all.  Pinned with no visible process is some work, not ours to call idle.)
    return None


def periodic_gaps(c: GpuContext) -> Candidate | None:
    """Gaps that recur at a regular interval and take a real share of the time are
    starvation even at a duty cycle up to ~0.88: a DataLoader restarting its workers every
    epoch, or a checkpoint or evaluation every N steps."""
    tr, cfg, t = c.tr, c.cfg, c.t
    low = c.duty is not None and c.duty < cfg.starved_duty
    if low and tr.rhythm_shorter_than(cfg.window_s):
        return None  # any rhythm is short and well below the line: as below, unsought
    rh = tr.rhythm()
    if rh is None or rh.period_s * 2.5 > cfg.rhythm_window_max_s:
        return None  # none, or too slow for a window to hold a few of its cycles
    if rh.period_s < cfg.window_s and low:
        return None  # a short rhythm well below the line: plain starvation (``starved``)
    gap = tr.open_gap_s()
    if gap > 2.0 * rh.gap_s + 2 * c.period_s:
        return None  # a gap far longer than the rhythm's own: idleness (the next rule)
    since_gap = 0.0 if gap > 0 else t - rh.last_end_s
    if since_gap > 1.5 * rh.period_s:
        return None  # no gap where the next was due: the pattern has stopped
    # Over the rhythm itself: from its first gap on (never back into start-up; resumes
    # are the rhythm's), for the duty cycle and the host's cause.
    span = min(cfg.rhythm_window_max_s, max(t - rh.first_start_s, c.w.span_s))
    began = c.now.work_began_s
    if began is not None:
        span = min(span, max(c.w.span_s, t - began))
    wl = tr.window(t, span)
    if wl.duty is None or wl.coverage < cfg.min_coverage or wl.duty < cfg.idle_duty:
        return None
    # The share of time its gaps take is measured over whole periods (a gap per period):
    # from its first gap on, the work before that gap is missing and the share reads a
    # third too high over three gaps; nor is a burst at 97 % utilisation part idle.
    need = cfg.rhythm_exit_share if c.now.state is State.STARVED else cfg.rhythm_idle_share
    if rh.gap_s / rh.period_s < need:
        return None
    long_period = rh.period_s >= 10.0
    detail = f"a {rh.gap_s:.1f} s gap every {rh.period_s:.0f} s" if long_period else None
    return Candidate(
        state=State.STARVED,
        cause=c.cause_of(t, span, c.now.cause),
        reason=Reason.PERIODIC_GAPS if long_period else None,
        detail=detail,
        since_s=t,
        backdate_s=max(0.0, t - rh.first_start_s),
        clear=wl.duty < cfg.starved_duty - cfg.clear_margin,
    )


def healthy(c: GpuContext) -> Candidate | None:
    """A duty cycle at the healthy level (or above the starved line for a GPU that is not
    starved: hysteresis) is healthy."""
    d, cfg = c.duty, c.cfg
    assert d is not None
    if d >= cfg.healthy_duty:
        return Candidate(state=State.HEALTHY, since_s=c.t, backdate_s=c.w.span_s * 0.5)
    if d < cfg.starved_duty and c.now.state is State.HEALTHY:
        d = _over_whole_period(c, d)
    if d < cfg.starved_duty or c.now.state is State.STARVED:
        return None
    # In the band between: hysteresis keeps a GPU healthy -- unless the duty cycle has
    # stayed below the line for a long window of work (start-up's idleness is no part of
    # it): that is no borderline flicker.
    began = c.now.work_began_s
    if began is None or c.t - began >= cfg.sustained_window_s:
        wl = c.tr.window(c.t, cfg.sustained_window_s)
        if wl.duty is not None and wl.coverage >= 0.9 and wl.duty < cfg.sustained_duty:
            return None
    return Candidate(state=State.HEALTHY, since_s=c.t, backdate_s=c.w.span_s * 0.5)


def _over_whole_period(c: GpuContext, d: float) -> float:
    """The duty cycle of a dip's whole period: a window holding one dip, shorter than the
    time since the GPU's previous dip, is read from that dip's end on (at most
    ``window_max_s``): a 2 s dip every 20 s is a tenth of the time, not a quarter of an
    8 s window."""
    tr, cfg, t, w = c.tr, c.cfg, c.t, c.w
    start = t - w.span_s
    inside = sum(1 for _, end in tr.long_gaps if end > start) + (0 if tr.run_busy else 1)
    if inside > 1:
        return d  # several gaps in the window: a pattern, judged as it reads
    prev = max((end for _, end in tr.long_gaps if end <= start), default=None)
    if prev is None or t - prev > cfg.window_max_s:
        return d
    wp = tr.window(t, t - prev)
    return d if wp.duty is None or wp.coverage < cfg.min_coverage else max(d, wp.duty)


def healthy_dip(c: GpuContext) -> Candidate | None:
    """One isolated dip of a healthy GPU (a checkpoint, a hand-over) keeps it healthy."""
    if c.now.state is State.HEALTHY and c.is_isolated() and c.tr.open_gap_s() < c.cfg.dip_max_s:
        return Candidate(state=State.HEALTHY, since_s=c.t)
    return None


def bursty(w: Window) -> bool:
    """Bursts and gaps both seen in the window: work that stops and starts."""
    return w.bursts >= 2 and w.gaps >= 2


def coarse_unjudgeable(c: GpuContext) -> Candidate | None:
    """On coarse data a *flat* duty cycle below ``small_work_duty`` with no sign that a
    process holds the GPU could be small work (or a display); above it the GPU is plainly
    working at a fraction of its capacity, and bursts and gaps are starvation's signature
    anyway."""
    d = c.duty
    assert d is not None
    if not c.coarse or c.held is True or bursty(c.w) or d >= c.cfg.small_work_duty:
        return None
    why = "no process information" if c.held is None else "no visible process"
    small = "a low flat duty cycle could be small work"
    return Candidate(
        state=State.UNKNOWN,
        reason=Reason.COARSE_DATA,
        detail=f"one sample per {c.period_s:.1f} s and {why}; {small}",
        since_s=c.t,
    )


def starved(c: GpuContext) -> Candidate | None:
    """What is left -- a working GPU below the healthy duty cycle -- waits on its input."""
    d, cfg = c.duty, c.cfg
    assert d is not None
    detail = None
    if c.coarse:  # (worded only where it is said: this rule answers on every eval)
        detail = f"one sample per {c.period_s:.1f} s, judged on the duty cycle alone"
    return Candidate(
        state=State.STARVED,
        cause=c.cause_of(c.t, c.w.span_s, c.now.cause),
        reason=Reason.COARSE_DATA if c.coarse else None,
        detail=detail,
        since_s=c.t,
        backdate_s=c.w.span_s * 0.4,
        clear=d < cfg.starved_duty - cfg.clear_margin,
    )


BEFORE_WORK: tuple[Rule, ...] = (lost_gpu, stream_begins, no_data)
ON_WORK: tuple[Rule, ...] = (
    before_work,
    too_young,
    no_run,
    periodic_gaps,
    first_judgment,
    idle,
    healthy,
    healthy_dip,
    coarse_unjudgeable,
    starved,
)


def judge_before_work(c: GpuContext) -> Candidate | None:
    """The rules that need no work: the first that answers decides (else None)."""
    for rule in BEFORE_WORK:
        found = rule(c)
        if found is not None:
            return found
    return None


def judge_work(c: GpuContext) -> Candidate:
    """The rules that judge work, after ``enter_work`` was applied: the first that answers
    decides (``starved`` always answers)."""
    for rule in ON_WORK:
        found = rule(c)
        if found is not None:
            return found
    raise AssertionError("the last rule always answers")
