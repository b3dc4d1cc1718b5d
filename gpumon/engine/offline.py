"""A whole trace judged in one pass: what ``gpumon analyze`` and the library's
``analyze()`` report, bounded whatever the trace's length.

    with open_trace("run.csv") as trace:
        result = analyze(trace.header, trace)
    result.summary.verdict, result.summary.advice
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpumon.detect import DetectorConfig, RunSummary
from gpumon.engine.memory import GpuMemory, RunMemory
from gpumon.engine.session import Session
from gpumon.model import Advice, Cause, Episode, Snapshot, State, TraceHeader, Verdict


@dataclass
class Analysis:
    """A judged trace: its memory (timelines, histograms, episodes), the detector's view
    at its end ("now") and the run summary every face reports."""

    header: TraceHeader
    memory: RunMemory
    verdict: Verdict  # the detector's view at the end ("now")
    summary: RunSummary  # the run as a whole
    # (time, what) of a tick whose values the detector could not take (a string where a
    # number belongs, in a hand-edited file): the analysis stopped before it.
    bad_tick: tuple[float, str] | None = None

    @property
    def gpus(self) -> dict[int, GpuMemory]:
        return dict(sorted(self.memory.gpus.items()))

    @property
    def run_episodes(self) -> list[Episode]:
        return list(self.memory.run_episodes)

    @property
    def start_s(self) -> float | None:
        return self.memory.start_s

    @property
    def end_s(self) -> float | None:
        return self.memory.end_s

    @property
    def ticks(self) -> int:
        return self.memory.ticks

    @property
    def duration_s(self) -> float:
        return self.memory.duration_s

    @property
    def state(self) -> State:
        return self.summary.verdict

    @property
    def cause(self) -> Cause | None:
        return self.summary.cause

    @property
    def advice(self) -> tuple[Advice, ...]:
        return self.summary.advice

    @property
    def lost_gpu_seconds(self) -> float:
        return self.summary.lost_gpu_seconds


def analyze(
    header: TraceHeader, snapshots: Iterable[Snapshot], config: DetectorConfig | None = None
) -> Analysis:
    """Judge ``snapshots`` once, keeping bounded summaries per GPU, at the live detector's
    cadence (``OFFLINE_CONFIG``): a recording analysed tells the story the live faces told.
    """
    session = Session.offline(header, config)
    feed = session.feed
    bad_tick = None
    for snap in snapshots:
        try:
            feed(snap)
        except (TypeError, ValueError) as exc:
            # Readers of text logs parse every number; a JSON trace can hold a string or a
            # list where a number belongs.  Stop there, keep the analysis of what came
            # before (try costs nothing until it catches, unlike checking every field).
            bad_tick = (snap.t_s, f"{type(exc).__name__}: {exc}")
            break
    session.conclude()  # a short log is judged on all it shows: "now" says so too
    verdict = session.verdict()
    session.finish()
    summary = session.summary()
    assert verdict is not None and summary is not None  # an offline session judges
    return Analysis(header, session.memory, verdict, summary, bad_tick)
