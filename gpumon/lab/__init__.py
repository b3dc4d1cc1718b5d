"""Test data made by gpumon itself: the labelled synthetic corpus and the demo trace."""
