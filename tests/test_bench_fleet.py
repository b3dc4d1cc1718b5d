"""The fleet benchmark's cluster, backfilled into a real Prometheus by promtool, read back
by the real `gpumon report`: the ranking is the generator's (order, users, GPU-seconds
lost, verdict and cause of each kind of job), so the benchmark times reports that are
right; and a Prometheus given only the fleet's recorded series -- what a global store fed
by federation or remote-write of the records alone holds (docs/report.md, "Past one
Prometheus") -- still ranks every job with its user and lost time, and says it cannot
judge them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import one_sentence

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_fleet as bf  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, bf.Scale]]:
    for tool in ("promtool", "prometheus"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (apt-get install prometheus)")
    tmp = tmp_path_factory.mktemp("fleet-bench")
    end = int(time.time())
    # One job of each kind, back to back on the same 3 nodes, 2 hours each.
    cluster = bf.make_cluster(3, 1, 5, 10 / 24, 120, end, kinds=bf.KINDS)
    scales = {
        "all": bf.Scale("all", cluster, tmp / "all"),
        "records": bf.Scale("records", cluster, tmp / "records", records_only=True),
    }
    try:
        for s in scales.values():
            bf.generate(s)
            bf.start_prometheus(s)
        yield scales
    finally:
        for s in scales.values():
            if s.proc is not None:
                s.proc.terminate()
                s.proc.wait(timeout=60)


def _report(s: bf.Scale, *args: str) -> subprocess.CompletedProcess[str]:
    c = s.cluster
    cmd = [sys.executable, "-m", "gpumon", "report", "--prometheus", s.url,
           "--since", str(c.t0), "--until", str(c.t1), *args]  # fmt: skip
    env = {**os.environ, "GPUMON_REPORT_STORE": str(s.here / "no-kept-reports")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def _top(s: bf.Scale) -> dict:
    res = _report(s, "--top", "10", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _by_kind(s: bf.Scale) -> dict[str, bf.Job]:
    return {j.kind: j for j in s.cluster.jobs}


def test_the_ranking_is_the_generators(backfilled: dict[str, bf.Scale]) -> None:
    s = backfilled["all"]
    truth = s.cluster.truth()
    rows = _top(s)["jobs"]
    assert [r["job"] for r in rows] == sorted(truth, key=lambda j: (-truth[j][2], j))
    for r in rows:
        user, _kind, lost, _used = truth[r["job"]]
        assert r["user"] == user
        assert r["lost_gpu_seconds"] == pytest.approx(lost, abs=1)
    got = {r["job"]: r for r in rows}
    kinds = _by_kind(s)
    starved = got[kinds["starved"].ident]
    assert (starved["verdict"], starved["cause"]) == (
        "starved",
        kinds["starved"].phases[0][0].cause,
    )
    strag = got[kinds["straggling"].ident]
    assert (strag["verdict"], strag["cause"]) == ("sync_stall", "straggler")
    assert strag["straggler_node"] == bf.instance(0) and strag["gpus"] == 24
    hung = got[kinds["hung"].ident]
    assert (hung["verdict"], hung["cause"]) == ("sync_stall", "hang")
    # Worked, then held its memory with no work: healthy while working, its loss idle.
    idle = got[kinds["idle"].ident]
    assert idle["verdict"] == "healthy"
    assert (idle["lost_to"]["state"], idle["lost_to"]["cause"]) == ("idle", "memory_held")
    assert got[kinds["healthy"].ident]["lost_gpu_seconds"] == 0


def test_report_job_judges_the_straggling_job(backfilled: dict[str, bf.Scale]) -> None:
    s = backfilled["all"]
    job = _by_kind(s)["straggling"]
    res = _report(s, "--job", job.ident, "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["verdict"] == "sync_stall" and r["gpu_count"] == 24
    assert r["user"] == job.user


def test_only_the_recorded_series_still_rank_every_job(backfilled: dict[str, bf.Scale]) -> None:
    """A store holding the fleet records alone (raw series absent): the same ranking,
    users and lost time; no verdict, since judging reads each job's per-node counters."""
    full, recs = _top(backfilled["all"]), _top(backfilled["records"])
    assert recs["sources"]["lost_time"] == "recording rule"
    assert [r["job"] for r in recs["jobs"]] == [r["job"] for r in full["jobs"]]
    for a, b in zip(full["jobs"], recs["jobs"], strict=True):
        assert b["user"] == a["user"] and b["lost_to"] == a["lost_to"]
        assert b["lost_gpu_seconds"] == pytest.approx(a["lost_gpu_seconds"], abs=1e-6)
        assert b["verdict"] is None and b.get("nodes") is None
    users = _report(backfilled["records"], "--top", "5", "--by", "user", "--json")
    assert users.returncode == 0, users.stderr
    want = {}
    for user, _k, lost, _u in backfilled["records"].cluster.truth().values():
        want[user] = want.get(user, 0.0) + lost
    got = {u["user"]: u["lost_gpu_seconds"] for u in json.loads(users.stdout)["users"]}
    assert got == pytest.approx(want, abs=1)
    # report --job there says why it cannot judge: the store holds the records alone.
    job = _by_kind(backfilled["records"])["straggling"]
    res = _report(backfilled["records"], "--job", job.ident)
    assert res.returncode == 4 and not res.stdout
    msg = one_sentence(res.stderr)
    assert "holds only gpumon's recorded series of job " + job.ident in msg, msg
    assert "job_user_cause:gpumon_job_gpu_seconds:increase5m" in msg
