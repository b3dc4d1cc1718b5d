"""The live judgments a user meets first, on data: warm-up, the run's end, and a summary
that adds up (issue "Live verdicts you can trust").

Ticks are synthetic and shaped as the live path makes them: a tick every 0.5 s carrying
the driver samples (1/6 s) since the previous one, judged by the live configuration.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import replace

import pytest

from gpumon.detect import Detector
from gpumon.detect.advice import advice_for, gil_prescription
from gpumon.detect.host import HostWindow, host_cause
from gpumon.detect.summary import AdviceWeights
from gpumon.engine import DetectorConfig, Session, analyze
from gpumon.model import (
    Advice,
    Cause,
    Episode,
    Evidence,
    GpuIdentity,
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
)

PERIOD = 1 / 6
T0 = 1000.0


def ticks(
    patterns: dict[int, Callable[[float], float]],
    seconds: float,
    *,
    tick_s: float = 0.5,
    period_s: float = PERIOD,
    power: Callable[[int, float], float] = lambda gpu, t: 400.0,
) -> list[Snapshot]:
    """Snapshots of GPUs whose driver samples follow ``patterns`` (time since start)."""
    out = []
    t, tp = T0, T0
    while t < T0 + seconds - 1e-9:
        t += tick_s
        times = []
        while tp + period_s <= t + 1e-9:
            tp += period_s
            times.append(tp)
        gpus = tuple(
            GpuSample(
                t,
                i,
                f"GPU-{i}",
                util_samples=tuple((x, f(x - T0)) for x in times),
                util_pct=f(t - T0),
                mem_used_bytes=20 << 30,
                mem_total_bytes=80 << 30,
                power_watts=power(i, t - T0),
                power_limit_watts=700.0,
                processes=(GpuProcess(100 + i),),
            )
            for i, f in patterns.items()
        )
        out.append(Snapshot(t, gpus, HostSample(t, cpu_pct=20.0)))
    return out


def live(n: int = 1) -> Session:
    gpus = tuple(GpuIdentity(i, f"GPU-{i}", power_limit_watts=700.0) for i in range(n))
    return Session.offline(TraceHeader(1, "gpumon", gpus=gpus), DetectorConfig(), live=True)


def shown(
    snaps: list[Snapshot], n: int = 1
) -> tuple[Session, list[tuple[float, State, Reason | None]]]:
    """What a live face shows of GPU 0 tick by tick: (seconds in, state, reason)."""
    s = live(n)
    seen = []
    for snap in snaps:
        s.fold(s.read(snap))
        v = s.verdict()
        assert v is not None
        g = v.gpus[0] if v.gpus else None
        seen.append((snap.t_s - T0, g.state if g else State.UNKNOWN, g.reason if g else None))
    return s, seen


def busy(x: float) -> float:
    return 95.0 + (x * 7919) % 4  # 95-99 %, never a gap


def test_a_gpu_busy_from_its_first_sample_is_healthy_within_3_s_and_never_idle() -> None:
    _, seen = shown(ticks({0: busy}, 12))
    assert all(state is not State.IDLE for _, state, _ in seen), seen
    first = next(t for t, state, _ in seen if state is State.HEALTHY)
    assert first <= 3.0, seen
    assert all(state is State.HEALTHY for t, state, _ in seen if t >= first)
    before = {(state, reason) for t, state, reason in seen if t < first}
    assert before <= {(State.UNKNOWN, None)}  # at most: no evaluation yet
    assert seen[-1][2] is None  # confirmed, no longer "judging"


def test_work_after_a_quiet_start_is_judged_never_idle_while_busy() -> None:
    _, seen = shown(ticks({0: lambda x: 0.0 if x < 5 else busy(x)}, 14))
    assert [s for t, s, _ in seen if t < 4.5] and all(
        s is State.IDLE or r is None for t, s, r in seen if t < 4.5
    )
    busy_idle = [(t, s, r) for t, s, r in seen if t >= 6.5 and s is State.IDLE]
    assert not busy_idle, busy_idle  # busy since 5 s: by the next eval never "idle"
    first = next(t for t, state, _ in seen if state is State.HEALTHY)
    assert first - 5.0 <= 3.5, seen


def test_a_gpu_being_judged_says_what_it_looks_like_so_far() -> None:
    s, _ = shown(ticks({0: lambda x: 100.0 if x % 1.0 < 0.3 else 0.0}, 5))
    v = s.verdict()
    assert v is not None and v.gpus[0].reason is Reason.JUDGING
    # Shown as what it looks like (a provisional state), the reason saying it is one.
    assert v.gpus[0].state is State.STARVED and v.state is State.STARVED
    assert v.gpus[0].note is not None and "so far" in v.gpus[0].note
    assert v.gpus[0].advice == ()  # advice waits for the verdict


def test_a_bursty_start_is_starved_once_judged_and_never_healthy_first() -> None:
    _, seen = shown(ticks({0: lambda x: 100.0 if x % 1.0 < 0.3 else 0.0}, 20))
    judged = [s for _, s, r in seen if r is not Reason.JUDGING and s is not State.UNKNOWN]
    assert judged and judged[0] is not State.HEALTHY
    assert seen[-1][1] is State.STARVED


def test_start_up_ends_where_work_begins_in_a_short_log() -> None:
    """Two GPUs at 0-70 % for 2 s, then 96-98 % for 6 s: healthy, not start-up throughout."""
    rng = random.Random(7)
    warm = lambda x: rng.random() * 70 if x < 2 else 96 + 2 * rng.random()  # noqa: E731
    res = analyze(
        TraceHeader(1, "nvidia-smi-csv"), ticks({0: warm, 1: warm}, 8, tick_s=0.2, period_s=0.2)
    )
    assert res.summary.verdict is State.HEALTHY
    assert res.summary.seconds[State.HEALTHY] >= 5.0
    assert res.verdict.state is State.HEALTHY  # "now" agrees with the verdict


def test_now_agrees_with_a_short_recordings_only_episode() -> None:
    """A 5 s recording of a bursting GPU: judged at its end, and 'now' says the same."""
    res = analyze(TraceHeader(1, "gpumon"), ticks({0: lambda x: 100.0 if x % 1 < 0.35 else 0.0}, 5))
    assert res.summary.verdict is State.STARVED
    assert res.verdict.state is State.STARVED
    assert res.verdict.gpus[0].state is State.STARVED


def test_per_gpu_lost_gpu_seconds_add_up_to_the_runs() -> None:
    starve = lambda x: 100.0 if x % 1.0 < 0.4 else 0.0  # noqa: E731
    s = live(2)
    for snap in ticks({0: busy, 1: starve}, 40):
        s.fold(s.read(snap))
    s.finish()
    run = s.summary()
    assert run is not None
    per = {g.gpu: g.lost_gpu_seconds for g in run.gpus}
    assert run.lost_gpu_seconds > 10
    assert sum(per.values()) == pytest.approx(run.lost_gpu_seconds, rel=1e-6)
    assert per[1] > 10 * max(per[0], 0.1)  # the starved GPU lost them
    assert all(g.off_bus_s == 0 for g in run.gpus)


# --- the summary's advice --------------------------------------------------------------------


def _episode(state: State, cause: Cause | None, advice: tuple[Advice, ...], secs: float) -> Episode:
    return Episode(
        gpu=0, uuid="GPU-0", state=state, cause=cause, start_s=0.0, end_s=secs, advice=advice
    )


def test_advice_says_each_lever_once_and_covers_every_cause_of_the_run() -> None:
    """The demo's run: starved on the CPU, then as long on the GIL; the CPU episodes' texts
    differ only in their numbers."""
    w = AdviceWeights()
    cpu = "data-loading workers are CPU-saturated during the gaps: raise num_workers to "
    pin = Advice(
        Lever.PINNING, "pin_memory=True and non_blocking=True copies let transfers overlap compute"
    )
    w.add(_episode(State.STARVED, Cause.CPU, (Advice(Lever.WORKERS, cpu + "~20"), pin), 60), 60)
    w.add(_episode(State.STARVED, Cause.CPU, (Advice(Lever.WORKERS, cpu + "~19"), pin), 20), 20)
    ev = {"duty_cycle": 0.3, "cpu_count": 16, "host_cpu_pct": 10.0}
    gil = advice_for(State.STARVED, Cause.GIL, ev)
    assert gil[0] == gil_prescription(ev) and "num_workers=4" in gil[0].text
    w.add(_episode(State.STARVED, Cause.GIL, gil, 75), 75)
    io = Advice(Lever.STORAGE, "storage does not keep up: cache it")
    w.add(_episode(State.STARVED, Cause.IO, (io, pin), 2), 2)
    advice = w.for_verdict(State.STARVED, Cause.CPU)
    # One per lever; io held too little to say.  The worker count is one lever whichever
    # cause named it (the GIL's wording held longest), so the run names one count.
    assert advice == (gil[0], gil[1], pin)
    assert [a.lever for a in advice] == [Lever.WORKERS, Lever.GIL, Lever.PINNING]
    assert len([a for a in advice if "num_workers" in a.text]) == 1


def test_a_run_starved_on_its_workers_then_on_its_main_process_is_told_of_both() -> None:
    """Saturated workers most of the run, then the loading in the main process (workers
    turned off): the one worker count is the CPU's wording (it held longer), and the GIL's
    own remedy still has its line -- before, both of its lines lost their levers to the
    CPU's and the summary never named the main process."""
    w = AdviceWeights()
    saturated = {"workers": 2.0, "workers_cpu_pct": 99.0, "duty_cycle": 0.3, "cpu_count": 16,
                 "host_cpu_pct": 20.0}  # fmt: skip
    alone = {"duty_cycle": 0.3, "cpu_count": 16, "host_cpu_pct": 10.0}
    cpu = advice_for(State.STARVED, Cause.CPU, saturated)
    gil = advice_for(State.STARVED, Cause.GIL, alone)
    w.add(_episode(State.STARVED, Cause.CPU, cpu, 60), 60)
    w.add(_episode(State.STARVED, Cause.GIL, gil, 30), 30)
    advice = w.for_verdict(State.STARVED, Cause.CPU)
    levers = [a.lever for a in advice]
    assert len(levers) == len(set(levers))  # each lever once
    (workers,) = [a for a in advice if a.lever is Lever.WORKERS]
    assert workers == cpu[0] and "from 2 to" in workers.text  # one count: the CPU's
    assert [a.lever for a in advice if "main process" in a.text] == [Lever.GIL]


