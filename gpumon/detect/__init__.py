"""The burst/stall detector: pure (no I/O, no clock), incremental, bounded memory."""

from gpumon.detect.config import DetectorConfig
from gpumon.detect.detector import Detector, DetectorUpdate

__all__ = ["Detector", "DetectorConfig", "DetectorUpdate"]
