"""Hostile input, third round: a wall clock that steps (NTP, a VM resumed).

The driver stamps its samples with a clock that may be the wall clock; the fake's
``timestamp_offset_s`` steps that clock as NTP would, for the real pynvml bindings.  Before,
a step back left ``lastSeenTimeStamp`` ahead of every new sample: NVML returned none, tick
after tick, and nothing was said.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator

import pytest
from fakenvml import FakeGPU, Pattern, Scenario

import gpumon.sample.nvml as nvml_module
from gpumon.sample.nvml import NvmlSampler

PERIOD = 1.0 / 6.0


@pytest.fixture
def nvml(fake_nvml, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    fake_nvml.load()
    monkeypatch.setattr(nvml_module, "_init_done", False)
    yield fake_nvml


def _scenario(offset_s: float) -> Scenario:
    gpu = FakeGPU(pattern=Pattern.steady(100.0), sample_period_s=PERIOD, buffer_len=120)
    return Scenario(gpus=[gpu], timestamp_offset_s=offset_s)


def _points(sampler: NvmlSampler, seconds: float) -> list[tuple[float, float]]:
    """Every driver sample over ``seconds`` of ticks every 0.3 s."""
    out: list[tuple[float, float]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.3)
        (sample,) = sampler.sample()
        out.extend(sample.util_samples)
    return out


def _check_no_loss_no_repeat(points: list[tuple[float, float]], since: float) -> None:
    times = [t for t, _ in points]
    assert times == sorted(times) and len(set(times)) == len(times), "a sample came twice"
    assert times and times[0] - since < 3 * PERIOD + 0.5, "samples after the step were lost"
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) < 2.5 * PERIOD, f"a hole of {max(gaps):.2f} s in the samples"


@pytest.mark.parametrize("step_s", [-3600.0, -5.0])
def test_a_clock_stepped_back_still_delivers_every_sample_once(nvml, caplog, step_s) -> None:
    nvml.set(_scenario(0.0))
    sampler = NvmlSampler()
    before = _points(sampler, 1.2)
    assert before, "the fake delivers samples before the step"
    caplog.set_level(logging.WARNING, logger="gpumon")
    nvml.set(_scenario(step_s))  # the clock the driver stamps with jumps back
    stepped = time.monotonic()
    after = _points(sampler, 2.4)
    _check_no_loss_no_repeat(before + after, before[-1][0])
    assert all(t > before[-1][0] for t, _ in after)
    assert all(t <= time.monotonic() for t, _ in after), "a sample from the future"
    assert after[0][0] - stepped < 1.0
    said = [r.getMessage() for r in caplog.records if "stepped back" in r.getMessage()]
    assert len(said) == 1, said  # said once, however many ticks follow
    assert sampler.clock_steps_back >= 1


def test_a_clock_stepped_forward_delivers_no_sample_twice(nvml) -> None:
    """The driver's buffer re-stamped ahead: its older samples look new; not taken again."""
    nvml.set(_scenario(0.0))
    sampler = NvmlSampler()
    before = _points(sampler, 1.2)
    nvml.set(_scenario(+3600.0))
    after = _points(sampler, 1.5)
    _check_no_loss_no_repeat(before + after, before[-1][0])


def test_an_anchored_clock_never_places_a_sample_after_it_is_read() -> None:
    """A driver clock that is no system clock is anchored: its newest sample taken as 'now'.
    Anchored while the reading thread lagged its read (a busy machine), later samples
    would land in the future; each read bounds the anchor again."""
    from gpumon.sample.nvml import SampleClock

    clock = SampleClock()
    first_us = int((time.clock_gettime(time.CLOCK_REALTIME) - 7200.0) * 1e6)  # no clock we know
    clock.offset_s(first_us)
    assert clock.clock_name == "anchored"
    # The thread was 0.4 s late reading the first sample: a sample stamped now reads
    # 0.4 s after the first one's anchor put it.
    for newest_us in (first_us + 400_000, first_us + 500_000):
        offset = clock.offset_s(newest_us)
        assert newest_us / 1e6 - offset <= time.monotonic()
