"""The hardware counters dcgm-exporter exports by default and NVML gives: read by the
sampler against the fake NVML library, None (never 0) where a GPU does not support them.

Row remapping (four field values in the health's one call), the driver's reserved memory
(nvmlMemory_v2), the video engines' utilisation, and GPM's DRAM bandwidth and FP64/32/16
pipes over the tick's own two GPM samples (one more metrics call when the hardware is
due, no sample of its own).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fakenvml import FakeGPU, MiB, Pattern, Scenario, call_count

import gpumon.sample.nvml as nvml_module
from gpumon.sample.nvml import NvmlSampler

# GPM's counters refresh no faster than every ~100 ms: ticks closer repeat the last reading.
GPM_GAP_S = 0.11


def tick(sampler: NvmlSampler) -> tuple:
    """One tick after GPM's minimum interval (its model, not a wait for the machine)."""
    time.sleep(GPM_GAP_S)
    return sampler.sample()


@pytest.fixture
def nvml(fake_nvml, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The fake loaded into this process; gpumon's once-per-process init flag reset."""
    fake_nvml.load()
    monkeypatch.setattr(nvml_module, "_init_done", False)
    yield fake_nvml


WORN_H100 = FakeGPU(
    gpm_supported=True, gpm_dram_active_pct=64.0, gpm_fp64_active_pct=8.0,
    gpm_fp32_active_pct=30.0, gpm_fp16_active_pct=2.0, mem_reserved=700 * MiB,
    encoder_pct=12, decoder_pct=37, remapped_rows_corrected=3, remapped_rows_uncorrected=1,
    row_remap_pending=True,
)  # fmt: skip


def test_the_default_counters_nvml_gives_are_read(nvml) -> None:
    nvml.set(Scenario(gpus=[WORN_H100]))
    sampler = NvmlSampler(hardware_every_s=0.0)
    (first,) = sampler.sample()
    assert (first.remapped_rows_corrected, first.remapped_rows_uncorrected) == (3, 1)
    assert (first.row_remap_pending, first.row_remap_failed) == (1, 0)
    assert first.memory_reserved_bytes == 700 * MiB
    assert (first.encoder_util_pct, first.decoder_util_pct) == (12.0, 37.0)
    # GPM needs two samples: none on the first tick, then over the interval between them.
    assert first.dram_active_ratio is None and first.fp64_active_ratio is None
    (g,) = tick(sampler)
    assert g.dram_active_ratio == pytest.approx(0.64)
    assert (g.fp64_active_ratio, g.fp32_active_ratio, g.fp16_active_ratio) == (
        pytest.approx(0.08), pytest.approx(0.30), pytest.approx(0.02),
    )  # fmt: skip
    assert g.unsupported == () and sampler.errors == {}


def test_the_gpm_pipes_follow_the_tick_and_take_no_sample_of_their_own(nvml) -> None:
    """Half busy between the two samples: each pipe reads half its busy percentage; the
    pipes cost one metrics call when the hardware is due (a sample would cost two)."""
    nvml.set(Scenario(gpus=[WORN_H100]))
    sampler = NvmlSampler(hardware_every_s=3600.0)
    sampler.sample()
    tick(sampler)  # two GPM samples taken: an interval
    before = call_count("gpm")
    tick(sampler)
    per_tick = call_count("gpm") - before
    assert per_tick == 2  # the tick's own: one sample, one metrics call
    sampler.hardware_every_s = 0.0
    before = call_count("gpm")
    (g,) = tick(sampler)
    assert call_count("gpm") - before == per_tick + 1
    assert g.dram_active_ratio == pytest.approx(0.64)
    idle = Scenario(gpus=[WORN_H100]).with_gpu(0, pattern=Pattern.off())
    nvml.set(idle)
    tick(sampler)  # an interval that began busy: a mix
    (g,) = tick(sampler)
    assert g.dram_active_ratio == 0.0 and g.fp32_active_ratio == 0.0  # idle: 0, not None


def test_a_gpu_without_them_reads_none_never_zero(nvml) -> None:
    """A PCIe card before Ampere: no row remapping, no encoder, no GPM; each asked once
    (then left alone), None in the sample, named in ``unsupported``."""
    old = FakeGPU(unsupported={"remapped_rows", "encoder"}, gpm_supported=False)
    h100_no_fp64 = FakeGPU(gpm_supported=True, gpm_fp64_active_pct=None)
    nvml.set(Scenario(gpus=[old, h100_no_fp64]))
    sampler = NvmlSampler(hardware_every_s=0.0)
    sampler.sample()
    encoders = call_count("encoder")
    g, h = tick(sampler)
    assert (g.remapped_rows_corrected, g.row_remap_pending, g.row_remap_failed) == (None,) * 3
    assert g.encoder_util_pct is None and g.decoder_util_pct == 0.0
    assert g.dram_active_ratio is None and g.fp16_active_ratio is None
    assert {"remapped_rows", "encoder"} <= set(g.unsupported)
    assert "gpm_pipes" not in g.unsupported  # no GPM at all: nothing asked
    assert call_count("encoder") == encoders + 1  # the H100's alone: the old card's left alone
    asked = sampler._gpus[0].fields
    assert asked is not None  # dropped from the old card's one field-values request:
    assert "remapped_rows" not in {asked.FIELDS[i][0] for i in asked._asked}
    assert h.fp64_active_ratio is None and h.fp32_active_ratio == pytest.approx(0.2)
    assert sampler.errors == {}


def test_a_failing_read_is_none_for_that_time_and_counted(nvml) -> None:
    nvml.set(Scenario(gpus=[FakeGPU(errors={"decoder": "UNKNOWN", "remapped_rows": "TIMEOUT"})]))
    sampler = NvmlSampler(hardware_every_s=0.0)
    (g,) = sampler.sample()
    assert g.decoder_util_pct is None and g.remapped_rows_corrected is None
    assert g.encoder_util_pct == 0.0 and g.memory_reserved_bytes == 512 * MiB
    assert sampler.errors["unknown"] >= 1 and sampler.errors["timeout"] >= 1
    assert "decoder" not in g.unsupported  # a failure, not NotSupported: asked again
