"""gpumon's small exception tree; the CLI turns each into one clear sentence and an exit status.

Each error carries the fields a program needs to act on it (the pid, the file and line,
NVML's error code) as well as the sentence a person reads, as psutil's ``NoSuchProcess``
carries its pid: a notebook can catch ``ProcessGoneError`` and look at ``.pid`` instead
of parsing the message.
"""

from __future__ import annotations


class GpumonError(Exception):
    """Base of every error gpumon reports to a user instead of a traceback."""

    exit_status = 1


class NoDriverError(GpumonError):
    """NVML cannot be loaded or the NVIDIA kernel driver is not running.

    ``nvml_code``: NVML's error code where NVML gave one (12: library not found, 9: driver
    not loaded, 4: no permission, ...)."""

    exit_status = 3

    def __init__(self, message: str, *, nvml_code: int | None = None) -> None:
        super().__init__(message)
        self.nvml_code = nvml_code


class DeviceLostError(GpumonError):
    """A GPU fell off the bus (NVML GpuIsLost)."""

    def __init__(self, message: str, *, gpu: int | None = None, uuid: str | None = None) -> None:
        super().__init__(message)
        self.gpu = gpu
        self.uuid = uuid


class ProcessGoneError(GpumonError):
    """The process to watch does not exist, exited, or cannot be read (``pid``)."""

    exit_status = 4

    def __init__(self, message: str, *, pid: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid


class TraceFormatError(GpumonError):
    """A trace line could not be parsed; names the file and line."""

    exit_status = 2

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        where = ":".join(str(x) for x in (path, line) if x is not None)
        super().__init__(f"{where}: {message}" if where else message)
        self.path = path
        self.line = line
        self.reason = message  # without the place


class ConfigError(GpumonError):
    """An invalid configuration file or option; names the key and line."""

    exit_status = 2


class UsageError(GpumonError):
    """A command line gpumon cannot carry out as given (nothing to watch, an output file
    that already exists): the status of argparse's own usage errors."""

    exit_status = 2


class StacksUnavailableError(GpumonError):
    """``--stacks`` was asked for and py-spy cannot be run here (not installed)."""

    exit_status = 2


class StacksRefusedError(GpumonError):
    """The kernel refused to let py-spy read a process of the job (ptrace not permitted):
    the sentence names the fix that applies here (``fix``); the watch goes on without."""

    def __init__(self, message: str, *, pid: int | None = None, fix: str = "") -> None:
        super().__init__(message)
        self.pid = pid
        self.fix = fix
