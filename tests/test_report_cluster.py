"""`gpumon report` against a real cluster in miniature: gpumon serve daemons as nodes, a
real Prometheus scraping them, real processes with SLURM_JOB_ID on their fake GPUs.

One cluster for the whole module (its data takes ~30 s to gather):

- n1: four starved GPUs (bursts of 30 % duty); GPUs 0-1 run job 1001, GPUs 2-3 job 2002.
- n2: three healthy GPUs; GPUs 0-1 run job 1001, GPU 2 job 3003 (a one-node job).
- n3: two GPUs pinned at 100 % at a quarter of their power (busy-waiting), job 2002: they
  wait on n1, the straggler node of job 2002.
- n4: one healthy GPU, job 4004; its gpumon is killed for a few seconds mid-job.
- a stand-in for dcgm-exporter (one gauge with hpc_job="5005"): a job seen by Prometheus
  on a node that runs no gpumon.
- n5: two GPUs pinned at 100 % at low power, none computing, job 6006, with a hang
  threshold of 10 s: a hung job; n6: the job's third GPU, computing alone (a rank in another
  phase): the node the job waits on.

Prometheus asks for basic auth (its --web.config.file), so every report goes through the
HTTP configuration a real one would use; the report recording rule is loaded.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fakenvml import FakeGPU, Pattern, Process, Scenario, fake_env, write_scenario
from test_cli import one_sentence
from test_serve_daemon import Daemon, _openssl, free_port, make_cert, start_daemon

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
PROCTREE = REPO / "tests" / "helpers" / "proctree.py"
REPORT_RULES = REPO / "deploy" / "prometheus" / "gpumon-report-rules.yml"
EPILOG = REPO / "deploy" / "slurm" / "gpumon-epilog.sh"
PASSWORD = "report-test-password"
# Prometheus serves HTTPS and asks for a client certificate (files beside the config).
TLS_CONFIG = "tls_config:\n  ca_file: server.crt\n  cert_file: client.crt\n  key_file: client.key\n"
# How long every node holds its state before the reports are asked (working time judged).
HOLD_S = 14.0
# n4's gpumon is down this long (from when Prometheus has seen it gone).
N4_DOWN_FOR_S = 5.0
# Waits on Prometheus end here only when what they wait for never comes.
READY_DEADLINE_S = 300.0


def bursty(phase: float) -> Pattern:
    return Pattern.burst(period_s=0.5, duty=0.3, phase_s=phase)


class FakeDcgmExporter(http.server.BaseHTTPRequestHandler):
    """What dcgm-exporter serves for a job on a node without gpumon (one gauge)."""

    BODY = (
        b"# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
        b"# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-dcgm-0",hpc_job="5005"} 87\n'
    )

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.BODY)))
        self.end_headers()
        self.wfile.write(self.BODY)

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Cluster:
    url: str
    http_config: Path
    nodes: dict[str, str]  # name -> instance label
    dcgm_instance: str
    tmp: Path
    port: int  # Prometheus'
    env: dict[str, str] = field(default_factory=dict)

    def report(
        self,
        *args: str,
        auth: bool = True,
        url: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "gpumon", "report", "--prometheus", url or self.url]
        if auth:
            cmd += ["--http.config.file", str(self.http_config)]
        # Hermetic: no kept report of this machine's (/var/lib/gpumon/reports) is read.
        env = {"GPUMON_REPORT_STORE": str(self.tmp / "no-kept-reports"), **(env or os.environ)}
        return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60, env=env)

    def raw(self, selector: str) -> list[tuple[float, float]]:
        """The samples Prometheus holds for ``selector`` (what it scraped, when)."""
        return _raw(self.tmp, self.port, selector)

    def unseen(self, gaps: list[dict]) -> list[dict]:
        """The missing stretches of a report that Prometheus did not record as failed
        scrapes (up == 0 within a step of them): a report's gap on a node that answered.
        On a busy machine a node may miss a scrape's one-second deadline: that gap is the
        run's own truth, and the report is right to name it."""
        out = []
        for g in gaps:
            failed = [t for t, v in self.raw(f'up{{instance="{g["instance"]}"}}') if v == 0]
            if not any(g["start"] - 1.0 <= t <= g["end"] + 1.0 for t in failed):
                out.append(g)
        return out

    def report_json(self, *args: str) -> dict:
        res = self.report(*args, "--json")
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)


