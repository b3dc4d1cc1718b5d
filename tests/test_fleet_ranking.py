"""The fleet ranking's rules on data alone: each job once, kept reports beside Prometheus,
groups by user, namespace and cause, the node's time as the judge's readings, and the
options that ask for it."""

from __future__ import annotations

import argparse

import pytest
from test_cli import gpumon, one_sentence

from gpumon.engine import judge_job
from gpumon.faces.report.command import parse_time
from gpumon.faces.report.fleet import JobTotals, NodeTime, coverage, job_of, readings
from gpumon.faces.report.kept import Kept
from gpumon.faces.report.queries import JobSelector
from gpumon.faces.report.ranking import (
    Ranking,
    count,
    gpu_time,
    judged_from,
    rank,
    render_text,
    to_json,
)

HOUR = 3600.0


def totals(job: JobSelector, user: str, **lost: float) -> JobTotals:
    """A job's lost time by ``state__cause`` (GPU-hours), used time twice that."""
    got = {tuple(k.split("__")) if "__" in k else (k, ""): v * HOUR for k, v in lost.items()}
    return JobTotals(job, user, dict(got), {w: 2 * v for w, v in got.items()})  # type: ignore[misc]


def kept(job: str, start: float, end: float, user: str = "alice", lost: float = 3.0) -> Kept:
    report = {
        "job": job,
        "user": user,
        "start": start,
        "end": end,
        "verdict": "starved",
        "cause": "io",
        "lost_gpu_seconds": lost * HOUR,
        "lost_by_cause": [{"state": "starved", "cause": "io", "lost_gpu_seconds": lost * HOUR}],
        "seconds": {"starved": 4 * lost * HOUR, "healthy": 0.0},
        "gpu_count": 8,
        "speedup_if_fed": 2.5,
        "advice": ["read the data from local disk"],
        "nodes": [{"instance": "n1:9977"}, {"instance": "n2:9977"}],
        "straggler": None,
    }
    return Kept(job, end + 20, "http://prometheus:9090", "text", report, f"/kept/{job}.json")


SLURM = JobSelector(hpc_job="81423")
POD = JobSelector(namespace="ml", pod="train-0")
PROC = JobSelector(job_kind="process", job_name="4242", instance="n3:9977")
WEEK = (0.0, 7 * 24 * HOUR)


def test_each_job_counts_once_from_prometheus_or_its_kept_report() -> None:
    since, until = WEEK
    prom = [totals(SLURM, "alice", starved__cpu=5.0), totals(PROC, "bob", idle__memory_held=2.0)]
    gone = kept("70001", HOUR, 2 * HOUR, user="carol", lost=4.0)  # series gone: kept only
    both = kept("81423", 3 * HOUR, 5 * HOUR, lost=6.0)  # within the range: kept, whole
    old = kept("60000", -10 * HOUR, -5 * HOUR)  # ended before the range: not counted
    counted = {c.totals.job.ident(): c for c in count(prom, [gone, both, old], since, until)}
    assert set(counted) == {"81423", "70001", "process:4242@n3:9977"}
    assert counted["81423"].source == "kept" and counted["81423"].totals.lost_s == 6.0 * HOUR
    assert counted["70001"].totals.user == "carol"
    assert counted["process:4242@n3:9977"].source == "prometheus"


def test_a_kept_job_partly_in_the_range_counts_its_share_unless_prometheus_has_it() -> None:
    since, until = WEEK
    straddles = kept("70002", -HOUR, HOUR, lost=4.0)  # half in the range
    (c,) = count([], [straddles], since, until)
    assert c.totals.lost_s == pytest.approx(2.0 * HOUR)
    prom = totals(JobSelector(hpc_job="70002"), "alice", starved__io=1.0)
    (c,) = count([prom], [straddles], since, until)
    assert c.source == "prometheus" and c.totals.lost_s == 1.0 * HOUR


def test_a_kept_report_made_before_the_job_counters_still_counts() -> None:
    k = kept("70003", HOUR, 2 * HOUR)
    del k.report["lost_by_cause"]
    (c,) = count([], [k], *WEEK)
    assert c.totals.lost == {("starved", "io"): 3.0 * HOUR}


def test_the_records_count_whole_intervals_within_the_range_the_counters_its_ends() -> None:
    # Records every 300 s, the newest at 1000 s; the range [290, 1100]: the records at 700
    # and 1000 (intervals 400-700, 700-1000) lie inside it; 290-400 and 1000-1100 do not.
    cov = coverage(290.0, 1100.0, newest=1000.0, every=300.0)
    assert (cov.records, cov.count) == ((400.0, 1000.0), 2)
    assert cov.counters == ((290.0, 400.0), (1000.0, 1100.0))
    # A range that starts on a record's interval and ends on a record: no ends to count.
    cov = coverage(400.0, 1000.0, newest=1000.0, every=300.0)
    assert (cov.records, cov.count, cov.counters) == ((400.0, 1000.0), 2, ())
    # No record interval fits (a range shorter than one, or no interval known yet): the
    # counters count it all.
    for newest, every in ((1000.0, 900.0), (1000.0, None), (None, 300.0), (1200.0, 300.0)):
        cov = coverage(290.0, 1100.0, newest=newest, every=every)
        assert (cov.records, cov.counters) == (None, ((290.0, 1100.0),)), (newest, every)


