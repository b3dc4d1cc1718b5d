"""The one memory of a run: what every face reads about it, bounded however long it runs.

A session folds each tick into a ``RunMemory``: per GPU its latest readings, its recent
driver samples (a live face draws them), a timeline of utilisation and state, histograms
of its bursts and gaps, its episodes (capped), and the seconds it was reported in each
state; for the run, its episodes and the episode each GPU and the run are in now.  The
detector keeps what judging needs; this keeps what showing needs, once, so ``analyze``,
``watch``, ``serve`` and dstat never keep a second, drifting copy.

Two clocks of seconds per state exist on purpose: the *run summary's* (the detector's
tallies, backdated to each episode's onset: what really happened) and the *reported*
seconds here (added tick by tick to the state shown at that tick: counters that never
decrease, for Prometheus).  Faces that sum up a run use the first; the exporter the
second.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from gpumon.detect import DetectorUpdate, GpuTotals
from gpumon.detect.activities import ActivityTrack, StackWindow
from gpumon.model import Episode, GpuIdentity, GpuSample, Point, Snapshot, State

MAX_EPISODES = 400  # per GPU and for the run; older ones are dropped (and counted)
# A live memory keeps only the latest few: only a report of a whole trace lists them
# (``analyze``), a live face shows the open ones, and a daemon's log has every one.  400
# each, every episode carrying its evidence and advice, grew a daemon of 8 GPUs by ~2 MiB
# an hour until the caps were reached, days later.
LIVE_EPISODES = 16
TIMELINE_BUCKETS = 64
POINTS_KEPT = 720  # recent driver samples per GPU for a live timeline (~2 min at 6/s)
# A stalled loop (a suspended laptop, a stopped daemon) adds no reported seconds.
MAX_TICK_GAP_S = 60.0
_STATES = tuple(State)

# Prometheus buckets of gaps and bursts.  Gaps: a DataLoader hiccup is 50-500 ms, a
# starved step 0.2-2 s, a checkpoint or an evaluation tens of seconds to minutes.  Bursts:
# one step's kernels, 50 ms to seconds.  Few on purpose: every bucket is a series per GPU.
EXPORT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0)


class Timeline:
    """``n`` time buckets over the stream: mean utilisation and seconds per state each.

    Starts with ``width_s`` buckets and doubles the width (merging neighbours) whenever the
    stream outgrows them: bounded memory, no need to know the length in advance.
    """

    def __init__(self, n: int = TIMELINE_BUCKETS, width_s: float = 1.0) -> None:
        self.n = n
        self.width = width_s
        self.t0: float | None = None
        self.util = [0.0] * n  # util-seconds
        self.cov = [0.0] * n
        self.states = [[0.0] * len(_STATES) for _ in range(n)]
        self.end: float | None = None

    def _grow(self, t: float) -> None:
        assert self.t0 is not None
        while t >= self.t0 + self.n * self.width:
            half = self.n // 2
            for i in range(half):
                a, b = 2 * i, 2 * i + 1
                self.util[i] = self.util[a] + self.util[b]
                self.cov[i] = self.cov[a] + self.cov[b]
                self.states[i] = [
                    x + y for x, y in zip(self.states[a], self.states[b], strict=True)
                ]
            for i in range(half, self.n):
                self.util[i] = 0.0
                self.cov[i] = 0.0
                self.states[i] = [0.0] * len(_STATES)
            self.width *= 2

    def add_util(self, t: float, dt: float, util_pct: float) -> None:
        t0 = self.t0
        if t0 is None:
            t0 = self.t0 = t - dt
        n = self.n
        if t >= t0 + n * self.width:
            self._grow(t)
        i = int((t - t0) / self.width)
        i = min(n - 1, max(0, i))
        self.util[i] += util_pct * dt
        self.cov[i] += dt
        if self.end is None or t > self.end:
            self.end = t

    def add_state(self, start: float, end: float, state: State) -> None:
        """Spread an episode's seconds over the buckets it overlaps."""
        if self.t0 is None or end <= start:
            return
        self._grow(end)
        k = _STATES.index(state)
        t0, w = self.t0, self.width
        a = max(start, t0)
        i0 = int((a - t0) / w)
        i1 = min(self.n - 1, int((end - t0) / w))
        for i in range(i0, i1 + 1):
            lo = max(a, t0 + i * w)
            hi = min(end, t0 + (i + 1) * w)
            if hi > lo:
                self.states[i][k] += hi - lo

    def next_edge(self, t: float) -> float:
        """The end of the bucket ``t`` falls in (``t`` itself before the first data)."""
        if self.t0 is None:
            return t
        return self.t0 + (math.floor((t - self.t0) / self.width) + 1) * self.width

    def used(self) -> int:
        """Buckets that hold data (the rest lie after the stream's end)."""
        if self.t0 is None or self.end is None:
            return 0
        return min(self.n, int((self.end - self.t0) / self.width) + 1)

    def util_series(self) -> list[float | None]:
        return [self.util[i] / self.cov[i] if self.cov[i] > 0 else None for i in range(self.used())]

    def state_series(self) -> list[State | None]:
        out: list[State | None] = []
        for i in range(self.used()):
            row = self.states[i]
            m = max(row)
            out.append(_STATES[row.index(m)] if m > 0 else None)
        return out


