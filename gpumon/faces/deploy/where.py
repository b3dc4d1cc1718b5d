"""Which gpumon the deployed files run: the one that wrote them.

The shipped unit and epilog name ``/usr/local/bin/gpumon`` (where ``sudo pip install``
puts it), but a venv or pipx puts it elsewhere, and a unit whose ExecStart names no file
does not start (``systemd-analyze verify`` fails on it).  ``gpumon deploy`` therefore
writes the path of the gpumon command that runs it in place of that default.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from gpumon.faces.deploy.shipped import DeployFile

# The path the shipped files name, and the command's name.
SHIPPED_GPUMON = "/usr/local/bin/gpumon"
COMMAND = "gpumon"
# A path written as is into a systemd ExecStart= and a shell assignment needs no quoting
# in either only if it holds none of the characters they treat specially.
_PLAIN_PATH = re.compile(r"^/[A-Za-z0-9._+@/-]+$")
_SHIPPED = re.compile(re.escape(SHIPPED_GPUMON.encode()) + rb"(?![\w.-])")


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def running_gpumon(argv0: str | None = None) -> Path | None:
    """The absolute path of the ``gpumon`` command running now, or None when there is none
    (``python -m gpumon`` with no script installed beside that Python).

    The script the shell started comes first (a pipx link stays a link: it survives an
    upgrade); else the script pip installed for this Python (its scripts folder, or beside
    the interpreter, as in a venv)."""
    first = Path(sys.argv[0] if argv0 is None else argv0)
    candidates = [first] if first.name == COMMAND else []
    candidates.append(Path(sysconfig.get_path("scripts")) / COMMAND)
    candidates.append(Path(sys.executable).parent / COMMAND)
    for c in candidates:
        if _executable(c):
            return Path(os.path.abspath(c))
    return None


def writable_as_is(path: Path) -> bool:
    """Whether ``path`` can be written into ExecStart= and a shell assignment unquoted."""
    return bool(_PLAIN_PATH.match(str(path)))


def point_at(files: Iterable[DeployFile], gpumon: Path) -> list[DeployFile]:
    """The files, with the shipped gpumon path naming ``gpumon`` where a program reads it
    (the whole path only: not ``/usr/local/bin/gpumon-foo``).  What people read keeps it:
    comment lines and Markdown say what the shipped copies run (a clone's deploy/), and
    would otherwise name the gpumon that happened to write them."""
    new = str(gpumon).encode()
    out = []
    for f in files:
        if f.path.suffix == ".md":
            out.append(f)
            continue
        lines = f.data.splitlines(keepends=True)
        data = b"".join(
            ln if ln.lstrip().startswith(b"#") else _SHIPPED.sub(lambda _: new, ln) for ln in lines
        )
        out.append(replace(f, data=data))
    return out
