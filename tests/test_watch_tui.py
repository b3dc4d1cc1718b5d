"""The full-screen view in a real terminal: tmux runs `gpumon watch`, capture-pane reads it."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from fakenvml import Pattern, Scenario
from test_watch import ROOT, gpu_with, start_tree

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


class Tmux:
    """One private tmux server (its own socket), so tests never touch a user's sessions."""

    def __init__(self) -> None:
        self.socket = f"gpumon-test-{os.getpid()}-{time.monotonic_ns()}"

    def run(self, *args: str) -> str:
        r = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "w")

    def wait_for(self, ok: Callable[[str], bool], timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.screen()
            if ok(text):
                return text
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; the screen was:\n{text}")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    t = Tmux()
    yield t
    t.kill()


def _timeline_row(screen: str) -> str | None:
    """The GPU panel's timeline: the line right above the 'utilisation, last' label."""
    lines = screen.splitlines()
    for i, line in enumerate(lines):
        if "utilisation, last" in line and i > 0:
            return lines[i - 1]
    return None


def watch_command(fake_nvml, *args: str) -> str:
    """The shell line that runs ``gpumon watch ARGS`` against the fake NVML inside tmux.

    COLUMNS/LINES are unset: set by some test runners, they would pin rich to 80x24.
    """
    env = [f"{k}={fake_nvml.env[k]}" for k in ("LD_LIBRARY_PATH", "FAKE_NVML_SCENARIO")]
    return shlex.join(
        [
            "env",
            "-u",
            "COLUMNS",
            "-u",
            "LINES",
            *env,
            sys.executable,
            "-m",
            "gpumon",
            "watch",
            *args,
        ]
    )


def test_live_view_shows_timeline_and_state_and_q_leaves_the_process(fake_nvml, tmux) -> None:
    tree = start_tree(2, 0, 40)
    try:
        fake_nvml.set(Scenario(gpus=[gpu_with(tree.workers[0], Pattern.burst(1.0, 0.3))]))
        watch = watch_command(
            fake_nvml, "--pid", str(tree.pid), "--interval", "0.25", "--window", "3"
        )
        tmux.run(
            "new-session",
            "-d",
            "-s",
            "w",
            "-x",
            "120",
            "-y",
            "50",
            "-c",
            str(ROOT),
            f"{watch}; echo gpumon-exit=$?; sleep 60",
        )

        def shows_bursts(screen: str) -> bool:
            row = _timeline_row(screen)
            # Bursts (full blocks) between gaps (low blocks), several periods of them.
            return row is not None and row.count("█") >= 4 and row.count("▁") >= 8

        tmux.wait_for(shows_bursts, 15, "the GPU timeline")

        def complete(screen: str) -> bool:
            # One capture can land mid-redraw: wait for a screen with everything on it.
            return shows_bursts(screen) and all(
                x in screen
                for x in (
                    "GPU 0 NVIDIA H100",  # the GPU panel
                    "/ 80.0 GiB",  # memory used / total
                    "/ 700 W",  # power against the limit
                    "worker+GPU",  # the process tree, GPU-holding worker marked
                    f" {tree.pid}  main",
                    "host CPU",
                    "state: starved  cause: cpu",  # the state with its cause
                    "duty cycle 3",  # evidence in numbers (~30 %)
                    "advice:",
                    "num_workers",
                )
            )

        tmux.wait_for(complete, 25, "the starved verdict with its evidence")

        tmux.run("send-keys", "-t", "w", "q")
        screen = tmux.wait_for(lambda s: "gpumon-exit=" in s, 10, "gpumon to exit")
        assert "gpumon-exit=0" in screen
        assert "gpumon watch summary" in screen and "the process is still running" in screen
        assert "verdict          starved (cause: cpu)" in screen
        assert tree.proc.poll() is None  # q left the watched process alone
    finally:
        tree.proc.terminate()
        tree.proc.wait(5)


def test_command_mode_view_and_its_output_after_q(fake_nvml, tmux) -> None:
    """`watch -- CMD` on a terminal: q closes the view, the command's output is all there."""
    fake_nvml.set(Scenario(gpus=[]))
    script = (
        "import time\nfor i in range(30):\n    print('step', i, flush=True)\n    time.sleep(0.1)\n"
    )
    watch = watch_command(fake_nvml, "--interval", "0.25", "--", sys.executable, "-c", script)
    tmux.run(
        "new-session",
        "-d",
        "-s",
        "w",
        "-x",
        "120",
        "-y",
        "60",
        "-c",
        str(ROOT),
        f"{watch}; echo gpumon-exit=$?; sleep 60",
    )
    screen = tmux.wait_for(lambda s: "command output" in s and "step" in s, 10, "the view")
    assert "waiting for the run to use a GPU" in screen or "no GPU" in screen
    tmux.run("send-keys", "-t", "w", "q")
    screen = tmux.wait_for(lambda s: "gpumon-exit=" in s, 15, "gpumon to exit")
    assert "gpumon-exit=0" in screen
    for i in (0, 15, 29):  # replayed after the view closed, or passed straight through
        assert f"step {i}\n" in screen + "\n"


CTRL_C_CHILD = """
import signal, sys, time
hits = []
def on_int(*_):
    hits.append(1)
    print(f"child SIGINT {len(hits)}", flush=True)
    time.sleep(0.5)  # cleanup a second Ctrl-C from gpumon would interrupt
    print(f"child saved after {len(hits)} SIGINT", flush=True)
    sys.exit(7)
signal.signal(signal.SIGINT, on_int)
print("child ready", flush=True)
time.sleep(60)
"""


def test_ctrl_c_stops_the_command_as_without_gpumon(fake_nvml, tmux) -> None:
    fake_nvml.set(Scenario(gpus=[]))
    watch = watch_command(
        fake_nvml, "--plain", "--interval", "0.25", "--", sys.executable, "-c", CTRL_C_CHILD
    )
    tmux.run(
        "new-session",
        "-d",
        "-s",
        "w",
        "-x",
        "120",
        "-y",
        "40",
        "-c",
        str(ROOT),
        f"{watch}; echo gpumon-exit=$?; sleep 60",
    )
    tmux.wait_for(lambda s: "child ready" in s, 10, "the command to start")
    tmux.run("send-keys", "-t", "w", "C-c")
    screen = tmux.wait_for(lambda s: "gpumon-exit=" in s, 10, "gpumon to exit")
    # Its own handler ran to the end of its cleanup, uninterrupted.  (A duplicate SIGINT
    # sent at once would usually merge with the terminal's, so this cannot prove there was
    # none; gpumon does not forward a Ctrl-C the terminal already delivered.)
    assert "child saved after 1 SIGINT" in screen
    assert "gpumon-exit=7" in screen
    assert "the command exited with status 7" in screen
