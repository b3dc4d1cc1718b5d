"""Hostile and broken input (issue 13): every reader linear in its input, memory bounded,
long lines a named error at once, cut-short files read as far as they go, and errors
that name the cell and the line."""

from __future__ import annotations

import contextlib
import gzip
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

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
    [
        "",
        "timestamp, utilization.gpu [%]\n",
        "# gpu   pwr    sm\n# Idx     W     %\n",
        "{",
        '{"ts": 1, "gpu_index": 0, "util_gpu": 5}\n{"ts": 2, "gpu_index": 0, "util_gpu": ',
        "==============NVSMI LOG==============\nGPU 00000000:01:00.0\n    Utilization\n",
        "GPUId,TimeStampUs,Field,Values\n0,1,gpu_utilization,5\n0,2,gpu_utilization,",
        "[12:00:00] GPU0: util=5%\n[12:00:01] GPU0: util=6%\n[12:00:02] GPU0: util=",
    ],
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


# --- second round (issue "Hostile input, second round"): each in a child held to a few
# hundred MiB and a timeout, so that a loop or a blow-up fails the test, not the machine.


def bounded_analyze(
    path: Path, *args: str, mib: int = 400, timeout: float = 120
) -> tuple[int, dict[str, Any] | None, str]:
    """``gpumon analyze --json`` on ``path`` in a child limited to ``mib`` MiB of address
    space and ``timeout`` seconds: (exit status, the report or None, stderr)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (mib << 20, mib << 20))

    proc = subprocess.run(
        [sys.executable, "-m", "gpumon", "analyze", "--json", *args, str(path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
    )
    report = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, report, proc.stderr


def samples_read(report: dict[str, Any] | None) -> int:
    assert report is not None
    return sum(g["samples"] for g in report["gpus"])


def test_prometheus_point_at_a_nan_time_is_skipped(tmp_path: Path) -> None:
    """One ``[NaN, "50"]`` point kept a CPU at 100 % for over ten minutes."""
    points = '[1714564800, "50"], [1714564815, "60"], [NaN, "50"], [1714564830, "70"]'
    path = tmp_path / "prom.json"
    path.write_text(
        '{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": '
        '{"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", "Hostname": "n1"}, '
        f'"values": [{points}]}}]}}}}\n'
    )
    status, report, err = bounded_analyze(path, timeout=60)
    assert status == 0, err
    assert samples_read(report) == 3
    assert "prom.json:1: 1 point(s) whose time is not a finite number" in err


def _gpumon_trace(times: list[str]) -> str:
    header = (
        '{"format": "gpumon-trace", "version": 1, "header": {"source": "gpumon", '
        '"interval_s": 1.0, "gpus": [{"index": 0, "uuid": "GPU-x"}]}}\n'
    )
    ticks = (
        f'{{"t": {t}, "gpus": [{{"gpu": 0, "uuid": "GPU-x", "util_pct": 50.0}}]}}\n' for t in times
    )
    return header + "".join(ticks)


@pytest.mark.parametrize("kind", ["gpumon", "wandb", "csv"])
def test_nan_and_infinite_times_are_skipped_and_named(tmp_path: Path, kind: str) -> None:
    """A time of NaN or 1e999 ended in "cannot convert float NaN to integer", a traceback
    and exit 1 (gpumon traces, W&B logs)."""
    times = [str(1714564800 + k) for k in range(10)]
    times[4], times[6] = "NaN", "1e999"
    path = tmp_path / f"times.{kind}"
    if kind == "gpumon":
        path.write_text(_gpumon_trace(times))
        bad_line = 6  # the header is line 1
    elif kind == "wandb":
        path.write_text("".join(f'{{"system.gpu.0.gpu": 50, "_timestamp": {t}}}\n' for t in times))
        bad_line = 5
    else:
        path.write_text(
            "timestamp, index, utilization.gpu [%]\n"
            + "".join(f"{t.lower()}, 0, 50 %\n" for t in times)
        )
        bad_line = 6
    status, report, err = bounded_analyze(path, timeout=60)
    assert status == 0, err
    assert "Traceback" not in err
    assert samples_read(report) == 8
    assert f"times.{kind}:{bad_line}: 2 row(s) whose time is not a finite number" in err


def test_a_header_then_hundreds_of_blank_lines_keeps_the_rows(tmp_path: Path) -> None:
    """600 blank lines after the header: "malformed value ('NoneType' object is not
    callable)" and the row was lost."""
    path = tmp_path / "blank.csv"
    path.write_text(
        "timestamp, index, utilization.gpu [%], memory.used [MiB]\n"
        + "\n" * 600
        + "2024/05/01 12:00:00.000, 0, 50 %, 100 MiB\n"
        + "2024/05/01 12:00:01.000, 0, 60 %, 100 MiB\n"
    )
    status, report, err = bounded_analyze(path, timeout=60)
    assert status == 0, err
    assert "malformed" not in err
    assert samples_read(report) == 2


