"""`gpumon report --top` against a fleet in miniature: three `gpumon serve` daemons on the
fake NVML library, scraped by a real Prometheus evaluating the shipped rules, with real job
processes -- Slurm jobs (SLURM_JOB_ID, SLURM_JOB_USER) and a plain process tree started
from a shell, as a command typed in a login is.

- f1: GPU 0 runs job 7001 (alice), starved (30 % duty); GPUs 1-3 job 7002 (bob), starved
  (20 % duty): job 7002's straggler node.
- f2: GPUs 0-1 run job 7002, pinned at 100 % at a fifth of their power: busy-waiting on
  f1; GPU 2 job 7003 (alice), healthy.
- f3: GPUs 0-2 run a plain process tree (this test's user): it computes until the node's
  gpumon has seen it work, then holds its memory with no work; GPU 3 runs job 7001,
  starved.

GPU time lost per second: 7002 about 2.4 + 2 = 4.4, the plain job 3 (once idle), 7001 1.4,
7003 about nothing.  The fleet group of gpumon-rules.yml runs every 3 s here instead of
every 5 minutes (its interval and window rewritten together, as its comment says they must
be), so its records exist within the test; the shipped group is promtool-tested.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fakenvml import FakeGPU, Pattern, Process, Scenario, fake_env, write_scenario
from test_cli import one_sentence
from test_report_cluster import _empty_prometheus, start_prometheus
from test_serve_daemon import free_port, start_daemon

from gpumon.faces.report.queries import NODE_KINDS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
PROCTREE = REPO / "tests" / "helpers" / "proctree.py"
RULES = REPO / "deploy" / "prometheus" / "gpumon-rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "gpumon-dashboard.json"
ME = pwd.getpwuid(os.getuid()).pw_name
HOLD_S = 12.0
FLEET_EVERY = "3s"


def fast_fleet_rules(text: str) -> str:
    """gpumon-rules.yml with the fleet group every FLEET_EVERY, window and interval alike."""
    head, sep, rest = text.partition("  - name: gpumon-fleet\n")
    assert sep, "gpumon-rules.yml has no gpumon-fleet group"
    group, sep2, tail = rest.partition("\n  - name: ")
    assert group.count("interval: 5m") == 1 and group.count("[5m]") == 4, group
    group = group.replace("interval: 5m", f"interval: {FLEET_EVERY}")
    group = group.replace("[5m]", f"[{FLEET_EVERY}]")
    return head + sep + group + sep2 + tail


@dataclass
class Fleet:
    url: str
    port: int
    nodes: dict[str, str]  # name -> instance
    plain: str  # the plain job's pid (its job_name)
    tmp: Path

    def report(self, *args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "gpumon", "report", "--prometheus", url or self.url]
        env = {**os.environ, "GPUMON_REPORT_STORE": str(self.tmp / "no-kept-reports")}
        return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, env=env)

    def json(self, *args: str, url: str | None = None) -> dict:
        res = self.report(*args, "--json", url=url)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    def query(self, expr: str) -> list[dict]:
        import urllib.parse
        import urllib.request

        body = urllib.parse.urlencode({"query": expr}).encode()
        with urllib.request.urlopen(f"{self.url}/api/v1/query", body, timeout=10) as r:
            return json.load(r)["data"]["result"]


def _slurm_job(job: str, user: str) -> subprocess.Popen[str]:
    env = dict(os.environ, SLURM_JOB_ID=job, SLURM_JOB_USER=user)
    p = subprocess.Popen(
        [sys.executable, str(PROCTREE), "0", "1", "300"], env=env, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline().startswith("ready")
    return p


def _plain_job() -> tuple[subprocess.Popen[str], int]:
    """A process tree started from a shell leading its session (as a typed command is):
    the job is the tree, named by its top process; its pid."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    shell = subprocess.Popen(
        ["sh", "-c", '"$@"; exit $?', "sh", sys.executable, str(PROCTREE), "0", "1", "300"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert shell.stdout is not None
    worker = int(shell.stdout.readline().split()[1])
    top = int(Path(f"/proc/{worker}/stat").read_text().rsplit(") ", 1)[1].split()[1])
    return shell, top


def bursty(duty: float, phase: float) -> Pattern:
    return Pattern.burst(period_s=0.5, duty=duty, phase_s=phase)


@pytest.fixture(scope="module")
def fleet(fake_nvml_lib: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    tmp = tmp_path_factory.mktemp("fleet")
    jobs = {
        "7001": _slurm_job("7001", "alice"),
        "7002": _slurm_job("7002", "bob"),
        "7003": _slurm_job("7003", "alice"),
    }
    shell, plain = _plain_job()
    pid = {j: p.pid for j, p in jobs.items()}
    held = [FakeGPU(uuid=f"GPU-f3-{i}", processes=[Process(plain)]) for i in range(3)]
    scenarios = {
        "f1": Scenario(
            gpus=[
                FakeGPU(uuid="GPU-f1-0", pattern=bursty(0.3, 0.0),
                        processes=[Process(pid["7001"])]),
                *(
                    FakeGPU(uuid=f"GPU-f1-{i}", pattern=bursty(0.2, 0.1 * i),
                            processes=[Process(pid["7002"])])
                    for i in (1, 2, 3)
                ),
            ]
        ),
        "f2": Scenario(
            gpus=[
                *(
                    FakeGPU(uuid=f"GPU-f2-{i}", power_busy_w=140.0,
                            processes=[Process(pid["7002"])])
                    for i in (0, 1)
                ),
                FakeGPU(uuid="GPU-f2-2", processes=[Process(pid["7003"])]),
            ]
        ),
        "f3": Scenario(
            gpus=[
                *held,
                FakeGPU(uuid="GPU-f3-3", pattern=bursty(0.3, 0.2),
                        processes=[Process(pid["7001"])]),
            ]
        ),
    }  # fmt: skip
    paths, daemons = {}, {}
    for name, scn in scenarios.items():
        (tmp / name).mkdir()
        paths[name] = write_scenario(tmp / name / "scenario.txt", scn)
    daemons = {n: start_daemon(fake_env(paths[n]), tmp / n, log=False) for n in scenarios}
    port = free_port()
    (tmp / "rules.yml").write_text(fast_fleet_rules(RULES.read_text()))
    targets = ", ".join(f"'127.0.0.1:{d.port}'" for d in daemons.values())
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "rule_files: [rules.yml]\nscrape_configs:\n"
        f"  - job_name: gpumon\n    static_configs: [{{targets: [{targets}]}}]\n"
    )
    prom = start_prometheus(exe, tmp, port)
    nodes = {n: f"127.0.0.1:{d.port}" for n, d in daemons.items()}
    f = Fleet(f"http://127.0.0.1:{port}", port, nodes, str(plain), tmp)
    try:
        # The plain job computes until its node's gpumon has seen it work, then holds its
        # memory with no work.
        deadline = time.monotonic() + 90
        while _safe_count(f, 'gpumon_gpu_state{uuid=~"GPU-f3-[012]",state="healthy"} == 1') < 3:
            assert prom.poll() is None, prom.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the plain job's GPUs were never seen working"
            time.sleep(0.5)
        idle = [FakeGPU(uuid=g.uuid, pattern=Pattern.off(), processes=g.processes) for g in held]
        write_scenario(paths["f3"], Scenario(gpus=[*idle, scenarios["f3"].gpus[3]]))
        deadline = time.monotonic() + 90
        while True:
            assert prom.poll() is None, prom.communicate()[1][-2000:]
            try:
                counts = {q: _count(f, q) for q in READY}
            except OSError:
                counts = {}
            if counts and all(counts[q] >= n for q, n in READY.items()):
                break
            assert time.monotonic() < deadline, f"the fleet never reached its states: {counts}"
            time.sleep(0.5)
        time.sleep(HOLD_S)
        yield f
    finally:
        prom.terminate()
        prom.wait(timeout=10)
        for d in daemons.values():
            d.stop()
        for p in jobs.values():
            p.terminate()
            p.wait(timeout=10)
        os.killpg(shell.pid, 15)
        shell.wait(timeout=10)


# What the fleet shows once every node is in its state (series each query must return).
READY = {
    'gpumon_job_state{hpc_job="7001",state="starved"} == 1': 2,
    'gpumon_job_state{hpc_job="7002",state="sync_stall"} == 1': 1,
    'gpumon_gpu_reason{reason="memory_held"} == 1': 3,
    "job_user_cause:gpumon_job_lost_gpu_seconds:increase5m": 5,
}


def _count(f: Fleet, expr: str) -> int:
    return len(f.query(expr))


def _safe_count(f: Fleet, expr: str) -> int:
    try:
        return _count(f, expr)
    except OSError:  # Prometheus not listening yet
        return 0


def _rows(report: dict) -> list[dict]:
    return report["jobs"]


def plain_ident(f: Fleet) -> str:
    (kind,) = {
        s["metric"]["job_kind"]
        for s in f.query(f'gpumon_job_gpus{{job_name="{f.plain}"}}')
    }  # fmt: skip
    assert kind in NODE_KINDS
    return f"{kind}:{f.plain}@{f.nodes['f3']}"


# --------------------------------------------------------------------------- the ranking
def test_top_ranks_jobs_by_gpu_time_lost_with_verdict_cause_and_user(fleet: Fleet) -> None:
    # One range for the records and the raw series alike: the jobs go on losing time
    # between the two reports (seconds apart on a busy machine).
    until = time.time()
    window = ("--since", f"@{until - 600:.3f}", "--until", f"@{until:.3f}")
    r = fleet.json("--top", "10", *window)
    rows = _rows(r)
    plain = plain_ident(fleet)
    assert [x["job"] for x in rows] == ["7002", plain, "7001", "7003"], rows
    assert [x["user"] for x in rows] == ["bob", ME, "alice", "alice"]
    assert [x["rank"] for x in rows] == [1, 2, 3, 4]
    lost = [x["lost_gpu_seconds"] for x in rows]
    assert lost == sorted(lost, reverse=True) and lost[0] > 2 * HOLD_S
    assert r["sources"]["lost_time"] == "recording rule"
    assert r["job_count"] == 4 and r["sources"]["kept_reports"] == 0

    j7002, jplain, j7001, j7003 = rows
    # Job 7002's GPUs on f2 busy-wait on f1's, which are starved: the job waits on f1.
    assert j7002["verdict"] == "sync_stall" and j7002["cause"] == "straggler", j7002
    assert j7002["straggler_node"] == fleet.nodes["f1"]
    assert sorted(j7002["nodes"]) == sorted([fleet.nodes["f1"], fleet.nodes["f2"]])
    assert j7002["gpus"] == 5 and j7002["speedup_if_fed"] >= 2
    assert j7002["advice"].startswith(f"node {fleet.nodes['f1']} is the straggler")
    causes = {(c["state"], c["cause"]) for c in j7002["lost_by_cause"]}
    assert ("sync_stall", "busy_wait") in causes
    assert any(s == "starved" for s, _ in causes)
    # The plain job computed (healthy) a while, then held its memory with no work: its
    # lost time is that.
    assert jplain["verdict"] == "healthy" and jplain["cause"] is None, jplain
    assert jplain["lost_to"]["state"] == "idle" and jplain["lost_to"]["cause"] == "memory_held"
    assert jplain["lost_to"]["share"] >= 0.5  # the rest: before the detector saw it idle
    assert jplain["kind"] in NODE_KINDS and jplain["nodes"] == [fleet.nodes["f3"]]
    assert jplain["gpus"] == 3
    assert jplain["lost_by_cause"][0]["state"] == "idle"
    assert jplain["lost_by_cause"][0]["cause"] == "memory_held"
    # Job 7001: starved on both its nodes.
    assert j7001["verdict"] == "starved", j7001
    assert j7001["cause"] in ("cpu", "gil", "io", "contention", "unknown")
    assert j7001["gpus"] == 2 and len(j7001["nodes"]) == 2 and j7001["advice"]
    assert 0.4 <= j7001["lost_share"] <= 0.9
    # Job 7003 is healthy and lost next to nothing.
    assert j7003["verdict"] == "healthy" and j7003["lost_share"] < 0.1

    # The same ranking from the daemons' counters alone (no records read).
    raw = fleet.json("--top", "10", *window, "--no-recording-rules")
    assert raw["sources"]["lost_time"] == "raw series"
    assert [x["job"] for x in _rows(raw)] == [x["job"] for x in rows]
    for a, b in zip(rows, _rows(raw), strict=True):
        assert b["lost_gpu_seconds"] == pytest.approx(a["lost_gpu_seconds"], rel=0.3, abs=5)
        assert (a["verdict"], a["cause"]) == (b["verdict"], b["cause"])

    # --top 2 shows two, and still says how many jobs there were.
    two = fleet.json("--top", "2", "--since", "10m")
    assert [x["job"] for x in _rows(two)] == ["7002", plain] and two["job_count"] == 4


def test_the_text_ranking_and_the_per_user_digest(fleet: Fleet) -> None:
    res = fleet.report("--top", "3", "--since", "10m")
    assert res.returncode == 0 and not res.stderr, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("gpumon report · top 3 jobs by GPU time lost · ")
    unit = r"[\d.]+ GPU-(h|min|s)"
    assert re.match(rf"{unit} lost of {unit} \(\d+ %\) in 4 job\(s\)$", lines[1]), lines[1]
    ranked = [ln for ln in lines if re.match(r"\s+\d+  ", ln)]
    assert len(ranked) == 3
    assert ranked[0].split()[1] == "7002" and "user bob" in ranked[0]
    assert f"sync_stall/straggler (waits on {fleet.nodes['f1']})" in ranked[0]
    assert "healthy, lost " in ranked[1] and " % to idle/memory_held" in ranked[1]
    assert f"user {ME}" in ranked[1]
    assert any(ln.strip().startswith("advice: ") for ln in lines)

    digest = fleet.report("--top", "10", "--since", "10m", "--by", "user", "--format", "text")
    assert digest.returncode == 0, digest.stderr
    text = digest.stdout
    assert text.splitlines()[0].startswith("gpumon report · top 3 users by GPU time lost · ")
    users = [ln.split()[1] for ln in text.splitlines() if re.match(r"\s+\d+  ", ln)]
    assert users == ["bob", ME, "alice"]
    assert "worst: job 7001 " in text  # alice's worst job, with its verdict
    assert len(text.splitlines()) <= 3 + 4 * 3  # short enough to mail


def test_by_user_namespace_and_cause(fleet: Fleet) -> None:
    users = fleet.json("--top", "10", "--since", "10m", "--by", "user")
    rows = users["users"]
    assert [u["user"] for u in rows] == ["bob", ME, "alice"]
    alice = rows[2]
    assert alice["job_count"] == 2 and alice["jobs"] == ["7001", "7003"]
    assert alice["worst_job"]["job"] == "7001" and alice["worst_job"]["verdict"] == "starved"
    # Each figure is rounded to 0.1 s on its own: the total within their roundings.
    total = sum(u["lost_gpu_seconds"] for u in rows)
    assert users["lost_gpu_seconds"] == pytest.approx(total, abs=0.05 * (len(rows) + 1))

    causes = fleet.json("--top", "20", "--since", "10m", "--by", "cause")["causes"]
    got = {(c["state"], c["cause"]) for c in causes}
    assert {("sync_stall", "busy_wait"), ("idle", "memory_held")} <= got
    assert any(s == "starved" for s, _ in got)
    top = causes[0]
    assert top["lost_gpu_seconds"] == max(c["lost_gpu_seconds"] for c in causes)

    spaces = fleet.json("--top", "5", "--since", "10m", "--by", "namespace")["namespaces"]
    assert [n["namespace"] for n in spaces] == [None]  # no pods here: one row, no namespace
    assert spaces[0]["job_count"] == 4


def test_a_plain_nodes_job_is_reported_by_the_name_top_gives_it(fleet: Fleet) -> None:
    ident = plain_ident(fleet)
    r = fleet.json("--job", ident, "--last", "10m")
    assert r["job"] == ident and r["verdict"] == "healthy"
    assert r["selector"] == {
        "job_kind": ident.split(":")[0],
        "job_name": fleet.plain,
        "instance": fleet.nodes["f3"],
    }
    assert [n["instance"] for n in r["nodes"]] == [fleet.nodes["f3"]] and r["gpu_count"] == 3
    assert r["user"] == ME and r["lost_by_cause"][0]["cause"] == "memory_held"


def test_since_and_until_take_durations(fleet: Fleet) -> None:
    r = fleet.json("--top", "5", "--since", "10m", "--until", "1s")
    assert r["until"] - r["since"] == pytest.approx(600, abs=5)
    assert abs(r["until"] - time.time()) < 60
    # A range ending before the fleet started holds nothing: status 4, one sentence.
    res = fleet.report("--top", "5", "--since", "3h", "--until", "2h")
    assert res.returncode == 4 and not res.stdout
    assert "has no GPU time of any job between" in one_sentence(res.stderr)
    bad = fleet.report("--top", "5", "--since", "7x")
    assert bad.returncode == 2 and "'7x' is not a time" in bad.stderr


# --------------------------------------------------------------------------- kept reports
def test_kept_reports_feed_the_ranking_each_job_once(fleet: Fleet) -> None:
    store = fleet.tmp / "kept"
    made = fleet.report("--job", "7001", "--last", "10m", "--keep", "--store", str(store))
    assert made.returncode == 0, made.stderr
    kept = json.loads((store / "7001.json").read_text())["report"]
    assert kept["user"] == "alice" and kept["lost_by_cause"]

    # Kept and still in Prometheus: counted once, from the kept report (its whole span).
    both = fleet.json("--top", "10", "--since", "10m", "--store", str(store))
    rows = _rows(both)
    assert [x["job"] for x in rows].count("7001") == 1 and both["job_count"] == 4
    (j7001,) = [x for x in rows if x["job"] == "7001"]
    assert j7001["source"] == "kept" and j7001["judged_from"] == "kept"
    assert j7001["verdict"] == "starved" and j7001["user"] == "alice"
    assert both["sources"]["kept_reports"] == 1

    # Gone from Prometheus (retention): the job still ranks, from its kept report alone.
    empty, url = _empty_prometheus(fleet.tmp)
    try:
        alone = fleet.json("--top", "10", "--since", "1h", "--store", str(store), url=url)
    finally:
        empty.terminate()
        empty.wait(timeout=10)
    (only,) = _rows(alone)
    assert only["job"] == "7001" and only["user"] == "alice" and only["verdict"] == "starved"
    assert only["source"] == "kept" and only["lost_gpu_seconds"] > 0
    assert only["lost_gpu_seconds"] == pytest.approx(
        sum(c["lost_gpu_seconds"] for c in kept["lost_by_cause"]), abs=1
    )


# --------------------------------------------------------------------------- the dashboard
def _fleet_row_targets() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    panels = dash["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and "Fleet" in p["title"])
    out = []
    for p in panels[start + 1 :]:
        if p["type"] == "row":
            break
        out += [(p["title"], t["expr"]) for t in p["targets"]]
    return out


# What each panel of the fleet row shows of its series.
SHOWS = {
    "Top jobs by GPU-hours lost": ("job_kind", "job_name", "user"),
    "Top users by GPU-hours lost": ("user",),
    "GPU-hours lost by cause": ("state",),
    "Top jobs, split by cause (GPU-hours lost)": ("job_kind", "job_name", "user", "state"),
    "Share of each user's GPU time lost": ("user",),
    "GPUs lost, by cause (mean over 5 min)": ("state",),
}


def test_the_dashboards_fleet_row_resolves(fleet: Fleet) -> None:
    """Every query of the fleet row, with the dashboard's range as Grafana fills it, returns
    series with the labels its panel shows."""
    targets = _fleet_row_targets()
    assert {t for t, _ in targets} == set(SHOWS)
    for title, expr in targets:
        res = fleet.query(expr.replace("$__range", "10m"))
        assert res, f"{title}: no series for {expr}"
        for s in res:
            missing = [name for name in SHOWS[title] if not s["metric"].get(name)]
            assert not missing, f"{title}: {s['metric']} lacks {missing}"
    (top,) = [e for t, e in targets if t == "Top jobs by GPU-hours lost"]
    names = [s["metric"]["job_name"] for s in fleet.query(top.replace("$__range", "10m"))]
    assert {"7002", "7001", fleet.plain} <= set(names)
    causes = next(e for t, e in targets if t == "GPU-hours lost by cause")
    got = {(s["metric"]["state"], s["metric"].get("cause")) for s in fleet.query(
        causes.replace("$__range", "10m"))}  # fmt: skip
    assert {("sync_stall", "busy_wait"), ("idle", "memory_held")} <= got
