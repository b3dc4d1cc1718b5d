"""gpumon's tick against one full query by nvitop and by gpustat, on the same fake GPUs.

    pip install -e '.[bench]'          # nvitop and gpustat: benchmark-only dependencies
    python benchmarks/bench_peers.py [--quick]

All three run in this process against the fake ``libnvidia-ml.so.1`` (tests/fakenvml),
1 and 8 GPUs, each GPU holding two processes that really exist (sleeping workers of one
process tree), so every tool's per-process host lookups read real /proc entries.

What one call of each contender reads (per GPU unless said otherwise):

* **gpumon tick** (``Session.live(pid=...).tick()``, as ``gpumon watch`` runs it; on
  GPUs without processes, ``Session.live().tick()``: the whole node, no tree):
  the driver's utilisation sample buffer since the last tick (~6 samples a second), the
  utilisation rates, memory, power, power limit, SM clock, clock-event reasons,
  temperature, PCIe throughput (every 5 s), the compute processes and their SM
  utilisation; machine-wide CPU per core, iowait, load, memory and disk throughput; the
  whole watched process tree (root + every GPU process: state, ppid, name, CPU, threads,
  I/O); then the detector folds it all in and classifies (once per 1 s of stream time).
* **nvitop query** (what its TUI does per refresh, ``tui/screens/main/panels``):
  ``[d.as_snapshot() for d in devices]`` (41 attributes: name, UUID, bus id, memory,
  utilisation incl. encoder/decoder, current and max clocks, fan, temperature, power and
  limit, PCIe throughput, display, persistence, P-state, ECC, compute mode, CUDA
  capability, MIG mode) and ``GpuProcess.take_snapshots`` of every device's
  ``processes()`` (compute + graphics lists, 1 s of per-process utilisation, and per
  process psutil's name, user, command line, CPU %, memory, running time, status).
  Two variants: ``Device.all()`` inside each query (its README's loop), and devices
  created once and kept (its TUI and exporter); the faster one is the baseline.
* **nvitop narrow** (its API used the way a script polls it, issue 12): ``Device.all()``,
  then per device ``gpu_utilization()``, ``memory_used()``, ``memory_total()``,
  ``power_usage()`` and ``processes()`` (compute + graphics lists and 1 s of per-process
  utilisation; no host lookups).  Far less than gpumon reads: no sample buffer, no host,
  no tree, no detector.
* **gpustat query** (``gpustat.new_query()``, what ``gpustat -i`` runs per refresh):
  ``nvmlInit`` + ``nvmlShutdown`` around the query (reference-counted: gpumon keeps NVML
  initialised, so these are cheap here, as they would not be for ``gpustat -i`` alone),
  name, UUID, temperature, fan, utilisation incl. encoder/decoder, power and limit,
  memory, compute and graphics processes and per process psutil's user, name, command
  line, CPU %, memory and ``virtual_memory()``.

gpumon reads less per GPU than nvitop (no static facts re-read each refresh) but more per
tick overall: the sample buffer, the non-GPU workers of the tree, the host, the detector.

Fair steady state: every contender is warmed up (its caches filled: nvitop's per-pid
process objects, gpustat's psutil process cache, gpumon's open /proc files) before timing;
each contender's previous result is kept alive until its next call, as a refreshing UI
does (nvitop's caches are weak references).  NVML is initialised once for the process and
shared, as it would be in one long-running tool.

A tick at 1 Hz, not back to back: ticks here are milliseconds apart, where the driver
buffer would be empty and the detector would skip its once-a-second classification, which
would flatter gpumon.  So before each gpumon tick the sampler's buffer cursors are moved
back one second and gpumon's monotonic clock is advanced one second: every tick reads a
second's worth of driver samples and process utilisation, reads PCIe every fifth tick,
and the detector classifies on its real 1 Hz schedule (calm evaluations included).

Two machines: each GPU holding two processes, and GPUs without processes (an idle node,
or one whose jobs' processes NVML cannot list).  The fake GPUs have no GPM counters here
(as an A100): the peers read none, and on a Hopper gpumon's GPM read adds ~1 us per GPU
(bench_tick).

Same process, interleaved batches in rotating order, medians of CPU time per call (and of
wall-clock for reference).  Target (issue 7): gpumon no slower than the faster of the
full refreshes (nvitop's snapshots, gpustat's query).  The narrow nvitop poll has no
target: it is reported, as the issue asks, beside the others.
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import (  # noqa: E402
    OneHertz,
    Timing,
    clock_modules,
    interleaved,
    nvml_sampler_of,
    ratio,
    table,
)
from fakenvml import FakeGPU, Pattern, Process, Scenario, load_in_process, write_scenario  # noqa: E402

PROCTREE = ROOT / "tests" / "helpers" / "proctree.py"
PROCS_PER_GPU = 2


def start_workers(n: int) -> tuple[subprocess.Popen[str], list[int]]:
    """A real process tree: a parent and ``n`` sleeping workers (their pids returned)."""
    proc = subprocess.Popen(
        [sys.executable, str(PROCTREE), "0", str(n), "600"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "ready", line
    return proc, [int(p) for p in line[1:]]


def gpumon_tick(
    root_pid: int | None,
) -> tuple[Callable[[], object], OneHertz, Callable[[], int]]:
    """One gpumon tick at 1 Hz (NVML + host + tree + detector), and the tree's size."""
    from gpumon.engine import Session

    session = Session.live(pid=root_pid, interval_s=1.0)
    hz = OneHertz(nvml_sampler_of(session), clock_modules())
    last: list[object] = [None]

    def tick() -> None:
        hz.step()
        last[0] = session.tick()

    def tree_size() -> int:
        tree = session.tick().snapshot.tree
        return 0 if tree is None else len(tree.processes)

    return tick, hz, tree_size


