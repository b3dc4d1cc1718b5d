"""`gpumon watch` rendering and summary on hand-built data: no NVML, no processes, no clock."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import termios
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from rich.screen import Screen
from rich.text import Text

from gpumon.detect import DetectorUpdate, RunSummary
from gpumon.engine import RunMemory
from gpumon.engine.words import evidence_items
from gpumon.faces.watch.keys import KeyReader, ViewControls, parse_keys
from gpumon.faces.watch.layout import LiveView
from gpumon.faces.watch.summary import EXIT_FAIL_ON, GpuLine, Summary, parse_states
from gpumon.faces.watch.view import HOLE, WatchState, plain_line, tick_duty, timeline
from gpumon.model import (
    Advice,
    Cause,
    GpuIdentity,
    GpuProcess,
    GpuSample,
    GpuVerdict,
    HostSample,
    Lever,
    ProcessSample,
    ProcTreeSample,
    Snapshot,
    State,
    UtilPoint,
    Verdict,
)

UUID = "GPU-1234"


def feed(
    st: WatchState, snap: Snapshot, verdict: Verdict | None, invisible_gpu_pids: object = ()
) -> None:
    """A tick as the watch loop folds it: into the run's memory (the session's, here one
    of the test's own), then what the view shows of it."""
    if st.memory is None:
        st.memory = RunMemory(st.identities, dict, live=True)
    st.memory.after(snap, DetectorUpdate())
    st.feed(snap, verdict, invisible_gpu_pids)  # type: ignore[arg-type]


ADVICE = (
    Advice(Lever.WORKERS, "raise num_workers (now 2 on 8 cores)"),
    Advice(Lever.PINNING, "pin_memory=True"),
)


def burst_points(t0: float, n: int, period: float = 1 / 6) -> tuple[UtilPoint, ...]:
    """Two busy samples then four idle ones: a 1 s burst/gap cycle."""
    return tuple(UtilPoint(t0 + i * period, 100.0 if i % 6 < 2 else 0.0) for i in range(n))


def snapshot(t: float = 10.0, points: tuple[UtilPoint, ...] | None = None) -> Snapshot:
    g = GpuSample(
        t_s=t,
        gpu=0,
        uuid=UUID,
        util_samples=burst_points(t - 3, 18) if points is None else points,
        util_pct=33.0,
        mem_used_bytes=20 * 2**30,
        mem_total_bytes=80 * 2**30,
        power_watts=250.0,
        power_limit_watts=700.0,
        temperature_c=41.0,
        processes=(GpuProcess(pid=101, used_mem_bytes=2**30),),
    )
    tree = ProcTreeSample(
        t_s=t,
        root_pid=100,
        processes=(
            ProcessSample(100, 1, "python", 12.0, 30, 0.0, 0.0, "sleeping"),
            ProcessSample(101, 100, "pt_data_worker", 98.0, 4, 5e6, 0.0, "running"),
            ProcessSample(102, 100, "pt_data_worker", 97.0, 4, 4e6, 0.0, "running"),
        ),
    )
    host = HostSample(
        t_s=t, cpu_pct=96.0, iowait_pct=0.5, load_1m=7.9, cpu_pct_per_core=(96.0,) * 8
    )
    return Snapshot(t_s=t, gpus=(g,), host=host, tree=tree)


def starved_verdict(t: float = 10.0) -> Verdict:
    ev = {
        "duty_cycle": 0.31,
        "burst_p50_s": 0.33,
        "gap_p50_s": 0.67,
        "period_s": 1.0,
        "workers_cpu_pct": 97.5,
        "workers": 2,
        "main_cpu_pct": 12.0,
        "samples": 60,
        "window_s": 8.0,
        "some_new_key": 1.5,
    }
    gv = GpuVerdict(
        gpu=0,
        uuid=UUID,
        state=State.STARVED,
        cause=Cause.CPU,
        since_s=4.0,
        evidence=ev,
        advice=ADVICE,
    )
    return Verdict(
        t_s=t,
        state=State.STARVED,
        cause=Cause.CPU,
        gpus=(gv,),
        evidence={"effective_gpus": 0.31},
        advice=ADVICE,
    )


