"""The host sampler: the only module in gpumon that imports ``psutil``.

Machine-wide CPU (per core), iowait, load, memory and disk throughput, and, for a watched
pid, its whole process tree: DataLoader workers hold no CUDA context, so NVML never sees
them, yet their CPU is exactly what tells a starved GPU's cause.

Rates come from counter deltas between two calls (``cpu_times``), never from psutil's
stateful ``cpu_percent(None)``.  Processes that vanish or deny access mid-sample are
dropped or read as ``None``; a negative delta (counter reset, pid reuse) is clamped.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

from gpumon.errors import ProcessGoneError
from gpumon.model import HostSample, ProcessSample, ProcTreeSample

# --- pure arithmetic on counters ---------------------------------------------------------


def cpu_busy_pct(before: object, after: object) -> tuple[float | None, float | None]:
    """(busy %, iowait %) of one CPU between two ``cpu_times`` readings.

    Idle and iowait count as not busy; a zero or negative interval gives (None, None).
    """
    total = _total(after) - _total(before)
    if total <= 0:
        return None, None
    idle = max(0.0, after.idle - before.idle)  # type: ignore[attr-defined]
    iowait = max(0.0, getattr(after, "iowait", 0.0) - getattr(before, "iowait", 0.0))
    busy = max(0.0, min(100.0, 100.0 * (total - idle - iowait) / total))
    return busy, max(0.0, min(100.0, 100.0 * iowait / total))


def _total(times: object) -> float:
    """All CPU time; Linux already counts guest time inside user/nice (as psutil does)."""
    guest = getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    return sum(times) - guest  # type: ignore[call-overload]


def rate(before: float | None, after: float | None, seconds: float) -> float | None:
    """Per-second rate of a counter, clamped at 0 (a reset is not negative throughput)."""
    if before is None or after is None or seconds <= 0:
        return None
    return max(0.0, (after - before) / seconds)


# --- host -----------------------------------------------------------------------------


class HostSampler:
    """Machine-wide CPU, iowait, load, memory and disk throughput, as deltas per tick."""

    def __init__(self) -> None:
        self._t = time.monotonic()
        self._cpu = psutil.cpu_times(percpu=True)
        self._disk = self._disk_counters()

    @staticmethod
    def _disk_counters() -> tuple[float, float] | None:
        try:
            io = psutil.disk_io_counters(perdisk=False)
        except (OSError, RuntimeError):
            return None
        return None if io is None else (float(io.read_bytes), float(io.write_bytes))

    def sample(self) -> HostSample:
        t = time.monotonic()
        cpu = psutil.cpu_times(percpu=True)
        per_core = [cpu_busy_pct(b, a) for b, a in zip(self._cpu, cpu, strict=False)]
        busy = [b for b, _ in per_core if b is not None]
        iowait = [w for _, w in per_core if w is not None]
        disk = self._disk_counters()
        seconds = t - self._t
        read = write = None
        if disk is not None and self._disk is not None:
            read = rate(self._disk[0], disk[0], seconds)
            write = rate(self._disk[1], disk[1], seconds)
        try:
            load = psutil.getloadavg()
        except OSError:
            load = (None, None, None)
        mem = psutil.virtual_memory()
        self._t, self._cpu, self._disk = t, cpu, disk
        return HostSample(
            t_s=t,
            # All cores or none: a missing reading must not pass for an idle core.
            cpu_pct_per_core=tuple(busy) if len(busy) == len(per_core) else (),
            cpu_pct=sum(busy) / len(busy) if busy else None,
            iowait_pct=sum(iowait) / len(iowait) if iowait else None,
            load_1m=load[0],
            load_5m=load[1],
            load_15m=load[2],
            mem_used_bytes=int(mem.total - mem.available),
            mem_total_bytes=int(mem.total),
            disk_read_bytes_per_s=read,
            disk_write_bytes_per_s=write,
        )


# --- the watched process tree ------------------------------------------------------------


@dataclass
class _Seen:
    """What we keep of a process between ticks to turn its counters into rates."""

    proc: psutil.Process
    t: float
    cpu_s: float | None
    read_bytes: float | None
    write_bytes: float | None


def _children_procfs(pid: int, procfs: str) -> list[int] | None:
    """Direct children from /proc/PID/task/*/children (cheap: no scan of every process).

    None where the kernel lacks the file (CONFIG_PROC_CHILDREN), so the caller falls back.
    """
    task_dir = f"{procfs}/{pid}/task"
    try:
        tids = os.listdir(task_dir)
    except FileNotFoundError:
        return []
    except OSError:
        return None
    children: list[int] = []
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/children", "rb") as fh:
                children.extend(int(x) for x in fh.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"{task_dir}/{tid}"):
                continue  # the thread exited between listdir and open
            return None
        except OSError:
            continue
    return children


class ProcessTreeSampler:
    """The watched process and every descendant, re-discovered each tick.

    Descendants spawned later (DataLoader workers come and go each epoch) are picked up;
    the first tick a process is seen only sets its baseline (its rates are None).
    """

    def __init__(self, root_pid: int, *, procfs: str = "/proc") -> None:
        try:
            root = psutil.Process(root_pid)
            root.status()
        except psutil.NoSuchProcess:
            raise ProcessGoneError(f"no process with pid {root_pid} exists.") from None
        except psutil.AccessDenied:
            raise ProcessGoneError(
                f"process {root_pid} exists but cannot be read (permission denied): "
                "run gpumon as the same user or as root."
            ) from None
        self.root_pid = root_pid
        self._procfs = procfs
        self._root = root
        self._seen: dict[int, _Seen] = {}
        self._procfs_children = True

    def _descendants(self) -> list[int]:
        if self._procfs_children:
            found: list[int] = []
            frontier = [self.root_pid]
            while frontier:
                pid = frontier.pop()
                kids = _children_procfs(pid, self._procfs)
                if kids is None:
                    self._procfs_children = False
                    return self._descendants()
                found.extend(kids)
                frontier.extend(kids)
            return found
        try:
            return [p.pid for p in self._root.children(recursive=True)]
        except psutil.Error:
            return []

    def cmdline(self) -> tuple[str, ...] | None:
        try:
            return tuple(self._root.cmdline()) or None
        except psutil.Error:
            return None

    def root_alive(self) -> bool:
        try:
            return self._root.is_running() and self._root.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def pids(self) -> list[int]:
        """The tree's pids now (root first), for matching against NVML's process lists."""
        return [self.root_pid, *self._descendants()] if self.root_alive() else []

    def sample(self) -> ProcTreeSample:
        t = time.monotonic()
        alive = self.root_alive()
        pids = [self.root_pid, *self._descendants()] if alive else []
        samples = [s for s in (self._sample_one(pid, t) for pid in pids) if s is not None]
        for gone in set(self._seen) - {s.pid for s in samples}:
            del self._seen[gone]
        return ProcTreeSample(
            t_s=t, root_pid=self.root_pid, processes=tuple(samples), root_alive=alive
        )

    def _process(self, pid: int) -> psutil.Process:
        seen = self._seen.get(pid)
        if seen is not None and seen.proc.is_running():  # is_running also catches pid reuse
            return seen.proc
        self._seen.pop(pid, None)
        return self._root if pid == self.root_pid else psutil.Process(pid)

    def _sample_one(self, pid: int, t: float) -> ProcessSample | None:
        try:
            proc = self._process(pid)
            with proc.oneshot():
                status = proc.status()
                ppid = proc.ppid()
                name = proc.name()
                threads = _or_none(proc.num_threads)
                times = _or_none(proc.cpu_times)
                io = _or_none(proc.io_counters)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None  # vanished mid-sample: it simply is not part of the tree any more
        except psutil.AccessDenied:
            return ProcessSample(pid, None, None, None, None, None, None, None)
        cpu_s = None if times is None else times.user + times.system
        read_b = None if io is None else float(io.read_bytes)
        write_b = None if io is None else float(io.write_bytes)
        before = self._seen.get(pid)
        self._seen[pid] = _Seen(proc, t, cpu_s, read_b, write_b)
        cpu_pct = read_rate = write_rate = None
        if before is not None:
            seconds = t - before.t
            cpu_rate = rate(before.cpu_s, cpu_s, seconds)
            cpu_pct = None if cpu_rate is None else 100.0 * cpu_rate
            read_rate = rate(before.read_bytes, read_b, seconds)
            write_rate = rate(before.write_bytes, write_b, seconds)
        return ProcessSample(
            pid=pid,
            ppid=ppid,
            name=name,
            cpu_pct=cpu_pct,
            num_threads=threads,
            read_bytes_per_s=read_rate,
            write_bytes_per_s=write_rate,
            status=status,
        )


def _or_none(fn):  # type: ignore[no-untyped-def]
    """Read one optional process field: denied access gives None, not a lost process."""
    try:
        return fn()
    except psutil.AccessDenied:
        return None


def cpu_count() -> int | None:
    return psutil.cpu_count(logical=True)
