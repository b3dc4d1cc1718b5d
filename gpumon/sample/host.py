"""The host sampler: the only module in gpumon that imports ``psutil``.

Machine-wide CPU (per core), iowait, load, memory and disk throughput, and, for a watched
pid, its whole process tree: DataLoader workers hold no CUDA context, so NVML never sees
them, yet their CPU is exactly what tells a starved GPU's cause.

Rates come from counter deltas between two calls (CPU times, disk sectors), never from
psutil's stateful ``cpu_percent(None)``.  Processes that vanish or deny access mid-sample are
dropped or read as ``None``; a negative delta (counter reset, pid reuse) is clamped.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from gpumon.errors import ProcessGoneError
from gpumon.model import HostSample, ProcessSample, ProcTreeSample

# --- pure arithmetic on counters ---------------------------------------------------------

# A CPU's times in /proc/stat's order (psutil's ``scputimes`` on Linux has the same):
# user nice system idle iowait irq softirq steal guest guest_nice.
_IDLE, _IOWAIT, _GUEST, _GUEST_NICE = 3, 4, 8, 9


def cpu_busy_pct(
    before: Sequence[float], after: Sequence[float]
) -> tuple[float | None, float | None]:
    """(busy %, iowait %) of one CPU between two readings of its times.

    Idle and iowait count as not busy; a zero or negative interval gives (None, None).
    """
    total = _total(after) - _total(before)
    if total <= 0:
        return None, None
    idle = max(0.0, after[_IDLE] - before[_IDLE])
    iowait = 0.0
    if len(after) > _IOWAIT and len(before) > _IOWAIT:
        iowait = max(0.0, after[_IOWAIT] - before[_IOWAIT])
    busy = max(0.0, min(100.0, 100.0 * (total - idle - iowait) / total))
    return busy, max(0.0, min(100.0, 100.0 * iowait / total))


def _total(times: Sequence[float]) -> float:
    """All CPU time; Linux already counts guest time inside user/nice (as psutil does)."""
    guest = sum(times[_GUEST : _GUEST_NICE + 1])
    return sum(times) - guest


def rate(before: float | None, after: float | None, seconds: float) -> float | None:
    """Per-second rate of a counter, clamped at 0 (a reset is not negative throughput)."""
    if before is None or after is None or seconds <= 0:
        return None
    return max(0.0, (after - before) / seconds)


def parse_proc_stat(text: str) -> list[tuple[int, ...]]:
    """Each CPU's times (clock ticks, /proc/stat's order) from the ``cpuN`` lines.

    ValueError where there are none (not a /proc/stat)."""
    end = text.find("\nintr")  # the per-CPU lines come first; the rest can be long
    cores = [
        tuple(map(int, line.split()[1:]))
        for line in (text if end < 0 else text[:end]).splitlines()
        if line.startswith("cpu") and line[3:4].isdigit()
    ]
    if not cores:
        raise ValueError("no per-CPU lines in /proc/stat")
    return cores


# --- host -----------------------------------------------------------------------------


_READ_CHUNK = 65536


def _read_text(path: str) -> str:
    """Read a small procfs file with raw syscalls (about 3x cheaper than open().read()).

    A read that returns less than was asked for is the end of the file (procfs and sysfs
    fill the buffer until their last record), so no second read is made to see an empty
    one: on procfs that read is not free, the kernel regenerates the file to find its end
    (for /proc/PID/stat it tripled the cost).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        chunk = os.read(fd, _READ_CHUNK)
        if len(chunk) < _READ_CHUNK:
            return chunk.decode("ascii", errors="replace")
        chunks = [chunk]
        while chunk := os.read(fd, _READ_CHUNK):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("ascii", errors="replace")


# A children file (/proc/PID/task/TID/children) is a seq_file the kernel hands out a page
# at a time: a read longer than half the smallest page may have been cut there, so it is
# read on to its end (5,000 children are 30 KB, and one read gave 683 of them).  A shorter
# read is the whole file (the kernel would have added the next pid of a few bytes): no
# second read is made to see an empty one.
_WHOLE_LISTING = 2048


def _read_children(path: str, fd: int | None = None) -> str:
    """A children file to its end, through ``fd`` (read from offset 0) or by ``path``."""
    own = fd is None
    if fd is None:
        fd = os.open(path, os.O_RDONLY)
    try:
        chunk = os.pread(fd, _READ_CHUNK, 0)
        if len(chunk) <= _WHOLE_LISTING:
            return chunk.decode("ascii", errors="replace")
        chunks, at = [chunk], len(chunk)
        while chunk := os.pread(fd, _READ_CHUNK, at):
            chunks.append(chunk)
            at += len(chunk)
    finally:
        if own:
            os.close(fd)
    return b"".join(chunks).decode("ascii", errors="replace")


class _KeptFile:
    """A procfs or sysfs file kept open and re-read with ``pread`` at offset 0 (the
    kernel regenerates it on each read): a third of the cost of open + read + close.

    ``keep=False`` (a test's tree of plain files, which may be replaced) opens it per
    read.  A failed read closes it, and the next read opens it afresh (a disk that went
    away and came back).
    """

    def __init__(self, path: str, keep: bool) -> None:
        self.path = path
        self._keep = keep
        self._fd: int | None = None

    def read(self) -> str:
        """The file's text; raises OSError as open() and read() do."""
        if not self._keep:
            return _read_text(self.path)
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        try:
            data = os.pread(self._fd, _READ_CHUNK, 0)
        except OSError:
            self.close()
            raise
        if len(data) >= _READ_CHUNK:  # too long for one read
            return _read_text(self.path)
        return data.decode("ascii", errors="replace")

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


