"""Each job's GPU time and the time it lost, by state and cause, as the daemon counts it.

The daemon's own path (a session with a job table, its ``ServeState`` and the exporter) is
fed labelled synthetic GPUs (gpumon.lab.synth) held by processes of a fake /proc: a
starved job and a job holding memory with no work sharing a node, a straggling job on a
whole node.  What the jobs' counters add up to is checked against their detectors' own
count of lost GPU-seconds, and what the exposition says against the labels.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from prometheus_client import generate_latest
from test_jobs_any_node import FakeProc, P, proc  # noqa: F401  (proc: the fixture)

from gpumon.engine import Polled, Reading, Session
from gpumon.engine.jobs import JobTime
from gpumon.faces.serve.collector import make_registry
from gpumon.faces.serve.config import ServeConfig
from gpumon.faces.serve.daemon import ServeState, job_options
from gpumon.faces.serve.log import EventLog
from gpumon.lab.synth import SynthTrace, generate
from gpumon.model import Cause, GpuIdentity, GpuProcess, Reason, Snapshot, State, TraceHeader
from gpumon.sample.containers import ContainerNames
from gpumon.sample.joblabels import JobResolver

ROOT = "0::/\n"  # a process nobody placed (the Slurm job is said by its environment)


def slurm(pid: int, job: str, user: str) -> P:
    env = f"SLURM_JOB_ID={job}\0SLURM_JOB_USER={user}\0".encode()
    return P(pid, "python", 1, ROOT, ("python", "train.py"), session=pid, environ=env)


def daemon(procfs: FakeProc, gpus: int, linger_s: float = 60.0) -> ServeState:
    cfg = ServeConfig(process_trees=False, job_linger_s=linger_s)
    ids = tuple(GpuIdentity(i, f"GPU-{i}") for i in range(gpus))
    session = Session.offline(
        TraceHeader(1, "gpumon", gpus=ids),
        live=True,
        jobs=job_options(cfg),
        resolver=JobResolver(
            procfs=str(procfs.root), pod_resources=None, containers=ContainerNames((), ())
        ),
    )
    return ServeState(session, cfg, EventLog(None))


def feed(state: ServeState, snap: Snapshot) -> None:
    reading = state.session.read(snap)
    state.ingest(Reading(Polled(reading.polled.due, snap, 0.001), reading.jobs))


def merged(parts: list[tuple[SynthTrace, int, int]], i: int) -> Snapshot:
    """Tick ``i`` of several traces side by side: each trace's GPU ``k`` becomes this
    node's GPU ``first + k``, held by ``pid``."""
    gpus = []
    first = 0
    for trace, pid, _ in parts:
        snap = trace.snapshots[i]
        for g in snap.gpus:
            procs = () if g.processes == () else (GpuProcess(pid, g.mem_used_bytes),)
            gpus.append(replace(g, gpu=first + g.gpu, uuid=f"GPU-{first + g.gpu}",
                                t_s=parts[0][0].snapshots[i].t_s, processes=procs))  # fmt: skip
        first += len(snap.gpus)
    base = parts[0][0].snapshots[i]
    return Snapshot(base.t_s, tuple(gpus), base.host, None)


def exposition(state: ServeState) -> str:
    return generate_latest(make_registry(state)).decode()  # type: ignore[arg-type]


