"""Each detector rule on data alone: a track fed with samples, the rule asked once.

The rules are the sentences of gpumon/detect/rules.py and multi.py; each test states one
and shows it answering (and, beside it, the case it must leave to another rule).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from gpumon.detect import DetectorConfig, run_verdict
from gpumon.detect import rules as R
from gpumon.detect.gpu import GpuTrack, find_rhythm
from gpumon.detect.multi import RunContext, busy_wait, pinned_peers
from gpumon.detect.pauses import PauseTracker
from gpumon.model import Cause, GpuProcess, GpuSample, Reason, State

CFG = DetectorConfig()
GIB = 1 << 30
HELD = (GpuProcess(42, 10 * GIB),)


def track(
    util: Callable[[float], float],
    seconds: float,
    *,
    period: float = 1 / 6,
    power: Callable[[float], float] | None = None,
    processes: tuple[GpuProcess, ...] | None = HELD,
    index: int = 0,
    lost_at: float | None = None,
    mem_used: int | None = 20 * GIB,
) -> GpuTrack:
    """A track fed one tick a second with driver points every ``period`` seconds, its
    totals recorded every second as the detector records them at its evals."""
    tr = GpuTrack(index, f"GPU-{index}", CFG, power_limit_watts=400.0, mem_total_bytes=80 * GIB)
    t = 0.0
    n = round(1 / period)
    while t < seconds:
        t += 1.0
        pts = tuple((t - 1 + (k + 1) * period, util(t - 1 + (k + 1) * period)) for k in range(n))
        g = GpuSample(
            t_s=t,
            gpu=index,
            uuid=tr.uuid,
            util_samples=pts,
            power_watts=None if power is None else power(t),
            mem_used_bytes=mem_used,
            mem_total_bytes=80 * GIB,
            processes=processes,
            lost=lost_at is not None and t >= lost_at,
        )
        tr.ingest(g, [], [])
        tr.record(t)
    return tr


@dataclass
class Judged:
    """A track's readings with what the detector has decided about it."""

    tr: GpuTrack
    now: R.GpuDecision


def context(gpu: GpuTrack | Judged, span: float = 8.0, state: State | None = None) -> R.GpuContext:
    g = gpu if isinstance(gpu, Judged) else Judged(gpu, R.GpuDecision())
    now = g.now if state is None else replace(g.now, state=state)
    t = g.tr.last_tick_t or 0.0
    return R.GpuContext(
        tr=g.tr,
        now=now,
        w=g.tr.window(t, span),
        t=t,
        cfg=CFG,
        cause_of=lambda t, s, current: Cause.UNKNOWN,
        isolated=lambda *a: False,
    )


def working(tr: GpuTrack, since: float = 1.0, state: State = State.HEALTHY) -> Judged:
    """Past start-up, in ``state``."""
    now = R.GpuDecision(
        state=state, reason=None, seen_work=True, work_start_s=since, work_began_s=since
    )
    return Judged(tr, now)


def classify(c: R.GpuContext) -> R.Candidate:
    """The rules in order, as the detector asks them for a GPU past start-up."""
    return R.judge_before_work(c) or R.judge_work(c)


def square(period: float, duty: float, low: float = 0.0) -> Callable[[float], float]:
    return lambda t: 98.0 if (t % period) < duty * period else low


def steady(u: float) -> Callable[[float], float]:
    return lambda t: u


# --- rules that need no work ------------------------------------------------------------


def test_a_lost_gpu_is_unknown_at_once() -> None:
    c = R.lost_gpu(context(track(steady(98), 20, lost_at=19)))
    assert c is not None and (c.state, c.reason, c.clear) == (State.UNKNOWN, Reason.GPU_LOST, True)
    assert R.lost_gpu(context(track(steady(98), 20))) is None


def test_no_reading_is_unknown_never_idle() -> None:
    tr = GpuTrack(0, "GPU-0", CFG)
    tr.record(0.0)
    tr.record(30.0)
    c = R.no_data(
        R.GpuContext(
            tr=tr,
            now=R.GpuDecision(),
            w=tr.window(30.0, 8.0),
            t=30.0,
            cfg=CFG,
            cause_of=None,  # type: ignore[arg-type]
            isolated=None,  # type: ignore[arg-type]
        )
    )
    assert c is not None and (c.state, c.reason) == (State.UNKNOWN, Reason.NO_DATA)


# --- start-up ----------------------------------------------------------------------------


