"""The end-of-run summary of `gpumon watch`: text for people, JSON for CI, and --fail-on.

Everything here is arithmetic on what the detector already decided (seconds per state,
episodes with causes and advice) plus the face's own bookkeeping (wall time, which GPUs
the run used, their mean utilisation).  No classification happens here.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpumon.model import Cause, Episode, Point, State, Verdict

# Exit status when --fail-on trips (and the watched command itself succeeded).  Distinct
# from gpumon's error statuses (1-4), from 130 (interrupted) and from argparse's 2.
EXIT_FAIL_ON = 5

STATES: tuple[State, ...] = tuple(State)


def parse_states(text: str) -> tuple[State, ...]:
    """``"starved,sync_stall"`` -> states; raises ValueError naming a bad one."""
    out: list[State] = []
    for part in text.split(","):
        name = part.strip().lower()
        if not name:
            continue
        try:
            out.append(State(name))
        except ValueError:
            valid = ", ".join(s.value for s in STATES)
            raise ValueError(f"unknown state {name!r} (valid: {valid})") from None
    if not out:
        raise ValueError("no state given")
    return tuple(dict.fromkeys(out))


@dataclass
class GpuUse:
    """What the face saw of one GPU of the run: enough for its mean duty cycle."""

    gpu: int
    uuid: str
    name: str | None = None
    util_sum: float = 0.0
    util_n: int = 0

    def add(self, points: Iterable[Point], tick_util_pct: float | None) -> None:
        """Driver samples where there are any; the tick's utilization.gpu otherwise."""
        pts = list(points)
        if pts:
            self.util_sum += sum(u for _, u in pts)
            self.util_n += len(pts)
        elif tick_util_pct is not None:
            self.util_sum += tick_util_pct
            self.util_n += 1

    @property
    def duty_cycle(self) -> float | None:
        return None if self.util_n == 0 else round(self.util_sum / self.util_n / 100.0, 4)


# Closed episodes kept as they were (the rest of a long run lives on as running totals).
RECENT_EPISODES = 1_000


class EpisodeTally:
    """Running totals over closed episodes, in the order they came: flat memory however
    long the run, and the same answers as scanning every episode."""

    def __init__(self, episodes: Iterable[Episode] = ()) -> None:
        # (state, cause) -> seconds; insertion order is first-seen order (ties go to it).
        self.seconds: dict[tuple[State, Cause], float] = {}
        # (state, cause) -> (duration, arrival, advice) of the longest episode with advice.
        self.best_advice: dict[tuple[State, Cause | None], tuple[float, int, tuple[str, ...]]] = {}
        self.startup_s = 0.0  # run-level idle episodes noted "start-up"
        self.n = 0
        for ep in episodes:
            self.add(ep)

    def add(self, ep: Episode) -> None:
        self.n += 1
        dur = ep.duration_s
        if ep.cause is not None and dur is not None:
            key = (ep.state, ep.cause)
            self.seconds[key] = self.seconds.get(key, 0.0) + dur
        if ep.advice:
            akey = (ep.state, ep.cause)
            d = dur or 0.0
            best = self.best_advice.get(akey)
            if best is None or d > best[0]:
                self.best_advice[akey] = (d, self.n, ep.advice)
        if ep.gpu is None and ep.state is State.IDLE and ep.note == "start-up":
            self.startup_s += dur or 0.0

    def dominant_cause(self, state: State) -> Cause | None:
        by_cause = {c: v for (s, c), v in self.seconds.items() if s is state}
        if not by_cause:
            return None
        return max(by_cause, key=lambda c: by_cause[c])

    def advice(self, state: State, cause: Cause | None) -> tuple[str, ...] | None:
        """The longest matching episode's advice (the earliest of equals); None if none."""
        found = [
            v
            for (s, c), v in self.best_advice.items()
            if s is state and (cause is None or c == cause)
        ]
        if not found:
            return None
        return max(found, key=lambda v: (v[0], -v[1]))[2]


