# ruff: noqa: E501 -- the rows are written as the tools lay them out, one f-string each
"""Regenerate the real-shaped logs in ``quirks/``: ``python tests/data/logs/make_quirks.py``.

Each file imitates a *kind* of log people publish (nvidia-smi loops, home-made loggers,
gpustat, W&B, dmon, dcgmi, Prometheus exports) with the quirks those logs show -- learned
from reading public logs, never copied from them: the values are a seeded simulation of
what the GPUs did (``Run``), the layout is written here.  ``quirks/manifest.toml`` lists
each file, its quirks, the kind it imitates, its GPU count and the verdict a person would
give; ``test_traces_quirks.py`` checks that reading gets each one right.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent / "quirks"
HEADERLESS_DIR = Path(__file__).parent / "headerless"  # rows only --columns can name
START = 1764189000  # 2025-11-26 20:30:00 UTC
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


# --- what the GPUs did -------------------------------------------------------------------


@dataclass
class State:
    util: float  # percent, as NVML's utilization.gpu would read over its sample period
    power: float  # W
    mem: float  # MiB used


class Run:
    """A seeded training run: ``state(t, gpu)`` is what that GPU was doing at time t.

    behaviours: ``healthy``; ``starved`` (busy bursts and idle gaps, every GPU in step:
    one input pipeline feeds them all); ``sync_stall`` (one rank writes a checkpoint at
    0 % while the others spin in NCCL at ~100 % but low power); ``straggler`` (one GPU is
    slow, the others busy-wait on it); ``idle`` (memory held, nothing runs); ``epoch_gap``
    (healthy, but the DataLoader restarts its workers every epoch: a gap every 27 s).
    """

    def __init__(
        self,
        behaviour: str,
        gpus: int,
        seed: int,
        tdp: float = 400.0,
        mem_total: float = 81920.0,
        period: float = 4.0,
        duty: float = 0.5,
        stall_rank: int = 3,
    ):
        self.behaviour = behaviour
        self.gpus = gpus
        self.rng = random.Random(seed)
        self.tdp = tdp
        self.mem_total = mem_total
        self.period = period
        self.duty = duty
        self.stall_rank = min(stall_rank, gpus - 1)
        self.base_mem = [
            0.6 * mem_total + 37 * g + self.rng.uniform(-200, 200) for g in range(gpus)
        ]
        self.temp = [38 + 3 * g % 7 + self.rng.randint(0, 3) for g in range(gpus)]

    def _busy(self, util: float) -> float:
        return 0.22 * self.tdp + (0.72 * self.tdp) * util / 100 + self.rng.uniform(-12, 12)

    def state(self, t: float, gpu: int) -> State:
        r = self.rng
        b = self.behaviour
        mem = self.base_mem[gpu] + r.choice((0, 0, 0, 2, 4))
        if b == "idle":
            return State(0.0, 0.15 * self.tdp + r.uniform(-3, 3), mem)
        if b == "healthy":
            u = r.uniform(93, 100)
            return State(u, self._busy(u), mem)
        if b == "starved":
            phase = t % self.period
            if phase < self.duty * self.period:
                u = r.uniform(90, 100)
                return State(u, self._busy(u), mem)
            return State(r.uniform(0, 3), 0.25 * self.tdp + r.uniform(-5, 5), mem)
        if b == "epoch_gap":
            if t % 27.0 >= 22.5:
                return State(r.uniform(0, 2), 0.25 * self.tdp + r.uniform(-5, 5), mem)
            u = r.uniform(93, 100)
            return State(u, self._busy(u), mem)
        if b == "sync_stall":
            stalled = t % self.period >= (1 - self.duty) * self.period
            if not stalled:
                u = r.uniform(97, 100)
                return State(u, 0.9 * self.tdp + r.uniform(-15, 15), mem)
            if gpu == self.stall_rank:
                return State(0.0, 0.2 * self.tdp + r.uniform(-4, 4), mem)
            return State(100.0, 0.21 * self.tdp + r.uniform(-6, 6), mem)  # NCCL spin
        if b == "straggler":
            if gpu == self.stall_rank:
                u = r.uniform(97, 100)
                return State(u, 0.92 * self.tdp + r.uniform(-10, 10), mem)
            if t % 1.0 < 0.6:
                u = r.uniform(97, 100)
                return State(u, 0.9 * self.tdp + r.uniform(-10, 10), mem)
            return State(100.0, 0.24 * self.tdp + r.uniform(-8, 8), mem)
        raise ValueError(b)

    def temp_of(self, gpu: int, util: float) -> int:
        """A GPU's temperature: its own level, drifting with its long-run load (the die
        heats over minutes, not per sample); ``util`` is ignored on purpose."""
        return int(self.temp[gpu] + 14 + self.rng.randint(0, 1))


# --- time formats -------------------------------------------------------------------------


def nvsmi_stamp(t: float) -> str:
    whole = int(t)
    return (
        time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(whole)) + f".{int((t - whole) * 1000):03d}"
    )


def iso(t: float, sep: str = "T") -> str:
    return time.strftime(f"%Y-%m-%d{sep}%H:%M:%S", time.gmtime(int(t)))


def date_line(t: float) -> str:
    g = time.gmtime(int(t))
    return f"{DAYS[g.tm_wday]} {MONTHS[g.tm_mon - 1]} {g.tm_mday:2d} " + time.strftime(
        "%H:%M:%S %Y", g
    )


def lines(rows: list[str], end: str = "\n") -> str:
    return end.join(rows) + end


# --- the files ----------------------------------------------------------------------------


def nvsmi_8gpu_same_stamp() -> str:
    """8 GPUs, no index column, all rows of a tick share one timestamp (-l 1); rank 3
    writes a checkpoint while the others spin in NCCL at 100 % and ~150 W."""
    run = Run("sync_stall", 8, 101, tdp=700.0, period=20.0, duty=0.3)
    out = [
        "timestamp, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB], "
        "power.draw [W]"
    ]
    for k in range(180):
        t = START + k + 0.412 + run.rng.randint(0, 6) / 1000
        for g in range(8):
            s = run.state(k, g)
            out.append(
                f"{nvsmi_stamp(t)}, NVIDIA H100 80GB HBM3, {s.util:.0f} %, {s.mem:.0f} MiB, "
                f"81559 MiB, {s.power:.2f} W"
            )
    return lines(out)


def nvsmi_2gpu_ms_apart() -> str:
    """2 GPUs, no index column, -lms 100, nounits: the rows of a tick 1-3 ms apart."""
    run = Run("starved", 2, 102, tdp=300.0, period=0.8, duty=0.45, mem_total=49140.0)
    out = ["timestamp, utilization.gpu [%], memory.used [MiB], memory.total [MiB], power.draw [W]"]
    for k in range(900):
        t = START + k * 0.1 + 0.005 + run.rng.randint(0, 3) / 1000
        for g in range(2):
            s = run.state(k * 0.1, g)
            out.append(
                f"{nvsmi_stamp(t + 0.001 * g + run.rng.randint(0, 1) / 1000)}, {s.util:.0f}, "
                f"{s.mem:.0f}, 49140, {s.power:.2f}"
            )
    return lines(out)


def nvsmi_4gpu_straggler_crlf() -> str:
    """4 GPUs, no index, -l 1, written on Windows: UTF-8 BOM and CRLF line ends; GPU 2 is
    the straggler the others wait for."""
    run = Run("straggler", 4, 103, tdp=350.0, stall_rank=2, mem_total=24576.0)
    out = [
        "timestamp, name, pci.bus_id, utilization.gpu [%], memory.used [MiB], power.draw [W], "
        "enforced.power.limit [W]"
    ]
    for k in range(150):
        t = START + k + 0.88 + run.rng.randint(0, 4) / 1000
        for g in range(4):
            s = run.state(k + 0.7, g)
            out.append(
                f"{nvsmi_stamp(t + g * 0.002)}, NVIDIA GeForce RTX 3090, "
                f"00000000:{0x1A + 0x20 * g:02X}:00.0, {s.util:.0f} %, {s.mem:.0f} MiB, "
                f"{s.power:.2f} W, 350.00 W"
            )
    return "\ufeff" + lines(out, "\r\n")


def nvsmi_header_every_row() -> str:
    """A shell loop calling nvidia-smi --format=csv every second and appending: the header
    before every row.  Memory held, nothing runs."""
    run = Run("idle", 1, 104, tdp=250.0, mem_total=11264.0)
    hdr = (
        "timestamp, index, name, pci.bus_id, utilization.gpu [%], utilization.memory [%], "
        "memory.used [MiB], memory.free [MiB], memory.total [MiB]"
    )
    out = []
    for k in range(120):
        s = run.state(k, 0)
        used = 9812 + run.rng.choice((0, 0, 2))
        out += [
            hdr,
            f"{nvsmi_stamp(START + k * 1.03 + 0.252)}, 0, NVIDIA GeForce RTX 2080 Ti, "
            f"00000000:01:00.0, {s.util:.0f} %, 0 %, {used} MiB, {11264 - used} MiB, 11264 MiB",
        ]
    return lines(out)


def home_epoch_spaces() -> str:
    """A home-made logger writing nvidia-smi's query names with epoch-second times and a
    space after some commas, once a minute: ``1764189075,1, 24576, 0``."""
    run = Run("healthy", 1, 105, tdp=300.0, mem_total=24576.0)
    out = ["timestamp,memory.used,memory.total,utilization.gpu"]
    for k in range(90):
        s = run.state(k * 60, 0)
        out.append(
            f"{START + 75 + k * 60 + run.rng.randint(0, 1)},{10586 if k > 2 else 442 * k}, 24576, {s.util:.0f}"
        )
    return lines(out)


def home_quoted_newline() -> str:
    """A Python logger quoting a power cell that holds a newline (``"26.11`` newline
    ``0"``), sampling every ~0.25 s with elapsed seconds; input-starved."""
    run = Run("starved", 1, 106, tdp=300.0, period=1.5, duty=0.4, mem_total=49140.0)
    out = ["elapsed_sec,gpu_util_pct,mem_used_mb,mem_total_mb,temp_c,power_w"]
    t = 0.08
    for _k in range(480):
        s = run.state(t, 0)
        out.append(
            f'{t:.2f},{s.util:.0f},{s.mem:.0f},49140,{run.temp_of(0, s.util)},"{s.power:.2f}\n0"'
        )
        t += 0.22 + run.rng.randint(0, 6) / 100
    return lines(out)


def tsv_time_s_aggregates() -> str:
    """A tab-separated monitor log: ``Time(s)`` values with an ``s`` suffix, a header
    mixing tabs and spaces, machine-wide series as columns (CPU, GPU, LGPU); the CPU is
    saturated whenever the GPU waits."""
    run = Run("starved", 1, 107, period=6.0, duty=0.5)
    out = ["Time(s)\tCPU  GPU\tLGPU"]
    for k in range(240):
        s = run.state(k, 0)
        cpu = run.rng.uniform(96, 100) if s.util < 50 else run.rng.uniform(55, 75)
        out.append(f"{k}s\t{cpu:.1f}\t{s.util:.0f}\t{max(0, s.util - run.rng.uniform(0, 6)):.0f}")
    return lines(out)


def gpustat_loop() -> str:
    """``while true; do gpustat; sleep 1; done >> log``: the header line (hostname, date,
    driver) before each snapshot, ``'C``, process lists; 2 GPUs kept busy."""
    run = Run("healthy", 2, 108, tdp=215.0, mem_total=7982.0)
    out = []
    for k in range(150):
        t = START + k
        out.append(f"compute3{'':26}{date_line(t)}  465.19.01")
        for g in range(2):
            s = run.state(k, g)
            used = int(s.mem * 0.9)
            out.append(
                f"[{g}] NVIDIA GeForce RTX 2070 SUPER | {run.temp_of(g, s.util)}'C, {s.util:3.0f} % "
                f"| {used:5d} / {7982:5d} MB | root({used - 3}M)"
            )
    return lines(out)


def gpustat_full_color() -> str:
    """``gpustat -a --no-header --color`` in a loop: colour codes, ``°C``, fan speed before
    the utilisation, encoder/decoder, ``?? W`` when power has no reading; starved."""
    run = Run("starved", 1, 109, tdp=250.0, period=5.0, duty=0.4, mem_total=12287.0)
    cy, rs = "\x1b[36m", "\x1b[0;10m"
    out = []
    for k in range(200):
        s = run.state(k, 0)
        power = "??" if k % 37 == 5 else f"{s.power:.0f}"
        out.append(
            f"{cy}[0]{rs} \x1b[34mGeForce GTX TITAN X{rs} | \x1b[31m{run.temp_of(0, s.util)}°C{rs}, "
            f"{40 + k % 3:3d} %, \x1b[32m{s.util:3.0f} %{rs} (E:   0 %  D:   0 %), "
            f"{power:>3} / 250 W | \x1b[33m{int(s.mem)}{rs} / 12287 MB | "
            f"user1:python/48448({int(s.mem) - 300}M)"
        )
        out.append(" └─  48448 (  85%,  257MB): python train.py")
    return lines(out)


def gpustat_json_loop() -> str:
    """``gpustat --json`` appended in a loop: pretty-printed objects one after another;
    2 GPUs, memory held, nothing running (an idle allocation)."""
    run = Run("idle", 2, 110, tdp=300.0, mem_total=24576.0)
    out = []
    for k in range(100):
        t = START + 2 * k
        gpus = []
        for g in range(2):
            s = run.state(2 * k, g)
            gpus.append(
                {
                    "index": g,
                    "uuid": f"GPU-7e1{g}aa2c-0b9d-4c61-9f0e-5b2d9c7e11a{g}",
                    "name": "NVIDIA RTX A5000",
                    "temperature.gpu": run.temp_of(g, 0),
                    "fan.speed": 30,
                    "utilization.gpu": 0,
                    "utilization.enc": 0,
                    "utilization.dec": 0,
                    "power.draw": round(s.power),
                    "enforced.power.limit": 230,
                    "memory.used": 18023 + g,
                    "memory.total": 24564,
                    "processes": [
                        {
                            "username": "ana",
                            "command": "python",
                            "gpu_memory_usage": 18000,
                            "pid": 4100 + g,
                        }
                    ],
                }
            )
        doc = {
            "hostname": "ws-lab-2",
            "driver_version": "535.129.03",
            "query_time": iso(t) + f".{run.rng.randint(0, 999999):06d}",
            "gpus": gpus,
        }
        out.append(json.dumps(doc, indent=4, separators=(",", ": ")))
    return lines(out)


def wandb_events() -> str:
    """``wandb-events.jsonl``: one object per ~30 s with system.gpu.N.* keys (averages),
    _timestamp and _runtime; 2 GPUs kept busy (a healthy control)."""
    run = Run("healthy", 2, 111, tdp=300.0, mem_total=49140.0)
    out = []
    for k in range(60):
        ev: dict[str, object] = {}
        for g in range(2):
            s = run.state(k * 30, g)
            ev[f"system.gpu.{g}.gpu"] = round(s.util, 2)
            ev[f"system.gpu.{g}.memory"] = round(s.util * 0.4, 2)
            ev[f"system.gpu.{g}.memoryAllocated"] = round(100 * s.mem / 49140, 2)
            ev[f"system.gpu.{g}.temp"] = float(run.temp_of(g, s.util))
            ev[f"system.gpu.{g}.powerWatts"] = round(s.power, 2)
            ev[f"system.gpu.{g}.powerPercent"] = round(100 * s.power / 300, 2)
        ev["system.cpu"] = round(run.rng.uniform(30, 45), 2)
        ev["system.memory"] = 21.3
        ev["system.network.sent"] = 1233288 + 1000 * k
        ev["_wandb"] = True
        ev["_timestamp"] = START + 30 * k + run.rng.randint(0, 1)
        ev["_runtime"] = 28 + 30 * k
        out.append(json.dumps(ev))
    return lines(out)


def wandb_export_csv() -> str:
    """A W&B chart exported to CSV: quoted headers ``run - system/gpu.0.gpu`` with __MIN
    and __MAX companions, ``Relative Time (Process)``, 2 GPUs; starved (~45 % averages)."""
    run = Run("starved", 2, 112, tdp=400.0, period=3.0, duty=0.45)
    name = "glowing-sun-42"
    cols = ["Relative Time (Process)"]
    for g in range(2):
        for m in ("gpu", "powerWatts"):
            cols += [
                f"{name} - system/gpu.{g}.{m}",
                f"{name} - system/gpu.{g}.{m}__MIN",
                f"{name} - system/gpu.{g}.{m}__MAX",
            ]
    out = [",".join(f'"{c}"' for c in cols)]
    for k in range(80):
        rel = 15.2 + 15 * k
        cells = [f"{rel:.3f}"]
        for g in range(2):
            # a 15 s average of a 3 s starved rhythm
            us = [run.state(rel + i * 0.5, g) for i in range(30)]
            u = sum(x.util for x in us) / len(us)
            p = sum(x.power for x in us) / len(us)
            cells += [f"{u:.3f}", f"{u:.3f}", f"{u:.3f}", f"{p:.3f}", f"{p:.3f}", f"{p:.3f}"]
        if k % 11 == 4:
            cells[-6:] = ["", "", "", "", "", ""]  # GPU 1 not logged in this row
        out.append(",".join(cells))
    return lines(out)


DMON_ALL = (
    ("gpu", "Idx"),
    ("pwr", "W"),
    ("gtemp", "C"),
    ("mtemp", "C"),
    ("sm", "%"),
    ("mem", "%"),
    ("enc", "%"),
    ("dec", "%"),
    ("jpg", "%"),
    ("ofa", "%"),
    ("mclk", "MHz"),
    ("pclk", "MHz"),
    ("pviol", "%"),
    ("tviol", "bool"),
    ("fb", "MB"),
    ("bar1", "MB"),
    ("ccpm", "MB"),
    ("sbecc", "errs"),
    ("dbecc", "errs"),
    ("pci", "errs"),
    ("rxpci", "MB/s"),
    ("txpci", "MB/s"),
)


def dmon_all_columns() -> str:
    """``nvidia-smi dmon -s pucvmet -o DT``: every column set, date and time, the header
    pair every 20 rows, a blank line now and then; 4 GPUs, bursty (starved)."""
    run = Run("starved", 4, 113, tdp=400.0, period=5.0, duty=0.4)
    names = "#Date       Time        " + " ".join(f"{n:>5}" for n, _ in DMON_ALL)
    units = "#YYYYMMDD   HH:MM:SS    " + " ".join(f"{u:>5}" for _, u in DMON_ALL)
    out = []
    rows = 0
    for k in range(200):
        t = START + k
        for g in range(4):
            if rows % 20 == 0:
                out += [names, units]
            rows += 1
            s = run.state(k, g)
            vals = [
                g,
                int(s.power),
                run.temp_of(g, s.util),
                "-",
                int(s.util),
                int(s.util / 3),
                0,
                0,
                0,
                0,
                1593,
                1410 if s.util > 50 else 210,
                0,
                0,
                int(s.mem),
                4,
                0,
                "-",
                "-",
                0,
                120 if s.util < 50 else 9,
                4,
            ]
            out.append(
                f" {time.strftime('%Y%m%d   %H:%M:%S', time.gmtime(t))}    "
                + " ".join(f"{v:>5}" for v in vals)
            )
        if k % 50 == 49:
            out.append("")
    return lines(out)


def dmon_time_only_midnight() -> str:
    """``nvidia-smi dmon -s u -o T`` over midnight: a time column without a date; 1 GPU,
    healthy."""
    run = Run("healthy", 1, 114)
    out = []
    t0 = 86400 * 20000 - 90  # 23:58:30
    for k in range(180):
        if k % 30 == 0:
            out += [
                "#Time        gpu    sm   mem   enc   dec",
                "#HH:MM:SS    Idx     %     %     %     %",
            ]
        s = run.state(k, 0)
        out.append(
            f" {time.strftime('%H:%M:%S', time.gmtime(t0 + k))}    {0:>3} {int(s.util):>5} {int(s.util / 2):>5} {0:>5} {0:>5}"
        )
    return lines(out)


def dcgmi_dmon() -> str:
    """``dcgmi dmon -e 203,252,155,150,1001,1002``: the #Entity header and its ID/units line
    reprinted every 14 rows, GPUs listed from the last, N/A cells; 4 GPUs, GPU 1 writes a
    checkpoint while the others wait.  SMACT is what SM activity reads: most SMs busy
    while a GPU computes, the few SMs of NCCL's channels while it spins, none when idle."""
    run = Run("sync_stall", 4, 115, tdp=400.0, period=15.0, duty=0.35, stall_rank=1)
    sm_rng = random.Random(1150)

    def smact(s: State) -> float:
        if s.util < 5:
            return 0.0
        if s.power < 0.4 * run.tdp:  # pinned utilisation at idle power: spinning
            return sm_rng.uniform(0.14, 0.19)
        return s.util / 100 * sm_rng.uniform(0.78, 0.9)

    out = []
    rows = 0
    for k in range(160):
        for g in (3, 2, 1, 0):
            if rows % 14 == 0:
                out.append(
                    "#Entity   GPUTL             FBUSD             POWER             TMPTR        GRACT             SMACT"
                )
                out.append("ID                          MiB               W                 C")
            rows += 1
            s = run.state(k, g)
            grac = "N/A" if k < 2 else f"{s.util / 100 * 0.93:.3f}"
            out.append(
                f"GPU {g}     {int(s.util):<17} {int(s.mem):<17} {s.power:<17.3f} {run.temp_of(g, s.util):<12} "
                f"{grac:<17} {smact(s):.3f}"
            )
    return lines(out)


def _prom(series: list[tuple[dict[str, str], list[tuple[float, str]]]]) -> dict:
    return {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [{"metric": m, "values": [[t, v] for t, v in pts]} for m, pts in series],
        },
    }


