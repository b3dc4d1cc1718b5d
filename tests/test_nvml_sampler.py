"""The NVML sampler through the real pynvml bindings against the fake libnvidia-ml.so.1."""

from __future__ import annotations

import contextlib
import itertools
import json
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fakenvml import FakeGPU, GiB, Pattern, Process, Scenario, XidError, call_count

import gpumon.sample.nvml as nvml_module
from gpumon.sample.nvml import NvmlSampler
from gpumon.traces.jsonl import TraceReader


@pytest.fixture
def nvml(fake_nvml, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The fake loaded into this process; gpumon's once-per-process init flag reset."""
    fake_nvml.load()
    monkeypatch.setattr(nvml_module, "_init_done", False)
    yield fake_nvml


def test_values_match_the_scenario(nvml) -> None:
    nvml.set(
        Scenario(
            gpus=[
                FakeGPU(
                    pattern=Pattern.steady(100.0),
                    processes=[Process(4242, 2 * GiB, sm_util=87)],
                    mem_reserved=0,
                    power_busy_w=650.0,
                    temperature_c=55,
                    pcie_rx_kbps=1000,
                ),
                FakeGPU(
                    name="NVIDIA A100-SXM4-40GB",
                    mem_total=40 * GiB,
                    pattern=Pattern.off(),
                    power_limit_w=400.0,
                    power_idle_w=60.0,
                ),
            ],
            epoch=time.monotonic() - 5.0,
        )
    )
    sampler = NvmlSampler()
    assert sampler.driver_version == "550.54.15"
    g0, g1 = sampler.gpus
    assert (g0.index, g1.index) == (0, 1)
    assert g0.uuid != g1.uuid and g0.uuid.startswith("GPU-")
    assert g1.name == "NVIDIA A100-SXM4-40GB"
    assert g0.pci_bus_id == "00000000:17:00.0"
    assert g1.mem_total_bytes == 40 * GiB
    assert g1.power_limit_watts == 400.0

    time.sleep(0.4)
    s0, s1 = sampler.sample()
    assert s0.uuid == g0.uuid and s0.gpu == 0
    assert s0.util_pct == 100.0 and s1.util_pct == 0.0
    assert s0.mem_used_bytes == 2 * GiB and s0.mem_total_bytes == 80 * GiB
    assert s0.power_watts == pytest.approx(650.0, abs=1.0)
    assert s1.power_watts == pytest.approx(60.0, abs=1.0)
    assert s0.power_limit_watts == 700.0
    assert s0.temperature_c == 55.0
    assert s0.sm_clock_mhz == 1980
    assert s0.pcie_rx_bytes_per_s == 1000 * 1024.0
    assert s0.processes is not None and [p.pid for p in s0.processes] == [4242]
    assert s0.processes[0].used_mem_bytes == 2 * GiB
    assert s0.processes[0].sm_util_pct == 87.0
    assert s1.processes == ()
    assert s1.clock_event_reasons is not None and s1.clock_event_reasons & 0x1  # idle
    assert not s0.lost and s0.unsupported == ()


def test_burst_samples_come_through_without_loss_between_ticks(nvml) -> None:
    period, duty, sample_period = 1.0, 0.3, 1.0 / 6.0
    nvml.set(
        Scenario(gpus=[FakeGPU(pattern=Pattern.burst(period, duty), sample_period_s=sample_period)])
    )
    sampler = NvmlSampler()
    points = []
    start = time.monotonic()
    while time.monotonic() - start < 3.6:
        time.sleep(0.7)  # ticks far slower than the driver's sample period
        (sample,) = sampler.sample()
        points.extend(sample.util_samples)
    times = [t for t, _ in points]  # (t_s, util_pct) pairs
    assert times == sorted(times) and len(set(times)) == len(times)  # no duplicates
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) == pytest.approx(sample_period, abs=0.01)  # nothing lost between ticks
    assert len(points) >= int(3.4 / sample_period)
    # Converted to our monotonic clock: within the sampling window.
    assert start - 0.01 <= times[0] and times[-1] <= time.monotonic()
    # The pattern survives: the sampled duty cycle is the scenario's, not a smeared 100 %.
    mean = sum(u for _, u in points) / len(points) / 100.0
    assert mean == pytest.approx(duty, abs=0.08)
    assert min(u for _, u in points) == 0.0 and max(u for _, u in points) == 100.0