# --- causes: the job's own, and hysteresis ---------------------------------------------------

CFG = DetectorConfig()


def window(**kw: float) -> HostWindow:
    return kw  # type: ignore[return-value]


def test_a_saturated_host_with_the_jobs_tree_asleep_is_not_the_jobs_cpu() -> None:
    """The user's case: the job's processes at 2 % and asleep, no workers, every core busy
    with processes outside the job: the job does not ask for the CPU, so neither its CPU
    nor contention is what it waits on (a remote source, a lock): say so, and never
    "raise num_workers"."""
    h = window(host_cpu_pct=99.0, main_cpu_pct=2.0, workers=0.0, tree_cpu_pct=2.0,
               tree_runnable=0.0)  # fmt: skip
    assert host_cause(h, CFG, None, cpu_count=16) is Cause.UNKNOWN
    ev = Evidence(host_cpu_pct=99.0, tree_cpu_pct=2.0, outside_cpu_pct=1582.0, cpu_count=16)
    advice = advice_for(State.STARVED, Cause.UNKNOWN, ev, None, True)
    assert any("the job's processes sleep while the GPU waits" in a.text for a in advice), advice
    assert not any("num_workers" in a.text or "more DataLoader workers" in a.text for a in advice)


def test_a_job_held_back_by_processes_outside_it_is_contention() -> None:
    """The job's processes runnable (or using a share of a core) on a host others fill:
    contention, with the outsiders counted and named, never "raise num_workers"."""
    for h in (
        window(host_cpu_pct=99.0, main_cpu_pct=30.0, workers=2.0, workers_cpu_pct=20.0,
               tree_cpu_pct=70.0, tree_runnable=2.5),
        window(host_cpu_pct=99.0, main_cpu_pct=3.0, workers=2.0, workers_cpu_pct=2.0,
               tree_cpu_pct=7.0, tree_runnable=1.0),  # runnable, and barely run
    ):  # fmt: skip
        assert host_cause(h, CFG, None, cpu_count=16) is Cause.CONTENTION
    ev = Evidence(host_cpu_pct=99.0, tree_cpu_pct=70.0, outside_cpu_pct=1514.0, cpu_count=16)
    advice = advice_for(State.STARVED, Cause.CONTENTION, ev, None, True)
    assert "processes outside the job" in advice[0].text and "15.1 cores" in advice[0].text
    assert not any("raise num_workers" in a.text for a in advice)


