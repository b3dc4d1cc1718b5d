"""Jobs found on real processes in real cgroups that the test makes as root.

A real process tree (tests/helpers/proctree.py: a parent and its workers) is started in a
cgroup shaped as a runtime or systemd makes one: a Docker container's
``docker-<id>.scope`` in the v2 hierarchy (a v2-only host's, or a hybrid host's
``unified`` one), cgroupfs's ``docker/<id>`` in a v1 hierarchy, both at once as a hybrid
host with Docker's cgroupfs driver has them, a unit's ``train.service``, a login
session's scope.  The resolver reads the machine's own /proc.  Where cgroups cannot be
made (not root, nothing mounted, read-only) the tests skip and say why; the tests of a
session-leading shell and of tmux need no cgroup.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from livelab import cgroup

from gpumon.engine import Polled, Reading, Session
from gpumon.faces.serve.config import ServeConfig
from gpumon.faces.serve.daemon import ServeState, job_options
from gpumon.faces.serve.log import EventLog
from gpumon.model import GpuIdentity, GpuProcess, GpuSample, Snapshot, TraceHeader
from gpumon.sample.containers import ContainerNames
from gpumon.sample.joblabels import JobResolver

HELPER = Path(__file__).resolve().parent / "helpers" / "proctree.py"
CID = "c0ffee" + "0" * 58
TREE = [sys.executable, str(HELPER), "0", "2", "60"]  # a parent and two sleeping workers


def needs(v1: bool = False) -> None:
    why = cgroup.unavailable(v1)
    if why is not None:
        pytest.skip(f"cgroups cannot be made here: {why}")


class Tree:
    """A running proctree: the parent's pid and its workers'."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()  # type: ignore[union-attr]
        assert line and line[0] == "ready", f"the tree did not start: {line}"
        self.workers = [int(x) for x in line[1:]]
        self.pid = self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # its handler kills the workers
        self.proc.wait(10)


@pytest.fixture
def placed() -> Iterator[list[cgroup.Placement]]:
    made: list[cgroup.Placement] = []
    yield made
    for p in made:
        p.close()


def start_in(made: list[cgroup.Placement], v2: str | None, v1: str | None = None) -> Tree:
    place = cgroup.Placement.create(v2=v2, v1=v1)
    made.append(place)
    return Tree(place.argv(TREE))


def resolver() -> JobResolver:
    return JobResolver(pod_resources=None, containers=ContainerNames((), ()))


def test_a_process_in_a_docker_scope_on_cgroup_v2(placed: list[cgroup.Placement]) -> None:
    needs()
    tree = start_in(placed, v2=f"system.slice/docker-{CID}.scope")
    try:
        text = Path(f"/proc/{tree.workers[0]}/cgroup").read_text()
        assert f"docker-{CID}.scope" in text  # the kernel placed it (and its workers)
        lb = resolver().labels(tree.workers[0])
        assert (lb.kind, lb.name, lb.container) == ("container", CID[:12], CID[:12])
        assert lb.command == f"{Path(TREE[0]).name} proctree.py"  # the program, its script
        # The worker holds the GPU; the job's top is its parent (the container's first
        # process: its parent, pytest, is in another cgroup).
        r = resolver()
        r.labels(tree.workers[0])
        assert r.root(tree.workers[0]) is not None
        assert r.root(tree.workers[0])[0] == tree.pid  # type: ignore[index]
    finally:
        tree.stop()


def test_a_process_in_a_docker_cgroup_on_cgroup_v1(placed: list[cgroup.Placement]) -> None:
    needs(v1=True)
    tree = start_in(placed, v2=None, v1=f"docker/{CID}")
    try:
        lb = resolver().labels(tree.pid)
        assert (lb.kind, lb.name) == ("container", CID[:12])
    finally:
        tree.stop()


def test_a_hybrid_hosts_docker_cgroupfs_placement(placed: list[cgroup.Placement]) -> None:
    """As ctrsploit#280 recorded: v1 says /docker/<id>, the unified line a service."""
    needs(v1=True)
    tree = start_in(placed, v2="system.slice/containerd.service", v1=f"docker/{CID}")
    try:
        text = Path(f"/proc/{tree.pid}/cgroup").read_text()
        assert "containerd.service" in text and f"/docker/{CID}" in text
        lb = resolver().labels(tree.pid)
        assert (lb.kind, lb.name) == ("container", CID[:12])
    finally:
        tree.stop()


