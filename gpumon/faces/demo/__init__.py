"""`gpumon demo`: the live faces, replaying a bundled trace (no GPU needed)."""

from gpumon.faces.demo.command import register

__all__ = ["register"]
