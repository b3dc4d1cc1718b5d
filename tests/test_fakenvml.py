"""Tests of the fake NVML library itself, driven through the real pynvml bindings."""

from __future__ import annotations

import ctypes
import itertools
import json
import subprocess
import sys
import textwrap
import threading
import time

import pynvml
import pytest
from fakenvml import (
    CALL_NAMES,
    FakeGPU,
    GiB,
    MigInstance,
    Pattern,
    Process,
    Scenario,
    XidError,
)

NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25


class ProcessInfoV1(ctypes.Structure):
    """nvml.h's original nvmlProcessInfo_t (the unversioned symbol); pynvml no longer has it."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


def _init(fake_nvml, scenario: Scenario) -> ctypes.CDLL:
    fake_nvml.set(scenario, settle=0)
    lib = fake_nvml.load()
    pynvml.nvmlInit()
    return lib


def _run_child(code: str, env: dict[str, str]) -> dict:
    """Run ``code`` in a fresh interpreter (LD_LIBRARY_PATH must be set at start); its JSON."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- layouts
@pytest.mark.parametrize(
    ("c_name", "py_struct", "expected"),
    [
        ("nvmlSample_t", pynvml.c_nvmlSample_t, 16),
        ("nvmlValue_t", pynvml.c_nvmlValue_t, 8),
        ("nvmlMemory_t", pynvml.c_nvmlMemory_t, 24),
        ("nvmlMemory_v2_t", pynvml.c_nvmlMemory_v2_t, 40),
        ("nvmlPciInfo_t", pynvml.nvmlPciInfo_t, 68),
        ("nvmlProcessInfo_t", pynvml.c_nvmlProcessInfo_v3_t, 24),
        ("nvmlProcessInfo_t", pynvml.c_nvmlProcessInfo_v2_t, 24),
        ("nvmlProcessInfo_v1_t", ProcessInfoV1, 16),
        ("nvmlProcessUtilizationSample_t", pynvml.c_nvmlProcessUtilizationSample_t, 32),
        ("nvmlProcessUtilizationInfo_v1_t", pynvml.c_nvmlProcessUtilizationInfo_v1_t, 40),
        ("nvmlProcessesUtilizationInfo_t", pynvml.c_nvmlProcessesUtilizationInfo_v1_t, 24),
        ("nvmlUtilization_t", pynvml.c_nvmlUtilization_t, 8),
        ("nvmlFieldValue_t", pynvml.c_nvmlFieldValue_t, 40),
        ("nvmlTemperature_t", pynvml.c_nvmlTemperature_v1_t, 12),
        ("nvmlBAR1Memory_t", pynvml.c_nvmlBAR1Memory_t, 24),
        ("nvmlGpmSupport_t", pynvml.c_nvmlGpmSupport_t, 8),
        ("nvmlEventData_t", pynvml.c_nvmlEventData_t, 32),
    ],
)
def test_struct_sizes_match_pynvml(fake_nvml_lib, c_name, py_struct, expected):
    lib = ctypes.CDLL(str(fake_nvml_lib))
    lib.fakenvml_sizeof.argtypes = [ctypes.c_char_p]
    assert lib.fakenvml_sizeof(c_name.encode()) == expected
    assert ctypes.sizeof(py_struct) == expected


def test_gpm_layouts_match_pynvml(fake_nvml_lib):
    """The metrics request: its header (version, count, two sample handles) and one metric
    entry, as pynvml lays them out; the fake reads only numMetrics entries, so pynvml's
    NVML_GPM_METRIC_MAX (98 in older bindings, 477 in newer) does not matter."""
    lib = ctypes.CDLL(str(fake_nvml_lib))
    lib.fakenvml_sizeof.argtypes = [ctypes.c_char_p]
    assert lib.fakenvml_sizeof(b"nvmlGpmMetric_t") == ctypes.sizeof(pynvml.c_nvmlGpmMetric_t)
    assert ctypes.sizeof(pynvml.c_nvmlGpmMetric_t) == 40
    offset = lib.fakenvml_sizeof(b"nvmlGpmMetricsGet_t.metrics")
    assert offset == pynvml.c_nvmlGpmMetricsGet_t.metrics.offset == 24
    assert pynvml.NVML_GPM_METRICS_GET_VERSION == pynvml.NVML_GPM_SUPPORT_VERSION == 1


def test_versioned_struct_constants_match_pynvml():
    assert pynvml.nvmlMemory_v2 == ctypes.sizeof(pynvml.c_nvmlMemory_v2_t) | 2 << 24
    info = pynvml.c_nvmlProcessesUtilizationInfo_v1_t
    assert pynvml.ProcessesUtilizationInfo_v1 == ctypes.sizeof(info) | 1 << 24
    assert pynvml.nvmlTemperature_v1 == ctypes.sizeof(pynvml.c_nvmlTemperature_v1_t) | 1 << 24


