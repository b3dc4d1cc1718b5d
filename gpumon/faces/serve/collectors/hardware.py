"""The ``hardware`` group: what dcgm-exporter exports beside gpumon.

Temperatures, clocks and why they are held down, fan, P-state, energy, ECC and row
remapping, PCIe replays and throughput, NVLink traffic, XID errors, the reserved memory,
the video engines, GPM's DRAM and FP pipes: gpumon's own names;
deploy/prometheus/gpumon-dcgm-rules.yml records them under dcgm-exporter's.  Turned off
(``--no-collector.hardware``, on a node that runs dcgm-exporter), the sampler does not
read them either.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpumon.faces.serve.collectors.base import GPU, GroupCollector, add, add_typed
from gpumon.model import GpuSample

# The clocks-event (throttle) reasons: nvml.h's nvmlClocksEventReason* bits, by label.
CLOCK_EVENT_REASONS = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


# The per-GPU hardware series of one reading each: (family, help, a counter?, the reading
# in base units).
HARDWARE_SERIES: tuple[tuple[str, str, bool, Callable[[GpuSample], float | None]], ...] = (
    (
        "gpumon_gpu_temperature_celsius",
        "GPU core temperature (temperature.gpu).",
        False,
        lambda s: s.temperature_c,
    ),
    (
        "gpumon_gpu_memory_temperature_celsius",
        "Memory (HBM) temperature (temperature.memory).",
        False,
        lambda s: s.memory_temperature_c,
    ),
    (
        "gpumon_gpu_sm_clock_hertz",
        "SM clock (clocks.sm).",
        False,
        lambda s: _scaled(s.sm_clock_mhz, 1e6),
    ),
    (
        "gpumon_gpu_memory_clock_hertz",
        "Memory clock (clocks.mem).",
        False,
        lambda s: _scaled(s.mem_clock_mhz, 1e6),
    ),
    (
        "gpumon_gpu_fan_speed_ratio",
        "Fan speed against its maximum (fan.speed); absent on passively cooled GPUs.",
        False,
        lambda s: _scaled(s.fan_speed_pct, 0.01),
    ),
    (
        "gpumon_gpu_performance_state",
        "Performance state: 0 (P0, the fastest) to 15 (pstate).",
        False,
        lambda s: s.pstate,
    ),
    (
        "gpumon_gpu_memory_utilization_ratio",
        "Share of the driver's last sample period in which memory was read or written "
        "(utilization.memory).",
        False,
        lambda s: _scaled(s.mem_util_pct, 0.01),
    ),
    (
        "gpumon_gpu_energy_joules",
        "Energy the GPU used since the driver loaded (total energy consumption).",
        True,
        lambda s: s.energy_joules,
    ),
    (
        "gpumon_gpu_pcie_replays",
        "PCIe transfers replayed after a link error, since the driver loaded.",
        True,
        lambda s: s.pcie_replays,
    ),
    (
        "gpumon_gpu_nvlink_transmit_bytes",
        "Data sent over NVLink, all links, since the driver loaded.",
        True,
        lambda s: s.nvlink_tx_bytes,
    ),
    (
        "gpumon_gpu_nvlink_receive_bytes",
        "Data received over NVLink, all links, since the driver loaded.",
        True,
        lambda s: s.nvlink_rx_bytes,
    ),
    (
        "gpumon_gpu_pcie_transmit_bytes_per_second",
        "Data the GPU sent over PCIe (NVML's PCIe throughput: a 20 ms window, read every 5 s).",
        False,
        lambda s: s.pcie_tx_bytes_per_s,
    ),
    (
        "gpumon_gpu_pcie_receive_bytes_per_second",
        "Data the GPU received over PCIe (NVML's PCIe throughput: a 20 ms window, read every 5 s).",
        False,
        lambda s: s.pcie_rx_bytes_per_s,
    ),
    (
        "gpumon_gpu_memory_reserved_bytes",
        "GPU memory the driver reserves for itself (memory.reserved; within memory.used).",
        False,
        lambda s: s.memory_reserved_bytes,
    ),
    (
        "gpumon_gpu_encoder_utilization_ratio",
        "Share of the driver's last sample period the video encoder was busy "
        "(utilization.encoder).",
        False,
        lambda s: _scaled(s.encoder_util_pct, 0.01),
    ),
    (
        "gpumon_gpu_decoder_utilization_ratio",
        "Share of the driver's last sample period the video decoder was busy "
        "(utilization.decoder).",
        False,
        lambda s: _scaled(s.decoder_util_pct, 0.01),
    ),
    (
        "gpumon_gpu_row_remap_pending",
        "1 when a row of memory was remapped and the GPU needs a reset to use it "
        "(remapped_rows.pending; Ampere and later).",
        False,
        lambda s: s.row_remap_pending,
    ),
    (
        "gpumon_gpu_row_remap_failed",
        "1 when remapping a row of memory failed: the GPU needs service "
        "(remapped_rows.failure; Ampere and later).",
        False,
        lambda s: s.row_remap_failed,
    ),
    (
        "gpumon_gpu_dram_active_ratio",
        "Share of the memory bandwidth used over the last tick (GPM, Hopper and later; "
        "DCGM_FI_PROF_DRAM_ACTIVE).",
        False,
        lambda s: s.dram_active_ratio,
    ),
    (
        "gpumon_gpu_fp64_active_ratio",
        "Share of time the SMs did non-tensor FP64 math over the last tick (GPM).",
        False,
        lambda s: s.fp64_active_ratio,
    ),
    (
        "gpumon_gpu_fp32_active_ratio",
        "Share of time the SMs did non-tensor FP32 math over the last tick (GPM).",
        False,
        lambda s: s.fp32_active_ratio,
    ),
    (
        "gpumon_gpu_fp16_active_ratio",
        "Share of time the SMs did non-tensor FP16 math over the last tick (GPM).",
        False,
        lambda s: s.fp16_active_ratio,
    ),
)
# XID codes people page on (NVIDIA's XID catalogue: 48 double-bit ECC, 63/64 row
# remapping, 74 NVLink, 79 fallen off the bus, 94/95 contained/uncontained ECC): exported
# at 0 from the start, so the first one is an increase Prometheus can see.
PAGED_XIDS = ("48", "63", "64", "74", "79", "94", "95")


def _xid_order(code: str) -> tuple[int, str]:
    return (int(code), "") if code.isdigit() else (1 << 30, code)


class HardwareCollector(GroupCollector):
    """Each GPU's hardware health, in base units."""

    group = "hardware"
    names = (
        *(name + ("_total" if counter else "") for name, _, counter, _ in HARDWARE_SERIES),
        "gpumon_gpu_clock_event_reason",
        "gpumon_gpu_ecc_errors_total",
        "gpumon_gpu_ecc_aggregate_errors_total",
        "gpumon_gpu_remapped_rows_total",
        "gpumon_gpu_xid_errors_total",
        "gpumon_gpu_last_xid",
    )

    def collect(self) -> list[Metric]:
        st = self.state
        plain = [
            (CounterMetricFamily if counter else GaugeMetricFamily)(name, text, labels=GPU)
            for name, text, counter, _ in HARDWARE_SERIES
        ]
        reasons = GaugeMetricFamily(
            "gpumon_gpu_clock_event_reason",
            "Why the clocks are held down (clocks_event_reasons, once throttle reasons): 1 "
            "for each active reason, 0 for the others.",
            labels=[*GPU, "reason"],
        )
        ecc = CounterMetricFamily(
            "gpumon_gpu_ecc_errors",
            "ECC errors since the driver loaded (volatile), by type: corrected (single-bit) "
            "or uncorrected (double-bit).",
            labels=[*GPU, "type"],
        )
        ecc_life = CounterMetricFamily(
            "gpumon_gpu_ecc_aggregate_errors",
            "ECC errors over the GPU's life (aggregate, kept in its infoROM), by type.",
            labels=[*GPU, "type"],
        )
        remapped = CounterMetricFamily(
            "gpumon_gpu_remapped_rows",
            "Rows of memory remapped to spares over the GPU's life, by the type of error "
            "that retired them: corrected or uncorrected (Ampere and later).",
            labels=[*GPU, "type"],
        )
        xid = CounterMetricFamily(
            "gpumon_gpu_xid_errors",
            "XID critical errors (NVML events) since gpumon started, by code; beyond "
            "32 codes per GPU as 'other'.",
            labels=[*GPU, "xid"],
        )
        last_xid = GaugeMetricFamily(
            "gpumon_gpu_last_xid",
            "Code of the GPU's last XID error since gpumon started; 0 before any.",
            labels=GPU,
        )
        for idx in sorted(st.gpus):
            rt = st.gpus[idx]
            lv = [str(idx), rt.identity.uuid]
            counts = rt.xid_counts
            if counts is not None:  # kept while the GPU is lost: XID 79 is how it goes
                for code in sorted({*PAGED_XIDS, *counts}, key=_xid_order):
                    xid.add_metric([*lv, code], counts.get(code, 0))
                last_xid.add_metric(lv, float(rt.last_xid or 0))
            s = rt.latest
            if s is None or s.lost:
                continue
            for family, (_, _, _, reading) in zip(plain, HARDWARE_SERIES, strict=True):
                add(family, lv, reading(s))
            bits = s.clock_event_reasons
            if bits is not None:
                for name, bit in CLOCK_EVENT_REASONS:
                    reasons.add_metric([*lv, name], 1.0 if bits & bit else 0.0)
            add_typed(ecc, lv, s.ecc_corrected_errors, s.ecc_uncorrected_errors)
            add_typed(
                ecc_life, lv, s.ecc_corrected_errors_aggregate, s.ecc_uncorrected_errors_aggregate
            )
            add_typed(remapped, lv, s.remapped_rows_corrected, s.remapped_rows_uncorrected)
        return [*plain, reasons, ecc, ecc_life, remapped, xid, last_xid]
