"""From verdict to prescription: the speed-up if fed, worker counts, memory levers, scaling."""

from __future__ import annotations

import math

import pytest

from gpumon.detect import Detector
from gpumon.detect.advice import _memory_advice, gil_prescription, worker_prescription
from gpumon.engine import analyze
from gpumon.engine.words import speedup_sentence
from gpumon.faces.analyze.report import to_json
from gpumon.lab.synth import generate
from gpumon.model import GpuSample, Lever, Snapshot, TraceHeader

GIB = 1 << 30


def _square(duty: float, seconds: float = 300.0, gpus: int = 1, period: float = 2.0):
    """Driver samples (1/6 s) of a square wave: busy ``duty`` of every ``period``."""
    out = []
    for k in range(1, int(seconds) + 1):
        t = float(k)
        pts = tuple(
            (t - 1 + (j + 1) / 6, 100.0 if (t - 1 + (j + 1) / 6) % period < duty * period else 0.0)
            for j in range(6)
        )
        gs = tuple(
            GpuSample(t, i, f"GPU-{i}", pts, mem_used_bytes=30 * GIB, mem_total_bytes=80 * GIB)
            for i in range(gpus)
        )
        out.append(Snapshot(t, gs))
    return out


@pytest.mark.parametrize(("duty", "want"), [(0.4, 2.5), (0.25, 4.0), (1.0, 1.0)])
def test_speedup_if_fed_is_one_over_the_working_duty_cycle(duty: float, want: float) -> None:
    j = to_json(analyze(TraceHeader(1, "csv"), _square(duty)))
    assert j["speedup_if_fed"] == pytest.approx(want, rel=0.12)
    assert j["work_duty_cycle"] == pytest.approx(min(1.0, duty), abs=0.06)


def test_the_speedup_is_said_with_its_basis() -> None:
    res = analyze(TraceHeader(1, "csv"), _square(0.4))
    line = speedup_sentence(res.summary)
    assert line is not None
    assert line.startswith("fixing the input pipeline could make this run up to 2.")
    assert "x faster (its GPUs computed 4" in line


def test_a_healthy_run_has_no_speedup_to_sell() -> None:
    res = analyze(TraceHeader(1, "csv"), _square(1.0))
    assert speedup_sentence(res.summary) is None


def test_worker_count_from_the_measured_cpu() -> None:
    ev = {
        "workers": 4.0,
        "workers_cpu_pct": 96.0,
        "duty_cycle": 0.4,
        "cpu_count": 32,
        "host_cpu_pct": 20.0,
    }
    rx = worker_prescription(ev)
    assert rx is not None and rx.startswith("raise num_workers from 4 to about 10")
    assert "26 of 32 are free" in rx
    busy = dict(ev, host_cpu_pct=99.0)
    assert (worker_prescription(busy) or "").startswith("no free cores (num_workers=4")
    some = dict(ev, host_cpu_pct=85.0)  # 4.8 cores free: 5 more workers fit, 6 are needed
    rx = worker_prescription(some) or ""
    assert rx.startswith("raise num_workers from 4 to 9 (all the free cores") and "DALI" in rx
    assert worker_prescription({"duty_cycle": 0.4}) is None  # no host data, no figure


def test_a_gil_bound_loader_gets_a_worker_count() -> None:
    rx = gil_prescription({"duty_cycle": 0.3, "cpu_count": 16, "host_cpu_pct": 10.0})
    assert "num_workers=4" in rx.text and "14 cores are free" in rx.text
    # A worker count is the one lever of workers, whichever cause names it.
    assert rx.lever is Lever.WORKERS and rx.number("workers") == 4


def test_memory_levers_in_numbers() -> None:
    roomy = {"mem_headroom_ratio": 0.6, "mem_used_bytes": 32 * GIB, "mem_total_bytes": 80 * GIB}
    assert [a.text for a in _memory_advice(roomy)] == [
        "batch could roughly double (48 GiB free of 80): a larger batch amortises per-step "
        "host work"
    ]
    full = {"mem_headroom_ratio": 0.04, "mem_used_bytes": 77 * GIB, "mem_total_bytes": 80 * GIB}
    (lever,) = _memory_advice(full)
    assert lever.lever is Lever.BATCH and lever.number("free_gib") == 3.0
    text = lever.text
    assert "bf16/fp16" in text and "half the batch" in text and "3.0 GiB free of 80" in text


def test_starved_cpu_trace_with_host_data_names_a_worker_count() -> None:
    tr = generate("starved_cpu", seed=2, gpus=1, duration_s=240.0)
    res = analyze(tr.header, tr.snapshots)
    assert res.state.value == "starved" and res.cause.value == "cpu"  # type: ignore[union-attr]
    assert any("num_workers from" in a.text and " to " in a.text for a in res.advice), res.advice


def test_scaling_efficiency_beside_the_usual_range() -> None:
    det = Detector()
    for snap in _square(0.5, gpus=4):
        det.update(snap)
    det.finish()
    notes = det.summary().notes
    note = next(n for n in notes if "GPUs of work while working" in n)
    eff = float(note.split(" deliver ")[1].split(" ")[0])
    assert math.isclose(eff, 2.0, abs_tol=0.3)
    assert "data-parallel training usually reaches 2.5-3.8 on 4" in note
