"""systemd's notify protocol: READY=1 once serving, WATCHDOG=1 while sampling progresses.

With ``Type=notify`` and ``WatchdogSec=`` systemd passes ``$NOTIFY_SOCKET`` (a unix
datagram socket; a leading ``@`` is the abstract namespace) and ``$WATCHDOG_USEC``.  The
protocol is one datagram of ``KEY=VALUE`` lines, so no library is needed.  The watchdog
is fed by a thread of its own, but only while the sampling loop beats: a tick stuck in
the driver (an NVML call that never returns) stops the pings, and systemd restarts the
daemon after ``WatchdogSec``.  Pinging from the loop itself would not do: the loop
sleeps a whole interval (up to 60 s) between ticks.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

# The longest watchdog period taken as given: a longer one is pinged as if it were this.
MAX_PERIOD_S = 86400.0


class Notifier:
    """Sends notify datagrams to ``$NOTIFY_SOCKET``; does nothing where it is unset."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        path = env.get("NOTIFY_SOCKET", "")
        self.address: str | None = None
        if path.startswith("@"):
            self.address = "\0" + path[1:]
        elif path.startswith("/"):
            self.address = path

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        """One datagram of ``fields`` (``READY=1``, ``STATUS=...``); False if it failed."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto("\n".join(fields).encode(), self.address)
        except OSError:  # systemd gone or restarting: the next one may pass
            return False
        return True


def watchdog_period_s(env: Mapping[str, str] | None = None) -> float | None:
    """``WatchdogSec`` in seconds when it is meant for this process, else None."""
    env = os.environ if env is None else env
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    pid = env.get("WATCHDOG_PID")
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return None
    # A period beyond any wait the system can make (a WATCHDOG_USEC past time_t) would
    # kill the pinging thread; pinging at least daily is always soon enough for it.
    return min(usec / 1e6, MAX_PERIOD_S)


class Watchdog:
    """Pings every third of the period while the loop's last beat is recent enough.

    ``stale_after_s``: how long after a beat the loop still counts as progressing (the
    interval between ticks plus room for a slow tick).
    """

    def __init__(
        self,
        notifier: Notifier,
        period_s: float,
        stale_after_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.notifier = notifier
        self.period_s = period_s
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._beat: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpumon-watchdog", daemon=True)

    def beat(self) -> None:
        """The sampling loop finished a tick."""
        self._beat = self._clock()

    def progressing(self) -> bool:
        beat = self._beat
        return beat is not None and self._clock() - beat <= self.stale_after_s

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s / 3.0):
            if self.progressing():
                self.notifier.send("WATCHDOG=1")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.period_s)


def stale_after_s(interval_s: float, period_s: float) -> float:
    """Beats may be this far apart before the loop counts as stuck: two intervals, and
    half the watchdog period for a slow tick."""
    return 2.0 * interval_s + period_s / 2.0
