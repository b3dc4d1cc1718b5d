"""JSON values from a stream of text chunks, one at a time, in bounded memory.

For logs that are JSON documents rather than JSON lines: ``gpustat --json`` in a loop
writes pretty-printed objects one after another; a Prometheus export is one document,
often a single line of many megabytes.  ``Buffer`` holds only the text not yet decoded;
a value that is not complete yet is retried after reading as much text again as the
buffer holds (so the work stays linear), up to ``max_chars`` for one value.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from gpumon.errors import TraceFormatError

MAX_VALUE = 64 << 20
_WS = " \t\r\n"


class Buffer:
    """Text read so far from ``chunks``, with the position of the next unread character."""

    def __init__(self, chunks: Iterator[str], path: str, max_chars: int = MAX_VALUE):
        self._chunks = chunks
        self.path = path
        self.max = max_chars
        self.buf = ""
        self.pos = 0
        self.line = 1  # line of self.pos
        self.eof = False
        self._decoder = json.JSONDecoder()

    def _more(self, want: int) -> bool:
        """Read at least ``want`` more characters (or to the end); False at the end."""
        if self.eof:
            return False
        self.buf = self.buf[self.pos :]
        self.pos = 0
        parts = [self.buf]
        got = 0
        while got < want:
            chunk = next(self._chunks, None)
            if chunk is None:
                self.eof = True
                break
            parts.append(chunk)
            got += len(chunk)
        self.buf = "".join(parts)
        return got > 0

    def _advance(self, end: int) -> None:
        self.line += self.buf.count("\n", self.pos, end)
        self.pos = end

    def skip(self, chars: str = _WS) -> str | None:
        """Skip ``chars``; the next character, or None at the end."""
        while True:
            buf, pos, n = self.buf, self.pos, len(self.buf)
            while pos < n and buf[pos] in chars:
                pos += 1
            self._advance(pos)
            if pos < n:
                return buf[pos]
            if not self._more(1 << 16):
                return None

    def take(self, c: str) -> None:
        self._advance(self.pos + len(c))

    def find(self, needle: str) -> bool:
        """Move to just after the next ``needle``; False (at the end) when there is none."""
        while True:
            at = self.buf.find(needle, self.pos)
            if at >= 0:
                self._advance(at + len(needle))
                return True
            keep = max(self.pos, len(self.buf) - len(needle))
            self._advance(keep)
            if not self._more(1 << 16):
                return False

    def value(self) -> Any:
        """Decode the JSON value at the current position (reading more as needed).

        A value that does not decode may only be incomplete: more text is read (as much
        again as is pending) until it decodes, the stream ends, or it passes ``max``.
        At the end of the stream a value that stops short raises EOFError (a log cut
        short); any other failure is a TraceFormatError naming the line.
        """
        while True:
            try:
                obj, end = self._decoder.raw_decode(self.buf, self.pos)
            except RecursionError:
                raise self.error("JSON nested too deeply to be a GPU log") from None
            except json.JSONDecodeError as exc:
                pending = len(self.buf) - self.pos
                if pending > self.max:
                    raise self.error(
                        f"a JSON value longer than {self.max >> 20} MiB, or malformed ({exc.msg})"
                    ) from None
                if self._more(max(pending, 1 << 16)):
                    continue
                if (
                    exc.msg.startswith(("Unterminated", "Expecting"))
                    and exc.pos >= len(self.buf.rstrip()) - 1
                ) or exc.msg.startswith("Unterminated string"):
                    raise EOFError("the JSON value is cut short") from None
                raise self.error(f"invalid JSON ({exc.msg})", exc.pos) from None
            except ValueError as exc:  # an integer of more than 4300 digits
                raise self.error(f"invalid JSON ({exc})") from None
            self._advance(end)
            return obj

    def error(self, why: str, at: int | None = None) -> TraceFormatError:
        line = self.line + (self.buf.count("\n", self.pos, at) if at is not None else 0)
        return TraceFormatError(why, path=self.path, line=line)


def values(buf: Buffer) -> Iterator[tuple[Any, int]]:
    """Each top-level JSON value in the stream and the line it starts on; a value cut
    short at the end raises EOFError (the caller decides whether that is only a warning)."""
    while True:
        c = buf.skip()
        if c is None:
            return
        line = buf.line
        yield buf.value(), line
