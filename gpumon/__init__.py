"""gpumon: tells people training neural networks why their GPUs are waiting.

The command line is ``gpumon``; the same engine is a library::

    import gpumon

    with gpumon.open_trace("nvidia-smi.csv") as trace:     # any format gpumon reads
        result = gpumon.analyze(trace.header, trace)
    print(result.summary.verdict, result.summary.cause)
    for advice in result.summary.advice:                   # each with the lever it pulls
        print(advice.lever, advice.text)

    session = gpumon.Session.live(gpumon.LiveOptions(pid=1234))  # live (NVML, no CUDA)
    session.tick(); session.verdict()

Names are imported when first used, so ``import gpumon`` stays cheap (the dstat plugin
and the command line import it before anything else).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The distribution name, for importlib.metadata and install hints: "gpumon" on PyPI is
# another project, so this one installs as gpumon-why (the command is still `gpumon`).
DISTRIBUTION = "gpumon-why"

# Public name -> the module that defines it.
_EXPORTS = {
    # reading and judging traces and live runs
    "open_trace": "gpumon.traces.sniff",
    "FORMATS": "gpumon.traces.sniff",
    "analyze": "gpumon.engine.offline",
    "Analysis": "gpumon.engine.offline",
    "Session": "gpumon.engine.session",
    "LiveOptions": "gpumon.engine.sources",
    "Tick": "gpumon.engine.session",
    "RunMemory": "gpumon.engine.memory",
    "DetectorConfig": "gpumon.detect.config",
    "RunSummary": "gpumon.detect.summary",
    "GpuRun": "gpumon.detect.summary",
    # the data model
    "State": "gpumon.model",
    "Cause": "gpumon.model",
    "Reason": "gpumon.model",
    "Snapshot": "gpumon.model",
    "GpuSample": "gpumon.model",
    "HostSample": "gpumon.model",
    "ProcTreeSample": "gpumon.model",
    "ProcessSample": "gpumon.model",
    "GpuProcess": "gpumon.model",
    "GpuIdentity": "gpumon.model",
    "TraceHeader": "gpumon.model",
    "Episode": "gpumon.model",
    "Verdict": "gpumon.model",
    "GpuVerdict": "gpumon.model",
    "Evidence": "gpumon.model",
    "Advice": "gpumon.model",
    "Lever": "gpumon.model",
    # errors
    "GpumonError": "gpumon.errors",
    "NoDriverError": "gpumon.errors",
    "DeviceLostError": "gpumon.errors",
    "ProcessGoneError": "gpumon.errors",
    "TraceFormatError": "gpumon.errors",
    "ConfigError": "gpumon.errors",
    "UsageError": "gpumon.errors",
}

__all__ = [
    "DISTRIBUTION",
    "FORMATS",
    "Advice",
    "Analysis",
    "Cause",
    "ConfigError",
    "DetectorConfig",
    "DeviceLostError",
    "Episode",
    "Evidence",
    "GpuIdentity",
    "GpuProcess",
    "GpuRun",
    "GpuSample",
    "GpuVerdict",
    "GpumonError",
    "HostSample",
    "Lever",
    "LiveOptions",
    "NoDriverError",
    "ProcTreeSample",
    "ProcessGoneError",
    "ProcessSample",
    "Reason",
    "RunMemory",
    "RunSummary",
    "Session",
    "Snapshot",
    "State",
    "Tick",
    "TraceFormatError",
    "TraceHeader",
    "UsageError",
    "Verdict",
    "__version__",
    "analyze",
    "open_trace",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpumon' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # what type checkers and editors see
    from gpumon.detect.config import DetectorConfig
    from gpumon.detect.summary import GpuRun, RunSummary
    from gpumon.engine.memory import RunMemory
    from gpumon.engine.offline import Analysis, analyze
    from gpumon.engine.session import Session, Tick
    from gpumon.engine.sources import LiveOptions
    from gpumon.errors import (
        ConfigError,
        DeviceLostError,
        GpumonError,
        NoDriverError,
        ProcessGoneError,
        TraceFormatError,
        UsageError,
    )
    from gpumon.model import (
        Advice,
        Cause,
        Episode,
        Evidence,
        GpuIdentity,
        GpuProcess,
        GpuSample,
        GpuVerdict,
        HostSample,
        Lever,
        ProcessSample,
        ProcTreeSample,
        Reason,
        Snapshot,
        State,
        TraceHeader,
        Verdict,
    )
    from gpumon.traces.sniff import FORMATS, open_trace
