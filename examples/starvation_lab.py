#!/usr/bin/env python3
"""A starvation lab: one small PyTorch training run whose input pipeline starves the GPU
on purpose, one way after another, so gpumon can be checked against known truth.

Phases (each runs for --phase-seconds, in the order given by --phases):

  healthy      the batch already lives on the GPU: nothing waits for the host
  starved-cpu  heavy CPU augmentation in too few DataLoader worker processes
  starved-gil  the same augmentation in the main process (num_workers=0)
  starved-io   samples read from files with the page cache bypassed (O_DIRECT) or dropped
               (posix_fadvise DONTNEED); where neither reaches a disk, throttled reads
  busy-wait    a kernel that spins on the GPU while no work is done, as NCCL ranks do
               while they wait for a peer: high utilisation, low power

The starved phases are calibrated at start-up on this machine (GPU step time, CPU cost of
one augmentation pass, disk read latency) so that the GPU is busy about --duty of the time
in bursts of about --burst-ms: visible as bursts and gaps in NVML's sub-second samples.

Every phase's start and end are printed on stdout as JSON lines with the wall time and
time.monotonic() -- the clock gpumon's samples use -- so a recording can be labelled
(see examples/label_trace.py).  Progress and warnings go to stderr.

Needs PyTorch and a CUDA GPU; without them it says so and exits with status 2.
`--device cpu` runs the plumbing without a GPU (for testing the lab itself; the GPU
phases then show nothing gpumon could see).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import mmap
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

PHASE_HELP = {
    "healthy": "the batch already lives on the GPU: nothing waits for the host",
    "starved-cpu": "heavy CPU augmentation in too few DataLoader worker processes",
    "starved-gil": "the same augmentation in the main process (num_workers=0)",
    "starved-io": "samples read from files past the page cache (O_DIRECT or fadvise)",
    "busy-wait": "a kernel spinning on the GPU with no work, as NCCL ranks waiting on a peer",
}
PHASES = tuple(PHASE_HELP)
EXIT_NO_GPU = 2
PAGE = 4096


# --- output ------------------------------------------------------------------------------


PHASE_LOG: list[Any] = []  # extra files the JSON lines also go to (--phase-log)


def emit(event: str, **data: Any) -> None:
    """One JSON line on stdout, flushed at once (a recorder may be reading it live)."""
    line = json.dumps(
        {
            "event": event,
            "wall_s": round(time.time(), 3),
            "mono_s": round(time.monotonic(), 3),
            **data,
        }
    )
    print(line, flush=True)
    for f in PHASE_LOG:
        f.write(line + "\n")
        f.flush()


def note(msg: str) -> None:
    print(f"starvation_lab: {msg}", file=sys.stderr, flush=True)


# --- arguments ---------------------------------------------------------------------------


def _phases(text: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in names if p not in PHASES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown phase {', '.join(bad) or '(none)'}; choose from {', '.join(PHASES)}"
        )
    return names


def _positive(kind: type) -> Any:
    def check(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0: {text!r}")
        return value

    return check


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="starvation_lab.py",
        description="A PyTorch training run whose input pipeline starves the GPU on purpose, "
        "phase after phase, printing each phase's start and end as JSON lines (wall time and "
        "time.monotonic(), gpumon's clock) so a gpumon recording can be labelled. Needs "
        "PyTorch and a CUDA GPU.",
        epilog="phases: " + "; ".join(f"{k}: {v}" for k, v in PHASE_HELP.items()),
    )
    p.add_argument(
        "--phases",
        type=_phases,
        default=PHASES,
        metavar="LIST",
        help=f"comma-separated phases to run in order (default: {','.join(PHASES)})",
    )
    p.add_argument(
        "--phase-seconds",
        type=_positive(float),
        default=30.0,
        metavar="N",
        help="seconds per phase (default 30)",
    )
    p.add_argument(
        "--device", default="cuda", help="torch device (default cuda, i.e. the current CUDA GPU)"
    )
    p.add_argument("--batch-size", type=_positive(int), default=64)
    p.add_argument(
        "--image-size",
        type=_positive(int),
        default=128,
        help="synthetic images are 3 x N x N (default 128)",
    )
    p.add_argument(
        "--width",
        type=_positive(int),
        default=128,
        help="channels of the conv net's first stage (default 128)",
    )
    p.add_argument(
        "--burst-ms",
        type=_positive(float),
        default=300.0,
        help="GPU time per loaded batch in the starved phases (default 300 ms: "
        "longer than the driver's 1/6 s sample period, so bursts show)",
    )
    p.add_argument(
        "--duty",
        type=_positive(float),
        default=0.35,
        help="target share of time the GPU is busy when starved (default 0.35)",
    )
    p.add_argument(
        "--cpu-workers",
        type=_positive(int),
        default=3,
        help="DataLoader workers in starved-cpu (default 3: too few)",
    )
    p.add_argument(
        "--io-workers",
        type=_positive(int),
        default=2,
        help="DataLoader workers in starved-io (default 2)",
    )
    p.add_argument(
        "--io-chunk-kb",
        type=_positive(int),
        default=4,
        help="read size in starved-io; small reads make the latency show (default 4)",
    )
    p.add_argument(
        "--phase-log",
        metavar="FILE",
        help="also write the JSON lines to FILE (handy when stdout is shown by "
        "`gpumon watch -- ...`)",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="where starved-io writes its sample files (default: a temporary "
        "directory under the current one, since /tmp is often in memory)",
    )
    return p.parse_args(argv)


# --- CPU work shared by the starved phases -------------------------------------------------


class AugmentedImages:
    """Synthetic images with a deliberately heavy, single-threaded CPU augmentation.

    A plain object (DataLoader accepts any map-style dataset), so this module imports no
    torch at import time and ``--help`` works without it.
    """

    def __init__(self, size: int, passes: int, length: int = 1 << 30) -> None:
        self.size = size
        self.passes = passes
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Any, int]:
        import torch
        import torch.nn.functional as F

        g = torch.Generator().manual_seed(index)
        img = torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=g)
        return augment(torch, F, img, self.passes, g), index % 10


def augment(torch: Any, F: Any, img: Any, passes: int, g: Any) -> Any:
    """Blur/sharpen passes, a flip and a colour jitter: CPU time proportional to ``passes``."""
    x = img.float().unsqueeze(0) / 255.0
    for k in range(passes):
        blurred = F.avg_pool2d(x, 3, stride=1, padding=1)
        x = blurred if k % 2 == 0 else (2.0 * x - blurred).clamp_(0.0, 1.0)
    if torch.rand((), generator=g) < 0.5:
        x = x.flip(-1)
    x = x * (0.8 + 0.4 * torch.rand(3, 1, 1, generator=g))
    return (x.squeeze(0).clamp_(0.0, 1.0) * 255.0).to(torch.uint8)


# --- I/O work for starved-io ---------------------------------------------------------------


def _aligned_buffer(size: int) -> mmap.mmap:
    return mmap.mmap(-1, max(PAGE, size))  # anonymous maps are page-aligned: O_DIRECT-safe


def read_file(path: str, chunk: int, mode: str, delay_s: float = 0.0) -> bytes:
    """Read a whole file in ``chunk``-byte reads, past the page cache where ``mode`` allows.

    ``direct``: O_DIRECT (no cache at all); ``dontneed``: drop the file's cached pages first
    and disable read-ahead, so each small read goes to the device; ``throttled``: ordinary
    reads with ``delay_s`` slept per chunk, for when no real device is reachable.
    """
    flags = os.O_RDONLY | (getattr(os, "O_DIRECT", 0) if mode == "direct" else 0)
    fd = os.open(path, flags)
    try:
        if mode == "dontneed":
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        size = os.fstat(fd).st_size
        out = bytearray()
        buf = _aligned_buffer(chunk)
        offset = 0
        while offset < size:
            n = os.preadv(fd, [buf], offset)
            if n <= 0:
                break
            out += buf[:n]
            offset += n
            if delay_s:
                time.sleep(delay_s)
        buf.close()
        return bytes(out)
    finally:
        os.close(fd)


class FileImages:
    """Samples stored one per file; each read goes past the page cache (see read_file)."""

    def __init__(
        self,
        paths: Sequence[str],
        size: int,
        chunk: int,
        mode: str,
        delay_s: float,
        length: int = 1 << 30,
    ) -> None:
        self.paths = list(paths)
        self.size = size
        self.chunk = chunk
        self.mode = mode
        self.delay_s = delay_s
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Any, int]:
        import torch

        raw = read_file(self.paths[index % len(self.paths)], self.chunk, self.mode, self.delay_s)
        n = 3 * self.size * self.size
        img = torch.frombuffer(bytearray(raw[:n]), dtype=torch.uint8)
        return img.view(3, self.size, self.size), index % 10


def write_sample_files(
    directory: str, count: int, size_bytes: int, prefix: str = "sample"
) -> list[str]:
    """``count`` files of random bytes, synced to disk and dropped from the page cache."""
    paths = []
    block = os.urandom(min(size_bytes, 1 << 20))
    for i in range(count):
        path = os.path.join(directory, f"{prefix}-{i:04d}.bin")
        with open(path, "wb") as f:
            left = size_bytes
            while left > 0:
                f.write(block[: min(left, len(block))])
                left -= len(block)
            f.flush()
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        paths.append(path)
    return paths


def choose_io_mode(directory: str, chunk: int) -> tuple[str, float]:
    """The strongest way to reach the device here, and its measured latency per read."""
    probe = write_sample_files(directory, 1, 64 * chunk, prefix="probe")[0]
    try:
        for mode in ("direct", "dontneed"):
            try:
                t0 = time.perf_counter()
                read_file(probe, chunk, mode)
                per_read = (time.perf_counter() - t0) / 64
            except OSError:  # O_DIRECT refused (tmpfs, some overlay filesystems)
                continue
            # Under ~5 µs a read came from memory: no device behind this directory.
            if per_read >= 5e-6:
                return mode, per_read
        return "throttled", 0.0
    finally:
        os.unlink(probe)


# --- the model and the GPU side ----------------------------------------------------------


def build_model(torch: Any, width: int) -> Any:
    nn = torch.nn

    def block(cin: int, cout: int, stride: int) -> Any:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
        )

    w = width
    return nn.Sequential(
        block(3, w, 2),
        block(w, w, 1),
        block(w, 2 * w, 2),
        block(2 * w, 2 * w, 1),
        block(2 * w, 4 * w, 2),
        block(4 * w, 4 * w, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * w, 10),
    )


class Trainer:
    """The training step, with a bounded queue of GPU work (blocking waits, no CPU spin)."""

    def __init__(self, torch: Any, device: Any, width: int) -> None:
        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self.model = build_model(torch, width).to(device).to(memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.in_flight: collections.deque[Any] = collections.deque()
        self.steps = 0

    def to_input(self, images: Any, labels: Any) -> tuple[Any, Any]:
        torch = self.torch
        x = images.to(self.device, non_blocking=True).float().div_(255.0)
        x = x.contiguous(memory_format=torch.channels_last)
        return x, labels.to(self.device, non_blocking=True)

    def step(self, x: Any, y: Any, repeats: int = 1) -> None:
        torch = self.torch
        for _ in range(repeats):
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cuda):
                loss = self.loss_fn(self.model(x), y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self.steps += 1
        self.mark()

    def mark(self, depth: int = 2) -> None:
        """Keep at most ``depth`` batches of work queued: wait (sleeping) for older ones."""
        if not self.cuda:
            return
        ev = self.torch.cuda.Event(blocking=True)
        ev.record()
        self.in_flight.append(ev)
        while len(self.in_flight) > depth:
            self.in_flight.popleft().synchronize()

    def drain(self) -> None:
        while self.in_flight:
            self.in_flight.popleft().synchronize()
        if self.cuda:
            self.torch.cuda.synchronize()


def time_steps(trainer: Trainer, x: Any, y: Any, n: int) -> float:
    """Seconds per training step on a resident batch (after the caller's warm-up)."""
    trainer.drain()
    t0 = time.perf_counter()
    for _ in range(n):
        trainer.step(x, y)
    trainer.drain()
    return (time.perf_counter() - t0) / n


# --- the plan: sizes calibrated on this machine -------------------------------------------


def calibrate(args: argparse.Namespace, torch: Any, trainer: Trainer) -> dict[str, Any]:
    """Measure the GPU step and one augmentation pass; size each starved phase from them."""
    import torch.nn.functional as F

    b, s = args.batch_size, args.image_size
    x = torch.randint(0, 256, (b, 3, s, s), dtype=torch.uint8)
    y = torch.randint(0, 10, (b,))
    xg, yg = trainer.to_input(x, y)
    for _ in range(3):
        trainer.step(xg, yg)
    step_s = time_steps(trainer, xg, yg, 5)
    step_s = time_steps(trainer, xg, yg, max(5, min(50, int(1.0 / max(step_s, 1e-4)))))
    repeats = max(1, round(args.burst_ms / 1000.0 / step_s))
    burst_s = repeats * step_s
    # The host must deliver one batch per burst_s / duty: that is the starved cadence.
    batch_period_s = burst_s / args.duty

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker
    try:
        g = torch.Generator().manual_seed(0)
        img = x[0]
        augment(torch, F, img, 2, g)
        t0 = time.perf_counter()
        for _ in range(10):
            augment(torch, F, img, 0, g)
        base_s = (time.perf_counter() - t0) / 10
        t0 = time.perf_counter()
        for _ in range(10):
            augment(torch, F, img, 20, g)
        pass_s = max(1e-6, ((time.perf_counter() - t0) / 10 - base_s) / 20)
    finally:
        torch.set_num_threads(threads)

    def passes_for(per_sample_s: float) -> int:
        return max(1, math.ceil((per_sample_s - base_s) / pass_s))

    plan: dict[str, Any] = {
        "step_s": round(step_s, 5),
        "steps_per_batch": repeats,
        "burst_s": round(burst_s, 4),
        "batch_period_s": round(batch_period_s, 4),
        "augment_base_s": round(base_s, 6),
        "augment_pass_s": round(pass_s, 6),
        "cpu_passes": passes_for(batch_period_s * args.cpu_workers / b),
        "gil_passes": passes_for(batch_period_s / b),
    }
    return plan


def plan_io(args: argparse.Namespace, plan: dict[str, Any], directory: str) -> dict[str, Any]:
    """File size and read mode so that --io-workers deliver a batch per batch_period_s."""
    chunk = args.io_chunk_kb * 1024
    mode, per_read = choose_io_mode(directory, chunk)
    per_sample_s = plan["batch_period_s"] * args.io_workers / args.batch_size
    image = 3 * args.image_size * args.image_size
    min_reads = math.ceil(image / chunk)
    delay = 0.0
    if mode == "throttled":
        note(
            f"no disk reachable under {directory} (O_DIRECT refused and reads come from "
            "memory): starved-io will throttle reads with sleeps, which gpumon cannot tell "
            "from other waiting"
        )
        reads = min_reads
        delay = per_sample_s / reads
    else:
        reads = max(min_reads, math.ceil(per_sample_s / per_read))
    reads = min(reads, (8 << 20) // chunk)  # at most 8 MiB per sample file
    return {
        "io_mode": mode,
        "io_read_s": round(per_read, 7),
        "io_reads_per_sample": reads,
        "io_file_bytes": reads * chunk,
        "io_delay_s": delay,
        "io_files": 48,
    }


# --- phases --------------------------------------------------------------------------------


def batches(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


def run_loader_phase(
    torch: Any, trainer: Trainer, loader: Any, repeats: int, until: float
) -> dict[str, Any]:
    n = 0
    for images, labels in batches(loader):
        x, y = trainer.to_input(images, labels)
        trainer.step(x, y, repeats)
        n += 1
        if time.monotonic() >= until:
            break
    return {"batches": n}


def phase_healthy(
    torch: Any, trainer: Trainer, args: argparse.Namespace, plan: dict[str, Any], until: float
) -> dict[str, Any]:
    b, s = args.batch_size, args.image_size
    x = torch.randint(0, 256, (b, 3, s, s), dtype=torch.uint8)
    xg, yg = trainer.to_input(x, torch.randint(0, 10, (b,)))
    n = 0
    while time.monotonic() < until:
        trainer.step(xg, yg, plan["steps_per_batch"])
        n += 1
    return {"batches": n}


def _loader(torch: Any, dataset: Any, args: argparse.Namespace, workers: int) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=False,
        num_workers=workers,
        pin_memory=trainer_is_cuda(args),
        prefetch_factor=2 if workers else None,
        persistent_workers=False,
    )


def trainer_is_cuda(args: argparse.Namespace) -> bool:
    return str(args.device).startswith("cuda")


def phase_starved_cpu(
    torch: Any, trainer: Trainer, args: argparse.Namespace, plan: dict[str, Any], until: float
) -> dict[str, Any]:
    data = AugmentedImages(args.image_size, plan["cpu_passes"])
    loader = _loader(torch, data, args, args.cpu_workers)
    out = run_loader_phase(torch, trainer, loader, plan["steps_per_batch"], until)
    return {**out, "workers": args.cpu_workers, "passes": plan["cpu_passes"]}


def phase_starved_gil(
    torch: Any, trainer: Trainer, args: argparse.Namespace, plan: dict[str, Any], until: float
) -> dict[str, Any]:
    data = AugmentedImages(args.image_size, plan["gil_passes"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core, as Python-side preprocessing would be
    try:
        loader = _loader(torch, data, args, 0)
        out = run_loader_phase(torch, trainer, loader, plan["steps_per_batch"], until)
    finally:
        torch.set_num_threads(threads)
    return {**out, "workers": 0, "passes": plan["gil_passes"]}


def phase_starved_io(
    torch: Any, trainer: Trainer, args: argparse.Namespace, plan: dict[str, Any], until: float
) -> dict[str, Any]:
    data = FileImages(
        plan["io_paths"],
        args.image_size,
        args.io_chunk_kb * 1024,
        plan["io_mode"],
        plan["io_delay_s"],
    )
    loader = _loader(torch, data, args, args.io_workers)
    out = run_loader_phase(torch, trainer, loader, plan["steps_per_batch"], until)
    return {**out, "workers": args.io_workers, "io_mode": plan["io_mode"]}


def phase_busy_wait(
    torch: Any, trainer: Trainer, args: argparse.Namespace, plan: dict[str, Any], until: float
) -> dict[str, Any]:
    if not trainer.cuda or not hasattr(torch.cuda, "_sleep"):
        time.sleep(max(0.0, until - time.monotonic()))
        return {"spins": 0, "note": "no GPU (or no torch.cuda._sleep): nothing spun"}
    cycles = plan["spin_cycles"]
    n = 0
    while time.monotonic() < until:
        torch.cuda._sleep(cycles)  # spins the SMs at full occupancy of one block: no work
        trainer.mark(depth=3)
        n += 1
    return {"spins": n, "spin_cycles": cycles}


PHASE_FUNCS = {
    "healthy": phase_healthy,
    "starved-cpu": phase_starved_cpu,
    "starved-gil": phase_starved_gil,
    "starved-io": phase_starved_io,
    "busy-wait": phase_busy_wait,
}


def spin_cycles(torch: Any, seconds: float = 0.05) -> int:
    """GPU clock cycles that ``torch.cuda._sleep`` spins in ``seconds``."""
    torch.cuda._sleep(1_000_000)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(50_000_000)
    torch.cuda.synchronize()
    per_s = 50_000_000 / max(1e-6, time.perf_counter() - t0)
    return max(1, int(per_s * seconds))


# --- main ----------------------------------------------------------------------------------


def load_torch(device: str) -> Any:
    """torch and the device, or None after saying in one sentence why the lab cannot run."""
    try:
        import torch
    except ImportError:
        note(
            "PyTorch is not installed, and this lab needs PyTorch with a CUDA GPU "
            "(pip install torch)."
        )
        return None
    if device.startswith("cuda") and not torch.cuda.is_available():
        note(
            "no CUDA GPU is available to PyTorch (torch.cuda.is_available() is False), and "
            "this lab needs one to starve."
        )
        return None
    return torch


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch = load_torch(args.device)
    if torch is None:
        return EXIT_NO_GPU
    # SIGTERM (a scheduler, `kill`) ends the run like Ctrl-C: sample files are removed.
    signal.signal(signal.SIGTERM, _terminate)
    if args.phase_log:
        PHASE_LOG.append(open(args.phase_log, "w", encoding="utf-8"))  # noqa: SIM115
    try:
        return run(args, torch)
    finally:
        for f in PHASE_LOG:
            f.close()
        PHASE_LOG.clear()


def _terminate(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace, torch: Any) -> int:
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    else:
        note(f"running on {device}: the lab's plumbing only; there is no GPU to starve")
    trainer = Trainer(torch, device, args.width)
    emit(
        "lab_start",
        pid=os.getpid(),
        phases=list(args.phases),
        phase_seconds=args.phase_seconds,
        device=str(device),
        gpu=torch.cuda.get_device_name(device) if trainer.cuda else None,
        torch=torch.__version__,
        argv=sys.argv[1:],
    )
    plan = calibrate(args, torch, trainer)
    if trainer.cuda and "busy-wait" in args.phases and hasattr(torch.cuda, "_sleep"):
        plan["spin_cycles"] = spin_cycles(torch)
    io_dir = None
    try:
        if "starved-io" in args.phases:
            io_dir = tempfile.mkdtemp(prefix="starvation-lab-", dir=args.data_dir or ".")
            plan.update(plan_io(args, plan, io_dir))
            plan["io_paths"] = write_sample_files(io_dir, plan["io_files"], plan["io_file_bytes"])
        emit("calibration", **{k: v for k, v in plan.items() if k != "io_paths"})
        trainer.drain()
        for name in args.phases:
            start = time.monotonic()
            emit("phase_start", phase=name)
            note(f"phase {name} for {args.phase_seconds:g} s")
            steps0 = trainer.steps
            stats = PHASE_FUNCS[name](torch, trainer, args, plan, start + args.phase_seconds)
            trainer.drain()  # this phase's GPU work must not spill into the next
            elapsed = time.monotonic() - start
            steps = trainer.steps - steps0
            emit(
                "phase_end",
                phase=name,
                seconds=round(elapsed, 3),
                steps=steps,
                images_per_s=round(stats.get("batches", 0) * args.batch_size / elapsed, 1),
                **stats,
            )
    except KeyboardInterrupt:
        note("interrupted")
        return 130
    finally:
        if io_dir is not None:
            shutil.rmtree(io_dir, ignore_errors=True)
    emit("lab_end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
