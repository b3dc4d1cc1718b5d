"""`gpumon watch -- CMD`: start the command, pass its signals on, keep its output intact.

The command runs in gpumon's own process group, as it would from the shell, so Ctrl-C at
the terminal reaches it directly; gpumon forwards SIGINT/SIGHUP only when they did not
come from the terminal (someone ran ``kill`` on gpumon), so the command never gets the
same Ctrl-C twice, and forwards SIGTERM always.  While the full-screen view is up the
command's output goes through a pipe (its last lines are shown in the view) and is
replayed to the terminal when the view closes, then passed straight through.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from typing import Any

from gpumon.errors import GpumonError

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Lines of the command's output kept while the view is up (replayed when it closes).
TAIL_LINES = 10_000


class CommandError(GpumonError):
    """The command could not be started (shell conventions: 127 not found, 126 not runnable)."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


def exit_status(returncode: int) -> int:
    """Popen's returncode as the shell reports it: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class OutputPump:
    """Reads the command's merged stdout/stderr; keeps a tail, or passes it through."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.lines: deque[bytes] = deque(maxlen=TAIL_LINES)
        self.dropped = 0
        self.lock = threading.Lock()
        self.passthrough = False
        # Writing to the terminal failed (closed pipe, EIO): keep draining, discard.
        self.broken = False
        self._thread = threading.Thread(target=self._run, name="gpumon-output", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        out = sys.stdout.buffer
        for line in iter(self.stream.readline, b""):
            with self.lock:
                if self.passthrough:
                    if not self.broken:
                        self._write(out, line)
                    continue
                if len(self.lines) == self.lines.maxlen:
                    self.dropped += 1
                self.lines.append(line)

    def _write(self, out: Any, data: bytes) -> None:
        """Pass ``data`` on; on the first failed write stop passing and only drain, so the
        command never blocks on a full pipe (the pump must outlive its reader)."""
        try:
            out.write(data)
            out.flush()
        except (OSError, ValueError):  # BrokenPipeError, EIO; ValueError: stdout closed
            self.broken = True

    def tail(self, n: int) -> list[str]:
        """The last ``n`` lines for the view (a progress bar's \\r keeps its last state)."""
        with self.lock:
            raw = list(self.lines)[-n:]
        return [b.rstrip(b"\r\n").rsplit(b"\r", 1)[-1].decode(errors="replace") for b in raw]

    def release(self) -> None:
        """The view is gone: replay what was kept, then pass everything straight through."""
        with self.lock:
            if self.passthrough:
                return
            out = sys.stdout.buffer
            if self.dropped:
                out.write(
                    f"gpumon: {self.dropped} earlier lines of the command's output were "
                    "only shown in the live view\n".encode()
                )
            out.writelines(self.lines)
            out.flush()
            self.lines.clear()
            self.passthrough = True

    def join(self, timeout: float = 5.0) -> None:
        """Wait for the last output after the command exits (a child of it may hold the pipe)."""
        self._thread.join(timeout)


class Child:
    """The watched command.  ``capture`` pipes its output (for the full-screen view)."""

    def __init__(self, argv: tuple[str, ...], *, capture: bool) -> None:
        env = None
        if capture:
            # A pipe makes Python block-buffer its stdout; keep the view's tail current.
            env = dict(os.environ)
            env.setdefault("PYTHONUNBUFFERED", "1")
        # Signals are the command's from the moment it exists: one that arrives while it
        # starts is held and forwarded once it has a pid (gpumon's own start-up, NVML and
        # the session, can take seconds; a SIGTERM then must not kill gpumon and orphan
        # the command).  Handlers set here are reset in the command by exec.
        self._previous: dict[int, Any] = {}
        self.signals: list[int] = []
        early: list[int] = []
        self._catch(lambda signum, _frame: early.append(signum))
        try:
            self.proc = subprocess.Popen(
                list(argv),
                stdout=subprocess.PIPE if capture else None,
                stderr=subprocess.STDOUT if capture else None,
                env=env,
            )
        except FileNotFoundError:
            self.restore_signals()
            raise CommandError(f"cannot run {argv[0]!r}: command not found.", 127) from None
        except PermissionError:
            self.restore_signals()
            raise CommandError(f"cannot run {argv[0]!r}: permission denied.", 126) from None
        except OSError as exc:
            self.restore_signals()
            raise CommandError(f"cannot run {argv[0]!r}: {exc.strerror or exc}.", 126) from None
        self.pid = self.proc.pid
        self.pump = OutputPump(self.proc.stdout) if capture else None
        self._catch(self._on_signal)
        for signum in early:
            self._on_signal(signum, None)

    # --- signals -------------------------------------------------------------------------

    def _catch(self, handler: Any) -> None:
        """``handler`` for every forwarded signal (the main thread only: elsewhere Python
        sets none); the handlers before the first kept for ``restore_signals``."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in FORWARDED:
            previous = signal.signal(sig, handler)
            self._previous.setdefault(sig, previous)

    def forward_signals(self) -> None:
        """Forward the signals to the command (already so since it started; kept for
        callers that say so where the run begins)."""
        self._catch(self._on_signal)

    def restore_signals(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)
        if signum != signal.SIGTERM and self._terminal_sent_it_too():
            return
        self.send(signum)

    def _terminal_sent_it_too(self) -> bool:
        """True when gpumon and the command share the terminal's foreground process group:
        then a Ctrl-C (or hang-up) from the terminal has already reached the command."""
        try:
            same_group = os.getpgid(self.pid) == os.getpgrp()
        except OSError:
            return False
        if not same_group:
            return False
        for fd in (0, 1, 2):
            try:
                return os.tcgetpgrp(fd) == os.getpgrp()
            except OSError:
                continue
        return False

    def send(self, signum: int) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    # --- the end ---------------------------------------------------------------------------

    def wait(self) -> int:
        """Wait for the command (it decides how long a Ctrl-C takes); shell-style status."""
        while True:
            try:
                rc = self.proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - handlers are ours while waiting
                continue
        if self.pump is not None:
            self.pump.join()
        return exit_status(rc)