def test_one_call_sample_buffer_reads_what_pynvml_reads(nvml) -> None:
    """The one-call buffer read, pynvml's two-call wrapper and the full-buffer fallback
    give the same points and move the cursor alike."""
    scn = Scenario(
        gpus=[FakeGPU(pattern=Pattern.burst(1.0, 0.3, noise_pct=5.0))],
        epoch=time.monotonic() - 30.0,  # a full driver history (120 samples) to read
    )
    nvml.set(scn)
    fast, slow, tiny = (NvmlSampler(start_s=0.0) for _ in range(3))
    assert fast._gpus[0].sample_buffer is not None
    slow._gpus[0].sample_buffer = None  # pynvml's nvmlDeviceGetSamples
    # Smaller than the driver's history: "full", so it falls back to pynvml.
    tiny._gpus[0].sample_buffer = nvml_module._SampleBuffer.create(capacity=8)
    points: list[list] = [[], [], []]
    for _ in range(6):
        for got, sampler in zip(points, (fast, slow, tiny), strict=True):
            got.extend(sampler.sample()[0].util_samples)
        time.sleep(0.3)
    # A driver sample may land between the three reads (a new one at the end, the oldest
    # gone from the start of the history): compare the span all three read.
    start = max(got[0][0] for got in points) - 1e-3
    end = min(got[-1][0] for got in points) + 1e-3
    common = [[(t, u) for t, u in got if start <= t <= end] for got in points]
    assert len(common[0]) >= 110  # the driver's history (120), then the new samples
    values = [[u for _, u in got] for got in common]
    assert values[0] == values[1] == values[2]
    ts = [[t for t, _ in got] for got in common]
    assert ts[0] == pytest.approx(ts[1], abs=1e-3) == ts[2]


@pytest.mark.parametrize("clock", ["realtime", "monotonic", "boottime"])
def test_sample_timestamps_on_any_clock_land_on_ours(nvml, clock: str) -> None:
    nvml.set(Scenario(timestamp_clock=clock))
    sampler = NvmlSampler()
    time.sleep(0.5)
    before = time.monotonic()
    (sample,) = sampler.sample()
    assert sample.util_samples
    chosen = sampler._gpus[0].clock.clock_name
    clocks = {
        "realtime": time.CLOCK_REALTIME,
        "monotonic": time.CLOCK_MONOTONIC,
        "boottime": time.CLOCK_BOOTTIME,
    }
    # Without a suspend since boot, monotonic and boottime agree: either is right then.
    assert chosen in clocks
    skew = abs(time.clock_gettime(clocks[chosen]) - time.clock_gettime(clocks[clock]))
    assert skew < 1.0
    for t, _ in sample.util_samples:
        assert sampler.start_s - 0.2 <= t <= before + 0.01


def test_samples_buffered_before_start_are_not_replayed(nvml) -> None:
    nvml.set(Scenario(epoch=time.monotonic() - 30.0))  # the buffer is full of old samples
    sampler = NvmlSampler()
    (sample,) = sampler.sample()
    assert all(t >= sampler.start_s for t, _ in sample.util_samples)


def test_unsupported_fields_are_absent_and_retried_only_later(nvml) -> None:
    nvml.set(Scenario(gpus=[FakeGPU(unsupported={"power", "temperature", "pcie", "samples"})]))
    sampler = NvmlSampler(retry_unsupported_s=3600.0)
    time.sleep(0.3)
    (s,) = sampler.sample()
    assert s.power_watts is None and s.temperature_c is None
    assert s.pcie_rx_bytes_per_s is None and s.util_samples == ()
    assert s.util_pct == 100.0  # the fallback when the sample buffer is unsupported
    assert s.mem_used_bytes is not None
    assert {"power", "temperature", "pcie", "samples"} <= set(s.unsupported)
    assert sampler.errors == {}  # NotSupported is not an error
    # The card gains support, but the sampler does not ask again before the retry time...
    nvml.set(Scenario())
    (s,) = sampler.sample()
    assert s.power_watts is None
    # ...and does once it is due.
    sampler.retry_unsupported_s = 0.0
    for st in sampler._gpus:
        st.unsupported_until = dict.fromkeys(st.unsupported_until, 0.0)
    (s,) = sampler.sample()
    assert s.power_watts is not None and s.temperature_c is not None
    assert "power" not in s.unsupported