def prom_dcgm() -> str:
    """A Prometheus query_range export of dcgm-exporter (one line, as the API returns it):
    DCGM_FI_DEV_GPU_UTIL, POWER_USAGE, FB_USED, PROF_GR_ENGINE_ACTIVE for 2 GPUs of one
    node, step 5 s; a starved run (10 s busy / 10 s idle)."""
    run = Run("starved", 2, 116, tdp=700.0, period=20.0, duty=0.5)
    series = []
    ts = [START + 5 * k for k in range(180)]
    states = {(g, t): run.state(t - START, g) for g in range(2) for t in ts}
    for g in range(2):
        base = {
            "gpu": str(g),
            "UUID": f"GPU-3f2a{g}c1e-8d47-4b0a-a6f1-{g}e29d0b7c5a1",
            "device": f"nvidia{g}",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": "gpu-node-07",
            "instance": "10.0.3.17:9400",
            "job": "dcgm-exporter",
        }
        for name, fn in (
            ("DCGM_FI_DEV_GPU_UTIL", lambda s: f"{s.util:.0f}"),
            ("DCGM_FI_DEV_POWER_USAGE", lambda s: f"{s.power:.3f}"),
            ("DCGM_FI_DEV_FB_USED", lambda s: f"{s.mem:.0f}"),
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", lambda s: f"{s.util / 100 * 0.9:.6f}"),
        ):
            pts = [(t, fn(states[(g, t)])) for t in ts]
            if name == "DCGM_FI_DEV_POWER_USAGE":
                pts[37] = (pts[37][0], "NaN")
            series.append(({"__name__": name, **base}, pts))
    return json.dumps(_prom(series), separators=(",", ":")) + "\n"


