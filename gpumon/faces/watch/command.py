"""`gpumon watch`: a live view of one training run, with a verdict, advice and a summary.

``gpumon watch --pid PID`` attaches to a running process; ``gpumon watch -- CMD ...``
starts the command, watches it and exits with its exit status.  Either way the whole
process tree is followed (DataLoader workers come and go), the GPUs shown are those whose
NVML process list holds a pid of the tree, and the detector decides the state: this face
only asks its ``Session`` for ticks and verdicts, and renders.

On a terminal the view is full-screen (``q`` or Ctrl-C leaves it; in --pid mode the
watched process is never touched); otherwise one plain line per interval is printed.
When the run ends a summary follows, optionally as JSON, and ``--fail-on`` turns too much
time starved or stalled into exit status 5 for CI jobs and Slurm epilogs.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpumon.engine import DetectorConfig, LiveOptions, Session, StackOptions
from gpumon.errors import GpumonError, ProcessGoneError, UsageError
from gpumon.faces.common import (
    HANG_AFTER_MAX_S,
    HANG_AFTER_MIN_S,
    hang_after_arg,
    interval,
    positive_float,
    recorded_settings,
    write_tick,
)
from gpumon.faces.watch.child import Child
from gpumon.faces.watch.keys import KeyReader, ViewControls
from gpumon.faces.watch.layout import MIN_WIDTH, LiveView
from gpumon.faces.watch.summary import EXIT_FAIL_ON, GpuLine, Summary, parse_states
from gpumon.faces.watch.view import WatchState, plain_line
from gpumon.files import check_replaceable
from gpumon.loop import ExitWatch, StopFlag, paced
from gpumon.model import State, Verdict
from gpumon.terminal import printable

if TYPE_CHECKING:
    from gpumon.traces.jsonl import TraceWriter


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "watch",
        help="watch one training run live: why its GPUs wait, with advice and a summary",
        description="Watch a running process (--pid) or start a command (after --) and "
        "follow its whole process tree: per GPU a sub-second utilisation timeline from the "
        "driver's sample buffer, memory and power; the workers' CPU and reads; the state "
        "(healthy, starved, sync_stall, idle, unknown) with its cause, evidence and advice. "
        "Full-screen on a terminal of 80 columns or more (keys: ? help, a advice, g and "
        "the arrows page the GPUs, p pause, q quit), one plain line per interval "
        "otherwise; a summary when the run ends.",
        epilog=f"Exit status: the command's own in `watch -- CMD` mode; {EXIT_FAIL_ON} when "
        "--fail-on trips (and the command itself succeeded); 4 when the pid does not exist "
        "or cannot be read; 2 when nothing to watch is given; 127/126 when the command "
        "cannot be started.",
    )
    p.add_argument("--pid", type=int, help="watch this running process and its descendants")
    p.add_argument(
        "--interval",
        type=interval,
        default=_default("interval"),
        metavar="S",
        help="seconds between ticks (default %(default)g; every driver sample "
        "between ticks is kept whatever the interval)",
    )
    p.add_argument(
        "--window",
        type=positive_float,
        metavar="S",
        help="seconds of recent samples each verdict is judged on (default: the "
        "detector's, 8 s); shorter decides sooner, longer flaps less",
    )
    p.add_argument(
        "--hang-after",
        type=hang_after_arg,
        metavar="S",
        help="seconds every GPU may spin in a collective with none computing before the run "
        "is called a hang (default: the detector's, 300 s, as serve's [detector] "
        f"hang_after_s; {HANG_AFTER_MIN_S:g} to {HANG_AFTER_MAX_S:g})",
    )
    p.add_argument("--summary-json", metavar="FILE", help="write the end-of-run summary as JSON")
    p.add_argument(
        "--fail-on",
        type=_states,
        metavar="STATES",
        help="comma-separated states (e.g. starved,sync_stall): exit with status "
        f"{EXIT_FAIL_ON} when the run spent more than --fail-threshold of its time in them",
    )
    p.add_argument(
        "--fail-threshold",
        type=_share,
        default=_default("fail_threshold"),
        metavar="SHARE",
        help="share of the run (0-1) above which --fail-on trips (default %(default)g)",
    )
    p.add_argument("--record", metavar="FILE", help="also keep the trace for `gpumon analyze`")
    p.add_argument(
        "--stacks",
        action="store_true",
        help="while a GPU waits, read the job's Python stacks (py-spy, gpumon-why[stacks]) "
        "and name what its processes do: loader waits, decoding, checkpoints, evaluation, "
        "collectives (within 2 %% of one core)",
    )
    p.add_argument(
        "--stacks-every",
        type=positive_float,
        default=_default("stacks_every"),
        metavar="S",
        help="seconds per stack window: stacks arrive this often while a GPU waits "
        "(default %(default)g)",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="one plain line per interval even on a terminal (the default when stdout is "
        "not a terminal)",
    )
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- CMD ...",
        help="start this command and watch it; gpumon exits with its exit status",
    )
    p.set_defaults(func=run)


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """What a watch is asked to do: the command line's options, as the demo and tests
    pass them without an argv.  The defaults are written here only: the command line's
    are these."""

    pid: int | None = None
    command: tuple[str, ...] = ()
    interval: float = 0.5
    window: float | None = None
    hang_after: float | None = None
    summary_json: str | None = None
    fail_on: tuple[State, ...] | None = None
    fail_threshold: float = 0.25
    record: str | None = None
    plain: bool = False
    stacks: bool = False
    stacks_every: float = 10.0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WatchOptions:
        command = tuple(args.command or ())
        if command and command[0] == "--":
            command = command[1:]
        return cls(
            pid=args.pid,
            command=command,
            interval=args.interval,
            window=args.window,
            hang_after=args.hang_after,
            summary_json=args.summary_json,
            fail_on=args.fail_on,
            fail_threshold=args.fail_threshold,
            record=args.record,
            plain=args.plain,
            stacks=args.stacks,
            stacks_every=args.stacks_every,
        )


def _default(name: str) -> Any:
    """The default of a WatchOptions field (what the command line defaults to)."""
    return next(f.default for f in dataclasses.fields(WatchOptions) if f.name == name)


def _states(text: str) -> tuple[State, ...]:
    try:
        return parse_states(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a share from 0 to below 1: {text!r}")
    return value


class SessionFactory(Protocol):
    """How watch asks for its session: ``Session.live``, or the demo's replay."""

    def __call__(
        self,
        options: LiveOptions,
        /,
        *,
        config: DetectorConfig | None = None,
        stacks: StackOptions | None = None,
    ) -> Session: ...


