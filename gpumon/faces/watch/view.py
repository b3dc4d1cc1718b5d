"""What `gpumon watch` shows: the full-screen live view and the plain per-interval line.

``WatchState`` is the face's memory of the run (recent driver samples per GPU, the latest
snapshot and verdict); it is fed by the tick loop and read by the renderers.  The full
view is a ``rich`` renderable rebuilt on every refresh, so the elapsed clock moves between
ticks; the plain line carries no escape codes at all (Slurm output files, CI logs).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import sys
import termios
import threading
import time
import tty
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpumon.faces.watch.summary import fmt_duration, short_command
from gpumon.model import (
    GpuIdentity,
    GpuSample,
    GpuVerdict,
    Point,
    ProcessSample,
    Snapshot,
    State,
    Verdict,
)

BLOCKS = "▁▂▃▄▅▆▇█"
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

    @property
    def waiting(self) -> bool:
        return not self.gpus


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
    missing period, so silence is never drawn as a zero.
    """
    cells: list[tuple[str, str]] = []
    period = 0.0
    if points:
        diffs = sorted(b[0] - a[0] for a, b in itertools.pairwise(points) if b[0] > a[0])
        period = diffs[len(diffs) // 2] if diffs else 0.0
        prev_t: float | None = None
        for t, u in points:
            if prev_t is not None and period > 0 and t - prev_t > 1.5 * period:
                missing = min(width, round((t - prev_t) / period) - 1)
                cells.extend([(HOLE, "dim")] * missing)
            cells.append(_block(u))
            prev_t = t
    cells = cells[-width:]
    span = 0.0
    if len(points) > 1:
        span = points[-1][0] - points[0][0]
        if period > 0:
            span = min(span, len(cells) * period)
    text = Text(" " * (width - len(cells)))
    for ch, style in cells:
        text.append(ch, style=style)
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


# --- the full-screen view ------------------------------------------------------------------


class LiveView:
    """A ``rich`` renderable over a ``WatchState``; rebuilt on each refresh."""

    def __init__(self, state: WatchState, *, quit_hint: str = "q quits the view") -> None:
        self.state = state
        self.quit_hint = quit_hint

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # The width the console really has (a terminal resized mid-run included).
        # Build under the lock, write outside it: a slow (or XOFF'd) terminal must not hold
        # up ``feed()`` and so the sampling.
        with self.state.lock:
            screen = render(
                self.state,
                width=options.max_width,
                height=options.height,
                console=console,
                quit_hint=self.quit_hint,
            )
        yield screen


def render(
    st: WatchState,
    *,
    width: int | None = None,
    height: int | None = None,
    console: Console | None = None,
    quit_hint: str = "",
) -> RenderableType:
    """The whole screen, top to bottom in order of importance.

    With a ``height`` (the live view), what does not fit is made smaller rather than cut
    off the bottom: GPUs become one line each, then the process list shrinks.
    """
    width = width or _console_width()
    head, verdict = _header(st, quit_hint), _verdict_panel(st)
    parts: list[RenderableType] = [head, verdict]
    output = _output_panel(st)
    used = 0
    if height is not None and console is not None:
        opts = console.options.update(width=width, height=None)

        def lines(x: RenderableType) -> int:
            return len(console.render_lines(x, opts, pad=False))

        used = lines(head) + lines(verdict)
        if used + len(st.gpus) + 2 + 7 > height:  # not even one line per GPU would fit
            verdict = _verdict_panel(st, compact=True)
            parts[1] = verdict
            used = lines(head) + lines(verdict)
    used += 0 if output is None else 8
    traces = _ordered(st.gpus.values())
    if st.waiting:
        parts.append(_waiting_panel(st))
        used += 5
    elif height is not None and used + 7 * len(traces) + 7 > height:
        parts.append(_gpus_compact(traces, st.verdict, width))
        used += len(traces) + 2
    else:
        parts += [_gpu_panel(t, st.verdict, width) for t in traces]
        used += 7 * len(traces)
    rows = 10 if height is None else max(1, min(10, height - used - 5))
    parts.append(_host_panel(st, rows))
    if output is not None:
        parts.append(output)
    return Group(*parts)


def _output_panel(st: WatchState) -> Panel | None:
    if st.output is None or not st.output:
        return None
    tail = list(st.output)[-6:]
    return Panel(
        Text("\n".join(tail), overflow="ellipsis", no_wrap=True),
        title="command output (last lines)",
        title_align="left",
        border_style="dim",
    )


def _gpus_compact(traces: list[GpuTrace], verdict: Verdict | None, width: int) -> Panel:
    """One line per GPU when full panels do not fit (8 GPUs on a laptop-sized terminal):
    state, timeline, the GPU's own key numbers, memory and power."""
    table = Table.grid(padding=(0, 1))
    for _ in range(5):
        table.add_column(no_wrap=True)
    by_uuid = {g.uuid: g for g in (verdict.gpus if verdict else ())}
    now = None if verdict is None else verdict.t_s
    rows = []
    for t in traces:
        g, gv = t.latest, by_uuid.get(t.identity.uuid)
        if g is not None and g.lost:
            label = Text(f"GPU {t.identity.index} ", style="bold")
            label.append("LOST", style="bold red")
        elif gv is not None:
            label = _gpu_state_text(gv, now, compact=True)
        else:
            label = Text(f"GPU {t.identity.index}", style="bold")
        ev = {} if gv is None else {k: gv.evidence[k] for k in _COMPACT_KEYS if k in gv.evidence}
        mem = "–" if g is None or g.mem_used_bytes is None else fmt_bytes(g.mem_used_bytes)
        power = "–" if g is None or g.power_watts is None else f"{g.power_watts:.0f} W"
        limit = (g.power_limit_watts if g else None) or t.identity.power_limit_watts
        if limit:
            power += f"/{limit:.0f}"
        rows.append((label, t, _evidence_text(ev), mem, power))
    # The timeline gets what the other columns leave (borders and four gaps: 8 cells).
    others = sum(
        max((Text(x).cell_len if isinstance(x, str) else x.cell_len for x in col), default=0)
        for col in (
            [r[0] for r in rows],
            [r[2] for r in rows],
            [r[3] for r in rows],
            [r[4] for r in rows],
        )
    )
    tl_width = max(10, width - others - 8)
    for label, t, ev_text, mem, power in rows:
        line, _ = timeline(list(t.points), tl_width)
        table.add_row(label, line, ev_text, mem, power)
    return Panel(table, title="GPUs (one character per driver sample)", title_align="left")


def _console_width() -> int:
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns
    except OSError:
        return 100


def _ordered(traces: Iterable[GpuTrace]) -> list[GpuTrace]:
    return sorted(traces, key=lambda t: t.identity.index)


def _header(st: WatchState, quit_hint: str) -> Text:
    t = Text("gpumon watch", style="bold")
    if st.pid is not None:
        t.append(f"  pid {st.pid}")
    if st.command:
        t.append(f"  {short_command(st.command, 50)}", style="cyan")
    t.append(f"  elapsed {fmt_duration(time.monotonic() - st.started_mono_s)}")
    if st.status:
        t.append(f"  {st.status}", style="yellow")
    if quit_hint:
        t.append(f"  ({quit_hint})", style="dim")
    return t


# In the compact verdict (many GPUs, small terminal) each GPU keeps only these numbers.
_COMPACT_KEYS = ("duty_cycle", "gap_p50_s")


def _verdict_panel(st: WatchState, compact: bool = False) -> Panel:
    """The state, cause, evidence and advice; ``compact``: one line per GPU, two advices."""
    v = st.verdict
    body = Text()
    if v is None:
        body.append("state: ", style="bold")
        body.append("unknown", style=STATE_STYLE[State.UNKNOWN])
        body.append("  (no verdict yet)")
        return Panel(body, title="verdict", title_align="left")
    body.append("state: ", style="bold")
    body.append(v.state.value, style=STATE_STYLE.get(v.state, "bold"))
    if v.cause is not None:
        body.append("  cause: ", style="bold")
        body.append(v.cause.value, style="bold")
    if v.note:
        body.append(f"  ({v.note})", style="dim")
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=compact, overflow="ellipsis" if compact else "fold")
    # Compact: each GPU's state and numbers move to its one-line row in the GPUs panel.
    rows = [] if compact else [g for g in v.gpus if g.evidence or g.state is not State.UNKNOWN]
    for g in rows:
        # Host and run numbers are the same for every GPU: shown once, on the run's row.
        own = {k: x for k, x in g.evidence.items() if k not in v.evidence}
        table.add_row(_gpu_state_text(g, v.t_s), _evidence_text(own))
    if v.evidence:
        table.add_row(Text("run", style="bold"), _evidence_text(v.evidence))
    advice = list(dict.fromkeys([*v.advice, *(a for g in v.gpus for a in g.advice)]))
    parts: list[RenderableType] = [body]
    if rows or v.evidence:
        parts.append(table)
    if advice:
        parts.append(Text("advice:", style="bold"))
        bullets = Table.grid(padding=(0, 1))
        bullets.add_column(no_wrap=True)
        bullets.add_column()
        for a in advice[: 2 if compact else 4]:
            bullets.add_row("  •", a)  # wrapped lines stay under their text
        parts.append(bullets)
    return Panel(
        Group(*parts),
        title="verdict",
        title_align="left",
        border_style=STATE_STYLE.get(v.state, "white").replace("bold ", ""),
    )