# --------------------------------------------------------------------------- values
def test_identity_and_static_values(fake_nvml):
    scn = Scenario(
        gpus=[
            FakeGPU(name="NVIDIA A100-SXM4-40GB", mem_total=40 * GiB, mem_used=3 * GiB,
                    power_limit_w=400, temperature_c=55, pcie_rx_kbps=1234, pcie_tx_kbps=567,
                    sm_clock_mhz=1410, fan_pct=0),
            FakeGPU(uuid="GPU-12345678-abcd-ef01-2345-6789abcdef01", bus_id="00000000:9A:00.0"),
        ],
        driver_version="535.104.05",
        cuda_version=12020,
    )  # fmt: skip
    _init(fake_nvml, scn)
    assert pynvml.nvmlSystemGetDriverVersion() == "535.104.05"
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12020
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12020
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.550.54.15"
    assert pynvml.nvmlDeviceGetCount() == 2

    h0 = pynvml.nvmlDeviceGetHandleByIndex(0)
    h1 = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetName(h0) == "NVIDIA A100-SXM4-40GB"
    assert pynvml.nvmlDeviceGetIndex(h1) == 1
    uuid1 = pynvml.nvmlDeviceGetUUID(h1)
    assert uuid1 == "GPU-12345678-abcd-ef01-2345-6789abcdef01"
    assert pynvml.nvmlDeviceGetUUID(h0) != uuid1
    assert pynvml.nvmlDeviceGetUUID(h0).startswith("GPU-")
    pci = pynvml.nvmlDeviceGetPciInfo(h1)
    assert (pci.busId, pci.bus, pci.domain) == ("00000000:9A:00.0", 0x9A, 0)
    assert pci.busIdLegacy == "0000:9A:00.0"
    by_uuid = pynvml.nvmlDeviceGetHandleByUUID(uuid1)
    assert pynvml.nvmlDeviceGetIndex(by_uuid) == 1
    by_bus = pynvml.nvmlDeviceGetHandleByPciBusId("00000000:9a:00.0")
    assert pynvml.nvmlDeviceGetIndex(by_bus) == 1
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-nope")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(2)

    mem = pynvml.nvmlDeviceGetMemoryInfo(h0)
    assert (mem.total, mem.used, mem.free) == (40 * GiB, 3 * GiB, 37 * GiB)
    mem2 = pynvml.nvmlDeviceGetMemoryInfo(h0, version=pynvml.nvmlMemory_v2)
    assert mem2.reserved == 512 * 2**20
    assert mem2.used + mem2.reserved == 3 * GiB
    assert mem2.total == mem2.used + mem2.reserved + mem2.free
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h0) == 400_000
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h0) == 400_000
    assert pynvml.nvmlDeviceGetTemperature(h0, pynvml.NVML_TEMPERATURE_GPU) == 55
    assert pynvml.nvmlDeviceGetTemperatureV(h0, pynvml.NVML_TEMPERATURE_GPU) == 55
    assert pynvml.nvmlDeviceGetPcieThroughput(h0, pynvml.NVML_PCIE_UTIL_RX_BYTES) == 1234
    assert pynvml.nvmlDeviceGetPcieThroughput(h0, pynvml.NVML_PCIE_UTIL_TX_BYTES) == 567
    assert pynvml.nvmlDeviceGetClockInfo(h0, pynvml.NVML_CLOCK_SM) == 1410
    assert pynvml.nvmlDeviceGetMaxClockInfo(h1, pynvml.NVML_CLOCK_SM) == 1980
    assert pynvml.nvmlDeviceGetFanSpeed(h0) == 0
    assert pynvml.nvmlDeviceGetPerformanceState(h0) == 0
    assert pynvml.nvmlDeviceGetPersistenceMode(h0) == 1
    assert pynvml.nvmlDeviceGetComputeMode(h0) == 0
    assert pynvml.nvmlDeviceGetDisplayActive(h0) == 0
    assert pynvml.nvmlDeviceGetBrand(h0) == pynvml.NVML_BRAND_NVIDIA
    assert pynvml.nvmlDeviceGetMinorNumber(h1) == 1
    assert pynvml.nvmlDeviceGetSerial(h1) == "165432100001"
    assert pynvml.nvmlDeviceGetCudaComputeCapability(h0) == (9, 0)
    assert pynvml.nvmlDeviceGetMigMode(h0) == [0, 0]  # an H100 with MIG off
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h0) == 0
    assert pynvml.nvmlGpmQueryDeviceSupport(h0).isSupportedDevice == 0
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"