def test_rows_by_job_user_namespace_and_cause() -> None:
    jobs = count(
        [
            totals(SLURM, "alice", starved__cpu=5.0, idle__start_up=1.0),
            totals(POD, "ml", sync_stall__busy_wait=3.0),
            totals(PROC, "alice", idle__memory_held=2.0),
        ],
        [],
        *WEEK,
    )
    assert [e.key for e in rank(jobs, "job")] == ["81423", "ml/train-0", "process:4242@n3:9977"]
    users = rank(jobs, "user")
    assert [(e.key, e.lost_s / HOUR, len(e.jobs)) for e in users] == [
        ("alice", 8.0, 2),
        ("ml", 3.0, 1),
    ]
    assert users[0].worst.totals.job == SLURM
    spaces = rank(jobs, "namespace")
    assert [(e.key, e.lost_s / HOUR) for e in spaces] == [("", 8.0), ("ml", 3.0)]
    causes = rank(jobs, "cause")
    assert [(e.key, e.lost_s / HOUR) for e in causes] == [
        ("starved/cpu", 5.0),
        ("sync_stall/busy_wait", 3.0),
        ("idle/memory_held", 2.0),
        ("idle/start_up", 1.0),
    ]


def test_a_series_names_its_job_on_any_node() -> None:
    assert job_of({"hpc_job": "1", "instance": "n1"}) == JobSelector(hpc_job="1")
    assert job_of({"pod": "p", "namespace": "ns", "job_kind": "pod", "instance": "n1"}) == (
        JobSelector(namespace="ns", pod="p")
    )
    assert job_of({"job_kind": "unit", "job_name": "t.service", "instance": "n1"}) == (
        JobSelector(job_kind="unit", job_name="t.service", instance="n1")
    )
    assert job_of({"instance": "n1"}) is None
    # --job takes what --top names a job.
    assert JobSelector.parse(PROC.ident()) == PROC
    assert JobSelector.parse("81423") == SLURM
    assert PROC.matchers() == 'job_kind="process",job_name="4242",instance="n3:9977"'
    assert PROC.describe() == "process 4242 on n3:9977"


def test_a_nodes_time_becomes_the_judges_readings() -> None:
    """Job on two nodes: one starved (its GPUs compute 20 % of the time), the other's two
    GPUs busy-wait on it; the judge names the straggler node."""
    starved = NodeTime(
        "n1", 2, {("starved", "io"): 200.0}, {("starved", "io"): 160.0}
    )  # fmt: skip
    waiting = NodeTime(
        "n2", 2, {("sync_stall", "busy_wait"): 200.0}, {("sync_stall", "busy_wait"): 200.0}
    )
    got = readings([starved, waiting])
    assert len(got) == 4 and {r.instance for r in got} == {"n1", "n2"}
    assert sum(sum(r.seconds.values()) for r in got) == pytest.approx(400.0)
    j = judge_job(got)
    assert j.summary.verdict.value == "sync_stall"
    assert j.straggler is not None and j.straggler.instance == "n1" and j.straggler.gpu is None
    lost = {("starved", "io"): 160.0, ("sync_stall", "busy_wait"): 200.0}
    job = JobSelector(hpc_job="9")
    judged = judged_from(job, j, [starved, waiting], lost)
    assert (judged.verdict, judged.cause, judged.straggler) == ("sync_stall", "straggler", "n1")
    assert judged.gpus == 4 and judged.nodes == ("n1", "n2")


def test_the_json_lists_jobs_and_the_text_says_gpu_time_as_people_count_it() -> None:
    jobs = count([totals(SLURM, "alice", starved__cpu=5.0)], [kept("70001", 1, 2)], *WEEK)
    rows = rank(jobs, "job")
    r = Ranking("job", *WEEK, "http://p:9090", rows, 8 * HOUR, 16 * HOUR, 2, 2, "raw series", 1)
    doc = to_json(r)
    assert [x["job"] for x in doc["jobs"]] == ["81423", "70001"]
    first = doc["jobs"][0]
    assert {"job", "user", "lost_gpu_seconds", "verdict", "cause"} <= set(first)
    assert first["lost_gpu_seconds"] == 5 * HOUR and first["gpu_hours_lost"] == 5.0
    assert doc["jobs"][1]["source"] == "kept"
    assert doc["sources"] == {"lost_time": "raw series", "kept_reports": 1}
    text = render_text(r)
    assert "8.0 GPU-h lost of 16.0 GPU-h (50 %) in 2 job(s), 1 from kept reports" in text
    assert gpu_time(40) == "40 GPU-s" and gpu_time(600) == "10 GPU-min"
    assert gpu_time(5 * HOUR) == "5.0 GPU-h" and gpu_time(312 * HOUR) == "312 GPU-h"


def test_since_and_until_take_durations_as_prometheus_users_type_them() -> None:
    assert parse_time("7d", now=1e9) == 1e9 - 7 * 86400
    assert parse_time("2m", now=1e9) == 1e9 - 120
    assert parse_time("1h30m", now=1e9) == 1e9 - 5400
    assert parse_time("1714564800", now=1e9) == 1714564800.0  # digits: Unix seconds
    with pytest.raises(argparse.ArgumentTypeError, match="before 1970"):
        parse_time("100y", now=1e9)


def test_options_that_need_top_or_a_job_are_refused_in_one_sentence() -> None:
    res = gpumon(None, "report", "--prometheus", "http://127.0.0.1:1", "--job", "1", "--by", "user")
    assert res.returncode == 2
    assert one_sentence(res.stderr) == "gpumon: --by ranks --top N: give --top"
    res = gpumon(None, "report", "--prometheus", "http://127.0.0.1:1", "--top", "5", "--keep")
    assert res.returncode == 2 and "--keep keeps one job's report" in res.stderr
    res = gpumon(None, "report", "--prometheus", "http://127.0.0.1:1", "--top", "0")
    assert res.returncode == 2 and "'0' is not a number of rows from 1 to 1000" in res.stderr
    res = gpumon(None, "report", "--prometheus", "http://127.0.0.1:1", "--top", "3", "--job", "1")
    assert res.returncode == 2 and "not allowed with argument" in res.stderr
