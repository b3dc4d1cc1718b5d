"""A judged trace as a person reads it (text) and as a script reads it (JSON).

The judging is the engine's (``gpumon.engine.analyze``: one pass, bounded memory); this
module only formats its ``Analysis``, in the words every face shares
(``gpumon.engine.words``).
"""

from __future__ import annotations

from gpumon.engine import Analysis
from gpumon.engine.memory import Durations
from gpumon.engine.words import (
    clock,
    duration,
    evidence_line,
    seconds_by_state,
    share,
    speedup_sentence,
    stacks_json,
    stacks_line,
    state_label,
    verdict_words,
)
from gpumon.model import Episode, Reason, State

BLOCKS = " ▁▂▃▄▅▆▇█"
STATE_CHAR = {
    State.HEALTHY: "█",
    State.STARVED: "▒",
    State.SYNC_STALL: "≈",
    State.IDLE: "·",
    State.UNKNOWN: "?",
}


# --- text ---------------------------------------------------------------------------------


def _quantiles(d: Durations) -> str:
    return f"p50 {duration(d.quantile(0.5))}, p90 {duration(d.quantile(0.9))}"


def render_text(result: Analysis, max_episodes: int = 12) -> str:
    """A readable report: verdict, then per GPU a timeline, statistics and episodes."""
    v = result.verdict
    summ = result.summary
    t0 = result.start_s or 0.0
    gpus = result.gpus
    out: list[str] = []
    out.append(
        f"gpumon analysis · {result.header.source} · {len(gpus)} GPU(s) · "
        f"{clock(result.end_s or t0, t0)} · {result.ticks} ticks"
    )
    line = f"Verdict: {verdict_words(result.state, result.cause)}"
    if v.state is not result.state:
        line += f" · now {state_label(v.state, v.cause)}"
    eff = summ.effective_gpus
    if eff is not None and len(gpus) > 1:
        line += f" · {len(gpus)} GPUs deliver {eff:.1f} GPUs of work"
    if summ.straggler is not None and result.state is State.SYNC_STALL:
        line += f" · straggler GPU {summ.straggler}"
    if result.lost_gpu_seconds > 0:
        line += f" · {result.lost_gpu_seconds:.0f} GPU-seconds lost waiting"
    out.append(line)
    gain = speedup_sentence(summ)
    if gain:
        out.append(f"  {gain}")
    for note in summ.notes:
        out.append(f"  note: {note}")
    stacks = result.memory.stacks_run()
    if stacks is not None and stacks_line(stacks):
        out.append(f"  stacks during the gaps: {stacks_line(stacks)}")
    if v.note and v.state is not result.state:
        out.append(f"  now: {v.note}")
    out.append("")
    legend = ", ".join(f"{c} {s.value}" for s, c in STATE_CHAR.items())
    now = {g.gpu: g for g in v.gpus}
    for idx, s in gpus.items():
        gv = now.get(idx)
        head = f"GPU {idx}  {s.identity.uuid}"
        if gv is not None:
            head += f"  now {state_label(gv.state, gv.cause)}"
        head += f"  duty {share(s.duty_cycle)}  samples {s.samples}"
        out.append(head)
        util = "".join(
            " " if u is None else BLOCKS[min(8, max(0, round(u / 12.5)))]
            for u in s.timeline.util_series()
        )
        states = "".join(" " if st is None else STATE_CHAR[st] for st in s.timeline.state_series())
        out.append(f"  util  |{util}|")
        out.append(f"  state |{states}|  ({duration(s.timeline.width)}/char)")
        out.append(
            f"  bursts {s.bursts.count}: {_quantiles(s.bursts)} · "
            f"gaps {s.gaps.count}: {_quantiles(s.gaps)}"
        )
        eps = list(s.episodes)
        shown = eps[-max_episodes:]
        hidden = len(eps) - len(shown) + s.dropped_episodes
        if hidden:
            out.append(f"  ({hidden} earlier episodes not shown)")
        for ep in shown:
            out += _episode_lines(ep, t0, result.end_s)
        out.append("")
    out.append(f"legend: {legend}")
    spent = ", ".join(f"{st.value} {clock(x, 0)}" for st, x in summ.seconds.items() if x >= 0.5)
    if spent:
        out.append(f"time per state (run): {spent}")
    if result.advice:
        out.append("")
        out.append("Advice:")
        out.extend(f"  - {a}" for a in result.advice)
    return "\n".join(out) + "\n"


