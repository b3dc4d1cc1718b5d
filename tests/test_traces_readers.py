"""The pieces of the log readers on data alone: cells, times, delimiters, column names,
GPU identity inference, and each new reader's variants."""

from __future__ import annotations

import json

import pytest

from gpumon.errors import TraceFormatError
from gpumon.traces import identity
from gpumon.traces._common import mem_mib, num
from gpumon.traces.columns import resolve
from gpumon.traces.sniff import read_lines
from gpumon.traces.table import WS, sniff_delimiter
from gpumon.traces.timefmt import date_time, pick

MIB = 1 << 20


def read(text: str, fmt: str = "auto") -> tuple[str, object, list, list[str]]:
    warnings: list[str] = []
    found, header, snaps = read_lines(text.splitlines(keepends=True), fmt, "log", warnings)
    return found, header, list(snaps), warnings


# --- cells ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cell", "value"),
    [
        ("92 %", 92.0),
        ("92", 92.0),
        ("45'C", 45.0),
        ("80°C", 80.0),
        ("12,5", 12.5),
        ('"26.11"', 26.11),
        ("150.20W", 150.2),
        ("1.5e2 W", 150.0),
    ],
)
def test_numbers(cell: str, value: float) -> None:
    assert num(cell) == value


@pytest.mark.parametrize("cell", ["[N/A]", "[Not Supported]", "N/A", "??", "-", "nan", "", "ERR!"])
def test_no_reading(cell: str) -> None:
    assert num(cell) is None


@pytest.mark.parametrize("cell", ["abc %", "%", "fast", "1.2.3x!", "12 (W)"])
def test_not_numbers_say_so(cell: str) -> None:
    with pytest.raises(ValueError, match="is not a number"):
        num(cell)


def test_memory_units() -> None:
    assert mem_mib("24 GiB") == 24 * 1024
    assert mem_mib(" 7982 MB") == 7982
    assert mem_mib("512") == 512
    assert mem_mib("2", default_scale=1024) == 2048  # a header that says GiB
    assert mem_mib(str(8 * MIB) + " B") == 8


# --- times -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cells", "kind", "first"),
    [
        (["2024/05/01 12:00:00.123"], "datetime", 1714564800.123),
        (["2024-05-01T12:00:00Z"], "datetime", 1714564800.0),
        (["2024-05-01T14:00:00+02:00"], "datetime", 1714564800.0),
        (["2024-05-01 12:00:00"], "datetime", 1714564800.0),
        (["1714564800", "1714564801"], "epoch", 1714564800.0),
        (["1714564800123"], "epoch", 1714564800.123),
        (["35s", "36s"], "elapsed", 35.0),
        (["0.25", "0.5"], "elapsed", 0.25),
        (["1:05"], "elapsed", 65.0),
        (["23:59:59"], "time-of-day", 86399.0),
    ],
)
def test_time_forms(cells: list[str], kind: str, first: float) -> None:
    parser = pick(cells)
    assert parser is not None and parser.kind == kind
    assert parser.parse(cells[0]) == pytest.approx(first)


def test_iso_comma_fraction_and_ms_column_names() -> None:
    assert date_time("2024-05-01T12:00:00,5+00:00") == pytest.approx(1714564800.5)
    parser = pick(["1000", "2000"], "elapsed_ms")
    assert parser is not None and parser.parse("1500") == 1.5


# --- delimiters and names --------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "delim"),
    [
        (["a,b,c\n", "1,2,3\n", "4,5,6\n"], ","),
        (["time;util\n", "12:00:00;45,5\n", "12:00:01;46,5\n"], ";"),
        (["Time(s)\tCPU  GPU\tLGPU\n", "1s\t50\t90\t88\n", "2s\t51\t91\t87\n"], WS),
        (["t\tutil\n", "1\t50\n", "2\t60\n"], "\t"),
    ],
)
def test_delimiter_sniffing(lines: list[str], delim: str) -> None:
    assert sniff_delimiter(lines) == delim


def test_column_vocabularies() -> None:
    lay = resolve(["gpu0_util", "gpu1_util", "GPU 0 Power (W)", "cuda:1 mem_used_gib", "CPU"])
    assert lay.wide[0] == {"util": 0, "power": 2}
    assert lay.wide[1]["util"] == 1 and lay.wide[1]["mem_used"] == 3
    assert lay.columns[3].scale == 1024.0
    assert lay.host_cpu == 4
    lay = resolve(["time", "gpu", "util"])  # a bare "gpu" beside a utilisation: the index
    assert lay.at["index"] == 1 and lay.at["util"] == 2
    lay = resolve(["system.gpu.process.0.gpu", "system.gpu.0.powerWatts"])
    assert lay.wide[0] == {"util": 0, "power": 1}


