"""Advice is a value that carries its lever: summaries group it, and the job's view across
nodes replaces its peers' vague advice, by that lever -- never by the words.  Rewording
every sentence changes what people read and nothing else."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpumon.detect import advice
from gpumon.detect.advice import advice_for, straggler_node_advice
from gpumon.detect.from_metrics import GpuReadings, judge_job
from gpumon.engine import analyze
from gpumon.lab.synth import Phase, generate
from gpumon.model import Advice, Cause, Evidence, Lever, Reason, State

T = 100.0  # seconds of the job on every GPU

# Evidence that, across every state, cause and reason, reaches every wording.
EVIDENCE: tuple[Evidence, ...] = (
    {},
    {"workers": 8.0, "workers_cpu_pct": 99.0, "duty_cycle": 0.4, "cpu_count": 16,
     "host_cpu_pct": 60.0, "mem_headroom_ratio": 0.6, "mem_used_bytes": 8 << 30,
     "mem_total_bytes": 24 << 30, "straggler_gpu": 2},
    {"workers": 8.0, "workers_cpu_pct": 99.0, "duty_cycle": 0.4, "cpu_count": 8,
     "host_cpu_pct": 100.0, "mem_headroom_ratio": 0.05, "mem_used_bytes": 23 << 30,
     "mem_total_bytes": 24 << 30},
    {"duty_cycle": 0.3, "cpu_count": 16, "host_cpu_pct": 10.0, "tree_cpu_pct": 5.0},
    {"outside_cpu_pct": 1200.0, "tree_cpu_pct": 150.0, "cpu_count": 16},
    {"main_activity": "loader_wait", "workers_activity": "decode", "workers_where": "d.py:3",
     "workers_activity_share": 0.7, "main_where": "train.py:9", "straggler_where": "f.py:1"},
    {"main_activity": "gpu_wait", "main_where": "train.py:9"},
)  # fmt: skip


def every_advice() -> list[Advice]:
    out = [
        a
        for state in State
        for cause in (None, *Cause)
        for reason in (None, *Reason)
        for ev in EVIDENCE
        for host_seen in (False, True)
        for a in advice_for(state, cause, ev, reason, host_seen)
    ]
    return out + [straggler_node_advice("n1", "starved", "n2", hung) for hung in (False, True)]


def test_every_lever_has_a_wording_and_every_wording_one_lever() -> None:
    said = every_advice()
    assert {a.lever for a in said} == set(Lever)
    levers: dict[str, set[Lever]] = {}
    for a in said:
        assert a.text and a.text == str(a)
        levers.setdefault(a.text, set()).add(a.lever)
    assert all(len(v) == 1 for v in levers.values())


def test_a_worker_count_is_one_lever_whichever_cause_names_it() -> None:
    ev: Evidence = {"duty_cycle": 0.3, "cpu_count": 16, "host_cpu_pct": 10.0}
    gil = advice_for(State.STARVED, Cause.GIL, ev)[0]
    assert (gil.lever, gil.number("workers")) == (Lever.WORKERS, 4)
    waiting: Evidence = {**ev, "workers": 3.0}  # its workers idle: no count, the GIL's lever
    assert advice_for(State.STARVED, Cause.GIL, waiting)[0].lever is Lever.GIL


@pytest.fixture
def reworded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sentence said in other words, none of which the old patterns knew."""
    say = advice._say

    def other_words(lever: Lever, text: str, **numbers: float) -> Advice:
        return say(lever, "in other words: " + text.swapcase(), **numbers)

    monkeypatch.setattr(advice, "_say", other_words)


def _levers(summary_advice: tuple[Advice, ...]) -> list[Lever]:
    return [a.lever for a in summary_advice]


# Starved on the GIL twice, a healthy stretch between, first at a duty cycle of 0.4, then
# of 0.2: the loaders needed to keep the GPU fed are about 1/duty, 3 then 5.  (The machine
# of seed 4 runs no DataLoader workers: the count is the advice.)
GIL_TWICE = (
    Phase("startup", 20.0),
    Phase("starved", 60.0, Cause.GIL, params={"burst_s": 0.5, "duty": 0.4}),
    Phase("healthy", 40.0),
    Phase("starved", 60.0, Cause.GIL, params={"burst_s": 0.5, "duty": 0.2}),
)


