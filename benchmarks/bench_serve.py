"""What `gpumon serve` costs a GPU node: CPU share, memory over time, scrape latency.

    python benchmarks/bench_serve.py [--quick | --smoke] [--seconds 180] [--gpus 8]
                                     [--intervals 1.0 0.1] [--scrape-every 1]

Runs the real daemon (``python -m gpumon serve``) as a subprocess against the fake NVML
library with 8 GPUs in a burst/gap pattern (so the detector and the histograms work),
each GPU held by a real process of a Slurm job (so job attribution runs), and scrapes
/metrics every second (``--scrape-every``; a Prometheus at 15 s scrapes less, but a p99
needs a hundred scrapes).  Per interval it reports the daemon's CPU share of one core
from /proc/PID/stat (its own and its reaped children's), its RSS at start (after
warm-up), each minute and at the end, and scrape latency (median, p99, max).

Targets (issues 5, "Honest speed"): < 1 % of a core at the default 1 s interval; RSS <
80 MB and flat; a scrape's p99 <= 20 ms.  Exit status 0 when all are met, 3 when one is
missed.  ``--quick``: 60 s a row; ``--smoke``: 5 s at 1 s, only to prove every figure is
produced.  The fake library's own cost is inside the daemon's CPU, so real NVML calls
(slower: microseconds each in the driver) add to the 10 Hz figure.

``--baseline-src DIR`` runs a second daemon from another source tree (say an earlier
commit, ``git archive REV gpumon | tar -x -C DIR``) beside this one, at the same time, on
the same fake GPUs and scrape schedule, and reports the CPU per tick of both and their
ratio: two daemons measured side by side see the same machine load.  The CPU per tick is
the daemon's CPU seconds over its own tick count (``gpumon_samples_total``).

The soak (``--soak-hours``, in this process): the daemon's state as ``gpumon serve``
builds it, stepped tick after tick on an emulated clock that gains a second a tick (each
tick reads a second of driver samples, ``_timing.OneHertz``), scraped every 15 ticks
(OpenMetrics, gzip: Prometheus' request), so hours of a daemon's life pass in minutes:
RSS and live objects each emulated half hour, and the growth per hour after the first
(its rings and histograms fill in the first minutes).  Target: flat (< 0.25 MiB an hour).
It is how a growth of ~2 MiB an hour was found (tracemalloc: episodes kept, 400 per GPU,
with their evidence and advice, by a memory no live face read them from).

Last, in this process, the cost of one re-enumeration (``NvmlSampler._rediscover``: the
GPU count, plus a handle and UUID call per lost GPU) against one tick of the same
sampler, interleaved (benchmarks/_timing.py), and what it adds per tick at its period.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import exit_status, machine_load, say_load  # noqa: E402
from fakenvml import FakeGPU, Pattern, Process, Scenario, fake_env, write_scenario  # noqa: E402

TICK_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """The process's CPU seconds, its waited-for children's included (py-spy's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / TICK_S  # utime + stime + cutime + cstime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> tuple[float, bytes]:
    s = time.perf_counter()
    with urllib.request.urlopen(url, timeout=5) as r:
        body = r.read()
    return (time.perf_counter() - s) * 1000.0, body


def wait_ready(url: str, limit_s: float = 120.0) -> None:
    """Until the daemon answers (it imports and opens NVML first: seconds on a busy box)."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            scrape(url)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def samples_total(body: bytes) -> float:
    for line in body.decode().splitlines():
        if line.startswith("gpumon_samples_total "):
            return float(line.split()[1])
    return float("nan")


def p99(values: list[float]) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(0.99 * (len(s) - 1)))]


def run_one(
    interval: float,
    seconds: float,
    n_gpus: int,
    tmp: Path,
    sources: dict[str, str | None],
    *,
    warmup_s: float = 15.0,
    scrape_every_s: float = 1.0,
) -> dict[str, dict[str, object]]:
    """Every daemon of ``sources`` (name -> source tree, None: this checkout) at once."""
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
    procs: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    for name, src in sources.items():
        port = free_port()
        env = fake_env(path)
        if src is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
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
                str(tmp / f"gpumon-{name}-{interval}.jsonl"),
            ],
            env=env,
            stderr=subprocess.DEVNULL,
            cwd=tmp,  # not a source tree: `-m gpumon` must find the one PYTHONPATH names
        )
        procs[name] = (proc, f"http://127.0.0.1:{port}/metrics")
    out: dict[str, dict[str, object]] = {}
    try:
        for _, url in procs.values():
            wait_ready(url)
        time.sleep(warmup_s)  # warm-up: first windows, detector start-up
        start = {}
        for name, (proc, url) in procs.items():
            _, body = scrape(url)
            start[name] = (cpu_seconds(proc.pid), samples_total(body), rss_mb(proc.pid))
        t0 = time.monotonic()
        scrapes: dict[str, list[float]] = {n: [] for n in procs}
        rss_max = {n: start[n][2] for n in procs}
        rss_trace = {n: [start[n][2]] for n in procs}  # one a minute: flat means bounded
        last: dict[str, bytes] = {}
        next_minute = t0 + 60
        order = list(procs)
        while time.monotonic() - t0 < seconds:
            order = order[1:] + order[:1]  # rotated: neither daemon always scraped first
            for name in order:
                proc, url = procs[name]
                ms, last[name] = scrape(url)
                scrapes[name].append(ms)
                rss_max[name] = max(rss_max[name], rss_mb(proc.pid))
            if time.monotonic() >= next_minute:
                for name, (proc, _) in procs.items():
                    rss_trace[name].append(rss_mb(proc.pid))
                next_minute += 60
            time.sleep(scrape_every_s)
        t1 = time.monotonic()
        for name, (proc, url) in procs.items():
            _, body = scrape(url)
            cpu1, ticks1 = cpu_seconds(proc.pid), samples_total(body)
            cpu0, ticks0, rss0 = start[name]
            if warmup_s >= 10:  # (a smoke run's detector may still be starting up)
                assert b'state="starved"' in last[name], name
            out[name] = {
                "interval_s": interval,
                "cpu_pct": 100.0 * (cpu1 - cpu0) / (t1 - t0),
                "cpu_per_tick_ms": 1000.0 * (cpu1 - cpu0) / max(1.0, ticks1 - ticks0),
                "rss_start_mb": rss0,
                "rss_end_mb": rss_mb(proc.pid),
                "rss_max_mb": rss_max[name],
                "scrape_p50_ms": statistics.median(scrapes[name]),
                "scrape_p99_ms": p99(scrapes[name]),
                "scrape_max_ms": max(scrapes[name]),
                "scrapes": len(scrapes[name]),
                "seconds": t1 - t0,
                "body_kb": len(body) / 1024.0,
                "rss_trace": rss_trace[name],
                "build": next(
                    (ln for ln in body.decode().splitlines() if ln.startswith("gpumon_build")), ""
                ),
            }
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            proc.wait(timeout=20)
        for h in holders:
            h.kill()
            h.wait()
    return out


def soak(hours: float, n_gpus: int, scenario: Path) -> list[tuple[float, float, int]]:
    """(emulated hours, RSS MiB, live objects) at every tenth of an accelerated soak (see
    the module docstring), in this process, whose fake NVML reads ``scenario``."""
    import gc

    from _timing import OneHertz, clock_modules, nvml_sampler_of
    from prometheus_client import disable_created_metrics

    from gpumon.engine import LiveOptions, Session
    from gpumon.faces.serve.collector import make_registry
    from gpumon.faces.serve.config import ServeConfig
    from gpumon.faces.serve.daemon import ServeState, detector_config, job_options
    from gpumon.faces.serve.http import WebApp
    from gpumon.faces.serve.log import EventLog

    holders = [
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(100000)"],
            env=dict(os.environ, SLURM_JOB_ID=str(5000 + i // 4)),
        )
        for i in range(n_gpus)
    ]
    try:
        scn = Scenario(
            gpus=[
                FakeGPU(
                    pattern=Pattern.burst(period_s=0.7, duty=0.6, phase_s=i * 0.05),
                    processes=[Process(pid=holders[i].pid)],
                )
                for i in range(n_gpus)
            ]
        )
        write_scenario(scenario, scn)
        time.sleep(0.05)  # the fake rereads its scenario within 10 ms
        disable_created_metrics()
        cfg = ServeConfig(log_path=str(scenario.with_suffix(".jsonl")))
        node = Session.live(
            LiveOptions(interval_s=1.0), jobs=job_options(cfg), config=detector_config(cfg)
        )
        clock = [1000.0]  # the daemon's own clocks, a second a tick
        state = ServeState(
            node, cfg, EventLog(cfg.log_path), mono=lambda: clock[0], wall=lambda: clock[0] + 1.7e9
        )
        hz = OneHertz(nvml_sampler_of(node), clock_modules())
        app = WebApp(cfg, make_registry(state))
        env = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": "/metrics",
            "HTTP_ACCEPT": "application/openmetrics-text;version=1.0.0",
            "HTTP_ACCEPT_ENCODING": "gzip",
        }
        out = []
        every = max(60, int(hours * 360))
        with hz.installed():
            for k in range(int(hours * 3600) + 1):
                if k % every == 0:
                    gc.collect()
                    out.append((k / 3600, rss_mb(os.getpid()), len(gc.get_objects())))
                hz.step()
                clock[0] += 1.0
                state.step()
                if k % 15 == 0:
                    app(env, lambda *_: None)
        assert state.tick_errors_total == 0
        node.close()
        return out
    finally:
        for h in holders:
            h.kill()
            h.wait()


def rediscovery_cost(n_gpus: int, tmp: Path) -> dict[str, float]:
    """One re-enumeration against one tick, in this process on the fake (µs of CPU): with
    every GPU up, then with GPU 0 off the bus (asked again, and still gone, each time)."""
    import logging

    from _timing import interleaved
    from fakenvml import load_in_process

    from gpumon.sample.nvml import NvmlSampler

    logging.getLogger("gpumon").setLevel(logging.CRITICAL)  # the lost GPU's line, once
    scn = Scenario.uniform(n_gpus)
    path = write_scenario(tmp / "rediscover.txt", scn)
    load_in_process(path)
    sampler = NvmlSampler(rediscover_every_s=1e9)  # only when the benchmark asks
    up = interleaved(
        {"tick": sampler.sample, "rediscover": lambda: sampler._rediscover(time.monotonic())},
        rounds=15,
        per_batch={"tick": 50, "rediscover": 200},
    )
    write_scenario(path, scn.with_gpu(0, lost=True))
    time.sleep(0.05)  # the fake rereads its scenario within 10 ms
    sampler.sample()  # GPU 0 found lost
    assert sampler._gpus[0].lost
    down = interleaved(
        {
            "tick_one_lost": sampler.sample,
            "rediscover_one_lost": lambda: sampler._rediscover(time.monotonic()),
        },
        rounds=15,
        per_batch={"tick_one_lost": 50, "rediscover_one_lost": 200},
    )
    assert sampler._gpus[0].lost  # asked again every time, never wrongly revived
    return {k: v.cpu_us for k, v in {**up, **down}.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="60 s a row")
    mode.add_argument("--smoke", action="store_true", help="5 s at 1 s, numbers moot")
    ap.add_argument("--seconds", type=float, default=180.0, help="measured time per interval")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--intervals", type=float, nargs="+", default=[1.0, 0.1])
    ap.add_argument("--scrape-every", type=float, default=1.0, help="seconds between scrapes")
    ap.add_argument(
        "--soak-hours", type=float, default=6.0, help="emulated hours of the accelerated soak"
    )
    ap.add_argument(
        "--baseline-src",
        metavar="DIR",
        help="a gpumon source tree to run beside this one (its gpumon/ package in DIR)",
    )
    args = ap.parse_args()
    warmup_s = 15.0
    if args.quick:
        args.seconds, args.soak_hours = 60.0, 3.0
    if args.smoke:
        args.seconds, args.intervals, warmup_s, args.soak_hours = 5.0, [1.0], 3.0, 0.2
    sources: dict[str, str | None] = {"gpumon": None}
    if args.baseline_src:
        sources["baseline"] = str(Path(args.baseline_src).resolve())
    rows = []
    print(f"# {machine_load()}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        for interval in args.intervals:
            say_load(f"interval {interval:g} s: start")
            rows.append(
                run_one(
                    interval, args.seconds, args.gpus, Path(d), sources,
                    warmup_s=warmup_s, scrape_every_s=args.scrape_every,
                )
            )  # fmt: skip
            say_load(f"interval {interval:g} s: end")
        redisc = rediscovery_cost(args.gpus, Path(d))  # (loads the fake NVML here)
        say_load(f"soak, {args.soak_hours:g} h emulated: start")
        soaked = soak(args.soak_hours, args.gpus, Path(d) / "rediscover.txt")
        say_load("soak: end")
    print(
        f"gpumon serve, {args.gpus} fake GPUs, {args.seconds:.0f} s measured per row, "
        f"a scrape every {args.scrape_every:g} s; {machine_load()}"
    )
    print(
        "| daemon | interval | CPU (% of a core) | CPU per tick | target | "
        "RSS start -> end (max) MB | target | scrape p50 / p99 / max ms (n) | target | "
        "/metrics size |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for row in rows:
        for name, r in row.items():
            at_1s = r["interval_s"] >= 1.0  # type: ignore[operator]
            cpu_target = "< 1 %" if at_1s else "-"
            if name == "gpumon":
                ok &= r["scrape_p99_ms"] <= 20.0 and r["rss_max_mb"] < 80.0  # type: ignore[operator]
                ok &= not at_1s or r["cpu_pct"] < 1.0  # type: ignore[operator]
            print(
                f"| {name} | {r['interval_s']:g} s | {r['cpu_pct']:.2f} | "
                f"{r['cpu_per_tick_ms']:.2f} ms | {cpu_target} | "
                f"{r['rss_start_mb']:.1f} -> {r['rss_end_mb']:.1f} ({r['rss_max_mb']:.1f}) | "
                f"< 80, flat | {r['scrape_p50_ms']:.1f} / {r['scrape_p99_ms']:.1f} / "
                f"{r['scrape_max_ms']:.1f} ({r['scrapes']}) | p99 <= 20 | {r['body_kb']:.0f} KiB |"
            )
    for row in rows:
        for name, r in row.items():
            trace = " ".join(f"{x:.1f}" for x in r["rss_trace"])  # type: ignore[attr-defined]
            print(f"RSS per minute, {name} at {r['interval_s']:g} s (MB): {trace}")
    for name, r in rows[0].items():
        print(f"{name} ran: {r['build']}")  # which code each daemon really was
    print("soak (emulated hours: RSS MiB, live objects): " + ", ".join(
        f"{h:.2f} h: {mb:.2f}, {n}" for h, mb, n in soaked
    ))  # fmt: skip
    settled = min(1.0, soaked[-1][0] / 2)  # its rings and histograms fill first
    after_first = [(h, mb) for h, mb, _ in soaked if h >= settled]
    if len(after_first) >= 2:
        (h0, mb0), (h1, mb1) = after_first[0], after_first[-1]
        growth = (mb1 - mb0) / (h1 - h0)
        flat = growth < 0.25
        ok &= flat
        print(
            f"| soak RSS growth from {h0:.2f} h on | {growth:+.2f} MiB/h over {h1 - h0:.2f} "
            f"emulated h | < 0.25 MiB/h | {'PASS' if flat else 'FAIL'} |"
        )
    if "baseline" in sources:
        for row in rows:
            a, b = row["gpumon"], row["baseline"]
            print(
                f"CPU per tick at {a['interval_s']:g} s: gpumon / baseline = "
                f"{a['cpu_per_tick_ms'] / b['cpu_per_tick_ms']:.2f} "  # type: ignore[operator]
                f"({a['cpu_per_tick_ms']:.2f} / {b['cpu_per_tick_ms']:.2f} ms, side by side)"
            )
    per_tick = redisc["rediscover"] / 10.0  # every 10 s at the default 1 s interval
    print(
        f"re-enumeration: {redisc['rediscover']:.1f} µs CPU against {redisc['tick']:.0f} µs "
        f"for one tick of {args.gpus} GPUs ({redisc['rediscover_one_lost']:.1f} µs against "
        f"{redisc['tick_one_lost']:.0f} µs with one GPU lost); every 10 s at a 1 s interval "
        f"that is {per_tick:.2f} µs a tick ({100.0 * per_tick / redisc['tick']:.3f} % of one)"
    )
    return exit_status(ok)


if __name__ == "__main__":
    raise SystemExit(main())
