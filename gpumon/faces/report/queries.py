"""What `gpumon report` asks Prometheus, and the readings it makes of the answers.

Three steps, each touching only the job's series:

1. **Where and when**: a range query of ``gpumon_gpu_job_info`` for the job (an index
   lookup on ``hpc_job``, or ``namespace`` and ``pod``) gives its nodes and its span;
   run again at a finer step over that span alone.  Within the span, a node whose series
   are absent for a while (and ``up`` says whether gpumon answered) is *missing* there:
   said, and the rest judged.
2. **How it went**: instant queries at the span's end over the span's length, on the
   job's nodes only (``instance=~``): the state-seconds counters at both ends, causes,
   straggler marks, utilisation (per state: from the recording rule of
   gpumon-report-rules.yml where it is loaded, else a subquery), power, memory, host CPU
   and the gap/burst histograms.
3. Turned into ``GpuReadings`` for gpumon.detect.from_metrics, which judges them.

The state counters are read as values at both ends rather than through ``increase()``:
a node's detector backdates an episode to its onset, which takes seconds back from the
state before, so that counter can dip, and ``increase()`` would read the dip as a reset
and count the whole counter again.  A real reset (gpumon restarted: its
``process_start_time_seconds`` moved) counts from the restart.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from gpumon.engine import GpuReadings
from gpumon.faces.report.client import JobNotFoundError, PrometheusClient, Series
from gpumon.model import Cause, Evidence, State

MAX_POINTS = 1000  # per series of a range query (Prometheus allows 11,000)
MIN_STEP_S = 1.0
# A node's series may start or end this many steps after or before the job's others (each
# daemon sees the job's processes at its own tick) before that counts as missing.
EDGE_SLACK_STEPS = 3
RECORDED_UTIL = "instance_gpu_state:gpumon_gpu_utilization:ratio"
# The names gpumon's recording rules give their series (LEVEL:gpumon_METRIC:OPERATIONS).
RECORDED_OF_GPUMON = ".+:gpumon_.+"
GPU_KEY = ("job", "instance", "gpu", "uuid")


def promql_string(value: str) -> str:
    """A PromQL double-quoted string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def regex_alternation(values: Iterable[str]) -> str:
    """An RE2 pattern matching exactly these values."""
    special = set("\\.^$|?*+()[]{}")
    return "|".join(
        "".join("\\" + c if c in special else c for c in v) for v in sorted(set(values))
    )


# Kinds of job whose name is only its node's (docs/serve.md, "How jobs are found"): such a
# job is named with its node, ``KIND:NAME@INSTANCE``.
NODE_KINDS = ("container", "unit", "session", "process")
_NODE_JOB = re.compile(r"^(container|unit|session|process):(.+)@([^@]+)$")


@dataclass(frozen=True, slots=True)
class JobSelector:
    """A job, by its identity labels: a Slurm job id, a Kubernetes pod, or on a node
    with neither a container, unit, session or process tree and its node (``instance``),
    since its name is only its node's."""

    hpc_job: str | None = None
    namespace: str | None = None
    pod: str | None = None
    job_kind: str | None = None
    job_name: str | None = None
    instance: str | None = None

    @classmethod
    def parse(cls, text: str) -> JobSelector:
        """``--job``: a Slurm job id, or ``KIND:NAME@INSTANCE`` for a job found on a node
        without a scheduler (``process:4242@node7:9977``, as `report --top` names it)."""
        m = _NODE_JOB.match(text)
        if m is None:
            return cls(hpc_job=text)
        return cls(job_kind=m.group(1), job_name=m.group(2), instance=m.group(3))

    @classmethod
    def of(cls, labels: dict[str, str]) -> JobSelector | None:
        """The job a series' labels name, or None where they name none."""
        if labels.get("hpc_job"):
            return cls(hpc_job=labels["hpc_job"])
        if labels.get("pod"):
            return cls(namespace=labels.get("namespace", ""), pod=labels["pod"])
        kind, name = labels.get("job_kind", ""), labels.get("job_name", "")
        if kind in NODE_KINDS and name:
            return cls(job_kind=kind, job_name=name, instance=labels.get("instance", ""))
        return None

    def matchers(self) -> str:
        if self.hpc_job is not None:
            return f"hpc_job={promql_string(self.hpc_job)}"
        if self.pod is not None:
            return f"namespace={promql_string(self.namespace or '')},pod={promql_string(self.pod)}"
        return (
            f"job_kind={promql_string(self.job_kind or '')},"
            f"job_name={promql_string(self.job_name or '')},"
            f"instance={promql_string(self.instance or '')}"
        )

    def describe(self) -> str:
        if self.hpc_job is not None:
            return f"job {self.hpc_job}"
        if self.pod is not None:
            return f"pod {self.namespace}/{self.pod}"
        return f"{self.job_kind} {self.job_name} on {self.instance}"

    def ident(self) -> str:
        if self.hpc_job is not None:
            return self.hpc_job
        if self.pod is not None:
            return f"{self.namespace}/{self.pod}"
        return f"{self.job_kind}:{self.job_name}@{self.instance}"

    def labels(self) -> dict[str, str]:
        """The labels it was found by (those set)."""
        return {k: v for k in _SELECTOR_LABELS if (v := getattr(self, k)) is not None}


