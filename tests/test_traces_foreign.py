"""The readers of foreign GPU logs, on data alone: values, no-reading as None, GPU
inference, repeated headers, encodings, and errors that name the line."""

from __future__ import annotations

import gzip
import itertools
import time
from pathlib import Path

import pytest

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, GpuSample, Snapshot, TraceHeader
from gpumon.traces import dmon, nvsmi_table, tabular
from gpumon.traces._common import num
from gpumon.traces.jsonl import FORMAT_VERSION, TraceWriter
from gpumon.traces.sniff import open_trace, read_lines
from gpumon.traces.timefmt import date_time

LOGS = Path(__file__).parent / "data" / "logs"
MIB = 1 << 20


def load(name: str) -> tuple[str, TraceHeader, list[Snapshot], list[str]]:
    with open_trace(LOGS / name) as trace:
        snaps = list(trace)
        return trace.format, trace.header, snaps, trace.warnings


def parse(text: str, fmt: str = "auto") -> tuple[str, TraceHeader, list[Snapshot], list[str]]:
    warnings: list[str] = []
    found, header, snaps = read_lines(text.splitlines(keepends=True), fmt, "mem", warnings)
    return found, header, list(snaps), warnings


def gpu(snap: Snapshot, index: int) -> GpuSample:
    return next(g for g in snap.gpus if g.gpu == index)


# --- cells ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cell", "value"),
    [
        (" 92 %", 92.0),
        ("49140 MiB", 49140.0),
        (" 150.20 W", 150.2),
        ("34C", 34.0),
        ("61W", 61.0),
        ("4MiB", 4.0),
        ("0%", 0.0),
        ("1410", 1410.0),
        (" 0 ", 0.0),
    ],
)
def test_numbers_with_or_without_units(cell: str, value: float) -> None:
    assert num(cell) == value


@pytest.mark.parametrize(
    "cell",
    ["[N/A]", " [Not Supported]", "N/A", "-", "", " ", "ERR!", "[Unknown Error]", "[GPU is lost]"],
)
def test_no_reading_is_none_not_zero(cell: str) -> None:
    assert num(cell) is None


def test_garbage_cell_raises() -> None:
    with pytest.raises(ValueError):
        num("fast")


def test_nvsmi_timestamp() -> None:
    assert date_time("2024/05/01 12:00:00.123") == pytest.approx(1714564800.123)
    assert date_time(" 2024/05/02 00:00:01.000") == pytest.approx(1714608001.0)


# --- nvidia-smi CSV ---------------------------------------------------------------------


def test_nvsmi_csv_units_index_values() -> None:
    fmt, header, snaps, warnings = load("nvsmi_units_index.csv")
    assert fmt == "nvidia-smi-csv"
    assert header.source == "nvidia-smi-csv"
    assert header.interval_s == pytest.approx(1.0, abs=0.02)
    assert header.started_wall_s == pytest.approx(1714564800.104, abs=0.01)
    assert [g.index for g in header.gpus] == [0, 1]
    assert header.gpus[1] == GpuIdentity(
        index=1,
        uuid="00000000:2B:00.0",
        name="NVIDIA A100-SXM4-80GB",
        pci_bus_id="00000000:2B:00.0",
        mem_total_bytes=81920 * MIB,
        power_limit_watts=400.0,
    )
    # 120 ticks, the header repeated at tick 60 neither lost nor counted as a row.
    assert len(snaps) == 120 and all(len(s.gpus) == 2 for s in snaps)
    first = gpu(snaps[0], 1)
    assert first.t_s == 0.0
    assert (first.util_pct, first.mem_util_pct) == (91.0, 30.0)
    assert first.mem_used_bytes == 49152 * MIB and first.mem_total_bytes == 81920 * MIB
    assert first.power_watts == 348.18 and first.power_limit_watts == 400.0
    assert first.temperature_c == 35.0 and first.sm_clock_mhz == 1410
    assert first.util_samples == ()  # 1 s log: util_pct only
    assert snaps[-1].t_s == pytest.approx(119.0, abs=0.02)
    assert warnings == []


