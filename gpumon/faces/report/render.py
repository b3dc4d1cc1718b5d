"""The job report as text and as JSON, worded as `gpumon analyze` words a run.

The verdict line, the speed-up sentence, the notes, the evidence and the advice come from
the same run summary and the same formatting helpers as analyze's report; what is new is
the layout across nodes: one block per node (``instance``), one line per GPU.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping

from gpumon.engine import GpuJudged, JobJudged, NodeJudged, RunSummary, Straggler
from gpumon.engine.summary_json import LOST_PLACES, run_core
from gpumon.engine.words import (
    clock,
    evidence_line,
    seconds_by_state,
    share,
    speedup_sentence,
    state_label,
    verdict_words,
)
from gpumon.faces.report.queries import Fetched, LostTime
from gpumon.model import State


def _wall(t: float, date: bool = True) -> str:
    fmt = "%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S"
    return datetime.datetime.fromtimestamp(t).astimezone().strftime(fmt)


def _spent(seconds: Mapping[State, float]) -> str:
    total = sum(seconds.values())
    parts = []
    for st, x in seconds.items():
        if x >= 0.5:
            part = f" ({x / total * 100:.0f} %)" if total > 0 else ""
            parts.append(f"{st.value} {clock(x, 0)}{part}")
    return ", ".join(parts) or "no time classified"


def why_text(state: str, cause: str) -> str:
    """A state and the cause or reason its time went to: ``starved/cpu``, ``idle``."""
    return f"{state}/{cause}" if cause else state


def lost_text(lost: list[LostTime]) -> str:
    """``starved/cpu 120 GPU-s (80 %), idle/start_up 30 GPU-s (20 %)``."""
    total = sum(x.seconds for x in lost)
    return ", ".join(
        f"{why_text(x.state, x.cause)} {x.seconds:.0f} GPU-s"
        + (f" ({x.seconds / total * 100:.0f} %)" if total > 0 else "")
        for x in lost
    )


def lost_json(x: LostTime) -> dict:
    return {"state": x.state, "cause": x.cause or None, "lost_gpu_seconds": round(x.seconds, 1)}


def straggler_text(s: Straggler) -> str:
    if s.hung_peers:
        return f"hung: the job waits on {s.name()}"
    return f"straggler {s.name()} (skew {s.skew * 100:.0f} %)"


def missing_sentences(f: Fetched) -> list[str]:
    """What the report could not see: said, then the rest is judged."""
    out = []
    for g in f.gaps:
        out.append(
            f"{g.instance}: no series from {_wall(g.start, False)} to {_wall(g.end, False)} "
            f"({g.why}); the report judges the rest of the job's time"
        )
    for inst in f.restarted:
        out.append(
            f"{inst}: gpumon restarted during the job; its time per state counts from the restart"
        )
    return out


def render_text(f: Fetched, j: JobJudged, url: str) -> str:
    s = j.summary
    n_gpus = sum(len(n.gpus) for n in j.nodes)
    out = [
        f"gpumon report · {f.selector.describe()} · {len(j.nodes)} node(s) · {n_gpus} GPU(s) · "
        f"{_wall(f.start)} – {_wall(f.end, False)} ({clock(f.end, f.start)}) · {url}"
    ]
    line = f"Verdict: {verdict_words(s.verdict, s.cause)}"
    if s.effective_gpus is not None and n_gpus > 1:
        line += f" · {n_gpus} GPUs deliver {s.effective_gpus:.1f} GPUs of work"
    if j.straggler is not None and s.verdict is State.SYNC_STALL:
        line += f" · {straggler_text(j.straggler)}"
    elif j.problem_nodes and s.verdict in (State.STARVED, State.IDLE):
        line += f" · on {', '.join(j.problem_nodes)}"
    if s.lost_gpu_seconds >= 0.5:
        line += f" · {s.lost_gpu_seconds:.0f} GPU-seconds lost waiting"
    out.append(line)
    gain = speedup_sentence(s)
    if gain:
        out.append(f"  {gain}")
    if j.straggler is not None and s.verdict is State.SYNC_STALL:
        out.append(f"  note: {straggler_note(j.straggler)}")
    for note in s.notes:
        out.append(f"  note: {note}")
    for m in missing_sentences(f):
        out.append(f"  missing: {m}")
    out.append("")
    for node in j.nodes:
        out += _node_lines(node, j.straggler)
        out.append("")
    out.append(f"time per state (GPU-seconds, all nodes): {_spent(s.seconds)}")
    if f.lost_by_cause:
        out.append(f"GPU time lost by cause: {lost_text(f.lost_by_cause)}")
    if s.advice:
        out.append("")
        out.append("Advice:")
        out.extend(f"  - {a.text}" for a in s.advice)
    return "\n".join(out) + "\n"


def straggler_note(s: Straggler) -> str:
    if s.gpu is None and s.hung_peers:
        did = s.state.value + (f" (cause: {s.cause.value})" if s.cause is not None else "")
        return (
            f"every GPU of the other nodes spins with none computing (a hang) "
            f"{s.peers_wait * 100:.0f} % of their working time, node {s.instance}'s "
            f"{s.own_wait * 100:.0f} %: its GPUs are {did}; the job waits on it"
        )
    if s.gpu is None:
        did = s.state.value + (f" (cause: {s.cause.value})" if s.cause is not None else "")
        return (
            f"the other nodes' GPUs wait on peers {s.peers_wait * 100:.0f} % of their working "
            f"time, node {s.instance}'s {s.own_wait * 100:.0f} %: its GPUs are {did} while "
            "the rest busy-wait on it"
        )
    return (
        f"the job's other GPUs wait on peers {s.peers_wait * 100:.0f} % of their working time "
        f"while {s.name()} computes: they wait on it"
    )


def _node_lines(n: NodeJudged, strag: Straggler | None) -> list[str]:
    s = n.summary
    head = f"node {n.instance}  {state_label(s.verdict, s.cause)}  {len(n.gpus)} GPU(s)"
    head += f"  duty {share(s.duty_cycle)}"
    if s.effective_gpus is not None:
        head += f"  effective GPUs {s.effective_gpus:.1f}"
    head += f"  lost GPU-s {n.lost_gpu_seconds:.1f}"
    if strag is not None and strag.instance == n.instance and strag.gpu is None:
        head += "  ← the straggler"
    out = [head]
    runs = {g.gpu: g for g in s.gpus}
    for g in n.gpus:
        r = g.readings
        run = runs.get(r.gpu)
        label = state_label(run.verdict, run.cause) if run else "unknown"
        duty = run.duty_cycle if run else None
        line = f"  GPU {r.gpu}  {r.uuid}  {label}  duty {share(duty)}"
        line += f"  lost GPU-s {g.lost_gpu_seconds:.1f}"
        if strag is not None and strag.gpu == r.gpu and strag.instance == r.instance:
            line += "  ← the straggler"
        out.append(line)
        out.append(f"         {_spent(dict(g.facts.tally.seconds))}")
        ev = evidence_line(_gpu_evidence(g))
        if ev:
            out.append(f"         {ev}")
    return out


def _gpu_evidence(g: GpuJudged) -> dict:
    ev = dict(g.readings.evidence)
    if g.facts.covered_s > 0:
        ev["duty_cycle"] = round(g.facts.busy_s / g.facts.covered_s, 4)
    return ev


# --- JSON ----------------------------------------------------------------------------------


def _straggler_json(s: Straggler | None) -> dict | None:
    if s is None:
        return None
    return {
        "kind": s.kind,
        "instance": s.instance,
        "gpu": s.gpu,
        "skew": s.skew,
        "peers_wait_share": s.peers_wait,
        "own_wait_share": s.own_wait,
        "state": s.state.value,
        "cause": s.cause.value if s.cause is not None else None,
        "hung_peers": s.hung_peers,
        "note": straggler_note(s),
    }


def _summary_json(s: RunSummary, gpus: list[GpuJudged]) -> dict:
    """A run summary (the job's, or a node's) as the engine's core, its GPUs those judged."""
    core = run_core(s, {g.readings.gpu: g.readings.uuid for g in gpus})
    core["gpus"] = [_gpu_json(g, c) for g, c in zip(gpus, core["gpus"], strict=True)]
    return core


