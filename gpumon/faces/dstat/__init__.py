"""`dstat --gpu`: the columns the plugin shows, and `gpumon dstat install` that puts it there."""

from gpumon.faces.dstat.install import register

__all__ = ["register"]
