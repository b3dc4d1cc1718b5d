"""Shared pytest fixtures."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fakenvml import (
    Scenario,
    build_library,
    fake_env,
    load_in_process,
    missing_library_env,
    unload_in_process,
    write_scenario,
)


# --------------------------------------------------------------------------- fake NVML
@dataclass
class FakeNvml:
    """Handle on one test's fake NVML: its scenario file and how to point pynvml at it.

    ``set()`` rewrites the scenario (atomically) while a monitor runs; the fake notices within
    ~10 ms, and ``set`` waits ``settle`` seconds so the next call sees the new world.
    """

    path: Path
    lib_dir: Path
    env: dict[str, str]
    scenario: Scenario
    _in_process: bool = field(default=False, repr=False)

    def set(self, scenario: Scenario, settle: float = 0.03) -> None:
        self.scenario = scenario
        write_scenario(self.path, scenario)
        if settle:
            time.sleep(settle)

    def load(self) -> object:
        """Make this process's pynvml use the fake (then call ``pynvml.nvmlInit()``)."""
        self._in_process = True
        return load_in_process(self.path)

    @staticmethod
    def missing_env(base_env: dict[str, str] | None = None) -> dict[str, str]:
        """A child environment in which libnvidia-ml.so.1 cannot be loaded."""
        return missing_library_env(base_env)


@pytest.fixture(scope="session")
def fake_nvml_lib() -> Path:
    """Build the fake libnvidia-ml.so.1 once per session; the path of the .so."""
    return build_library()


@pytest.fixture
def fake_nvml(tmp_path: Path, fake_nvml_lib: Path) -> Iterator[FakeNvml]:
    """A fake NVML with one default (H100-like, steady 100 %) GPU; rewrite it with ``.set()``.

    Children: ``subprocess.run(..., env=fake_nvml.env)``.  This process: ``fake_nvml.load()``
    then ``pynvml.nvmlInit()``; teardown shuts it down and resets pynvml.
    """
    scenario = Scenario()
    path = write_scenario(tmp_path / "fakenvml-scenario.txt", scenario)
    saved = os.environ.get("FAKE_NVML_SCENARIO")
    fake = FakeNvml(path=path, lib_dir=fake_nvml_lib.parent, env=fake_env(path), scenario=scenario)
    yield fake
    if fake._in_process:
        unload_in_process()
        if saved is None:
            os.environ.pop("FAKE_NVML_SCENARIO", None)
        else:
            os.environ["FAKE_NVML_SCENARIO"] = saved
