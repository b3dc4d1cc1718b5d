"""The full-screen view in a real terminal: tmux runs `gpumon watch` (or `gpumon demo`, the
same face on a replayed trace), capture-pane reads the screen.

Sizes are reached by resizing one running view (the live reflow is tested on the way): the
bundled 2-GPU demo through 80x24, 100x30, 120x40 and 200x60; an 8-GPU trace at 80x24 and
200x60; one GPU on a real process tree and the fake NVML at 80x24 and 200x60.  Each key is
pressed once.  Every screen is checked for what must be on it and for lines wrapped mid-value.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fakenvml import Pattern, Scenario
from test_watch import ROOT, gpu_with, start_tree

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

TIMELINE_CELLS = set("▁▂▃▄▅▆▇█·")
GPU_ROW = re.compile(r"^GPU (\d+) +(?:healthy|starved|sync_stall|idle|unknown|LOST|–)\S* ")
UNITS = re.compile(r"^(W|%|s\b|GiB|MiB|KiB|B/s|°C|MHz)")


class Tmux:
    """One private tmux server (its own socket), so tests never touch a user's sessions."""

    def __init__(self) -> None:
        self.socket = f"gpumon-test-{os.getpid()}-{time.monotonic_ns()}"
        self.size = (0, 0)

    def run(self, *args: str) -> str:
        r = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    def start(self, command: str, width: int, height: int) -> None:
        self.size = (width, height)
        self.run(
            *("new-session", "-d", "-s", "w", "-x", str(width), "-y", str(height)),
            *("-c", str(ROOT), f"{command}; echo gpumon-exit=$?; sleep 60"),
        )

    def resize(self, width: int, height: int) -> None:
        self.size = (width, height)
        self.run("resize-window", "-t", "w", "-x", str(width), "-y", str(height))

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "w", *keys)

    def screen(self, joined: bool = False, history: bool = False) -> str:
        """The pane as shown; ``joined``: lines the terminal wrapped joined again;
        ``history``: with what scrolled off the top."""
        flags = (["-J"] if joined else []) + (["-S", "-"] if history else [])
        return self.run("capture-pane", "-p", *flags, "-t", "w")

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


def gpumon_command(env: dict[str, str], *args: str) -> str:
    """The shell line that runs ``gpumon ARGS`` inside tmux, with ``env`` where it matters.

    COLUMNS/LINES are unset: set by some test runners, they would pin rich to 80x24.
    """
    keep = [f"{k}={env[k]}" for k in ("LD_LIBRARY_PATH", "FAKE_NVML_SCENARIO") if k in env]
    cmd = ["env", "-u", "COLUMNS", "-u", "LINES", *keep, sys.executable, "-m", "gpumon", *args]
    return shlex.join(cmd)


# --- what every screen must show --------------------------------------------------------------


def gpu_rows(screen: str) -> dict[int, str]:
    """Each GPU's timeline row, by GPU index."""
    return {int(m[1]): ln for ln in screen.splitlines() if (m := GPU_ROW.match(ln))}


def timeline_cells(row: str) -> int:
    return sum(ch in TIMELINE_CELLS for ch in row)


def fits(screen: str, gpus: int | range, state: str = "starved") -> bool:
    """The musts: the top line (state, cause, elapsed), a timeline row for each GPU, one
    advice line, the footer with the keys; and no line wrapped mid-value."""
    lines = screen.rstrip("\n").split("\n")
    if not lines or f"state: {state}" not in lines[0] or "elapsed " not in lines[0]:
        return False
    want = range(gpus) if isinstance(gpus, int) else gpus
    rows = gpu_rows(screen)
    if sorted(rows) != list(want) or any(timeline_cells(r) < 20 for r in rows.values()):
        return False
    advice = [ln for ln in lines if ln.startswith("advice ")]
    if len(advice) != 1 or not advice[0].startswith("advice • "):
        return False
    footer = lines[-1]
    return "? help" in footer and "q quit" in footer and not wrapped_mid_value(lines)


