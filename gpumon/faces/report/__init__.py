"""`gpumon report`: one job across its nodes, judged from the Prometheus that scrapes them."""

from gpumon.faces.report.command import register

__all__ = ["register"]