def test_utilization_power_and_clock_reasons_follow_the_pattern(fake_nvml):
    now = time.monotonic()
    scn = Scenario(
        gpus=[
            # 5 whole periods in any 1 s window: the 1 s means are exact.
            FakeGPU(pattern=Pattern.burst(period_s=0.2, duty=0.3)),
            # A busy-wait stall: 100 % "utilisation" at low power.
            FakeGPU(pattern=Pattern.steady(100), power_busy_w=120),
            FakeGPU(pattern=Pattern.off(), clock_reasons=0x4, sm_clock_idle_mhz=345),
            FakeGPU(pattern=Pattern.steady(95)),
        ],
        epoch=now - 10,
    )
    _init(fake_nvml, scn)
    h = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    util0 = pynvml.nvmlDeviceGetUtilizationRates(h[0])
    assert util0.gpu == 30
    assert util0.memory == 12  # 0.3 * mem_busy_pct 40
    assert pynvml.nvmlDeviceGetPowerUsage(h[0]) == 90_000 + 168_000  # idle + 0.3 * (650-90)
    assert pynvml.nvmlDeviceGetUtilizationRates(h[1]).gpu == 100
    assert pynvml.nvmlDeviceGetPowerUsage(h[1]) == 120_000
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h[1]) == 0
    assert pynvml.nvmlDeviceGetUtilizationRates(h[2]).gpu == 0
    assert pynvml.nvmlDeviceGetPowerUsage(h[2]) == 90_000
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h[2]) == 0x4 | 0x1
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h[2]) == 0x5
    assert pynvml.nvmlDeviceGetClockInfo(h[2], pynvml.NVML_CLOCK_SM) == 345
    assert pynvml.nvmlDeviceGetUtilizationRates(h[3]).gpu == 95


def test_energy_integrates_power(fake_nvml):
    _init(fake_nvml, Scenario(gpus=[FakeGPU(pattern=Pattern.steady(), power_busy_w=500)]))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    t0 = time.monotonic()
    e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    time.sleep(0.3)
    e1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    t1 = time.monotonic()
    mean_mw = (e1 - e0) / (t1 - t0)
    assert 500_000 * 0.9 < mean_mw <= 500_000 * 1.01
    fields = pynvml.nvmlDeviceGetFieldValues(
        h, [pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 74]
    )
    assert fields[0].nvmlReturn == 0
    assert fields[0].value.uiVal == 500_000
    assert fields[1].value.ullVal >= e1
    assert fields[2].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED  # a field the fake lacks


# --------------------------------------------------------------------------- driver samples
def _sample_times_to_monotonic(clock: str) -> float:
    """Offset to subtract from a sample timestamp (s) to get time.monotonic() seconds."""
    c = {"realtime": time.CLOCK_REALTIME, "monotonic": time.CLOCK_MONOTONIC,
         "boottime": time.CLOCK_BOOTTIME}[clock]  # fmt: skip
    return time.clock_gettime(c) - time.monotonic()


@pytest.mark.parametrize("clock", ["realtime", "monotonic", "boottime"])
def test_burst_samples_integrate_the_pattern(fake_nvml, clock):
    period = 0.1
    pattern = Pattern.burst(period_s=0.7, duty=0.4, busy_pct=90, idle_pct=5)
    epoch = time.monotonic() - 30
    scn = Scenario(
        gpus=[FakeGPU(pattern=pattern, sample_period_s=period, buffer_len=50)],
        timestamp_clock=clock,
        epoch=epoch,
    )
    _init(fake_nvml, scn)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    offset = _sample_times_to_monotonic(clock)
    vtype, samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    now_ts = (time.monotonic() + offset) * 1e6
    assert vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert len(samples) == 50
    stamps = [s.timeStamp for s in samples]
    assert all(b - a == 100_000 for a, b in itertools.pairwise(stamps))
    assert stamps[0] % 100_000 == 0
    assert 0 <= now_ts - stamps[-1] < 100_000 + 500_000  # the newest sample is recent
    values = [s.sampleValue.uiVal for s in samples]
    for ts, value in zip(stamps, values, strict=True):
        t1 = ts / 1e6 - offset
        frac = pattern.busy_fraction(t1 - period, t1, epoch)
        expected = frac * 90 + (1 - frac) * 5
        assert abs(value - expected) <= 1.5, (ts, value, expected)
    assert {5, 90} <= set(values)  # whole idle and whole busy periods both occur
    assert any(5 < v < 90 for v in values)  # and periods straddling an edge

    # Only samples newer than lastSeenTimeStamp come back.
    _, newer = pynvml.nvmlDeviceGetSamples(h, 1, stamps[-3])
    assert [s.timeStamp for s in newer][:2] == stamps[-2:]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetSamples(h, 1, stamps[-1] + 10 * 100_000)


def test_default_epoch_starts_patterns_on_a_sample_boundary(fake_nvml):
    """Without an explicit epoch the values are deterministic: busy 0.3 s of every 1 s, read
    in 1/6 s samples, is always one full 100 %, one 80 % and four idle samples per period."""
    _init(fake_nvml, Scenario.uniform(1, pattern=Pattern.burst(1.0, 0.3)))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    _, samples = pynvml.nvmlDeviceGetSamples(h, 1, 0)
    values = [s.sampleValue.uiVal for s in samples]
    assert len(values) == 120
    assert set(values) == {100, 80, 0}
    assert values.count(100) == 20
    assert values.count(80) == 20


def test_sample_noise_is_deterministic_and_bounded(fake_nvml):
    scn = Scenario(gpus=[FakeGPU(pattern=Pattern.steady(50, noise_pct=10))])
    _init(fake_nvml, scn)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    _, a = pynvml.nvmlDeviceGetSamples(h, 1, 0)
    _, b = pynvml.nvmlDeviceGetSamples(h, 1, a[-5].timeStamp - 1)
    va = {s.timeStamp: s.sampleValue.uiVal for s in a}
    assert all(va[s.timeStamp] == s.sampleValue.uiVal for s in b[:5])
    assert all(40 <= v <= 60 for v in va.values())
    assert len(set(va.values())) > 5


