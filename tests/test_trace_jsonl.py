"""The gpumon trace format: exact round trips, and clear errors that lose nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumon.errors import TraceFormatError
from gpumon.model import (
    GpuIdentity,
    GpuProcess,
    GpuSample,
    HostSample,
    ProcessSample,
    ProcTreeSample,
    Snapshot,
    TraceHeader,
    UtilPoint,
)
from gpumon.traces.jsonl import FORMAT_VERSION, TraceReader, TraceWriter, read_trace

HEADER = TraceHeader(
    version=FORMAT_VERSION,
    source="gpumon",
    hostname="node1",
    started_wall_s=1764441000.123456,
    started_mono_s=5123.4,
    interval_s=0.5,
    driver_version="550.54.15",
    nvml_version="12.550.54.15",
    cpu_count=8,
    watched_pid=4242,
    command=("python", "train.py", "--lr", "3e-4"),
    gpus=(
        GpuIdentity(0, "GPU-aaaa", "NVIDIA H100", "00000000:17:00.0", 85520809984, 700.0),
        GpuIdentity(1, "GPU-bbbb"),
    ),
    extra={"note": "test"},
)


def snapshot(t: float, lost: bool = False) -> Snapshot:
    gpu0 = GpuSample(
        t_s=t,
        gpu=0,
        uuid="GPU-aaaa",
        util_samples=(UtilPoint(t - 0.3333333, 100.0), UtilPoint(t - 0.1666667, 12.5)),
        util_pct=56.0,
        mem_util_pct=0.0,  # a real zero must stay a zero, not become "absent"
        mem_used_bytes=1 << 33,
        mem_total_bytes=85520809984,
        power_watts=312.25,
        power_limit_watts=700.0,
        sm_clock_mhz=1980,
        clock_event_reasons=0,
        pcie_rx_bytes_per_s=None,
        temperature_c=51.0,
        processes=(GpuProcess(4242, 1 << 30, 40.0), GpuProcess(4243, None, None)),
        unsupported=("pcie",),
    )
    gpu1 = GpuSample(t_s=t + 0.001, gpu=1, uuid="GPU-bbbb", lost=lost, processes=())
    host = HostSample(
        t_s=t, cpu_pct_per_core=(99.0, 1.5), cpu_pct=50.25, iowait_pct=0.0, load_1m=1.0
    )
    tree = ProcTreeSample(
        t_s=t,
        root_pid=4242,
        processes=(
            ProcessSample(4242, 1, "python", 99.5, 12, 0.0, 0.0, "running"),
            ProcessSample(4250, 4242, "pt_data_worker", None, None, None, None, None),
        ),
        root_alive=False,
    )
    return Snapshot(t_s=t, gpus=(gpu0, gpu1), host=host, tree=tree)


def test_round_trip_is_exact(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    snaps = [snapshot(5124.4), snapshot(5124.9, lost=True), Snapshot(t_s=5125.4)]
    with TraceWriter.open(path, HEADER) as writer:
        for s in snaps:
            writer.write(s)
    header, back = read_trace(path)
    assert header == HEADER
    assert back == snaps


def test_absent_fields_are_none_not_zero(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path, HEADER) as writer:
        writer.write(snapshot(1.0))
    line = json.loads(path.read_text().splitlines()[1])
    gpu0 = line["gpus"][0]
    assert "pcie_rx_bytes_per_s" not in gpu0
    assert gpu0["mem_util_pct"] == 0.0
    _, (back,) = read_trace(path)
    assert back.gpus[0].pcie_rx_bytes_per_s is None
    assert back.gpus[0].mem_util_pct == 0.0
    assert back.gpus[1].processes == ()  # "no processes" differs from "unknown"
    assert back.gpus[0].processes[1].used_mem_bytes is None


def test_each_tick_is_flushed_as_written(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    writer = TraceWriter.open(path, HEADER)
    writer.write(snapshot(1.0))
    # Without closing (as after a crash) the tick is already on disk.
    assert len(path.read_text().splitlines()) == 2
    writer.close()


def test_event_lines_are_kept_apart(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path, HEADER) as writer:
        writer.write(snapshot(1.0))
        writer.write_event(1.5, "phase", name="starved-cpu", edge="start")
        writer.write(snapshot(2.0))
    reader = TraceReader(path)
    assert [s.t_s for s in reader] == [1.0, 2.0]
    assert reader.events == [{"t": 1.5, "event": "phase", "name": "starved-cpu", "edge": "start"}]


def _write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(lines))


def _good_lines() -> list[str]:
    from gpumon.traces.jsonl import encode_header, encode_snapshot

    return [
        json.dumps(encode_header(HEADER)) + "\n",
        json.dumps(encode_snapshot(snapshot(1.0))) + "\n",
        json.dumps(encode_snapshot(snapshot(2.0))) + "\n",
    ]


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ('{"t": 3.0, "gpus": [}\n', "invalid JSON"),
        ('{"gpus": []}\n', "missing field 't'"),
        ('{"t": "soon"}\n', "'t' must be a number"),
        ('{"t": 3.0, "gpus": [{"gpu": 0, "uuid": "x", "bogus": 1}]}\n', "bogus"),
    ],
)
def test_malformed_line_names_the_line_after_the_valid_ones(
    tmp_path: Path, bad: str, expected: str
) -> None:
    path = tmp_path / "t.jsonl"
    _write_lines(path, [*_good_lines(), bad, _good_lines()[1]])
    reader = TraceReader(path)
    got = []
    with pytest.raises(TraceFormatError) as info:
        for s in reader:
            got.append(s.t_s)
    assert got == [1.0, 2.0]  # the valid lines before it were not hidden
    assert info.value.line == 4
    assert f"{path}:4:" in str(info.value)
    assert expected in str(info.value)


def test_truncated_last_line_is_a_warning_not_an_error(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = _good_lines()
    _write_lines(path, [*lines, lines[1][: len(lines[1]) // 2]])
    reader = TraceReader(path)
    assert [s.t_s for s in reader] == [1.0, 2.0]
    assert len(reader.warnings) == 1
    assert ":4: last line is incomplete" in reader.warnings[0]


@pytest.mark.parametrize(
    ("first", "expected"),
    [
        ("not json\n", "Expecting value"),
        ('{"format": "something-else"}\n', "not a gpumon trace"),
        ('{"format": "gpumon-trace", "version": 99, "header": {}}\n', "newer than this gpumon"),
    ],
)
def test_bad_header_is_line_1(tmp_path: Path, first: str, expected: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(first)
    with pytest.raises(TraceFormatError) as info:
        TraceReader(path)
    assert info.value.line == 1
    assert expected in str(info.value)


def test_gzip_compressed_trace_reads_the_same(tmp_path: Path) -> None:
    import gzip

    plain = tmp_path / "t.jsonl"
    with TraceWriter.open(plain, HEADER) as writer:
        writer.write(snapshot(1.0))
    packed = tmp_path / "t.jsonl.gz"  # the name does not matter: magic bytes decide
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_trace(packed) == read_trace(plain)


def test_unreadable_trace_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="cannot read the trace"):
        TraceReader(tmp_path / "missing.jsonl")