def test_the_cpu_is_the_jobs_when_its_workers_or_the_job_fill_the_host() -> None:
    workers = window(host_cpu_pct=99.0, main_cpu_pct=20.0, workers=8.0, workers_cpu_pct=97.0,
                     tree_cpu_pct=796.0)  # fmt: skip
    assert host_cause(workers, CFG, None, cpu_count=16) is Cause.CPU
    # 16 workers on 8 cores, each at ~50 %: none saturated, the job fills the host.
    crowded = window(host_cpu_pct=98.0, main_cpu_pct=20.0, workers=16.0, workers_cpu_pct=48.0,
                     tree_cpu_pct=788.0)  # fmt: skip
    assert host_cause(crowded, CFG, None, cpu_count=8) is Cause.CPU
    # A log with host CPU only (no tree): a saturated host is taken as the job's.
    assert host_cause(window(host_cpu_pct=97.0), CFG, None, cpu_count=8) is Cause.CPU


def test_a_cause_holds_until_its_sign_falls_well_below_its_line() -> None:
    h = window(host_cpu_pct=60.0, main_cpu_pct=10.0, workers=4.0, workers_cpu_pct=70.0,
               tree_cpu_pct=290.0)  # fmt: skip
    assert host_cause(h, CFG, None, cpu_count=8) is Cause.UNKNOWN  # below the 80 % line
    assert host_cause(h, CFG, Cause.CPU, cpu_count=8) is Cause.CPU  # above 64 %: holds
    low = window(host_cpu_pct=50.0, main_cpu_pct=10.0, workers=4.0, workers_cpu_pct=60.0,
                 tree_cpu_pct=250.0)  # fmt: skip
    assert host_cause(low, CFG, Cause.CPU, cpu_count=8) is Cause.UNKNOWN  # released


