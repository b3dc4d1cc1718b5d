"""The ``build`` group: what gpumon is and what it runs on (``gpumon_build_info``)."""

from __future__ import annotations

from prometheus_client.core import InfoMetricFamily, Metric

from gpumon.faces.serve.buildinfo import build_labels
from gpumon.faces.serve.collectors.base import GroupCollector, Inputs


class BuildCollector(GroupCollector):
    """gpumon's version and commit, its Python, the NVML library and driver."""

    group = "build"
    names = ("gpumon_build_info",)

    def __init__(self, inputs: Inputs) -> None:
        super().__init__(inputs)
        st = inputs.state
        self._labels = build_labels(st.version, st.session.nvml_version, st.driver_version)

    def collect(self) -> list[Metric]:
        info = InfoMetricFamily(
            "gpumon_build",
            "gpumon's version and commit, the Python it runs on, the NVML library and driver.",
            value=self._labels,
        )
        return [info]
