"""The lab's training jobs: scenarios of phases, run by real processes on emulated GPUs.

A job is a training process (or a launcher with one process per rank, each on its own GPU)
whose loop does what a PyTorch loop does: take a batch from its DataLoader-shaped
pipeline (``pipeline.Loader``: forked workers, queues, prefetch), launch the step's
kernels on its ``EmulatedDevice`` (asynchronously: at most one step queued ahead, as CUDA's
queue lets the host run ahead), and, per phase, meet its peers at a barrier (spinning),
write a checkpoint, evaluate, or hold its memory and do nothing.  So the GPU waits exactly
when and because the process feeding it waits.  Each rank logs its truth (``truth.py``).

A scenario's parameters (step time, worker counts, costs, gap lengths, straggler, GPM or
not) are drawn from its seed; ``scale`` stretches every phase (the tests run scale 1, the
benchmark longer).  Run one with ``python tests/livelab/job.py SCENARIO --seed N --dir D``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import multiprocessing as mp
import os
import random
import signal
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from livelab.emulator import EmulatedDevice, GiB
from livelab.pipeline import (
    CpuDataset,
    IoDataset,
    Loader,
    RemoteDataset,
    make_data_file,
    read_seconds,
    torch_loader,
)
from livelab.truth import HANG_AFTER_S, Label, TruthLog

HEALTHY = Label("healthy")
IDLE_HELD = Label("idle", None, "memory allocated, no work")
BUSY_WAIT = Label("sync_stall", None, "busy-wait")
HANG = Label("sync_stall", None, "hang")
STRAGGLER = Label("sync_stall", None, "straggler")
DATA_FILE_BYTES = 256 << 20


def starved(cause: str, reason: str | None = None) -> Label:
    return Label("starved", cause, reason)


@dataclass(frozen=True)
class Phase:
    """One regime of the training loop, for ``seconds``."""

    name: str
    seconds: float
    design: Label
    # train: the loop; evaluate: the loop inside an evaluation function (as a validation
    # loop runs); hold: memory held, no work; hang: every rank spins
    mode: str = "train"
    step_s: float = 0.2  # a step's kernels
    loader: str = "train"  # the same name keeps the same loader (and its workers) going
    data: str = "cpu"  # cpu | io | remote: what a batch costs
    workers: int = 2
    batch_cost_s: float = 0.05  # CPU seconds, read seconds or remote wait per batch
    samples: int = 8  # samples per batch (the cost is spread over them)
    persistent: bool = True
    epoch_batches: int | None = None  # batches per epoch (None: one endless epoch)
    worker_init_s: float = 0.0  # CPU a new worker spends starting up
    add_workers: int = 0  # workers forked at the phase's start
    checkpoint_every_s: float | None = None
    checkpoint_s: float = 0.0
    barrier: bool = False  # ranks meet after every step
    straggler: int | None = None  # the rank whose steps take straggler_factor times longer
    straggler_factor: float = 2.0

    def design_for(self, rank: int, ranks: int) -> Label:
        if self.straggler is not None and ranks > 1:
            return STRAGGLER if rank == self.straggler else BUSY_WAIT
        return self.design


@dataclass(frozen=True)
class LabScenario:
    """A job: its phases, ranks (one GPU each) and its surroundings."""

    name: str
    title: str
    phases: tuple[Phase, ...]
    covers: tuple[str, ...]  # the scenarios this run shows
    ranks: int = 1
    gpm: bool = True  # Hopper's GPM counters (else spinning is told by power alone)
    neighbours: int = 0  # processes outside the job saturating the cores
    observe_after_exit_s: float = 0.0  # the daemon keeps watching the GPU after the exit
    model_bytes: int = 16 * GiB
    seed: int = 0

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LabScenario:
        phases = tuple(Phase(**{**p, "design": Label(**p["design"])}) for p in d["phases"])
        return cls(**{**d, "phases": phases, "covers": tuple(d["covers"])})


# --------------------------------------------------------------------------- the scenarios


def _rng(name: str, seed: int) -> random.Random:
    return random.Random(seed * 1_000_003 + zlib.crc32(name.encode()))


def _cheap(r: random.Random, step: float, workers: int = 2) -> dict[str, Any]:
    """A loader far faster than the GPU (a healthy run), even on a loaded machine."""
    return {"step_s": step, "workers": workers, "batch_cost_s": step * r.uniform(0.05, 0.12)}


def _duty(r: random.Random) -> float:
    """A starved phase's designed duty cycle: well below any healthy line, and bursts long
    enough to show in the driver's samples (a loaded machine only starves it more)."""
    return r.uniform(0.45, 0.6)


