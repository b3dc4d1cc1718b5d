"""gpumon's small exception tree; the CLI turns each into one clear sentence and an exit status."""

from __future__ import annotations


class GpumonError(Exception):
    """Base of every error gpumon reports to a user instead of a traceback."""

    exit_status = 1


class NoDriverError(GpumonError):
    """NVML cannot be loaded or the NVIDIA kernel driver is not running."""

    exit_status = 3


class DeviceLostError(GpumonError):
    """A GPU fell off the bus (NVML GpuIsLost)."""


class ProcessGoneError(GpumonError):
    """The process to watch does not exist, exited, or cannot be read."""

    exit_status = 4


class TraceFormatError(GpumonError):
    """A trace line could not be parsed; names the file and line."""

    exit_status = 2

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        where = ":".join(str(x) for x in (path, line) if x is not None)
        super().__init__(f"{where}: {message}" if where else message)
        self.path = path
        self.line = line


class ConfigError(GpumonError):
    """An invalid configuration file or option; names the key and line."""

    exit_status = 2


class UsageError(GpumonError):
    """A command line gpumon cannot carry out as given (nothing to watch, an output file
    that already exists): the status of argparse's own usage errors."""

    exit_status = 2
