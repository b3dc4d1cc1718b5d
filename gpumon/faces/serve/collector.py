"""The Prometheus collector: one consistent snapshot of ``ServeState`` per scrape.

Built on fresh ``*MetricFamily`` objects per scrape (client_python's custom-collector
pattern) on gpumon's own ``CollectorRegistry``.  It never raises: each group of metrics is
built in its own ``try``; a failing group is left out of that scrape and counted in
``gpumon_scrape_errors_total``, the others are still served.  A reading NVML did not give
(``None``) is an absent series, never a 0: "unsupported" must not read as "idle".

Names follow Prometheus' rules: ``gpumon_`` prefix, base units as suffixes (``_ratio``
0-1, ``_bytes``, ``_watts``, ``_seconds``), counters ``_total``, metadata in ``_info``,
labels ``gpu`` (NVML index) and ``uuid``; job labels use dcgm-exporter's names
(``hpc_job``, ``pod``, ``namespace``, ``container``) so the two join, and every job, on
any node, has ``job_kind``, ``job_name``, ``user`` and ``command`` (docs/serve.md, "How
jobs are found").  There is no pid label: pids churn series (a process tree's job is
named by its top pid, one series per job, as a Slurm job is by its id).  The hardware
series people alert on (temperatures, clocks and why they are held down, ECC, XID, PCIe
replays, NVLink, energy) are gpumon's own names; deploy/prometheus/gpumon-dcgm-rules.yml
records them under dcgm-exporter's.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from gpumon.faces.serve.buildinfo import build_labels
from gpumon.faces.serve.daemon import ServeState
from gpumon.faces.serve.http import CONNECTION_ERROR_KINDS, ConnectionStats
from gpumon.faces.serve.log import REOPEN_REASONS
from gpumon.model import Cause, Episode, GpuSample, Reason, State

GPU = ["gpu", "uuid"]
# A job's labels (JobLabels.as_dict()); a job's own series leave out the GPU's container.
JOB = ["hpc_job", "pod", "namespace", "container", "job_kind", "job_name", "user", "command"]
JOB_OWN = [name for name in JOB if name != "container"]
STATES = tuple(str(s) for s in State)
CAUSES = tuple(str(c) for c in Cause)
# Reasons as label values: the enum's names, since its values are phrases for people.
REASON_LABELS = {r: r.name.lower() for r in Reason}
# The clocks-event (throttle) reasons: nvml.h's nvmlClocksEventReason* bits, by label.
CLOCK_EVENT_REASONS = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


# The per-GPU hardware series of one reading each: (family, help, a counter?, the reading
# in base units).
HARDWARE_SERIES: tuple[tuple[str, str, bool, Callable[[GpuSample], float | None]], ...] = (
    (
        "gpumon_gpu_temperature_celsius",
        "GPU core temperature (temperature.gpu).",
        False,
        lambda s: s.temperature_c,
    ),
    (
        "gpumon_gpu_memory_temperature_celsius",
        "Memory (HBM) temperature (temperature.memory).",
        False,
        lambda s: s.memory_temperature_c,
    ),
    (
        "gpumon_gpu_sm_clock_hertz",
        "SM clock (clocks.sm).",
        False,
        lambda s: _scaled(s.sm_clock_mhz, 1e6),
    ),
    (
        "gpumon_gpu_memory_clock_hertz",
        "Memory clock (clocks.mem).",
        False,
        lambda s: _scaled(s.mem_clock_mhz, 1e6),
    ),
    (
        "gpumon_gpu_fan_speed_ratio",
        "Fan speed against its maximum (fan.speed); absent on passively cooled GPUs.",
        False,
        lambda s: _scaled(s.fan_speed_pct, 0.01),
    ),
    (
        "gpumon_gpu_performance_state",
        "Performance state: 0 (P0, the fastest) to 15 (pstate).",
        False,
        lambda s: s.pstate,
    ),
    (
        "gpumon_gpu_memory_utilization_ratio",
        "Share of the driver's last sample period in which memory was read or written "
        "(utilization.memory).",
        False,
        lambda s: _scaled(s.mem_util_pct, 0.01),
    ),
    (
        "gpumon_gpu_energy_joules",
        "Energy the GPU used since the driver loaded (total energy consumption).",
        True,
        lambda s: s.energy_joules,
    ),
    (
        "gpumon_gpu_pcie_replays",
        "PCIe transfers replayed after a link error, since the driver loaded.",
        True,
        lambda s: s.pcie_replays,
    ),
    (
        "gpumon_gpu_nvlink_transmit_bytes",
        "Data sent over NVLink, all links, since the driver loaded.",
        True,
        lambda s: s.nvlink_tx_bytes,
    ),
    (
        "gpumon_gpu_nvlink_receive_bytes",
        "Data received over NVLink, all links, since the driver loaded.",
        True,
        lambda s: s.nvlink_rx_bytes,
    ),
)
# XID codes people page on (NVIDIA's XID catalogue: 48 double-bit ECC, 63/64 row
# remapping, 74 NVLink, 79 fallen off the bus, 94/95 contained/uncontained ECC): exported
# at 0 from the start, so the first one is an increase Prometheus can see.
PAGED_XIDS = ("48", "63", "64", "74", "79", "94", "95")

# Every metric family name this collector can emit (the dashboard and rules tests check
# their queries against this list).
METRIC_NAMES = (
    "gpumon_build_info",
    "gpumon_gpu_info",
    "gpumon_gpu_lost",
    "gpumon_gpu_utilization_ratio",
    "gpumon_gpu_memory_used_bytes",
    "gpumon_gpu_memory_total_bytes",
    "gpumon_gpu_power_watts",
    "gpumon_gpu_power_limit_watts",
    "gpumon_gpu_processes",
    "gpumon_gpu_sm_active_ratio",
    "gpumon_gpu_sm_occupancy_ratio",
    "gpumon_gpu_tensor_active_ratio",
    "gpumon_gpu_state",
    "gpumon_gpu_cause",
    "gpumon_gpu_reason",
    "gpumon_gpu_straggler",
    "gpumon_gpu_state_seconds_total",
    "gpumon_gpu_idle_gap_seconds",
    "gpumon_gpu_busy_burst_seconds",
    "gpumon_gpu_job_info",
    "gpumon_gpu_temperature_celsius",
    "gpumon_gpu_memory_temperature_celsius",
    "gpumon_gpu_sm_clock_hertz",
    "gpumon_gpu_memory_clock_hertz",
    "gpumon_gpu_clock_event_reason",
    "gpumon_gpu_fan_speed_ratio",
    "gpumon_gpu_performance_state",
    "gpumon_gpu_memory_utilization_ratio",
    "gpumon_gpu_energy_joules_total",
    "gpumon_gpu_ecc_errors_total",
    "gpumon_gpu_ecc_aggregate_errors_total",
    "gpumon_gpu_pcie_replays_total",
    "gpumon_gpu_nvlink_transmit_bytes_total",
    "gpumon_gpu_nvlink_receive_bytes_total",
    "gpumon_gpu_xid_errors_total",
    "gpumon_gpu_last_xid",
    "gpumon_node_state",
    "gpumon_node_state_seconds_total",
    "gpumon_lost_gpu_seconds_total",
    "gpumon_job_state",
    "gpumon_job_reason",
    "gpumon_job_gpus",
    "gpumon_jobs_untracked_total",
    "gpumon_host_cpu_ratio",
    "gpumon_host_iowait_ratio",
    "gpumon_last_sample_timestamp_seconds",
    "gpumon_sample_duration_seconds",
    "gpumon_sample_interval_seconds",
    "gpumon_samples_total",
    "gpumon_sample_errors_total",
    "gpumon_nvml_errors_total",
    "gpumon_log_write_errors_total",
    "gpumon_log_reopens_total",
    "gpumon_http_connection_errors_total",
    "gpumon_scrape_errors_total",
    "gpumon_scrape_duration_seconds",
    "gpumon_scrape_group_success",
    "gpumon_scrape_group_duration_seconds",
    # The daemon's own cost (client_python's ProcessCollector, in the same registry).
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_start_time_seconds",
    "process_open_fds",
    "process_max_fds",
)


class GpumonCollector(Collector):
    """Reads ``ServeState`` under its lock; yields every family of one tick."""

    def __init__(
        self, state: ServeState, http: ConnectionStats | None = None, hostname: str | None = None
    ) -> None:
        self.state = state
        self.http = http
        self._hostname = hostname if hostname is not None else node_name()
        self._last_scrape_s: float | None = None
        session = state.session
        self._build_labels = build_labels(state.version, session.nvml_version, state.driver_version)
        # Every known kind at 0 from the first scrape: a panel shows 0, not "No data".
        self._nvml_kinds = session.known_error_kinds

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
            for group, part in self.groups():
                began = time.perf_counter()
                try:
                    out.extend(part())
                    ok = 1.0
                except Exception:  # never fail the scrape; count it, say which group
                    failed += 1
                    ok = 0.0
                success.add_metric([group], ok)
                cost.add_metric([group], time.perf_counter() - began)
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

    # --- groups ----------------------------------------------------------------------------

    def groups(self) -> tuple[tuple[str, Callable[[], list[Metric]]], ...]:
        """Each group of metrics, built on its own: one failing leaves the others served."""
        return (
            ("build", self._build),
            ("gpus", self._gpus),
            ("hardware", self._hardware),
            ("detection", self._detection),
            ("jobs", self._jobs),
            ("host", self._host),
            ("health", self._health),
        )

    def _build(self) -> list[Metric]:
        info = InfoMetricFamily(
            "gpumon_build",
            "gpumon's version and commit, the Python it runs on, the NVML library and driver.",
            value=self._build_labels,
        )
        return [info]

    def _gpus(self) -> list[Metric]:
        st = self.state
        info = InfoMetricFamily("gpumon_gpu", "Each GPU as discovered at start-up.", labels=GPU)
        lost = GaugeMetricFamily(
            "gpumon_gpu_lost", "1 when NVML reports the GPU fell off the bus.", labels=GPU
        )
        util = GaugeMetricFamily(
            "gpumon_gpu_utilization_ratio",
            "Share of the driver's last sample period in which a kernel ran (utilization.gpu).",
            labels=GPU,
        )
        used = GaugeMetricFamily(
            "gpumon_gpu_memory_used_bytes", "GPU memory used (memory.used).", labels=GPU
        )
        total = GaugeMetricFamily(
            "gpumon_gpu_memory_total_bytes", "GPU memory installed (memory.total).", labels=GPU
        )
        power = GaugeMetricFamily("gpumon_gpu_power_watts", "Power draw (power.draw).", labels=GPU)
        limit = GaugeMetricFamily(
            "gpumon_gpu_power_limit_watts",
            "Enforced power limit (enforced.power.limit).",
            labels=GPU,
        )
        procs = GaugeMetricFamily(
            "gpumon_gpu_processes", "Processes holding a compute context on the GPU.", labels=GPU
        )
        sm_active = GaugeMetricFamily(
            "gpumon_gpu_sm_active_ratio",
            "Share of SMs with a warp resident over the last tick (GPM, Hopper and later; "
            "DCGM_FI_PROF_SM_ACTIVE): low while utilisation reads 100 % is a GPU waiting.",
            labels=GPU,
        )
        sm_occupancy = GaugeMetricFamily(
            "gpumon_gpu_sm_occupancy_ratio",
            "Resident warps over the SMs' maximum, over the last tick (GPM).",
            labels=GPU,
        )
        tensor = GaugeMetricFamily(
            "gpumon_gpu_tensor_active_ratio",
            "Share of cycles the tensor cores were busy, over the last tick (GPM).",
            labels=GPU,
        )
        jobinfo = InfoMetricFamily(
            "gpumon_gpu_job",
            "The jobs using each GPU (Slurm job id; Kubernetes pod, namespace, container; "
            "every job's kind, name, user and command).",
            labels=[*GPU, *JOB],
        )
        for idx in sorted(st.gpus):
            rt = st.gpus[idx]
            ident = rt.identity
            lv = [str(idx), ident.uuid]
            info.add_metric(
                lv,
                {
                    "name": ident.name or "",
                    "driver": st.driver_version or "",
                    "pci_bus_id": ident.pci_bus_id or "",
                    "hostname": self._hostname,
                },
            )
            s = rt.latest
            lost.add_metric(lv, 1.0 if s is not None and s.lost else 0.0)
            for lb in st.jobs_of(idx):
                jobinfo.add_metric([*lv, *lb.as_dict().values()], {})
            if s is None or s.lost:
                continue
            _add(util, lv, None if s.util_pct is None else s.util_pct / 100.0)
            _add(used, lv, s.mem_used_bytes)
            _add(
                total,
                lv,
                s.mem_total_bytes if s.mem_total_bytes is not None else ident.mem_total_bytes,
            )
            _add(power, lv, s.power_watts)
            _add(
                limit,
                lv,
                s.power_limit_watts if s.power_limit_watts is not None else ident.power_limit_watts,
            )
            _add(procs, lv, None if s.processes is None else len({p.pid for p in s.processes}))
            _add(sm_active, lv, s.sm_active_ratio)
            _add(sm_occupancy, lv, s.sm_occupancy_ratio)
            _add(tensor, lv, s.tensor_active_ratio)
        return [
            *(info, lost, util, used, total, power, limit, procs),
            *(sm_active, sm_occupancy, tensor, jobinfo),
        ]

    def _hardware(self) -> list[Metric]:
        """What dcgm-exporter exports beside gpumon: temperatures, clocks and why they are
        held down, fan, P-state, energy, ECC, PCIe replays, NVLink traffic, XID errors."""
        st = self.state
        plain = [
            (CounterMetricFamily if counter else GaugeMetricFamily)(name, text, labels=GPU)
            for name, text, counter, _ in HARDWARE_SERIES
        ]
        reasons = GaugeMetricFamily(
            "gpumon_gpu_clock_event_reason",
            "Why the clocks are held down (clocks_event_reasons, once throttle reasons): 1 "
            "for each active reason, 0 for the others.",
            labels=[*GPU, "reason"],
        )
        ecc = CounterMetricFamily(
            "gpumon_gpu_ecc_errors",
            "ECC errors since the driver loaded (volatile), by type: corrected (single-bit) "
            "or uncorrected (double-bit).",
            labels=[*GPU, "type"],
        )
        ecc_life = CounterMetricFamily(
            "gpumon_gpu_ecc_aggregate_errors",
            "ECC errors over the GPU's life (aggregate, kept in its infoROM), by type.",
            labels=[*GPU, "type"],
        )
        xid = CounterMetricFamily(
            "gpumon_gpu_xid_errors",
            "XID critical errors (NVML events) since gpumon started, by code; beyond "
            "32 codes per GPU as 'other'.",
            labels=[*GPU, "xid"],
        )
        last_xid = GaugeMetricFamily(
            "gpumon_gpu_last_xid",
            "Code of the GPU's last XID error since gpumon started; 0 before any.",
            labels=GPU,
        )
        for idx in sorted(st.gpus):
            rt = st.gpus[idx]
            lv = [str(idx), rt.identity.uuid]
            counts = rt.xid_counts
            if counts is not None:  # kept while the GPU is lost: XID 79 is how it goes
                for code in sorted({*PAGED_XIDS, *counts}, key=_xid_order):
                    xid.add_metric([*lv, code], counts.get(code, 0))
                last_xid.add_metric(lv, float(rt.last_xid or 0))
            s = rt.latest
            if s is None or s.lost:
                continue
            for family, (_, _, _, reading) in zip(plain, HARDWARE_SERIES, strict=True):
                _add(family, lv, reading(s))
            bits = s.clock_event_reasons
            if bits is not None:
                for name, bit in CLOCK_EVENT_REASONS:
                    reasons.add_metric([*lv, name], 1.0 if bits & bit else 0.0)
            _add_typed(ecc, lv, s.ecc_corrected_errors, s.ecc_uncorrected_errors)
            _add_typed(
                ecc_life, lv, s.ecc_corrected_errors_aggregate, s.ecc_uncorrected_errors_aggregate
            )
        return [*plain, reasons, ecc, ecc_life, xid, last_xid]

    def _detection(self) -> list[Metric]:
        st = self.state
        seconds = st.memory.reported  # tick by tick: never decreases (counters)
        open_episodes = st.memory.open
        state = GaugeMetricFamily(
            "gpumon_gpu_state",
            "The detector's current state of the GPU: 1 for the current state, 0 otherwise.",
            labels=[*GPU, "state"],
        )
        cause = GaugeMetricFamily(
            "gpumon_gpu_cause",
            "Why a starved GPU waits (cpu, gil, io, contention, unknown): 1 for the current cause; "
            "absent unless starved.",
            labels=[*GPU, "cause"],
        )
        reason = GaugeMetricFamily(
            "gpumon_gpu_reason",
            "Why the GPU has its state, where the state alone does not say (start_up, "
            "no_process, memory_held, busy_wait, straggler, ...): 1 for the current reason; "
            "absent when there is none.",
            labels=[*GPU, "reason"],
        )
        strag = GaugeMetricFamily(
            "gpumon_gpu_straggler",
            "1 when the other GPUs of the node wait on this one (the straggler).",
            labels=GPU,
        )
        secs = CounterMetricFamily(
            "gpumon_gpu_state_seconds",
            "Seconds the GPU spent in each state since gpumon started.",
            labels=[*GPU, "state"],
        )
        gaps = HistogramMetricFamily(
            "gpumon_gpu_idle_gap_seconds",
            "Lengths of the GPU's idle gaps between bursts, from the driver's sample buffer.",
            labels=GPU,
        )
        bursts = HistogramMetricFamily(
            "gpumon_gpu_busy_burst_seconds",
            "Lengths of the GPU's busy bursts, from the driver's sample buffer.",
            labels=GPU,
        )
        for idx in sorted(st.gpus):
            rt = st.gpus[idx]
            lv = [str(idx), rt.identity.uuid]
            ep = open_episodes.get(idx)
            cur = str(ep.state) if ep is not None else str(State.UNKNOWN)
            for s in STATES:
                state.add_metric([*lv, s], 1.0 if s == cur else 0.0)
            if ep is not None and ep.state is State.STARVED:
                c = str(ep.cause or Cause.UNKNOWN)
                for name in CAUSES:
                    cause.add_metric([*lv, name], 1.0 if name == c else 0.0)
            if ep is not None and ep.reason is not None:
                reason.add_metric([*lv, REASON_LABELS[ep.reason]], 1.0)
            strag.add_metric(lv, 1.0 if ep is not None and is_straggler(ep) else 0.0)
            per = seconds.get(idx, {})
            for s in State:
                secs.add_metric([*lv, str(s)], per.get(s, 0.0))
            gaps.add_metric(lv, rt.gaps.cumulative(), rt.gaps.total)
            bursts.add_metric(lv, rt.bursts.cumulative(), rt.bursts.total)
        node = GaugeMetricFamily(
            "gpumon_node_state",
            "The node's overall state over all its GPUs: 1 for the current state.",
            labels=["state"],
        )
        node_ep = open_episodes.get(None)
        node_state = str(node_ep.state) if node_ep is not None else str(State.UNKNOWN)
        for s in STATES:
            node.add_metric([s], 1.0 if s == node_state else 0.0)
        node_secs = CounterMetricFamily(
            "gpumon_node_state_seconds",
            "Seconds the node (all GPUs together) spent in each state.",
            labels=["state"],
        )
        per = seconds.get(None, {})
        for s in State:
            node_secs.add_metric([str(s)], per.get(s, 0.0))
        lost = CounterMetricFamily(
            "gpumon_lost_gpu_seconds",
            "GPU-seconds spent idle or busy-waiting while a process held the GPU.",
            value=st.session.lost_gpu_seconds(),
        )
        return [state, cause, reason, strag, secs, gaps, bursts, node, node_secs, lost]

    def _jobs(self) -> list[Metric]:
        st = self.state
        state = GaugeMetricFamily(
            "gpumon_job_state",
            "Each job's state over its GPUs on this node: 1 for the current state.",
            labels=[*JOB_OWN, "state"],
        )
        reason = GaugeMetricFamily(
            "gpumon_job_reason",
            "Why the job has its state, where the state alone does not say (hang: every "
            "GPU of the job on this node spins and none computes; straggler, ...): 1 for "
            "the current reason; absent when there is none.",
            labels=[*JOB_OWN, "reason"],
        )
        gpus = GaugeMetricFamily(
            "gpumon_job_gpus", "GPUs of this node the job uses.", labels=JOB_OWN
        )
        for job in st.jobs.values():
            lb = job.labels
            lv = [v for k, v in lb.as_dict().items() if k != "container"]
            ep = st.job_episode(job)
            cur = State.UNKNOWN if ep is None else ep.state
            for s in STATES:
                state.add_metric([*lv, s], 1.0 if s == str(cur) else 0.0)
            if ep is not None and ep.reason is not None:
                reason.add_metric([*lv, REASON_LABELS[ep.reason]], 1.0)
            gpus.add_metric(lv, float(len(job.gpus)))
        dropped = CounterMetricFamily(
            "gpumon_jobs_untracked",
            "Jobs not given a state because max_jobs were already tracked.",
            value=st.jobs_dropped_total,
        )
        return [state, reason, gpus, dropped]

    def _host(self) -> list[Metric]:
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

    def _health(self) -> list[Metric]:
        st = self.state
        out: list[Metric] = []
        last = GaugeMetricFamily(
            "gpumon_last_sample_timestamp_seconds", "Unix time of the last completed sample."
        )
        _add(last, [], st.last_sample_wall_s)
        dur = GaugeMetricFamily(
            "gpumon_sample_duration_seconds", "Time the last tick took to read NVML and the host."
        )
        _add(dur, [], st.last_sample_duration_s)
        out += [last, dur]
        out.append(
            GaugeMetricFamily(
                "gpumon_sample_interval_seconds",
                "Configured time between ticks.",
                value=st.cfg.interval_s,
            )
        )
        out.append(CounterMetricFamily("gpumon_samples", "Ticks completed.", value=st.ticks_total))
        out.append(
            CounterMetricFamily(
                "gpumon_sample_errors",
                "Ticks skipped because sampling or processing failed.",
                value=st.tick_errors_total,
            )
        )
        nvml = CounterMetricFamily(
            "gpumon_nvml_errors", "NVML calls that failed, by error kind.", labels=["kind"]
        )
        for kind in sorted({*self._nvml_kinds, *st.nvml_errors}):
            nvml.add_metric([kind], st.nvml_errors.get(kind, 0))
        out.append(nvml)
        out.append(
            CounterMetricFamily(
                "gpumon_log_write_errors",
                "Log lines lost: not written, or cut short and truncated away (full disk, "
                "unwritable file).",
                value=st.log.errors_total,
            )
        )
        reopens = CounterMetricFamily(
            "gpumon_log_reopens",
            "Times the log was reopened: signal (SIGHUP, logrotate), removed or replaced "
            "(found gone or another file at its path).",
            labels=["reason"],
        )
        for reason in REOPEN_REASONS:
            reopens.add_metric([reason], st.log.reopens.get(reason, 0))
        out.append(reopens)
        http = CounterMetricFamily(
            "gpumon_http_connection_errors",
            "HTTP connections that failed: timeout (a silent client), reset, tls (a failed "
            "handshake), overload (no worker free), other.",
            labels=["kind"],
        )
        counts = self.http.snapshot() if self.http is not None else {}
        for kind in CONNECTION_ERROR_KINDS:
            http.add_metric([kind], counts.get(kind, 0))
        out.append(http)
        return out


def is_straggler(ep: Episode) -> bool:
    """The detector marks the GPU its peers wait on with the straggler reason."""
    return ep.state is State.SYNC_STALL and ep.reason is Reason.STRAGGLER


def _add(
    family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | int | None
) -> None:
    if value is not None:
        family.add_metric(labels, float(value))


def _add_typed(
    family: CounterMetricFamily, labels: list[str], corrected: int | None, uncorrected: int | None
) -> None:
    """ECC counts under ``type``: each absent where it was not read."""
    for kind, value in (("corrected", corrected), ("uncorrected", uncorrected)):
        if value is not None:
            family.add_metric([*labels, kind], float(value))


def _xid_order(code: str) -> tuple[int, str]:
    return (int(code), "") if code.isdigit() else (1 << 30, code)


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
