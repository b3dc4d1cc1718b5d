"""The one build step pyproject.toml cannot say: the commit a distribution is built from.

A wheel built from a clone gets the checkout's commit in ``gpumon/_revision``, so that
an install that is not editable (and the container image made from that wheel) says
which commit it runs (``gpumon serve --version``, ``gpumon_build_info``), where it would
say ``unknown``.  An sdist carries the same file, so a wheel built from the sdist knows
it too.  The commit is read from ``.git`` as files (gpumon/faces/serve/buildinfo.py, the
module that reads it back at run time): no git is needed on the build host.  Nothing is
written into the source tree; without a checkout (nor an sdist's file), nothing is
written at all.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent


def _buildinfo() -> ModuleType:
    """gpumon/faces/serve/buildinfo.py, loaded by its path (gpumon is not installed yet)."""
    path = ROOT / "gpumon" / "faces" / "serve" / "buildinfo.py"
    spec = importlib.util.spec_from_file_location("_gpumon_buildinfo", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_revision() -> str | None:
    """The commit of the checkout being built, else the one an sdist carries."""
    info = _buildinfo()
    return info.checkout_revision(ROOT) or info.baked_revision(ROOT / "gpumon")


def _write_revision(package_dir: Path) -> None:
    sha = build_revision()
    if sha is not None:
        target = package_dir / _buildinfo().REVISION_FILE
        if target.exists():  # a hard link into the source tree (sdist's release tree)
            os.unlink(target)
        target.write_text(sha + "\n", encoding="ascii")


class BuildPyWithRevision(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:  # an editable install reads its checkout's .git
            _write_revision(Path(self.build_lib) / "gpumon")


class SdistWithRevision(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        _write_revision(Path(base_dir) / "gpumon")


setup(cmdclass={"build_py": BuildPyWithRevision, "sdist": SdistWithRevision})
