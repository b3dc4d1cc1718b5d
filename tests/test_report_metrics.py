"""gpumon.detect.from_metrics on data: exported readings back to the one run summary, and
the cross-node straggler rule."""

from __future__ import annotations

import pytest

from gpumon.detect.from_metrics import (
    GpuReadings,
    judge_gpu,
    judge_job,
    merge,
    straggler_node,
    tally_of,
)
from gpumon.detect.summary import run_verdict
from gpumon.engine.words import speedup_sentence
from gpumon.model import Cause, Reason, State

T = 100.0  # seconds of the job on every GPU


def gpu(
    instance: str,
    index: int,
    state: State,
    util: float,
    *,
    idle_s: float = 0.0,
    cause: Cause | None = None,
    straggler: float = 0.0,
    seconds: dict[State, float] | None = None,
) -> GpuReadings:
    """One GPU that spent ``T`` seconds in ``state`` at utilisation ``util`` (after
    ``idle_s`` of idle start-up)."""
    secs = seconds or {state: T, State.IDLE: idle_s}
    cov = sum(secs.values())
    by_state = {s: (util * v / cov if s is state else 0.0) for s, v in secs.items()}
    return GpuReadings(
        instance=instance,
        gpu=index,
        uuid=f"GPU-{instance}-{index}",
        seconds=secs,
        cause_samples={cause: 50.0} if cause else {},
        straggler_share=straggler,
        lost_share=0.0,
        util_by_state=by_state,
        duty=sum(by_state.values()),
        samples=int(cov),
        evidence={
            "mem_headroom_ratio": 0.6,
            "mem_used_bytes": 32 << 30,
            "mem_total_bytes": 80 << 30,
        },
    )


# --------------------------------------------------------------------------- one GPU
def test_a_gpus_tally_splits_starved_time_by_the_causes_seen() -> None:
    r = GpuReadings(
        "n1",
        0,
        "GPU-a",
        {State.STARVED: 80.0, State.HEALTHY: 20.0},
        cause_samples={Cause.CPU: 30.0, Cause.IO: 10.0},
    )
    t = tally_of(r)
    assert t.seconds[State.STARVED] == 80.0 and t.seconds[State.SYNC_STALL] == 0.0
    assert t.starved_by_cause == pytest.approx({Cause.CPU: 60.0, Cause.IO: 20.0})
    assert t.verdict() == (State.STARVED, Cause.CPU)
    # Starved without any cause reading: the cause is unknown, as the detector says it.
    bare = tally_of(GpuReadings("n1", 0, "GPU-a", {State.STARVED: 80.0}))
    assert bare.starved_by_cause == {Cause.UNKNOWN: 80.0}


def test_straggler_and_lost_marks_become_the_detectors_reasons() -> None:
    r = GpuReadings(
        "n1",
        1,
        "GPU-b",
        {State.SYNC_STALL: 60.0, State.UNKNOWN: 40.0},
        straggler_share=0.5,  # half the scrapes: 50 s, within its 60 s of stall
        lost_share=0.3,
    )
    t = tally_of(r)
    assert t.reason_s(State.SYNC_STALL, Reason.STRAGGLER) == pytest.approx(50.0)
    assert t.reason_s(State.UNKNOWN, Reason.GPU_LOST) == pytest.approx(30.0)
    assert t.main_reason(State.SYNC_STALL) == (Reason.STRAGGLER, "its peers busy-wait on it")


def test_busy_waiting_is_lost_time_and_no_work() -> None:
    starved = judge_gpu(gpu("n1", 0, State.STARVED, 0.3), 0)
    assert starved.facts.busy_s == pytest.approx(30.0)
    assert starved.facts.work_busy_s == pytest.approx(30.0)
    assert starved.lost_gpu_seconds == pytest.approx(70.0)
    spinning = judge_gpu(gpu("n3", 0, State.SYNC_STALL, 1.0), 0)
    assert spinning.facts.busy_s == pytest.approx(100.0)  # reads busy ...
    assert spinning.facts.work_busy_s == 0.0  # ... computes nothing
    assert spinning.lost_gpu_seconds == pytest.approx(100.0)
    healthy = judge_gpu(gpu("n2", 0, State.HEALTHY, 1.0), 0)
    assert healthy.lost_gpu_seconds == 0.0 and healthy.advice == ()