def _gpu_state_text(g: GpuVerdict, now_s: float | None, compact: bool = False) -> Text:
    """``GPU 0 starved/cpu`` and how long it has held (on a second line unless compact)."""
    t = Text(f"GPU {g.gpu} ", style="bold")
    t.append(g.state.value, style=STATE_STYLE.get(g.state, ""))
    if g.cause is not None:
        t.append(f"/{g.cause.value}")
    if g.since_s is not None and now_s is not None and now_s >= g.since_s:
        sep = " " if compact else "\n"
        t.append(f"{sep}for {fmt_duration(now_s - g.since_s)}", style="dim")
    return t


def _evidence_text(evidence: dict[str, object]) -> Text:
    t = Text()
    for i, (label, value) in enumerate(evidence_items(evidence)):
        if i:
            t.append("  ")
        t.append(f"{label} ", style="dim")
        t.append(value)
    return t


def _waiting_panel(st: WatchState) -> Panel:
    if st.invisible_gpu_pids:
        pids = ", ".join(str(p) for p in st.invisible_gpu_pids[:6])
        msg = Text(
            f"NVML lists GPU processes whose pids do not exist here ({pids}): running in a "
            "container without the host PID namespace? NVML reports host pids, so gpumon "
            "cannot tell which GPU is this run's (run the container with --pid=host).",
            style="yellow",
        )
    elif not st.identities:
        msg = Text("NVML reports no GPU on this machine.", style="yellow")
    else:
        msg = Text(
            "waiting for the run to use a GPU (no process of its tree is in any GPU's "
            f"process list yet; {len(st.identities)} GPU(s) on this machine)."
        )
    return Panel(msg, title="GPUs", title_align="left")


