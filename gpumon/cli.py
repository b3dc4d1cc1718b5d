"""Command-line entry point: parses arguments and hands over to one face.

Each face module in ``gpumon.faces`` exposes ``register(subparsers)``, which adds its
sub-command and sets ``func`` to a callable taking the parsed arguments and returning
an exit status.  Errors gpumon knows about become one sentence on stderr, never a
traceback, and so do its warnings (a GPU that fell off the bus): ``gpumon: ...``.  The
exit statuses are listed in docs/cli.md.  Standard output that cannot be written (closed,
a full disk) is one of those errors too, whichever command was printing.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import logging
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

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
            if not isinstance(chosen, str):
                # A command's own argument of that name took it over (watch's `-- CMD`):
                # the command is the one whose function was chosen.
                func = getattr(args, "func", None)
                chosen = next(
                    (n for n, p in action.choices.items() if p.get_default("func") is func), None
                )
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


class StdoutError(GpumonError):
    """Standard output cannot be written: closed (``>&-``) or failing (``>/dev/full``)."""


class _Stdout:
    """``sys.stdout`` as given, turning the first write that fails into a StdoutError.

    Every command prints through it, so the rule holds for all of them: what cannot be
    written is said once and the status is 1, never a traceback, never "Exception
    ignored" at exit, and never a silent success (argparse swallows the failed write of
    ``--help``; the failure is remembered here).  A reader that went away
    (BrokenPipeError) is not an error of ours and passes through as it is.
    """

    def __init__(self, stream: TextIO | None) -> None:
        self.closed_at_start = stream is None
        if stream is None:
            # fd 1 was closed: take it (on /dev/null) so that no file or socket gpumon
            # opens lands on it, where a print or a watched command's output would go.
            stream = _devnull_on_fd1()
        self.stream = stream
        self.failure: OSError | None = None
        self.said = False

    def _fail(self, exc: OSError) -> StdoutError:
        if self.failure is None:
            self.failure = exc
            # What is still buffered would fail again at exit: let it go to /dev/null.
            _devnull_on_fd1()
        self.said = True
        return StdoutError(self.sentence())

    def sentence(self) -> str:
        if self.closed_at_start or (self.failure is not None and self.failure.errno == errno.EBADF):
            return "cannot write to standard output: it is closed."
        why = self.failure.strerror if self.failure is not None else None
        return f"cannot write to standard output: {why or self.failure}."

    def _guard(self, call: Any, *args: Any) -> Any:
        if self.failure is not None:
            return None  # said once; the rest is lost with it
        if self.closed_at_start:
            raise self._fail(OSError(errno.EBADF, "closed"))
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise self._fail(exc) from None

    def write(self, text: str) -> int:
        written = self._guard(self.stream.write, text)
        return len(text) if written is None else int(written)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self.closed_at_start:  # closed: nothing was ever buffered
            self._guard(self.stream.flush)

    def isatty(self) -> bool:
        return not self.closed_at_start and self.stream.isatty()

    def __getattr__(self, name: str) -> Any:  # fileno, buffer, encoding, ...
        return getattr(self.stream, name)


def _devnull_on_fd1() -> TextIO:
    """/dev/null on file descriptor 1, and a text stream writing there."""
    fd = os.open(os.devnull, os.O_WRONLY)
    if fd != 1:
        os.dup2(fd, 1)
        os.close(fd)
    return open(1, "w", closefd=False)  # fd 1 outlives this stream


def main(argv: Sequence[str] | None = None) -> int:
    _warnings_to_stderr()
    given = sys.stdout
    out = _Stdout(given)
    sys.stdout = out
    try:
        status = _run(argv)
        out.flush()  # buffered output fails here, not at exit
    except StdoutError as exc:
        print(f"gpumon: {exc}", file=sys.stderr)
        return exc.exit_status
    except BrokenPipeError:
        # `gpumon analyze x | head`: the reader went away; that is not an error of ours.
        sys.stderr.close()
        return 0
    finally:
        sys.stdout = given
    if out.failure is not None and not out.said:  # a write someone swallowed (argparse)
        print(f"gpumon: {out.sentence()}", file=sys.stderr)
    return status or (1 if out.failure is not None else 0)


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # said with the usage of the command they were given to, not gpumon's
            innermost = _innermost(parser, args)
            innermost.error(unknown_options_message(innermost, extra))
    except SystemExit as done:  # --help, --version, a usage error: argparse's status
        return done.code if isinstance(done.code, int) else 2
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except StdoutError:
        raise
    except GpumonError as exc:
        print(f"gpumon: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        return 130
