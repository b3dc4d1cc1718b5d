"""The ``host`` group: the machine's CPU and iowait over the last tick."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily, Metric

from gpumon.faces.serve.collectors.base import GroupCollector


class HostCollector(GroupCollector):
    """Whether the host's CPUs are busy or waiting on I/O (a starved GPU's usual why)."""

    group = "host"
    names = ("gpumon_host_cpu_ratio", "gpumon_host_iowait_ratio")

    def collect(self) -> list[Metric]:
        h = self.state.host
        cpu = GaugeMetricFamily(
            "gpumon_host_cpu_ratio", "Share of all cores' time spent busy over the last tick."
        )
        io = GaugeMetricFamily(
            "gpumon_host_iowait_ratio",
            "Share of all cores' time spent in iowait over the last tick.",
        )
        if h is not None:
            if h.cpu_pct is not None:
                cpu.add_metric([], h.cpu_pct / 100.0)
            if h.iowait_pct is not None:
                io.add_metric([], h.iowait_pct / 100.0)
        return [cpu, io]