def test_idle_periods_record_no_samples_when_asked(fake_nvml):
    scn = Scenario(
        gpus=[
            FakeGPU(pattern=Pattern.off(), idle_no_samples=True),
            FakeGPU(pattern=Pattern.off()),
            FakeGPU(pattern=Pattern.burst(1.0, 0.3), idle_no_samples=True, sample_period_s=0.1),
            FakeGPU(samples_supported=False),
        ],
        epoch=time.monotonic() - 20,
    )
    _init(fake_nvml, scn)
    h = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetSamples(h[0], 1, 0)
    _, zeros = pynvml.nvmlDeviceGetSamples(h[1], 1, 0)
    assert len(zeros) == 120
    assert {s.sampleValue.uiVal for s in zeros} == {0}
    _, busy = pynvml.nvmlDeviceGetSamples(h[2], 1, 0)
    assert 0 < len(busy) < 120
    assert all(s.sampleValue.uiVal > 0 for s in busy)
    # 3 of every 10 slots are wholly busy, one more straddles the edge: about 40 %.
    assert 0.3 <= len(busy) / 120 <= 0.5
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetSamples(h[3], 1, 0)


def test_idle_no_samples_skips_a_period_busy_under_half_a_percent(fake_nvml):
    # The burst starts 0.3 ms before a sample period ends: that period reads 0 % busy, so a
    # driver that records only busy periods records nothing for it, never a sample of 0.
    burst = Pattern.burst(1.0, 0.3, phase_s=-0.0997)
    scn = Scenario(gpus=[FakeGPU(pattern=burst, idle_no_samples=True, sample_period_s=0.1)])
    _init(fake_nvml, scn)
    time.sleep(2.5)
    _, busy = pynvml.nvmlDeviceGetSamples(pynvml.nvmlDeviceGetHandleByIndex(0), 1, 0)
    assert len(busy) >= 6
    assert {s.sampleValue.uiVal for s in busy} == {100}


def test_samples_size_query_returns_success_and_count(fake_nvml):
    lib = _init(fake_nvml, Scenario(gpus=[FakeGPU(buffer_len=30)]))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    vtype, count = ctypes.c_int(), ctypes.c_uint(0)
    ret = lib.nvmlDeviceGetSamples(h, 1, ctypes.c_ulonglong(0), ctypes.byref(vtype),
                                   ctypes.byref(count), None)  # fmt: skip
    assert ret == NVML_SUCCESS
    assert count.value == 30
    # A buffer smaller than the count gets the oldest samples, and the count says how many.
    buf = (pynvml.c_nvmlSample_t * 4)()
    count.value = 4
    ret = lib.nvmlDeviceGetSamples(h, 1, ctypes.c_ulonglong(0), ctypes.byref(vtype),
                                   ctypes.byref(count), buf)  # fmt: skip
    assert ret == NVML_SUCCESS
    assert count.value == 4
    assert buf[0].timeStamp < buf[3].timeStamp


# --------------------------------------------------------------------------- processes
def test_running_processes_and_size_protocol(fake_nvml):
    scn = Scenario(
        gpus=[
            FakeGPU(processes=[Process(4242, 2 * GiB, sm_util=70, mem_util=20), Process(77, GiB)]),
            FakeGPU(),
        ]
    )
    lib = _init(fake_nvml, scn)
    h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h0)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(4242, 2 * GiB), (77, GiB)]
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h0)] == [4242, 77]
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h1) == []
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(h0) == []
    mem = pynvml.nvmlDeviceGetMemoryInfo(h0)
    assert mem.used == 3 * GiB + 512 * 2**20  # reserved + the processes

    count = ctypes.c_uint(1)
    buf = (pynvml.c_nvmlProcessInfo_v3_t * 1)()
    ret = lib.nvmlDeviceGetComputeRunningProcesses_v3(h0, ctypes.byref(count), buf)
    assert (ret, count.value) == (NVML_ERROR_INSUFFICIENT_SIZE, 2)
    # The unversioned C symbol fills the original 16-byte struct.
    count = ctypes.c_uint(2)
    v1 = (ProcessInfoV1 * 2)()
    assert lib.nvmlDeviceGetComputeRunningProcesses(h0, ctypes.byref(count), v1) == 0
    assert (v1[1].pid, v1[1].usedGpuMemory) == (77, GiB)

    # Process utilisation: the NULL size query must answer INSUFFICIENT_SIZE.
    count = ctypes.c_uint(0)
    ret = lib.nvmlDeviceGetProcessUtilization(h0, None, ctypes.byref(count), ctypes.c_ulonglong(0))
    assert (ret, count.value) == (NVML_ERROR_INSUFFICIENT_SIZE, 2)
    samples = pynvml.nvmlDeviceGetProcessUtilization(h0, 0)
    assert [(s.pid, s.smUtil, s.memUtil) for s in samples] == [(4242, 70, 20), (77, 100, 0)]
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer than the last sample
        pynvml.nvmlDeviceGetProcessUtilization(h0, samples[0].timeStamp + 10**9)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(h1, 0)
    infos = pynvml.nvmlDeviceGetProcessesUtilizationInfo(h0, 0)
    assert [(i.pid, i.smUtil) for i in infos] == [(4242, 70), (77, 100)]
    assert infos[0].timeStamp >= samples[0].timeStamp
    assert infos[0].timeStamp % 166_667 == 0  # a driver sample's timestamp


