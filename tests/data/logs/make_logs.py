"""Regenerate the sample logs in this folder: ``python tests/data/logs/make_logs.py``.

Each file mimics, byte for byte in layout, what the nvidia-smi command named in
``docs/analyze.md`` prints (column widths, units, ``[N/A]``, repeated headers); the values
are a seeded simulation of a starved run (busy bursts, idle gaps) or a healthy one.
UTF-16 and CRLF variants are made by the tests from these UTF-8 files.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

HERE = Path(__file__).parent
START = 1714564800  # 2024-05-01 12:00:00 UTC
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def stamp(t: float) -> str:
    """nvidia-smi CSV timestamp: 2024/05/01 12:00:00.123."""
    whole = int(t)
    ms = round((t - whole) * 1000)
    return time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(whole)) + f".{ms:03d}"


def table_date(t: float) -> str:
    """The date line above an nvidia-smi table: Wed May  1 12:00:00 2024."""
    g = time.gmtime(int(t))
    return f"{DAYS[g.tm_wday]} {MONTHS[g.tm_mon - 1]} {g.tm_mday:2d} " + time.strftime(
        "%H:%M:%S %Y", g
    )


def util_at(rng: random.Random, t: float, pattern: str, gpu: int = 0) -> int:
    """Utilisation of a starved (2 s busy / 2 s idle) or healthy GPU at time t."""
    if pattern == "healthy":
        return rng.randint(93, 100)
    phase = (t + 0.05 * gpu) % 4.0
    return rng.randint(90, 100) if phase < 2.0 else rng.randint(0, 2)


def power_for(rng: random.Random, util: int) -> float:
    return 70.0 + 3.1 * util + rng.uniform(-8, 8)


def nvsmi_units_index() -> str:
    """nvidia-smi --query-gpu=timestamp,index,name,pci.bus_id,utilization.gpu,
    utilization.memory,memory.used,memory.total,power.draw,enforced.power.limit,
    temperature.gpu,clocks.sm --format=csv -l 1 (restarted once: header repeated)."""
    rng = random.Random(1)
    hdr = (
        "timestamp, index, name, pci.bus_id, utilization.gpu [%], utilization.memory [%], "
        "memory.used [MiB], memory.total [MiB], power.draw [W], enforced.power.limit [W], "
        "temperature.gpu, clocks.current.sm [MHz]"
    )
    out = [hdr]
    for k in range(120):
        if k == 60:
            out.append(hdr)
        t = START + k + 0.101 + rng.randint(0, 9) / 1000
        for g in range(2):
            u = util_at(rng, k, "starved", g)
            out.append(
                f"{stamp(t)}, {g}, NVIDIA A100-SXM4-80GB, 00000000:{0x17 + 0x14 * g:02X}:00.0, "
                f"{u} %, {u // 3} %, {49140 + 12 * g} MiB, 81920 MiB, {power_for(rng, u):.2f} W, "
                f"400.00 W, {34 + g + k % 3}, {1410 if u > 50 else 1095} MHz"
            )
    return "\n".join(out) + "\n"


def nvsmi_nounits_lms() -> str:
    """nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw
    --format=csv,nounits -lms 100 (one GPU; power.draw [N/A] now and then)."""
    rng = random.Random(2)
    out = ["timestamp, utilization.gpu [%], memory.used [MiB], power.draw [W]"]
    for k in range(600):
        t = START + k * 0.1 + 0.003 + rng.randint(0, 4) / 1000
        u = util_at(rng, k * 0.1, "starved")
        pw = "[N/A]" if k % 97 == 13 else f"{power_for(rng, u):.2f}"
        out.append(f"{stamp(t)}, {u}, 20311, {pw}")
    return "\n".join(out) + "\n"


def nvsmi_noindex_4gpu() -> str:
    """nvidia-smi --query-gpu=timestamp,name,utilization.gpu,memory.used,memory.total,
    power.draw --format=csv -l 1 on 4 GPUs: no index column, GPUs are consecutive rows."""
    rng = random.Random(3)
    out = [
        "timestamp, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB], "
        "power.draw [W]"
    ]
    for k in range(90):
        t = START + k + 0.512 + rng.randint(0, 5) / 1000
        for g in range(4):
            u = util_at(rng, k, "healthy", g)
            out.append(
                f"{stamp(t + 0.001 * g)}, NVIDIA H100 80GB HBM3, {u} %, "
                f"{71234 + 40 * g} MiB, 81559 MiB, {power_for(rng, u) + 250:.2f} W"
            )
    return "\n".join(out) + "\n"


def nvsmi_noheader() -> str:
    """nvidia-smi --query-gpu=timestamp,index,utilization.gpu,utilization.memory,
    memory.used,memory.total,power.draw --format=csv,noheader -l 1 (2 GPUs)."""
    rng = random.Random(4)
    out = []
    for k in range(90):
        t = START + k + 0.250 + rng.randint(0, 9) / 1000
        for g in range(2):
            u = util_at(rng, k, "starved", g)
            out.append(
                f"{stamp(t)}, {g}, {u} %, {u // 4} %, {30111 + g} MiB, 40960 MiB, "
                f"{power_for(rng, u) / 1.6:.2f} W"
            )
    return "\n".join(out) + "\n"


def nvsmi_na_uuid() -> str:
    """nvidia-smi --query-gpu=timestamp,uuid,name,utilization.gpu,memory.used,power.draw,
    temperature.gpu --format=csv -l 2 on a GeForce: power reads [N/A], some [Not Supported]."""
    rng = random.Random(5)
    out = [
        "timestamp, uuid, name, utilization.gpu [%], memory.used [MiB], power.draw [W], "
        "temperature.gpu"
    ]
    uuid = "GPU-5a0b1c2d-3e4f-5a6b-7c8d-9e0f1a2b3c4d"
    for k in range(60):
        t = START + 2 * k + 0.7
        u = util_at(rng, 2 * k, "healthy")
        mem = "[Not Supported]" if k == 7 else f"{5120 + k} MiB"
        out.append(
            f"{stamp(t)}, {uuid}, NVIDIA GeForce RTX 3090, {u} %, {mem}, [N/A], {61 + k % 4}"
        )
    return "\n".join(out) + "\n"


DMON_HDR_OLD = (
    "# gpu   pwr gtemp mtemp    sm   mem   enc   dec  mclk  pclk",
    "# Idx     W     C     C     %     %     %     %   MHz   MHz",
)


def dmon_default() -> str:
    """nvidia-smi dmon (driver 470: default -s puc, -d 1), 2 GPUs, header every 20 rows."""
    rng = random.Random(6)
    out = []
    rows = 0
    for k in range(120):
        for g in range(2):
            if rows % 20 == 0:
                out.extend(DMON_HDR_OLD)
            rows += 1
            u = util_at(rng, k, "starved", g)
            pw = int(power_for(rng, u) / 1.6)
            out.append(
                f"{g:>5} {pw:>5} {40 + g:>5} {'-':>5} {u:>5} {u // 3:>5} {0:>5} {0:>5}"
                f" {1215:>5} {1410 if u > 50 else 1095:>5}"
            )
    return "\n".join(out) + "\n"


def dmon_dt() -> str:
    """nvidia-smi dmon -s pu -o DT (driver 535: jpg and ofa columns), 1 GPU."""
    rng = random.Random(7)
    names = (
        "#Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec"
        "    jpg    ofa "
    )
    units = (
        "#YYYYMMDD   HH:MM:SS    Idx      W      C      C      %      %      %      %"
        "      %      % "
    )
    out = []
    for k in range(120):
        if k % 20 == 0:
            out.extend((names, units))
        t = START + k
        u = util_at(rng, k, "healthy")
        d = time.strftime("%Y%m%d", time.gmtime(t))
        hms = time.strftime("%H:%M:%S", time.gmtime(t))
        out.append(
            f" {d}   {hms}    {0:>3} {int(power_for(rng, u)):>6} {37:>6} {'-':>6} "
            f"{u:>6} {u // 2:>6} {0:>6} {0:>6} {0:>6} {0:>6} "
        )
    return "\n".join(out) + "\n"


NEW_TOP = """\
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |
|                                         |                      |               MIG M. |
|=========================================+======================+======================|"""
NEW_SEP = "+" + "-" * 41 + "+" + "-" * 22 + "+" + "-" * 22 + "+"
NEW_PROCS = """\
+---------------------------------------------------------------------------------------+
| Processes:                                                                            |
|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |
|        ID   ID                                                             Usage      |
|=======================================================================================|
|    0   N/A  N/A    412873      C   python                                    49128MiB |
|    1   N/A  N/A    412874      C   python                                    49140MiB |
+---------------------------------------------------------------------------------------+"""


def table_new() -> str:
    """nvidia-smi -l 1 (driver 535 layout), 2 A100s, 60 tables."""
    rng = random.Random(8)
    out = []
    for k in range(60):
        out.append(table_date(START + k) + "       ")
        out.append(NEW_TOP)
        for g in range(2):
            u = util_at(rng, k, "starved", g)
            pw = f"{int(power_for(rng, u))}W / 400W"
            bus = f"00000000:{0x17 + 0x14 * g:02X}:00.0"
            out.append(
                f"| {g:>3}  {'NVIDIA A100-SXM4-80GB':<21}{'On':>12}  | {bus} Off |{'0':>21} |"
            )
            mem = f"{49152 + 12 * g}MiB / 81920MiB"
            out.append(f"| N/A   {34 + g}C    P0 {pw:>23} | {mem:>20} |{f'{u}%':>8}      Default |")
            out.append(f"|{'':41}|{'':22}|{'Disabled':>21} |")
            out.append(NEW_SEP)
        out.append(" " * 89)
        out.append(NEW_PROCS)
    return "\n".join(out) + "\n"


OLD_TOP = """\
+-----------------------------------------------------------------------------+
| NVIDIA-SMI 470.182.03   Driver Version: 470.182.03   CUDA Version: 11.4     |
|-------------------------------+----------------------+----------------------+
| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |
|                               |                      |               MIG M. |
|===============================+======================+======================|"""
OLD_SEP = "+-------------------------------+----------------------+----------------------+"
OLD_PROCS = """\
+-----------------------------------------------------------------------------+
| Processes:                                                                  |
|  GPU   GI   CI        PID   Type   Process name                  GPU Memory |
|        ID   ID                                                   Usage      |
|=============================================================================|
|    0   N/A  N/A     98231      C   python                          15012MiB |
+-----------------------------------------------------------------------------+"""


def table_old() -> str:
    """nvidia-smi -l 2 (driver 470 layout), one V100, 45 tables."""
    rng = random.Random(9)
    out = []
    for k in range(45):
        t = START + 2 * k
        out.append(table_date(t) + "       ")
        out.append(OLD_TOP)
        u = util_at(rng, 2 * k, "healthy")
        pw = min(int(power_for(rng, u) * 0.8), 299)
        out.append("|   0  Tesla V100-SXM2...  On   | 00000000:06:00.0 Off |" + " " * 20 + "0 |")
        out.append(
            f"| N/A   {41 + k % 3}C    P0 {pw:>5}W / 300W |  15015MiB / 16160MiB |"
            f"{f'{u}%':>8}      Default |"
        )
        out.append("|" + " " * 31 + "|" + " " * 22 + "|" + " " * 18 + "N/A |")
        out.append(OLD_SEP)
        out.append(" " * 79)
        out.append(OLD_PROCS)
    return "\n".join(out) + "\n"


def table_grep() -> str:
    """while true; do nvidia-smi | grep MiB | grep Default; sleep 1; done (2 GPUs)."""
    rng = random.Random(10)
    out = []
    for k in range(90):
        for g in range(2):
            u = util_at(rng, k, "starved", g)
            pw = f"{int(power_for(rng, u))}W / 400W"
            mem = f"{30000 + 2000 * g}MiB / 81920MiB"
            out.append(f"| N/A   {34 + g}C    P0 {pw:>23} | {mem:>20} |{f'{u}%':>8}      Default |")
    return "\n".join(out) + "\n"


def simple_csv() -> str:
    """A home-made logger: time (epoch s), gpu, util, mem_used_mb, power_w; 2 GPUs."""
    rng = random.Random(11)
    out = ["time,gpu,util,mem_used_mb,power_w"]
    for k in range(120):
        for g in range(2):
            u = util_at(rng, k, "starved", g)
            out.append(f"{START + k + 0.5:.3f},{g},{u},{20000 + g},{power_for(rng, u):.1f}")
    return "\n".join(out) + "\n"


def simple_iso() -> str:
    """A home-made logger: ISO 8601 time; utilisation as a 0-1 fraction; semicolons."""
    rng = random.Random(12)
    out = ["timestamp;gpu_utilization"]
    for k in range(240):
        t = START + 0.5 * k
        u = util_at(rng, 0.5 * k, "healthy") / 100
        iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(t))) + f".{int(t % 1 * 1000):03d}Z"
        out.append(f"{iso};{u:.2f}")
    return "\n".join(out) + "\n"


def malformed_mid() -> str:
    """An nvidia-smi CSV whose line 43 was mangled (two rows run together)."""
    lines = nvsmi_units_index().splitlines()
    lines[42] = lines[42][:60] + lines[43]
    return "\n".join(lines) + "\n"


def cut_short() -> str:
    """nvidia-smi killed mid-write: the last line has no newline and stops mid-cell."""
    text = nvsmi_units_index()
    return text[: text.rindex("\n", 0, len(text) - 1) + 40]


FILES = {
    "nvsmi_units_index.csv": nvsmi_units_index,
    "nvsmi_nounits_lms100.csv": nvsmi_nounits_lms,
    "nvsmi_noindex_4gpu.csv": nvsmi_noindex_4gpu,
    "nvsmi_noheader.csv": nvsmi_noheader,
    "nvsmi_na_uuid.csv": nvsmi_na_uuid,
    "dmon_default.txt": dmon_default,
    "dmon_dt.txt": dmon_dt,
    "table_535.txt": table_new,
    "table_470.txt": table_old,
    "table_grep.txt": table_grep,
    "simple.csv": simple_csv,
    "simple_iso.csv": simple_iso,
    "bad_malformed_mid.csv": malformed_mid,
    "bad_cut_short.csv": cut_short,
    "bad_unknown.txt": lambda: "hello\nthis is not a GPU log\n",
}


if __name__ == "__main__":
    for name, make in FILES.items():
        (HERE / name).write_text(make(), encoding="utf-8", newline="\n")
        print(name)