def nvitop_query(kept: bool) -> Callable[[], object]:
    """One nvitop refresh: device snapshots + process snapshots (TUI's take_snapshots)."""
    from nvitop import Device, GpuProcess

    devices = Device.all()
    last: list[object] = [None]

    def query() -> None:
        devs = devices if kept else Device.all()
        snaps = [d.as_snapshot() for d in devs]
        procs = GpuProcess.take_snapshots(
            itertools.chain.from_iterable(d.processes().values() for d in devs), failsafe=True
        )
        last[0] = (devs, snaps, procs)

    return query


def nvitop_narrow() -> Callable[[], object]:
    """nvitop's API polled for the basics: utilisation, memory, power, processes."""
    from nvitop import Device

    last: list[object] = [None]

    def query() -> None:
        last[0] = [
            (
                d.gpu_utilization(),
                d.memory_used(),
                d.memory_total(),
                d.power_usage(),
                d.processes(),
            )
            for d in Device.all()
        ]

    return query


def gpustat_query() -> Callable[[], object]:
    import gpustat

    last: list[object] = [None]

    def query() -> None:
        last[0] = gpustat.new_query()

    return query


def check_answers(n_gpus: int, n_procs: int) -> None:
    """Every contender sees the fake GPUs and their processes (else timing is moot)."""
    import gpustat
    from nvitop import Device

    stat = gpustat.new_query()
    assert len(stat.gpus) == n_gpus
    assert sum(len(g.processes or ()) for g in stat.gpus) == n_procs
    devices = Device.all()
    assert len(devices) == n_gpus
    assert sum(len(d.processes()) for d in devices) == n_procs


