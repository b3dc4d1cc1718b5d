"""Pauses and dips of a whole run, on data: what a rhythm of short dips is (issue 35, item
8) and whose all-GPU pauses the host's CPU fills (item 7).

Ticks are shaped as the live path makes them (tests/test_live_judgments.py): a tick every
0.5 s carrying the driver samples (1/6 s) since the previous one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from test_live_judgments import T0, busy, shown, ticks

from gpumon.detect import Detector, DetectorConfig
from gpumon.detect.activities import Activity, Reading, judge
from gpumon.detect.rules import Candidate
from gpumon.engine import analyze
from gpumon.model import (
    Cause,
    GpuProcess,
    GpuSample,
    HostSample,
    Lever,
    ProcessSample,
    ProcTreeSample,
    Reason,
    Snapshot,
    State,
    TraceHeader,
    Verdict,
)
from gpumon.traces.jsonl import TraceWriter


def dips(startup_s: float, dip_s: float, every_s: float = 20.0) -> Callable[[float], float]:
    """Idle through a start-up of ``startup_s``, then busy (95-99 %) with an all-idle dip
    of ``dip_s`` at the end of every ``every_s``."""

    def f(x: float) -> float:
        if x < startup_s:
            return 0.0
        return 0.0 if (x - startup_s) % every_s >= every_s - dip_s else busy(x)

    return f


@pytest.mark.parametrize("startup_s", [0.0, 10.0])
@pytest.mark.parametrize("gpus", [1, 2])
def test_brief_periodic_dips_of_a_healthy_run_are_never_starvation(
    startup_s: float, gpus: int
) -> None:
    """A 2 s dip every 20 s is a tenth of the time, below the line (``rhythm_idle_share``):
    healthy throughout, live.  Measured from its first dip the rhythm read 14 %; the
    start-up's idle counted as a gap made the first dip no lone dip; and the second dip,
    read over an 8 s window (a quarter idle) or a sustained window reaching back into
    start-up, read starved."""
    f = dips(startup_s, 2.0)
    snaps = ticks(dict.fromkeys(range(gpus), f), 200)
    _, seen = shown(snaps, gpus)
    after = [(t, s, r) for t, s, r in seen if t >= startup_s + 4.0]
    assert all(s is State.HEALTHY for _, s, _ in after), [
        x for x in after if x[1] is not State.HEALTHY
    ][:3]
    header = TraceHeader(1, "gpumon")
    res = analyze(header, snaps)  # the same trace offline: the verdict agrees
    assert res.summary.verdict is State.HEALTHY, res.summary.notes
    assert res.summary.seconds.get(State.STARVED, 0.0) == 0.0


def test_analyze_of_a_recording_with_brief_periodic_dips_says_healthy(tmp_path: Path) -> None:
    """The recording of such a run (two GPUs, an idle start-up, a 2 s dip every 20 s), read
    back by ``gpumon analyze`` as a user runs it: healthy, no second starved."""
    path = tmp_path / "dips.jsonl"
    f = dips(10.0, 2.0)
    with TraceWriter.open(path, TraceHeader(version=2, source="gpumon")) as out:
        for snap in ticks({0: f, 1: f}, 240):
            out.write(snap)
    proc = subprocess.run(
        [sys.executable, "-m", "gpumon", "analyze", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["verdict"] == "healthy", got["notes"]
    assert got["seconds"].get("starved", 0.0) == 0.0, got["seconds"]


def test_periodic_dips_above_the_line_are_still_starvation() -> None:
    """A 4 s dip every 20 s on one GPU takes a fifth of the time: periodic starvation."""
    _, seen = shown(ticks({0: dips(10.0, 4.0)}, 200))
    _, state, reason = seen[-1]
    assert (state, reason) == (State.STARVED, Reason.PERIODIC_GAPS), seen[-1]
    first = next(t for t, s, _ in seen if s is State.STARVED)
    assert first <= 10.0 + 4 * 20.0  # by the fourth dip


# --- all-GPU pauses that the CPU fills (item 7) ------------------------------------------

PAUSE_S, EVERY_S, CORES = 8.0, 30.0, 16


def paused(x: float) -> bool:
    """Every GPU stops for 8 s at the end of every 30 s (an epoch's end, or a checkpoint)."""
    return x % EVERY_S >= EVERY_S - PAUSE_S


def pausing_run(
    in_pause: str, *, tree: bool = True, seconds: int = 240, gpus: int = 4
) -> list[Snapshot]:
    """Four GPUs pausing together; the host in the pauses as ``in_pause`` says:
    ``loader`` (8 DataLoader workers started anew at each epoch, at ~95 % of a core each
    loading the first batches), ``checkpoint`` (the main process pickling and writing
    1.5 GB/s, iowait 12 %, the workers idle), or ``flat`` (as in the work between).  In the
    work the main process drives the GPUs (~90 %) and the workers prefetch (~30 % each)."""
    out = []
    for k in range(1, seconds + 1):
        t = float(k)
        stop = paused(t - 0.5)
        pts = tuple(
            (T0 + t - 1 + (j + 1) / 6, 0.0 if paused(t - 1 + (j + 0.5) / 6) else busy(t + j))
            for j in range(6)
        )
        epoch = int(t // EVERY_S)
        main, workers, write, iowait = 90.0, [30.0] * 8, 0.0, 0.5
        if stop and in_pause == "loader":
            main, workers = 30.0, [95.0] * 8
        elif stop and in_pause == "checkpoint":
            main, workers, write, iowait = 100.0, [2.0] * 8, 1.5e9, 12.0
        procs = [ProcessSample(100, 1, "python", main, 12, 0.0, write, "running")]
        procs += [
            ProcessSample(1000 * epoch + w, 100, "pt_data_worker", c, 1, 5e6, 0.0, "running")
            for w, c in enumerate(workers)
        ]
        busy_cores = (main + sum(workers)) / 100.0 + 0.2
        host = HostSample(
            T0 + t,
            tuple([min(100.0, 100.0 * busy_cores / CORES)] * CORES),
            min(100.0, 100.0 * busy_cores / CORES),
            iowait,
            disk_read_bytes_per_s=40e6,
            disk_write_bytes_per_s=write + 1e5,
        )
        gpu = tuple(
            GpuSample(
                T0 + t,
                i,
                f"GPU-{i}",
                pts,
                util_pct=pts[-1][1],
                mem_used_bytes=20 << 30,
                mem_total_bytes=80 << 30,
                power_watts=90.0 if stop else 550.0,
                power_limit_watts=700.0,
                processes=(GpuProcess(100),),
            )
            for i in range(gpus)
        )
        ptree = ProcTreeSample(T0 + t, 100, tuple(procs)) if tree else None
        out.append(Snapshot(T0 + t, gpu, host, ptree))
    return out


def judged(snaps: list[Snapshot]) -> Verdict:
    det = Detector()
    for s in snaps:
        det.update(s)
    return det.verdict()


@pytest.mark.parametrize(
    ("tree", "cause"), [(True, Cause.CPU), (False, Cause.UNKNOWN)], ids=["job-tree", "host-only"]
)
def test_pauses_the_cpu_fills_are_the_input_pipeline_starting_over(
    tree: bool, cause: Cause
) -> None:
    """Every GPU pauses 8 s of each 30 s while the loader's workers start anew and load the
    first batches: the job's CPU (or the host's) surges in each pause.  That is the input
    pipeline's stall, starved, with the epoch-start advice -- not a checkpoint.  Its cause
    is read as for any starvation: the job's workers saturated (cpu); a host half busy,
    without the job's tree to say whose, names none."""
    v = judged(pausing_run("loader", tree=tree))
    assert v.state is State.STARVED, (v.state, v.note)
    assert v.reason is Reason.SYNC_PAUSES
    assert {g.state for g in v.gpus} == {State.STARVED}
    assert v.cause is cause, v.gpus[0].evidence
    assert v.note is not None and "CPU fills each pause" in v.note, v.note
    advice = " ".join(a.text for a in v.advice)
    assert "persistent_workers=True" in advice and "prefetch_factor" in advice, advice
    assert "checkpoint" not in advice, advice
    assert v.advice[0].lever is Lever.RHYTHM


@pytest.mark.parametrize("in_pause", ["checkpoint", "flat"])
def test_pauses_without_a_cpu_surge_or_with_writes_stay_a_checkpoint(in_pause: str) -> None:
    """The same pauses while the main process writes a checkpoint (disk writes, iowait, the
    workers idle), or with the host as in the work between: a sync stall, as before."""
    v = judged(pausing_run(in_pause))
    assert (v.state, v.reason) == (State.SYNC_STALL, Reason.SYNC_PAUSES), (v.state, v.note)
    assert any("checkpoint less often" in a.text for a in v.advice), v.advice


def test_a_cpu_surge_with_writes_is_still_a_checkpoint() -> None:
    """Writes during the pauses say a checkpoint even where the CPU rises with them."""
    snaps = pausing_run("loader")
    written = [
        replace(s, host=replace(s.host, disk_write_bytes_per_s=1.2e9))
        if s.host is not None and paused(s.t_s - T0 - 0.5)
        else s
        for s in snaps
    ]
    v = judged([replace(s, tree=None) for s in written])
    assert (v.state, v.reason) == (State.SYNC_STALL, Reason.SYNC_PAUSES), (v.state, v.note)


def test_stacks_in_a_checkpoint_keep_pauses_a_checkpoint() -> None:
    """Pauses read as the input pipeline's, whose stacks show the main process in
    torch.save for most of them, are a checkpoint (the stacks say what the host cannot)."""
    cand = Candidate(
        state=State.STARVED,
        cause=Cause.CPU,
        reason=Reason.SYNC_PAUSES,
        detail="the job's CPU",
        since_s=10.0,
    )
    r = Reading((Activity.CHECKPOINT, 0.9), None, "train.py:88 save", None, 6.0)
    got = judge(cand, r, DetectorConfig(), True)
    assert (got.state, got.reason) == (State.SYNC_STALL, Reason.CHECKPOINT)