def test_start_up_ends_at_the_first_sustained_work() -> None:
    tr = track(lambda t: 0.0 if t < 10 else 98.0, 20)
    c = context(tr)
    now = R.enter_work(c)
    # (within the window it can see: the last 8 s, plus one partial sample)
    assert now is not None and now.seen_work
    assert now.work_start_s is not None and 10 <= now.work_start_s <= 12.5
    assert now.work_began_s == now.work_start_s and not c.now.seen_work  # (a value, not a write)
    assert R.before_work(replace(c, now=now)) is None


def test_a_gpu_that_never_works_is_start_up_then_just_idle() -> None:
    young = context(track(steady(0), 60))
    c = R.before_work(young)
    assert c is not None and (c.state, c.reason) == (State.IDLE, Reason.START_UP)
    old = context(track(steady(0), 200))
    c = R.before_work(old)
    assert c is not None and (c.state, c.reason) == (State.IDLE, Reason.MEMORY_HELD)
    assert c.backdate_s >= 190  # it never was starting up: idle from the start
    free = context(track(steady(0), 60, processes=(), mem_used=0))
    c = R.before_work(free)
    assert c is not None and c.reason is Reason.NO_PROCESS


def test_new_work_is_healthy_on_its_latest_samples() -> None:
    tr = working(track(steady(98), 20), since=15, state=State.IDLE)
    c = R.first_judgment(context(tr))
    assert c is not None and c.state is State.HEALTHY
    gappy = working(track(square(1.0, 0.5), 20), since=15, state=State.IDLE)
    assert R.first_judgment(context(gappy)) is None


# --- judging work ------------------------------------------------------------------------


def test_no_activity_is_idle_and_says_memory_is_held() -> None:
    c = R.idle(context(working(track(lambda t: 98.0 if t < 30 else 0.0, 60))))
    assert c is not None and (c.state, c.reason) == (State.IDLE, Reason.MEMORY_HELD)
    assert R.idle(context(working(track(steady(98), 60)))) is None


def test_periodic_gaps_are_starvation_even_at_a_high_duty_cycle() -> None:
    # A DataLoader restarting its workers every epoch: ~4.5 s gap every 27 s (duty 0.83).
    tr = working(track(square(27.0, 1 - 4.5 / 27), 200))
    c = R.periodic_gaps(context(tr))
    assert c is not None and (c.state, c.reason) == (State.STARVED, Reason.PERIODIC_GAPS)
    assert "gap every 27 s" in (c.detail or "")
    # ... while duty alone would call it healthy:
    assert R.healthy(context(tr, span=60)) is not None


def test_rare_checkpoints_are_not_a_rhythm_of_starvation() -> None:
    tr = working(track(square(150.0, 1 - 4.0 / 150), 600))
    assert tr.tr.rhythm() is not None  # regular, but under 3 % of the time
    assert R.periodic_gaps(context(tr)) is None


def test_irregular_gaps_are_no_rhythm() -> None:
    starts = [0.0, 10.0, 40.0, 45.0, 90.0]
    assert find_rhythm([(a, a + 3.0) for a in starts], CFG) is None
    regular = [0.0, 27.0, 54.5, 81.0]
    rh = find_rhythm([(a, a + 4.5) for a in regular], CFG)
    assert rh is not None and rh.gaps == 4 and round(rh.period_s) == 27


def test_a_rhythm_that_stopped_no_longer_starves() -> None:
    tr = working(track(lambda t: square(27.0, 0.8)(t) if t < 150 else 98.0, 260))
    assert tr.tr.rhythm() is not None
    assert R.periodic_gaps(context(tr)) is None


def test_healthy_with_hysteresis_and_no_endless_borderline() -> None:
    assert R.healthy(context(working(track(steady(95), 60)))) is not None
    band = working(track(steady(78), 100))
    assert R.healthy(context(band, state=State.STARVED)) is None  # hysteresis: stays starved
    # Healthy until now, but below the line for a whole minute: no longer borderline.
    assert R.healthy(context(band, state=State.HEALTHY)) is None
    flicker = working(track(lambda t: 78.0 if t > 95 else 95.0, 100))
    assert R.healthy(context(flicker, state=State.HEALTHY)) is not None