def test_nvsmi_csv_na_is_none() -> None:
    _, header, snaps, _ = load("nvsmi_na_uuid.csv")
    assert header.gpus[0].uuid == "GPU-5a0b1c2d-3e4f-5a6b-7c8d-9e0f1a2b3c4d"
    assert header.interval_s == pytest.approx(2.0)
    assert all(s.gpus[0].power_watts is None for s in snaps)
    assert snaps[7].gpus[0].mem_used_bytes is None  # [Not Supported]
    assert snaps[8].gpus[0].mem_used_bytes == 5128 * MIB
    assert all(s.gpus[0].util_pct is not None for s in snaps)


def test_nvsmi_csv_without_index_infers_gpus_from_times() -> None:
    _, header, snaps, _ = load("nvsmi_noindex_4gpu.csv")
    assert [g.index for g in header.gpus] == [0, 1, 2, 3]
    assert "4" in str(header.extra["gpus_inferred"])
    assert len(snaps) == 90
    assert [g.gpu for g in snaps[5].gpus] == [0, 1, 2, 3]
    # Each GPU keeps its own memory use: rows were not shuffled between GPUs.
    assert [g.mem_used_bytes for g in snaps[50].gpus] == [(71234 + 40 * i) * MIB for i in range(4)]


def test_nvsmi_csv_without_index_or_times_infers_gpus_from_pattern() -> None:
    lines = ["name, utilization.gpu [%], memory.used [MiB]"]
    for k in range(30):
        lines += [f"NVIDIA A10, {k % 100} %, {1000 + 100 * g} MiB" for g in range(3)]
    _, header, snaps, _ = parse("\n".join(lines) + "\n")
    assert len(header.gpus) == 3
    assert "interval_assumed" in header.extra
    assert len(snaps) == 30 and snaps[1].t_s == 1.0
    assert [g.mem_used_bytes for g in snaps[10].gpus] == [1000 * MIB, 1100 * MIB, 1200 * MIB]


def test_nvsmi_csv_sub_second_rows_become_util_samples() -> None:
    _, header, snaps, _ = load("nvsmi_nounits_lms100.csv")
    assert header.interval_s == pytest.approx(0.1, abs=0.005)
    points = [p for s in snaps for p in s.gpus[0].util_samples]
    assert len(points) == 600  # one point per log row, none lost
    assert all(8 <= len(s.gpus[0].util_samples) <= 12 for s in snaps[:-1])
    assert [t for t, _ in points] == sorted(t for t, _ in points)
    s = snaps[0].gpus[0]
    assert (s.t_s, s.util_pct) == s.util_samples[-1]
    assert s.mem_used_bytes == 20311 * MIB
    # [N/A] power in the row that closes a window stays None, never 0.
    assert all(g.power_watts is None or g.power_watts > 0 for sn in snaps for g in sn.gpus)


def test_nvsmi_csv_noheader_columns_guessed_from_units() -> None:
    _, header, snaps, warnings = load("nvsmi_noheader.csv")
    assert any("no header" in w for w in warnings)
    assert header.extra["columns_guessed"] == {
        "time": 0,
        "index": 1,
        "util": 2,
        "mem_util": 3,
        "mem_used": 4,
        "mem_total": 5,
        "power": 6,
    }
    g = snaps[0].gpus[0]
    assert (g.util_pct, g.mem_util_pct, g.mem_used_bytes, g.mem_total_bytes) == (
        94.0,
        23.0,
        30111 * MIB,
        40960 * MIB,
    )


def test_nvsmi_csv_noheader_nounits_names_columns_option() -> None:
    """Two columns of 0-100 values that both change: either could be the utilisation, so
    the refusal says how to name the columns (and how to re-run nvidia-smi)."""
    text = "".join(f"2024/05/01 12:00:0{k}.000, 0, {k * 10}, {k * 7}, 1234\n" for k in range(5))
    with pytest.raises(TraceFormatError, match="--columns") as err:
        parse(text)
    assert "re-run nvidia-smi with --format=csv" in str(err.value)


def test_nvsmi_csv_any_order_and_power_priority() -> None:
    text = (
        "power.draw.average [W], power.draw.instant [W], memory.total [MiB], "
        "memory.free [MiB], utilization.gpu [%], index, timestamp\n"
        "100.00, 120.50, 1000, 250, 42, 0, 2024/05/01 12:00:00.000\n"
        "101.00, 121.50, 1000, 260, 43, 0, 2024/05/01 12:00:01.000\n"
    )
    _, _, snaps, _ = parse(text)
    g = snaps[1].gpus[0]
    assert g.power_watts == 121.5  # instant preferred over the 1 s average
    assert g.mem_used_bytes == 740 * MIB  # total - free when used is not logged
    assert g.util_pct == 43.0 and snaps[1].t_s == 1.0


