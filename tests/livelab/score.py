"""Score what gpumon's faces said about a lab run against what the run did.

Faces, each read per GPU as a timeline of (time, state, cause, reason):

- ``watch``: watch's plain lines as they arrived (the run's state and cause; each GPU's
  state from the ``gpuN:state`` part where the run has several GPUs);
- ``serve``: the daemon's ``/metrics`` scraped every second (``gpumon_gpu_state``,
  ``_cause``, ``_reason``);
- ``serve_log``: the episodes of the daemon's log (backdated to their onsets);
- ``analyze``: the episodes of ``gpumon analyze --json`` of watch's recording.

Truth per GPU is the label of the phase running (``truth.py``; a phase whose measured label
differs from its design is left out and reported), and idle (no process) after the job
exited.  Every second from the go signal on, each face's state is compared with the truth,
except within a settling margin after each truth change: ``LIVE_MARGIN_S`` for the live
faces (the detector's 8 s window and one evaluation), ``BACKDATED_MARGIN_S`` for the
episode faces (backdated to their onsets), and ``TARGET_STARTUP_S`` after a run's first
sample, whatever the run does from it (the issue's target for a GPU busy from its first
sample); nor in the second before a change (``GUARD_S``: a phase's last kernel ends a
moment before its loop says so).  Near the seconds the truth's CPU reads show other
processes holding the job back (``held_back``: other work on a shared machine comes and
goes within a phase), contention is a right cause too, and a turn to it and back no flap.
What is computed, per face:

- precision and recall per state, cause accuracy (starved seconds on which face and
  truth agree on starved: the share with the right cause), reason accuracy where the truth
  names one (idle: memory held or no process; sync_stall: straggler or busy-wait);
- latency: from each truth change to the first time the face shows the new state (and
  cause) and keeps it 3 s;
- changes of state and of cause per steady minute (after the margin), and the most cause
  changes in one steady phase;
- whether the faces tell the same story: watch's lines against serve's metrics and against
  the summary's own episodes (analyze of watch's recording) second by second once settled
  (the lines lag each change by their latency, scored above; the summary places it where
  it happened), the lines' start-up against the summary's, the summary against analyze
  (verdict, cause, seconds per state, GPU-seconds lost), the summary's per-GPU
  ``lost_gpu_seconds`` against its run total, and its advice (no repeats; a line for each cause the
  run was starved by); and that serve's job series name the job, wherever it ran (a Slurm
  job by its id; on a node with no scheduler, by its top process or its container).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from livelab.truth import Label, PhaseTotals, held_back, read_truth

STATES = ("healthy", "starved", "sync_stall", "idle", "unknown")
LIVE_FACES = ("watch", "serve")
BACKDATED_FACES = ("serve_log", "analyze")
FACES = LIVE_FACES + BACKDATED_FACES
# A live face judges a window of samples (8 s) once a second: a new regime shows within the
# window and one evaluation.  The episode faces are backdated to onsets: a few seconds.
LIVE_MARGIN_S = 9.0
BACKDATED_MARGIN_S = 3.0
# The truth's phase boundaries are known to about a driver sample (the last kernel of a
# phase ends a moment before the loop says so): the second before a change is not scored.
GUARD_S = 1.0
ENDS_WITH_JOB = ("watch", "analyze")
STALE_S = 3.0  # a live observation older than this is no reading
HOLD_S = 3.0  # latency: the right state shown and kept this long
# Reasons the truth knows and the faces name (watch's note is for people: not scored).
REASONS_SCORED = ("memory allocated, no work", "no process", "straggler", "busy-wait", "hang")
# The truth's CPU, read over this many seconds, tells which seconds other processes held
# the job back (the load on a shared machine comes and goes within a phase).
HELD_WINDOW_S = 3.0

TARGET_PR = 0.95
TARGET_CAUSE = 0.95
TARGET_STARTUP_S = 3.0
TARGET_CAUSE_CHANGES = 1

# Reasons as the metrics spell them -> as the detector's Reason values read.
_REASON_ALIASES = {
    "start_up": "start-up",
    "no_process": "no process",
    "memory_held": "memory allocated, no work",
    "no_work": "no work",
    "busy_wait": "busy-wait",
    "periodic_gaps": "periodic gaps",
    "sync_pauses": "all GPUs pause together",
}
# The per-GPU parts of a plain watch line ("gpu0:healthy gpu1:sync_stall").
_GPU_STATE = re.compile(r"\bgpu(\d+):(\w+)")
_LINE = re.compile(r"\bstate=(\w+) cause=(\S+)(?: \(([^)]*)\))?")
_GPU_DUTY = re.compile(r"\bgpu(\d+)=(?:\d+%|n/a|lost)")


@dataclass(frozen=True)
class Obs:
    t: float
    state: str
    cause: str | None
    reason: str | None


@dataclass(frozen=True)
class Seg:
    """A stretch of truth for one GPU."""

    start: float
    end: float
    label: Label
    phase: str
    valid: bool = True
    # What the stretch was, seen from after it: spinning that went on into a hang was the
    # hang from its start, as the faces that place a change where it happened (the summary's
    # episodes, serve's log) name it; the live faces can say so only past the threshold.
    hindsight: Label | None = None


# --------------------------------------------------------------------------- reading a run


@dataclass
class Run:
    """A finished run's files, read."""

    dir: Path
    meta: dict[str, Any]
    truth: dict[int, list[Seg]]
    faces: dict[str, dict[int, list[Obs]]]  # face -> gpu -> timeline
    intervals: dict[str, dict[int, list[tuple[float, float, Obs]]]]  # episode faces
    summary: dict[str, Any] | None
    analysis: dict[str, Any] | None
    serve_stop: dict[str, Any] | None
    invalid_phases: list[dict[str, Any]]
    watch_spans: list[tuple[float, float, str, str | None]]  # watch's lines: start, end,
    # the run's state and the note
    serve_jobs: list[dict[str, str]] = field(default_factory=list)  # as serve's series name
    # them (each label set once)
    # Per GPU, the end of the first second the truth saw it work: before a kernel (or a
    # spin) has run, no driver sample can show work, however loaded the machine kept it.
    first_work: dict[int, float] = field(default_factory=dict)
    # Per GPU, the seconds (their starts) that processes outside the job held it back, by
    # the truth's own rule over HELD_WINDOW_S: a face may say contention near them.
    held_back: dict[int, list[float]] = field(default_factory=dict)

    @property
    def go_t(self) -> float:
        return float(self.meta["go_t"])

    @property
    def gpus(self) -> list[int]:
        return sorted(self.truth)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]
    except (OSError, json.JSONDecodeError):
        return None


