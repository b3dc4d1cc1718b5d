"""Other people's text, made safe to show on a terminal.

A watched process's command line and name, a kept report, a server's error message: any
of them may hold control characters (``ESC]0;...BEL`` retitles the terminal, ``ESC[2J``
clears it, a bidi override reorders what follows).  Every face shows such text through
``printable``, which writes each control or format character as its Python escape
(``\\x1b``, ``\\u202e``), so what is shown is what is there, and nothing is obeyed.
"""

from __future__ import annotations


def printable(text: str, limit: int | None = None, *, keep_newlines: bool = False) -> str:
    """``text`` with every non-printable character escaped, and at most ``limit``
    characters (cut with "…").  ``keep_newlines``: line breaks stay (a report of many
    lines); every other control character is still escaped."""
    if text.isprintable():
        out = text
    else:
        out = "".join(
            c
            if c.isprintable() or (keep_newlines and c == "\n")
            else c.encode("unicode_escape", "backslashreplace").decode("ascii")
            for c in text
        )
    if limit is not None and len(out) > limit:
        return out[: limit - 1] + "…"
    return out
