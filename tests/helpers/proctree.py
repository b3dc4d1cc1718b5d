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
    print("ready", *pids, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: _stop(pids))
    end = time.monotonic() + lifetime
    while time.monotonic() < end:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(-1, os.WNOHANG)  # reap workers that exit early
        time.sleep(0.05)
    _stop(pids)


def _stop(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os._exit(0)


if __name__ == "__main__":
    main()