def state_with(verdict: Verdict | None, snap: Snapshot | None = None) -> WatchState:
    st = WatchState(
        pid=100,
        command=("python", "train.py"),
        identities=(GpuIdentity(0, UUID, "Fake H100", None, 80 * 2**30, 700.0),),
        started_mono_s=0.0,
    )
    feed(st, snap or snapshot(), verdict)
    return st


def screen(
    st: WatchState, width: int = 110, height: int = 60, controls: ViewControls | None = None
) -> str:
    return "\n".join(screen_lines(st, width, height, controls))


def screen_lines(
    st: WatchState, width: int, height: int, controls: ViewControls | None = None
) -> list[str]:
    """What a terminal of ``width`` x ``height`` shows, through rich as the live view draws."""
    console = Console(
        width=width,
        height=height,
        record=True,
        force_terminal=True,
        color_system="truecolor",
        file=io.StringIO(),
        legacy_windows=False,
    )
    console.print(Screen(LiveView(st, controls)))
    return console.export_text().split("\n")[:height]


def many_gpus(n: int, t: float = 10.0) -> WatchState:
    """``n`` starved GPUs with a minute of driver samples each (the view's full history)."""
    snap = snapshot(t)
    gpus = tuple(
        GpuSample(
            t_s=t,
            gpu=i,
            uuid=f"GPU-{i}",
            util_samples=burst_points(t - 60, 360),
            util_pct=40.0,
            mem_used_bytes=2**34,
            mem_total_bytes=80 * 2**30,
            power_watts=133.0 + i,
            power_limit_watts=700.0,
        )
        for i in range(n)
    )
    v = starved_verdict(t)
    g0 = v.gpus[0]
    per_gpu = tuple(
        replace(g0, gpu=i, uuid=f"GPU-{i}", evidence={**g0.evidence, "power_watts": 133.0 + i})
        for i in range(n)
    )
    st = WatchState(pid=100, command=("python", "train.py", "--lr", "3e-4"), started_mono_s=0.0)
    feed(st, Snapshot(t_s=t, gpus=gpus, host=snap.host, tree=snap.tree), replace(v, gpus=per_gpu))
    return st


# --- the full-screen view ------------------------------------------------------------------


def test_view_shows_timeline_memory_power_tree_state_evidence_and_advice() -> None:
    text = screen(state_with(starved_verdict()))
    assert "state: starved  cause: cpu" in text.splitlines()[0]  # the top line
    assert "for 6.0s" in text  # since the episode began (t 10 - since 4)
    assert "duty cycle 31%" in text and "gap p50 670ms" in text and "CPU per worker 98%" in text
    assert "some new key 1.5" in text  # evidence the view has no label for still shows
    assert "samples 60" not in text and "window" not in text  # bookkeeping is not evidence
    assert "advice • raise num_workers (now 2 on 8 cores)" in text
    row = next(line for line in text.splitlines() if line.startswith("GPU 0 "))
    assert "starved/cpu" in row and "██▁▁▁▁██▁▁▁▁██▁▁▁▁" in row  # a character per sample
    assert "20.0 GiB / 80.0 GiB" in text and "250 W / 700 W" in text  # the GPU's details
    assert "main" in text and "worker+GPU" in text and "pt_data_worker" in text
    assert "host CPU 96%" in text and "iowait 0.5%" in text
    # Busiest worker first after the main process.
    assert text.index(" 101 ") < text.index(" 102 ")
    assert "? help" in text.splitlines()[-1] and "q quit" in text.splitlines()[-1]


def test_view_before_the_run_uses_a_gpu_says_waiting() -> None:
    st = WatchState(pid=100, command=None, identities=(GpuIdentity(0, UUID),), started_mono_s=0)
    feed(st, Snapshot(t_s=1.0, gpus=(), tree=snapshot().tree), None)
    text = screen(st)
    assert "waiting for the run to use a GPU" in text
    assert "state: unknown" in text and "advice – none yet" in text


