"""The host sampler against a real process tree the test starts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpumon.errors import ProcessGoneError
from gpumon.sample.host import (
    FdBudget,
    HostSampler,
    ProcessTreeSampler,
    cpu_busy_pct,
    parse_block_stat,
    parse_diskstats,
    parse_io,
    parse_meminfo,
    parse_proc_stat,
    parse_stat,
    rate,
)

PROCTREE = Path(__file__).parent / "helpers" / "proctree.py"


class Tree:
    def __init__(self, proc: subprocess.Popen[str], workers: list[int]) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.workers = workers


def start_tree(*args: object) -> Tree:
    proc = subprocess.Popen(
        [sys.executable, str(PROCTREE), *map(str, args)], stdout=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline().split()  # type: ignore[union-attr]
    assert line[0] == "ready"
    return Tree(proc, [int(x) for x in line[1:]])


@pytest.fixture
def tree() -> Iterator[Tree]:
    t = start_tree(2, 1, 30)
    yield t
    t.proc.terminate()
    t.proc.wait(5)


def _cpu_s(pid: int) -> float:
    """The CPU seconds the kernel has charged a process (utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_tree_cpu_is_attributed_to_the_burning_workers(tree: Tree) -> None:
    sampler = ProcessTreeSampler(tree.pid)
    burners, sleeper = tree.workers[:2], tree.workers[2]
    t0, charged0 = time.monotonic(), [_cpu_s(p) for p in burners]
    first = sampler.sample()
    assert {p.pid for p in first.processes} == {tree.pid, *tree.workers}
    assert all(p.cpu_pct is None for p in first.processes)  # baseline tick has no rates
    time.sleep(1.0)
    second = sampler.sample()
    t1, charged1 = time.monotonic(), [_cpu_s(p) for p in burners]
    by_pid = {p.pid: p for p in second.processes}
    # The burners get what the kernel charged them over the tick (read around it: the
    # machine may be shared, so their share is whatever it gave); the parent and the
    # sleeping worker next to nothing.
    idle_cpu = max(by_pid[sleeper].cpu_pct, by_pid[tree.pid].cpu_pct)
    for pid, a, b in zip(burners, charged0, charged1, strict=True):
        charged_pct = 100.0 * (b - a) / (t1 - t0)
        assert by_pid[pid].cpu_pct is not None
        assert by_pid[pid].cpu_pct == pytest.approx(charged_pct, rel=0.25, abs=3.0)
        assert by_pid[pid].cpu_pct > 5 * idle_cpu
        assert by_pid[pid].ppid == tree.pid
    assert idle_cpu < 5.0
    assert second.root is not None and second.root.pid == tree.pid
    assert {p.pid for p in second.workers} == set(tree.workers)
    assert second.root_alive


def test_worker_exiting_mid_run_does_not_break_sampling() -> None:
    t = start_tree(1, 1, 30, 0.6)  # the burner exits after 0.6 s
    try:
        sampler = ProcessTreeSampler(t.pid)
        sampler.sample()
        time.sleep(1.2)
        later = sampler.sample()
        pids = {p.pid for p in later.processes}
        assert t.workers[0] not in pids
        assert t.workers[1] in pids
        assert later.root_alive
    finally:
        t.proc.terminate()
        t.proc.wait(5)


def _kept_proc_files(pid: int) -> list[str]:
    """The files of /proc/PID this process holds open."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"/proc/{pid}/"):
            out.append(target)
    return out


def test_kept_procfs_files_are_closed_when_a_worker_leaves_and_on_close() -> None:
    """The tree sampler keeps /proc/PID files open between ticks; none may leak."""

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    t = start_tree(0, 2, 30, 0.6)  # one sleeper exits after 0.6 s
    try:
        sampler = ProcessTreeSampler(t.pid)
        first = sampler.sample()
        assert len(first.processes) == 3
        with_three = open_fds()
        assert with_three > before  # files kept open for the next tick
        assert _kept_proc_files(t.workers[0])
        again = sampler.sample()  # re-read through the kept files
        assert {p.pid for p in again.processes} == {p.pid for p in first.processes}
        assert open_fds() == with_three
        time.sleep(1.2)
        later = sampler.sample()
        assert {p.pid for p in later.processes} == {t.pid, t.workers[1]}
        assert _kept_proc_files(t.workers[0]) == []
        sampler.close()
        assert open_fds() <= before + 1  # the Popen pipe
    finally:
        t.proc.terminate()
        t.proc.wait(5)


THREADED = r"""
import os, sys, threading, time
def fork_child():
    pid = os.fork()
    if pid == 0:
        time.sleep(60); os._exit(0)
    print(pid, flush=True)
    time.sleep(60)
for _ in range(3):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
threading.Thread(target=fork_child, daemon=True).start()  # a child of a non-main thread
sys.stdin.readline()
threading.Thread(target=fork_child, daemon=True).start()  # a new thread, a new child
sys.stdin.readline()
"""


def _kept_children_files() -> int:
    """How many /proc/PID/task/TID/children files this process holds open."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").endswith("/children")
        except OSError:
            continue
    return n


