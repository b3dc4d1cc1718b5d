"""Not code: this folder ships inside the wheel as ``gpumon.faces.deploy.files`` (see
pyproject.toml), so that `gpumon deploy DIR` can write it out for a pip-installed gpumon."""
