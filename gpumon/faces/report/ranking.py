"""`gpumon report --top`: the fleet's jobs (or users, namespaces, causes) ranked by GPU time
lost, as text, a digest to mail, and the one JSON object (built here and nowhere else).

Pure: the totals (from Prometheus, ``fleet.py``) and the kept reports in, the ranking out.
Kept reports (the epilog's, ``kept.py``) feed the same ranking, so a week's report does
not depend on Prometheus' retention; each job counts once:

- a job whose kept report lies within the range counts from it: made when the job ended,
  from its whole span, it is complete whatever Prometheus still holds;
- else a job with series in the range counts from them (the range's part of it);
- else (its series gone) from its kept report, for the share of its span in the range.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpumon.engine import JobJudged
from gpumon.engine.words import clock
from gpumon.faces.report.fleet import JobTotals, NodeTime, Why
from gpumon.faces.report.kept import Kept
from gpumon.faces.report.queries import JobSelector, LostTime, lost_by_cause
from gpumon.faces.report.render import lost_json, why_text
from gpumon.model import State

# The key of the JSON list for each --by.
LIST_KEY = {"job": "jobs", "user": "users", "namespace": "namespaces", "cause": "causes"}
NO_NAMESPACE = ""  # jobs that are not pods
# How far a kept report's span may stick out of the range and still lie within it (the
# fleet records are 5-minute sums, a report's span starts a step early).
KEPT_SLACK_S = 300.0


@dataclass(frozen=True, slots=True)
class Judged:
    """How one job went: its verdict, cause, nodes and what fixing it would be worth."""

    job: str
    verdict: str
    cause: str | None  # the starved cause, or the reason the verdict's time went to
    nodes: tuple[str, ...]
    gpus: int
    straggler: str | None  # the node the job waits on
    speedup_if_fed: float | None
    advice: str | None
    source: str  # "prometheus" or "kept"


@dataclass
class Counted:
    """One job's GPU time in the range, and where it was counted from."""

    totals: JobTotals
    source: str = "prometheus"  # or "kept"
    kept: Kept | None = None


@dataclass
class Entry:
    """One row of the ranking: a job, or a user's, a namespace's or a cause's jobs."""

    key: str
    lost: dict[Why, float] = field(default_factory=dict)
    used: dict[Why, float] = field(default_factory=dict)
    jobs: list[Counted] = field(default_factory=list)
    judged: Judged | None = None  # the job's, or the group's worst job's

    @property
    def lost_s(self) -> float:
        return sum(self.lost.values())

    @property
    def used_s(self) -> float:
        return sum(self.used.values())

    @property
    def worst(self) -> Counted:
        return max(self.jobs, key=lambda c: (c.totals.lost_s, c.totals.job.ident()))


@dataclass
class Ranking:
    """What `report --top` shows: the range, the rows, and where the numbers came from."""

    by: str
    since: float
    until: float
    prometheus: str
    rows: list[Entry]  # the top N
    total_lost_s: float
    total_used_s: float
    job_count: int
    group_count: int
    source: str  # of the lost time: "recording rule" or "raw series"
    kept_count: int
    cost: Mapping[str, int] = field(default_factory=dict)


# --- counting: Prometheus and the kept reports ----------------------------------------


def kept_totals(kept: Kept) -> tuple[JobTotals, float, float] | None:
    """A kept report's job, GPU time and span; None where it says too little."""
    r = kept.report
    start, end = r.get("start"), r.get("end")
    if not isinstance(start, int | float) or not isinstance(end, int | float) or end < start:
        return None
    user = r.get("user") if isinstance(r.get("user"), str) else ""
    lost: dict[Why, float] = {}
    rows = r.get("lost_by_cause")
    if isinstance(rows, list) and rows:
        for x in rows:
            if isinstance(x, dict) and isinstance(x.get("lost_gpu_seconds"), int | float):
                why = (str(x.get("state") or ""), str(x.get("cause") or ""))
                lost[why] = lost.get(why, 0.0) + float(x["lost_gpu_seconds"])
    elif isinstance(r.get("lost_gpu_seconds"), int | float):  # made before the job counters
        why = (str(r.get("verdict") or State.UNKNOWN.value), str(r.get("cause") or ""))
        lost[why] = float(r["lost_gpu_seconds"])
    used: dict[Why, float] = {}
    seconds = r.get("seconds")
    if isinstance(seconds, dict):
        for state, secs in seconds.items():
            if isinstance(secs, int | float) and secs > 0:
                used[(str(state), "")] = float(secs)
    job = JobTotals(JobSelector(hpc_job=kept.job), user or "", lost, used)
    return job, float(start), float(end)