def prom_nvidia_gpu_exporter() -> str:
    """A pretty-printed query_range export of nvidia_gpu_exporter (ratios 0-1, bytes, a
    uuid label without the GPU- prefix); 1 GPU holding memory with nothing running."""
    run = Run("idle", 1, 117, tdp=320.0, mem_total=16384.0)
    ts = [START + 15 * k for k in range(120)]
    labels = {
        "uuid": "72f02a28-5140-325e-ba49-1ae77c6b4e30",
        "instance": "ws12:9835",
        "job": "nvidia_gpu_exporter",
    }
    series = []
    for name, fn in (
        ("nvidia_smi_utilization_gpu_ratio", lambda s: "0"),
        ("nvidia_smi_memory_used_bytes", lambda s: str(int(s.mem) << 20)),
        ("nvidia_smi_memory_total_bytes", lambda s: str(16384 << 20)),
        ("nvidia_smi_power_draw_watts", lambda s: f"{s.power:.2f}"),
    ):
        series.append(
            ({"__name__": name, **labels}, [(t, fn(run.state(t - START, 0))) for t in ts])
        )
    return json.dumps(_prom(series), indent=2) + "\n"


def prom_gpumon() -> str:
    """gpumon's own series pulled back from Prometheus: two responses (utilisation, then
    host CPU) on two lines, 2 GPUs kept busy."""
    run = Run("healthy", 2, 118)
    ts = [START + 10 * k for k in range(90)]
    util = []
    for g in range(2):
        lab = {
            "__name__": "gpumon_gpu_utilization_ratio",
            "gpu": str(g),
            "uuid": f"GPU-5d0c{g}",
            "instance": "node17:9977",
        }
        util.append((lab, [(t, f"{run.state(t - START, g).util / 100:.4f}") for t in ts]))
    host = [
        (
            {"__name__": "gpumon_host_cpu_ratio", "instance": "node17:9977"},
            [(t, f"{run.rng.uniform(0.3, 0.4):.3f}") for t in ts],
        )
    ]
    return json.dumps(_prom(util)) + "\n" + json.dumps(_prom(host)) + "\n"


