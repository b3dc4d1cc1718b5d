"""Text for people, wrapped to their terminal: the run summaries and analyze's report.

A terminal's width comes from ``COLUMNS`` or the terminal itself; output that goes to a
file or a pipe keeps ``DEFAULT_WIDTH``, so a log or a CI page reads the same everywhere.
Lines break between words (never inside one that fits), and a list of figures breaks
between its items, so "duty 41%" never ends up split over two lines.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence

DEFAULT_WIDTH = 100
# Below this the indents would leave too little room to read; a narrower terminal gets
# lines this long (and wraps them itself).
MIN_WIDTH = 40


def terminal_width(default: int = DEFAULT_WIDTH) -> int:
    """The width to wrap to: ``COLUMNS``, else stdout's terminal, else ``default``."""
    columns = shutil.get_terminal_size((default, 24)).columns
    return max(MIN_WIDTH, columns if columns > 0 else default)


def wrap(text: str, width: int, first: str = "", rest: str | None = None) -> list[str]:
    """``text`` in lines of at most ``width``: the first after ``first``, the others
    after ``rest`` (``first``'s width in spaces by default)."""
    rest = " " * len(first) if rest is None else rest
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=first,
        subsequent_indent=rest,
        break_on_hyphens=False,
    ) or [first.rstrip()]


def pack(
    items: Sequence[str], width: int, first: str = "", rest: str | None = None, sep: str = "  "
) -> list[str]:
    """Items joined by ``sep`` in lines of at most ``width``, broken between items; an
    item too long for a line of its own is wrapped by words."""
    rest = " " * len(first) if rest is None else rest
    lines: list[str] = []
    line = first
    fresh = True  # nothing on the line yet but its indent
    for item in items:
        joined = item if fresh else sep + item
        if len(line) + len(joined) <= width:
            line += joined
            fresh = False
            continue
        if not fresh:
            lines.append(line)
            line, fresh = rest, True
        if len(line) + len(item) <= width:
            line += item
            fresh = False
            continue
        *done, line = wrap(item, width, line, rest)
        lines += done
        fresh = False
    lines.append(line.rstrip() if fresh else line)
    return lines