_SELECTOR_LABELS = ("hpc_job", "namespace", "pod", "job_kind", "job_name", "instance")


@dataclass(frozen=True, slots=True)
class Gap:
    """A stretch of the job's span in which a node's series are missing."""

    instance: str
    start: float
    end: float
    why: str


@dataclass(frozen=True, slots=True)
class LostTime:
    """GPU-seconds lost in one state, for one cause or reason ("" where none)."""

    state: str
    cause: str
    seconds: float


def lost_by_cause(rows: Iterable[tuple[str, str, float]]) -> list[LostTime]:
    """(state, cause, seconds) summed per state and cause, largest first."""
    acc: dict[tuple[str, str], float] = {}
    for state, cause, secs in rows:
        if math.isfinite(secs) and secs > 0:
            acc[(state, cause)] = acc.get((state, cause), 0.0) + secs
    return [LostTime(s, c, v) for (s, c), v in sorted(acc.items(), key=lambda kv: -kv[1])]


@dataclass
class Fetched:
    """Everything the report needs from Prometheus for one job."""

    selector: JobSelector
    since: float
    until: float
    start: float  # the job's span within [since, until]
    end: float
    step_s: float
    readings: list[GpuReadings]
    gaps: list[Gap] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)  # instances whose gpumon restarted
    util_source: str = "recording rule"
    # The job's user and its GPU time lost by state and cause, from the daemons' per-job
    # counters (absent: None and [], where they do not export them).
    user: str | None = None
    lost_by_cause: list[LostTime] = field(default_factory=list)


def step_for(span_s: float) -> float:
    """A range query's step: at most MAX_POINTS points, never under a second."""
    return max(MIN_STEP_S, math.ceil(span_s / MAX_POINTS))


def present_runs(
    times: Iterable[float], start: float, end: float, step: float
) -> list[tuple[float, float]]:
    """The stretches of the grid ``start, start+step, .. end`` at which ``times`` lack a
    point: (first missing, last missing) each."""
    have = {round((t - start) / step) for t in times}
    n = round((end - start) / step)
    out: list[tuple[float, float]] = []
    run: int | None = None
    for k in range(n + 1):
        if k in have:
            if run is not None:
                out.append((start + run * step, start + (k - 1) * step))
                run = None
        elif run is None:
            run = k
    if run is not None:
        out.append((start + run * step, start + n * step))
    return out


def missing_stretches(
    nodes: dict[str, list[float]],
    ups: dict[str, list[tuple[float, float]]],
    start: float,
    end: float,
    step: float,
) -> list[Gap]:
    """Each node's absences within the job's span, with why where ``up`` tells."""
    out = []
    for inst, times in sorted(nodes.items()):
        for a, b in present_runs(times, start, end, step):
            edge = a <= start + 1e-6 or b >= end - 1e-6
            if edge and (b - a) / step + 1 <= EDGE_SLACK_STEPS:
                continue
            up = [v for t, v in ups.get(inst, ()) if a - step / 2 <= t <= b + step / 2]
            if any(v == 0 for v in up):
                why = "gpumon did not answer Prometheus' scrapes (up == 0)"
            elif not up:
                why = "no scrape of the node is recorded"
            else:
                why = "gpumon served no series of the job (its processes were not seen)"
            out.append(Gap(inst, a, b, why))
    return out


