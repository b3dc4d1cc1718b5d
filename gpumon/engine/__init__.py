"""The engine floor: between the samplers and readers below and the faces above.

A ``Session`` takes snapshots from one source (the machine, a replayed trace, a caller),
judges them with the detector, follows the jobs on the GPUs, and keeps one bounded
``RunMemory`` of the run that every face reads; ``analyze`` judges a whole trace in one
pass; ``words`` says it all the same way in every face.
"""

from gpumon.detect import DetectorConfig, GpuRun, RunSummary
from gpumon.detect.from_metrics import (
    GpuJudged,
    GpuReadings,
    JobJudged,
    NodeJudged,
    Straggler,
    judge_job,
)
from gpumon.engine.jobs import Job, JobOptions, JobTracker
from gpumon.engine.memory import GpuEvent, GpuEventKind, GpuMemory, RunMemory
from gpumon.engine.offline import Analysis, analyze
from gpumon.engine.session import OFFLINE_CONFIG, Reading, Session, Tick
from gpumon.engine.sources import LiveOptions, Polled
from gpumon.engine.stacks import StackOptions

__all__ = [
    "OFFLINE_CONFIG",
    "Analysis",
    "DetectorConfig",
    "GpuEvent",
    "GpuEventKind",
    "GpuJudged",
    "GpuMemory",
    "GpuReadings",
    "GpuRun",
    "Job",
    "JobJudged",
    "JobOptions",
    "JobTracker",
    "LiveOptions",
    "NodeJudged",
    "Polled",
    "Reading",
    "RunMemory",
    "RunSummary",
    "Session",
    "StackOptions",
    "Straggler",
    "Tick",
    "analyze",
    "judge_job",
]
