"""What `gpumon report --top` asks Prometheus: the fleet's GPU time lost per job and cause,
then how each of the jobs it shows went.

1. **The ranking**: one query of the fleet records (gpumon-rules.yml's ``gpumon-fleet``
   group: per job, user, state and cause, a sample of GPU-seconds lost every 5 minutes)
   summed over the range, and one of the GPU time they had: a few series per job,
   whatever the number of GPUs or samples.  A record sums the interval before it, so only
   the records whose intervals lie within the range are summed (``coverage``); the range's
   ends around them, less than an interval each, are read from the counters -- or a
   report of the last 10 minutes would count up to 5 minutes too few or too many.  Where
   the records are not there (the group not loaded, ``--no-recording-rules``), all of it
   from the daemons' per-job counters (``increase`` over the range of every job's series
   on every node).
2. **Each job shown**: the job's own counters on each of its nodes (GPU time and lost time
   per state and cause, its GPUs there), three queries that read only that job's series,
   turned into readings for ``gpumon.detect.from_metrics.judge_job`` -- the judge
   `report --job` uses -- with each node's time spread evenly over its GPUs.  A straggler
   *node*, a hang, the verdict, the speed-up if fed and the advice come from it; what
   one GPU of a node did apart from the others is `report --job`'s to say.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpumon.engine import GpuReadings
from gpumon.faces.report.client import PrometheusClient, Series
from gpumon.faces.report.queries import NODE_KINDS, JobSelector
from gpumon.model import Cause, State

LOST_RECORD = "job_user_cause:gpumon_job_lost_gpu_seconds:increase5m"
USED_RECORD = "job_user_cause:gpumon_job_gpu_seconds:increase5m"
LOST_COUNTER = "gpumon_job_lost_gpu_seconds_total"
USED_COUNTER = "gpumon_job_gpu_seconds_total"
# What names a job and where its time went (instance: only a node-local job's).
BY = "instance, hpc_job, namespace, pod, job_kind, job_name, user, state, cause"

Why = tuple[str, str]  # (state, cause or reason; "" where none)


@dataclass
class JobTotals:
    """One job's GPU time over the range, from the fleet's records or counters."""

    job: JobSelector
    user: str
    lost: dict[Why, float] = field(default_factory=dict)
    used: dict[Why, float] = field(default_factory=dict)

    @property
    def lost_s(self) -> float:
        return sum(self.lost.values())

    @property
    def used_s(self) -> float:
        return sum(self.used.values())


@dataclass(frozen=True, slots=True)
class NodeTime:
    """A job's time on one node: its GPUs there, GPU time and lost time by state and why."""

    instance: str
    gpus: int
    used: Mapping[Why, float]
    lost: Mapping[Why, float]


def window(since: float, until: float) -> str:
    """A PromQL range covering [since, until]."""
    return f"{max(1000, round((until - since) * 1000))}ms"


@dataclass(frozen=True, slots=True)
class Coverage:
    """How a range splits between the fleet records and the counters: ``records`` (start,
    end] is whole record intervals, ``count`` of them; the ends (``counters``) are not."""

    records: tuple[float, float] | None
    count: int
    counters: tuple[tuple[float, float], ...]


def coverage(since: float, until: float, newest: float | None, every: float | None) -> Coverage:
    """The records within [since, until] whose intervals (``every`` seconds before each,
    the newest at ``newest``) lie wholly inside it, and the ends left to the counters;
    all of it to the counters where no record interval fits."""
    if newest is None or every is None or every <= 0 or not since < newest <= until:
        return Coverage(None, 0, ((since, until),))
    count = math.floor((newest - since) / every + 1e-9)
    if count < 1:
        return Coverage(None, 0, ((since, until),))
    start = newest - count * every
    ends = tuple((a, b) for a, b in ((since, start), (newest, until)) if b - a >= 1.0)
    return Coverage((start, newest), count, ends)


def job_of(labels: Mapping[str, str]) -> JobSelector | None:
    """The job a fleet series names; a Slurm job or a pod whatever node it was on."""
    lb = dict(labels)
    if lb.get("job_kind", "") not in NODE_KINDS:
        lb.pop("instance", None)
    return JobSelector.of(lb)


