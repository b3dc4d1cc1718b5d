"""The host sampler: the only module in gpumon that imports ``psutil``.

Machine-wide CPU (per core), iowait, load, memory and disk throughput, and, for a watched
pid, its whole process tree: DataLoader workers hold no CUDA context, so NVML never sees
them, yet their CPU is exactly what tells a starved GPU's cause.

Rates come from counter deltas between two calls (CPU times, disk sectors), never from
psutil's stateful ``cpu_percent(None)``.  Processes that vanish or deny access mid-sample are
dropped or read as ``None``; a negative delta (counter reset, pid reuse) is clamped.
"""

from __future__ import annotations

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
    try:
        read_at, write_at = words.index("read_bytes:"), words.index("write_bytes:")
    except ValueError:
        raise KeyError("read_bytes/write_bytes") from None
    return float(words[read_at + 1]), float(words[write_at + 1])


@dataclass(slots=True)
class _Seen:
    """What we keep of a process between ticks to turn its counters into rates."""

    start_ticks: int
    t: float
    cpu_s: float
    read_bytes: float | None
    write_bytes: float | None


def _max_kept_fds() -> int:
    """How many procfs files the tree samplers of this process may keep open, all together:
    a quarter of the soft limit on open files, at most 1024 (a 128-process tree needs
    about 390)."""
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
    """The tree's per-process procfs files, kept open between ticks and re-read in place.

    ``pread(fd, n, 0)`` on an open /proc/PID/stat costs a third of open + read + close
    (and a fifth for ``children``); on a 32-process tree that is about half the tick.
    Semantics are those of opening the path each time: the kernel ties such an fd to the
    process, so once it exits (or its pid is reused) the read fails (ESRCH) and the path
    is opened afresh, which finds the new owner or nothing.  Only a real procfs is kept
    open (a test's procfs of plain files may be replaced, leaving an fd on the old one);
    files are kept while ``budget`` (shared by every sampler) allows, the rest are opened
    per read as before; without a budget nothing is kept.
    """

    def __init__(self, budget: FdBudget | None) -> None:
        self.budget = budget
        self._fds: dict[int, dict[str, int]] = {}
        self._count = 0

    def read(self, pid: int, path: str) -> str:
        """The text of ``path`` (a file of process ``pid``); raises OSError as open() does."""
        kept = self._fds.get(pid)
        fd = None if kept is None else kept.get(path)
        if fd is not None:
            try:
                data = os.pread(fd, _READ_CHUNK, 0)
            except OSError:  # the process is gone (ESRCH) or no longer readable
                data = None
            if data is not None and len(data) < _READ_CHUNK:
                return data.decode("ascii", errors="replace")
            self._close(pid, path)
        budget = self.budget
        if budget is None or not budget.take():
            return _read_text(path)
        try:
            fd = os.open(path, os.O_RDONLY)
        except BaseException:
            budget.give()
            raise
        try:
            data = os.pread(fd, _READ_CHUNK, 0)
        except BaseException:
            os.close(fd)
            budget.give()
            raise
        if len(data) >= _READ_CHUNK:  # too big to re-read in one call: not worth keeping
            os.close(fd)
            budget.give()
            return _read_text(path)
        self._fds.setdefault(pid, {})[path] = fd
        self._count += 1
        return data.decode("ascii", errors="replace")

    def _close(self, pid: int, path: str) -> None:
        fd = self._fds[pid].pop(path)
        self._release(1)
        os.close(fd)

    def _release(self, n: int) -> None:
        self._count -= n
        if self.budget is not None and n:
            self.budget.give(n)

    def forget(self, pid: int) -> None:
        """Close the files of a process that left the tree."""
        fds = self._fds.pop(pid, {})
        self._release(len(fds))
        for fd in fds.values():
            os.close(fd)

    def close(self) -> None:
        for pid in list(self._fds):
            self.forget(pid)


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
    thread that exits fails its read, which lists the threads afresh next tick), and
    the files are kept open in ``files`` like the other procfs files (a training
    process has dozens of threads: opening each thread's file each tick cost more than
    the rest of its process's sample).  None only where the kernel lacks the file
    (CONFIG_PROC_CHILDREN: absent for a task that exists), so the caller falls back for
    good; any other failure (EMFILE, EACCES) reads as no children this tick.
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
            except OSError:  # gone, or no fd left this tick: not a missing kernel feature
                return []
            if tids is not None and num_threads is not None:
                tids[pid] = (num_threads, names)
    read = _read_text if files is None else (lambda path: files.read(pid, path))
    children: list[int] = []
    for tid in names:
        try:
            children.extend(int(x) for x in read(f"{task_dir}/{tid}/children").split())
        except FileNotFoundError:
            if tids is not None:
                tids.pop(pid, None)  # the threads changed: list them again next tick
            if not os.path.exists(f"{task_dir}/{tid}"):
                continue  # the thread (or process) exited between listing and reading
            return None
        except OSError:
            if tids is not None:
                tids.pop(pid, None)
            continue
    return children


class ProcessTreeSampler:
    """The watched process and every descendant, re-discovered each tick.

    Descendants spawned later (DataLoader workers come and go each epoch) are picked up;
    the first tick a process is seen only sets its baseline (its rates are None).  A pid
    reused by an unrelated process is told apart by its start time.
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
        self._seen: dict[int, _Seen] = {}
        self._tids: dict[int, tuple[int, list[str]]] = {}  # threads of multi-threaded ones
        self._procfs_children = True
        if procfs != "/proc":
            fd_budget = None
        elif fd_budget is None:
            fd_budget = shared_fd_budget()
        self._files = _ProcFiles(fd_budget)

    def close(self) -> None:
        """Close the procfs files kept open between ticks (also done when collected)."""
        self._files.close()

    def __del__(self) -> None:
        files = getattr(self, "_files", None)
        if files is not None:
            files.close()

    def _children(self, pid: int, num_threads: int | None) -> list[int]:
        if self._procfs_children:
            kids = _children_procfs(pid, num_threads, self._procfs, self._files, self._tids)
            if kids is not None:
                return kids
            self._procfs_children = False
        try:  # kernels without /proc/PID/task/*/children: psutil scans every process
            return [p.pid for p in psutil.Process(pid).children()]
        except (psutil.Error, OSError):  # gone, denied, or no fd left: none this tick
            return []

    def cmdline(self) -> tuple[str, ...] | None:
        try:
            raw = _read_text(f"{self._procfs}/{self.root_pid}/cmdline")
        except OSError:
            return None
        return tuple(raw.rstrip("\0").split("\0")) if raw else None

    def _root_fields(self) -> tuple[str, str, int, float, int, int] | None:
        """The root's stat fields while it is the same process and not a zombie; else None."""
        try:
            fields = _stat_fields(
                self._files.read(self.root_pid, f"{self._procfs}/{self.root_pid}/stat")
            )
        except (OSError, ValueError, IndexError):
            return None
        if fields[5] != self._root_start or fields[1] in ("zombie", "dead"):
            return None
        return fields

    def root_alive(self) -> bool:
        return self._root_fields() is not None

    def sample(self) -> ProcTreeSample:
        """Walk the tree from the root, reading each process once (stat gives the thread
        count that decides how its children are found; the root's one read also says
        whether it is alive)."""
        t = time.monotonic()
        root = self._root_fields()
        alive = root is not None
        samples: list[ProcessSample] = []
        if root is not None:
            first = self._sample_one(self.root_pid, t, root)
            samples.append(first)
            frontier = self._children(self.root_pid, first.num_threads)
        else:
            frontier = []
        while frontier:
            pid = frontier.pop()
            sample = self._sample_one(pid, t)
            if sample is None:
                continue
            samples.append(sample)
            frontier.extend(self._children(pid, sample.num_threads))
        for gone in set(self._seen) - {s.pid for s in samples}:
            del self._seen[gone]
            self._tids.pop(gone, None)
            self._files.forget(gone)
        return ProcTreeSample(
            t_s=t, root_pid=self.root_pid, processes=tuple(samples), root_alive=alive
        )

    def _sample_one(
        self, pid: int, t: float, fields: tuple[str, str, int, float, int, int] | None = None
    ) -> ProcessSample | None:
        """One process; ``fields``: its stat, where already read this tick (the root's)."""
        base = f"{self._procfs}/{pid}"
        read = self._files.read
        if fields is None:
            try:
                fields = _stat_fields(read(pid, f"{base}/stat"))
            except FileNotFoundError:
                return None  # vanished mid-sample: it is simply not part of the tree any more
            except (OSError, ValueError, IndexError):
                return ProcessSample(pid, None, None, None, None, None, None, None)
        name, state, ppid, cpu_s, num_threads, start_ticks = fields
        try:
            read_b, write_b = parse_io(read(pid, f"{base}/io"))
        except (OSError, KeyError, ValueError):  # another user's process: no io access
            read_b = write_b = None
        before = self._seen.get(pid)
        if before is not None and before.start_ticks != start_ticks:
            before = None  # the pid was reused by a new process: start a new baseline
        self._seen[pid] = _Seen(start_ticks, t, cpu_s, read_b, write_b)
        cpu_pct = read_rate = write_rate = None
        if before is not None:
            seconds = t - before.t
            cpu_rate = rate(before.cpu_s, cpu_s, seconds)
            cpu_pct = None if cpu_rate is None else 100.0 * cpu_rate
            read_rate = rate(before.read_bytes, read_b, seconds)
            write_rate = rate(before.write_bytes, write_b, seconds)
        return ProcessSample(pid, ppid, name, cpu_pct, num_threads, read_rate, write_rate, state)


def cpu_count() -> int | None:
    return psutil.cpu_count(logical=True)
