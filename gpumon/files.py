"""Files named by people, opened as gpumon's rules say: only regular files, bounded, never
through a planted link, never blocking on a FIFO.

gpumon often runs as root, and the paths it is given (a configuration, a TLS key, a report
store shared between nodes, ``--summary-json`` in a CI job) may lie in folders others can
write.  Every reader and writer of such a file goes through this module, so one rule holds
everywhere:

- **reading** opens without blocking (``O_NONBLOCK``: a FIFO with no writer does not hang
  the start), keeps the file only if ``fstat`` says it is a regular file (``/dev/zero``, a
  FIFO, a socket are refused by name), and reads at most ``limit`` bytes: a file larger
  than what it is for is refused before it is read, and one that grows while read is cut
  at the limit and refused.  A link is followed (an admin's configuration is often one,
  and a Kubernetes ConfigMap always is): what it leads to is checked;
- **replacing** a file whole (a summary, a kept report) writes a temporary file created
  exclusively (``mkstemp``: a random name, ``O_EXCL``, so a link planted at a guessable
  name is never followed) in the target's folder, then renames it over the target; and
  only over a regular file or nothing: a FIFO, a device, a link, a folder at the path are
  refused, so ``--summary-json /dev/full`` run as root cannot replace the machine's
  device;
- **streaming** into a file (a trace) opens it without following a link
  (``O_NOFOLLOW``), without blocking, keeps it only if it is a regular file, and takes an
  exclusive ``flock`` on it, so two recorders on one path cannot tear it: the second is
  refused before it truncates anything.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator

# What each kind of file may weigh: far above any real one, far below what hurts.
CONFIG_LIMIT = 1 << 20  # a TOML or YAML configuration, a web configuration
PEM_LIMIT = 1 << 20  # a TLS certificate chain, key or CA bundle
SECRET_LIMIT = 64 << 10  # a password or bearer-token file
REPORT_LIMIT = 16 << 20  # one kept job report (text and JSON of hundreds of GPUs)

_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_STREAM_FLAGS = (
    os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
)


class NotARegularFile(OSError):
    """The path names something gpumon does not read or write as a file; ``strerror`` says
    what it is, in words."""


class TooLarge(OSError):
    """The file is larger than what it is for (``strerror`` says both sizes)."""


class Locked(OSError):
    """Another process holds the file's lock (another gpumon writing it)."""


def what_it_is(st: os.stat_result) -> str | None:
    """What ``st`` describes when it is not a regular file, in words; None for a file."""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a plain file"


def what_is_at(path: str) -> str:
    """What is at ``path`` (not following a link), in words, for a refusal."""
    try:
        st = os.lstat(path)
    except OSError:
        return "not a plain file"
    return what_it_is(st) or "a file"


def _is_dev_null(st: os.stat_result) -> bool:
    """The null device (character device 1:3 on Linux), which reads as empty."""
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)


def _refuse(path: str, what: str) -> NotARegularFile:
    return NotARegularFile(errno.EINVAL, f"it is {what}, not a regular file", path)


@contextlib.contextmanager
def opened_for_reading(
    path: str | os.PathLike[str], limit: int, *, empty_ok: bool = False
) -> Iterator[int]:
    """An fd on the regular file at ``path``, no larger than ``limit`` bytes; OSError
    (``NotARegularFile``, ``TooLarge``, or the open's own) otherwise.  The fd is in
    blocking mode again (a regular file never blocks).  ``empty_ok``: ``/dev/null`` is
    taken too, as the empty file it reads as (``--config /dev/null``: no configuration)."""
    name = os.fspath(path)
    fd = os.open(name, _READ_FLAGS)
    try:
        st = os.fstat(fd)
        what = what_it_is(st)
        if what is not None and not (empty_ok and _is_dev_null(st)):
            raise _refuse(name, what)
        if st.st_size > limit:
            raise TooLarge(errno.EFBIG, _too_large(st.st_size, limit), name)
        os.set_blocking(fd, True)
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def checked_path(path: str | os.PathLike[str] | None, limit: int) -> Iterator[str | None]:
    """A name for a library that opens files by name (OpenSSL) to read the regular file
    at ``path`` as checked here: ``/proc/self/fd/N`` of the fd this opened, so the file
    cannot be swapped for a FIFO between the check and the library's open (the path
    itself where /proc is not mounted).  None stays None."""
    if path is None:
        yield None
        return
    with opened_for_reading(path, limit) as fd:
        alias = f"/proc/self/fd/{fd}"
        yield alias if os.path.exists(alias) else os.fspath(path)


def read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them (see
    ``opened_for_reading``); a file that grew past the limit while read is refused."""
    with opened_for_reading(path, limit, empty_ok=True) as fd:
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    if size > limit:
        raise TooLarge(errno.EFBIG, _too_large(size, limit, grew=True), os.fspath(path))
    return b"".join(chunks)


def read_text_bounded(path: str | os.PathLike[str], limit: int) -> str:
    """``read_bounded`` decoded as UTF-8 (UnicodeDecodeError, a ValueError, if it is not)."""
    return read_bounded(path, limit).decode("utf-8")


def _too_large(size: int, limit: int, grew: bool = False) -> str:
    seen = f"over {_size(limit)}" if grew else _size(size)
    return f"it is {seen}, more than the {_size(limit)} such a file may be"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def replace_whole(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    mode: int = 0o644,
    fsync: bool = False,
) -> None:
    """Write ``data`` as a file whole: a temporary file made exclusively in the
    target's folder, which is then renamed over ``path``.  Only a regular file (or
    nothing) at ``path`` is replaced; anything else raises ``NotARegularFile`` and is left
    as it was.  A failure leaves no temporary file behind."""
    target = os.fspath(path)
    check_replaceable(target)
    folder = os.path.dirname(target) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        check_replaceable(target)  # again: a FIFO or a link may have been put there since
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def check_replaceable(path: str) -> None:
    """Raise ``NotARegularFile`` unless ``path`` is a regular file or nothing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    what = what_it_is(st)
    if what is not None:
        raise _refuse(path, what)


def open_stream(path: str | os.PathLike[str], *, replace: bool = False) -> int:
    """An fd to write a stream (a trace) into the regular file at ``path``: created, or
    with ``replace`` truncated, once this process holds its exclusive lock.  Raises
    ``FileExistsError`` (it exists and ``replace`` is not given), ``NotARegularFile`` (a
    link, FIFO, device...), ``Locked`` (another process is writing it) or the open's own
    OSError.  Nothing at ``path`` is changed before every check has passed."""
    name = os.fspath(path)
    flags = _STREAM_FLAGS if replace else _STREAM_FLAGS | os.O_EXCL
    try:
        fd = os.open(name, flags, 0o644)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # a link; a FIFO; a folder
            raise _refuse(name, what_is_at(name)) from None
        raise
    try:
        what = what_it_is(os.fstat(fd))
        if what is not None:
            raise _refuse(name, what)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Locked(
                errno.EAGAIN, "another process is writing it (another gpumon record?)", name
            ) from None
        os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def reason(exc: OSError) -> str:
    """An OSError's reason in words, without the path (the caller names it)."""
    return exc.strerror or str(exc)