def test_view_in_a_container_says_so_instead_of_nothing() -> None:
    st = WatchState(pid=100, command=None, identities=(GpuIdentity(0, UUID),), started_mono_s=0)
    feed(st, Snapshot(t_s=1.0, gpus=()), None, invisible_gpu_pids={4242})
    text = screen(st, width=250)
    assert "container without the host PID namespace?" in text and "4242" in text


def test_view_falls_back_to_ticks_without_the_driver_buffer() -> None:
    snap = snapshot(points=())
    text = screen(state_with(None, snap))
    assert "per tick" in text
    # The first tick reads before the driver recorded a sample: not yet "unavailable".
    assert "until the driver's samples arrive" in text and "unavailable" not in text
    st = state_with(None, snap)
    for t in (10.5, 11.0):  # the buffer stays silent tick after tick: now it is said
        feed(st, snapshot(t, points=()), None)
    assert "per tick: the driver's sample buffer is unavailable" in screen(st)
    feed(st, snapshot(11.5), None)  # it speaks: one character per sample again
    assert "one character per driver sample" in screen(st)


SIZES = [(80, 24), (81, 25), (97, 28), (100, 30), (120, 40), (133, 50), (200, 60), (240, 70)]


@pytest.mark.parametrize("gpus", [1, 2, 3, 8, 16, 40])
@pytest.mark.parametrize(("width", "height"), SIZES)
def test_layout_keeps_what_matters_at_every_size_and_never_cuts_a_value(
    gpus: int, width: int, height: int
) -> None:
    st = many_gpus(gpus)
    lines = screen_lines(st, width, height)
    assert len(lines) == height and all(Text(ln).cell_len <= width for ln in lines)
    top, footer = lines[0], lines[-1]
    assert "state: starved  cause: cpu" in top and "elapsed " in top and "pid 100" in top
    assert "? help" in footer and "g/←/→ GPUs" in footer and "q quit" in footer
    rows = {int(ln.split()[1]): ln for ln in lines if re.match(r"GPU \d+ +starved/cpu ", ln)}
    fit = height - 4  # top, the GPUs' rule, the advice line, the footer
    shown = gpus if gpus <= fit else fit - 1
    assert sorted(rows) == list(range(shown))  # a timeline row per GPU, in order ...
    for row in rows.values():
        assert sum(row.count(c) for c in "█▁") >= 30  # ... the timeline the widest part
    more = [ln for ln in lines if ln.startswith("+")]
    assert more == ([] if gpus <= fit else [more[0]]) and (
        not more or f"+{gpus - shown} more" in more[0]
    )
    if gpus == 8 and height >= 24:
        assert len(rows) == 8  # eight GPUs at 80x24: eight rows
    assert any(ln.startswith("advice • raise num_workers") for ln in lines)
    _assert_chips_whole(st, lines)


def _assert_chips_whole(st: WatchState, lines: list[str]) -> None:
    """Every evidence value shown is shown whole, never split across lines or cut."""
    v = st.verdict
    assert v is not None
    chips = {f"{label} {value}" for label, value in evidence_items(v.evidence)}
    for g in v.gpus:
        own = {k: x for k, x in g.evidence.items() if k not in v.evidence}
        chips |= {f"{label} {value}" for label, value in evidence_items(own)}
    if not any(ln.startswith("── evidence") for ln in lines):
        return
    start = next(i for i, ln in enumerate(lines) if ln.startswith("── evidence")) + 1
    for ln in lines[start:-1]:  # up to the footer
        if ln.startswith("──") or not ln.strip():
            break
        for piece in ln[7:].strip().split("  "):
            assert piece in chips, (piece, ln)


def test_a_narrow_terminal_gets_the_plain_lines_with_a_note() -> None:
    st = many_gpus(2)
    feed(st, st.snapshot, st.verdict)  # type: ignore[arg-type]
    lines = screen_lines(st, 60, 20)
    text = "\n".join(lines)
    assert "60 columns wide" in text and "needs 80" in text
    assert "state=starved cause=cpu" in text and "╭" not in text and "GPU 0 " not in text
    assert all(Text(ln).cell_len <= 60 for ln in lines)
    for ln in lines:  # wrapped at spaces: every token whole
        assert not re.search(r"gpu\d+=\d+$", ln.strip()) or ln.strip().endswith("%")


