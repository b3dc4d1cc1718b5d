"""A log's text as readers take it: its head for sniffing, then bounded lines or chunks.

Whatever the file holds, memory stays bounded: the head is at most ``HEAD_CHARS``, and a
line longer than ``MAX_LINE`` is an error naming it the moment the bound is passed (not
after reading a 300 MB "line" into memory).  Formats that are one JSON document (a
Prometheus export) read ``chunks()`` instead and scan them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial as partial_call
from itertools import chain, islice
from typing import IO

from gpumon.errors import TraceFormatError

MAX_LINE = 1 << 20  # characters
HEAD_CHARS = 1 << 16
HEAD_LINES = 400
CHUNK = 1 << 16


def _split_keep(text: str) -> list[str]:
    """Lines of ``text`` with their ``\\n`` (the last one may lack it)."""
    out = text.split("\n")
    last = out.pop()
    lines = [s + "\n" for s in out]
    if last:
        lines.append(last)
    return lines


class Source:
    """One pass over a log's text.  ``head`` (lines, for sniffing) is read at once; then
    either ``lines()`` or ``chunks()``, once, from the start."""

    def __init__(
        self, path: str, head: list[str], rest: Iterator[str] | None, stream: IO[str] | None
    ):
        self.path = path
        self.head = head
        self._rest = rest  # remaining lines (from an iterable)
        self._stream = stream  # or the rest of a text stream
        self._used = False

    @classmethod
    def from_lines(cls, lines: Iterable[str], path: str = "<input>") -> Source:
        it = iter(lines)
        head = list(islice(it, HEAD_LINES))
        if head and head[0].startswith("\ufeff"):
            head[0] = head[0][1:]
        return cls(path, head, it, None)

    @classmethod
    def from_stream(cls, stream: IO[str], path: str) -> Source:
        parts: list[str] = []
        size = 0
        while size < HEAD_CHARS:
            chunk = stream.read(min(8192, HEAD_CHARS - size))
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        head = _split_keep("".join(parts))
        if head and head[0].startswith("\ufeff"):
            head[0] = head[0][1:]
        return cls(path, head, None, stream)

    def _take(self) -> None:
        if self._used:
            raise RuntimeError("a Source is read once")
        self._used = True

    def lines(self, checked: bool = True) -> Iterator[str]:
        """Every line with its line ending; TraceFormatError for one over MAX_LINE.

        ``checked=False``: a C-level iterator, for the hot loops that check lengths
        themselves (a line over the bound arrives as a piece of MAX_LINE + 1 characters
        without a line ending, which such a loop must not take as a row).
        """
        self._take()
        raw = self._raw()
        return self._checked(raw) if checked else raw

    def _raw(self) -> Iterator[str]:
        if self._stream is None:
            return chain(self.head, self._rest or ())
        head = self.head
        partial = ""
        if head and not head[-1].endswith("\n"):
            partial = head.pop()
        readline = self._stream.readline
        first: list[str] = []
        if partial:
            first = [
                partial + readline(MAX_LINE + 1 - len(partial))
                if len(partial) <= MAX_LINE
                else partial
            ]
        return chain(head, first, iter(partial_call(readline, MAX_LINE + 1), ""))

    def _checked(self, raw: Iterator[str]) -> Iterator[str]:
        for no, line in enumerate(raw, 1):
            if len(line) > MAX_LINE:
                raise too_long(self.path, no)
            yield line

    def chunks(self) -> Iterator[str]:
        """The text in pieces (JSON documents that are one long line)."""
        self._take()
        yield "".join(self.head)
        if self._stream is None:
            yield from self._rest or ()
            return
        while True:
            chunk = self._stream.read(CHUNK)
            if not chunk:
                return
            yield chunk


def too_long(path: str, line_no: int) -> TraceFormatError:
    return TraceFormatError(
        f"line longer than {MAX_LINE >> 20} MiB: not a GPU log line (a binary file, or "
        "lines run together?)",
        path=path,
        line=line_no,
    )


def as_source(lines: Iterable[str] | Source, path: str) -> Source:
    return lines if isinstance(lines, Source) else Source.from_lines(lines, path)


def numbered_lines(
    lines: Iterable[str] | Source, path: str, warnings: list[str] | None
) -> tuple[list[str], Iterator[tuple[int, str]]]:
    """What every line reader starts with: its warnings list and ``(line_no, line)``."""
    warns = warnings if warnings is not None else []
    return warns, enumerate(as_source(lines, path).lines(), 1)