def samples(text: str, name: str) -> dict[tuple[str, str, str], float]:
    """(job_name, state, cause) -> value of ``name``'s series."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            out[(labels["job_name"], labels["state"], labels["cause"])] = float(line.split()[-1])
    return out


def by_job(state: ServeState) -> dict[str, JobTime]:
    return {j.labels.hpc_job: j.time for j in state.jobs.values()}


def test_jobs_sharing_a_node_count_their_own_lost_time_by_cause(proc: FakeProc) -> None:  # noqa: F811
    proc.add(slurm(7001, "7001", "alice"), slurm(7002, "7002", "bob"))
    starved = generate("starved_cpu", 1, gpus=1, period_s=0.25, duration_s=300)
    held = generate("idle_mem", 2, gpus=1, period_s=0.25, duration_s=300)
    parts = [(starved, 7001, 0), (held, 7002, 1)]
    state = daemon(proc, gpus=2)
    n = min(len(starved.snapshots), len(held.snapshots))
    seen: dict[tuple[str, str, str], float] = {}
    for i in range(n):
        feed(state, merged(parts, i))
        if i % 50 == 0:  # counters: no series ever goes down between scrapes
            now = samples(exposition(state), "gpumon_job_lost_gpu_seconds_total")
            assert all(now[k] >= v for k, v in seen.items() if k in now)
            assert seen.keys() <= now.keys()
            seen = now
    jobs = {j.labels.hpc_job: j for j in state.jobs.values()}
    a, b = jobs["7001"], jobs["7002"]
    assert a.detector is not None and b.detector is not None  # two jobs: one detector each
    elapsed = starved.snapshots[n - 1].t_s - starved.snapshots[0].t_s
    for job in (a, b):
        # Every tick but the first is counted, once per GPU.
        assert sum(job.time.seconds.values()) == pytest.approx(elapsed, abs=2.0)
        # The time lost is the job's detector's count (but the first tick's).
        assert sum(job.time.lost.values()) == pytest.approx(
            job.detector.lost_gpu_seconds(),
            abs=1.5,  # type: ignore[union-attr]
        )
    # The starved job lost most of its time starved, under the cause its detector named.
    a_lost = a.time.lost
    starved_lost = sum(v for (s, _), v in a_lost.items() if s is State.STARVED)
    assert starved_lost >= 0.8 * sum(a_lost.values()) > 0.3 * elapsed
    assert {c for (s, c) in a_lost if s is State.STARVED} <= set(Cause)
    # The job holding memory with no work lost all of it: starting up until the detector
    # gave up waiting for work (startup_max_s), then memory held.
    b_lost = b.time.lost
    assert sum(b_lost.values()) == pytest.approx(elapsed, rel=0.05)
    assert b_lost[(State.IDLE, Reason.MEMORY_HELD)] >= 0.4 * elapsed
    assert set(b_lost) <= {(State.IDLE, Reason.START_UP), (State.IDLE, Reason.MEMORY_HELD)}

    text = exposition(state)
    lost = samples(text, "gpumon_job_lost_gpu_seconds_total")
    spent = samples(text, "gpumon_job_gpu_seconds_total")
    assert lost.keys() == spent.keys()
    assert lost[("7002", "idle", "memory_held")] == pytest.approx(
        b_lost[(State.IDLE, Reason.MEMORY_HELD)]
    )
    assert ("7002", "idle", "start_up") in lost
    assert all(lost[k] <= spent[k] + 1e-6 for k in lost)  # lost time is time spent
    line = next(
        ln for ln in text.splitlines() if ln.startswith("gpumon_job_lost_gpu_seconds_total{")
    )
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    assert set(labels) == {"hpc_job", "pod", "namespace", "job_kind", "job_name", "user",
                           "command", "state", "cause"}  # fmt: skip
    rows = [ln for ln in text.splitlines() if ln.startswith("gpumon_job_lost_gpu_seconds_total{")]
    users = {dict(re.findall(r'(\w+)="([^"]*)"', ln))["user"] for ln in rows}
    assert users == {"alice", "bob"}


def test_a_job_on_every_gpu_counts_the_nodes_detector_and_its_straggler(proc: FakeProc) -> None:  # noqa: F811
    """A job holding every GPU is judged by the node's detector: its lost time is that
    detector's, split into the straggler's own waits and its peers' busy-waiting."""
    proc.add(slurm(7003, "7003", "carol"))
    trace = generate("straggler", 3, gpus=4, period_s=0.25, duration_s=360)
    state = daemon(proc, gpus=4)
    for i in range(len(trace.snapshots)):
        feed(state, merged([(trace, 7003, 0)], i))
    (job,) = state.jobs.values()
    assert job.detector is None
    lost = job.time.lost
    assert sum(lost.values()) == pytest.approx(state.session.lost_gpu_seconds(), abs=4 * 1.5)
    stall = {c for (s, c), v in lost.items() if s is State.SYNC_STALL and v > 0}
    assert Reason.BUSY_WAIT in stall, lost
    busy_wait = lost[(State.SYNC_STALL, Reason.BUSY_WAIT)]
    assert busy_wait >= 0.5 * sum(v for (s, _), v in lost.items() if s is State.SYNC_STALL)


def test_a_job_that_leaves_takes_its_series_and_starts_again_from_zero(proc: FakeProc) -> None:  # noqa: F811
    proc.add(slurm(7004, "7004", "dave"))
    trace = generate("healthy", 4, gpus=1, period_s=0.25, duration_s=120)
    state = daemon(proc, gpus=1, linger_s=5.0)
    snaps = [merged([(trace, 7004, 0)], i) for i in range(len(trace.snapshots))]
    for snap in snaps[:60]:
        feed(state, snap)
    before = sum(by_job(state)["7004"].seconds.values())
    assert before > 50
    # Its process leaves the GPU: the job lingers (counted no more), then goes.
    t = snaps[59].t_s
    for k in range(1, 10):
        gone = Snapshot(t + k, tuple(replace(g, t_s=t + k, processes=()) for g in snaps[59].gpus))
        feed(state, gone)
        if k < 5:
            assert sum(by_job(state)["7004"].seconds.values()) == before
    assert not state.jobs
    assert "gpumon_job_lost_gpu_seconds_total{" not in exposition(state)
    # Back on the GPU: a new job entry whose counters start again (a reset to Prometheus).
    for snap in snaps[60:]:
        feed(state, replace(snap, t_s=snap.t_s + 10,
                            gpus=tuple(replace(g, t_s=g.t_s + 10) for g in snap.gpus)))  # fmt: skip
    again = sum(by_job(state)["7004"].seconds.values())
    assert again == pytest.approx(snaps[-1].t_s - snaps[60].t_s, abs=2.0)