def wrapped_mid_value(lines: list[str]) -> list[str]:
    """Lines a value was split across: a number at the end of one, its unit at the start of
    the next (the old view's 'power 133⏎W'), or a box border broken by a wrap."""
    bad = []
    for a, b in itertools.pairwise(lines):
        if re.search(r"\d$", a.rstrip()) and UNITS.match(b.lstrip("│ ")):
            bad.append(f"{a!r} / {b!r}")
    bad += [ln for ln in lines if ln.startswith("│") and not ln.rstrip().endswith("│")]
    return bad


def drawn_at(screen: str, width: int, height: int) -> bool:
    """The screen was drawn for this size (not the last one's, before the redraw): the
    footer on the last row, the section rules as wide as the terminal."""
    lines = screen.split("\n")
    return (
        len(lines) >= height
        and "? help" in lines[height - 1]
        and any(ln.startswith("── ") and len(ln) == width for ln in lines)
    )


def assert_screen(tmux: Tmux, gpus: int | range, timeout: float = 15, **kw: object) -> str:
    width, height = tmux.size
    screen = tmux.wait_for(
        lambda s: drawn_at(s, width, height) and fits(s, gpus, **kw),
        timeout,
        f"a full screen at {width}x{height}",
    )
    lines = screen.rstrip("\n").split("\n")
    assert len(lines) <= height and all(len(ln) <= width for ln in lines)
    return screen


# --- one GPU: `gpumon watch` on a real process tree and the fake NVML -------------------------


def test_watch_one_gpu_at_80x24_and_200x60_then_q_leaves_the_process(fake_nvml, tmux) -> None:
    tree = start_tree(2, 0, 40)
    try:
        fake_nvml.set(Scenario(gpus=[gpu_with(tree.workers[0], Pattern.burst(1.0, 0.3))]))
        args = ("watch", "--pid", str(tree.pid), "--interval", "0.25", "--window", "3")
        tmux.start(gpumon_command(fake_nvml.env, *args), 80, 24)
        screen = assert_screen(tmux, 1, timeout=30)
        row = gpu_rows(screen)[0]
        # Two burning workers: the CPU, or contention where other load holds this
        # machine's cores (the cause is the job's own only when its workers get the CPU).
        assert re.search(r"starved/(cpu|contention)", row), row
        assert row.count("█") >= 4 and row.count("▁") >= 8  # bursts

        tmux.resize(200, 60)

        def complete(screen: str) -> bool:
            return (
                fits(screen, 1)
                and all(
                    x in screen
                    for x in (
                        "NVIDIA H100",  # the GPU's details
                        "/ 80.0 GiB",  # memory used / total
                        "/ 700 W",  # power against the limit
                        "worker+GPU",  # the process tree, GPU-holding worker marked
                        f" {tree.pid} main",
                        "host CPU",
                        "duty cycle 3",  # evidence in numbers (~30 %)
                    )
                )
                and ("num_workers" in screen or "outside the job" in screen)
            )  # as the cause

        tmux.wait_for(complete, 15, "the details, the evidence and the tree at 200x60")

        tmux.keys("q")
        screen = tmux.wait_for(lambda s: "gpumon-exit=" in s, 10, "gpumon to exit")
        assert "gpumon-exit=0" in screen
        assert "gpumon watch summary" in screen and "the process is still running" in screen
        assert re.search(r"verdict +starved \(cause: (cpu|contention)\)", screen)
        assert tree.proc.poll() is None  # q left the watched process alone
    finally:
        tree.proc.terminate()
        tree.proc.wait(5)


# --- two GPUs: the bundled demo at every size, and the help and advice keys -------------------


