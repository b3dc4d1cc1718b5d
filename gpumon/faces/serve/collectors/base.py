"""What every group collector shares: what it reads, its shape, its labels and helpers.

A group builds fresh ``*MetricFamily`` objects per scrape (client_python's custom-collector
pattern).  A reading NVML did not give (``None``) is an absent series, never a 0:
"unsupported" must not read as "idle".  ``collect`` runs under the state's lock (the
scrape collector holds it), so every group of one scrape sees the same tick.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpumon.faces.serve.daemon import ServeState
from gpumon.faces.serve.http import ConnectionStats

GPU = ["gpu", "uuid"]
# A job's labels (JobLabels.as_dict()); a job's own series leave out the GPU's container.
JOB = ["hpc_job", "pod", "namespace", "container", "job_kind", "job_name", "user", "command"]
JOB_OWN = [name for name in JOB if name != "container"]


@dataclass(frozen=True, slots=True)
class Inputs:
    """What the groups read: the daemon's state, its HTTP server's counts, the node's name."""

    state: ServeState
    http: ConnectionStats | None
    hostname: str


class GroupCollector(Collector, ABC):
    """One group of gpumon's metrics: ``group`` names it (in ``gpumon_scrape_group_*`` and
    its ``--collector.<group>`` switch), ``names`` lists the families it can emit."""

    group: ClassVar[str]
    names: ClassVar[tuple[str, ...]]

    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs
        self.state = inputs.state

    @abstractmethod
    def collect(self) -> list[Metric]:
        """The group's families for one scrape (the caller holds ``state.lock``)."""


def add(
    family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | int | None
) -> None:
    """One series, or none where there is no reading."""
    if value is not None:
        family.add_metric(labels, float(value))


def add_typed(
    family: CounterMetricFamily, labels: list[str], corrected: int | None, uncorrected: int | None
) -> None:
    """Counts under ``type``: each absent where it was not read."""
    for kind, value in (("corrected", corrected), ("uncorrected", uncorrected)):
        if value is not None:
            family.add_metric([*labels, kind], float(value))
