"""gpumon: tells people training neural networks why their GPUs are waiting."""

__version__ = "0.1.0"
