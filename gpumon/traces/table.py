"""Rows of a table-shaped log: the delimiter sniffed, cells split, quotes honoured.

One splitter for every table a GPU log comes as: comma, tab or semicolon separated, or
columns aligned with runs of spaces (dmon, dcgmi, a header mixing tabs and spaces).  A line
with a double quote goes through the stdlib ``csv`` module, joined with the lines after it
while a quoted field is still open (a logger that wrote ``"26.11`` newline ``0"``); every
other line is a plain ``str.split``, which is what ``csv`` would make of it, at half the cost.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence

from gpumon.errors import TraceFormatError
from gpumon.traces._common import shown, split_number

WS = " "  # the "delimiter" of whitespace-aligned tables: any run of spaces and tabs
CANDIDATES = (",", "\t", ";", WS)
MAX_RECORD_LINES = 64  # a quoted field may span lines, but not a whole file
MAX_RECORD_CHARS = 1 << 20

csv.field_size_limit(MAX_RECORD_CHARS)


def split_plain(line: str, delim: str) -> list[str]:
    """The cells of a line without quotes (the last keeps its line ending; parsers strip)."""
    return line.split() if delim == WS else line.split(delim)


def split_quoted(text: str, delim: str) -> list[str]:
    """The cells of one record holding quotes, as the ``csv`` module reads them.

    A record whose quotes do not pair up (a line break outside any quoted field) is split
    as plain text: its cells will not fit the header, and the reader names the line.
    """
    try:
        if delim == WS:
            return next(csv.reader([text.strip()], delimiter=" ", skipinitialspace=True), [])
        return next(csv.reader([text], delimiter=delim, skipinitialspace=True), [])
    except csv.Error:
        return split_plain(text.rstrip("\r\n"), delim)


def open_quote(text: str) -> bool:
    """True while a quoted field is still open at the end of ``text``."""
    return text.count('"') % 2 == 1


def _one_value(line: str) -> bool:
    """A line that is one cell: a value with its unit (``85 %``), or a one-word name (the
    header of a one-column log, repeated before every value)."""
    try:
        split_number(line)
    except ValueError:
        name = line.strip().split("[", 1)[0].strip()
        return name[:1].isalpha() and " " not in name
    return True


def _field_counts(lines: Sequence[str], delim: str) -> list[int]:
    out = []
    for line in lines:
        cells = (
            split_quoted(line, delim) if '"' in line else split_plain(line.rstrip("\r\n"), delim)
        )
        while len(cells) > 1 and not cells[-1].strip():
            cells.pop()  # a trailing delimiter
        out.append(len(cells))
    return out


def sniff_delimiter(lines: Sequence[str]) -> str | None:
    """The delimiter of these (non-empty, non-comment) lines, header first; None if none fits.

    A candidate fits when it splits the data lines into one count of at least two cells
    (most of them); ties go to the one the header uses most (a semicolon file with decimal
    commas), then to comma, tab, semicolon, whitespace.  A header mixing tabs and spaces is
    read with whitespace when only that agrees with the data lines.
    """
    sample = [ln for ln in lines if ln.strip()][:40]
    if not sample:
        return None
    header, data = sample[0], sample[1:] or sample
    if all(_one_value(d) for d in data):
        return None  # one column (``85 %`` is a value with its unit, not two cells)
    best: tuple[float, ...] | None = None
    choice = None
    for rank, delim in enumerate(CANDIDATES):
        if delim != WS and delim not in header and not any(delim in d for d in data):
            continue
        counts = _field_counts(data, delim)
        mode = max(set(counts), key=counts.count)
        if mode < 2:
            continue
        agree = counts.count(mode) / len(counts)
        if agree < 0.8:
            continue
        header_count = _field_counts([header], delim)[0]
        header_fits = 1.0 if header_count == mode else 0.0
        uses = header.count(delim) if delim != WS else 0
        score = (agree >= 0.95, header_fits, agree, uses, -rank)
        if best is None or score > best:
            best, choice = score, delim
    return choice


def records(
    numbered: Iterator[tuple[int, str]], delim: str, path: str
) -> Iterator[tuple[int, list[str], str]]:
    """``(line_no, cells, text)`` per record: quoted fields may span lines.

    The generic (slower) iteration, for readers that do not split rows themselves.
    """
    for no, line in numbered:
        if '"' not in line:
            yield no, split_plain(line, delim), line
            continue
        text = line
        if open_quote(text):
            text = join_quoted(text, numbered, no, path)
        yield no, split_quoted(text, delim), text


def join_quoted(text: str, numbered: Iterator[tuple[int, str]], no: int, path: str) -> str:
    """``text`` and the lines after it until the quoted field it opens is closed."""
    parts = [text]
    size = len(text)
    quotes = text.count('"')
    for _ in range(MAX_RECORD_LINES):
        nxt = next(numbered, None)
        if nxt is None:
            break
        parts.append(nxt[1])
        size += len(nxt[1])
        quotes += nxt[1].count('"')
        if size > MAX_RECORD_CHARS:
            break
        if quotes % 2 == 0:
            return "".join(parts)
    raise TraceFormatError(
        f"a quoted field opened here is not closed within {MAX_RECORD_LINES} lines: "
        f"{shown(text)!r}",
        path=path,
        line=no,
    )