# --------------------------------------------------------------------------- GPM and MIG
def _metrics_request(ids: list[int], first, second):
    req = pynvml.c_nvmlGpmMetricsGet_t()
    req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = len(ids)
    req.sample1, req.sample2 = first, second
    for i, metric_id in enumerate(ids):
        req.metrics[i].metricId = metric_id
    return req


def test_gpm_samples_and_metrics(fake_nvml):
    scn = Scenario(
        gpus=[
            FakeGPU(gpm_supported=True, gpm_sm_active_pct=2.0, gpm_tensor_active_pct=None),
            FakeGPU(gpm_supported=True, pattern=Pattern.off()),
            FakeGPU(),
        ]
    )
    _init(fake_nvml, scn)
    h0, h1, h2 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(3))
    assert pynvml.nvmlGpmQueryDeviceSupport(h0).isSupportedDevice == 1
    assert pynvml.nvmlGpmQueryDeviceSupport(h2).isSupportedDevice == 0
    a, b, c = (pynvml.nvmlGpmSampleAlloc() for _ in range(3))
    pynvml.nvmlGpmSampleGet(h0, a)
    time.sleep(0.02)
    pynvml.nvmlGpmSampleGet(h0, b)
    ids = [pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
           pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, pynvml.NVML_GPM_METRIC_FP64_UTIL,
           pynvml.NVML_GPM_METRIC_FP32_UTIL, pynvml.NVML_GPM_METRIC_FP16_UTIL,
           pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, pynvml.NVML_GPM_METRIC_INTEGER_UTIL]  # fmt: skip
    req = pynvml.nvmlGpmMetricsGet(_metrics_request(ids, a, b))
    got = [(m.nvmlReturn, m.value) for m in req.metrics[:8]]
    # Each metric's percentage while busy, times the busy share (steady: all of it).
    assert got[:6] == [(0, pytest.approx(p)) for p in (2.0, 40.0, 50.0, 10.0, 20.0, 5.0)]
    # Tensor activity set to None, and a metric the fake does not model: NOT_SUPPORTED.
    assert [r for r, _ in got[6:]] == [pynvml.NVML_ERROR_NOT_SUPPORTED] * 2
    assert req.metrics[0].metricInfo.unit == b"%"
    # Out of order, from two GPUs, unfilled: refused.
    for first, second in ((b, a), (a, c)):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlGpmMetricsGet(_metrics_request(ids, first, second))
    pynvml.nvmlGpmSampleGet(h1, c)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmMetricsGet(_metrics_request(ids, b, c))
    bad = _metrics_request(ids, a, b)
    bad.version = 2
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlGpmMetricsGet(bad)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmSampleGet(h2, a)
    for s in (a, b, c):
        pynvml.nvmlGpmSampleFree(s)


def test_mig_instances_and_their_gpm_samples(fake_nvml):
    scn = Scenario(gpus=[FakeGPU(gpm_supported=True, mig=[MigInstance(1, 50.0),
                                                          MigInstance(9, 10.0)])])  # fmt: skip
    _init(fake_nvml, scn)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(h) == [1, 1]
    slots = pynvml.nvmlDeviceGetMaxMigDeviceCount(h)
    assert slots == 7
    ids = []
    for i in range(slots):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        except pynvml.NVMLError_NotFound:  # an empty slot
            continue
        ids.append(pynvml.nvmlDeviceGetGpuInstanceId(mig))
        assert pynvml.nvmlDeviceGetComputeInstanceId(mig) == 0
        parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        assert pynvml.nvmlDeviceGetIndex(parent) == 0
    assert ids == [1, 9]
    with pytest.raises(pynvml.NVMLError_NotSupported):  # not a MIG device
        pynvml.nvmlDeviceGetGpuInstanceId(h)
    a, b = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotSupported):  # MIG on: read per instance
        pynvml.nvmlGpmSampleGet(h, a)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlGpmMigSampleGet(h, 4, a)
    pynvml.nvmlGpmMigSampleGet(h, 9, a)
    time.sleep(0.02)
    pynvml.nvmlGpmMigSampleGet(h, 9, b)
    req = pynvml.nvmlGpmMetricsGet(_metrics_request([pynvml.NVML_GPM_METRIC_SM_UTIL], a, b))
    assert (req.metrics[0].nvmlReturn, req.metrics[0].value) == (0, pytest.approx(10.0))


# --------------------------------------------------------------------------- hardware health
UINT_MAX = 0xFFFFFFFF