def test_a_steady_starved_job_near_the_line_changes_cause_at_most_once() -> None:
    """Workers' CPU wandering 72-88 % around the 80 % line for 6 minutes: one steady phase,
    one cause (the daemon flapped cpu <-> unknown 21 times in 6.4 minutes)."""
    rng = random.Random(3)
    snaps = ticks({0: lambda x: 100.0 if x % 1.0 < 0.35 else 0.0}, 380)
    det = Detector(CFG, (GpuIdentity(0, "GPU-0", power_limit_watts=700.0),))
    starts = []
    for snap in snaps:
        cpu = 80.0 + 8.0 * math.sin(snap.t_s / 7.0) + rng.uniform(-2, 2)
        tree = ProcTreeSample(
            snap.t_s,
            10,
            (
                ProcessSample(10, 1, "python", 15.0, 10, 0.0, 0.0, "sleeping"),
                *(
                    ProcessSample(11 + k, 10, "pt_data_worker", cpu, 2, 0.0, 0.0, "running")
                    for k in range(4)
                ),
            ),
        )
        host = HostSample(snap.t_s, cpu_pct_per_core=(60.0,) * 8, cpu_pct=60.0, iowait_pct=1.0)
        upd = det.update(Snapshot(snap.t_s, snap.gpus, host, tree))
        starts += [e for e in upd.opened if e.gpu == 0 and e.state is State.STARVED]
    causes = [e.cause for e in starts]
    changes = sum(1 for a, b in itertools.pairwise(causes) if a != b)
    assert causes and changes <= 1, causes


