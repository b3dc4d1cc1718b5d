"""Hostile and broken input (issue 13): every reader linear in its input, memory bounded,
long lines a named error at once, cut-short files read as far as they go, and errors
that name the cell and the line."""

from __future__ import annotations

import contextlib
import gzip
import time
import tracemalloc
from pathlib import Path

import pytest

from gpumon.errors import GpumonError, TraceFormatError
from gpumon.traces.sniff import open_trace, read_lines
from gpumon.traces.source import MAX_LINE

LOGS = Path(__file__).parent / "data" / "logs"


def lines_of(name: str) -> list[str]:
    return (LOGS / name).read_text(encoding="utf-8").splitlines(keepends=True)


def cpu(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def read_all(lines: list[str], fmt: str = "auto") -> tuple[str, list, list[str]]:
    warnings: list[str] = []
    found, _header, snaps = read_lines(lines, fmt, "log", warnings)
    return found, list(snaps), warnings


@pytest.mark.parametrize("spaces", [2000, 4000, 200_000])
def test_crafted_table_row_costs_time_in_proportion(spaces: int) -> None:
    """``|   0 `` + spaces + ``X`` took 45 s (2000 spaces) with the old GPU-row regex."""
    table = lines_of("table_535.txt")
    bad = "|   0 " + " " * spaces + "X\n"
    lines = table[:20] + [bad] * 50 + table[20:]
    took = cpu(lambda: read_all(lines))
    assert took < 0.5 + 5e-8 * spaces * 50  # far below a second for 10 MB of crafted rows


@pytest.mark.parametrize("length", [16_000, 500_000])
def test_junk_first_line_before_a_csv_is_skipped_fast(length: int) -> None:
    """A first line ``a`` + 16000 ``_`` + ``a`` made the unit-suffix regex run > 300 s."""
    lines = ["a" + "_" * length + "a\n", *lines_of("nvsmi_units_index.csv")]
    result: list = []
    took = cpu(lambda: result.append(read_all(lines)))
    fmt, snaps, warnings = result[0]
    assert took < 2.0
    assert fmt == "nvidia-smi-csv" and len(snaps) == 120
    assert any("before the header" in w for w in warnings)


def test_a_line_over_the_bound_is_a_named_error_after_the_valid_part(tmp_path: Path) -> None:
    rows = lines_of("nvsmi_units_index.csv")
    path = tmp_path / "long.csv"
    path.write_text("".join(rows[:41]) + "9" * (MAX_LINE + 10) + "\n" + "".join(rows[41:]))
    got = []
    with open_trace(path) as trace, pytest.raises(TraceFormatError) as err:
        got.extend(trace)
    assert err.value.line == 42 and "longer than 1 MiB" in str(err.value)
    assert len(got) >= 19


@pytest.mark.parametrize(
    "start",
    ["", "timestamp, utilization.gpu [%]\n", "# gpu   pwr    sm\n# Idx     W     %\n", "{"],
)
def test_a_huge_file_without_newlines_takes_bounded_memory(tmp_path: Path, start: str) -> None:
    """A 300 MB file without a newline took 612 MB; here 24 MB, read under 16 MiB."""
    path = tmp_path / "blob.txt"
    with open(path, "w") as f:
        f.write(start)
        chunk = "7" * (1 << 20)
        for _ in range(24):
            f.write(chunk)
    tracemalloc.start()
    try:
        with pytest.raises(GpumonError), open_trace(path) as trace:
            list(trace)
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_truncated_gzip_shorter_than_the_sniffing_head(tmp_path: Path) -> None:
    """19 ticks were readable and none were reported (exit 1)."""
    text = "".join(lines_of("nvsmi_units_index.csv")[:60])
    packed = gzip.compress(text.encode())
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(packed[: len(packed) * 2 // 3])
    with open_trace(path) as trace:
        snaps = list(trace)
        warnings = trace.warnings
    assert 10 <= len(snaps) <= 30
    assert any("gzip stream ends early" in w for w in warnings)


def test_truncated_gzip_after_the_head(tmp_path: Path) -> None:
    text = "".join(lines_of("dmon_default.txt")) * 40
    packed = gzip.compress(text.encode())
    path = tmp_path / "cut.txt.gz"
    path.write_bytes(packed[: len(packed) // 2])
    with open_trace(path) as trace:
        snaps = list(trace)
        warnings = trace.warnings
    assert len(snaps) > 1000
    assert any("gzip stream ends early" in w for w in warnings)


def test_a_malformed_cell_names_the_column_and_the_line() -> None:
    """``abc %`` was reported as "could not convert string to float: ''"."""
    rows = [
        "timestamp, index, utilization.gpu [%], memory.used [MiB]\n",
        "2024/05/01 12:00:00.000, 0, 95 %, 100 MiB\n",
        "2024/05/01 12:00:01.000, 0, abc %, 100 MiB\n",
    ]
    with pytest.raises(TraceFormatError) as err:
        read_all(rows)
    msg = str(err.value)
    assert msg.startswith("log:3:")
    assert "'utilization.gpu [%]'" in msg and "'abc %' is not a number" in msg
    rows[2] = "2024/05/01 12:00:01.000, 0, 95 %, lots MiB\n"
    with pytest.raises(TraceFormatError, match=r"log:3: .*'memory.used \[MiB\]'.*'lots MiB'"):
        read_all(rows)


def test_many_rows_with_one_timestamp_warn() -> None:
    """1.5 M rows with one timestamp gave '0:00' and no warning."""
    rows = ["timestamp, index, utilization.gpu [%]\n"]
    rows += ["2024/05/01 12:00:00.000, 0, 50 %\n"] * 20_000
    _fmt, snaps, warnings = read_all(rows)
    assert len(snaps) == 20_000
    assert any("all 20,000 ticks carry the same time" in w for w in warnings)


def test_forcing_the_gpumon_format_on_a_csv_says_so() -> None:
    with pytest.raises(TraceFormatError) as err:
        read_all(lines_of("nvsmi_units_index.csv"), "gpumon")
    msg = str(err.value)
    assert "not a gpumon trace: its first line is not JSON" in msg
    assert "Expecting value" not in msg and "leave out --format" in msg


def test_forcing_another_wrong_format_names_the_right_one() -> None:
    with pytest.raises(TraceFormatError, match=r"it looks like nvidia-smi-csv"):
        read_all(lines_of("nvsmi_units_index.csv"), "dmon")


@pytest.mark.parametrize(
    "text",
    [
        "\x00\x01\x02" * 1000,
        "{" * 50_000,
        "[" * 50_000,
        '{"resultType": "matrix", "result": [' + "[" * 20_000,
        '"' * 30_000 + "\n" + "a,b\n" * 10,
        "| N/A | " * 20_000 + "\n",
        "[0] x | " * 20_000 + "\n",
        "#Entity " + "GPUTL " * 20_000 + "\nGPU 0 1\n",
    ],
    ids=lambda text: repr(text[:12]),
)
def test_pathological_shapes_fail_fast_with_our_errors(text: str) -> None:
    def go() -> None:
        with contextlib.suppress(GpumonError):
            read_all(text.splitlines(keepends=True))

    assert cpu(go) < 2.0
