"""The live lab with ``--stacks``: watch names what the job's processes did while its GPU waited.

One run (tests/livelab): the ``starved`` scenario's two phases (workers saturated decoding,
then num_workers=0, batches decoded in the main process), then lifecycle's evaluation and
periodic's checkpoints, each a real process on the emulated GPU, watched by ``gpumon watch
--stacks`` (the real py-spy).  The lab's code is named as real training code is
(``CpuDataset.decode``, ``RankJob.evaluate``, ``write_checkpoint``); the judgments are
gpumon's, read from its public output: the summary, and the recording phase by phase.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from livelab import runner, workloads
from livelab.truth import read_truth, too_busy_for_a_run

from gpumon.detect.activities import Activity, decide
from gpumon.model import ProcessRole
from gpumon.sample.stacks import find_py_spy
from gpumon.traces.jsonl import decode_stacks

pytestmark = [
    pytest.mark.slow,
    pytest.mark.owns_machine,
    pytest.mark.skipif(
        find_py_spy() is None, reason="py-spy is not installed (gpumon-why[stacks])"
    ),
]

CI_SEED = 0
STACKS_EVERY_S = 2.0


def _phase(scenario: str, name: str, seconds: float) -> workloads.Phase:
    scn = workloads.build(scenario, CI_SEED)
    ph = next(p for p in scn.phases if p.name == name)
    return dataclasses.replace(ph, seconds=seconds)


def stacks_scenario() -> workloads.LabScenario:
    """starved's phases, then an evaluation and checkpoints (the scenarios' own phases)."""
    starved = workloads.build("starved", CI_SEED, 1.0)
    more = (_phase("lifecycle", "evaluation", 10), _phase("periodic", "checkpoints", 12))
    return dataclasses.replace(starved, phases=starved.phases + more)


def _by_phase(run_dir: Path) -> dict[tuple[str, str], dict[str, float]]:
    """Watch's recorded stacks (its own samples, classified by gpumon): seconds per
    activity, per (truth phase, role).  Idle is left out: the main process sleeping while
    its GPU runs the step queued ahead, a worker waiting for work -- not what a gap was
    spent on (the summary weighs it by the GPU's waiting; a raw count cannot)."""
    phases = [r for r in read_truth(run_dir / "truth-rank0.jsonl") if r.get("event") == "phase_end"]
    out: dict[tuple[str, str], dict[str, float]] = {}
    for line in (run_dir / "record.jsonl").read_text().splitlines():
        obj = json.loads(line)
        if obj.get("event") != "stacks":
            continue
        for s in decode_stacks(obj):
            mid = s.t_s + s.seconds / 2
            ph = next((p["phase"] for p in phases if p["start"] <= mid < p["t"]), None)
            act = decide(s.frames, s.role)[0]
            if ph is not None and act is not Activity.IDLE:
                key = (ph, "workers" if s.role is ProcessRole.WORKER else "main")
                per = out.setdefault(key, {})
                per[act.value] = per.get(act.value, 0.0) + s.seconds
    return out


def _top(seconds: dict[str, float] | None) -> str | None:
    return None if not seconds else max(seconds, key=lambda a: seconds[a])


def test_watch_names_what_each_starved_phase_was_spent_on(
    tmp_path: Path, fake_nvml_lib: Path
) -> None:
    busy = too_busy_for_a_run()
    if busy:
        pytest.skip(busy)
    run_dir = tmp_path / "run"
    obs = runner.run(stacks_scenario(), run_dir, stacks_every_s=STACKS_EVERY_S)
    summary = json.loads((run_dir / "summary.json").read_text())
    refused = [n for n in summary["notes"] if n.startswith("cannot read the Python stacks")]
    if refused:
        pytest.skip(refused[0])
    assert obs.errors == [], obs.errors
    # What the processes spend the gaps on is the design's only where the run kept to it:
    # workers that wait for a CPU other processes hold sit idle, their batches queued.
    kept = [r for r in read_truth(run_dir / "truth-rank0.jsonl") if r.get("event") == "phase_end"]
    off = [(r["phase"], r["label"]) for r in kept if r["label"] != r["design"]]
    if off:
        pytest.skip(f"the machine kept phases from their design (the run's truth): {off}")
    stacks = summary["stacks"]
    assert isinstance(stacks, dict), summary
    # The summary, over the run: the workers decoded; the main process waited on its
    # loader (workers saturated), decoded itself (num_workers=0), evaluated and wrote
    # checkpoints -- each at the lab's frame that does it.
    workers, main = stacks["workers"]["activities"], stacks["main"]["activities"]
    assert max(workers, key=workers.get) == "decode", stacks
    assert "CpuDataset.decode" in stacks["workers"]["top"][0]["where"], stacks
    for act in ("loader_wait", "decode", "evaluation"):
        assert main.get(act, 0.0) >= 0.1, (act, stacks)
    assert main.get("checkpoint", 0.0) > 0.0, stacks
    wheres = {t["activity"]: t["where"] for t in stacks["main"]["top"]}
    assert "CpuDataset.decode" in wheres["decode"], stacks
    assert "RankJob.evaluate" in wheres["evaluation"], stacks
    # Phase by phase, from watch's recording of the same stacks.
    got = _by_phase(run_dir)
    want = {
        ("starved-cpu", "main"): "loader_wait",
        ("starved-cpu", "workers"): "decode",
        ("starved-gil", "main"): "decode",
        ("evaluation", "main"): "evaluation",
        ("checkpoints", "main"): "checkpoint",
    }
    assert {k: _top(got.get(k)) for k in want} == want, got
