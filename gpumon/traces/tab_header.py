"""Recognising a table-shaped GPU log and its header: which of the first lines names the
columns, and which vocabulary it speaks (nvidia-smi's query names, W&B's system metrics,
anyone's own), or, without a header, whether the values' units say what the columns are.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpumon.traces._common import split_number
from gpumon.traces.columns import Layout, is_nvsmi_name, resolve
from gpumon.traces.tab_guess import bare_rows, guess_layout
from gpumon.traces.table import WS, sniff_delimiter, split_plain, split_quoted
from gpumon.traces.timefmt import line_time, pick

FORMAT = "csv"
NVSMI = "nvidia-smi-csv"
WANDB = "wandb-csv"
PREAMBLE = 8  # lines of text (a banner, a note) allowed before the header

GPU_FIELDS = (
    "util",
    "mem_util",
    "mem_used",
    "mem_total",
    "mem_free",
    "mem_pct",
    "mem_used_bytes",
    "power",
    "power_limit",
    "power_pct",
    "temp",
    "sm_clock",
)


SEPARATOR_CHARS = frozenset("-=*_~+. \t\r\n")


BANNER_FRAME = frozenset("=-*~#")


def between_rows(line: str) -> bool:
    """A line a logger prints between rows that is no row: a separator (``----``), a
    banner framed like one (``=== epoch 3 ===``) or a time alone (``Thu Oct 31 18:47:06
    UTC 2024``, printed by ``date`` before each sample)."""
    s = line.strip()
    if not s:
        return False
    if all(c in SEPARATOR_CHARS for c in s):
        return True
    framed = len(s) > 4 and set(s[:2]) <= BANNER_FRAME and set(s[-2:]) <= BANNER_FRAME
    return framed or line_time(s) is not None


def content(lines: Iterable[str]) -> list[str]:
    """The lines that can be a header or a row: not blank, not a ``#`` comment, not a
    separator or a time line between rows."""
    return [
        ln
        for ln in lines
        if ln.strip() and not ln.lstrip().startswith("#") and not between_rows(ln)
    ]


def cells_of(line: str, delim: str) -> list[str]:
    return split_quoted(line, delim) if '"' in line else split_plain(line.rstrip("\r\n"), delim)


def is_value(cell: str) -> bool:
    """A number (or a no-reading mark) or a time, not a name."""
    s = cell.strip().strip('"').strip()
    if not s:
        return True
    try:
        split_number(s)
    except ValueError:
        return pick([s]) is not None
    return True


def _unnamed(cell: str) -> bool:
    """A header cannot hold it: a value (or an empty quoted cell) not starting with a letter."""
    s = cell.strip().strip('"').strip()
    return is_value(s) and not s[:1].isalpha()


def _is_data(cell: str) -> bool:
    """Only a data row holds it: a value not starting with a letter or a quote."""
    s = cell.strip()
    return bool(s) and not s[:1].isalpha() and is_value(cell)


def is_header(cells: list[str]) -> bool:
    """A row of names: no cell reads as a value, and its names are ours -- every one
    nvidia-smi's, or at least two fields we know, of which a GPU's utilisation or a
    quarter of the names (a trainer's log may add any number of its own columns)."""
    named = [c for c in cells if c.strip()]
    if not named or any(_unnamed(c) for c in named):
        return False
    if all(is_nvsmi_name(c) for c in named):
        return True
    lay = resolve(cells)
    known = sum(1 for col in lay.columns if col.field is not None)
    if known < min(2, len(named)):
        return False
    return known >= 0.25 * len(named) or names_utilisation(lay)


def names_utilisation(lay: Layout) -> bool:
    """Whether a layout has a GPU utilisation column (long, wide or a series of its own)."""
    return "util" in lay.at or bool(lay.series) or any("util" in f for f in lay.wide.values())


def gpu_fields(lay: Layout) -> bool:
    """Whether a layout names anything of a GPU's (not just times and host columns)."""
    return bool(lay.wide or lay.series or any(f in lay.at for f in GPU_FIELDS))


def header_index(rows: list[list[str]]) -> int | None:
    """Which of the first rows is the header (naming GPU fields), after at most PREAMBLE
    lines that are neither a header nor data; None when there is none."""
    for k, cells in enumerate(rows[: PREAMBLE + 1]):
        if is_header(cells):
            return k if gpu_fields(resolve(cells)) else None
        if any(_is_data(c) for c in cells):
            return None  # a data row before any header: not a preamble
    return None


def _nvsmi_stamp(cell: str) -> bool:
    s = cell.strip()
    return len(s) >= 19 and s[4] == "/" and s[7] == "/" and s[10] == " " and s[13] == ":"


def label(cells: list[str], lay: Layout) -> str:
    """The vocabulary a header speaks: nvidia-smi's, W&B's, or anyone's (csv)."""
    if all(is_nvsmi_name(c) for c in cells if c.strip()):
        return NVSMI
    if any(c.label and "system" in c.label.lower() and c.gpu is not None for c in lay.columns):
        return WANDB
    return FORMAT


def sniff_format(head: list[str]) -> str | None:
    """nvidia-smi-csv / wandb-csv / csv when these lines are such a table, else None."""
    lines = content(head)
    if not lines or lines[0].lstrip("\ufeff").lstrip()[:1] in ("{", "["):
        return None  # JSON, not a table
    delim = sniff_delimiter(lines) or ","
    first = cells_of(lines[0].lstrip("\ufeff"), delim)
    at = header_index([cells_of(ln, delim) for ln in lines[: PREAMBLE + 1]])
    if at is not None:
        cells = cells_of(lines[at], delim)
        rows = [cells_of(ln, delim) for ln in lines[at + 1 : at + 20]]
        if not any(len(r) in (len(cells), len(cells) + 1) for r in rows):
            return None  # names, but no rows under them
        return label(cells, resolve(cells))
    if len(lines) >= 2 and delim != WS and guess_layout([cells_of(ln, delim) for ln in lines[:64]]):
        return NVSMI
    if len(first) > 1 and _nvsmi_stamp(first[0]):
        return NVSMI  # nvidia-smi rows without header or units: read() says how to re-run
    if delim != WS and bare_rows([cells_of(ln, delim) for ln in lines[:64]]):
        return NVSMI  # epoch times and bare numbers: read as far as the values allow
    return None