def _reason(r: str | None) -> str | None:
    return None if r is None else _REASON_ALIASES.get(r, r)


def _hang_from_its_start(segs: list[Seg], spun_before: dict[float, float]) -> None:
    """Mark the stretches of spin a hang followed as the hang (``Seg.hindsight``): a hang
    phase's truth says how long nothing but spin went on before it began."""
    for seg in list(segs):
        if seg.label.reason != "hang":
            continue
        began = seg.start - spun_before.get(seg.start, 0.0) - GUARD_S
        for i, before in enumerate(segs):
            if began <= before.start and before.end <= seg.start + GUARD_S and before is not seg:
                segs[i] = replace(before, hindsight=seg.label)


def read_run(run_dir: Path) -> Run:
    run_dir = Path(run_dir)
    meta = json.loads((run_dir / "run.json").read_text())
    truth: dict[int, list[Seg]] = {}
    invalid: list[dict[str, Any]] = []
    exits: dict[int, float] = {}
    first_work: dict[int, float] = {}
    held: dict[int, list[float]] = {}
    spun: dict[int, dict[float, float]] = {}  # per GPU, per phase start: spin before it
    for path in sorted(run_dir.glob("truth-rank*.jsonl")):
        records = read_truth(path)
        for gpu, seconds in _held_back_seconds(records).items():
            held.setdefault(gpu, []).extend(seconds)
        for rec in records:
            gpu = int(rec["gpu"])
            if "event" not in rec and rec.get("compute", 0) + rec.get("spin", 0) > 0:
                first_work[gpu] = min(first_work.get(gpu, float("inf")), float(rec["t"]) + 1.0)
            if rec.get("event") == "phase_end":
                lab = Label(**rec["label"])
                seg = Seg(float(rec["start"]), float(rec["t"]), lab, rec["phase"], rec["valid"])
                spun.setdefault(gpu, {})[seg.start] = float(rec["measured"].get("spun_before", 0))
                truth.setdefault(gpu, []).append(seg)
                if not rec["valid"]:
                    invalid.append(rec)
            elif rec.get("event") == "exit":
                exits[gpu] = float(rec["t"])
    end_t = float(meta["end_t"])
    observe = float(meta["scenario"].get("observe_after_exit_s") or 0.0)
    for gpu, segs in truth.items():
        segs.sort(key=lambda s: s.start)
        _hang_from_its_start(segs, spun.get(gpu, {}))
        gone = exits.get(gpu, segs[-1].end if segs else None)
        if gone is not None and observe > 0:
            segs.append(Seg(gone, end_t, Label("idle", None, "no process"), "exited"))
    faces: dict[str, dict[int, list[Obs]]] = {f: {} for f in LIVE_FACES}
    spans: list[tuple[float, float, str, str | None]] = []
    last: tuple[float, str, str | None] | None = None
    for rec in _jsonl(run_dir / "watch.jsonl"):
        m = _LINE.search(rec["line"])
        if not m or not _GPU_DUTY.search(rec["line"]):
            continue  # waiting for a GPU, or the summary after the lines
        t = float(rec["t"])
        state, cause, note = str(m[1]), None if m[2] == "-" else str(m[2]), m[3]
        per_gpu = {int(g): s for g, s in _GPU_STATE.findall(rec["line"])}
        shown = [int(g) for g in re.findall(r"\bgpu(\d+)=", rec["line"])]
        for gpu in shown:
            s = per_gpu.get(gpu, state)
            c = cause if s == state == "starved" else None
            faces["watch"].setdefault(gpu, []).append(Obs(t, s, c, note if s == state else None))
        if last is not None:
            spans.append((last[0], t, last[1], last[2]))
        last = (t, state, note)
    serve_jobs: list[dict[str, str]] = []
    for rec in _jsonl(run_dir / "metrics.jsonl"):
        for labels in rec.get("jobs", []):
            if labels not in serve_jobs:
                serve_jobs.append(labels)
        for gpu, v in rec["gpus"].items():
            if v.get("state") is None:
                continue
            faces["serve"].setdefault(int(gpu), []).append(
                Obs(float(rec["t"]), v["state"], v.get("cause"), _reason(v.get("reason")))
            )
    offset = float(meta["wall_minus_mono"])
    intervals: dict[str, dict[int, list[tuple[float, float, Obs]]]] = {
        f: {} for f in BACKDATED_FACES
    }
    serve_stop = None
    for rec in _jsonl(run_dir / "serve.jsonl"):
        if rec.get("event") == "stop":
            serve_stop = rec
        if rec.get("event") != "episode_end" or rec.get("scope") != "gpu":
            continue
        a, b = float(rec["start"]) - offset, float(rec["end"]) - offset
        intervals["serve_log"].setdefault(int(rec["gpu"]), []).append(
            (a, b, Obs(a, rec["state"], rec.get("cause"), rec.get("reason")))
        )
    analysis = _json(run_dir / "analyze.json")
    for g in (analysis or {}).get("gpus", []):
        for ep in g.get("episodes", []):
            a, b = float(ep["start"]), float(ep["end"])
            intervals["analyze"].setdefault(int(g["gpu"]), []).append(
                (a, b, Obs(a, ep["state"], ep.get("cause"), ep.get("reason")))
            )
    return Run(
        run_dir,
        meta,
        truth,
        faces,
        intervals,
        _json(run_dir / "summary.json"),
        analysis,
        serve_stop,
        invalid,
        spans,
        serve_jobs,
        first_work,
        held,
    )