def test_ecc_replay_memory_temperature_and_nvlink_fields(fake_nvml):
    """The slowly changing health fields, each alone in nvmlDeviceGetFieldValues (which
    answers SUCCESS when any field was filled) and through their own calls."""
    scn = Scenario(
        gpus=[
            FakeGPU(ecc_corrected=3, ecc_uncorrected=1, ecc_corrected_aggregate=30,
                    ecc_uncorrected_aggregate=2, pcie_replays=7, memory_temperature_c=61,
                    nvlink_links=4, nvlink_tx_kbps=4000, nvlink_rx_kbps=2000),
            FakeGPU(nvlink_links=0, unsupported={"ecc"}, errors={"pcie_replay": "UNKNOWN"}),
        ]
    )  # fmt: skip
    _init(fake_nvml, scn)
    h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    ids = [
        pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, UINT_MAX),
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, UINT_MAX),
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 1),
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 4),
    ]  # fmt: skip
    time.sleep(0.1)
    v = pynvml.nvmlDeviceGetFieldValues(h0, ids)
    assert [f.nvmlReturn for f in v[:9]] == [0] * 9
    assert [f.value.ullVal for f in v[:4]] == [3, 1, 30, 2]
    assert (v[4].value.uiVal, v[5].value.uiVal) == (61, 7)
    tx, rx, link1 = v[6].value.ullVal, v[7].value.ullVal, v[8].value.ullVal
    assert tx > 0 and rx == pytest.approx(tx / 2, rel=0.01)  # KiB since the library loaded
    assert link1 == pytest.approx(tx / 4, rel=0.01)  # one of four links
    assert v[9].nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT  # no fifth link
    assert pynvml.nvmlDeviceGetFieldValues(h0, ids[6:7])[0].value.ullVal >= tx  # a counter
    assert pynvml.nvmlDeviceGetTotalEccErrors(h0, 1, 0) == 1  # uncorrected, volatile
    assert pynvml.nvmlDeviceGetTotalEccErrors(h0, 0, 1) == 30  # corrected, aggregate
    assert pynvml.nvmlDeviceGetEccMode(h0) == [1, 1]
    assert pynvml.nvmlDeviceGetPcieReplayCounter(h0) == 7
    # Each field fails alone: ECC off, no NVLink, a failing replay counter.
    v = pynvml.nvmlDeviceGetFieldValues(h1, ids[:8])
    assert [f.nvmlReturn for f in v] == [pynvml.NVML_ERROR_NOT_SUPPORTED] * 4 + [
        0, pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
    ]  # fmt: skip
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTotalEccErrors(h1, 1, 0)


def test_xid_errors_arrive_as_events(fake_nvml):
    """An event set delivers each XID of a registered GPU once, oldest first, only those
    after the registration; waiting with timeout 0 never blocks."""
    before = XidError(13, time.monotonic() - 1.0)
    scn = Scenario(gpus=[FakeGPU(xid_errors=[before]), FakeGPU(), FakeGPU(unsupported={"events"})])
    _init(fake_nvml, scn)
    h0, h1, h2 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(3))
    xid = pynvml.nvmlEventTypeXidCriticalError
    assert pynvml.nvmlDeviceGetSupportedEventTypes(h0) & xid
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetSupportedEventTypes(h2)
    es = pynvml.nvmlEventSetCreate()
    for h in (h0, h1):
        pynvml.nvmlDeviceRegisterEvents(h, xid, es)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(h2, xid, es)
    with pytest.raises(pynvml.NVMLError_Timeout):  # the XID before registering is not sent
        pynvml.nvmlEventSetWait_v2(es, 0)
    time.sleep(0.05)
    now = time.monotonic()  # errors at now - 0.01 and now: both after the registration
    later = scn.with_gpu(0, xid_errors=[before, XidError(79, now), XidError(48, now - 0.01)])
    fake_nvml.set(later)
    got = []
    for _ in range(2):
        data = pynvml.nvmlEventSetWait_v2(es, 0)
        assert data.eventType == xid and data.gpuInstanceId == UINT_MAX
        assert pynvml.nvmlDeviceGetIndex(data.device) == 0
        got.append(data.eventData)
    assert got == [48, 79]  # oldest first
    fake_nvml.set(fake_nvml.scenario)  # the same errors again: nothing twice
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 0)
    # GPU 1's error is set only now, due 0.2 s ahead: set earlier, a slow machine could pass
    # its time before the check above, which would then see it
    fake_nvml.set(later.with_gpu(1, xid_errors=[XidError(94, time.monotonic() + 0.2)]))
    data = pynvml.nvmlEventSetWait_v2(es, 5000)  # waits for GPU 1's error
    assert (pynvml.nvmlDeviceGetIndex(data.device), data.eventData) == (1, 94)
    pynvml.nvmlEventSetFree(es)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # freed: stale
        pynvml.nvmlEventSetWait_v2(es, 0)


def test_xid_validation():
    t = time.monotonic()
    with pytest.raises(ValueError, match="same time"):
        Scenario(gpus=[FakeGPU(xid_errors=[XidError(79, t), XidError(48, t)])]).to_text()


