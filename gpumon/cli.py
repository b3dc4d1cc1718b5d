"""Command-line entry point: parses arguments and hands over to one face.

Each face module in ``gpumon.faces`` exposes ``register(subparsers)``, which adds its
sub-command and sets ``func`` to a callable taking the parsed arguments and returning
an exit status.  Errors gpumon knows about become one sentence on stderr, never a
traceback, and so do its warnings (a GPU that fell off the bus): ``gpumon: ...``.  The
exit statuses are listed in docs/cli.md.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import sys
from collections.abc import Mapping, Sequence

from gpumon import DISTRIBUTION, __version__
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
# The shells `gpumon completion` writes a script for (shtab's).
COMPLETION_SHELLS = ("bash", "zsh")
# A face's parser may name, in this default, what it calls options other tools call
# otherwise ({"--port": "--web.listen-address :PORT"}): said beside an unknown option.
OPTION_HINTS = "option_hints"


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
    comp = sub.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print gpumon's completion script for SHELL (made by shtab: pip install "
        f"'{DISTRIBUTION}[completion]').  bash: gpumon completion bash > "
        "~/.local/share/bash-completion/completions/gpumon; zsh: gpumon completion zsh > "
        '"${fpath[1]}/_gpumon".',
    )
    comp.add_argument("shell", metavar="SHELL", choices=COMPLETION_SHELLS, help="bash or zsh")
    comp.set_defaults(func=lambda args: _print_completion(parser, args.shell))
    return parser


def _print_completion(parser: argparse.ArgumentParser, shell: str) -> int:
    try:
        import shtab  # type: ignore[import-not-found,unused-ignore]  # the completion extra
    except ImportError:
        raise GpumonError(
            f"shell completion needs shtab: pip install '{DISTRIBUTION}[completion]'."
        ) from None
    sys.stdout.write(shtab.complete(parser, shell=shell))
    return 0


def _innermost(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The (sub-)command parser the parsed arguments ended in: its usage is the one to show."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest or "", None)
            if chosen in action.choices:
                return _innermost(action.choices[chosen], args)
    return parser


def unknown_options_message(parser: argparse.ArgumentParser, extra: Sequence[str]) -> str:
    """argparse's sentence for arguments nobody took, with the option meant where it can be
    guessed: a close spelling (``--jsn``: ``--json``), or what the face names in its hints."""
    hints: Mapping[str, str] = parser.get_default(OPTION_HINTS) or {}
    known = [s for a in parser._actions for s in a.option_strings]
    said = {}
    for arg in extra:
        name = arg.split("=", 1)[0]
        if name in hints:
            said[name] = f"use {hints[name]}"
        elif name.startswith("-") and (close := difflib.get_close_matches(name, known, 1, 0.6)):
            said[name] = f"did you mean {close[0]}?"
    message = f"unrecognized arguments: {' '.join(extra)}"
    if len(said) == 1:
        return f"{message} ({next(iter(said.values()))})"
    return f"{message} ({'; '.join(f'{k}: {v}' for k, v in said.items())})" if said else message


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
    args, extra = parser.parse_known_args(argv)
    if extra:  # said with the usage of the command they were given to, not gpumon's
        innermost = _innermost(parser, args)
        innermost.error(unknown_options_message(innermost, extra))
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