def _run_starved_on_the_gil() -> tuple[tuple[Advice, ...], set[str]]:
    """Starved on the GIL, the worker count differing from one stretch to the next: several
    wordings of one lever (the summary's advice, and the episodes' texts of the workers'
    lever)."""
    tr = generate("starved_gil", seed=4, gpus=2, duration_s=180.0, phases=GIL_TWICE)
    res = analyze(tr.header, tr.snapshots)
    episodes = [ep for g in res.gpus.values() for ep in g.episodes]
    said = {a.text for ep in episodes for a in ep.advice if a.lever is Lever.WORKERS}
    return res.summary.advice, said


def test_rewording_changes_no_lever_of_a_run_summary(request: pytest.FixtureRequest) -> None:
    plain, worker_wordings = _run_starved_on_the_gil()
    assert len(worker_wordings) >= 2  # the episodes name different counts ...
    assert _levers(plain).count(Lever.WORKERS) == 1  # ... the summary one
    assert len(set(_levers(plain))) == len(plain) >= 3
    request.getfixturevalue("reworded")
    other, _ = _run_starved_on_the_gil()
    assert _levers(other) == _levers(plain)
    assert [a.text for a in other] == ["in other words: " + a.text.swapcase() for a in plain]


def gpu(instance: str, index: int, state: State, util: float, **kw: object) -> GpuReadings:
    """One GPU that spent ``T`` seconds in ``state`` at utilisation ``util``."""
    r = GpuReadings(
        instance=instance,
        gpu=index,
        uuid=f"GPU-{instance}-{index}",
        seconds={state: T},
        util_by_state={state: util},
        duty=util,
        samples=int(T),
        evidence={"mem_headroom_ratio": 0.6, "mem_used_bytes": 32 << 30,
                  "mem_total_bytes": 80 << 30},
    )  # fmt: skip
    return replace(r, **kw)  # type: ignore[arg-type]


def straggler_job(hung: bool) -> list[GpuReadings]:
    """Node n1 starved on its storage while the GPUs of n3 and n4 busy-wait on it (or spin
    with none computing: a hang)."""
    slow = [gpu("n1", i, State.STARVED, 0.3, cause_samples={Cause.IO: 50.0}) for i in (2, 3)]
    marks = {"hang_share": 1.0} if hung else {}
    return slow + [
        gpu(n, i, State.SYNC_STALL, 1.0, **marks) for n in ("n3", "n4") for i in range(2)
    ]


@pytest.mark.parametrize("hung", [False, True], ids=["straggler", "hang"])
@pytest.mark.parametrize("words", ["as written", "reworded"])
def test_the_job_view_replaces_its_peers_vague_advice_whatever_the_words(
    hung: bool, words: str, request: pytest.FixtureRequest
) -> None:
    if words == "reworded":
        request.getfixturevalue("reworded")
    job = judge_job(straggler_job(hung))
    assert job.straggler is not None and job.straggler.hung_peers is hung
    peers = next(n for n in job.nodes if n.instance == "n3").summary.advice
    assert any(map(advice.names_no_rank, peers))  # a node alone cannot name the rank ...
    levers = _levers(job.summary.advice)
    assert levers[0] is Lever.STRAGGLER_NODE  # ... the job's view names the node instead
    assert Lever.HANG not in levers and Lever.STRAGGLER not in levers
    assert len(set(levers)) == len(levers)
    if not hung:  # the straggler node's own remedy follows
        assert Lever.STORAGE in levers
    if words == "reworded":
        assert all(a.text.startswith("in other words: ") for a in job.summary.advice)


def test_a_straggler_this_node_names_is_kept() -> None:
    """Only advice that cannot name the rank is vague; ``GPU 2 is the straggler`` is not."""
    named = advice_for(State.SYNC_STALL, None, {"straggler_gpu": 2}, Reason.STRAGGLER)
    unnamed = advice_for(State.SYNC_STALL, None, {}, Reason.STRAGGLER)
    assert [advice.names_no_rank(a) for a in named] == [False, False]
    assert [advice.names_no_rank(a) for a in unnamed] == [True, False]
    assert named[0].number("gpu") == 2