def _threaded_tree_is_found(sampler_for: Callable[[int], ProcessTreeSampler]) -> int:
    """Run THREADED under a sampler: the child of a non-main thread is found, then the
    child of a thread started later; returns the children files kept between ticks."""
    proc = subprocess.Popen(
        [sys.executable, "-c", THREADED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    children: list[int] = []
    try:
        first_child = int(proc.stdout.readline())
        children.append(first_child)
        sampler = sampler_for(proc.pid)
        tree = sampler.sample()
        assert {p.pid for p in tree.processes} == {proc.pid, first_child}
        assert tree.root is not None and tree.root.num_threads == 5  # main, 3 + 1 threads
        kept = _kept_children_files()
        assert {p.pid for p in sampler.sample().processes} == {proc.pid, first_child}
        assert _kept_children_files() == kept
        proc.stdin.write("\n")
        proc.stdin.flush()
        second_child = int(proc.stdout.readline())
        children.append(second_child)
        tree = sampler.sample()
        assert {p.pid for p in tree.processes} == {proc.pid, first_child, second_child}
        sampler.close()
        assert _kept_children_files() == 0
        return kept
    finally:
        for pid in children:  # the forked children outlive their killed parent otherwise
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait(5)


@pytest.mark.parametrize("cursors", [[7, 7], [7, 9]], ids=["still", "elsewhere"])
def test_a_pid_cursor_that_does_not_follow_new_tasks_is_not_trusted(
    cursors: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A /proc/loadavg whose last pid does not give out the id of a thread the sampler
    starts (one that never moves, as gVisor's; one a container filesystem makes up, as
    LXCFS's) is not trusted: every tick walks the tree, and new workers are still found."""
    with job_tree(1, 1) as job:
        values = iter(cursors)
        with monkeypatch.context() as m:
            m.setattr(ProcessTreeSampler, "_read_cursor", lambda self: next(values))
            sampler = ProcessTreeSampler(job.pid)
        assert sampler._cursor is None
        sampler.sample()
        child, grandchild = (int(x) for x in job.ask("fork"))
        assert {child, grandchild} <= {p.pid for p in sampler.sample().processes}
        sampler.close()


def test_children_of_any_thread_are_found_without_keeping_children_files() -> None:
    """A child is listed under the thread that forked it: the first tick's walk reads every
    thread's file; later children are found from the pids given out since, so no children
    file is kept open between ticks."""
    kept = _threaded_tree_is_found(lambda pid: ProcessTreeSampler(pid, fd_budget=FdBudget(64)))
    assert kept == 0


def test_without_a_trusted_pid_cursor_every_tick_walks_and_keeps_its_files(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the pid cursor cannot be trusted (here: /proc is not this process's own), the
    tree is walked each tick: every thread's children file is kept open while the threads
    stay the same, and listed again when they change."""
    from gpumon.sample import host

    def sampler_for(pid: int) -> ProcessTreeSampler:
        with monkeypatch.context() as m:
            m.setattr(host.os, "readlink", lambda path: "another namespace")
            sampler = ProcessTreeSampler(pid, fd_budget=FdBudget(64))
        assert sampler._cursor is None
        return sampler

    assert _threaded_tree_is_found(sampler_for) >= 5  # one per thread of the root


def test_new_descendants_are_picked_up_and_root_exit_is_seen() -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.7)"])
    sampler = ProcessTreeSampler(parent.pid)
    assert sampler.sample().root_alive
    parent.wait(5)
    gone = sampler.sample()
    assert not gone.root_alive
    assert gone.processes == ()


def test_missing_pid_is_a_clear_error() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(ProcessGoneError, match=f"no process with pid {proc.pid}"):
        ProcessTreeSampler(proc.pid)


def test_host_sample_sees_busy_cores(tree: Tree) -> None:
    sampler = HostSampler()
    time.sleep(0.8)
    host = sampler.sample()
    assert host.cpu_pct is not None and host.cpu_pct > 20.0
    assert len(host.cpu_pct_per_core) >= 1
    assert host.iowait_pct is not None
    assert host.mem_total_bytes and host.mem_used_bytes


def Times(user: float, system: float, idle: float, iowait: float) -> tuple[float, ...]:
    """One CPU's times in /proc/stat's (and psutil's scputimes') order: user nice system
    idle iowait irq softirq steal guest guest_nice."""
    return (user, 0.0, system, idle, iowait, 0.0, 0.0, 0.0, 0.0, 0.0)


def test_cpu_busy_pct_arithmetic() -> None:
    busy, iowait = cpu_busy_pct(Times(10, 0, 10, 0), Times(15, 0, 13, 2))
    assert busy == pytest.approx(50.0)
    assert iowait == pytest.approx(20.0)
    assert cpu_busy_pct(Times(1, 1, 1, 1), Times(1, 1, 1, 1)) == (None, None)
    # Guest time is already inside user: not counted twice.
    guest = (15, 0, 0, 13, 2, 0, 0, 0, 5, 0)
    assert cpu_busy_pct((10, 0, 0, 10, 0, 0, 0, 0, 0, 0), guest)[0] == pytest.approx(50.0)
    # psutil's own tuples (the fallback) have the same order.
    import psutil

    before, after = psutil.cpu_times(percpu=True)[0], psutil.cpu_times(percpu=True)[0]
    assert cpu_busy_pct(before, after) is not None


def test_proc_stat_is_parsed_per_cpu() -> None:
    text = (
        "cpu  300 10 200 1000 50 0 5 0 0 0\n"
        "cpu0 100 5 100 500 25 0 2 0 0 0\n"
        "cpu1 200 5 100 500 25 0 3 0 0 0\n"
        "intr 12345 1 2 3\nctxt 999\ncpu9 1 1 1 1\n"
    )
    assert parse_proc_stat(text) == [
        (100, 5, 100, 500, 25, 0, 2, 0, 0, 0),
        (200, 5, 100, 500, 25, 0, 3, 0, 0, 0),
    ]
    with pytest.raises(ValueError):
        parse_proc_stat("intr 1 2 3\n")
    # This machine's, against psutil's count of CPUs.
    import psutil

    assert len(parse_proc_stat(Path("/proc/stat").read_text())) == len(
        psutil.cpu_times(percpu=True)
    )


def test_block_stat_gives_bytes() -> None:
    text = "  100 0 2000 0 50 0 1000 0 0 0 0 0 0 0 0 0 0\n"
    assert parse_block_stat(text) == (2000 * 512.0, 1000 * 512.0)


def _fake_host(root: Path, *, cpu: str, read: int, written: int) -> None:
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc" / "stat").write_text(cpu + "intr 1\n")
    (root / "proc" / "meminfo").write_text(
        "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    400 kB\n"
    )
    for disk in ("vda", "loop0"):
        (root / "sys" / "block" / disk).mkdir(parents=True, exist_ok=True)
        (root / "sys" / "block" / disk / "stat").write_text(f"1 0 {read} 0 1 0 {written} 0 0 0 0\n")


def test_host_sample_from_proc_and_sys(tmp_path: Path) -> None:
    """CPU from /proc/stat, memory from /proc/meminfo, throughput of the physical disks
    from /sys/block/DEV/stat (loop devices left out)."""
    _fake_host(tmp_path, cpu="cpu0 10 0 0 10 0 0 0 0 0 0\n", read=0, written=0)
    sampler = HostSampler(procfs=str(tmp_path / "proc"), sysfs=str(tmp_path / "sys"))
    _fake_host(tmp_path, cpu="cpu0 40 0 0 20 10 0 0 0 0 0\n", read=2048, written=4096)
    (tmp_path / "sys" / "block" / "loop0" / "stat").write_text("1 0 99999 0 1 0 99999 0\n")
    sampler._t -= 2.0  # two seconds ago
    since = sampler._t
    host = sampler.sample()
    seconds = host.t_s - since  # 2 s and the time the machine took in between
    assert host.cpu_pct_per_core == (pytest.approx(60.0),)
    assert host.iowait_pct == pytest.approx(20.0)
    assert host.mem_used_bytes == 600 * 1024 and host.mem_total_bytes == 1000 * 1024
    assert host.disk_read_bytes_per_s == pytest.approx(2048 * 512 / seconds)
    assert host.disk_write_bytes_per_s == pytest.approx(4096 * 512 / seconds)
    # A disk gone: no throughput reading (not a drop to 0); unreadable CPUs: no CPU reading.
    (tmp_path / "sys" / "block" / "vda" / "stat").unlink()
    (tmp_path / "proc" / "stat").write_text("garbage\n")
    host = sampler.sample()
    assert host.disk_read_bytes_per_s is None and host.cpu_pct is None
    assert host.cpu_pct_per_core == ()
    assert host.mem_total_bytes == 1000 * 1024


def test_host_falls_back_on_psutil_without_proc_stat(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    sampler = HostSampler(procfs=str(tmp_path / "proc"), sysfs=str(tmp_path / "sys"))
    time.sleep(0.05)
    host = sampler.sample()
    assert len(host.cpu_pct_per_core) == os.cpu_count()
    assert host.mem_used_bytes is None and host.disk_read_bytes_per_s is None


def test_host_files_are_kept_open_and_closed(tmp_path: Path) -> None:
    def open_fds() -> set[str]:
        fds = Path("/proc/self/fd")
        out = set()
        for fd in fds.iterdir():
            try:
                out.add(os.readlink(fd))
            except OSError:
                continue
        return out

    sampler = HostSampler()
    sampler.sample()
    kept = open_fds()
    assert {"/proc/stat", "/proc/meminfo"} <= kept
    sampler.close()
    assert not {"/proc/stat", "/proc/meminfo"} & open_fds()


def test_rate_clamps_counter_resets() -> None:
    assert rate(100.0, 50.0, 1.0) == 0.0
    assert rate(None, 50.0, 1.0) is None
    assert rate(0.0, 50.0, 0.5) == 100.0


def test_parse_stat_handles_names_with_spaces_and_parentheses() -> None:
    text = (
        "4242 (pt data (worker) 3) S 4200 4242 4200 0 -1 4194560 100 0 0 0 "
        "250 50 0 0 20 0 7 0 123456 1000000 500 18446744073709551615 "
        "1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n"
    )
    stat = parse_stat(text)
    assert stat.name == "pt data (worker) 3"
    assert stat.state == "sleeping"
    assert stat.ppid == 4200
    assert stat.cpu_s == pytest.approx(300 / os.sysconf("SC_CLK_TCK"))
    assert stat.num_threads == 7
    assert stat.start_ticks == 123456


def test_parse_stat_of_this_process_agrees_with_the_kernel() -> None:
    stat = parse_stat(Path(f"/proc/{os.getpid()}/stat").read_text())
    assert stat.ppid == os.getppid()
    assert stat.state == "running"


def test_parse_io_and_meminfo_and_diskstats() -> None:
    io = "rchar: 10\nwchar: 20\nsyscr: 1\nsyscw: 2\nread_bytes: 4096\nwrite_bytes: 8192\n"
    assert parse_io(io) == (4096.0, 8192.0)
    assert parse_io("read_bytes: 5\nwrite_bytes: 6\n") == (5.0, 6.0)  # other layouts too
    with pytest.raises(KeyError):
        parse_io("rchar: 10\nwchar: 20\n")
    meminfo = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    400 kB\n"
    assert parse_meminfo(meminfo) == (600 * 1024, 1000 * 1024)
    assert parse_meminfo("MemTotal: 1 kB\n") is None
    diskstats = (
        "   8       0 sda 100 0 2000 0 50 0 1000 0 0 0 0\n"
        "   8       1 sda1 100 0 2000 0 50 0 1000 0 0 0 0\n"
        " 253       0 dm-0 100 0 2000 0 50 0 1000 0 0 0 0\n"
        " 259       0 nvme0n1 10 0 8 0 5 0 4 0 0 0 0\n"
    )
    disks = frozenset({"sda", "nvme0n1"})
    assert parse_diskstats(diskstats, disks) == (2008 * 512.0, 1004 * 512.0)


def test_a_reused_root_pid_is_not_the_watched_process(tmp_path: Path) -> None:
    """A pid whose start time changed belongs to a new process: the run has ended."""
    proc_dir = tmp_path / "4242"
    proc_dir.mkdir()
    stat = "4242 (python) S 1 4242 1 0 -1 0 0 0 0 0 10 5 0 0 20 0 1 0 {start} 0 0 0\n"
    (proc_dir / "stat").write_text(stat.format(start=1000))
    sampler = ProcessTreeSampler(4242, procfs=str(tmp_path))
    assert sampler.root_alive()
    (proc_dir / "stat").write_text(stat.format(start=2000))
    assert not sampler.root_alive()
    assert sampler.sample().processes == ()


def test_tree_samplers_share_one_fd_budget_and_keep_the_procfs_path() -> None:
    """Many samplers (one per job in `gpumon serve`) under a low open-file limit: the kept
    files come from one budget, so no sampler runs the process out of fds, none raises, and
    none gives up the cheap /proc/PID/task/*/children path."""
    t = start_tree(0, 6, 30)
    script = (
        "import os, resource, sys\n"
        "from gpumon.sample import host\n"
        "pid, expected = int(sys.argv[1]), set(map(int, sys.argv[2:]))\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "samplers = [host.ProcessTreeSampler(pid) for _ in range(8)]\n"
        "for _ in range(3):\n"
        "    for s in samplers:\n"
        "        got = {p.pid for p in s.sample().processes}\n"
        "        assert got == expected, (got, expected)\n"
        "assert all(s._procfs_children for s in samplers)\n"
        "budget = host.shared_fd_budget()\n"
        "assert budget.limit == 16 and budget.used == 16, (budget.limit, budget.used)\n"
        "for s in samplers:\n"
        "    s.close()\n"
        "assert budget.used == 0, budget.used\n"
        "os.close(os.open('/dev/null', os.O_RDONLY))  # fds are left for everything else\n"
        "print('ok')\n"
    )
    try:
        res = subprocess.run(
            [sys.executable, "-c", script, str(t.pid), str(t.pid), *map(str, t.workers)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0 and res.stdout.strip() == "ok", res.stdout + res.stderr
    finally:
        t.proc.terminate()
        t.proc.wait(5)


def test_running_out_of_fds_is_one_tick_without_children_not_a_fallback(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EMFILE on a children file or a task listing is not a kernel without the file: the
    tick misses the children, the sampler keeps /proc and finds them the next tick."""
    import errno

    from gpumon.sample import host

    real_open, real_listdir = os.open, os.listdir

    def no_fd_open(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path).endswith("/children"):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, *args, **kwargs)

    def no_fd_listdir(path):  # type: ignore[no-untyped-def]
        if str(path).endswith("/task"):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_listdir(path)

    def psutil_must_not_run(*_a, **_k):  # type: ignore[no-untyped-def]
        raise AssertionError("fell back to psutil")

    sampler = ProcessTreeSampler(tree.pid, fd_budget=host.FdBudget(0))
    monkeypatch.setattr(host.psutil, "Process", psutil_must_not_run)
    monkeypatch.setattr(host.os, "open", no_fd_open)
    monkeypatch.setattr(host.os, "listdir", no_fd_listdir)
    starved = sampler.sample()
    assert starved.root_alive and [p.pid for p in starved.processes] == [tree.pid]
    monkeypatch.setattr(host.os, "open", real_open)
    monkeypatch.setattr(host.os, "listdir", real_listdir)
    again = sampler.sample()
    assert {p.pid for p in again.processes} == {tree.pid, *tree.workers}
    assert sampler._procfs_children


def test_psutil_fallback_errors_read_as_no_children(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpumon.sample import host

    def broken(*_a, **_k):  # type: ignore[no-untyped-def]
        raise OSError(24, "Too many open files")

    sampler = ProcessTreeSampler(tree.pid)
    sampler._procfs_children = False  # a kernel without the children files
    monkeypatch.setattr(host.psutil, "Process", broken)
    assert [p.pid for p in sampler.sample().processes] == [tree.pid]
    sampler.close()


def test_the_roots_stat_is_read_once_per_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpumon.sample import host

    proc_dir = tmp_path / "4242"
    (proc_dir / "task" / "4242").mkdir(parents=True)
    (proc_dir / "task" / "4242" / "children").write_text("")
    (proc_dir / "stat").write_text(
        "4242 (python) S 1 4242 1 0 -1 0 0 0 0 0 10 5 0 0 20 0 1 0 1000 0 0 0\n"
    )
    sampler = ProcessTreeSampler(4242, procfs=str(tmp_path))
    reads: list[str] = []
    real = host._read_text

    def counting(path: str) -> str:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(host, "_read_text", counting)
    sample = sampler.sample()
    assert sample.root_alive and [p.pid for p in sample.processes] == [4242]
    assert reads.count(f"{tmp_path}/4242/stat") == 1


def test_host_cpu_is_absent_unless_every_core_was_read(monkeypatch: pytest.MonkeyPatch) -> None:
    before = [Times(10, 0, 10, 0), Times(10, 0, 10, 0)]
    after = [Times(15, 0, 15, 0), Times(10, 0, 10, 0)]  # core 1: no time passed (no reading)
    sampler = HostSampler()
    sampler._cpu = before
    monkeypatch.setattr(sampler, "_cpu_times", lambda: after)
    partial = sampler.sample()
    assert partial.cpu_pct is None and partial.cpu_pct_per_core == ()
    sampler._cpu = before
    monkeypatch.setattr(sampler, "_cpu_times", lambda: after[:1])  # a core went offline
    assert sampler.sample().cpu_pct is None
    sampler._cpu = before
    monkeypatch.setattr(sampler, "_cpu_times", lambda: [Times(15, 0, 15, 0), Times(12, 0, 18, 0)])
    full = sampler.sample()
    assert full.cpu_pct == pytest.approx(35.0) and len(full.cpu_pct_per_core) == 2


def test_the_sessions_process_tree_reads_the_real_proc_by_default() -> None:
    """What the daemon asks for per job, asked without a procfs path: the live /proc."""
    from gpumon.engine.sources import process_tree

    tree = process_tree(os.getpid()).sample()
    assert os.getpid() in {p.pid for p in tree.processes}


# --- job-shaped trees (tests/helpers/jobtree.py) -------------------------------------------

JOBTREE = Path(__file__).parent / "helpers" / "jobtree.py"


class JobTree:
    """A launcher, its ranks and their workers, driven through the helper's commands."""

    def __init__(self, ranks: int, workers: int, *options: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(JOBTREE), str(ranks), str(workers), *options],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.pid = self.proc.pid
        head = self.proc.stdout.readline().split()
        assert head == ["ready", str(self.pid)], head
        self.ranks: dict[int, list[int]] = {}
        while (line := self.proc.stdout.readline().split())[0] != "end":
            self.ranks[int(line[1])] = [int(x) for x in line[2:]]

    @property
    def workers(self) -> list[int]:
        return [w for ws in self.ranks.values() for w in ws]

    def ask(self, command: str) -> list[str]:
        """Send one command; the words of its reply after the first."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().split()[1:]

    def wait_asleep(self) -> None:
        """Until every process of the tree sleeps, as it then stays (a state read while one
        is still starting differs from psutil's read a moment later)."""
        deadline = time.monotonic() + 30
        while any(p.status() != "sleeping" for p in _psutil_tree(self.pid).values()):
            assert time.monotonic() < deadline, "the tree never settled"
            time.sleep(0.01)

    def readline(self) -> list[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().split()

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)  # the root leads a group: orphans too
        self.proc.wait(5)


@contextlib.contextmanager
def job_tree(ranks: int, workers: int, *options: str) -> Iterator[JobTree]:
    tree = JobTree(ranks, workers, *options)
    try:
        yield tree
    finally:
        tree.close()


def _kill_and_wait(pid: int) -> None:
    """SIGKILL a process the helper reaps at once, and wait until it is gone from /proc."""
    os.kill(pid, signal.SIGKILL)
    while os.path.exists(f"/proc/{pid}"):
        time.sleep(0.01)


def _psutil_tree(root: int) -> dict[int, Any]:
    """psutil's view of the tree: pid -> Process, the root and every descendant."""
    import psutil

    top = psutil.Process(root)
    return {p.pid: p for p in [top, *top.children(recursive=True)]}


def test_a_128_process_job_tree_matches_psutil() -> None:
    """A launcher, 8 ranks of 6 threads, 119 workers of 2 threads: the same processes,
    parents, names, thread counts and states as psutil reads."""
    with job_tree(8, 119, "--rank-threads", "6", "--worker-threads", "2") as job:
        job.wait_asleep()
        sampler = ProcessTreeSampler(job.pid)
        for _ in range(3):  # the baseline, the probes' baseline, then probes alone
            tree = sampler.sample()
            theirs = _psutil_tree(job.pid)
            ours = {p.pid: p for p in tree.processes}
            assert len(ours) == 128 and set(ours) == set(theirs)
            for pid, p in theirs.items():
                mine = ours[pid]
                assert mine.ppid == p.ppid()
                assert mine.name == p.name()
                assert mine.num_threads == p.num_threads()
                assert mine.status == p.status()
        assert tree.root is not None and tree.root.pid == job.pid
        assert all(p.cpu_pct is not None for p in tree.processes)
        sampler.close()


def test_cpu_of_a_busy_and_a_woken_worker_matches_psutil() -> None:
    """A worker burning CPU and one woken from its sleep (SIGUSR1: a second of CPU) read the
    CPU psutil reads over the same tick, within a few points; the sleepers read 0."""
    with job_tree(1, 3, "--busy", "1", "--burst-ms", "1000", "--period-ms", "1000") as job:
        busy, woken, sleeper = job.workers
        sampler = ProcessTreeSampler(job.pid)
        procs = _psutil_tree(job.pid)
        for _ in range(3):  # past the baselines: the sleepers are probed
            sampler.sample()
        before = {pid: sum(p.cpu_times()[:2]) for pid, p in procs.items()}
        t0 = time.monotonic()
        os.kill(woken, signal.SIGUSR1)
        time.sleep(1.2)
        tree = sampler.sample()
        seconds = time.monotonic() - t0
        after = {pid: sum(p.cpu_times()[:2]) for pid, p in procs.items()}
        ours = {p.pid: p.cpu_pct for p in tree.processes}
        for pid in (busy, woken):
            theirs = 100.0 * (after[pid] - before[pid]) / seconds
            if theirs <= 10.0:  # a machine this busy lets it barely run: nothing to compare
                pytest.skip(f"the worker got {theirs:.0f} % of a core: the machine is too busy")
            assert ours[pid] == pytest.approx(theirs, abs=5.0)
        assert ours[sleeper] == 0.0
        sampler.close()


def test_read_and_write_bytes_match_psutil(tmp_path: Path) -> None:
    """A worker reading a file that is not in the page cache, then writing a copy: its read
    and write bytes over the tick are what psutil reads of /proc/PID/io."""
    import psutil

    data = tmp_path / "data.bin"
    size = 8 << 20
    with open(data, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # reads reach the disk
    with job_tree(1, 1) as job:
        (reader,) = (int(x) for x in job.ask(f"reader {data}"))
        sampler = ProcessTreeSampler(job.pid)
        for _ in range(3):
            sampler.sample()
        before = psutil.Process(reader).io_counters()
        t0 = sampler.sample().t_s
        os.kill(reader, signal.SIGUSR2)
        assert job.readline() == ["read", str(reader)]
        tree = sampler.sample()
        after = psutil.Process(reader).io_counters()
        seconds = tree.t_s - t0
        mine = {p.pid: p for p in tree.processes}[reader]
        if after.read_bytes - before.read_bytes < size // 2:
            pytest.skip(f"{tmp_path} is not on a block device: reads do not reach storage")
        assert mine.read_bytes_per_s is not None and mine.write_bytes_per_s is not None
        assert mine.read_bytes_per_s * seconds == pytest.approx(
            after.read_bytes - before.read_bytes
        )
        assert mine.write_bytes_per_s * seconds == pytest.approx(
            after.write_bytes - before.write_bytes
        )
        assert after.write_bytes - before.write_bytes >= size
        sampler.close()


def test_idle_processes_are_not_read_in_full() -> None:
    """Past the baselines, a tree whose processes all sleep costs one schedstat read per
    thread: no stat is parsed, no file opened, and every process reads 0 CPU."""
    from gpumon.sample import host

    with job_tree(2, 6, "--worker-threads", "2") as job:
        job.wait_asleep()
        sampler = ProcessTreeSampler(job.pid)
        sampler.sample()
        sampler.sample()
        parsed: list[str] = []
        real = host._stat_fields

        def counting(text: str) -> tuple[str, str, int, float, int, int]:
            parsed.append(text)
            return real(text)

        fds = len(os.listdir("/proc/self/fd"))
        with pytest.MonkeyPatch.context() as m:
            m.setattr(host, "_stat_fields", counting)
            tree = sampler.sample()
        assert len(os.listdir("/proc/self/fd")) == fds
        assert parsed == []
        assert len(tree.processes) == 9
        assert all(p.cpu_pct == 0.0 and p.read_bytes_per_s == 0.0 for p in tree.processes)
        sampler.close()


def test_new_processes_are_found_the_next_tick_without_a_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A child and its own child forked between two ticks are both in the next tick, found
    from the pids given out since the last one, not by reading children files; a new
    thread is not a process."""
    from gpumon.sample import host

    with job_tree(2, 4) as job:
        sampler = ProcessTreeSampler(job.pid)
        sampler.sample()

        def no_walk(*_a: object, **_k: object) -> None:
            raise AssertionError("walked the tree")

        monkeypatch.setattr(host, "_children_procfs", no_walk)
        _check_every_new_pid(sampler, monkeypatch)
        child, grandchild = (int(x) for x in job.ask("fork"))
        (tid,) = (int(x) for x in job.ask("thread"))
        tree = sampler.sample()
        by_pid = {p.pid: p for p in tree.processes}
        assert set(by_pid) == {job.pid, *job.ranks, *job.workers, child, grandchild}
        assert by_pid[child].ppid == job.pid and by_pid[grandchild].ppid == child
        assert by_pid[child].cpu_pct is None  # its first tick: a baseline
        assert tid not in by_pid and by_pid[job.pid].num_threads == 2
        sampler.close()


def test_a_tick_after_many_new_pids_walks_the_tree_instead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More pids given out than checking them would cost against a walk: the tree is walked
    (and a new child found so); walked tick after tick, its children files are kept open,
    and closed once the ticks go quiet again."""
    with job_tree(1, 2) as job:
        sampler = ProcessTreeSampler(job.pid)
        sampler.sample()  # a walk: the first tick's
        with monkeypatch.context() as quiet:
            _check_every_new_pid(sampler, quiet)
            sampler.sample()  # no walk, whatever the machine's other processes forked

        def no_checks(*_a: object, **_k: object) -> None:
            raise AssertionError("checked the new pids one by one")

        with monkeypatch.context() as busy:
            busy.setattr(sampler, "_adopt", no_checks)
            child, grandchild = (int(x) for x in job.ask("fork"))
            _start_threads(40)  # 40 pids given out: past the cap of 32
            assert {child, grandchild} <= {p.pid for p in sampler.sample().processes}
            assert _kept_children_files() == 0  # one walk: nothing kept
            _start_threads(40)
            sampler.sample()
            assert _kept_children_files() == 6  # walked again: one file per process kept
        _check_every_new_pid(sampler, monkeypatch)
        sampler.sample()
        assert _kept_children_files() == 0
        sampler.close()


def _check_every_new_pid(sampler: ProcessTreeSampler, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ticks that check the pids given out since the last one however many: the pid cursor
    is the machine's, so other processes forking must not turn a tick into a walk."""
    monkeypatch.setattr(
        sampler, "_pids_since", lambda last, now: sampler._pids_between(last, now, 1 << 22)
    )


def test_a_missed_process_is_found_by_the_periodic_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Were the pid cursor ever to miss a new process, the walk every 300th tick finds it."""

    with job_tree(1, 1) as job:
        sampler = ProcessTreeSampler(job.pid)
        sampler.sample()
        frozen = sampler._read_cursor()
        monkeypatch.setattr(sampler, "_read_cursor", lambda: frozen)
        child, grandchild = (int(x) for x in job.ask("fork"))
        ticks = 1
        while child not in {p.pid for p in sampler.sample().processes}:
            ticks += 1
            assert ticks <= 300
        assert ticks == 300 and grandchild in {p.pid for p in sampler.sample().processes}
        sampler.close()


@pytest.mark.parametrize("subreaper", [False, True])
def test_an_orphan_leaves_the_tree_unless_the_root_is_its_subreaper(subreaper: bool) -> None:
    """A worker whose parent exits is re-parented: out of the tree (to init), or to the
    root where the root is a child subreaper (as torchrun-like launchers may be)."""
    with job_tree(1, 1, *(["--subreaper"] if subreaper else [])) as job:
        sampler = ProcessTreeSampler(job.pid)
        sampler.sample()
        middle, orphan = job.ask("orphan")
        tree = {p.pid: p for p in sampler.sample().processes}
        assert int(middle) not in tree
        if subreaper:
            assert tree[int(orphan)].ppid == job.pid
        else:
            assert int(orphan) not in tree
        assert set(tree) == set(_psutil_tree(job.pid))
        sampler.close()


def test_workers_exiting_and_forking_mid_run_match_psutil() -> None:
    """Round after round of a 128-process tree, workers killed, new pairs forked, orphans
    made and ranks killed with their workers: each tick holds exactly psutil's tree."""
    with job_tree(8, 119, "--worker-threads", "2") as job:
        sampler = ProcessTreeSampler(job.pid)
        workers = job.workers
        ranks = list(job.ranks)
        sampler.sample()
        for round_ in range(6):
            for pid in workers[round_ * 5 : round_ * 5 + 5]:
                _kill_and_wait(pid)
            job.ask("fork")
            job.ask("orphan")
            if round_ in (2, 4):
                rank = ranks[round_]
                _kill_and_wait(rank)
                for pid in job.ranks[rank]:  # they die with their rank
                    while os.path.exists(f"/proc/{pid}"):
                        time.sleep(0.01)
            tree = sampler.sample()
            assert {p.pid for p in tree.processes} == set(_psutil_tree(job.pid))
        sampler.close()


def _fork_with_pid(pid: int, fork: Callable[[], int], discard: Callable[[int], None]) -> bool:
    """Run ``fork`` so that the process it makes gets ``pid`` (as CRIU does: the kernel's
    ns_last_pid set just below); False where another process kept taking it first (the
    processes that got another pid are handed to ``discard``)."""
    for _ in range(20):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        got = fork()
        if got == pid:
            return True
        discard(got)
    return False


def _start_threads(n: int) -> None:
    """Start and join n threads: the kernel's pid cursor moves on by n."""
    for _ in range(n):
        thread = threading.Thread(target=int)
        thread.start()
        thread.join()


# It sets the machine's pid cursor back (ns_last_pid): another test's processes then get
# pids below the cursor a sampler last read, which hides them from it until its next walk
# (as a CRIU restore does; documented in ProcessTreeSampler), and their forks take the pid
# this test wants.  So it runs with no other test at once.
@pytest.mark.owns_machine
def test_a_pid_reused_within_a_tick_is_a_new_process() -> None:
    """A worker exits and, before the next tick, its pid is given to a new process: inside
    the tree that is a new member with a new baseline (its own name, no rates), outside
    the tree it is not one.  (The pid is chosen through ns_last_pid, as CRIU does; that
    sets the pid cursor back, so these ticks walk the tree.)"""
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("choosing a pid needs CAP_SYS_ADMIN (/proc/sys/kernel/ns_last_pid)")
    with job_tree(1, 2) as job:
        sampler = ProcessTreeSampler(job.pid)
        reused = job.workers[0]
        sampler.sample()
        _start_threads(8)  # the cursor then stays above every pid the reuse gives out
        sampler.sample()
        _kill_and_wait(reused)
        if not _fork_with_pid(reused, lambda: int(job.ask("fork reborn")[0]), _kill_and_wait):
            pytest.skip("the machine kept taking the pid first")
        tree = {p.pid: p for p in sampler.sample().processes}
        assert tree[reused].name == "reborn" and tree[reused].ppid == job.pid
        assert tree[reused].cpu_pct is None
        _start_threads(8)
        sampler.sample()
        _kill_and_wait(reused)
        strangers: list[subprocess.Popen[bytes]] = []

        def stranger() -> int:
            strangers.append(subprocess.Popen(["sleep", "60"]))
            return strangers[-1].pid

        try:
            if not _fork_with_pid(reused, stranger, lambda _pid: None):
                pytest.skip("the machine kept taking the pid first")
            assert reused not in {p.pid for p in sampler.sample().processes}
        finally:
            for proc in strangers:
                proc.kill()
                proc.wait(5)
        sampler.close()