# Virtual block devices sit on top of physical ones: counting them too would double the
# throughput.  Loop and RAM disks are not storage a training job waits on.
_VIRTUAL_DISK_PREFIXES = ("loop", "ram", "dm-", "md", "zram", "nbd", "sr")


def parse_diskstats(text: str, disks: frozenset[str]) -> tuple[float, float]:
    """(read bytes, written bytes) summed over ``disks`` from /proc/diskstats.

    Sectors there are always 512 bytes, whatever the device's own sector size.
    """
    read = written = 0
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 9 and fields[2] in disks:
            read += int(fields[5])
            written += int(fields[9])
    return read * 512.0, written * 512.0


def parse_block_stat(text: str) -> tuple[float, float]:
    """(read bytes, written bytes) from one disk's /sys/block/DEV/stat (the columns of
    /proc/diskstats after the device's name; sectors of 512 bytes there too)."""
    fields = text.split()
    return int(fields[2]) * 512.0, int(fields[6]) * 512.0


def parse_meminfo(text: str) -> tuple[int, int] | None:
    """(used, total) bytes: used is total minus MemAvailable, as free(1) and psutil say."""
    values = []
    for key in ("MemTotal:", "MemAvailable:"):  # near the top: no need to split every line
        at = text.find(key)
        if at < 0:
            return None
        end = text.find("\n", at)
        values.append(int(text[at + len(key) : None if end < 0 else end].split()[0]) * 1024)
    total, available = values
    return total - available, total


class HostSampler:
    """Machine-wide CPU, iowait, load, memory and disk throughput, as deltas per tick.

    Read straight from /proc and /sys, each file kept open and re-read in place: CPU
    times from /proc/stat (psutil where it cannot be read), memory from /proc/meminfo,
    disk throughput from each physical disk's /sys/block/DEV/stat (psutil's versions
    stat every block device's sysfs entries each call, several times the cost; all
    together the host's part of a tick went from ~50 to ~20 us on 2 cores).
    """

    def __init__(self, *, procfs: str = "/proc", sysfs: str = "/sys") -> None:
        self._procfs = procfs
        keep = procfs == "/proc" and sysfs == "/sys"  # a test's plain files are re-opened
        try:
            names = os.listdir(f"{sysfs}/block")
        except OSError:
            names = []
        disks = sorted(n for n in names if not n.startswith(_VIRTUAL_DISK_PREFIXES))
        self._disk_files = [_KeptFile(f"{sysfs}/block/{d}/stat", keep) for d in disks]
        self._stat = _KeptFile(f"{procfs}/stat", keep)
        self._meminfo = _KeptFile(f"{procfs}/meminfo", keep)
        try:  # /proc/stat where it can be read, else psutil for good (never mixed)
            self._proc_stat = bool(parse_proc_stat(self._stat.read()))
        except (OSError, ValueError):
            self._proc_stat = False
        self._t = time.monotonic()
        self._cpu = self._cpu_times()
        self._disk = self._disk_counters()

    def close(self) -> None:
        """Close the files kept open between ticks (also done when collected)."""
        for f in (self._stat, self._meminfo, *self._disk_files):
            f.close()

    def __del__(self) -> None:
        if hasattr(self, "_disk_files"):
            self.close()

    def _cpu_times(self) -> list[Sequence[float]]:
        """Each CPU's times in /proc/stat's order ([] where they cannot be read now)."""
        if not self._proc_stat:
            return list(psutil.cpu_times(percpu=True))
        try:
            return parse_proc_stat(self._stat.read())  # type: ignore[return-value]
        except (OSError, ValueError):
            return []

    def _disk_counters(self) -> tuple[float, float] | None:
        """(read, written) bytes summed over the physical disks; None if one is unreadable
        (a sum without it would read as a drop in throughput)."""
        if not self._disk_files:
            return None
        read = written = 0.0
        try:
            for f in self._disk_files:
                r, w = parse_block_stat(f.read())
                read += r
                written += w
        except (OSError, ValueError, IndexError):
            return None
        return read, written

    def _memory(self) -> tuple[int, int] | None:
        try:
            return parse_meminfo(self._meminfo.read())
        except (OSError, ValueError, IndexError):
            return None

    def sample(self) -> HostSample:
        t = time.monotonic()
        cpu = self._cpu_times()
        per_core = [cpu_busy_pct(b, a) for b, a in zip(self._cpu, cpu, strict=False)]
        busy = [b for b, _ in per_core if b is not None]
        iowait = [w for _, w in per_core if w is not None]
        all_cores = len(busy) == len(per_core) == len(cpu) == len(self._cpu)
        disk = self._disk_counters()
        seconds = t - self._t
        read = write = None
        if disk is not None and self._disk is not None:
            read = rate(self._disk[0], disk[0], seconds)
            write = rate(self._disk[1], disk[1], seconds)
        try:
            load: tuple[float | None, ...] = os.getloadavg()
        except OSError:
            load = (None, None, None)
        mem = self._memory()
        self._t, self._cpu, self._disk = t, cpu, disk
        return HostSample(
            t_s=t,
            # All cores or none: a missing reading must not pass for an idle core.
            cpu_pct_per_core=tuple(busy) if all_cores else (),
            cpu_pct=sum(busy) / len(busy) if all_cores and busy else None,
            iowait_pct=sum(iowait) / len(iowait) if iowait else None,
            load_1m=load[0],
            load_5m=load[1],
            load_15m=load[2],
            mem_used_bytes=None if mem is None else mem[0],
            mem_total_bytes=None if mem is None else mem[1],
            disk_read_bytes_per_s=read,
            disk_write_bytes_per_s=write,
        )