@pytest.fixture(scope="module")
def demo() -> Iterator[Tmux]:
    """`gpumon demo` at 80x24, once it reports its starved phases (7-23 s in at 15x)."""
    t = Tmux()
    t.start(gpumon_command(dict(os.environ), "demo", "--no-serve", "--speed", "15"), 80, 24)
    try:
        t.wait_for(lambda s: fits(s, 2), 30, "the demo's starved phase")
        yield t
    finally:
        t.kill()


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (120, 40), (200, 60)])
def test_demo_two_gpus_fit_each_size(demo: Tmux, size: tuple[int, int]) -> None:
    demo.resize(*size)
    screen = assert_screen(demo, 2)
    if size >= (100, 30):
        assert "── evidence" in screen and "duty cycle" in screen  # more fits: evidence
    if size >= (120, 40):
        assert "main+GPU" in screen and "pt_data_worker" in screen  # and the process tree
    demo.resize(80, 24)


def test_demo_help_key_opens_and_closes_the_help(demo: Tmux) -> None:
    demo.resize(80, 24)
    assert_screen(demo, 2)
    demo.keys("?")
    screen = demo.wait_for(lambda s: "── keys" in s and "close help" in s, 15, "the help")
    assert "pause the view" in screen and "no sample" in screen and "close help" in screen
    assert all(len(ln) <= 80 for ln in screen.splitlines())
    demo.keys("?")
    assert_screen(demo, 2)


def test_demo_advice_key_shows_every_advice_in_full(demo: Tmux) -> None:
    demo.resize(80, 24)
    demo.keys("a")
    screen = demo.wait_for(lambda s: "in full)" in s and "close advice" in s, 15, "all advice")
    bullets = [ln for ln in screen.splitlines() if ln.lstrip().startswith(("advice •", "•"))]
    assert len(bullets) >= 3 and "num_workers" in screen
    assert not wrapped_mid_value(screen.splitlines())
    demo.keys("a")
    assert_screen(demo, 2)


# --- eight GPUs: rows at 80x24 and 200x60, paging and pause -----------------------------------


def eight_gpu_trace(path: Path) -> Path:
    """Eight GPUs starved by the CPU from 4 s in, for 5 minutes, all held by the main process."""
    from gpumon.lab import synth
    from gpumon.model import Cause
    from gpumon.traces.jsonl import TraceWriter

    phases = [
        synth.Phase("startup", 4.0),
        synth.Phase("starved", 300.0, Cause.CPU, params={"burst_s": 0.6, "duty": 0.4}),
    ]
    trace = synth.generate("starved_cpu", 1, gpus=8, period_s=1 / 6, phases=phases)
    root = trace.header.watched_pid or 0
    with TraceWriter.open(path, trace.header) as writer:
        for snap in trace.snapshots:
            gpus = tuple(
                replace(g, processes=tuple(replace(p, pid=root) for p in g.processes or ()))
                for g in snap.gpus
            )
            writer.write(replace(snap, gpus=gpus))
    return path


@pytest.fixture(scope="module")
def eight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tmux]:
    path = eight_gpu_trace(tmp_path_factory.mktemp("eight") / "eight.jsonl")
    args = ("demo", "--trace", str(path), "--no-serve", "--speed", "4")
    t = Tmux()
    t.start(gpumon_command(dict(os.environ), *args), 80, 24)
    try:
        t.wait_for(lambda s: fits(s, 8), 30, "eight starved GPUs")
        yield t
    finally:
        t.kill()


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
def test_eight_gpus_show_eight_timeline_rows(eight: Tmux, size: tuple[int, int]) -> None:
    eight.resize(*size)
    screen = assert_screen(eight, 8)
    assert "more GPUs" not in screen
    eight.resize(80, 24)


def test_paging_keys_g_right_and_left(eight: Tmux) -> None:
    eight.resize(80, 10)  # room for five rows and "+3 more"
    first, second = range(5), range(5, 8)
    screen = assert_screen(eight, first)
    assert "+3 more GPUs" in screen and "GPUs 1–5 of 8" in screen
    eight.keys("g")
    assert_screen(eight, second)
    eight.keys("Right")
    assert_screen(eight, first)  # round to the first page
    eight.keys("Left")
    assert_screen(eight, second)
    eight.keys("Left")
    assert_screen(eight, first)
    eight.resize(80, 24)


