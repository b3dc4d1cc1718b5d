"""A judged trace as a person reads it (text) and as a script reads it (JSON).

The judging is the engine's (``gpumon.engine.analyze``: one pass, bounded memory); this
module only formats its ``Analysis``, in the words every face shares
(``gpumon.engine.words``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from gpumon.engine import Analysis
from gpumon.engine.memory import Durations
from gpumon.engine.summary_json import episode_core, run_core
from gpumon.engine.words import (
    EVIDENCE,
    clock,
    duration,
    evidence_value,
    share,
    speedup_sentence,
    stacks_json,
    stacks_line,
    state_label,
    verdict_words,
)
from gpumon.faces.wrap import pack, terminal_width, wrap
from gpumon.model import Episode, Reason, State

_T = TypeVar("_T")
# Where an episode's evidence and advice start, under its state.
_EVIDENCE = " " * 22

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


def _fit(series: list[_T], room: int, merge: Callable[[list[_T]], _T]) -> list[_T]:
    """A timeline in at most ``room`` characters: neighbours merged in pairs until it fits."""
    while len(series) > max(1, room):
        series = [merge(series[i : i + 2]) for i in range(0, len(series), 2)]
    return series


def _mean_util(pair: list[float | None]) -> float | None:
    known = [u for u in pair if u is not None]
    return sum(known) / len(known) if known else None


def _first_state(pair: list[State | None]) -> State | None:
    return next((st for st in pair if st is not None), None)


def _time_per_state(seconds: dict[State, float], startup_s: float) -> list[str]:
    """Seconds per state as people read them: start-up (warming up, and readings not yet
    confirmed) apart from idle, which it is counted in, so a run whose GPUs never idled
    shows no idle time."""
    shown = dict(seconds)
    shown[State.IDLE] = max(0.0, shown.get(State.IDLE, 0.0) - startup_s)
    out = [f"{st.value} {clock(x, 0)}" for st, x in shown.items() if x >= 0.5]
    if startup_s >= 0.5:
        out.append(f"start-up {clock(startup_s, 0)}")
    return out


def render_text(result: Analysis, max_episodes: int = 12, width: int | None = None) -> str:
    """A readable report in lines of at most ``width`` columns (the terminal's by
    default): verdict, then per GPU a timeline, statistics and episodes."""
    width = terminal_width() if width is None else width
    v = result.verdict
    summ = result.summary
    t0 = result.start_s or 0.0
    gpus = result.gpus
    out: list[str] = []
    out += pack(
        [
            "gpumon analysis",
            result.header.source,
            f"{len(gpus)} GPU(s)",
            f"{clock(result.end_s or t0, t0)}",
            f"{result.ticks} ticks",
        ],
        width,
        sep=" · ",
        rest="  ",
    )
    verdict = [f"Verdict: {verdict_words(result.state, result.cause)}"]
    if v.state is not result.state:
        verdict.append(f"now {state_label(v.state, v.cause)}")
    eff = summ.effective_gpus
    if eff is not None and len(gpus) > 1:
        verdict.append(f"{len(gpus)} GPUs deliver {eff:.1f} GPUs of work")
    if summ.straggler is not None and result.state is State.SYNC_STALL:
        verdict.append(f"straggler GPU {summ.straggler}")
    if result.lost_gpu_seconds > 0:
        verdict.append(f"{result.lost_gpu_seconds:.0f} GPU-seconds lost waiting")
    out += pack(verdict, width, sep=" · ", rest="  ")
    gain = speedup_sentence(summ)
    if gain:
        out += wrap(gain, width, "  ")
    for note in summ.notes:
        out += wrap(note, width, "  note: ")
    stacks = result.memory.stacks_run()
    if stacks is not None and stacks_line(stacks):
        out += wrap(stacks_line(stacks), width, "  stacks during the gaps: ", "    ")
    if v.note and v.state is not result.state:
        out += wrap(v.note, width, "  now: ")
    out.append("")
    legend = [f"{c} {s.value}" for s, c in STATE_CHAR.items()]
    now = {g.gpu: g for g in v.gpus}
    for idx, s in gpus.items():
        gv = now.get(idx)
        head = [f"GPU {idx}", s.identity.uuid]
        if gv is not None:
            head.append(f"now {state_label(gv.state, gv.cause)}")
        # Over every sample of the trace (start-up included): an episode's duty cycle is
        # its own stretch's.
        head.append(f"duty {share(s.duty_cycle)} over {s.samples} samples")
        out += pack(head, width, rest="       ")
        room = width - len("  util  ||")
        utils = _fit(s.timeline.util_series(), room, _mean_util)
        states = _fit(s.timeline.state_series(), room, _first_state)
        per_char = s.timeline.width * (len(s.timeline.util_series()) / max(1, len(utils)))
        util = "".join(" " if u is None else BLOCKS[min(8, max(0, round(u / 12.5)))] for u in utils)
        out.append(f"  util  |{util}|")
        out += pack(
            [f"  state |{''.join(' ' if st is None else STATE_CHAR[st] for st in states)}|",
             f"({duration(per_char)}/char)"],
            width,
            rest=" " * 9,
        )  # fmt: skip
        out += pack(
            [f"bursts {s.bursts.count}: {_quantiles(s.bursts)}",
             f"gaps {s.gaps.count}: {_quantiles(s.gaps)}"],
            width,
            "  ",
            sep=" · ",
        )  # fmt: skip
        eps = list(s.episodes)
        shown = eps[-max_episodes:]
        hidden = len(eps) - len(shown) + s.dropped_episodes
        if hidden:
            out.append(f"  ({hidden} earlier episodes not shown)")
        for ep in shown:
            out += _episode_lines(ep, t0, result.end_s, width)
        out.append("")
    out += pack(legend, width, "legend: ", sep=", ")
    spent = _time_per_state(summ.seconds, summ.startup_s)
    if spent:
        out += pack(spent, width, "time per state (run): ", sep=", ")
    if result.advice:
        out.append("")
        out.append("Advice:")
        for a in result.advice:
            out += wrap(a.text, width, "  - ")
    return "\n".join(out) + "\n"


def _episode_lines(ep: Episode, t0: float, end_s: float | None, width: int) -> list[str]:
    end = ep.end_s if ep.end_s is not None else end_s or ep.start_s
    head = f"  {clock(ep.start_s, t0):>8}–{clock(end, t0):<8} {state_label(ep.state, ep.cause):<14}"
    out = [head]
    if ep.note:
        out = pack([head, f"({ep.note})"], width, sep=" ", rest=_EVIDENCE)
    out[0] = out[0].rstrip()  # the state's column, padded for a note that did not follow
    ev: Mapping[str, object] = ep.evidence
    if ep.reason is Reason.JUDGING:
        ev = {}  # a provisional reading, never confirmed: its numbers judge nothing
    elif ep.state is State.HEALTHY:
        ev = {"duty_cycle": ev.get("duty_cycle")}
    listed = [
        f"{label} {evidence_value(ev[key], kind)}"
        for key, label, kind in EVIDENCE
        if ev.get(key) is not None
    ]
    if listed:
        out += pack([*(x + "," for x in listed[:-1]), listed[-1]], width, _EVIDENCE, sep=" ")
    if ep.advice and ep.state in (State.STARVED, State.SYNC_STALL):
        out += wrap(ep.advice[0].text, width, _EVIDENCE + "→ ")
    return out


# --- JSON ---------------------------------------------------------------------------------


def episode_json(ep: Episode, end_default: float | None) -> dict[str, object]:
    """One episode as analyze's JSON writes it (the engine's core, on the trace's clock)."""
    return episode_core(ep, ep.start_s, ep.end_s if ep.end_s is not None else end_default)


