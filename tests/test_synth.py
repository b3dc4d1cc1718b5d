"""The synthetic corpus: deterministic, well-formed, and labelled consistently."""

from __future__ import annotations

import itertools

import pytest

from gpumon.lab.synth import PERIODS, SCENARIOS, corpus, generate
from gpumon.model import Cause, Snapshot, State


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_is_well_formed(scenario: str) -> None:
    tr = generate(scenario, 3, duration_s=120)
    n = len(tr.header.gpus)
    assert tr.snapshots and all(isinstance(s, Snapshot) for s in tr.snapshots)
    ts = [s.t_s for s in tr.snapshots]
    assert ts == sorted(ts)
    for s in tr.snapshots:
        assert [g.gpu for g in s.gpus] == list(range(n))
        for g in s.gpus:
            assert all(0 <= p.util_pct <= 100 for p in g.util_samples)
            assert g.util_pct is None or 0 <= g.util_pct <= 100
    # Labels tile [0, end) for every GPU, without gaps or overlaps.
    end = sum(p.duration_s for p in tr.phases)
    for gpu in range(n):
        labs = sorted((lab for lab in tr.labels if lab.gpu == gpu), key=lambda x: x.start_s)
        assert labs[0].start_s == 0
        for a, b in itertools.pairwise(labs):
            assert a.end_s == pytest.approx(b.start_s)
        assert labs[-1].end_s == pytest.approx(end)
        assert all(isinstance(lab.state, State) for lab in labs)
        assert all((lab.cause is not None) == (lab.state is State.STARVED) for lab in labs)


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    a, b = generate("starved_cpu", 7), generate("starved_cpu", 7)
    assert a.snapshots == b.snapshots and a.labels == b.labels
    c = generate("starved_cpu", 8)
    assert c.snapshots != a.snapshots


@pytest.mark.parametrize("period", PERIODS)
def test_driver_points_come_at_the_sample_period(period: float) -> None:
    tr = generate("healthy", 1, gpus=1, period_s=period, duration_s=60)
    pts = [p.t_s for s in tr.snapshots for g in s.gpus for p in g.util_samples]
    steps = [b - a for a, b in itertools.pairwise(pts)]
    assert sum(steps) / len(steps) == pytest.approx(period, rel=0.05)


def test_starved_duty_and_healthy_duty_differ() -> None:
    def duty(scenario: str) -> float:
        tr = generate(scenario, 2, gpus=1, period_s=1 / 6, duration_s=200)
        start = tr.phases[0].duration_s + 5
        us = [
            p.util_pct
            for s in tr.snapshots
            if s.t_s > start
            for g in s.gpus
            for p in g.util_samples
        ]
        return sum(us) / len(us) / 100

    assert duty("healthy") > 0.9
    assert 0.1 < duty("starved_gil") < 0.7


def test_host_signature_matches_the_cause() -> None:
    def mid(scenario: str) -> Snapshot:
        tr = generate(scenario, 4, duration_s=200)
        return tr.snapshots[len(tr.snapshots) * 3 // 4]

    cpu = mid("starved_cpu")
    assert cpu.tree is not None and min(p.cpu_pct or 0 for p in cpu.tree.workers) > 90
    io = mid("starved_io")
    assert io.host is not None and (io.host.iowait_pct or 0) > 10
    gil = mid("starved_gil")
    root = gil.tree.root if gil.tree else None
    assert root is not None and (root.cpu_pct or 0) > 95
    assert all((p.cpu_pct or 0) < 5 for p in gil.tree.workers)  # type: ignore[union-attr]


def test_coarse_logs_have_no_buffer_no_processes_and_no_cause() -> None:
    tr = generate("coarse_starved", 1, duration_s=100)
    assert tr.period_s is None
    assert all(
        g.util_samples == () and g.processes is None and g.util_pct is not None
        for s in tr.snapshots
        for g in s.gpus
    )
    assert all(s.host is None and s.tree is None for s in tr.snapshots)
    assert {lab.cause for lab in tr.labels if lab.state is State.STARVED} == {Cause.UNKNOWN}


def test_idle_has_no_process_and_straggler_has_low_power_peers() -> None:
    idle = generate("idle", 1, duration_s=60)
    assert all(g.processes == () for s in idle.snapshots for g in s.gpus)
    tr = generate("straggler", 2, gpus=4, duration_s=200)
    strag = next(lab.gpu for lab in tr.labels if lab.note == "straggler")
    last = tr.snapshots[-5]
    lim = tr.header.gpus[0].power_limit_watts
    for g in last.gpus:
        if g.gpu != strag and g.power_watts is not None and lim:
            assert g.power_watts < 0.5 * lim
            assert (g.util_pct or 0) > 90


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown scenario"):
        generate("nope", 1)
    with pytest.raises(ValueError, match="at least 2"):
        generate("straggler", 1, gpus=1)


def test_corpus_covers_every_scenario() -> None:
    names = {tr.name.split("/")[0] for tr in corpus(seeds=[0], duration_s=60)}
    assert names == set(SCENARIOS)


def test_a_story_of_chosen_phases() -> None:
    from gpumon.lab.synth import Phase

    story = [
        Phase("startup", 10.0),
        Phase("healthy", 30.0),
        Phase("starved", 30.0, Cause.IO, params={"burst_s": 0.5, "duty": 0.4}),
    ]
    tr = generate("healthy", 1, gpus=2, period_s=0.5, phases=story)
    assert tr.phases == tuple(story)
    assert tr.snapshots[-1].t_s == pytest.approx(70.0, abs=0.01)
    assert [lab.state for lab in tr.labels if lab.gpu == 0] == [
        State.IDLE,
        State.HEALTHY,
        State.STARVED,
    ]
