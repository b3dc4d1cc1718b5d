"""`gpumon dstat install | uninstall`: where the plugin goes, what it is wired to, and the
refusals where dstat cannot load it (Python >= 3.12 has no `imp`; gpumon needs 3.11)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpumon.cli import main
from gpumon.faces.deploy.shipped import shipped
from gpumon.faces.dstat import install as inst

REPO = Path(__file__).resolve().parent.parent
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"

# The installer's default targets are ~/.dstat and ~/.dool: no test may read or write the
# real ones (a plugin left there by an earlier install would change what later tests see).
pytestmark = pytest.mark.usefixtures("tmp_home")


def fake_python(tmp: Path, version: tuple[int, int, int], imp: bool) -> Path:
    """An 'interpreter' that answers the installer's probe like a given Python would."""
    py = tmp / f"python{version[0]}.{version[1]}"
    answer = {"version": list(version), "executable": str(py), "imp": imp}
    if version >= (3, 11):
        answer |= {"gpumon": None, "psutil": None}
    py.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
    py.chmod(0o755)
    return py


def program(tmp: Path, shebang: str, name: str = "dstat") -> Path:
    p = tmp / name
    p.write_text(f"#!{shebang}\nprint('hi')\n")
    p.chmod(0o755)
    return p


def test_install_writes_the_plugin_wired_to_this_gpumon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], classic_dstat: Path
) -> None:
    dest = tmp_path / "plugins"
    assert main(["dstat", "install", "--dir", str(dest)]) == 0
    text = (dest / "dstat_gpu.py").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("GPUMON_SITE_DIRS = "))
    dirs = json.loads(line.split("=", 1)[1].split("#", 1)[0])
    assert dirs == inst.site_dirs()
    # The folder that holds this gpumon package is among them (editable or not).
    assert any(Path(d, "gpumon", "__init__.py").exists() for d in dirs) or any(
        Path(d).glob("*gpumon*.pth") for d in dirs
    )
    out = capsys.readouterr().out
    assert f"Installed {dest / 'dstat_gpu.py'}" in out
    assert "dstat runs Python 3." in out
    assert oct((dest / "dstat_gpu.py").stat().st_mode & 0o777) == "0o644"