def count(
    totals: Iterable[JobTotals], kept: Iterable[Kept], since: float, until: float
) -> list[Counted]:
    """Each job once: from Prometheus, or from its kept report (see the module's rules)."""
    out: dict[JobSelector, Counted] = {t.job: Counted(t) for t in totals}
    for k in kept:
        got = kept_totals(k)
        if got is None:
            continue
        job, start, end = got
        if end < since or start > until:
            continue
        if start >= since - KEPT_SLACK_S and end <= until + KEPT_SLACK_S:
            out[job.job] = Counted(job, "kept", k)  # whole: complete, whatever Prometheus has
        elif job.job not in out:
            share = (min(end, until) - max(start, since)) / (end - start) if end > start else 1
            job.lost = {w: v * share for w, v in job.lost.items()}
            job.used = {w: v * share for w, v in job.used.items()}
            out[job.job] = Counted(job, "kept", k)
    return [c for c in out.values() if c.totals.lost_s > 0 or c.totals.used_s > 0]


def group_key(c: Counted, by: str) -> list[str]:
    """The rows a job's time goes to: itself, its user, its namespace, or each cause."""
    t = c.totals
    if by == "job":
        return [t.job.ident()]
    if by == "user":
        return [t.user]
    if by == "namespace":
        return [t.job.namespace or NO_NAMESPACE]
    return [why_text(*why) for why, v in t.lost.items() if v > 0]


def rank(counted: Sequence[Counted], by: str) -> list[Entry]:
    """Rows by GPU time lost, largest first (ties by name)."""
    rows: dict[str, Entry] = {}
    for c in counted:
        for key in group_key(c, by):
            e = rows.setdefault(key, Entry(key))
            e.jobs.append(c)
            if by == "cause":
                for why, v in c.totals.lost.items():
                    if why_text(*why) == key:
                        e.lost[why] = e.lost.get(why, 0.0) + v
                for why, v in c.totals.used.items():
                    if why_text(*why) == key:
                        e.used[why] = e.used.get(why, 0.0) + v
                continue
            for why, v in c.totals.lost.items():
                e.lost[why] = e.lost.get(why, 0.0) + v
            for why, v in c.totals.used.items():
                e.used[why] = e.used.get(why, 0.0) + v
    return sorted(rows.values(), key=lambda e: (-e.lost_s, e.key))


# --- judging: a job's verdict from Prometheus' judge, or its kept report --------------------


def _main_why(lost: Mapping[Why, float], state: str) -> str | None:
    """The cause or reason most of the job's lost time in ``state`` went to."""
    inside = {c: v for (s, c), v in lost.items() if s == state and c and v > 0}
    return max(inside, key=lambda c: (inside[c], c)) if inside else None


def judged_from(
    job: JobSelector, j: JobJudged, nodes: Sequence[NodeTime], lost: Mapping[Why, float]
) -> Judged:
    """What the judge says of a job (its nodes' time read from Prometheus)."""
    s = j.summary
    if s.verdict is State.STARVED and s.cause is not None:
        cause: str | None = s.cause.value
    elif s.verdict is State.SYNC_STALL and j.straggler is not None and j.straggler.hung_peers:
        cause = "hang"
    elif s.verdict is State.SYNC_STALL and j.straggler is not None:
        cause = "straggler"
    elif s.verdict in (State.SYNC_STALL, State.IDLE):
        cause = _main_why(lost, s.verdict.value)
    else:
        cause = None
    strag = j.straggler.instance if j.straggler is not None and j.straggler.gpu is None else None
    return Judged(
        job.ident(),
        s.verdict.value,
        cause,
        tuple(n.instance for n in nodes),
        sum(n.gpus for n in nodes),
        strag,
        s.speedup_if_fed,
        s.advice[0].text if s.advice else None,
        "prometheus",
    )


def judged_kept(k: Kept) -> Judged:
    """What a kept report said of its job."""
    r = k.report
    nodes = tuple(
        str(n.get("instance")) for n in r.get("nodes", []) if isinstance(n, dict)
    )  # fmt: skip
    verdict = str(r.get("verdict") or State.UNKNOWN.value)
    cause = r.get("cause") or r.get("reason")
    strag = r.get("straggler")
    advice = r.get("advice")
    speedup = r.get("speedup_if_fed")
    return Judged(
        k.job,
        verdict,
        str(cause) if cause else None,
        nodes,
        int(r["gpu_count"]) if isinstance(r.get("gpu_count"), int) else 0,
        str(strag["instance"]) if isinstance(strag, dict) and strag.get("kind") == "node" else None,
        float(speedup) if isinstance(speedup, int | float) else None,
        str(advice[0]) if isinstance(advice, list) and advice else None,
        "kept",
    )