def _held_back_seconds(records: list[dict[str, Any]]) -> dict[int, list[float]]:
    """Per GPU, the truth's seconds that processes outside the job held it back: over the
    HELD_WINDOW_S ending with the second, its CPU reads and its main process's waits make
    ``contention`` (or ``ambiguous``) by the rule that labels whole phases."""
    reads: dict[int, list[dict[str, Any]]] = {}
    waits: dict[int, dict[float, float]] = {}
    for rec in records:
        gpu = int(rec["gpu"])
        if rec.get("event") == "cpu":
            reads.setdefault(gpu, []).append(rec)
        elif "event" not in rec:
            waits.setdefault(gpu, {})[float(rec["t"])] = sum(rec.get("wait", {}).values())
    out: dict[int, list[float]] = {}
    for gpu, per_second in waits.items():
        for sec in sorted(per_second):
            lo, hi = sec + 1.0 - HELD_WINDOW_S, sec + 1.0
            p = PhaseTotals(waits={"main": sum(w for s, w in per_second.items() if lo <= s < hi)})
            for r in reads.get(gpu, []):
                if lo < float(r["t"]) <= hi:
                    p.job_run_s += r["job_run_s"]
                    p.job_wait_s += r["job_wait_s"]
                    p.host_busy_s += r["host_busy_s"]
                    p.host_total_s += r["host_total_s"]
            if held_back(p) is not None:
                out.setdefault(gpu, []).append(sec)
    return out


def _held_near(run: Run, gpu: int, t: float) -> bool:
    """Whether others held the job back near ``t``: within the live margin before it (a
    live face judges a window), or the backdated margin after (an episode is backdated)."""
    return any(
        t - LIVE_MARGIN_S <= s + 1.0 and s <= t + BACKDATED_MARGIN_S
        for s in run.held_back.get(gpu, [])
    )


