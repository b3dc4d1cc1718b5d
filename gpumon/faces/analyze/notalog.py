"""What a file given to `gpumon analyze` is when it is no log at all, in one short sentence.

A file that does not exist or is a folder is a bad FILE argument (usage, status 2).  A file
no reader recognises gets the list of every format tried, which helps with a log of some
other tool; for a file that is empty, or not text at all (a screenshot of nvidia-smi, a
W&B run file), that list hides the point, and its first bytes print as garbage.
"""

from __future__ import annotations

import os

from gpumon.errors import UsageError
from gpumon.traces.sniff import open_text

# How much of the file's start tells text from binary.
HEAD_CHARS = 4096
# Characters no text log holds: C0 controls but tab, line feed, vertical tab, form feed,
# carriage return and escape (coloured gpustat output has escapes), and DEL.
_CONTROLS = frozenset(chr(c) for c in (*range(0x09), *range(0x0E, 0x1B), *range(0x1C, 0x20), 0x7F))
# Binary formats people may take for a log, by their first bytes.
MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"PK\x03\x04", "a zip archive (.zip, .xlsx, .docx): unpack it first"),
    (b"\x7fELF", "an executable or a library (ELF)"),
    (b"SQLite format 3\x00", "an SQLite database (Nsight Systems keeps its reports in one)"),
    (b"\xfd7zXZ\x00", "xz-compressed data: unpack it first (xz -d)"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data: unpack it first (zstd -d)"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive: unpack it first"),
)


def check_exists(path: str) -> None:
    """A FILE argument that names no file is a usage error (status 2), said as such."""
    if path == "-":
        return
    if os.path.isdir(path):
        raise UsageError(f"{path} is a folder: name a trace or log file in it.")
    if not os.path.lexists(path):
        raise UsageError(f"{path}: no such file.")


def why_not_a_log(path: str) -> str | None:
    """``path is empty`` or ``path is binary ...`` for a file that is no text log, else None
    (then the readers' own sentence stands).  stdin is not read again: None."""
    if path == "-":
        return None
    try:
        with open_text(path) as text:
            raw = text.buffer.peek(16)[:16]  # type: ignore[attr-defined]  # past any gzip
            head = text.read(HEAD_CHARS)
    except (OSError, EOFError, ValueError):
        return None
    if not head.strip():
        if len(head) == HEAD_CHARS:
            return None  # blank space so far: the readers say what follows it
        return f"{path} is {'blank' if head else 'empty'}: there is nothing to analyse."
    if not _CONTROLS.intersection(head):
        return None
    what = next((name for magic, name in MAGIC if raw.startswith(magic)), None)
    if what is None:
        what = f"binary data (it starts with the bytes {raw[:8].hex(' ')})"
    return f"{path} is {what}, not a log: gpumon analyze reads text logs and gpumon traces."
