"""Hopper's GPM counters: read through the real pynvml against the fake NVML, used by the
detector's busy-wait rule, and carried by the trace format."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest
from fakenvml import FakeGPU, MigInstance, Pattern, Process, Scenario, call_count

import gpumon.sample.nvml as nvml_module
from gpumon.detect import Detector
from gpumon.engine import LiveOptions, Session
from gpumon.lab.synth import generate
from gpumon.model import GpuSample, MigActivity, Reason, Snapshot, State, TraceHeader
from gpumon.sample.nvml import NvmlSampler
from gpumon.traces.jsonl import FORMAT_VERSION, TraceReader, TraceWriter, read_trace


@pytest.fixture
def nvml(fake_nvml, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The fake loaded into this process; gpumon's once-per-process init flag reset."""
    fake_nvml.load()
    monkeypatch.setattr(nvml_module, "_init_done", False)
    yield fake_nvml


def _two_ticks(sampler: NvmlSampler, gap_s: float = 0.15) -> tuple[GpuSample, ...]:
    """The second tick: GPM needs two samples to give an interval."""
    first = sampler.sample()
    assert all(g.sm_active_ratio is None for g in first)  # one sample: no reading yet
    time.sleep(gap_s)
    return sampler.sample()


# --------------------------------------------------------------------------- the sampler
def test_gpm_metrics_are_read_over_the_tick_interval(nvml) -> None:
    nvml.set(
        Scenario(
            gpus=[
                # Reads busy, SMs idle: a collective spinning.
                FakeGPU(gpm_supported=True, gpm_sm_active_pct=2.0, gpm_tensor_active_pct=None),
                FakeGPU(gpm_supported=True, gpm_sm_active_pct=85.0, gpm_sm_occupancy_pct=55.0),
                FakeGPU(gpm_supported=True, pattern=Pattern.off()),
                FakeGPU(),  # no GPM (an A100, say)
            ]
        )
    )
    before = call_count("gpm")
    sampler = NvmlSampler()
    assert call_count("gpm") - before == 4  # asked once per GPU, when it was opened
    spin, busy, idle, old = _two_ticks(sampler)
    assert spin.sm_active_ratio == pytest.approx(0.02)
    assert spin.sm_occupancy_ratio == pytest.approx(0.40)
    assert spin.tensor_active_ratio is None  # a metric the GPU does not offer: no reading
    assert busy.sm_active_ratio == pytest.approx(0.85)
    assert busy.sm_occupancy_ratio == pytest.approx(0.55)
    assert busy.tensor_active_ratio == pytest.approx(0.30)
    # An idle GPU's counters read 0, a reading; a GPU without GPM reads None.
    assert idle.sm_active_ratio == 0.0 and idle.tensor_active_ratio == 0.0
    assert (old.sm_active_ratio, old.sm_occupancy_ratio, old.tensor_active_ratio) == (
        None,
        None,
        None,
    )
    assert all(g.unsupported == () and g.mig_activity == () for g in (spin, busy, idle, old))
    assert sampler.errors == {}
    # Per tick, each GPM GPU costs two calls (a sample, then the metrics); the GPU without
    # GPM none: it is not asked again.
    before = call_count("gpm")
    for _ in range(3):
        time.sleep(0.11)
        sampler.sample()
    assert call_count("gpm") - before == 3 * 3 * 2


def test_gpm_follows_the_utilisation_pattern_between_samples(nvml) -> None:
    nvml.set(
        Scenario(
            gpus=[FakeGPU(gpm_supported=True, pattern=Pattern.burst(0.1, 0.5))],
            epoch=time.monotonic() - 5.0,
        )
    )
    sampler = NvmlSampler()
    (s,) = _two_ticks(sampler, gap_s=1.0)  # ten whole periods, busy half of each
    assert s.sm_active_ratio == pytest.approx(0.80 * 0.5, abs=0.03)


def test_ticks_closer_than_100ms_repeat_the_reading_without_sampling(nvml) -> None:
    nvml.set(Scenario(gpus=[FakeGPU(gpm_supported=True)]))
    sampler = NvmlSampler()
    (s,) = _two_ticks(sampler)
    before = call_count("gpm")
    (again,) = sampler.sample()  # at once: GPM's counters are refreshed every ~100 ms
    assert call_count("gpm") == before
    assert again.sm_active_ratio == s.sm_active_ratio == pytest.approx(0.8)


def test_gpm_per_mig_instance(nvml) -> None:
    nvml.set(
        Scenario(
            gpus=[
                FakeGPU(
                    gpm_supported=True,
                    mig=[MigInstance(1, 50.0, 20.0, None), MigInstance(5, 3.0, 10.0, 0.0)],
                    unsupported={"utilization", "samples"},  # as NVML says with MIG on
                )
            ]
        )
    )
    sampler = NvmlSampler(retry_unsupported_s=3600.0)
    (g,) = _two_ticks(sampler)
    assert g.mig_activity == (
        MigActivity(1, pytest.approx(0.5), pytest.approx(0.2), None),
        MigActivity(5, pytest.approx(0.03), pytest.approx(0.1), 0.0),
    )
    # With MIG on the whole GPU has no GPM sample: no reading, asked again only rarely.
    assert g.sm_active_ratio is None and "gpm" in g.unsupported
    assert sampler.errors == {}
    before = call_count("gpm")
    time.sleep(0.11)
    sampler.sample()
    assert call_count("gpm") - before == 2 * 2  # two instances, no whole-GPU sample