def test_a_short_coarse_log_is_judged_on_what_it_shows_and_says_how_sure() -> None:
    """8 dmon samples at 1 s, 30-95 % (mean 65 %) with one dip: a GPU working below its
    capacity, on too few samples to be sure; a flat 5 % could be small work: unknown."""

    def log(values: list[float]) -> list[Snapshot]:
        return [
            Snapshot(T0 + i, (GpuSample(T0 + i, 0, "GPU-0", ((T0 + i, v),), util_pct=v),))
            for i, v in enumerate(values)
        ]

    res = analyze(TraceHeader(1, "dmon"), log([30, 62, 88, 95, 12, 70, 81, 84]))
    assert res.summary.verdict is State.STARVED and res.verdict.state is State.STARVED
    assert any("too few to be sure" in n for n in res.summary.notes), res.summary.notes
    flat = analyze(TraceHeader(1, "dmon"), log([5, 6, 5, 4, 5, 6, 5, 5]))
    assert flat.summary.verdict is State.UNKNOWN


def test_work_that_begins_with_its_memory_is_not_taken_for_a_warm_up() -> None:
    """nvidia-smi once a minute: GPU 0's job allocates 1.5 GB and works at 11-16 % from its
    second sample on.  The memory came with the work's first sample, so it is no warm-up
    still filling memory (read before the samples: the work began with it)."""
    snaps = []
    for k, u in enumerate((0.0, 11.0, 16.0, 13.0)):
        t = T0 + 60 * k
        mem = (1 << 20) if k == 0 else 1527 << 20
        g = GpuSample(t, 0, "GPU-0", ((t, u),), util_pct=u, mem_used_bytes=mem)
        snaps.append(Snapshot(t, (g,)))
    res = analyze(TraceHeader(1, "nvidia-smi-csv"), snaps)
    assert res.summary.verdict is State.STARVED, res.summary


def test_a_short_log_of_nothing_but_idleness_is_idle() -> None:
    """Nine nvidia-smi tables in one second, 0 % with 1.6 GB held (a job starting, or
    stuck): idle with memory held, judged on all the log shows, not 'unknown'."""
    snaps = [
        Snapshot(
            T0 + k / 8,
            (GpuSample(T0 + k / 8, 0, "GPU-0", ((T0 + k / 8, 0.0),), util_pct=0.0,
                       mem_used_bytes=1638 << 20, mem_total_bytes=6 << 30),),
        )
        for k in range(9)
    ]  # fmt: skip
    res = analyze(TraceHeader(1, "nvidia-smi-table"), snaps)
    assert res.summary.verdict is State.IDLE
    assert res.summary.gpus[0].seconds[State.IDLE] > 0.9


# --- warm-up memory, the cause's window, peers spinning part of each step -------------------


def _csv_log(values: list[tuple[float, int]]) -> list[Snapshot]:
    """An nvidia-smi CSV log at 1 s: (utilisation %, memory MiB) per row."""
    return [
        Snapshot(
            T0 + k,
            (GpuSample(T0 + k, 0, "GPU-0", ((T0 + k, u),), util_pct=u,
                       mem_used_bytes=mib << 20, mem_total_bytes=24 << 30),),
        )
        for k, (u, mib) in enumerate(values)
    ]  # fmt: skip