def _gpu_json(g: GpuJudged, core: dict) -> dict:
    """A GPU's core with the report's extras: its time per state is its facts' tally, its
    lost GPU-seconds its judged ones, its samples its readings' (what the report saw)."""
    return {
        **core,
        "seconds": seconds_by_state(dict(g.facts.tally.seconds)),
        "lost_gpu_seconds": round(g.lost_gpu_seconds, LOST_PLACES),
        "samples": g.readings.samples,
        "evidence": _gpu_evidence(g),
        "advice": [a.text for a in g.advice],
    }


def to_json(f: Fetched, j: JobJudged, url: str, cost: Mapping[str, int]) -> dict:
    """The one object of `gpumon report --json`."""
    s = j.summary
    nodes = []
    for n in j.nodes:
        d = {"instance": n.instance, **_summary_json(n.summary, list(n.gpus))}
        d["straggler"] = j.straggler is not None and j.straggler.instance == n.instance
        nodes.append(d)
    sel = f.selector.labels()
    return {
        "job": f.selector.ident(),
        "selector": sel,
        "user": f.user,
        "prometheus": url,
        "since": f.since,
        "until": f.until,
        "start": f.start,
        "end": f.end,
        "duration_s": round(f.end - f.start, 3),
        "step_s": f.step_s,
        **{k: x for k, x in _summary_json(s, []).items() if k != "gpus"},
        "gpu_count": sum(len(n.gpus) for n in j.nodes),
        "straggler": _straggler_json(j.straggler),
        "problem_nodes": list(j.problem_nodes),
        "nodes": nodes,
        "missing": [
            {"instance": g.instance, "start": g.start, "end": g.end, "why": g.why} for g in f.gaps
        ],
        "restarted": list(f.restarted),
        "lost_by_cause": [lost_json(x) for x in f.lost_by_cause],
        "sources": {"utilization_by_state": f.util_source, **cost},
    }