# --- the JSON: built here only --------------------------------------------------------------


def _lost(d: Mapping[Why, float]) -> list[LostTime]:
    return lost_by_cause((s, c, v) for (s, c), v in d.items())


def _lost_to(lost: Mapping[Why, float]) -> dict[str, Any] | None:
    """Where most of the lost time went (whatever the verdict of the working time)."""
    rows = _lost(lost)
    if not rows:
        return None
    total = sum(x.seconds for x in rows)
    top = rows[0]
    return {"state": top.state, "cause": top.cause or None, "share": round(top.seconds / total, 4)}


def _share(lost: float, used: float) -> float | None:
    return round(lost / used, 4) if used > 0 else None


def _judged_json(j: Judged | None) -> dict[str, Any]:
    if j is None:
        return {"verdict": None, "cause": None}
    return {
        "verdict": j.verdict,
        "cause": j.cause,
        "nodes": list(j.nodes),
        "gpus": j.gpus,
        "straggler_node": j.straggler,
        "speedup_if_fed": j.speedup_if_fed,
        "advice": j.advice,
        "judged_from": j.source,
    }


def _job_json(c: Counted, judged: Judged | None) -> dict[str, Any]:
    t = c.totals
    job = t.job
    return {
        "job": job.ident(),
        "user": t.user or None,
        "kind": job.job_kind or ("slurm" if job.hpc_job is not None else "pod"),
        "selector": job.labels(),
        "lost_gpu_seconds": round(t.lost_s, 1),
        "gpu_hours_lost": round(t.lost_s / 3600, 3),
        "gpu_seconds": round(t.used_s, 1),
        "lost_share": _share(t.lost_s, t.used_s),
        **_judged_json(judged),
        "lost_to": _lost_to(t.lost),
        "lost_by_cause": [lost_json(x) for x in _lost(t.lost)],
        "source": c.source,
    }


def _row_json(e: Entry, by: str) -> dict[str, Any]:
    if by == "job":
        return _job_json(e.jobs[0], e.judged)
    worst = e.worst
    out: dict[str, Any] = {by: e.key or None}
    if by == "cause":
        state, _, cause = e.key.partition("/")
        out = {"state": state, "cause": cause or None}
    out.update(
        {
            "lost_gpu_seconds": round(e.lost_s, 1),
            "gpu_hours_lost": round(e.lost_s / 3600, 3),
            "gpu_seconds": round(e.used_s, 1),
            "lost_share": _share(e.lost_s, e.used_s),
            "job_count": len(e.jobs),
            "lost_by_cause": [lost_json(x) for x in _lost(e.lost)],
            "worst_job": _job_json(worst, e.judged) if e.judged is not None else None,
            "jobs": [c.totals.job.ident() for c in _worst_first(e.jobs)[:10]],
        }
    )
    return out


def _worst_first(jobs: Iterable[Counted]) -> list[Counted]:
    return sorted(jobs, key=lambda c: (-c.totals.lost_s, c.totals.job.ident()))


def to_json(r: Ranking) -> dict[str, Any]:
    """The one object of `gpumon report --top --json`; its list is under ``jobs`` (or
    ``users``, ``namespaces``, ``causes`` with ``--by``)."""
    return {
        "by": r.by,
        "prometheus": r.prometheus,
        "since": r.since,
        "until": r.until,
        "lost_gpu_seconds": round(r.total_lost_s, 1),
        "gpu_seconds": round(r.total_used_s, 1),
        "lost_share": _share(r.total_lost_s, r.total_used_s),
        "job_count": r.job_count,
        f"{LIST_KEY[r.by][:-1]}_count": r.group_count,
        LIST_KEY[r.by]: [{"rank": i + 1, **_row_json(e, r.by)} for i, e in enumerate(r.rows)],
        "sources": {"lost_time": r.source, "kept_reports": r.kept_count, **r.cost},
    }


# --- text -----------------------------------------------------------------------------------


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).astimezone().strftime("%Y-%m-%d %H:%M")


