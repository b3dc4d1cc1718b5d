"""The replay stand-ins: timing at a speed, re-based times, merged ticks, the run's end."""

from __future__ import annotations

import gzip
import itertools
import threading
import time
from pathlib import Path

import pytest

from gpumon.engine import Session
from gpumon.loop import paced
from gpumon.model import (
    GpuIdentity,
    GpuProcess,
    GpuSample,
    HostSample,
    ProcessSample,
    ProcTreeSample,
    Snapshot,
    TraceHeader,
    UtilPoint,
)
from gpumon.sample.replay import Replay
from gpumon.traces.jsonl import FORMAT_VERSION, TraceReader, TraceWriter

T0 = 5000.0  # the recording's own monotonic clock: far from this process's
PID = 4242


def _snapshots(seconds: int, *, gpus: int = 2, period: float = 1 / 6) -> list[Snapshot]:
    """One tick a second; GPU g's driver points say util = 10 * tick + g (recognisable)."""
    out = []
    per_tick = round(1 / period)
    for i in range(1, seconds + 1):
        t = T0 + i
        samples = []
        for g in range(gpus):
            points = tuple(
                UtilPoint(t - 1 + (k + 1) * period, float(10 * i + g)) for k in range(per_tick)
            )
            samples.append(
                GpuSample(
                    t_s=t,
                    gpu=g,
                    uuid=f"GPU-{g}",
                    util_samples=points,
                    util_pct=float(10 * i),
                    power_watts=100.0 + i,
                    processes=(GpuProcess(pid=PID),),
                )
            )
        host = HostSample(t_s=t, cpu_pct=float(i), cpu_pct_per_core=(float(i), 2.0 * i))
        tree = ProcTreeSample(
            t_s=t,
            root_pid=PID,
            processes=(ProcessSample(PID, 1, "python", float(i), 4, 0.0, 0.0, "running"),),
        )
        out.append(Snapshot(t_s=t, gpus=tuple(samples), host=host, tree=tree))
    return out


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_times_are_rebased_onto_the_live_clock_without_scaling() -> None:
    clock = FakeClock()
    replay = Replay(_snapshots(10), speed=4.0, clock=clock)
    clock.t += 0.3  # 1.2 trace seconds at speed 4: the ticks at T0+1 and T0+2 are due
    snap = replay.advance()
    gpus = snap.gpus
    # The first tick (T0+1) plays at live_start; stream time = live clock + trace offset.
    assert replay.live_start_s == 100.0
    assert gpus[0].t_s == pytest.approx(101.0)  # T0+2 re-based: 100 + (2 - 1)
    points = gpus[0].util_samples
    assert len(points) == 12  # both ticks' driver points, none lost
    assert points[0][0] == pytest.approx(100.0 - 1 + 1 / 6)
    assert points[-1][0] == pytest.approx(101.0)
    assert [u for _, u in points[:6]] == [10.0] * 6
    assert [u for _, u in points[6:]] == [20.0] * 6
    assert all(a[0] < b[0] for a, b in itertools.pairwise(points))
    # Host and tree belong to the same merged tick, averaged over its two recorded ticks.
    h = snap.host
    assert h is not None and h.t_s == gpus[0].t_s
    assert h.cpu_pct == pytest.approx(1.5)
    assert h.cpu_pct_per_core == pytest.approx((1.5, 3.0))
    tr = snap.tree
    assert tr is not None and tr.t_s == gpus[0].t_s and tr.root_pid == PID and tr.root_alive
    assert tr.processes[0].cpu_pct == pytest.approx(1.5)
    assert replay.now() == pytest.approx(101.2)
    assert replay.played_s == pytest.approx(1.0)  # up to the last tick handed out


def test_a_tick_with_nothing_due_keeps_readings_and_moves_on() -> None:
    clock = FakeClock()
    replay = Replay(_snapshots(5), speed=1.0, clock=clock)
    first = replay.advance().gpus
    clock.t += 0.4
    again = replay.advance().gpus
    assert again[0].util_samples == ()  # the driver buffer had nothing new
    assert again[0].power_watts == first[0].power_watts
    assert again[0].t_s == pytest.approx(100.4) and again[0].t_s > first[0].t_s