def _cause_fits(run: Run, gpu: int, t: float, said: str | None, want: str | None) -> bool:
    """The cause a face said is the truth's, or contention where others held the job back
    near ``t`` (whatever the phase was designed to wait on)."""
    return said == want or (said == "contention" and _held_near(run, gpu, t))


# --------------------------------------------------------------------------- per second


def truth_at(segs: list[Seg], t: float) -> Seg | None:
    for s in segs:
        if s.start <= t < s.end:
            return s
    return None


def _live_at(tl: list[Obs], t: float) -> Obs | None:
    best = None
    for o in tl:
        if o.t > t:
            break
        best = o
    if best is None or t - best.t > STALE_S:
        return None
    return best


def _interval_at(iv: list[tuple[float, float, Obs]], t: float) -> Obs | None:
    hit = None
    for a, b, o in iv:
        if a <= t < b:
            hit = o  # a later episode wins where two overlap (an instant at a hand-over)
    return hit


def face_at(run: Run, face: str, gpu: int, t: float) -> Obs | None:
    if face in LIVE_FACES:
        return _live_at(run.faces[face].get(gpu, []), t)
    return _interval_at(run.intervals[face].get(gpu, []), t)


WORKING = ("healthy", "starved", "sync_stall")


def onset(run: Run, gpu: int, seg: Seg, first: bool) -> float:
    """When a face could first show ``seg``: its start (from the go signal), or, for a
    run's first phase of work, the end of the second its GPU first worked (a job the
    machine kept from its first kernel for seconds is idle to every face till then)."""
    start = max(seg.start, run.go_t)
    work = run.first_work.get(gpu)
    if first and seg.label.state in WORKING and work is not None:
        start = max(start, min(work, seg.end))
    return start


def _margin(face: str, first: bool = False) -> float:
    """Seconds after a truth change not scored.  A GPU busy from its first sample is to be
    shown healthy within TARGET_STARTUP_S (the issue's target); the same holds for whatever
    a run does from its first sample (starved, stalled): that is a first phase's margin."""
    if face not in LIVE_FACES:
        return BACKDATED_MARGIN_S
    return TARGET_STARTUP_S if first else LIVE_MARGIN_S


def instants(run: Run, gpu: int) -> list[float]:
    segs = run.truth.get(gpu, [])
    if not segs:
        return []
    t, end = max(run.go_t, segs[0].start) + 0.5, segs[-1].end
    out = []
    while t < end:
        out.append(t)
        t += 1.0
    return out


@dataclass
class FaceScore:
    """One face's figures over one run (or several, added up)."""

    face: str
    pairs: Counter[tuple[str, str]] = field(default_factory=Counter)  # (truth, face) seconds
    missing: int = 0  # scored seconds the face said nothing
    cause_right: int = 0
    cause_total: int = 0
    cause_pairs: Counter[tuple[str, str]] = field(default_factory=Counter)
    reason_right: int = 0
    reason_total: int = 0
    reason_pairs: Counter[tuple[str, str]] = field(default_factory=Counter)
    latencies: list[dict[str, Any]] = field(default_factory=list)
    state_changes: int = 0
    cause_changes: int = 0
    steady_s: float = 0.0
    max_cause_changes_per_phase: int = 0

    def precision(self, state: str) -> float | None:
        n = self.said(state)
        return None if n == 0 else self.pairs[(state, state)] / n

    def recall(self, state: str) -> float | None:
        n = self.support(state)
        return None if n == 0 else self.pairs[(state, state)] / n

    def support(self, state: str) -> int:
        """Scored seconds the truth was ``state``."""
        return sum(v for (tr, _), v in self.pairs.items() if tr == state)

    def said(self, state: str) -> int:
        """Scored seconds the face said ``state``."""
        return sum(v for (_, f), v in self.pairs.items() if f == state)

    def worst(self, min_s: int = 3) -> float | None:
        """The lowest precision or recall over the states seen at least ``min_s`` seconds."""
        vals = [self.precision(s) for s in STATES if self.said(s) >= min_s]
        vals += [self.recall(s) for s in STATES if self.support(s) >= min_s]
        return min((v for v in vals if v is not None), default=None)

    @property
    def cause_accuracy(self) -> float | None:
        return None if self.cause_total == 0 else self.cause_right / self.cause_total

    @property
    def reason_accuracy(self) -> float | None:
        return None if self.reason_total == 0 else self.reason_right / self.reason_total

    def changes_per_min(self) -> tuple[float | None, float | None]:
        if self.steady_s < 1.0:
            return None, None
        m = self.steady_s / 60.0
        return self.state_changes / m, self.cause_changes / m

    def add(self, other: FaceScore) -> None:
        """Add another run's figures (the benchmark sums seeds)."""
        for f in fields(self):
            if f.name == "face":
                continue
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.name.startswith("max_"):
                setattr(self, f.name, max(mine, theirs))
            else:
                setattr(self, f.name, mine + theirs)