def test_errors_leave_a_field_none_and_are_counted(nvml) -> None:
    nvml.set(Scenario(gpus=[FakeGPU(errors={"power": "UNKNOWN"})]))
    sampler = NvmlSampler()
    (s,) = sampler.sample()
    assert s.power_watts is None
    assert s.mem_used_bytes is not None
    assert sampler.errors["unknown"] >= 1


HEALTHY_H100 = FakeGPU(
    ecc_corrected=5, ecc_uncorrected=1, ecc_corrected_aggregate=50, ecc_uncorrected_aggregate=3,
    pcie_replays=12, memory_temperature_c=64, fan_pct=42, nvlink_tx_kbps=1 << 20,
    nvlink_rx_kbps=1 << 19, mem_clock_mhz=2619,
)  # fmt: skip


def test_hardware_health_is_read_every_few_seconds_in_one_field_call(nvml) -> None:
    nvml.set(Scenario(gpus=[HEALTHY_H100, HEALTHY_H100]))
    sampler = NvmlSampler(hardware_every_s=3600.0)
    fields, fans = call_count("field_values"), call_count("fan")
    first = sampler.sample()
    assert call_count("field_values") - fields == 2  # one call per GPU for every counter
    for g in first:
        assert (g.mem_clock_mhz, g.memory_temperature_c, g.fan_speed_pct, g.pstate) == (
            2619, 64.0, 42.0, 0,
        )  # fmt: skip
        assert (g.ecc_corrected_errors, g.ecc_uncorrected_errors) == (5, 1)
        assert (g.ecc_corrected_errors_aggregate, g.ecc_uncorrected_errors_aggregate) == (50, 3)
        assert g.pcie_replays == 12 and g.energy_joules is not None and g.energy_joules > 0
        # KiB counters since the driver loaded, in bytes: TX at twice RX's rate.
        assert g.nvlink_tx_bytes is not None and g.nvlink_rx_bytes is not None
        assert g.nvlink_tx_bytes % 1024 == 0
        assert g.nvlink_tx_bytes == pytest.approx(2 * g.nvlink_rx_bytes, rel=0.05)
        assert g.unsupported == ()
    nvml.set(Scenario(gpus=[replace(HEALTHY_H100, ecc_corrected=6)] * 2))
    again = sampler.sample()
    assert call_count("field_values") - fields == 2 and call_count("fan") - fans == 2
    assert again[0].ecc_corrected_errors == 5  # not read again before hardware_every_s
    sampler.hardware_every_s = 0.0
    assert sampler.sample()[0].ecc_corrected_errors == 6
    assert sampler.errors == {}


def test_health_fields_not_supported_are_left_alone_on_the_fast_path(nvml) -> None:
    """A PCIe card without fan, NVLink or ECC: those are asked once and not again, and the
    GPU keeps the tick's fast path (nothing in unsupported_until)."""
    pcie_card = FakeGPU(nvlink_links=0, unsupported={"fan", "ecc", "events"})
    nvml.set(Scenario(gpus=[pcie_card]))
    sampler = NvmlSampler(hardware_every_s=0.0)
    (g,) = sampler.sample()
    assert g.fan_speed_pct is None and g.nvlink_tx_bytes is None
    assert g.ecc_corrected_errors is None and g.ecc_uncorrected_errors_aggregate is None
    assert g.pcie_replays == 0 and g.memory_temperature_c == 50.0  # the rest still read
    assert set(g.unsupported) == {"fan", "ecc_volatile", "ecc_aggregate", "nvlink", "xid_events"}
    fans, waits = call_count("fan"), call_count("events")
    for _ in range(3):
        (g,) = sampler.sample()
    assert call_count("fan") == fans and call_count("events") == waits  # left alone
    assert sampler._gpus[0].unsupported_until == {}  # the fast path is kept
    # Still asked: memory temperature, energy, PCIe replays and the four row-remapping fields.
    assert sampler._gpus[0].fields is not None and len(sampler._gpus[0].fields._asked) == 7
    assert sampler.errors == {}