def test_a_header_repeated_a_million_times_before_one_row(tmp_path: Path) -> None:
    """The row after a million headers was skipped as "malformed ('NoneType' object is not
    callable)"; it is read, within bounded memory and time."""
    path = tmp_path / "headers.csv"
    header = "timestamp, index, utilization.gpu [%], memory.used [MiB]\n"
    with open(path, "w") as f:
        for _ in range(100):
            f.write(header * 10_000)
        f.write("2024/05/01 12:00:00.000, 0, 50 %, 100 MiB\n")
    status, report, err = bounded_analyze(path, mib=300, timeout=120)
    assert status == 0, err
    assert "malformed" not in err
    assert samples_read(report) == 1


# --- the reader edge cases of "Real logs, the long tail" (class 6) --------------------------


def test_a_header_naming_our_columns_among_many_of_its_own_is_read(tmp_path: Path) -> None:
    """``timestamp, index, utilization.gpu [%]`` and ten columns of the trainer's own was
    refused, even with ``--format csv``."""
    path = tmp_path / "train.csv"
    rows = [
        "timestamp, index, utilization.gpu [%], step, loss, lr, grad_norm, tokens_per_sec, "
        "batch, seq_len, mfu, run, note"
    ]
    rows += [
        f"2024/05/01 12:00:{k:02d}.000, 0, {95 if k % 4 < 2 else 0}, {k}, 0.5, 0.001, 1.2, "
        "5000, 32, 2048, 0.4, r1, ok"
        for k in range(40)
    ]
    path.write_text("\n".join(rows) + "\n")
    for args in ((), ("--format", "csv")):
        status, report, err = bounded_analyze(path, *args, timeout=60)
        assert status == 0, err
        assert samples_read(report) == 40


def test_a_bad_time_in_the_first_rows_is_named_with_its_line(tmp_path: Path) -> None:
    """A bad time among the first ~600 rows blamed the valid first row, without a line
    number; it is named with its line, as it is further down, after the rows before it."""
    path = tmp_path / "bad.csv"
    rows = ["timestamp, index, utilization.gpu [%]"]
    rows += [f"2024/05/01 12:{k // 60:02d}:{k % 60:02d}.000, 0, 50 %" for k in range(100)]
    rows[31] = "garbage, 0, 50 %"
    path.write_text("\n".join(rows) + "\n")
    status, report, err = bounded_analyze(path, timeout=60)
    assert status == 2
    assert "bad.csv:32: malformed value ('garbage' is not a timestamp)" in err
    assert "2024/05/01 12:00:00.000" not in err
    assert samples_read(report) == 30


def test_times_that_run_backwards_are_said(tmp_path: Path) -> None:
    """A log written newest first gave 0:00 and UNKNOWN without a word."""
    path = tmp_path / "back.csv"
    rows = ["timestamp, index, utilization.gpu [%]"]
    rows += [f"2024/05/01 12:{k // 60:02d}:{k % 60:02d}.000, 0, 90 %" for k in range(120, 0, -1)]
    path.write_text("\n".join(rows) + "\n")
    status, _report, err = bounded_analyze(path, timeout=60)
    assert status == 0, err
    assert "the times run backwards (119 of 119 steps" in err


@pytest.mark.parametrize("value", ["-50", "1e9"])
def test_utilisation_outside_0_to_100_is_named(tmp_path: Path, value: str) -> None:
    """Every row at -50 % or 1e9 % gave "no GPU could be classified" and no word of why."""
    path = tmp_path / "range.csv"
    rows = ["timestamp, index, utilization.gpu [%]"]
    rows += [f"2024/05/01 12:00:{k:02d}.000, 0, {value} %" for k in range(30)]
    path.write_text("\n".join(rows) + "\n")
    status, _report, err = bounded_analyze(path, timeout=60)
    assert status == 0, err
    said = "range.csv:2: 30 utilisation reading(s) outside 0-100 %: read as no reading"
    assert f"{said} (the first: '{value} %')" in err


def test_gzip_of_blank_lines_takes_bounded_memory(tmp_path: Path) -> None:
    """A gzipped log with many blank lines after its rows was 6x slower than the same file
    plain: every 64 KiB read decompressed to tens of MB held (and copied) at once.  Speed
    is a benchmark's business; this holds the memory that made it slow."""
    rows = "".join(lines_of("nvsmi_units_index.csv"))
    blank = (" " * 4095 + "\n").encode()
    path = tmp_path / "blank.csv.gz"
    with gzip.open(path, "wb") as f:
        f.write(rows.encode())
        for _ in range(12):
            f.write(blank * 1024)  # 48 MiB of blank lines in all
    tracemalloc.start()
    try:
        with open_trace(path) as trace:
            snaps = list(trace)
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(snaps) == 120
    assert peak < 16 << 20
