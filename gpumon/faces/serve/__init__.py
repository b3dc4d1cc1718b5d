"""`gpumon serve`: the daemon (sampling loop, Prometheus collector, HTTP, JSON-lines log).

``Daemon`` (with its ``ServeConfig``) is the whole daemon over a session, for the demo to
run serve's own; imported on first use, so that other commands never load the HTTP side."""

from typing import TYPE_CHECKING, Any

from gpumon.faces.serve.command import register

if TYPE_CHECKING:
    from gpumon.faces.serve.config import ServeConfig
    from gpumon.faces.serve.runner import Daemon

__all__ = ["Daemon", "ServeConfig", "register"]


def __getattr__(name: str) -> Any:
    if name == "Daemon":
        from gpumon.faces.serve.runner import Daemon

        return Daemon
    if name == "ServeConfig":
        from gpumon.faces.serve.config import ServeConfig

        return ServeConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
