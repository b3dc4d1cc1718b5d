"""An emulated GPU that real processes drive: the writer side of the fake NVML's driven file.

A workload calls ``EmulatedDevice`` where a training loop would call CUDA: ``context()`` when
it creates its CUDA context, ``launch``/``kernel`` for a step's kernels, ``spin_until`` while
it waits at a barrier (NCCL ranks spin on a few SMs: utilisation ~100 %, little power),
``alloc``/``free`` for memory.  It writes what it does into a small shared file that the fake
``libnvidia-ml.so.1`` (tests/fakenvml, ``FakeGPU(driven=path)``) maps and reads, so the
driver's sample buffer, power, GPM counters, memory and process list follow what the job
really does -- a GPU waits because the process feeding it waits.  No GPU, no CUDA.

File layout (native byte order, mirrored in fakenvml.c's "driven GPUs" region)::

    header  64 B   magic "GPUEMU01", version, ring_len, max_ctx, entry_size, ctx_off,
                   ring_off, head (entries published), ctx_gen (bumped per context change)
    ctx     32 B   x max_ctx: seq (odd while written), pid (0: free), mem_bytes
    ring    32 B   x ring_len: seq (i + 1 once entry i is whole), t_ns (CLOCK_MONOTONIC,
                   = time.monotonic_ns()), pid, kind (0 idle, 1 compute, 2 spin), sm, power

An entry says "from t_ns on, this process's stream is <kind>".  A kernel is written whole
when launched -- (start, compute) and (end, idle) -- so a writer the scheduler delays never
stretches it, as a real GPU runs its queue whatever the host does.  Writers hold an flock
while they write (several processes may share one GPU); the reader takes none: each entry
is written before it is published (its seq, then head), and the reader checks seq around
its copy.  Stores of aligned 8-byte fields through ctypes are single stores; on x86 (TSO)
they become visible in program order, which is all the protocol needs.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

MAGIC = int.from_bytes(b"GPUEMU01", "little")
VERSION = 1
IDLE, COMPUTE, SPIN = 0, 1, 2
MiB = 1 << 20
GiB = 1 << 30

#: What a spinning collective shows: every sample busy, a few SMs of a hundred active, and
#: little of the busy power (NVIDIA/nccl#689: "100 % but not using a lot of power").
SPIN_SM = 0.03
SPIN_POWER = 0.08
#: A compute kernel of a training step keeps most SMs busy at the card's busy power.
COMPUTE_SM = 0.85
COMPUTE_POWER = 1.0
#: A CUDA context's own memory (cuBLAS/cuDNN workspaces and the context itself).
CONTEXT_BYTES = 512 * MiB


class _Header(ctypes.Structure):
    _fields_ = [
        ("magic", ctypes.c_uint64),
        ("version", ctypes.c_uint32),
        ("ring_len", ctypes.c_uint32),
        ("max_ctx", ctypes.c_uint32),
        ("entry_size", ctypes.c_uint32),
        ("ctx_off", ctypes.c_uint32),
        ("ring_off", ctypes.c_uint32),
        ("head", ctypes.c_uint64),
        ("ctx_gen", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 2),
    ]


class _Ctx(ctypes.Structure):
    _fields_ = [
        ("seq", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("mem_bytes", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 2),
    ]


class _Entry(ctypes.Structure):
    _fields_ = [
        ("seq", ctypes.c_uint64),
        ("t_ns", ctypes.c_int64),
        ("pid", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),
        ("sm", ctypes.c_float),
        ("power", ctypes.c_float),
    ]


assert ctypes.sizeof(_Header) == 64 and ctypes.sizeof(_Ctx) == 32
assert ctypes.sizeof(_Entry) == 32


def create(path: str | os.PathLike[str], ring_len: int = 4096, max_ctx: int = 16) -> Path:
    """Make an empty driven file (atomically: the fake never maps half a file)."""
    path = Path(path)
    ctx_off = ctypes.sizeof(_Header)
    ring_off = ctx_off + max_ctx * ctypes.sizeof(_Ctx)
    size = ring_off + ring_len * ctypes.sizeof(_Entry)
    buf = bytearray(size)
    hdr = _Header.from_buffer(buf)
    hdr.magic, hdr.version, hdr.ring_len, hdr.max_ctx = MAGIC, VERSION, ring_len, max_ctx
    hdr.entry_size, hdr.ctx_off, hdr.ring_off = ctypes.sizeof(_Entry), ctx_off, ring_off
    del hdr  # release the buffer export before writing
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(bytes(buf))
    os.replace(tmp, path)
    return path


class _Waitable(Protocol):
    def wait(self, timeout: float | None = ...) -> object: ...


class EmulatedDevice:
    """One process's handle on an emulated GPU (open one per process: forked children must
    open their own; a handle refuses to write from a process other than its opener)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        self._mm = mmap.mmap(self._fd, 0)
        self._hdr = _Header.from_buffer(self._mm)
        if self._hdr.magic != MAGIC or self._hdr.version != VERSION:
            raise ValueError(f"{self.path} is not a driven-GPU file of version {VERSION}")
        n_ctx, n_ring = self._hdr.max_ctx, self._hdr.ring_len
        self._ctx = (_Ctx * n_ctx).from_buffer(self._mm, self._hdr.ctx_off)
        self._ring = (_Entry * n_ring).from_buffer(self._mm, self._hdr.ring_off)
        self._pid = os.getpid()
        self._slot: int | None = None
        self._tail_ns = 0  # when the last kernel queued on this stream ends
        self._allocs: dict[int, int] = {}
        self._next_handle = 1
        #: This process's own GPU activity, (start_ns, end_ns, kind), for its truth log.
        self.intervals: list[tuple[int, int, int]] = []

    # --- writing ---------------------------------------------------------------------------

    def _mine(self) -> None:
        if os.getpid() != self._pid:
            raise RuntimeError("an EmulatedDevice is used only by the process that opened it")

    def _publish(self, entries: list[tuple[int, int, float, float]]) -> None:
        """Append (t_ns, kind, sm, power) entries of this process, in order."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            hdr, n = self._hdr, self._hdr.ring_len
            for t_ns, kind, sm, power in entries:
                i = hdr.head
                e = self._ring[i % n]
                e.seq = 0  # the slot is being rewritten: readers skip it
                e.t_ns, e.pid, e.kind, e.sm, e.power = t_ns, self._pid, kind, sm, power
                e.seq = i + 1  # complete...
                hdr.head = i + 1  # ...then published
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _set_ctx(self, mem_bytes: int, pid: int) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            if self._slot is None:
                free = [i for i, c in enumerate(self._ctx) if c.pid in (0, pid)]
                stale = [i for i, c in enumerate(self._ctx) if not _alive(c.pid)]
                if not free and not stale:
                    raise RuntimeError(f"{self.path}: every context slot is taken")
                self._slot = (free or stale)[0]
            c = self._ctx[self._slot]
            c.seq += 1  # odd: being written
            c.pid, c.mem_bytes = pid, mem_bytes
            c.seq += 1
            self._hdr.ctx_gen += 1
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _mem(self) -> int:
        return CONTEXT_BYTES + sum(self._allocs.values())

    # --- what a training process does --------------------------------------------------------

    def context(self) -> EmulatedDevice:
        """Create this process's context on the GPU: NVML lists the pid from now on."""
        self._mine()
        self._set_ctx(self._mem(), self._pid)
        return self

    def alloc(self, nbytes: int) -> int:
        """Allocate device memory; returns a handle for ``free``."""
        self._mine()
        if self._slot is None:
            self.context()
        handle = self._next_handle
        self._next_handle += 1
        self._allocs[handle] = int(nbytes)
        self._set_ctx(self._mem(), self._pid)
        return handle

    def free(self, handle: int) -> None:
        self._mine()
        self._allocs.pop(handle)
        self._set_ctx(self._mem(), self._pid)

    def launch(self, seconds: float, sm: float = COMPUTE_SM, power: float = COMPUTE_POWER) -> int:
        """Queue a kernel of ``seconds`` behind the ones queued; returns when it will end
        (monotonic ns).  Returns at once, as a CUDA launch does."""
        self._mine()
        if self._slot is None:
            self.context()
        start = max(time.monotonic_ns(), self._tail_ns)
        end = start + max(0, round(seconds * 1e9))
        self._publish([(start, COMPUTE, sm, power), (end, IDLE, 0.0, 0.0)])
        self._tail_ns = end
        self.intervals.append((start, end, COMPUTE))
        return end

    def queued_s(self) -> float:
        """Seconds of work still queued on this stream."""
        return max(0.0, (self._tail_ns - time.monotonic_ns()) * 1e-9)

    def synchronize(self) -> None:
        """Block until every queued kernel has run (``torch.cuda.synchronize()``)."""
        while True:
            left = self._tail_ns - time.monotonic_ns()
            if left <= 0:
                return
            time.sleep(left * 1e-9)

    def kernel(self, seconds: float, sm: float = COMPUTE_SM, power: float = COMPUTE_POWER) -> None:
        """A synchronous step: ``seconds`` of compute, waited for."""
        self.launch(seconds, sm, power)
        self.synchronize()

    def spin_until(
        self,
        done: _Waitable | Callable[[], bool],
        poll_s: float = 0.002,
        sm: float = SPIN_SM,
        power: float = SPIN_POWER,
    ) -> object:
        """Spin on the GPU until ``done`` (an object with ``wait()`` such as an Event or a
        Barrier, or a predicate polled every ``poll_s``), as a rank waits in a collective:
        the kernels queued run first, then the GPU reads busy on few SMs at little power.
        Returns what ``wait()`` returned."""
        self._mine()
        if self._slot is None:
            self.context()
        self.synchronize()
        start = time.monotonic_ns()
        self._publish([(start, SPIN, sm, power)])
        result: object = None
        try:
            if hasattr(done, "wait"):
                result = done.wait()  # type: ignore[union-attr]
            else:
                while not done():  # type: ignore[operator]
                    time.sleep(poll_s)
        finally:
            end = time.monotonic_ns()
            self._publish([(end, IDLE, 0.0, 0.0)])
            self._tail_ns = end
            self.intervals.append((start, end, SPIN))
        return result

    def close(self) -> None:
        """Destroy the context (the process's kernels stop; its memory is freed)."""
        if os.getpid() != self._pid or self._slot is None:
            return
        now = time.monotonic_ns()
        if self._tail_ns > now:  # queued work is dropped with the context
            self._publish([(now, IDLE, 0.0, 0.0)])
        self._set_ctx(0, 0)
        self._slot = None

    # --- reading back (tests) --------------------------------------------------------------

    def busy_between(self, t0_ns: int, t1_ns: int, kind: int | None = None) -> float:
        """Seconds of this process's own kernels (of ``kind``, or any) within [t0, t1]."""
        total = 0
        for a, b, k in self.intervals:
            if kind is not None and k != kind:
                continue
            lo, hi = max(a, t0_ns), min(b, t1_ns)
            if hi > lo:
                total += hi - lo
        return total * 1e-9


def _alive(pid: int) -> bool:
    if pid == 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
