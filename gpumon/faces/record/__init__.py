"""`gpumon record`: write a gpumon trace for later analysis."""

from gpumon.faces.record.command import register

__all__ = ["register"]
