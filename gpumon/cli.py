"""Command-line entry point: parses arguments and hands over to one face.

Each face module in ``gpumon.faces`` exposes ``register(subparsers)``, which adds its
sub-command and sets ``func`` to a callable taking the parsed arguments and returning
an exit status.  Errors gpumon knows about become one sentence on stderr, never a
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpumon import __version__
from gpumon.errors import GpumonError

# Order is the order of `gpumon --help`.
FACES: tuple[str, ...] = ("watch", "record", "analyze", "serve", "dstat", "demo")


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


def main(argv: Sequence[str] | None = None) -> int:
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
