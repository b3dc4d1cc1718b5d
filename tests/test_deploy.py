"""The deployment files in deploy/: each checked by the tool that will consume it.

systemd-analyze verifies the unit, promtool checks and unit-tests the rules and the scrape
config, logrotate dry-runs its snippet; the dashboard and the rules may only query metric
names the exporter emits (or rules record).  A test skips only when its tool is absent
(CI installs the `systemd`, `prometheus` and `logrotate` packages), and says which.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpumon.faces.serve.collector import METRIC_NAMES
from gpumon.faces.serve.collectors.hardware import HARDWARE_SERIES
from gpumon.faces.serve.config import DEFAULT_PORT, ServeConfig, parse

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
UNIT = DEPLOY / "systemd" / "gpumon.service"
RULES = DEPLOY / "prometheus" / "gpumon-rules.yml"
DCGM_RULES = DEPLOY / "prometheus" / "gpumon-dcgm-rules.yml"
RULE_FILES = sorted((DEPLOY / "prometheus").glob("gpumon-*rules.yml"))
RULE_TESTS = DEPLOY / "prometheus" / "tests"
SCRAPE = DEPLOY / "prometheus" / "prometheus-scrape.yml"
DASHBOARD = DEPLOY / "grafana" / "gpumon-dashboard.json"
K8S_SCRAPE = DEPLOY / "kubernetes" / "prometheus-scrape-kubernetes.yml"
EXAMPLE = DEPLOY / "gpumon.toml"
LOGROTATE = DEPLOY / "logrotate" / "gpumon"


def load_yaml_all(path: Path) -> list[object]:
    """PyYAML is not a gpumon dependency: the tests that must parse YAML skip without it."""
    yaml = pytest.importorskip("yaml", reason="PyYAML not installed (pip install pyyaml)")
    return list(yaml.safe_load_all(path.read_text()))


def tool(name: str, package: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        pytest.skip(f"{name} not installed (apt-get install {package})")
    return exe


# --------------------------------------------------------------------------- systemd
def unit_settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            k, v = line.split("=", 1)
            out.setdefault(k.strip(), []).append(v.strip())
    return out


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = tool("systemd-analyze", "systemd")
    # verify checks that ExecStart's binary exists: point it at this machine's gpumon.
    exe = shutil.which("gpumon") or sys.executable
    text = UNIT.read_text().replace("/usr/local/bin/gpumon", exe)
    unit = tmp_path / "gpumon.service"
    unit.write_text(text)
    res = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    ours = [ln for ln in (res.stdout + res.stderr).splitlines() if "gpumon.service" in ln]
    assert res.returncode == 0 and not ours, res.stdout + res.stderr


def test_systemd_unit_is_hardened() -> None:
    s = unit_settings()
    assert s["NoNewPrivileges"] == ["yes"]
    assert s["ProtectSystem"] == ["strict"]
    assert s["Restart"] == ["on-failure"]
    assert s["DevicePolicy"] == ["closed"]
    assert any("nvidia" in d for d in s["DeviceAllow"])
    assert set(s["ReadWritePaths"][0].split()) == {"/var/log/gpumon", "/var/lib/gpumon"}
    assert "--config /etc/gpumon/gpumon.toml" in s["ExecStart"][0]
    # Config errors (2) and a missing driver (3) are not retried forever.
    assert set(s["RestartPreventExitStatus"][0].split()) == {"2", "3"}
    caps = set(s["CapabilityBoundingSet"][0].split())
    assert caps <= {"CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "CAP_NET_BIND_SERVICE"}


def test_logrotate_snippet_dry_runs(tmp_path: Path) -> None:
    logrotate = tool("logrotate", "logrotate")
    logdir = tmp_path / "log"
    logdir.mkdir()
    (logdir / "gpumon.jsonl").write_text('{"event":"start"}\n')
    conf = tmp_path / "gpumon.logrotate"
    conf.write_text(LOGROTATE.read_text().replace("/var/log/gpumon", str(logdir)))
    conf.chmod(0o644)
    res = subprocess.run(
        [logrotate, "-d", "-s", str(tmp_path / "state"), str(conf)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "error" not in (res.stdout + res.stderr).lower(), res.stdout + res.stderr
    assert "--signal=HUP" in LOGROTATE.read_text()


# --------------------------------------------------------------------------- config
def test_example_config_parses_to_the_documented_defaults() -> None:
    cfg = parse(EXAMPLE.read_text(), str(EXAMPLE))
    assert cfg == ServeConfig(log_path="/var/log/gpumon/gpumon.jsonl")
    assert cfg.port == DEFAULT_PORT and cfg.address == "127.0.0.1"


# --------------------------------------------------------------------------- Prometheus
def test_rules_pass_promtool_check() -> None:
    promtool = tool("promtool", "prometheus")
    assert {RULES, DCGM_RULES} <= set(RULE_FILES)
    res = subprocess.run(
        [promtool, "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_rules_pass_their_unit_tests() -> None:
    promtool = tool("promtool", "prometheus")
    tests = sorted(RULE_TESTS.glob("*.yml"))
    assert tests
    res = subprocess.run(
        [promtool, "test", "rules", *map(str, tests)],
        capture_output=True,
        text=True,
        cwd=RULE_TESTS,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    # Every alert has at least one test that expects it to fire.
    alerts = re.findall(r"^\s*- alert:\s*(\S+)", RULES.read_text(), re.M)
    assert len(alerts) >= 5
    tested = "\n".join(p.read_text() for p in tests)
    for a in alerts:
        assert re.search(rf"alertname: {a}\n\s+exp_alerts:\n\s+- ", tested), f"{a} untested"
    # Every rules file has its tests.
    for rules in RULE_FILES:
        assert f"../{rules.name}" in tested, f"{rules.name} has no promtool tests"


def test_the_hardware_alerts_people_page_on_are_there() -> None:
    """XID errors, uncorrectable ECC, sustained thermal or power throttling, a GPU off the
    bus: each an alert on gpumon's own series."""
    (rules,) = load_yaml_all(RULES)
    alerts = {
        r["alert"]: r["expr"]
        for g in rules["groups"]  # type: ignore[index]
        for r in g["rules"]
        if "alert" in r
    }
    needed = {
        "GpumonGpuXidCritical": "gpumon_gpu_xid_errors_total",
        "GpumonGpuXidError": "gpumon_gpu_xid_errors_total",
        "GpumonGpuEccUncorrectable": "gpumon_gpu_ecc_errors_total",
        "GpumonGpuThermalThrottling": "gpumon_gpu_clock_event_reason",
        "GpumonGpuPowerBrake": "gpumon_gpu_clock_event_reason",
        "GpumonGpuLost": "gpumon_gpu_lost",
    }
    for alert, series in needed.items():
        assert series in alerts[alert], alert
    for xid in ("48", "63", "64", "74", "79", "94", "95"):  # the codes people page on
        assert xid in alerts["GpumonGpuXidCritical"]