@dataclass
class EpisodeLog:
    """Closed episodes as the detector hands them out, for the dominant cause and advice.

    Only running totals and the most recent episodes are kept, so a week-long watch
    uses as much memory as a minute-long one.
    """

    run: EpisodeTally = field(default_factory=EpisodeTally)  # the run's own (gpu None)
    per_gpu: EpisodeTally = field(default_factory=EpisodeTally)
    recent_run: deque[Episode] = field(default_factory=lambda: deque(maxlen=RECENT_EPISODES))
    recent_gpu: deque[Episode] = field(default_factory=lambda: deque(maxlen=RECENT_EPISODES))

    def add(self, episodes: Iterable[Episode] | None) -> None:
        for ep in episodes or ():
            if ep.end_s is None:
                continue
            if ep.gpu is None:
                self.run.add(ep)
                self.recent_run.append(ep)
            else:
                self.per_gpu.add(ep)
                self.recent_gpu.append(ep)

    def run_level(self) -> list[Episode]:
        """The run's own recent episodes (gpu None); per-GPU ones when the detector has none."""
        return list(self.recent_run if self.run.n else self.recent_gpu)

    def tally(self) -> EpisodeTally:
        """Totals over the run's own episodes; over per-GPU ones when the detector has none."""
        return self.run if self.run.n else self.per_gpu


@dataclass
class Summary:
    """Everything the end of a watch says, in one JSON-friendly shape."""

    pid: int | None
    command: tuple[str, ...] | None
    wall_s: float
    verdict: State
    cause: Cause | None
    seconds: dict[State, float]
    gpus: list[GpuUse]
    lost_gpu_seconds: float | None
    advice: tuple[str, ...]
    used_gpu: bool
    exit_status: int | None = None  # the command's, in `watch -- CMD` mode
    ended: str = "exited"  # "exited", "stopped" (q / Ctrl-C in --pid mode)
    notes: list[str] = field(default_factory=list)
    invisible_gpu_pids: tuple[int, ...] = ()
    fail_on: tuple[State, ...] = ()
    fail_threshold: float | None = None
    startup_s: float = 0.0  # of the idle seconds, those before the first sustained work

    @property
    def tracked_s(self) -> float:
        return sum(self.seconds.values())

    def share(self, states: Iterable[State]) -> float:
        """Share of the detector-tracked time spent in ``states`` (0 when nothing tracked)."""
        total = self.tracked_s
        return 0.0 if total <= 0 else sum(self.seconds.get(s, 0.0) for s in states) / total

    @property
    def failed(self) -> bool:
        """--fail-on: more than the threshold share of the run in the named states."""
        if not self.fail_on or self.fail_threshold is None:
            return False
        return self.share(self.fail_on) > self.fail_threshold

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "command": None if self.command is None else list(self.command),
            "wall_s": round(self.wall_s, 3),
            "verdict": self.verdict.value,
            "cause": None if self.cause is None else self.cause.value,
            "seconds": {s.value: round(self.seconds.get(s, 0.0), 3) for s in STATES},
            "gpus": [
                {"gpu": g.gpu, "uuid": g.uuid, "name": g.name, "duty_cycle": g.duty_cycle}
                for g in self.gpus
            ],
            "startup_s": round(self.startup_s, 3),
            "lost_gpu_seconds": None
            if self.lost_gpu_seconds is None
            else round(self.lost_gpu_seconds, 3),
            "advice": list(self.advice),
            "used_gpu": self.used_gpu,
            "ended": self.ended,
            "exit_status": self.exit_status,
            "notes": list(self.notes),
            "invisible_gpu_pids": list(self.invisible_gpu_pids),
            "fail_on": {
                "states": [s.value for s in self.fail_on],
                "threshold": self.fail_threshold,
                "share": round(self.share(self.fail_on), 4),
                "failed": self.failed,
            }
            if self.fail_on
            else None,
        }

    def write_json(self, path: str) -> None:
        """Write atomically, so a CI step never reads half a file."""
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.to_json(), fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)

    def text(self) -> str:
        """The summary as plain lines (printed after the live view or the plain lines)."""
        who = "the run" if self.pid is None else f"pid {self.pid}"
        if self.command:
            who += f" ({short_command(self.command)})"
        if self.ended == "stopped":
            ended = "watching stopped; the process is still running"
        elif self.exit_status is not None:
            ended = f"the command exited with status {self.exit_status}"
        else:
            ended = "the process exited"
        lines = [
            f"gpumon watch summary: {who}",
            f"  ended            {ended}",
            f"  wall time        {fmt_duration(self.wall_s)}",
        ]
        total = self.tracked_s
        parts = []
        for s in STATES:
            secs = self.seconds.get(s, 0.0)
            if secs <= 0:
                continue  # the JSON has every state; people read the ones that happened
            extra = f"{100 * secs / total:.0f}%"
            if s is State.IDLE and self.startup_s > 0:
                extra += f", {fmt_duration(self.startup_s)} of it start-up"
            parts.append(f"{s.value} {fmt_duration(secs)} ({extra})")
        lines.append("  time in state    " + ("  ".join(parts) or "none classified"))
        if not self.used_gpu:
            lines.append(
                "  GPUs             none: no process of the run appeared in any GPU's process list"
            )
        for g in self.gpus:
            duty = "n/a" if g.duty_cycle is None else f"{100 * g.duty_cycle:.0f}%"
            name = f"{g.name}, " if g.name else ""
            lines.append(f"  GPU {g.gpu:<13d}{name}mean utilisation {duty} ({g.uuid})")
        if self.lost_gpu_seconds is not None and self.used_gpu:
            lines.append(f"  GPU-seconds lost waiting  {self.lost_gpu_seconds:.1f}")
        verdict = self.verdict.value
        if self.cause is not None:
            verdict += f" (cause: {self.cause.value})"
        lines.append(f"  verdict          {verdict}")
        for i, a in enumerate(self.advice):
            lines += textwrap.wrap(
                a,
                width=100,
                initial_indent=("  advice           " if i == 0 else " " * 19) + "- ",
                subsequent_indent=" " * 21,
            )
        if self.fail_on:
            states = ",".join(s.value for s in self.fail_on)
            mark = "FAILED" if self.failed else "ok"
            lines.append(
                f"  --fail-on {states}: {100 * self.share(self.fail_on):.0f}% of the run "
                f"(threshold {100 * (self.fail_threshold or 0):.0f}%) -> {mark}"
            )
        lines += [f"  note             {n}" for n in self.notes]
        return "\n".join(lines)


