"""`gpumon serve`: the daemon (sampling loop, Prometheus collector, HTTP, JSON-lines log)."""

from gpumon.faces.serve.command import register

__all__ = ["register"]
