"""Open any trace or log gpumon reads, recognising its format by content, not by name.

The one place that touches files for the readers: gzip (by magic bytes), UTF-8 or UTF-16
(by BOM, or by the zero bytes of BOM-less UTF-16), LF or CRLF.  The readers themselves
take lines and return ``(TraceHeader, Iterator[Snapshot])``.

    with open_trace("run.csv") as trace:
        result = analyze(trace.header, trace)      # iterates lazily
        print(trace.format, trace.warnings)        # warnings are complete after iteration
"""

from __future__ import annotations

import gzip
import io
import os
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from typing import IO, Any

from gpumon.errors import GpumonError, TraceFormatError
from gpumon.model import Snapshot, TraceHeader
from gpumon.traces import dmon, nvsmi_csv, nvsmi_table, simple_csv
from gpumon.traces.jsonl import FORMAT_NAME, TraceReader

# Names accepted by ``--format``, in the order content detection tries them.
FORMATS: tuple[str, ...] = ("gpumon", "dmon", "nvidia-smi-csv", "nvidia-smi-table", "csv")
_DESCRIPTIONS = {
    "gpumon": 'gpumon trace (JSON lines with a "format": "gpumon-trace" header)',
    "dmon": "nvidia-smi dmon output ('# gpu ...' and '# Idx ...' header lines)",
    "nvidia-smi-csv": "nvidia-smi --query-gpu CSV (a header of query names, or rows "
    "starting with a 'YYYY/MM/DD hh:mm:ss' timestamp)",
    "nvidia-smi-table": "plain nvidia-smi tables ('| N/A 34C P0 61W / 400W | ...' rows)",
    "csv": "CSV with a time column and a GPU utilisation column named in its header",
}
Reader = Callable[..., tuple[TraceHeader, Iterator[Snapshot]]]
_READERS: dict[str, tuple[Callable[[list[str]], bool], Reader]] = {
    "dmon": (dmon.sniff, dmon.read),
    "nvidia-smi-csv": (nvsmi_csv.sniff, nvsmi_csv.read),
    "nvidia-smi-table": (nvsmi_table.sniff, nvsmi_table.read),
    "csv": (simple_csv.sniff, simple_csv.read),
}
HEAD_LINES = 80  # enough to reach the first GPU row of an nvidia-smi table


class OpenedTrace:
    """A trace being read: ``header`` now, snapshots by iterating (once), ``warnings``
    (skipped lines, assumptions) complete once iteration ends.  Close it, or use ``with``."""

    def __init__(
        self,
        path: str,
        fmt: str,
        header: TraceHeader,
        snapshots: Iterator[Snapshot],
        warnings: list[str],
        stream: IO[Any] | None,
        line_of_last: Callable[[], int | None] = lambda: None,
    ):
        self.line_of_last = line_of_last  # line of the snapshot last yielded, if known
        self.path = path
        self.format = fmt
        self.header = header
        self.warnings = warnings
        self._snapshots = snapshots
        self._stream = stream

    def __iter__(self) -> Iterator[Snapshot]:
        return self._snapshots

    def close(self) -> None:
        close = getattr(self._snapshots, "close", None)
        if close is not None:
            close()
        if self._stream is not None:
            self._stream.close()

    def __enter__(self) -> OpenedTrace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_text(path: str) -> IO[str]:
    """The file as text lines, whatever its compression, encoding and line endings."""
    raw: IO[bytes] = open(path, "rb")  # noqa: SIM115
    try:
        buffered = io.BufferedReader(raw) if not isinstance(raw, io.BufferedReader) else raw
        head = buffered.peek(4)[:4]
        stream: io.BufferedReader = buffered
        if head[:2] == b"\x1f\x8b":
            stream = io.BufferedReader(gzip.GzipFile(fileobj=buffered))  # type: ignore[arg-type]
            head = stream.peek(4)[:4]
        if head[:3] == b"\xef\xbb\xbf":
            encoding = "utf-8-sig"
        elif head[:2] in (b"\xff\xfe", b"\xfe\xff"):
            encoding = "utf-16"
        elif len(head) >= 2 and head[0] != 0 and head[1] == 0:
            encoding = "utf-16-le"
        elif len(head) >= 2 and head[0] == 0 and head[1] != 0:
            encoding = "utf-16-be"
        else:
            encoding = "utf-8"
        # Undecodable bytes become U+FFFD: in a number they make that line malformed (and
        # named); in a GPU name they are harmless.
        return io.TextIOWrapper(stream, encoding=encoding, errors="replace", newline=None)
    except BaseException:
        raw.close()
        raise


