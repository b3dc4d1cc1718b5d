"""`gpumon deploy DIR`: the deployment files come out of the package, whole and the same as
deploy/ in the repository, from an editable install and from a freshly built wheel."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from helpers.image import build_distribution, copy_sources

from gpumon.cli import main
from gpumon.faces.deploy.shipped import shipped

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"


def repo_deploy_files() -> dict[str, bytes]:
    """deploy/ as a clone has it, less the package marker and byte code."""
    return {
        p.relative_to(DEPLOY).as_posix(): p.read_bytes()
        for p in sorted(DEPLOY.rglob("*"))
        if p.is_file() and p.name != "__init__.py" and "__pycache__" not in p.parts
    }


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_the_package_ships_every_file_of_deploy() -> None:
    assert {f.path.as_posix(): f.data for f in shipped()} == repo_deploy_files()


def test_deploy_writes_the_files_with_their_modes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "out"
    assert main(["deploy", str(dest)]) == 0
    assert tree(dest) == repo_deploy_files()
    assert os.stat(dest / "pcp" / "gpumon_node.py").st_mode & 0o777 == 0o755
    assert os.stat(dest / "systemd" / "gpumon.service").st_mode & 0o777 == 0o644
    out = capsys.readouterr().out
    assert f"wrote {len(repo_deploy_files())} files to {dest}" in out
    assert f"kubectl apply -k {dest}/kubernetes/overlays/kube-prometheus-stack" in out
    # Again: nothing to do, nothing refused.
    assert main(["deploy", str(dest)]) == 0
    assert "wrote 0 files" in capsys.readouterr().out


def test_an_edited_copy_is_kept_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["deploy", str(tmp_path)]) == 0
    unit = tmp_path / "systemd" / "gpumon.service"
    unit.write_text("# mine\n")
    (tmp_path / "gpumon.toml").unlink()
    capsys.readouterr()
    assert main(["deploy", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{unit} differs from gpumon's copy; nothing was written" in err
    assert unit.read_text() == "# mine\n"
    assert not (tmp_path / "gpumon.toml").exists()  # refused whole, not half done
    assert main(["deploy", "--force", str(tmp_path)]) == 0
    assert unit.read_bytes() == (DEPLOY / "systemd" / "gpumon.service").read_bytes()
    assert (tmp_path / "gpumon.toml").exists()


def test_deploy_errors_are_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy"]) == 1
    assert "name the folder to write into" in capsys.readouterr().err
    afile = tmp_path / "file"
    afile.write_text("")
    assert main(["deploy", str(afile)]) == 1
    assert f"{afile} exists and is not a folder." in capsys.readouterr().err
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(0o555)
        assert main(["deploy", str(ro)]) == 1
        assert "cannot write" in capsys.readouterr().err


def test_list_names_every_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "--list"]) == 0
    assert capsys.readouterr().out.split() == sorted(repo_deploy_files())


def test_no_hint_in_gpumon_points_at_a_deploy_folder_pip_users_lack() -> None:
    """Every string gpumon may print (docstrings aside) names `gpumon deploy`, not deploy/."""
    for path in (REPO / "gpumon").rglob("*.py"):
        module = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(module)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(module):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                if id(node) not in docstrings and "deploy/" in text:
                    assert "gpumon deploy" in text, f"{path}:{node.lineno}: {text!r}"


# --------------------------------------------------------------------------- a real wheel
@pytest.fixture(scope="module")
def source_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_sources(tmp_path_factory.mktemp("src"))


@pytest.mark.slow
def test_a_fresh_wheel_install_deploys_the_files(source_copy: Path, tmp_path: Path) -> None:
    wheel = build_distribution("wheel", source_copy, tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert "gpumon/faces/deploy/files/kubernetes/base/daemonset.yaml" in names
    # A venv of its own; the dependencies come from this interpreter's site-packages
    # (offline), gpumon itself only from the wheel (and never from the checkout: cwd).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    pip = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         "--ignore-installed", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    where = subprocess.run(
        [venv / "bin" / "python", "-c", "import gpumon; print(gpumon.__file__)"],
        capture_output=True, text=True, env=env, check=True, cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    assert Path(where).resolve().is_relative_to(venv.resolve()), where
    dest = tmp_path / "deployed"
    res = subprocess.run(
        [venv / "bin" / "gpumon", "deploy", str(dest)],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert tree(dest) == repo_deploy_files()
    assert os.stat(dest / "pcp" / "gpumon_node.py").st_mode & 0o111


@pytest.mark.slow
def test_the_sdist_carries_deploy(source_copy: Path, tmp_path: Path) -> None:
    sdist = build_distribution("sdist", source_copy, tmp_path)
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    missing = {f"deploy/{rel}" for rel in repo_deploy_files()} - names
    assert not missing, sorted(missing)
