"""Real Python processes doing one thing each, for the stack tests (``--stacks``).

Run as ``python stackjob.py MODE [LIFETIME_S]``; prints ``ready PID...`` (its own pid, then
its workers' or ranks') once they run, then does MODE until LIFETIME_S passes or it is
terminated (its children go with it).  Function names are plain on purpose: a rule must
recognise the activity by the frames the libraries (or the C call's line) show, not by a
name chosen for the test -- except where a name is the rule (``evaluate``).

Modes: loader (main waits on a queue, two workers decode), main-decode, read, checkpoint
(pickle.dump), evaluation, gpu-wait (``.item()`` blocking in C), step, collective (two
ranks under a launcher, torch's names via the stand-in package, one rank elsewhere),
torch-loader (a real DataLoader, two workers), torch-save, torch-gloo (two real gloo ranks,
one elsewhere).
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import pickle
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    from PIL import Image  # noqa: F401  (decode with Pillow where it is installed)

    HAVE_PIL = True
except ImportError:
    HAVE_PIL = False


def _jpeg() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (384, 384), (90, 140, 30)).save(buf, format="JPEG")
    return buf.getvalue()


def decode_image(blob: bytes | None) -> object:
    """One sample's decode and augmentation: Pillow's, or a pure-Python stand-in."""
    if blob is not None:
        from PIL import Image

        img = Image.open(io.BytesIO(blob))
        return img.convert("RGB").resize((192, 192)).rotate(7)
    return decode_jpeg_pure(20000)


def decode_jpeg_pure(n: int) -> int:
    """A decode without Pillow: the rule that knows it is its name."""
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) & 0xFFFF
    return acc


def produce(q: mp.Queue, parent: int) -> None:  # type: ignore[type-arg]
    blob = _jpeg() if HAVE_PIL else None
    while os.getppid() == parent:
        sample = decode_image(blob)
        q.put(0 if sample is None else 1)


def consume(q: mp.Queue) -> None:  # type: ignore[type-arg]
    q.get()


def run_loader(end: float) -> list[int]:
    """The main process takes each sample as soon as a worker has decoded one.  The queue
    holds what the workers decode while the main process waits for a CPU (a busy machine
    wakes it late): they decode on, as workers with a prefetch do, and never wait on it."""
    q: mp.Queue = mp.Queue(64)  # type: ignore[type-arg]
    procs = [mp.Process(target=produce, args=(q, os.getpid()), daemon=True) for _ in range(2)]
    for p in procs:
        p.start()
    _ready([p.pid for p in procs])
    while time.monotonic() < end:
        consume(q)
    return []


def run_main_decode(end: float) -> None:
    blob = _jpeg() if HAVE_PIL else None
    _ready([])
    while time.monotonic() < end:
        decode_image(blob)


def run_read(end: float) -> None:
    fd, path = tempfile.mkstemp(prefix="stackjob-read-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(os.urandom(1 << 20) * 32)
        _ready([])
        while time.monotonic() < end:
            load_shard(path)
    finally:
        os.unlink(path)


def load_shard(path: str) -> int:
    total = 0
    with open(path, "rb", buffering=0) as fh:
        while True:
            chunk = fh.read(1 << 20)
            if not chunk:
                return total
            total += len(chunk)


def run_checkpoint(end: float) -> None:
    fd, path = tempfile.mkstemp(prefix="stackjob-ckpt-")
    os.close(fd)
    state = {"weights": list(range(400_000)), "step": 0}
    try:
        with open(path, "wb") as fh:
            _ready([])
            while time.monotonic() < end:
                persist(state, fh)
    finally:
        os.unlink(path)


def persist(state: dict[str, object], fh: io.BufferedWriter) -> None:
    fh.seek(0)
    pickle.dump(state, fh)


def run_evaluation(end: float) -> None:
    _ready([])
    while time.monotonic() < end:
        evaluate(2000)


def evaluate(batches: int) -> int:
    correct = 0
    for i in range(batches):
        correct += forward(i) % 2
    return correct


def forward(i: int) -> int:
    return sum(j * i for j in range(200))


class _Loss:
    """A loss whose ``.item()`` blocks in C until the GPU (a timer) is done."""

    item = staticmethod(signal.pause)


def run_gpu_wait(end: float) -> None:
    signal.signal(signal.SIGALRM, lambda *_: None)
    signal.setitimer(signal.ITIMER_REAL, 0.3, 0.3)
    loss = _Loss()
    _ready([])
    while time.monotonic() < end:
        value = loss.item()
        del value


def run_step(end: float) -> None:
    _ready([])
    while time.monotonic() < end:
        train_step(3000)


def train_step(n: int) -> int:
    acc = 0
    for i in range(n):
        acc ^= i * 7
    return acc


def rank(index: int, group: object, end: float, parent: int) -> None:
    sys.path.insert(0, os.path.join(HERE, "standin", "site-packages"))
    import torch.distributed as dist  # the stand-in

    dist.init_process_group(group)
    while time.monotonic() < end and os.getppid() == parent:
        if index == 1:
            next_batch_slowly()
        dist.all_reduce([index])


def next_batch_slowly() -> None:
    time.sleep(0.6)  # the straggler's own work, outside any collective


def run_collective(end: float) -> None:
    group = mp.Barrier(2)
    ranks = [
        mp.Process(target=rank, args=(i, group, end, os.getpid()), daemon=True) for i in range(2)
    ]
    for p in ranks:
        p.start()
    _ready([p.pid for p in ranks])
    while time.monotonic() < end and all(p.is_alive() for p in ranks):
        time.sleep(0.1)  # the launcher only waits, as torchrun's agent does


def run_torch_loader(end: float) -> None:
    import torch
    from torch.utils.data import DataLoader, Dataset

    blob = _jpeg() if HAVE_PIL else None

    class Images(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 10**7

        def __getitem__(self, i: int) -> object:
            decode_image(blob)
            return torch.zeros(4)

    loader = DataLoader(Images(), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    _ready(list(getattr(it, "_workers_pids", None) or [w.pid for w in it._workers]))
    while time.monotonic() < end:
        next(it)


def run_torch_save(end: float) -> None:
    import torch

    fd, path = tempfile.mkstemp(prefix="stackjob-torch-")
    os.close(fd)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])
    try:
        _ready([])
        while time.monotonic() < end:
            torch.save(model.state_dict(), path)
    finally:
        os.unlink(path)


def gloo_rank(index: int, port: int, end: float, parent: int, up: object) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=index, world_size=2)
    t = torch.ones(16)
    dist.all_reduce(t)
    up.put(index)  # type: ignore[attr-defined]
    while time.monotonic() < end and os.getppid() == parent:
        if index == 1:
            next_batch_slowly()
        dist.all_reduce(t)


def run_torch_gloo(end: float) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    up: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    ranks = [
        mp.Process(target=gloo_rank, args=(i, port, end, os.getpid(), up), daemon=True)
        for i in range(2)
    ]
    for p in ranks:
        p.start()
    up.get(timeout=120)
    up.get(timeout=120)  # both ranks past their first collective
    _ready([p.pid for p in ranks])
    while time.monotonic() < end and all(p.is_alive() for p in ranks):
        time.sleep(0.1)


def _ready(children: list[int]) -> None:
    print("ready", os.getpid(), *children, flush=True)


MODES = {
    "loader": run_loader,
    "main-decode": run_main_decode,
    "read": run_read,
    "checkpoint": run_checkpoint,
    "evaluation": run_evaluation,
    "gpu-wait": run_gpu_wait,
    "step": run_step,
    "collective": run_collective,
    "torch-loader": run_torch_loader,
    "torch-save": run_torch_save,
    "torch-gloo": run_torch_gloo,
}


def main() -> None:
    mode = sys.argv[1]
    lifetime = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    mp.set_start_method("fork")
    # SIGTERM ends the run as an exit does: daemon children are stopped by atexit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    MODES[mode](time.monotonic() + lifetime)


if __name__ == "__main__":
    main()