def test_coarse_flat_low_duty_without_process_is_unknown_but_work_and_bursts_are_not() -> None:
    flat = working(track(steady(7), 60, period=1.0, processes=None, mem_used=None))
    c = R.coarse_unjudgeable(context(flat))
    assert c is not None and (c.state, c.reason) == (State.UNKNOWN, Reason.COARSE_DATA)
    bursty = working(track(square(4.0, 0.5), 60, period=1.0, processes=None, mem_used=None))
    assert R.coarse_unjudgeable(context(bursty)) is None
    held = working(track(steady(7), 60, period=1.0))
    assert R.coarse_unjudgeable(context(held)) is None
    working_flat = working(track(steady(13), 60, period=1.0, processes=None, mem_used=None))
    assert R.coarse_unjudgeable(context(working_flat)) is None


def test_a_little_work_in_every_sample_from_a_holding_process_is_not_idle() -> None:
    """4-7 % in every sample (an RL run waiting on its environment) under a process that
    holds 10 GB: starved, not idle; the same from a GPU nobody holds is idleness."""
    held = working(track(lambda t: 4.0 + (t % 4), 120, period=1.0))
    assert R.idle(context(held)) is None
    free = working(track(lambda t: 4.0 + (t % 4), 120, period=1.0, processes=(), mem_used=0))
    c = R.no_run(context(free))
    assert c is not None and (c.state, c.reason) == (State.IDLE, Reason.NO_PROCESS)


def test_a_gpu_no_process_holds_has_no_run_to_starve() -> None:
    """A desktop reading 8-60 % on a GPU whose run has left (65 MiB in use, no process
    list): idle, not starved -- and one tick of a larger reading does not change that."""
    tr = working(track(square(20.0, 0.5), 120, processes=None, mem_used=65 << 20))
    c = R.no_run(context(tr))
    assert c is not None and c.state is State.IDLE
    assert R.no_run(context(working(track(square(20.0, 0.5), 120)))) is None  # held: a run


def test_memory_below_any_cuda_context_means_nothing_holds_the_gpu() -> None:
    """65 MiB in use and no process list: a display or another client, not a training run."""
    tr = track(steady(30), 20, processes=None, mem_used=65 << 20)
    assert tr.held() is False
    assert track(steady(30), 20, processes=None, mem_used=2 << 30).held() is True
    # A small model on an 80 GB card (1.5 GiB, under 5 %) is held all the same.
    assert track(steady(30), 20, processes=None, mem_used=3 << 29).held() is True


def test_what_is_left_is_starved_with_the_hosts_cause() -> None:
    c = R.starved(context(working(track(square(1.0, 0.3), 60))))
    assert c is not None and c.state is State.STARVED and c.cause is Cause.UNKNOWN
    assert c.clear  # far below the line: confirmed at once


def test_classify_asks_the_rules_in_order() -> None:
    lost = context(track(steady(98), 20, lost_at=19))
    found = R.judge_before_work(lost)
    assert found is not None and found.reason is Reason.GPU_LOST  # before anything else
    c = context(working(track(steady(98), 60)))
    assert R.judge_before_work(c) is None and R.judge_work(c).state is State.HEALTHY


# --- run-level rules -----------------------------------------------------------------------


def run(gpus: list[Judged], span: float = 8.0) -> RunContext:
    t = max(g.tr.last_tick_t or 0.0 for g in gpus)
    return RunContext(
        t=t,
        prev_eval_s=t - 1,
        tracks={g.tr.index: g.tr for g in gpus},
        decided={g.tr.index: g.now for g in gpus},
        wins={g.tr.index: g.tr.window(t, span) for g in gpus},
        cands={g.tr.index: classify(context(g, span)) for g in gpus},
        run_peak_watts=None,
        cfg=CFG,
        pauses=PauseTracker(CFG),
    )


def test_busy_waiting_peers_name_the_straggler() -> None:
    strag = working(track(square(1.0, 0.4), 60, power=lambda t: 300.0))
    peers = [working(track(steady(99), 60, power=lambda t: 110.0, index=i)) for i in (1, 2)]
    c = run([strag, *peers])
    busy_wait(c)
    assert c.straggler == 0 and c.busywait == {1, 2}
    assert c.cands[0].reason is Reason.STRAGGLER and c.cands[1].reason is Reason.BUSY_WAIT


def test_pinned_peers_without_power_wait_on_a_minority() -> None:
    strag = working(track(square(1.0, 0.4), 60))
    peers = [working(track(steady(99), 60, index=i)) for i in (1, 2, 3)]
    c = run([strag, *peers])
    pinned_peers(c)
    assert c.straggler == 0
    assert [c.cands[i].state for i in range(4)] == [State.SYNC_STALL] * 4


