"""Open any trace or log gpumon reads, recognising its format by content, not by name.

The one place that touches files for the readers: a path or ``-`` (stdin); gzip (by magic
bytes, a stream cut short read up to where it ends); UTF-8 or UTF-16 (by BOM, or by the zero
bytes of BOM-less UTF-16); LF, CRLF or CR.  The first ``HEAD_CHARS`` are read for sniffing,
then the reader takes bounded lines (or chunks) from a ``Source``; every reader returns
``(TraceHeader, Iterator[Snapshot])``.

    with open_trace("run.csv") as trace:
        result = analyze(trace.header, trace)      # iterates lazily
        print(trace.format, trace.warnings)        # warnings are complete after iteration
"""

from __future__ import annotations

import io
import os
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any, cast

from gpumon.errors import GpumonError, TraceFormatError
from gpumon.model import Snapshot, TraceHeader
from gpumon.traces import (
    dcgmi,
    dmon,
    gpustat,
    gpustat_json,
    jsonl,
    jsonrows,
    keyvalue,
    longtable,
    nvsmi_query,
    nvsmi_table,
    oneline,
    prometheus,
    tabular,
    wandb,
)
from gpumon.traces._common import shown
from gpumon.traces.reader import Reader
from gpumon.traces.source import Source
from gpumon.traces.tab_header import is_value

# Every format gpumon reads, in the order content detection asks them: the specific
# before the general (a gpustat --json or W&B file is JSON too; any table is a CSV).
READERS: tuple[Reader, ...] = (
    jsonl.READER,
    prometheus.READER,
    gpustat_json.READER,
    wandb.READER,
    jsonrows.READER,
    dcgmi.READER,
    dmon.READER,
    gpustat.READER,
    nvsmi_query.READER,
    nvsmi_table.READER,
    oneline.READER,
    keyvalue.READER,
    longtable.READER,
    *tabular.READERS,
)
BY_NAME: dict[str, Reader] = {r.name: r for r in READERS}
FORMATS: tuple[str, ...] = tuple(BY_NAME)  # the names ``--format`` accepts
SNIFF_LINE = 4096  # sniffers see at most this much of each head line


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


class _Gunzip(io.RawIOBase):
    """gzip decompression that hands over every byte a stream cut short still holds
    (``gzip.GzipFile`` raises EOFError and loses the last block it was decoding), and
    reads concatenated members; ``cut_short`` says whether the stream ended early.

    At most ``OUT_CHUNK`` decompressed bytes are held at a time, handed over without
    copying what remains: text that compresses a thousandfold (blank lines) costs no more
    memory and no more time per byte than any other."""

    OUT_CHUNK = 1 << 18

    def __init__(self, raw: IO[bytes]):
        self._raw = raw
        self._z = zlib.decompressobj(wbits=47)  # a gzip header, checked
        self._pending = b""
        self._pos = 0  # bytes of _pending already handed over
        self._done = False
        self.cut_short = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while self._pos >= len(self._pending) and not self._done:
            self._fill()
        n = min(len(b), len(self._pending) - self._pos)
        b[:n] = memoryview(self._pending)[self._pos : self._pos + n]
        self._pos += n
        return n

    def _fill(self) -> None:
        """Decompress the next piece: what the last call left of its input, another
        member, or the next read from the file."""
        z = self._z
        data = z.unconsumed_tail
        if not data and z.eof and z.unused_data:  # another member follows
            data = z.unused_data
            self._z = z = zlib.decompressobj(wbits=47)
        elif not data:
            data = self._raw.read(1 << 16)
            if not data:
                self._done = True
                self.cut_short = not z.eof
                return
            if z.eof:  # a member ended exactly where the read did
                self._z = z = zlib.decompressobj(wbits=47)
        try:
            self._pending = z.decompress(data, self.OUT_CHUNK)
        except zlib.error:
            self._pending = b""
            self._done = self.cut_short = True
        self._pos = 0

    def close(self) -> None:
        self._raw.close()
        super().close()


def _open(path: str) -> tuple[IO[str], _Gunzip | None]:
    """The file (``-``: stdin) as text, whatever its compression, encoding and line endings;
    and the guard that knows whether a gzip stream was cut short."""
    raw: IO[bytes] = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    try:
        buffered: io.BufferedReader = (
            raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(cast(Any, raw))
        )
        head = buffered.peek(4)[:4]
        stream = buffered
        guard = None
        if head[:2] == b"\x1f\x8b":
            guard = _Gunzip(buffered)
            stream = io.BufferedReader(guard)
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
        text = io.TextIOWrapper(stream, encoding=encoding, errors="replace", newline=None)
        return text, guard
    except BaseException:
        if raw is not sys.stdin.buffer:
            raw.close()
        raise


