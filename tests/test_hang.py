"""A hung job, named: every rank spinning in a collective and none computing, on data.

8 GPUs doing real work (~550 W, SM activity ~0.8) then all at 100 % utilisation, ~120 W of
700 and SM activity ~0.04: the ranks wait in a collective for a rank that is not here.
"""

from __future__ import annotations

from collections.abc import Callable

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

T0 = 5000.0


def run(
    gpus: int,
    phases: list[tuple[float, str]],
    *,
    gpm: bool = True,
) -> list[Snapshot]:
    """``phases``: (seconds, "work" | "spin") in order; a tick a second, 6 samples each."""
    out = []
    t = T0
    for seconds, kind in phases:
        end = t + seconds
        while t < end - 1e-9:
            t += 1.0
            pts = tuple((t - 1 + (k + 1) / 6, 98.0 if kind == "work" else 100.0) for k in range(6))
            spin = kind == "spin"
            out.append(
                Snapshot(
                    t,
                    tuple(
                        GpuSample(
                            t,
                            i,
                            f"GPU-{i}",
                            pts,
                            util_pct=100.0,
                            mem_used_bytes=60 << 30,
                            mem_total_bytes=80 << 30,
                            power_watts=120.0 if spin else 550.0,
                            power_limit_watts=700.0,
                            processes=(GpuProcess(100 + i),),
                            sm_active_ratio=(0.04 if spin else 0.8) if gpm else None,
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
