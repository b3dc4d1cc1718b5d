"""The live view's keys: what each does (``ViewControls``) and reading them (``KeyReader``).

Mouse-free and few, listed in the view's footer and its ``?`` overlay: ``?`` help, ``a``
all advice, ``g``/``→`` and ``←`` page the GPUs, ``p`` pause the view, ``q`` quit.  None of
them touches the watched job: pausing freezes only what is drawn, sampling, the verdict
and the end-of-run summary go on.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import threading
import tty
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpumon.faces.watch.view import WatchState

HELP = "help"
ADVICE = "advice"

# Cursor keys as terminals send them (normal and application cursor mode).
_SEQUENCES: dict[bytes, str] = {
    b"\x1b[C": "right",
    b"\x1bOC": "right",
    b"\x1b[D": "left",
    b"\x1bOD": "left",
    b"\x1b[A": "up",
    b"\x1bOA": "up",
    b"\x1b[B": "down",
    b"\x1bOB": "down",
}


def parse_keys(data: bytes) -> list[str]:
    """Bytes read from the terminal -> key names: letters in lower case, ``?``, ``left``,
    ``right``, ``up``, ``down``, ``esc``; other escape sequences are skipped whole."""
    keys: list[str] = []
    i = 0
    while i < len(data):
        if data[i] != 0x1B:
            ch = chr(data[i])
            keys.append(ch.lower() if ch.isascii() and ch.isalpha() else ch)
            i += 1
            continue
        seq = next((s for s in _SEQUENCES if data.startswith(s, i)), None)
        if seq is not None:
            keys.append(_SEQUENCES[seq])
            i += len(seq)
        elif i + 1 < len(data) and data[i + 1] in b"[O":
            # Some other CSI/SS3 sequence (F-keys, Home, ...): skip to its final byte.
            j = i + 2
            while j < len(data) and not 0x40 <= data[j] <= 0x7E:
                j += 1
            i = j + 1
        else:
            keys.append("esc")
            i += 1
    return keys


class ViewControls:
    """What the keys changed, read by the layout on each refresh.

    ``page`` may run past the last page or below zero: the layout, which alone knows how
    many GPUs fit, wraps it round.
    """

    def __init__(
        self,
        state: WatchState,
        quit_event: threading.Event,
        *,
        quit_closes_view_only: bool = False,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.state = state
        self.quit = quit_event
        self.quit_closes_view_only = quit_closes_view_only  # `watch -- CMD`: the command runs on
        self.on_change = on_change
        self.page = 0
        self.overlay: str | None = None
        self.frozen: WatchState | None = None  # the paused view's copy of the state

    @property
    def paused(self) -> bool:
        return self.frozen is not None

    def press(self, key: str) -> None:
        if key == "q":
            self.quit.set()
        elif key == "?":
            self.overlay = None if self.overlay == HELP else HELP
        elif key == "a":
            self.overlay = None if self.overlay == ADVICE else ADVICE
        elif key == "esc":
            self.overlay = None
        elif key in ("g", "right", "down"):
            self.page += 1
        elif key in ("left", "up"):
            self.page -= 1
        elif key == "p":
            self.frozen = None if self.frozen is not None else self.state.freeze()
        else:
            return
        if self.on_change is not None:
            self.on_change()


class KeyReader:
    """Reads keys from the terminal in cbreak mode on a thread and hands each to ``on_key``.

    cbreak keeps ISIG, so Ctrl-C still raises SIGINT as usual.  The terminal's settings are
    restored on ``close()`` whatever happened.
    """

    def __init__(self, on_key: Callable[[str], None], fd: int | None = None) -> None:
        self.on_key = on_key
        self.fd = sys.stdin.fileno() if fd is None else fd
        self._saved: list | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpumon-keys", daemon=True)

    def start(self) -> KeyReader:
        if not os.isatty(self.fd):
            return self
        try:
            background = os.tcgetpgrp(self.fd) != os.getpgrp()
        except OSError:  # not this process's controlling terminal: it cannot stop us
            background = False
        if background:
            return self  # a background group setting its terminal up is stopped (SIGTTOU)
        try:
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        except (OSError, termios.error):  # EINTR from a signal, EIO: the view goes on without keys
            if self._saved is not None:
                with contextlib.suppress(OSError, termios.error):
                    termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
                self._saved = None
            return self
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.1)
                if not ready:
                    continue
                data = os.read(self.fd, 64)
            except OSError:
                return
            if not data:
                return
            for key in parse_keys(data):
                self.on_key(key)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        if self._saved is not None:
            with contextlib.suppress(termios.error):
                termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
            self._saved = None
