"""The Prometheus collector: one consistent snapshot of ``ServeState`` per scrape.

It runs the group collectors (``gpumon.faces.serve.collectors``: build, gpus, hardware,
detection, jobs, host, health) under the state's lock, so every group of a scrape sees
one tick.  It never raises: each group is built in its own ``try``; a failing group is
left out of that scrape and counted in ``gpumon_scrape_errors_total``, the others are
still served, and each group's health is in ``gpumon_scrape_group_success{group}`` and
``gpumon_scrape_group_duration_seconds{group}`` (node_exporter's
``node_scrape_collector_*``).

Names follow Prometheus' rules: ``gpumon_`` prefix, base units as suffixes (``_ratio``
0-1, ``_bytes``, ``_watts``, ``_seconds``), counters ``_total``, metadata in ``_info``,
labels ``gpu`` (NVML index) and ``uuid``; job labels use dcgm-exporter's names
(``hpc_job``, ``pod``, ``namespace``, ``container``) so the two join, and every job, on
any node, has ``job_kind``, ``job_name``, ``user`` and ``command`` (docs/serve.md, "How
jobs are found").  There is no pid label: pids churn series (a process tree's job is
named by its top pid, one series per job, as a Slurm job is by its id).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from gpumon.faces.serve.collectors import GROUPS, GroupCollector, Inputs
from gpumon.faces.serve.config import COLLECTORS
from gpumon.faces.serve.daemon import ServeState
from gpumon.faces.serve.http import ConnectionStats

if tuple(g.group for g in GROUPS) != COLLECTORS:  # the switches name every group
    raise ImportError("collectors.GROUPS and config.COLLECTORS differ: update both")

# The scrape's own series, beside the groups'.
SCRAPE_NAMES = (
    "gpumon_scrape_errors_total",
    "gpumon_scrape_duration_seconds",
    "gpumon_scrape_group_success",
    "gpumon_scrape_group_duration_seconds",
)
# The daemon's own cost (client_python's ProcessCollector, in the same registry).
PROCESS_NAMES = (
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_start_time_seconds",
    "process_open_fds",
    "process_max_fds",
)
# Every metric family name gpumon's registry can emit (the dashboard and rules tests
# check their queries against this list).
METRIC_NAMES = (*(n for g in GROUPS for n in g.names), *SCRAPE_NAMES, *PROCESS_NAMES)


class GpumonCollector(Collector):
    """Reads ``ServeState`` under its lock; yields every family of one tick."""

    def __init__(
        self, state: ServeState, http: ConnectionStats | None = None, hostname: str | None = None
    ) -> None:
        self.state = state
        inputs = Inputs(state, http, hostname if hostname is not None else node_name())
        # Only the groups switched on are made: one switched off costs a scrape nothing.
        self.groups: tuple[GroupCollector, ...] = tuple(
            group(inputs) for group in GROUPS if group.group in state.cfg.collectors
        )
        self._last_scrape_s: float | None = None

    def describe(self) -> Iterator[Metric]:
        # Registering must not run a scrape (client_python calls collect() when a collector
        # has no describe()); this registry holds only this collector, so no clash check
        # is needed.
        return iter(())

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        out: list[Metric] = []
        st = self.state
        failed = 0
        success = GaugeMetricFamily(
            "gpumon_scrape_group_success",
            "1 when this scrape built the group's metrics, 0 when it had to leave them out "
            "(as node_exporter's node_scrape_collector_success).",
            labels=["group"],
        )
        cost = GaugeMetricFamily(
            "gpumon_scrape_group_duration_seconds",
            "Time this scrape took to build the group's metrics.",
            labels=["group"],
        )
        with st.lock:
            for group in self.groups:
                began = time.perf_counter()
                try:
                    out.extend(group.collect())
                    ok = 1.0
                except Exception:  # never fail the scrape; count it, say which group
                    failed += 1
                    ok = 0.0
                success.add_metric([group.group], ok)
                cost.add_metric([group.group], time.perf_counter() - began)
            st.scrape_errors_total += failed
            errors = st.scrape_errors_total
        yield from out
        yield success
        yield cost
        yield CounterMetricFamily(
            "gpumon_scrape_errors",
            "Scrapes in which a group of gpumon's metrics could not be built (left out).",
            value=errors,
        )
        last = self._last_scrape_s
        if last is not None:
            yield GaugeMetricFamily(
                "gpumon_scrape_duration_seconds",
                "Time the previous scrape took to build gpumon's metrics.",
                value=last,
            )
        self._last_scrape_s = time.perf_counter() - started


def node_name() -> str:
    """The node's name for the ``hostname`` label (dcgm-exporter's ``Hostname``): NODE_NAME
    where set (a Kubernetes pod's hostname is the pod's; the DaemonSet passes the node's),
    else the host name."""
    name = os.environ.get("NODE_NAME") or socket.gethostname()
    # The environment's bytes that are not UTF-8 (held as surrogates) cannot be written in
    # an exposition: shown as \xNN escapes instead of failing every scrape.
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def make_registry(state: ServeState, http: ConnectionStats | None = None) -> CollectorRegistry:
    """gpumon's own registry (no import-time globals): gpumon's metrics and the daemon's
    own ``process_*`` (CPU, memory, open files), so its cost is watched from Prometheus."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(GpumonCollector(state, http))
    ProcessCollector(registry=registry)
    return registry
