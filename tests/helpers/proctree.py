"""A real process tree for tests: a parent whose worker children burn (or idle on) CPU.

Run as a script: ``python proctree.py BURNERS SLEEPERS [LIFETIME_S] [SHORT_LIVED_S]``.
The parent prints one line, ``ready <pid> <pid>...`` (the workers' pids), then waits.  A
worker given SHORT_LIVED_S exits after that long, to test workers vanishing mid-run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    os._exit(0)


def _sleep(seconds: float) -> None:
    time.sleep(seconds)
    os._exit(0)


def main() -> None:
    burners, sleepers = int(sys.argv[1]), int(sys.argv[2])
    lifetime = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
    short_lived = float(sys.argv[4]) if len(sys.argv) > 4 else None
    pids = []
    for i in range(burners + sleepers):
        pid = os.fork()
        if pid == 0:
            seconds = short_lived if (short_lived is not None and i == 0) else lifetime
            (_burn if i < burners else _sleep)(seconds)
        pids.append(pid)
    # The parent stands for an idle main process: it sleeps until a signal, never polls
    # (a poll loop costs a few % of a core on a busy machine: not idle beside its burners).
    signal.signal(signal.SIGCHLD, lambda *_: _reap())  # workers that exit early
    signal.signal(signal.SIGTERM, lambda *_: _stop(pids))
    print("ready", *pids, flush=True)
    time.sleep(lifetime)  # resumed after each handler (PEP 475)
    _stop(pids)


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _stop(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os._exit(0)


if __name__ == "__main__":
    main()