# --- keys ----------------------------------------------------------------------------------


def controls_for(st: WatchState) -> ViewControls:
    return ViewControls(st, threading.Event())


def test_help_key_shows_the_keys_and_the_legend_then_closes() -> None:
    st = many_gpus(2)
    c = controls_for(st)
    c.press("?")
    text = screen(st, 80, 24, c)
    assert "── keys" in text and "pause the view" in text and "no sample" in text
    assert "close help" in text.splitlines()[-1]
    assert "GPU 1 " not in text  # the overlay replaces the rows
    c.press("?")
    assert "── keys" not in screen(st, 80, 24, c)
    c.press("?")
    c.press("esc")
    assert "── keys" not in screen(st, 80, 24, c)


def test_advice_key_shows_every_advice_in_full() -> None:
    st = many_gpus(8)
    long = "move decoding and augmentation onto the GPU " * 4
    more = Advice(Lever.OFFLOAD, long.strip())
    st.verdict = replace(st.verdict, advice=(*ADVICE, more))  # type: ignore[type-var]
    c = controls_for(st)
    main = screen(st, 80, 24, c)
    assert "pin_memory=True" not in main or "move decoding" not in main  # not all fit
    c.press("a")
    text = screen(st, 80, 24, c)
    assert "advice (3, in full)" in text and "pin_memory=True" in text
    assert "".join(text.split()).count("".join(long.split())) == 1  # whole, wrapped
    c.press("a")
    assert "in full" not in screen(st, 80, 24, c)


def test_paging_keys_go_through_the_gpus_and_wrap_round() -> None:
    st = many_gpus(8)
    c = controls_for(st)

    def rows() -> list[int]:
        lines = screen_lines(st, 80, 10, c)  # room for 5 GPU rows and "+N more"
        return [int(ln.split()[1]) for ln in lines if re.match(r"GPU \d+ ", ln)]

    assert rows() == [0, 1, 2, 3, 4]
    assert "GPUs 1–5 of 8" in screen(st, 80, 10, c)
    c.press("g")
    assert rows() == [5, 6, 7]
    c.press("right")
    assert rows() == [0, 1, 2, 3, 4]  # round to the first page
    c.press("left")
    assert rows() == [5, 6, 7]
    c.press("left")
    assert rows() == [0, 1, 2, 3, 4]


def test_pause_key_freezes_the_view_while_the_state_goes_on() -> None:
    st = state_with(starved_verdict())
    c = controls_for(st)
    c.press("p")
    later = snapshot(t=20.0, points=tuple(UtilPoint(17 + i / 6, 100.0) for i in range(18)))
    feed(st, later, replace(starved_verdict(20.0), state=State.HEALTHY, cause=None))
    paused = screen(st, 100, 30, c)
    assert (
        "PAUSED" in paused and "state: starved" in paused and "paused: sampling goes on" in paused
    )
    assert st.verdict is not None and st.verdict.state is State.HEALTHY  # fed all the same
    c.press("p")
    resumed = screen(st, 100, 30, c)
    assert "PAUSED" not in resumed and "state: healthy" in resumed


def test_quit_key_sets_the_quit_event_only() -> None:
    st = many_gpus(1)
    c = controls_for(st)
    c.press("x")  # not a key of ours: nothing happens
    assert c.overlay is None and not c.paused and c.page == 0 and not c.quit.is_set()
    c.press("q")
    assert c.quit.is_set()


def test_parse_keys_names_letters_arrows_and_escape() -> None:
    assert parse_keys(b"?aGpQ") == ["?", "a", "g", "p", "q"]
    assert parse_keys(b"\x1b[C\x1b[D\x1bOC\x1bOD") == ["right", "left", "right", "left"]
    assert parse_keys(b"\x1b") == ["esc"]
    assert parse_keys(b"\x1b[15~g") == ["g"]  # F5, skipped whole


