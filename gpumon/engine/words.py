"""The words every face prints for the same things: states, causes, durations, evidence.

``gpumon analyze``, ``watch``, ``report``, ``demo`` and the daemon's log all say what a
run did; when one face wrote "starved/cpu, duty 41 %" and another "starved cpu=41%" a
reader had to translate.  Everything here is a pure function of a value: no face state.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Final

from gpumon.detect import RunSummary
from gpumon.detect.activities import RoleShares, StackWindow
from gpumon.evidence_fields import EVIDENCE_FIELDS
from gpumon.model import Cause, Evidence, State
from gpumon.terminal import printable


def state_label(state: State, cause: Cause | None) -> str:
    """``starved/cpu`` for a starved state with a cause, else the state's name."""
    if cause is not None and state is State.STARVED:
        return f"{state.value}/{cause.value}"
    return state.value


def verdict_words(state: State, cause: Cause | None) -> str:
    """``STARVED (cause: cpu)``: a run's verdict as a headline."""
    word = state.value.upper().replace("_", " ")
    if cause is not None and state is State.STARVED:
        word += f" (cause: {cause.value})"
    return word


def clock(t: float, t0: float) -> str:
    """A moment of a run as elapsed time since ``t0``: ``4:05``, ``1:02:03``."""
    s = max(0, round(t - t0))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def duration(seconds: float | None) -> str:
    """A length of time: ``670ms``, ``4.5s``, ``1m 15s``, ``2h 03m 00s``."""
    if seconds is None:
        return "n/a"
    if seconds < 1.0:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60.0:
        return f"{seconds:.1f}s"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def share(x: float | None) -> str:
    """A ratio 0-1 as a percentage: ``41%`` (``n/a`` without a reading)."""
    return "n/a" if x is None else f"{x * 100:.0f}%"


def fmt_bytes(n: float | None, suffix: str = "") -> str:
    """Bytes in binary units: ``13.2 GiB``; ``–`` without a reading."""
    if n is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}{suffix}" if unit == "B" else f"{n:.1f} {unit}{suffix}"
        n /= 1024
    return f"{n:.1f} TiB{suffix}"


def short_command(command: tuple[str, ...], limit: int = 60) -> str:
    """``/usr/bin/python3 /a/b/train.py --lr 3e-4`` -> ``python3 train.py --lr 3e-4``."""
    text = " ".join(os.path.basename(a) if i < 2 and "/" in a else a for i, a in enumerate(command))
    return printable(text, limit)  # a command line is anyone's text: shown escaped


def seconds_by_state(seconds: Mapping[State, float] | None) -> dict[str, float]:
    """Seconds per state as JSON keys (every state, 0 where none), to the millisecond."""
    return {s.value: round((seconds or {}).get(s, 0.0), 3) for s in State}


def speedup_sentence(summary: RunSummary) -> str | None:
    """The speed-up if fed, in words, with its basis: what fixing the verdict is worth."""
    x, duty = summary.speedup_if_fed, summary.work_duty_cycle
    if x is None or duty is None or x < 1.1:
        return None
    if summary.verdict is State.STARVED:
        what = "fixing the input pipeline"
    elif summary.verdict is State.SYNC_STALL:
        what = "removing the waits on peers"
    else:
        return None
    return (
        f"{what} could make this run up to {x:.1f}x faster (its GPUs computed "
        f"{duty * 100:.0f} % of their working time)"
    )


# --- evidence --------------------------------------------------------------------------------

# How each format of evidence value is written (gpumon.evidence_fields names the format).
_KINDS: Final[dict[str, Callable[[float], str]]] = {
    "ratio": share,  # 0-1
    "pct": lambda v: f"{v:.0f}%",  # 0-100
    "s": duration,
    "W": lambda v: f"{v:.0f} W",
    "bytes": fmt_bytes,
    "Bps": lambda v: fmt_bytes(v, "/s"),
    "int": lambda v: f"{v:.0f}",
    "f2": lambda v: f"{v:.2f}",
    "f1": lambda v: f"{v:.1f}",
    "gpu": lambda v: f"GPU {v:.0f}",
}