# --- the watched process tree ------------------------------------------------------------
#
# The tree is read straight from procfs: one read of /proc/PID/stat (state, ppid, CPU
# times, threads, start time) and one of /proc/PID/io per process per tick.  psutil's
# Process objects cost three to six file reads per process and a pid-reuse check that
# builds a second object; on a 32-process DataLoader tree that alone was ~8 ms a tick.

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk-sleep",
    "Z": "zombie",
    "T": "stopped",
    "t": "tracing-stop",
    "X": "dead",
    "I": "idle",
    "P": "parked",
    "W": "waking",
}


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of /proc/PID/stat gpumon uses (proc(5))."""

    name: str
    state: str
    ppid: int
    cpu_s: float  # utime + stime
    num_threads: int
    start_ticks: int  # start time since boot, in clock ticks: identifies a pid's owner


def _stat_fields(text: str) -> tuple[str, str, int, float, int, int]:
    """ProcStat's fields as a plain tuple (the per-process hot path builds no object).

    The name may hold spaces and parentheses, so the fields start after the last ')';
    only the 21 fields up to the start time are split off, not all 50.
    """
    open_paren, close_paren = text.index("("), text.rindex(")")
    fields = text[close_paren + 2 :].split(None, 20)
    state = fields[0]
    return (
        text[open_paren + 1 : close_paren],
        _STATES.get(state, state),
        int(fields[1]),
        (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS,
        int(fields[17]),
        int(fields[19]),
    )


def parse_stat(text: str) -> ProcStat:
    """Parse /proc/PID/stat."""
    return ProcStat(*_stat_fields(text))


def parse_io(text: str) -> tuple[float, float]:
    """(read_bytes, write_bytes) from /proc/PID/io: bytes that reached storage.

    KeyError where either line is missing, ValueError where a value is not a number.
    """
    words = text.split()
    if words[8:11:2] == ["read_bytes:", "write_bytes:"]:  # the kernel's order since 2.6.20
        return float(words[9]), float(words[11])
    try:
        read_at, write_at = words.index("read_bytes:"), words.index("write_bytes:")
    except ValueError:
        raise KeyError("read_bytes/write_bytes") from None
    return float(words[read_at + 1]), float(words[write_at + 1])


def _task_fields(text: str) -> tuple[int, bool]:
    """(ppid, is a thread) of a task from its /proc/TID/stat.

    /proc/TID answers for a thread too (it is only left out of the listing); the kernel
    sets a thread's exit signal (field 38) to -1, a process's to the signal its parent
    gets (SIGCHLD), so that field tells a new process from a new thread.
    """
    fields = text[text.rindex(")") + 2 :].split(None, 36)
    return int(fields[1]), fields[35] == "-1"


def _max_kept_fds() -> int:
    """How many procfs files the tree samplers of this process may keep open, all together:
    a quarter of the soft limit on open files, at most 1024 (a 128-process tree keeps
    one per thread of each process with few threads, two for each busy or larger one:
    about 260 for 8 ranks and 120 workers of 2 threads)."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        return 0
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(0, min(1024, soft // 4))


class FdBudget:
    """How many procfs files may be kept open, shared by every tree sampler that uses it.

    ``gpumon serve`` runs one tree sampler per job: a budget per sampler would multiply
    with the jobs and exhaust the open-file limit, after which every open (NVML's, the
    log's, a scrape's socket) fails.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.used >= self.limit:
                return False
            self.used += 1
            return True

    def give(self, n: int = 1) -> None:
        with self._lock:
            self.used -= n


_shared_budget: FdBudget | None = None
_shared_budget_lock = threading.Lock()


def shared_fd_budget() -> FdBudget:
    """The process-wide budget (sized from the open-file limit when first asked for)."""
    global _shared_budget
    with _shared_budget_lock:
        if _shared_budget is None:
            _shared_budget = FdBudget(_max_kept_fds())
        return _shared_budget


class _ProcFiles:
    """The children files of a tree walked tick after tick, kept open and re-read in place.

    ``pread(fd, n, 0)`` on an open /proc/PID/task/TID/children costs a fifth of open +
    read + close.  Semantics are those of opening the path each time: the kernel ties
    such an fd to the task, so once it exits (or its pid is reused) the read fails (ESRCH)
    and the path is opened afresh, which finds the new owner or nothing.  Files are kept
    while ``budget`` (shared by every sampler) allows, the rest are opened per read;
    without a budget nothing is kept.
    """

    def __init__(self, budget: FdBudget | None) -> None:
        self.budget = budget
        self._fds: dict[int, dict[str, int]] = {}

    def read(self, pid: int, path: str) -> str:
        """The text of ``path`` (a file of process ``pid``); raises OSError as open() does."""
        kept = self._fds.get(pid)
        fd = None if kept is None else kept.get(path)
        if fd is not None:
            try:
                data = os.pread(fd, _READ_CHUNK, 0)
            except OSError:  # the task is gone (ESRCH) or no longer readable
                data = None
            if data is not None and len(data) <= _WHOLE_LISTING:
                return data.decode("ascii", errors="replace")
            if data is not None:  # maybe cut at a page: read on to its end
                return _read_children(path, fd)
            self._close(pid, path)
        fd = _open_kept(path, self.budget)
        if fd is None:
            return _read_children(path)
        try:
            data = os.pread(fd, _READ_CHUNK, 0)
            if len(data) > _WHOLE_LISTING:  # maybe cut at a page: read on to its end
                data = _read_children(path, fd).encode("ascii")
        except BaseException:
            _close_kept(fd, self.budget)
            raise
        self._fds.setdefault(pid, {})[path] = fd
        return data.decode("ascii", errors="replace")

    def keep(self, budget: FdBudget | None) -> None:
        """Keep files open from now on under ``budget`` (None: keep none, close all)."""
        if budget is not self.budget:
            self.close()
            self.budget = budget

    def _close(self, pid: int, path: str) -> None:
        _close_kept(self._fds[pid].pop(path), self.budget)

    def forget(self, pid: int) -> None:
        """Close the files of a process that left the tree."""
        for fd in self._fds.pop(pid, {}).values():
            _close_kept(fd, self.budget)

    def close(self) -> None:
        for pid in list(self._fds):
            self.forget(pid)


def _open_kept(path: str, budget: FdBudget | None) -> int | None:
    """An fd on ``path`` to keep open, where ``budget`` has one left; None where it has
    not (the caller reads the path instead).  Raises OSError as open() does."""
    if budget is None or not budget.take():
        return None
    try:
        return os.open(path, os.O_RDONLY)
    except BaseException:
        budget.give()
        raise


def _close_kept(fd: int, budget: FdBudget | None) -> None:
    os.close(fd)
    if budget is not None:
        budget.give()


_SMALL_FILE = 4096  # /proc/PID/stat, io and schedstat: a few hundred bytes at most


def _pread_text(fd: int) -> str:
    """A small procfs file read through a kept fd (raises ProcessLookupError once its
    task is gone)."""
    return os.pread(fd, _SMALL_FILE, 0).decode("ascii", errors="replace")


def _children_procfs(
    pid: int,
    num_threads: int | None,
    procfs: str,
    files: _ProcFiles | None = None,
    tids: dict[int, tuple[int, list[str]]] | None = None,
) -> list[int] | None:
    """Direct children from /proc/PID/task/*/children (cheap: no scan of every process).

    A child is listed under the thread that forked it, so every thread's file is read:
    a single-threaded process has one task, itself, so its listing is skipped; for the
    others the listing is kept in ``tids`` while the thread count stays the same (a
    thread that exits fails its read, which lists the threads afresh next time), and the
    files are kept open in ``files`` (a training process has dozens of threads).  None
    only where the kernel lacks the file (CONFIG_PROC_CHILDREN: absent for a task that
    exists), so the caller falls back for good; a process that is gone has no children;
    any other failure (EMFILE, EACCES) raises OSError: the walk is incomplete.
    """
    task_dir = f"{procfs}/{pid}/task"
    if num_threads == 1:
        if files is not None:
            try:
                return [int(x) for x in files.read(pid, f"{task_dir}/{pid}/children").split()]
            except OSError:
                pass  # the slow path below tells a vanished process from a missing file
        names = [str(pid)]
    else:
        known = None if tids is None else tids.get(pid)
        if known is not None and known[0] == num_threads:
            names = known[1]
        else:
            try:
                names = os.listdir(task_dir)
            except FileNotFoundError:
                return []  # gone
            if tids is not None and num_threads is not None:
                tids[pid] = (num_threads, names)
    read = _read_children if files is None else (lambda path: files.read(pid, path))
    children: list[int] = []
    for tid in names:
        try:
            children.extend(int(x) for x in read(f"{task_dir}/{tid}/children").split())
        except FileNotFoundError:
            if tids is not None:
                tids.pop(pid, None)  # the threads changed: list them again next time
            if not os.path.exists(f"{task_dir}/{tid}"):
                continue  # the thread (or process) exited between listing and reading
            return None
        except OSError:
            if tids is not None:
                tids.pop(pid, None)
            raise
    return children


# A process with at most this many threads is watched through its threads' schedstat
# files (three numbers each: a quarter of the kernel's work for /proc/PID/stat): while
# none of its threads ran, nothing a tick reports of it changed.  With more threads one
# read of stat costs less than a probe per thread.
_PROBE_MAX_THREADS = 4
# The tree is walked through its children files every this many ticks even where the pid
# cursor says no task was created: a guard against a task the cursor does not show (one
# given a chosen pid by clone3's set_tid or after ns_last_pid was set back, as CRIU
# restores processes).  A walk opens every thread's children file: ~3.5 ms for a
# 128-process job on 2 cores, ~11 us a tick over 300 ticks (5 minutes at 1 Hz).
_WALK_EVERY_TICKS = 300
_GONE = (FileNotFoundError, ProcessLookupError)  # ENOENT by path, ESRCH through a kept fd
_OK, _EXITED, _LEFT = 0, 1, 2  # what a full read found: alive, a zombie, gone


class _Member:
    """A process of the tree and what is kept of it between ticks."""

    __slots__ = (
        "baseline",
        "busy",
        "cpu_s",
        "io_denied",
        "io_fd",
        "io_raw",
        "pid",
        "ppid",
        "probe_fds",
        "probe_raw",
        "ran",
        "read_b",
        "resting",
        "sample",
        "settled",
        "start_ticks",
        "stat_fd",
        "stat_raw",
        "write_b",
    )

    def __init__(self, pid: int, ppid: int | None, start_ticks: int = -1) -> None:
        self.pid = pid
        self.ppid = ppid
        self.start_ticks = start_ticks  # -1: not known yet
        self.cpu_s = 0.0  # the counters as of the last tick (with a baseline)
        self.read_b: float | None = None
        self.write_b: float | None = None
        self.baseline = False  # read on an earlier tick: its rates can be given
        self.stat_raw = ""  # the texts last read: unchanged texts need no parsing
        self.io_raw = ""
        self.stat_fd: int | None = None  # kept fds (None: read by path)
        self.io_fd: int | None = None
        self.io_denied = False  # its io cannot be read: not asked again
        self.probe_fds: tuple[int, ...] | None = None  # its threads' schedstat files
        self.probe_raw: bytes | None = None  # their text, read before its last full read
        # Its CPU time moved over the last tick, or it was running when read: it is read
        # in full again without asking its probe (it most likely ran; and a probe may not
        # show the time of a task still on its CPU: schedstat is brought up to date at
        # switches and scheduler ticks, stat whenever it is read).
        self.busy = False
        self.ran = False  # it ran over the last tick (its probe or its CPU time says so)
        self.sample = ProcessSample(pid, ppid, None, None, None, None, None, None)
        self.settled = False  # ``sample`` is what a tick without running gives
        self.resting = False  # settled, and no stat or io file kept: nothing to do at rest


class ProcessTreeSampler:
    """The watched process and every descendant, each tick.

    Reading each process in full each tick (stat, io, every thread's children file) cost
    ~11 us a process; most of a job's processes (idle DataLoader workers, helpers) do not
    run between two ticks, so what is read follows what can have changed:

    * A process with few threads is first asked whether any of its threads ran (their
      /proc/PID/task/TID/schedstat, on kept fds, read before anything else of it): if
      none did, its CPU time, I/O, state, name and thread count are as they were (each
      changes only by the process running) and last tick's sample stands, with 0 CPU
      and 0 bytes/s.  A process that ran, or has many threads, has stat and io read; one
      whose CPU time moved over the last tick (or was running) is read so without
      asking (it most likely ran again).  Two things change without the process
      running: its parent (see below) and its state on a wakeup, so a process woken but
      not yet run reads as sleeping until it runs.
    * A process joins the tree only by being created.  The kernel's pid cursor (the
      last pid it gave out, /proc/loadavg's last field) says whether any task was
      created since the last tick, and the pids given out since are checked for a
      parent in the tree, in the order they were given out (so a child of a new worker
      is found too): a new worker is seen on the first tick after it exists, as when
      every tick walked the tree.  Where checking the new pids would cost more than a
      walk, where the cursor cannot be trusted (not this process's procfs, or it did
      not give out the id of a thread started here) and every 300th tick, the tree is
      walked through the children files instead.  A cursor set back (ns_last_pid, as a
      CRIU restore does) can hide a new process until the next walk.
    * A process leaves the tree by exiting (its kept fd fails with ESRCH) or by being
      re-parented out of it when its parent exits (the stat of a departed process's
      children is read again on that tick).

    The first tick a process is seen only sets its baseline (its rates are None).  A pid
    reused by an unrelated process is a new process: the old one's kept fds fail, and
    where files are read by path its start time tells them apart.
    """

    def __init__(
        self, root_pid: int, *, procfs: str = "/proc", fd_budget: FdBudget | None = None
    ) -> None:
        self.root_pid = root_pid
        self._procfs = procfs
        try:
            self._root_start = parse_stat(_read_text(f"{procfs}/{root_pid}/stat")).start_ticks
        except FileNotFoundError:
            raise ProcessGoneError(
                f"no process with pid {root_pid} exists.", pid=root_pid
            ) from None
        except PermissionError:
            raise ProcessGoneError(
                f"process {root_pid} exists but cannot be read (permission denied): "
                "run gpumon as the same user or as root.",
                pid=root_pid,
            ) from None
        if procfs != "/proc":
            fd_budget = None  # a test's procfs of plain files may be replaced: read paths
        elif fd_budget is None:
            fd_budget = shared_fd_budget()
        self._budget = fd_budget
        self._members: dict[int, _Member] = {}  # the root first, then in the order found
        self._root_gone = False
        self._t: float | None = None
        self._ticks = 0
        self._procfs_children = True
        self._walk_due = True
        self._walk_files = 32  # children files the last walk read: what a walk costs
        self._pending: list[int] = []  # new pids not yet visible last tick: asked again
        # Probing needs the schedstat files (CONFIG_SCHED_INFO) and fds to keep them on.
        self._probe = fd_budget is not None and os.path.exists(
            f"{procfs}/{root_pid}/task/{root_pid}/schedstat"
        )
        try:
            self._pid_max: int | None = int(_read_text(f"{procfs}/sys/kernel/pid_max"))
        except (OSError, ValueError):
            self._pid_max = None
        self._cursor_fd: int | None = None
        self._cursor = self._trusted_cursor()
        self._children_files = _ProcFiles(None)
        self._walked_last = self._cursor is None  # walked last tick (or will every tick)
        self._tids: dict[int, tuple[int, list[str]]] = {}

    def close(self) -> None:
        """Close the procfs files kept open between ticks (also done when collected)."""
        for m in self._members.values():
            self._close_files(m)
        self._members.clear()
        self._children_files.close()
        if self._cursor_fd is not None:
            fd, self._cursor_fd = self._cursor_fd, None
            _close_kept(fd, self._budget)

    def __del__(self) -> None:
        if hasattr(self, "_children_files"):
            self.close()

    def cmdline(self) -> tuple[str, ...] | None:
        try:
            raw = _read_text(f"{self._procfs}/{self.root_pid}/cmdline")
        except OSError:
            return None
        return tuple(raw.rstrip("\0").split("\0")) if raw else None

    def root_alive(self) -> bool:
        """The root is the same process and not a zombie."""
        try:
            stat = parse_stat(_read_text(f"{self._procfs}/{self.root_pid}/stat"))
        except (OSError, ValueError, IndexError):
            return False
        return stat.start_ticks == self._root_start and stat.state not in ("zombie", "dead")

    # --- one tick -------------------------------------------------------------------

    def sample(self) -> ProcTreeSample:
        t = time.monotonic()
        if self._root_gone:
            return ProcTreeSample(t_s=t, root_pid=self.root_pid, processes=(), root_alive=False)
        cursor = None if self._cursor is None else self._read_cursor()  # before any process
        if not self._members:
            self._members[self.root_pid] = _Member(self.root_pid, None, self._root_start)
        dt = 0.0 if self._t is None else t - self._t
        out, exited, left = self._refresh(dt)
        root = self._members[self.root_pid]
        if root in left or root in exited:
            self._root_gone = True
            self.close()
            return ProcTreeSample(t_s=t, root_pid=self.root_pid, processes=(), root_alive=False)
        changed = False
        for m in left:
            self._drop(m)
            changed = True
        if left or exited:
            self._reparent({m.pid for m in left} | {m.pid for m in exited})
            self._prune()
            changed = True
        new = self._grow(cursor, dt)
        self._t = t
        self._ticks += 1
        if changed:
            out = [m.sample for m in self._members.values()]
        elif new:
            out.extend(m.sample for m in new)
        return ProcTreeSample(t_s=t, root_pid=self.root_pid, processes=tuple(out), root_alive=True)

    def _refresh(self, dt: float) -> tuple[list[ProcessSample], list[_Member], list[_Member]]:
        """Every member once: (samples, members that exited, members gone)."""
        out: list[ProcessSample] = []
        exited: list[_Member] = []
        left: list[_Member] = []
        pread = os.pread
        for m in self._members.values():
            probe = None
            fds = m.probe_fds
            if fds is not None and not m.busy:
                try:
                    n = len(fds)
                    if n == 1:
                        probe = pread(fds[0], 128, 0)
                    elif n == 2:  # a DataLoader worker and its queue's feeder thread
                        probe = pread(fds[0], 128, 0) + pread(fds[1], 128, 0)
                    else:
                        probe = b"".join([pread(fd, 128, 0) for fd in fds])
                except OSError:  # a thread is gone: read in full, its threads listed again
                    self._close_probes(m)
                if probe is not None and probe == m.probe_raw:
                    # None of its threads ran since its last reading.
                    if not m.resting:
                        self._rest(m)
                    out.append(m.sample)
                    continue
            found = self._read(m, dt, probe)
            if found == _LEFT:
                left.append(m)
                continue
            if found == _EXITED:
                exited.append(m)
            out.append(m.sample)
        return out, exited, left

    def _rest(self, m: _Member) -> None:
        """A member that did not run over the tick: 0 CPU, 0 bytes/s, the rest as it was;
        its stat and io files, read again only when it runs, are not kept meanwhile."""
        m.ran = False
        m.resting = True
        self._close_stat_io(m)
        if not m.settled:
            s = m.sample
            idle_read = None if m.read_b is None else 0.0
            idle_write = None if m.write_b is None else 0.0
            m.sample = ProcessSample(
                m.pid, s.ppid, s.name, 0.0, s.num_threads, idle_read, idle_write, s.status
            )
            m.settled = True

    def _read(self, m: _Member, dt: float, probe: bytes | None, text: str | None = None) -> int:
        """Read a member's stat (unless given as ``text``) and io in full, after its probe
        (``probe``: None where it has none or was not asked); sets its sample."""
        probing = m.probe_fds is not None
        m.resting = False
        # Files read every tick are kept open: a member read in full each tick (after its
        # first), a probed one while it runs tick after tick.
        keep = m.baseline
        if probing:
            keep = m.ran
            m.ran = m.busy or (probe is not None and m.probe_raw is not None)
            m.probe_raw = probe  # None where not asked: the next probe is a baseline
        try:
            stat_fd, io_fd = m.stat_fd, m.io_fd
            if keep and text is None and stat_fd is not None and io_fd is not None:
                # Read tick after tick through its kept files (the busy ones' common case).
                text = os.pread(stat_fd, _SMALL_FILE, 0).decode("ascii", errors="replace")
                io_text = self._io_kept(m, io_fd)
            else:
                base = f"{self._procfs}/{m.pid}"
                if text is None:
                    text = self._text(m, "stat_fd", f"{base}/stat", keep)
                io_text = "" if m.io_denied else self._io_text(m, f"{base}/io", keep)
        except _GONE:
            return _LEFT
        except OSError:
            return self._unreadable(m)
        if not probing and m.settled and text == m.stat_raw and io_text == m.io_raw:
            return _OK  # nothing changed: the settled sample stands
        try:
            name, state, ppid, cpu_s, threads, start = _stat_fields(text)
        except (ValueError, IndexError):
            return self._unreadable(m)
        if start != m.start_ticks:
            if m.start_ticks != -1:
                return _LEFT  # the pid was reused by another process
            m.start_ticks = start
        read_b = write_b = None
        if io_text:
            with contextlib.suppress(KeyError, ValueError):  # not the io file we know
                read_b, write_b = parse_io(io_text)
        cpu_pct = read_rate = write_rate = None
        if m.baseline and dt > 0:
            cpu_pct = 100.0 * max(0.0, cpu_s - m.cpu_s) / dt
            if read_b is not None and m.read_b is not None:
                read_rate = max(0.0, read_b - m.read_b) / dt
            if write_b is not None and m.write_b is not None:
                write_rate = max(0.0, write_b - m.write_b) / dt
        m.stat_raw, m.io_raw = text, io_text
        m.cpu_s, m.read_b, m.write_b, m.baseline, m.ppid = cpu_s, read_b, write_b, True, ppid
        m.busy = state == "running" or (cpu_pct is not None and cpu_pct > 0.0)
        m.sample = ProcessSample(m.pid, ppid, name, cpu_pct, threads, read_rate, write_rate, state)
        m.settled = (
            cpu_pct == 0.0
            and read_rate == (None if read_b is None else 0.0)
            and write_rate == (None if write_b is None else 0.0)
        )
        if self._probe and (
            threads != len(m.probe_fds)
            if m.probe_fds is not None
            else threads <= _PROBE_MAX_THREADS
        ):
            self._watch_threads(m, threads)
        return _EXITED if state in ("zombie", "dead") else _OK

    def _text(self, m: _Member, attr: str, path: str, keep: bool) -> str:
        """One of a member's files, through its kept fd where it has one; ``keep``: keep
        one open for the next tick (the budget allowing), else close any."""
        fd = getattr(m, attr)
        if fd is None:
            if not keep or (fd := _open_kept(path, self._budget)) is None:
                return _read_text(path)
            setattr(m, attr, fd)
        try:
            return _pread_text(fd)
        finally:
            if not keep:
                setattr(m, attr, None)
                _close_kept(fd, self._budget)

    def _io_text(self, m: _Member, path: str, keep: bool) -> str:
        """Its io; "" where it cannot be read.  Another user's process (EACCES), or a kernel
        without I/O accounting (no file): not asked again."""
        try:
            return self._text(m, "io_fd", path, keep)
        except (PermissionError, FileNotFoundError):
            m.io_denied = True
        except OSError:  # gone since its stat was read: seen at the next tick
            pass
        return ""

    @staticmethod
    def _io_kept(m: _Member, fd: int) -> str:
        """Its io through its kept fd; "" where it cannot be read now."""
        try:
            return os.pread(fd, _SMALL_FILE, 0).decode("ascii", errors="replace")
        except PermissionError:  # no longer ours to read (a setuid exec): not asked again
            m.io_denied = True
        except OSError:  # gone since its stat was read: seen at the next tick
            pass
        return ""

    def _unreadable(self, m: _Member) -> int:
        """A member whose stat cannot be read or parsed: no reading this tick."""
        self._close_files(m)
        m.sample = ProcessSample(m.pid, m.ppid, None, None, None, None, None, None)
        m.baseline = m.settled = m.busy = m.ran = False
        m.stat_raw = ""
        return _OK

    def _watch_threads(self, m: _Member, threads: int) -> None:
        """Probe a member through its threads' schedstat files where it has few threads
        and the budget keeps them all open (else it is read in full each tick).  Its
        first probe is a baseline: the next tick reads it in full once more."""
        self._close_probes(m)
        budget = self._budget
        if threads > _PROBE_MAX_THREADS or budget is None or budget.limit - budget.used < threads:
            return  # many threads, or no fds left to keep (not worth listing them)
        task_dir = f"{self._procfs}/{m.pid}/task"
        try:
            tids = os.listdir(task_dir)
        except OSError:
            return
        if len(tids) > _PROBE_MAX_THREADS:
            return
        fds: list[int] = []
        try:
            for tid in tids:
                fd = _open_kept(f"{task_dir}/{tid}/schedstat", self._budget)
                if fd is None:
                    break
                fds.append(fd)
        except OSError:
            pass  # a thread exited meanwhile
        if len(fds) < len(tids):
            for fd in fds:
                _close_kept(fd, self._budget)
            return
        m.probe_fds, m.probe_raw = tuple(fds), None

    def _close_probes(self, m: _Member) -> None:
        fds, m.probe_fds, m.probe_raw = m.probe_fds, None, None
        for fd in fds or ():
            _close_kept(fd, self._budget)

    def _close_stat_io(self, m: _Member) -> None:
        for attr in ("stat_fd", "io_fd"):
            fd = getattr(m, attr)
            if fd is not None:
                setattr(m, attr, None)
                _close_kept(fd, self._budget)

    def _close_files(self, m: _Member) -> None:
        self._close_probes(m)
        self._close_stat_io(m)

    # --- membership -----------------------------------------------------------------

    def _drop(self, m: _Member) -> None:
        """A member leaves the tree: its files are closed."""
        self._close_files(m)
        self._children_files.forget(m.pid)
        self._tids.pop(m.pid, None)
        del self._members[m.pid]

    def _reparent(self, departed: set[int]) -> None:
        """Read again the parent of each member whose parent exited or is gone this tick
        (the kernel re-parents its children: to a subreaper in the tree or out of it)."""
        for m in [m for m in self._members.values() if m.ppid in departed]:
            if m.pid in departed:
                continue
            try:
                text = self._text(
                    m, "stat_fd", f"{self._procfs}/{m.pid}/stat", m.stat_fd is not None
                )
                ppid = _task_fields(text)[0]
            except _GONE:
                self._drop(m)
                continue
            except (OSError, ValueError, IndexError):
                continue
            if ppid != m.ppid:
                s = m.sample
                m.ppid = ppid
                m.sample = ProcessSample(
                    s.pid, ppid, s.name, s.cpu_pct, s.num_threads,
                    s.read_bytes_per_s, s.write_bytes_per_s, s.status,
                )  # fmt: skip

    def _prune(self) -> None:
        """Drop the members no longer descended from the root (by their parents)."""
        kids: dict[int | None, list[int]] = {}
        for m in self._members.values():
            kids.setdefault(m.ppid, []).append(m.pid)
        reached = {self.root_pid}
        stack = [self.root_pid]
        while stack:
            for kid in kids.get(stack.pop(), ()):
                if kid not in reached:
                    reached.add(kid)
                    stack.append(kid)
        for m in [m for pid, m in self._members.items() if pid not in reached]:
            self._drop(m)

    def _grow(self, cursor: int | None, dt: float) -> list[_Member]:
        """The processes that joined the tree since the last tick: those among the pids
        given out since (and those not yet visible then), or all by a walk."""
        new: list[_Member] = []
        walk = self._walk_due or self._ticks % _WALK_EVERY_TICKS == 0
        if cursor is None or self._cursor is None:
            walk = True
        elif not walk:
            pids = self._pids_since(self._cursor, cursor) if cursor != self._cursor else []
            if pids is None:
                walk = True
            elif pids or self._pending:
                new = self._adopt(pids, dt)
        # The children files are kept open while the tree is walked tick after tick (an
        # untrusted cursor, or a machine giving out more pids than the cap each tick);
        # otherwise none is held between ticks.
        self._children_files.keep(self._budget if walk and self._walked_last else None)
        if walk:
            new = self._walk(dt)
            self._pending = []
        self._walked_last = walk or cursor is None
        if cursor is not None:
            self._cursor = cursor
        return new

    def _pids_since(self, last: int, now: int) -> range | list[int] | None:
        """The pids given out after ``last`` up to ``now``, in that order; None where a
        walk likely costs less, or they cannot be told.  Checking a pid opens its stat
        (~5 us); a walk reads a children file per thread of the tree (~0.7 us on kept
        fds): past a quarter as many pids as those files, the tree is walked."""
        return self._pids_between(last, now, max(32, self._walk_files // 4))

    def _pids_between(self, last: int, now: int, cap: int) -> range | list[int] | None:
        """The pids after ``last`` up to ``now`` in the order the kernel gives them out
        (up to pid_max, then from 1 again); None where more than ``cap``."""
        if now >= last:
            return range(last + 1, now + 1) if now - last <= cap else None
        if self._pid_max is None or self._pid_max - 1 - last + now > cap:
            return None  # wrapped past pid_max (or the cursor was set back): too many
        return [*range(last + 1, self._pid_max), *range(1, now + 1)]

    def _adopt(self, pids: Sequence[int], dt: float) -> list[_Member]:
        """Members among new pids: processes (not threads) whose parent is a member."""
        pending, self._pending = self._pending, []
        members = self._members
        new: list[_Member] = []
        for pid in [*pending, *pids]:
            if pid in members:
                continue
            try:
                text = _read_text(f"{self._procfs}/{pid}/stat")
                ppid, thread = _task_fields(text)
            except FileNotFoundError:
                if pid not in pending:  # given out but not yet attached to its task
                    self._pending.append(pid)
                continue
            except (OSError, ValueError, IndexError):
                continue
            if thread or ppid not in members:
                continue
            m = members[pid] = _Member(pid, ppid)
            if self._read(m, dt, None, text) == _LEFT:
                del members[pid]
                continue
            new.append(m)
        return new

    def _walk(self, dt: float) -> list[_Member]:
        """Every descendant of the root through the children files; the new ones joined.
        A walk that could not read every file is done again the next tick."""
        members = self._members
        new: list[_Member] = []
        complete = True
        files = 0
        stack = [self.root_pid]
        while stack:
            pid = stack.pop()
            m = members.get(pid)
            threads = None if m is None else m.sample.num_threads
            files += threads or 1
            try:
                kids = self._children(pid, threads)
            except OSError:
                complete = False
                continue
            for kid in kids:
                if kid not in members:
                    joined = members[kid] = _Member(kid, pid)
                    if self._read(joined, dt, None) == _LEFT:
                        del members[kid]
                        continue
                    new.append(joined)
                stack.append(kid)
        self._walk_due = not complete
        self._walk_files = files
        return new

    def _children(self, pid: int, num_threads: int | None) -> list[int]:
        """Direct children of ``pid``; OSError where they could not be read now."""
        if self._procfs_children:
            files = self._children_files
            kept = files.budget is not None
            kids = _children_procfs(
                pid, num_threads, self._procfs, files if kept else None,
                self._tids if kept else None,
            )  # fmt: skip
            if kids is not None:
                return kids
            self._procfs_children = False
        try:  # kernels without /proc/PID/task/*/children: psutil scans every process
            return [p.pid for p in psutil.Process(pid).children()]
        except psutil.NoSuchProcess:
            return []
        except (psutil.Error, OSError) as e:  # denied, or no fd left
            raise OSError(f"children of {pid}: {e}") from e

    # --- the pid cursor -------------------------------------------------------------

    def _trusted_cursor(self) -> int | None:
        """The kernel's pid cursor now, where it can be trusted to follow every task
        created: this process's own procfs (its pid namespace), and seen to give out the
        id of a thread started here (a virtualised /proc/loadavg, as LXCFS's, does not)."""
        if self._procfs != "/proc":
            return None
        try:
            if os.readlink("/proc/self") != str(os.getpid()):
                return None
        except OSError:
            return None
        self._cursor_fd = _open_kept("/proc/loadavg", self._budget)
        before = self._read_cursor()
        thread = threading.Thread(target=int)
        thread.start()
        thread.join()
        after = self._read_cursor()
        if before is None or after is None or thread.native_id is None:
            return None
        given = self._pids_between(before, after, 1 << 16)
        return after if given is not None and thread.native_id in given else None

    def _read_cursor(self) -> int | None:
        """The last pid the kernel gave out (in this pid namespace)."""
        try:
            fd = self._cursor_fd
            text = _read_text("/proc/loadavg") if fd is None else _pread_text(fd)
            return int(text.rsplit(None, 1)[1])
        except (OSError, ValueError, IndexError):
            return None


def cpu_count() -> int | None:
    return psutil.cpu_count(logical=True)
