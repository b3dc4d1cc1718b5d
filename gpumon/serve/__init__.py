"""`gpumon serve`'s parts: config, job labels, the sampling daemon, collector, log, HTTP.

The face (``gpumon.faces.serve``) wires them; each part is testable on its own, on data.
"""
