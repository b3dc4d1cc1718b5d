"""The daemon's event log: JSON lines, whole lines only, reopened when moved, never fatal.

Admins read it with ``jq`` and rotate it with ``logrotate`` (``postrotate`` sends SIGHUP;
the next write goes to a fresh file).  A log that cannot be written (full disk, a
read-only mount, a deleted directory) must never stop sampling, and must never stop being
JSON lines either:

- each line goes out in one ``os.write`` on an ``O_APPEND`` descriptor; when the write
  comes back short or fails (ENOSPC, EFBIG), the file is truncated back to where the line
  began, so no fragment is left for the next line to be glued to.  The line is lost,
  counted (``gpumon_log_write_errors_total``) and said once on stderr; the next line is
  tried as usual, and the recovery is said once too, with the count of lines lost;
- before each line the path is compared with the open file (``st_dev``/``st_ino``, as the
  stdlib's ``WatchedFileHandler`` does): a log removed or replaced behind the daemon's
  back is reopened at its path instead of feeding a deleted file until the next SIGHUP
  (counted in ``gpumon_log_reopens_total``).

The daemon often runs as root and the log's folder may be writable by others: the log is
opened without following a symbolic link (``O_NOFOLLOW``), without blocking on a FIFO
(``O_NONBLOCK``), and kept only if what was opened is a regular file with no other name
(``fstat``: a hard link would be another file's name); at start, on SIGHUP and on every
reopen after a move.  Anything else is not written: the lines are lost and counted, and
the reason said once, as for a full disk.

New files are created 0640, the mode logrotate's ``create`` gives them.  A log whose
folder is missing at start (``--log /var/log/gpumon/gpumon.jsonl`` on a fresh node) gets
it made, 0750, by ``make_folder`` before the daemon serves; each folder it creates is
entered without following a symbolic link, so a link planted in its place is refused, not
followed.  A folder that cannot be made stops the daemon from starting (a log that was
never going to be written is a configuration error, not a fault to count).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import sys
from typing import IO, Any

from gpumon.files import what_is_at, what_it_is

FILE_MODE = 0o640
FOLDER_MODE = 0o750  # root writes; the adm group (logrotate, log readers) reads
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_OPEN_FLAGS = (
    os.O_WRONLY
    | os.O_APPEND
    | os.O_CREAT
    | os.O_CLOEXEC
    | os.O_NOFOLLOW  # a link planted at the path is not followed ...
    | os.O_NONBLOCK  # ... and a FIFO there does not hang the daemon until a reader comes
    | os.O_NOCTTY
)

# Why the log was reopened (the label values of gpumon_log_reopens_total).
REOPEN_REASONS = ("signal", "removed", "replaced")

# The one system call the writer makes per line; a test puts a fault in its place.
_write = os.write


_NOT_A_FILE = "it is {} (gpumon writes its log only into a regular file of its own)"


def _refusal(st: os.stat_result) -> str | None:
    """What the opened path is when it is not a log gpumon may append to, else None."""
    what = what_it_is(st)
    if what is not None:
        return what
    return None if st.st_nlink <= 1 else f"a file with {st.st_nlink} names (hard links)"


def make_folder(path: str) -> list[str]:
    """Create the folders missing above the log file ``path``, FOLDER_MODE each; the ones
    created, outermost first.  The nearest folder that exists is opened as it is (links
    included: /var/log may be one); below it each new folder is made and entered by name
    from its parent with ``O_NOFOLLOW``.  OSError (its ``filename`` the folder) otherwise."""
    folder = os.path.dirname(os.path.abspath(path))
    missing: list[str] = []
    while not os.path.lexists(folder):  # a dangling link exists: the open below refuses it
        missing.append(folder)
        folder = os.path.dirname(folder)
    try:
        fd = os.open(folder, _FOLDER_FLAGS)
    except OSError as exc:
        if os.path.islink(folder) and exc.errno == errno.ENOENT:
            raise OSError(exc.errno, "a symbolic link to nothing is in its place", folder) from None
        raise OSError(exc.errno, exc.strerror, folder) from None
    created: list[str] = []
    try:
        for new in reversed(missing):
            name = os.path.basename(new)
            try:
                made = _mkdir(name, fd)
                inner = os.open(name, _FOLDER_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if _is_link(name, fd):  # put there since it was looked at (ELOOP, ENOTDIR)
                    raise OSError(errno.ELOOP, "a symbolic link is in its place", new) from None
                raise OSError(exc.errno, exc.strerror, new) from None
            os.close(fd)
            fd = inner
            if made:
                os.fchmod(fd, FOLDER_MODE)  # whatever the umask took away
                created.append(new)
    finally:
        os.close(fd)
    return created


def _is_link(name: str, parent: int) -> bool:
    """Whether ``name`` in the folder ``parent`` is a symbolic link (only a link reads)."""
    try:
        os.readlink(name, dir_fd=parent)
    except OSError:
        return False
    return True


def _mkdir(name: str, parent: int) -> bool:
    """Make ``name`` in the folder ``parent``; False if something made it first."""
    try:
        os.mkdir(name, FOLDER_MODE, dir_fd=parent)
    except FileExistsError:
        return False
    return True


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
    """Appends one JSON object per line to ``path`` (``None``: logging is off).

    ``errors_total`` counts the lines lost (never written, or cut short and truncated
    away); ``reopens`` counts reopenings by reason.
    """

    def __init__(self, path: str | None, *, stderr: IO[str] | None = None) -> None:
        self.path = path
        self.errors_total = 0
        self.lines_total = 0
        self.reopens: dict[str, int] = dict.fromkeys(REOPEN_REASONS, 0)
        self._fd: int | None = None
        self._dev_ino: tuple[int, int] | None = None
        self._failing = False
        self._lost_in_streak = 0
        self._fragment = False  # a cut line could not be truncated away: end it first
        self._said_moved = False
        self._stderr = stderr
        self.reopen_wanted = False
        if path is not None:
            self._open()

    def _err(self) -> IO[str]:
        return self._stderr if self._stderr is not None else sys.stderr

    def _say(self, text: str) -> None:
        print(f"gpumon: {text}", file=self._err(), flush=True)

    # --- the file ----------------------------------------------------------------------

    def _open(self) -> OSError | None:
        """Open ``path`` for appending; the error instead of raising."""
        assert self.path is not None
        self._fd, self._dev_ino = None, None
        try:
            fd = os.open(self.path, _OPEN_FLAGS, FILE_MODE)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO):  # a link; a FIFO without a reader
                return OSError(exc.errno, _NOT_A_FILE.format(what_is_at(self.path)))
            return exc
        try:
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            return exc
        refused = _refusal(st)
        if refused is not None:
            os.close(fd)
            return OSError(errno.EINVAL, _NOT_A_FILE.format(refused))
        self._fd, self._dev_ino = fd, (st.st_dev, st.st_ino)
        return None

    def _close_quietly(self) -> None:
        fd, self._fd, self._dev_ino = self._fd, None, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _moved(self) -> str | None:
        """'removed' or 'replaced' when ``path`` is no longer the open file, else None."""
        assert self.path is not None
        try:
            st = os.lstat(self.path)  # a link put in the file's place is a replacement
        except FileNotFoundError:
            return "removed"
        except OSError:
            return None  # cannot tell (a directory gone unreadable): keep writing
        return None if (st.st_dev, st.st_ino) == self._dev_ino else "replaced"

    def request_reopen(self) -> None:
        """Called from the SIGHUP handler: only a flag, the I/O happens on the next write."""
        self.reopen_wanted = True

    def reopen(self, reason: str = "signal") -> None:
        """Close and open ``path`` again (after logrotate moved the old file away)."""
        self.reopen_wanted = False
        if self.path is None:
            return
        self.reopens[reason] = self.reopens.get(reason, 0) + 1
        self._close_quietly()
        self._fragment = False  # that file is no longer written
        self._open()  # a failure shows on the next write, with the line it loses

    # --- lines -------------------------------------------------------------------------

    def write(self, record: dict[str, Any]) -> bool:
        """Append one whole line; False (and the line counted as lost) when it cannot be."""
        if self.path is None:
            return False
        if self.reopen_wanted:
            self.reopen("signal")
        elif self._fd is not None:
            moved = self._moved()
            if moved is not None:
                if not self._said_moved:
                    self._said_moved = True
                    self._say(
                        f"the log {self.path} was {moved} while gpumon wrote it; writing to a "
                        "new file at that path (counted in gpumon_log_reopens_total)."
                    )
                self.reopen(moved)
        data = (json.dumps(_clean(record), separators=(",", ":")) + "\n").encode()
        failure = self._open() if self._fd is None else None
        if failure is None:
            failure = self._append(data)
        if failure is not None:
            self._lost(failure)
            return False
        self.lines_total += 1
        if self._failing:
            self._failing = False
            self._say(
                f"writing the log {self.path} works again ({self._lost_in_streak} "
                f"line{'s' if self._lost_in_streak != 1 else ''} lost)."
            )
            self._lost_in_streak = 0
        return True

    def _append(self, data: bytes) -> OSError | None:
        """Write ``data`` whole, or leave the file as it was; the error instead of raising."""
        fd = self._fd
        assert fd is not None
        if self._fragment:
            data = b"\n" + data
        try:
            start = os.fstat(fd).st_size
        except OSError as exc:
            return exc
        view = memoryview(data)
        done = 0
        try:
            while done < len(data):
                n = _write(fd, view[done:])
                if n <= 0:  # never for a regular file; do not spin on it
                    raise OSError(errno.EIO, "the write made no progress")
                done += n
        except OSError as exc:
            if done:  # a write either writes or fails: only a short one left a fragment
                self._cut_back(fd, start)
            return exc
        self._fragment = False
        return None

    def _cut_back(self, fd: int, size: int) -> None:
        """Truncate a partly written line away; if even that fails, end it on the next line."""
        try:
            os.ftruncate(fd, size)
        except OSError:
            self._fragment = True

    def _lost(self, exc: OSError) -> None:
        self.errors_total += 1
        self._lost_in_streak += 1
        if not self._failing:
            self._failing = True
            reason = exc.strerror or str(exc)
            self._say(
                f"cannot write the log {self.path}: {reason}; sampling and metrics go on, "
                "and the lost lines are counted in gpumon_log_write_errors_total."
            )

    def close(self) -> None:
        self._close_quietly()
