"""The ``jobs`` group: each job's state over its GPUs on this node."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpumon.faces.serve.collectors.base import JOB_OWN, GroupCollector
from gpumon.faces.serve.collectors.detection import REASON_LABELS, STATES
from gpumon.model import State


class JobsCollector(GroupCollector):
    """Per job (Slurm job, pod, container, unit or process tree): its state and reason,
    how many GPUs it uses, and the jobs left untracked beyond ``max_jobs``."""

    group = "jobs"
    names = (
        "gpumon_job_state",
        "gpumon_job_reason",
        "gpumon_job_gpus",
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
