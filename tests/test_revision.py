"""The commit an install runs: a wheel built from a clone knows it (setup.py writes it into
the package from the checkout's .git), so `gpumon serve --version` of an install that is
not editable says it instead of `unknown`; an sdist carries it to the wheels built from
it; a build from sources that are no checkout writes none (no guess).
"""

from __future__ import annotations

import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
from helpers.image import build_distribution, commit_sources, copy_sources
from test_deploy_cmd import install_in_a_venv

from gpumon import __version__
from gpumon.faces.serve.buildinfo import REVISION_FILE

pytestmark = pytest.mark.slow
IN_WHEEL = f"gpumon/{REVISION_FILE}"


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The sources as a clone has them: one commit of a git checkout; (folder, commit)."""
    src = copy_sources(tmp_path_factory.mktemp("clone"))
    sha = commit_sources(src)
    if sha is None:
        pytest.skip("git not installed (apt-get install git)")
    return src, sha


def serve_version(wheel: Path, tmp_path: Path) -> str:
    """`gpumon serve --version`'s first line, from ``wheel`` installed in a venv of its own
    (not editable; run away from any checkout)."""
    venv = tmp_path / "venv"
    _, env = install_in_a_venv(wheel, venv)
    res = subprocess.run(
        [venv / "bin" / "gpumon", "serve", "--version"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()[0]


def test_a_wheel_built_from_a_clone_says_its_commit(
    clone: tuple[Path, str], tmp_path: Path
) -> None:
    src, sha = clone
    wheel = build_distribution("wheel", src, tmp_path)
    assert zipfile.ZipFile(wheel).read(IN_WHEEL).decode().strip() == sha
    assert serve_version(wheel, tmp_path) == (
        f"gpumon serve, version {__version__} (revision: {sha})"
    )
    assert not (src / "gpumon" / REVISION_FILE).exists()  # nothing written into the sources


def test_an_sdist_carries_the_commit_to_its_wheels(clone: tuple[Path, str], tmp_path: Path) -> None:
    src, sha = clone
    sdist = build_distribution("sdist", src, tmp_path)
    with tarfile.open(sdist) as tar:
        # The "data" filter where this Python has it (3.11.4 and later): an sdist's files only.
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp_path / "unpacked", **safe)  # type: ignore[arg-type]
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    assert not (unpacked / ".git").exists()
    assert (unpacked / "gpumon" / REVISION_FILE).read_text().strip() == sha
    out = tmp_path / "from-sdist"
    out.mkdir()
    wheel = build_distribution("wheel", unpacked, out)
    assert zipfile.ZipFile(wheel).read(IN_WHEEL).decode().strip() == sha


def test_sources_that_are_no_checkout_build_no_revision(tmp_path: Path) -> None:
    src = copy_sources(tmp_path / "src")
    wheel = build_distribution("wheel", src, tmp_path)
    assert IN_WHEEL not in zipfile.ZipFile(wheel).namelist()