def _detector_config(args: WatchOptions) -> DetectorConfig | None:
    """The detector's settings --window and --hang-after change (None: the defaults)."""
    if args.window is None and args.hang_after is None:
        return None
    base = DetectorConfig()
    return dataclasses.replace(
        base,
        window_s=base.window_s if args.window is None else args.window,
        hang_after_s=base.hang_after_s if args.hang_after is None else args.hang_after,
    )


class _Run:
    """One watch from start to summary; the pieces the loop and the ending share."""

    def __init__(
        self,
        args: WatchOptions,
        command: tuple[str, ...],
        session_factory: SessionFactory = Session.live,
    ) -> None:
        self.args = args
        self.session_factory = session_factory
        self.command = command or None
        self.tui = sys.stdout.isatty() and not args.plain and _in_foreground() and _wide_enough()
        self.child: Child | None = None
        self.session: Session | None = None
        self.verdict: Verdict | None = None
        self.ended = "exited"
        self.started_mono_s = time.monotonic()
        self.quit_view = threading.Event()
        # Ends the wait between ticks at once: the watched process exited, or a stop.
        self.wake = threading.Event()
        self.view_open = False
        self._closer = _Closer()
        self.quiet = False  # plain lines stopped (their reader went away)
        self.state: WatchState  # set by start(), once the pid is known

    # --- setup -------------------------------------------------------------------------

    def start(self) -> None:
        # The face only asks the session; it decides nothing itself.
        pid = self.args.pid
        config = _detector_config(self.args)
        stacks = None
        if self.args.stacks:
            stacks = StackOptions(every_s=self.args.stacks_every)
            Session.check_stacks(stacks)  # before the command starts
        if self.command is not None:
            # NVML first: without a driver, say so before the command has started.
            Session.check_driver()
            self.child = Child(self.command, capture=self.tui)
            pid = self.child.pid
        try:
            options = LiveOptions(
                pid=pid, command=self.command, interval_s=self.args.interval, tree_gpus_only=True
            )
            session = self.session_factory(options, config=config, stacks=stacks)
        except BaseException:
            if self.child is not None:
                self.child.send(15)
                self.child.wait()
                self.child.restore_signals()
            raise
        self.session = session
        self.state = WatchState(
            pid=pid if pid is not None else session.root_pid,
            command=session.command,
            identities=session.gpus,
            started_mono_s=self.started_mono_s,
            memory=session.memory,
        )
        if self.child is not None and self.child.pump is not None:
            self.state.output = _TailView(self.child.pump)  # type: ignore[assignment]

    # --- the loop ------------------------------------------------------------------------

    def loop(self, stop: threading.Event, writer: TraceWriter | None, live: Any) -> None:
        session = self.session
        assert session is not None
        for _ in paced(self.args.interval, stop, wake=self.wake):
            reading = session.read()  # NVML, the host, the tree: before the lock
            with self.state.lock:
                snap = session.fold(reading).snapshot
                self.verdict = session.verdict()
                self.state.feed(snap, self.verdict, session.invisible_gpu_pids)
            if writer is not None and self.args.record is not None:
                write_tick(writer, snap, self.args.record)
            if not self.view_open:
                if not self.tui and not self.quiet:
                    self._print_line(printable(plain_line(self.state)))
            elif live is not None:
                live.refresh()
            if snap.tree is not None and not snap.tree.root_alive:
                self.ended = "exited"
                return
            if self.quit_view.is_set() and self.view_open:
                if self.child is None:
                    self.ended = "stopped"
                    return
                self._close_view_keep_watching()
        self.ended = "stopped"

    def _print_line(self, line: str) -> None:
        try:
            print(line, flush=True)
        except BrokenPipeError:
            if self.child is None:
                raise  # `gpumon watch --pid N | head`: the reader is done, so are we
            # The reader went away, the command did not: keep watching it, silently.
            self.quiet = True
            _silence_stdout()

    def _close_view_keep_watching(self) -> None:
        """`q` in `watch -- CMD` mode: the command keeps running in the foreground."""
        self.view_open = False
        self._closer.close()
        if self.child is not None and self.child.pump is not None:
            self.child.pump.release()
        print(
            f"gpumon: view closed; still watching {' '.join(self.command or ())!r} "
            f"(pid {self.state.pid}) until it exits; Ctrl-C stops it.",
            file=sys.stderr,
            flush=True,
        )

    # --- the end -------------------------------------------------------------------------

    def summary(self, exit_status: int | None) -> Summary:
        session = self.session
        assert session is not None
        session.finish()
        self.verdict = session.verdict()
        run = session.summary()
        assert run is not None
        notes: list[str] = []
        used = session.tree_gpu_uuids
        used_gpu = bool(used)
        invisible = tuple(sorted(session.invisible_gpu_pids))
        if not used_gpu:
            notes.append(
                "the run never used a GPU: no process of its tree appeared in any GPU's "
                "NVML process list"
            )
            if invisible:
                notes.append(
                    "NVML listed GPU processes whose pids do not exist here "
                    f"({', '.join(map(str, invisible[:6]))}): running in a container without "
                    "the host PID namespace? (docker run --pid=host)"
                )
        elif run.verdict is State.IDLE and run.startup_s > 0 and run.working_s == 0:
            notes.append("the run ended in start-up, before any sustained GPU work was seen")
        if session.stacks is not None and session.stacks.refusal:
            notes.append(session.stacks.refusal)
        names = {g.uuid: g.name for g in session.gpus}
        gpus = [
            GpuLine(g.gpu, g.uuid, names.get(g.uuid), g.duty_cycle, g.off_bus_s, g.lost_gpu_seconds)
            for g in run.gpus
            if g.uuid in used
        ]
        return Summary(
            pid=self.state.pid,
            command=self.state.command,
            wall_s=time.monotonic() - self.started_mono_s,
            run=run,
            gpus=gpus,
            used_gpu=used_gpu,
            exit_status=exit_status,
            ended=self.ended,
            notes=notes,
            invisible_gpu_pids=invisible,
            fail_on=self.args.fail_on or (),
            fail_threshold=self.args.fail_threshold if self.args.fail_on else None,
            stacks=session.memory.stacks_run(),
        )


