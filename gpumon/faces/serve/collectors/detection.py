"""The ``detection`` group: the detector's verdicts per GPU and for the node."""

from __future__ import annotations

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from gpumon.faces.serve.collectors.base import GPU, GroupCollector
from gpumon.model import Cause, Episode, Reason, State

STATES = tuple(str(s) for s in State)
CAUSES = tuple(str(c) for c in Cause)
# Reasons as label values: the enum's names, since its values are phrases for people.
REASON_LABELS = {r: r.name.lower() for r in Reason}


def is_straggler(ep: Episode) -> bool:
    """The detector marks the GPU its peers wait on with the straggler reason."""
    return ep.state is State.SYNC_STALL and ep.reason is Reason.STRAGGLER


class DetectionCollector(GroupCollector):
    """Each GPU's state, cause and reason, its time per state and the lengths of its gaps
    and bursts; the node's state; the GPU-seconds lost."""

    group = "detection"
    names = (
        "gpumon_gpu_state",
        "gpumon_gpu_cause",
        "gpumon_gpu_reason",
        "gpumon_gpu_straggler",
        "gpumon_gpu_state_seconds_total",
        "gpumon_gpu_idle_gap_seconds",
        "gpumon_gpu_busy_burst_seconds",
        "gpumon_node_state",
        "gpumon_node_state_seconds_total",
        "gpumon_lost_gpu_seconds_total",
    )

    def collect(self) -> list[Metric]:
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
