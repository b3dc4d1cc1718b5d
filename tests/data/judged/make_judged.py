"""Logs of behaviours a person names at a glance, and the verdict they would give.

``python tests/data/judged/make_judged.py DIR`` writes them (``tests/test_judged.py``
writes them to a temporary folder and checks that ``gpumon analyze`` gives the verdict in
``verdicts.toml`` beside this file).  Each imitates an nvidia-smi ``--query-gpu`` loop
(``-l 1``, with an ``index`` column) of one behaviour from the issue "Real logs, real
verdicts"; values are a seeded simulation, not copies of any published log.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

OUT = Path(".")
START = 1733000000.0  # 2024-11-30 20:53:20 UTC
MIB = 1
HEADER = (
    "timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB], "
    "power.draw [W], power.limit [W]"
)

# util(t, gpu, rng) -> (util_pct, power_w)
Behaviour = Callable[[float, int, random.Random], tuple[float, float]]


def stamp(t: float) -> str:
    whole = int(t)
    ms = round((t - whole) * 1000)
    return time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(whole)) + f".{ms:03d}"


def nvsmi_csv(
    name: str,
    gpus: int,
    seconds: float,
    every: float,
    behaviour: Behaviour,
    *,
    seed: int,
    mem_used: float = 30000,
    mem_total: float = 81559,
    limit: float = 700.0,
    gpu_name: str = "NVIDIA H100 80GB HBM3",
) -> None:
    rng = random.Random(seed)
    lines = [HEADER]
    t = 0.0
    while t < seconds:
        for g in range(gpus):
            u, p = behaviour(t, g, rng)
            u = max(0, min(100, round(u)))
            lines.append(
                f"{stamp(START + t + 0.002 * g)}, {g}, {gpu_name}, {u} %, "
                f"{round(mem_used + rng.uniform(-50, 50))} MiB, {round(mem_total)} MiB, "
                f"{p:.2f} W, {limit:.2f} W"
            )
        t += every
    (OUT / name).write_text("\n".join(lines) + "\n")


def series(values: list[float], idle_w: float = 60.0, busy_w: float = 250.0) -> Behaviour:
    """A short log given sample by sample (one GPU, one value a tick)."""

    def b(t: float, g: int, rng: random.Random) -> tuple[float, float]:
        u = values[min(len(values) - 1, round(t))]
        return u, idle_w + (busy_w - idle_w) * u / 100 + rng.uniform(-3, 3)

    return b


def square(period: float, duty: float, phase: float = 0.0, busy=(96, 100), idle=(0, 3)):
    """Busy for duty*period, then idle; the value of a 1 s sample is its busy share."""

    def busy_share(t: float, dt: float) -> float:
        # share of [t - dt, t) spent busy, sampled finely
        n = 20
        inside = [
            ((t - dt + (k + 0.5) * dt / n + phase) % period) < duty * period for k in range(n)
        ]
        return sum(inside) / n

    return busy_share


def main(out: Path) -> None:
    global OUT
    OUT = out
    out.mkdir(parents=True, exist_ok=True)
    # 7a. A short log of a GPU at ~66 % duty dipping to ~30 % (data loading in the main process).
    nvsmi_csv(
        "short_main_process_loading.csv",
        1,
        9.5,
        1.0,
        series([68, 64, 31, 70, 66, 29, 67, 65, 33, 69]),
        seed=1,
        mem_used=9000,
        mem_total=16384,
        limit=250,
        gpu_name="Tesla V100-SXM2-16GB",
    )
    # 7b. A short log of a V100 alternating between bursts and idle.
    nvsmi_csv(
        "short_bursty_v100.csv",
        1,
        9.5,
        1.0,
        series([0, 31, 0, 95, 0, 24, 0, 94, 0, 0]),
        seed=2,
        mem_used=12000,
        mem_total=16384,
        limit=300,
        gpu_name="Tesla V100-SXM2-16GB",
    )

    # 8. 8 GPUs; every ~90 s rank 0 writes a checkpoint for ~20 s at 0 % while the other seven
    #    spin in NCCL at ~100 % and ~150 W (~550 W when they compute).
    def ckpt(t: float, g: int, rng: random.Random) -> tuple[float, float]:
        in_ckpt = (t % 90.0) >= 70.0
        if in_ckpt:
            if g == 0:
                return rng.uniform(0, 2), rng.uniform(95, 110)
            return rng.uniform(99, 100), rng.uniform(140, 160)
        return rng.uniform(97, 100), rng.uniform(520, 580)

    nvsmi_csv("checkpoint_busywait_8gpu.csv", 8, 400, 1.0, ckpt, seed=3)

    # 9. One GPU, a stock DataLoader restarting its workers every epoch: ~4.5 s gap every ~27 s.
    epoch = square(27.0, 1 - 4.5 / 27.0)

    def loader(t: float, g: int, rng: random.Random) -> tuple[float, float]:
        s = epoch(t, 1.0)
        u = s * rng.uniform(95, 100)
        return u, 70 + 330 * s + rng.uniform(-5, 5)

    nvsmi_csv(
        "epoch_loader_restart.csv",
        1,
        300,
        1.0,
        loader,
        seed=4,
        limit=450,
        gpu_name="NVIDIA A100-SXM4-40GB",
        mem_total=40960,
        mem_used=21000,
    )

    # 9b. Long-period starvation: 120 s period, duty 0.85.
    slow = square(120.0, 0.85, phase=17.0)

    def slowb(t: float, g: int, rng: random.Random) -> tuple[float, float]:
        s = slow(t, 1.0)
        return s * rng.uniform(95, 100), 80 + 300 * s + rng.uniform(-5, 5)

    nvsmi_csv("long_period_starved.csv", 1, 900, 1.0, slowb, seed=5, limit=400)

    # 10. 4 GPUs, GPU 2 is a straggler (bursty, ~40 %); the others read ~100 % waiting on it.
    strag = square(1.6, 0.4)

    def straggler(t: float, g: int, rng: random.Random) -> tuple[float, float]:
        if g == 2:
            s = strag(t + rng.uniform(0, 0.5), 1.0)
            return 100 * s + rng.uniform(-3, 3), 120 + 250 * s
        return rng.uniform(96, 100), rng.uniform(180, 230)

    nvsmi_csv(
        "straggler_4gpu.csv",
        4,
        240,
        1.0,
        straggler,
        seed=6,
        limit=400,
        gpu_name="NVIDIA RTX A6000",
        mem_total=49140,
        mem_used=30000,
    )

    # Controls.
    def healthy(t: float, g: int, rng: random.Random) -> tuple[float, float]:
        return rng.uniform(94, 100), rng.uniform(560, 640)

    nvsmi_csv("healthy_1gpu.csv", 1, 300, 1.0, healthy, seed=7)
    nvsmi_csv("healthy_8gpu.csv", 8, 300, 1.0, healthy, seed=8)
    rare = square(150.0, 1 - 4.0 / 150.0, phase=40.0)

    def rare_ckpt(t: float, g: int, rng: random.Random) -> tuple[float, float]:
        s = rare(t, 1.0)
        return s * rng.uniform(95, 100), 90 + 500 * s

    nvsmi_csv("healthy_rare_checkpoints.csv", 2, 600, 1.0, rare_ckpt, seed=9)

    def idle(t: float, g: int, rng: random.Random) -> tuple[float, float]:
        return 0.0, rng.uniform(60, 70)

    nvsmi_csv("idle_memory_held.csv", 2, 300, 1.0, idle, seed=10, mem_used=40000)

    # Starved at 1 s samples (a GIL-bound loader): ~45 % duty, bursty.
    st = square(2.4, 0.45)

    def starved(t: float, g: int, rng: random.Random) -> tuple[float, float]:
        s = st(t + rng.uniform(0, 0.3), 1.0)
        return 100 * s * rng.uniform(0.95, 1.0), 90 + 400 * s

    nvsmi_csv("starved_1gpu.csv", 1, 300, 1.0, starved, seed=11)

    # A laptop: 15 min of training at ~99 % holding 4.6 GB, then the run ends -- memory
    # back at 65 MiB, idle power -- while the desktop keeps the GPU reading 8-60 %.
    def laptop(t: float, g: int, rng: random.Random) -> tuple[float, float]:
        if t < 900:
            return rng.uniform(97, 100), rng.uniform(47, 52)
        return rng.choice((8, 9, 10, 11, 44, 54, 60)), rng.uniform(12, 17)

    rows = []
    rng = random.Random(12)
    for k in range(240):
        t = 10.0 * k
        u, pw = laptop(t, 0, rng)
        mem = 4628 if t < 900 else rng.choice((65,) * 10 + (462, 832))
        rows.append(f"{stamp(START + t)}, {round(u)} %, {mem} MiB, 8151 MiB, {pw:.2f} W, 56")
    write(
        "laptop_run_then_desktop.csv",
        "timestamp,util_gpu_pct,mem_used_mib,mem_total_mib,power_w,temp_c",
        rows,
    )

    # 64 s of nothing, then a job starts in the last seconds: memory still filling up.
    rows = []
    for k in range(70):
        u = 0 if k < 64 else (77, 57, 65, 76, 69, 47)[k - 64]
        mem = 1 if k < 64 else 1466 + 350 * (k - 64)
        rows.append(f"{stamp(START + k)}, 0, NVIDIA A10, {u} %, {mem} MiB, 23028 MiB")
    write(
        "job_starts_at_the_end.csv",
        "timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB]",
        rows,
    )

    # One sample every 5 s of a GPU at a flat 11-15 %, 446 MiB in use (a small model).
    rows = [f"{stamp(START + 5 * k)}, {12 + (k % 4)} %, 446 MiB, 24564 MiB" for k in range(50)]
    write(
        "flat_low_duty_5s.csv",
        "timestamp, utilization.gpu [%], memory.used [MiB], memory.total [MiB]",
        rows,
    )

    # A home-made logger whose "GPU" column holds the GPU's name, one row every 5 minutes
    # of a laptop GPU doing nothing.
    rows = [
        f"2025-05-19 16:{19 + 5 * k:02d}:26,NVIDIA GeForce RTX 3070 Laptop GPU,{40 + k},"
        f"{55 if k == 0 else 0},{909.8 - k:.1f},8192.0"
        for k in range(8)
    ]
    write(
        "gpu_column_holds_the_name.csv",
        "Time,GPU,Temp (°C),Util (%),Memory Used (MB),Total Memory (MB)",
        rows,
    )


def write(name: str, header: str, rows: list[str]) -> None:
    (OUT / name).write_text("\n".join([header, *rows]) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("."))
