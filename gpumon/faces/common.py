"""Pieces several faces share: argument types and writing a tick to a trace."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpumon.errors import GpumonError

if TYPE_CHECKING:
    from gpumon.model import Snapshot
    from gpumon.traces.jsonl import TraceWriter


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0: {text!r}")
    return value


def write_tick(writer: TraceWriter, snapshot: Snapshot, path: str) -> None:
    """Append one tick to a trace; a failed write (full disk) becomes one clear sentence."""
    try:
        writer.write(snapshot)
    except OSError as exc:
        raise GpumonError(
            f"writing {path} failed ({exc.strerror or exc}); the ticks before this one are "
            "intact in the file."
        ) from None
