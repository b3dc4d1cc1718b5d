"""The ``jobs`` group: each job's state over its GPUs on this node, and its GPU time.

A job's GPU time (``gpumon_job_gpu_seconds_total``, ``gpumon_job_lost_gpu_seconds_total``)
is counted per state and why: the starved cause (``cpu``, ``gil``, ``io``, ``contention``,
``unknown``) or the state's reason (``straggler``, ``busy_wait``, ``hang``, ``memory_held``,
``start_up``, ...), ``""`` where the state says it all.  The series are bounded: at most
``max_jobs`` jobs, each with the (state, cause) pairs it went through, out of a fixed
vocabulary; a job's series go when the job leaves the table (``linger_s`` after its last
GPU process left), and a job seen again starts from 0 (a counter reset to Prometheus).
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpumon.engine.jobs import SpentKey
from gpumon.faces.serve.collectors.base import JOB_OWN, GroupCollector
from gpumon.faces.serve.collectors.detection import REASON_LABELS, STATES
from gpumon.model import Reason, State


def why_label(key: SpentKey) -> str:
    """The ``cause`` label of a job's time: the starved cause, the reason's name, or ""."""
    why = key[1]
    if why is None:
        return ""
    return REASON_LABELS[why] if isinstance(why, Reason) else str(why)


class JobsCollector(GroupCollector):
    """Per job (Slurm job, pod, container, unit or process tree): its state and reason,
    how many GPUs it uses, its GPU time and the time lost by state and cause, and the
    jobs left untracked beyond ``max_jobs``."""

    group = "jobs"
    names = (
        "gpumon_job_state",
        "gpumon_job_reason",
        "gpumon_job_gpus",
        "gpumon_job_gpu_seconds_total",
        "gpumon_job_lost_gpu_seconds_total",
        "gpumon_jobs_untracked_total",
    )

    def collect(self) -> list[Metric]:
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
        spent = CounterMetricFamily(
            "gpumon_job_gpu_seconds",
            "GPU-seconds the job's GPUs on this node spent in each state, by cause (a "
            "starved GPU's) or reason (the state's: straggler, busy_wait, hang, "
            'memory_held, start_up, ...; "" where the state says it all).',
            labels=[*JOB_OWN, "state", "cause"],
        )
        lost = CounterMetricFamily(
            "gpumon_job_lost_gpu_seconds",
            "Of the job's GPU-seconds on this node, those lost: idle or busy-waiting while "
            "the job held the GPU, by state and cause or reason.",
            labels=[*JOB_OWN, "state", "cause"],
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
            time = job.time
            for key, secs in time.seconds.items():
                why = [*lv, str(key[0]), why_label(key)]
                spent.add_metric(why, secs)
                lost.add_metric(why, time.lost.get(key, 0.0))
        dropped = CounterMetricFamily(
            "gpumon_jobs_untracked",
            "Jobs not given a state because max_jobs were already tracked.",
            value=st.jobs_dropped_total,
        )
        return [state, reason, gpus, spent, lost, dropped]