def test_a_job_still_filling_its_memory_is_warming_up_until_it_stops() -> None:
    """A minute idle, then work at 50-75 % while memory climbs 1.5 -> 3.2 GB a second at a
    time, to the log's end: a job warming up (its summary: start-up, idle), never judged on
    the climb.  The same work with its memory allocated in one go is judged at once."""
    idle = [(0.0, 1)] * 60
    work = [77.0, 57.0, 65.0, 76.0, 69.0, 47.0, 70.0]
    climbing = analyze(
        TraceHeader(1, "nvidia-smi-csv"),
        _csv_log(idle + [(u, 1466 + 300 * k) for k, u in enumerate(work)]),
    )
    assert climbing.summary.verdict is State.IDLE, climbing.summary
    assert climbing.summary.gpus[0].seconds[State.HEALTHY] == 0
    at_once = analyze(TraceHeader(1, "nvidia-smi-csv"), _csv_log(idle + [(u, 3210) for u in work]))
    assert at_once.summary.verdict is not State.IDLE, at_once.summary


def _tree(t: float, main: float, workers: float) -> ProcTreeSample:
    return ProcTreeSample(
        t,
        10,
        (
            ProcessSample(10, 1, "python", main, 10, 0.0, 0.0, "running"),
            *(
                ProcessSample(11 + k, 10, "pt_data_worker", workers, 2, 0.0, 0.0, "running")
                for k in range(4)
            ),
        ),
    )


def _starved_with(
    host: Callable[[float], tuple[float, float]],
    seconds: float,
    *,
    cycle_s: float = 1.0,
    tick_s: float = 0.5,
    config: DetectorConfig = CFG,
) -> tuple[Detector, list[tuple[float, Episode]]]:
    """A GPU starved throughout (35 % duty, in cycles of ``cycle_s``) while the job's main
    process and its four workers use ``host(seconds in)`` % of a core each: the detector,
    and the starved episodes it opened (when, the episode), in order."""
    det = Detector(config, (GpuIdentity(0, "GPU-0", power_limit_watts=700.0),))
    opened: list[tuple[float, Episode]] = []
    starve = lambda x: 100.0 if x % cycle_s < 0.35 * cycle_s else 0.0  # noqa: E731
    for snap in ticks({0: starve}, seconds, tick_s=tick_s):
        main, workers = host(snap.t_s - T0)
        h = HostSample(snap.t_s, cpu_pct_per_core=(30.0,) * 16, cpu_pct=30.0, iowait_pct=1.0)
        upd = det.update(Snapshot(snap.t_s, snap.gpus, h, _tree(snap.t_s, main, workers)))
        opened += [
            (snap.t_s - T0, e) for e in upd.opened if e.gpu == 0 and e.state is State.STARVED
        ]
    return det, opened


@pytest.mark.parametrize("cycle_s", [1.0, 8.0])
def test_a_cause_follows_the_host_within_seconds_of_its_change(cycle_s: float) -> None:
    """Two minutes starved on saturated workers, then on a main process pinned at one core
    with its workers idle: the cause is read over the latest waits, so it turns to the GIL
    within seconds, and the change is placed where it happened -- not a window of the GPU's
    rhythm back (the summary gave an 8 s rhythm's CPU phase 100 s to the GIL)."""
    _, opened = _starved_with(
        lambda x: (30.0, 97.0) if x < 120 else (99.0, 1.0), 170, cycle_s=cycle_s
    )
    seen = [(round(at), e.cause, round(e.start_s - T0)) for at, e in opened]
    judged = [e for _, e in opened if e.reason is not Reason.JUDGING]
    assert judged[0].cause is Cause.CPU, seen
    gil = [(at, e) for at, e in opened if e.cause is Cause.GIL]
    assert gil and gil[0][0] - 120 <= 10.0, seen
    assert 115 <= gil[0][1].start_s - T0 <= 125, seen


