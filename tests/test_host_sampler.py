"""The host sampler against a real process tree the test starts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

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


def test_tree_cpu_is_attributed_to_the_burning_workers(tree: Tree) -> None:
    sampler = ProcessTreeSampler(tree.pid)
    first = sampler.sample()
    assert {p.pid for p in first.processes} == {tree.pid, *tree.workers}
    assert all(p.cpu_pct is None for p in first.processes)  # baseline tick has no rates
    time.sleep(1.0)
    second = sampler.sample()
    by_pid = {p.pid: p for p in second.processes}
    burners, sleeper = tree.workers[:2], tree.workers[2]
    # The burners get real CPU; the parent and the sleeping worker next to nothing.  The
    # comparison is relative: the machine may be shared, so a burner's absolute share varies.
    idle_cpu = max(by_pid[sleeper].cpu_pct, by_pid[tree.pid].cpu_pct)
    for pid in burners:
        assert by_pid[pid].cpu_pct is not None and by_pid[pid].cpu_pct > 10.0
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
        again = sampler.sample()  # re-read through the kept files
        assert {p.pid for p in again.processes} == {p.pid for p in first.processes}
        assert open_fds() == with_three
        time.sleep(1.2)
        later = sampler.sample()
        assert {p.pid for p in later.processes} == {t.pid, t.workers[1]}
        assert open_fds() < with_three
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


def test_children_of_any_thread_are_found_and_their_files_kept() -> None:
    """A child is listed under the thread that forked it: every thread's file is read, kept
    open while the threads stay the same, and listed again when they change."""
    proc = subprocess.Popen(
        [sys.executable, "-c", THREADED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    children: list[int] = []
    try:
        first_child = int(proc.stdout.readline())
        children.append(first_child)
        sampler = ProcessTreeSampler(proc.pid, fd_budget=FdBudget(64))
        tree = sampler.sample()
        assert {p.pid for p in tree.processes} == {proc.pid, first_child}
        assert tree.root is not None and tree.root.num_threads == 5  # main, 3 + 1 threads
        kept = _kept_children_files()
        assert kept >= 5  # one per thread of the root (and the child's own)
        assert {p.pid for p in sampler.sample().processes} == {proc.pid, first_child}
        assert _kept_children_files() == kept  # read again through the kept files
        proc.stdin.write("\n")
        proc.stdin.flush()
        second_child = int(proc.stdout.readline())
        children.append(second_child)
        tree = sampler.sample()
        assert {p.pid for p in tree.processes} == {proc.pid, first_child, second_child}
        sampler.close()
        assert _kept_children_files() == 0
    finally:
        for pid in children:  # the forked children outlive their killed parent otherwise
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait(5)


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
    host = sampler.sample()
    assert host.cpu_pct_per_core == (pytest.approx(60.0),)
    assert host.iowait_pct == pytest.approx(20.0)
    assert host.mem_used_bytes == 600 * 1024 and host.mem_total_bytes == 1000 * 1024
    assert host.disk_read_bytes_per_s == pytest.approx(2048 * 512 / 2.0, rel=0.01)
    assert host.disk_write_bytes_per_s == pytest.approx(4096 * 512 / 2.0, rel=0.01)
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