def test_no_utilisation_reading_is_no_duty_cycle_not_zero() -> None:
    r = GpuReadings("n1", 0, "GPU-a", {State.UNKNOWN: 100.0})
    j = judge_job([r])
    assert j.summary.duty_cycle is None and j.summary.effective_gpus is None
    assert j.summary.verdict is State.UNKNOWN and j.summary.speedup_if_fed is None


# --------------------------------------------------------------------------- the job
def test_one_starved_node_one_healthy_is_starved_and_names_the_node() -> None:
    gpus = [gpu("n1", i, State.STARVED, 0.3, cause=Cause.CPU, idle_s=10) for i in range(2)]
    gpus += [gpu("n2", i, State.HEALTHY, 1.0, idle_s=10) for i in range(2)]
    j = judge_job(gpus)
    s = j.summary
    assert (s.verdict, s.cause) == (State.STARVED, Cause.CPU)
    assert j.problem_nodes == ("n1",) and j.straggler is None
    assert {n.instance: n.summary.verdict for n in j.nodes} == {
        "n1": State.STARVED,
        "n2": State.HEALTHY,
    }
    # GPUs of work while working (100 s each; the 10 s of idle are no working time).
    assert s.effective_gpus == pytest.approx(0.3 * 2 + 1.0 * 2, abs=0.01)
    assert s.lost_gpu_seconds == pytest.approx(2 * (70 + 10) + 2 * 10)
    # 260 busy of 400 working GPU-seconds: up to 1.5x faster, said as analyze says it.
    assert s.speedup_if_fed == pytest.approx(400 / 260, abs=0.01)
    assert speedup_sentence(s) == (
        "fixing the input pipeline could make this run up to 1.5x faster (its GPUs computed "
        "65 % of their working time)"
    )
    assert s.advice[0].text.startswith("data-loading workers are CPU-saturated during the gaps")
    # The node's GPUs keep their own index within it.
    assert [g.gpu for g in j.nodes[0].summary.gpus] == [0, 1]


def test_a_straggler_node_whose_peers_busy_wait_makes_the_job_a_sync_stall() -> None:
    slow = [gpu("n1", i, State.STARVED, 0.3, cause=Cause.IO) for i in (2, 3)]
    waiting = [gpu(n, i, State.SYNC_STALL, 1.0) for n in ("n3", "n4") for i in range(2)]
    j = judge_job([*slow, *waiting])
    s = j.summary
    assert s.verdict is State.SYNC_STALL and s.cause is None
    st = j.straggler
    assert st is not None and (st.kind, st.instance, st.gpu) == ("node", "n1", None)
    assert (st.state, st.cause) == (State.STARVED, Cause.IO)
    assert st.skew == pytest.approx(1.0) and st.peers_wait == pytest.approx(1.0)
    assert j.problem_nodes == ("n1",)
    # Node n1 alone is starved; in the job's view its starved time is what the others wait on.
    n1 = next(n for n in j.nodes if n.instance == "n1")
    assert n1.summary.verdict is State.STARVED
    assert s.seconds[State.STARVED] == 0.0 and s.seconds[State.SYNC_STALL] == pytest.approx(600)
    assert s.advice[0].text.startswith("node n1 is the straggler: its GPUs are starved (cause: io)")
    assert "n3, n4 busy-wait on it" in s.advice[0].text
    assert any("storage does not keep up" in a.text for a in s.advice[1:])
    assert not any(a.text.startswith("one rank is the straggler") for a in s.advice)
    # Only n1 computed (0.3 of 200 of 600 working GPU-seconds): removing the waits is worth
    # up to 10x, with the same sentence analyze prints.
    assert s.speedup_if_fed == pytest.approx(10.0)
    assert speedup_sentence(s).startswith("removing the waits on peers could make this run up to")