def lifecycle(seed: int, scale: float) -> LabScenario:
    """A run's life: busy from its first sample (warm-up), workers forked mid-run, an
    evaluation phase its loader cannot keep up with, memory held with no work, the exit."""
    r = _rng("lifecycle", seed)
    step = r.uniform(0.15, 0.25)
    eval_step = step * r.uniform(0.3, 0.4)
    return LabScenario(
        "lifecycle",
        "healthy from the first sample, workers forked, evaluation, memory held, exit",
        (
            Phase("healthy", 12 * scale, HEALTHY, **_cheap(r, step)),
            Phase("workers-forked", 10 * scale, HEALTHY, add_workers=2, **_cheap(r, step)),
            Phase(
                "evaluation",
                12 * scale,
                starved("cpu"),
                step_s=eval_step,
                mode="evaluate",
                loader="val",
                workers=1,
                batch_cost_s=eval_step / _duty(r),
            ),
            Phase("memory-held", 12 * scale, IDLE_HELD, mode="hold"),
        ),
        (
            "healthy",
            "warm-up",
            "workers forked mid-run",
            "evaluation phase",
            "memory held with no work",
            "job exiting",
        ),
        observe_after_exit_s=6.0,
        model_bytes=int(r.uniform(8, 40) * GiB),
        seed=seed,
    )


def starved_cpu_gil(seed: int, scale: float) -> LabScenario:
    """Workers saturated building batches, then batches built in the main process."""
    r = _rng("starved", seed)
    step = r.uniform(0.18, 0.35)
    workers = r.choice((1, 2))
    return LabScenario(
        "starved",
        "starved by saturated workers, then GIL-bound (num_workers=0)",
        (
            Phase(
                "starved-cpu",
                12 * scale,
                starved("cpu"),
                step_s=step,
                workers=workers,
                batch_cost_s=workers * step / _duty(r),
            ),
            Phase(
                "starved-gil",
                12 * scale,
                starved("gil"),
                step_s=step,
                loader="main-process",
                workers=0,
                batch_cost_s=step / _duty(r),
            ),
        ),
        ("starved by saturated workers", "GIL-bound"),
        seed=seed,
    )


def io_bound(seed: int, scale: float) -> LabScenario:
    """Workers reading samples from disk past the page cache."""
    r = _rng("io", seed)
    step = r.uniform(0.18, 0.35)
    return LabScenario(
        "io",
        "I/O-bound: workers read from disk past the page cache",
        (
            Phase(
                "starved-io",
                14 * scale,
                starved("io"),
                step_s=step,
                data="io",
                workers=2,
                batch_cost_s=2 * step / _duty(r),
            ),
        ),
        ("I/O-bound",),
        seed=seed,
    )


def noisy_neighbour(seed: int, scale: float) -> LabScenario:
    """Processes outside the job saturate every core: the job healthy, then the job starved
    by something outside it (its tree asleep: no workers, 0 % CPU)."""
    r = _rng("noisy", seed)
    step = r.uniform(0.15, 0.3)
    return LabScenario(
        "noisy",
        "a noisy neighbour: the job healthy, then starved with its tree asleep",
        (
            Phase("healthy-beside-neighbours", 12 * scale, HEALTHY, **_cheap(r, step)),
            Phase(
                "starved-remote",
                12 * scale,
                starved("unknown"),
                step_s=step,
                loader="remote",
                data="remote",
                workers=0,
                batch_cost_s=step / _duty(r),
            ),
        ),
        ("noisy neighbour (job healthy)", "noisy neighbour (job starved)"),
        neighbours=os.cpu_count() or 2,
        seed=seed,
    )


