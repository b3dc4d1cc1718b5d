"""`gpumon demo`: the whole live pipeline on a recorded run, on any machine, in a minute.

A bundled trace (a real recording when one ships, otherwise a synthetic one, said so on
screen) is replayed through the sampler stand-ins of ``gpumon.sample.replay``: the
``watch`` face runs unchanged on it (full screen on a terminal, plain lines otherwise,
then the run summary), while the ``serve`` daemon's parts serve Prometheus metrics on a
free loopback port and write its JSON-lines log into a temporary directory -- as if a
real training run were being watched on a GPU node.  No NVML, no driver, no GPU.

Each face gets its own replay of the same trace, started on the same instant at the same
speed, exactly as `gpumon watch` and `gpumon serve` would each sample the same machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumon.errors import GpumonError
from gpumon.faces.common import positive_float
from gpumon.model import Snapshot, TraceHeader
from gpumon.monitor import Monitor, Tick, paced
from gpumon.sample.replay import Replay
from gpumon.traces.jsonl import TraceReader

DATA = Path(__file__).resolve().parents[2] / "data"
SYNTHETIC = DATA / "demo-synthetic.jsonl.gz"
# Where real recordings of the starvation lab live in a source checkout.
CHECKOUT = Path(__file__).resolve().parents[3]
REAL_DIRS = (DATA, CHECKOUT / "tests" / "data" / "real")
# By default the replay lasts about this long, whatever the trace's length.
TARGET_WALL_S = 40.0
SERVE_INTERVAL_S = 0.5
# A view tick covers at most this much trace time: at higher speeds it ticks more often,
# so the detector still evaluates every few seconds of the run (start-up and phase edges
# stay sharp) whatever the speed.
MAX_TRACE_S_PER_TICK = 10.0
# On a terminal the full-screen view hides what was printed before it: a moment to read
# the metrics URL and the log path first.
TUI_PAUSE_S = 3.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="see gpumon work in a minute, no GPU needed: a recorded run replayed live",
        description="Replay a recorded training run (bundled) through the live pipeline: "
        "the `watch` view (full screen on a terminal, plain lines otherwise), Prometheus "
        "metrics on a free loopback port and the daemon's JSON-lines log in a temporary "
        "directory, ending with the run summary. Needs no GPU and no NVIDIA driver.",
    )
    p.add_argument(
        "--speed",
        type=positive_float,
        metavar="X",
        help=f"replay X times faster than recorded (default: the trace's length / "
        f"{TARGET_WALL_S:g} s, so the demo takes well under a minute)",
    )
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="replay this gpumon trace (.jsonl or .jsonl.gz) instead of the bundled one",
    )
    p.add_argument(
        "--no-serve",
        action="store_true",
        help="only the watch view: no metrics endpoint, no log file",
    )
    p.add_argument(
        "--interval",
        type=positive_float,
        metavar="S",
        help="wall seconds between the view's ticks (default 0.25 on a terminal, 1 for "
        f"plain lines, less when a tick would cover over {MAX_TRACE_S_PER_TICK:g} s of the "
        "trace); every recorded sample is replayed whatever the interval",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="plain lines even on a terminal (the default when stdout is not one)",
    )
    p.add_argument("--summary-json", metavar="FILE", help="write the run summary as JSON")
    p.set_defaults(func=run)


# --- the trace -------------------------------------------------------------------------------


def is_synthetic(header: TraceHeader) -> bool:
    return header.source in ("synth", "synthetic") or bool(header.extra.get("synthetic"))


def bundled_trace() -> Path:
    """A real recording when one ships (``demo-real*`` or ``tests/data/real``), else synthetic."""
    in_checkout = (CHECKOUT / "pyproject.toml").is_file()
    for folder in REAL_DIRS:
        if not folder.is_dir() or (folder != DATA and not in_checkout):
            continue
        for path in sorted(folder.glob("*.jsonl*")):
            if folder == DATA and not path.name.startswith("demo-real"):
                continue
            try:
                with TraceReader(path) as trace:
                    if not is_synthetic(trace.header):
                        return path
            except GpumonError:
                continue
    return SYNTHETIC


@dataclass(frozen=True)
class LoadedTrace:
    """A whole trace in memory: each face's replay iterates it from the start."""

    path: Path
    header: TraceHeader
    snapshots: tuple[Snapshot, ...]
    events: tuple[dict[str, Any], ...]

    @property
    def span_s(self) -> float:
        return self.snapshots[-1].t_s - self.snapshots[0].t_s if self.snapshots else 0.0

    @property
    def synthetic(self) -> bool:
        return is_synthetic(self.header)

    def describe(self) -> str:
        gpus = len(self.header.gpus) or len(self.snapshots[0].gpus)
        what = f"{fmt_span(self.span_s)} of a {gpus}-GPU training run"
        if self.synthetic:
            return f"the synthetic trace {self.path.name} ({what}; generated, not recorded)"
        names = sorted({g.name for g in self.header.gpus if g.name})
        where = f" on {', '.join(names)}" if names else ""
        return f"the real trace {self.path.name} ({what}, recorded{where})"


