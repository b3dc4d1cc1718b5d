"""Shared pytest fixtures."""

from __future__ import annotations

import fcntl
import os
import signal
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

SYSTEM_DSTAT = Path("/usr/bin/dstat")


# --------------------------------------------------------------------------- parallel runs
# The suite runs on several workers (pytest-xdist, ``-n`` in pyproject.toml).  Two rules
# keep that safe:
#
# - A module whose tests share a module-scoped fixture (a Prometheus cluster, dstat runs
#   started together, the live lab's runs) goes to one worker whole, so the fixture is
#   built once (``xdist_group``, with ``--dist loadgroup``).
# - A test marked ``owns_machine`` (the live lab, which scores gpumon against what a job
#   did second by second, and whose truth reads the machine's load) runs alone: it takes
#   the machine's lock exclusively, every other test shares it.  Nothing is timed by the
#   lock; a lab test simply waits until the others have run.


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "owns_machine: runs with no other test at once (the live lab; a test that sets "
        "machine-wide state others depend on, such as the pid cursor)",
    )
    # A suite started in the background of a script (``cmd &`` without job control) gets
    # SIGINT and SIGQUIT ignored, and every process it starts inherits that: a test's
    # Ctrl-C would then never reach gpumon or dstat.  Their processes get a terminal's.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups into node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        shared = any(
            d[-1].scope == "module" and d[-1].baseid == item.nodeid.split("::")[0]
            for d in defs.values()
            if d
        )
        if shared:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test whose group xdist did not take fails: it would build its group's fixture
    again on every worker, and after every switch of module (a pytest upgrade did this)."""
    grouped = item.get_closest_marker("xdist_group") is not None
    if grouped and item.config.getoption("loadgroup", default=False) and "@" not in item.nodeid:
        pytest.fail(
            "xdist's loadgroup ignored this test's group: this pytest and pytest-xdist "
            "do not work together (see the pin in pyproject.toml)",
            pytrace=False,
        )


def _machine_lock(config: pytest.Config) -> Path | None:
    """One lock file per run of the suite, shared by its workers (None: not parallel):
    beside their temporary folders, in the run's own (pytest removes old runs')."""
    worker = getattr(config, "workerinput", None)
    if worker is None:
        return None
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    return factory.getbasetemp().parent / f"machine-{worker['testrunuid']}.lock"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Setup, call and teardown of each test under the machine's lock (module fixtures
    are built and torn down inside them)."""
    path = _machine_lock(item.config)
    if path is None:
        yield
        return
    exclusive = item.get_closest_marker("owns_machine") is not None
    with open(path, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


# --------------------------------------------------------------------------- terminal size
@pytest.fixture(autouse=True)
def _no_inherited_terminal_size() -> None:
    """Children see no terminal size the runner did not set.

    GNU readline (loaded with pdb, which pytest imports) exports LINES and COLUMNS into the
    process's C environment, not into ``os.environ``, so every child started with the
    inherited environment would wrap its text at 80 columns, and only under pytest.  A
    test that means a width says it (``COLUMNS=80``)."""
    for name in ("COLUMNS", "LINES"):
        if name not in os.environ:
            os.unsetenv(name)


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


# --------------------------------------------------------------------------- home, dstat
@pytest.fixture
def tmp_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty $HOME for this test (``Path.home()`` follows it).

    dstat and dool load plugins from ~/.dstat and ~/.dool before any other folder, so a
    plugin left there by an earlier `gpumon dstat install` would be the one a test runs;
    and a test that installs into ~ must not leave one behind.
    """
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    return home


@dataclass(frozen=True)
class SystemDstat:
    """/usr/bin/dstat, and why the Python-plugin tests cannot use it (None: they can).

    They need Dag Wieers' dstat 0.7; where /usr/bin/dstat is pcp-dstat (Debian with pcp,
    RHEL, Fedora) Python plugins do not load: test_dstat_pcp.py covers that one.
    """

    path: Path
    unusable: str | None

    def require(self) -> Path:
        if self.unusable:
            pytest.skip(self.unusable)
        return self.path


@pytest.fixture(scope="session")
def system_dstat() -> SystemDstat:
    from gpumon.faces.dstat.install import _is_pcp_dstat

    why = None
    if not SYSTEM_DSTAT.exists():
        why = "dstat is not installed (apt-get install dstat)"
    elif _is_pcp_dstat(SYSTEM_DSTAT):
        why = (
            f"{SYSTEM_DSTAT} is pcp-dstat, which loads ini plugins, not Python ones: these "
            "tests need Debian's dstat 0.7 (test_dstat_pcp.py covers pcp-dstat)"
        )
    return SystemDstat(SYSTEM_DSTAT, why)


@pytest.fixture
def classic_dstat(system_dstat: SystemDstat) -> Path:
    """/usr/bin/dstat where it is the classic dstat; the test skips, saying why, elsewhere."""
    return system_dstat.require()
