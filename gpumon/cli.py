"""Command-line entry point: parses arguments and hands over to one face.

Each face module in ``gpumon.faces`` exposes ``register(subparsers)``, which adds its
sub-command and sets ``func`` to a callable taking the parsed arguments and returning
an exit status.  Errors gpumon knows about become one sentence on stderr, never a
traceback, and so do its warnings (a GPU that fell off the bus): ``gpumon: ...``.  The
exit statuses are listed in docs/cli.md.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from gpumon import __version__
from gpumon.errors import GpumonError

# Order is the order of `gpumon --help`.
FACES: tuple[str, ...] = (
    "watch",
    "record",
    "analyze",
    "report",
    "serve",
    "dstat",
    "demo",
    "deploy",
)


# The name of the stderr handler main() installs for gpumon's warnings.
_STDERR_HANDLER = "gpumon-stderr"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpumon",
        description="Tells you why your GPUs are waiting: starved by the input pipeline, "
        "stalled on peers, or idle.",
    )
    parser.add_argument("--version", action="version", version=f"gpumon {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for face in FACES:
        importlib.import_module(f"gpumon.faces.{face}").register(sub)
    return parser


def _warnings_to_stderr() -> None:
    """gpumon's log warnings as ``gpumon: ...`` lines on stderr, like its errors (Python's
    last-resort handler would print them bare).  On the root logger, so that a face that
    takes gpumon's logger over (the live view shows warnings in its header) still can."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _STDERR_HANDLER]:
        root.removeHandler(old)  # main() run again in one process: today's stderr
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_STDERR_HANDLER)
    handler.setLevel(logging.WARNING)
    handler.addFilter(logging.Filter("gpumon"))
    handler.setFormatter(logging.Formatter("gpumon: %(message)s"))
    root.addHandler(handler)


def main(argv: Sequence[str] | None = None) -> int:
    _warnings_to_stderr()
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except GpumonError as exc:
        print(f"gpumon: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `gpumon analyze x | head`: the reader went away; that is not an error of ours.
        sys.stderr.close()
        return 0
