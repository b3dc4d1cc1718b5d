"""systemd's notify protocol, spoken to a real unix datagram socket the test binds.

The daemon is told ``$NOTIFY_SOCKET`` and ``$WATCHDOG_USEC`` as systemd would tell a
``Type=notify`` unit with ``WatchdogSec=``; the test is systemd: it reads READY=1, the
WATCHDOG=1 pings and STOPPING=1.  A sampling loop stuck in the driver is made real: the
fake NVML's scenario file is swapped for a FIFO nobody writes, so the daemon's next NVML
call blocks in the library, as a hung driver call would; the pings must stop while
/metrics still answers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_serve_daemon
from test_deploy import unit_settings
from test_serve_daemon import start_daemon

from gpumon.faces.serve.notify import Notifier, Watchdog, stale_after_s, watchdog_period_s

daemons = test_serve_daemon.daemons  # the fixture: daemons a test started, stopped after it


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket standing in for systemd's, and its $NOTIFY_SOCKET value."""
    path = tmp_path / "notify.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    s.settimeout(0.2)
    yield s, str(path)
    s.close()


def messages(s: socket.socket, seconds: float) -> list[tuple[float, str]]:
    """Every datagram received within ``seconds``: (monotonic time, text)."""
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with contextlib.suppress(TimeoutError):
            out.append((time.monotonic(), s.recv(4096).decode()))
    return out


def first(s: socket.socket, want: str, timeout: float) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            text = s.recv(4096).decode()
        except TimeoutError:
            continue
        if want in text.splitlines():
            return text
    raise AssertionError(f"no {want} within {timeout} s")


# --------------------------------------------------------------------------- the pieces
def test_abstract_namespace_socket_is_reached() -> None:
    name = f"gpumon-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        s.settimeout(2)
        n = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert n.enabled and n.send("READY=1", "STATUS=x")
        assert s.recv(4096) == b"READY=1\nSTATUS=x"


def test_no_socket_means_no_notification() -> None:
    assert not Notifier({}).enabled and not Notifier({}).send("READY=1")
    assert not Notifier({"NOTIFY_SOCKET": "relative"}).enabled
    gone = Notifier({"NOTIFY_SOCKET": "/nonexistent/notify"})
    assert not gone.send("READY=1")  # said, never raised


def test_watchdog_period_is_for_this_process_only() -> None:
    assert watchdog_period_s({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert watchdog_period_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    me = str(os.getpid())
    assert watchdog_period_s({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": me}) == 0.5
    assert watchdog_period_s({}) is None and watchdog_period_s({"WATCHDOG_USEC": "x"}) is None
    assert stale_after_s(1.0, 30.0) == 17.0


def test_watchdog_pings_only_while_the_loop_beats(notify_socket) -> None:
    s, path = notify_socket
    dog = Watchdog(Notifier({"NOTIFY_SOCKET": path}), period_s=0.3, stale_after_s=0.5).start()
    try:
        assert messages(s, 0.4) == []  # no beat yet: nothing to vouch for
        for _ in range(6):
            dog.beat()
            time.sleep(0.1)
        beating = messages(s, 0.05)
        stopped_at = time.monotonic()
        after = messages(s, 1.5)
    finally:
        dog.stop()
    pings = [m for _, m in beating + after]
    assert len(pings) >= 3 and all(m == "WATCHDOG=1" for m in pings)
    late = [t for t, _ in after if t - stopped_at > 0.5 + 0.1 + 0.15]
    assert not late, f"pinged {len(late)} times after the loop stopped"


# --------------------------------------------------------------------------- the daemon
@pytest.mark.slow
def test_daemon_says_ready_feeds_the_watchdog_and_says_stopping(
    fake_nvml, tmp_path, daemons, notify_socket
) -> None:
    s, path = notify_socket
    env = dict(fake_nvml.env, NOTIFY_SOCKET=path, WATCHDOG_USEC="600000")
    d = start_daemon(env, tmp_path, wait=False)
    daemons.append(d)
    ready = first(s, "READY=1", 20)
    assert "STATUS=serving 1 GPU(s) on http://127.0.0.1:" in ready
    with socket.create_connection(("127.0.0.1", d.port), timeout=2):
        pass  # listening by the time it says READY
    pings = [m for _, m in messages(s, 1.5) if m == "WATCHDOG=1"]
    assert len(pings) >= 4  # every 0.2 s (a third of 0.6 s)
    d.proc.send_signal(signal.SIGTERM)
    first(s, "STOPPING=1", 10)
    # It stops on that one signal (a second, sent while it closes, would end it by force,
    # as systemd's second signal does): wait for its exit, never signal again.
    d.proc.wait(timeout=300)
    assert d.stop() == 0 and "Traceback" not in d.stderr_text


@pytest.mark.slow
def test_a_sampling_loop_stuck_in_nvml_stops_the_pings(
    fake_nvml, tmp_path, daemons, notify_socket
) -> None:
    s, path = notify_socket
    # WatchdogSec=2 s at a 0.2 s interval: stale after 2 * 0.2 + 1 = 1.4 s without a tick.
    env = dict(fake_nvml.env, NOTIFY_SOCKET=path, WATCHDOG_USEC="2000000")
    d = start_daemon(env, tmp_path, wait=False)
    daemons.append(d)
    first(s, "READY=1", 20)
    assert [m for _, m in messages(s, 1.5) if m == "WATCHDOG=1"], "no pings while sampling"
    fifo = tmp_path / "hang.fifo"
    os.mkfifo(fifo)
    os.replace(fifo, fake_nvml.path)  # the next NVML call blocks reading it: a hung driver
    # The pings stop: a silence of 3 s (twice the 1.4 s the loop may lag, and more) comes,
    # and the loop is stuck all the while.  Time here is the receiver's, which a busy
    # machine delays: so the test waits for the silence (a daemon that pinged on would
    # never give one) rather than timing the last ping.
    deadline = time.monotonic() + 300
    while [m for _, m in messages(s, 3.0) if m == "WATCHDOG=1"]:
        assert time.monotonic() < deadline, "the pings never stopped while sampling was stuck"
    ticks_then = d.metrics()["gpumon_samples_total"]  # HTTP still answers
    pings = [m for _, m in messages(s, 2.0) if m == "WATCHDOG=1"]
    assert not pings, f"{len(pings)} pings while sampling was stuck"
    assert d.metrics()["gpumon_samples_total"] == ticks_then  # and the loop is really stuck
    d.proc.kill()
    d.stop()


# --------------------------------------------------------------------------- the unit
DOCS = Path(__file__).resolve().parent.parent / "docs" / "serve.md"


def test_the_unit_waits_for_ready_and_keeps_a_watchdog() -> None:
    s = unit_settings()
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    period = s["WatchdogSec"][0]
    assert period.endswith("s") and 10 <= int(period[:-1]) <= 120
    # The default interval (1 s) leaves the loop far inside the watchdog's patience.
    assert stale_after_s(1.0, float(period[:-1])) < float(period[:-1])
    assert s["UMask"] == ["0027"]  # a reopened log is 0640, as logrotate creates it


def test_the_docs_list_every_capability_the_unit_keeps() -> None:
    caps = unit_settings()["CapabilityBoundingSet"][0].split()
    docs = DOCS.read_text()
    missing = [c for c in caps if f"`{c}`" not in docs]
    assert not missing, f"docs/serve.md does not list {missing}"
    for word in ("Type=notify", "WatchdogSec", "UMask=0027"):
        assert word in docs, word