def test_a_units_process(placed: list[cgroup.Placement]) -> None:
    needs()
    tree = start_in(placed, v2="system.slice/train.service")
    try:
        r = resolver()
        lb = r.labels(tree.workers[1])
        assert (lb.kind, lb.name) == ("unit", "train.service")
        assert r.root(tree.workers[1])[0] == tree.pid  # type: ignore[index]
    finally:
        tree.stop()


def test_a_command_below_a_session_leading_shell() -> None:
    """As an ssh login's shell runs a typed command: the job is the command, not the
    shell (and not whatever started the shell)."""
    shell = subprocess.Popen(
        ["sh", "-c", '"$@"; exit $?', "sh", *TREE],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the shell leads its session, as a login shell does
    )
    try:
        line = shell.stdout.readline().split()  # type: ignore[union-attr]
        workers = [int(x) for x in line[1:]]
        parent = int(Path(f"/proc/{workers[0]}/stat").read_text().split(") ")[1].split()[1])
        assert parent != shell.pid  # the tree's parent, below the shell
        r = resolver()
        lb = r.labels(workers[0])
        assert r.root(workers[0])[0] == parent  # type: ignore[index]
        if lb.kind in ("process", "session"):  # (a unit's or container's where tests run)
            assert lb.name == str(parent)
        assert lb.command.endswith("proctree.py")
    finally:
        os.killpg(shell.pid, 15)
        shell.wait(10)


def test_a_command_in_a_tmux_pane(tmp_path: Path) -> None:
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux is not installed")
    socket = f"gpumon-test-{os.getpid()}"
    out = tmp_path / "ready"
    cmd = " ".join([*TREE, ">", str(out)])
    subprocess.run([tmux, "-L", socket, "new-session", "-d", f"exec {cmd}"], check=True)
    try:
        deadline = time.monotonic() + 30
        while not (out.exists() and out.read_text().startswith("ready")):
            assert time.monotonic() < deadline, "the pane's command did not start"
            time.sleep(0.05)
        workers = [int(x) for x in out.read_text().split()[1:]]
        r = resolver()
        r.labels(workers[0])
        top = r.root(workers[0])
        assert top is not None
        assert top[0] not in workers  # the pane's command, the workers' parent
        stat = Path(f"/proc/{top[0]}/stat").read_text()
        parent = int(stat.split(") ")[1].split()[1])
        assert Path(f"/proc/{parent}/comm").read_text().startswith("tmux")
        assert r.labels(workers[0]).command == f"{Path(TREE[0]).name} proctree.py"
    finally:
        subprocess.run([tmux, "-L", socket, "kill-server"], check=False)


# --------------------------------------------------------------------------- the daemon

GPUS = (GpuIdentity(0, "GPU-0"), GpuIdentity(1, "GPU-1"))


def test_the_daemon_follows_a_containers_tree_from_its_top(
    placed: list[cgroup.Placement],
) -> None:
    """A worker of the container holds both GPUs: the job's tree (which the node's
    detector is given: one job holds every GPU) is the parent's, workers included."""
    needs()
    tree = start_in(placed, v2=f"system.slice/docker-{CID}.scope")
    try:
        cfg = ServeConfig()
        session = Session.offline(
            TraceHeader(1, "gpumon", gpus=GPUS), live=True, jobs=job_options(cfg),
            resolver=resolver(),
        )  # fmt: skip
        state = ServeState(session, cfg, EventLog(None))
        for i in range(3):
            t = float(i + 1)
            gpus = tuple(
                GpuSample(t_s=t, gpu=g.index, uuid=g.uuid, util_pct=90.0,
                          processes=(GpuProcess(tree.workers[0]),))
                for g in GPUS
            )  # fmt: skip
            snap = Snapshot(t_s=t, gpus=gpus)
            reading = session.read(snap)
            state.ingest(Reading(Polled(reading.polled.due, snap, 0.001), reading.jobs))
        (job,) = state.jobs.values()
        assert (job.labels.kind, job.labels.name) == ("container", CID[:12])
        assert job.detector is None  # the whole node's
        node_tree = session.jobs.whole_node_tree()  # type: ignore[union-attr]
        assert node_tree is not None and node_tree.root_pid == tree.pid
        assert {p.pid for p in node_tree.processes} == {tree.pid, *tree.workers}
    finally:
        tree.stop()
