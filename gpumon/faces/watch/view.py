"""What `gpumon watch` shows: the view's state, its pieces, and the plain line.

``WatchState`` is what the live view needs beyond the run's memory (which the session
keeps: recent driver samples per GPU, their latest readings): the latest snapshot and
verdict, the status line, the command's output tail, the plain lines of recent ticks.
The tick loop folds a tick in under its ``lock``; the full screen (``LiveView``, laid out
by ``layout.compose``) reads under it, so it never sees half a tick.  The plain line
carries no escape codes at all (Slurm output files, CI logs).
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rich.text import Text

from gpumon.engine import GpuMemory, RunMemory
from gpumon.model import GpuIdentity, GpuSample, Point, Snapshot, State, Verdict

BLOCKS = "▁▂▃▄▅▆▇█"
HISTORY_LINES = 200
HOLE = "·"  # no driver sample for a sample period (buffer ran dry or a missed read)
STATE_STYLE: dict[State, str] = {
    State.HEALTHY: "bold green",
    State.STARVED: "bold red",
    State.SYNC_STALL: "bold magenta",
    State.IDLE: "bold yellow",
    State.UNKNOWN: "bold white",
}


# --- what the view shows ------------------------------------------------------------------


@dataclass
class WatchState:
    """Shared between the tick loop (writer) and the live view's refresh thread (reader)."""

    pid: int | None
    command: tuple[str, ...] | None
    identities: tuple[GpuIdentity, ...] = ()
    started_mono_s: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    memory: RunMemory | None = None  # the session's memory of the run (None: not yet)
    snapshot: Snapshot | None = None
    verdict: Verdict | None = None
    invisible_gpu_pids: tuple[int, ...] = ()
    gpu_pids: frozenset[int] = frozenset()
    status: str | None = None
    output: deque[str] | None = None  # the command's last lines, in `watch -- CMD` mode
    # The plain lines of recent ticks: what a terminal too narrow for the view shows.
    history: deque[str] = field(default_factory=lambda: deque(maxlen=HISTORY_LINES))
    paused_at_s: float | None = None  # a frozen copy (the view paused): its elapsed time
    _frozen_gpus: dict[str, GpuMemory] | None = None

    def feed(
        self, snapshot: Snapshot, verdict: Verdict | None, invisible_gpu_pids: Iterable[int] = ()
    ) -> None:
        """A folded tick (the caller holds ``lock``): what the view shows of it."""
        self.snapshot = snapshot
        self.verdict = verdict
        self.invisible_gpu_pids = tuple(sorted(invisible_gpu_pids))
        self.gpu_pids = frozenset(p.pid for g in snapshot.gpus for p in g.processes or ())
        self.history.append(plain_line(self))

    @property
    def gpus(self) -> dict[str, GpuMemory]:
        """The GPUs of the run seen so far, by UUID (the memory's, or a paused copy)."""
        if self._frozen_gpus is not None:
            return self._frozen_gpus
        if self.memory is None:
            return {}
        return {m.identity.uuid: m for m in self.memory.gpus.values() if m.latest is not None}

    @property
    def waiting(self) -> bool:
        return not self.gpus

    @property
    def elapsed_s(self) -> float:
        if self.paused_at_s is not None:
            return self.paused_at_s
        return time.monotonic() - self.started_mono_s

    def freeze(self) -> WatchState:
        """A copy that later ticks leave alone: what a paused view goes on showing."""
        with self.lock:
            frozen = copy.copy(self)
            frozen.lock = threading.Lock()
            frozen._frozen_gpus = {
                u: GpuMemory(m.identity, m.latest, deque(m.points), m.from_ticks)
                for u, m in self.gpus.items()
            }
            frozen.history = deque(self.history, maxlen=self.history.maxlen)
            frozen.output = None if self.output is None else deque(self.output)
            frozen.paused_at_s = self.elapsed_s
        return frozen


