"""The log's folder: `gpumon serve --log /var/log/gpumon/gpumon.jsonl` (the README's line)
on a node without /var/log/gpumon makes the folder, 0750, or refuses to start in one
sentence; it never runs on without a log, and never follows a symbolic link into a
folder it creates.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest
import test_serve_daemon
from test_cli import one_sentence
from test_serve_daemon import free_port, serve_argv, start_daemon

from gpumon.faces.serve import log as serve_log
from gpumon.faces.serve.log import FOLDER_MODE, make_folder

daemons = test_serve_daemon.daemons  # the fixture: daemons a test started, stopped after it


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_the_missing_folders_are_made_0750_whatever_the_umask(tmp_path: Path) -> None:
    log = tmp_path / "var" / "log" / "gpumon" / "gpumon.jsonl"
    old = os.umask(0o077)
    try:
        created = make_folder(str(log))
    finally:
        os.umask(old)
    assert created == [str(tmp_path / "var"), str(tmp_path / "var/log"), str(log.parent)]
    assert [mode(Path(p)) for p in created] == [FOLDER_MODE] * 3 == [0o750] * 3
    assert make_folder(str(log)) == []  # there now: nothing to make, nothing changed
    assert not log.exists()  # the file is the log's to create (0640)


def test_an_existing_folder_reached_by_a_link_is_used_as_it_is(tmp_path: Path) -> None:
    """/var/log may itself be a link (to a data disk): the nearest folder that exists is
    opened as it is, and the new folders are made in what it points to."""
    (tmp_path / "disk").mkdir()
    (tmp_path / "log").symlink_to(tmp_path / "disk")
    (tmp_path / "disk").chmod(0o755)
    assert make_folder(str(tmp_path / "log" / "gpumon" / "gpumon.jsonl")) == [
        str(tmp_path / "log" / "gpumon")
    ]
    assert (tmp_path / "disk" / "gpumon").is_dir()
    assert not (tmp_path / "disk" / "gpumon").is_symlink()


def test_a_link_to_nothing_is_refused_not_followed(tmp_path: Path) -> None:
    (tmp_path / "gpumon").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError) as caught:
        make_folder(str(tmp_path / "gpumon" / "gpumon.jsonl"))
    assert caught.value.filename == str(tmp_path / "gpumon")
    assert "symbolic link" in (caught.value.strerror or "")
    assert not (tmp_path / "elsewhere").exists()


def test_a_link_put_in_place_of_a_made_folder_is_not_entered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between making a folder and entering it, someone who can write its parent swaps a
    link in (to a folder of theirs, or /etc): the next folder is not made through it."""
    target = tmp_path / "theirs"
    target.mkdir()
    real_mkdir = serve_log._mkdir

    def swapped(name: str, parent: int) -> bool:
        made = real_mkdir(name, parent)
        if name == "gpumon":
            os.rmdir(name, dir_fd=parent)
            os.symlink(target, name, dir_fd=parent)
        return made

    monkeypatch.setattr(serve_log, "_mkdir", swapped)
    with pytest.raises(OSError) as caught:
        make_folder(str(tmp_path / "log" / "gpumon" / "deeper" / "gpumon.jsonl"))
    assert caught.value.errno == errno.ELOOP
    assert caught.value.filename == str(tmp_path / "log" / "gpumon")
    assert list(target.iterdir()) == []  # nothing was made in the link's target


@pytest.mark.slow
def test_serve_makes_the_folder_and_logs_into_it(fake_nvml, tmp_path: Path, daemons) -> None:
    log = tmp_path / "var" / "log" / "gpumon" / "gpumon.jsonl"
    d = start_daemon(fake_nvml.env, tmp_path, "--log", str(log), log=False)
    daemons.append(d)
    assert d.stop() == 0
    assert f"created the log's folder {log.parent} (mode 0750)" in d.stderr_text
    assert mode(log.parent) == 0o750 and mode(log.parent.parent) == 0o750
    first = log.read_text().splitlines()[0]
    assert '"event":"start"' in first


@pytest.mark.slow
@pytest.mark.parametrize("what", ["a file", "a link to nothing"])
def test_serve_refuses_to_start_when_the_folder_cannot_be_made(
    fake_nvml, tmp_path: Path, what: str
) -> None:
    blocker = tmp_path / "gpumon"
    if what == "a file":
        blocker.write_text("not a folder\n")
    else:
        blocker.symlink_to(tmp_path / "nowhere")
    log = blocker / "gpumon.jsonl"
    res = subprocess.run(
        serve_argv(free_port(), "--log", str(log)),
        env=fake_nvml.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    sentence = one_sentence(res.stderr)
    assert sentence.startswith(f"gpumon: cannot create the folder {blocker} for the log {log}: ")
    assert not (tmp_path / "nowhere").exists()
