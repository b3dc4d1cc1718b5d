"""How fast `gpumon analyze` reads and judges a day of logs, healthy and starved.

    python benchmarks/bench_analyze.py            # the full figures (about 15 minutes on 2 cores)
    python benchmarks/bench_analyze.py --quick    # 1/8 of the sizes
    python benchmarks/bench_analyze.py --smoke    # tiny files, one run: numbers moot

Generates, in a temporary folder:

* a 24 h, 8-GPU gpumon trace at 6 samples/s per GPU in the compact form (1 s ticks of 6
  driver samples and the headline readings: ~4.1 M samples), healthy but for its middle
  third, starved (3 s of work, 2 s of gap);
* the same day as ``gpumon record --pid`` writes it (every NVML field, the host with 64
  cores, a trainer and 8 workers: ~120 B a sample), the middle third starved;
* a **starved run** as ``gpumon record --pid`` writes it of a starved lab job: 8 GPUs
  stepping every 0.8-1.2 s at a duty of 0.35-0.7, never healthy, waiting in turn on its
  workers' CPU, on storage, on the GIL and on other processes' load (the host's and the
  tree's readings move as they would), so the detector judges at the live cadence
  throughout and names four causes;
* nvidia-smi --query-gpu CSV logs of 1 M and 4 M rows (``-lms 167``, 8 GPUs), the middle
  third starved; and a 24 h ``nvidia-smi dmon`` log (8 GPUs, 1 s), the same.

Each is analysed by ``gpumon analyze --json`` in-process, in a fresh child process so that
its peak RSS is its own, several times (the median run is reported).  Times are CPU
seconds of that process (``time.process_time``), which is what "on one core" means and
stays meaningful on a busy machine; wall seconds are shown too.  "read" is the share spent
in the reader (inside ``next()``), the rest is the detector and the report.  "x bare
parse" divides the analysis CPU time by that of the same process reading and splitting
every line of the file and building nothing (``json.loads`` per line of a trace,
``str.split`` per line of a log): a baseline from the same run, steadier than seconds on a
shared machine.

Budgets (issue "Honest speed"): a starved trace from ``record`` >= 500 k samples/s, a
compact trace >= 1 M/s, nvidia-smi CSV (a third starved) >= 500 k/s, all end to end on
one core; peak memory flat.  Exit status 0 when all are met, 3 when one is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import exit_status, machine_load, say_load  # noqa: E402

START = 1714564800  # 2024-05-01 12:00:00 UTC
#: Samples per second of CPU each kind of log must be analysed at (``None``: reported only).
TARGETS: dict[str, float | None] = {"compact": 1_000_000, "record": 500_000, "csv": 500_000}


# --- generators (plain strings: the generator must not be the slow part) ----------------


def _util(rng: random.Random, t: float, gpu: int, span_s: float) -> int:
    """Healthy for the first third of the log, then starved (3 s busy / 2 s idle), then
    healthy again."""
    if span_s / 3 <= t < 2 * span_s / 3 and (t + 0.3 * gpu) % 5.0 >= 3.0:
        return rng.randint(0, 3)
    return rng.randint(88, 100)


def write_gpumon_trace(path: Path, hours: float, gpus: int = 8, rate: int = 6) -> int:
    rng = random.Random(1)
    header = {
        "format": "gpumon-trace",
        "version": 1,
        "header": {
            "source": "gpumon",
            "interval_s": 1.0,
            "started_wall_s": START,
            "started_mono_s": 0.0,
            "gpus": [
                {
                    "index": g,
                    "uuid": f"GPU-{g:08d}",
                    "name": "NVIDIA H100",
                    "mem_total_bytes": 85899345920,
                    "power_limit_watts": 700.0,
                }
                for g in range(gpus)
            ],
        },
    }
    samples = 0
    span = hours * 3600
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        for k in range(int(hours * 3600)):
            t = float(k)
            parts = []
            for g in range(gpus):
                pts = []
                for j in range(rate):
                    ts = round(t - 1 + (j + 1) / rate, 4)
                    pts.append(f"[{ts},{_util(rng, ts, g, span)}]")
                u = _util(rng, t, g, span)
                parts.append(
                    f'{{"gpu":{g},"uuid":"GPU-{g:08d}","util_samples":[{",".join(pts)}],'
                    f'"util_pct":{u},"mem_used_bytes":{60000 << 20},'
                    f'"mem_total_bytes":85899345920,"power_watts":{150 + 5 * u},'
                    f'"power_limit_watts":700.0}}'
                )
                samples += rate
            f.write(f'{{"t":{t},"gpus":[{",".join(parts)}]}}\n')
    return samples


def write_recorded_trace(path: Path, hours: float, gpus: int = 8, rate: int = 6) -> int:
    """A trace shaped as ``gpumon record --pid`` writes it (~100 B a sample): every GPU field
    NVML gives (processes, clocks, temperature, PCIe every 5 s), the host (64 cores), and a
    watched tree of a trainer and 8 DataLoader workers -- written by the real TraceWriter
    from model objects, so the shape cannot drift from what record writes."""
    sys.path.insert(0, str(ROOT))
    from gpumon.model import Snapshot
    from gpumon.traces.jsonl import TraceWriter

    rng = random.Random(4)
    span = hours * 3600
    header = _record_header(gpus)
    samples = 0
    with TraceWriter.open(path, header) as w:
        for k in range(int(span)):
            t = float(k)
            gs = []
            for g in range(gpus):
                pts = tuple(
                    (
                        round(t - 1 + (j + 1) / rate, 6),
                        float(_util(rng, t - 1 + (j + 1) / rate, g, span)),
                    )
                    for j in range(rate)
                )
                gs.append(_record_gpu(header, t, g, pts, float(_util(rng, t, g, span)), k, rng))
                samples += rate
            host = _record_host(rng, t, [rng.uniform(0, 100) for _ in range(64)], 0.4, 1.5e8)
            tree = _record_tree(t, 99.5, [rng.uniform(60, 100) for _ in range(8)], "running")
            w.write(Snapshot(t_s=t, gpus=tuple(gs), host=host, tree=tree))
    return samples


#: The starved run's phases, each a quarter of it: what the job waits on, and the host's
#: readings that show it (main process CPU %, per-worker CPU %, worker status, iowait %,
#: disk reads/s, other processes' CPU % per core).
STARVED_PHASES = (
    ("cpu", 40.0, 99.0, "running", 1.0, 5e6, 0.0),
    ("io", 20.0, 8.0, "disk-sleep", 45.0, 9e8, 0.0),
    ("gil", 100.0, 2.0, "sleeping", 0.5, 1e6, 0.0),
    ("contention", 30.0, 25.0, "running", 0.5, 1e6, 97.0),
)


def write_starved_recording(path: Path, hours: float, gpus: int = 8, rate: int = 6) -> int:
    """A starved lab job as ``gpumon record --pid`` writes it (see the module docstring):
    each GPU steps every 0.8-1.2 s, computing 35-70 % of each step, the step and duty
    drifting as a real loader's do; the cause changes each quarter of the run."""
    from gpumon.model import Snapshot
    from gpumon.traces.jsonl import TraceWriter

    rng = random.Random(5)
    span = hours * 3600
    header = _record_header(gpus)
    cores = 64
    samples = 0
    # Each GPU's step: its period and duty, drifting every ~30 s; the next step's start.
    period = [rng.uniform(0.8, 1.2) for _ in range(gpus)]
    duty = [rng.uniform(0.35, 0.7) for _ in range(gpus)]
    with TraceWriter.open(path, header) as w:
        for k in range(int(span)):
            t = float(k)
            _cause, main, worker, status, iowait, reads, outside = STARVED_PHASES[
                min(3, int(4 * t / span))
            ]
            gs = []
            for g in range(gpus):
                if rng.random() < 1 / 30:
                    period[g] = min(1.2, max(0.8, period[g] + rng.uniform(-0.1, 0.1)))
                    duty[g] = min(0.7, max(0.35, duty[g] + rng.uniform(-0.05, 0.05)))
                pts = []
                for j in range(rate):
                    ts = round(t - 1 + (j + 1) / rate + rng.uniform(-0.004, 0.004), 6)
                    phase = (ts + 0.13 * g) % period[g]
                    busy = phase < duty[g] * period[g]
                    pts.append((ts, float(rng.randint(92, 100) if busy else rng.randint(0, 4))))
                u = pts[-1][1]
                gs.append(_record_gpu(header, t, g, tuple(pts), u, k, rng))
                samples += rate
            tree_cpu = main + 8 * worker
            per_core = [
                min(100.0, tree_cpu / cores + outside + rng.uniform(0, 3)) for _ in range(cores)
            ]
            host = _record_host(rng, t, per_core, iowait, reads)
            workers = [min(100.0, worker + rng.uniform(-3, 3)) for _ in range(8)]
            tree = _record_tree(t, main, workers, status)
            w.write(Snapshot(t_s=t, gpus=tuple(gs), host=host, tree=tree))
    return samples