def gpu_time(s: float) -> str:
    """GPU time as people count it: ``312 GPU-h``, ``4.2 GPU-h``, ``35 GPU-min``, ``40 GPU-s``."""
    h = s / 3600
    if h >= 100:
        return f"{h:.0f} GPU-h"
    if h >= 1:
        return f"{h:.1f} GPU-h"
    if s >= 60:
        return f"{s / 60:.0f} GPU-min"
    return f"{s:.0f} GPU-s"


def _lost_line(lost: Mapping[Why, float]) -> str:
    rows = _lost(lost)
    total = sum(x.seconds for x in rows)
    return ", ".join(
        f"{why_text(x.state, x.cause)} {gpu_time(x.seconds)} ({x.seconds / total * 100:.0f} %)"
        for x in rows
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f} %"


def _verdict(j: Judged | None, lost: Mapping[Why, float] | None = None) -> str:
    """``starved/cpu``, ``sync_stall/straggler (waits on n1)``; where most of the lost
    time went in another state than the verdict's, that too."""
    if j is None:
        return "not judged"
    out = f"{j.verdict}/{j.cause}" if j.cause else j.verdict
    if j.straggler:
        out += f" (waits on {j.straggler})"
    top = _lost(lost or {})
    if top and top[0].state != j.verdict:
        total = sum(x.seconds for x in top)
        out += (
            f", lost {top[0].seconds / total * 100:.0f} % to {why_text(top[0].state, top[0].cause)}"
        )
    return out


def _head(r: Ranking, what: str) -> list[str]:
    span = clock(r.until - r.since, 0)
    total = (
        f"{gpu_time(r.total_lost_s)} lost of {gpu_time(r.total_used_s)} "
        f"({_pct(_share(r.total_lost_s, r.total_used_s))}) in {r.job_count} job(s)"
    )
    return [
        f"gpumon report · {what} · {_when(r.since)} – {_when(r.until)} ({span}) · {r.prometheus}",
        total + (f", {r.kept_count} from kept reports" if r.kept_count else ""),
        "",
    ]


def render_text(r: Ranking) -> str:
    """The ranking, a few lines a row: by user, a digest short enough to mail."""
    what = f"top {len(r.rows)} {LIST_KEY[r.by]} by GPU time lost"
    out = _head(r, what)
    if not r.rows:
        out.append("no GPU time lost in the range")
        return "\n".join(out) + "\n"
    name_w = max(len(e.key or NO_NAMESPACE_TEXT) for e in r.rows)
    name_w = max(name_w, len(r.by))
    for i, e in enumerate(r.rows, 1):
        key = e.key or (NO_NAMESPACE_TEXT if r.by == "namespace" else "(unknown)")
        line = (
            f"{i:>3}  {key:<{name_w}}  {gpu_time(e.lost_s):>11} lost "
            f"({_pct(_share(e.lost_s, e.used_s))} of {gpu_time(e.used_s)})"
        )
        if r.by == "job":
            c = e.jobs[0]
            line += f"  user {c.totals.user or '?'}  {_verdict(e.judged, c.totals.lost)}"
            j = e.judged
            if j is not None:
                line += f"  {len(j.nodes)} node(s)"
                fed = j.speedup_if_fed
                if j.verdict in (State.STARVED.value, State.SYNC_STALL.value) and fed:
                    line += f"  {fed:.1f}x if fed" if fed >= 1.05 else ""
            if c.source == "kept":
                line += "  (kept report)"
        else:
            line += f"  in {len(e.jobs)} job(s)"
        out.append(line)
        if r.by != "cause" and e.lost_s > 0:
            out.append(f"       {_lost_line(e.lost)}")
        if r.by in ("user", "namespace") and e.judged is not None:
            w = e.worst
            out.append(
                f"       worst: {w.totals.job.describe()} ({gpu_time(w.totals.lost_s)}, "
                f"{_verdict(e.judged, w.totals.lost)})"
            )
        if r.by == "cause":
            out.append(
                "       most: "
                + ", ".join(
                    f"{c.totals.job.describe()} ({gpu_time(_lost_in(c, e.key))})"
                    for c in sorted(e.jobs, key=lambda c: -_lost_in(c, e.key))[:3]
                )
            )
        if e.judged is not None and e.judged.advice:
            out.append(f"       advice: {e.judged.advice}")
    return "\n".join(out) + "\n"


NO_NAMESPACE_TEXT = "(not a pod)"


def _lost_in(c: Counted, key: str) -> float:
    return sum(v for why, v in c.totals.lost.items() if why_text(*why) == key)
