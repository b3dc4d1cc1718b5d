"""The report: one-pass analysis, bounded summaries, readable text, and issue 3's JSON."""

from __future__ import annotations

import json
import math

import pytest

from gpumon.engine import analyze
from gpumon.engine.memory import Durations, Timeline
from gpumon.faces.analyze.report import render_text, to_json
from gpumon.lab.synth import generate
from gpumon.model import GpuSample, Snapshot, State, TraceHeader, UtilPoint


@pytest.fixture(scope="module")
def starved() -> tuple:
    tr = generate("healthy_then_starved", 1, gpus=2, period_s=0.2, duration_s=240)
    return tr, analyze(tr.header, iter(tr.snapshots))


def test_json_has_the_shape_of_issue_3(starved: tuple) -> None:
    tr, res = starved
    j = to_json(res)
    json.dumps(j)  # serialisable as is
    assert j["verdict"] == "starved"
    cause = next(p.cause for p in tr.phases if p.kind == "starved")
    assert j["cause"] == cause.value
    assert isinstance(j["advice"], list) and j["advice"]
    assert set(j["seconds"]) == {s.value for s in State}
    assert len(j["gpus"]) == 2
    for g in j["gpus"]:
        assert {"gpu", "uuid", "state", "duty_cycle", "samples", "episodes"} <= set(g)
        assert 0 <= g["duty_cycle"] <= 1
        assert g["samples"] > 0
        assert g["state"] == "starved"
        states = [e["state"] for e in g["episodes"]]
        assert states[0] == "idle" and "healthy" in states and states[-1] == "starved"
        for e in g["episodes"]:
            assert {"start", "end", "state", "cause", "evidence", "advice"} <= set(e)
            assert e["end"] >= e["start"]
            assert (e["cause"] is None) == (e["state"] != "starved")
        assert g["episodes"][-1]["end"] == res.end_s


def test_cause_is_null_unless_starved() -> None:
    tr = generate("healthy", 2, gpus=1, duration_s=120)
    j = to_json(analyze(tr.header, tr.snapshots))
    assert j["verdict"] == "healthy" and j["cause"] is None


def test_text_report_shows_timeline_stats_episodes_and_advice(starved: tuple) -> None:
    _, res = starved
    text = render_text(res)
    assert "Verdict: STARVED" in text
    assert "GPU 0" in text and "GPU 1" in text
    assert "▒" in text and "█" in text  # state timeline: healthy then starved
    assert "gaps" in text and "p50" in text
    assert "(start-up)" in text
    assert "Advice:" in text
    assert "effective GPUs" in text or "GPUs deliver" in text


def test_timeline_stays_bounded_and_keeps_the_mean() -> None:
    tl = Timeline(n=16, width_s=1.0)
    for k in range(1, 10_001):
        tl.add_util(float(k), 1.0, 100.0 if k <= 5000 else 0.0)
    tl.add_state(0.0, 5000.0, State.HEALTHY)
    tl.add_state(5000.0, 10_000.0, State.IDLE)
    series = tl.util_series()
    assert len(series) <= 16 and len(tl.util) == 16
    assert tl.width >= 10_000 / 16
    assert series[0] == pytest.approx(100.0)
    assert series[-1] == pytest.approx(0.0)
    states = tl.state_series()
    assert states[0] is State.HEALTHY and states[-1] is State.IDLE