# What the job's processes were doing, in words (detect.activities.Activity values).
ACTIVITY_WORDS: Final = {
    "loader_wait": "waiting on the loader",
    "decode": "decoding/augmenting",
    "read": "reading files",
    "checkpoint": "writing a checkpoint",
    "evaluation": "evaluating",
    "collective": "in a collective",
    "gpu_wait": "waiting on the GPU",
    "step": "Python work",
    "idle": "idle",
}

# Evidence keys in the order people read them (most telling first), with their labels
# and formats: the worded rows of the one table of evidence fields.
EVIDENCE: Final[tuple[tuple[str, str, str], ...]] = tuple(
    (f.name, f.label, f.fmt) for f in EVIDENCE_FIELDS if f.label is not None
)
# Evidence kept for machines (JSON, the log) but not worth a person's attention.
QUIET_EVIDENCE: Final = frozenset(f.name for f in EVIDENCE_FIELDS if f.label is None)
_KNOWN: Final = {f.name for f in EVIDENCE_FIELDS}


def evidence_value(value: object, kind: str) -> str:
    """One evidence value in its kind's words (text values as they are)."""
    if kind == "act":
        return ACTIVITY_WORDS.get(str(value), str(value))
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    write = _KINDS.get(kind)
    return write(value) if write is not None else f"{value:.3g}"


def evidence_items(evidence: Evidence | Mapping[str, object]) -> list[tuple[str, str]]:
    """(label, value) pairs, most telling first; keys not listed follow as they come."""
    ev: Mapping[str, object] = evidence
    out = [
        (label, evidence_value(ev[key], kind))
        for key, label, kind in EVIDENCE
        if ev.get(key) is not None
    ]
    out += [
        (k.replace("_", " "), evidence_value(v, ""))
        for k, v in ev.items()
        if k not in _KNOWN and v is not None
    ]
    return out


def evidence_line(evidence: Evidence | Mapping[str, object]) -> str:
    """The listed evidence on one line: ``duty cycle 41%, gap p50 840ms, ...``."""
    ev: Mapping[str, object] = evidence
    return ", ".join(
        f"{label} {evidence_value(ev[key], kind)}"
        for key, label, kind in EVIDENCE
        if ev.get(key) is not None
    )


# --- Python stacks (--stacks) ----------------------------------------------------------------


def stack_roles(win: StackWindow) -> list[tuple[str, RoleShares]]:
    """The roles that have stacks, as people name them: ``main process`` (``ranks``
    where several drive GPUs), ``workers``."""
    main = "ranks" if len(win.ranks) >= 2 else "main process"
    return [(n, r) for n, r in ((main, win.main), ("workers", win.workers)) if r.seconds > 0]


def stacks_json(win: StackWindow, top: int = 5) -> dict[str, object]:
    """Activity shares and the places that took most, per role: the summary JSON's
    ``stacks`` (shares of the role's gap-weighted seconds)."""
    out: dict[str, object] = {}
    for name, shares in stack_roles(win):
        key = "ranks" if name == "ranks" else "main" if name == "main process" else "workers"
        acts = sorted(shares.activities.items(), key=lambda x: -x[1])
        out[key] = {
            "seconds": round(shares.seconds, 2),
            "activities": {a.value: round(s / shares.seconds, 3) for a, s in acts},
            "top": [
                {"where": w, "activity": shares.where_activity[w].value, "share": round(x, 3)}
                for w, x in shares.top_where(None, top)
            ],
        }
    return out


def stacks_line(win: StackWindow) -> str:
    """One line of what the job's processes did during the gaps: ``main process: waiting
    on the loader 71% (train.py:42 train -> ...); workers: decoding/augmenting 80% (...)``."""
    parts = []
    for name, shares in stack_roles(win):
        top = shares.top()
        if top is None:
            continue
        act, x = top
        place = shares.top_where(act)
        where = f" ({place[0][0]})" if place else ""
        parts.append(f"{name}: {ACTIVITY_WORDS.get(act.value, act.value)} {share(x)}{where}")
    return "; ".join(parts)