class _TailView:
    """Looks like a deque of lines to the view; reads the command's output tail lazily."""

    def __init__(self, pump: Any) -> None:
        self.pump = pump

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.pump.tail(6))

    def __bool__(self) -> bool:
        return bool(self.pump.lines)


class _Closer:
    """Closes the live view and the key reader once, whoever asks first."""

    def __init__(self) -> None:
        self.stack = ExitStack()
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.stack.close()


class _LogsToStatus(logging.Handler):
    """While the full screen is up, gpumon's warnings go to the header, not over the view."""

    def __init__(self, state: WatchState) -> None:
        super().__init__(logging.WARNING)
        self.state = state
        self.logger = logging.getLogger("gpumon")
        self._propagate = self.logger.propagate

    def emit(self, record: logging.LogRecord) -> None:
        self.state.status = f"warning: {record.getMessage()}"[:100]

    def __enter__(self) -> _LogsToStatus:
        self.logger.addHandler(self)
        self.logger.propagate = False
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.propagate = self._propagate


def run(args: argparse.Namespace) -> int:
    """`gpumon watch` from its command line."""
    return watch(WatchOptions.from_args(args))


def watch(args: WatchOptions, *, session_factory: SessionFactory = Session.live) -> int:
    """Watch a run; its exit status.  ``session_factory`` (``Session.live``, by default)
    is the seam the demo uses to feed the same face from a replayed trace."""
    command = args.command
    if args.pid is not None and command:
        raise GpumonError("give either --pid PID or -- CMD, not both.")
    if args.pid is None and not command:
        raise UsageError(
            "nothing to watch: give --pid PID or -- CMD ARGS... "
            "(e.g. gpumon watch -- python train.py)."
        )
    if args.pid is not None and args.pid <= 0:
        raise ProcessGoneError(f"no process with pid {args.pid} exists.", pid=args.pid)
    if args.summary_json:
        _check_output(args.summary_json)  # before the run, not after it
    r = _Run(args, command, session_factory)
    r.start()
    assert r.session is not None
    stop_flag = StopFlag()
    stop_flag.wakes.append(r.wake)
    if r.child is not None:
        r.child.forward_signals()  # the command decides when Ctrl-C ends the run
    else:
        stop_flag.install()
    exit_status: int | None = None
    failure: GpumonError | None = None
    # A live process only (a replay's pid is a recorded number, maybe another process now).
    pid = r.state.pid
    exits = ExitWatch(pid, r.wake) if session_factory == Session.live and pid is not None else None
    try:
        try:
            _watch(r, stop_flag)
        except GpumonError as exc:
            if r.child is None:
                raise
            # A failure of gpumon's own (a full disk under --record) must neither orphan nor
            # kill the training run: say so, and wait for the command as promised.
            failure = exc
            print(f"gpumon: {exc} Still waiting for the command to finish.", file=sys.stderr)
        if r.child is not None:
            if r.child.pump is not None:
                r.child.pump.release()
            exit_status = r.child.wait()
    finally:
        if exits is not None:
            exits.close()
        stop_flag.restore()
        if r.child is not None:
            r.child.restore_signals()
    summary = r.summary(exit_status)
    r.session.close()  # py-spy windows still running, kept /proc files
    try:
        text = printable(summary.text(), keep_newlines=True)
        print(("" if r.tui else "\n") + text, flush=True)
    except BrokenPipeError:
        if r.child is None:
            raise
        _silence_stdout()  # the command's status below matters more than our summary
    if args.summary_json:
        try:
            summary.write_json(args.summary_json)
        except OSError as exc:
            raise GpumonError(f"cannot write {args.summary_json}: {exc.strerror or exc}.") from None
    if exit_status:
        return exit_status
    if failure is not None:
        return failure.exit_status
    return EXIT_FAIL_ON if summary.failed else 0


