"""Run every gpumon benchmark in sequence; each prints its own results table last.

    python benchmarks/run_all.py            # full runs (about 25 minutes on 2 cores)
    python benchmarks/run_all.py --quick    # smoke runs (about 6 minutes)
    python benchmarks/run_all.py --only tick peers

Each benchmark runs as its own process (so one's imports, NVML state and memory do not
colour the next), with ``--quick`` where it has one; ``bench_serve`` has none, so the
quick run gives it a shorter soak (``--seconds``).  Options a script does not list in its
``--help`` are never passed.  The exit status is non-zero if any benchmark failed a target
or crashed; the summary at the end says which.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: (short name, script, what it measures): issue 7's items 1-5, in that order, and issue
#: 12's daemon tick after the peers.
BENCHMARKS: tuple[tuple[str, str, str], ...] = (
    ("tick", "bench_tick.py", "one tick against the bare-pynvml floor"),
    ("peers", "bench_peers.py", "one tick against nvitop and gpustat queries"),
    ("daemon_tick", "bench_daemon_tick.py", "the daemon's tick against the in-process tick"),
    ("serve", "bench_serve.py", "daemon soak: CPU share, RSS, scrape latency"),
    ("analyze", "bench_analyze.py", "analysis throughput and peak memory"),
    ("detector", "bench_detector.py", "detection precision/recall and latency"),
    (
        "stacks",
        "bench_stacks.py",
        "--stacks: py-spy and gpumon CPU, the job's step time read or not",
    ),
    ("live", "bench_live.py", "the live path (watch, serve, analyze) on the live lab"),
)
QUICK_SERVE_SECONDS = "30"


def options_of(script: Path) -> str:
    """The script's --help text ('' if it cannot even print that)."""
    proc = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60
    )
    return proc.stdout if proc.returncode == 0 else ""


def command(script: Path, quick: bool) -> list[str]:
    cmd = [sys.executable, str(script)]
    if quick:
        helptext = options_of(script)
        if "--quick" in helptext:
            cmd.append("--quick")
        elif "--seconds" in helptext:
            cmd += ["--seconds", QUICK_SERVE_SECONDS]
    return cmd


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's smoke mode")
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
        cmd = command(script, args.quick)
        print(f"\n=== {name}: {what}\n$ {' '.join(cmd[1:])}", flush=True)
        started = time.monotonic()
        rc = subprocess.run(cmd, check=False).returncode
        status = "ok" if rc == 0 else f"exit {rc}" + (" (a target missed)" if rc == 1 else "")
        summary.append((name, status, time.monotonic() - started, what))
    print("\n=== summary")
    for name, status, seconds, what in summary:
        print(f"{name:9} {status:24} {seconds:6.0f} s  {what}")
    return 0 if all(s[1] == "ok" for s in summary) else 1


if __name__ == "__main__":
    raise SystemExit(main())