def _gpu_panel(trace: GpuTrace, verdict: Verdict | None, width: int) -> Panel:
    ident, g = trace.identity, trace.latest
    inner = max(10, width - 4)
    line, span = timeline(list(trace.points), inner)
    kind = (
        "per tick: the driver's sample buffer is unavailable"
        if trace.from_ticks
        else "one character per driver sample"
    )
    label = Text(f"utilisation, last {span:.0f}s ({kind})", style="dim")
    info = Table.grid(padding=(0, 1))
    for _ in range(3):
        info.add_column(no_wrap=True)
    mem_used = None if g is None else g.mem_used_bytes
    mem_total = (None if g is None else g.mem_total_bytes) or ident.mem_total_bytes
    power = None if g is None else g.power_watts
    limit = (None if g is None else g.power_limit_watts) or ident.power_limit_watts
    info.add_row(
        "memory", bar(mem_used, mem_total), f"{fmt_bytes(mem_used)} / {fmt_bytes(mem_total)}"
    )
    info.add_row(
        "power",
        bar(power, limit),
        f"{'–' if power is None else f'{power:.0f} W'} / "
        f"{'–' if limit is None else f'{limit:.0f} W'}",
    )
    extra = []
    if g is not None and g.util_pct is not None:
        extra.append(f"utilization.gpu {g.util_pct:.0f}%")
    if g is not None and g.temperature_c is not None:
        extra.append(f"{g.temperature_c:.0f}°C")
    if g is not None and g.sm_clock_mhz is not None:
        extra.append(f"SM {g.sm_clock_mhz} MHz")
    if g is not None and g.processes is not None:
        extra.append(f"{len(g.processes)} process(es)")
    title = Text(f"GPU {ident.index}", style="bold")
    if ident.name:
        title.append(f" {ident.name}")
    title.append(f" {ident.uuid}", style="dim")
    gv = None if verdict is None else next((x for x in verdict.gpus if x.uuid == ident.uuid), None)
    if gv is not None:
        title.append("  ")
        title.append(gv.state.value, style=STATE_STYLE.get(gv.state, ""))
    if g is not None and g.lost:
        title.append("  LOST (fell off the bus)", style="bold red")
    parts: list[RenderableType] = [line, label, info]
    if extra:
        parts.append(Text("  ".join(extra), style="dim"))
    return Panel(Group(*parts), title=title, title_align="left")


