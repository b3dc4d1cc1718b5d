"""The run summary's JSON core: built here once, extended by each face.

Every face that writes a run's summary as JSON (`analyze --json`, `watch --summary-json`,
`report --json` and serve's summary/stop log lines) starts from ``run_core`` and adds its
own keys; an episode starts from ``episode_core``.  The shape is published as a JSON
Schema in ``gpumon/schema/summary.schema.json`` (``gpumon.schema.summary_schema()``), and
the tests hold every face's output to it, so a key, a type or a rounding is decided here
and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumon.detect import GpuRun, RunSummary
from gpumon.engine.words import seconds_by_state
from gpumon.model import Episode, State

# Decimal places, one per kind of number, for every face alike.
SECONDS_PLACES = 3  # a duration in seconds (start-up, off the bus, a run's wall time)
LOST_PLACES = 1  # GPU-seconds lost: a count people read, not a clock
SHARE_PLACES = 4  # a 0-1 share (duty cycle)


def _value(x: object) -> str | None:
    return None if x is None else str(x)


def _round(x: float | None, places: int) -> float | None:
    return None if x is None else round(x, places)


def gpu_core(gpu: int, uuid: str, run: GpuRun | None) -> dict[str, Any]:
    """One GPU over the run, the keys every face writes: its run verdict (``unknown``
    where the summary has no word on it) and cause, duty cycle, samples, time per state,
    lost GPU-seconds and time off the bus."""
    return {
        "gpu": gpu,
        "uuid": uuid,
        "verdict": (run.verdict if run is not None else State.UNKNOWN).value,
        "cause": _value(run.cause) if run is not None else None,
        "duty_cycle": _round(run.duty_cycle, SHARE_PLACES) if run is not None else None,
        "samples": run.samples if run is not None else 0,
        "seconds": seconds_by_state(run.seconds if run is not None else None),
        "lost_gpu_seconds": round(run.lost_gpu_seconds, LOST_PLACES) if run is not None else 0.0,
        "off_bus_s": round(run.off_bus_s, SECONDS_PLACES) if run is not None else 0.0,
    }


def run_core(run: RunSummary, gpus: Mapping[int, str] | None = None) -> dict[str, Any]:
    """What the run amounts to, the keys every face writes.  ``gpus`` (index -> UUID)
    lists the GPUs to show, in order, where a face knows more than the summary does (a GPU
    seen but never judged is ``unknown``); by default the summary's own."""
    runs = {g.gpu: g for g in run.gpus}
    shown = gpus if gpus is not None else {g.gpu: g.uuid for g in run.gpus}
    return {
        "verdict": run.verdict.value,
        "cause": _value(run.cause),
        "reason": _value(run.reason),
        "seconds": seconds_by_state(run.seconds),
        "startup_s": round(run.startup_s, SECONDS_PLACES),
        "duty_cycle": _round(run.duty_cycle, SHARE_PLACES),
        "effective_gpus": run.effective_gpus,
        "lost_gpu_seconds": round(run.lost_gpu_seconds, LOST_PLACES),
        "speedup_if_fed": run.speedup_if_fed,
        "work_duty_cycle": run.work_duty_cycle,
        "advice": [a.text for a in run.advice],
        "notes": list(run.notes),
        "gpus": [gpu_core(idx, uuid, runs.get(idx)) for idx, uuid in shown.items()],
    }


def episode_core(ep: Episode, start: float | None, end: float | None) -> dict[str, Any]:
    """One episode, the keys every face writes; its times are the face's to choose (a
    trace's clock in analyze, wall time in the daemon's log)."""
    return {
        "start": start,
        "end": end,
        "state": ep.state.value,
        "cause": _value(ep.cause),
        "reason": _value(ep.reason),
        "note": ep.note,
        "evidence": dict(ep.evidence),
        "advice": [a.text for a in ep.advice],
    }