class FleetQueries:
    """The fleet's queries against one Prometheus."""

    def __init__(self, client: PrometheusClient, use_rules: bool = True) -> None:
        self.client = client
        self.use_rules = use_rules
        self.source = "recording rule"

    # --- 1: the ranking -----------------------------------------------------------------

    def totals(self, since: float, until: float) -> list[JobTotals]:
        """Every job's lost and used GPU time in [since, until]."""
        lost: list[Series] = []
        used: list[Series] = []
        if self.use_rules:
            lost, used = self._recorded(since, until)
        if not lost:
            self.source = "raw series"
            lost, used = self._counted(since, until)
        jobs: dict[JobSelector, JobTotals] = {}
        for rows, attr in ((lost, "lost"), (used, "used")):
            for s in rows:
                job = job_of(s.labels)
                if job is None or not math.isfinite(s.value) or s.value < 0:
                    continue
                entry = jobs.get(job)
                if entry is None:
                    entry = jobs[job] = JobTotals(job, s.labels.get("user", ""))
                why = (s.labels.get("state", ""), s.labels.get("cause", ""))
                got: dict[Why, float] = getattr(entry, attr)
                got[why] = got.get(why, 0.0) + s.value
        return list(jobs.values())

    def _recorded(self, since: float, until: float) -> tuple[list[Series], list[Series]]:
        """Lost and used GPU time in [since, until] from the fleet records, where no whole
        record interval lies from the counters; ([], []) where there is neither."""
        cov = self._coverage(since, until)
        ends = [self._counted(a, b) for a, b in cov.counters]
        if cov.counters and not any(lost for lost, _ in ends):
            # No counters where the records do not reach (a store fed the records alone):
            # every record in the range, though the first one's interval may start before.
            return self._sum_records(since, until, 0)
        if cov.records is None:  # no whole record interval in the range: the counters alone
            self.source = "raw series"
            return ends[0]
        lost, used = self._sum_records(*cov.records, cov.count)
        for more_lost, more_used in ends if lost else ():
            lost, used = [*lost, *more_lost], [*used, *more_used]
        return lost, used

    def _sum_records(
        self, since: float, until: float, count: int
    ) -> tuple[list[Series], list[Series]]:
        """The records in (since, until] summed; with ``count``, the range is that many
        whole intervals: read less half of one, so that it never holds the record at its
        start, whatever the rounding of their timestamps."""
        start = since + (until - since) / count / 2 if count else since
        w = window(start, until)
        lost = self.client.query(f"sum by ({BY}) (sum_over_time({LOST_RECORD}[{w}]))", until)
        if not lost:
            return [], []
        used = self.client.query(f"sum by ({BY}) (sum_over_time({USED_RECORD}[{w}]))", until)
        return lost, used

    def _coverage(self, since: float, until: float) -> Coverage:
        """Where the records hold [since, until]: the newest record before ``until`` and
        the interval between records (from the one before it)."""

        def newest(at: float) -> float | None:
            got = self.client.query(f"max(timestamp({LOST_RECORD}))", at)
            return next((s.value for s in got if math.isfinite(s.value)), None)

        last = newest(until)
        before = None if last is None else newest(last - 0.001)
        every = None if last is None or before is None else last - before
        return coverage(since, until, last, every)

    def _counted(self, since: float, until: float) -> tuple[list[Series], list[Series]]:
        """Lost and used GPU time in [since, until] from the daemons' counters."""
        w = window(since, until)
        return (
            self.client.query(f"sum by ({BY}) (increase({LOST_COUNTER}[{w}]))", until),
            self.client.query(f"sum by ({BY}) (increase({USED_COUNTER}[{w}]))", until),
        )

    # --- 2: each job shown --------------------------------------------------------------

    def nodes(self, job: JobSelector, since: float, until: float) -> list[NodeTime]:
        """The job's time on each of its nodes over [since, until]."""
        w, sel = window(since, until), job.matchers()
        by = "instance, state, cause"

        def per_why(counter: str) -> dict[str, dict[Why, float]]:
            out: dict[str, dict[Why, float]] = {}
            expr = f"sum by ({by}) (increase({counter}{{{sel}}}[{w}]))"
            for s in self.client.query(expr, until):
                if math.isfinite(s.value) and s.value > 0:
                    why = (s.labels.get("state", ""), s.labels.get("cause", ""))
                    node = out.setdefault(s.labels.get("instance", ""), {})
                    node[why] = node.get(why, 0.0) + s.value
            return out

        used, lost = per_why(USED_COUNTER), per_why(LOST_COUNTER)
        gpus = {
            s.labels.get("instance", ""): s.value
            for s in self.client.query(
                f"max by (instance) (max_over_time(gpumon_job_gpus{{{sel}}}[{w}]))", until
            )
        }
        return [
            NodeTime(inst, max(1, round(gpus.get(inst, 1))), used[inst], lost.get(inst, {}))
            for inst in sorted(used)
        ]


def readings(nodes: list[NodeTime]) -> list[GpuReadings]:
    """The job's nodes as the judge's per-GPU readings: each node's time spread evenly
    over its GPUs there (GPU-seconds, so the job's sums are the counters')."""
    out = []
    for node in nodes:
        n = node.gpus
        seconds: dict[State, float] = {}
        busy: dict[State, float] = {}
        starved_by: dict[Cause, float] = {}
        strag = hang = gone = 0.0
        for (state_label, why), secs in node.used.items():
            try:
                state = State(state_label)
            except ValueError:
                continue
            lost = min(secs, node.lost.get((state_label, why), 0.0))
            seconds[state] = seconds.get(state, 0.0) + secs / n
            # Busy time: what was not lost, but a GPU that busy-waits reads busy and its
            # time is lost all the same (the judge counts it lost, not work).
            waiting = state is State.SYNC_STALL and why != "straggler"
            busy[state] = busy.get(state, 0.0) + (secs if waiting else secs - lost) / n
            if state is State.STARVED:
                try:
                    cause = Cause(why)
                except ValueError:
                    cause = Cause.UNKNOWN
                starved_by[cause] = starved_by.get(cause, 0.0) + secs
            elif state is State.SYNC_STALL and why == "straggler":
                strag += secs
            elif state is State.SYNC_STALL and why == "hang":
                hang += secs
            elif state is State.UNKNOWN and why == "gpu_lost":
                gone += secs
        total = sum(node.used.values())
        if total <= 0:
            continue
        covered = sum(seconds.values())
        util = {s: min(1.0, max(0.0, busy.get(s, 0.0) / v)) for s, v in seconds.items() if v > 0}
        for k in range(n):
            out.append(
                GpuReadings(
                    instance=node.instance,
                    gpu=k,
                    uuid=f"{node.instance}/{k}",
                    seconds=dict(seconds),
                    cause_samples=dict(starved_by),
                    straggler_share=strag / total,
                    hang_share=hang / total,
                    lost_share=gone / total,
                    util_by_state=util,
                    state_share=dict.fromkeys(util, 1.0),
                    duty=sum(busy.values()) / covered if covered > 0 else None,
                    samples=round(covered),
                )
            )
    return out