def _key(s: Series) -> tuple[str, str, str, str]:
    return tuple(s.labels.get(k, "") for k in GPU_KEY)  # type: ignore[return-value]


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


class JobQueries:
    """The job's queries against one Prometheus."""

    def __init__(
        self, client: PrometheusClient, selector: JobSelector, use_rules: bool = True
    ) -> None:
        self.client = client
        self.sel = selector
        self.use_rules = use_rules

    # --- step 1: where and when ----------------------------------------------------------------

    def _presence(
        self, since: float, until: float, step: float
    ) -> dict[tuple[str, str], list[float]]:
        expr = f"count by (job, instance) (gpumon_gpu_job_info{{{self.sel.matchers()}}})"
        out: dict[tuple[str, str], list[float]] = {}
        for s in self.client.query_range(expr, since, until, step):
            out[(s.labels.get("job", ""), s.labels.get("instance", ""))] = [t for t, _ in s.points]
        return out

    def locate(
        self, since: float, until: float
    ) -> tuple[dict[tuple[str, str], list[float]], float]:
        """The job's nodes with the times it was seen on each, at the step returned."""
        step = step_for(until - since)
        seen = self._presence(since, until, step)
        if not seen:
            raise JobNotFoundError(self._not_found(since, until))
        first = min(min(v) for v in seen.values())
        last = max(max(v) for v in seen.values())
        fine = step_for(last - first + 2 * step)
        if fine < step:
            lo, hi = max(since, first - step), min(until, last + step)
            seen = self._presence(lo, hi, fine) or seen
            step = fine if seen else step
        return seen, step

    def _not_found(self, since: float, until: float) -> str:
        """Why no gpumon series name the job: only gpumon's recording rules' series do (a
        store fed the fleet records alone), elsewhere seen (dcgm-exporter, a Slurm
        exporter) on nodes that run no gpumon, or not at all."""
        match = f'{{{self.sel.matchers()},__name__!~"{RECORDED_OF_GPUMON}|gpumon_.*"}}'
        others = self.client.series(match, since, until)
        what = self.sel.describe()
        if not others:
            match = f'{{{self.sel.matchers()},__name__=~"{RECORDED_OF_GPUMON}"}}'
            recorded = sorted({s.get("__name__", "?") for s in self.client.series(
                match, since, until)})  # fmt: skip
            if recorded:
                return (
                    f"Prometheus at {self.client.url} holds only gpumon's recorded series of "
                    f"{what} ({', '.join(recorded[:2])}), not its nodes' series: ask the "
                    "Prometheus that scrapes its nodes, or a query layer that reaches them "
                    '(docs/report.md, "Past one Prometheus")'
                )
            return (
                f"Prometheus at {self.client.url} has no series of {what} between "
                f"{_clock(since)} and {_clock(until)}: no such job in that range (widen it "
                "with --last or --since)"
            )
        insts = sorted({s.get("instance", "?") for s in others})
        names = sorted({s.get("__name__", "?") for s in others})
        return (
            f"{what} ran on {', '.join(insts)} ({', '.join(names[:3])} name it) but no "
            "gpumon series does: gpumon serve does not run on its nodes, or cannot see the "
            "job's processes there (docs/serve.md, job labels)"
        )

    # --- step 2: how it went -------------------------------------------------------------------

    def fetch(self, since: float, until: float) -> Fetched:
        seen, step = self.locate(since, until)
        first = min(min(v) for v in seen.values())
        last = max(max(v) for v in seen.values())
        start, end = max(since, first - step), last
        window = f"{max(1000, round((end - start) * 1000))}ms"
        jobs = regex_alternation(j for j, _ in seen)
        insts = regex_alternation(i for _, i in seen)
        n = f"job=~{promql_string(jobs)},instance=~{promql_string(insts)}"
        at = end

        def q(expr: str, t: float = at) -> list[Series]:
            return self.client.query(expr, t)

        members = q(
            "max by (job, instance, gpu, uuid) "
            f"(max_over_time(gpumon_gpu_job_info{{{self.sel.matchers()}}}[{window}]))"
        )
        gpus = {_key(s) for s in members}
        ups = {
            s.labels.get("instance", ""): list(s.points)
            for s in self.client.query_range(f"up{{{n}}}", first, last, step)
        }
        gaps = missing_stretches({i: t for (_, i), t in seen.items()}, ups, first, last, step)

        counters_end = q(f"gpumon_gpu_state_seconds_total{{{n}}}")
        counters_start = q(f"gpumon_gpu_state_seconds_total{{{n}}}", start)
        started_end = {
            s.labels.get("instance", ""): s.value for s in q(f"process_start_time_seconds{{{n}}}")
        }
        started_then = {
            s.labels.get("instance", ""): s.value
            for s in q(f"process_start_time_seconds{{{n}}}", start)
        }
        # Restarted while the job ran: its start time moved, or it started after the job
        # was first seen on it (a daemon started before the job is not a restart).
        restarted = sorted(
            i
            for i, v in started_end.items()
            if (v > started_then[i] + 0.5 if i in started_then else v > first + step)
        )
        seconds = _state_seconds(counters_end, counters_start, set(restarted))

        def per_gpu(expr: str) -> dict[tuple[str, str, str, str], float]:
            return {_key(s): s.value for s in q(expr) if math.isfinite(s.value)}

        def per_gpu_label(
            expr: str, label: str
        ) -> dict[tuple[str, str, str, str], dict[str, float]]:
            out: dict[tuple[str, str, str, str], dict[str, float]] = {}
            for s in q(expr):
                if math.isfinite(s.value):
                    out.setdefault(_key(s), {})[s.labels.get(label, "")] = s.value
            return out

        over = f"[{window}]"
        causes = per_gpu_label(f"sum_over_time(gpumon_gpu_cause{{{n}}}{over})", "cause")
        strag = per_gpu(f"avg_over_time(gpumon_gpu_straggler{{{n}}}{over})")
        # gpumon_gpu_reason exists only while its reason holds: count its scrapes.
        hung = per_gpu(f'count_over_time(gpumon_gpu_reason{{{n},reason="hang"}}{over})')
        lost = per_gpu(f"avg_over_time(gpumon_gpu_lost{{{n}}}{over})")
        duty = per_gpu(f"avg_over_time(gpumon_gpu_utilization_ratio{{{n}}}{over})")
        count = per_gpu(f"count_over_time(gpumon_gpu_utilization_ratio{{{n}}}{over})")
        util_source = "recording rule"
        by_state = {}
        if self.use_rules:
            by_state = per_gpu_label(f"avg_over_time({RECORDED_UTIL}{{{n}}}{over})", "state")
        if not gpus <= set(by_state):
            util_source = "subquery"
            by_state = per_gpu_label(
                f"avg_over_time((gpumon_gpu_state{{{n}}} * on (job, instance, gpu, uuid) "
                f"group_left () gpumon_gpu_utilization_ratio{{{n}}})[{window}:{step:g}s])",
                "state",
            )
        shares = per_gpu_label(f"avg_over_time(gpumon_gpu_state{{{n}}}{over})", "state")
        power = per_gpu(f"avg_over_time(gpumon_gpu_power_watts{{{n}}}{over})")
        peak = per_gpu(f"max_over_time(gpumon_gpu_power_watts{{{n}}}{over})")
        used = per_gpu(f"max_over_time(gpumon_gpu_memory_used_bytes{{{n}}}{over})")
        total = per_gpu(f"max_over_time(gpumon_gpu_memory_total_bytes{{{n}}}{over})")
        host = {
            s.labels.get("instance"): s.value
            for s in q(f"avg_over_time(gpumon_host_cpu_ratio{{{n}}}{over})")
        }
        iowait = {
            s.labels.get("instance"): s.value
            for s in q(f"avg_over_time(gpumon_host_iowait_ratio{{{n}}}{over})")
        }

        def quantile(metric: str, phi: float) -> dict[tuple[str, str, str, str], float]:
            # The buckets' growth from the span's start to its end: two samples per bucket
            # whatever the span (increase() would read every sample in it); a daemon started
            # within the span counts from 0.
            b = f"{metric}_bucket{{{n}}}"
            grown = f"(clamp_min({b} - {b} offset {window}, 0) or {b})"
            return per_gpu(
                f"histogram_quantile({phi}, sum by (job, instance, gpu, uuid, le) ({grown}))"
            )

        # The job's own counters (gpumon_job_lost_gpu_seconds_total): its user, and its lost
        # time by cause.
        lost_rows = q(
            "sum by (user, state, cause) (increase(gpumon_job_lost_gpu_seconds_total"
            f"{{{self.sel.matchers()}}}[{window}]))"
        )
        by_user: dict[str, float] = {}
        for s in lost_rows:
            u = s.labels.get("user", "")
            by_user[u] = by_user.get(u, 0.0) + (s.value if math.isfinite(s.value) else 0.0)
        user = max(by_user, key=lambda u: (by_user[u], u)) if by_user else None
        lost_causes = lost_by_cause(
            (s.labels.get("state", ""), s.labels.get("cause", ""), s.value) for s in lost_rows
        )

        gap50 = quantile("gpumon_gpu_idle_gap_seconds", 0.5)
        gap90 = quantile("gpumon_gpu_idle_gap_seconds", 0.9)
        burst50 = quantile("gpumon_gpu_busy_burst_seconds", 0.5)
        job_peak = max((peak[k] for k in gpus if k in peak), default=None)

        readings = []
        for k in sorted(gpus):
            _job, inst, gpu, uuid = k
            ev: Evidence = {}
            _put(ev, "gap_p50_s", gap50.get(k))
            _put(ev, "gap_p90_s", gap90.get(k))
            _put(ev, "burst_p50_s", burst50.get(k))
            if job_peak and k in power:
                ev["power_share_of_peak"] = round(power[k] / job_peak, 3)
            if k in power:
                ev["power_watts"] = round(power[k], 1)
            if k in used and total.get(k):
                ev["mem_used_bytes"] = int(used[k])
                ev["mem_total_bytes"] = int(total[k])
                ev["mem_headroom_ratio"] = round(1.0 - used[k] / total[k], 3)
            if inst in host:
                ev["host_cpu_pct"] = round(host[inst] * 100, 1)
            if inst in iowait:
                ev["iowait_pct"] = round(iowait[inst] * 100, 1)
            readings.append(
                GpuReadings(
                    instance=inst,
                    gpu=int(gpu) if gpu.isdigit() else -1,
                    uuid=uuid,
                    seconds=seconds.get(k, {}),
                    cause_samples=_enum_keys(causes.get(k, {}), Cause),
                    straggler_share=strag.get(k),
                    hang_share=hung[k] / count[k] if k in hung and count.get(k) else None,
                    lost_share=lost.get(k),
                    util_by_state=_enum_keys(by_state[k], State) if k in by_state else None,
                    state_share=_enum_keys(shares[k], State) if k in shares else None,
                    duty=duty.get(k),
                    samples=int(count.get(k, 0)),
                    evidence=ev,
                )
            )
        return Fetched(
            self.sel,
            since,
            until,
            start,
            end,
            step,
            readings,
            gaps,
            restarted,
            util_source,
            user or None,
            lost_causes,
        )


def _state_seconds(
    end: list[Series], start: list[Series], restarted: set[str]
) -> dict[tuple[str, str, str, str], dict[State, float]]:
    """Time per state from the counters' values at the span's two ends."""
    before = {(*_key(s), s.labels.get("state", "")): s.value for s in start}
    out: dict[tuple[str, str, str, str], dict[State, float]] = {}
    for s in end:
        try:
            state = State(s.labels.get("state", ""))
        except ValueError:
            continue
        k = _key(s)
        was = before.get((*k, state.value))
        grew = s.value if was is None or k[1] in restarted or s.value < was else s.value - was
        out.setdefault(k, {})[state] = max(0.0, grew)
    return out


def _enum_keys(d: dict[str, float], enum: Callable[[str], object]) -> dict:
    out = {}
    for k, v in d.items():
        try:
            out[enum(k)] = v
        except ValueError:
            continue
    return out


def _put(
    ev: Evidence, key: Literal["gap_p50_s", "gap_p90_s", "burst_p50_s"], value: float | None
) -> None:
    if value is not None and math.isfinite(value):
        ev[key] = round(value, 4)


def _clock(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
