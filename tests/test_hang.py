"""A hung job, named: every rank spinning in a collective and none computing, on data.

8 GPUs doing real work (~550 W, SM activity ~0.8) then all at 100 % utilisation, ~120 W of
700 and SM activity ~0.04: the ranks wait in a collective for a rank that is not here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpumon.engine import analyze
from gpumon.model import (
    GpuIdentity,
    GpuProcess,
    GpuSample,
    Reason,
    Snapshot,
    State,
    TraceHeader,
)
from gpumon.traces.jsonl import TraceWriter

T0 = 5000.0


def run(
    gpus: int,
    phases: list[tuple[float, str]],
    *,
    gpm: bool = True,
) -> list[Snapshot]:
    """``phases``: (seconds, "work" | "spin" | "straggler") in order, a tick a second, 6
    samples each; "straggler": GPU 0 works while its peers spin (waiting on it)."""
    out = []
    t = T0
    for seconds, kind in phases:
        end = t + seconds
        while t < end - 1e-9:
            t += 1.0
            spun = {i for i in range(gpus) if kind == "spin" or (kind == "straggler" and i)}
            out.append(
                Snapshot(
                    t,
                    tuple(
                        GpuSample(
                            t,
                            i,
                            f"GPU-{i}",
                            tuple(
                                (t - 1 + (k + 1) / 6, 100.0 if i in spun else 98.0)
                                for k in range(6)
                            ),
                            util_pct=100.0,
                            mem_used_bytes=60 << 30,
                            mem_total_bytes=80 << 30,
                            power_watts=120.0 if i in spun else 550.0,
                            power_limit_watts=700.0,
                            processes=(GpuProcess(100 + i),),
                            sm_active_ratio=(0.04 if i in spun else 0.8) if gpm else None,
                        )
                        for i in range(gpus)
                    ),
                )
            )
    return out


def header(gpus: int) -> TraceHeader:
    idents = tuple(GpuIdentity(i, f"GPU-{i}", power_limit_watts=700.0) for i in range(gpus))
    return TraceHeader(1, "gpumon", gpus=idents)


def reasons(res: object, want: Callable[[object], bool]) -> list[object]:
    return [e for g in res.gpus.values() for e in g.episodes if want(e)]  # type: ignore[attr-defined]


def test_every_rank_spinning_for_minutes_is_a_hang_named_with_its_start() -> None:
    res = analyze(header(8), run(8, [(300, "work"), (900, "spin")]))
    assert res.summary.verdict is State.SYNC_STALL
    assert res.summary.reason is Reason.HANG
    hung = reasons(res, lambda e: e.reason is Reason.HANG)  # type: ignore[attr-defined]
    assert len(hung) == 8
    for e in hung:
        assert abs(e.start_s - (T0 + 300)) <= 10  # backdated to when the spinning began
    assert res.verdict.reason is Reason.HANG  # now
    advice = " ".join(a.text for a in res.summary.advice)
    assert "elsewhere" in advice and "gpumon report --job" in advice
    assert "data loader" not in advice  # no local rank is a straggler
    # Spinning is no work: the episodes and the run agree on the GPUs of work delivered.
    assert all(e.evidence.get("effective_gpus", 0.0) <= 0.5 for e in hung)  # type: ignore[attr-defined]


def test_a_long_wait_that_recovers_is_a_stall_not_a_hang() -> None:
    res = analyze(header(8), run(8, [(120, "work"), (180, "spin"), (120, "work")]))
    assert not reasons(res, lambda e: e.reason is Reason.HANG)  # type: ignore[attr-defined]
    waits = reasons(res, lambda e: e.state is State.SYNC_STALL)  # type: ignore[attr-defined]
    assert waits  # the wait itself is seen: a sync stall (busy-wait)


def test_one_gpu_alone_spinning_with_idle_sms_hangs_too_but_not_on_power_alone() -> None:
    res = analyze(header(1), run(1, [(120, "work"), (600, "spin")]))
    assert res.summary.reason is Reason.HANG and res.verdict.state is State.SYNC_STALL
    blind = analyze(header(1), run(1, [(120, "work"), (600, "spin")], gpm=False))
    assert blind.summary.reason is not Reason.HANG  # low power alone could be light work


@pytest.mark.parametrize("minutes", [4.0])
def test_the_threshold_is_the_configured_one(minutes: float) -> None:
    from gpumon.detect import DetectorConfig

    cfg = DetectorConfig(hang_after_s=60.0, calm_factor=5.0)
    res = analyze(header(2), run(2, [(60, "work"), (minutes * 60, "spin")]), cfg)
    assert res.summary.reason is Reason.HANG


def test_watch_says_how_long_the_job_has_made_no_progress() -> None:
    from gpumon.faces.watch.layout import no_progress_s

    res = analyze(header(4), run(4, [(120, "work"), (600, "spin")]))
    stuck = no_progress_s(res.verdict)
    assert stuck is not None and abs(stuck - 600) <= 10
    assert no_progress_s(analyze(header(4), run(4, [(300, "work")])).verdict) is None


# --- the threshold analyze judges a recording with (the real CLI) ----------------------

ROOT = Path(__file__).resolve().parents[1]


def recording(path: Path, **extra: object) -> Path:
    """A trace of 2 GPUs: 60 s of work, then 90 s of every rank spinning, its header's
    ``extra`` as given (watch names the detector settings it was run with there)."""
    head = dataclasses.replace(header(2), extra=extra)
    with open(path, "w", encoding="utf-8") as fh, TraceWriter(fh, head) as w:
        for snap in run(2, [(60, "work"), (90, "spin")]):
            w.write(snap)
    return path


def analyze_cli(trace: Path, *args: str) -> tuple[dict, str]:
    r = subprocess.run(
        [sys.executable, "-m", "gpumon", "analyze", "--json", str(trace), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


def told(doc: dict) -> list[tuple[str, str | None]]:
    """The run's verdict and reason, and each GPU's last episode's state and reason."""
    last = {(e["state"], e["reason"]) for g in doc["gpus"] for e in g["episodes"][-1:]}
    return [(doc["verdict"], doc["reason"]), *sorted(last)]


