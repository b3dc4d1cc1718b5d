"""The ``health`` group: the daemon's own health: ticks, errors, its log and its server."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpumon.faces.serve.collectors.base import GroupCollector, Inputs, add
from gpumon.faces.serve.http import CONNECTION_ERROR_KINDS
from gpumon.faces.serve.log import REOPEN_REASONS


class HealthCollector(GroupCollector):
    """Whether gpumon keeps sampling, what failed (NVML, ticks, the log, HTTP clients)."""

    group = "health"
    names = (
        "gpumon_last_sample_timestamp_seconds",
        "gpumon_sample_duration_seconds",
        "gpumon_sample_interval_seconds",
        "gpumon_samples_total",
        "gpumon_sample_errors_total",
        "gpumon_nvml_errors_total",
        "gpumon_log_write_errors_total",
        "gpumon_log_reopens_total",
        "gpumon_http_connection_errors_total",
    )

    def __init__(self, inputs: Inputs) -> None:
        super().__init__(inputs)
        # Every known kind at 0 from the first scrape: a panel shows 0, not "No data".
        self._nvml_kinds = inputs.state.session.known_error_kinds

    def collect(self) -> list[Metric]:
        st = self.state
        out: list[Metric] = []
        last = GaugeMetricFamily(
            "gpumon_last_sample_timestamp_seconds", "Unix time of the last completed sample."
        )
        add(last, [], st.last_sample_wall_s)
        dur = GaugeMetricFamily(
            "gpumon_sample_duration_seconds", "Time the last tick took to read NVML and the host."
        )
        add(dur, [], st.last_sample_duration_s)
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
        stats = self.inputs.http
        counts = stats.snapshot() if stats is not None else {}
        for kind in CONNECTION_ERROR_KINDS:
            http.add_metric([kind], counts.get(kind, 0))
        out.append(http)
        return out