def sniff(head: list[str]) -> str | None:
    """The format these first lines are in, or None."""
    first = next((ln for ln in head if ln.strip()), "")
    if first.lstrip("\ufeff").startswith("{") and FORMAT_NAME in first:
        return "gpumon"
    for name, (test, _read) in _READERS.items():
        if test(head):
            return name
    return None


def _head_and_format(lines: Iterator[str], fmt: str, path: str) -> tuple[list[str], str]:
    """The first HEAD_LINES lines, taken from ``lines``, and the format they are in."""
    head = []
    for line in lines:
        head.append(line)
        if len(head) >= HEAD_LINES:
            break
    if fmt == "auto":
        found = sniff(head)
        if found is None:
            raise _unrecognised(head, path)
        fmt = found
    return head, fmt


def read_lines(
    lines: Iterable[str],
    fmt: str = "auto",
    path: str = "<input>",
    warnings: list[str] | None = None,
) -> tuple[str, TraceHeader, Iterator[Snapshot]]:
    """Parse foreign-log lines already in memory or on a stream (tests, pipes).

    Lines keep their line endings.  gpumon traces are read from files only (``open_trace``).
    """
    it = iter(lines)
    head, fmt = _head_and_format(it, fmt, path)
    if fmt == "gpumon":
        raise TraceFormatError("gpumon traces are read with open_trace(path)", path=path)
    if fmt not in _READERS:
        raise TraceFormatError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}", path=path)
    header, snapshots = _READERS[fmt][1](chain(head, it), path=path, warnings=warnings)
    return fmt, header, snapshots


def open_trace(path: str | os.PathLike[str], fmt: str = "auto") -> OpenedTrace:
    """Open a gpumon trace or a foreign GPU log, detecting its format by content.

    Raises ``TraceFormatError`` (naming the line) for a file no reader recognises or
    whose first lines are malformed; later malformed lines raise it during iteration,
    after every valid snapshot before them.
    """
    name = os.fspath(path)
    try:
        text = open_text(name)
    except OSError as exc:
        raise GpumonError(f"{name}: cannot read ({exc.strerror or exc})") from None
    try:
        head, fmt = _head_and_format(text, fmt, name)
        if fmt == "gpumon":
            utf8 = text.encoding == "utf-8"
            text.close()
            if not utf8:
                raise TraceFormatError(
                    "gpumon traces are UTF-8 (plain or gzip): re-encode it first", path=name
                )
            reader = TraceReader(name)
            return OpenedTrace(
                name, fmt, reader.header, iter(reader), reader.warnings, None, lambda: reader.line
            )
        warnings: list[str] = []
        _fmt, header, snapshots = read_lines(chain(head, text), fmt, name, warnings)
        return OpenedTrace(name, fmt, header, snapshots, warnings, text)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        text.close()
        raise GpumonError(f"{name}: cannot read ({exc})") from None
    except BaseException:
        text.close()
        raise


def _unrecognised(head: list[str], path: str) -> TraceFormatError:
    first_no, first = next(((i, ln) for i, ln in enumerate(head, 1) if ln.strip()), (1, ""))
    shown = first.strip().lstrip("\ufeff")
    if len(shown) > 80:
        shown = shown[:77] + "..."
    tried = "; ".join(_DESCRIPTIONS[f] for f in FORMATS)
    found = f"found {shown!r}" if shown else "the file is empty"
    return TraceFormatError(
        f"not a format gpumon reads ({found}). Tried: {tried}", path=path, line=first_no
    )
