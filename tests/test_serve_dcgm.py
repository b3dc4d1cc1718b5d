"""A dashboard written for dcgm-exporter, on a node that runs gpumon alone.

A real Prometheus scrapes `gpumon serve` (on the fake NVML library) with
deploy/prometheus/gpumon-dcgm-rules.yml loaded, and every query of Grafana dashboard 12239
and of dcgm-exporter's other default counters (tests/data/dcgm/dashboard-queries.json)
must return series with dcgm-exporter's labels, the dashboard's variables filled as
Grafana fills them.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import test_serve_daemon
from fakenvml import FakeGPU, Scenario, XidError
from test_serve_daemon import start_daemon
from test_serve_http import Prometheus

pytestmark = pytest.mark.slow
daemons = test_serve_daemon.daemons  # the fixture: daemons a test started, stopped after it

ROOT = Path(__file__).resolve().parent.parent
DCGM_RULES = ROOT / "deploy" / "prometheus" / "gpumon-dcgm-rules.yml"
QUERIES = json.loads((ROOT / "tests" / "data" / "dcgm" / "dashboard-queries.json").read_text())
NODE = "gpu-node-7"


def label_values(prom: Prometheus, query: str) -> list[str]:
    """Grafana's label_values(metric, label), through Prometheus' series API."""
    m = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
    assert m, query
    selector, label = m.groups()
    url = f"http://127.0.0.1:{prom.port}/api/v1/series?" + urllib.parse.urlencode(
        {"match[]": selector}
    )
    with urllib.request.urlopen(url, timeout=30) as r:
        return sorted({s[label] for s in json.load(r)["data"] if label in s})


def fill(expr: str, values: dict[str, list[str]]) -> str:
    """A multi-value variable set to All, as Grafana interpolates it into a regex: each
    value's regex characters escaped with a backslash, itself escaped in the string."""
    for name, vals in values.items():
        escaped = [re.sub(r"([\\^$*+?.()|\[\]{}])", r"\\\\\1", v) for v in vals]
        expr = expr.replace(f"${name}", "(" + "|".join(escaped) + ")")
    return expr


def check_the_dashboard(prom: Prometheus, variables: dict[str, list[str]]) -> None:
    """Every variable and query of the dashboard, filled in as Grafana fills them: the
    variables take ``variables``' values, and each query returns series with the labels
    its panel shows."""
    values: dict[str, list[str]] = {}
    for var in QUERIES["variables"]:
        values[var["name"]] = label_values(prom, fill(var["query"], values))
    assert values == variables
    for q in QUERIES["queries"]:
        # A rate over a recorded series needs two of the rules' evaluations: waited for
        # (Prometheus may run late on a busy machine), and said by panel if it never comes.
        try:
            result = prom.wait_for(fill(q["expr"], values))
        except AssertionError as exc:
            raise AssertionError(f"{q['panel']}: no series for {q['expr']} ({exc})") from None
        for series in result:
            labels = series["metric"]  # type: ignore[index]
            missing = [name for name in q["labels"] if not labels.get(name)]
            assert not missing, f"{q['panel']}: {labels} lacks {missing}"


def test_a_dcgm_exporter_dashboard_works_on_gpumon(fake_nvml, tmp_path, daemons) -> None:
    h100 = FakeGPU(
        gpm_supported=True, ecc_uncorrected=1, ecc_corrected_aggregate=9, nvlink_tx_kbps=4096,
        temperature_c=63,
    )  # fmt: skip
    fake_nvml.set(Scenario(gpus=[h100, FakeGPU(gpm_supported=True, temperature_c=48)]))
    env = dict(fake_nvml.env, NODE_NAME=NODE)
    d = start_daemon(env, tmp_path)
    daemons.append(d)
    (tmp_path / "prom").mkdir()
    prom = Prometheus(
        tmp_path / "prom",
        f"  - job_name: gpumon\n    static_configs: [{{targets: ['127.0.0.1:{d.port}']}}]\n",
        rules=(DCGM_RULES,),
    )
    try:
        # An XID once Prometheus watches: dcgm-exporter's gauge shows the last code.
        prom.wait_for("DCGM_FI_DEV_XID_ERRORS")
        fake_nvml.set(fake_nvml.scenario.with_gpu(1, xid_errors=[XidError(79)]))
        prom.wait_for('DCGM_FI_DEV_XID_ERRORS{gpu="1"} == 79')
        prom.wait_for("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")  # a rate: two scrapes at least
        # GPM's DRAM and pipes: with the hardware's second read (every 10 s), once GPM
        # has an interval.
        prom.wait_for("DCGM_FI_PROF_DRAM_ACTIVE")
        check_the_dashboard(prom, {"Hostname": [NODE], "gpu": ["0", "1"]})
        # The labels and units are dcgm-exporter's.
        (temp,) = prom.query('DCGM_FI_DEV_GPU_TEMP{gpu="0"}')
        assert temp["metric"] | {"instance": "", "job": ""} == {  # type: ignore[index]
            "__name__": "DCGM_FI_DEV_GPU_TEMP",
            "instance": "",
            "job": "",
            "gpu": "0",
            "uuid": fake_nvml.scenario.gpus[0].effective_uuid(0),
            "UUID": fake_nvml.scenario.gpus[0].effective_uuid(0),
            "device": "nvidia0",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": NODE,
            "pci_bus_id": "00000000:17:00.0",
        }
        assert float(temp["value"][1]) == 63  # type: ignore[index]
        (clock,) = prom.query('DCGM_FI_DEV_SM_CLOCK{gpu="1"}')
        assert float(clock["value"][1]) == 1980  # type: ignore[index]  MHz
        (used,) = prom.query('DCGM_FI_DEV_FB_USED{gpu="1"}')
        assert float(used["value"][1]) == 512  # type: ignore[index]  MiB (the reserved)
        assert not prom.query('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="1"} > 0')
    finally:
        prom.close()
    assert d.stop() == 0
    assert any(r.get("event") == "xid" and r.get("xid") == 79 for r in d.log_records())


def test_the_fixture_holds_every_panel_query_of_the_dashboard() -> None:
    """The eight panels and two variables of dashboard 12239, each with its metric."""
    panels = [q for q in QUERIES["queries"] if not q["panel"].startswith("(")]
    assert len(panels) == 8 and len(QUERIES["variables"]) == 2
    used = {m for q in QUERIES["queries"] for m in re.findall(r"DCGM_FI_\w+", q["expr"])}
    recorded = set(re.findall(r"- record: (DCGM_FI_\w+)", DCGM_RULES.read_text()))
    assert used <= recorded