def _durations_json(d: Durations) -> dict[str, object]:
    return {"count": d.count, "p50_s": d.quantile(0.5), "p90_s": d.quantile(0.9)}


def to_json(result: Analysis) -> dict[str, object]:
    """The JSON object of `gpumon analyze --json`, JSON-serialisable as is: the run
    summary's core (``gpumon.engine.summary_json``) and analyze's extras."""
    v = result.verdict
    summ = result.summary
    core = run_core(summ, {idx: s.identity.uuid for idx, s in result.gpus.items()})
    now = {g.gpu: g for g in v.gpus}
    gpus = []
    for gcore, (idx, s) in zip(core.pop("gpus"), result.gpus.items(), strict=True):
        gv = now.get(idx)
        gpus.append(
            {
                **gcore,
                "state": gcore["verdict"],  # the key before the schema: kept for its readers
                "state_now": gv.state.value if gv else State.UNKNOWN.value,
                "cause_now": gv.cause.value if gv and gv.cause else None,
                "note": gv.note if gv else None,
                "reason_now": gv.reason.value if gv and gv.reason else None,
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
                "advice": [a.text for a in gv.advice] if gv else [],
            }
        )
    return {
        **core,
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
        "evidence": dict(v.evidence),
        "episodes": [episode_json(ep, result.end_s) for ep in result.run_episodes],
        "stacks": None if (stacks := result.memory.stacks_run()) is None else stacks_json(stacks),
    }