def score_face(run: Run, face: str, phases: set[str] | None = None) -> FaceScore:
    """The face's figures over the run, or over the named phases of it."""
    fs = FaceScore(face)
    for gpu in run.gpus:
        segs = run.truth[gpu]
        for t in instants(run, gpu):
            seg = truth_at(segs, t)
            if seg is None or not seg.valid:
                continue
            first = seg is segs[0]
            if t - onset(run, gpu, seg, first) < _margin(face, first):
                continue
            if seg.end - t < GUARD_S and seg is not segs[-1]:
                continue
            if phases is not None and seg.phase not in phases:
                continue
            if seg.phase == "exited" and face in ENDS_WITH_JOB:
                continue  # watch (and its recording) end when the job does
            o = face_at(run, face, gpu, t)
            if o is None:
                fs.missing += 1
                continue
            want = seg.label if face in LIVE_FACES or seg.hindsight is None else seg.hindsight
            fs.pairs[(want.state, o.state)] += 1
            if want.state == "starved" and o.state == "starved":
                fits = _cause_fits(run, gpu, t, o.cause, want.cause)
                fs.cause_total += 1
                fs.cause_right += int(fits)
                fs.cause_pairs[(str(o.cause if fits else want.cause), str(o.cause))] += 1
            if face != "watch" and want.reason in REASONS_SCORED and o.state == want.state:
                fs.reason_total += 1
                fs.reason_right += int(o.reason == want.reason)
                fs.reason_pairs[(want.reason, str(o.reason))] += 1
        for seg in segs:
            if phases is not None and seg.phase not in phases:
                continue
            if seg.valid and not (seg.phase == "exited" and face in ENDS_WITH_JOB):
                fs.latencies.append(_latency(run, face, gpu, seg, first=seg is segs[0]))
        _changes(run, face, gpu, [s for s in segs if phases is None or s.phase in phases], fs)
    return fs


def _shows(run: Run, gpu: int, t: float, o: Obs | None, want: Label) -> bool:
    if o is None or o.state != want.state:
        return False
    return want.state != "starved" or _cause_fits(run, gpu, t, o.cause, want.cause)


def _latency(run: Run, face: str, gpu: int, seg: Seg, first: bool) -> dict[str, Any]:
    """Seconds from the truth change to the face showing it (and keeping it HOLD_S)."""
    start = onset(run, gpu, seg, first)
    t, step = start, 0.25
    shown_at = None
    while t < seg.end:
        if _shows(run, gpu, t, face_at(run, face, gpu, t), seg.label):
            if shown_at is None:
                shown_at = t
            if t - shown_at >= min(HOLD_S, seg.end - shown_at - step):
                break
        else:
            shown_at = None
        t += step
    else:
        shown_at = None
    return {
        "gpu": gpu,
        "phase": seg.phase,
        "truth": asdict(seg.label),
        "first": first,
        "latency_s": None if shown_at is None else round(shown_at - start, 2),
        "phase_s": round(seg.end - start, 1),
    }


def _changes(run: Run, face: str, gpu: int, segs: list[Seg], fs: FaceScore) -> None:
    """State and cause changes within each steady phase (after the margin)."""
    margin = _margin(face)  # (the regular one even at the start: steadiness, not speed)
    if face in LIVE_FACES:
        seq = [(o.t, o) for o in run.faces[face].get(gpu, [])]
    else:
        seq = [(a, o) for a, _, o in run.intervals[face].get(gpu, [])]
    for seg in segs:
        if not seg.valid or seg.phase == "exited":
            continue
        a, b = seg.start + margin, seg.end
        if b - a < 1.0:
            continue
        fs.steady_s += b - a
        prev = face_at(run, face, gpu, a)
        sc = cc = 0
        for t, o in seq:
            if not a < t < b:
                continue
            if prev is not None and o.state != prev.state:
                sc += 1
            if (
                prev is not None
                and o.state == prev.state == "starved"
                and not _cause_fits(run, gpu, t, o.cause, prev.cause)
                and not _cause_fits(run, gpu, t, prev.cause, o.cause)
            ):
                cc += 1  # (a turn to or from contention where others held the job back: theirs)
            prev = o
        fs.state_changes += sc
        fs.cause_changes += cc
        fs.max_cause_changes_per_phase = max(fs.max_cause_changes_per_phase, cc)