def test_analysis_timeline_buckets_hold_the_utilisation_of_their_own_time() -> None:
    """The report reads the detector's totals only at bucket edges: each bucket must still
    get exactly its own seconds' work (a second GPU appears late and idles)."""

    def gpu(t: float, i: int, u: float) -> GpuSample:
        pts = tuple(UtilPoint(t - 1 + (j + 1) / 4, u) for j in range(4))
        return GpuSample(t, i, f"GPU-{i}", util_samples=pts, util_pct=u)

    snaps = []
    for k in range(1, 1001):  # GPU 0: 100 % for 300 s, 0 % for 300 s, 40 % for 400 s
        u = 100.0 if k <= 300 else 0.0 if k <= 600 else 40.0
        gs = (gpu(k, 0, u),) + ((gpu(k, 1, 0.0),) if k > 500 else ())
        snaps.append(Snapshot(float(k), gs))
    res = analyze(TraceHeader(1, "test"), iter(snaps))
    g0, g1 = res.gpus[0], res.gpus[1]
    assert g0.samples == 4000 and g1.samples == 2000
    assert g0.duty_cycle == pytest.approx((300 * 1.0 + 400 * 0.4) / 1000, abs=1e-3)
    assert g1.duty_cycle == pytest.approx(0.0)
    tl = g0.timeline
    for i, u in enumerate(tl.util_series()):
        lo, hi = tl.t0 + i * tl.width, tl.t0 + (i + 1) * tl.width  # type: ignore[operator]
        want = [
            100.0 if t <= 300 else 0.0 if t <= 600 else 40.0
            for t in range(max(1, math.ceil(lo)), min(1000, math.ceil(hi) - 1) + 1)
        ]
        if want and len(set(want)) == 1:  # a bucket wholly inside one phase
            assert u == pytest.approx(want[0], abs=0.5), (i, lo, hi)
    assert g1.timeline.util_series()[-1] == pytest.approx(0.0)


def test_log_histogram_quantiles() -> None:
    h = Durations()
    for x in [0.1] * 50 + [1.0] * 40 + [10.0] * 10:
        h.add(x)
    assert h.quantile(0.5) == pytest.approx(0.1, rel=0.15)
    assert h.quantile(0.9) == pytest.approx(1.0, rel=0.15)
    assert Durations().quantile(0.5) is None


def test_empty_stream_gives_an_unknown_verdict() -> None:
    res = analyze(TraceHeader(1, "csv"), [])
    j = to_json(res)
    assert j["verdict"] == "unknown" and j["gpus"] == [] and j["cause"] is None
    assert "Verdict: UNKNOWN" in render_text(res)


def test_sync_stall_report_names_the_straggler() -> None:
    tr = generate("straggler", 0, gpus=4, period_s=0.25, duration_s=200)
    res = analyze(tr.header, tr.snapshots)
    j = to_json(res)
    assert j["verdict"] == "sync_stall"
    strag = next(lab.gpu for lab in tr.labels if lab.note == "straggler")
    assert j["evidence"]["straggler_gpu"] == strag
    assert f"straggler GPU {strag}" in render_text(res)


def _snaps(util, seconds: int) -> list:
    from gpumon.model import GpuProcess, GpuSample, Snapshot, UtilPoint

    out = []
    for k in range(1, seconds + 1):
        pts = tuple(UtilPoint(k - 1 + (j + 1) / 6, util(k - 1 + (j + 0.5) / 6)) for j in range(6))
        busy = any(u > 0 for _, u in pts) or k < 10  # the job's process, while it runs
        out.append(
            Snapshot(
                float(k),
                (
                    GpuSample(
                        float(k),
                        0,
                        "GPU-0",
                        util_samples=pts,
                        util_pct=pts[-1].util_pct,
                        processes=(GpuProcess(7),) if busy else (),
                    ),
                ),
            )
        )
    return out


def test_verdict_sums_up_the_run_not_its_last_moment() -> None:
    # Starved for 200 s (after start-up), then the job ended and the GPU went idle.
    def util(t: float) -> float:
        if t < 20 or t >= 220:
            return 0.0
        return 100.0 if t % 1.0 < 0.35 else 0.0

    res = analyze(TraceHeader(1, "csv"), _snaps(util, 300))
    j = to_json(res)
    assert j["verdict"] == "starved" and j["verdict_now"] == "idle"
    assert j["cause"] == "unknown"  # no host data
    assert j["gpus"][0]["state"] == "starved" and j["gpus"][0]["state_now"] == "idle"
    assert j["advice"], "the starvation's advice survives the idle ending"
    assert "now idle" in render_text(res)


def test_a_short_problem_in_a_long_healthy_run_stays_healthy_overall() -> None:
    def util(t: float) -> float:
        if t < 10:
            return 0.0
        if 500 <= t < 530:  # 30 s of starvation in ~20 min of work
            return 100.0 if t % 1.0 < 0.4 else 0.0
        return 98.0

    j = to_json(analyze(TraceHeader(1, "csv"), _snaps(util, 1200)))
    assert j["verdict"] == "healthy" and j["cause"] is None and j["advice"] == []
    states = [e["state"] for e in j["gpus"][0]["episodes"]]
    assert "starved" in states  # still listed as an episode
