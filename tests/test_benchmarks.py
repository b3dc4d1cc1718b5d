"""Smoke tests for benchmarks/: every script starts, and the shared timing code works.

Benchmarks must not become timed tests: nothing here asserts a speed or a target, only
that each script parses its options (so ``benchmarks/run_all.py`` and the README's
commands do not rot) and that the quickest one runs to its table.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = [*sorted(p.name for p in BENCH.glob("bench_*.py")), "run_all.py"]

sys.path.insert(0, str(BENCH))


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_benchmark_parses_its_options(script: str) -> None:
    proc = _run(str(BENCH / script), "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


def test_run_all_knows_every_benchmark_script() -> None:
    from run_all import BENCHMARKS

    listed = {script for _, script, _ in BENCHMARKS}
    assert {s for s in SCRIPTS if s.startswith("bench_")} <= listed


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


@pytest.mark.slow
def test_tick_benchmark_quick_run_prints_its_table() -> None:
    """bench_tick --quick runs in seconds; its pass/fail is the benchmark's business."""
    proc = _run(str(BENCH / "bench_tick.py"), "--quick", timeout=180)
    assert proc.returncode in (0, 1), proc.stderr
    assert "NVML part, 8 GPU" in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("whole tick, 8 GPU, 128 procs")