def test_key_reader_reads_a_real_terminal_in_cbreak_mode() -> None:
    """A pty stands for the terminal: keys typed arrive one by one, settings come back."""
    master, slave = pty.openpty()
    got: list[str] = []
    before = termios.tcgetattr(slave)
    reader = KeyReader(got.append, fd=slave).start()
    try:
        assert not termios.tcgetattr(slave)[3] & termios.ICANON  # cbreak: no line buffering
        os.write(master, b"?\x1b[Cp")
        deadline = time.monotonic() + 5
        while len(got) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        reader.close()
        assert termios.tcgetattr(slave) == before
        os.close(master)
        os.close(slave)
    assert got == ["?", "right", "p"]


# --- pieces -------------------------------------------------------------------------------


def test_timeline_draws_holes_as_dots_never_as_zero() -> None:
    pts = (*(UtilPoint(i / 10, 100.0) for i in range(4)), UtilPoint(0.7, 100.0))
    text, span = timeline(pts, 10)
    assert text.plain == "  ████···█"  # three sample periods without a sample
    assert span == pytest.approx(0.7)


def test_timeline_keeps_the_newest_samples_when_too_many() -> None:
    pts = tuple(UtilPoint(i * 0.1, 0.0 if i < 50 else 100.0) for i in range(60))
    text, _ = timeline(pts, 10)
    assert text.plain == "█" * 10


def test_tick_duty_prefers_driver_samples() -> None:
    g = GpuSample(t_s=1, gpu=0, uuid=UUID, util_samples=burst_points(0, 6), util_pct=90.0)
    assert tick_duty(g) == pytest.approx(2 / 6)
    assert tick_duty(GpuSample(t_s=1, gpu=0, uuid=UUID, util_pct=90.0)) == pytest.approx(0.9)
    assert tick_duty(GpuSample(t_s=1, gpu=0, uuid=UUID)) is None


def test_plain_line_has_time_duty_state_and_cause_without_escapes() -> None:
    line = plain_line(state_with(starved_verdict()), now_wall=0.0)
    assert "\x1b" not in line and "\n" not in line
    assert " gpu0=33% " in line and "state=starved cause=cpu" in line
    assert line.endswith("procs=3")
    waiting = WatchState(pid=1, command=None)
    feed(waiting, Snapshot(t_s=0.0), None)
    assert "waiting for the run to use a GPU state=unknown cause=-" in plain_line(waiting)


def test_evidence_items_are_ordered_and_skip_bookkeeping() -> None:
    items = evidence_items({"samples": 9, "gap_p50_s": 0.7, "duty_cycle": 0.5, "x_y": "z"})
    assert items == [("duty cycle", "50%"), ("gap p50", "700ms"), ("x y", "z")]


def test_hole_marker_is_not_a_block() -> None:
    assert HOLE not in "▁▂▃▄▅▆▇█"


# --- the summary ---------------------------------------------------------------------------


def _run(**kw: object) -> RunSummary:
    base: dict[str, object] = dict(
        verdict=State.STARVED,
        cause=Cause.CPU,
        reason=None,
        seconds={
            **dict.fromkeys(State, 0.0),
            State.HEALTHY: 20.0,
            State.STARVED: 50.0,
            State.IDLE: 5.0,
        },
        startup_s=5.0,
        duty_cycle=0.31,
        effective_gpus=0.31,
        lost_gpu_seconds=34.5,
        straggler=None,
        advice=ADVICE,
        notes=(),
        gpus=(),
    )
    base.update(kw)
    return RunSummary(**base)  # type: ignore[arg-type]


def _summary(run: RunSummary | None = None, **kw: object) -> Summary:
    base: dict[str, object] = dict(
        pid=100,
        command=("python", "train.py"),
        wall_s=75.2,
        run=run or _run(),
        gpus=[GpuLine(0, UUID, "Fake H100", 0.31)],
        used_gpu=True,
        exit_status=0,
    )
    base.update(kw)
    return Summary(**base)  # type: ignore[arg-type]