def open_text(path: str) -> IO[str]:
    """The file (``-``: stdin) as text, whatever its compression, encoding and line endings."""
    return _open(path)[0]


def sniff(head: list[str]) -> str | None:
    """The format these first lines are in, or None."""
    lines = [ln[:SNIFF_LINE] for ln in head]
    return next((r.name for r in READERS if r.sniff(lines)), None)


def read_source(
    src: Source,
    fmt: str = "auto",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
    columns: Sequence[str] | None = None,
) -> tuple[str, TraceHeader, Iterator[Snapshot]]:
    """Sniff (unless ``fmt`` says) and read a Source: (format, header, snapshots).
    ``columns``: the names of a table's columns (a table without a header line)."""
    fmt, header, snapshots, _line = _read(src, fmt, warnings, interval_s, columns)
    return fmt, header, snapshots


def _read(
    src: Source,
    fmt: str,
    warnings: list[str] | None,
    interval_s: float | None,
    columns: Sequence[str] | None = None,
) -> tuple[str, TraceHeader, Iterator[Snapshot], Callable[[], int | None]]:
    path = src.path
    if columns is not None:
        return _read_named(src, fmt, warnings, interval_s, columns)
    if fmt == "auto":
        found = sniff(src.head)
        if found is None:
            raise _unrecognised(src.head, path)
        fmt = found
        if fmt == "nvidia-smi-table":
            fmt = _skip_preamble(src, fmt, warnings)
    reader = BY_NAME.get(fmt)
    if reader is None:
        raise TraceFormatError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}", path=path)
    if not reader.checks_own_header and not reader.sniff([ln[:SNIFF_LINE] for ln in src.head]):
        found = sniff(src.head)
        hint = f" (it looks like {found})" if found else ""
        first = next((ln for ln in src.head if ln.strip()), "")
        raise TraceFormatError(
            f"not {reader.description}{hint}: it starts {shown(first.strip())!r}; leave out "
            "--format to let gpumon detect the format",
            path=path,
            line=1,
        )
    header, snapshots = reader.read(src, path=path, warnings=warnings, interval_s=interval_s)
    tracked = snapshots
    if warnings is not None and not reader.own_clock:
        snapshots = _clock_checks(snapshots, path, warnings)
    return fmt, header, snapshots, lambda: getattr(tracked, "line", None)


def _read_named(
    src: Source,
    fmt: str,
    warnings: list[str] | None,
    interval_s: float | None,
    columns: Sequence[str],
) -> tuple[str, TraceHeader, Iterator[Snapshot], Callable[[], int | None]]:
    """A table whose columns the user named (``--columns``): read as a table whatever its
    head looks like, since the names say what a header would."""
    tables = {r.name for r in tabular.READERS}
    if fmt != "auto" and fmt not in tables:
        raise TraceFormatError(
            f"--columns names the columns of a table ({', '.join(sorted(tables))}), not of {fmt}",
            path=src.path,
        )
    header, snapshots = tabular.read_named(src, src.path, warnings, interval_s, columns)
    if warnings is not None:
        snapshots = _clock_checks(snapshots, src.path, warnings)
    return header.source, header, snapshots, lambda: None


def _skip_preamble(src: Source, fmt: str, warnings: list[str] | None) -> str:
    """A job script often prints one ``nvidia-smi`` table before it starts its logging loop
    (``nvidia-smi; nvidia-smi --query-gpu=... -l 1``): a lone table followed by a log of
    another format is a preamble, and the log after it is what is read.  Its lines become
    blank, so every line keeps its number.  Returns the format to read."""
    head = src.head
    end = None
    for i, line in enumerate(head):
        text = line.strip()
        if not text or text[0] in "|+" or nvsmi_table.parse_date(text) is not None:
            continue
        end = i
        break
    if end is None:
        return fmt
    banners = sum("NVIDIA-SMI" in ln for ln in head[:end])
    if banners != 1 or any("NVIDIA-SMI" in ln for ln in head[end:]):
        return fmt
    after = sniff(head[end:])
    if after is None or after == fmt:
        return fmt
    src.head = ["\n"] * end + head[end:]
    if warnings is not None:
        warnings.append(
            f"{src.path}: lines 1-{end}: one nvidia-smi table printed before the log; the "
            f"log is read from line {end + 1} ({after})"
        )
    return after


