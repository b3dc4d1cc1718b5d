"""Cost of one gpumon sampling tick against the NVML floor, on the fake NVML library.

    python benchmarks/bench_tick.py [--quick]

The floor is the same NVML calls made directly through ``pynvml`` in a loop with no
processing (each result's fields are read out, nothing more).  gpumon's NVML part is
``NvmlSampler.sample()``; the whole tick is ``Monitor.tick()``: NVML + host + the
process tree + the detector.  Both run in this process against the same fake GPUs,
alternating in batches, so machine noise hits both alike; the figure that matters is
the ratio.  Medians over repeats.

Targets (issue 7): NVML part within 1.3x of the bare calls; a whole tick under 1 ms at
8 GPUs and a 32-process tree.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakenvml import FakeGPU, Pattern, Process, Scenario, load_in_process, write_scenario  # noqa: E402

PROCTREE = ROOT / "tests" / "helpers" / "proctree.py"


def median_us(fn: Callable[[], object], *, batches: int, per_batch: int) -> float:
    samples = []
    for _ in range(batches):
        start = time.perf_counter_ns()
        for _ in range(per_batch):
            fn()
        samples.append((time.perf_counter_ns() - start) / per_batch / 1000.0)
    return statistics.median(samples)


def paired(
    a: Callable[[], object], b: Callable[[], object], *, batches: int, per_batch: int
) -> tuple[float, float]:
    """Medians of a and b measured in alternating batches (noise hits both alike)."""
    ra, rb = [], []
    for _ in range(batches):
        ra.append(median_us(a, batches=1, per_batch=per_batch))
        rb.append(median_us(b, batches=1, per_batch=per_batch))
    return statistics.median(ra), statistics.median(rb)


def make_floor(n_gpus: int) -> Callable[[], None]:
    """The bare pynvml calls gpumon makes per tick, with no processing at all."""
    import pynvml as n

    handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n_gpus)]
    last = [0] * n_gpus
    last_proc = [0] * n_gpus

    def floor() -> None:
        # Each call's values are read out (a struct's fields, each sample's timestamp and
        # value): calls whose results are never looked at would not be a fair floor.
        for i, h in enumerate(handles):
            try:
                _, samples = n.nvmlDeviceGetSamples(h, n.NVML_GPU_UTILIZATION_SAMPLES, last[i])
                for s in samples:
                    last[i] = max(last[i], s.timeStamp)
                    s.sampleValue.uiVal  # noqa: B018
            except n.NVMLError_NotFound:
                pass
            rates = n.nvmlDeviceGetUtilizationRates(h)
            rates.gpu, rates.memory  # noqa: B018
            mem = n.nvmlDeviceGetMemoryInfo(h)
            mem.used, mem.total  # noqa: B018
            n.nvmlDeviceGetPowerUsage(h)
            n.nvmlDeviceGetEnforcedPowerLimit(h)
            n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)
            n.nvmlDeviceGetCurrentClocksEventReasons(h)
            n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
            procs = n.nvmlDeviceGetComputeRunningProcesses(h)
            for p in procs:
                p.pid, p.usedGpuMemory  # noqa: B018
            if procs:
                try:
                    for s in n.nvmlDeviceGetProcessUtilization(h, last_proc[i]):
                        last_proc[i] = max(last_proc[i], s.timeStamp)
                        s.pid, s.smUtil  # noqa: B018
                except n.NVMLError_NotFound:
                    pass

    return floor


def start_tree(n_procs: int) -> tuple[subprocess.Popen[str], int]:
    """A real tree of n_procs processes (the parent and n_procs-1 sleeping workers)."""
    proc = subprocess.Popen(
        [sys.executable, str(PROCTREE), "0", str(n_procs - 1), "600"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
    return proc, proc.pid


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (CI smoke run)")
    args = parser.parse_args()
    batches, per_batch = (5, 20) if args.quick else (15, 60)

    from gpumon.monitor import Monitor
    from gpumon.sample.host import HostSampler, ProcessTreeSampler
    from gpumon.sample.nvml import NvmlSampler

    try:
        from gpumon.detect import Detector
    except ImportError:  # pragma: no cover - the detector lands separately
        Detector = None  # type: ignore[assignment,misc]

    scenario_path = Path(tempfile.mkdtemp()) / "scenario.txt"
    rows: list[tuple[str, float, float, float, str, bool]] = []
    whole_8_32 = None
    for n_gpus in (1, 8):
        gpu = FakeGPU(pattern=Pattern.burst(1.0, 0.4), processes=[Process(4242)])
        write_scenario(scenario_path, Scenario(gpus=[gpu] * n_gpus))
        if n_gpus == 1:
            load_in_process(scenario_path)  # once: gpumon calls nvmlInit once per process
        time.sleep(0.05)  # the fake notices a rewritten scenario within ~10 ms
        sampler = NvmlSampler()
        floor = make_floor(n_gpus)
        floor_us, nvml_us = paired(floor, sampler.sample, batches=batches, per_batch=per_batch)
        ratio = nvml_us / floor_us
        rows.append((f"NVML part, {n_gpus} GPU", nvml_us, floor_us, ratio, "<= 1.3x", ratio <= 1.3))
        for n_procs in (1, 32, 128):
            tree_proc, pid = start_tree(n_procs)
            try:
                detector = None if Detector is None else Detector(gpus=sampler.gpus)
                monitor = Monitor(sampler, HostSampler(), ProcessTreeSampler(pid), detector)
                monitor.tick()
                assert len(monitor.tick().snapshot.tree.processes) == n_procs
                floor_us, tick_us = paired(
                    floor, monitor.tick, batches=batches, per_batch=max(5, per_batch // 4)
                )
            finally:
                tree_proc.terminate()
                tree_proc.wait()
            target = "< 1000 us" if (n_gpus, n_procs) == (8, 32) else ""
            ok = tick_us < 1000.0 if target else True
            if (n_gpus, n_procs) == (8, 32):
                whole_8_32 = tick_us
            rows.append(
                (
                    f"whole tick, {n_gpus} GPU, {n_procs} procs",
                    tick_us,
                    floor_us,
                    tick_us / floor_us,
                    target,
                    ok,
                )
            )

    print(f"\ndetector in tick: {'yes' if Detector is not None else 'NO (not importable)'}")
    print(f"{'figure':34} {'gpumon us':>10} {'floor us':>9} {'ratio':>6} {'target':>10}  pass")
    for name, ours, base, ratio, target, ok in rows:
        print(
            f"{name:34} {ours:10.1f} {base:9.1f} {ratio:6.2f} {target:>10}  "
            f"{'PASS' if ok else 'FAIL'}"
        )
    if whole_8_32 is not None:
        print(f"\none tick, 8 GPUs + 32-process tree: {whole_8_32:.0f} us")
    return 0 if all(r[5] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