# --- GPU identity ----------------------------------------------------------------------


def test_cycle_from_memory_fingerprints() -> None:
    fps = [(None, None, None, 1000.0 + 100 * (i % 3), None, None) for i in range(30)]
    assert identity.cycle_period(fps) == (3, "mem_used")


def test_power_alone_never_makes_gpus() -> None:
    # One GPU with a periodic workload: its power cycles every 4 rows.
    fps = [(None, None, None, None, None, 100.0 + 200 * (i % 4 < 2)) for i in range(40)]
    assert identity.cycle_period(fps) == (None, "")
    cycle = identity.infer([float(i) for i in range(40)], fps)
    assert cycle.n == 1


def test_distinct_totals_become_keys() -> None:
    fps = [("A", 24576.0 if i % 2 else 12288.0, None, 5000.0 + i, None, None) for i in range(20)]
    times = [float(i // 2) for i in range(20)]
    cycle = identity.infer(times, fps)
    assert cycle.n == 2 and cycle.mode == "key" and cycle.key_fields[0] in ("name", "mem_total")


def test_time_mode_counts_broken_ticks() -> None:
    a = identity.Assigner(identity.Cycle(3, "time", "", split=0.5))
    got = [a.by_time(t, i) for i, t in enumerate([0, 0, 0, 1, 1, 2, 2, 2, 2])]
    assert got == [0, 1, 2, 0, 1, 0, 1, 2, 0]
    assert a.breaks == 2 and a.first_break == 5  # the short tick at t=1, the long one at t=2


def test_key_mode_survives_missing_rows() -> None:
    rows = [
        "timestamp, name, memory.total [MiB], utilization.gpu [%]\n",
        *(
            f"2024/05/01 12:00:{k:02d}.000, NVIDIA {'A' if g == 0 else 'B'}, "
            f"{24576 if g == 0 else 12288} MiB, {10 + 80 * g} %\n"
            for k in range(20)
            for g in range(2)
            if not (k == 10 and g == 0)  # GPU 0's row of tick 10 went missing
        ),
    ]
    _, header, snaps, _ = read("".join(rows))
    assert len(header.gpus) == 2
    assert all(g.util_pct == (10.0 if g.gpu == 0 else 90.0) for s in snaps for g in s.gpus)


# --- readers ----------------------------------------------------------------------------


def test_dcgmi_device_name_with_spaces() -> None:
    text = (
        "# Entity  NVIDX  DVNAM       POWER  PMLMT  TMPTR  GPUTL\n"
        "     GPU 0   0   Tesla V100 PCIE 32GB   45.7   250.0   52   78\n"
        "     GPU 0   0   Tesla V100 PCIE 32GB   46.7   250.0   53   88\n"
    )
    fmt, header, snaps, _ = read(text)
    assert fmt == "dcgmi"
    assert header.gpus[0].name == "Tesla V100 PCIE 32GB"
    assert [s.gpus[0].util_pct for s in snaps] == [78.0, 88.0]
    assert snaps[0].gpus[0].power_limit_watts == 250.0


def test_gpustat_json_single_compact_snapshot() -> None:
    doc = {
        "hostname": "h",
        "query_time": "2024-05-01T12:00:00.5",
        "gpus": [{"index": 0, "uuid": "GPU-x", "utilization.gpu": 55, "memory.used": 10}],
    }
    fmt, _header, snaps, _ = read(json.dumps(doc) + "\n" + json.dumps(doc).replace("00.5", "01.5"))
    assert fmt == "gpustat-json" and len(snaps) == 2
    assert snaps[1].t_s == 1.0 and snaps[0].gpus[0].mem_used_bytes == 10 * MIB


def test_gpustat_cut_short_json_is_a_warning() -> None:
    doc = json.dumps(
        {"query_time": "2024-05-01T12:00:00", "gpus": [{"index": 0, "utilization.gpu": 5}]},
        indent=4,
    )
    _, _, snaps, warnings = read(doc + "\n" + doc[: len(doc) // 2])
    assert len(snaps) == 1 and any("incomplete" in w for w in warnings)


def test_prometheus_array_of_responses_and_vector_refused() -> None:
    resp = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "1", "Hostname": "n"},
                    "values": [[100, "50"], [105, "60"]],
                },
                {
                    "metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", "Hostname": "n"},
                    "values": [[100, "10"], [105, "+Inf"]],
                },
            ],
        },
    }
    fmt, header, snaps, _ = read(json.dumps([resp]))
    assert fmt == "prometheus" and [g.index for g in header.gpus] == [0, 1]
    assert [[g.util_pct for g in s.gpus] for s in snaps] == [[10.0, 50.0], [60.0]]
    vector = {"status": "success", "data": {"resultType": "vector", "result": {"x": 1}}}
    with pytest.raises(TraceFormatError, match="query_range"):
        read(json.dumps(vector))


