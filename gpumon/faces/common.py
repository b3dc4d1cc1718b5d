"""Pieces several faces share: argument types and building a Monitor from options."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpumon.errors import GpumonError
from gpumon.monitor import Monitor

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


def build_monitor(
    *,
    pid: int | None = None,
    interval_s: float | None = None,
    detector: object | None = None,
    tree_gpus_only: bool = False,
    command: tuple[str, ...] | None = None,
) -> Monitor:
    """NVML + host (+ the tree of ``pid``): the samplers every live face uses.

    The process tree is opened first so a wrong pid is reported before NVML starts.
    """
    from gpumon.sample.host import HostSampler, ProcessTreeSampler
    from gpumon.sample.nvml import NvmlSampler

    tree = None if pid is None else ProcessTreeSampler(pid)
    if command is None and tree is not None:
        command = tree.cmdline()
    return Monitor(
        NvmlSampler(),
        HostSampler(),
        tree,
        detector,  # type: ignore[arg-type]
        tree_gpus_only=tree_gpus_only,
        interval_s=interval_s,
        command=command,
    )


def write_tick(writer: TraceWriter, snapshot: Snapshot, path: str) -> None:
    """Append one tick to a trace; a failed write (full disk) becomes one clear sentence."""
    try:
        writer.write(snapshot)
    except OSError as exc:
        raise GpumonError(
            f"writing {path} failed ({exc.strerror or exc}); the ticks before this one are "
            "intact in the file."
        ) from None
