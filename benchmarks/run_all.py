"""Run every gpumon benchmark in sequence; each prints its own results table last.

    python benchmarks/run_all.py            # full runs (about an hour on 2 cores)
    python benchmarks/run_all.py --quick    # shorter runs (about 20 minutes)
    python benchmarks/run_all.py --smoke    # every figure once, numbers moot (about 5 minutes)
    python benchmarks/run_all.py --only tick peers

Each benchmark runs as its own process (so one's imports, NVML state and memory do not
colour the next), given ``--quick`` or ``--smoke`` (every script has both;
tests/test_benchmarks.py runs each ``--smoke`` to its table, so a benchmark that crashes
fails CI).  A benchmark that ran to its table and missed a target
exits with ``EXIT_MISSED`` (3, benchmarks/_timing.py); any other non-zero status is a
crash (a traceback exits 1) and is reported as one, never as a missed target.  The exit
status is non-zero if any benchmark missed a target or crashed; the summary at the end
says which.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _timing import EXIT_MISSED, machine_load  # noqa: E402

#: (short name, script, what it measures): issue 7's items 1-5, in that order, and issue
#: 12's daemon tick after the peers.
BENCHMARKS: tuple[tuple[str, str, str], ...] = (
    ("tick", "bench_tick.py", "the tick at 1 Hz and its parts against the NVML and stat floors"),
    ("peers", "bench_peers.py", "one tick against nvitop and gpustat queries"),
    ("daemon_tick", "bench_daemon_tick.py", "the daemon's tick against the in-process tick"),
    ("serve", "bench_serve.py", "the daemon: CPU share, RSS, scrape latency"),
    ("analyze", "bench_analyze.py", "analysis throughput (healthy and starved) and peak memory"),
    ("detector", "bench_detector.py", "detection precision/recall and latency"),
    (
        "stacks",
        "bench_stacks.py",
        "watch --stacks: its extra CPU, py-spy's included; the job's speed read or not",
    ),
    ("live", "bench_live.py", "the live path (watch, serve, analyze) on the live lab"),
    (
        "fleet",
        "bench_fleet.py",
        "report --top and --job against a backfilled Prometheus: a cluster's week, two scales",
    ),
)


def command(script: Path, mode: str | None) -> list[str]:
    """How a benchmark is run: ``mode`` is "quick", "smoke" or None (the full run)."""
    return [sys.executable, str(script), *([f"--{mode}"] if mode else [])]


def outcome(rc: int) -> str:
    """What an exit status says: ok, a target missed, or a crash."""
    if rc == 0:
        return "ok"
    if rc == EXIT_MISSED:
        return "a target missed"
    return f"CRASHED (exit {rc})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="each benchmark's shorter run")
    mode.add_argument("--smoke", action="store_true", help="each figure once, numbers moot")
    parser.add_argument(
        "--only", nargs="+", choices=[b[0] for b in BENCHMARKS], help="run only these"
    )
    args = parser.parse_args()
    chosen = [b for b in BENCHMARKS if not args.only or b[0] in args.only]
    summary: list[tuple[str, str, float, str]] = []
    for name, script_name, what in chosen:
        script = HERE / script_name
        if not script.exists():
            summary.append((name, "missing", 0.0, what))
            continue
        cmd = command(script, "quick" if args.quick else "smoke" if args.smoke else None)
        print(f"\n=== {name}: {what}\n$ {' '.join(cmd[1:])}", flush=True)
        started = time.monotonic()
        rc = subprocess.run(cmd, check=False).returncode
        status = outcome(rc)
        summary.append((name, status, time.monotonic() - started, what))
    print(f"\n=== summary ({machine_load()})")
    for name, status, seconds, what in summary:
        print(f"{name:11} {status:20} {seconds:6.0f} s  {what}")
    return 0 if all(s[1] == "ok" for s in summary) else 1  # (missed or crashed: see above)


if __name__ == "__main__":
    raise SystemExit(main())
