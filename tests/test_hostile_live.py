"""Hostile input, third round: processes that lie, waits that would not end, terminals.

Every case runs the real thing (a real flat family of processes, the real CLI on the fake
NVML, a real pseudo-terminal) and is bounded by its own timeout: a case that hangs fails.
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.text import Text

from gpumon.faces.watch.layout import _crop
from gpumon.sample.host import ProcessTreeSampler

HELPERS = Path(__file__).parent / "helpers"
ROOT = Path(__file__).resolve().parent.parent
HOSTILE_NAME = "\x1b]0;pwned\x07\x1b[2Jtrain"  # retitles the terminal, then clears it


# --- a flat family of 5,000 children ------------------------------------------------------


@pytest.fixture
def flat_family(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """(pid, children) of a process with 5,000 direct children; ended however the test ends."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed (it builds the flat-family helper)")
    exe = tmp_path / "flatfamily"
    subprocess.run(
        ["gcc", "-O2", "-o", str(exe), str(HELPERS / "flatfamily.c")], check=True, timeout=120
    )
    proc = subprocess.Popen(
        [str(exe), "5000"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, "the family was not made in 120 s"
        line = proc.stdout.readline().split()
        assert line and line[0] == "ready", line
        yield proc.pid, int(line[1])
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # every child reads EOF and exits; the parent reaps them
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_a_flat_tree_of_5000_children_is_counted_whole(flat_family) -> None:
    """Before, /proc/PID/task/TID/children was read with one read(), and the kernel hands
    it out a page at a time: 683 of the 5,000 were counted."""
    pid, children = flat_family
    assert children == 5000
    sampler = ProcessTreeSampler(pid)
    try:
        tree = sampler.sample()
        tree = sampler.sample()  # again: the children file is then read through a kept fd
    finally:
        sampler.close()
    assert len(tree.processes) == 1 + children


# --- waits that end with the process --------------------------------------------------------


def _run(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpumon", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_watch_ends_when_its_command_does_not_an_interval_later(fake_nvml) -> None:
    """``watch --interval 30 -- sleep 1`` exited at 31 s: the wait outlived the command."""
    started = time.monotonic()
    done = _run(fake_nvml.env, "watch", "--plain", "--interval", "30", "--", "sleep", "1",
                timeout=25)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 25
    assert "gpumon watch summary" in done.stdout


def test_record_ends_when_its_pid_does(fake_nvml, tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "1"])
    try:
        out = tmp_path / "t.jsonl"
        done = _run(fake_nvml.env, "record", "-o", str(out), "--interval", "30",
                    "--pid", str(sleeper.pid), timeout=25)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"process {sleeper.pid} exited" in done.stderr
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("value", ["inf", "1e400", "1e9", "1e-9", "nan", "0.01", "61"])
def test_an_interval_outside_the_one_range_is_refused_by_every_face(fake_nvml, value) -> None:
    """``inf`` and ``1e400`` were tracebacks, ``1e9`` a wait no signal ended, ``1e-9`` a
    busy loop: record, watch and serve take the same 0.05-60 s."""
    for face in (["record", "-o", "/nonexistent/x.jsonl"], ["watch", "--plain"], ["serve"]):
        done = _run(fake_nvml.env, *face, "--interval", value, "--", "true", timeout=30)
        assert done.returncode == 2, (face, done.stderr)
        assert "Traceback" not in done.stderr
        assert "--interval" in done.stderr


# --- the terminal -------------------------------------------------------------------------


def _pty_run(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run ``argv`` under a fresh pseudo-terminal (a session of its own, as a login shell
    is); its exit status and everything it wrote there."""
    pid, master = pty.fork()
    if pid == 0:  # the child: the session leader, foreground on the new terminal
        try:
            os.execvpe(argv[0], argv, env)
        finally:
            os._exit(127)
    out = b""
    deadline = time.monotonic() + timeout
    status = None
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the terminal's last holder closed it
                    chunk = b""
                out += chunk
                if chunk:
                    continue
            waited, st = os.waitpid(pid, os.WNOHANG)
            if waited:
                status = st
                break
    finally:
        if status is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(master)
    assert status is not None, f"still running after {timeout} s: {out[-500:]!r}"
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def test_the_full_view_in_a_background_group_falls_back_to_plain_lines(fake_nvml) -> None:
    """Under ``timeout`` (a process group of its own, in the background of the terminal)
    the view stopped on SIGTTOU when it set the terminal up, and stayed stopped."""
    if shutil.which("timeout") is None:
        pytest.skip("coreutils' timeout is not installed")
    gpumon = f"{sys.executable} -m gpumon watch --interval 0.2 -- sleep 2"
    env = {**fake_nvml.env, "TERM": "xterm", "COLUMNS": "120", "LINES": "40"}
    _, out = _pty_run(["sh", "-c", f"cd {ROOT} && timeout 60 {gpumon}; echo rc=$?"], env, 90)
    assert "rc=0" in out, out[-2000:]
    assert "in the background of this terminal" in out
    assert "gpumon watch summary" in out


def test_a_command_line_cannot_write_to_the_terminal_through_gpumon(fake_nvml) -> None:
    """A command line holding ESC]0;...BEL and ESC[2J was printed as is by the summary:
    the terminal was retitled and cleared."""
    done = _run(fake_nvml.env, "watch", "--plain", "--interval", "0.2", "--",
                "sh", "-c", "sleep 1", HOSTILE_NAME, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "\\x1b]0;pwned\\x07\\x1b[2Jtrain" in done.stdout


def test_every_row_of_the_full_view_shows_control_characters_escaped() -> None:
    """The view's rows (the process table's names, the header's command) pass one crop."""
    row = _crop(Text(f"  {HOSTILE_NAME}  12 %"), 80)
    assert "\x1b" not in row.plain and "\x07" not in row.plain
    assert "\\x1b[2Jtrain" in row.plain
