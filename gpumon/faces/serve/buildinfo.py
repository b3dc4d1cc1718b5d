"""The labels of ``gpumon_build_info``: what runs, so a dashboard can tell nodes apart.

The revision is the commit gpumon was installed from, where that can be known without
running anything: pip's record of a VCS install (``direct_url.json``), else the git
checkout an editable install runs from (``.git/HEAD`` read as a file), else the file a
build wrote into the package (``gpumon/_revision``: setup.py writes the commit of the
checkout a wheel or an sdist is built from, so a wheel built from a clone, and the image
installed from it, know theirs).  Otherwise it is empty, never a guess.

setup.py loads this file by its path at build time, before gpumon is installed: it
imports nothing of gpumon's at the top.
"""

from __future__ import annotations

import json
import platform
import re
from importlib import metadata
from pathlib import Path

_SHA = re.compile(r"^[0-9a-f]{40}$")
PACKAGE = Path(__file__).resolve().parents[2]  # the gpumon package folder
REVISION_FILE = "_revision"  # in the package: written at build time


def revision() -> str:
    """The commit hash gpumon came from, or "" when it cannot be known."""
    return _from_pip() or checkout_revision(PACKAGE.parent) or baked_revision(PACKAGE) or ""


def baked_revision(package: Path) -> str | None:
    """The commit a build wrote into the package folder ``package``, if it did."""
    try:
        sha = (package / REVISION_FILE).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return sha if _SHA.match(sha) else None


def _from_pip() -> str | None:
    from gpumon import DISTRIBUTION

    try:
        text = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except (metadata.PackageNotFoundError, OSError):
        return None
    try:
        commit = json.loads(text or "{}").get("vcs_info", {}).get("commit_id")
    except (ValueError, AttributeError):
        return None
    return commit if isinstance(commit, str) and _SHA.match(commit) else None


def checkout_revision(root: Path) -> str | None:
    """The commit checked out in the git working tree at ``root`` (a worktree too)."""
    git = root / ".git"
    try:
        if git.is_file():  # a worktree: "gitdir: PATH"
            git = (root / git.read_text().split(":", 1)[1].strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if _SHA.match(head):
            return head
        if not head.startswith("ref: "):
            return None
        ref = head[5:]
        common = git
        if (git / "commondir").is_file():  # a worktree's refs live in the main checkout
            common = (git / (git / "commondir").read_text().strip()).resolve()
        for ref_file in (git / ref, common / ref):
            if ref_file.is_file():
                sha = ref_file.read_text().strip()
                return sha if _SHA.match(sha) else None
        packed = common / "packed-refs"
        for line in packed.read_text().splitlines() if packed.is_file() else ():
            sha, _, name = line.partition(" ")
            if name == ref and _SHA.match(sha):
                return sha
    except (OSError, IndexError, UnicodeDecodeError):
        return None
    return None


def build_labels(
    version: str, nvml_version: str | None, driver_version: str | None
) -> dict[str, str]:
    """The label set of gpumon_build_info (an absent reading is "", as labels must be)."""
    return {
        "version": version,
        "revision": revision(),
        "python_version": platform.python_version(),
        "nvml_version": nvml_version or "",
        "driver_version": driver_version or "",
    }