def _episode_lines(ep: Episode, t0: float, end_s: float | None) -> list[str]:
    end = ep.end_s if ep.end_s is not None else end_s or ep.start_s
    txt = f"  {clock(ep.start_s, t0):>8}–{clock(end, t0):<8} {state_label(ep.state, ep.cause):<14}"
    if ep.note:
        txt += f" ({ep.note})"
    out = [txt]
    if ep.reason is Reason.JUDGING:
        evl = None  # a provisional reading, never confirmed: its numbers judge nothing
    elif ep.state is State.HEALTHY:
        evl = evidence_line({"duty_cycle": ep.evidence.get("duty_cycle")})
    else:
        evl = evidence_line(ep.evidence)
    if evl:
        out.append(f"{'':22}{evl}")
    if ep.advice and ep.state in (State.STARVED, State.SYNC_STALL):
        out.append(f"{'':22}→ {ep.advice[0]}")
    return out


# --- JSON ---------------------------------------------------------------------------------


def episode_json(ep: Episode, end_default: float | None) -> dict[str, object]:
    """One episode as the JSON of analyze, the watch summary and the daemon's log."""
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


def _durations_json(d: Durations) -> dict[str, object]:
    return {"count": d.count, "p50_s": d.quantile(0.5), "p90_s": d.quantile(0.9)}


def to_json(result: Analysis) -> dict[str, object]:
    """The JSON object of `gpumon analyze --json`, JSON-serialisable as is."""
    v = result.verdict
    summ = result.summary
    runs = {g.gpu: g for g in summ.gpus}
    now = {g.gpu: g for g in v.gpus}
    gpus = []
    for idx, s in result.gpus.items():
        gv = now.get(idx)
        duty = s.duty_cycle
        run = runs.get(idx)
        gstate = run.verdict if run is not None else State.UNKNOWN
        gcause = run.cause if run is not None else None
        gpus.append(
            {
                "gpu": idx,
                "uuid": s.identity.uuid,
                "state": gstate.value,
                "cause": gcause.value if gcause else None,
                "state_now": gv.state.value if gv else State.UNKNOWN.value,
                "cause_now": gv.cause.value if gv and gv.cause else None,
                "note": gv.note if gv else None,
                "reason_now": gv.reason.value if gv and gv.reason else None,
                "duty_cycle": None if duty is None else round(duty, 4),
                "samples": s.samples,
                "seconds": seconds_by_state(run.seconds if run is not None else None),
                "lost_gpu_seconds": round(run.lost_gpu_seconds, 1) if run is not None else 0.0,
                "off_bus_s": round(run.off_bus_s, 3) if run is not None else 0.0,
                "bursts": _durations_json(s.bursts),
                "gaps": _durations_json(s.gaps),
                "timeline": {
                    "bucket_s": s.timeline.width,
                    "start": s.timeline.t0,
                    "util_pct": [
                        None if u is None else round(u, 1) for u in s.timeline.util_series()
                    ],
                    "state": [None if st is None else st.value for st in s.timeline.state_series()],
                },
                "episodes": [episode_json(ep, result.end_s) for ep in s.episodes],
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
        "seconds": seconds_by_state(summ.seconds),
        "startup_s": round(summ.startup_s, 3),
        "duty_cycle": None if summ.duty_cycle is None else round(summ.duty_cycle, 4),
        "lost_gpu_seconds": round(result.lost_gpu_seconds, 1),
        "effective_gpus": summ.effective_gpus,
        "speedup_if_fed": summ.speedup_if_fed,
        "work_duty_cycle": summ.work_duty_cycle,
        "evidence": dict(v.evidence),
        "episodes": [episode_json(ep, result.end_s) for ep in result.run_episodes],
        "stacks": None if (stacks := result.memory.stacks_run()) is None else stacks_json(stacks),
    }
