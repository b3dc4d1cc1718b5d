"""`gpumon watch`: one training run, live (command, full-screen view, plain lines, summary)."""

from gpumon.faces.watch.command import WatchOptions, register, run, watch

__all__ = ["WatchOptions", "register", "run", "watch"]