def dominant(seconds: Mapping[State, float]) -> State:
    """The state the run spent most time in; ``unknown`` only when nothing else was seen."""
    known = {s: v for s, v in seconds.items() if s is not State.UNKNOWN and v > 0}
    if not known:
        return State.UNKNOWN
    return max(known, key=lambda s: known[s])


def dominant_cause(episodes: Iterable[Episode] | EpisodeTally, state: State) -> Cause | None:
    """The cause holding the most time among the episodes in ``state``."""
    tally = episodes if isinstance(episodes, EpisodeTally) else EpisodeTally(episodes)
    return tally.dominant_cause(state)


def advice_for_run(
    episodes: Iterable[Episode] | EpisodeTally,
    state: State,
    cause: Cause | None,
    last: Verdict | None,
) -> tuple[str, ...]:
    """The detector's advice from the longest episode matching the verdict.

    Falls back to the last live verdict when it matches (the run ended inside its only
    episode), and to nothing: gpumon never invents advice of its own.
    """
    tally = episodes if isinstance(episodes, EpisodeTally) else EpisodeTally(episodes)
    best = tally.advice(state, cause)
    if best is not None:
        return best
    if last is not None:
        if last.state is state and last.advice:
            return last.advice
        for g in last.gpus:
            if g.state is state and g.advice:
                return g.advice
    return ()


def fmt_duration(seconds: float) -> str:
    """``75.2`` -> ``1m 15s``; short runs keep a decimal."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def short_command(command: tuple[str, ...], limit: int = 60) -> str:
    """``/usr/bin/python3 /a/b/train.py --lr 3e-4`` -> ``python3 train.py --lr 3e-4``."""
    text = " ".join(os.path.basename(a) if i < 2 and "/" in a else a for i, a in enumerate(command))
    return text if len(text) <= limit else text[: limit - 1] + "…"
