"""The deployment files shipped in the package, and how to write them without surprises.

pyproject maps the repository's deploy/ folder onto the package ``gpumon.faces.deploy.files``
(as the dstat plugins are mapped), so a wheel carries the same files a clone has.  Only
what is read from the package lives here; ``plan`` and ``write`` are pure about choices
(which file is new, the same, or different) and leave printing to the command.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath

from gpumon.files import replace_whole

PACKAGE = "gpumon.faces.deploy.files"
# The package's own marker and byte code are not deployment files.
SKIPPED_NAMES = frozenset({"__init__.py", "__pycache__"})


@dataclass(frozen=True, slots=True)
class DeployFile:
    """One file to write: its path under DIR, its bytes and its mode."""

    path: PurePosixPath
    data: bytes

    @property
    def mode(self) -> int:
        # Scripts (a #! line) stay executable; a wheel keeps no other mode worth trusting.
        return 0o755 if self.data.startswith(b"#!") else 0o644


class Action(Enum):
    NEW = "new"
    SAME = "unchanged"
    DIFFERENT = "different"


def shipped() -> list[DeployFile]:
    """Every deployment file in the installed package, sorted by path."""
    root: Traversable
    try:
        root = importlib.resources.files(PACKAGE)
    except ModuleNotFoundError:  # a clone run from its own tree, never installed
        import gpumon

        root = Path(gpumon.__file__).resolve().parent.parent / "deploy"
    return sorted(_walk(root, PurePosixPath()), key=lambda f: f.path)


def _walk(node: Traversable, rel: PurePosixPath) -> Iterator[DeployFile]:
    for child in node.iterdir():
        if child.name in SKIPPED_NAMES or child.name.endswith(".pyc"):
            continue
        if child.is_dir():
            yield from _walk(child, rel / child.name)
        else:
            yield DeployFile(rel / child.name, child.read_bytes())


def plan(files: list[DeployFile], dest: Path) -> list[tuple[DeployFile, Action]]:
    """What writing ``files`` under ``dest`` would do to each."""
    out = []
    for f in files:
        target = dest / f.path
        try:
            current = target.read_bytes()
        except FileNotFoundError:
            out.append((f, Action.NEW))
            continue
        out.append((f, Action.SAME if current == f.data else Action.DIFFERENT))
    return out


def write(f: DeployFile, dest: Path) -> Path:
    """Write one file whole (a temporary file renamed over the target): never half a file."""
    target = dest / f.path
    target.parent.mkdir(parents=True, exist_ok=True)
    replace_whole(target, f.data, mode=f.mode)
    return target