def timeline(points: Sequence[Point], width: int) -> tuple[Text, float]:
    """One character per driver sample, newest at the right; returns (text, span seconds).

    A hole longer than 1.5 sample periods (the buffer ran dry) is drawn as dots, one per
    missing period, so silence is never drawn as a zero.  Only the samples that fit are
    looked at (the view redraws four times a second, the buffer holds minutes).
    """
    recent = points[-(width + 1) :]
    diffs = sorted(b[0] - a[0] for a, b in itertools.pairwise(recent) if b[0] > a[0])
    period = diffs[len(diffs) // 2] if diffs else 0.0
    cells: list[tuple[str, str]] = []  # newest first
    oldest = None
    next_t: float | None = None
    for t, u in reversed(recent):
        if next_t is not None and period > 0 and next_t - t > 1.5 * period:
            missing = min(width, round((next_t - t) / period) - 1)
            cells.extend([(HOLE, "dim")] * missing)
        if len(cells) >= width:
            break
        cells.append(_block(u))
        oldest, next_t = t, t
    cells = cells[:width][::-1]
    span = 0.0
    if oldest is not None and len(points) > 1:
        span = points[-1][0] - oldest
        if period > 0:
            span = min(span, len(cells) * period)
    text = Text(" " * (width - len(cells)))
    # One span per run of a colour, not per character.
    for style, run in itertools.groupby(cells, key=lambda c: c[1]):
        text.append("".join(ch for ch, _ in run), style=style)
    return text, span


def _block(util_pct: float) -> tuple[str, str]:
    u = max(0.0, min(100.0, util_pct))
    ch = BLOCKS[min(len(BLOCKS) - 1, int(u / 100.0 * len(BLOCKS)))]
    style = "green" if u >= 50 else ("yellow" if u >= 20 else "red")
    return ch, style


def bar(value: float | None, total: float | None, width: int = 20) -> Text:
    if value is None or not total:
        return Text("░" * width, style="dim")
    frac = max(0.0, min(1.0, value / total))
    full = round(frac * width)
    text = Text("█" * full, style="cyan")
    text.append("░" * (width - full), style="dim")
    return text


# --- the plain line -----------------------------------------------------------------------


def tick_duty(g: GpuSample) -> float | None:
    """This interval's duty cycle (0-1): the mean of its driver samples, else utilization.gpu."""
    if g.util_samples:
        return sum(u for _, u in g.util_samples) / len(g.util_samples) / 100.0
    return None if g.util_pct is None else g.util_pct / 100.0


def plain_line(st: WatchState, now_wall: float | None = None) -> str:
    """One line per interval, no escape codes: time, per-GPU duty cycle, state, cause."""
    now_wall = time.time() if now_wall is None else now_wall
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now_wall))
    elapsed = time.monotonic() - st.started_mono_s
    parts = [stamp, f"+{elapsed:.1f}s"]
    snap = st.snapshot
    if st.waiting:
        if st.invisible_gpu_pids:
            parts.append(
                "no GPU of this run visible: NVML lists pids not present here "
                "(running in a container without the host PID namespace?)"
            )
        else:
            parts.append("waiting for the run to use a GPU")
    elif snap is not None:
        for g in sorted(snap.gpus, key=lambda x: x.gpu):
            duty = tick_duty(g)
            parts.append(
                f"gpu{g.gpu}=lost"
                if g.lost
                else f"gpu{g.gpu}={'n/a' if duty is None else f'{100 * duty:.0f}%'}"
            )
    v = st.verdict
    parts.append(f"state={'unknown' if v is None else v.state.value}")
    parts.append(f"cause={'-' if v is None or v.cause is None else v.cause.value}")
    if v is not None and v.note:
        parts.append(f"({v.note})")
    if v is not None and len(v.gpus) > 1:
        parts.append(" ".join(f"gpu{g.gpu}:{g.state.value}" for g in v.gpus))
    if snap is not None and snap.tree is not None:
        parts.append(f"procs={len(snap.tree.processes)}")
    return " ".join(parts)
