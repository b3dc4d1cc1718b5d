"""`gpumon record` end to end: the real CLI against the fake NVML, and the file it leaves.

A trace is often the only copy of a long run: an existing output is never overwritten
without --force, and a .gz name gets gzip that stays readable up to a crash.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from test_cli import ROOT, gpumon, one_sentence

pytestmark = pytest.mark.slow


def test_record_refuses_to_overwrite_an_existing_trace(fake_nvml, tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    out.write_text("an earlier recording\n")
    r = gpumon(fake_nvml.env, "record", "-o", str(out), "--duration", "0.3", "--interval", "0.1")
    assert r.returncode == 2
    assert "already exists" in one_sentence(r.stderr) and "--force" in r.stderr
    assert out.read_text() == "an earlier recording\n"  # nothing lost
    r = gpumon(
        fake_nvml.env, "record", "-o", str(out), "--duration", "0.3", "--interval", "0.1", "--force"
    )
    assert r.returncode == 0, r.stderr
    header = json.loads(out.read_text().splitlines()[0])
    assert header["format"] == "gpumon-trace"  # replaced by a trace, header first


def test_record_to_a_gz_name_writes_gzip_readable_as_it_goes(fake_nvml, tmp_path: Path) -> None:
    from gpumon.traces.jsonl import TraceReader

    out = tmp_path / "run.jsonl.gz"
    r = gpumon(fake_nvml.env, "record", "-o", str(out), "--duration", "0.6", "--interval", "0.1")
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:2] == b"\x1f\x8b"  # gzip, not plain text
    with TraceReader(out) as trace:
        ticks = list(trace)
    assert len(ticks) >= 3 and all(len(t.gpus) == 1 for t in ticks)

    # Killed mid-recording: every tick flushed before the kill is still readable.
    cut = tmp_path / "cut.jsonl.gz"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpumon", "record", "-o", str(cut), "--interval", "0.1"],
        env=fake_nvml.env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        lines = 0
        while time.monotonic() < deadline and lines < 4:
            time.sleep(0.2)
            lines = _readable_lines(cut)
    finally:
        proc.kill()
        proc.wait(5)
    assert _readable_lines(cut) >= 4  # header + ticks, with no gzip trailer written


def _readable_lines(path: Path) -> int:
    """Whole lines in a gzip file still being written (no trailer yet): what its sync
    points make readable."""
    if not path.exists():
        return 0
    return zlib.decompressobj(wbits=31).decompress(path.read_bytes()).count(b"\n")