def test_dcgm_profiling_fields_are_the_gpm_ratios() -> None:
    """dcgm-exporter's SM activity, occupancy and tensor activity are what gpumon reads
    from GPM itself: the same 0-1 ratios, so busy-wait is told the same way."""

    def series(name: str, value: str) -> dict:
        return {"metric": {"__name__": name, "gpu": "0"}, "values": [[100, value]]}

    resp = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                series("DCGM_FI_DEV_GPU_UTIL", "100"),
                series("DCGM_FI_PROF_SM_ACTIVE", "0.17"),
                series("DCGM_FI_PROF_SM_OCCUPANCY", "0.05"),
                series("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0"),
            ],
        },
    }
    _, _, snaps, _ = read(json.dumps(resp))
    (g,) = snaps[0].gpus
    assert (g.util_pct, g.sm_active_ratio, g.sm_occupancy_ratio, g.tensor_active_ratio) == (
        100.0,
        0.17,
        0.05,
        0.0,
    )


def test_wandb_process_keys_stand_in_and_cpu_over_100_is_not_host_cpu() -> None:
    lines = [
        json.dumps({"system.gpu.process.0.gpu": 40.0 + k, "system.cpu": 250.0, "_runtime": k})
        for k in range(5)
    ]
    fmt, header, snaps, _ = read("\n".join(lines) + "\n")
    assert fmt == "wandb" and header.started_wall_s is None
    assert [s.gpus[0].util_pct for s in snaps] == [40.0, 41.0, 42.0, 43.0, 44.0]
    assert all(s.host is None for s in snaps)


def test_gpustat_no_header_with_watch_title() -> None:
    text = "".join(
        f"Every 2.0s: gpustat\n\n[0] Tesla T4 | 40'C, {k * 10:3d} % | 100 / 15109 MB |\n"
        for k in range(5)
    )
    _, header, snaps, _ = read(text)
    assert header.interval_s == 2.0 and snaps[1].t_s == 2.0


def test_a_broken_gpu_cycle_is_re_synced_and_warned_about() -> None:
    """Two GPUs without an index, one row lost at tick 30: the next tick starts at GPU 0
    again (nothing lands on the wrong GPU) and a warning names where the cycle broke."""
    rows = ["timestamp, utilization.gpu [%], memory.used [MiB]\n"]
    for k in range(60):
        for g in range(2):
            if (k, g) == (30, 1):
                continue
            rows.append(
                f"2024/05/01 12:00:{k:02d}.{100 + g:03d}, {10 + 70 * g} %, {1000 + g} MiB\n"
            )
    _, header, snaps, warnings = read("".join(rows))
    assert len(header.gpus) == 2
    assert all(g.util_pct == (10.0 if g.gpu == 0 else 80.0) for s in snaps for g in s.gpus)
    assert any("cycle of GPUs broke 1 time" in w and "log:" in w for w in warnings)


def test_json_lines_are_never_taken_for_a_table() -> None:
    with pytest.raises(TraceFormatError, match="not a format gpumon reads"):
        read('{"gpus": [{"gpu": 0}], "t": 1}\n{"gpus": [{"gpu": 0}], "t": 2}\n')


def test_one_column_with_its_header_before_every_value() -> None:
    """``nvidia-smi --query-gpu=utilization.gpu --format=csv`` appended in a loop: a single
    column, its header repeated, no times (a value with its unit is not two cells)."""
    text = "".join(f"utilization.gpu [%]\n{u} %\n" for u in (85, 100, 94, 91))
    fmt, header, snaps, _ = read(text)
    assert fmt == "nvidia-smi-csv" and len(header.gpus) == 1
    assert [s.gpus[0].util_pct for s in snaps] == [85.0, 100.0, 94.0, 91.0]
    assert "interval_assumed" in header.extra
