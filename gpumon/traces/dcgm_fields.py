"""DCGM's field names, one table: each field by the three names DCGM gives it -- its
``DCGM_FI_*`` name (dcgm-exporter's metrics), its tag (``gpu_utilization``: what DCGM's
API examples print) and its short name (``GPUTL``: ``dcgmi dmon``'s column) -- with the
gpumon field it fills and the scale from DCGM's unit to gpumon's (memory in MiB, ratios
to percent where gpumon keeps percent).  The dcgmi, Prometheus and long-table readers
read their vocabularies from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DcgmField:
    fi: str  # DCGM_FI_DEV_GPU_UTIL
    tag: str  # gpu_utilization
    shorts: tuple[str, ...]  # GPUTL (and the short names older dcgmi versions print)
    field: str  # gpumon's field
    scale: float = 1.0  # DCGM's unit to gpumon's
    rank: int = 0  # lower wins when two fields fill one (power: the average before instant)


FIELDS: tuple[DcgmField, ...] = (
    DcgmField("DCGM_FI_DEV_NAME", "name", ("DVNAM",), "name"),
    DcgmField("DCGM_FI_DEV_NVML_INDEX", "nvml_index", ("NVIDX",), "index"),
    DcgmField("DCGM_FI_DEV_SM_CLOCK", "sm_clock", ("SMCLK",), "sm_clock"),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", "gpu_temp", ("TMPTR", "GTEMP", "GPUT"), "temp"),
    DcgmField("DCGM_FI_DEV_POWER_USAGE", "power_usage", ("POWER", "POWR"), "power"),
    DcgmField("DCGM_FI_DEV_POWER_USAGE_INSTANT", "power_usage_instant", (), "power", rank=1),
    DcgmField("DCGM_FI_DEV_POWER_MGMT_LIMIT", "power_management_limit", ("PMLMT",), "power_limit"),
    DcgmField(
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "enforced_power_limit", ("EPLMT",), "power_limit"
    ),
    DcgmField("DCGM_FI_DEV_GPU_UTIL", "gpu_utilization", ("GPUTL",), "util"),
    DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", "mem_copy_utilization", ("MCUTL",), "mem_util"),
    DcgmField("DCGM_FI_DEV_FB_TOTAL", "fb_total", ("FBTTL",), "mem_total"),
    DcgmField("DCGM_FI_DEV_FB_FREE", "fb_free", ("FBFRE",), "mem_free"),
    DcgmField("DCGM_FI_DEV_FB_USED", "fb_used", ("FBUSD",), "mem_used"),
    # The clock event (throttle) reasons, a bitmask as NVML's (bit 0: the GPU is idle).
    DcgmField(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "current_clock_throttle_reasons",
        ("DVCCTR",),
        "reasons",
    ),
    DcgmField("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "clocks_event_reasons", (), "reasons"),
    # Profiling fields are ratios 0-1; the graphics engine's stands in for utilisation (%).
    DcgmField("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gr_engine_active", ("GRACT",), "util_prof", 100.0),
    DcgmField("DCGM_FI_PROF_SM_ACTIVE", "sm_active", ("SMACT",), "sm_active"),
    DcgmField("DCGM_FI_PROF_SM_OCCUPANCY", "sm_occupancy", ("SMOCC",), "sm_occupancy"),
    DcgmField("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active", ("TENSO",), "tensor_active"),
    DcgmField("DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx_bytes", ("PCITX",), "pcie_tx"),
    DcgmField("DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx_bytes", ("PCIRX",), "pcie_rx"),
)

BY_FI: dict[str, DcgmField] = {f.fi: f for f in FIELDS}
BY_TAG: dict[str, DcgmField] = {f.tag: f for f in FIELDS}
BY_SHORT: dict[str, DcgmField] = {s: f for f in FIELDS for s in f.shorts}


def lookup(name: str) -> DcgmField | None:
    """A field by any of its names (``DCGM_FI_DEV_FB_USED``, ``fb_used``, ``FBUSD``, or
    the bare id-less ``DEV_FB_USED``), None for a name DCGM does not give."""
    s = name.strip()
    up = s.upper()
    return (
        BY_FI.get(up)
        or BY_FI.get("DCGM_FI_" + up)
        or BY_TAG.get(s.lower())
        or BY_SHORT.get(up if len(up) <= 5 else "")
    )
