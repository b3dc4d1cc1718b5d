"""`gpumon watch`: one training run, live (command, full-screen view, plain lines, summary)."""

from gpumon.faces.watch.command import register, run

__all__ = ["register", "run"]