def test_health_errors_leave_that_field_none_and_are_counted(nvml) -> None:
    nvml.set(Scenario(gpus=[FakeGPU(errors={"pcie_replay": "UNKNOWN", "pstate": "TIMEOUT"})]))
    sampler = NvmlSampler(hardware_every_s=0.0)
    (g,) = sampler.sample()
    assert g.pcie_replays is None and g.pstate is None
    assert g.ecc_corrected_errors == 0 and g.fan_speed_pct == 30.0  # the rest still read
    assert sampler.errors["unknown"] == 1 and sampler.errors["timeout"] == 1
    assert g.unsupported == ()  # failing is not unsupported: asked again next time
    sampler.sample()
    assert sampler.errors["unknown"] == 2


def test_xid_errors_arrive_once_each_from_one_event_wait_per_tick(nvml) -> None:
    nvml.set(Scenario.uniform(8))
    sampler = NvmlSampler()
    waits = call_count("events")
    sampler.sample()
    assert call_count("events") - waits == 1  # one non-blocking wait for all eight GPUs
    time.sleep(0.05)
    now = time.monotonic()
    scn = Scenario.uniform(8).with_gpu(2, xid_errors=[XidError(13, now - 0.02), XidError(48, now)])
    nvml.set(scn.with_gpu(5, xid_errors=[XidError(94, now - 0.01)]))
    samples = sampler.sample()
    assert [g.xid_errors for g in samples] == [(), (), (13, 48), (), (), (94,), (), ()]
    assert call_count("events") - waits == 1 + 4  # three errors, then the empty answer
    nvml.set(nvml.scenario)  # rewritten with the same errors
    assert all(g.xid_errors == () for g in sampler.sample())  # each arrives once
    assert sampler.errors == {}


def test_a_burst_of_xid_errors_is_taken_over_ticks_none_lost(nvml) -> None:
    nvml.set(Scenario.uniform(2))
    sampler = NvmlSampler()
    time.sleep(0.05)
    now = time.monotonic()
    burst = [XidError(100 + k, now - 0.001 * k) for k in range(35)]
    nvml.set(Scenario.uniform(2, xid_errors=burst))
    first, second = sampler.sample(), sampler.sample()
    taken = [len(g.xid_errors) for g in first]
    assert sum(taken) == nvml_module._XidEvents.MAX_PER_TICK  # bounded per tick...
    assert sum(len(g.xid_errors) for g in second) == 70 - sum(taken)  # ...the rest next
    for gpu in (0, 1):
        codes = [*first[gpu].xid_errors, *second[gpu].xid_errors]
        assert codes == list(range(134, 99, -1))  # each once, oldest first


def test_an_xid_that_comes_with_the_gpu_falling_off_the_bus_is_kept(nvml) -> None:
    nvml.set(Scenario.uniform(2))
    sampler = NvmlSampler()
    sampler.sample()
    time.sleep(0.05)
    nvml.set(Scenario.uniform(2).with_gpu(1, lost=True, xid_errors=[XidError(79)]))
    time.sleep(0.02)
    g0, g1 = sampler.sample()
    assert g1.lost and g1.xid_errors == (79,)
    assert g0.xid_errors == ()


def test_a_failing_event_wait_is_counted_and_never_blocks(nvml) -> None:
    nvml.set(Scenario())
    sampler = NvmlSampler()
    nvml.set(Scenario(errors={"events": "UNKNOWN"}))  # registered; now every wait fails
    for _ in range(3):
        (g,) = sampler.sample()
        assert g.xid_errors == () and "xid_events" not in g.unsupported
    assert sampler.errors["unknown"] == 3