class Durations:
    """Lengths of bursts or gaps: log-spaced bins for quantiles (10 ms .. ~3 h, 20 per
    decade) and the exporter's fixed buckets, both bounded, both from one ``add``."""

    LO, PER_DECADE, BINS = -2.0, 20, 122
    # Upper edges of bins 0 .. BINS-2 (the last bin takes everything above).
    EDGES = tuple(10 ** (-2.0 + (k + 1) / 20) for k in range(BINS - 1))

    __slots__ = ("bounds", "count", "counts", "export_counts", "total")

    def __init__(self, bounds: Sequence[float] = EXPORT_BUCKETS_S) -> None:
        self.counts = [0] * self.BINS
        self.bounds = tuple(bounds)
        self.export_counts = [0] * (len(self.bounds) + 1)  # last: above the largest bound
        self.count = 0
        self.total = 0.0

    def add(self, x: float) -> None:
        if not x >= 0.0:  # negative or NaN: not a duration
            return
        self.counts[bisect_right(self.EDGES, x)] += 1
        self.export_counts[bisect_left(self.bounds, x)] += 1  # le: the first bound >= x
        self.count += 1
        self.total += x

    def quantile(self, q: float) -> float | None:
        if self.count == 0:
            return None
        target = q * self.count
        acc = 0
        for k, c in enumerate(self.counts):
            acc += c
            if acc >= target and c:
                return float(10 ** (self.LO + (k + 0.5) / self.PER_DECADE))
        return None

    def cumulative(self) -> list[tuple[str, int]]:
        """[(le, cumulative count)] ending with +Inf, as Prometheus' exposition wants."""
        out = []
        acc = 0
        for b, c in zip(self.bounds, self.export_counts, strict=False):
            acc += c
            out.append((repr(float(b)), acc))
        out.append(("+Inf", acc + self.export_counts[-1]))
        return out


# Distinct XID codes counted per GPU under their own label; any further code counts as
# "other" (a flapping driver must not grow the series without bound).
MAX_XID_LABELS = 32


class GpuEventKind(StrEnum):
    """A change in a GPU worth a line of its own: found while running, off the bus, back,
    an XID error from the driver."""

    APPEARED = "gpu_appeared"
    LOST = "gpu_lost"
    RECOVERED = "gpu_recovered"
    XID = "xid"


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """One GPU appearing, falling off the bus or coming back, or an XID, at ``t_s``."""

    kind: GpuEventKind
    identity: GpuIdentity
    t_s: float
    lost_since_s: float | None = None  # when it fell off (for RECOVERED)
    xid: int | None = None  # the XID's code (for XID)


@dataclass(slots=True)
class GpuMemory:
    """What the run's memory keeps of one GPU."""

    identity: GpuIdentity
    latest: GpuSample | None = None
    points: deque[Point] = field(default_factory=lambda: deque(maxlen=POINTS_KEPT))
    from_ticks: bool = False  # the driver buffer gave nothing: tick readings are drawn
    timeline: Timeline = field(default_factory=Timeline)
    bursts: Durations = field(default_factory=Durations)
    gaps: Durations = field(default_factory=Durations)
    episodes: deque[Episode] = field(default_factory=lambda: deque(maxlen=MAX_EPISODES))
    dropped_episodes: int = 0
    samples: int = 0
    covered_s: float = 0.0
    busy_s: float = 0.0  # utilisation-weighted
    lost_since_s: float | None = None  # off the bus since (None: on it)
    # XID errors seen since the run began, by code (None: the GPU's are not watched).
    xid_counts: dict[str, int] | None = None
    last_xid: int | None = None

    @property
    def duty_cycle(self) -> float | None:
        return min(1.0, max(0.0, self.busy_s / self.covered_s)) if self.covered_s > 0 else None

    @property
    def lost(self) -> bool:
        return self.latest is not None and self.latest.lost

    def keep_points(self, g: GpuSample) -> None:
        """Recent utilisation for a live timeline: the driver's samples, else (a source
        without a buffer) one reading per tick, replaced once the buffer speaks."""
        if g.util_samples:
            if self.from_ticks:
                self.points.clear()
                self.from_ticks = False
            self.points.extend(g.util_samples)
        elif g.util_pct is not None and (self.from_ticks or not self.points):
            self.from_ticks = True
            self.points.append((g.t_s, g.util_pct))


