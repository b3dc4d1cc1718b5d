"""Where a recording goes: never over an existing file unless asked, gzip when named so.

A trace is often the only copy of a long run, so ``record -o run.jsonl`` refuses a file
that exists (``--force`` replaces it); appending is no answer, since a second header in
mid-file is not a trace.  ``.gz`` names get gzip: each tick is flushed as a gzip sync
point, so a crash still leaves every tick before it readable.
"""

from __future__ import annotations

import contextlib
import gzip
from typing import IO, cast

from gpumon.errors import GpumonError, UsageError
from gpumon.model import TraceHeader
from gpumon.traces.jsonl import TraceWriter


def open_output(path: str, *, force: bool = False) -> IO[str]:
    """The file to write a trace to: created (``force``: replaced), gzip for ``*.gz``."""
    mode = "wt" if force else "xt"
    try:
        if path.endswith(".gz"):
            return cast(IO[str], gzip.open(path, mode, encoding="utf-8"))
        return open(path, mode, encoding="utf-8")
    except FileExistsError:
        raise UsageError(
            f"{path} already exists; gpumon does not overwrite a trace: give --force to "
            "replace it, or another -o."
        ) from None
    except OSError as exc:
        raise GpumonError(f"cannot write {path}: {exc.strerror or exc}.") from None


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