def test_nvsmi_csv_header_changing_mid_file() -> None:
    text = (
        "timestamp, index, utilization.gpu [%]\n"
        "2024/05/01 12:00:00.000, 0, 10 %\n"
        "2024/05/01 12:00:01.000, 0, 20 %\n"
        "timestamp, index, memory.used [MiB], utilization.gpu [%]\n"
        "2024/05/01 12:00:02.000, 0, 512 MiB, 30 %\n"
    )
    _, _, snaps, _ = parse(text)
    assert [s.gpus[0].util_pct for s in snaps] == [10.0, 20.0, 30.0]
    assert snaps[2].gpus[0].mem_used_bytes == 512 * MIB


def test_nvsmi_csv_without_util_column_warns() -> None:
    text = "timestamp, index, memory.used [MiB]\n2024/05/01 12:00:00.000, 0, 5 MiB\n"
    _, _, snaps, warnings = parse(text)
    assert snaps[0].gpus[0].util_pct is None
    assert any("utilization.gpu" in w for w in warnings)


# --- dmon -------------------------------------------------------------------------------


def test_dmon_default_values_and_repeated_headers() -> None:
    fmt, header, snaps, _ = load("dmon_default.txt")
    assert fmt == "dmon"
    assert "interval_assumed" in header.extra
    assert len(snaps) == 120 and [g.gpu for g in snaps[0].gpus] == [0, 1]
    g = snaps[0].gpus[0]
    assert (g.util_pct, g.mem_util_pct, g.power_watts, g.temperature_c, g.sm_clock_mhz) == (
        99.0,
        33.0,
        238.0,
        40.0,
        1410,
    )
    assert g.mem_used_bytes is None  # no fb column selected: no reading, not 0
    assert snaps[-1].t_s == 119.0


def test_dmon_date_time_columns() -> None:
    _, header, snaps, _ = load("dmon_dt.txt")
    assert header.started_wall_s == 1714564800.0
    assert header.interval_s == 1.0
    assert [s.t_s for s in snaps[:3]] == [0.0, 1.0, 2.0]
    assert snaps[0].gpus[0].util_pct == 98.0


def test_dmon_dash_is_none_and_time_wraps_midnight() -> None:
    text = (
        "#Time        gpu    pwr     sm    mem     fb\n"
        "#HH:MM:SS    Idx      W      %      %     MB\n"
        " 23:59:58      0     60      -      0   1024\n"
        " 23:59:59      0     61      5      0   1024\n"
        " 00:00:00      0      -     50      3   2048\n"
    )
    fmt, _, snaps, _ = parse(text)
    assert fmt == "dmon"
    assert [s.t_s for s in snaps] == [0.0, 1.0, 2.0]
    assert snaps[0].gpus[0].util_pct is None and snaps[0].gpus[0].power_watts == 60.0
    assert snaps[2].gpus[0].power_watts is None
    assert snaps[2].gpus[0].mem_used_bytes == 2048 * MIB


def test_dmon_csv_format() -> None:
    text = (
        "# gpu,    pwr,  gtemp,     sm,    mem\n"
        "# Idx,      W,      C,      %,      %\n"
        "    0,     61,     34,     12,      3\n"
        "    1,     62,     35,     80,      9\n"
    )
    fmt, _, snaps, _ = parse(text)
    assert fmt == "dmon"
    assert [g.util_pct for g in snaps[0].gpus] == [12.0, 80.0]


# --- nvidia-smi tables ------------------------------------------------------------------


def test_table_535_layout() -> None:
    fmt, header, snaps, _ = load("table_535.txt")
    assert fmt == "nvidia-smi-table"
    assert header.driver_version == "535.104.05"
    assert [(g.index, g.name, g.pci_bus_id) for g in header.gpus] == [
        (0, "NVIDIA A100-SXM4-80GB", "00000000:17:00.0"),
        (1, "NVIDIA A100-SXM4-80GB", "00000000:2B:00.0"),
    ]
    assert len(snaps) == 60 and snaps[1].t_s == 1.0
    g = gpu(snaps[0], 1)
    assert (g.util_pct, g.power_watts, g.power_limit_watts) == (96.0, 361.0, 400.0)
    assert g.mem_used_bytes == 49164 * MIB and g.mem_total_bytes == 81920 * MIB
    assert g.temperature_c == 35.0