def load(path: Path) -> LoadedTrace:
    trace = TraceReader(path)
    snapshots = tuple(trace)
    if len(snapshots) < 2:
        raise GpumonError(f"{path}: the trace holds {len(snapshots)} tick(s); nothing to replay.")
    return LoadedTrace(path, trace.header, snapshots, tuple(trace.events))


def fmt_span(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def default_speed(span_s: float) -> float:
    """Fast enough to finish in about TARGET_WALL_S; never slower than real time."""
    return max(1.0, round(span_s / TARGET_WALL_S, 1))


# --- the serve side ----------------------------------------------------------------------------


class DemoServer:
    """The serve daemon's state, metrics endpoint and log, fed by its own replay."""

    def __init__(self, trace: LoadedTrace, speed: float, live_start_s: float, log_dir: str) -> None:
        from prometheus_client import disable_created_metrics

        from gpumon.faces.serve.collector import make_registry
        from gpumon.faces.serve.config import ServeConfig
        from gpumon.faces.serve.daemon import ServeState
        from gpumon.faces.serve.http import MetricsServer
        from gpumon.faces.serve.log import EventLog
        from gpumon.sample.joblabels import JobResolver

        self.replay = Replay(
            trace.snapshots, header=trace.header, speed=speed, live_start_s=live_start_s
        )
        nvml, host, tree = self.replay.samplers()
        monitor = Monitor(nvml, host, tree, interval_s=SERVE_INTERVAL_S)  # type: ignore[arg-type]
        self.log_path = os.path.join(log_dir, "gpumon-serve.log")
        cfg = ServeConfig(
            address="127.0.0.1",
            port=0,
            interval_s=SERVE_INTERVAL_S,
            log_path=self.log_path,
            job_sources=(),
        )
        disable_created_metrics()
        wall0 = time.time() + (live_start_s - time.monotonic())  # wall time at live start
        # The daemon's clocks follow the replay, so log times and periodic summaries are
        # those of the recorded run, started now.
        self.state = ServeState(
            monitor,
            cfg,
            EventLog(cfg.log_path),
            resolver=JobResolver(()),
            mono=self.replay.now,
            wall=lambda: wall0 + (self.replay.now() - live_start_s),
        )
        self.server = MetricsServer(cfg, make_registry(self.state))
        self.url = f"http://127.0.0.1:{self.server.port}/metrics"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="gpumon-demo-serve", daemon=True)

    def start(self) -> None:
        self.server.start()
        start = self.state.summary("start")
        start["listen"] = self.url
        start["demo"] = True
        self.state.log.write(start)
        self.thread.start()

    def _loop(self) -> None:
        for _ in paced(SERVE_INTERVAL_S, self.stop):
            self.state.step()
            if self.replay.finished:  # the run is over: its episodes end with its last tick
                return

    def close(self, reason: str) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.state.finish(reason)
        self.server.close()
        self.state.log.close()


# --- the watch side ----------------------------------------------------------------------------