def periodic(seed: int, scale: float) -> LabScenario:
    """Gaps at a rhythm: workers restarted at every epoch (no persistent_workers), then a
    checkpoint written synchronously to disk every few seconds."""
    r = _rng("periodic", seed)
    step = r.uniform(0.15, 0.25)
    epoch_s = r.uniform(2.5, 3.5)
    return LabScenario(
        "periodic",
        "workers restarted every epoch, then a checkpoint every few seconds",
        (
            Phase(
                "epoch-restarts",
                20 * scale,
                starved("cpu", "periodic gaps"),
                step_s=step,
                workers=2,
                batch_cost_s=step * 0.3,
                persistent=False,
                epoch_batches=max(4, round(epoch_s / step)),
                worker_init_s=r.uniform(1.0, 1.4),
            ),
            Phase(
                "checkpoints",
                20 * scale,
                starved("io", "periodic gaps"),
                loader="persistent",
                checkpoint_every_s=r.uniform(2.0, 2.6),
                checkpoint_s=r.uniform(1.2, 1.5),
                **_cheap(r, step),
            ),
        ),
        ("workers restarted every epoch", "checkpoint every N steps"),
        seed=seed,
    )


def ranks_barrier(seed: int, scale: float) -> LabScenario:
    """Ranks meeting at a barrier after every step, one a straggler (its peers spin); then
    the ranks stop meeting: every rank spins, none computes -- a busy-wait for the faces'
    hang threshold (``HANG_AFTER_S``), a hang after it."""
    r = _rng("ranks", seed)
    ranks = r.choice((2, 3, 4))
    step = r.uniform(0.12, 0.22)
    # Batches already prepared (no CPU): the ranks' pace is their GPUs', whatever the load.
    common: dict[str, Any] = {"step_s": step, "workers": 0, "batch_cost_s": 0.0}
    return LabScenario(
        "ranks",
        f"{ranks} ranks at a barrier each step with one straggler, then a hang",
        (
            Phase(
                "straggler",
                12 * scale,
                BUSY_WAIT,
                barrier=True,
                straggler=r.randrange(ranks),
                straggler_factor=r.uniform(1.8, 2.6),
                **common,
            ),
            Phase("spin", HANG_AFTER_S, BUSY_WAIT, mode="hang", **common),
            Phase("hang", 10 * scale, HANG, mode="hang", **common),
        ),
        ("ranks at a barrier with a straggler", "hang (every rank spinning)"),
        ranks=ranks,
        gpm=r.random() < 0.5,
        seed=seed,
    )


SCENARIOS = {
    f.__name__: f
    for f in (lifecycle, starved_cpu_gil, io_bound, noisy_neighbour, periodic, ranks_barrier)
}


def build(name: str, seed: int, scale: float = 1.0) -> LabScenario:
    """The scenario ``name`` (its short name, e.g. "starved") for ``seed``."""
    for f in SCENARIOS.values():
        scn = f(seed, scale)
        if scn.name == name:
            return scn
    raise KeyError(f"no scenario {name!r}; known: {', '.join(names())}")


def names() -> list[str]:
    return [f(0, 1.0).name for f in SCENARIOS.values()]


# --------------------------------------------------------------------------- the job


@dataclass
class Calibration:
    """This machine's disk, measured before the run so I/O phases cost what they should."""

    read_s: float = 0.0001  # one 64 KiB read past the page cache

    @classmethod
    def measure(cls, data_file: Path | None) -> Calibration:
        cal = cls()
        if data_file is not None:
            cal.read_s = max(1e-5, read_seconds(data_file, 128))
        return cal


CKPT_BLOCK = 4096


def write_checkpoint(path: Path, seconds: float) -> int:
    """Write a checkpoint synchronously for ``seconds``: each 4 KiB block reaches the disk
    before the next is written (O_DIRECT | O_DSYNC; O_DSYNC alone where the filesystem
    refuses O_DIRECT), so the process waits on the disk, not the CPU, and a fast disk is
    kept to tens of MB/s rather than filled."""
    buf = mmap.mmap(-1, CKPT_BLOCK)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(CKPT_BLOCK))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DSYNC
    try:
        fd = os.open(path, flags | getattr(os, "O_DIRECT", 0), 0o600)
    except OSError:
        fd = os.open(path, flags, 0o600)
    written = 0
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                written += os.write(fd, buf)
            except OSError:  # O_DIRECT refused at the first write (some filesystems)
                os.close(fd)
                fd = os.open(path, flags, 0o600)
    finally:
        os.close(fd)
    return written


@dataclass
class Shared:
    """What the ranks of one job share (made by the launcher before it forks them)."""

    ranks: int
    barrier: Any = None
    stop: Any = None  # per phase: the step after whose barrier it ends (set by rank 0)


