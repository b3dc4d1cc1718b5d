"""`gpumon demo` end to end: plain lines, the metrics endpoint while it runs, the log, the
summary JSON -- with no NVIDIA driver and NVML never initialised."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from fakenvml import missing_library_env

from gpumon.faces.demo import command as demo
from gpumon.lab import synth
from gpumon.model import State
from gpumon.traces.jsonl import TraceReader, TraceWriter

ROOT = Path(__file__).resolve().parents[1]

# gpumon's CLI with NVML's init path booby-trapped: the demo must never reach it.
NO_NVML = (
    "import sys, pynvml\n"
    "def _trap(*a, **k):\n"
    "    raise SystemExit('nvmlInit was called by the demo')\n"
    "pynvml.nvmlInit = pynvml.nvmlInitWithFlags = _trap\n"
    "from gpumon.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
URL = re.compile(r"(http://127\.0\.0\.1:\d+/metrics)")


def _start(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", NO_NVML, "demo", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=missing_library_env(),
    )


def test_the_bundled_trace_is_labelled_synthetic_and_tells_the_story() -> None:
    path = demo.bundled_trace()
    assert path == demo.SYNTHETIC  # no real recording ships yet
    trace = demo.load(path)
    assert trace.synthetic and trace.header.extra["synthetic"] is True
    assert len(trace.header.gpus) == 2
    assert trace.snapshots[0].host is not None and trace.snapshots[0].tree is not None
    assert 300 <= trace.span_s <= 600
    assert [e["phase"] for e in trace.events] == [
        "start-up",
        "healthy",
        "starved-cpu",
        "starved-gil",
        "healthy",
    ]
    assert demo.default_speed(trace.span_s) * demo.TARGET_WALL_S == pytest.approx(
        trace.span_s, rel=0.01
    )
    assert demo.default_speed(10.0) == 1.0  # never slower than recorded


def test_demo_end_to_end_in_plain_lines_with_metrics_log_and_summary(tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    proc = _start("--speed", "20", "--summary-json", str(summary_path))
    lines: list[str] = []
    scraped: list[str] = []
    got_url = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if URL.search(line):
                got_url.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert got_url.wait(300), "".join(lines)  # a deadline: a busy machine starts slowly
        url = next(m.group(1) for line in lines if (m := URL.search(line)))
        deadline = time.monotonic() + 300
        # Scrape while the run goes on until the detector has named a state (the starved
        # phases last 12 s at 20x: scrapes a busy machine answers in seconds still see them).
        while time.monotonic() < deadline and proc.poll() is None:
            with urllib.request.urlopen(url, timeout=60) as resp:
                body = resp.read().decode()
            scraped.append(body)
            if re.search(r'gpumon_gpu_state\{[^}]*state="starved"[^}]*\} 1', body):
                break
            time.sleep(0.3)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(5)
    stderr = proc.stderr.read() if proc.stderr else ""
    out = "".join(lines)
    assert proc.returncode == 0, out + stderr

    # The metrics endpoint served the replayed GPUs while the demo ran.
    assert scraped, out
    assert 'uuid="GPU-synth-' in scraped[-1] and "gpumon_build_info" in scraped[-1]
    assert re.search(r'gpumon_gpu_state\{[^}]*state="starved"[^}]*\} 1', scraped[-1]), scraped[-1][
        -3000:
    ]

    # Plain lines: no escape codes, says what it is, one line per tick with both GPUs.
    assert "\x1b" not in out
    assert "synthetic trace" in out
    ticks = [ln for ln in lines if re.search(r" gpu0=\S+ gpu1=\S+ state=", ln)]
    # A line a tick, each later in the run than the one before (how many: as many ticks
    # as the machine ran while the replay played; a busy one runs fewer, never none).
    offsets = [float(m[1]) for ln in ticks if (m := re.search(r" \+(\d+(?:\.\d+)?)s ", ln))]
    assert len(offsets) == len(ticks) >= 4, out
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), out
    assert any("state=starved cause=cpu" in ln for ln in ticks), out
    assert any("state=starved cause=gil" in ln for ln in ticks), out
    # The story's phases are announced as the replay reaches them, before gpumon names them.
    said = [ln.split("enters its ")[1].split(" phase")[0] for ln in lines if "enters its" in ln]
    assert said == ["start-up", "healthy", "starved-cpu", "starved-gil", "healthy"]
    at = {
        p: next(i for i, ln in enumerate(lines) if f"enters its {p} phase" in ln)
        for p in ("starved-cpu", "starved-gil")
    }
    first_cpu = next(i for i, ln in enumerate(lines) if "state=starved cause=cpu" in ln)
    assert at["starved-cpu"] < first_cpu < at["starved-gil"]
    assert "gpumon watch summary" in out

    # The summary JSON carries what the story implies.
    summary = json.loads(summary_path.read_text())
    seconds = summary["seconds"]
    assert seconds["starved"] > 100 and seconds["healthy"] > 100, seconds
    assert seconds["sync_stall"] == 0
    assert summary["verdict"] == State.STARVED.value and summary["cause"] in ("cpu", "gil")
    assert [g["gpu"] for g in summary["gpus"]] == [0, 1]
    assert all(0.3 < g["duty_cycle"] < 0.9 for g in summary["gpus"])
    assert summary["lost_gpu_seconds"] > 0 and summary["advice"]

    # The daemon's log file: episodes of both starvation causes, and a final line.
    log_path = next(m.group(1) for ln in lines if (m := re.search(r"log: (\S+\.log)", ln)))
    records = [json.loads(ln) for ln in Path(log_path).read_text().splitlines()]
    starts = {
        (r["state"], r["cause"])
        for r in records
        if r["event"] == "episode_start" and r["scope"] == "node"
    }
    assert {("starved", "cpu"), ("starved", "gil"), ("healthy", None)} <= starts, starts
    assert records[0]["event"] == "start" and records[-1]["event"] == "stop"


def test_no_serve_and_a_trace_of_ones_own(tmp_path: Path) -> None:
    """--trace replays any gpumon trace; one not marked synthetic is called real; one
    recorded without a process tree (no --pid) still shows its GPUs."""
    gen = synth.generate("healthy", 3, gpus=1, period_s=0.5, duration_s=40.0)
    header = replace(gen.header, source="gpumon", extra={}, watched_pid=None)
    path = tmp_path / "mine.jsonl"
    with TraceWriter.open(path, header) as w:
        for snap in gen.snapshots:
            w.write(replace(snap, tree=None))
    assert not demo.is_synthetic(TraceReader(path).header)
    proc = _start("--trace", str(path), "--speed", "20", "--no-serve", "--interval", "0.2")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert "real trace mine.jsonl" in out and "synthetic" not in out
    assert "metrics" not in out.lower().split("gpumon watch summary")[0]
    assert "gpumon watch summary" in out
    assert "waiting for the run" not in out
    assert any(re.search(r" gpu0=\d+% state=", ln) for ln in out.splitlines()), out
    # Replayed at speed: the demo's own account of the replay (its start-up aside, which
    # a busy machine stretches) is the trace's span over 20, not the span itself.
    span = gen.snapshots[-1].t_s - gen.snapshots[0].t_s
    span_re = r"((?:\d+ min )?\d+ s)"
    said = re.search(rf"replayed {span_re} of the real trace in {span_re}", " ".join(out.split()))
    assert said is not None, out
    played, took = (_seconds(x) for x in said.groups())
    assert played >= span - 1 and span / 20 - 1 <= took < span / 2, out


def _seconds(span: str) -> int:
    """``1 min 04 s`` -> 64 (the demo's own words for a span)."""
    m = re.fullmatch(r"(?:(\d+) min )?(\d+) s", span)
    assert m is not None, span
    return 60 * int(m[1] or 0) + int(m[2])


def test_a_bad_trace_gets_one_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    proc = _start("--trace", str(bad), "--no-serve")
    _, err = proc.communicate(timeout=300)  # a deadline: a busy machine starts slowly
    assert proc.returncode == 2
    assert "Traceback" not in err and "bad.jsonl" in err


def test_a_real_recording_is_preferred_over_the_synthetic_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = synth.generate("healthy", 1, gpus=1, duration_s=20.0)
    real = tmp_path / "tests" / "data" / "real"
    real.mkdir(parents=True)
    (real / "notes.jsonl").write_text("not a trace\n")
    for name, source in (("a-synth.jsonl", "synthetic"), ("b-lab.jsonl", "gpumon")):
        with TraceWriter.open(real / name, replace(gen.header, source=source, extra={})) as w:
            w.write(gen.snapshots[0])
    monkeypatch.setattr(demo, "CHECKOUT", tmp_path)
    monkeypatch.setattr(demo, "REAL_DIRS", (tmp_path / "data", real))
    assert demo.bundled_trace() == demo.SYNTHETIC  # not a checkout: no pyproject.toml
    (tmp_path / "pyproject.toml").write_text("")
    assert demo.bundled_trace() == real / "b-lab.jsonl"


def test_analyze_and_the_demo_at_any_interval_give_one_verdict(tmp_path: Path) -> None:
    """The same samples give the same verdict through every face and at every view
    interval: the demo replays each recorded tick into the detector on its own."""
    from gpumon.faces.demo.command import SYNTHETIC

    analyzed = subprocess.run(
        [sys.executable, "-m", "gpumon", "analyze", "--json", str(SYNTHETIC)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert analyzed.returncode == 0, analyzed.stderr
    want = json.loads(analyzed.stdout)
    procs = {}
    for interval in ("1", "0.25"):
        out = tmp_path / f"summary-{interval}.json"
        procs[interval] = (
            _start(
                "--no-serve",
                "--plain",
                "--speed",
                "60",
                "--interval",
                interval,
                "--summary-json",
                str(out),
            ),
            out,
        )
    for interval, (proc, out) in procs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        got = json.loads(out.read_text())
        assert (got["verdict"], got["cause"]) == (want["verdict"], want["cause"]), interval
