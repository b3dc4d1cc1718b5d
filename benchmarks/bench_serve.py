"""What `gpumon serve` costs a GPU node: CPU share, memory over time, scrape latency.

    python benchmarks/bench_serve.py [--seconds 180] [--gpus 8] [--intervals 1.0 0.1]

Runs the real daemon (``python -m gpumon serve``) as a subprocess against the fake NVML
library with 8 GPUs in a burst/gap pattern (so the detector and the histograms work),
each GPU held by a real process of a Slurm job (so job attribution runs), and scrapes
/metrics every 5 s (a Prometheus at 15 s would scrape less).  Per interval it reports
the daemon's CPU share of one core from /proc/PID/stat, its RSS at start (after warm-up)
and at the end, and scrape latency (median and max).

Targets (issue 5): < 1 % of a core at the default 1 s interval; RSS < 80 MB and flat;
a scrape < 20 ms.  The fake library's own cost is inside the daemon's CPU, so real NVML
calls (slower: microseconds each in the driver) add to the 10 Hz figure.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakenvml import FakeGPU, Pattern, Process, Scenario, fake_env, write_scenario  # noqa: E402

TICK_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK_S  # utime + stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(interval: float, seconds: float, n_gpus: int, tmp: Path) -> dict[str, float]:
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(100000)"],
            env=dict(os.environ, SLURM_JOB_ID=str(5000 + i // 4)),
        )
        for i in range(n_gpus)
    ]
    scn = Scenario(
        gpus=[
            FakeGPU(
                pattern=Pattern.burst(period_s=0.7, duty=0.6, phase_s=i * 0.05),
                processes=[Process(pid=holders[i].pid)],
            )
            for i in range(n_gpus)
        ]
    )
    path = write_scenario(tmp / f"scenario-{interval}.txt", scn)
    port = free_port()
    log = tmp / f"gpumon-{interval}.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpumon",
            "serve",
            "--config",
            os.devnull,
            "--listen",
            f"127.0.0.1:{port}",
            "--interval",
            str(interval),
            "--log",
            str(log),
        ],
        env=fake_env(path),
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        time.sleep(15)  # warm-up: imports, first windows, detector start-up
        rss0 = rss_mb(proc.pid)
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        scrapes: list[float] = []
        rss_max = rss0
        rss_trace = [rss0]  # one reading per minute: flat means bounded state
        next_minute = t0 + 60
        while time.monotonic() - t0 < seconds:
            s = time.perf_counter()
            with urllib.request.urlopen(url, timeout=5) as r:
                body = r.read()
            scrapes.append((time.perf_counter() - s) * 1000.0)
            rss_max = max(rss_max, rss_mb(proc.pid))
            if time.monotonic() >= next_minute:
                rss_trace.append(rss_mb(proc.pid))
                next_minute += 60
            time.sleep(5)
        cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
        rss1 = rss_mb(proc.pid)
        assert b'state="starved"' in body
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        for h in holders:
            h.kill()
            h.wait()
    return {
        "interval_s": interval,
        "cpu_pct": 100.0 * (cpu1 - cpu0) / (t1 - t0),
        "rss_start_mb": rss0,
        "rss_end_mb": rss1,
        "rss_max_mb": rss_max,
        "scrape_p50_ms": statistics.median(scrapes),
        "scrape_max_ms": max(scrapes),
        "scrapes": len(scrapes),
        "seconds": t1 - t0,
        "body_kb": len(body) / 1024.0,
        "rss_trace": rss_trace,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=180.0, help="measured time per interval")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--intervals", type=float, nargs="+", default=[1.0, 0.1])
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for interval in args.intervals:
            rows.append(run_one(interval, args.seconds, args.gpus, Path(d)))
    print(
        f"gpumon serve, {args.gpus} fake GPUs, {args.seconds:.0f} s measured per row, "
        f"{os.cpu_count()} CPUs"
    )
    print(
        "| interval | CPU (% of a core) | target | RSS start -> end (max) MB | target | "
        "scrape p50 / max ms | target | /metrics size |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        cpu_target = "< 1 %" if r["interval_s"] >= 1.0 else "-"
        print(
            f"| {r['interval_s']:g} s | {r['cpu_pct']:.2f} | {cpu_target} | "
            f"{r['rss_start_mb']:.1f} -> {r['rss_end_mb']:.1f} ({r['rss_max_mb']:.1f}) | "
            f"< 80, flat | {r['scrape_p50_ms']:.1f} / {r['scrape_max_ms']:.1f} | < 20 | "
            f"{r['body_kb']:.0f} KiB |"
        )
    for r in rows:
        trace = " ".join(f"{x:.1f}" for x in r["rss_trace"])
        print(f"RSS per minute at {r['interval_s']:g} s (MB): {trace}")


if __name__ == "__main__":
    main()