def test_the_watched_root_exits_on_the_tick_after_the_last_recorded_one() -> None:
    clock = FakeClock()
    replay = Replay(_snapshots(3), speed=1.0, clock=clock)
    clock.t += 10
    last = replay.advance()
    assert last.tree is not None and last.tree.root_alive and not replay.finished
    assert replay.ticks_replayed == 3
    clock.t += 1
    gone = replay.advance()
    assert gone.tree is not None and not gone.tree.root_alive and replay.finished
    assert gone.gpus[0].processes == ()


def test_a_replay_session_ticks_like_a_live_one_and_judges_every_recorded_tick() -> None:
    header = TraceHeader(
        version=FORMAT_VERSION,
        source="test",
        driver_version="555.42",
        watched_pid=PID,
        command=("python", "train.py"),
        gpus=(GpuIdentity(0, "GPU-0", name="A"), GpuIdentity(1, "GPU-1", name="B")),
    )
    session = Session.replay(header, _snapshots(4), speed=1000.0)
    assert session.gpus == header.gpus and session.driver_version == "555.42"
    assert session.command == ("python", "train.py") and session.root_pid == PID
    time.sleep(0.01)  # 10 trace seconds: everything is due
    tick = session.tick()
    snap = tick.snapshot
    assert [g.uuid for g in snap.gpus] == ["GPU-0", "GPU-1"]
    assert snap.host is not None and snap.tree is not None
    assert snap.t_s == snap.host.t_s == snap.tree.t_s == snap.gpus[1].t_s
    assert len(snap.gpus[1].util_samples) == 24
    # The detector saw the four recorded ticks one by one, not one merged tick.
    assert session.detector is not None and session.detector.gpu_totals()[1].samples == 24
    assert session.tree_gpu_uuids == {"GPU-0", "GPU-1"}


def test_speed_10_plays_a_10_second_trace_in_about_a_second() -> None:
    snaps = _snapshots(11)  # ticks at T0+1 .. T0+11: 10 s of trace
    session = Session.replay(TraceHeader(FORMAT_VERSION, "test"), snaps, speed=10.0)
    started = time.monotonic()
    seen_points = 0
    times = []
    stop = threading.Event()
    for _ in paced(0.05, stop, duration_s=5.0):
        tick = session.tick()
        times.append(tick.snapshot.t_s)
        seen_points += len(tick.snapshot.gpus[0].util_samples)
        if not tick.snapshot.tree.root_alive:
            break
    elapsed = time.monotonic() - started
    assert 0.9 <= elapsed <= 1.6, elapsed
    assert seen_points == 11 * 6  # every recorded driver point, exactly once
    assert all(a <= b for a, b in itertools.pairwise(times))
    # Stream time advanced by the trace's own 10 s, not by the 1 s of wall time.
    assert times[-2] - times[0] == pytest.approx(10.0, abs=0.6)


def test_speed_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Replay(_snapshots(2), speed=0)
    with pytest.raises(ValueError):
        Replay([], speed=1)


@pytest.mark.parametrize("compress", [False, True])
def test_trace_files_plain_or_gzip(tmp_path: Path, compress: bool) -> None:
    header = TraceHeader(version=FORMAT_VERSION, source="test", interval_s=1.0)
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path, header) as w:
        for i, s in enumerate(_snapshots(4)):
            if i == 2:
                w.write_event(s.t_s, "phase", name="starved-cpu")
            w.write(s)
    if compress:
        data = path.read_bytes()
        path = tmp_path / "t.jsonl.gz"
        path.write_bytes(gzip.compress(data))
    trace = TraceReader(path)
    assert trace.header.source == "test"
    snaps = list(trace)
    assert snaps == _snapshots(4)
    assert trace.events == [{"t": T0 + 3, "event": "phase", "name": "starved-cpu"}]
