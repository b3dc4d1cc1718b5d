"""The captures in the docs are what gpumon prints now, regenerated from real output.

A capture is the code block after a ``<!-- capture: NAME -->`` line in README.md or
docs/*.md; ``CAPTURES[NAME]`` makes its text by running gpumon (the command, as a user
would) or, for a frame of the live view, by drawing the demo's trace at a chosen moment
of its replay through the view's own code.  A test fails when a doc's block differs from
what gpumon prints today.  To rewrite the blocks from today's output:

    GPUMON_REWRITE_CAPTURES=1 python -m pytest tests/test_captures.py

Only what varies from one run to the next by nature is not compared: the wall time of a
replay and the speed it was replayed at.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from fakenvml import missing_library_env
from rich.console import Console
from rich.screen import Screen

# One worker: a rewrite reads and writes the docs whole (and the demo runs once).
pytestmark = pytest.mark.xdist_group("captures")

ROOT = Path(__file__).resolve().parent.parent
REWRITE = os.environ.get("GPUMON_REWRITE_CAPTURES") == "1"
MARK = re.compile(r"^<!-- capture: ([\w-]+) -->\n```[^\n]*\n(.*?)^```$", re.M | re.S)
DOCS = ("README.md", "docs/analyze.md", "docs/watch.md")
NVSMI_LOG = "tests/data/logs/nvsmi_units_index.csv"
# What varies by nature between two runs of one replay (never compared).
VARIES = (
    (re.compile(r"(wall time +)\S+"), r"\1…"),
    (re.compile(r"replayed at [\d.]+x"), "replayed at …x"),
    (re.compile(r"elapsed [\d.]+s"), "elapsed …s"),
)


def _run(*args: str, columns: int) -> str:
    env = {**missing_library_env(), "COLUMNS": str(columns)}
    env.pop("LINES", None)
    proc = subprocess.run(
        [sys.executable, "-m", "gpumon", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _excerpt(report: str) -> str:
    """A report with every GPU after the first elided (``...``): their blocks read alike."""
    lines = report.rstrip("\n").split("\n")
    heads = [i for i, ln in enumerate(lines) if re.match(r"GPU \d+  ", ln)]
    legend = next(i for i, ln in enumerate(lines) if ln.startswith("legend: "))
    if len(heads) > 1:
        lines[heads[1] : legend] = [lines[heads[1]], "  ...", ""]
    return "\n".join(lines)


def analyze_nvsmi() -> str:
    return _excerpt(_run("analyze", NVSMI_LOG, columns=100))


def analyze_nvsmi_prompt() -> str:
    return f"$ gpumon analyze {NVSMI_LOG}\n" + analyze_nvsmi()


@cache
def demo_summary() -> str:
    """The demo's run summary in an 80-column terminal (fast: the summary is the same at
    any speed, every recorded tick is judged)."""
    out = _run("demo", "--no-serve", "--plain", "--speed", "200", columns=80)
    start = out.index("gpumon watch summary:")
    return out[start : out.index("\n\n", start)]


@dataclass(frozen=True)
class Frame:
    """The demo's live view at ``elapsed_s`` into a replay at ``speed``x, ticked every
    ``interval_s`` as `gpumon demo` ticks on a terminal, drawn at ``width`` x ``height``."""

    width: int
    height: int
    elapsed_s: float = 10.8
    speed: float = 15.0
    interval_s: float = 0.25
    keys: str = ""

    def __call__(self) -> str:
        from gpumon.engine.session import OFFLINE_CONFIG, Session
        from gpumon.engine.sources import ReplaySource
        from gpumon.faces.demo import command as demo
        from gpumon.faces.watch.keys import ViewControls
        from gpumon.faces.watch.layout import LiveView
        from gpumon.faces.watch.view import WatchState
        from gpumon.sample.replay import Replay

        trace = demo.load(demo.SYNTHETIC)
        now = [0.0]
        replay = Replay(
            trace.snapshots,
            header=trace.header,
            speed=self.speed,
            live_start_s=0.0,
            clock=lambda: now[0],
        )
        command = (
            f"[synthetic trace replayed at {self.speed:g}x]",
            *(trace.header.command or ("a run",)),
        )
        source = ReplaySource(replay, trace.header, interval_s=self.interval_s, command=command)
        session = Session(source, config=OFFLINE_CONFIG)
        st = WatchState(pid=session.root_pid, command=session.command, started_mono_s=0.0)
        ticks = round(self.elapsed_s / self.interval_s)
        for k in range(ticks + 1):
            now[0] = k * self.interval_s
            tick = session.tick()
            st.memory = session.memory
            st.feed(tick.snapshot, session.verdict(), session.invisible_gpu_pids)
        st.paused_at_s = self.elapsed_s  # the clock the top line shows, fixed
        controls = ViewControls(st, threading.Event())
        for key in self.keys:
            controls.press(key)
        console = Console(
            width=self.width,
            height=self.height,
            record=True,
            force_terminal=True,
            color_system="truecolor",
            file=io.StringIO(),
            legacy_windows=False,
        )
        console.print(Screen(LiveView(st, controls)))
        lines = console.export_text().split("\n")[: self.height]
        return "\n".join(ln.rstrip() for ln in lines)


CAPTURES: dict[str, Callable[[], str]] = {
    "analyze-nvsmi": analyze_nvsmi,
    "analyze-nvsmi-prompt": analyze_nvsmi_prompt,
    "demo-summary": demo_summary,
    "demo-frame-80x24": Frame(80, 24),
    "demo-frame-120x40": Frame(120, 40),
}


def _blocks() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for m in MARK.finditer((ROOT / doc).read_text(encoding="utf-8")):
            found.append((doc, m.group(1)))
    return found


def _comparable(text: str) -> str:
    for pattern, into in VARIES:
        text = pattern.sub(into, text)
    return text.rstrip("\n")


def test_every_capture_in_the_docs_has_a_maker_and_every_maker_a_capture() -> None:
    names = [name for _, name in _blocks()]
    assert sorted(set(names)) == sorted(CAPTURES), names


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_the_docs_capture_is_what_gpumon_prints_now(name: str) -> None:
    made = CAPTURES[name]().rstrip("\n")
    for doc in DOCS:
        path = ROOT / doc
        text = path.read_text(encoding="utf-8")
        for m in [m for m in MARK.finditer(text) if m.group(1) == name][::-1]:
            shown = m.group(2).rstrip("\n")
            if REWRITE and _comparable(shown) != _comparable(made):
                text = text[: m.start(2)] + made + "\n" + text[m.end(2) :]
                path.write_text(text, encoding="utf-8")
                continue
            assert _comparable(shown) == _comparable(made), (
                f"{doc}: the capture {name!r} differs from what gpumon prints now; "
                "GPUMON_REWRITE_CAPTURES=1 python -m pytest tests/test_captures.py rewrites it"
            )


def test_the_demo_summary_fits_80_columns_and_names_one_worker_count() -> None:
    summary = CAPTURES["demo-summary"]()
    assert max(len(ln) for ln in summary.splitlines()) <= 80, summary
    counts = re.findall(r"num_workers(?:=| from )(\d+)(?: to (?:about )?(\d+))?", summary)
    assert len(counts) == 1, summary  # one lever, one number
