"""`gpumon deploy DIR`: the deployment files come out of the package, whole and the same as
deploy/ in the repository (but for the path of the gpumon the unit and the epilog run),
from an editable install and from a freshly built wheel installed in a venv of its own."""

from __future__ import annotations

import ast
import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from helpers.image import build_distribution, copy_sources

from gpumon.cli import main
from gpumon.faces.deploy.shipped import shipped
from gpumon.faces.deploy.where import SHIPPED_GPUMON, point_at, writable_as_is

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


def deployed_for(gpumon: Path) -> dict[str, bytes]:
    """deploy/ as `gpumon deploy` run by ``gpumon`` writes it: that path where a program
    reads /usr/local/bin/gpumon; prose (Markdown, comment lines) and every other byte the
    same."""
    old, new = SHIPPED_GPUMON.encode(), str(gpumon).encode()

    def deployed(name: str, data: bytes) -> bytes:
        if name.endswith(".md"):
            return data
        return b"".join(
            ln if ln.lstrip().startswith(b"#") else ln.replace(old, new)
            for ln in data.splitlines(keepends=True)
        )

    return {k: deployed(k, v) for k, v in repo_deploy_files().items()}


@pytest.fixture
def this_gpumon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `gpumon` command that this in-process run claims to be (sys.argv[0])."""
    exe = tmp_path / "bin" / "gpumon"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(exe), "deploy"])
    return exe


def test_the_package_ships_every_file_of_deploy() -> None:
    assert {f.path.as_posix(): f.data for f in shipped()} == repo_deploy_files()


def test_deploy_writes_the_files_with_their_modes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], this_gpumon: Path
) -> None:
    dest = tmp_path / "out"
    assert main(["deploy", str(dest)]) == 0
    assert tree(dest) == deployed_for(this_gpumon)
    unit = (dest / "systemd" / "gpumon.service").read_text()
    assert f"\nExecStart={this_gpumon} serve --config /etc/gpumon/gpumon.toml\n" in unit
    epilog = (dest / "slurm" / "gpumon-epilog.sh").read_text()
    assert f"GPUMON_BIN=${{GPUMON_BIN:-{this_gpumon}}}" in epilog
    # What people read still says what the shipped copies (a clone's deploy/) run.
    assert str(this_gpumon) not in (dest / "README.md").read_text()
    assert f"runs {SHIPPED_GPUMON} (`command -v gpumon`)" in unit
    assert f"(default {SHIPPED_GPUMON}: `gpumon deploy` writes its own)" in epilog
    assert os.stat(dest / "pcp" / "gpumon_node.py").st_mode & 0o777 == 0o755
    assert os.stat(dest / "systemd" / "gpumon.service").st_mode & 0o777 == 0o644
    out = capsys.readouterr().out
    assert f"wrote {len(repo_deploy_files())} files to {dest}" in out
    assert f"the unit and the epilog run {this_gpumon} (the gpumon that wrote them)" in out
    assert f"kubectl apply -k {dest}/kubernetes/overlays/kube-prometheus-stack" in out
    # Again: nothing to do, nothing refused.
    assert main(["deploy", str(dest)]) == 0
    assert "wrote 0 files" in capsys.readouterr().out


def test_an_edited_copy_is_kept_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], this_gpumon: Path
) -> None:
    assert main(["deploy", str(tmp_path)]) == 0
    unit = tmp_path / "systemd" / "gpumon.service"
    unit.write_text("# mine\n")
    (tmp_path / "gpumon.toml").unlink()
    capsys.readouterr()
    assert main(["deploy", str(tmp_path)]) == 2  # an output file that exists: usage
    err = capsys.readouterr().err
    assert f"{unit} differs from gpumon's copy; nothing was written" in err
    assert unit.read_text() == "# mine\n"
    assert not (tmp_path / "gpumon.toml").exists()  # refused whole, not half done
    assert main(["deploy", "--force", str(tmp_path)]) == 0
    assert unit.read_bytes() == deployed_for(this_gpumon)["systemd/gpumon.service"]
    assert (tmp_path / "gpumon.toml").exists()


def test_deploy_errors_are_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Usage (no DIR, DIR a file) is 2 as docs/cli.md says; a folder it cannot write, 1."""
    assert main(["deploy"]) == 2
    assert "name the folder to write into" in capsys.readouterr().err
    afile = tmp_path / "file"
    afile.write_text("")
    assert main(["deploy", str(afile)]) == 2
    assert f"{afile} exists and is not a folder." in capsys.readouterr().err
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(0o555)
        assert main(["deploy", str(ro)]) == 1
        assert "cannot write" in capsys.readouterr().err


