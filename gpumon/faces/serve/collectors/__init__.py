"""gpumon's metrics, one small collector per group, as client_python's process, platform
and gc collectors are: each builds its own families from the daemon's state and nothing
else, and ``gpumon.faces.serve.collector`` runs them, one ``try`` each, under the state's
lock, reporting each group's health (``gpumon_scrape_group_success{group}``).

A new series goes in the group whose readings it shows (docs/architecture.md, "Where a
change goes"); a new group is a module here, a class in ``GROUPS`` and a name in
``gpumon.faces.serve.config.COLLECTORS`` (its on/off switch).
"""

from __future__ import annotations

from gpumon.faces.serve.collectors.base import GroupCollector, Inputs
from gpumon.faces.serve.collectors.build import BuildCollector
from gpumon.faces.serve.collectors.detection import DetectionCollector
from gpumon.faces.serve.collectors.gpus import GpusCollector
from gpumon.faces.serve.collectors.hardware import HardwareCollector
from gpumon.faces.serve.collectors.health import HealthCollector
from gpumon.faces.serve.collectors.host import HostCollector
from gpumon.faces.serve.collectors.jobs import JobsCollector

# Every group, in the order a scrape lists them.
GROUPS: tuple[type[GroupCollector], ...] = (
    BuildCollector,
    GpusCollector,
    HardwareCollector,
    DetectionCollector,
    JobsCollector,
    HostCollector,
    HealthCollector,
)

__all__ = ["GROUPS", "GroupCollector", "Inputs"]
