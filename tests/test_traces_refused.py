"""Logs gpumon refused before issue 35, read now: other monitors' JSON lines, nvidia-smi -q
reports, long tables, one-line monitors, key-value blocks with lines of several readings,
and rows of bare numbers (read where the values allow one reading only, else refused
naming ``--columns``, and read with it).  The fixtures are tests/data/logs/quirks (see
its manifest) and tests/data/logs/headerless; values are checked against the files
themselves, not against numbers copied here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gpumon.errors import TraceFormatError
from gpumon.model import Snapshot, TraceHeader
from gpumon.traces.sniff import open_trace, read_lines
from gpumon.traces.source import MAX_LINE

LOGS = Path(__file__).parent / "data" / "logs"
QUIRKS = LOGS / "quirks"
HEADERLESS = LOGS / "headerless"
HEADERLESS_CASES = tomllib.loads((HEADERLESS / "manifest.toml").read_text())["files"]
ROOT = Path(__file__).parent.parent
MIB = 1 << 20


def load(
    path: Path, columns: list[str] | None = None
) -> tuple[str, TraceHeader, list[Snapshot], list[str]]:
    with open_trace(path, columns=columns) as trace:
        snaps = list(trace)
        return trace.format, trace.header, snaps, trace.warnings


def said(header: TraceHeader, warnings: list[str]) -> str:
    return " | ".join([*map(str, header.extra.values()), *warnings])


def analyze(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "gpumon", "analyze", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )


# --- 1. JSON lines of other monitors ------------------------------------------------------


def test_json_per_gpu_objects_read_by_name_nulls_none_events_counted() -> None:
    path = QUIRKS / "json_per_gpu_events.jsonl"
    fmt, header, snaps, warnings = load(path)
    assert fmt == "json-lines"
    objs = [json.loads(ln) for ln in path.read_text().splitlines()[:-1]]
    samples = [o for o in objs if "gpu_index" in o]
    # Every object of a GPU is one sample of it, in order, with its values.
    for g in (0, 1):
        want = [o for o in samples if o["gpu_index"] == g]
        got = [x for s in snaps for x in s.gpus if x.gpu == g]
        assert [x.util_pct for x in got] == [float(o["util_gpu"]) for o in want]
        assert [x.mem_used_bytes for x in got] == [o["mem_used"] * MIB for o in want]
        # null is no reading, never 0
        assert [x.power_watts for x in got] == [o["power_draw"] for o in want]
        assert any(o["power_draw"] is None for o in want)
    text = said(header, warnings)
    events = sum(1 for o in objs if "event" in o)
    assert f"{events} object(s) with no GPU reading" in text
    assert "last line is incomplete" in text
    assert {"pstate", "phase", "step"} <= set(header.extra["ignored_columns"])


def test_json_without_utilisation_says_what_it_can_and_cannot_judge() -> None:
    _, header, snaps, warnings = load(QUIRKS / "json_nvline_epoch.jsonl")
    assert all(g.util_pct is None for s in snaps for g in s.gpus)
    assert {g.mem_used_bytes for s in snaps for g in s.gpus} == {4 * MIB}
    assert header.gpus[0].name == "NVIDIA A10G"
    text = said(header, warnings)
    assert "cannot be judged" in text and "memory used" in text


def test_json_devices_list_fraction_and_gigabytes() -> None:
    path = QUIRKS / "json_devices_list.jsonl"
    _, header, snaps, _ = load(path)
    first = json.loads(path.read_text().splitlines()[0])
    for dev, got in zip(first["devices"], snaps[0].gpus, strict=True):
        assert got.gpu == dev["id"]
        assert got.util_pct == pytest.approx(dev["util"] * 100)
        assert got.mem_used_bytes == pytest.approx(dev["mem_used"] * 1024 * MIB, rel=1e-6)
    notes = " ".join(header.extra["notes"])  # type: ignore[arg-type]
    assert "read in GiB" in notes and "fraction" in str(header.extra["util_scale"])


def test_json_lines_that_are_not_objects_are_counted_not_fatal() -> None:
    rows = [
        json.dumps({"ts": 1764189000 + k, "gpu": 0, "gpu_util": k, "memory_used_mb": 100}) + "\n"
        for k in range(20)
    ]
    rows.insert(5, "Traceback (most recent call last):\n")
    rows.insert(9, "[1, 2, 3]\n")
    warnings: list[str] = []
    fmt, _, snaps = read_lines(rows, warnings=warnings)
    got = [s.gpus[0].util_pct for s in snaps]
    assert fmt == "json-lines" and got == [float(k) for k in range(20)]
    assert any("2 line(s) that are not a JSON object" in w for w in warnings)


# --- 2. nvidia-smi -q ---------------------------------------------------------------------


def _q_values(path: Path, section: str, key: str) -> list[str]:
    """The values of one field in one section, in file order (the test's own reading)."""
    out, current = [], ""
    for line in path.read_text().splitlines():
        if line.startswith("    ") and not line.startswith("        ") and ":" not in line:
            current = line.strip()
        elif (
            line.startswith("        ") and current == section and line.split(":")[0].strip() == key
        ):
            out.append(line.split(":", 1)[1].strip())
    return out


def test_nvsmi_q_loop_reads_utilisation_not_its_samples_section() -> None:
    path = QUIRKS / "nvsmi_q_loop_535.txt"
    fmt, header, snaps, _ = load(path)
    assert fmt == "nvidia-smi-q" and header.interval_s == 1.0
    assert [g.pci_bus_id for g in header.gpus] == ["00000000:3B:00.0", "00000000:D8:00.0"]
    utils = [float(v.split()[0]) for v in _q_values(path, "Utilization", "Gpu")]
    powers = [float(v.split()[0]) for v in _q_values(path, "GPU Power Readings", "Power Draw")]
    got = [(g.util_pct, g.power_watts) for s in snaps for g in s.gpus]
    assert got == list(zip(utils, powers, strict=True))
    assert all(g.power_limit_watts == 300.0 for s in snaps for g in s.gpus)


def test_nvsmi_q_gpus_by_bus_order_not_minor_number() -> None:
    path = QUIRKS / "nvsmi_q_full_minor_swap.txt"
    _, header, snaps, _ = load(path)
    minors = [
        int(v)
        for v in path.read_text().split("Minor Number")[1:3]
        for v in [v.split(":")[1].split()[0]]
    ]
    assert minors == [1, 0]  # the file's quirk
    first, second = header.gpus
    assert (first.index, first.pci_bus_id) == (0, "00000000:1A:00.0")
    assert first.uuid.endswith("c1") and second.uuid.endswith("c0")
    averages = [
        float(v.split()[0]) for v in _q_values(path, "GPU Power Readings", "Average Power Draw")
    ]
    assert [g.power_watts for s in snaps for g in s.gpus] == averages
    assert all(s.gpus[0].mem_used_bytes == 31874 * MIB for s in snaps)
    assert all(g.util_pct == 0.0 for s in snaps for g in s.gpus)


def test_nvsmi_q_single_report_is_one_moment() -> None:
    text = (QUIRKS / "nvsmi_q_full_minor_swap.txt").read_text()
    one = text[: text.index("==============NVSMI LOG", 10)]
    warnings: list[str] = []
    fmt, header, snaps = read_lines(one.splitlines(keepends=True), warnings=warnings)
    assert fmt == "nvidia-smi-q" and len(list(snaps)) == 1
    assert "single moment" in " ".join(header.extra["notes"])  # type: ignore[arg-type]


# --- 3. long tables -----------------------------------------------------------------------


def test_dcgm_api_rows_pivot_into_samples_whatever_their_order() -> None:
    path = QUIRKS / "dcgm_api_power_only.csv"
    fmt, header, snaps, warnings = load(path)
    assert fmt == "long-table" and len(header.gpus) == 2
    rows = [ln.split(",") for ln in path.read_text().splitlines()[1:]]
    power = {(int(r[0]), int(r[1])): float(r[3]) for r in rows if r[2] == "power_usage_instant"}
    # Each one-second window holds its GPU's hundred 10 ms samples, none lost or doubled.
    got = [g for s in snaps for g in s.gpus]
    assert len(got) == 12 and all(g.util_pct is None for g in got)
    t0 = min(t for _, t in power)
    for g in got:
        last = max(t for (gpu, t) in power if gpu == g.gpu and (t - t0) / 1e6 <= g.t_s + 0.001)
        assert g.power_watts == power[(g.gpu, last)]
    # The event reasons are read (bit 0: idle) where the GPU idles.
    idle = [g for g in got if g.power_watts is not None and g.power_watts < 100]
    assert idle and all(g.clock_event_reasons == 1 for g in idle)
    assert "throttle_reason_idle" in header.extra["ignored_columns"]
    assert "power tells a GPU drawing working power" in said(header, warnings)


def test_tidy_long_table_with_metric_names() -> None:
    path = QUIRKS / "long_tidy_dcgm_names.csv"
    fmt, header, snaps, _ = load(path)
    assert fmt == "long-table" and len(header.gpus) == 4
    rows = [ln.split(",") for ln in path.read_text().splitlines()[1:]]
    want = [float(r[4]) for r in rows if r[3] == "DCGM_FI_DEV_GPU_UTIL"]
    assert [g.util_pct for s in snaps for g in s.gpus] == want
    fb = [int(r[4]) * MIB for r in rows if r[3] == "DCGM_FI_DEV_FB_USED"]
    assert [g.mem_used_bytes for s in snaps for g in s.gpus] == fb


def test_long_table_malformed_rows_counted_and_named() -> None:
    rows = ["GPUId,TimeStampUs,Field,Values\n"] + [
        f"0,{1764189000_000000 + k * 1_000_000},gpu_utilization,{k}\n" for k in range(30)
    ]
    rows.insert(7, "0,1764189006000000,power_usage,61.2" + "0,1764189006000001,fb_used,3\n")
    warnings: list[str] = []
    fmt, _, snaps = read_lines(rows, warnings=warnings)
    assert fmt == "long-table"
    assert [s.gpus[0].util_pct for s in snaps] == [float(k) for k in range(30)]
    assert any(":8: 1 row(s) that are not a GPU" in w for w in warnings)


# --- 4. one-line monitors -----------------------------------------------------------------


def test_one_line_monitor_over_midnight_with_alerts_between() -> None:
    path = QUIRKS / "oneline_bracket_alerts.log"
    fmt, header, snaps, warnings = load(path)
    assert fmt == "one-line" and [g.index for g in header.gpus] == [2, 3]
    times = [s.t_s for s in snaps]
    assert times == sorted(times) and times[-1] == pytest.approx(5 * 239)
    text = path.read_text()
    utils = [float(p.split("util=")[1].split("%")[0]) for p in text.split("GPU2: ")[1:]]
    assert [s.gpus[0].util_pct for s in snaps] == utils
    skipped = sum(1 for ln in text.splitlines() if "util=" not in ln)
    assert any(f"{skipped} line(s) without GPU readings" in w for w in warnings)


def test_one_line_memory_percent_and_logging_times() -> None:
    path = QUIRKS / "oneline_logging_pipes.log"
    _, header, snaps, _ = load(path)
    assert len(header.gpus) == 4 and header.interval_s == 10.0
    first = path.read_text().splitlines()[0]
    assert snaps[0].gpus[3].util_pct == float(first.split("GPU3: Util=")[1].split("%")[0])


# --- 5. key-value blocks ------------------------------------------------------------------


def test_key_value_lines_of_several_readings_are_skipped_not_fatal() -> None:
    path = QUIRKS / "keyvalue_pytorch_lines.log"
    _, _, snaps, warnings = load(path)
    assert len(snaps) == 150
    used = [
        float(ln.split(": ")[1].split("MB")[0])
        for ln in path.read_text().splitlines()
        if ln.startswith("GPU Memory:")
    ]
    assert [s.gpus[0].mem_used_bytes for s in snaps] == [int(u * MIB) for u in used]
    assert any("150 line(s) whose value is not one reading" in w for w in warnings)
    # The process's CPU share above 100 % (several cores) is not the host's share.
    assert any(s.host is None for s in snaps)


def test_a_second_key_for_a_field_does_not_overwrite_the_first() -> None:
    block = [
        "=== 2025-01-05 14:02:11 ===\n",
        "GPU Load: 97.0%\n",
        "GPU Memory: 5120.0MB / 8192.0MB (62.5%)\n",
        "PyTorch GPU Memory - Allocated: 2.00 GB\n",
    ]
    warnings: list[str] = []
    _, header, snaps = read_lines(block * 4, warnings=warnings)
    assert [s.gpus[0].mem_used_bytes for s in snaps] == [5120 * MIB] * 4
    assert "PyTorch GPU Memory - Allocated" in header.extra["ignored_columns"]


# --- 6. rows of bare numbers, and --columns ------------------------------------------------


def test_bare_rows_read_where_the_values_leave_one_reading() -> None:
    path = QUIRKS / "noheader_stamp_util_varies.csv"
    _, header, snaps, _ = load(path)
    utils = [float(ln.split(", ")[2]) for ln in path.read_text().splitlines()]
    assert [s.gpus[0].util_pct for s in snaps] == utils
    assert snaps[0].gpus[0].mem_total_bytes == 24564 * MIB
    notes = " ".join(header.extra["notes"])  # type: ignore[arg-type]
    assert "read as utilization.gpu" in notes and "read as memory.total" in notes
    assert "column(s) 2, 4 not read" in notes


def test_epoch_first_bare_rows_are_a_table() -> None:
    rows = [f"{1764189000 + k}, {k % 7 * 14}, 2411, 16384\n" for k in range(20)]
    warnings: list[str] = []
    fmt, header, snaps = read_lines(rows, warnings=warnings)
    assert fmt == "nvidia-smi-csv"
    assert [s.gpus[0].util_pct for s in snaps] == [float(k % 7 * 14) for k in range(20)]
    assert "epoch seconds" in " ".join(header.extra["notes"])  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(HEADERLESS_CASES))