def _check_output(path: str) -> None:
    """Refuse, before watching, a --summary-json that could not be written at the end."""
    try:
        check_replaceable(path)
    except OSError as exc:
        raise UsageError(f"--summary-json {path}: {exc.strerror}; give a file's path.") from None


def _in_foreground() -> bool:
    """The full view sets the terminal up, which the kernel stops (SIGTTOU) a process of a
    background group for doing (``gpumon watch ... &``, ``timeout`` without
    ``--foreground``): there it prints plain lines instead, saying why."""
    try:
        foreground = os.tcgetpgrp(sys.stdout.fileno()) == os.getpgrp()
    except OSError:
        return True  # no controlling terminal to ask: nothing can stop us
    if not foreground:
        print(
            "gpumon: running in the background of this terminal; printing one plain line "
            "per interval instead of the full view.",
            file=sys.stderr,
            flush=True,
        )
    return foreground


def _wide_enough() -> bool:
    """The full view needs MIN_WIDTH columns; a narrower terminal gets the plain lines,
    with a note saying why (a resize below it mid-run shows them inside the view)."""
    try:
        columns = os.get_terminal_size(sys.stdout.fileno()).columns
    except OSError:
        return True
    if columns >= MIN_WIDTH:
        return True
    print(
        f"gpumon: this terminal is {columns} columns wide and the full view needs "
        f"{MIN_WIDTH}; printing one plain line per interval instead.",
        file=sys.stderr,
        flush=True,
    )
    return False


