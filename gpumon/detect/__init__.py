"""The burst/stall detector: pure (no I/O, no clock), incremental, bounded memory."""

from gpumon.detect.config import DetectorConfig
from gpumon.detect.detector import Detector, DetectorUpdate, GpuTotals
from gpumon.detect.summary import GpuRun, RunSummary, run_verdict

__all__ = [
    "Detector",
    "DetectorConfig",
    "DetectorUpdate",
    "GpuRun",
    "GpuTotals",
    "RunSummary",
    "run_verdict",
]