def test_ambiguous_bare_rows_are_refused_naming_columns(name: str) -> None:
    proc = analyze(HEADERLESS / name)
    assert proc.returncode == 2
    assert "--columns" in proc.stderr


@pytest.mark.parametrize("name", sorted(HEADERLESS_CASES))
def test_columns_names_them(name: str) -> None:
    case = HEADERLESS_CASES[name]
    proc = analyze(HEADERLESS / name, "--json", "--columns", case["columns"])
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert len(doc["gpus"]) == case["gpus"]
    assert doc["verdict"] == case["verdict"], case["behaviour"]
    _, header, _, _ = load(HEADERLESS / name, case["columns"].split(","))
    assert header.interval_s == pytest.approx(case["interval"], rel=0.05)


def test_columns_must_name_every_column() -> None:
    proc = analyze(
        HEADERLESS / "name_total_free_used.csv", "--columns", "timestamp,utilization.gpu"
    )
    assert proc.returncode == 2
    assert "2 column name(s) given, but the rows have 7 cells" in proc.stderr


def test_columns_override_a_header_and_say_so(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    rows = "".join(f"{1764189000 + k},{k},100\n" for k in range(10))
    path.write_text("ts,gpu_util,mem_mb\n" + rows)
    _, _, snaps, warnings = load(path, ["timestamp", "utilization.gpu", "memory.used"])
    assert [s.gpus[0].util_pct for s in snaps] == [float(k) for k in range(10)]
    assert any("own header line is passed over" in w for w in warnings)


def test_columns_refused_for_a_format_that_is_not_a_table() -> None:
    proc = analyze(
        QUIRKS / "nvsmi_q_loop_535.txt", "--format", "nvidia-smi-q", "--columns", "timestamp,index"
    )
    assert proc.returncode == 2 and "--columns names the columns of a table" in proc.stderr


# --- every new reader: bounded lines --------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "json_per_gpu_events.jsonl",
        "nvsmi_q_loop_535.txt",
        "dcgm_api_power_only.csv",
        "oneline_bracket_alerts.log",
    ],
)
def test_a_line_over_the_bound_is_a_named_error(name: str) -> None:
    head = (QUIRKS / name).read_text().splitlines(keepends=True)[:300]
    rows = [*head, "x" * (MAX_LINE + 10) + "\n", *head[-3:]]
    with pytest.raises(TraceFormatError, match="longer than"):
        _, _, snaps = read_lines(rows)
        for _ in snaps:
            pass