def _pinned(level: Callable[[int], float], *, gpm: bool) -> Detector:
    """Four GPUs pinned at 97-99 % for 40 s, GPU ``i`` computing at ``level(i)`` (0-1): its
    SM activity where ``gpm``, else its share of 700 W."""
    det = Detector(
        CFG, tuple(GpuIdentity(i, f"GPU-{i}", power_limit_watts=700.0) for i in range(4))
    )
    for snap in ticks(dict.fromkeys(range(4), busy), 40, power=lambda i, t: 700.0 * level(i)):
        gpus = tuple(
            replace(g, power_watts=None, sm_active_ratio=level(g.gpu)) if gpm else g
            for g in snap.gpus
        )
        det.update(Snapshot(snap.t_s, gpus, snap.host))
    return det


@pytest.mark.parametrize("gpm", [True, False])
def test_peers_that_spin_for_part_of_each_step_name_the_gpu_they_wait_on(gpm: bool) -> None:
    """Data-parallel ranks all read pinned (a spinning collective reads busy), but three
    compute at half of what GPU 2 does: they spend the rest of each step waiting on it.
    Told by SM activity, or by power on a card without GPM; equal peers stay healthy."""
    det = _pinned(lambda i: 0.85 if i == 2 else 0.4, gpm=gpm)
    eps = det.open_episodes()
    assert eps[2].state is State.SYNC_STALL and eps[2].reason is Reason.STRAGGLER, eps[2]
    for i in (0, 1, 3):
        assert eps[i].state is State.SYNC_STALL and eps[i].reason is Reason.BUSY_WAIT, eps[i]
    even = _pinned(lambda i: 0.8 if i == 2 else 0.72, gpm=gpm).open_episodes()
    assert {even[i].state for i in range(4)} == {State.HEALTHY}, even


def _opened_after_idle(level: Callable[[int], float], tick_s: float, gpm: bool) -> dict:
    """Four GPUs idle 3.3 s, then pinned, GPU ``i`` computing at ``level(i)``: when (from the
    work's start) each state first opened on GPU 0."""
    start = 3.3
    det = Detector(
        CFG, tuple(GpuIdentity(i, f"GPU-{i}", power_limit_watts=700.0) for i in range(4))
    )

    def at(i: int, x: float) -> float:
        return level(i) if x >= start else 0.0

    opened: dict = {}
    work = dict.fromkeys(range(4), lambda x: 100.0 if x >= start else 0.0)
    for snap in ticks(work, 15, tick_s=tick_s, power=lambda i, x: 60 + 640 * at(i, x)):
        x = snap.t_s - T0
        gpus = tuple(
            replace(g, power_watts=None, sm_active_ratio=at(g.gpu, x)) if gpm else g
            for g in snap.gpus
        )
        for e in det.update(Snapshot(snap.t_s, gpus, snap.host)).opened:
            if e.gpu == 0:
                opened.setdefault((e.state, e.reason), x - start)
    return opened


@pytest.mark.parametrize("tick_s", [0.5, 1.0], ids=["watch", "serve"])
def test_peers_spinning_on_one_gpu_from_the_start_of_work_are_found_within_4_s(
    tick_s: float,
) -> None:
    """The ranks start after a few idle seconds and spin on GPU 2 from their first step:
    their windows, aligned to evals, reach back into the idle before the work, so a rule
    asking for 90 % over them waited until they no longer did (4.7-5.2 s); an unbroken
    busy run with SM activity read is pinned, and a clear case is confirmed at the next
    eval even while the first judgment is pending."""
    opened = _opened_after_idle(lambda i: 0.85 if i == 2 else 0.4, tick_s, gpm=True)
    assert opened.get((State.SYNC_STALL, Reason.BUSY_WAIT), 99.0) <= 4.0, opened
    # Peers computing alike (no one waits) stay healthy from the same start.
    even = _opened_after_idle(lambda i: 0.8 if i == 2 else 0.72, tick_s, gpm=True)
    assert {s for s, _ in even} <= {State.IDLE, State.HEALTHY}, even
    # Without SM activity, power still tells it, a few seconds later (the idle in a
    # window would lower a spinning GPU's mean power: no shortcut taken on it).
    power = _opened_after_idle(lambda i: 0.85 if i == 2 else 0.4, tick_s, gpm=False)
    assert power.get((State.SYNC_STALL, Reason.BUSY_WAIT), 99.0) <= 6.0, power