class NarratedMonitor(Monitor):
    """The replay's Monitor; in plain-line mode it also says when the recorded run enters
    a labelled phase (the trace's ``phase`` events), so the reader can compare what
    happened with what gpumon says.  Printed from the tick, before the face's own line."""

    def __init__(self, *args: Any, phases: list[tuple[float, str]], out: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._phases = sorted(phases)
        self._out = out

    def tick(self) -> Tick:
        tick = super().tick()
        while self._phases and self._phases[0][0] <= tick.snapshot.t_s:
            _, text = self._phases.pop(0)
            print(f"gpumon demo: -- {text} --", file=self._out, flush=True)
        return tick


def phase_notes(trace: LoadedTrace, live_start_s: float) -> list[tuple[float, str]]:
    """(stream time, sentence) for each labelled phase of the trace."""
    t0 = trace.snapshots[0].t_s
    notes = []
    for ev in trace.events:
        phase, t = ev.get("phase"), ev.get("t")
        if ev.get("event") != "phase" or not isinstance(t, int | float) or not phase:
            continue
        cause = f" (cause: {ev['cause']})" if ev.get("cause") else ""
        notes.append((live_start_s + (t - t0), f"the recorded run enters its {phase} phase{cause}"))
    return notes


def replay_monitor_factory(monitor: Monitor, *, has_tree: bool = True) -> Callable[..., Monitor]:
    """What the watch face calls instead of ``build_monitor``: the replay's Monitor.

    A trace recorded without a process tree (``gpumon record`` without ``--pid``) cannot
    tie GPUs to a run: then every GPU is shown rather than none.
    """

    def factory(**kw: Any) -> Monitor:
        monitor.interval_s = kw.get("interval_s", monitor.interval_s)
        monitor.tree_gpus_only = bool(kw.get("tree_gpus_only", False)) and has_tree
        return monitor

    return factory


def watch_args(
    watch: Any, pid: int, interval: float, plain: bool, summary_json: str | None
) -> argparse.Namespace:
    """The watch face's own parser fills every option it has (defaults included)."""
    parser = argparse.ArgumentParser(prog="gpumon")
    sub = parser.add_subparsers(dest="command_name")
    watch.register(sub)
    argv = ["watch", "--pid", str(pid), "--interval", repr(interval)]
    if plain:
        argv.append("--plain")
    if summary_json:
        argv += ["--summary-json", summary_json]
    return parser.parse_args(argv)


# --- the face ----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    path = Path(args.trace) if args.trace else bundled_trace()
    trace = load(path)
    speed = args.speed or default_speed(trace.span_s)
    tui = sys.stdout.isatty() and not args.plain
    interval = args.interval or min(0.25 if tui else 1.0, max(0.05, MAX_TRACE_S_PER_TICK / speed))
    kind = "synthetic trace" if trace.synthetic else "real trace"
    out = sys.stdout
    print(
        f"gpumon demo: replaying {trace.describe()} at {speed:g}x "
        f"(about {fmt_span(trace.span_s / speed)}).",
        file=out,
    )
    if trace.synthetic:
        print(
            "gpumon demo: this is a synthetic trace, made by gpumon.lab.synth to show what "
            "gpumon reports; no GPU was measured.",
            file=out,
        )
    story = trace.header.extra.get("story")
    if isinstance(story, list) and story:
        phases = " -> ".join(str(p.get("phase")) for p in story if isinstance(p, dict))
        print(f"gpumon demo: the run's phases: {phases}.", file=out)

    pause = TUI_PAUSE_S if tui and not args.no_serve else 0.0
    live_start = time.monotonic() + pause  # both replays start on this instant
    server = None
    if not args.no_serve:
        try:
            log_dir = tempfile.mkdtemp(prefix="gpumon-demo-")
        except OSError as exc:
            raise GpumonError(
                f"cannot create a temporary directory for the daemon's log "
                f"({exc.strerror or exc}); set TMPDIR or use --no-serve."
            ) from None
        server = DemoServer(trace, speed, live_start, log_dir)
        print(
            f"gpumon demo: Prometheus metrics at {server.url} (try: curl -s {server.url} "
            "| grep gpumon_gpu_state)",
            file=out,
        )
        print(f"gpumon demo: the daemon's log: {server.log_path}", file=out)
    if pause:
        print(f"gpumon demo: the live view opens in {pause:g} s; q quits it.", file=out)
    out.flush()
    if pause:
        time.sleep(max(0.0, live_start - time.monotonic()))
    if server is not None:
        server.start()

    replay = Replay(trace.snapshots, header=trace.header, speed=speed, live_start_s=live_start)
    nvml, host, tree = replay.samplers()
    command = (f"[{kind} replayed at {speed:g}x]", *(trace.header.command or ("a run",)))
    notes = [] if tui else phase_notes(trace, live_start)
    monitor = NarratedMonitor(
        nvml,
        host,
        tree,
        command=command,  # type: ignore[arg-type]
        phases=notes,
        out=out,
    )
    status = 0
    reason = "demo finished"
    try:
        has_tree = any(snap.tree is not None for snap in trace.snapshots)
        from gpumon.faces import watch

        wargs = watch_args(watch, tree.root_pid, interval, not tui, args.summary_json)
        factory = replay_monitor_factory(monitor, has_tree=has_tree)
        status = watch.run(wargs, monitor_factory=factory)
        if not replay.finished:
            reason = "demo stopped"
    finally:
        if server is not None:
            server.close(reason)
    played = min(trace.span_s, replay.played_s)
    print(
        f"\ngpumon demo: replayed {fmt_span(played)} of the {kind} in "
        f"{fmt_span(time.monotonic() - live_start)} (wall time above is the replay's).",
        file=out,
    )
    if server is not None:
        print(
            f"gpumon demo: metrics were served at {server.url}; the daemon's log "
            f"({server.state.log.lines_total} lines) is at {server.log_path}",
            file=out,
        )
    print(
        "gpumon demo: on a GPU machine, run `gpumon watch -- python train.py` or "
        "`gpumon watch --pid PID`.",
        file=out,
        flush=True,
    )
    return status