# --------------------------------------------------------------------------- the faces agree


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def _truth_seconds(run: Run) -> dict[str, float]:
    out: dict[str, float] = {}
    for segs in run.truth.values():
        for s in segs:
            if s.phase != "exited":
                out[s.label.state] = out.get(s.label.state, 0.0) + s.end - max(s.start, run.go_t)
    return out


def _settled(run: Run, other: str, name: str, lag_s: float = 0.0) -> Check:
    """Watch's lines against ``other`` face, second by second, once both have settled (past
    the live margin after each truth change, and not in the second before the next, as the
    faces are scored): the same state, and cause when starved.  With ``lag_s``, a line
    that shows what ``other`` said up to that long before is the same story, told late."""
    same = total = 0
    for gpu in run.gpus:
        segs = run.truth.get(gpu, [])
        for t in instants(run, gpu):
            seg = truth_at(segs, t)
            if seg is None or t - seg.start < LIVE_MARGIN_S or seg.phase == "exited":
                continue
            if seg.end - t < GUARD_S and seg is not segs[-1]:
                continue
            w, o = face_at(run, "watch", gpu, t), face_at(run, other, gpu, t)
            if w is None or o is None:
                continue
            total += 1
            told = [o]
            back = 1.0
            while back <= lag_s:
                earlier = face_at(run, other, gpu, t - back)
                if earlier is not None:
                    told.append(earlier)
                back += 1.0
            same += int(
                any(
                    w.state == x.state
                    and (
                        w.state != "starved"
                        or _cause_fits(run, gpu, t, w.cause, x.cause)
                        or _cause_fits(run, gpu, t, x.cause, w.cause)
                    )
                    for x in told
                )
            )
    share = same / total if total else None
    return Check(
        name, share is not None and share >= 0.95, f"{same}/{total} settled seconds the same"
    )


def names_the_job(run: Run) -> Check | None:
    """Whether serve's job series name the run's job, as its placement lets them: a Slurm
    job by its id; a container by its id's first 12 digits; a plain run by its command,
    and by its top process's pid where nothing placed it (a unit or a container the lab
    itself runs in names it instead).  None for runs that did not record a placement."""
    placement, pid = run.meta.get("placement"), run.meta.get("job_pid")
    if placement is None:
        return None
    jobs = run.serve_jobs
    if placement == "slurm":
        ok = any(j.get("hpc_job") == "4242" for j in jobs)
    elif placement == "container":
        cid = str(run.meta.get("container_id") or "")[:12]
        ok = any(j.get("job_kind") == "container" and j.get("job_name") == cid for j in jobs)
    else:
        ok = any(
            j.get("command", "").endswith("job.py")
            and (j.get("job_kind") in ("unit", "container") or j.get("job_name") == str(pid))
            for j in jobs
        )
    return Check(f"serve's series name the job ({placement})", ok, f"serve's jobs: {jobs}")