def test_only_the_whole_shipped_path_is_rewritten() -> None:
    from gpumon.faces.deploy.shipped import DeployFile

    f = DeployFile(
        Path("x.sh"),  # type: ignore[arg-type]
        b"A=/usr/local/bin/gpumon\nB=/usr/local/bin/gpumon-old\nC=/usr/local/bin/gpumon.sh\n"
        b"ExecStart=/usr/local/bin/gpumon serve\n",
    )
    (out,) = point_at([f], Path("/opt/venv/bin/gpumon"))
    assert out.data == (
        b"A=/opt/venv/bin/gpumon\nB=/usr/local/bin/gpumon-old\nC=/usr/local/bin/gpumon.sh\n"
        b"ExecStart=/opt/venv/bin/gpumon serve\n"
    )
    assert writable_as_is(Path("/home/ann/.local/bin/gpumon"))
    assert not writable_as_is(Path("/home/ann/my venv/bin/gpumon"))
    assert not writable_as_is(Path('/opt/a"b/gpumon'))


def test_a_path_that_needs_quoting_keeps_the_shipped_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    exe = tmp_path / "my venv" / "gpumon"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(exe), "deploy"])
    assert main(["deploy", str(tmp_path / "out")]) == 0
    assert tree(tmp_path / "out") == repo_deploy_files()
    assert f"run {SHIPPED_GPUMON}, not {exe}" in capsys.readouterr().out


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


def venv_with_these_dependencies(venv: Path) -> Path:
    """A venv of its own whose dependencies are this interpreter's (offline): its
    site-packages folders, named in a .pth file.  Not ``--system-site-packages``: from a
    venv that exposes the *base* interpreter's packages, not this venv's.  Plain folders in
    a .pth are added without their own .pth files, so an editable gpumon there stays out."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    ours = [*site.getsitepackages(), site.getusersitepackages()]
    (Path(purelib) / "_deps_of_the_test_runner.pth").write_text("\n".join(ours) + "\n")
    return py


def install_in_a_venv(wheel: Path, venv: Path) -> tuple[Path, dict[str, str]]:
    """``wheel`` installed (not editable) in a venv of its own with this interpreter's
    dependencies: (its python, an environment that reaches no other gpumon)."""
    py = venv_with_these_dependencies(venv)
    pip = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return py, env


@pytest.mark.slow
def test_a_fresh_wheel_install_deploys_the_files(source_copy: Path, tmp_path: Path) -> None:
    wheel = build_distribution("wheel", source_copy, tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert "gpumon/faces/deploy/files/kubernetes/base/daemonset.yaml" in names
    assert wheel.name.startswith("gpumon_why-"), wheel.name  # "gpumon" on PyPI is another
    # gpumon itself only from the wheel (and never from the checkout: cwd).
    venv = tmp_path / "venv"
    py, env = install_in_a_venv(wheel, venv)
    where = subprocess.run(
        [py, "-c", "import gpumon, rich; print(gpumon.__file__)"],
        capture_output=True, text=True, env=env, check=True, cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    assert Path(where).resolve().is_relative_to(venv.resolve()), where
    dest = tmp_path / "deployed"
    gpumon = venv / "bin" / "gpumon"
    res = subprocess.run(
        [gpumon, "deploy", str(dest)],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert f"the unit and the epilog run {gpumon} (the gpumon that wrote them)" in res.stdout
    assert tree(dest) == deployed_for(gpumon)
    assert os.stat(dest / "pcp" / "gpumon_node.py").st_mode & 0o111
    # The unit it wrote verifies as it is: its ExecStart names a gpumon that exists.
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (apt-get install systemd)")
    check = subprocess.run(
        [analyze, "verify", str(dest / "systemd" / "gpumon.service")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    ours = [ln for ln in (check.stdout + check.stderr).splitlines() if "gpumon.service" in ln]
    assert check.returncode == 0 and not ours, check.stdout + check.stderr


@pytest.mark.slow
def test_the_sdist_carries_deploy(source_copy: Path, tmp_path: Path) -> None:
    sdist = build_distribution("sdist", source_copy, tmp_path)
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    missing = {f"deploy/{rel}" for rel in repo_deploy_files()} - names
    assert not missing, sorted(missing)


def test_a_clone_never_installed_runs_from_its_own_tree(tmp_path: Path) -> None:
    """``PYTHONPATH=clone python -m gpumon``: the package mappings (deploy/, dstat_plugins/)
    exist only once installed, so a clone run from its tree reads the folders themselves."""
    clone = tmp_path / "clone"
    for name in ("gpumon", "deploy", "dstat_plugins"):
        shutil.copytree(REPO / name, clone / name, ignore=shutil.ignore_patterns("__pycache__"))
    # No installed gpumon answers for the clone: an editable install's finder is dropped.
    prelude = (
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path"
        " if not getattr(f, '__module__', '').startswith('__editable__')];"
        f" sys.path.insert(0, {str(clone)!r});"
    )
    env = {**os.environ, "HOME": str(tmp_path)}

    def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", prelude + code, *args], capture_output=True, text=True, env=env
        )

    listed = python("from gpumon.cli import main; sys.exit(main(sys.argv[1:]))", "deploy", "--list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == sorted(repo_deploy_files())
    where = python("from gpumon.faces.dstat.install import PLUGIN_DIR; print(PLUGIN_DIR)")
    assert where.stdout.strip() == str(clone / "dstat_plugins"), where.stderr