def test_record_keeps_the_hardware_fields_and_xid_errors(fake_nvml, tmp_path: Path) -> None:
    """An XID that happens while the recording runs (once it has ticks, whenever a busy
    machine let it start) is in the trace; the recording ends with the process it follows."""
    fake_nvml.set(Scenario(gpus=[HEALTHY_H100, FakeGPU(nvlink_links=0)]))
    out = tmp_path / "t.jsonl"
    with _recording_a_process(fake_nvml.env, out, "0.5") as (child, rec):
        _until("no tick was recorded", lambda: _ticks_in(out) >= 2 or rec.poll() is not None)
        gpu = replace(HEALTHY_H100, xid_errors=[XidError(63, time.monotonic() + 0.3)])
        fake_nvml.set(Scenario(gpus=[gpu, FakeGPU(nvlink_links=0)]))
        seen = _ticks_in(out)
        _until(
            "the recording stopped", lambda: _ticks_in(out) >= seen + 3 or rec.poll() is not None
        )
        child.communicate(timeout=60)
        _, err = rec.communicate(timeout=120)
    assert rec.returncode == 0, err
    from gpumon.traces.jsonl import FORMAT_VERSION, read_trace

    header, snaps = read_trace(out)
    assert header.version == FORMAT_VERSION == 4
    first = snaps[0].gpus
    assert first[0].ecc_uncorrected_errors == 1 and first[0].memory_temperature_c == 64.0
    assert first[0].nvlink_rx_bytes is not None and first[1].nvlink_rx_bytes is None
    assert "nvlink" in first[1].unsupported
    assert [x for s in snaps for x in s.gpus[0].xid_errors] == [63]


def test_gpu_lost_mid_run_is_marked_and_others_continue(nvml) -> None:
    scenario = Scenario.uniform(3, Pattern.steady(90.0))
    nvml.set(scenario)
    sampler = NvmlSampler()
    assert [s.lost for s in sampler.sample()] == [False, False, False]
    nvml.set(scenario.with_gpu(1, lost=True))
    for _ in range(2):
        time.sleep(0.2)
        s0, s1, s2 = sampler.sample()
        assert s1.lost and s1.util_pct is None and s1.mem_used_bytes is None
        assert s1.uuid == sampler.gpus[1].uuid
        assert not s0.lost and s0.util_pct == 90.0
        assert not s2.lost and s2.mem_used_bytes is not None
    assert sampler.errors["gpu_is_lost"] == 1


def test_gpu_lost_at_start_is_reported_not_fatal(nvml) -> None:
    nvml.set(Scenario.uniform(2).with_gpu(0, lost=True))
    sampler = NvmlSampler()
    s0, s1 = sampler.sample()
    assert s0.lost and s0.uuid == "unknown-gpu-0"
    assert not s1.lost


def test_a_lost_gpu_that_answers_again_is_read_again(nvml, caplog) -> None:
    scenario = Scenario.uniform(2, Pattern.steady(80.0))
    nvml.set(scenario)
    sampler = NvmlSampler(rediscover_every_s=0.2)
    sampler.sample()
    nvml.set(scenario.with_gpu(1, lost=True))
    assert sampler.sample()[1].lost
    time.sleep(0.3)
    assert sampler.sample()[1].lost  # asked again, still gone: stays lost
    nvml.set(scenario)  # the GPU is back (a reset, a reseated riser)
    time.sleep(0.3)
    s1 = sampler.sample()[1]
    assert not s1.lost and s1.util_pct == 80.0 and s1.mem_used_bytes is not None
    assert s1.uuid == scenario.gpus[1].effective_uuid(1)
    assert sampler.errors["gpu_is_lost"] == 1  # counted once, when it was lost
    assert any("answers again after" in r.getMessage() for r in caplog.records)