def _record_header(gpus: int) -> object:
    sys.path.insert(0, str(ROOT))
    from gpumon.model import GpuIdentity, TraceHeader

    return TraceHeader(
        version=1,
        source="gpumon",
        hostname="node17",
        started_wall_s=START,
        started_mono_s=0.0,
        interval_s=1.0,
        driver_version="550.54.15",
        nvml_version="12.550.54.15",
        cpu_count=64,
        watched_pid=4242,
        command=("python", "train.py"),
        gpus=tuple(
            GpuIdentity(
                g,
                f"GPU-{g:08d}-5d0c-4b0a-a6f1-0e29d0b7c5a1",
                "NVIDIA H100 80GB HBM3",
                f"00000000:{0x17 + g:02X}:00.0",
                TOTAL_MEM,
                700.0,
            )
            for g in range(gpus)
        ),
    )


TOTAL_MEM = 85899345920


def _record_gpu(
    header: object, t: float, g: int, pts: tuple, u: float, k: int, rng: random.Random
) -> object:
    """One GPU's sample with every field ``record`` writes (PCIe every 5 s)."""
    from gpumon.model import GpuProcess, GpuSample

    pcie = k % 5 == 0
    return GpuSample(
        t_s=t,
        gpu=g,
        uuid=header.gpus[g].uuid,  # type: ignore[attr-defined]
        util_samples=pts,
        util_pct=u,
        mem_util_pct=round(u / 3, 1),
        mem_used_bytes=(60000 + g) << 20,
        mem_total_bytes=TOTAL_MEM,
        power_watts=round(150 + 5 * u + rng.random(), 3),
        power_limit_watts=700.0,
        sm_clock_mhz=1980 if u > 50 else 345,
        clock_event_reasons=0 if u > 50 else 1,
        pcie_rx_bytes_per_s=1.2e9 if pcie else None,
        pcie_tx_bytes_per_s=3.1e8 if pcie else None,
        temperature_c=float(45 + g),
        processes=(GpuProcess(4242, 59 << 30, u),),
    )


