"""Real-shaped logs (tests/data/logs/quirks, see its manifest.toml) are read right: the
format, the GPU count and identity, the interval, the values; and what had to be assumed
is said in the header's notes."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gpumon.model import Snapshot, TraceHeader
from gpumon.traces.sniff import open_trace

QUIRKS = Path(__file__).parent / "data" / "logs" / "quirks"
MANIFEST = tomllib.loads((QUIRKS / "manifest.toml").read_text(encoding="utf-8"))["files"]
MIB = 1 << 20


def load(name: str) -> tuple[str, TraceHeader, list[Snapshot], list[str]]:
    with open_trace(QUIRKS / name) as trace:
        snaps = list(trace)
        return trace.format, trace.header, snaps, trace.warnings


def notes(header: TraceHeader) -> str:
    extra = header.extra
    return " | ".join(str(v) for k, v in extra.items() if k != "ignored_columns")


def test_every_fixture_is_in_the_manifest_and_back() -> None:
    files = {p.name for p in QUIRKS.iterdir() if p.name != "manifest.toml"}
    assert files == set(MANIFEST)
    for name, entry in MANIFEST.items():
        assert {"kind", "quirks", "format", "gpus", "interval", "verdict"} <= set(entry), name
        # unknown: a log without utilisation, where a person cannot tell either
        assert entry["verdict"] in ("healthy", "starved", "sync_stall", "idle", "unknown"), name


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_format_gpus_and_interval(name: str) -> None:
    entry = MANIFEST[name]
    fmt, header, snaps, warnings = load(name)
    assert fmt == entry["format"]
    assert header.source == entry["format"]
    assert len(header.gpus) == entry["gpus"], notes(header)
    assert {g.gpu for s in snaps for g in s.gpus} == set(entry.get("indices", range(entry["gpus"])))
    assert header.interval_s == pytest.approx(entry["interval"], rel=0.05)
    assert len(snaps) >= entry.get("samples", 10)
    times = [s.t_s for s in snaps]
    assert times == sorted(times) or name == "concat_runs_cut_start.csv"
    assert not any("Traceback" in w for w in warnings)


def test_8gpu_same_timestamp_keeps_each_gpu_apart() -> None:
    _, header, snaps, _ = load("nvsmi_8gpu_same_stamp.csv")
    assert "share one timestamp" in header.extra["gpus_inferred"]
    assert len(snaps) == 180 and all(len(s.gpus) == 8 for s in snaps)
    # Each GPU keeps its own memory: no row landed on another GPU.
    mem = {
        g: {x.mem_used_bytes // MIB for s in snaps for x in s.gpus if x.gpu == g} for g in range(8)
    }
    spans = [max(v) - min(v) for v in mem.values()]
    assert max(spans) <= 8
    # The stalled rank reads 0 % while the others read 100 % at low power.
    stall = snaps[15]  # 15 s into a 20 s period: the stall window
    rank3 = next(g for g in stall.gpus if g.gpu == 3)
    others = [g for g in stall.gpus if g.gpu != 3]
    assert rank3.util_pct == 0.0
    assert all(g.util_pct == 100.0 and g.power_watts < 200 for g in others)


def test_2gpu_ms_apart_sub_second_rows_become_util_samples() -> None:
    _, header, snaps, _ = load("nvsmi_2gpu_ms_apart.csv")
    assert "a few ms apart" in header.extra["gpus_inferred"]
    points = [(g.gpu, p) for s in snaps for g in s.gpus for p in g.util_samples]
    assert len(points) == 1800  # 900 ticks x 2 GPUs, one point per row
    assert all(8 <= len(g.util_samples) <= 12 for s in snaps[1:-1] for g in s.gpus)


def test_crlf_bom_straggler_by_bus_id() -> None:
    _, header, _snaps, _ = load("nvsmi_4gpu_straggler_crlf.csv")
    assert [g.pci_bus_id for g in header.gpus] == [
        "00000000:1A:00.0",
        "00000000:3A:00.0",
        "00000000:5A:00.0",
        "00000000:7A:00.0",
    ]
    assert header.gpus[0].power_limit_watts == 350.0
    assert "gpus_inferred" not in header.extra


def test_header_before_every_row() -> None:
    _, _header, snaps, warnings = load("nvsmi_header_every_row.csv")
    assert len(snaps) == 120 and warnings == []
    g = snaps[5].gpus[0]
    assert g.util_pct == 0.0 and g.mem_used_bytes >= 9812 * MIB
    assert g.mem_total_bytes == 11264 * MIB


def test_epoch_seconds_with_spaces() -> None:
    """``1764189075,1, 24576, 0`` once failed with "month must be in 1..12"."""
    _, header, snaps, _ = load("home_epoch_spaces.csv")
    assert header.started_wall_s == pytest.approx(1764189075, abs=2)
    assert "epoch seconds" in header.extra["timestamps"]
    g = snaps[10].gpus[0]
    assert g.mem_total_bytes == 24576 * MIB and 90 <= g.util_pct <= 100


def test_quoted_cell_spanning_two_lines() -> None:
    _, header, snaps, warnings = load("home_quoted_newline.csv")
    assert any("span lines" in w and "power_w" in w for w in warnings)
    powers = [g.power_watts for s in snaps for g in s.gpus]
    assert all(p is not None and 50 < p < 320 for p in powers)
    assert header.started_wall_s is None  # elapsed seconds


def test_tab_separated_seconds_suffix_and_aggregates() -> None:
    _, header, snaps, _ = load("tsv_time_s_aggregates.tsv")
    assert header.gpus[0].uuid == "aggregate" and "aggregate" in (header.gpus[0].name or "")
    assert header.gpus[1].uuid == "series:LGPU"
    assert snaps[1].t_s == 1.0  # "1s"
    # The CPU column is the host's, never a GPU.
    assert all(s.host is not None and s.host.cpu_pct is not None for s in snaps)
    assert "host CPU" in notes(header)


def test_gpustat_text_with_headers() -> None:
    _, header, snaps, _ = load("gpustat_loop.txt")
    assert header.hostname == "compute3" and header.driver_version == "465.19.01"
    assert header.gpus[0].name == "NVIDIA GeForce RTX 2070 SUPER"
    g = snaps[3].gpus[1]
    assert g.mem_total_bytes == 7982 * MIB and g.temperature_c is not None
    assert snaps[1].t_s == 1.0


def test_gpustat_colour_fan_codec_and_unknown_power() -> None:
    _, header, snaps, _ = load("gpustat_full_color.txt")
    assert "interval_assumed" in header.extra
    utils = [s.gpus[0].util_pct for s in snaps]
    assert min(utils) < 5 and max(utils) > 90  # the utilisation, not the fan's 40 %
    assert snaps[5].gpus[0].power_watts is None  # "?? / 250 W"
    assert snaps[6].gpus[0].power_limit_watts == 250.0
    assert header.gpus[0].name == "GeForce GTX TITAN X"


def test_gpustat_json_pretty_printed_objects() -> None:
    _, header, snaps, _ = load("gpustat_json_loop.json")
    assert header.hostname == "ws-lab-2" and header.driver_version == "535.129.03"
    assert len(snaps) == 100
    g = snaps[0].gpus[1]
    assert g.uuid.startswith("GPU-") and g.mem_used_bytes == 18024 * MIB
    assert g.util_pct == 0.0 and g.power_limit_watts == 230.0


def test_wandb_events() -> None:
    _, header, snaps, _ = load("wandb-events.jsonl")
    assert "averages" in notes(header)
    g = snaps[0].gpus[0]
    assert g.util_pct is not None and g.power_watts is not None
    assert g.power_limit_watts == pytest.approx(300.0, rel=0.01)  # from powerPercent
    assert g.mem_used_bytes is None  # memoryAllocated is a percent of an unknown total
    assert snaps[0].host is not None and snaps[0].host.cpu_pct is not None


def test_wandb_csv_export_sparse_cells() -> None:
    _, header, snaps, _ = load("wandb_export.csv")
    utils = [s.gpus[0].util_pct for s in snaps]
    assert all(30 < u < 65 for u in utils)
    sparse = snaps[4]  # GPU 1 not logged in that row
    assert next(g for g in sparse.gpus if g.gpu == 1).util_pct is None
    assert header.started_wall_s is None


def test_dmon_every_column_set() -> None:
    _, _header, snaps, _ = load("dmon_all_columns.txt")
    assert len(snaps) == 200 and all(len(s.gpus) == 4 for s in snaps)
    g = snaps[0].gpus[2]
    assert g.mem_used_bytes is not None and g.sm_clock_mhz in (1410, 210)
    assert g.pcie_rx_bytes_per_s is not None and g.temperature_c is not None


def test_dmon_time_only_over_midnight() -> None:
    _, _, snaps, _ = load("dmon_time_only_midnight.txt")
    assert [s.t_s for s in snaps[88:93]] == [88.0, 89.0, 90.0, 91.0, 92.0]


def test_dcgmi_reverse_order_and_na() -> None:
    _, header, snaps, _ = load("dcgmi_dmon.txt")
    assert len(snaps) == 160 and [g.gpu for g in snaps[0].gpus] == [0, 1, 2, 3]
    g = snaps[10].gpus[0]
    assert g.power_watts is not None and g.mem_used_bytes is not None and g.util_pct is not None
    assert "no time" in header.extra["interval_assumed"]


def test_prometheus_dcgm() -> None:
    _, header, snaps, _ = load("prom_dcgm.json")
    assert [g.uuid[:8] for g in header.gpus] == ["GPU-3f2a", "GPU-3f2a"]
    assert header.gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert header.started_wall_s == pytest.approx(1764189000)
    assert snaps[37].gpus[0].power_watts is None  # NaN: no reading
    assert snaps[1].t_s == 5.0


def test_prometheus_nvidia_gpu_exporter_ratios_and_bytes() -> None:
    _, header, snaps, _ = load("prom_nvidia_gpu_exporter.json")
    g = snaps[0].gpus[0]
    assert g.util_pct == 0.0 and g.mem_total_bytes == 16384 * MIB
    assert header.gpus[0].uuid == "72f02a28-5140-325e-ba49-1ae77c6b4e30"


def test_prometheus_gpumon_series_with_host() -> None:
    _, _, snaps, _ = load("prom_gpumon.json")
    assert all(s.host is not None and 30 <= s.host.cpu_pct <= 40 for s in snaps)
    assert all(90 <= g.util_pct <= 100 for s in snaps for g in s.gpus)


def test_wide_file_one_series_per_gpu() -> None:
    _, header, snaps, _ = load("wide_per_gpu.csv")
    assert len(header.gpus) == 2 and all(len(s.gpus) == 2 for s in snaps)
    assert snaps[0].host is not None and 40 <= snaps[0].host.cpu_pct <= 60
    assert snaps[0].gpus[1].temperature_c is not None


def test_semicolons_decimal_commas_and_midnight() -> None:
    _, _, snaps, _ = load("semicolon_decimal_comma.csv")
    assert len(snaps) == 300
    assert [s.t_s for s in snaps[178:183]] == [178.0, 179.0, 180.0, 181.0, 182.0]  # 00:00
    assert any(g.util_pct % 1 for s in snaps for g in s.gpus)  # "45,5" read as 45.5


def test_concatenated_runs_and_a_cut_start() -> None:
    _, _, snaps, warnings = load("concat_runs_cut_start.csv")
    assert any(":2: first row is malformed" in w for w in warnings)
    assert len(snaps) == 199
    assert snaps[-1].t_s - snaps[0].t_s > 7000  # the second run, two hours later
    assert snaps[-1].gpus[0].temperature_c is not None  # the second header's column


def test_gnu_iso_comma_fraction_split_in_two_cells() -> None:
    _, header, snaps, _ = load("gnu_iso_ns.csv")
    assert header.started_wall_s == pytest.approx(1764189000.0131, abs=0.001)
    points = [p for s in snaps for g in s.gpus for p in g.util_samples]
    assert len(points) == 600


def test_whole_second_stamps_spread_within_the_second() -> None:
    _, header, snaps, _ = load("whole_second_fast.csv")
    assert "whole-second" in notes(header)
    points = [p for s in snaps for g in s.gpus for p in g.util_samples]
    assert len(points) == 800
    ts = [t for t, _ in points]
    assert ts == sorted(ts) and len(set(ts)) == 800


def test_three_gpus_told_apart_by_temperature() -> None:
    _, header, snaps, _ = load("three_gpu_date_time.csv")
    assert "temperature" in header.extra["gpus_inferred"]
    temps = {g: {x.temperature_c for s in snaps for x in s.gpus if x.gpu == g} for g in range(3)}
    assert max(temps[0]) < min(temps[1])  # GPU 1 runs hot: never mixed with GPU 0
    assert "DD-MM-YYYY" in notes(header)


def test_short_log_is_read_whole() -> None:
    _, _, snaps, _ = load("short_v100.csv")
    assert [s.gpus[0].util_pct for s in snaps] == [0, 31, 0, 95, 0, 24, 0, 94, 0, 0]


def test_one_table_before_a_csv_log_is_a_preamble() -> None:
    fmt, header, snaps, warnings = load("table_then_csv.csv")
    assert fmt == "nvidia-smi-csv"
    assert [w for w in warnings if "one nvidia-smi table printed before the log" in w]
    assert len(snaps) == 180 and header.gpus[0].name == "NVIDIA A100-SXM4-40GB"


def _table_then_csv(tables: int, bad_row: bool = False) -> list[str]:
    text = (QUIRKS / "table_then_csv.csv").read_text().splitlines(keepends=True)
    at = next(i for i, ln in enumerate(text) if ln.startswith("timestamp,"))
    table, log = text[:at], text[at:]
    if bad_row:
        log[5] = "this is not a row\n"
    return table * tables + log


def test_a_malformed_row_after_the_preamble_keeps_its_line_number() -> None:
    from gpumon.errors import TraceFormatError
    from gpumon.traces.sniff import read_lines

    lines = _table_then_csv(1, bad_row=True)
    _fmt, _header, snaps = read_lines(lines)
    with pytest.raises(TraceFormatError) as err:
        list(snaps)
    bad = lines.index("this is not a row\n") + 1
    assert err.value.line == bad, str(err.value)


def test_several_tables_are_a_table_log_not_a_preamble() -> None:
    from gpumon.traces.sniff import read_lines

    warnings: list[str] = []
    fmt, _header, _snaps = read_lines(_table_then_csv(2), warnings=warnings)
    assert fmt == "nvidia-smi-table"
    assert not [w for w in warnings if "preamble" in w or "before the log" in w]


def test_dcgmi_smact_is_sm_activity() -> None:
    """SMACT (field 1002) is read as GPM's SM activity: few SMs while the peers spin at
    100 %, none on the rank that writes its checkpoint, most while all compute."""
    _, _, snaps, _ = load("dcgmi_dmon.txt")
    by_gpu: dict[int, list[tuple[float, float]]] = {}
    for s in snaps:
        for g in s.gpus:
            if g.sm_active_ratio is not None and g.util_pct is not None:
                by_gpu.setdefault(g.gpu, []).append((g.util_pct, g.sm_active_ratio))
    assert set(by_gpu) == {0, 1, 2, 3}
    assert all(0.0 <= sm <= 1.0 for pts in by_gpu.values() for _, sm in pts)
    spinning = [sm for g in (0, 2, 3) for u, sm in by_gpu[g] if u >= 99 and sm < 0.3]
    computing = [sm for g in (0, 2, 3) for u, sm in by_gpu[g] if u >= 99 and sm >= 0.3]
    assert spinning and computing and max(spinning) < 0.5 * min(computing)


# --- the long tail (issue "Real logs, the long tail") -----------------------------------


def test_two_gpus_at_lms100_with_late_rows_stay_two_gpus() -> None:
    """Rows of a tick 1-4 ms apart but now and then one 8-93 ms late, memory the same on
    both GPUs: read as one GPU with 2 ms bursts every ~102 ms.  The late rows no longer
    hide the ticks, and each idle GPU's own power (17.55 W, 16.19 W) tells them apart."""
    _, header, snaps, _ = load("nvsmi_2gpu_lms100_late_rows.csv")
    assert len(header.gpus) == 2 and "a few ms apart" in header.extra["gpus_inferred"]
    gpu1 = [g for s in snaps for g in s.gpus if g.gpu == 1]
    assert all(g.util_pct == 0.0 for g in gpu1)
    assert sum(g.power_watts == 16.19 for g in gpu1) >= 0.99 * len(gpu1)
    busy = [g.util_pct for s in snaps if s.t_s > 45 for g in s.gpus if g.gpu == 0]
    assert busy and min(busy) >= 95  # no idle GPU 1 rows mixed into GPU 0


