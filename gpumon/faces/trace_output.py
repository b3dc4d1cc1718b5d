"""Where a recording goes (``record -o``, ``watch --record``): never over an existing
file unless asked, gzip when named so.

A trace is often the only copy of a long run, so ``record -o run.jsonl`` refuses a file
that exists (``--force`` replaces it); appending is no answer, since a second header in
mid-file is not a trace.  ``.gz`` names get gzip: each tick is flushed as a gzip sync
point, so a crash still leaves every tick before it readable.
"""

from __future__ import annotations

import contextlib
import gzip
import io
from typing import IO, cast

from gpumon.errors import GpumonError, UsageError
from gpumon.files import Locked, NotARegularFile, open_stream
from gpumon.model import TraceHeader
from gpumon.traces.jsonl import TraceWriter


def open_output(path: str, *, force: bool = False) -> IO[str]:
    """The file to write a trace to: created (``force``: replaced), gzip for ``*.gz``;
    only a regular file, locked while written (``gpumon.files.open_stream``)."""
    try:
        fd = open_stream(path, replace=force)
    except FileExistsError:
        raise UsageError(
            f"{path} already exists; gpumon does not overwrite a trace: give --force to "
            "replace it, or another -o."
        ) from None
    except NotARegularFile as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}.") from None
    except Locked:
        raise UsageError(
            f"{path} is being written by another process (another gpumon record?); two "
            "recordings in one file would tear it: give another -o."
        ) from None
    except OSError as exc:
        raise GpumonError(f"cannot write {path}: {exc.strerror or exc}.") from None
    # The lock lives as long as the fd, which the stream owns and closes.
    raw = open(fd, "wb")  # noqa: SIM115 - owned by the stream returned
    if path.endswith(".gz"):
        return io.TextIOWrapper(cast(IO[bytes], _OwningGzip(raw)), encoding="utf-8")
    return io.TextIOWrapper(raw, encoding="utf-8")


class _OwningGzip(gzip.GzipFile):
    """A gzip stream that closes the file it writes into (a GzipFile given a file object
    leaves it open, and with it the lock)."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__(fileobj=raw, mode="wb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def trace_writer(path: str, header: TraceHeader, *, force: bool = False) -> TraceWriter:
    """A ``TraceWriter`` on ``open_output(path)``; its first line, the header, written."""
    stream = open_output(path, force=force)
    try:
        return TraceWriter(stream, header)
    except OSError as exc:
        with contextlib.suppress(OSError):
            stream.close()
        raise GpumonError(f"cannot write {path}: {exc.strerror or exc}.") from None
    except BaseException:
        with contextlib.suppress(OSError):
            stream.close()
        raise