def wide_per_gpu() -> str:
    """A script's CSV with one set of columns per GPU (``0GPU (%)``, ``1GPU (%)``), host CPU,
    RAM and swap, epoch seconds with ms; 2 GPUs, healthy."""
    run = Run("healthy", 2, 119)
    out = [
        "Timestamp (s),CPU (%),RAM (%),Swap (%),0GPU (%),0Mem (%),0Temp (C),1GPU (%),1Mem (%),1Temp (C)"
    ]
    for k in range(150):
        cells = [
            f"{START + k + 0.137 + run.rng.randint(0, 20) / 1000:.3f}",
            f"{run.rng.uniform(40, 60):.1f}",
            "31.2",
            "0.0",
        ]
        for g in range(2):
            s = run.state(k, g)
            cells += [f"{s.util:.0f}", f"{s.util / 3:.0f}", str(run.temp_of(g, s.util))]
        out.append(",".join(cells))
    return lines(out)


def semicolon_decimal_comma() -> str:
    """A logger on a German-locale machine: semicolons, decimal commas, times of day only
    (crossing midnight); 1 GPU, starved."""
    run = Run("starved", 1, 120, tdp=250.0, period=6.0, duty=0.35)
    out = ["time;gpu_util;power_w;mem_used_mib"]
    t0 = 23 * 3600 + 57 * 60
    for k in range(300):
        s = run.state(k, 0)
        tod = (t0 + k) % 86400
        out.append(
            f"{tod // 3600:02d}:{tod // 60 % 60:02d}:{tod % 60:02d};{s.util:.1f}".replace(".", ",")
            + f";{s.power:.1f}".replace(".", ",")
            + f";{int(s.mem)}"
        )
    return lines(out)


def concat_runs_cut_start() -> str:
    """Two nvidia-smi logs concatenated: the first starts mid-line (a garbled first
    timestamp), the second run restarted nvidia-smi with other columns two hours later."""
    run = Run("healthy", 1, 121, tdp=350.0, mem_total=24576.0)
    out = [
        "timestamp, name, utilization.gpu [%], utilization.memory [%], memory.total [MiB], memory.used [MiB], power.draw [W]"
    ]
    for k in range(100):
        s = run.state(k, 0)
        stamp = nvsmi_stamp(START + k + 0.642)
        if k == 0:
            stamp = stamp[1:]
        out.append(
            f"{stamp}, NVIDIA GeForce RTX 3090, {s.util:.0f} %, {s.util / 4:.0f} %, 24576 MiB, {s.mem:.0f} MiB, {s.power:.2f} W"
        )
    out.append("timestamp, utilization.gpu [%], memory.used [MiB], power.draw [W], temperature.gpu")
    for k in range(100):
        s = run.state(k, 0)
        out.append(
            f"{nvsmi_stamp(START + 7200 + k + 0.301)}, {s.util:.0f} %, {s.mem:.0f} MiB, {s.power:.2f} W, {run.temp_of(0, s.util)}"
        )
    return lines(out)


def gnu_iso_ns() -> str:
    """``echo "$(date --iso-8601=ns),$line"`` around nvidia-smi --format=csv,noheader,
    nounits -lms 200: the time's comma fraction splits it into two cells; starved."""
    run = Run("starved", 1, 122, period=1.2, duty=0.5)
    out = ["timestamp,utilization.gpu,utilization.memory,memory.used,power.draw"]
    for k in range(600):
        t = START + k * 0.2 + 0.0131
        whole = int(t)
        ns = int((t - whole) * 1e9)
        s = run.state(k * 0.2, 0)
        out.append(
            f"{iso(whole + 3600)},{ns:09d}+01:00,{s.util:.0f}, {s.util / 3:.0f}, {s.mem:.0f}, {s.power:.2f}"
        )
    return lines(out)


def whole_second_fast() -> str:
    """A home-made logger at ~4 rows a second stamping whole seconds (``%Y-%m-%d
    %H:%M:%S``): several ticks share each timestamp; 1 GPU, starved (0.75 s rhythm)."""
    run = Run("starved", 1, 123, period=0.75, duty=0.5)
    out = ["timestamp,gpu_utilization,memory_used,memory_total"]
    for k in range(800):
        t = k * 0.25
        s = run.state(t, 0)
        out.append(f"{iso(START + t, ' ')},{s.util:.0f}, {s.mem:.0f}, 81920")
    return lines(out)


def ms_epoch_gpu_id() -> str:
    """``Time,GPU_ID,Utilization`` at ~100 ms with float epoch seconds of varying length;
    NVML's value repeats over two rows (it refreshes slower than the loop); healthy."""
    run = Run("healthy", 1, 124)
    out = ["Time,GPU_ID,Utilization"]
    t = START + 0.750246
    u = 0.0
    for k in range(1200):
        if k % 2 == 0:
            u = run.state(k * 0.1, 0).util
        out.append(f"{round(t, 7)!r},0,{u:.0f}")
        t += 0.1013 + run.rng.randint(0, 9) / 10000
    return lines(out)


def three_gpu_date_time() -> str:
    """``Date,Time,Temperature,Power Used, Power Max,...`` with DD-MM-YYYY dates and no GPU
    column: 3 GPUs per tick, many ticks per whole second, told apart by temperature; idle."""
    rng = random.Random(125)
    out = ["Date,Time,Temperature,Power Used, Power Max,Fan,Utilization,Memory Used,Memory Max"]
    temps = (58, 95, 41)
    for k in range(240):
        t = START + k // 6
        for g in range(3):
            out.append(
                time.strftime("%d-%m-%Y,%H:%M:%S", time.gmtime(t))
                + f",{temps[g] + rng.choice((0, 0, 1))},{1 + g},250,0,0,0,11019"
            )
    return lines(out)


def short_v100() -> str:
    """Ten samples at 1 s of a V100 going 0, 31, 0, 95, 0, 24, 0, 94, 0, 0 %: a short log
    that is starved, not start-up."""
    out = ["timestamp, name, utilization.gpu [%], memory.used [MiB], power.draw [W]"]
    for k, u in enumerate((0, 31, 0, 95, 0, 24, 0, 94, 0, 0)):
        out.append(
            f"{nvsmi_stamp(START + k + 0.5)}, Tesla V100-SXM2-16GB, {u} %, 15012 MiB, {60 + 2.3 * u:.2f} W"
        )
    return lines(out)


def epoch_gap_27s() -> str:
    """-l 1 over 10 minutes of a stock DataLoader restarting its workers every epoch: a
    ~4.5 s gap every 27 s, busy otherwise."""
    run = Run("epoch_gap", 1, 126, tdp=400.0)
    out = ["timestamp, index, utilization.gpu [%], memory.used [MiB], power.draw [W]"]
    for k in range(600):
        s = run.state(k, 0)
        out.append(
            f"{nvsmi_stamp(START + k + 0.2)}, 0, {s.util:.0f} %, {s.mem:.0f} MiB, {s.power:.2f} W"
        )
    return lines(out)


def table_then_csv() -> str:
    """A job script that prints ``nvidia-smi`` once (2 A100s, nothing running yet), then
    starts ``nvidia-smi --query-gpu=... --format=csv -l 1`` into the same file: a table
    preamble, then a CSV log of a run whose input pipeline cannot keep up."""
    t0 = START - 3
    table = [
        date_line(t0) + "       ",
        "+" + "-" * 87 + "+",
        "| NVIDIA-SMI 535.154.05             Driver Version: 535.154.05   CUDA Version: 12.2     |",
        "|-----------------------------------------+----------------------+----------------------+",
        "| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                      |               MIG M. |",
        "|=========================================+======================+======================|",
    ]
    for g, bus in enumerate(("00000000:07:00.0", "00000000:0F:00.0")):
        table += [
            f"|   {g}  NVIDIA A100-SXM4-40GB          On  | {bus} Off |                    0 |",
            f"| N/A   {31 + g}C    P0              {52 + 3 * g}W / 400W |      4MiB / 40960MiB |      0%      Default |",
            "|                                         |                      |             Disabled |",
            "+-----------------------------------------+----------------------+----------------------+",
        ]
    table += [
        " " * 89,
        "+" + "-" * 87 + "+",
        "| Processes:                                                                            |",
        "|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |",
        "|        ID   ID                                                             Usage      |",
        "|=======================================================================================|",
        "|  No running processes found                                                           |",
        "+" + "-" * 87 + "+",
    ]
    run = Run("starved", 2, 127, tdp=400.0, mem_total=40960.0, period=5.0, duty=0.4)
    out = ["timestamp, index, name, utilization.gpu [%], memory.used [MiB], power.draw [W]"]
    for k in range(180):
        for g in range(2):
            s = run.state(k, g)
            out.append(
                f"{nvsmi_stamp(START + k + 0.31 + 0.002 * g)}, {g}, NVIDIA A100-SXM4-40GB, "
                f"{s.util:.0f} %, {s.mem:.0f} MiB, {s.power:.2f} W"
            )
    return lines(table + out)


# --- the long tail (issue "Real logs, the long tail"): each class as the real logs showed it


