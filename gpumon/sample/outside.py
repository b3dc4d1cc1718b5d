"""The busiest processes outside the watched job: who holds the CPUs a starved job needs.

When a host is saturated and the job's own processes are not what saturates it, the cause
of a starvation is somebody else's load, and the user needs its name.  Finding it means
reading every process on the machine, so it is done rarely: only while the host is busy,
at most once per ``every_s``, comparing each process's CPU time with the previous scan.

What a scan reads is what it needs of every process: its CPU time, from
``/proc/PID/schedstat`` (three numbers; the kernel formats ``stat``'s fifty-two at three
times the cost), each through ``os.open``/``os.read`` (no file object); only the few
busiest have their ``stat`` read for their name and parent.  Both files are readable for
every process, whoever owns it; where schedstat is not there (a kernel without
``CONFIG_SCHED_INFO``, a test's procfs of plain files) ``stat`` gives the CPU time.  A
process that exits mid-scan is skipped.  Memory is bounded by the number of processes
alive.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection

from gpumon.model import ProcessSample

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def read_stat(procfs: str, pid: int) -> tuple[str, float, int] | None:
    """(name, CPU seconds so far, ppid) of one process, or None if it is gone."""
    raw = _read(f"{procfs}/{pid}/stat", 4096)
    if raw is None:
        return None
    start, end = raw.find(b"("), raw.rfind(b")")
    if start < 0 or end < start:
        return None
    fields = raw[end + 2 :].split(None, 13)
    if len(fields) < 13:
        return None
    try:
        cpu = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        return raw[start + 1 : end].decode("utf-8", "replace"), cpu, int(fields[1])
    except ValueError:
        return None


def read_cpu_ns(procfs: str, pid: int) -> int | None:
    """CPU time of one process so far in nanoseconds (schedstat's first number), or None
    if it is gone or its schedstat cannot be read."""
    raw = _read(f"{procfs}/{pid}/schedstat", 128)
    if raw is None:
        return None
    try:
        return int(raw.split(None, 1)[0])
    except (ValueError, IndexError):
        return None


def _read(path: str, size: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


class OutsideScanner:
    """The few busiest processes not in the job's tree, by CPU since the previous scan."""

    def __init__(
        self,
        *,
        procfs: str = "/proc",
        every_s: float = 5.0,
        keep: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.procfs = procfs
        self.every_s = every_s
        self.keep = keep
        self._clock = clock
        self._last_t: float | None = None
        self._last: dict[int, float] = {}  # pid -> CPU seconds at the last scan
        self._use_schedstat: bool | None = None  # (decided on the first scan)
        self.busiest: tuple[ProcessSample, ...] = ()

    def due(self) -> bool:
        return self._last_t is None or self._clock() - self._last_t >= self.every_s

    def scan(self, job_pids: Collection[int]) -> tuple[ProcessSample, ...]:
        """Read every process once; the busiest outside ``job_pids`` since the last scan
        (nothing on the first scan, or one older than ``3 * every_s``: no fair baseline)."""
        now = self._clock()
        elapsed = None if self._last_t is None else now - self._last_t
        fair = elapsed is not None and 0 < elapsed <= 3 * self.every_s
        try:
            entries = os.listdir(self.procfs)
        except OSError:
            return self.busiest
        procfs, last = self.procfs, self._last
        cpu_s = self._cpu_reader(entries)
        seen: dict[int, float] = {}
        rows: list[tuple[float, int]] = []
        own = os.getpid()
        for name in entries:
            if not name.isdigit():
                continue
            pid = int(name)
            cpu = cpu_s(procfs, pid)
            if cpu is None:
                continue
            seen[pid] = cpu
            before = last.get(pid)
            if fair and before is not None and pid not in job_pids and pid != own:
                assert elapsed is not None
                pct = 100.0 * max(0.0, cpu - before) / elapsed
                if pct >= 1.0:
                    rows.append((pct, pid))
        self._last, self._last_t = seen, now
        rows.sort(reverse=True)
        busiest = []
        for pct, pid in rows:  # the busiest few are named: their stat, now
            got = read_stat(procfs, pid)
            if got is None:
                continue  # gone since: the next one down is named
            comm, _cpu, ppid = got
            busiest.append(ProcessSample(pid, ppid, comm, round(pct, 1), None, None, None, None))
            if len(busiest) == self.keep:
                break
        self.busiest = tuple(busiest)
        return self.busiest

    def _cpu_reader(self, entries: list[str]) -> Callable[[str, int], float | None]:
        """How CPU times are read: schedstat where the first process has one (decided on
        the first scan, so two scans never compare one file's time with the other's)."""
        if self._use_schedstat is None:
            first = next((int(n) for n in entries if n.isdigit()), None)
            self._use_schedstat = first is not None and read_cpu_ns(self.procfs, first) is not None
        if self._use_schedstat:
            return _schedstat_s
        return _stat_s


def _schedstat_s(procfs: str, pid: int) -> float | None:
    ns = read_cpu_ns(procfs, pid)
    return None if ns is None else ns / 1e9


def _stat_s(procfs: str, pid: int) -> float | None:
    got = read_stat(procfs, pid)
    return None if got is None else got[1]