def test_the_summary_is_the_detectors_run_summary() -> None:
    """The watch summary says what `gpumon analyze` would: the detector's one summary."""
    from gpumon.detect import Detector
    from gpumon.lab.synth import generate

    trace = generate("healthy_then_starved", seed=3, gpus=1, duration_s=200.0)
    det = Detector(gpus=trace.header.gpus)
    for snap in trace.snapshots:
        det.update(snap)
    det.finish()
    run = det.summary()
    s = _summary(run, gpus=[GpuLine(0, run.gpus[0].uuid, None, run.gpus[0].duty_cycle)])
    data = s.to_json()
    assert (data["verdict"], data["cause"]) == (run.verdict.value, run.cause and run.cause.value)
    assert data["seconds"] == {k.value: round(v, 3) for k, v in run.seconds.items()}
    assert data["advice"] == [a.text for a in run.advice]
    assert data["startup_s"] == round(run.startup_s, 3)


def test_fail_on_trips_above_the_threshold_share() -> None:
    s = _summary(fail_on=(State.STARVED, State.SYNC_STALL), fail_threshold=0.25)
    assert s.share(s.fail_on) == pytest.approx(50 / 75)
    assert s.failed
    assert not _summary(fail_on=(State.SYNC_STALL,), fail_threshold=0.25).failed
    assert not _summary(fail_on=(State.STARVED,), fail_threshold=0.7).failed
    assert not _summary().failed  # no --fail-on, never fails
    assert EXIT_FAIL_ON not in (0, 1, 2, 3, 4, 130)


