"""A real process tree shaped like a training job, for tests and benchmarks.

Run as a script: ``python jobtree.py RANKS WORKERS [options]``.  The root (a launcher)
forks RANKS ranks; the ranks fork WORKERS workers between them (round robin).  Every
process sleeps (blocked, no wakeups) unless told otherwise; ``--rank-threads`` and
``--worker-threads`` give each rank or worker that many threads in all (the extra ones
sleep; a DataLoader worker has at least a queue feeder thread), ``--busy N`` makes the
first N workers run in bursts (``--burst-ms`` of CPU every ``--period-ms``).  A worker
sent SIGUSR1 burns CPU for ``--usr1-s`` seconds.  Each process dies with its parent;
``os.killpg(ROOT, SIGKILL)`` ends them all (the root leads a process group of its own).

The root prints ``ready ROOT`` and then ``rank PID WORKER...`` for each rank and
``end``; then it answers commands on stdin, one line each:

* ``fork [NAME]``: a new child of the root, which forks a grandchild at once: ``forked
  CHILD GRANDCHILD`` (both sleep; NAME, if given, becomes the child's comm).
* ``orphan``: a child that forks a grandchild and exits: ``orphan CHILD GRANDCHILD``,
  printed once the child is gone (the grandchild is re-parented: to the root where it is
  a subreaper, ``--subreaper``, else out of the tree).
* ``thread``: a new sleeping thread in the root: ``thread TID``.
* ``reader PATH``: a new child of the root that waits for SIGUSR2: ``reader CHILD``.
  On the signal it reads PATH whole, writes as many bytes to PATH.copy, prints ``read
  CHILD`` and sleeps again.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    """This process gets SIGKILL when the process that forked it exits."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _sleep_forever() -> None:
    while True:
        time.sleep(3600)


def _threads(n: int) -> None:
    """Start n - 1 sleeping threads (the caller's own makes n)."""
    for _ in range(n - 1):
        threading.Thread(target=_sleep_forever, daemon=True).start()


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _child(body: object, *args: object) -> int:
    """Fork; the child runs ``body(*args)`` (and dies with this process)."""
    pid = os.fork()
    if pid == 0:
        try:
            _die_with_parent()
            body(*args)  # type: ignore[operator]
        finally:
            os._exit(0)
    return pid


def _worker(threads: int, burst_s: float, period_s: float, usr1_s: float, ready: int) -> None:
    signal.signal(signal.SIGUSR1, lambda *_: _burn(usr1_s))
    _threads(threads)
    os.write(ready, b".")
    os.close(ready)
    if burst_s <= 0:
        _sleep_forever()
    while True:
        _burn(burst_s)
        time.sleep(period_s - burst_s)


def _rank(workers: list[tuple[int, float]], args: argparse.Namespace, out: int) -> None:
    """Fork this rank's workers, start its threads, report their pids on ``out`` once
    every worker has started its own threads, then sleep."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed workers are reaped at once
    r, w = os.pipe()
    pids = [
        _child(_worker, args.worker_threads, burst, args.period_ms / 1000, args.usr1_s, w)
        for _, burst in workers
    ]
    os.close(w)
    _threads(args.rank_threads)
    for _ in pids:
        os.read(r, 1)
    os.close(r)
    os.write(out, (" ".join(map(str, [os.getpid(), *pids])) + "\n").encode())
    os.close(out)
    _sleep_forever()


def _pair(name: str | None, orphan: bool, out: int) -> None:
    """A child that forks a grandchild, reports both, then sleeps (or exits)."""
    if name:
        with open(f"/proc/{os.getpid()}/comm", "w") as f:
            f.write(name)
    grandchild = os.fork()
    if grandchild == 0:
        if not orphan:
            _die_with_parent()
        _sleep_forever()
    os.write(out, f"{os.getpid()} {grandchild}\n".encode())
    if not orphan:
        _sleep_forever()


def _reader(path: str, out: int) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    os.write(out, f"{os.getpid()}\n".encode())
    signal.sigwait({signal.SIGUSR2})
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            size += len(chunk)
    with open(path + ".copy", "wb") as f:
        f.write(b"x" * size)
    print("read", os.getpid(), flush=True)
    _sleep_forever()


def _new_thread() -> int:
    """Start a sleeping thread; its thread id once it runs."""
    started = threading.Event()
    tid: list[int] = []

    def run() -> None:
        tid.append(threading.get_native_id())
        started.set()
        _sleep_forever()

    threading.Thread(target=run, daemon=True).start()
    started.wait()
    return tid[0]


def _ask(body: object, *args: object) -> str:
    """Run ``body(*args, write_end)`` in a new child of the root; its one reply line."""
    r, w = os.pipe()
    _child(body, *args, w)
    os.close(w)
    with os.fdopen(r) as f:
        return f.readline().strip()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ranks", type=int)
    parser.add_argument("workers", type=int)
    parser.add_argument("--rank-threads", type=int, default=1)
    parser.add_argument("--worker-threads", type=int, default=1)
    parser.add_argument("--busy", type=int, default=0)
    parser.add_argument("--burst-ms", type=float, default=0.2)
    parser.add_argument("--period-ms", type=float, default=1.0)
    parser.add_argument("--usr1-s", type=float, default=1.0)
    parser.add_argument("--subreaper", action="store_true")
    args = parser.parse_args()
    os.setpgid(0, 0)  # a group of its own: killpg(ROOT) ends the tree, orphans included
    if args.subreaper:
        _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children that exit are reaped at once
    burst_s = args.burst_ms / 1000
    plan: list[list[tuple[int, float]]] = [[] for _ in range(args.ranks)]
    for i in range(args.workers):
        plan[i % args.ranks].append((i, burst_s if i < args.busy else 0.0))
    lines = []
    for workers in plan:
        lines.append(_ask(_rank, workers, args))
    print("ready", os.getpid(), flush=True)
    for line in lines:
        print("rank", line)
    print("end", flush=True)
    for command in sys.stdin:
        word, *rest = command.split()
        if word == "fork":
            print("forked", _ask(_pair, rest[0] if rest else None, False), flush=True)
        elif word == "orphan":
            child, grandchild = _ask(_pair, None, True).split()
            while os.path.exists(f"/proc/{child}"):  # until it has exited and been reaped
                time.sleep(0.01)
            print("orphan", child, grandchild, flush=True)
        elif word == "thread":
            print("thread", _new_thread(), flush=True)
        elif word == "reader":
            print("reader", _ask(_reader, rest[0]), flush=True)


if __name__ == "__main__":
    main()
