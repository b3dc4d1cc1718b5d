"""What the job's processes do while the GPU waits, on data alone (``--stacks``).

Each frame rule of ``detect/activities.py`` on the frames py-spy shows for it; the
weighting by the GPUs' waiting; the judgments the detector makes with them (a pause spent
in torch.save is a checkpoint, a loader waited on while workers decode is starvation on
the CPU, ranks in a collective name the straggler); when and whose stacks the engine
reads; the trace's stacks lines.  The same on real processes: tests/test_stacks.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from test_detect import run, square, stream

from gpumon.detect import DetectorConfig, DetectorUpdate
from gpumon.detect.activities import (
    Activity,
    ActivityTrack,
    Reading,
    StackWindow,
    Weighted,
    classify,
    decide,
    judge,
    straggler_gpus,
    where,
)
from gpumon.detect.rules import Candidate
from gpumon.engine.memory import RunMemory
from gpumon.engine.stacks import StackOptions, plan, roles, waiting
from gpumon.engine.words import stacks_json, stacks_line
from gpumon.errors import TraceFormatError
from gpumon.model import (
    Cause,
    Episode,
    GpuSample,
    ProcessRole,
    ProcessSample,
    ProcTreeSample,
    Reason,
    Snapshot,
    StackFrame,
    StackSample,
    State,
    TraceHeader,
)
from gpumon.sample.stacks import ATTACH_CPU_S, SAMPLE_CPU_S, shorten
from gpumon.traces.jsonl import TraceReader, TraceWriter

MAIN, WORKER, RANK = ProcessRole.MAIN, ProcessRole.WORKER, ProcessRole.RANK


def lib(file: str, name: str, line: int = 1, code: str | None = None) -> StackFrame:
    return StackFrame(name, file, line, True, code)


def own(file: str, name: str, line: int = 1, code: str | None = None) -> StackFrame:
    return StackFrame(name, file, line, False, code)


TRAIN = own("train.py", "train", 42)
LOADER = (
    lib("multiprocessing/connection.py", "Connection._recv"),
    lib("multiprocessing/queues.py", "Queue.get"),
    lib("torch/utils/data/dataloader.py", "_MultiProcessingDataLoaderIter._next_data"),
    lib("torch/utils/data/dataloader.py", "_BaseDataLoaderIter.__next__"),
    TRAIN,
)
BOOT = (
    lib("multiprocessing/process.py", "BaseProcess.run"),
    lib("multiprocessing/process.py", "BaseProcess._bootstrap"),
    lib("multiprocessing/popen_fork.py", "Popen._launch"),
    lib("torch/utils/data/dataloader.py", "_MultiProcessingDataLoaderIter.__init__"),
    TRAIN,
)  # a forked worker's stack ends in its parent's, at the fork
FETCH = (
    lib("torch/utils/data/_utils/fetch.py", "_MapDatasetFetcher.fetch"),
    lib("torch/utils/data/_utils/worker.py", "_worker_loop"),
    *BOOT,
)
DECODE = (lib("PIL/Image.py", "open"), own("dataset.py", "Images.__getitem__", 87), *FETCH)
SAVE = (
    lib("torch/serialization.py", "_save"),
    lib("torch/serialization.py", "save"),
    own("train.py", "train", 88),
)
STEP = (own("model.py", "Net.forward", 12, "x = self.mix(x)"), TRAIN)


# --- the frame rules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frames", "role", "activity"),
    [
        # Checkpoints, anywhere in the stack.
        (SAVE, MAIN, Activity.CHECKPOINT),
        ((lib("transformers/modeling_utils.py", "PreTrainedModel.save_pretrained"), TRAIN),
         MAIN, Activity.CHECKPOINT),
        ((lib("safetensors/torch.py", "save_file"), TRAIN), MAIN, Activity.CHECKPOINT),
        ((own("train.py", "persist", 9, "pickle.dump(state, f)"), TRAIN), MAIN,
         Activity.CHECKPOINT),
        ((own("train.py", "write_ckpt", 9, "x = 1"), TRAIN), MAIN, Activity.CHECKPOINT),
        # ... activation checkpointing is no checkpoint, nor is a library's own C call.
        ((lib("torch/utils/checkpoint.py", "checkpoint"), TRAIN), MAIN, Activity.STEP),
        ((lib("mylib/io.py", "keep", 3, "pickle.dump(x, f)"), TRAIN), MAIN, Activity.STEP),
        # Evaluation: a frame named so; nn.Module.eval only switches a mode.
        ((*STEP, own("train.py", "validation_step", 60)), MAIN, Activity.EVALUATION),
        ((own("loop.py", "runEvaluation", 3), TRAIN), MAIN, Activity.EVALUATION),
        ((lib("torch/nn/modules/module.py", "Module.eval"), TRAIN), MAIN, Activity.STEP),
        ((own("train.py", "interval", 3), TRAIN), MAIN, Activity.STEP),
        # Collectives, in torch.distributed; a function of the same name elsewhere is not.
        ((lib("torch/distributed/distributed_c10d.py", "all_reduce"), TRAIN), RANK,
         Activity.COLLECTIVE),
        ((lib("torch/distributed/distributed_c10d.py", "barrier"), TRAIN), RANK,
         Activity.COLLECTIVE),
        ((own("ops.py", "all_reduce"), TRAIN), RANK, Activity.STEP),
        # The host waiting on the GPU.
        ((lib("torch/cuda/__init__.py", "synchronize"), TRAIN), MAIN, Activity.GPU_WAIT),
        ((own("train.py", "train", 50, "total += loss.item()"),), MAIN, Activity.GPU_WAIT),
        ((own("train.py", "train", 50, "out = pred.cpu()"),), MAIN, Activity.GPU_WAIT),
        # Reading files; a file opened for writing is not a read.
        ((lib("h5py/_hl/dataset.py", "Dataset.__getitem__"), TRAIN), WORKER, Activity.READ),
        ((own("data.py", "load", 5, "blob = fh.read()"), TRAIN), WORKER, Activity.READ),
        ((own("data.py", "dump", 5, 'with open(p, "wb") as f:'), TRAIN), MAIN, Activity.STEP),
        # Decoding and augmentation.
        (DECODE, WORKER, Activity.DECODE),
        ((own("data.py", "get", 5, "img = cv2.imdecode(buf, 1)"), TRAIN), WORKER,
         Activity.DECODE),
        ((own("data.py", "decode_jpeg", 5, "acc += 1"), TRAIN), WORKER, Activity.DECODE),
        ((lib("torchvision/transforms/transforms.py", "RandomResizedCrop.forward"), *FETCH),
         WORKER, Activity.DECODE),
        # The dataset's own code inside a DataLoader fetch makes samples: decoding.
        ((own("dataset.py", "Rows.__getitem__", 9, "return self.rows[i] * 2"), *FETCH),
         WORKER, Activity.DECODE),
        # Waiting on the loader (a main process) is idleness in a worker.
        (LOADER, MAIN, Activity.LOADER_WAIT),
        ((lib("multiprocessing/queues.py", "Queue.get"), own("main.py", "consume")), MAIN,
         Activity.LOADER_WAIT),
        ((lib("multiprocessing/queues.py", "Queue.get"),
          lib("torch/utils/data/_utils/worker.py", "_worker_loop"), *BOOT), WORKER,
         Activity.IDLE),
        ((lib("torch/utils/data/_utils/worker.py", "_worker_loop"), *BOOT), WORKER,
         Activity.IDLE),
        # A main process starting its workers (an epoch boundary) waits on its loader.
        (BOOT[2:], MAIN, Activity.LOADER_WAIT),
        ((own("train.py", "train", 3, "time.sleep(1)"),), MAIN, Activity.IDLE),
        (STEP, MAIN, Activity.STEP),
    ],
)  # fmt: skip
def test_each_activity_is_named_by_its_frames(
    frames: tuple[StackFrame, ...], role: ProcessRole, activity: Activity
) -> None:
    assert classify(frames, role) is activity


def test_a_forked_workers_frames_outside_bootstrap_are_its_parents() -> None:
    # Without the strip the parent's loader frames would make this worker "wait".
    assert classify((own("w.py", "work", 1, "x = y + 1"), *BOOT), WORKER) is Activity.STEP
    assert "train.py" not in where(DECODE, decide(DECODE, WORKER)[1])


def test_where_names_the_code_and_what_it_called() -> None:
    assert (
        where(DECODE, decide(DECODE, WORKER)[1])
        == "dataset.py:87 Images.__getitem__ -> PIL.Image.open"
    )
    assert where(LOADER, decide(LOADER, MAIN)[1]) == (
        "train.py:42 train -> torch.utils.data.dataloader._BaseDataLoaderIter.__next__"
    )
    assert where(SAVE, decide(SAVE, MAIN)[1]) == "train.py:88 train -> torch.serialization._save"
    c = (own("train.py", "train", 50, "total += loss.item()  # sync"),)
    assert where(c, decide(c, MAIN)[1]) == "train.py:50 train: total += loss.item()"
    assert where(STEP, None) == "model.py:12 Net.forward: x = self.mix(x)"


def test_file_names_as_people_name_them() -> None:
    assert shorten("/usr/lib/python3/dist-packages/PIL/Image.py") == ("PIL/Image.py", True)
    assert shorten("/opt/venv/lib/python3.11/site-packages/torch/serialization.py") == (
        "torch/serialization.py", True,
    )  # fmt: skip
    assert shorten("/usr/lib/python3.11/multiprocessing/queues.py") == (
        "multiprocessing/queues.py", True,
    )  # fmt: skip
    assert shorten("/home/ada/proj/data/dataset.py") == ("dataset.py", False)
    assert shorten("<frozen importlib._bootstrap>") == ("<frozen importlib._bootstrap>", True)


# --- weighting by the GPUs' waiting ------------------------------------------------------------


def sample(t: float, seconds: float, frames: tuple[StackFrame, ...], pid: int = 10,
           role: ProcessRole = MAIN) -> StackSample:  # fmt: skip
    return StackSample(t, seconds, pid, role, frames)


def test_samples_count_by_how_much_the_gpus_waited_over_them() -> None:
    track = ActivityTrack()
    for k in range(1, 21):  # waiting over (0, 10], busy over (10, 20]
        track.tick(float(k), 1.0 if k <= 10 else 0.0)
    assert track.waiting_s(2.0, 4.0) == pytest.approx(2.0)
    assert track.waiting_s(9.5, 10.5) == pytest.approx(0.5)
    assert track.waiting_s(12.0, 14.0) == 0.0
    track.ingest([sample(2.0, 6.0, SAVE), sample(12.0, 6.0, STEP)])
    win = track.window(0.0, 30.0)
    # 12 s of stacks, half of each activity: during the gaps, all of it was the checkpoint.
    assert track.raw_seconds == pytest.approx(12.0)
    assert win.main.top() == (Activity.CHECKPOINT, pytest.approx(1.0))


def test_without_gpu_readings_every_sample_counts() -> None:
    track = ActivityTrack()
    track.ingest([sample(1.0, 3.0, SAVE), sample(4.0, 1.0, STEP)])
    assert track.window(0.0, 10.0).main.top() == (Activity.CHECKPOINT, pytest.approx(0.75))


def window(*ws: Weighted) -> StackWindow:
    win = StackWindow()
    for w in ws:
        win.add(w)
    return win


def w(pid: int, role: ProcessRole, act: Activity, seconds: float, place: str = "x") -> Weighted:
    return Weighted(0.0, pid, role, act, place, seconds)


# --- the judgments -------------------------------------------------------------------------------

CFG = DetectorConfig()
STARVED = Candidate(state=State.STARVED, cause=Cause.UNKNOWN, since_s=10.0, backdate_s=2.0)


def reading(main: tuple[Activity, float] | None, workers: tuple[Activity, float] | None = None,
            seconds: float = 5.0) -> Reading:  # fmt: skip
    return Reading(main, workers, "train.py:88 train -> torch.serialization.save",
                   "dataset.py:87 __getitem__ -> PIL.Image.open", seconds)  # fmt: skip


def test_a_wait_spent_writing_a_checkpoint_is_a_checkpoint_not_starvation() -> None:
    c = judge(STARVED, reading((Activity.CHECKPOINT, 0.8)), CFG, True)
    assert (c.state, c.reason) == (State.SYNC_STALL, Reason.CHECKPOINT)
    assert (
        c.detail
        == "the main process in train.py:88 train -> torch.serialization.save, 80% of the gaps"
    )
    assert c.backdate_s == STARVED.backdate_s
    # All-GPU pauses and a long idle wait with memory held after work: the same.
    pauses = Candidate(
        state=State.SYNC_STALL,
        reason=Reason.SYNC_PAUSES,
        detail="checkpoint or host sync",
        since_s=10.0,
    )
    assert judge(pauses, reading((Activity.CHECKPOINT, 0.7)), CFG, True).reason is Reason.CHECKPOINT
    held = Candidate(state=State.IDLE, reason=Reason.MEMORY_HELD, since_s=10.0, backdate_s=40.0)
    assert judge(held, reading((Activity.EVALUATION, 0.9)), CFG, True).reason is Reason.EVALUATION
    assert judge(held, reading((Activity.EVALUATION, 0.9)), CFG, False) is held  # before work


def test_too_little_or_too_mixed_a_reading_changes_nothing() -> None:
    assert judge(STARVED, reading((Activity.CHECKPOINT, 0.4)), CFG, True) is STARVED
    assert judge(STARVED, reading((Activity.CHECKPOINT, 0.9), seconds=0.5), CFG, True) is STARVED
    healthy = Candidate(state=State.HEALTHY, since_s=10.0)
    assert judge(healthy, reading((Activity.CHECKPOINT, 0.9)), CFG, True) is healthy
    hang = Candidate(
        state=State.SYNC_STALL, reason=Reason.HANG, detail="no GPU has computed", since_s=10.0
    )
    assert judge(hang, reading((Activity.CHECKPOINT, 0.9)), CFG, True) is hang


def test_a_loader_waited_on_names_the_cause_from_what_the_workers_do() -> None:
    c = judge(STARVED, reading((Activity.LOADER_WAIT, 0.9), (Activity.DECODE, 0.8)), CFG, True)
    assert (c.state, c.cause) == (State.STARVED, Cause.CPU)
    assert c.detail == (
        "the workers decode in dataset.py:87 __getitem__ -> PIL.Image.open, 80% of the gaps"
    )
    c = judge(STARVED, reading((Activity.LOADER_WAIT, 0.9), (Activity.READ, 0.7)), CFG, True)
    assert c.cause is Cause.IO
    c = judge(STARVED, reading((Activity.LOADER_WAIT, 0.9), (Activity.STEP, 0.7)), CFG, True)
    assert c.cause is Cause.CPU and (c.detail or "").startswith("the workers compute in ")
    # Workers idle: they keep up; the wait is elsewhere and names no cause.
    idle = reading((Activity.LOADER_WAIT, 0.9), (Activity.IDLE, 0.9))
    assert judge(STARVED, idle, CFG, True) is STARVED
    # The main process decoding itself, no worker doing it: the GIL.
    assert judge(STARVED, reading((Activity.DECODE, 0.9)), CFG, True).cause is Cause.GIL
    assert judge(STARVED, reading((Activity.READ, 0.9)), CFG, True).cause is Cause.IO
    # Contention stays: the stacks cannot see the processes outside the job.
    cont = replace(STARVED, cause=Cause.CONTENTION)
    assert (
        judge(cont, reading((Activity.LOADER_WAIT, 0.9), (Activity.DECODE, 0.8)), CFG, True) is cont
    )


def test_ranks_in_a_collective_name_the_straggler_and_its_gpu() -> None:
    win = window(
        w(10, RANK, Activity.COLLECTIVE, 4.0), w(11, RANK, Activity.COLLECTIVE, 3.5),
        w(12, RANK, Activity.DECODE, 4.0, "train.py:30 step -> PIL.Image.open"),
        w(20, WORKER, Activity.IDLE, 4.0),
    )  # fmt: skip
    gpu_pids = {0: frozenset({10}), 1: frozenset({11}), 2: frozenset({12})}
    assert straggler_gpus(win, gpu_pids) == (2, [0, 1], "train.py:30 step -> PIL.Image.open")
    # Two ranks elsewhere: no one straggler.
    win.add(w(11, RANK, Activity.STEP, 10.0))
    assert straggler_gpus(win, gpu_pids) is None


# --- the detector, end to end on data --------------------------------------------------------


Proc = tuple[
    int, ProcessRole, Callable[[float], float], tuple[StackFrame, ...], tuple[StackFrame, ...]
]


def with_stacks(snaps: list[Snapshot], *procs: Proc, every: int = 2) -> list[Snapshot]:
    """The stream with its processes' stacks, in quarter-second samples handed over every
    ``every`` ticks as a live window would be: each ``(pid, role, util, in_gap,
    in_burst)`` shows ``in_gap`` while ``util`` is 0."""
    t0 = snaps[0].t_s - 1.0
    out = []
    for k, snap in enumerate(snaps, 1):
        if k % every:
            out.append(snap)
            continue
        got = []
        for q in range(every * 4):
            t = snap.t_s - every + q * 0.25
            for pid, role, util, in_gap, in_burst in procs:
                frames = in_gap if util(t - t0 + 0.125) == 0 else in_burst
                got.append(StackSample(t, 0.25, pid, role, frames))
        out.append(replace(snap, stacks=tuple(got)))
    return out


def test_pauses_spent_in_torch_save_are_a_checkpoint() -> None:
    util = square(12.0, 3.0)  # a 3 s pause every 15 s: a rhythm of long gaps
    plain = stream(util, 120)
    det, closed, _ = run(plain)
    ep = det.open_episodes()[0]
    assert (ep.state, ep.reason) == (State.STARVED, Reason.PERIODIC_GAPS)  # without stacks
    det, closed, _ = run(with_stacks(plain, (500, MAIN, util, SAVE, STEP)))
    ep = det.open_episodes()[0]
    assert (ep.state, ep.reason) == (State.SYNC_STALL, Reason.CHECKPOINT), closed
    assert "torch.serialization._save" in (ep.note or "")
    assert ep.evidence["main_activity"] == "checkpoint"
    assert ep.advice[0].text.startswith("checkpoint less often or asynchronously")
    assert det.open_episodes()[None].reason is Reason.CHECKPOINT  # the run's too


def test_a_starved_gpu_waiting_on_its_loader_names_the_workers_decode() -> None:
    util = square(0.3, 0.7)
    plain = stream(util, 40)
    det, _, _ = run(plain)
    ep = det.open_episodes()[0]
    assert (ep.state, ep.cause) == (State.STARVED, Cause.UNKNOWN)  # no host data
    det, _, _ = run(
        with_stacks(plain, (500, MAIN, util, LOADER, STEP), (600, WORKER, util, DECODE, DECODE))
    )
    ep = det.open_episodes()[0]
    assert (ep.state, ep.cause) == (State.STARVED, Cause.CPU)
    v = det.verdict().gpus[0]
    assert v.evidence["workers_activity"] == "decode"
    assert v.evidence["workers_where"] == "dataset.py:87 Images.__getitem__ -> PIL.Image.open"
    assert v.evidence["main_activity"] == "loader_wait"
    assert any(
        a.text.startswith("the workers spend the gaps decoding in dataset.py:87") for a in v.advice
    )


def test_ranks_waiting_in_all_reduce_name_the_straggler_rank() -> None:
    slow, fast = square(0.3, 0.7), square(0.3, 0.7, 0.1)
    plain = stream([fast, slow], 40)  # GPU 0's rank waits on GPU 1's, neither spins
    coll = (lib("torch/distributed/distributed_c10d.py", "all_reduce"), TRAIN)
    strag = (own("data.py", "next_batch", 7, "time.sleep(0.5)"), TRAIN)
    snaps = with_stacks(plain, (500, RANK, fast, coll, coll), (501, RANK, slow, strag, strag))
    det, _, _ = run(snaps)
    eps = det.open_episodes()
    assert (eps[1].state, eps[1].reason) == (State.SYNC_STALL, Reason.STRAGGLER)
    assert "data.py:7 next_batch: time.sleep(0.5)" in (eps[1].note or "")
    assert (eps[0].state, eps[0].reason) == (State.SYNC_STALL, Reason.BUSY_WAIT)
    v = det.verdict()
    assert v.gpus[1].evidence["straggler_where"] == "pid 501: data.py:7 next_batch: time.sleep(0.5)"


# --- when and whose stacks the engine reads ------------------------------------------------------


def proc(pid: int, ppid: int) -> ProcessSample:
    return ProcessSample(pid, ppid, "python", 10.0, 1, None, None, "running")


def test_roles_the_gpu_process_is_main_and_its_descendants_workers() -> None:
    tree = ProcTreeSample(0.0, 1, (proc(1, 0), proc(2, 1), proc(3, 2), proc(4, 2)))
    assert roles([tree], [2]) == {2: MAIN, 3: WORKER, 4: WORKER}  # 1: a launcher, left out
    assert roles([tree], []) == {1: MAIN, 2: WORKER, 3: WORKER, 4: WORKER}  # no GPU list
    torchrun = ProcTreeSample(0.0, 1, (proc(1, 0), proc(2, 1), proc(3, 1), proc(5, 2)))
    assert roles([torchrun], [2, 3]) == {2: RANK, 3: RANK, 5: WORKER}
    assert roles([], [7, 8]) == {7: RANK, 8: RANK}  # serve without process trees


def test_the_plan_stays_within_the_budget() -> None:
    found = {1: MAIN, **{p: WORKER for p in range(2, 10)}}  # 8 workers
    p = plan(found, StackOptions(every_s=10.0))
    assert p is not None and [pid for pid, _ in p.targets] == [1, 2, 3]
    cost = len(p.targets) * (ATTACH_CPU_S / p.seconds + p.rate_hz * SAMPLE_CPU_S)
    assert cost <= 0.02 and p.rate_hz >= 10
    # The workers are taken in turn, window after window.
    q = plan(found, StackOptions(every_s=10.0), turn=1)
    assert q is not None and [pid for pid, _ in q.targets] == [1, 4, 5]
    # Many ranks: as many as leave each at least 2 samples a second, still in budget.
    many = plan({p: RANK for p in range(64)}, StackOptions(every_s=10.0))
    assert many is not None and many.rate_hz >= 2
    assert len(many.targets) * (ATTACH_CPU_S / 10 + many.rate_hz * SAMPLE_CPU_S) <= 0.02
    assert plan({1: MAIN}, StackOptions(), skip=[1]) is None


def gpu(t: float, util: float) -> GpuSample:
    return GpuSample(t, 0, "GPU-0", util_samples=((t, util),))


def episode(state: State, reason: Reason | None = None) -> Episode:
    return Episode(
        gpu=0, uuid="GPU-0", state=state, cause=None, start_s=0.0, end_s=None, reason=reason
    )


def test_stacks_are_read_only_while_a_gpu_waits() -> None:
    busy, gap = Snapshot(1.0, (gpu(1.0, 100.0),)), Snapshot(1.0, (gpu(1.0, 0.0),))
    assert not waiting(busy, {0: episode(State.HEALTHY)}, 50.0)
    assert waiting(gap, {0: episode(State.HEALTHY)}, 50.0)  # a gap now
    assert waiting(busy, {0: episode(State.STARVED)}, 50.0)
    assert waiting(busy, {0: episode(State.IDLE, Reason.MEMORY_HELD)}, 50.0)
    assert not waiting(gap, {0: episode(State.IDLE, Reason.START_UP)}, 50.0)  # starting up
    assert not waiting(gap, {}, 50.0)


# --- what faces show, and what a trace keeps ---------------------------------------------------


def test_the_summary_json_and_line_per_role() -> None:
    win = window(
        w(1, MAIN, Activity.LOADER_WAIT, 7.0, "train.py:42 train -> ...__next__"),
        w(1, MAIN, Activity.STEP, 3.0, "model.py:12 forward"),
        w(2, WORKER, Activity.DECODE, 8.0, "dataset.py:87 __getitem__ -> PIL.Image.open"),
    )
    out = stacks_json(win)
    assert out["main"] == {
        "seconds": 10.0,
        "activities": {"loader_wait": 0.7, "step": 0.3},
        "top": [
            {"where": "train.py:42 train -> ...__next__", "activity": "loader_wait", "share": 0.7},
            {"where": "model.py:12 forward", "activity": "step", "share": 0.3},
        ],
    }
    assert stacks_line(win) == (
        "main process: waiting on the loader 70% (train.py:42 train -> ...__next__); "
        "workers: decoding/augmenting 100% (dataset.py:87 __getitem__ -> PIL.Image.open)"
    )


def test_a_trace_keeps_the_stacks_and_gives_them_back(tmp_path: Path) -> None:
    code = own("train.py", "train", 50, "total += loss.item()")
    snaps = [
        Snapshot(1.0),
        Snapshot(2.0, stacks=(StackSample(1.0, 0.5, 10, MAIN, (code, *LOADER[1:])),
                              StackSample(1.5, 0.5, 11, WORKER, DECODE))),
        Snapshot(3.0),
    ]  # fmt: skip
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path, TraceHeader(version=2, source="gpumon")) as out:
        for s in snaps:
            out.write(s)
    lines = path.read_text().splitlines()
    assert '"event":"stacks","version":1' in lines[2]  # its own line, before its tick
    reader = TraceReader(path)
    assert list(reader) == snaps and reader.events == []


def test_a_newer_stacks_version_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"format":"gpumon-trace","version":2,"header":{"source":"gpumon","gpus":[]}}\n'
        '{"t":1.0,"event":"stacks","version":9,"whatever":[]}\n'
        '{"t":1.0}\n'
    )
    reader = TraceReader(path)
    assert list(reader) == [Snapshot(1.0)]
    assert reader.warnings == [f"{path}: stacks version 9 is newer than this gpumon reads; skipped"]


def test_the_memory_shows_the_detectors_stacks() -> None:
    track = ActivityTrack()
    mem = RunMemory((), lambda: {}, stacks=track)
    assert mem.stacks_window(60.0) is None and mem.stacks_run() is None  # none read
    track.ingest([sample(1.0, 2.0, SAVE)])
    mem.after(Snapshot(3.0), DetectorUpdate())
    assert mem.stacks_run() is track.run
    got = mem.stacks_window(60.0)
    assert got is not None and got.main.top() == (Activity.CHECKPOINT, 1.0)


def test_a_malformed_stacks_line_is_named_by_its_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"format":"gpumon-trace","version":2,"header":{"source":"gpumon","gpus":[]}}\n'
        '{"t":1.0}\n'
        '{"t":2.0,"event":"stacks","version":1,"frames":[["f","a.py",1]],'
        '"samples":[[1.0,0.5,10,"main",[0,3]]]}\n'
        '{"t":2.0}\n'
    )
    got: list[Snapshot] = []
    with pytest.raises(TraceFormatError, match=r":3: malformed trace line \(a stack sample"):
        for snap in TraceReader(path):
            got.append(snap)
    assert got == [Snapshot(1.0)]  # every valid tick before it
