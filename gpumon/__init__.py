"""gpumon: tells people training neural networks why their GPUs are waiting."""

__version__ = "0.1.0"
# The distribution name, for importlib.metadata and install hints: "gpumon" on PyPI is
# another project, so this one installs as gpumon-why (the command is still `gpumon`).
DISTRIBUTION = "gpumon-why"