def test_table_470_layout() -> None:
    _, header, snaps, _ = load("table_470.txt")
    assert header.driver_version == "470.182.03"
    assert header.gpus[0].name == "Tesla V100-SXM2..."
    assert header.interval_s == 2.0 and len(snaps) == 45
    g = snaps[0].gpus[0]
    assert (g.util_pct, g.power_watts, g.mem_total_bytes) == (100.0, 299.0, 16160 * MIB)


def test_table_grepped_rows() -> None:
    _, header, snaps, _ = load("table_grep.txt")
    assert len(header.gpus) == 2
    assert "interval_assumed" in header.extra
    assert len(snaps) == 90
    assert [g.mem_used_bytes for g in snaps[40].gpus] == [30000 * MIB, 32000 * MIB]


def test_table_na_power() -> None:
    text = (
        "| N/A   34C    P8              N/A /  N/A |      4MiB / 24576MiB |"
        "      0%      Default |\n"
        "| 30%   45C    P2             120W / 350W |   2000MiB / 24576MiB |"
        "     77%      Default |\n"
    )
    _, _, snaps, _ = parse(text, "nvidia-smi-table")
    assert snaps[0].gpus[0].power_watts is None and snaps[0].gpus[0].power_limit_watts is None
    assert snaps[0].gpus[0].util_pct == 0.0


# --- home-made CSV ----------------------------------------------------------------------


def test_simple_csv() -> None:
    fmt, header, snaps, _ = load("simple.csv")
    assert fmt == "csv"
    assert header.started_wall_s == pytest.approx(1714564800.5)
    assert len(snaps) == 120 and len(snaps[0].gpus) == 2
    g = snaps[0].gpus[1]
    assert g.mem_used_bytes == 20001 * MIB and g.power_watts is not None


def test_simple_csv_iso_fraction_semicolon() -> None:
    fmt, header, snaps, _ = load("simple_iso.csv")
    assert fmt == "csv"
    assert "util_scale" in header.extra
    points = [p for s in snaps for p in s.gpus[0].util_samples]
    assert len(points) == 240 and all(90 <= u <= 100 for _, u in points)


def test_simple_csv_relative_seconds_and_ms() -> None:
    _, header, snaps, _ = parse("elapsed_ms,gpu_util_%\n0,10\n1000,20\n2000,30\n")
    assert header.started_wall_s is None
    assert [s.t_s for s in snaps] == [0.0, 1.0, 2.0]
    assert [s.gpus[0].util_pct for s in snaps] == [10.0, 20.0, 30.0]


# --- encodings, line endings, compression ----------------------------------------------


def _variants(tmp_path: Path, name: str) -> dict[str, Path]:
    text = (LOGS / name).read_text(encoding="utf-8")
    out = {}
    for label, data in {
        "utf16-bom-crlf": text.replace("\n", "\r\n").encode("utf-16"),
        "utf16le-nobom": text.encode("utf-16-le"),
        "utf8-bom-crlf": b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8"),
        "gzip": gzip.compress(text.encode("utf-8")),
    }.items():
        path = tmp_path / f"{label}-{name}"
        path.write_bytes(data)
        out[label] = path
    return out


@pytest.mark.parametrize(
    "name",
    ["nvsmi_units_index.csv", "dmon_dt.txt", "table_535.txt", "simple.csv", "nvsmi_noheader.csv"],
)
def test_encodings_read_the_same(tmp_path: Path, name: str) -> None:
    fmt, header, expected, _ = load(name)
    for label, path in _variants(tmp_path, name).items():
        with open_trace(path) as trace:
            assert trace.format == fmt, label
            assert trace.header.gpus == header.gpus, label
            assert list(trace) == expected, label


# --- errors -----------------------------------------------------------------------------


def test_malformed_line_named_after_valid_ticks() -> None:
    got = []
    with (
        open_trace(LOGS / "bad_malformed_mid.csv") as trace,
        pytest.raises(TraceFormatError) as err,
    ):
        for snap in trace:
            got.append(snap)
    assert err.value.line == 43
    assert "bad_malformed_mid.csv:43:" in str(err.value)
    assert len(got) >= 19  # the ticks before line 43 (two rows per tick) were yielded