def test_a_gpu_lost_at_start_gets_its_identity_when_it_answers(nvml) -> None:
    scenario = Scenario.uniform(2)
    nvml.set(scenario.with_gpu(0, lost=True))
    sampler = NvmlSampler(rediscover_every_s=0.2)
    assert sampler.sample()[0].uuid == "unknown-gpu-0"
    nvml.set(scenario)
    time.sleep(0.3)
    s0 = sampler.sample()[0]
    assert not s0.lost and s0.uuid == scenario.gpus[0].effective_uuid(0)
    assert sampler.gpus[0].name == scenario.gpus[0].name
    assert sampler.gpus[0].mem_total_bytes == scenario.gpus[0].mem_total


def test_a_gpu_that_appears_while_sampling_is_found(nvml, caplog) -> None:
    nvml.set(Scenario.uniform(1))
    sampler = NvmlSampler(rediscover_every_s=0.2)
    assert len(sampler.sample()) == 1
    nvml.set(Scenario.uniform(2, Pattern.steady(70.0)))
    time.sleep(0.3)
    samples = sampler.sample()
    assert [s.gpu for s in samples] == [0, 1] and samples[1].util_pct == 70.0
    assert [g.index for g in sampler.gpus] == [0, 1]
    assert sampler.gpus[1].uuid == Scenario.uniform(2).gpus[1].effective_uuid(1)
    assert any("appeared" in r.getMessage() for r in caplog.records)


def test_rediscovery_runs_only_every_period(nvml) -> None:
    """Its cost is bounded by the period, not paid on every tick."""
    nvml.set(Scenario.uniform(2))
    sampler = NvmlSampler(rediscover_every_s=0.5)
    start = time.monotonic()
    while time.monotonic() - start < 1.2:
        sampler.sample()
        time.sleep(0.02)
    assert sampler.rediscoveries in (2, 3)


# --- whole processes ---------------------------------------------------------------------