def agreement(run: Run) -> list[Check]:
    """Whether watch's lines, its summary, serve and analyze tell the same story."""
    checks = [
        _settled(run, "serve", "watch lines = serve metrics"),
        # The lines lag each change by the seconds it takes to confirm it (the latency,
        # scored as such); the summary places changes where they happened.  Once settled,
        # the lines tell the story of the summary's own episodes (analyze of the same
        # recording, whose seconds are checked against the summary's below) -- and a change
        # the truth did not make (the cause turning to contention and back as other work
        # comes and goes) the lines show late by as much as any: the live margin.
        _settled(
            run,
            "analyze",
            "watch lines = the summary's episodes (settled seconds)",
            lag_s=LIVE_MARGIN_S,
        ),
    ]
    named = names_the_job(run)
    if named is not None:
        checks.append(named)
    summ, ana = run.summary, run.analysis
    if summ is None or ana is None:
        checks.append(
            Check(
                "summaries present", False, f"summary {summ is not None}, analyze {ana is not None}"
            )
        )
        return checks
    # Watch's lines against its own summary: start-up.  The summary places a confirmed
    # reading where it began, so one of another state may be backdated over the lines'
    # provisional seconds: the summary's start-up lies between the start-up the lines named
    # and that plus every provisional reading the verdict did not take over.
    named_s, most_s = lines_startup(run.watch_spans)
    summ_s = float(summ.get("startup_s") or 0.0)
    checks.append(
        Check(
            "watch lines = watch summary (start-up)",
            named_s - 2.0 <= summ_s <= most_s + 2.0,
            f"the lines said start-up for {named_s:.1f} s ({most_s:.1f} with the provisional "
            f"readings not taken over), the summary's startup_s is {summ_s:.1f}",
        )
    )
    # The summary against analyze of the same recording.
    checks.append(
        Check(
            "watch summary = analyze (verdict, cause)",
            (summ["verdict"], summ["cause"]) == (ana["verdict"], ana["cause"]),
            f"watch {summ['verdict']}/{summ['cause']}, analyze {ana['verdict']}/{ana['cause']}",
        )
    )
    dur = max(1.0, float(ana.get("duration_s") or 1.0))
    worst = max((abs(summ["seconds"].get(s, 0.0) - ana["seconds"].get(s, 0.0)), s) for s in STATES)
    checks.append(
        Check(
            "watch summary = analyze (seconds per state)",
            worst[0] <= max(2.0, 0.05 * dur),  # the same recording: the same story
            f"watch {_fmt_secs(summ['seconds'])} vs analyze {_fmt_secs(ana['seconds'])}",
        )
    )
    lw, la = float(summ["lost_gpu_seconds"]), float(ana["lost_gpu_seconds"])
    checks.append(
        Check(
            "watch summary = analyze (GPU-seconds lost)",
            abs(lw - la) <= max(2.0, 0.1 * max(lw, la)),
            f"{lw:.1f} vs {la:.1f}",
        )
    )
    per_gpu = sum(float(g.get("lost_gpu_seconds") or 0.0) for g in summ.get("gpus", []))
    checks.append(
        Check(
            "summary: per-GPU lost_gpu_seconds add up to the run's lost_gpu_seconds",
            abs(per_gpu - lw) <= max(2.0, 0.1 * lw),
            f"per GPU {per_gpu:.1f}, run {lw:.1f}",
        )
    )
    advice = list(summ.get("advice") or [])
    dups = [a for a, n in Counter(advice).items() if n > 1]
    checks.append(Check("summary advice without repeats", not dups, f"repeated: {dups}"))
    causes = {
        s.label.cause
        for segs in run.truth.values()
        for s in segs
        if s.valid and s.label.state == "starved"
    }
    missing = [c for c in sorted(causes, key=str) if c and not _advises(advice, c)]
    checks.append(
        Check(
            "summary advice for every cause the run was starved by",
            not missing,
            f"starved by {sorted(map(str, causes))}; no advice for {missing}; advice {advice}",
        )
    )
    return checks


def lines_startup(spans: list[tuple[float, float, str, str | None]]) -> tuple[float, float]:
    """The start-up watch's lines showed, as (the start-up phase they named, that plus each
    provisional reading ("judging") the verdict did not take over).  The summary counts the
    second, less what a confirmed reading of another state is backdated over (a confirmed
    reading of the same state is backdated over all of it).  A machine that slows the first
    judgment lengthens both alike."""
    named = extra = 0.0
    for i, (a, b, state, note) in enumerate(spans):
        if note == "start-up":
            named += b - a
        elif note is not None and note.startswith("judging"):
            after = next(
                (s for s in spans[i + 1 :] if not (s[3] or "").startswith("judging")), None
            )
            if after is None or after[2] != state:
                extra += b - a
    return named, named + extra


#: Words an advice line for a cause contains (advice.py's wording, loosely).
ADVICE_WORDS = {
    "cpu": ("num_workers", "CPU-saturated", "workers"),
    "contention": ("outside the job", "other processes", "contention", "share the host"),
    "gil": ("main process", "GIL", "num_workers=0", "worker processes"),
    "io": ("storage", "disk", "read", "I/O", "iowait"),
    "unknown": ("outside", "waits on", "profile", "neither"),
}


def _advises(advice: Iterable[str], cause: str) -> bool:
    words = ADVICE_WORDS.get(cause, ())
    return any(w.lower() in a.lower() for a in advice for w in words)


def _fmt_secs(d: dict[str, float]) -> str:
    return " ".join(f"{k} {v:.1f}" for k, v in d.items() if v)


# --------------------------------------------------------------------------- one run's score