def nvsmi_2gpu_lms100_late_rows() -> str:
    """``nvidia-smi --query-gpu=timestamp,power.draw,utilization.gpu,memory.used
    --format=csv -lms 100`` on two GPUs, no index: the rows of a tick 1-4 ms apart, ticks
    101-104 ms apart, and now and then the second GPU's row late (8 to 33 ms, once 93 ms)
    as nvidia-smi waits on a GPU.  40 s idle first: memory the same on both GPUs, each
    GPU's power constant to the hundredth of a watt and its own (17.55 W, 16.19 W).  Then
    GPU 0 trains, fed (95-99 %), while GPU 1 stays idle."""
    rng = random.Random(301)
    out = ["timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]"]
    late = (0.008, 0.010, 0.023, 0.027, 0.030, 0.033)
    t = START + 0.575
    for k in range(1000):
        gap = rng.choice((0.001, 0.001, 0.002, 0.003, 0.004))
        if k % 23 == 11:
            gap = late[(k // 23) % len(late)]
        if k == 151:
            gap = 0.093
        busy = t - START > 40.0
        mem = 1 if t - START < 3 else 4
        if busy:
            u0 = rng.randint(95, 99)
            rows = ((f"{rng.uniform(165, 195):.2f}", u0, 2693), ("16.19", 0, 4))
        else:
            rows = (("17.55", 0, mem), ("16.19", 0, mem))
        for g, (power, util, used) in enumerate(rows):
            out.append(f"{nvsmi_stamp(t + g * gap)}, {power} W, {util} %, {used} MiB")
        t += rng.choice((0.101, 0.102, 0.102, 0.103, 0.104))
    return lines(out)


def grep_mib_v100_starved() -> str:
    """``nvidia-smi -l 1 | grep MiB`` of one V100: its GPU row and its process row each
    second, no date lines; utilisation 0/31/0/95/0/24 %... every other second at the same
    memory.used, temperature and power rising a little with each burst.  One GPU, starved."""
    rng = random.Random(302)
    out = []
    busy = (31, 95, 24, 94, 88, 40, 97, 63)
    for k in range(120):
        util = 0 if k % 2 == 0 else busy[(k // 2) % len(busy)]
        temp = 38 + (2 if util else 0) + rng.choice((0, 0, 1))
        power = 41 + 2.4 * util + rng.uniform(-2, 2)
        out.append(
            f"| N/A   {temp}C    P0   {power:3.0f}W / 300W |  15012MiB / 16160MiB |"
            f"  {util:3d}%      Default |"
        )
        out.append(
            "|    0   N/A  N/A     23456      C   python                          15009MiB |"
        )
    return lines(out)


def dmon_8_samples_one_dip() -> str:
    """``nvidia-smi dmon`` for eight seconds of a GPU that works: 30-95 % (mean 65 %) with
    one dip.  A person says healthy, with little confidence on so short a log."""
    out = [
        "# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk",
        "# Idx      W      C      C      %      %      %      %      %      %    MHz    MHz",
    ]
    for sm in (62, 70, 95, 30, 75, 68, 60, 60):
        out.append(
            f"    0    {150 + int(sm * 1.3):3d}     51      -    {sm:3d}    {sm // 2:3d}      0      0      0      0   9501   1755"
        )
    return lines(out)


def nvsmi_2gpu_slow_start() -> str:
    """``nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,power.draw
    --format=csv -lms 150``, two GPUs: 2 s of start-up at 0-70 %, then 6 s at 96-98 %.
    A person says healthy: the start is where the log begins, not what the run does."""
    rng = random.Random(304)
    out = ["timestamp, index, utilization.gpu [%], memory.used [MiB], power.draw [W]"]
    t = START + 0.1
    while t < START + 8.0:
        for g in range(2):
            util = rng.randint(0, 70) if t - START < 2.0 else rng.randint(96, 98)
            out.append(
                f"{nvsmi_stamp(t + 0.001 * g)}, {g}, {util} %, {30211 + 17 * g} MiB, "
                f"{90 + 3.1 * util + rng.uniform(-5, 5):.2f} W"
            )
        t += rng.uniform(0.1, 0.2)
    return lines(out)


def keyvalue_blocks() -> str:
    """A home-made Python logger: a ``=== date ===`` line, then ``Key: value`` lines for the
    GPU (load, memory used / total, temperature) and the host (CPU, RAM), a blank line;
    every 5 s.  A laptop GPU starved by its CPU: loaded one sample in three."""
    rng = random.Random(305)
    out = []
    for k in range(120):
        busy = k % 3 == 0
        load = rng.uniform(85, 99) if busy else rng.uniform(0, 4)
        used = 4711.0 + rng.choice((0.0, 2.0))
        cpu = rng.uniform(20, 35) if busy else rng.uniform(96, 100)
        out += [
            f"=== {iso(START + 5 * k, ' ')} ===",
            f"GPU Load: {load:.1f}%",
            f"GPU Memory: {used:.1f}MB / 6144.0MB ({100 * used / 6144:.1f}%)",
            f"GPU Temperature: {61 + (6 if busy else 0):.1f}°C",
            f"CPU Usage: {cpu:.1f}%",
            f"RAM Usage: 9.2GB / 15.9GB ({100 * 9.2 / 15.9:.1f}%)",
            "",
        ]
    return lines(out)


def keyvalue_inline() -> str:
    """A logger printing a whole sample on one line, ``Key: value`` pairs two spaces apart
    after a ``[DD-MM-YYYY @ HH:MM:SS] >`` prompt gpumon does not read as a time: one GPU
    busy three samples in six, its memory held throughout."""
    rng = random.Random(308)
    out = []
    for k in range(90):
        g = time.gmtime(START + k)
        stamp = time.strftime("%d-%m-%Y @ %H:%M:%S", g)
        busy = k % 6 < 3
        util = rng.randint(90, 99) if busy else 0
        power = rng.randint(210, 240) if busy else rng.randint(55, 60)
        out.append(
            f"[{stamp}] >  Temp: {71 if busy else 64}C  Power: {power}/250 W  Fan: 41%  "
            f"Utilization: {util}%  Memory: 9012/11019 MiB"
        )
    return lines(out)


def date_rows_separator() -> str:
    """``while true; do date; nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used,
    memory.total --format=csv,noheader; echo ----; sleep 2; done``: a date line, one
    header-less row per GPU (units on every value), a separator.  Two GPUs in step, fed."""
    rng = random.Random(306)
    out = []
    for k in range(90):
        t = START + 2 * k
        out.append(
            date_line(t).replace(
                f" {time.gmtime(int(t)).tm_year}", " UTC " + str(time.gmtime(int(t)).tm_year)
            )
        )
        for g in range(2):
            out.append(
                f"{g}, NVIDIA A100-SXM4-40GB, {rng.randint(93, 100)} %, {31250 + 9 * g} MiB, 40960 MiB"
            )
        out.append("----")
    return lines(out)


def trainer_13_columns() -> str:
    """A trainer logging its own metrics beside nvidia-smi's: ``timestamp, index,
    utilization.gpu [%]`` and ten columns of its own (step, loss, lr, ...); 1 s apart,
    the GPU waiting on data half of every 6 s."""
    rng = random.Random(307)
    out = [
        "timestamp, index, utilization.gpu [%], step, loss, lr, grad_norm, tokens_per_sec, "
        "batch, seq_len, mfu, run, note"
    ]
    for k in range(240):
        util = rng.randint(92, 100) if k % 6 < 3 else rng.randint(0, 3)
        out.append(
            f"{nvsmi_stamp(START + k + 0.3)}, 0, {util}, {k}, {2.5 - k / 200:.3f}, 0.0003, "
            f"{rng.uniform(0.5, 1.5):.2f}, {rng.randint(4000, 6000)}, 32, 2048, "
            f"{rng.uniform(0.2, 0.4):.2f}, run7, ok"
        )
    return lines(out)


# --- logs refused before issue 35: other monitors' JSON lines, nvidia-smi -q, long tables,
# one-line monitors, key-value blocks with framework lines, rows of bare numbers


def json_per_gpu_events() -> str:
    """A monitor's JSON lines, one object per GPU per second: ``ts`` in ISO with an offset,
    ``gpu_index``, ``util_gpu``, ``util_mem``, ``mem_used`` / ``mem_total`` (MiB without
    saying so), ``power_draw`` (``null`` where the driver gave none), ``temp_c``,
    ``pstate``, the trainer's ``phase`` and ``step``; event objects between samples
    (``{"ts": ..., "event": "eval_start"}``); the last line cut short.  Two GPUs fed by
    one input pipeline: busy 3 s of every 6."""
    run = Run("starved", 2, 351, tdp=300.0, mem_total=81559.0, period=6.0, duty=0.5)
    out = []
    step = 1200
    for k in range(240):
        t = START + k + 0.412
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(t))) + ".412+00:00"
        if k % 60 == 30:
            out.append(json.dumps({"ts": stamp, "event": "eval_start", "epoch": k // 60}))
        for g in range(2):
            s = run.state(k, g)
            power = None if (k + g) % 37 == 5 else round(s.power, 1)
            out.append(
                json.dumps(
                    {
                        "ts": stamp,
                        "gpu_index": g,
                        "util_gpu": round(s.util),
                        "util_mem": round(s.util * 0.4),
                        "mem_used": round(s.mem),
                        "mem_total": 81559,
                        "power_draw": power,
                        "temp_c": run.temp_of(g, s.util),
                        "pstate": "P0",
                        "phase": "train",
                        "step": step,
                    }
                )
            )
        step += 1 if k % 6 < 3 else 0
    text = lines(out)
    return text[: text.rfind("{") + 40]  # the logger killed mid-line


def json_nvline_epoch() -> str:
    """``nvline``-shaped: nvidia-smi's fields dumped each second as compact JSON with sorted
    keys (``driver_version``, ``index``, ``memory_free``, ``memory_total``, ``memory_used``,
    ``name``, ``temperature_gpu``, epoch-second ``timestamp``) and no utilisation at all.
    An A10G with 4 MiB used: nothing runs, but the log cannot say so."""
    rng = random.Random(352)
    out = []
    for k in range(180):
        used = 4
        obj = {
            "driver_version": "545.23.08",
            "index": 0,
            "memory_free": 23028 - 520 - used,
            "memory_total": 23028,
            "memory_used": used,
            "name": "NVIDIA A10G",
            "temperature_gpu": 30 + rng.choice((0, 0, 0, 1)),
            "timestamp": START + k,
        }
        out.append(json.dumps(obj, separators=(",", ":"), sort_keys=True))
    return lines(out)


def json_devices_list() -> str:
    """A logger writing one object per minute with a ``devices`` list (``id``, ``name``,
    ``mem_used`` / ``mem_total`` in GB without saying so, ``util`` as a 0-1 fraction) and a
    ``processes`` list beside it; float epoch ``time``.  Two Quadro RTX 8000s training."""
    rng = random.Random(353)
    out = []
    for k in range(150):
        devices = [
            {
                "id": g,
                "name": "Quadro RTX 8000",
                "mem_used": round(36.842 + 0.002 * rng.randint(0, 3) - 1.2 * g, 3),
                "mem_total": 48.601 - 0.003 * g,
                "util": round(rng.uniform(0.93, 1.0), 2),
            }
            for g in range(2)
        ]
        obj = {
            "time": START + 60 * k + rng.uniform(0.0, 0.02),
            "devices": devices,
            "processes": [
                {
                    "device_id": g,
                    "user": "student",
                    "name": "/home/student/anaconda3/envs/bin/python train.py",
                    "uptime": f"0-{(k + 61) // 60:02d}:{(k + 1) % 60:02d}:{17 + g:02d}",
                }
                for g in range(2)
            ],
        }
        out.append(json.dumps(obj))
    return lines(out)


_Q_BANNER = "==============NVSMI LOG=============="


def _q_field(indent: int, key: str, value: str) -> str:
    return f"{' ' * indent}{key:<{42 - indent}}: {value}"


def nvsmi_q_loop_535() -> str:
    """``nvidia-smi -q -d UTILIZATION,MEMORY,POWER,TEMPERATURE -l 1`` on a 535 driver: a
    report a second, each with its banner and ``Timestamp``; ``Utilization / Gpu``, the
    ``GPU Utilization Samples`` (max, min, avg over the driver's buffer) beside it, ``GPU
    Power Readings / Power Draw`` and a ``Power Samples`` section.  Two A100s on buses
    3B and D8 starved together by one input pipeline: busy 2 s of every 5."""
    run = Run("starved", 2, 354, tdp=300.0, mem_total=40960.0, period=5.0, duty=0.4)
    out: list[str] = []
    for k in range(48):
        t = START + k
        out += ["", _Q_BANNER, ""]
        out += [
            _q_field(0, "Timestamp", date_line(t)),
            _q_field(0, "Driver Version", "535.104.05"),
            _q_field(0, "CUDA Version", "12.2"),
            "",
            _q_field(0, "Attached GPUs", "2"),
        ]
        for g, bus in enumerate(("00000000:3B:00.0", "00000000:D8:00.0")):
            s = run.state(k, g)
            avg = max(0, min(100, round(s.util + run.rng.uniform(-8, 8))))
            out += [
                f"GPU {bus}",
                "    FB Memory Usage",
                _q_field(8, "Total", "40960 MiB"),
                _q_field(8, "Reserved", "635 MiB"),
                _q_field(8, "Used", f"{s.mem:.0f} MiB"),
                _q_field(8, "Free", f"{40960 - 635 - s.mem:.0f} MiB"),
                "    BAR1 Memory Usage",
                _q_field(8, "Total", "65536 MiB"),
                _q_field(8, "Used", "1 MiB"),
                _q_field(8, "Free", "65535 MiB"),
                "    Utilization",
                _q_field(8, "Gpu", f"{s.util:.0f} %"),
                _q_field(8, "Memory", f"{s.util * 0.3:.0f} %"),
                _q_field(8, "Encoder", "0 %"),
                _q_field(8, "Decoder", "0 %"),
                "    GPU Utilization Samples",
                _q_field(8, "Duration", "16.58 sec"),
                _q_field(8, "Number of Samples", "99"),
                _q_field(8, "Max", "100 %"),
                _q_field(8, "Min", "0 %"),
                _q_field(8, "Avg", f"{avg} %"),
                "    Temperature",
                _q_field(8, "GPU Current Temp", f"{run.temp_of(g, s.util)} C"),
                _q_field(8, "GPU T.Limit Temp", "N/A"),
                _q_field(8, "GPU Shutdown Temp", "90 C"),
                _q_field(8, "GPU Slowdown Temp", "87 C"),
                _q_field(8, "GPU Max Operating Temp", "85 C"),
                _q_field(8, "GPU Target Temperature", "N/A"),
                _q_field(8, "Memory Current Temp", f"{run.temp_of(g, s.util) - 4} C"),
                _q_field(8, "Memory Max Operating Temp", "95 C"),
                "    GPU Power Readings",
                _q_field(8, "Power Draw", f"{s.power:.2f} W"),
                _q_field(8, "Current Power Limit", "300.00 W"),
                _q_field(8, "Requested Power Limit", "300.00 W"),
                _q_field(8, "Default Power Limit", "300.00 W"),
                _q_field(8, "Min Power Limit", "150.00 W"),
                _q_field(8, "Max Power Limit", "300.00 W"),
                "    Power Samples",
                _q_field(8, "Duration", "2.38 sec"),
                _q_field(8, "Number of Samples", "119"),
                _q_field(8, "Max", f"{s.power + 11:.2f} W"),
                _q_field(8, "Min", f"{max(40.0, s.power - 40):.2f} W"),
                _q_field(8, "Avg", f"{s.power:.2f} W"),
                "",
            ]
    return lines(out)


def nvsmi_q_full_minor_swap() -> str:
    """``while true; do nvidia-smi -q >> log; sleep 10; done`` on a 570 driver: whole
    reports (identity, PCI, clocks, temperatures, processes); ``Utilization / GPU``; power
    as ``Average`` and ``Instantaneous Power Draw`` only, beside ``GPU Memory Power
    Readings`` and ``Module Power Readings`` of N/A.  Two GPUs listed in bus order (1A,
    3D) whose minor numbers are the other way round (1, 0).  A notebook's kernel holds
    31 GB on GPU 0 and computes nothing; GPU 1 is empty."""
    rng = random.Random(355)
    out: list[str] = []
    gpus = (("00000000:1A:00.0", 1, 31873), ("00000000:3D:00.0", 0, 0))
    for k in range(16):
        t = START + 10 * k + (1 if k % 3 == 2 else 0)
        out += ["", _Q_BANNER, ""]
        out += [
            _q_field(0, "Timestamp", date_line(t)),
            _q_field(0, "Driver Version", "570.124.06"),
            _q_field(0, "CUDA Version", "12.8"),
            "",
            _q_field(0, "Attached GPUs", "2"),
        ]
        for g, (bus, minor, used) in enumerate(gpus):
            power = 61.3 + 3 * g + rng.uniform(-0.4, 0.4) if used else 23.8 + rng.uniform(-0.3, 0.3)
            out += [
                f"GPU {bus}",
                _q_field(4, "Product Name", "NVIDIA L40S"),
                _q_field(4, "Product Brand", "NVIDIA"),
                _q_field(4, "Product Architecture", "Ada Lovelace"),
                _q_field(4, "Display Mode", "Disabled"),
                _q_field(4, "Persistence Mode", "Enabled"),
                "    MIG Mode",
                _q_field(8, "Current", "N/A"),
                _q_field(8, "Pending", "N/A"),
                _q_field(4, "Serial Number", f"13242230{minor}5631"),
                _q_field(4, "GPU UUID", f"GPU-8c45994a-7fe3-4f26-b7e9-4d496ae2d5c{minor}"),
                _q_field(4, "Minor Number", str(minor)),
                _q_field(4, "VBIOS Version", "95.02.66.00.02"),
                "    PCI",
                _q_field(8, "Bus", "0x" + bus[9:11]),
                _q_field(8, "Device", "0x00"),
                _q_field(8, "Domain", "0x0000"),
                _q_field(8, "Bus Id", bus),
                "        GPU Link Info",
                "            PCIe Generation",
                _q_field(16, "Max", "4"),
                _q_field(16, "Current", "1"),
                _q_field(8, "Tx Throughput", f"{rng.randint(200, 600)} KB/s"),
                _q_field(8, "Rx Throughput", f"{rng.randint(200, 600)} KB/s"),
                _q_field(4, "Fan Speed", "N/A"),
                _q_field(4, "Performance State", "P0" if used else "P8"),
                "    Clocks Event Reasons",
                _q_field(8, "Idle", "Active"),
                _q_field(8, "Applications Clocks Setting", "Not Active"),
                _q_field(8, "SW Power Cap", "Not Active"),
                _q_field(8, "HW Slowdown", "Not Active"),
                _q_field(12, "HW Thermal Slowdown", "Not Active"),
                _q_field(12, "HW Power Brake Slowdown", "Not Active"),
                "    FB Memory Usage",
                _q_field(8, "Total", "46068 MiB"),
                _q_field(8, "Reserved", "591 MiB"),
                _q_field(8, "Used", f"{used + 1} MiB"),
                _q_field(8, "Free", f"{46068 - 591 - used - 1} MiB"),
                "    Compute Mode",
                "    Utilization",
                _q_field(8, "GPU", "0 %"),
                _q_field(8, "Memory", "0 %"),
                _q_field(8, "Encoder", "0 %"),
                _q_field(8, "Decoder", "0 %"),
                _q_field(8, "JPEG", "0 %"),
                _q_field(8, "OFA", "0 %"),
                "    Temperature",
                _q_field(8, "GPU Current Temp", f"{33 + 3 * g} C"),
                _q_field(8, "GPU T.Limit Temp", f"{52 - 3 * g} C"),
                _q_field(8, "Memory Current Temp", "N/A"),
                "    GPU Power Readings",
                _q_field(8, "Average Power Draw", f"{power:.2f} W"),
                _q_field(8, "Instantaneous Power Draw", f"{power + rng.uniform(-1, 1):.2f} W"),
                _q_field(8, "Current Power Limit", "350.00 W"),
                _q_field(8, "Requested Power Limit", "350.00 W"),
                _q_field(8, "Default Power Limit", "350.00 W"),
                "    GPU Memory Power Readings ",
                _q_field(8, "Average Power Draw", "N/A"),
                _q_field(8, "Instantaneous Power Draw", "N/A"),
                "    Module Power Readings",
                _q_field(8, "Average Power Draw", "N/A"),
                _q_field(8, "Instantaneous Power Draw", "N/A"),
                _q_field(8, "Current Power Limit", "N/A"),
                "    Clocks",
                _q_field(8, "Graphics", f"{2520 if used else 210} MHz"),
                _q_field(8, "SM", f"{2520 if used else 210} MHz"),
                _q_field(8, "Memory", f"{9001 if used else 405} MHz"),
                _q_field(8, "Video", f"{1965 if used else 1185} MHz"),
                "    Max Clocks",
                _q_field(8, "Graphics", "2520 MHz"),
                _q_field(8, "SM", "2520 MHz"),
                _q_field(8, "Memory", "9001 MHz"),
            ]
            if used:
                out += [
                    "    Processes",
                    _q_field(8, "GPU instance ID", "N/A"),
                    _q_field(8, "Compute instance ID", "N/A"),
                    _q_field(8, "Process ID", "2286603"),
                    _q_field(12, "Type", "C"),
                    _q_field(12, "Name", "/opt/conda/bin/python3.11"),
                    _q_field(12, "Used GPU Memory", f"{used - 14} MiB"),
                    "",
                ]
            else:
                out += [_q_field(4, "Processes", "None"), ""]
    return lines(out)


def dcgm_api_power_only() -> str:
    """DCGM's API example (``dcgmWatchFields`` at 10 ms, ``dcgmGetValuesSince_v2`` once a
    second, the callback printing ``entityId,ts,fieldMeta->tag,value``): the header
    ``GPUId,TimeStampUs,Field,Values``; each call's values grouped by GPU, then field, then
    time; ``power_usage_instant`` with two decimals and ``current_clock_throttle_reasons``
    as an integer, after a ``throttle_reason_idle,1`` row whenever the idle bit is set.
    No utilisation: two GPUs' power, busy (~270 W) half of each 4 s and idle between."""
    rng = random.Random(356)
    out = ["GPUId,TimeStampUs,Field,Values"]
    base = START * 1_000_000 + 412_345
    for call in range(6):
        for gpu in (0, 1):
            times = [base + call * 1_000_000 + k * 10_000 + rng.randint(0, 40) for k in range(100)]
            busy = [((t - base) / 1e6) % 4.0 < 2.0 for t in times]
            for t, b in zip(times, busy, strict=True):
                w = rng.uniform(262, 281) if b else rng.uniform(61, 64)
                out.append(f"{gpu},{t},power_usage_instant,{w:.2f}")
            for t, b in zip(times, busy, strict=True):
                reasons = 0 if b else 1
                if reasons & 1:
                    out.append(f"{gpu},{t + 3},throttle_reason_idle,1")
                out.append(f"{gpu},{t + 3},current_clock_throttle_reasons,{reasons}")
    return lines(out)


def long_tidy_dcgm_names() -> str:
    """A Prometheus range export flattened to a tidy CSV: ``timestamp,Hostname,gpu,metric,
    value`` with ISO times (``Z``), dcgm-exporter's metric names, one row per GPU and
    metric every 15 s scrape, metrics in alphabetical order within a scrape.  Four GPUs
    of one node training, fed."""
    run = Run("healthy", 4, 357, tdp=700.0, mem_total=81559.0)
    out = ["timestamp,Hostname,gpu,metric,value"]
    for k in range(80):
        t = START + 15 * k
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
        states = [run.state(15 * k, g) for g in range(4)]
        for metric in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"):
            for g, s in enumerate(states):
                value = {
                    "DCGM_FI_DEV_FB_USED": f"{s.mem:.0f}",
                    "DCGM_FI_DEV_GPU_UTIL": f"{s.util:.0f}",
                    "DCGM_FI_DEV_POWER_USAGE": f"{s.power:.3f}",
                }[metric]
                out.append(f"{stamp},gpu-node-07,{g},{metric},{value}")
    return lines(out)


def oneline_bracket_alerts() -> str:
    """A one-line monitor of two GPUs (indices 2 and 3, the job's ``CUDA_VISIBLE_DEVICES``)
    every 5 s: ``[HH:MM:SS] GPU2: util=100% mem=33769MiB free=11616MiB | GPU3: ...``, a
    start-up banner, and alert lines with emoji (``⚠️``, ``🔥``) between samples; times of
    day only, over midnight.  Both GPUs starved by one input pipeline."""
    run = Run("starved", 2, 358, tdp=300.0, mem_total=46068.0, period=20.0, duty=0.4)
    start = 86400 * (START // 86400) + 86400 - 600  # 23:50:00
    out = [
        "=" * 60,
        "GPU monitor started · GPUs 2,3 · every 5s · log: gpu_monitor.log",
        "=" * 60,
    ]
    for k in range(240):
        t = start + 5 * k
        clock = time.strftime("%H:%M:%S", time.gmtime(t))
        parts = []
        for g, gpu in enumerate((2, 3)):
            s = run.state(5 * k + 0.5, g)
            used = round(s.mem)
            parts.append(f"GPU{gpu}: util={s.util:.0f}% mem={used}MiB free={46068 - 591 - used}MiB")
        out.append(f"[{clock}] " + " | ".join(parts))
        if k % 24 == 23:
            out.append(f"⚠️  [{clock}] GPU3 util below 20% for 30s — check the data loader")
        if k == 100:
            out.append(f"🔥 [{clock}] GPU2 temperature 83C")
    return lines(out)


def oneline_logging_pipes() -> str:
    """Python ``logging`` with ``%(asctime)s`` (a comma before the milliseconds) and every
    GPU on one line: ``2025-02-03 21:49:59,959 | GPU0: Util=97%, Mem=81.5% | GPU1: ...``,
    memory as a percent of the card; every 10 s; four GPUs training, fed."""
    run = Run("healthy", 4, 359, tdp=400.0, mem_total=40960.0)
    out = []
    for k in range(120):
        t = START + 10 * k + 0.959
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(int(t))) + ",959"
        parts = []
        for g in range(4):
            s = run.state(10 * k, g)
            parts.append(f"GPU{g}: Util={s.util:.0f}%, Mem={100 * s.mem / 40960:.1f}%")
        out.append(stamp + " | " + " | ".join(parts))
    return lines(out)


def keyvalue_pytorch_lines() -> str:
    """A GPUtil logger's blocks (each begins with a blank line, then ``=== date ===``):
    ``GPU Load``, ``GPU Memory: used / total (pct)``, ``GPU Temperature``, ``PyTorch GPU
    Memory - Allocated: 4012.3MB, Reserved: 4608.0MB`` (two readings on one line), ``CPU
    Usage`` of the process (above 100 % when it uses several cores), ``RAM Usage`` in MB;
    every 2 s.  A GPU starved by its loader: loaded one sample in three."""
    rng = random.Random(360)
    out: list[str] = []
    for k in range(150):
        busy = k % 3 == 0
        load = rng.uniform(88, 99) if busy else rng.uniform(0, 5)
        used = 5120.0 + rng.choice((0.0, 2.0, 4.0))
        out += [
            "",
            f"=== {iso(START + 2 * k, ' ')} ===",
            f"GPU Load: {load:.1f}%",
            f"GPU Memory: {used:.1f}MB / 8192.0MB ({100 * used / 8192:.1f}%)",
            f"GPU Temperature: {64 + (5 if busy else 0):.1f}°C",
            f"PyTorch GPU Memory - Allocated: {4012.3 + rng.choice((0.0, 0.5)):.1f}MB, "
            "Reserved: 4608.0MB",
            f"CPU Usage: {rng.uniform(100, 140) if not busy else rng.uniform(30, 60):.1f}%",
            f"RAM Usage: {2345.6 + rng.uniform(0, 4):.1f}MB",
        ]
    return lines(out)


def noheader_stamp_util_varies() -> str:
    """``nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,memory.total
    --format=csv,noheader,nounits -l 1``: no header, no units; the index a constant 0,
    memory used and total constant.  The values leave one reading only: the stamp is the
    time, the one changing 0-100 column the utilisation, the constant 24564 the total.
    A GPU starved: busy 2 s of every 5."""
    run = Run("starved", 1, 361, tdp=350.0, mem_total=24564.0, period=5.0, duty=0.4)
    out = []
    for k in range(150):
        s = run.state(k, 0)
        out.append(f"{nvsmi_stamp(START + k + 0.315)}, 0, {s.util:.0f}, 18234, 24564")
    return lines(out)


# Rows whose columns only --columns can name (headerless/): (file, maker, columns).


def headerless_epoch_ws() -> str:
    """A cron job's space-separated lines every 5 minutes, one per GPU: float epoch seconds,
    GPU id, fan %, temperature, power (W), memory used (MiB), utilisation (%).  Fan,
    temperature, power, memory and utilisation all lie within 0-100: only names tell them
    apart.  Four GPUs, three training flat out, one idle."""
    rng = random.Random(362)
    out = []
    for k in range(60):
        t = START + 300 * k + rng.uniform(0.5, 0.9)
        for g in range(4):
            busy = g != 3
            fan = 30 + (40 if busy else 0) + rng.randint(0, 3)
            temp = 46 + (30 if busy else 0) + rng.randint(0, 4)
            power = rng.uniform(230, 250) if busy else rng.uniform(45, 48)
            mem = 10771.0 if busy else 0.0
            util = float(rng.randint(96, 100)) if busy else 0.0
            out.append(
                f"{t + g * 3e-5:.7f} {g} {fan:.1f} {temp:.1f} {power:.1f} {mem:.1f} {util:.1f}"
            )
    return lines(out)


def headerless_name_total_free_used() -> str:
    """``nvidia-smi --query-gpu=timestamp,name,utilization.gpu,utilization.memory,
    memory.total,memory.free,memory.used --format=csv,noheader,nounits -l 2`` of an
    idle GPU: three columns of small constant numbers (0, 0, 2): which is the
    utilisation, only names say."""
    out = []
    for k in range(90):
        out.append(
            f"{nvsmi_stamp(START + 2 * k + 0.433)}, NVIDIA GeForce RTX 3080 Ti, 0, 0, 12288, 12043, 2"
        )
    return lines(out)


HEADERLESS = {
    "epoch_ws_5min.txt": (
        headerless_epoch_ws,
        "timestamp,index,fan.speed,temperature.gpu,power.draw,memory.used,utilization.gpu",
    ),
    "name_total_free_used.csv": (
        headerless_name_total_free_used,
        "timestamp,name,utilization.gpu,utilization.memory,memory.total,memory.free,memory.used",
    ),
}

FILES = {
    "nvsmi_8gpu_same_stamp.csv": nvsmi_8gpu_same_stamp,
    "nvsmi_2gpu_ms_apart.csv": nvsmi_2gpu_ms_apart,
    "nvsmi_4gpu_straggler_crlf.csv": nvsmi_4gpu_straggler_crlf,
    "nvsmi_header_every_row.csv": nvsmi_header_every_row,
    "home_epoch_spaces.csv": home_epoch_spaces,
    "home_quoted_newline.csv": home_quoted_newline,
    "tsv_time_s_aggregates.tsv": tsv_time_s_aggregates,
    "gpustat_loop.txt": gpustat_loop,
    "gpustat_full_color.txt": gpustat_full_color,
    "gpustat_json_loop.json": gpustat_json_loop,
    "wandb-events.jsonl": wandb_events,
    "wandb_export.csv": wandb_export_csv,
    "dmon_all_columns.txt": dmon_all_columns,
    "dmon_time_only_midnight.txt": dmon_time_only_midnight,
    "dcgmi_dmon.txt": dcgmi_dmon,
    "prom_dcgm.json": prom_dcgm,
    "prom_nvidia_gpu_exporter.json": prom_nvidia_gpu_exporter,
    "prom_gpumon.json": prom_gpumon,
    "wide_per_gpu.csv": wide_per_gpu,
    "semicolon_decimal_comma.csv": semicolon_decimal_comma,
    "concat_runs_cut_start.csv": concat_runs_cut_start,
    "gnu_iso_ns.csv": gnu_iso_ns,
    "whole_second_fast.csv": whole_second_fast,
    "ms_epoch_gpu_id.csv": ms_epoch_gpu_id,
    "three_gpu_date_time.csv": three_gpu_date_time,
    "short_v100.csv": short_v100,
    "epoch_gap_27s.csv": epoch_gap_27s,
    "table_then_csv.csv": table_then_csv,
    "nvsmi_2gpu_lms100_late_rows.csv": nvsmi_2gpu_lms100_late_rows,
    "grep_mib_v100_starved.txt": grep_mib_v100_starved,
    "dmon_8_samples_one_dip.txt": dmon_8_samples_one_dip,
    "nvsmi_2gpu_slow_start.csv": nvsmi_2gpu_slow_start,
    "keyvalue_blocks.log": keyvalue_blocks,
    "keyvalue_inline.log": keyvalue_inline,
    "date_rows_separator.log": date_rows_separator,
    "trainer_13_columns.csv": trainer_13_columns,
    "json_per_gpu_events.jsonl": json_per_gpu_events,
    "json_nvline_epoch.jsonl": json_nvline_epoch,
    "json_devices_list.jsonl": json_devices_list,
    "nvsmi_q_loop_535.txt": nvsmi_q_loop_535,
    "nvsmi_q_full_minor_swap.txt": nvsmi_q_full_minor_swap,
    "dcgm_api_power_only.csv": dcgm_api_power_only,
    "long_tidy_dcgm_names.csv": long_tidy_dcgm_names,
    "oneline_bracket_alerts.log": oneline_bracket_alerts,
    "oneline_logging_pipes.log": oneline_logging_pipes,
    "keyvalue_pytorch_lines.log": keyvalue_pytorch_lines,
    "noheader_stamp_util_varies.csv": noheader_stamp_util_varies,
}


if __name__ == "__main__":
    HERE.mkdir(exist_ok=True)
    for name, make in FILES.items():
        (HERE / name).write_bytes(make().encode("utf-8"))
        print(name)
    HEADERLESS_DIR.mkdir(exist_ok=True)
    for name, (make, _columns) in HEADERLESS.items():
        (HEADERLESS_DIR / name).write_bytes(make().encode("utf-8"))
        print("headerless/" + name)
