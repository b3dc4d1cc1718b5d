"""`gpumon analyze` end to end: the real CLI in a subprocess on every sample log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpumon.model import Cause, State
from gpumon.traces.jsonl import TraceWriter

pytest.importorskip("gpumon.faces.analyze.report", reason="the report module has not landed yet")

pytestmark = pytest.mark.slow

LOGS = Path(__file__).parent / "data" / "logs"
ROOT = Path(__file__).parent.parent
STATES = {s.value for s in State}
CAUSES = {c.value for c in Cause}

# Sample log -> GPUs it holds.
SAMPLES = {
    "nvsmi_units_index.csv": 2,
    "nvsmi_nounits_lms100.csv": 1,
    "nvsmi_noindex_4gpu.csv": 4,
    "nvsmi_noheader.csv": 2,
    "nvsmi_na_uuid.csv": 1,
    "dmon_default.txt": 2,
    "dmon_dt.txt": 1,
    "table_535.txt": 2,
    "table_470.txt": 1,
    "table_grep.txt": 2,
    "simple.csv": 2,
    "simple_iso.csv": 1,
}


def gpumon(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "gpumon", "analyze", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )


def check_json(doc: dict, gpus: int) -> None:
    assert doc["verdict"] in STATES
    assert doc["cause"] is None or doc["cause"] in CAUSES
    if doc["verdict"] != "starved":
        assert doc["cause"] is None
    assert isinstance(doc["advice"], list) and all(isinstance(a, str) for a in doc["advice"])
    assert [g["gpu"] for g in doc["gpus"]] == list(range(gpus))
    for g in doc["gpus"]:
        assert g["state"] in STATES
        assert g["duty_cycle"] is None or 0.0 <= g["duty_cycle"] <= 1.0
        assert isinstance(g["samples"], int) and g["samples"] > 0
        for ep in g["episodes"]:
            assert {"start", "end", "state", "cause", "evidence"} <= set(ep)
            assert ep["state"] in STATES


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_json_report_on_each_sample(name: str) -> None:
    proc = gpumon(LOGS / name, "--json")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    check_json(json.loads(proc.stdout), SAMPLES[name])


@pytest.mark.parametrize("name", ["nvsmi_units_index.csv", "dmon_default.txt", "table_535.txt"])
def test_text_report(name: str) -> None:
    proc = gpumon(LOGS / name)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and not proc.stdout.lstrip().startswith("{")


def test_assumptions_are_said() -> None:
    proc = gpumon(LOGS / "table_grep.txt", "--json")
    assert proc.returncode == 0
    assert "gpumon: note: no date lines: tables assumed 1 s apart" in proc.stderr
    assert "gpumon: note: GPUs: 2 (GPU rows without their first line" in proc.stderr


def test_starved_log_is_called_starved() -> None:
    """2 s busy / 2 s idle on every GPU, logged by nvidia-smi -l 1."""
    doc = json.loads(gpumon(LOGS / "nvsmi_units_index.csv", "--json").stdout)
    assert doc["verdict"] == "starved"
    assert all(0.3 < g["duty_cycle"] < 0.7 for g in doc["gpus"])


def test_utf16_crlf_log(tmp_path: Path) -> None:
    text = (LOGS / "dmon_default.txt").read_text(encoding="utf-8")
    path = tmp_path / "dmon-utf16.txt"
    path.write_bytes(text.replace("\n", "\r\n").encode("utf-16"))
    proc = gpumon(path, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(gpumon(LOGS / "dmon_default.txt", "--json").stdout)


def test_malformed_line_reports_valid_part_then_fails() -> None:
    proc = gpumon(LOGS / "bad_malformed_mid.csv", "--json")
    assert proc.returncode == 2
    assert "bad_malformed_mid.csv:43:" in proc.stderr
    assert "Traceback" not in proc.stderr
    check_json(json.loads(proc.stdout), 2)  # the report of the lines before it


def test_cut_short_last_line_is_only_a_warning() -> None:
    proc = gpumon(LOGS / "bad_cut_short.csv", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "incomplete" in proc.stderr


def test_unrecognised_file() -> None:
    proc = gpumon(LOGS / "bad_unknown.txt")
    assert proc.returncode == 2
    assert "bad_unknown.txt:1:" in proc.stderr and "Tried:" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_missing_file() -> None:
    proc = gpumon(LOGS / "no-such-file.csv")
    assert proc.returncode != 0
    assert "no-such-file.csv" in proc.stderr and "Traceback" not in proc.stderr


def test_wrong_forced_format() -> None:
    proc = gpumon(LOGS / "simple.csv", "--format", "dmon")
    assert proc.returncode == 2
    assert "simple.csv" in proc.stderr and "Traceback" not in proc.stderr


def test_gpumon_trace(tmp_path: Path) -> None:
    from gpumon.lab.synth import generate

    synth = generate("starved_cpu", seed=1, gpus=2, duration_s=180.0)
    path = tmp_path / "run.jsonl"
    with TraceWriter.open(path, synth.header) as writer:
        for snap in synth.snapshots:
            writer.write(snap)
    for fmt in ("auto", "gpumon"):
        proc = gpumon(path, "--json", "--format", fmt)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        check_json(doc, 2)
        assert doc["verdict"] == "starved"


@pytest.mark.parametrize(
    "part, field, value",
    [
        ("gpu", "power_watts", '"high"'),
        ("gpu", "util_samples", '[["a", 5]]'),
        ("host", "cpu_pct", "[97]"),
    ],
)
def test_a_string_where_a_number_belongs_names_the_line(
    tmp_path: Path, part: str, field: str, value: str
) -> None:
    """JSON can hold any type anywhere: a wrong one mid-trace gets the report of the ticks
    before it and an error naming its line, not a traceback from inside the detector."""
    from gpumon.lab.synth import generate

    synth = generate("healthy", seed=2, gpus=1, duration_s=120.0)
    path = tmp_path / "run.jsonl"
    with TraceWriter.open(path, synth.header) as writer:
        for snap in synth.snapshots:
            writer.write(snap)
    lines = path.read_text().splitlines(keepends=True)
    obj = json.loads(lines[80])
    (obj["gpus"][0] if part == "gpu" else obj["host"])[field] = json.loads(value)
    lines[80] = json.dumps(obj) + "\n"
    path.write_text("".join(lines))
    proc = gpumon(path, "--json")
    assert proc.returncode == 2
    assert f"run.jsonl:81: malformed values in the tick at t={obj['t']}" in proc.stderr
    assert "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    check_json(doc, 1)
    assert doc["gpus"][0]["samples"] > 0