def test_analyze_calls_a_hang_after_the_seconds_its_command_line_gives(tmp_path: Path) -> None:
    trace = recording(tmp_path / "spin.jsonl")
    default, _ = analyze_cli(trace)  # 90 s of spinning: under the default 300 s
    assert told(default) == [("sync_stall", None), ("sync_stall", "busy-wait")]
    hung, _ = analyze_cli(trace, "--hang-after", "30")
    assert told(hung) == [("sync_stall", "hang"), ("sync_stall", "hang")]


def test_a_recording_is_judged_with_the_hang_threshold_watch_named_in_it(tmp_path: Path) -> None:
    trace = recording(tmp_path / "spin.jsonl", detector={"hang_after_s": 30.0})
    hung, err = analyze_cli(trace)
    assert told(hung) == [("sync_stall", "hang"), ("sync_stall", "hang")]
    assert "gpumon: note: judged with the recording's settings: hang after 30 s" in err
    # The command line's threshold is over the recording's, and the note no longer says it.
    waiting, err = analyze_cli(trace, "--hang-after", "300")
    assert told(waiting) == [("sync_stall", None), ("sync_stall", "busy-wait")]
    assert "recording's settings" not in err


def test_detector_settings_a_recording_names_wrongly_are_ignored_and_said(tmp_path: Path) -> None:
    trace = recording(
        tmp_path / "spin.jsonl", detector={"hang_after_s": "soon", "window_s": 0, "colour": 1}
    )
    res, err = analyze_cli(trace)
    # Judged with analyze's own settings.
    assert told(res) == [("sync_stall", None), ("sync_stall", "busy-wait")]
    assert "setting hang_after_s: 'soon' is not 10 to 86400 seconds: ignored" in err
    assert "setting window_s: 0 is not" in err
    assert "setting colour: not a setting this gpumon knows: ignored" in err
    assert "recording's settings" not in err


@pytest.mark.parametrize("gpm", [True, False])
def test_a_hang_is_called_when_the_spinning_has_lasted_the_threshold_not_before(gpm: bool) -> None:
    """Counted from when the GPUs stopped computing: the live view names the hang once the
    spinning has lasted ``hang_after_s`` (within a tick), and the episode begins then."""
    from gpumon.detect import DetectorConfig
    from gpumon.engine import Session

    cfg = DetectorConfig(hang_after_s=20.0)
    session = Session.offline(header(4), cfg, live=True)
    spin_began = T0 + 60
    called = None
    for snap in run(4, [(60, "work"), (60, "spin")], gpm=gpm):
        session.feed(snap)
        verdict = session.verdict()
        if called is None and verdict is not None and verdict.reason is Reason.HANG:
            called = snap.t_s
    assert called is not None and verdict is not None
    assert spin_began + 20.0 <= called <= spin_began + 20.0 + 2.0
    hung = [g for g in verdict.gpus if g.reason is Reason.HANG]
    assert len(hung) == 4
    assert all(g.since_s is not None and abs(g.since_s - spin_began) <= 1.0 for g in hung)


@pytest.mark.parametrize("gpm", [True, False])
def test_a_straggler_that_stops_computing_is_said_to_wait_with_its_peers(gpm: bool) -> None:
    """The rank its peers waited on spins too now: its episode says so within seconds,
    not "straggler" (and its advice about its own slowness) until the hang threshold."""
    from gpumon.engine import Session

    session = Session.offline(header(4), live=True)  # the default threshold: 300 s
    spin_began = T0 + 60
    said: dict[float, Reason | None] = {}
    for snap in run(4, [(60, "straggler"), (60, "spin")], gpm=gpm):
        session.feed(snap)
        verdict = session.verdict()
        if verdict is not None:
            said[snap.t_s] = verdict.gpus[0].reason
    assert said[spin_began] is Reason.STRAGGLER
    assert all(said[t] is Reason.BUSY_WAIT for t in said if t >= spin_began + 8), said
