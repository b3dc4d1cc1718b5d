"""A DataLoader-shaped input pipeline: worker processes, index and result queues, prefetch.

It behaves as PyTorch's ``DataLoader`` does where gpumon can see it: ``num_workers`` forked
worker processes (children of the training process, so in its tree) each build whole batches
from the indices the main process sends them, at most ``prefetch_factor`` batches ahead per
worker, delivered in order; ``num_workers=0`` builds batches in the main process itself;
without ``persistent_workers`` the workers exit at the end of each epoch and new ones start
(and initialise) with the next.  ``torch_loader`` builds PyTorch's own where torch is
installed.

What a sample costs is the dataset's business (``CpuDataset`` burns CPU, ``IoDataset``
reads from disk past the page cache, ``RemoteDataset`` waits on something outside the job),
so a scenario chooses why its GPU waits and the process tree shows it as it would.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import multiprocessing as mp
import os
import queue
import random
import time
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Protocol

_CTX = mp.get_context("fork")  # as DataLoader's default on Linux: workers inherit the dataset


class Dataset(Protocol):
    """What the loader needs of a dataset."""

    def __len__(self) -> int: ...

    def worker_init(self, worker_id: int) -> None:
        """Run once in each new worker before its first sample (imports, opening files)."""

    def load(self, index: int) -> int:
        """Produce one sample; returns its size in bytes (the sample itself is not kept)."""


def burn(cpu_s: float) -> None:
    """Use ``cpu_s`` seconds of this thread's CPU: under contention it takes longer in
    wall-clock time, as decoding and augmentation do."""
    end = time.thread_time() + cpu_s
    x = 0
    while time.thread_time() < end:
        for _ in range(2000):
            x += 1


def name_process(name: str) -> None:
    """Set this process's name (comm, what ps and gpumon's tree show), as torch names its
    workers ``pt_data_worker``."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


class CpuDataset:
    """Samples that cost CPU (decode, augment): ``cpu_s`` each; a new worker first spends
    ``init_cpu_s`` starting up."""

    def __init__(self, n: int, cpu_s: float, init_cpu_s: float = 0.0) -> None:
        self.n, self.cpu_s, self.init_cpu_s = n, cpu_s, init_cpu_s

    def __len__(self) -> int:
        return self.n

    def worker_init(self, worker_id: int) -> None:
        burn(self.init_cpu_s)

    def load(self, index: int) -> int:
        return self.decode(index)

    def decode(self, index: int) -> int:
        """Decode and augment one sample: the CPU it costs, under the name a real dataset's
        frame has (what ``--stacks`` reads as decoding)."""
        burn(self.cpu_s)
        return 3 * 224 * 224


class RemoteDataset:
    """Samples fetched from something outside the job (an object store, a data service):
    the process sleeps ``wait_s`` per sample, its tree idle at 0 % CPU."""

    def __init__(self, n: int, wait_s: float) -> None:
        self.n, self.wait_s = n, wait_s

    def __len__(self) -> int:
        return self.n

    def worker_init(self, worker_id: int) -> None:
        pass

    def load(self, index: int) -> int:
        time.sleep(self.wait_s)
        return 3 * 224 * 224


READ_BLOCK = 64 * 1024


def make_data_file(path: Path, size: int) -> Path:
    """A file of ``size`` random-looking bytes, written once and synced (so later reads come
    from the disk, not from the writer's page cache)."""
    if path.exists() and path.stat().st_size == size:
        return path
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    block = os.urandom(1 << 20)
    with open(tmp, "wb") as f:
        for _ in range(size >> 20):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