def test_peers_seen_computing_are_separate_work() -> None:
    strag = working(track(square(1.0, 0.4), 60, power=lambda t: 200.0))
    peers = [working(track(steady(99), 60, power=lambda t: 380.0, index=i)) for i in (1, 2)]
    c = run([strag, *peers])
    pinned_peers(c)
    assert c.straggler is None and c.cands[0].state is State.STARVED


def test_most_gpus_slow_is_starvation_not_a_straggler() -> None:
    slow = [working(track(square(1.0, 0.4), 60, index=i)) for i in (0, 1, 2)]
    c = run([*slow, working(track(steady(99), 60, index=3))])
    pinned_peers(c)
    assert c.straggler is None


def test_all_gpus_pausing_together_is_a_sync_stall() -> None:
    """Every GPU stops for 8 s every 30 s, busy in between (a checkpoint, a host sync)."""
    from gpumon.detect import Detector
    from gpumon.model import Snapshot

    pause = square(30.0, 1 - 8 / 30)
    det = Detector()
    for k in range(1, 200):
        t = float(k)
        pts = tuple((t - 1 + (j + 1) / 6, pause(t - 1 + (j + 1) / 6)) for j in range(6))
        gpus = tuple(
            GpuSample(t, i, f"GPU-{i}", pts, mem_used_bytes=20 * GIB, mem_total_bytes=80 * GIB)
            for i in range(4)
        )
        det.update(Snapshot(t, gpus))
    v = det.verdict()
    assert v.state is State.SYNC_STALL and v.reason is Reason.SYNC_PAUSES
    assert {g.reason for g in v.gpus} == {Reason.SYNC_PAUSES}


@pytest.mark.parametrize("gpm", [True, False])
def test_gpus_spinning_together_at_full_power_pause_where_gpm_reads(gpm: bool) -> None:
    """All four GPUs wait 8 s of every 30 s in a collective held up on the host (a rank's
    CPU-side checkpoint), at 100 % and full power.  Their SMs say they wait (GPM): the
    pauses, all GPUs together, are a sync stall.  Without GPM nothing tells the wait."""
    from gpumon.detect import Detector
    from gpumon.model import Snapshot

    working = square(30.0, 1 - 8 / 30)
    det = Detector()
    for k in range(1, 200):
        t = float(k)
        waits = working(t - 0.5) == 0.0
        pts = tuple((t - 1 + (j + 1) / 6, 100.0) for j in range(6))
        gpus = tuple(
            GpuSample(
                t,
                i,
                f"GPU-{i}",
                pts,
                power_watts=600.0,
                power_limit_watts=700.0,
                mem_used_bytes=20 * GIB,
                mem_total_bytes=80 * GIB,
                processes=(GpuProcess(100 + i),),
                sm_active_ratio=(0.15 if waits else 0.85) if gpm else None,
            )
            for i in range(4)
        )
        det.update(Snapshot(t, gpus))
    v = det.verdict()
    if gpm:
        assert v.state is State.SYNC_STALL, v
        assert {g.reason for g in v.gpus} <= {Reason.SYNC_PAUSES, Reason.BUSY_WAIT}, v
    else:
        assert v.state is State.HEALTHY, v


# --- the run summary rule -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "causes", "want"),
    [
        ({State.HEALTHY: 900, State.STARVED: 100}, {Cause.CPU: 100}, (State.STARVED, Cause.CPU)),
        ({State.HEALTHY: 950, State.STARVED: 50}, {Cause.CPU: 50}, (State.HEALTHY, None)),
        (
            {State.STARVED: 100, State.SYNC_STALL: 200, State.HEALTHY: 100},
            {},
            (State.SYNC_STALL, None),
        ),
        ({State.IDLE: 500, State.HEALTHY: 10}, {}, (State.HEALTHY, None)),  # start-up is not work
        ({State.IDLE: 300}, {}, (State.IDLE, None)),
        ({State.UNKNOWN: 30, State.IDLE: 10}, {}, (State.UNKNOWN, None)),
        ({}, {}, (State.UNKNOWN, None)),
    ],
)
def test_a_problem_is_the_verdict_once_it_takes_a_tenth_of_the_work(
    seconds: dict, causes: dict, want: tuple
) -> None:
    assert run_verdict(seconds, causes) == want