def test_summary_json_has_every_documented_key(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    _summary(fail_on=(State.STARVED,), fail_threshold=0.25).write_json(str(path))
    data = json.loads(path.read_text())
    assert data["pid"] == 100 and data["command"] == ["python", "train.py"]
    assert data["verdict"] == "starved" and data["cause"] == "cpu"
    assert data["seconds"] == {
        "healthy": 20.0,
        "starved": 50.0,
        "sync_stall": 0.0,
        "idle": 5.0,
        "unknown": 0.0,
    }
    # A GPU the detector's summary has no word on: what the watch saw of it, its run
    # verdict unknown (the schema's core: gpumon/schema/summary.schema.json).
    assert data["gpus"] == [
        {
            "gpu": 0,
            "uuid": UUID,
            "verdict": "unknown",
            "cause": None,
            "duty_cycle": 0.31,
            "samples": 0,
            "seconds": dict.fromkeys(("healthy", "starved", "sync_stall", "idle", "unknown"), 0.0),
            "lost_gpu_seconds": 0.0,
            "off_bus_s": 0.0,
            "name": "Fake H100",
        }
    ]
    assert data["lost_gpu_seconds"] == 34.5 and data["advice"] == [a.text for a in ADVICE]
    assert data["startup_s"] == 5.0
    assert data["fail_on"]["failed"] is True
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically


def test_summary_text_reads_well() -> None:
    text = _summary().text()
    assert "wall time        1m 15s" in text
    assert "starved 50.0s (67%)" in text
    assert "5.0s of it start-up" in text
    assert "GPU-seconds lost waiting  34.5" in text
    assert "verdict          starved (cause: cpu)" in text
    assert "advice           - raise num_workers" in text
    gain = _summary(_run(speedup_if_fed=2.5, work_duty_cycle=0.4)).text()
    assert "worth            fixing the input pipeline could make this run up to 2.5x" in gain
    none = _summary(_run(verdict=State.UNKNOWN, cause=None), used_gpu=False, gpus=[]).text()
    assert "none: no process of the run appeared" in none


LONG_ADVICE = (
    Advice(
        Lever.WORKERS,
        "data-loading workers are CPU-saturated during the gaps: raise num_workers from 8 to "
        "16 (all the free cores: 8 of 16); ~20 would be needed, so also move decoding onto "
        "the GPU (e.g. NVIDIA DALI) or pre-process the dataset offline",
    ),
    Advice(
        Lever.PINNING, "pin_memory=True and non_blocking=True copies let transfers overlap compute"
    ),
)


@pytest.mark.parametrize("width", [80, 100, 132])
def test_summary_lines_fit_the_terminal_and_break_between_words(width: int) -> None:
    run = _run(
        advice=LONG_ADVICE,
        notes=("2 GPUs deliver 1.3 GPUs of work while working; data-parallel training "
               "usually reaches 1.2-1.9 on 2",),
        speedup_if_fed=1.6,
        work_duty_cycle=0.64,
        seconds={**dict.fromkeys(State, 0.0), State.HEALTHY: 177.0, State.STARVED: 243.0,
                 State.IDLE: 18.2},
    )  # fmt: skip
    gpus = [GpuLine(i, f"GPU-fa4e000{i}-0000-4000-8000-00000000000{i}", "NVIDIA H100 80GB HBM3",
                    0.35, lost_gpu_seconds=172.5) for i in range(2)]  # fmt: skip
    summary = _summary(run, gpus=gpus, command=("python", "train.py", "--data", "/d" * 40))
    text = summary.text(width)
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= width, text
    words = " ".join(ln.strip() for ln in lines)
    for advice in LONG_ADVICE:  # broken only between words: the lines join back into it
        assert advice.text in words, text
    assert "worth            fixing the input pipeline" in text
    assert lines[0].startswith("gpumon watch summary: pid 100 (python train.py")


def test_summary_text_follows_the_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run(advice=LONG_ADVICE)
    monkeypatch.setenv("COLUMNS", "80")
    assert max(len(ln) for ln in _summary(run).text().splitlines()) <= 80
    monkeypatch.setenv("COLUMNS", "200")
    assert any(len(ln) > 100 for ln in _summary(run).text().splitlines())


def test_summary_says_when_a_gpu_fell_off_the_bus_and_names_the_straggler() -> None:
    run = _run(
        verdict=State.SYNC_STALL,
        cause=None,
        straggler=1,
        notes=("the straggler's peers read busy while it idles",),
    )
    text = _summary(run, gpus=[GpuLine(0, UUID, None, 0.9, off_bus_s=12.0)]).text()
    assert "fell off the bus: unknown for 12.0s" in text
    assert "verdict          sync_stall, straggler GPU 1" in text
    assert "note             the straggler's peers read busy" in text


def test_parse_states() -> None:
    assert parse_states("starved, sync_stall,starved") == (State.STARVED, State.SYNC_STALL)
    with pytest.raises(ValueError, match="unknown state 'slow'"):
        parse_states("starved,slow")


# --- the captures in the docs are screens of this view ---------------------------------------

DOCS = Path(__file__).resolve().parent.parent


def _capture_after(doc: str, marker: str) -> list[str]:
    """The code block that follows ``marker`` in ``doc``."""
    text = (DOCS / doc).read_text()
    block = text[text.index(marker) :].split("```\n", 2)[1]
    return block.rstrip("\n").split("\n")


def with_three_advices(st: WatchState) -> WatchState:
    """The demo's starved phase gives three distinct advices (the footer counts them)."""
    v = st.verdict
    assert v is not None
    gpus = tuple(replace(g, advice=()) for g in v.gpus)
    abc = tuple(Advice(lv, t) for lv, t in zip(Lever, "abc", strict=False))
    st.verdict = replace(v, advice=abc, gpus=gpus)
    return st


def test_readme_capture_is_an_80x24_screen_of_this_view() -> None:
    lines = _capture_after("README.md", "`gpumon demo` at 80x24:")
    assert len(lines) == 24 and all(Text(ln).cell_len <= 80 for ln in lines)
    assert "state: starved  cause: cpu" in lines[0] and "elapsed" in lines[0]
    assert [ln for ln in lines if ln.startswith("── ")] == [
        ln for ln in lines if ln.startswith("── ") and Text(ln).cell_len == 80
    ]
    assert [ln.split()[1] for ln in lines if re.match(r"GPU \d+  starved/cpu [▁-█]", ln)] == [
        "0",
        "1",
    ]
    assert lines[4].startswith("advice • ")
    st = with_three_advices(many_gpus(2))
    assert lines[-1] == screen_lines(st, 80, 24)[-1].rstrip()  # today's footer


def test_docs_help_capture_is_the_help_this_view_draws() -> None:
    lines = _capture_after("docs/watch.md", "and at 80×24 with `?` pressed:")
    st = with_three_advices(many_gpus(2))
    c = controls_for(st)
    c.press("?")
    drawn = [ln.rstrip() for ln in screen_lines(st, 80, 24, c)]
    assert lines[1:] == drawn[1:]  # all but the top line (its clock and command)