@pytest.mark.parametrize(
    "peers, straggler, why",
    [
        ([State.HEALTHY], [State.STARVED, State.STARVED], "the peers do not wait"),
        ([State.SYNC_STALL], [State.STARVED, State.HEALTHY], "one of its GPUs works"),
        ([State.SYNC_STALL], [State.SYNC_STALL, State.SYNC_STALL], "no skew: all wait"),
    ],
)
def test_no_straggler_node_unless_every_gpu_of_it_is_slow_while_the_others_wait(
    peers: list[State], straggler: list[State], why: str
) -> None:
    gpus = [gpu("n1", i, st, 0.3) for i, st in enumerate(straggler)]
    gpus += [gpu("n2", i, st, 1.0) for i, st in enumerate(peers)]
    nodes = {n: [tally_of(g) for g in gpus if g.instance == n] for n in ("n1", "n2")}
    assert straggler_node(nodes) is None, why


def test_a_one_node_job_has_no_straggler_node() -> None:
    gpus = [gpu("n1", 0, State.STARVED, 0.3), gpu("n1", 1, State.SYNC_STALL, 1.0)]
    assert straggler_node({"n1": [tally_of(g) for g in gpus]}) is None


def test_peers_waiting_less_than_half_their_time_name_no_straggler_node() -> None:
    secs = {State.SYNC_STALL: 40.0, State.HEALTHY: 60.0}
    peers = [gpu("n2", 0, State.SYNC_STALL, 1.0, seconds=secs)]
    nodes = {"n1": [tally_of(gpu("n1", 0, State.STARVED, 0.3))], "n2": [tally_of(g) for g in peers]}
    assert straggler_node(nodes) is None


def test_a_straggler_gpu_marked_by_its_node_is_the_jobs_straggler() -> None:
    marked = gpu("n3", 1, State.SYNC_STALL, 0.4, straggler=1.0)
    peers = [gpu("n3", 0, State.SYNC_STALL, 1.0), gpu("n4", 0, State.SYNC_STALL, 1.0)]
    j = judge_job([marked, *peers])
    assert j.summary.verdict is State.SYNC_STALL
    st = j.straggler
    assert st is not None and (st.kind, st.instance, st.gpu) == ("gpu", "n3", 1)
    assert st.own_wait == 0.0 and st.skew == pytest.approx(1.0)
    assert st.name() == "GPU 1 of n3"


def test_merged_tallies_judge_as_the_sum_of_their_gpu_seconds() -> None:
    a = tally_of(gpu("n1", 0, State.STARVED, 0.3, cause=Cause.GIL))
    b = tally_of(gpu("n1", 1, State.HEALTHY, 1.0))
    m = merge([a, b])
    assert m.seconds[State.STARVED] == T and m.seconds[State.HEALTHY] == T
    assert m.verdict() == run_verdict(m.seconds, m.starved_by_cause) == (State.STARVED, Cause.GIL)


def test_busy_time_per_state_follows_the_gauges_not_the_backdated_counters() -> None:
    """The counters give the first 10 s of work to healthy (backdated); the gauges still
    said idle then, while the GPU was busy.  Mean utilisation per gauge state, times the
    counters' seconds, keeps a healthy GPU at 1.0."""
    r = GpuReadings(
        "n2",
        0,
        "GPU-a",
        {State.HEALTHY: 100.0, State.IDLE: 0.0},
        util_by_state={State.HEALTHY: 0.9, State.IDLE: 0.1},
        state_share={State.HEALTHY: 0.9, State.IDLE: 0.1},
        duty=1.0,
    )
    j = judge_job([r])
    assert j.summary.speedup_if_fed == 1.0 and j.summary.work_duty_cycle == 1.0
    flat = judge_job([GpuReadings(**{**_fields(r), "state_share": None})])
    assert flat.summary.work_duty_cycle == pytest.approx(0.9)  # what mixing them would say


def _fields(r: GpuReadings) -> dict:
    return {f: getattr(r, f) for f in GpuReadings.__slots__}