def _record_host(
    rng: random.Random, t: float, per_core: list[float], iowait: float, reads: float
) -> object:
    from gpumon.model import HostSample

    cores = tuple(round(c, 1) for c in per_core)
    return HostSample(
        t_s=t,
        cpu_pct_per_core=cores,
        cpu_pct=round(sum(cores) / len(cores), 2),
        iowait_pct=round(iowait + rng.uniform(0, 0.5), 2),
        load_1m=31.2,
        load_5m=30.8,
        load_15m=29.9,
        mem_used_bytes=412 << 30,
        mem_total_bytes=2 << 40,
        disk_read_bytes_per_s=reads,
        disk_write_bytes_per_s=2.0e6,
    )


def _record_tree(t: float, main: float, workers: list[float], status: str) -> object:
    """A trainer and its 8 DataLoader workers."""
    from gpumon.model import ProcessSample, ProcTreeSample

    procs = [ProcessSample(4242, 1, "python", round(main, 1), 48, 0.0, 1.0e5, "running")]
    procs += [
        ProcessSample(4300 + i, 4242, "pt_data_worker", round(c, 1), 4, 2.1e7, 0.0, status)
        for i, c in enumerate(workers)
    ]
    return ProcTreeSample(t_s=t, root_pid=4242, processes=tuple(procs))


def _stamp(t: float) -> str:
    whole = int(t)
    ms = int((t - whole) * 1000)
    return time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(whole)) + f".{ms:03d}"


