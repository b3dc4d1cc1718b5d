"""The end-of-run summary of `gpumon watch`: text for people, JSON for CI, and --fail-on.

The verdict, its cause, the time per state, the GPUs' duty cycles and the advice are the
detector's run summary (gpumon.detect.summary), the same that `gpumon analyze` reports;
this module adds only what the face itself knows (pid, command, wall time, how the watch
ended, GPU names) and renders it.  No classification happens here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpumon.engine import GpuRun, RunSummary
from gpumon.engine.summary_json import gpu_core, run_core
from gpumon.engine.words import duration, short_command, speedup_sentence, stacks_json, stacks_line
from gpumon.faces.wrap import pack, terminal_width, wrap
from gpumon.files import replace_whole
from gpumon.model import Advice, Cause, State

# Exit status when --fail-on trips (and the watched command itself succeeded).  Distinct
# from gpumon's error statuses (1-4), from 130 (interrupted) and from argparse's 2.
EXIT_FAIL_ON = 5

STATES: tuple[State, ...] = tuple(State)
# Where every field's text starts: under the first after its label.
_INDENT = " " * 19


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


@dataclass(frozen=True, slots=True)
class GpuLine:
    """One GPU of the run as the summary shows it (duty cycle: the detector's)."""

    gpu: int
    uuid: str
    name: str | None
    duty_cycle: float | None
    off_bus_s: float = 0.0  # time it was off the bus (its state unknown)
    # GPU-seconds it waited (idle or busy-waiting) while the run held it: the GPUs' add
    # up to the run's lost GPU-seconds.
    lost_gpu_seconds: float = 0.0


@dataclass
class Summary:
    """Everything the end of a watch says, in one JSON-friendly shape."""

    pid: int | None
    command: tuple[str, ...] | None
    wall_s: float
    run: RunSummary  # the detector's: verdict, cause, seconds, advice, notes
    gpus: list[GpuLine]
    used_gpu: bool
    exit_status: int | None = None  # the command's, in `watch -- CMD` mode
    ended: str = "exited"  # "exited", "stopped" (q / Ctrl-C in --pid mode)
    notes: list[str] = field(default_factory=list)  # the face's own (no GPU used, ...)
    invisible_gpu_pids: tuple[int, ...] = ()
    fail_on: tuple[State, ...] = ()
    fail_threshold: float | None = None
    # What the job's processes did during the gaps (--stacks): the memory's run totals.
    stacks: Any = None

    @property
    def verdict(self) -> State:
        return self.run.verdict

    @property
    def cause(self) -> Cause | None:
        return self.run.cause

    @property
    def seconds(self) -> dict[State, float]:
        return self.run.seconds

    @property
    def advice(self) -> tuple[Advice, ...]:
        return self.run.advice

    @property
    def startup_s(self) -> float:
        return self.run.startup_s

    @property
    def lost_gpu_seconds(self) -> float:
        return self.run.lost_gpu_seconds

    @property
    def all_notes(self) -> list[str]:
        return [*self.run.notes, *self.notes]

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
        """The JSON of --summary-json: the run summary's core (``gpumon.engine.summary_json``,
        the same as analyze's) and what the watch itself knows."""
        runs = {g.gpu: g for g in self.run.gpus}
        core = run_core(self.run, {})
        gpus = []
        for g in self.gpus:
            run = runs.get(g.gpu)
            if run is None:  # a GPU the summary has no word on: what the watch saw of it
                run = GpuRun(
                    gpu=g.gpu, uuid=g.uuid, verdict=State.UNKNOWN, cause=None,
                    duty_cycle=g.duty_cycle, samples=0, seconds={},
                    off_bus_s=g.off_bus_s, lost_gpu_seconds=g.lost_gpu_seconds,
                )  # fmt: skip
            gpus.append({**gpu_core(g.gpu, g.uuid, run), "name": g.name})
        return {
            **core,
            "pid": self.pid,
            "command": None if self.command is None else list(self.command),
            "wall_s": round(self.wall_s, 3),
            "gpus": gpus,
            "straggler": self.run.straggler,
            "used_gpu": self.used_gpu,
            "ended": self.ended,
            "exit_status": self.exit_status,
            "notes": self.all_notes,
            "invisible_gpu_pids": list(self.invisible_gpu_pids),
            "fail_on": {
                "states": [s.value for s in self.fail_on],
                "threshold": self.fail_threshold,
                "share": round(self.share(self.fail_on), 4),
                "failed": self.failed,
            }
            if self.fail_on
            else None,
            "stacks": None if self.stacks is None else stacks_json(self.stacks),
        }

    def write_json(self, path: str) -> None:
        """Write whole, so a CI step never reads half a file; only over a regular file
        (``gpumon.files.replace_whole``)."""
        data = (json.dumps(self.to_json(), indent=2) + "\n").encode()
        replace_whole(path, data)

    def text(self, width: int | None = None) -> str:
        """The summary as plain lines of at most ``width`` columns (the terminal's by
        default), printed after the live view or the plain lines."""
        width = terminal_width() if width is None else width
        who = "the run" if self.pid is None else f"pid {self.pid}"
        if self.command:
            who += f" ({short_command(self.command)})"
        if self.ended == "stopped":
            ended = "watching stopped; the process is still running"
        elif self.exit_status is not None:
            ended = f"the command exited with status {self.exit_status}"
        else:
            ended = "the process exited"

        def field(label: str, text: str) -> list[str]:
            return wrap(text, width, f"  {label:<17}", _INDENT)

        lines = [
            *wrap(who, width, "gpumon watch summary: ", "    "),
            *field("ended", ended),
            *field("wall time", duration(self.wall_s)),
        ]
        total = self.tracked_s
        parts = []
        for s in STATES:
            secs = self.seconds.get(s, 0.0)
            if secs <= 0:
                continue  # the JSON has every state; people read the ones that happened
            extra = f"{100 * secs / total:.0f}%"
            if s is State.IDLE and self.startup_s > 0:
                extra += f", {duration(self.startup_s)} of it start-up"
            parts.append(f"{s.value} {duration(secs)} ({extra})")
        lines += pack(parts or ["none classified"], width, f"  {'time in state':<17}", _INDENT)
        if not self.used_gpu:
            lines += field("GPUs", "none: no process of the run appeared in any GPU's process list")
        for g in self.gpus:
            duty = "n/a" if g.duty_cycle is None else f"{100 * g.duty_cycle:.0f}%"
            name = f"{g.name}, " if g.name else ""
            lost = f", {g.lost_gpu_seconds:.1f} GPU-s lost" if g.lost_gpu_seconds >= 0.05 else ""
            lines += field(f"GPU {g.gpu}", f"{name}mean utilisation {duty}{lost} ({g.uuid})")
            if g.off_bus_s > 0:
                lines += field("", f"fell off the bus: unknown for {duration(g.off_bus_s)}")
        if self.used_gpu:
            lines.append(f"  GPU-seconds lost waiting  {self.lost_gpu_seconds:.1f}")
        verdict = self.verdict.value
        if self.cause is not None:
            verdict += f" (cause: {self.cause.value})"
        if self.run.straggler is not None and self.verdict is State.SYNC_STALL:
            verdict += f", straggler GPU {self.run.straggler}"
        gain = speedup_sentence(self.run)
        lines += field("verdict", verdict)
        if self.stacks is not None and stacks_line(self.stacks):
            lines += field("stacks", "during the gaps, " + stacks_line(self.stacks))
        if gain:
            lines += field("worth", gain)
        for i, a in enumerate(self.advice):
            lines += wrap(
                a.text, width, ("  advice           " if i == 0 else _INDENT) + "- ", _INDENT + "  "
            )
        if self.fail_on:
            states = ",".join(s.value for s in self.fail_on)
            mark = "FAILED" if self.failed else "ok"
            lines += wrap(
                f"{100 * self.share(self.fail_on):.0f}% of the run "
                f"(threshold {100 * (self.fail_threshold or 0):.0f}%) -> {mark}",
                width,
                f"  --fail-on {states}: ",
                _INDENT,
            )
        for n in self.all_notes:
            lines += field("note", n)
        return "\n".join(lines)