# --------------------------------------------------------------------------- versions, errors
def test_version_mismatch_is_reported(fake_nvml):
    lib = _init(fake_nvml, Scenario())
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(h, version=0x01000028)
    temp = pynvml.c_nvmlTemperature_v1_t()
    temp.version = 0x0200000C
    assert lib.nvmlDeviceGetTemperatureV(h, ctypes.byref(temp)) == (
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    )
    info = pynvml.c_nvmlProcessesUtilizationInfo_v1_t()
    info.version = 0x02000018
    assert lib.nvmlDeviceGetProcessesUtilizationInfo(h, ctypes.byref(info)) == (
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    )
    mem = pynvml.c_nvmlMemory_v2_t()
    mem.version = pynvml.nvmlMemory_v2
    assert lib.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(mem)) == NVML_SUCCESS


def test_error_injection(fake_nvml):
    scn = Scenario(
        gpus=[
            FakeGPU(unsupported={"power", "pcie", "samples"}, errors={"temperature": "UNKNOWN"}),
            FakeGPU(lost=True),
            FakeGPU(errors={"processes": "NO_PERMISSION"}),
        ],
        unsupported={"energy"},
    )
    _init(fake_nvml, scn)
    h0 = pynvml.nvmlDeviceGetHandleByIndex(0)
    h2 = pynvml.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(h0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPcieThroughput(h0, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetSamples(h0, 1, 0)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetTemperature(h0, 0)
    for h in (h0, h2):  # scenario-wide "unsupported" reaches every GPU
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert pynvml.nvmlDeviceGetUtilizationRates(h0).gpu == 100  # the rest still works
    assert pynvml.nvmlDeviceGetCount() == 3
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetComputeRunningProcesses(h2)
    assert pynvml.nvmlDeviceGetPowerUsage(h2) > 0


def test_global_errors_and_lost_handle_after_rewrite(fake_nvml):
    _init(fake_nvml, Scenario.uniform(2))
    h1 = pynvml.nvmlDeviceGetHandleByIndex(1)
    fake_nvml.set(Scenario(gpus=[FakeGPU(), FakeGPU(lost=True)], errors={"count": "NO_PERMISSION"}))
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUtilizationRates(h1)
    fake_nvml.set(Scenario.uniform(1))
    with pytest.raises(pynvml.NVMLError_GpuIsLost):  # the GPU vanished
        pynvml.nvmlDeviceGetName(h1)


def test_scenario_validation():
    with pytest.raises(ValueError, match="unknown call name"):
        Scenario(gpus=[FakeGPU(unsupported={"powr"})]).to_text()
    with pytest.raises(ValueError, match="unknown NVML error"):
        Scenario(gpus=[FakeGPU(errors={"power": "BROKEN"})]).to_text()
    with pytest.raises(ValueError):
        Pattern.burst(1.0, duty=1.5)
    assert "samples" in CALL_NAMES


def test_uninitialized_after_shutdown(fake_nvml):
    _init(fake_nvml, Scenario())
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetName(h)
    pynvml.nvmlInit()  # init again reads the scenario again
    assert pynvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"


# --------------------------------------------------------------------------- reload
def test_scenario_reload_while_running(fake_nvml):
    lib = _init(fake_nvml, Scenario.uniform(1, pattern=Pattern.steady()))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    gen = lib.fakenvml_generation()
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == 0
    fake_nvml.set(Scenario.uniform(2, pattern=Pattern.off(), name="NVIDIA L4"))
    assert pynvml.nvmlDeviceGetCount() == 2
    assert pynvml.nvmlDeviceGetName(h) == "NVIDIA L4"
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == 0x1
    assert lib.fakenvml_generation() == gen + 1
    # Without settling, an explicit reload makes the change visible at once.
    fake_nvml.set(Scenario.uniform(3), settle=0)
    lib.fakenvml_reload()
    assert pynvml.nvmlDeviceGetCount() == 3


def test_steady_to_burst_switch_keeps_the_past(fake_nvml):
    """A rewrite starts the new pattern when written; samples from before it stay steady."""
    sp = 0.05
    _init(fake_nvml, Scenario.uniform(1, pattern=Pattern.steady(), sample_period_s=sp))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    _, before = pynvml.nvmlDeviceGetSamples(h, 1, 0)
    assert {s.sampleValue.uiVal for s in before} == {100}
    time.sleep(0.3)  # unread steady samples accumulate
    written_us = time.time() * 1e6
    fake_nvml.set(Scenario.uniform(1, pattern=Pattern.burst(0.4, 0.5), sample_period_s=sp))
    time.sleep(0.85)
    _, after = pynvml.nvmlDeviceGetSamples(h, 1, before[-1].timeStamp)
    old = [s.sampleValue.uiVal for s in after if s.timeStamp <= written_us - sp * 1e6]
    new = [s.sampleValue.uiVal for s in after if s.timeStamp > written_us + sp * 1e6]
    assert len(old) >= 4
    assert set(old) == {100}
    assert 0 in new
    assert 100 in new
    assert 0.3 <= sum(new) / (100 * len(new)) <= 0.7


def test_rewrite_with_an_unchanged_pattern_keeps_its_phase(fake_nvml):
    sp, period = 0.05, 0.4
    pattern = Pattern.burst(period, 0.5)
    epoch = time.monotonic() - 10
    _init(fake_nvml, Scenario.uniform(1, pattern=pattern, sample_period_s=sp, epoch=epoch))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    # Rewrite half a period out of phase, where a restarted pattern would be inverted.
    time.sleep(period - (time.monotonic() - epoch) % period + period / 2)
    scn = Scenario.uniform(1, pattern=pattern, sample_period_s=sp, name="renamed")
    fake_nvml.set(scn)
    assert pynvml.nvmlDeviceGetName(h) == "renamed"
    time.sleep(0.5)
    offset = _sample_times_to_monotonic("realtime")
    _, samples = pynvml.nvmlDeviceGetSamples(h, 1, 0)
    for s in samples[-12:]:
        t1 = s.timeStamp / 1e6 - offset
        expected = 100 * pattern.busy_fraction(t1 - sp, t1, epoch)
        assert abs(s.sampleValue.uiVal - expected) <= 1.5


def test_reload_is_thread_safe(fake_nvml):
    _init(fake_nvml, Scenario.uniform(4))
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    stop = threading.Event()
    seen: set[str] = set()
    errors: list[BaseException] = []

    def hammer() -> None:
        while not stop.is_set():
            for h in handles:
                try:
                    seen.add(pynvml.nvmlDeviceGetName(h))
                    pynvml.nvmlDeviceGetSamples(h, 1, 0)
                    pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                except pynvml.NVMLError_GpuIsLost:
                    pass
                except BaseException as exc:
                    errors.append(exc)

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        for i in range(40):
            n = 2 + i % 3
            procs = [Process(1000 + j, GiB) for j in range(i % 5)]
            fake_nvml.set(Scenario.uniform(n, name=f"GPU gen {i % 2}", processes=procs),
                          settle=0.012)  # fmt: skip
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert {"GPU gen 0", "GPU gen 1"} <= seen


# --------------------------------------------------------------------------- child processes
def test_child_process_uses_the_fake(fake_nvml):
    scn = Scenario(gpus=[FakeGPU(name="NVIDIA H200"), FakeGPU(processes=[Process(9, GiB)])])
    fake_nvml.set(scn, settle=0)
    out = _run_child(
        """
        import json, pynvml
        pynvml.nvmlInit()
        h = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        print(json.dumps({
            "names": [pynvml.nvmlDeviceGetName(x) for x in h],
            "pids": [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h[1])],
            "driver": pynvml.nvmlSystemGetDriverVersion(),
        }))
        """,
        fake_nvml.env,
    )
    assert out == {"names": ["NVIDIA H200", "NVIDIA H100 80GB HBM3"], "pids": [9],
                   "driver": "550.54.15"}  # fmt: skip


def test_driver_not_loaded_and_missing_library(fake_nvml):
    code = """
        import json, pynvml
        try:
            pynvml.nvmlInit()
            print(json.dumps({"error": None}))
        except pynvml.NVMLError as e:
            print(json.dumps({"error": type(e).__name__}))
        """
    fake_nvml.set(Scenario.no_driver(), settle=0)
    assert _run_child(code, fake_nvml.env) == {"error": "NVMLError_DriverNotLoaded"}
    assert _run_child(code, fake_nvml.missing_env()) == {"error": "NVMLError_LibraryNotFound"}
    env = dict(fake_nvml.env)
    del env["FAKE_NVML_SCENARIO"]  # the library but no scenario: no driver either
    assert _run_child(code, env) == {"error": "NVMLError_DriverNotLoaded"}


def test_in_process_init_error(fake_nvml):
    fake_nvml.set(Scenario(init_error="DRIVER_NOT_LOADED"), settle=0)
    fake_nvml.load()
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    fake_nvml.set(Scenario(), settle=0)
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 1


def test_call_overhead_is_small(fake_nvml):
    lib = _init(fake_nvml, Scenario())
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    util = pynvml.c_nvmlUtilization_t()
    fn = lib.nvmlDeviceGetUtilizationRates
    ref = ctypes.byref(util)
    best = float("inf")
    for _ in range(5):  # best of five: robust against a busy machine
        t0 = time.perf_counter()
        for _ in range(2000):
            fn(h, ref)
        best = min(best, (time.perf_counter() - t0) / 2000)
    assert util.gpu == 100
    assert best < 20e-6


@pytest.mark.parametrize("tool", ["gpustat", "nvitop"])
def test_common_monitors_run_against_the_fake(fake_nvml, tool):
    """gpustat and nvitop (the benchmark's baselines) read the scripted values."""
    pytest.importorskip(tool)
    fake_nvml.set(
        Scenario(gpus=[FakeGPU(pattern=Pattern.steady(95), processes=[Process(1, GiB)]),
                       FakeGPU(lost=True)]),
        settle=0,
    )  # fmt: skip
    code = {
        "gpustat": """
            import json, gpustat
            gpus = gpustat.new_query().jsonify()["gpus"]
            print(json.dumps([g["utilization.gpu"] for g in gpus[:1]]))
            """,
        "nvitop": """
            import json
            from nvitop import Device
            print(json.dumps([Device(0).gpu_utilization(), Device.count()]))
            """,
    }[tool]
    out = _run_child(code, fake_nvml.env)
    assert out[0] == 95