def test_one_v100_whose_load_alternates_stays_one_gpu() -> None:
    """``nvidia-smi -l 1 | grep MiB`` of one V100 at 0 % every other second: its
    temperature and power follow the bursts, which made it two GPUs."""
    _, header, snaps, _ = load("grep_mib_v100_starved.txt")
    assert len(header.gpus) == 1, header.extra["gpus_inferred"]
    assert len(snaps) == 120
    utils = [s.gpus[0].util_pct for s in snaps[:6]]
    assert utils == [0.0, 31.0, 0.0, 95.0, 0.0, 24.0]


def test_eight_dmon_samples_are_read_whole() -> None:
    _, _header, snaps, _ = load("dmon_8_samples_one_dip.txt")
    assert [s.gpus[0].util_pct for s in snaps] == [62, 70, 95, 30, 75, 68, 60, 60]


def test_key_value_blocks_are_read_by_their_keys() -> None:
    """``=== date ===`` then ``GPU Load: 0.0%``, ``GPU Memory: 0.0MB / 6144.0MB (0.0%)``,
    ``GPU Temperature: 48.0°C``, ``CPU Usage``, ``RAM Usage``: was "malformed value"."""
    fmt, header, snaps, _ = load("keyvalue_blocks.log")
    assert fmt == "key-value" and header.started_wall_s == 1764189000
    assert [s.t_s for s in snaps[:3]] == [0.0, 5.0, 10.0]
    g = snaps[0].gpus[0]
    assert g.util_pct is not None and g.util_pct > 80
    assert g.mem_total_bytes == 6144 * MIB and g.mem_used_bytes is not None
    assert g.temperature_c == 67.0
    assert snaps[1].host is not None and snaps[1].host.cpu_pct > 90
    assert header.extra["ignored_columns"] == ["RAM Usage"]