def test_pause_key_freezes_the_view_and_p_resumes_it(eight: Tmux) -> None:
    eight.resize(80, 24)
    assert_screen(eight, 8)
    eight.keys("p")
    # The whole paused frame (its footer is drawn last), not one caught mid-redraw.
    paused = eight.wait_for(
        lambda s: "PAUSED" in s.splitlines()[0] and "paused: sampling goes on" in s, 15, "the pause"
    )
    time.sleep(1.0)  # four refreshes and four ticks later ...
    assert eight.screen() == paused  # ... the same screen, clock and timelines included
    assert "paused: sampling goes on" in paused
    eight.keys("p")
    eight.wait_for(lambda s: "PAUSED" not in s, 15, "the view to resume")
    assert_screen(eight, 8)
    eight.wait_for(lambda s: gpu_rows(s) != gpu_rows(paused), 15, "the timelines to move again")


# --- `watch -- CMD`: the command's output, and Ctrl-C ------------------------------------------


def test_command_mode_view_and_its_output_after_q(fake_nvml, tmux) -> None:
    """`watch -- CMD` on a terminal: q closes the view, the command's output is all there."""
    fake_nvml.set(Scenario(gpus=[]))
    script = (
        "import time\nfor i in range(30):\n    print('step', i, flush=True)\n    time.sleep(0.1)\n"
    )
    args = ("watch", "--interval", "0.25", "--", sys.executable, "-c", script)
    tmux.start(gpumon_command(fake_nvml.env, *args), 120, 60)
    screen = tmux.wait_for(lambda s: "command output" in s and "step" in s, 10, "the view")
    assert "waiting for the run to use a GPU" in screen or "no GPU" in screen
    assert "q close view" in screen
    tmux.keys("q")
    screen = tmux.wait_for(lambda s: "gpumon-exit=" in s, 15, "gpumon to exit")
    assert "gpumon-exit=0" in screen
    for i in (0, 15, 29):  # replayed after the view closed, or passed straight through
        assert f"step {i}\n" in screen + "\n"


def test_a_terminal_under_80_columns_gets_plain_lines_with_a_note(fake_nvml, tmux) -> None:
    fake_nvml.set(Scenario(gpus=[]))
    args = ("watch", "--interval", "0.25", "--", sys.executable, "-c", "import time; time.sleep(2)")
    tmux.start(gpumon_command(fake_nvml.env, *args), 70, 30)
    tmux.wait_for(lambda s: "gpumon-exit=" in s, 15, "gpumon to exit")
    screen = tmux.screen(joined=True, history=True)
    assert "70 columns wide and the full view needs 80" in screen
    assert "waiting for the run to use a GPU state=unknown" in screen
    assert "╭" not in screen and "? help" not in screen  # no box, no view
    assert "gpumon-exit=0" in screen


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
    args = ("watch", "--plain", "--interval", "0.25", "--", sys.executable, "-c", CTRL_C_CHILD)
    tmux.start(gpumon_command(fake_nvml.env, *args), 120, 40)
    tmux.wait_for(lambda s: "child ready" in s, 10, "the command to start")
    tmux.keys("C-c")
    screen = tmux.wait_for(lambda s: "gpumon-exit=" in s, 10, "gpumon to exit")
    # Its own handler ran to the end of its cleanup, uninterrupted.  (A duplicate SIGINT
    # sent at once would usually merge with the terminal's, so this cannot prove there was
    # none; gpumon does not forward a Ctrl-C the terminal already delivered.)
    assert "child saved after 1 SIGINT" in screen
    assert "gpumon-exit=7" in screen
    assert "the command exited with status 7" in screen
