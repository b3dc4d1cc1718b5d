"""Logs of behaviours people name at a glance get the verdict a person would give.

The logs are written by tests/data/judged/make_judged.py (seeded, nvidia-smi
``--query-gpu`` loops); tests/data/judged/verdicts.toml says, for each, the verdict and why.
They run through the real ``gpumon analyze`` command, reader and detector included.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "data" / "judged"
CASES = tomllib.loads((HERE / "verdicts.toml").read_text())


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = importlib.util.spec_from_file_location("make_judged", HERE / "make_judged.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path_factory.mktemp("judged")
    mod.main(out)
    return out


def test_every_log_written_has_a_verdict(logs: Path) -> None:
    assert {p.name for p in logs.iterdir()} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_analyze_gives_the_verdict_a_person_would(logs: Path, name: str) -> None:
    want = CASES[name]
    proc = subprocess.run(
        [sys.executable, "-m", "gpumon", "analyze", "--json", str(logs / name)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["verdict"] == want["verdict"], f"{name}: {want['why']} (notes: {got['notes']})"
    if "straggler" in want:
        assert got["straggler"] == want["straggler"]
    if "reason" in want:
        assert got["reason"] == want["reason"]


QUIRKS = Path(__file__).parent / "data" / "logs" / "quirks"
QUIRK_CASES = {
    name: entry
    for name, entry in tomllib.loads((QUIRKS / "manifest.toml").read_text())["files"].items()
    if "verdict" in entry
}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=entry["pending"]))
        if "pending" in entry
        else name
        for name, entry in sorted(QUIRK_CASES.items())
    ],
)
def test_real_shaped_logs_get_the_verdict_a_person_would(name: str) -> None:
    """The reader's real-shaped fixtures (quirks learned from public logs), judged end to
    end: the manifest says what each simulated run did and what a person would call it."""
    want = QUIRK_CASES[name]
    proc = subprocess.run(
        [sys.executable, "-m", "gpumon", "analyze", "--json", str(QUIRKS / name)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["verdict"] == want["verdict"], f"{name}: {want.get('behaviour')}"
