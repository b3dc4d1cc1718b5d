"""`gpumon record`: write everything sampled to a trace for `gpumon analyze` later.

Each tick is flushed as it is written, so a crash loses at most the last interval; the
recording ends when the duration is over, on Ctrl-C/SIGTERM, or when the watched pid
exits.  A write that fails (full disk) stops the recording with a clear message and
leaves what was written intact.  An existing output file is never overwritten without
``--force``; a ``.gz`` name is written gzip-compressed.
"""

from __future__ import annotations

import argparse
import sys
import threading

from gpumon.engine import LiveOptions, Session, StackOptions
from gpumon.errors import UsageError
from gpumon.faces.common import interval, positive_float, write_tick
from gpumon.faces.trace_output import trace_writer
from gpumon.loop import ExitWatch, StopFlag, paced


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "record",
        help="record GPU, host and process-tree samples to a trace file",
        description="Record every GPU's driver utilisation samples, memory, power and "
        "processes, host CPU and (with --pid) the process tree, as JSON lines.",
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="trace file to write (JSON lines; gzip-compressed when FILE ends in .gz); an "
        "existing FILE is refused unless --force",
    )
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    p.add_argument(
        "--interval",
        type=interval,
        default=1.0,
        metavar="S",
        help="seconds between ticks (default 1; the driver's sub-second samples "
        "between ticks are kept whatever the interval)",
    )
    p.add_argument("--duration", type=positive_float, metavar="S", help="stop after S seconds")
    p.add_argument(
        "--pid", type=int, help="also record this process and its descendants; stop when it exits"
    )
    p.add_argument(
        "--stacks",
        action="store_true",
        help="with --pid: also record the job's Python stacks while a GPU waits (py-spy, "
        "gpumon-why[stacks]); `gpumon analyze` names what they show",
    )
    p.add_argument(
        "--stacks-every",
        type=positive_float,
        default=10.0,
        metavar="S",
        help="seconds per stack window (default 10)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    stacks = None
    if args.stacks:
        if args.pid is None:
            raise UsageError("--stacks reads the stacks of a job: give its --pid too.")
        stacks = StackOptions(every_s=args.stacks_every)
        Session.check_stacks(stacks)
    # Judged only to know when a GPU waits, where the stacks are read.
    session = Session.live(
        LiveOptions(pid=args.pid, interval_s=args.interval), judge=stacks is not None, stacks=stacks
    )
    stop = StopFlag().install()
    # The pid's exit (or a stop) ends the wait between ticks at once.
    wake = threading.Event()
    stop.wakes.append(wake)
    exits = ExitWatch(args.pid, wake) if args.pid is not None else None
    ticks = 0
    try:
        header = session.header()
        with trace_writer(args.output, header, force=args.force) as writer:
            print(_starting(args, len(header.gpus)), file=sys.stderr, flush=True)
            for _ in paced(args.interval, stop.event, duration_s=args.duration, wake=wake):
                tick = session.tick()
                write_tick(writer, tick.snapshot, args.output)
                ticks += 1
                tree = tick.snapshot.tree
                if args.pid is not None and tree is not None and not tree.root_alive:
                    print(f"gpumon: process {args.pid} exited; recording stopped.", file=sys.stderr)
                    break
            else:
                # One last tick so the driver samples since the previous one are kept.
                write_tick(writer, session.tick().snapshot, args.output)
                ticks += 1
    finally:
        if exits is not None:
            exits.close()
        stop.restore()
        session.close()
    print(f"gpumon: wrote {ticks} ticks to {args.output}", file=sys.stderr)
    return 0


def _starting(args: argparse.Namespace, gpus: int) -> str:
    """What is recorded, where, and how it ends: said before the first tick, since nothing
    else is printed until the recording stops."""
    what = f"{gpus} GPU(s), the host"
    if args.pid is not None:
        what += f" and process {args.pid} with its descendants"
    until = [f"after {args.duration:g} s"] if args.duration is not None else []
    if args.pid is not None:
        until.append(f"when process {args.pid} exits")
    until.append("on Ctrl-C")
    return (
        f"gpumon: recording {what} to {args.output} every {args.interval:g} s; it stops "
        f"{', '.join(until[:-1]) + ' or ' if len(until) > 1 else ''}{until[-1]}, keeping "
        "every tick written."
    )