@dataclass
class RunScore:
    """Everything scored about one run."""

    scenario: str
    seed: int
    faces: dict[str, FaceScore]
    checks: list[Check]
    invalid_phases: list[dict[str, Any]]
    errors: list[str]
    truth_seconds: dict[str, float]

    def failures(self) -> list[str]:
        """Each target the run missed, in one sentence."""
        out = [f"{self.scenario}: the run failed: {e}" for e in self.errors]
        for fs in self.faces.values():
            for st in STATES:
                if fs.support(st) < 3:
                    continue
                p, r = fs.precision(st), fs.recall(st)
                if r is not None and r < TARGET_PR:
                    out.append(
                        f"{fs.face}: recall of {st} {r:.2f} < {TARGET_PR} ({_confusions(fs, st)})"
                    )
            for st in STATES:
                p = fs.precision(st)
                if p is not None and fs.said(st) >= 3 and p < TARGET_PR:
                    out.append(f"{fs.face}: precision of {st} {p:.2f} < {TARGET_PR}")
            ca = fs.cause_accuracy
            if ca is not None and fs.cause_total >= 3 and ca < TARGET_CAUSE:
                pairs = ", ".join(
                    f"{t}->{f} {n}s" for (t, f), n in fs.cause_pairs.items() if t != f
                )
                out.append(f"{fs.face}: cause accuracy {ca:.2f} < {TARGET_CAUSE} ({pairs})")
            if fs.max_cause_changes_per_phase > TARGET_CAUSE_CHANGES:
                out.append(
                    f"{fs.face}: {fs.max_cause_changes_per_phase} cause changes in one steady phase"
                )
            for lat in fs.latencies:
                if lat["first"] and lat["truth"]["state"] == "healthy":
                    v = lat["latency_s"]
                    if fs.face in LIVE_FACES and (v is None or v > TARGET_STARTUP_S):
                        out.append(
                            f"{fs.face}: busy from its first sample, shown healthy after "
                            f"{'never' if v is None else f'{v:.1f} s'} "
                            f"(target {TARGET_STARTUP_S:.0f} s)"
                        )
        out += [f"faces disagree: {c.name}: {c.detail}" for c in self.checks if not c.ok]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "seed": self.seed,
            "faces": {f: face_json(fs) for f, fs in self.faces.items()},
            "checks": [asdict(c) for c in self.checks],
            "invalid_phases": self.invalid_phases,
            "errors": self.errors,
            "failures": self.failures(),
        }


def _confusions(fs: FaceScore, st: str) -> str:
    said = {f: n for (tr, f), n in fs.pairs.items() if tr == st and f != st}
    return "said " + ", ".join(f"{f} {n}s" for f, n in said.items()) if said else ""


def face_json(fs: FaceScore) -> dict[str, Any]:
    per_state = {}
    for st in STATES:
        if fs.support(st) or any(f == st for (_, f) in fs.pairs):
            per_state[st] = {
                "precision": _r(fs.precision(st)),
                "recall": _r(fs.recall(st)),
                "support_s": fs.support(st),
            }
    spm, cpm = fs.changes_per_min()
    return {
        "states": per_state,
        "cause_accuracy": _r(fs.cause_accuracy),
        "cause_seconds": fs.cause_total,
        "reason_accuracy": _r(fs.reason_accuracy),
        "missing_s": fs.missing,
        "state_changes_per_min": _r(spm),
        "cause_changes_per_min": _r(cpm),
        "max_cause_changes_per_phase": fs.max_cause_changes_per_phase,
        "latencies": fs.latencies,
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def score_run(run_dir: Path, phases: Iterable[str] | None = None) -> RunScore:
    """Score a finished run: every phase (with the faces-agree checks), or the named ones
    (without them: they are about the whole run)."""
    run = read_run(run_dir)
    scn = run.meta["scenario"]
    only = None if phases is None else set(phases)
    return RunScore(
        scenario=scn["name"],
        seed=int(scn["seed"]),
        faces={f: score_face(run, f, only) for f in FACES},
        checks=agreement(run) if only is None else [],
        invalid_phases=[
            {
                "phase": r["phase"],
                "gpu": r["gpu"],
                "design": r["design"],
                "label": r["label"],
                "measured": r["measured"],
            }
            for r in run.invalid_phases
            if only is None or r["phase"] in only
        ],
        errors=list(run.meta.get("errors", [])),
        truth_seconds=_truth_seconds(run),
    )


def timeline(run_dir: Path, gpu: int = 0) -> list[str]:
    """One line per second: truth and each face (for a person reading why a run failed)."""
    run = read_run(run_dir)
    out = []
    for t in instants(run, gpu):
        seg = truth_at(run.truth[gpu], t)
        cells = [f"{t - run.go_t:6.1f}", _cell(seg.label if seg else None)]
        for face in FACES:
            o = face_at(run, face, gpu, t)
            cells.append("-" if o is None else _cell(Label(o.state, o.cause, o.reason)))
        out.append("  ".join(f"{c:28}" for c in cells))
    return out


def _cell(lab: Label | None) -> str:
    if lab is None:
        return "-"
    s = lab.state + (f"/{lab.cause}" if lab.cause else "")
    return s + (f" ({lab.reason})" if lab.reason else "")
