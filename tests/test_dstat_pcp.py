"""deploy/pcp: the pcp-dstat plugin, the OpenMetrics URL source and the node-summary script
agree with each other and with the metric names `gpumon serve` really exports."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpumon.faces.serve.collector import METRIC_NAMES

PCP = Path(__file__).resolve().parent.parent / "deploy" / "pcp"
SCRIPT = PCP / "gpumon_node.py"

# What gpumon serve prints for two GPUs (GPU 1 starved) and a lost third one.
EXPOSITION = """\
# HELP gpumon_gpu_utilization_ratio Share of the driver's last sample period in which a kernel ran.
# TYPE gpumon_gpu_utilization_ratio gauge
gpumon_gpu_utilization_ratio{gpu="0",uuid="GPU-a"} 0.97
gpumon_gpu_utilization_ratio{gpu="1",uuid="GPU-b"} 0.3
gpumon_gpu_memory_used_bytes{gpu="0",uuid="GPU-a"} 2.0e+10
gpumon_gpu_memory_used_bytes{gpu="1",uuid="GPU-b"} 6.0e+10
gpumon_gpu_memory_total_bytes{gpu="0",uuid="GPU-a"} 8.0e+10
gpumon_gpu_memory_total_bytes{gpu="1",uuid="GPU-b"} 8.0e+10
gpumon_gpu_lost{gpu="0",uuid="GPU-a"} 0.0
gpumon_gpu_lost{gpu="1",uuid="GPU-b"} 0.0
gpumon_gpu_lost{gpu="2",uuid="GPU-c"} 1.0
gpumon_gpu_state{gpu="0",state="healthy",uuid="GPU-a"} 1.0
gpumon_gpu_state{gpu="0",state="starved",uuid="GPU-a"} 0.0
gpumon_gpu_state{gpu="1",state="healthy",uuid="GPU-b"} 0.0
gpumon_gpu_state{gpu="1",state="starved",uuid="GPU-b"} 1.0
gpumon_gpu_state_seconds_total{gpu="1",state="starved",uuid="GPU-b"} 12.0
gpumon_node_state{state="starved"} 1.0
"""


def run_script(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT)],
        env={"GPUMON_METRICS_URL": url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def node_values(stdout: str) -> dict[str, float]:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("#"):
            continue
        name, value = line.split()
        out[name] = float(value)
    return out


def test_node_script_summarises_gpumon_serve(tmp_path: Path) -> None:
    families = set(re.findall(r"^(gpumon_[a-z_]+?)(?:\{| )", EXPOSITION, re.MULTILINE))
    assert families - {"gpumon_gpu_state_seconds_total"} <= set(METRIC_NAMES)
    prom = tmp_path / "metrics.txt"
    prom.write_text(EXPOSITION)
    proc = run_script(prom.as_uri())
    assert proc.returncode == 0, proc.stderr
    values = node_values(proc.stdout)
    assert values == {
        "gpus": 3,
        "gpus_lost": 1,
        "gpus_healthy": 1,
        "gpus_starved": 1,
        "gpus_sync_stall": 0,
        "gpus_idle": 0,
        "gpus_unknown": 0,
        "util_pct": pytest.approx(63.5),
        "mem_pct": pytest.approx(50.0),
    }
    for name in values:
        # pmdaopenmetrics makes any name with a total/count/sum piece a counter (rate-converted)
        assert not {"total", "count", "sum", "bytes", "seconds"} & set(name.split("_"))
        assert f"# TYPE {name} gauge" in proc.stdout


def test_node_script_prints_nothing_when_gpumon_is_down(tmp_path: Path) -> None:
    proc = run_script((tmp_path / "absent").as_uri())
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert "cannot read" in proc.stderr


def test_dstat_ini_reads_only_metrics_that_exist(tmp_path: Path) -> None:
    ini = configparser.ConfigParser(interpolation=None)  # as pcp-dstat: '%I' is literal
    ini.read(PCP / "dstat" / "gpumon")
    assert set(ini.sections()) == {"gpumon", "gpumon-gpu"}
    prom = tmp_path / "metrics.txt"
    prom.write_text(EXPOSITION)
    produced = set(node_values(run_script(prom.as_uri()).stdout))
    url = (PCP / "gpumon.url").read_text()
    assert url.splitlines()[0] == "http://localhost:9977/metrics"
    included = re.findall(r"^FILTER: INCLUDE METRIC \^(\w+)\$$", url, re.MULTILINE)
    assert included and set(included) <= set(METRIC_NAMES)
    options = {"label", "width", "precision", "printtype", "colorstep", "grouptype"}
    columns = 0
    for section in ini.sections():
        for key, expr in ini.items(section):
            if key in options or "." in key:
                continue
            columns += 1
            for name in re.findall(r"openmetrics\.gpumon_node\.(\w+)", expr):
                assert name in produced, f"[{section}] {key}: {name} is not printed by the script"
            for name in re.findall(r"openmetrics\.gpumon\.(\w+)", expr):
                assert name in included, f"[{section}] {key}: {name} is filtered out in gpumon.url"
    assert columns == 9


def test_node_script_is_executable_stdlib_python() -> None:
    assert SCRIPT.stat().st_mode & 0o111
    assert SCRIPT.read_text().startswith("#!/usr/bin/python3\n")
    imports = set(re.findall(r"^import (\w+)", SCRIPT.read_text(), re.MULTILINE))
    assert imports <= set(sys.stdlib_module_names)


def pcp_dstat() -> str:
    """pcp-dstat's path (Debian with pcp: /usr/bin/dstat links to it); skip where absent."""
    for candidate in ("/usr/lib/pcp/bin/pcp-dstat", "/usr/libexec/pcp/bin/pcp-dstat"):
        if Path(candidate).is_file():
            return candidate
    found = shutil.which("pcp-dstat")
    if found is None:
        pytest.skip("pcp-dstat not installed (pcp; it replaces Debian's dstat, so CI has none)")
    return found


def test_pcp_dstat_loads_the_ini_plugin_from_home(tmp_path: Path) -> None:
    """The real pcp-dstat finds and parses both plugins where docs/dstat.md puts them."""
    exe = pcp_dstat()
    plugins = tmp_path / ".pcp" / "dstat"
    plugins.mkdir(parents=True)
    shutil.copy(PCP / "dstat" / "gpumon", plugins / "gpumon")
    proc = subprocess.run(
        [exe, "--list"],
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = proc.stdout.split(f"{plugins} plugins:", 1)
    assert len(listed) == 2, proc.stdout
    names = {n.strip() for n in listed[1].split("\n", 2)[1].split(",")}
    assert names == {"gpumon", "gpumon-gpu"}, proc.stdout