@dataclass
class RankJob:
    """One rank's training process: its GPU, its loaders, its truth."""

    scn: LabScenario
    rank: int
    run_dir: Path
    data_file: Path | None
    cal: Calibration
    shared: Shared
    use_torch: bool = False
    loaders: dict[str, Any] = field(default_factory=dict)
    _iters: dict[str, Iterator[int]] = field(default_factory=dict)

    def run(self, go: Path) -> None:
        _wait_for(go)
        dev = EmulatedDevice(self.run_dir / f"gpu{self.rank}.emu").context()
        dev.alloc(self.scn.model_bytes)
        truth = TruthLog(self.run_dir / f"truth-rank{self.rank}.jsonl", dev, self.rank, self.rank)
        truth.mem_held = True
        try:
            for i, ph in enumerate(self.scn.phases):
                truth.phase(ph.name, ph.design_for(self.rank, self.scn.ranks))
                end = time.monotonic() + ph.seconds
                if ph.mode == "hold":
                    self._hold(dev, truth, end)
                elif ph.mode == "hang":
                    dev.spin_until(lambda end=end: time.monotonic() >= end)  # type: ignore[misc]
                elif ph.mode == "evaluate":
                    self.evaluate(dev, truth, ph, i, end)
                    dev.synchronize()
                else:
                    self._train(dev, truth, ph, i, end)
                    dev.synchronize()  # the phase's queued steps run within it
            truth.tick()
            truth.end_phase()
        finally:
            dev.close()
            truth.has_context = False
            truth.close()
            for loader in self.loaders.values():
                _shutdown(loader)

    # --- the phases ------------------------------------------------------------------------

    def _hold(self, dev: EmulatedDevice, truth: TruthLog, end: float) -> None:
        dev.synchronize()
        while time.monotonic() < end:
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))
            truth.tick()

    def evaluate(
        self, dev: EmulatedDevice, truth: TruthLog, ph: Phase, idx: int, end: float
    ) -> None:
        """An evaluation loop: the training loop's batches and kernels, called from a
        function named as real validation code is (what ``--stacks`` reads as evaluation)."""
        self._train(dev, truth, ph, idx, end)

    def _train(self, dev: EmulatedDevice, truth: TruthLog, ph: Phase, idx: int, end: float) -> None:
        step = ph.step_s * (ph.straggler_factor if ph.straggler == self.rank else 1.0)
        loader = self._loader(ph)
        if ph.add_workers:
            loader.add_workers(ph.add_workers)
        wait_for = {"cpu": "loader_cpu", "io": "loader_io", "remote": "remote"}[ph.data]
        if ph.workers == 0 and ph.data == "cpu":
            wait_for = "main_cpu"
        next_ckpt = time.monotonic() + (ph.checkpoint_every_s or 0.0)
        steps = 0
        while True:
            steps += 1
            if ph.barrier:
                # Rank 0 decides which barrier is the phase's last, before it arrives there;
                # every rank reads it after that barrier (so all leave after the same one).
                if self.rank == 0 and time.monotonic() >= end:
                    self.shared.stop[idx] = steps
            elif time.monotonic() >= end:
                break
            self._next_batch(ph, loader, truth, wait_for)
            while (ahead := dev.queued_s() - step) > 0:  # CUDA's queue: a step ahead at most
                time.sleep(min(0.01, ahead))
            dev.launch(step)
            if ph.checkpoint_every_s and time.monotonic() >= next_ckpt:
                dev.synchronize()
                with truth.waiting("checkpoint"):
                    write_checkpoint(self.run_dir / f"ckpt-rank{self.rank}.bin", ph.checkpoint_s)
                next_ckpt = time.monotonic() + ph.checkpoint_every_s
            if ph.barrier:
                arrival = dev.spin_until(self.shared.barrier)
                truth.barrier(last=arrival == self.scn.ranks - 1)
                if self.shared.stop[idx] == steps:
                    break
            truth.tick()

    def _next_batch(self, ph: Phase, loader: Any, truth: TruthLog, wait_for: str) -> int:
        """The next batch, waited for (on ``wait_for``; on new workers starting up at an
        epoch's first batch without persistent workers)."""
        while True:
            it = self._iters.get(ph.loader)
            why = wait_for
            if it is None:
                it = self._iters[ph.loader] = iter(loader)
                if not ph.persistent and ph.workers:
                    why = "worker_start"
            try:
                with truth.waiting(why):
                    return next(it)
            except StopIteration:
                self._iters.pop(ph.loader, None)

    def _loader(self, ph: Phase) -> Any:
        loader = self.loaders.get(ph.loader)
        if loader is not None:
            return loader
        for old in self.loaders.values():  # a new loader: the previous one is done with
            _shutdown(old)
        self.loaders.clear()
        self._iters.clear()
        n = 1 << 30 if ph.epoch_batches is None else ph.epoch_batches * ph.samples
        per_sample = ph.batch_cost_s / ph.samples
        ds: Any
        if ph.data == "io":
            assert self.data_file is not None
            reads = max(1, round(per_sample / self.cal.read_s))
            ds = IoDataset(n, self.data_file, reads)
        elif ph.data == "remote":
            ds = RemoteDataset(n, per_sample)
        else:
            ds = CpuDataset(n, per_sample, ph.worker_init_s)
        loader = None
        if self.use_torch:
            loader = torch_loader(
                ds,
                ph.samples,
                ph.workers,
                persistent_workers=ph.persistent and ph.workers > 0,
                prefetch_factor=2 if ph.workers else None,
            )
        if loader is None:
            loader = Loader(ds, ph.samples, ph.workers, 2, ph.persistent)
        self.loaders[ph.loader] = loader
        return loader


