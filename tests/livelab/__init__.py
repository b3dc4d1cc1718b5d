"""The live lab: training jobs driving emulated GPUs, observed by gpumon's live faces.

``emulator`` (the writer side of the fake NVML's driven GPUs), ``pipeline`` (a
DataLoader-shaped input pipeline), ``truth`` (what a job did, per second, and the state it
makes), ``workloads`` (the scenarios and the job), ``runner`` (one run observed by watch,
serve and analyze), ``score`` (the faces against the truth).  See benchmarks/README.md for
the figures and examples/live_lab.py for running one scenario by hand.
"""