def test_a_gpu_without_gpm_falls_back_silently(nvml, caplog) -> None:
    """Unsupported device, a driver without the GPM functions, a failing support query:
    each reads no GPM fields, counts no error, logs nothing, and is not asked again."""
    nvml.set(
        Scenario(
            gpus=[
                FakeGPU(gpm_supported=False),
                FakeGPU(gpm_supported=True, unsupported={"gpm"}),
                FakeGPU(gpm_supported=True, errors={"gpm": "FUNCTION_NOT_FOUND"}),
            ]
        )
    )
    caplog.set_level(logging.DEBUG, logger="gpumon")
    sampler = NvmlSampler()
    gpus = _two_ticks(sampler)
    before = call_count("gpm")
    for _ in range(3):
        time.sleep(0.11)
        gpus = sampler.sample()
    assert call_count("gpm") == before
    for g in gpus:
        assert (g.sm_active_ratio, g.sm_occupancy_ratio, g.tensor_active_ratio) == (None,) * 3
        assert g.unsupported == () and g.util_pct == 100.0
    assert sampler.errors == {}
    assert not [r for r in caplog.records if "gpm" in r.getMessage().lower()]


def test_bindings_without_gpm_read_everything_else(nvml, monkeypatch) -> None:
    nvml.set(Scenario(gpus=[FakeGPU(gpm_supported=True)]))
    monkeypatch.delattr(pynvml, "nvmlGpmQueryDeviceSupport")
    sampler = NvmlSampler()
    (g,) = _two_ticks(sampler)
    assert g.sm_active_ratio is None and g.util_pct == 100.0 and sampler.errors == {}


def test_a_gpu_lost_in_a_gpm_call_is_marked_lost(nvml) -> None:
    nvml.set(Scenario(gpus=[FakeGPU(gpm_supported=True), FakeGPU(gpm_supported=True)]))
    sampler = NvmlSampler()
    _two_ticks(sampler)
    nvml.set(Scenario(gpus=[FakeGPU(gpm_supported=True, errors={"gpm": "GPU_IS_LOST"}),
                            FakeGPU(gpm_supported=True)]))  # fmt: skip
    time.sleep(0.11)
    lost, fine = sampler.sample()
    assert lost.lost and not fine.lost and fine.sm_active_ratio == pytest.approx(0.8)
    assert sampler.errors["gpu_is_lost"] == 1


def test_other_gpm_errors_are_counted_and_leave_no_reading(nvml) -> None:
    nvml.set(Scenario(gpus=[FakeGPU(gpm_supported=True)]))
    sampler = NvmlSampler()
    _two_ticks(sampler)
    nvml.set(Scenario(gpus=[FakeGPU(gpm_supported=True, errors={"gpm": "UNKNOWN"})]))
    time.sleep(0.11)
    (g,) = sampler.sample()
    assert g.sm_active_ratio is None and not g.lost and g.util_pct == 100.0
    assert sampler.errors["unknown"] == 1
    nvml.set(Scenario(gpus=[FakeGPU(gpm_supported=True)]))
    time.sleep(0.11)
    sampler.sample()
    time.sleep(0.11)
    (g,) = sampler.sample()
    assert g.sm_active_ratio == pytest.approx(0.8)  # not marked unsupported: read again


# --------------------------------------------------------------------------- the detector
STRAGGLER = generate("straggler", 3, gpus=4, period_s=1 / 6)


def _spinning_peers(gpm: bool, spin_sm: float = 0.03) -> list[Snapshot]:
    """A straggler whose three peers spin in the collective, at full power throughout (so
    power cannot tell the spin), with or without GPM's SM activity (``spin_sm`` while
    spinning: NCCL's kernels hold one block per channel)."""
    tr = STRAGGLER
    limit = tr.header.gpus[0].power_limit_watts
    assert limit is not None
    out = []
    for snap in tr.snapshots:
        gpus = []
        for g in snap.gpus:
            label = tr.label_at(g.t_s, g.gpu)
            spin = label is not None and label.note == "busy-wait"
            util = (g.util_pct or 0.0) / 100
            kw: dict[str, float] = {"power_watts": limit * (0.1 + 0.8 * util)}
            if gpm:
                kw["sm_active_ratio"] = spin_sm if spin else 0.75 * util
            gpus.append(replace(g, **kw))
        out.append(replace(snap, gpus=tuple(gpus)))
    return out


def _verdict(snaps: list[Snapshot]):
    det = Detector(gpus=STRAGGLER.header.gpus)
    for s in snaps:
        det.update(s)
    return det.verdict()