def _shutdown(loader: Any) -> None:
    with contextlib.suppress(Exception):
        if isinstance(loader, Loader):
            loader.shutdown()


def _wait_for(path: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"livelab job: no go signal ({path}) within {timeout:.0f} s")
        time.sleep(0.005)


# --------------------------------------------------------------------------- the process


def run_job(scn: LabScenario, run_dir: Path, data_file: Path | None, use_torch: bool) -> int:
    """The job's main process: calibrate, say ready, run the rank(s), return a status."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if data_file is not None and any(p.data == "io" for p in scn.phases):
        make_data_file(data_file, DATA_FILE_BYTES)
    else:
        data_file = None
    cal = Calibration.measure(data_file)
    (run_dir / "calibration.json").write_text(json.dumps(asdict(cal)))
    go = run_dir / "go"
    ctx = mp.get_context("fork")
    shared = Shared(scn.ranks)
    if scn.ranks > 1:
        shared.barrier = ctx.Barrier(scn.ranks)
        shared.stop = ctx.Array("i", len(scn.phases), lock=False)
    else:
        shared.stop = [0] * len(scn.phases)
    (run_dir / "ready").write_text(json.dumps({"pid": os.getpid()}))
    print("ready", os.getpid(), flush=True)
    if scn.ranks == 1:
        RankJob(scn, 0, run_dir, data_file, cal, shared, use_torch).run(go)
        return 0
    procs = []
    for rank in range(scn.ranks):
        job = RankJob(scn, rank, run_dir, data_file, cal, shared, use_torch)
        p = ctx.Process(target=job.run, args=(go,), name=f"rank{rank}")
        p.start()
        procs.append(p)

    def stop(*_: object) -> None:
        for q in procs:
            q.terminate()

    signal.signal(signal.SIGTERM, stop)
    status = 0
    for p in procs:
        p.join()
        status = status or (p.exitcode or 0)
    return status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run one live-lab training job.")
    ap.add_argument("scenario", choices=names())
    ap.add_argument("--scenario-json", help="the scenario exactly (as the runner passes it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--dir", type=Path, required=True, help="the run's folder")
    ap.add_argument("--data", type=Path, help="data file for I/O-bound phases")
    ap.add_argument("--torch", action="store_true", help="PyTorch's DataLoader (if installed)")
    ap.add_argument("--phase-seconds", type=float, help="every phase this long (overrides)")
    args = ap.parse_args(argv)
    if args.scenario_json:
        scn = LabScenario.from_json(json.loads(args.scenario_json))
    else:
        scn = build(args.scenario, args.seed, args.scale)
    if args.phase_seconds:
        scn = replace(scn, phases=tuple(replace(p, seconds=args.phase_seconds) for p in scn.phases))
    return run_job(scn, args.dir, args.data, args.torch)


if __name__ == "__main__":
    sys.exit(main())