def write_nvsmi_csv(path: Path, rows: int, gpus: int = 8, interval: float = 1 / 6) -> int:
    rng = random.Random(2)
    span = rows // gpus * interval
    with open(path, "w", encoding="utf-8") as f:
        f.write(
            "timestamp, index, utilization.gpu [%], utilization.memory [%], "
            "memory.used [MiB], power.draw [W]\n"
        )
        for k in range(rows // gpus):
            t = k * interval
            stamp = _stamp(START + t)
            lines = []
            for g in range(gpus):
                u = _util(rng, t, g, span)
                lines.append(f"{stamp}, {g}, {u} %, {u // 3} %, 60000 MiB, {150 + 5 * u}.00 W\n")
            f.write("".join(lines))
    return rows // gpus * gpus


def write_dmon(path: Path, hours: float, gpus: int = 8) -> int:
    rng = random.Random(3)
    span = hours * 3600
    with open(path, "w", encoding="utf-8") as f:
        for k in range(int(hours * 3600)):
            if k % 10 == 0:
                f.write(
                    "# gpu   pwr gtemp mtemp    sm   mem   enc   dec  mclk  pclk\n"
                    "# Idx     W     C     C     %     %     %     %   MHz   MHz\n"
                )
            for g in range(gpus):
                u = _util(rng, k, g, span)
                f.write(
                    f"{g:>5} {150 + 5 * u:>5} {40:>5} {'-':>5} {u:>5} {u // 3:>5}"
                    f" {0:>5} {0:>5} {2619:>5} {1980:>5}\n"
                )
    return int(hours * 3600) * gpus


# --- one measured run (in a child process) ----------------------------------------------


def run_one(path: str) -> dict[str, object]:
    """`gpumon analyze PATH --json` in this process, timing the reader inside it."""
    sys.path.insert(0, str(ROOT))
    from gpumon import cli
    from gpumon.faces.analyze import command as face
    from gpumon.traces.sniff import open_trace

    stats = {"read_cpu_s": 0.0, "samples": 0, "ticks": 0}

    class Timed:
        def __init__(self, trace):  # type: ignore[no-untyped-def]
            self._trace = trace
            self.header, self.path, self.warnings = trace.header, trace.path, trace.warnings
            self.line_of_last = trace.line_of_last

        def __iter__(self):  # type: ignore[no-untyped-def]
            it = iter(self._trace)
            clock = time.process_time
            while True:
                t0 = clock()
                try:
                    snap = next(it)
                except StopIteration:
                    stats["read_cpu_s"] += clock() - t0
                    return
                stats["read_cpu_s"] += clock() - t0
                stats["ticks"] += 1
                for g in snap.gpus:
                    stats["samples"] += len(g.util_samples) or (g.util_pct is not None)
                yield snap

        def __enter__(self):  # type: ignore[no-untyped-def]
            return self

        def __exit__(self, *exc):  # type: ignore[no-untyped-def]
            self._trace.close()

    try:
        import gpumon.faces.analyze.report  # noqa: F401

        face.open_trace = lambda *a, **kw: Timed(open_trace(*a, **kw))  # type: ignore[assignment]
        argv = ["analyze", path, "--json"]
        with contextlib.redirect_stdout(io.StringIO()) as out:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            rc = cli.main(argv)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        verdict = json.loads(out.getvalue()).get("verdict") if rc in (0, 2) else None
        analysed = True
    except ImportError:  # the report module has not landed: measure the reader alone
        cpu0, wall0 = time.process_time(), time.perf_counter()
        with Timed(open_trace(path)) as trace:
            for _ in trace:
                pass
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        rc, verdict, analysed = 0, None, False
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "rc": rc,
        "cpu_s": cpu,
        "wall_s": wall,
        "verdict": verdict,
        "analysed": analysed,
        "maxrss_mib": maxrss,
        "bare_cpu_s": bare_parse_cpu(path),
        **stats,
    }


def bare_parse_cpu(path: str) -> float:
    """CPU seconds of the least any Python reader of this file must do: every line read
    and split (``json.loads`` for a trace, ``str.split`` for a log), nothing built.  The
    baseline of the same run: analysis / bare parse is a ratio that machine load moves
    far less than the seconds themselves."""
    split: Callable[[str], object] = (
        json.loads
        if path.endswith(".jsonl")
        else (lambda line: line.split(","))
        if path.endswith(".csv")
        else str.split
    )
    t0 = time.process_time()
    with open(path, encoding="utf-8") as f:
        for line in f:
            split(line)
    return time.process_time() - t0


def measure(path: Path) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, __file__, "--one", str(path)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed on {path.name}:\n{proc.stderr}")
    return json.loads(proc.stdout)


