"""The benchmarks run: every script's ``--smoke`` form runs to its table, so a benchmark
that crashes (bench_daemon_tick did, unseen, for weeks) fails here, not in front of the
person who wants its figure.

Benchmarks must not become timed tests: nothing here asserts a speed or a target.  A
smoke run does every step of its benchmark with the least repetition (a few ticks 50 ms
apart, tiny files, short phases), so its numbers mean nothing; what is checked is that it
ran through (exit 0, or ``EXIT_MISSED``: a target missed is the benchmark's business) and
printed the figures its table is made of.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = [*sorted(p.name for p in BENCH.glob("bench_*.py")), "run_all.py"]

sys.path.insert(0, str(BENCH))

#: What each benchmark's table says once it produced its figures (lines it must print).
FIGURES: dict[str, tuple[str, ...]] = {
    "bench_tick.py": (
        "NVML part, 1 GPU, starved",
        "NVML part, 64 GPUs, starved",
        "whole tick, 8 GPUs, healthy + 32 procs",
        "whole tick, 8 GPUs, starved + 128-proc job",
        "judging, 8 GPUs, healthy",
        "judging, 8 GPUs, starved",
        "per process at",
        "outside scan at",
    ),
    "bench_daemon_tick.py": ("daemon tick / in-process tick, 8 GPU, 32 procs",),
    "bench_peers.py": ("tick vs fastest full refresh, 8 GPU, 2 procs/GPU",),
    "bench_serve.py": ("| gpumon | 1 s |", "| soak RSS growth from", "re-enumeration:"),
    "bench_analyze.py": (
        "[gpumon trace 24h 8 GPU 6/s, a third starved]",
        "[gpumon record of a starved run, 4 causes]",
        "[nvidia-smi CSV 1M rows, a third starved]",
        "samples/s, CPU, end to end",
    ),
    "bench_detector.py": ("cause accuracy:", "latency:"),
    "bench_stacks.py": ("extra CPU of --stacks, py-spy included", "job steps/s, read / unread"),
    "bench_live.py": ("runs with every target met",),
    "bench_fleet.py": (
        "report --top 20 --since 7d, wall s",
        "report --top 20 --since 7d --by user, peak RSS MiB",
        "report --job ID --since 7d, samples touched",
        "samples touched by the ranking query (records)",
    ),
}


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_benchmark_parses_its_options(script: str) -> None:
    proc = _run(str(BENCH / script), "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout
    assert "--quick" in proc.stdout and "--smoke" in proc.stdout  # run_all passes either


def test_run_all_knows_every_benchmark_script() -> None:
    from run_all import BENCHMARKS

    listed = {script for _, script, _ in BENCHMARKS}
    assert {s for s in SCRIPTS if s.startswith("bench_")} == listed == set(FIGURES)


def test_run_all_reports_a_crash_as_a_crash(tmp_path: Path) -> None:
    """A benchmark that raises is a crash in the summary, never "a target missed"."""
    import run_all

    (tmp_path / "bench_boom.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "bench_miss.py").write_text(
        f"import sys; sys.path.insert(0, {str(BENCH)!r})\n"
        "from _timing import exit_status\nraise SystemExit(exit_status(False))\n"
    )
    proc = _run(
        "-c",
        f"import sys; sys.path.insert(0, {str(BENCH)!r})\n"
        "import run_all\n"
        f"run_all.HERE = __import__('pathlib').Path({str(tmp_path)!r})\n"
        "run_all.BENCHMARKS = (('boom', 'bench_boom.py', 'x'), ('miss', 'bench_miss.py', 'y'))\n"
        "sys.argv = ['run_all.py']\n"
        "raise SystemExit(run_all.main())\n",
    )
    assert proc.returncode == 1, proc.stderr
    summary = proc.stdout.split("=== summary", 1)[1].splitlines()
    assert any(line.startswith("boom") and "CRASHED (exit 1)" in line for line in summary)
    assert any(line.startswith("miss") and "a target missed" in line for line in summary)
    assert run_all.outcome(0) == "ok"


def test_interleaved_timing_and_ratios() -> None:
    from _timing import Timing, interleaved, ratio, table

    calls = {"a": 0, "b": 0}

    def a() -> None:
        calls["a"] += 1

    def b() -> None:
        calls["b"] += 1
        sum(range(200))

    res = interleaved({"a": a, "b": b}, rounds=4, per_batch={"a": 3, "b": 2}, warmup=1)
    assert calls == {"a": 1 + 4 * 3, "b": 1 + 4 * 2}
    assert all(len(t.walls) == len(t.cpus) == 4 for t in res.values())
    fixed = Timing(1.0, 1.0, (1.0, 2.0, 4.0), (1.0, 2.0, 4.0))
    double = Timing(2.0, 2.0, (2.0, 4.0, 8.0), (2.0, 4.0, 8.0))
    assert ratio(double, fixed) == 2.0
    assert ratio(double, (fixed, double)) == 2.0  # against the per-round faster one
    text = table([("x", "1", "2", "0.50", "<= 1", "PASS")])
    head = ["figure", "gpumon", "baseline", "ratio", "target", "pass"]
    assert text.splitlines()[0].split() == head


def test_calls_at_a_cadence_with_their_parts() -> None:
    """Each contender once a period, its parts timed inside the call; a run's figure is a
    mean, so a call that costs more every few calls (a scan every 5 s) counts."""
    import time

    from _timing import Parts, Ticks, at_cadence, run_ratio

    parts = Parts()
    count = [0]

    def spin(seconds: float) -> None:
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass

    inner = parts.timed("inner", spin)

    def tick() -> None:
        count[0] += 1
        inner(0.004 if count[0] % 3 == 0 else 0.001)

    started = time.monotonic()
    got = at_cadence({"tick": tick, "idle": lambda: None}, calls=6, period_s=0.05, warmup=1,
                     parts={"tick": parts})  # fmt: skip
    assert time.monotonic() - started >= 6 * 0.05  # paced, not back to back
    assert count[0] == 7 and len(got["tick"].cpus) == len(got["tick"].parts["inner"]) == 6
    assert got["tick"].figure(1) >= got["tick"].figure(1, "inner") >= 1000 * (4 + 4 + 1 * 4) / 6
    assert all(c >= p for c, p in zip(got["tick"].cpus, got["tick"].parts["inner"], strict=True))
    fixed = Ticks([1.0, 1.0, 2.0, 2.0])
    double = Ticks([2.0, 2.0, 4.0, 4.0])
    assert double.run_means(2) == [2.0, 4.0] and run_ratio(double, fixed, 2) == 2.0


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(FIGURES))
def test_each_benchmark_smoke_run_produces_its_figures(script: str) -> None:
    """``--smoke`` runs every step of the benchmark; a crash fails here.  The timeout is
    a bound for a machine at load 20, not a speed target."""
    from _timing import EXIT_MISSED

    if script == "bench_fleet.py":
        for tool in ("promtool", "prometheus"):
            if shutil.which(tool) is None:
                pytest.skip(f"{tool} not installed (apt-get install prometheus)")
    proc = _run(str(BENCH / script), "--smoke", timeout=900)
    assert proc.returncode in (0, EXIT_MISSED), (proc.returncode, proc.stderr[-3000:])
    for figure in FIGURES[script]:
        assert figure in proc.stdout, (figure, proc.stdout[-3000:])
