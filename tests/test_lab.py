"""The starvation lab: --help and the no-GPU exit anywhere; the plumbing where torch exists."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpumon.model import GpuSample, Snapshot, TraceHeader
from gpumon.traces.jsonl import FORMAT_VERSION, TraceReader, TraceWriter

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "examples" / "starvation_lab.py"
LABEL = ROOT / "examples" / "label_trace.py"

# Runs the lab with `import torch` failing, as on a machine without PyTorch.
_LAB = str(LAB)
NO_TORCH = (
    f"import runpy, sys; sys.modules['torch'] = None; sys.argv = [{_LAB!r}, *sys.argv[1:]]; "
    f"runpy.run_path({_LAB!r}, run_name='__main__')"
)


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Decided without importing torch here (seconds per import): the lab's children do that.
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_CUDA = Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()


def test_help_works_without_torch() -> None:
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH, "--help"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    for phase in ("healthy", "starved-cpu", "starved-gil", "starved-io", "busy-wait"):
        assert phase in out.stdout
    assert "--phase-seconds" in out.stdout and "--phases" in out.stdout


def test_without_torch_it_says_so_in_one_sentence_and_exits_non_zero() -> None:
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH, "--phase-seconds", "1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "PyTorch is not installed" in lines[0], out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.skipif(HAVE_CUDA, reason="a CUDA GPU is present: the lab would run")
def test_without_cuda_it_says_so_and_exits_non_zero() -> None:
    out = subprocess.run(
        [sys.executable, str(LAB), "--phase-seconds", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stdout == ""  # no phase was started
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert ("no CUDA GPU" in lines[0]) if HAVE_TORCH else ("PyTorch is not installed" in lines[0])


def test_bad_phase_names_are_refused() -> None:
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH, "--phases", "healthy,starved-xyz"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "starved-xyz" in out.stderr


def test_file_reads_go_past_the_page_cache_or_say_they_cannot(tmp_path: Path) -> None:
    lab = _load(LAB)
    paths = lab.write_sample_files(str(tmp_path), 2, 3 * 8192 + 100)
    mode, per_read = lab.choose_io_mode(str(tmp_path), 4096)
    assert mode in ("direct", "dontneed", "throttled")
    assert (per_read > 0) == (mode != "throttled")
    expected = Path(paths[0]).read_bytes()
    for m in ("dontneed", "throttled", mode):
        assert lab.read_file(paths[0], 4096, m) == expected


@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed (optional)")
def test_the_phases_run_in_order_and_print_parseable_times(tmp_path: Path) -> None:
    log = tmp_path / "phases.jsonl"
    argv = [
        sys.executable,
        str(LAB),
        "--device",
        "cpu",
        "--phases",
        "healthy,starved-gil,starved-cpu",
        "--phase-seconds",
        "0.7",
        "--width",
        "4",
        "--image-size",
        "16",
        "--batch-size",
        "4",
        "--burst-ms",
        "20",
        "--cpu-workers",
        "1",
        "--phase-log",
        str(log),
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    assert [json.loads(line) for line in log.read_text().splitlines()] == events
    kinds = [(e["event"], e.get("phase")) for e in events]
    assert kinds == [
        ("lab_start", None),
        ("calibration", None),
        ("phase_start", "healthy"),
        ("phase_end", "healthy"),
        ("phase_start", "starved-gil"),
        ("phase_end", "starved-gil"),
        ("phase_start", "starved-cpu"),
        ("phase_end", "starved-cpu"),
        ("lab_end", None),
    ]
    monos = [e["mono_s"] for e in events]
    assert monos == sorted(monos)
    for start, end in zip(events[2:8:2], events[3:8:2], strict=True):
        assert end["mono_s"] - start["mono_s"] >= 0.7
        assert end["wall_s"] - start["wall_s"] == pytest.approx(
            end["mono_s"] - start["mono_s"], abs=0.05
        )
        assert end["batches"] >= 1
    assert events[0]["pid"] > 0
    assert events[1]["gil_passes"] >= 1 and events[1]["cpu_passes"] >= 1


def test_a_recording_is_labelled_with_the_phases(tmp_path: Path) -> None:
    header = TraceHeader(version=FORMAT_VERSION, source="gpumon")
    raw = tmp_path / "raw.jsonl"
    with TraceWriter.open(raw, header) as w:
        for i in range(10):
            w.write(Snapshot(t_s=100.0 + i, gpus=(GpuSample(t_s=100.0 + i, gpu=0, uuid="G"),)))
    phases = tmp_path / "phases.jsonl"
    phases.write_text(
        "\n".join(
            json.dumps(e)
            for e in [
                {"event": "lab_start", "mono_s": 101.2},
                {"event": "phase_start", "phase": "healthy", "mono_s": 102.5},
                {"event": "phase_end", "phase": "healthy", "mono_s": 105.5},
                {"event": "phase_start", "phase": "starved-gil", "mono_s": 105.5},
                {"event": "phase_end", "phase": "starved-gil", "mono_s": 108.5},
            ]
        )
        + "\nsome warning that is not JSON\n"
    )
    out = tmp_path / "lab.jsonl"
    done = subprocess.run(
        [sys.executable, str(LABEL), str(raw), str(phases), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    reader = TraceReader(out)
    snaps = list(reader)
    assert len(snaps) == 10
    assert reader.events == [
        {"t": 102.5, "event": "phase", "phase": "healthy", "end": 105.5},
        {"t": 105.5, "event": "phase", "phase": "starved-gil", "end": 108.5},
    ]
    lines = out.read_text().splitlines()
    # Each label sits just before the first tick at or after its start.
    assert (
        json.loads(lines[lines.index(next(x for x in lines if '"healthy"' in x)) + 1])["t"] == 103.0
    )
