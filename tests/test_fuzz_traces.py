"""Property-based fuzzing of every log reader and the format sniffer (issue 13).

Arbitrary bytes, and real-shaped logs mutated (characters dropped, inserted, repeated into
long runs; lines cut, doubled, swapped), raise nothing but gpumon's own errors, and take
time in proportion to their size (a generous bound per character: what this catches is
the quadratic or exponential blow-up of a backtracking parser, seconds where it should be
milliseconds).  The budget is about a minute on CI.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumon.errors import GpumonError
from gpumon.traces.sniff import FORMATS, open_trace, read_lines

LOGS = Path(__file__).parent / "data" / "logs"
QUIRKS = LOGS / "quirks"

# A real-shaped sample of each format, its first lines (the mutations need them short).
SAMPLES = {
    "nvidia-smi-csv": LOGS / "nvsmi_units_index.csv",
    "csv": QUIRKS / "home_quoted_newline.csv",
    "wandb-csv": QUIRKS / "wandb_export.csv",
    "dmon": QUIRKS / "dmon_all_columns.txt",
    "dcgmi": QUIRKS / "dcgmi_dmon.txt",
    "gpustat": QUIRKS / "gpustat_full_color.txt",
    "gpustat-json": QUIRKS / "gpustat_json_loop.json",
    "wandb": QUIRKS / "wandb-events.jsonl",
    "prometheus": QUIRKS / "prom_gpumon.json",
    "nvidia-smi-table": LOGS / "table_535.txt",
    "key-value": QUIRKS / "keyvalue_blocks.log",
    "json-lines": QUIRKS / "json_per_gpu_events.jsonl",
    "nvidia-smi-q": QUIRKS / "nvsmi_q_loop_535.txt",
    "long-table": QUIRKS / "dcgm_api_power_only.csv",
    "one-line": QUIRKS / "oneline_bracket_alerts.log",
}
HEADS = {
    fmt: "".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:40])
    for fmt, path in SAMPLES.items()
}
HEADS["prometheus"] = SAMPLES["prometheus"].read_text(encoding="utf-8")[:6000]
# Two reports of two GPUs each: the sections, the second report's banner and time.
HEADS["nvidia-smi-q"] = "".join(
    SAMPLES["nvidia-smi-q"].read_text(encoding="utf-8").splitlines(keepends=True)[:200]
)
HEADS["gpumon"] = (
    '{"format":"gpumon-trace","version":1,"header":{"source":"gpumon","interval_s":1.0,'
    '"gpus":[{"index":0,"uuid":"GPU-a"}]}}\n'
    + "".join(
        f'{{"t":{k}.0,"gpus":[{{"gpu":0,"uuid":"GPU-a","util_samples":[[{k}.5,{k % 100}]],'
        f'"util_pct":{k % 100},"power_watts":{100 + k}.5}}],"host":{{"cpu_pct":50.0}}}}\n'
        for k in range(30)
    )
)
assert set(HEADS) == set(FORMATS) - {"dmon", "dcgmi"} | {"dmon", "dcgmi"}

FUZZ = settings(
    max_examples=int(os.environ.get("GPUMON_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("GPUMON_FUZZ_RANDOM") is None,
)
SECONDS_PER_CHAR = 5e-5  # generous: real parsing is ~1 µs a character
SLACK_S = 1.0


def consume(lines: list[str], fmt: str) -> None:
    """Read everything, as analyze would; only gpumon's own errors may come out."""
    warnings: list[str] = []
    try:
        _found, _header, snaps = read_lines(lines, fmt, "fuzz", warnings)
        for _ in snaps:
            pass
    except GpumonError:
        pass


def bounded(text_len: int, fn) -> None:  # type: ignore[no-untyped-def]
    t0 = time.process_time()
    fn()
    took = time.process_time() - t0
    assert took < SLACK_S + SECONDS_PER_CHAR * text_len, f"{took:.2f} s for {text_len} chars"


@st.composite
def mutated(draw: st.DrawFn, text: str) -> str:
    """``text`` with a few edits of the kinds real breakage makes, or hostile input does."""
    lines = text.splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 6))):
        if not lines:
            break
        kind = draw(st.sampled_from(["drop", "insert", "run", "cut", "double", "swap", "glue"]))
        i = draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        j = draw(st.integers(0, len(line)))
        if kind == "drop":
            lines[i] = line[:j] + line[j + draw(st.integers(1, 12)) :]
        elif kind == "insert":
            lines[i] = line[:j] + draw(st.text(max_size=12)) + line[j:]
        elif kind == "run":  # a long run of one character: where backtracking hides
            c = draw(st.sampled_from([" ", "_", "0", "9", "%", ",", "|", "[", "{", '"', "\t", "."]))
            lines[i] = line[:j] + c * draw(st.integers(100, 20_000)) + line[j:]
        elif kind == "cut":
            lines = lines[: i + 1]
            lines[i] = line[:j]
        elif kind == "double":
            lines.insert(i, line)
        elif kind == "swap" and len(lines) > 1:
            k = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[k] = lines[k], lines[i]
        elif kind == "glue" and i + 1 < len(lines):
            lines[i : i + 2] = [line[:j] + lines[i + 1]]
    return "".join(lines)


@pytest.mark.parametrize("fmt", sorted(HEADS))
@FUZZ
@given(data=st.data())
def test_mutated_logs_raise_only_our_errors_in_linear_time(fmt: str, data: st.DataObject) -> None:
    text = data.draw(mutated(HEADS[fmt]))
    lines = text.splitlines(keepends=True)
    bounded(len(text), lambda: consume(lines, "auto"))
    if fmt != "gpumon":
        bounded(len(text), lambda: consume(lines, fmt))


@pytest.mark.parametrize("fmt", sorted(set(FORMATS) - {"gpumon"}))
@FUZZ
@given(text=st.text(max_size=3000))
def test_arbitrary_text_forced_into_each_reader(fmt: str, text: str) -> None:
    lines = text.splitlines(keepends=True)
    bounded(len(text), lambda: consume(lines, fmt))


def _read_bytes_in_bounded_time(blob: bytes) -> None:
    """Write ``blob`` to a file and read it through ``open_trace`` to the end: a
    GpumonError is the only failure allowed, and the time taken stays bounded."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x"
        path.write_bytes(blob)

        def run() -> None:
            try:
                with open_trace(path) as trace:
                    for _ in trace:
                        pass
            except GpumonError:
                pass

        bounded(len(blob), run)


@FUZZ
@given(blob=st.binary(max_size=4000), gz=st.booleans())
def test_arbitrary_bytes_through_open_trace(blob: bytes, gz: bool) -> None:
    """The whole stack from bytes: encodings, gzip, sniffing, every reader."""
    if gz:
        blob = b"\x1f\x8b" + blob
    _read_bytes_in_bounded_time(blob)


@FUZZ
@given(
    head=st.sampled_from(sorted(HEADS)),
    cut=st.integers(0, 4000),
    junk=st.binary(max_size=200),
)
def test_real_logs_cut_and_spliced_with_bytes_through_open_trace(
    head: str, cut: int, junk: bytes
) -> None:
    raw = HEADS[head].encode("utf-8")
    blob = raw[:cut] + junk + raw[cut:]
    _read_bytes_in_bounded_time(blob)