class IoDataset:
    """Samples read from disk: ``reads`` random 64 KiB blocks each, with O_DIRECT (or, where
    the filesystem refuses it, after posix_fadvise(DONTNEED)) so each read goes to the disk,
    not the page cache: the workers wait in disk-sleep, iowait and read throughput rise."""

    def __init__(self, n: int, path: Path, reads: int) -> None:
        self.n, self.path, self.reads = n, Path(path), reads
        self._fd = -1
        self._direct = False
        self._buf: mmap.mmap | None = None
        self._blocks = max(1, self.path.stat().st_size // READ_BLOCK)
        self._rng = random.Random()

    def __len__(self) -> int:
        return self.n

    def worker_init(self, worker_id: int) -> None:
        self._open()
        self._rng = random.Random(worker_id * 7919 + os.getpid())

    def _open(self) -> None:
        if self._fd >= 0 and self._buf is not None:
            return
        self._buf = mmap.mmap(-1, READ_BLOCK)  # page-aligned, as O_DIRECT needs
        try:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
            self._direct = hasattr(os, "O_DIRECT")
            os.preadv(self._fd, [self._buf], 0)
        except OSError:  # tmpfs and some filesystems refuse O_DIRECT
            if self._fd >= 0:
                os.close(self._fd)
            self._fd = os.open(self.path, os.O_RDONLY)
            self._direct = False

    def load(self, index: int) -> int:
        self._open()
        assert self._buf is not None
        for _ in range(self.reads):
            off = self._rng.randrange(self._blocks) * READ_BLOCK
            if not self._direct:
                os.posix_fadvise(self._fd, off, READ_BLOCK, os.POSIX_FADV_DONTNEED)
            os.preadv(self._fd, [self._buf], off)
        return self.reads * READ_BLOCK


def read_seconds(path: Path, reads: int = 64) -> float:
    """Mean seconds of one IoDataset read on this machine (to size a sample)."""
    ds = IoDataset(1, path, reads)
    ds.worker_init(0)
    t = time.perf_counter()
    ds.load(0)
    return (time.perf_counter() - t) / reads


# --------------------------------------------------------------------------- the loader


def _worker_loop(dataset: Dataset, index_q: Any, result_q: Any, worker_id: int) -> None:
    name_process("pt_data_worker")
    try:
        dataset.worker_init(worker_id)
        while True:
            item = index_q.get()
            if item is None:
                break
            batch_no, indices = item
            size = sum(dataset.load(i) for i in indices)
            result_q.put((batch_no, size))
    except KeyboardInterrupt:
        pass
    finally:
        result_q.cancel_join_thread()


class Loader:
    """Batches of ``batch_size`` indices of ``dataset``, built by ``num_workers`` forked
    workers (or in this process when 0), in order, ``prefetch_factor`` per worker ahead."""

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        num_workers: int,
        prefetch_factor: int = 2,
        persistent_workers: bool = True,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers
        self._workers: list[tuple[BaseProcess, Any]] = []
        self._result_q: Any = None
        self._next_worker = 0

    def __len__(self) -> int:
        return len(self.dataset) // self.batch_size

    # --- workers ---------------------------------------------------------------------------

    def _start_workers(self, n: int) -> None:
        if self._result_q is None:
            self._result_q = _CTX.Queue()
        for _ in range(n):
            wid = len(self._workers)
            index_q = _CTX.Queue()
            proc = _CTX.Process(
                target=_worker_loop,
                args=(self.dataset, index_q, self._result_q, wid),
                daemon=True,
                name=f"pt_data_worker-{wid}",
            )
            proc.start()
            self._workers.append((proc, index_q))

    def add_workers(self, n: int) -> None:
        """Fork ``n`` more workers now; they take batches from the next one sent on."""
        self.num_workers += n
        if self._workers:
            self._start_workers(n)

    def worker_pids(self) -> list[int]:
        return [p.pid for p, _ in self._workers if p.pid is not None]

    def shutdown(self) -> None:
        """Stop the workers (end of an epoch without persistent workers, or the end)."""
        for _, q in self._workers:
            with contextlib.suppress(Exception):
                q.put(None)
        deadline = time.monotonic() + 2.0
        for p, _ in self._workers:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(1.0)
        for _, q in self._workers:
            q.cancel_join_thread()
            q.close()
        self._workers = []
        if self._result_q is not None:
            self._result_q.cancel_join_thread()
            self._result_q.close()
            self._result_q = None
        self._next_worker = 0

    # --- iteration -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[int]:
        """One epoch: yields each batch's size in bytes, in order."""
        n_batches = len(self)
        bs = self.batch_size
        if self.num_workers == 0:
            for b in range(n_batches):
                yield sum(self.dataset.load(i) for i in range(b * bs, (b + 1) * bs))
            return
        if not self._workers:
            self._start_workers(self.num_workers)
        sent = 0
        done: dict[int, int] = {}
        want = 0
        while want < n_batches:
            while sent < n_batches and sent - want < self.prefetch_factor * len(self._workers):
                _, q = self._workers[self._next_worker % len(self._workers)]
                self._next_worker += 1
                q.put((sent, list(range(sent * bs, (sent + 1) * bs))))
                sent += 1
            while want not in done:
                try:
                    b, size = self._result_q.get(timeout=1.0)
                except queue.Empty:
                    if not any(p.is_alive() for p, _ in self._workers):
                        raise RuntimeError("every DataLoader worker died") from None
                    continue
                done[b] = size
            yield done.pop(want)
            want += 1
        if not self.persistent_workers:
            self.shutdown()


def torch_loader(dataset: Dataset, batch_size: int, num_workers: int, **kw: Any) -> Any:
    """PyTorch's own DataLoader over ``dataset`` (None where torch is not installed)."""
    try:
        from torch.utils.data import DataLoader  # type: ignore[import-not-found]
        from torch.utils.data import Dataset as TorchDataset  # type: ignore[import-not-found]
    except ImportError:
        return None

    class _Wrapped(TorchDataset):  # type: ignore[misc]
        def __len__(self) -> int:
            return len(dataset)

        def __getitem__(self, i: int) -> int:
            return dataset.load(i)

    def init(worker_id: int) -> None:
        name_process("pt_data_worker")
        dataset.worker_init(worker_id)

    return DataLoader(
        _Wrapped(),
        batch_size=batch_size,
        num_workers=num_workers,
        worker_init_fn=init if num_workers else None,
        multiprocessing_context="fork" if num_workers else None,
        **kw,
    )
