"""The whole /metrics page of `gpumon serve`, byte for byte, against a golden file.

client_python tests its exposition byte for byte; so does this, for gpumon's: the real
daemon (default configuration) on the fake NVML library with fixed readings, one busy GPU
held by a Slurm job, one idle GPU with GPM and without a fan, NVLink or ECC, one GPU lost
from the start, and an XID error.  Only what genuinely varies from run to run is
normalised: times and durations, counts of ticks and seconds, energy (it accumulates with
time), the host's CPU, the daemon's own process figures, and the build's version, commit
and Python.

``GPUMON_UPDATE_GOLDEN=1`` rewrites the file (then review the diff: it is the change to
what every Prometheus scraping gpumon sees).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_serve_daemon
from fakenvml import FakeGPU, Pattern, Process, Scenario, XidError
from test_serve_daemon import Daemon, gpu_state, one, series, start_daemon

pytestmark = pytest.mark.slow
daemons = test_serve_daemon.daemons  # the fixture: daemons a test started, stopped after it

GOLDEN = Path(__file__).resolve().parent / "data" / "serve" / "metrics-default.prom"
NODE = "gpu-node-golden"

# Families whose values vary from run to run: every series of them keeps its name and
# labels, its value becomes "<v>".
VARIABLE_VALUES = (
    "gpumon_gpu_energy_joules_total",
    "gpumon_gpu_state_seconds_total",
    "gpumon_host_cpu_ratio",
    "gpumon_host_iowait_ratio",
    "gpumon_node_state_seconds_total",
    "gpumon_last_sample_timestamp_seconds",
    "gpumon_sample_duration_seconds",
    "gpumon_samples_total",
    "gpumon_scrape_duration_seconds",
    "gpumon_scrape_group_duration_seconds",
    "process_",
)
# Families whose very series vary: a job's time per state and cause (how long it was
# judged before it was found healthy, say, depends on the machine's load): their series
# become one line, "NAME <series>".
VARIABLE_SERIES = ("gpumon_job_gpu_seconds_total", "gpumon_job_lost_gpu_seconds_total")
# Labels whose values are the build's, not behaviour: the version, its commit, the Python.
VARIABLE_LABELS = ("version", "revision", "python_version")


def normalise(text: str) -> str:
    """The exposition with the run's variable values (and only those) replaced."""
    out: list[str] = []
    for line in text.splitlines():
        if not line.startswith("#"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            if name in VARIABLE_SERIES:
                if out[-1] != f"{name} <series>":
                    out.append(f"{name} <series>")
                continue
            if name.startswith(VARIABLE_VALUES):
                line = line[: line.rindex(" ")] + " <v>"
            if name == "gpumon_build_info":
                for label in VARIABLE_LABELS:
                    line = re.sub(rf'(\b{label}=)"[^"]*"', r'\1"<v>"', line)
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.fixture
def slurm_job() -> Iterator[subprocess.Popen[bytes]]:
    """A real process of Slurm job 4242 whose user the job's environment names."""
    env = dict(os.environ, SLURM_JOB_ID="4242", SLURM_JOB_USER="alice")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env)
    yield p
    p.kill()
    p.wait()


def scenario(job_pid: int) -> Scenario:
    """Fixed readings: nothing in it changes with time but energy (normalised)."""
    busy = FakeGPU(
        pattern=Pattern.steady(100),
        power_busy_w=610.0,
        temperature_c=63,
        memory_temperature_c=71,
        clock_reasons=0x4,  # the software power cap
        ecc_corrected=3,
        ecc_uncorrected_aggregate=1,
        pcie_replays=2,
        processes=[Process(pid=job_pid, used_mem=3 << 30)],
    )
    idle = FakeGPU(
        pattern=Pattern.off(),
        gpm_supported=True,  # GPM over an idle GPU reads exactly 0
        power_limit_w=400.0,
        pstate_idle=8,
        nvlink_links=0,
        unsupported={"fan", "ecc"},
    )
    return Scenario(gpus=[busy, idle, FakeGPU(lost=True)])


def settled(m: dict[str, float]) -> bool:
    """Every GPU judged, the XID counted, the job's state known: nothing left to change."""
    return (
        gpu_state(m, 0) == "healthy"
        and gpu_state(m, 1) == "idle"
        and bool(series(m, "gpumon_gpu_xid_errors_total", gpu="0", xid="48"))
        and one(m, "gpumon_gpu_xid_errors_total", gpu="0", xid="48") == 1
        and bool(series(m, "gpumon_job_state", hpc_job="4242", state="healthy"))
        and one(m, "gpumon_job_state", hpc_job="4242", state="healthy") == 1
        and not series(m, "gpumon_gpu_reason", gpu="0")
        and bool(series(m, "gpumon_gpu_memory_clock_hertz", gpu="1"))
        # GPM's pipes: read with the hardware (every 10 s) once GPM has an interval
        and bool(series(m, "gpumon_gpu_dram_active_ratio", gpu="1"))
        and bool(series(m, "gpumon_scrape_duration_seconds"))
    )


def golden_scrape(fake_nvml, tmp_path: Path, daemons: list[Daemon], job_pid: int) -> str:
    scn = scenario(job_pid)
    fake_nvml.set(scn)
    env = dict(fake_nvml.env, NODE_NAME=NODE)
    d = start_daemon(env, tmp_path)
    daemons.append(d)
    # The XID once the daemon watches the GPU's events (one scripted before is not seen).
    d.wait_for(lambda m: bool(series(m, "gpumon_gpu_xid_errors_total", gpu="0")), 20, "watching")
    fake_nvml.set(scn.with_gpu(0, xid_errors=[XidError(48)]))
    d.wait_for(settled, 40, "settled")
    return d.text()


def test_the_default_exposition_is_the_golden_one(fake_nvml, tmp_path, daemons, slurm_job) -> None:
    got = normalise(golden_scrape(fake_nvml, tmp_path, daemons, slurm_job.pid))
    if os.environ.get("GPUMON_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(got)
        pytest.skip(f"rewrote {GOLDEN}")
    want = GOLDEN.read_text()
    assert got == want, "the exposition changed; see the diff (GPUMON_UPDATE_GOLDEN=1 to accept)"


def test_normalise_keeps_everything_but_the_variable_values() -> None:
    text = (
        "# HELP gpumon_samples_total Ticks completed.\n"
        "gpumon_samples_total 41.0\n"
        'gpumon_gpu_power_watts{gpu="0",uuid="u"} 610.0\n'
        'gpumon_build_info{driver_version="550",python_version="3.12.1",version="1.2"} 1.0\n'
        'gpumon_gpu_state_seconds_total{gpu="0",state="idle"} 12.4\n'
    )
    assert normalise(text) == (
        "# HELP gpumon_samples_total Ticks completed.\n"
        "gpumon_samples_total <v>\n"
        'gpumon_gpu_power_watts{gpu="0",uuid="u"} 610.0\n'
        'gpumon_build_info{driver_version="550",python_version="<v>",version="<v>"} 1.0\n'
        'gpumon_gpu_state_seconds_total{gpu="0",state="idle"} <v>\n'
    )