def run_gpumon(*args: str, env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpumon", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_no_driver_library_gives_one_sentence_and_exit_status(fake_nvml, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    result = run_gpumon("record", "-o", str(out), "--duration", "1", env=fake_nvml.missing_env())
    assert result.returncode == 3
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("gpumon: cannot read GPUs: no NVIDIA driver found")
    assert not out.exists()


def test_driver_not_loaded_gives_one_sentence(fake_nvml, tmp_path: Path) -> None:
    fake_nvml.set(Scenario.no_driver())
    result = run_gpumon(
        "record", "-o", str(tmp_path / "t.jsonl"), "--duration", "1", env=fake_nvml.env
    )
    assert result.returncode == 3
    assert "Traceback" not in result.stderr
    assert "NVIDIA kernel driver is not loaded" in result.stderr


def test_record_end_to_end_keeps_every_driver_sample(fake_nvml, tmp_path: Path) -> None:
    fake_nvml.set(Scenario.uniform(2, Pattern.burst(1.0, 0.5), sample_period_s=1.0 / 6.0))
    out = tmp_path / "t.jsonl"
    result = run_gpumon(
        "record", "-o", str(out), "--duration", "3", "--interval", "1", env=fake_nvml.env
    )
    assert result.returncode == 0, result.stderr
    from gpumon.traces.jsonl import read_trace

    header, snaps = read_trace(out)
    assert [g.index for g in header.gpus] == [0, 1]
    assert header.driver_version == "550.54.15"
    assert header.interval_s == 1.0
    for gpu in (0, 1):
        points = [p for s in snaps for g in s.gpus if g.gpu == gpu for p in g.util_samples]
        # 3 s at the driver's 6 samples/s, none lost between ticks.
        assert 16 <= len(points) <= 20, len(points)
        times = [t for t, _ in points]
        assert max(b - a for a, b in itertools.pairwise(times)) < 0.2
    assert all(s.host is not None and s.host.cpu_pct is not None for s in snaps[1:])


def _ticks_in(path: Path) -> int:
    """Ticks written to a trace so far (its header aside)."""
    try:
        return max(0, path.read_text().count("\n") - 1)
    except FileNotFoundError:
        return 0


@contextlib.contextmanager
def _recording_a_process(
    env: dict[str, str], out: Path, interval: str
) -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[str]]]:
    """A process that exits when its stdin closes, and ``gpumon record --pid`` of it
    into ``out`` (600 s at most), both killed on the way out if still running."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    rec = subprocess.Popen(
        [sys.executable, "-m", "gpumon", "record", "-o", str(out), "--pid", str(child.pid),
         "--interval", interval, "--duration", "600"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield child, rec
    finally:
        for p in (child, rec):
            if p.poll() is None:
                p.kill()
                p.wait()


def _until(what: str, done: Callable[[], bool], deadline_s: float = 300.0) -> None:
    """Wait for an event (the deadline only ends a wait for one that never comes)."""
    end = time.monotonic() + deadline_s
    while not done():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def test_record_follows_a_pid_and_stops_when_it_exits(fake_nvml, tmp_path: Path) -> None:
    """The process exits once the recording has ticks of it (however long gpumon took to
    start), and the recording ends then, not at --duration."""
    out = tmp_path / "t.jsonl"
    with _recording_a_process(fake_nvml.env, out, "0.25") as (child, rec):
        _until("no tick was recorded", lambda: _ticks_in(out) >= 2 or rec.poll() is not None)
        child.communicate(timeout=60)  # stdin closed: it exits
        _, err = rec.communicate(timeout=120)
    assert rec.returncode == 0, err
    assert f"process {child.pid} exited" in err
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[-1]["t"] - lines[1]["t"] < 600 - 1  # it ended with the process
    assert lines[0]["header"]["watched_pid"] == child.pid
    assert lines[1]["tree"]["root_pid"] == child.pid
    assert lines[-1]["tree"]["root_alive"] is False


def test_record_to_unwritable_path_is_a_clear_error(fake_nvml, tmp_path: Path) -> None:
    result = run_gpumon(
        "record",
        "-o",
        str(tmp_path / "no" / "such" / "dir.jsonl"),
        "--duration",
        "1",
        env=fake_nvml.env,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "cannot write" in result.stderr


def _file_size_limit(limit: int):  # type: ignore[no-untyped-def]
    """preexec_fn: writes past ``limit`` bytes fail with EFBIG, like a disk filling up."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_record_on_a_disk_that_fills_mid_run_keeps_what_was_written(
    fake_nvml, tmp_path: Path
) -> None:
    fake_nvml.set(Scenario.uniform(2))
    out = tmp_path / "t.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpumon",
            "record",
            "-o",
            str(out),
            "--duration",
            "20",
            "--interval",
            "0.1",
        ],
        env=fake_nvml.env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_file_size_limit(6000),
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "File too large" in result.stderr and "intact" in result.stderr
    reader = TraceReader(out)
    ticks = list(reader)  # every complete line before the failure reads back
    assert len(ticks) >= 2
    assert len(reader.warnings) <= 1  # at most the one line cut short


def test_watch_with_a_failing_record_still_waits_for_the_command(fake_nvml, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpumon",
            "watch",
            "--plain",
            "--interval",
            "0.1",
            "--record",
            str(out),
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(2.5); raise SystemExit(7)",
        ],
        env=fake_nvml.env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_file_size_limit(3000),
    )
    assert "Traceback" not in result.stderr
    assert "Still waiting for the command" in result.stderr
    assert result.returncode == 7  # the command's own status, not gpumon's failure


SAMPLE_THEN_MAPS = """
import sys, time
from gpumon.sample.nvml import NvmlSampler
from gpumon.traces.jsonl import TraceReader
from gpumon.sample.monitor import Monitor
from gpumon.sample.host import HostSampler
m = Monitor(NvmlSampler(), HostSampler())
for _ in range(3):
    m.sample(); time.sleep(0.1)
maps = open("/proc/self/maps").read()
print("nvml" if "libnvidia-ml.so.1" in maps else "no-nvml")
print("cuda" if "libcuda" in maps or "libcudart" in maps else "no-cuda")
"""


def test_sampling_never_loads_cuda(fake_nvml) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SAMPLE_THEN_MAPS],
        env=fake_nvml.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    # The positive control proves the maps check sees loaded libraries at all.
    assert result.stdout.split() == ["nvml", "no-cuda"]
