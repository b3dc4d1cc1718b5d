"""`gpumon deploy DIR`: write the deployment files shipped inside the package."""

from gpumon.faces.deploy.command import register

__all__ = ["register"]