def test_date_lines_between_rows_give_them_their_time() -> None:
    """``date``, one header-less ``--query-gpu`` row per GPU, ``----``, in a loop: was "not
    a format gpumon reads".  The date lines stamp the rows after them; they and the
    separators are skipped and counted."""
    fmt, header, snaps, warnings = load("date_rows_separator.log")
    assert fmt == "nvidia-smi-csv" and len(header.gpus) == 2
    assert [s.t_s for s in snaps[:3]] == [0.0, 2.0, 4.0]
    assert all(len(s.gpus) == 2 for s in snaps)
    assert any("180 line(s) between rows that are no rows" in w for w in warnings)
    assert "date line printed above them" in notes(header)


def test_a_trainers_own_columns_do_not_hide_ours() -> None:
    fmt, header, snaps, _ = load("trainer_13_columns.csv")
    assert fmt == "csv" and len(snaps) == 240
    assert "loss" in header.extra["ignored_columns"]
    assert [s.gpus[0].util_pct is not None for s in snaps] == [True] * 240


def test_a_sample_on_one_line_of_key_value_pairs() -> None:
    """``[04-03-2021 @ 13:32:39] >  Temp: 58C  Power: 1/250 W  Fan: 0%  Utilization: 0%
    Memory: 0/11019 MiB``: was "not a format gpumon reads"."""
    fmt, header, snaps, _ = load("keyvalue_inline.log")
    assert fmt == "key-value" and len(snaps) == 90
    g = snaps[0].gpus[0]
    assert g.util_pct == 92.0 and g.power_watts == 214.0 and g.power_limit_watts == 250.0
    assert g.mem_used_bytes == 9012 * MIB and g.mem_total_bytes == 11019 * MIB
    assert g.temperature_c == 71.0
    assert "blocks assumed 1 s apart" in notes(header)
    assert header.extra["ignored_columns"] == ["Fan"]
