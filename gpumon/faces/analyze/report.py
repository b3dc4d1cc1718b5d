"""From detector output to what a person reads: a text report and the JSON of `analyze`.

``analyze_snapshots`` runs the detector over a stream in one pass and keeps, per GPU, only
bounded summaries: a fixed number of timeline buckets (merged pairwise as the stream grows,
so the length need not be known in advance), log-binned burst/gap histograms, and the
episodes (capped).  ``render_text`` and ``to_json`` only format that result.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpumon.detect import DetectorConfig, RunSummary, speedup_sentence
from gpumon.model import Cause, Episode, Snapshot, State, TraceHeader, Verdict
from gpumon.session import Session

BLOCKS = " ▁▂▃▄▅▆▇█"
STATE_CHAR = {
    State.HEALTHY: "█",
    State.STARVED: "▒",
    State.SYNC_STALL: "≈",
    State.IDLE: "·",
    State.UNKNOWN: "?",
}
_STATES = tuple(State)
MAX_EPISODES = 400  # per GPU; older ones are dropped (and counted) beyond this


class Timeline:
    """``n`` time buckets over the stream: mean utilisation and seconds per state each.

    Starts with ``width_s`` buckets and doubles the width (merging neighbours) whenever the
    stream outgrows them: bounded memory, no need to know the length in advance.
    """

    def __init__(self, n: int = 64, width_s: float = 1.0) -> None:
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
        if i >= n:
            i = n - 1
        elif i < 0:
            i = 0
        self.util[i] += util_pct * dt
        self.cov[i] += dt
        end = self.end
        if end is None or t > end:
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


class LogHistogram:
    """Durations in log-spaced bins (10 ms .. 3 h, 20 per decade): bounded quantiles."""

    LO, PER_DECADE, BINS = -2.0, 20, 122

    def __init__(self) -> None:
        self.counts = [0] * self.BINS
        self.n = 0
        self.total = 0.0

    # Upper edges of bins 0 .. BINS-2 (the last bin takes everything above).
    EDGES = tuple(10 ** (-2.0 + (k + 1) / 20) for k in range(BINS - 1))  # 10 ms .. ~3 h

    def add(self, x: float) -> None:
        if x <= 0:
            return
        self.counts[bisect_right(self.EDGES, x)] += 1
        self.n += 1
        self.total += x

    def quantile(self, q: float) -> float | None:
        if self.n == 0:
            return None
        target = q * self.n
        acc = 0
        for k, c in enumerate(self.counts):
            acc += c
            if acc >= target and c:
                return 10 ** (self.LO + (k + 0.5) / self.PER_DECADE)
        return None


@dataclass
class GpuSummary:
    """What the report keeps of one GPU: bounded whatever the stream length."""

    gpu: int
    uuid: str
    samples: int = 0
    busy_s: float = 0.0  # util-weighted
    cov_s: float = 0.0
    timeline: Timeline = field(default_factory=Timeline)
    bursts: LogHistogram = field(default_factory=LogHistogram)
    gaps: LogHistogram = field(default_factory=LogHistogram)
    episodes: deque[Episode] = field(default_factory=lambda: deque(maxlen=MAX_EPISODES))
    dropped_episodes: int = 0

    @property
    def duty_cycle(self) -> float | None:
        return self.busy_s / self.cov_s if self.cov_s > 0 else None


@dataclass
class AnalysisResult:
    """Everything the text and JSON reports need, from one pass over a stream."""

    header: TraceHeader
    gpus: dict[int, GpuSummary]
    run_episodes: list[Episode]
    verdict: Verdict  # the detector's view at the end ("now")
    summary: RunSummary  # the run as a whole: what every face reports
    start_s: float | None
    end_s: float | None
    ticks: int
    # (time, what) of a tick whose values the detector could not take (a string where a
    # number belongs, in a hand-edited file): the analysis stopped before it.
    bad_tick: tuple[float, str] | None = None

    @property
    def duration_s(self) -> float:
        if self.start_s is None or self.end_s is None:
            return 0.0
        return self.end_s - self.start_s

    @property
    def state(self) -> State:
        return self.summary.verdict

    @property
    def cause(self) -> Cause | None:
        return self.summary.cause

    @property
    def advice(self) -> tuple[str, ...]:
        return self.summary.advice

    @property
    def lost_gpu_seconds(self) -> float:
        return self.summary.lost_gpu_seconds


def analyze_snapshots(
    header: TraceHeader, snapshots: Iterable[Snapshot], config: DetectorConfig | None = None
) -> AnalysisResult:
    """Run the detector over ``snapshots`` once, keeping bounded summaries per GPU.

    Without a config, the detector re-evaluates calm stretches only every third second:
    offline, episodes are backdated to their onset, so detection latency costs nothing
    and a day-long trace analyses several times faster.
    """
    det = Session.offline(header, config)
    gpus: dict[int, GpuSummary] = {}
    run_eps: deque[Episode] = deque(maxlen=MAX_EPISODES)
    start = end = None
    ticks = 0

    def take(eps: Iterable[Episode]) -> None:
        for ep in eps:
            if ep.gpu is None:
                if ep.end_s is None or ep.end_s - ep.start_s >= 1e-6:
                    run_eps.append(ep)
                continue
            s = gpus.get(ep.gpu)
            if s is None or (ep.end_s is not None and ep.end_s - ep.start_s < 1e-6):
                continue  # a candidate overtaken at once by a backdated successor
            if len(s.episodes) == MAX_EPISODES:
                s.dropped_episodes += 1
            s.episodes.append(ep)
            s.timeline.add_state(ep.start_s, ep.end_s or ep.start_s, ep.state)

    # Duty cycles and timelines come from the detector's running totals, read only when
    # the stream crosses a timeline bucket edge: the driver samples are walked once.
    flushed: dict[int, tuple[float, float]] = {}  # per GPU: covered_s, busy_s so far

    def flush(t: float) -> float:
        """Put each GPU's work since the last flush into its bucket at ``t``; return the
        time of the next bucket edge."""
        edge = math.inf
        for idx, tot in det.gpu_totals().items():
            s = gpus.get(idx)
            if s is None:  # seen by a tick the detector could not finish
                s = gpus[idx] = GpuSummary(idx, tot.uuid)
            cov0, busy0 = flushed.get(idx, (0.0, 0.0))
            dcov = tot.covered_s - cov0
            if dcov > 0:
                s.timeline.add_util(t, dcov, 100.0 * (tot.busy_s - busy0) / dcov)
                flushed[idx] = (tot.covered_s, tot.busy_s)
            s.samples, s.cov_s, s.busy_s = tot.samples, tot.covered_s, tot.busy_s
            edge = min(edge, s.timeline.next_edge(t))
        return edge

    update = det.feed
    flush_at = -math.inf
    bad_tick = None
    for snap in snapshots:
        ts = snap.t_s
        if start is not None and ts >= flush_at:
            flush_at = flush(end)  # the work so far lies before ts: in end's bucket
        try:
            upd = update(snap)
        except (TypeError, ValueError) as exc:
            # Readers of text logs parse every number; a JSON trace can hold a string or a
            # list where a number belongs.  Stop there, keep the analysis of what came
            # before (try costs nothing until it catches, unlike checking every field).
            bad_tick = (ts, f"{type(exc).__name__}: {exc}")
            break
        ticks += 1
        if start is None:
            start = ts
        end = ts
        if det.gpu_count() != len(gpus):
            for g in snap.gpus:
                if g.gpu not in gpus:
                    gpus[g.gpu] = GpuSummary(g.gpu, g.uuid)
        if upd.bursts:
            for i, x in upd.bursts:
                gpus[i].bursts.add(x)
        if upd.gaps:
            for i, x in upd.gaps:
                gpus[i].gaps.add(x)
        if upd.closed:
            take(upd.closed)
    if end is not None:
        flush(end)
    verdict = det.verdict()
    take(det.finish().closed)
    return AnalysisResult(
        header,
        dict(sorted(gpus.items())),
        list(run_eps),
        verdict,
        det.summary(),
        start,
        end,
        ticks,
        bad_tick,
    )


# --- text ---------------------------------------------------------------------------------


def _clock(t: float, t0: float) -> str:
    s = max(0, round(t - t0))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.0f} %"


def _secs(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.1f} s"


def _label(state: State, cause: object) -> str:
    return (
        f"{state.value}/{cause.value}"
        if cause is not None and state is State.STARVED
        else state.value
    )  # type: ignore[attr-defined]


_EV_TEXT = (
    ("duty_cycle", "duty", _pct),
    ("burst_p50_s", "burst p50", _secs),
    ("gap_p50_s", "gap p50", _secs),
    ("gap_p90_s", "gap p90", _secs),
    ("period_s", "period", _secs),
    ("power_share_of_peak", "power/peak", _pct),
    ("sm_active_ratio", "SM active", _pct),
    ("tensor_active_ratio", "tensor active", _pct),
    ("main_cpu_pct", "main CPU", lambda v: f"{v:.0f} %"),
    ("workers_cpu_pct", "worker CPU", lambda v: f"{v:.0f} %/worker"),
    ("workers", "workers", lambda v: f"{v:.0f}"),
    ("iowait_pct", "iowait", lambda v: f"{v:.0f} %"),
    ("read_bytes_per_s", "read", lambda v: f"{v / 1e6:.0f} MB/s"),
    ("effective_gpus", "effective GPUs", lambda v: f"{v:.1f}"),
    ("straggler_gpu", "straggler", lambda v: f"GPU {v}"),
    ("skew_s", "skew", _secs),
    ("mem_headroom_ratio", "mem free", _pct),
)


def _evidence_line(ev: dict) -> str:
    parts = []
    for key, name, fmt in _EV_TEXT:
        v = ev.get(key)
        if isinstance(v, int | float):
            parts.append(f"{name} {fmt(v)}")
    return ", ".join(parts)


def render_text(result: AnalysisResult, max_episodes: int = 12) -> str:
    """A readable report: verdict, then per GPU a timeline, statistics and episodes."""
    v = result.verdict
    t0 = result.start_s or 0.0
    out: list[str] = []
    src = result.header.source
    out.append(
        f"gpumon analysis · {src} · {len(result.gpus)} GPU(s) · "
        f"{_clock(result.end_s or t0, t0)} · {result.ticks} ticks"
    )
    verdict = result.state.value.upper().replace("_", " ")
    if result.cause is not None and result.state is State.STARVED:
        verdict += f" (cause: {result.cause.value})"
    line = f"Verdict: {verdict}"
    if v.state is not result.state:
        line += f" · now {_label(v.state, v.cause)}"
    eff = result.summary.effective_gpus
    if eff is not None and len(result.gpus) > 1:
        line += f" · {len(result.gpus)} GPUs deliver {eff:.1f} GPUs of work"
    if result.summary.straggler is not None and result.state is State.SYNC_STALL:
        line += f" · straggler GPU {result.summary.straggler}"
    if result.lost_gpu_seconds > 0:
        line += f" · {result.lost_gpu_seconds:.0f} GPU-seconds lost waiting"
    out.append(line)
    gain = speedup_sentence(result.summary)
    if gain:
        out.append(f"  {gain}")
    for note in result.summary.notes:
        out.append(f"  note: {note}")
    if v.note and v.state is not result.state:
        out.append(f"  now: {v.note}")
    out.append("")
    legend = ", ".join(f"{c} {s.value}" for s, c in STATE_CHAR.items())
    for s in result.gpus.values():
        gv = next((g for g in v.gpus if g.gpu == s.gpu), None)
        head = f"GPU {s.gpu}  {s.uuid}"
        if gv is not None:
            head += f"  now {_label(gv.state, gv.cause)}"
        head += f"  duty {_pct(s.duty_cycle)}  samples {s.samples}"
        out.append(head)
        util = "".join(
            " " if u is None else BLOCKS[min(8, max(0, round(u / 12.5)))]
            for u in s.timeline.util_series()
        )
        states = "".join(" " if st is None else STATE_CHAR[st] for st in s.timeline.state_series())
        out.append(f"  util  |{util}|")
        out.append(f"  state |{states}|  ({_secs(s.timeline.width)}/char)")
        out.append(
            f"  bursts {s.bursts.n}: p50 {_secs(s.bursts.quantile(0.5))}, "
            f"p90 {_secs(s.bursts.quantile(0.9))} · gaps {s.gaps.n}: "
            f"p50 {_secs(s.gaps.quantile(0.5))}, p90 {_secs(s.gaps.quantile(0.9))}"
        )
        eps = list(s.episodes)
        shown = eps[-max_episodes:]
        hidden = len(eps) - len(shown) + s.dropped_episodes
        if hidden:
            out.append(f"  ({hidden} earlier episodes not shown)")
        for ep in shown:
            end = ep.end_s if ep.end_s is not None else result.end_s or ep.start_s
            txt = (
                f"  {_clock(ep.start_s, t0):>8}–{_clock(end, t0):<8} "
                f"{_label(ep.state, ep.cause):<14}"
            )
            if ep.note:
                txt += f" ({ep.note})"
            out.append(txt)
            evl = (
                _evidence_line(ep.evidence)
                if ep.state is not State.HEALTHY
                else _evidence_line({"duty_cycle": ep.evidence.get("duty_cycle")})
            )
            if evl:
                out.append(f"{'':22}{evl}")
            if ep.advice and ep.state in (State.STARVED, State.SYNC_STALL):
                out.append(f"{'':22}→ {ep.advice[0]}")
        out.append("")
    out.append(f"legend: {legend}")
    secs = result.summary.seconds
    spent = ", ".join(f"{st.value} {_clock(x, 0)}" for st, x in secs.items() if x >= 0.5)
    if spent:
        out.append(f"time per state (run): {spent}")
    if result.advice:
        out.append("")
        out.append("Advice:")
        out.extend(f"  - {a}" for a in result.advice)
    return "\n".join(out) + "\n"


# --- JSON ---------------------------------------------------------------------------------


def _episode_json(ep: Episode, end_default: float | None) -> dict:
    return {
        "start": ep.start_s,
        "end": ep.end_s if ep.end_s is not None else end_default,
        "state": ep.state.value,
        "cause": ep.cause.value if ep.cause else None,
        "note": ep.note,
        "reason": ep.reason.value if ep.reason is not None else None,
        "evidence": dict(ep.evidence),
        "advice": list(ep.advice),
    }


def _seconds_json(d: dict[State, float] | None) -> dict[str, float]:
    return {s.value: round((d or {}).get(s, 0.0), 3) for s in State}


def to_json(result: AnalysisResult) -> dict:
    """The JSON object of `gpumon analyze --json` (issue 3), JSON-serialisable as is."""
    v = result.verdict
    summ = result.summary
    runs = {g.gpu: g for g in summ.gpus}
    gpus = []
    for s in result.gpus.values():
        gv = next((g for g in v.gpus if g.gpu == s.gpu), None)
        duty = s.duty_cycle
        run = runs.get(s.gpu)
        gstate = run.verdict if run is not None else State.UNKNOWN
        gcause = run.cause if run is not None else None
        gpus.append(
            {
                "gpu": s.gpu,
                "uuid": s.uuid,
                "state": gstate.value,
                "cause": gcause.value if gcause else None,
                "state_now": gv.state.value if gv else State.UNKNOWN.value,
                "cause_now": gv.cause.value if gv and gv.cause else None,
                "note": gv.note if gv else None,
                "reason_now": gv.reason.value if gv and gv.reason else None,
                "duty_cycle": None if duty is None else round(min(1.0, max(0.0, duty)), 4),
                "samples": s.samples,
                "seconds": _seconds_json(run.seconds if run is not None else None),
                "bursts": {
                    "count": s.bursts.n,
                    "p50_s": s.bursts.quantile(0.5),
                    "p90_s": s.bursts.quantile(0.9),
                },
                "gaps": {
                    "count": s.gaps.n,
                    "p50_s": s.gaps.quantile(0.5),
                    "p90_s": s.gaps.quantile(0.9),
                },
                "timeline": {
                    "bucket_s": s.timeline.width,
                    "start": s.timeline.t0,
                    "util_pct": [
                        None if u is None else round(u, 1) for u in s.timeline.util_series()
                    ],
                    "state": [None if st is None else st.value for st in s.timeline.state_series()],
                },
                "episodes": [_episode_json(ep, result.end_s) for ep in s.episodes],
                "episodes_dropped": s.dropped_episodes,
                "evidence": dict(gv.evidence) if gv else {},
                "advice": list(gv.advice) if gv else [],
            }
        )
    return {
        "verdict": result.state.value,
        "cause": result.cause.value if result.cause is not None else None,
        "reason": summ.reason.value if summ.reason is not None else None,
        "notes": list(summ.notes),
        "straggler": summ.straggler,
        "verdict_now": v.state.value,
        "cause_now": v.cause.value if v.cause is not None else None,
        "note": v.note,
        "source": result.header.source,
        "start": result.start_s,
        "end": result.end_s,
        "duration_s": round(result.duration_s, 3),
        "started_wall_s": result.header.started_wall_s,
        "gpus": gpus,
        "advice": list(result.advice),
        "seconds": _seconds_json(summ.seconds),
        "startup_s": round(summ.startup_s, 3),
        "duty_cycle": None if summ.duty_cycle is None else round(summ.duty_cycle, 4),
        "lost_gpu_seconds": round(result.lost_gpu_seconds, 1),
        "effective_gpus": summ.effective_gpus,
        "speedup_if_fed": summ.speedup_if_fed,
        "work_duty_cycle": summ.work_duty_cycle,
        "evidence": dict(v.evidence),
        "episodes": [_episode_json(ep, result.end_s) for ep in result.run_episodes],
    }