# A few channels' SMs, or 32 channels of an H100's 132 (above the absolute floor, still far
# below the 0.75 of the GPU that computes).
@pytest.mark.parametrize("spin_sm", [0.03, 0.26])
def test_busy_wait_is_told_by_sm_activity_at_full_power(spin_sm: float) -> None:
    without = _verdict(_spinning_peers(gpm=False, spin_sm=spin_sm))
    # The control: at full power the power path cannot see the peers spinning.
    assert without.state is not State.SYNC_STALL
    assert not any(g.reason is Reason.BUSY_WAIT for g in without.gpus)
    told = _verdict(_spinning_peers(gpm=True, spin_sm=spin_sm))
    assert told.state is State.SYNC_STALL
    reasons = sorted(str(g.reason) for g in told.gpus)
    assert reasons == ["busy-wait"] * 3 + ["straggler"]
    peers = [g for g in told.gpus if g.reason is Reason.BUSY_WAIT]
    assert all(g.evidence["sm_active_ratio"] <= spin_sm + 0.01 for g in peers)
    assert all(g.evidence["power_share_of_peak"] > 0.8 for g in peers)
    assert all("idle SMs" in (g.note or "") for g in peers)


@pytest.mark.parametrize("power", [80.0, None])
def test_busy_sms_are_work_at_low_or_no_power(power: float | None) -> None:
    """GPM overrides power both ways: pinned peers whose SMs are busy compute, whether
    their power reads low (a power cap) or not at all; a gappy GPU beside them is not
    their straggler."""
    v = _verdict(
        [
            replace(s, gpus=tuple(replace(g, power_watts=power, sm_active_ratio=0.7)
                                  for g in s.gpus))
            for s in _spinning_peers(gpm=True)
        ]
    )  # fmt: skip
    assert not any(g.reason in (Reason.BUSY_WAIT, Reason.STRAGGLER) for g in v.gpus)


def test_busy_wait_told_live_on_the_fake(nvml) -> None:
    """Live, on the fake: three GPUs pinned at 100 % at full power with their SMs idle,
    beside one that computes in bursts; with GPM the detector names the spin, without it
    (same GPUs, same power) it cannot."""

    def scenario(gpm: bool) -> Scenario:
        peers = [
            FakeGPU(gpm_supported=gpm, gpm_sm_active_pct=2.0, processes=[Process(4242)])
            for _ in range(3)
        ]
        strag = FakeGPU(
            gpm_supported=gpm, pattern=Pattern.burst(1.0, 0.5), processes=[Process(4242)]
        )
        return Scenario(gpus=[strag, *peers], epoch=time.monotonic() - 30.0)

    for gpm in (True, False):
        nvml.set(scenario(gpm))
        nvml_module._init_done = False
        session = Session.live(LiveOptions(interval_s=0.25, host=False, backlog=True))
        reasons: list[Reason | None] = []
        for _ in range(12):  # 3 s: the backlog holds the last 20 s of driver samples
            session.tick()
            reasons = [g.reason for g in session.verdict().gpus]
            if Reason.BUSY_WAIT in reasons:
                break
            time.sleep(0.25)
        if gpm:
            assert reasons == [Reason.STRAGGLER] + [Reason.BUSY_WAIT] * 3
        else:
            assert Reason.BUSY_WAIT not in reasons


# --------------------------------------------------------------------------- the trace
def test_trace_round_trip_keeps_gpm_fields(tmp_path: Path) -> None:
    header = TraceHeader(version=FORMAT_VERSION, source="gpumon")
    gpus = (
        GpuSample(1.0, 0, "GPU-a", util_pct=100.0, sm_active_ratio=0.02,
                  sm_occupancy_ratio=0.4, tensor_active_ratio=None),
        GpuSample(1.0, 1, "GPU-b", mig_activity=(MigActivity(0, 0.5, None, 0.0),
                                                 MigActivity(3, None, None, None))),
    )  # fmt: skip
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path, header) as w:
        w.write(Snapshot(1.0, gpus))
    line = path.read_text().splitlines()[1]
    assert '"tensor_active_ratio"' not in line.split('"mig_activity"')[0]  # None: absent
    with TraceReader(path) as r:
        (snap,) = list(r)
    assert snap.gpus == gpus


def test_record_writes_what_gpm_reads(fake_nvml, tmp_path: Path) -> None:
    fake_nvml.set(
        Scenario(
            gpus=[
                FakeGPU(gpm_supported=True, gpm_sm_active_pct=2.0),
                FakeGPU(gpm_supported=True, mig=[MigInstance(2, 40.0, 20.0, 10.0)]),
            ]
        )
    )
    out = tmp_path / "t.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "gpumon", "record", "-o", str(out), "--duration", "1.5",
         "--interval", "0.25"],
        env=fake_nvml.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    header, snaps = read_trace(out)
    assert header.version == FORMAT_VERSION == 4
    later = snaps[1:]
    assert later and all(s.gpus[0].sm_active_ratio == pytest.approx(0.02) for s in later)
    assert all(s.gpus[1].mig_activity[0].sm_active_ratio == pytest.approx(0.4) for s in later)
    assert all(s.gpus[1].mig_activity[0].gpu_instance_id == 2 for s in later)