def test_installed_plugin_imports_gpumon_under_the_system_python(tmp_path: Path) -> None:
    """What dstat will do: /usr/bin/python3, no PYTHONPATH, only the written site dirs."""
    system = Path("/usr/bin/python3")
    if not system.exists():
        pytest.skip("no /usr/bin/python3")
    dest = tmp_path / "p"
    dstat = program(tmp_path, str(system))
    assert main(["dstat", "install", "--dir", str(dest), "--program", str(dstat), "--force"]) == 0
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run(
        [str(system), "-c", inst.PROBE, str(dest / "dstat_gpu.py"), "dstat"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    out = json.loads(proc.stdout)
    if tuple(out["version"][:2]) < (3, 11):
        pytest.skip("system Python older than 3.11")
    assert out["gpumon"] is None, out
    assert Path(out["gpumon_file"]).resolve().parent == Path(inst.gpumon.__file__).resolve().parent


def test_dool_install_goes_to_home_dool(tmp_path: Path, tmp_home: Path) -> None:
    py = program(tmp_path, sys.executable, "dool")
    assert main(["dstat", "install", "--dool", "--program", str(py)]) == 0
    text = (tmp_home / ".dool" / "dool_gpu.py").read_text()
    assert "dool_plugin = _gpumon_plugin_class(dool," in text
    assert main(["dstat", "uninstall", "--dool"]) == 0
    assert not (tmp_home / ".dool" / "dool_gpu.py").exists()


def test_default_dstat_target_is_home_dstat(tmp_path: Path, tmp_home: Path) -> None:
    dstat = program(tmp_path, str(fake_python(tmp_path, (3, 11, 2), imp=True)))
    assert main(["dstat", "install", "--program", str(dstat)]) == 0
    assert (tmp_home / ".dstat" / "dstat_gpu.py").exists()


def test_refuses_a_dstat_on_python_312_without_imp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    py = fake_python(tmp_path, (3, 12, 3), imp=False)
    dstat = program(tmp_path, f"/usr/bin/env {py}")
    dest = tmp_path / "plugins"
    assert main(["dstat", "install", "--dir", str(dest), "--program", str(dstat)]) == 1
    err = capsys.readouterr().err
    assert "Python 3.12.3" in err and "`imp` module" in err and "dool" in err
    assert "Nothing was installed" in err
    assert not (dest / "dstat_gpu.py").exists()


def test_refuses_for_a_real_python_312_when_there_is_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    candidates = sorted(PYENV.glob("3.1[2-9]*/bin/python3")) + [
        Path(p) for p in (shutil.which("python3.12"), shutil.which("python3.13")) if p
    ]
    if not candidates:
        pytest.skip("no Python >= 3.12 on this machine")
    dstat = program(tmp_path, str(candidates[0]))
    assert main(["dstat", "install", "--dir", str(tmp_path / "p"), "--program", str(dstat)]) == 1
    assert "`imp` module" in capsys.readouterr().err


def test_refuses_a_python_older_than_gpumon_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    py = fake_python(tmp_path, (3, 10, 12), imp=True)
    dstat = program(tmp_path, str(py))
    assert main(["dstat", "install", "--dir", str(tmp_path / "p"), "--program", str(dstat)]) == 1
    err = capsys.readouterr().err
    assert "Python 3.10.12" in err and "needs Python 3.11" in err


def test_force_installs_anyway(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    py = fake_python(tmp_path, (3, 12, 3), imp=False)
    dstat = program(tmp_path, str(py))
    dest = tmp_path / "p"
    args = ["dstat", "install", "--dir", str(dest), "--program", str(dstat), "--force"]
    assert main(args) == 0
    assert (dest / "dstat_gpu.py").exists()
    assert "warning:" in capsys.readouterr().err


def test_refuses_when_the_interpreter_cannot_import_gpumon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real interpreter and a plugin wired to nowhere: the check catches it."""
    monkeypatch.setattr(inst, "site_dirs", lambda: [str(tmp_path / "nowhere")])
    system = Path("/usr/bin/python3")
    if not system.exists():
        pytest.skip("no /usr/bin/python3")
    dstat = program(tmp_path, str(system))
    rc = main(["dstat", "install", "--dir", str(tmp_path / "p"), "--program", str(dstat)])
    err = capsys.readouterr().err
    if "needs Python 3.11" in err or "`imp` module" in err:
        pytest.skip("system Python cannot run gpumon at all")
    assert rc == 1
    assert "cannot import gpumon" in err
    assert not (tmp_path / "p" / "dstat_gpu.py").exists()


def test_psutil_that_does_not_load_is_reported(tmp_path: Path) -> None:
    p = inst.Probe(
        "/usr/bin/python3", (3, 11, 2), True, None, "ImportError: undefined symbol", None
    )
    assert inst.problems(inst.targets()["dstat"], Path("/usr/bin/dstat"), p) == []
    (note,) = inst.warnings_for(p)
    assert "psutil" in note and "ABI" in note


@pytest.mark.parametrize(
    ("shebang", "expected"),
    [
        ("/usr/bin/python3", ["/usr/bin/python3"]),
        (" /usr/bin/python3 -s", ["/usr/bin/python3", "-s"]),
    ],
)
def test_interpreter_of_reads_the_shebang(
    tmp_path: Path, shebang: str, expected: list[str]
) -> None:
    assert inst.interpreter_of(program(tmp_path, shebang)) == expected


def test_interpreter_of_resolves_env(tmp_path: Path) -> None:
    py = fake_python(tmp_path, (3, 11, 2), imp=True)
    assert inst.interpreter_of(program(tmp_path, f"/usr/bin/env {py}")) == [str(py)]


def test_interpreter_of_rejects_non_python(tmp_path: Path) -> None:
    with pytest.raises(inst.GpumonError, match="not Python"):
        inst.interpreter_of(program(tmp_path, "/bin/sh"))


def test_pcp_dstat_is_pointed_at_the_ini_plugin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pcp = tmp_path / "pcp-dstat"
    pcp.write_text("#!/usr/bin/pcp python\nfrom pcp import pmapi\n")
    link = tmp_path / "dstat"
    link.symlink_to(pcp)
    assert main(["dstat", "install", "--dir", str(tmp_path / "p"), "--program", str(link)]) == 1
    err = capsys.readouterr().err
    assert "pcp-dstat" in err
    # It names files that `gpumon deploy DIR` writes (a pip install has no deploy/ folder).
    assert "`gpumon deploy DIR`" in err and "docs/dstat.md" in err
    assert (REPO / "docs" / "dstat.md").is_file()
    deployed = {str(f.path) for f in shipped()}
    for named in ("pcp/dstat/gpumon", "pcp/gpumon.url"):
        assert f"DIR/{named}" in err and named in deployed, named


def test_a_failed_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "p" / "dstat_gpu.py"

    def full(*_a: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(inst.os, "chmod", full)
    args = inst.argparse.Namespace(system=False)
    with pytest.raises(inst.GpumonError, match="No space left"):
        inst._write(dest, "text", args)
    assert list(dest.parent.iterdir()) == []


def test_uninstall_removes_only_gpumon_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "p"
    dest.mkdir()
    foreign = dest / "dstat_gpu.py"
    foreign.write_text("class dstat_plugin(dstat): pass\n")
    assert main(["dstat", "uninstall", "--dir", str(dest)]) == 1
    assert foreign.exists()
    assert "not installed by gpumon" in capsys.readouterr().err
    foreign.write_text(inst.render_plugin(inst.targets()["dstat"], []))
    assert main(["dstat", "uninstall", "--dir", str(dest)]) == 0
    assert not foreign.exists()
    assert main(["dstat", "uninstall", "--dir", str(dest)]) == 0  # nothing left: fine


def test_render_plugin_fills_only_the_site_dirs_line() -> None:
    target = inst.targets()["dstat"]
    source = (REPO / "dstat_plugins" / "dstat_gpu.py").read_text()
    text = inst.render_plugin(target, ["/a b/site-packages", '/we"ird'])
    diff = [(a, b) for a, b in zip(source.splitlines(), text.splitlines(), strict=True) if a != b]
    assert len(diff) == 1
    namespace: dict[str, object] = {}
    exec(diff[0][1], namespace)
    assert namespace["GPUMON_SITE_DIRS"] == ["/a b/site-packages", '/we"ird']


def test_unwritable_system_dir_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() == 0:
        blocked = tmp_path / "file"
        blocked.write_text("")  # a file where the folder should be: fails even for root
        system_dir = blocked / "dstat"
    else:
        system_dir = Path("/usr/local/share/dstat-gpumon-test")
    target = inst.Target("dstat", "dstat_gpu.py", tmp_path, system_dir)
    monkeypatch.setattr(inst, "targets", lambda: {"dstat": target, "dool": target})
    dstat = program(tmp_path, str(fake_python(tmp_path, (3, 11, 2), imp=True)))
    assert main(["dstat", "install", "--system", "--program", str(dstat)]) == 1
    assert "sudo" in capsys.readouterr().err


def test_an_import_failure_under_another_python_names_the_abi() -> None:
    err = "ImportError: _psutil_linux.abi3.so: undefined symbol: PyFoo"
    p = inst.Probe("/opt/py/bin/python3.13", (3, 13, 0), False, err, err, None)
    (problem,) = inst.problems(inst.targets()["dool"], Path("/usr/local/bin/dool"), p)
    assert "cannot import gpumon: " + err in problem
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if here != "3.13":
        assert f"installed for Python {here}" in problem and "do not load under 3.13.0" in problem
        assert "/opt/py/bin/python3.13 -m pip install --user gpumon-why" in problem