def measure_median(path: Path, runs: int) -> dict[str, object]:
    """``runs`` analyses of the file, each in a fresh process: the run of median speed."""
    got = sorted((measure(path) for _ in range(runs)), key=_rate)
    middle = dict(got[len(got) // 2])
    middle["rates"] = [_rate(r) for r in got]
    return middle


# --- the table --------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="1/8 of the sizes")
    mode.add_argument("--smoke", action="store_true", help="tiny files, one run: numbers moot")
    parser.add_argument("--runs", type=int, default=3, help="analyses of each file (median)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one)))
        return 0
    scale = 1 / 500 if args.smoke else 1 / 8 if args.quick else 1.0
    runs = 1 if args.smoke else args.runs
    hours = 24 * scale
    rows = []
    print(f"# {machine_load()}; {runs} runs of each", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpumon-bench-") as tmp:
        d = Path(tmp)
        cases: list[tuple[str, Path, Callable[[Path], int], str | None]] = [
            (
                "gpumon trace 24h 8 GPU 6/s, a third starved",
                d / "day.jsonl",
                lambda p: write_gpumon_trace(p, hours),
                "compact",
            ),
            (
                "gpumon record-shaped 24h, a third starved",
                d / "recorded.jsonl",
                lambda p: write_recorded_trace(p, hours),
                "record",
            ),
            (
                "gpumon record of a starved run, 4 causes",
                d / "starved.jsonl",
                lambda p: write_starved_recording(p, hours),
                "record",
            ),
            (
                "nvidia-smi CSV 1M rows, a third starved",
                d / "1m.csv",
                lambda p: write_nvsmi_csv(p, int(1_000_000 * scale)),
                "csv",
            ),
            (
                "nvidia-smi CSV 4M rows, a third starved",
                d / "4m.csv",
                lambda p: write_nvsmi_csv(p, int(4_147_200 * scale)),
                "csv",
            ),
            ("dmon 24h 8 GPU 1 s, a third starved", d / "dmon.txt",
             lambda p: write_dmon(p, hours), None),
        ]  # fmt: skip
        for name, path, make, kind in cases:
            t0 = time.perf_counter()
            make(path)
            gen = time.perf_counter() - t0
            size = path.stat().st_size / (1 << 20)
            say_load(f"{name}: generated {size:.0f} MiB in {gen:.0f} s; analysing")
            r = measure_median(path, runs)
            r.update(name=name, kind=kind, target=TARGETS.get(kind or ""), size_mib=size)
            rows.append(r)
            path.unlink()
    print_table(rows)
    print(f"\n({machine_load()})")
    return exit_status(all(ok for r in rows for ok in [_ok(r)] if ok is not None))


def _rate(r: dict) -> float:
    return r["samples"] / r["cpu_s"] if r["cpu_s"] else float("inf")


def _ok(r: dict) -> bool | None:
    if r["target"] is None or not r["analysed"]:
        return None
    return _rate(r) >= r["target"]


def print_table(rows: list[dict]) -> None:
    """figure | value | target | pass/fail, one block per generated log."""
    w = 34
    head = f"{'figure':<{w}} {'value':>16} {'target':>12}  result"
    print(head)
    print("-" * len(head))
    for r in rows:
        ok = _ok(r)
        verdict = "pass" if ok else ("FAIL" if ok is False else "-")
        target = f">= {r['target']:,.0f}" if r["target"] else ""
        print(f"[{r['name']}]{'' if r['analysed'] else '  (read only: no report module)'}")
        print(f"{'  samples':<{w}} {r['samples']:>16,}")
        print(f"{'  samples/s, CPU, end to end':<{w}} {_rate(r):>16,.0f} {target:>12}  {verdict}")
        runs = " ".join(f"{x / 1000:.0f}k" for x in r["rates"])
        print(f"{'    each run':<{w}} {runs:>16}")
        split = f"{r['read_cpu_s']:.1f} + {r['cpu_s'] - r['read_cpu_s']:.1f}"
        print(f"{'  CPU s: read + detect/report':<{w}} {split:>16}")
        floor = r["bare_cpu_s"]
        ratio = r["cpu_s"] / floor if floor else 0.0
        print(f"{'  x bare parse (same run)':<{w}} {ratio:>16.1f}")
        print(
            f"{'  reader alone x bare parse':<{w}} {r['read_cpu_s'] / floor if floor else 0:>16.1f}"
        )
        print(
            f"{'  reader alone, samples/s (CPU)':<{w}} "
            f"{r['samples'] / r['read_cpu_s'] if r['read_cpu_s'] else 0:>16,.0f}"
        )
        print(f"{'  wall s':<{w}} {r['wall_s']:>16.1f}")
        print(f"{'  peak RSS MiB':<{w}} {r['maxrss_mib']:>16.0f}")
        if r["verdict"] is not None:
            print(f"{'  verdict':<{w}} {r['verdict']:>16}")


if __name__ == "__main__":
    raise SystemExit(main())