def test_cut_short_last_line_is_a_warning() -> None:
    _, _, snaps, warnings = load("bad_cut_short.csv")
    assert len(snaps) == 120
    assert len(warnings) == 1 and "incomplete" in warnings[0]


def test_unrecognised_file_lists_formats_tried() -> None:
    with pytest.raises(TraceFormatError) as err:
        load("bad_unknown.txt")
    msg = str(err.value)
    assert err.value.line == 1 and "'hello'" in msg
    for fmt in (
        "gpumon trace",
        "dmon",
        "--query-gpu CSV",
        "nvidia-smi tables",
        "named in its header",
    ):
        assert fmt in msg


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("")
    with pytest.raises(TraceFormatError, match="empty"):
        open_trace(path)


def test_malformed_dmon_and_table_rows_named() -> None:
    text = "# gpu   pwr    sm\n# Idx     W     %\n    0    60    10\n    0    61    xx\n"
    _, _, it = read_lines(text.splitlines(keepends=True), path="d.txt")
    with pytest.raises(TraceFormatError, match=r"d.txt:4:"):
        list(it)


def test_forced_format_mismatch_is_an_error() -> None:
    with pytest.raises(TraceFormatError):
        parse("hello\nworld\n", "dmon")


# --- streaming --------------------------------------------------------------------------


def test_readers_are_lazy() -> None:
    """The first snapshot comes after a bounded read-ahead, not after the whole file."""
    consumed = 0

    def lines():
        nonlocal consumed
        yield "timestamp, index, utilization.gpu [%]\n"
        for k in itertools.count():
            consumed += 1
            yield f"2024/05/01 12:00:00.000, {k % 2}, 50 %\n".replace(
                "12:00:00", f"{12 + k // 7200:02d}:{k // 120 % 60:02d}:{k // 2 % 60:02d}"
            )

    _, _, snaps = read_lines(lines(), "nvidia-smi-csv")
    first = next(snaps)
    assert len(first.gpus) == 2
    assert consumed <= tabular.PREFIX_LINES + 10


def test_gpumon_trace_through_open_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    header = TraceHeader(
        version=FORMAT_VERSION,
        source="gpumon",
        interval_s=1.0,
        gpus=(GpuIdentity(index=0, uuid="GPU-x"),),
    )
    snaps = [
        Snapshot(t_s=float(k), gpus=(GpuSample(t_s=float(k), gpu=0, uuid="GPU-x", util_pct=50.0),))
        for k in range(5)
    ]
    with TraceWriter.open(path, header) as w:
        for s in snaps:
            w.write(s)
    with open_trace(path) as trace:
        assert trace.format == "gpumon" and trace.header == header
        assert list(trace) == snaps


def test_readers_are_pure_functions_of_lines() -> None:
    for reader, name in (
        (tabular, "nvsmi_units_index.csv"),
        (dmon, "dmon_default.txt"),
        (nvsmi_table, "table_470.txt"),
        (tabular, "simple.csv"),
    ):
        lines = (LOGS / name).read_text().splitlines(keepends=True)
        header, snaps = reader.read(lines, path=name)
        assert header.source in (reader.FORMAT, tabular.NVSMI)
        assert len(list(snaps)) > 10


def test_table_550_layout() -> None:
    """Driver 550+ widened the memory column; the rows still read the same."""
    text = "\n".join(
        [
            "Wed May  1 12:00:00 2024       ",
            "+" + "-" * 89 + "+",
            "| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4"
            "     |",
            "|-----------------------------------------+------------------------+"
            "----------------------+",
            "| GPU  Name                 Persistence-M | Bus-Id          Disp.A |"
            " Volatile Uncorr. ECC |",
            "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage |"
            " GPU-Util  Compute M. |",
            "|=========================================+========================+"
            "======================|",
            "|   0  NVIDIA H100 80GB HBM3          On  |   00000000:19:00.0 Off |"
            "                    0 |",
            "| N/A   28C    P0             69W /  700W |       4MiB /  81559MiB |"
            "      0%      Default |",
            "",
        ]
    )
    fmt, header, snaps, _ = parse(text)
    assert fmt == "nvidia-smi-table"
    assert header.driver_version == "550.54.15"
    assert header.gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert header.gpus[0].pci_bus_id == "00000000:19:00.0"
    g = snaps[0].gpus[0]
    assert (g.util_pct, g.power_watts, g.power_limit_watts, g.mem_used_bytes) == (
        0.0,
        69.0,
        700.0,
        4 * MIB,
    )


