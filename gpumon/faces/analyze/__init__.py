"""`gpumon analyze`: a recorded trace or an existing log, judged and reported."""

from gpumon.faces.analyze.command import register

__all__ = ["register"]
