"""The live samplers of one tick together: NVML, the host and a process tree.

Only the engine's live source (``gpumon.engine.sources``) builds one; faces ask a session.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from gpumon.model import GpuSample, Snapshot

# A host this busy may be busy with someone else's work: look for whose (outside.py).
BUSY_HOST_PCT = 80.0

if TYPE_CHECKING:
    from gpumon.sample.host import HostSampler, ProcessTreeSampler
    from gpumon.sample.nvml import NvmlSampler
    from gpumon.sample.outside import OutsideScanner


class Monitor:
    """Samples GPUs, host and an optional process tree once per ``sample()``.

    With ``tree_gpus_only`` (``gpumon watch``), a GPU is shown only once a pid of the
    watched tree appears in its NVML process list, and stays shown afterwards: other
    users' GPUs are never reported as this run's.
    """

    def __init__(
        self,
        nvml: NvmlSampler | None,
        host: HostSampler | None = None,
        tree: ProcessTreeSampler | None = None,
        *,
        tree_gpus_only: bool = False,
        interval_s: float | None = None,
        command: tuple[str, ...] | None = None,
        outside: OutsideScanner | None = None,
    ) -> None:
        self.nvml = nvml
        self.host = host
        self.tree = tree
        self.outside = outside
        self.tree_gpus_only = tree_gpus_only and tree is not None
        self.interval_s = interval_s
        self.command = command
        self.started_wall_s = time.time()
        self.started_mono_s = time.monotonic()
        self.tree_gpu_uuids: set[str] = set()
        # GPU pids that exist in NVML's lists but not in our /proc: a sign of running in a
        # container without the host PID namespace (NVML reports host pids).
        self.invisible_gpu_pids: set[int] = set()

    def sample(self) -> Snapshot:
        """One tick of every sampler, on one clock."""
        gpus = () if self.nvml is None else self.nvml.sample()
        host = None if self.host is None else self.host.sample()
        tree = None if self.tree is None else self.tree.sample()
        if self.tree_gpus_only and tree is not None:
            gpus = self._tree_gpus(gpus, {p.pid for p in tree.processes})
        scanner = self.outside
        if scanner is not None and host is not None and tree is not None:
            busy = host.cpu_pct is not None and host.cpu_pct >= BUSY_HOST_PCT
            if busy and scanner.due():
                scanner.scan({p.pid for p in tree.processes})
            if busy and scanner.busiest:
                host = replace(host, busiest_outside=scanner.busiest)
        t_s = gpus[0].t_s if gpus else (host.t_s if host else time.monotonic())
        return Snapshot(t_s=t_s, gpus=gpus, host=host, tree=tree)

    def _tree_gpus(self, gpus: tuple[GpuSample, ...], tree_pids: set[int]) -> tuple[GpuSample, ...]:
        for g in gpus:
            for p in g.processes or ():
                if p.pid in tree_pids:
                    self.tree_gpu_uuids.add(g.uuid)
                elif len(self.invisible_gpu_pids) < 64 and not os.path.exists(f"/proc/{p.pid}"):
                    self.invisible_gpu_pids.add(p.pid)  # a handful is proof enough: bounded
        return tuple(g for g in gpus if g.uuid in self.tree_gpu_uuids)