def start_prometheus(exe: str, here: Path, port: int, *flags: str) -> subprocess.Popen[str]:
    """Prometheus on loopback with ``here``'s prometheus.yml, its data in ``here``/tsdb."""
    return subprocess.Popen(
        [
            exe,
            f"--config.file={here / 'prometheus.yml'}",
            f"--storage.tsdb.path={here / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            *flags,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _job_tree(job: str) -> subprocess.Popen[str]:
    env = dict(os.environ, SLURM_JOB_ID=job)
    p = subprocess.Popen(
        [sys.executable, str(PROCTREE), "0", "1", "180"], env=env, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline().startswith("ready")
    return p


def _prom_query(tmp: Path, port: int, expr: str) -> list[dict]:
    body = urllib.parse.urlencode({"query": expr}).encode()
    req = urllib.request.Request(f"https://127.0.0.1:{port}/api/v1/query", body)
    token = base64.b64encode(f"gpumon:{PASSWORD}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    ctx = ssl.create_default_context(cafile=str(tmp / "server.crt"))
    ctx.load_cert_chain(str(tmp / "client.crt"), str(tmp / "client.key"))
    with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
        return json.load(r)["data"]["result"]


def _job_on(tmp: Path, port: int, instance: str, fresh: bool = False) -> bool:
    """Prometheus holds a job's series from ``instance`` (``fresh``: one scraped after
    the last scrape that failed)."""
    jobs = _raw(tmp, port, f"gpumon_gpu_job_info{{{instance}}}")
    if not fresh:
        return bool(jobs)
    down = [t for t, v in _raw(tmp, port, f"up{{{instance}}}") if v == 0]
    return bool(down) and any(t > down[-1] for t, _ in jobs)


def _raw(tmp: Path, port: int, selector: str) -> list[tuple[float, float]]:
    """The samples Prometheus holds for ``selector`` over the last 10 minutes."""
    res = _prom_query(tmp, port, f"{selector}[10m]")
    return sorted((float(t), float(v)) for r in res for t, v in r["values"])


def _hung(tmp: Path, port: int) -> int:
    res = _prom_query(tmp, port, 'count(gpumon_gpu_reason{reason="hang"} == 1)')
    return int(float(res[0]["value"][1])) if res else 0


def _count(tmp: Path, port: int, state: str) -> int:
    res = _prom_query(tmp, port, f'count(gpumon_gpu_state{{state="{state}"}} == 1)')
    return int(float(res[0]["value"][1])) if res else 0


@pytest.fixture(scope="module")
def cluster(fake_nvml_lib: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    pytest.importorskip("bcrypt", reason="bcrypt not installed (pip install bcrypt)")
    import bcrypt

    tmp = tmp_path_factory.mktemp("cluster")
    trees = {j: _job_tree(j) for j in ("1001", "2002", "3003", "4004", "6006")}
    pid = {j: p.pid for j, p in trees.items()}
    scenarios = {
        "n1": Scenario(
            gpus=[
                FakeGPU(uuid=f"GPU-n1-{i}", pattern=bursty(0.11 * i), processes=[Process(pid[j])])
                for i, j in enumerate(("1001", "1001", "2002", "2002"))
            ]
        ),
        "n2": Scenario(
            gpus=[
                FakeGPU(uuid=f"GPU-n2-{i}", processes=[Process(pid[j])])
                for i, j in enumerate(("1001", "1001", "3003"))
            ]
        ),
        "n3": Scenario(
            gpus=[
                FakeGPU(uuid=f"GPU-n3-{i}", power_busy_w=150.0, processes=[Process(pid["2002"])])
                for i in range(2)
            ]
        ),
        "n4": Scenario(gpus=[FakeGPU(uuid="GPU-n4-0", processes=[Process(pid["4004"])])]),
        "n5": Scenario(
            gpus=[
                FakeGPU(uuid=f"GPU-n5-{i}", power_busy_w=120.0, processes=[Process(pid["6006"])])
                for i in range(2)
            ]
        ),
        "n6": Scenario(gpus=[FakeGPU(uuid="GPU-n6-0", processes=[Process(pid["6006"])])]),
    }
    # n5 and n6 call a job hung after 10 s of every GPU spinning (5 minutes by default).
    (tmp / "hang.toml").write_text("[detector]\nhang_after_s = 10\n")
    quick_hang = ("--config", str(tmp / "hang.toml"))
    envs = {}
    for name, scn in scenarios.items():
        (tmp / name).mkdir()
        envs[name] = fake_env(write_scenario(tmp / name / "scenario.txt", scn))
    t0 = time.monotonic()
    daemons: dict[str, Daemon] = {
        n: start_daemon(envs[n], tmp / n, *(quick_hang if n in ("n5", "n6") else ()), log=False)
        for n in scenarios
    }
    dcgm = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeDcgmExporter)
    threading.Thread(target=dcgm.serve_forever, daemon=True).start()
    dcgm_instance = f"127.0.0.1:{dcgm.server_address[1]}"

    port = free_port()
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    openssl = _openssl()
    make_cert(openssl, tmp, "server")  # self-signed, for 127.0.0.1: its own CA
    make_cert(openssl, tmp, "client", ca=make_cert(openssl, tmp, "client-ca"))
    (tmp / "web.yml").write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client-ca.crt\n"
        f"basic_auth_users:\n  gpumon: {hashed}\n"
    )
    shutil.copy(REPORT_RULES, tmp / "rules.yml")
    targets = ", ".join(f"'127.0.0.1:{d.port}'" for d in daemons.values())
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "rule_files: [rules.yml]\nscrape_configs:\n"
        f"  - job_name: gpumon\n    static_configs: [{{targets: [{targets}]}}]\n"
        f"  - job_name: dcgm\n    static_configs: [{{targets: ['{dcgm_instance}']}}]\n"
    )
    prom = start_prometheus(exe, tmp, port, f"--web.config.file={tmp / 'web.yml'}")
    (tmp / "password").write_text(PASSWORD + "\n")
    http_config = tmp / "http.yml"
    http_config.write_text(
        "basic_auth:\n  username: gpumon\n  password_file: password\n" + TLS_CONFIG
    )
    nodes = {n: f"127.0.0.1:{d.port}" for n, d in daemons.items()}
    n4 = f'instance="{nodes["n4"]}"'

    def until(what: str, ready: Callable[[], bool]) -> None:
        """Wait for Prometheus to hold ``what``: events, whatever the machine's load (the
        deadline only ends a wait for something that never comes)."""
        deadline = time.monotonic() + READY_DEADLINE_S
        while True:
            assert prom.poll() is None, prom.communicate()[1][-2000:]
            try:
                if ready():
                    return
            except OSError:
                pass
            assert time.monotonic() < deadline, what
            time.sleep(0.5)

    try:
        # n4's gpumon goes away for a while once Prometheus has its job's series, and
        # comes back once Prometheus has seen it gone.
        until("n4's job never reached Prometheus", lambda: _job_on(tmp, port, n4))
        n4_port = daemons["n4"].port
        daemons["n4"].stop(signal.SIGKILL)
        until(
            "Prometheus never saw n4 down", lambda: bool(_prom_query(tmp, port, f"up{{{n4}}} == 0"))
        )
        time.sleep(N4_DOWN_FOR_S)  # the outage's length (a design, not a wait)
        daemons["n4"] = start_daemon(
            envs["n4"], tmp / "n4", "--listen", f"127.0.0.1:{n4_port}", log=False, wait=False
        )
        until("n4's job never came back", lambda: _job_on(tmp, port, n4, fresh=True))
        until(
            "the nodes never reached their states",
            lambda: (
                _count(tmp, port, "starved") >= 4
                and _count(tmp, port, "sync_stall") >= 4
                and _count(tmp, port, "healthy") >= 5
                and _hung(tmp, port) >= 2
            ),
        )
        time.sleep(HOLD_S)
        print(f"cluster ready after {time.monotonic() - t0:.0f} s")
        yield Cluster(f"https://127.0.0.1:{port}", http_config, nodes, dcgm_instance, tmp, port)
    finally:
        prom.terminate()
        prom.wait(timeout=10)
        for d in daemons.values():
            d.stop()
        dcgm.shutdown()
        for p in trees.values():
            p.terminate()
            p.wait(timeout=10)


def _node(report: dict, instance: str) -> dict:
    (node,) = [n for n in report["nodes"] if n["instance"] == instance]
    return node


# --------------------------------------------------------------------------- verdicts
def test_one_node_starved_one_healthy_names_the_starved_node(cluster: Cluster) -> None:
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    r = cluster.report_json("--job", "1001", "--last", "10m")
    assert r["job"] == "1001" and r["gpu_count"] == 4
    assert r["verdict"] == "starved" and r["cause"] in ("cpu", "gil", "io", "unknown")
    assert r["problem_nodes"] == [n1]
    assert _node(r, n1)["verdict"] == "starved" and _node(r, n2)["verdict"] == "healthy"
    assert [g["gpu"] for g in _node(r, n1)["gpus"]] == [0, 1]
    for g in _node(r, n1)["gpus"]:
        assert 0.2 <= g["duty_cycle"] <= 0.45, g
        assert g["seconds"]["starved"] > HOLD_S
        assert 0.25 <= g["evidence"]["gap_p50_s"] <= 0.6  # 0.35 s gaps, log-binned
        assert g["advice"]
    for g in _node(r, n2)["gpus"]:
        assert g["duty_cycle"] >= 0.95 and g["verdict"] == "healthy"
    # Two starved GPUs at 0.3 and two at 1.0: about 2.6 GPUs of work, and about 1.4x faster
    # if fed (1 / the working duty cycle of ~0.65).
    assert 2.3 <= r["effective_gpus"] <= 2.9
    assert 1.2 <= r["speedup_if_fed"] <= 1.9
    assert r["lost_gpu_seconds"] > 2 * HOLD_S * 0.5
    assert r["straggler"] is None and cluster.unseen(r["missing"]) == []
    assert r["sources"]["utilization_by_state"] == "recording rule"

    text = cluster.report("--job", "1001", "--last", "10m")
    # Warnings only of scrapes Prometheus recorded as failed (a busy machine's; the JSON's
    # gaps are held to Prometheus' own up series above).
    unexplained = [ln for ln in text.stderr.splitlines() if "(up == 0)" not in ln]
    assert text.returncode == 0 and not unexplained, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("gpumon report · job 1001 · 2 node(s) · 4 GPU(s) ·")
    assert lines[1].startswith("Verdict: STARVED (cause: ") and f"on {n1}" in lines[1]
    assert "fixing the input pipeline could make this run up to" in text.stdout
    assert f"node {n1}  starved/" in text.stdout and f"node {n2}  healthy" in text.stdout
    assert "Advice:" in text.stdout


def test_a_straggler_node_whose_peers_busy_wait_is_named(cluster: Cluster) -> None:
    n1, n3 = cluster.nodes["n1"], cluster.nodes["n3"]
    r = cluster.report_json("--job", "2002", "--last", "10m")
    assert r["verdict"] == "sync_stall" and r["cause"] is None
    s = r["straggler"]
    assert s["kind"] == "node" and s["instance"] == n1 and s["gpu"] is None
    assert s["skew"] >= 0.5 and s["state"] == "starved"
    assert r["problem_nodes"] == [n1]
    # Each node, judged alone, sees only half: n1 starved, n3 stalled on peers.
    assert _node(r, n1)["verdict"] == "starved" and _node(r, n1)["straggler"] is True
    assert _node(r, n3)["verdict"] == "sync_stall" and _node(r, n3)["straggler"] is False
    assert [g["gpu"] for g in _node(r, n1)["gpus"]] == [2, 3]
    assert r["advice"][0].startswith(f"node {n1} is the straggler")
    assert n3 in r["advice"][0]
    assert not any(a.startswith("one rank is the straggler") for a in r["advice"])
    # Busy-waiting is no work: four GPUs read busy 65 % of the time but computed ~15 %.
    assert r["speedup_if_fed"] >= 4

    text = cluster.report("--job", "2002", "--last", "10m").stdout
    verdict = text.splitlines()[1]
    assert verdict.startswith("Verdict: SYNC STALL") and f"straggler node {n1} (skew " in verdict
    assert "removing the waits on peers could make this run up to" in text
    assert f"node {n1}  starved/" in text and "← the straggler" in text


def test_a_hung_job_names_the_node_whose_gpus_do_not_spin(cluster: Cluster) -> None:
    """n5's two GPUs spin with none computing (a hang) while n6's computes alone: the job
    waits on n6, whatever it does; n5's own view (the rank is elsewhere) gives way."""
    n5, n6 = cluster.nodes["n5"], cluster.nodes["n6"]
    r = cluster.report_json("--job", "6006", "--last", "10m")
    assert r["verdict"] == "sync_stall" and r["reason"] == "hang", r
    s = r["straggler"]
    assert s["kind"] == "node" and s["instance"] == n6 and s["hung_peers"] is True
    assert s["state"] == "healthy"  # computing alone: a rank in another phase
    assert r["problem_nodes"] == [n6]
    assert _node(r, n5)["verdict"] == "sync_stall" and _node(r, n6)["verdict"] == "healthy"
    assert r["advice"][0].startswith(f"node {n6} is what the job waits on")
    assert not any(a.startswith("no rank on this node computes") for a in r["advice"])
    text = cluster.report("--job", "6006", "--last", "10m").stdout
    assert f"hung: the job waits on node {n6}" in text.splitlines()[1]
    # The daemon's own series: the job's reason, for GpumonJobHung.
    res = _prom_query(cluster.tmp, int(cluster.url.rsplit(":", 1)[1]),
                      'gpumon_job_reason{hpc_job="6006",reason="hang"}')  # fmt: skip
    assert [x["metric"]["instance"] for x in res] == [n5]


def test_a_job_on_one_node(cluster: Cluster) -> None:
    r = cluster.report_json("--job", "3003", "--last", "10m")
    assert [n["instance"] for n in r["nodes"]] == [cluster.nodes["n2"]]
    assert r["verdict"] == "healthy" and r["gpu_count"] == 1 and r["straggler"] is None
    (g,) = r["nodes"][0]["gpus"]
    assert g["gpu"] == 2 and g["uuid"] == "GPU-n2-2" and g["duty_cycle"] >= 0.95
    assert r["advice"] == [] and r["speedup_if_fed"] is not None and r["speedup_if_fed"] < 1.1


def test_series_missing_for_part_of_the_job_are_named_and_the_rest_judged(
    cluster: Cluster,
) -> None:
    """The stretch is Prometheus' own: from its first failed scrape of n4 (its series go
    stale there) to the first scrape that brought the job's series back, at the report's
    one-second step, however long the machine took to kill and restart the daemon."""
    n4 = cluster.nodes["n4"]
    res = cluster.report("--job", "4004", "--last", "10m", "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    at = f'instance="{n4}"'
    down = [t for t, v in cluster.raw(f"up{{{at}}}") if v == 0]
    assert down, "Prometheus recorded no failed scrape of n4"
    back = [t for t, _ in cluster.raw(f'gpumon_gpu_job_info{{{at},hpc_job="4004"}}') if t > down[0]]
    assert back, "n4's job series never came back"
    (gap,) = [g for g in r["missing"] if g["instance"] == n4 and g["start"] <= back[0]]
    assert "up == 0" in gap["why"]
    step, slack = 1.0, 0.01
    assert down[0] - slack <= gap["start"] <= down[0] + step + slack, (gap, down[0])
    assert back[0] - step - slack <= gap["end"] <= back[0] + slack, (gap, back[0])
    assert gap["end"] - gap["start"] >= N4_DOWN_FOR_S - 2 * step
    # Any other stretch is one Prometheus saw too (a scrape that timed out on a busy node).
    assert cluster.unseen([g for g in r["missing"] if g is not gap]) == []
    assert r["restarted"] == [n4]
    assert r["verdict"] == "healthy"  # judged on the rest
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("gpumon: warning:")]
    assert len(warnings) == len(r["missing"]) + 1
    assert any(n4 in w and "judges the rest" in w for w in warnings)
    text = cluster.report("--job", "4004", "--last", "10m").stdout
    assert f"  missing: {n4}: no series from " in text


def test_raw_series_and_the_recording_rule_give_the_same_report(cluster: Cluster) -> None:
    ruled = cluster.report_json("--job", "2002", "--last", "10m")
    raw = cluster.report_json("--job", "2002", "--last", "10m", "--no-recording-rules")
    assert raw["sources"]["utilization_by_state"] == "subquery"
    assert raw["verdict"] == ruled["verdict"]
    assert raw["straggler"]["instance"] == ruled["straggler"]["instance"]
    for a, b in zip(ruled["nodes"], raw["nodes"], strict=True):
        for ga, gb in zip(a["gpus"], b["gpus"], strict=True):
            assert abs(ga["duty_cycle"] - gb["duty_cycle"]) <= 0.05
    assert abs(ruled["speedup_if_fed"] - raw["speedup_if_fed"]) <= 0.25 * ruled["speedup_if_fed"]


# --------------------------------------------------------------------------- errors
def test_a_job_that_does_not_exist(cluster: Cluster) -> None:
    res = cluster.report("--job", "9999", "--last", "10m")
    assert res.returncode == 4 and not res.stdout
    msg = one_sentence(res.stderr)
    assert "no series of job 9999" in msg and "no such job in that range" in msg
    # A pod is looked for by its namespace and name labels, the same way.
    res = cluster.report("--pod", "train/resnet-0", "--last", "10m")
    assert res.returncode == 4 and "no series of pod train/resnet-0" in one_sentence(res.stderr)


def test_a_job_whose_nodes_run_no_gpumon(cluster: Cluster) -> None:
    res = cluster.report("--job", "5005", "--last", "10m")
    assert res.returncode == 4 and not res.stdout
    msg = one_sentence(res.stderr)
    assert cluster.dcgm_instance in msg and "DCGM_FI_DEV_GPU_UTIL" in msg
    assert "gpumon serve does not run on its nodes" in msg


def test_prometheus_down(cluster: Cluster) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, not listening
        res = cluster.report("--job", "1001", url=closed)
    assert res.returncode == 1 and not res.stdout
    assert one_sentence(res.stderr) == (
        f"gpumon: cannot reach Prometheus at {closed} (connection refused)"
    )


def _with_config(cluster: Cluster, text: str) -> subprocess.CompletedProcess[str]:
    path = cluster.tmp / "other-http.yml"
    path.write_text(text)
    return cluster.report("--job", "1001", "--http.config.file", str(path), auth=False)


def test_credentials_refused(cluster: Cluster) -> None:
    res = _with_config(cluster, TLS_CONFIG)  # the certificate, no password
    assert res.returncode == 1
    assert one_sentence(res.stderr) == (
        f"gpumon: Prometheus at {cluster.url} refused the credentials (HTTP 401); give them "
        "with --http.config.file (basic_auth, authorization or bearer_token_file)"
    )
    res = _with_config(cluster, "basic_auth: {username: gpumon, password: guess}\n" + TLS_CONFIG)
    assert res.returncode == 1 and "HTTP 401" in one_sentence(res.stderr)


def test_the_servers_certificate_is_checked(cluster: Cluster) -> None:
    res = cluster.report("--job", "1001", auth=False)  # the system's CAs do not know it
    assert res.returncode == 1
    msg = one_sentence(res.stderr)
    assert msg.startswith(f"gpumon: the TLS handshake with Prometheus at {cluster.url} failed")
    named = TLS_CONFIG + "  server_name: localhost\n"  # in the certificate: accepted
    good = f"basic_auth: {{username: gpumon, password: {PASSWORD}}}\n"
    res = _with_config(cluster, good + named)
    assert res.returncode == 0, res.stderr
    res = _with_config(cluster, good + TLS_CONFIG + "  server_name: prometheus.example\n")
    assert res.returncode == 1 and "TLS handshake" in one_sentence(res.stderr)


# --------------------------------------------------------------------------- kept reports
def _empty_prometheus(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    """A real Prometheus that scrapes nothing: one whose retention has dropped every job."""
    exe = shutil.which("prometheus")
    assert exe is not None
    here = tmp / f"empty-prometheus-{free_port()}"
    here.mkdir()
    (here / "prometheus.yml").write_text("global:\n  scrape_interval: 1s\n")
    port = free_port()
    proc = start_prometheus(exe, here, port)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_DEADLINE_S
    while True:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        assert time.monotonic() < deadline, "the empty Prometheus never became ready"
        time.sleep(0.2)


def _stand_in_slurm(bindir: Path, comment: Path) -> dict[str, str]:
    """scontrol and sacct as far as the AdminComment goes, kept in ``comment``; the PATH."""
    bindir.mkdir(exist_ok=True)
    (bindir / "scontrol").write_text(
        "#!/bin/sh\n"
        f"c={comment}\n"
        'if [ "$1" = update ]; then printf %s "${3#AdminComment=}" > "$c"; exit 0; fi\n'
        'printf "JobId=1001 JobName=train JobState=COMPLETED AdminComment=%s Power=\\n" '
        '"$(cat "$c" 2>/dev/null || echo "(null)")"\n'
    )
    (bindir / "sacct").write_text(f"#!/bin/sh\ncat {comment} 2>/dev/null; echo\n")
    for tool in ("scontrol", "sacct"):
        (bindir / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}


def test_a_kept_report_is_read_back_once_prometheus_has_lost_the_series(cluster: Cluster) -> None:
    store = cluster.tmp / "kept"
    made = cluster.report("--job", "1001", "--last", "10m", "--keep", "--store", str(store))
    assert made.returncode == 0, made.stderr
    kept = store / "1001.json"
    assert f"gpumon: kept the report of job 1001 in {kept}" in made.stderr
    assert "gpumon report · job 1001 · 2 node(s)" in made.stdout
    empty, url = _empty_prometheus(cluster.tmp)
    try:
        # The series are gone: Prometheus alone has nothing of the job ...
        gone = cluster.report("--job", "1001", url=url, auth=False)
        assert gone.returncode == 4, gone.stderr
        # ... and the kept report is what was made, said to come from where it was kept.
        back = cluster.report("--job", "1001", "--store", str(store), url=url, auth=False)
        assert back.returncode == 0, back.stderr
        assert back.stdout == made.stdout
        note = one_sentence(back.stderr)
        assert note.startswith(f"gpumon: note: the report of job 1001 kept in {kept}, made ")
        assert note.endswith(f"from {cluster.url}; --fresh asks Prometheus again")
        js = cluster.report("--job", "1001", "--store", str(store), "--json", url=url, auth=False)
        doc = json.loads(js.stdout)
        assert doc["job"] == "1001" and doc["verdict"] == "starved" and doc["gpu_count"] == 4
        assert doc["kept"]["where"] == str(kept)
        # Without a Prometheus at all; and --fresh asks the (empty) one.
        alone = subprocess.run(
            [sys.executable, "-m", "gpumon", "report", "--job", "1001", "--store", str(store)],
            capture_output=True, text=True, timeout=60,
            env={k: v for k, v in os.environ.items() if k != "GPUMON_PROMETHEUS"},
        )  # fmt: skip
        assert alone.returncode == 0 and alone.stdout == made.stdout, alone.stderr
        fresh = cluster.report(
            "--job", "1001", "--store", str(store), "--fresh", url=url, auth=False
        )
        assert fresh.returncode == 4, fresh.stderr
    finally:
        empty.terminate()
        empty.wait(timeout=10)


def test_the_report_is_kept_in_slurms_admincomment_unless_another_tools_is_there(
    cluster: Cluster,
) -> None:
    comment = cluster.tmp / "admincomment"
    env = _stand_in_slurm(cluster.tmp / "slurm-bin", comment)
    store = cluster.tmp / "kept-beside-slurm"
    made = cluster.report(
        "--job", "1001", "--last", "10m", "--keep", "--store", str(store), env=env
    )
    assert made.returncode == 0, made.stderr
    assert "gpumon: kept the report of job 1001 in Slurm's AdminComment of job 1001" in made.stderr
    assert comment.read_text().startswith("GPUMON1:") and not (store / "1001.json").exists()
    empty, url = _empty_prometheus(cluster.tmp)
    try:
        back = cluster.report("--job", "1001", "--store", str(store), url=url, auth=False, env=env)
        assert back.returncode == 0 and back.stdout == made.stdout, back.stderr
        assert "kept in Slurm's AdminComment of job 1001, made " in back.stderr
    finally:
        empty.terminate()
        empty.wait(timeout=10)
    # jobstats' summary (or an admin's note) is never replaced: the report goes to a file.
    comment.write_text("JS1:H4sIAAAAAAAAA6tWSs7PS0lNLlGyUlAqS8wpTtVRSs5ILC4uzUkFCQIA")
    again = cluster.report(
        "--job", "1001", "--last", "10m", "--keep", "--store", str(store), env=env
    )
    assert again.returncode == 0, again.stderr
    assert f"kept the report of job 1001 in {store / '1001.json'}" in again.stderr
    assert comment.read_text().startswith("JS1:")


# --------------------------------------------------------------------------- Slurm
def _wait_for(path: Path, text: str, timeout_s: float = 90) -> str:
    """The file once it holds ``text`` (the epilog's report runs detached, after it)."""
    deadline = time.monotonic() + timeout_s
    while text not in (content := path.read_text()):
        assert time.monotonic() < deadline, f"{text!r} never came: {content!r}"
        time.sleep(0.2)
    return content


def test_the_slurm_epilog_appends_the_report_to_the_jobs_output(cluster: Cluster) -> None:
    """The epilog as slurmd runs it (root, no PATH), with a stand-in for scontrol.  It does
    not hold the node: it returns while its report still waits (here on a gate the test
    opens), and the report lands in the job's output, and in the kept reports, after."""
    bindir = cluster.tmp / "bin"
    bindir.mkdir(exist_ok=True)
    out = cluster.tmp / "slurm-1001.out"
    out.write_text("training output\n")
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 300))
    scontrol = bindir / "scontrol"
    scontrol.write_text(  # what `scontrol -o show job 1001` prints, in part
        "#!/bin/sh\n"
        f'echo "JobId=1001 JobName=train UserId=someone({os.getuid()}) '
        f"GroupId=some({os.getgid()}) JobState=COMPLETING StartTime={start} "
        f'EndTime=Unknown NodeList=n[1-2] BatchHost=n1 StdOut={out} Power="\n'
    )
    scontrol.chmod(0o755)
    gate = cluster.tmp / "epilog-gate"
    gpumon = bindir / "gpumon"
    gpumon.write_text(
        f"#!/bin/sh\nwhile [ ! -e {gate} ]; do sleep 0.1; done\n"
        f'exec {sys.executable} -m gpumon "$@"\n'
    )
    gpumon.chmod(0o755)
    store = cluster.tmp / "epilog-kept"
    env = {
        "SLURM_JOB_ID": "1001",
        "SLURMD_NODENAME": "n1",
        "GPUMON_PROMETHEUS": cluster.url,
        "GPUMON_HTTP_CONFIG": str(cluster.http_config),
        "GPUMON_BIN": str(gpumon),
        "SCONTROL": str(scontrol),
        "GPUMON_REPORT_DELAY": "0",
        "GPUMON_REPORT_STORE": str(store),
        "PYTHONPATH": str(REPO),
    }
    try:
        res = subprocess.run(
            ["/bin/sh", str(EPILOG)], env=env, capture_output=True, text=True, timeout=30
        )
        assert res.returncode == 0, res.stderr
        assert out.read_text() == "training output\n"  # returned; the report still waits
    finally:
        gate.touch()
    text = _wait_for(out, "Verdict: ")
    assert text.startswith("training output\n")
    assert "gpumon report · job 1001 · 2 node(s)" in text and "Verdict: STARVED" in text
    assert f"gpumon: kept the report of job 1001 in {store / '1001.json'}" in _wait_for(
        out, "gpumon: kept"
    )
    # On the job's other nodes it does nothing (one report per job, from the batch host).
    out.write_text("")
    res = subprocess.run(
        ["/bin/sh", str(EPILOG)],
        env={**env, "SLURMD_NODENAME": "n2"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0 and out.read_text() == ""
    # And a failure never fails the epilog (slurmd would drain the node).
    res = subprocess.run(
        ["/bin/sh", str(EPILOG)],
        env={**env, "GPUMON_PROMETHEUS": "http://127.0.0.1:1"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0
    _wait_for(out, "cannot reach Prometheus")