def _silence_stdout() -> None:
    """After a broken pipe: send stdout to /dev/null so later writes and exit are quiet."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def _watch(r: _Run, stop_flag: StopFlag) -> None:
    """The loop with its trace file and live view around it, both closed however it ends."""
    assert r.session is not None
    writer = None
    if r.args.record:
        from gpumon.faces.trace_output import trace_writer

        # Never over an existing trace; gzip for a .gz name (as `gpumon record` does).
        # Settings of its own are named in it: analyze of it judges as this watch does.
        header = r.session.header()
        settings = recorded_settings(r.args.window, r.args.hang_after)
        header = dataclasses.replace(header, extra={**header.extra, **settings})
        writer = trace_writer(r.args.record, header)
    with ExitStack() as files:
        if writer is not None:
            files.enter_context(writer)
        live = None
        try:
            if r.tui:
                live = _open_view(r)
            r.loop(stop_flag.event, writer, live)
        finally:
            r._closer.close()
            r.view_open = False


def _open_view(r: _Run) -> Any:
    from rich.console import Console
    from rich.live import Live

    controls = ViewControls(r.state, r.quit_view, quit_closes_view_only=r.child is not None)
    live = Live(
        LiveView(r.state, controls),
        console=Console(),
        screen=True,
        auto_refresh=True,
        refresh_per_second=4,
        redirect_stdout=False,
        redirect_stderr=False,
    )
    r._closer.stack.callback(live.stop)
    r._closer.stack.enter_context(_LogsToStatus(r.state))
    live.start()
    controls.on_change = live.refresh  # a key's effect is seen at once, not at the next tick
    keys = KeyReader(controls.press).start()
    r._closer.stack.callback(keys.close)
    r.view_open = True
    return live