def read_lines(
    lines: Iterable[str],
    fmt: str = "auto",
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
    columns: Sequence[str] | None = None,
) -> tuple[str, TraceHeader, Iterator[Snapshot]]:
    """Parse log lines already in memory or on a stream (tests, pipes); lines keep their
    line endings."""
    return read_source(Source.from_lines(lines, path), fmt, warnings, interval_s, columns)


def open_trace(
    path: str | os.PathLike[str],
    fmt: str = "auto",
    interval_s: float | None = None,
    columns: Sequence[str] | None = None,
) -> OpenedTrace:
    """Open a gpumon trace or a foreign GPU log (``-``: stdin), detecting its format.

    Raises ``TraceFormatError`` (naming the line) for a file no reader recognises or
    whose first lines are malformed; later malformed lines raise it during iteration,
    after every valid snapshot before them.
    """
    name = os.fspath(path)
    label = "<stdin>" if name == "-" else name
    warnings: list[str] = []
    try:
        text, guard = _open(name)
    except OSError as exc:
        raise GpumonError(f"{label}: cannot read ({exc.strerror or exc})") from None
    try:
        src = Source.from_stream(text, label)
        fmt, header, snapshots, line_of_last = _read(src, fmt, warnings, interval_s, columns)
        if guard is not None:
            snapshots = _noting_cut(snapshots, guard, label, warnings)
        return OpenedTrace(
            label, fmt, header, snapshots, warnings, None if name == "-" else text, line_of_last
        )
    except (OSError, EOFError) as exc:
        _close(text, name)
        raise GpumonError(f"{label}: cannot read ({exc})") from None
    except BaseException:
        _close(text, name)
        raise


def _clock_checks(
    snapshots: Iterator[Snapshot], path: str, warnings: list[str]
) -> Iterator[Snapshot]:
    """The snapshots, then a warning when their times cannot order them: every one the
    same (a time column written once, or frozen), or most of them earlier than the one
    before (a log written newest first): durations would read 0:00."""
    ticks = back = 0
    first: float | None = None
    last = float("-inf")
    moved = False
    for snap in snapshots:
        ticks += 1
        t = snap.t_s
        if first is None:
            first = t
        elif t != first:
            moved = True
        if t < last:
            back += 1
        last = t
        yield snap
    if ticks >= 3 and not moved:
        warnings.append(
            f"{path}: all {ticks:,} ticks carry the same time: the log's timestamps cannot "
            "order them, so durations and changes over time mean nothing (was the time "
            "column written once, or frozen?)"
        )
    elif ticks >= 3 and back * 2 >= ticks - 1:
        warnings.append(
            f"{path}: the times run backwards ({back:,} of {ticks - 1:,} steps go back in "
            "time): the log was written newest first? gpumon reads logs oldest first; put "
            "the rows in time order (keep the header, reverse the rest) and analyse again"
        )


def _noting_cut(
    snapshots: Iterator[Snapshot], guard: _Gunzip, path: str, warnings: list[str]
) -> Iterator[Snapshot]:
    """The snapshots, then a warning if the gzip stream they came from was cut short."""
    try:
        yield from snapshots
    finally:
        if guard.cut_short:
            warnings.append(
                f"{path}: the gzip stream ends early (the file was cut short); read what it holds"
            )


def _close(text: IO[str], name: str) -> None:
    if name != "-":
        text.close()


def _unrecognised(head: list[str], path: str) -> TraceFormatError:
    first_no, first = next(((i, ln) for i, ln in enumerate(head, 1) if ln.strip()), (1, ""))
    text = first.strip().lstrip("\ufeff")
    tried = "; ".join(r.description for r in READERS)
    found = f"found {shown(text)!r}" if text else "the file is empty"
    hint = ""
    cells = text.replace(",", " ").replace(";", " ").split()
    if len(cells) >= 2 and all(is_value(c) for c in cells):
        hint = (
            ". Rows of values without a header line: name the columns with --columns "
            "(nvidia-smi's query names, in order)"
        )
    return TraceFormatError(
        f"not a format gpumon reads ({found}). Tried: {tried}{hint}", path=path, line=first_no
    )
