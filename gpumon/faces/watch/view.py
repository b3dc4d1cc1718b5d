"""What `gpumon watch` shows: the face's memory of the run, its pieces, and the plain line.

``WatchState`` is the face's memory of the run (recent driver samples per GPU, the latest
snapshot and verdict); it is fed by the tick loop and read by the renderers.  The full
screen (``LiveView``, laid out by ``layout.compose``) is rebuilt on every refresh, so the
elapsed clock moves between ticks; the plain line carries no escape codes at all (Slurm
output files, CI logs).
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
# Evidence keys shown first, with their labels and formats; the rest follow as they come.
_EVIDENCE: tuple[tuple[str, str, str], ...] = (
    ("duty_cycle", "duty cycle", "pct1"),
    ("burst_p50_s", "burst p50", "s"),
    ("gap_p50_s", "gap p50", "s"),
    ("gap_p90_s", "gap p90", "s"),
    ("period_s", "period", "s"),
    ("workers_cpu_pct", "workers CPU", "pct"),
    ("workers", "workers", "int"),
    ("main_cpu_pct", "main CPU", "pct"),
    ("host_cpu_pct", "host CPU", "pct"),
    ("iowait_pct", "iowait", "pct"),
    ("read_bytes_per_s", "read", "Bps"),
    ("power_watts", "power", "W"),
    ("power_share_of_peak", "power/peak", "pct1"),
    ("sm_active_ratio", "SM active", "pct1"),
    ("tensor_active_ratio", "tensor active", "pct1"),
    ("sm_occupancy_ratio", "SM occupancy", "pct1"),
    ("skew_s", "skew", "s"),
    ("effective_gpus", "effective GPUs", "f2"),
    ("mem_headroom_ratio", "mem headroom", "pct1"),
    ("max_core_pct", "busiest core", "pct"),
    ("lost_gpu_seconds", "lost GPU-s", "f1"),
)
_SKIP_EVIDENCE = {
    "samples",
    "sample_period_s",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_limit_watts",
    "power_peak_watts",
    "burst_p90_s",
    "cpu_count",
    "window_s",
    "gpus",
    "processes",
    "larger_batch_fits",
    "duration_s",
}


# --- the face's memory of the run ---------------------------------------------------------


@dataclass
class GpuTrace:
    """The last minute or so of one GPU: driver samples (or per-tick readings)."""

    identity: GpuIdentity
    points: deque[Point] = field(default_factory=lambda: deque(maxlen=720))
    from_ticks: bool = False  # True when the driver buffer gave nothing and ticks are shown
    latest: GpuSample | None = None

    def add(self, g: GpuSample) -> None:
        self.latest = g
        if g.util_samples:
            if self.from_ticks:  # the driver buffer came back: drop the coarse readings
                self.points.clear()
                self.from_ticks = False
            self.points.extend(g.util_samples)
        elif g.util_pct is not None and (self.from_ticks or not self.points):
            self.from_ticks = True
            self.points.append((g.t_s, g.util_pct))


@dataclass
class WatchState:
    """Shared between the tick loop (writer) and the live view's refresh thread (reader)."""

    pid: int | None
    command: tuple[str, ...] | None
    identities: tuple[GpuIdentity, ...] = ()
    started_mono_s: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    gpus: dict[str, GpuTrace] = field(default_factory=dict)
    snapshot: Snapshot | None = None
    verdict: Verdict | None = None
    invisible_gpu_pids: tuple[int, ...] = ()
    gpu_pids: frozenset[int] = frozenset()
    status: str | None = None
    output: deque[str] | None = None  # the command's last lines, in `watch -- CMD` mode
    # The plain lines of recent ticks: what a terminal too narrow for the view shows.
    history: deque[str] = field(default_factory=lambda: deque(maxlen=HISTORY_LINES))
    paused_at_s: float | None = None  # a frozen copy (the view paused): its elapsed time

    def feed(
        self, snapshot: Snapshot, verdict: Verdict | None, invisible_gpu_pids: Iterable[int] = ()
    ) -> None:
        with self.lock:
            self.snapshot = snapshot
            self.verdict = verdict
            self.invisible_gpu_pids = tuple(sorted(invisible_gpu_pids))
            pids: set[int] = set()
            for g in snapshot.gpus:
                trace = self.gpus.get(g.uuid)
                if trace is None:
                    ident = next(
                        (i for i in self.identities if i.uuid == g.uuid),
                        GpuIdentity(index=g.gpu, uuid=g.uuid),
                    )
                    trace = self.gpus[g.uuid] = GpuTrace(ident)
                trace.add(g)
                pids.update(p.pid for p in g.processes or ())
            self.gpu_pids = frozenset(pids)
            self.history.append(plain_line(self))

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
            frozen.gpus = {
                u: GpuTrace(
                    t.identity, deque(t.points, maxlen=t.points.maxlen), t.from_ticks, t.latest
                )
                for u, t in self.gpus.items()
            }
            frozen.history = deque(self.history, maxlen=self.history.maxlen)
            frozen.output = None if self.output is None else deque(self.output)  # type: ignore[assignment]
            frozen.paused_at_s = self.elapsed_s
        return frozen


# --- small formatting helpers ----------------------------------------------------------


def fmt_bytes(n: float | None, suffix: str = "") -> str:
    if n is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}{suffix}" if unit == "B" else f"{n:.1f} {unit}{suffix}"
        n /= 1024
    return f"{n:.1f} TiB{suffix}"  # pragma: no cover


def fmt_evidence(value: object, kind: str) -> str:
    if not isinstance(value, int | float):
        return str(value)
    if kind == "pct1":
        return f"{100 * value:.0f}%"
    if kind == "pct":
        return f"{value:.0f}%"
    if kind == "s":
        return f"{value:.2f}s"
    if kind == "W":
        return f"{value:.0f} W"
    if kind == "Bps":
        return fmt_bytes(value, "/s")
    if kind == "int":
        return f"{value:.0f}"
    if kind == "f2":
        return f"{value:.2f}"
    if kind == "f1":
        return f"{value:.1f}"
    return f"{value:.3g}"


def evidence_items(evidence: dict[str, object]) -> list[tuple[str, str]]:
    """(label, value) pairs in a stable, most-telling-first order."""
    out = [
        (label, fmt_evidence(evidence[key], kind))
        for key, label, kind in _EVIDENCE
        if evidence.get(key) is not None
    ]
    known = {k for k, _, _ in _EVIDENCE} | _SKIP_EVIDENCE
    out += [
        (k.replace("_", " "), fmt_evidence(v, ""))
        for k, v in evidence.items()
        if k not in known and v is not None
    ]
    return out


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