def test_gpus_held_by_no_one_are_idle_from_a_short_logs_first_table() -> None:
    """Two nvidia-smi tables 14 s apart (a pasted pair): six GPUs at 0 % with 7 MiB (no
    context: held by no one), one holding 5.7 GB at 0 %, one at 3-7 %.  The GPUs no one holds
    were idle since the first table, not from the second: the log is an idle node."""

    def table(t: float, k: int) -> Snapshot:
        gpus = []
        for i in range(8):
            mib, u = (5729, 0.0) if i == 0 else (2415, (3.0, 7.0)[k]) if i == 5 else (7, 0.0)
            gpus.append(GpuSample(t, i, f"GPU-{i}", ((t, u),), util_pct=u,
                                  mem_used_bytes=mib << 20, mem_total_bytes=80 << 30,
                                  power_watts=70.0, power_limit_watts=400.0))  # fmt: skip
        return Snapshot(t, tuple(gpus))

    res = analyze(TraceHeader(1, "nvidia-smi-table"), [table(T0, 0), table(T0 + 14, 1)])
    free = [g for g in res.summary.gpus if g.gpu not in (0, 5)]
    assert all(g.seconds[State.IDLE] == pytest.approx(14.0) for g in free), free
    assert res.summary.verdict is State.IDLE, res.summary


@pytest.mark.parametrize(
    "change_s, cycle_s, duty", [(40.7, 1, 0.35), (41.3, 2, 0.5), (43.6, 4, 0.6)]
)
def test_analyze_of_a_recording_tells_the_live_summarys_story(
    change_s: float, cycle_s: float, duty: float
) -> None:
    """A GPU healthy for 40-odd s, then starved: the change comes after a calm stretch.
    Analyze of the recording judges at the live cadence, so it places the change where the
    live detector did, to the second (judging calm stretches every fifth second offline put
    it up to 3 s off, and watch's summary and analyze of its recording disagreed)."""

    def starve(x: float) -> float:
        return busy(x) if x < change_s or x % cycle_s < duty * cycle_s else 0.0

    snaps = ticks({0: starve}, 80)
    s = live()
    for snap in snaps:
        s.fold(s.read(snap))
    s.finish()
    live_run = s.summary()
    assert live_run is not None
    offline = analyze(TraceHeader(1, "gpumon"), snaps).summary
    for state in (State.HEALTHY, State.STARVED):
        assert offline.seconds[state] == pytest.approx(live_run.seconds[state], abs=0.01), (
            state,
            offline.seconds,
            live_run.seconds,
        )


def test_offline_judging_places_a_process_arriving_where_live_does() -> None:
    """A job works for 20 s and exits; its GPU idles, held by no one, until (at 61.3 s) a
    process allocates on it and does not work yet: idle, memory held.  Offline skips evals
    only while nothing changes, and a process arriving is a change: the new reason begins
    where the live detector puts it."""

    def starts(cfg: DetectorConfig) -> list[tuple[Reason | None, float]]:
        det = Detector(cfg, (GpuIdentity(0, "GPU-0", power_limit_watts=700.0),))
        out = []
        for snap in ticks({0: lambda x: busy(x) if x < 20 else 0.0}, 90):
            x = snap.t_s - T0
            held = x < 20 or x >= 61.3
            g = replace(snap.gpus[0], processes=(GpuProcess(100),) if held else (),
                        mem_used_bytes=(20 << 30) if held else (3 << 20))  # fmt: skip
            upd = det.update(Snapshot(snap.t_s, (g,), snap.host))
            out += [(e.reason, round(e.start_s - T0, 2)) for e in upd.opened if e.gpu == 0]
        return out

    live_starts = starts(DetectorConfig())
    held = [at for reason, at in live_starts if reason is Reason.MEMORY_HELD]
    assert held and 61.3 <= held[0] <= 64.0, live_starts
    assert starts(DetectorConfig(calm_factor=5.0)) == live_starts