Totals = Callable[[], Mapping[int, GpuTotals]]


class RunMemory:
    """Everything faces show about one run, fed by the session tick by tick.

    ``live``: keep what a live face shows (latest readings, recent samples, GPUs lost and
    back, reported seconds); an offline analysis keeps only the bounded summaries.
    """

    def __init__(
        self,
        identities: Sequence[GpuIdentity],
        totals: Totals,
        *,
        live: bool = True,
        stacks: ActivityTrack | None = None,
        known: Callable[[], Sequence[GpuIdentity]] | None = None,
    ) -> None:
        self.live = live
        # The GPUs the source knows now (a live sampler opens hot-plugged ones with their
        # name and bus id): asked when a GPU appears that the identities lack.
        self._known = known
        # The job's Python stacks over the gaps (--stacks): the detector's track, kept
        # once; its run totals per role are what faces show.
        self.stacks = stacks
        self._totals = totals
        self._identities = {g.index: g for g in identities}
        self.max_episodes = LIVE_EPISODES if live else MAX_EPISODES
        self.gpus: dict[int, GpuMemory] = {g.index: self._new(g) for g in identities if live}
        self.run_episodes: deque[Episode] = deque(maxlen=self.max_episodes)
        # The episode each GPU (and the run: key None) is in now.
        self.open: dict[int | None, Episode] = {}
        # Seconds each GPU (None: the run) was reported in each state, tick by tick.
        self.reported: dict[int | None, dict[State, float]] = {}
        self.start_s: float | None = None
        self.end_s: float | None = None
        self.ticks = 0
        self._flush_at = -math.inf
        self._flushed: dict[int, tuple[float, float]] = {}  # per GPU: covered, busy so far

    # --- one tick ------------------------------------------------------------------------

    def before(self, t_s: float) -> None:
        """Before a tick at ``t_s`` is judged: the work so far into the timeline, when ``t_s``
        crosses a bucket edge (the detector's totals are read only then: the driver
        samples are walked once, by the detector)."""
        if self.end_s is not None and t_s >= self._flush_at:
            self._flush_at = self._flush(self.end_s)

    def after(self, snap: Snapshot, update: DetectorUpdate) -> tuple[GpuEvent, ...]:
        """A judged tick: its readings, bursts, gaps and episodes.  Returns the GPU events
        it brought (live only)."""
        t = snap.t_s
        if self.start_s is None:
            self.start_s = t
        last, self.end_s = self.end_s, t
        self.ticks += 1
        events: tuple[GpuEvent, ...] = ()
        gpus = self.gpus
        if self.live:
            events = self._readings(snap)
        elif len(gpus) < len(snap.gpus):
            for g in snap.gpus:
                if g.gpu not in gpus:
                    gpus[g.gpu] = self._new(self._identity(g))
        if update.bursts or update.gaps:
            for i, x in update.bursts:
                self._gpu(i).bursts.add(x)
            for i, x in update.gaps:
                self._gpu(i).gaps.add(x)
        if self.live and last is not None and 0 < t - last < MAX_TICK_GAP_S:
            self._count(t - last)
        self.take(update)
        return events

    def take(self, update: DetectorUpdate) -> None:
        """Episodes that closed (kept) and opened (now open)."""
        for ep in update.closed:
            cur = self.open.get(ep.gpu)
            if cur is not None and cur.start_s == ep.start_s:
                del self.open[ep.gpu]
            if ep.end_s is not None and ep.end_s - ep.start_s < 1e-6:
                continue  # a candidate overtaken at once by a backdated successor
            self._keep(ep)
        for ep in update.opened:
            self.open[ep.gpu] = ep

    def finish(self, update: DetectorUpdate) -> None:
        """The stream ended: the last work into the timeline, every episode closed."""
        if self.end_s is not None:
            self._flush(self.end_s)
        self.take(update)

    # --- what faces read -------------------------------------------------------------------

    @property
    def duration_s(self) -> float:
        if self.start_s is None or self.end_s is None:
            return 0.0
        return self.end_s - self.start_s

    def stacks_window(self, span_s: float) -> StackWindow | None:
        """What the job's processes did over the gaps of the last ``span_s`` (--stacks);
        None where no stacks were read."""
        track = self.stacks
        if track is None or not track.seen or self.end_s is None:
            return None
        return track.window(self.end_s - span_s, float("inf"))

    def stacks_run(self) -> StackWindow | None:
        """... over the whole run's gaps (bounded: the places that took most are kept)."""
        track = self.stacks
        return None if track is None or not track.seen else track.run

    def reported_seconds(self, key: int | None) -> dict[State, float]:
        """Seconds per state the GPU (None: the run) was shown in, every state present."""
        per = self.reported.get(key)
        return {s: (per or {}).get(s, 0.0) for s in _STATES}

    # --- internals -----------------------------------------------------------------------

    def _new(self, identity: GpuIdentity) -> GpuMemory:
        return GpuMemory(identity, episodes=deque(maxlen=self.max_episodes))

    def _gpu(self, idx: int) -> GpuMemory:
        mem = self.gpus.get(idx)
        if mem is None:
            ident = self._identities.get(idx) or GpuIdentity(index=idx, uuid=f"GPU-{idx}")
            mem = self.gpus[idx] = self._new(ident)
        return mem

    def _identity(self, g: GpuSample) -> GpuIdentity:
        ident = self._identities.get(g.gpu)
        if (ident is None or ident.uuid != g.uuid) and self._known is not None:
            self._identities.update({k.index: k for k in self._known()})
            ident = self._identities.get(g.gpu)
        if ident is not None and ident.uuid == g.uuid:
            return ident
        return GpuIdentity(index=g.gpu, uuid=g.uuid)

    def _readings(self, snap: Snapshot) -> tuple[GpuEvent, ...]:
        events: list[GpuEvent] = []
        t = snap.t_s
        for g in snap.gpus:
            mem = self.gpus.get(g.gpu)
            if mem is None:  # found by the sampler's re-enumeration while running
                mem = self.gpus[g.gpu] = self._new(self._identity(g))
                events.append(GpuEvent(GpuEventKind.APPEARED, mem.identity, t))
            elif mem.identity.uuid != g.uuid:  # lost at start-up, now known by its UUID
                mem.identity = self._identity(g)
            was_lost = mem.lost
            mem.latest = g
            if g.lost and not was_lost:
                mem.lost_since_s = t
                events.append(GpuEvent(GpuEventKind.LOST, mem.identity, t))
            elif was_lost and not g.lost:
                events.append(GpuEvent(GpuEventKind.RECOVERED, mem.identity, t, mem.lost_since_s))
                mem.lost_since_s = None
            mem.keep_points(g)
            if g.xid_errors or mem.xid_counts is None:
                events += self._xids(mem, g)
        return tuple(events)

    def _xids(self, mem: GpuMemory, g: GpuSample) -> list[GpuEvent]:
        """Count the GPU's XID errors (kept while it is lost: XID 79 is how a GPU goes)."""
        counts = mem.xid_counts
        if counts is None:
            if not g.xid_errors and (g.lost or "xid_events" in g.unsupported):
                return []
            counts = mem.xid_counts = {}
        out = []
        for code in g.xid_errors:
            label = str(code)
            if label not in counts and len(counts) >= MAX_XID_LABELS:
                label = "other"
            counts[label] = counts.get(label, 0) + 1
            mem.last_xid = code
            out.append(GpuEvent(GpuEventKind.XID, mem.identity, g.t_s, xid=code))
        return out

    def _count(self, dt: float) -> None:
        reported = self.reported
        for key, ep in self.open.items():
            per = reported.get(key)
            if per is None:
                per = reported[key] = dict.fromkeys(_STATES, 0.0)
            per[ep.state] += dt

    def _keep(self, ep: Episode) -> None:
        if ep.gpu is None:
            self.run_episodes.append(ep)
            return
        mem = self.gpus.get(ep.gpu)
        if mem is None:
            return
        if len(mem.episodes) == mem.episodes.maxlen:
            mem.dropped_episodes += 1
        mem.episodes.append(ep)
        mem.timeline.add_state(ep.start_s, ep.end_s or ep.start_s, ep.state)

    def _flush(self, t: float) -> float:
        """Each GPU's work since the last flush into its bucket at ``t``; the time of the
        next bucket edge."""
        edge = math.inf
        for idx, tot in self._totals().items():
            mem = self.gpus.get(idx)
            if mem is None:  # seen by a tick the detector could not finish
                mem = self.gpus[idx] = self._new(
                    self._identities.get(idx) or GpuIdentity(index=idx, uuid=tot.uuid)
                )
            cov0, busy0 = self._flushed.get(idx, (0.0, 0.0))
            dcov = tot.covered_s - cov0
            if dcov > 0:
                mem.timeline.add_util(t, dcov, 100.0 * (tot.busy_s - busy0) / dcov)
                self._flushed[idx] = (tot.covered_s, tot.busy_s)
            mem.samples, mem.covered_s, mem.busy_s = tot.samples, tot.covered_s, tot.busy_s
            edge = min(edge, mem.timeline.next_edge(t))
        return edge
