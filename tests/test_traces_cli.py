"""`gpumon analyze` argument handling for logs: stdin, --interval, --format errors, and the
readers' notes and warnings on stderr (the real CLI in a subprocess)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

LOGS = Path(__file__).parent / "data" / "logs"
ROOT = Path(__file__).parent.parent


def analyze(
    *args: str | os.PathLike[str], stdin: bytes | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "gpumon", "analyze", *map(str, args)],
        input=stdin,
        capture_output=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )


def test_dash_reads_stdin() -> None:
    data = (LOGS / "nvsmi_units_index.csv").read_bytes()
    proc = analyze("-", "--json", stdin=data)
    assert proc.returncode == 0, proc.stderr.decode()
    doc = json.loads(proc.stdout)
    assert len(doc["gpus"]) == 2
    assert doc == json.loads(analyze(LOGS / "nvsmi_units_index.csv", "--json").stdout)


def test_dash_reads_gzip_and_gpumon_traces_from_stdin() -> None:
    data = gzip.compress((LOGS / "dmon_default.txt").read_bytes())
    proc = analyze("-", "--json", stdin=data)
    assert proc.returncode == 0, proc.stderr.decode()
    assert len(json.loads(proc.stdout)["gpus"]) == 2


def test_format_gpumon_on_a_csv_is_one_clear_sentence() -> None:
    proc = analyze(LOGS / "nvsmi_units_index.csv", "--format", "gpumon")
    err = proc.stderr.decode()
    assert proc.returncode == 2
    assert "not a gpumon trace: its first line is not JSON" in err
    assert "Expecting value" not in err and "Traceback" not in err


def test_interval_flag_sets_the_spacing_of_timeless_rows() -> None:
    proc = analyze(LOGS / "dmon_default.txt", "--json", "--interval", "2")
    assert proc.returncode == 0, proc.stderr.decode()
    assert "ticks assumed 2 s apart" in proc.stderr.decode()
    default = analyze(LOGS / "dmon_default.txt")
    assert "ticks assumed 1 s apart" in default.stderr.decode()


@pytest.mark.parametrize("bad", ["0", "-1", "fast"])
def test_interval_flag_rejects_nonsense(bad: str) -> None:
    proc = analyze(LOGS / "dmon_default.txt", "--interval", bad)
    assert proc.returncode == 2
    assert "--interval" in proc.stderr.decode()


def test_gpu_inference_and_notes_are_said() -> None:
    proc = analyze(LOGS / "quirks" / "nvsmi_8gpu_same_stamp.csv", "--json")
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "gpumon: note: GPUs: 8 GPUs inferred" in err and "share one timestamp" in err
    assert len(json.loads(proc.stdout)["gpus"]) == 8
    proc = analyze(LOGS / "quirks" / "tsv_time_s_aggregates.tsv", "--json")
    assert "gpumon: note: the 'CPU' column is read as host CPU, not a GPU" in proc.stderr.decode()


def test_one_timestamp_for_every_row_is_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "frozen.csv"
    rows = ["timestamp, index, utilization.gpu [%]"]
    rows += ["2024/05/01 12:00:00.000, 0, 50 %"] * 3000
    path.write_text("\n".join(rows) + "\n")
    proc = analyze(path, "--json")
    assert proc.returncode == 0
    assert "gpumon: warning:" in proc.stderr.decode()
    assert "ticks carry the same time" in proc.stderr.decode()


def test_a_malformed_cell_after_valid_rows_names_column_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    rows = ["timestamp, index, utilization.gpu [%]"]
    rows += [f"2024/05/01 12:00:{k:02d}.000, 0, 50 %" for k in range(30)]
    rows.append("2024/05/01 12:00:31.000, 0, abc %")
    path.write_text("\n".join(rows) + "\n")
    proc = analyze(path, "--json")
    err = proc.stderr.decode()
    assert proc.returncode == 2
    assert "bad.csv:32:" in err and "'abc %' is not a number" in err
    assert "utilization.gpu [%]" in err
    assert json.loads(proc.stdout)["gpus"]  # the report of the 30 rows before it