def run(
    n_gpus: int, per_gpu: int, scenario: Path, *, rounds: int, first: bool
) -> dict[str, Timing]:
    tree, workers = start_workers(max(1, per_gpu * n_gpus))
    try:
        gpus = [
            FakeGPU(
                pattern=Pattern.burst(1.0, 0.4),
                processes=[Process(p) for p in workers[i * per_gpu : (i + 1) * per_gpu]],
            )
            for i in range(n_gpus)
        ]
        write_scenario(scenario, Scenario(gpus=gpus))
        if first:
            load_in_process(scenario)  # once: NVML is initialised once per process
        time.sleep(0.05)  # the fake notices a rewritten scenario within ~10 ms
        tick, hz, tree_size = gpumon_tick(tree.pid if per_gpu else None)
        assert tree_size() == (1 + len(workers) if per_gpu else 0)
        check_answers(n_gpus, per_gpu * n_gpus)
        contenders = {
            "gpumon": tick,
            "nvitop": nvitop_query(kept=False),
            "nvitop_kept": nvitop_query(kept=True),
            "nvitop_narrow": nvitop_narrow(),
            "gpustat": gpustat_query(),
        }
        with hz.installed():
            return interleaved(
                contenders,
                rounds=rounds,
                # gpustat sleeps 0.1 s per GPU in each query (for psutil's CPU %): one call
                # per batch keeps the run short; its CPU time is what is compared.
                per_batch={
                    "gpumon": 8 // n_gpus + 2,
                    "nvitop": 4 // n_gpus + 1,
                    "nvitop_kept": 4 // n_gpus + 1,
                    "nvitop_narrow": 8 // n_gpus + 2,
                    "gpustat": 1,
                },
                warmup=5,
            )
    finally:
        tree.terminate()
        tree.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (smoke run)")
    args = parser.parse_args()
    rounds = 7 if args.quick else 31

    scenario = Path(tempfile.mkdtemp()) / "scenario.txt"
    rows: list[tuple[str, str, str, str, str, str]] = []
    detail: list[str] = []
    ok_all = True
    first = True
    for per_gpu in (PROCS_PER_GPU, 0):
        for n_gpus in (1, 8):
            res = run(n_gpus, per_gpu, scenario, rounds=rounds, first=first)
            first = False
            where = f"{n_gpus} GPU, {per_gpu} procs/GPU"
            full = ("nvitop", "nvitop_kept", "gpustat")
            fastest = min(full, key=lambda p: res[p].cpu_us)
            for name in ("nvitop", "nvitop_kept", "nvitop_narrow", "gpustat", "gpumon"):
                t = res[name]
                detail.append(
                    f"{where}  {name:13} cpu {t.cpu_us:8.0f} us   wall {t.wall_us:8.0f} us"
                )
            r_cpu = ratio(res["gpumon"], tuple(res[p] for p in full))
            r_wall = ratio(res["gpumon"], tuple(res[p] for p in full), cpu=False)
            ok = r_cpu <= 1.0
            ok_all &= ok
            rows.append(
                (
                    f"tick vs fastest full refresh, {where} (CPU us)",
                    f"{res['gpumon'].cpu_us:.0f}",
                    f"{res[fastest].cpu_us:.0f} ({fastest})",
                    f"{r_cpu:.2f}",
                    "<= 1.00",
                    "PASS" if ok else "FAIL",
                )
            )
            rows.append(
                (
                    "  same, wall-clock us (reference)",
                    f"{res['gpumon'].wall_us:.0f}",
                    f"{min(res[p].wall_us for p in full):.0f}",
                    f"{r_wall:.2f}",
                    "",
                    "",
                )
            )
            for peer in (*full, "nvitop_narrow"):
                rows.append(
                    (
                        f"  gpumon / {peer}, {where}",
                        "",
                        f"{res[peer].cpu_us:.0f}",
                        f"{ratio(res['gpumon'], res[peer]):.2f}",
                        "",
                        "",
                    )
                )
    print("\nper call, medians over rounds (CPU = process time, all threads):")
    print("\n".join(detail))
    print("\ngpumon ticks at an emulated 1 Hz (see --help)\n")
    print(table(rows))
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
