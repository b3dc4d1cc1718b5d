"""The busiest processes outside the watched job: who holds the CPUs a starved job needs.

When a host is saturated and the job's own processes are not what saturates it, the cause
of a starvation is somebody else's load, and the user needs its name.  Finding it means
reading every process on the machine, so it is done rarely: only while the host is busy,
at most once per ``every_s``, comparing each process's CPU time with the previous scan.

Reads ``/proc/PID/stat`` only (readable for every process, whoever owns it); a process
that exits mid-scan is skipped.  Memory is bounded by the number of processes alive.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection

from gpumon.model import ProcessSample

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def read_stat(procfs: str, pid: int) -> tuple[str, float, int] | None:
    """(name, CPU seconds so far, ppid) of one process, or None if it is gone."""
    try:
        with open(f"{procfs}/{pid}/stat", "rb") as fh:
            raw = fh.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    start, end = raw.find("("), raw.rfind(")")
    if start < 0 or end < start:
        return None
    fields = raw[end + 2 :].split()
    if len(fields) < 13:
        return None
    try:
        cpu = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        return raw[start + 1 : end], cpu, int(fields[1])
    except ValueError:
        return None


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
        self.busiest: tuple[ProcessSample, ...] = ()

    def due(self) -> bool:
        return self._last_t is None or self._clock() - self._last_t >= self.every_s

    def scan(self, job_pids: Collection[int]) -> tuple[ProcessSample, ...]:
        """Read every process once; the busiest outside ``job_pids`` since the last scan
        (nothing on the first scan, or one older than ``3 * every_s``: no fair baseline)."""
        now = self._clock()
        seen: dict[int, float] = {}
        rows: list[tuple[float, int, str, int]] = []
        elapsed = None if self._last_t is None else now - self._last_t
        fair = elapsed is not None and 0 < elapsed <= 3 * self.every_s
        try:
            entries = os.listdir(self.procfs)
        except OSError:
            return self.busiest
        own = os.getpid()
        for name in entries:
            if not name.isdigit():
                continue
            pid = int(name)
            got = read_stat(self.procfs, pid)
            if got is None:
                continue
            comm, cpu, ppid = got
            seen[pid] = cpu
            before = self._last.get(pid)
            if fair and before is not None and pid not in job_pids and pid != own:
                assert elapsed is not None
                pct = 100.0 * max(0.0, cpu - before) / elapsed
                if pct >= 1.0:
                    rows.append((pct, pid, comm, ppid))
        self._last, self._last_t = seen, now
        rows.sort(reverse=True)
        self.busiest = tuple(
            ProcessSample(pid, ppid, comm, round(pct, 1), None, None, None, None)
            for pct, pid, comm, ppid in rows[: self.keep]
        )
        return self.busiest