def test_nvsmi_q_reads_the_power_limit_610_drivers_nest() -> None:
    """610 drivers put the limit under GPU Power Readings / GPU Ceiling Power Limit."""
    report = [
        "==============NVSMI LOG==============\n",
        "Timestamp                                              : Wed Sep 16 16:20:41 2026\n",
        "GPU 00000000:01:00.0\n",
        "    Utilization\n",
        "        GPU                                            : 0 %\n",
        "    GPU Power Readings\n",
        "        Average Power Draw                             : 12.11 W\n",
        "        GPU Ceiling Power Limit\n",
        "            Current Power Limit                        : 80.00 W\n",
        "        Min Power Limit                                : 1.00 W\n",
    ]
    _, _, snaps = read_lines(report)
    gpu = next(iter(snaps)).gpus[0]
    assert (gpu.power_watts, gpu.power_limit_watts) == (12.11, 80.0)


def test_public_log_score_counts_verdict_gpus_and_refusals(tmp_path: Path) -> None:
    """benchmarks/score_public_logs.py on a manifest of two logs: one read and judged as
    labelled, one gpumon cannot read."""
    (tmp_path / "a.csv").write_bytes((QUIRKS / "json_devices_list.jsonl").read_bytes())
    (tmp_path / "b.log").write_text("hello\nworld\n")
    (tmp_path / "manifest.toml").write_text(
        '[logs."a.csv"]\nrepo = "x/y"\npath = "a"\ncommit = "0"\nlines = "all"\n'
        'label = "healthy"\ngpus = 2\nevidence = "two GPUs at 93-100 %"\n\n'
        '[logs."b.log"]\nrepo = "x/y"\npath = "b"\ncommit = "0"\nlines = "all"\n'
        'label = "idle"\ngpus = 1\nevidence = "none"\n'
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "score_public_logs.py"),
            str(tmp_path / "manifest.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "both right: 1/2" in proc.stdout
    assert "read (not refused): 1/2" in proc.stdout
    assert "refused: gpumon:" in proc.stdout