def _host_panel(st: WatchState, limit: int = 10) -> Panel:
    snap = st.snapshot
    host = None if snap is None else snap.host
    tree = None if snap is None else snap.tree
    head = Text()
    if host is not None:
        head.append("host CPU ", style="dim")
        head.append("–" if host.cpu_pct is None else f"{host.cpu_pct:.0f}%")
        head.append("  iowait ", style="dim")
        head.append("–" if host.iowait_pct is None else f"{host.iowait_pct:.1f}%")
        if host.cpu_pct_per_core:
            head.append(f"  cores {len(host.cpu_pct_per_core)}", style="dim")
        if host.load_1m is not None:
            head.append("  load ", style="dim")
            head.append(f"{host.load_1m:.2f}")
        if host.disk_read_bytes_per_s is not None:
            head.append("  disk read ", style="dim")
            head.append(fmt_bytes(host.disk_read_bytes_per_s, "/s"))
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold dim")
    for col, justify in (
        ("pid", "right"),
        ("role", "left"),
        ("name", "left"),
        ("CPU", "right"),
        ("thr", "right"),
        ("read", "right"),
        ("status", "left"),
    ):
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    procs = _ordered_procs(tree.processes if tree else (), None if tree is None else tree.root_pid)
    for p in procs[:limit]:
        role = "main" if tree is not None and p.pid == tree.root_pid else "worker"
        if p.pid in st.gpu_pids:
            role += "+GPU"
        table.add_row(
            str(p.pid),
            role,
            (p.name or "?")[:20],
            "–" if p.cpu_pct is None else f"{p.cpu_pct:.0f}%",
            "–" if p.num_threads is None else str(p.num_threads),
            fmt_bytes(p.read_bytes_per_s, "/s"),
            p.status or "?",
        )
    parts: list[RenderableType] = [head, table]
    if len(procs) > limit:
        parts.append(Text(f"… and {len(procs) - limit} more processes", style="dim"))
    if tree is not None and not tree.root_alive:
        parts.append(Text("the watched process has exited", style="yellow"))
    n = len(procs)
    return Panel(Group(*parts), title=f"host and process tree ({n} processes)", title_align="left")


def _ordered_procs(procs: Iterable[ProcessSample], root: int | None) -> list[ProcessSample]:
    """Main process first, then workers by CPU (the busiest are the telling ones)."""
    return sorted(procs, key=lambda p: (p.pid != root, -(p.cpu_pct or 0.0), p.pid))


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


# --- keys ----------------------------------------------------------------------------------


class KeyReader:
    """Reads single keys from the terminal in cbreak mode on a thread; `q` sets ``quit``.

    cbreak keeps ISIG, so Ctrl-C still raises SIGINT as usual.  The terminal's settings are
    restored on ``close()`` whatever happened.
    """

    def __init__(self, quit_event: threading.Event, fd: int | None = None) -> None:
        self.quit = quit_event
        self.fd = sys.stdin.fileno() if fd is None else fd
        self._saved: list | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpumon-keys", daemon=True)

    def start(self) -> KeyReader:
        if os.isatty(self.fd):
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.1)
                if not ready:
                    continue
                data = os.read(self.fd, 64)
            except OSError:
                return
            if not data:
                return
            if b"q" in data or b"Q" in data:
                self.quit.set()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)
        if self._saved is not None:
            with contextlib.suppress(termios.error):
                termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
            self._saved = None