def test_sub_second_without_index_keeps_each_gpu_apart() -> None:
    """8 GPUs at -lms 100, no index column, rows of a tick 1.2 ms apart, nvidia-smi
    restarted half-way (header again, 5 s pause): no row lands on the wrong GPU."""

    def stamp(t: float) -> str:
        whole = int(t)
        return time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(whole)) + (
            f".{int((t - whole) * 1000):03d}"
        )

    head = "timestamp, name, utilization.gpu [%], memory.used [MiB]\n"
    lines = [head]
    for k in range(300):
        if k == 150:
            lines.append(head)
        base = 1714564800 + k * 0.1 + (5 if k >= 150 else 0)
        lines += [
            f"{stamp(base + g * 0.0012)}, NVIDIA H100, {g * 10} %, {1000 + g} MiB\n"
            for g in range(8)
        ]
    _, header, snaps, _ = parse("".join(lines))
    assert len(header.gpus) == 8
    points = [(g.gpu, u) for s in snaps for g in s.gpus for _, u in g.util_samples]
    assert len(points) == 2400
    assert all(u == gpu * 10 for gpu, u in points)


# --- values that are not numbers (review findings) ----------------------------------------


def test_a_nan_cell_is_no_reading_and_does_not_turn_a_healthy_log_idle() -> None:
    from gpumon.engine import analyze
    from gpumon.faces.analyze.report import to_json

    rows = ["timestamp, index, utilization.gpu [%]\n"]
    for k in range(300):
        util = "nan" if k == 150 else "95 %"
        rows.append(f"2024/05/01 12:{k // 60:02d}:{k % 60:02d}.000, 0, {util}\n")
    _, header, snaps = read_lines(rows, "nvidia-smi-csv")
    snaps = list(snaps)
    assert [g.util_pct for s in snaps for g in s.gpus][150] is None
    assert to_json(analyze(header, snaps))["verdict"] == "healthy"


def test_an_infinite_cell_is_an_error_naming_the_line() -> None:
    rows = [
        "timestamp, index, utilization.gpu [%]\n",
        "2024/05/01 12:00:00.000, 0, 95 %\n",
        "2024/05/01 12:00:01.000, 0, inf %\n",
    ]
    _, _, snaps = read_lines(rows, "nvidia-smi-csv", "gpu.csv")
    with pytest.raises(TraceFormatError, match=r"gpu\.csv:3"):
        list(snaps)


def test_home_made_csv_with_the_gpu_index_in_the_first_column() -> None:
    rows = ["gpu,time,util\n"]
    for t in range(5):
        rows += [f"{g},{t},{50 + g}\n" for g in range(4)]
    _, header, snaps = read_lines(rows, "csv")
    assert [g.index for g in header.gpus] == [0, 1, 2, 3]
    assert {g.gpu for s in snaps for g in s.gpus} == {0, 1, 2, 3}


@pytest.mark.parametrize(
    "fmt, rows, bad_line_no",
    [
        (
            "nvidia-smi-csv",
            [
                "timestamp, index, utilization.gpu [%], memory.used [MiB]\n",
                "2024/05/01 12:00:00.000, 0, 95 %, 100 MiB\n",
                "2024/05/01 12:00:01.000, 0, 95 %, lots MiB\n",
            ],
            3,
        ),
        (
            "dmon",
            [
                "# gpu   pwr    sm\n",
                "# Idx     W     %\n",
                "    0    60    10\n",
                "    0    xx    10\n",
            ],
            4,
        ),
        ("csv", ["time,util,power\n", "0,50,100\n", "1,50,100\n", "2,50,watts\n"], 4),
    ],
)
def test_a_malformed_cell_besides_the_utilisation_names_its_line(
    fmt: str, rows: list[str], bad_line_no: int
) -> None:
    """Cells other than the utilisation are parsed only when a row becomes a sample (in the
    assembler, after the row loop has moved on): the error still names that row's line."""
    _, _, snaps = read_lines(rows, fmt, "log.txt")
    with pytest.raises(TraceFormatError, match=rf"log\.txt:{bad_line_no}: malformed value"):
        list(snaps)
