"""The daemon's event log: JSON lines, reopened on SIGHUP, never fatal.

Admins read it with ``jq`` and rotate it with ``logrotate`` (``postrotate`` sends SIGHUP;
the next write goes to a fresh file).  A log that cannot be written (full disk, a
read-only mount, a deleted directory) must never stop sampling: the failure is counted
(``gpumon_log_write_errors_total``), reported once on stderr, and retried on the next
line; a recovery is reported once too.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from typing import IO, Any


def _clean(value: Any) -> Any:
    """JSON has no NaN/Infinity; such a number becomes null rather than an invalid line."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


class EventLog:
    """Appends one JSON object per line to ``path`` (``None``: logging is off)."""

    def __init__(self, path: str | None, *, stderr: IO[str] | None = None) -> None:
        self.path = path
        self.errors_total = 0
        self.lines_total = 0
        self._fh: IO[str] | None = None
        self._failing = False
        self._stderr = stderr
        self.reopen_wanted = False
        if path is not None:
            self._open()

    def _err(self) -> IO[str]:
        return self._stderr if self._stderr is not None else sys.stderr

    def _open(self) -> bool:
        assert self.path is not None
        try:
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        except OSError as exc:
            self._fh = None
            self._fail(exc)
            return False
        return True

    def _fail(self, exc: OSError) -> None:
        self.errors_total += 1
        if not self._failing:
            self._failing = True
            reason = exc.strerror or str(exc)
            print(
                f"gpumon: cannot write the log {self.path}: {reason}; sampling and metrics "
                "go on, and the failed lines are counted in gpumon_log_write_errors_total.",
                file=self._err(),
                flush=True,
            )

    def request_reopen(self) -> None:
        """Called from the SIGHUP handler: only a flag, the I/O happens on the next write."""
        self.reopen_wanted = True

    def reopen(self) -> None:
        """Close and open ``path`` again (after logrotate moved the old file away)."""
        self.reopen_wanted = False
        if self.path is None:
            return
        self._close_quietly()
        self._open()

    def write(self, record: dict[str, Any]) -> bool:
        """Append one line; False (and counted) when it could not be written."""
        if self.path is None:
            return False
        if self.reopen_wanted:
            self.reopen()
        if self._fh is None and not self._open():
            return False
        assert self._fh is not None
        line = json.dumps(_clean(record), separators=(",", ":"), sort_keys=False)
        try:
            self._fh.write(line + "\n")
            self._fh.flush()
        except OSError as exc:
            # A partly written buffer would be retried on the next flush and corrupt the
            # next line; drop the handle and start clean on the next write.
            self._close_quietly()
            self._fail(exc)
            return False
        self.lines_total += 1
        if self._failing:
            self._failing = False
            print(f"gpumon: writing the log {self.path} works again.", file=self._err(), flush=True)
        return True

    def _close_quietly(self) -> None:
        fh, self._fh = self._fh, None
        if fh is None:
            return
        with contextlib.suppress(OSError):
            fh.close()

    def close(self) -> None:
        self._close_quietly()