def test_scrape_config_passes_promtool(tmp_path: Path) -> None:
    promtool = tool("promtool", "prometheus")
    # promtool stats the TLS files and rule files: give it stand-ins next to a copy.
    text = SCRAPE.read_text().replace("/etc/prometheus/tls/", f"{tmp_path}/")
    (tmp_path / "targets").mkdir()
    text = text.replace("/etc/prometheus/targets/", f"{tmp_path}/targets/")
    for name in ("gpumon-ca.crt", "prometheus.crt", "prometheus.key"):
        (tmp_path / name).write_text("")
    shutil.copy(RULES, tmp_path / RULES.name)
    conf = tmp_path / "prometheus.yml"
    conf.write_text(text)
    res = subprocess.run([promtool, "check", "config", str(conf)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def recorded_names(*files: Path) -> set[str]:
    return {
        name
        for f in files or RULE_FILES
        for name in re.findall(r"^\s*- record:\s*(\S+)", f.read_text(), re.M)
    }


def exported_series_names() -> set[str]:
    """What a query may name: families plus their histogram series."""
    names = set(METRIC_NAMES)
    for n in METRIC_NAMES:
        if n in ("gpumon_gpu_idle_gap_seconds", "gpumon_gpu_busy_burst_seconds"):
            names |= {n + "_bucket", n + "_count", n + "_sum"}
    return names


def metric_names_in(expr: str) -> set[str]:
    # Drop label matchers' values and strings first, then take identifiers.
    expr = re.sub(r'"[^"]*"', '""', expr)
    return set(re.findall(r"\b[a-z_]*:?gpumon_[a-z0-9_:]+", expr))


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_rules_use_only_exported_metrics(path: Path) -> None:
    known = exported_series_names() | recorded_names()
    (rules,) = load_yaml_all(path)
    assert recorded_names(path) == {
        r["record"]
        for g in rules["groups"]  # type: ignore[index]
        for r in g["rules"]
        if "record" in r
    }
    for g in rules["groups"]:  # type: ignore[index]
        for r in g["rules"]:
            unknown = metric_names_in(r["expr"]) - known
            assert not unknown, f"{r.get('record') or r.get('alert')}: {unknown}"


# dcgm-exporter's default counters (its etc/default-counters.csv) that NVML alone can give,
# and the others its dashboards query (profiling ratios, fan, P-state, ECC, FB total).
DCGM_NAMES = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    "DCGM_FI_DEV_FAN_SPEED", "DCGM_FI_DEV_PSTATE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
)  # fmt: skip


def test_dcgm_rules_record_dcgm_exporters_names_with_its_labels() -> None:
    (rules,) = load_yaml_all(DCGM_RULES)
    records = {
        r["record"]: " ".join(r["expr"].split())
        for g in rules["groups"]  # type: ignore[index]
        for r in g["rules"]
        if "record" in r
    }
    assert set(DCGM_NAMES) <= set(records)
    for name in DCGM_NAMES:  # each joins the GPU's dcgm-exporter and workload labels
        assert records[name].endswith(
            "* on (job, instance, gpu) group_left (UUID, device, modelName, Hostname, "
            "pci_bus_id, hpc_job, pod, namespace, container) "
            "instance_gpu:gpumon_gpu_info:dcgm_labels"
        ), name


# --------------------------------------------------------------------------- Grafana
def dashboard_exprs(node: object) -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(v, str) and (k == "expr" or (k == "query" and "gpumon" in v)):
                out.append(v)
            else:
                out += dashboard_exprs(v)
    elif isinstance(node, list):
        for v in node:
            out += dashboard_exprs(v)
    return out


def test_dashboard_is_valid_and_queries_only_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"]
    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    exprs = dashboard_exprs(dash)
    assert len(exprs) >= 15
    known = exported_series_names() | recorded_names()
    used: set[str] = set()
    for e in exprs:
        names = metric_names_in(e)
        assert names, f"no gpumon metric in {e!r}"
        assert names <= known, f"{names - known} in {e!r}"
        used |= names
    # The dashboard shows what the issue asks for: states, gaps, lost GPU-hours, jobs.
    for needed in (
        "gpumon_gpu_state",
        "gpumon_job_state",
        "gpumon_gpu_idle_gap_seconds_bucket",
        "gpumon_lost_gpu_seconds_total",
        "hpc_job:gpumon_gpu_waiting:ratio_rate5m",
        # The fleet row: GPU time lost per job, user and cause.
        "job_user_cause:gpumon_job_lost_gpu_seconds:increase5m",
        "job_user_cause:gpumon_job_gpu_seconds:increase5m",
        "user_cause:gpumon_job_lost_gpu_seconds:increase5m",
    ):
        assert needed in used, needed
    # ...and the hardware series.
    hardware = [n + ("_total" if counter else "") for n, _, counter, _ in HARDWARE_SERIES]
    for name in (
        *hardware,
        "gpumon_gpu_clock_event_reason",
        "gpumon_gpu_ecc_errors_total",
        "gpumon_gpu_remapped_rows_total",
        "gpumon_gpu_xid_errors_total",
    ):
        assert name in used, name
    for p in panels:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]


# --------------------------------------------------------------------------- Kubernetes
# The kustomizations are rendered and validated in test_kubernetes.py.
def test_plain_prometheus_keeps_the_training_pods_labels() -> None:
    scrape = load_yaml_all(K8S_SCRAPE)[0]["scrape_configs"][0]  # type: ignore[index]
    assert scrape["honor_labels"] is True
