"""The job of every GPU process on a node without a scheduler: a fake /proc of the shapes
real nodes have (an ssh login, tmux, a unit, Docker and Podman containers, a nohup'd
process), and the daemon's path from a GPU's pids to the job series.

Each process of the fake /proc has a ``stat`` line as the kernel writes it (the name in
parentheses, then state, ppid, pgrp, session, ..., start time as field 22), its
``cgroup`` text, ``cmdline`` and, where a test says, ``environ``.  Real processes in
cgroups a test creates are in test_jobs_real_cgroups.py.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from gpumon.engine import Polled, Reading, Session
from gpumon.engine.jobs import MAX_JOBS_PER_GPU, JobTracker
from gpumon.faces.serve.collector import make_registry
from gpumon.faces.serve.config import ServeConfig
from gpumon.faces.serve.daemon import ServeState, job_options
from gpumon.faces.serve.log import EventLog
from gpumon.model import GpuIdentity, GpuProcess, GpuSample, JobLabels, Snapshot, TraceHeader
from gpumon.sample.containers import ContainerNames
from gpumon.sample.joblabels import RECHECK_S, JobResolver, host_pid_namespace
from gpumon.sample.podresources import Holder

ME = pwd.getpwuid(os.getuid()).pw_name  # who owns the fake /proc's files
CID = "3f" * 32
SESSION = "0::/user.slice/user-1000.slice/session-3.scope\n"
SSHD = "0::/system.slice/ssh.service\n"
INIT = "0::/init.scope\n"


@dataclass
class P:
    """A process of the fake /proc."""

    pid: int
    name: str
    ppid: int
    cgroup: str
    argv: tuple[str, ...] = ()
    session: int = 0  # 0: the parent's session (set by FakeProc.add)
    start: int = 0  # 0: derived from the pid
    environ: bytes | None = None


@dataclass
class FakeProc:
    root: Path
    procs: dict[int, P] = field(default_factory=dict)

    def add(self, *procs: P) -> None:
        for p in procs:
            if not p.session:
                parent = self.procs.get(p.ppid)
                p.session = parent.session if parent else p.pid
            if not p.start:
                p.start = 1000 + p.pid
            self.procs[p.pid] = p
            self.write(p)

    def write(self, p: P) -> None:
        d = self.root / str(p.pid)
        d.mkdir(parents=True, exist_ok=True)
        rest = " ".join(["0"] * 15)  # tty_nr .. itrealvalue (fields 7-21)
        (d / "stat").write_text(
            f"{p.pid} ({p.name}) S {p.ppid} {p.pid} {p.session} {rest} {p.start} 1 2 3\n"
        )
        (d / "cgroup").write_text(p.cgroup)
        (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in p.argv))
        if p.environ is not None:
            (d / "environ").write_bytes(p.environ)

    def resolver(self, **kw: object) -> JobResolver:
        kw.setdefault("pod_resources", None)
        kw.setdefault("containers", ContainerNames((), ()))
        return JobResolver(procfs=str(self.root), **kw)  # type: ignore[arg-type]


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    fp = FakeProc(tmp_path / "proc")
    fp.add(P(1, "systemd", 0, INIT, ("/sbin/init",), session=1))
    return fp


def ssh_login(fp: FakeProc) -> None:
    """sshd -> sshd-session -> the login shell (leads session 900) in session-3.scope."""
    fp.add(
        P(800, "sshd", 1, SSHD, ("sshd: /usr/sbin/sshd -D",), session=800),
        P(900, "sshd-session", 800, SESSION, ("sshd-session: alice@pts/0",), session=900),
        P(1000, "bash", 900, SESSION, ("-bash",), session=1000),
    )


# --------------------------------------------------------------------------- ancestry


def test_a_command_typed_in_an_ssh_session_is_its_own_job(proc: FakeProc) -> None:
    ssh_login(proc)
    proc.add(
        P(1100, "python3", 1000, SESSION, ("/usr/bin/python3", "-u", "train.py", "--lr", "3")),
        P(1101, "pt_data_worker", 1100, SESSION, ("/usr/bin/python3", "-u", "train.py")),
    )
    r = proc.resolver()
    want = JobLabels(kind="session", name="1100", user=ME, command="python3 train.py")
    assert r.labels(1100) == want  # not the shell, not sshd; no argument leaks
    assert r.root(1100) == (1100, 2100)  # the process `gpumon watch --pid` would be given


def test_a_launchers_ranks_are_one_job_rooted_at_the_launcher(proc: FakeProc) -> None:
    ssh_login(proc)
    proc.add(
        P(1200, "torchrun", 1000, SESSION, ("/opt/venv/bin/torchrun", "--nproc", "2", "t.py")),
        # torchrun starts each rank in a session of its own: still the launcher's job.
        P(1201, "python", 1200, SESSION, ("python", "t.py"), session=1201),
        P(1202, "python", 1200, SESSION, ("python", "t.py"), session=1202),
    )
    r = proc.resolver()
    assert r.labels(1201) == r.labels(1202)
    assert r.labels(1201).name == "1200" and r.labels(1201).command == "torchrun t.py"
    assert r.root(1201) == r.root(1202) == (1200, 2200)


def test_a_script_run_from_the_shell_is_part_of_the_job(proc: FakeProc) -> None:
    ssh_login(proc)
    proc.add(
        P(1300, "bash", 1000, SESSION, ("bash", "run.sh")),  # not a session leader
        P(1301, "python", 1300, SESSION, ("python", "-m", "trainer.main", "--cfg", "a.yml")),
    )
    r = proc.resolver()
    assert r.labels(1301).name == "1300"
    assert r.labels(1301).command == "bash run.sh"


def test_a_tmux_pane_and_a_nohup_process(proc: FakeProc) -> None:
    pane = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/tmux-spawn-1.scope\n"
    proc.add(
        P(2000, "tmux: server", 1, pane, ("tmux",), session=2000),
        P(2001, "zsh", 2000, pane, ("-zsh",), session=2001),
        P(2002, "python", 2001, pane, ("python", "-m", "torch.distributed.run", "x.py")),
        # A nohup'd job whose login ended: re-parented to init, in the root cgroup.
        P(3000, "python", 1, "0::/\n", ("python", "train.py"), session=3000),
    )
    r = proc.resolver()
    assert r.labels(2002) == JobLabels(
        kind="session", name="2002", user=ME, command="python -m torch.distributed.run"
    )
    assert r.labels(3000) == JobLabels(
        kind="process", name="3000", user=ME, command="python train.py"
    )


def test_a_unit_is_its_own_job_rooted_at_its_top_process(proc: FakeProc) -> None:
    unit = "0::/system.slice/train.service\n"
    proc.add(
        P(4000, "bash", 1, unit, ("/bin/bash", "/opt/train.sh"), session=4000),
        P(4001, "python", 4000, unit, ("python", "/opt/train.py")),
    )
    r = proc.resolver()
    assert r.labels(4001) == JobLabels(
        kind="unit", name="train.service", user=ME, command="python train.py"
    )
    # The unit's script leads its session (systemd starts each service in one): the
    # process below it is the job's main process, as a pane's command is.
    assert r.root(4001) == (4001, 5001)


def test_units_and_containers_can_be_turned_off(proc: FakeProc) -> None:
    unit = "0::/system.slice/train.service\n"
    docker = f"0::/system.slice/docker-{CID}.scope\n"
    proc.add(
        P(4100, "python", 1, unit, ("python", "a.py"), session=4100),
        P(4200, "containerd-shim", 1, "0::/system.slice/containerd.service\n", ("shim",)),
        P(4201, "python", 4200, docker, ("python", "b.py"), session=4201),
    )
    r = proc.resolver(sources=("processes",))
    assert (r.labels(4100).kind, r.labels(4100).name) == ("process", "4100")
    assert (r.labels(4201).kind, r.labels(4201).name) == ("process", "4201")
    assert not proc.resolver(sources=("slurm",)).labels(4100).known


# --------------------------------------------------------------------------- containers


def test_a_docker_container_is_named_from_dockers_files(proc: FakeProc, tmp_path: Path) -> None:
    docker = f"0::/system.slice/docker-{CID}.scope\n"
    shim = "0::/system.slice/containerd.service\n"
    proc.add(
        P(5000, "containerd-shim", 1, shim, ("/usr/bin/containerd-shim-runc-v2",)),
        P(5001, "tini", 5000, docker, ("/tini", "--", "python", "train.py"), session=5001),
        P(5002, "python", 5001, docker, ("python", "train.py")),
    )
    data_root = tmp_path / "docker"
    (data_root / "containers" / CID).mkdir(parents=True)
    config = {"ID": CID, "Name": "/trainer", "Config": {"Hostname": CID[:12], "Env": ["A=1"]}}
    (data_root / "containers" / CID / "config.v2.json").write_text(json.dumps(config))
    r = proc.resolver(containers=ContainerNames([str(data_root)], ()))
    want = JobLabels(
        container="trainer", kind="container", name="trainer", user=ME, command="python train.py"
    )
    assert r.labels(5002) == want
    assert r.root(5002) == (5002, 6002)  # below the container's init (tini)
    # No file to read (not root, another data root): the id, as `docker ps` shows it.
    bare = proc.resolver()
    assert bare.labels(5002).name == CID[:12] == bare.labels(5002).container


def test_a_rootless_podman_container_is_named_from_containers_storage(
    proc: FakeProc, tmp_path: Path
) -> None:
    cg = (
        "0::/user.slice/user-1000.slice/user@1000.service/user.slice/"
        f"libpod-{CID}.scope/container\n"
    )
    proc.add(
        P(6000, "conmon", 1, "0::/user.slice/user-1000.slice/user@1000.service/app.slice\n"),
        P(6001, "python", 6000, cg, ("python", "train.py"), session=6001),
    )
    storage = tmp_path / "storage"
    (storage / "overlay-containers").mkdir(parents=True)
    listing = [{"id": "0" * 64, "names": ["other"]}, {"id": CID, "names": ["bert", "b2"]}]
    (storage / "overlay-containers" / "containers.json").write_text(json.dumps(listing))
    r = proc.resolver(containers=ContainerNames((), [str(storage)]))
    assert r.labels(6001).name == "bert" and r.labels(6001).kind == "container"


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b'{"Name": 7}', b"[]", b'"x"', b"\xff\xfe", b'{"Name": "/' + b"n" * 500 + b'"}'],
)
def test_a_broken_runtime_file_leaves_the_id(
    proc: FakeProc, tmp_path: Path, content: bytes
) -> None:
    proc.add(P(7000, "python", 1, f"0::/docker/{CID}\n", ("python", "x.py"), session=7000))
    folder = tmp_path / "docker" / "containers" / CID
    folder.mkdir(parents=True)
    (folder / "config.v2.json").write_bytes(content)
    name = proc.resolver(containers=ContainerNames([str(tmp_path / "docker")], ())).labels(7000)
    assert name.name in (CID[:12], "n" * 63 + "…")  # a long name is cut, not refused
    assert len(name.name) <= 64


def test_a_runtime_file_that_is_a_fifo_or_a_link_is_not_read(
    proc: FakeProc, tmp_path: Path
) -> None:
    proc.add(P(7100, "python", 1, f"0::/docker/{CID}\n", ("python", "x.py"), session=7100))
    folder = tmp_path / "docker" / "containers" / CID
    folder.mkdir(parents=True)
    os.mkfifo(folder / "config.v2.json")  # a read would block forever
    r = proc.resolver(containers=ContainerNames([str(tmp_path / "docker")], ()))
    assert r.labels(7100).name == CID[:12]
    (folder / "config.v2.json").unlink()
    secret = tmp_path / "secret.json"
    secret.write_text('{"Name": "/leaked"}')
    (folder / "config.v2.json").symlink_to(secret)
    r = proc.resolver(containers=ContainerNames([str(tmp_path / "docker")], ()))
    assert r.labels(7100).name == CID[:12]


# --------------------------------------------------------------------------- hostile input


def test_an_id_from_the_environment_is_bounded_and_validated(proc: FakeProc) -> None:
    """Issue 36: a 120 KB SLURM_JOB_ID became a label on every job series."""
    huge = b"SLURM_JOB_ID=" + b"9" * 120_000 + b"\0"
    proc.add(
        P(8000, "python", 1, "0::/\n", ("python", "a.py"), session=8000, environ=huge),
        P(8001, "python", 1, "0::/\n", ("python", "b.py"), session=8001,
          environ=b"SLURM_JOB_ID=12 34\0SLURM_JOB_USER=x\x1b]0;y\0"),
        P(8002, "python", 1, "0::/\n", ("python", "c.py"), session=8002,
          environ=b"SLURM_JOB_ID=4242\0SLURM_JOB_USER=al\x07ice\0"),
        P(8003, "python", 1, f"0::/kubepods/pod{'0' * 8}-0000-0000-0000-{'0' * 12}/{CID}\n",
          ("python", "d.py"), session=8003,
          environ=b"HOSTNAME=" + b"a" * 300 + b"\0POD_NAMESPACE=Not_A_Namespace\0"),
    )  # fmt: skip
    r = proc.resolver()
    for pid in (8000, 8001):
        lb = r.labels(pid)
        assert lb.hpc_job == "" and lb.kind == "process", lb  # no id: a plain process
    ok = r.labels(8002)
    assert (ok.hpc_job, ok.kind, ok.user) == ("4242", "slurm", ME)  # a user name not shaped
    pod = r.labels(8003)
    assert pod.pod == "00000000-0000-0000-0000-000000000000" and pod.namespace == ""
    for pid in (8000, 8001, 8002, 8003):
        assert all(len(v) <= 253 for v in r.labels(pid).as_dict().values())


def test_text_from_a_process_is_bounded_and_printable(proc: FakeProc) -> None:
    unit = "0::/system.slice/" + "u" * 300 + ".service\n"
    proc.add(P(8100, "py\x1b[2J", 1, unit, ("/x/" + "p" * 500 + "\x1b]0;t\x07", "a.py")))
    lb = proc.resolver().labels(8100)
    assert len(lb.name) <= 64 and lb.name.endswith("…")
    assert len(lb.command) <= 64 and "\x1b" not in lb.command and "\x07" not in lb.command


# --------------------------------------------------------------------------- pid reuse


def test_a_reused_pid_is_read_afresh(proc: FakeProc) -> None:
    """Issue 36: a pid reused by another job kept the old job's label (the cache was keyed
    by pid alone)."""
    now = [0.0]
    proc.add(P(9000, "python", 1, "0::/\n", ("python", "a.py"), session=9000,
               environ=b"SLURM_JOB_ID=111\0"))  # fmt: skip
    r = proc.resolver(clock=lambda: now[0])
    assert r.labels(9000).hpc_job == "111"
    # Job 111 ends; job 222's process gets pid 9000 (a new start time) while NVML lists it.
    proc.add(P(9000, "python", 1, "0::/\n", ("python", "b.py"), session=9000, start=7777,
               environ=b"SLURM_JOB_ID=222\0"))  # fmt: skip
    assert r.recheck() == frozenset()  # not due yet: nothing read
    assert r.labels(9000).hpc_job == "111"
    now[0] += RECHECK_S
    assert r.recheck() == {9000}
    assert r.labels(9000).hpc_job == "222"
    reads = r.reads
    now[0] += RECHECK_S
    assert r.recheck() == frozenset() and r.labels(9000).hpc_job == "222"
    assert r.reads == reads  # the same process: its labels not read again


# --------------------------------------------------------------------------- pid namespaces


def test_a_pid_namespace_of_its_own_is_detected(tmp_path: Path) -> None:
    (tmp_path / "self" / "ns").mkdir(parents=True)
    (tmp_path / "self" / "ns" / "pid").symlink_to("pid:[4026531836]")
    assert host_pid_namespace(str(tmp_path)) is True
    (tmp_path / "self" / "ns" / "pid").unlink()
    (tmp_path / "self" / "ns" / "pid").symlink_to("pid:[4026532719]")
    assert host_pid_namespace(str(tmp_path)) is False
    assert host_pid_namespace(str(tmp_path / "nowhere")) is None


class OneHolder:
    def __init__(self, uuid: str) -> None:
        self.uuid = uuid

    def devices(self) -> dict[str, tuple[Holder, ...]]:
        return {self.uuid: (Holder("ml", "bert-0", "trainer"),)}


def test_in_a_pid_namespace_of_its_own_nothing_is_read_and_it_is_said_once(
    proc: FakeProc, caplog: pytest.LogCaptureFixture
) -> None:
    # pid 9100 here is some process of gpumon's own container, not NVML's pid 9100.
    proc.add(P(9100, "python", 1, "0::/\n", ("python", "x.py"), session=9100,
               environ=b"SLURM_JOB_ID=5\0"))  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="gpumon.jobs"):
        r = proc.resolver(host_pids=False, pod_resources=OneHolder("GPU-a"))
        assert r.labels(9100) == JobLabels()
        assert r.labels(9101, "GPU-a").pod == "bert-0"  # the kubelet names the GPU's pod
        r.labels(9102)
    said = [rec for rec in caplog.records if rec.name == "gpumon.jobs"]
    assert len(said) == 1 and "hostPID" in said[0].getMessage()
    assert r.notice is not None and "pid namespace of its own" in r.notice


def test_the_real_proc_tells_its_own_pid_namespace() -> None:
    with open("/proc/self/status") as f:
        nspid = next(line.split()[1:] for line in f if line.startswith("NSpid:"))
    # One NSpid field: this process is in the namespace /proc was mounted for.
    expected = host_pid_namespace() if len(nspid) == 1 else False
    assert JobResolver(pod_resources=None).host_pids is (expected is not False)


# --------------------------------------------------------------------------- the daemon

GPUS = (GpuIdentity(0, "GPU-0"), GpuIdentity(1, "GPU-1"))


def serve(
    procfs: Path, cfg: ServeConfig | None = None, clock: Callable[[], float] = time.monotonic
) -> ServeState:
    cfg = cfg or ServeConfig(process_trees=False)
    session = Session.offline(
        TraceHeader(1, "gpumon", gpus=GPUS),
        live=True,
        jobs=job_options(cfg),
        resolver=JobResolver(procfs=str(procfs), pod_resources=None, clock=clock),
    )
    return ServeState(session, cfg, EventLog(None))


def tick(state: ServeState, t: float, pids: dict[int, tuple[int, ...]]) -> None:
    gpus = tuple(
        GpuSample(t_s=t, gpu=g.index, uuid=g.uuid, util_pct=90.0,
                  processes=tuple(GpuProcess(p) for p in pids.get(g.index, ())))
        for g in GPUS
    )  # fmt: skip
    snap = Snapshot(t_s=t, gpus=gpus)
    reading = state.session.read(snap)
    state.ingest(Reading(Polled(reading.polled.due, snap, 0.001), reading.jobs))


def series(state: ServeState, name: str) -> list[str]:
    text = generate_latest(make_registry(state)).decode()  # type: ignore[arg-type]
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_the_daemons_series_name_each_job(proc: FakeProc) -> None:
    ssh_login(proc)
    docker = f"0::/system.slice/docker-{CID}.scope\n"
    proc.add(
        P(1100, "python3", 1000, SESSION, ("python3", "train.py")),
        P(5000, "containerd-shim", 1, "0::/system.slice/containerd.service\n", ("shim",)),
        P(5001, "python", 5000, docker, ("python", "serve.py"), session=5001),
    )
    state = serve(proc.root)
    tick(state, 1.0, {0: (1100,), 1: (5001,)})
    info = series(state, "gpumon_gpu_job_info")
    assert len(info) == 2, info
    assert 'gpu="0"' in info[0] and 'job_kind="session"' in info[0]
    assert 'job_name="1100"' in info[0] and 'command="python3 train.py"' in info[0]
    assert f'user="{ME}"' in info[0]
    assert f'container="{CID[:12]}"' in info[1] and 'job_kind="container"' in info[1]
    states = [ln for ln in series(state, "gpumon_job_state") if ln.endswith(" 1.0")]
    assert len(states) == 2 and any('job_name="1100"' in ln for ln in states)
    # Two jobs on the node: its GPUs are not one job's peers.
    assert state.session.jobs is not None and not state.session.jobs.one_job()


def test_a_busy_gpu_lists_a_bounded_number_of_jobs(proc: FakeProc) -> None:
    pids = tuple(range(20_000, 20_000 + 3 * MAX_JOBS_PER_GPU))
    for pid in pids:  # each its own job (nohup'd, re-parented to init)
        proc.add(P(pid, "python", 1, "0::/\n", ("python", f"j{pid}.py"), session=pid))
    state = serve(proc.root, ServeConfig(process_trees=False, max_jobs=8))
    tick(state, 1.0, {0: pids})
    assert len(series(state, "gpumon_gpu_job_info")) == MAX_JOBS_PER_GPU
    assert len(state.jobs) == 8
    assert state.jobs_dropped_total == MAX_JOBS_PER_GPU - 8


def test_a_reused_pid_on_a_gpu_changes_its_job(proc: FakeProc) -> None:
    """The daemon's path: NVML keeps listing pid 9000 while its process is replaced."""
    proc.add(P(9000, "python", 1, "0::/\n", ("python", "a.py"), session=9000,
               environ=b"SLURM_JOB_ID=111\0"))  # fmt: skip
    now = [0.0]
    state = serve(proc.root, clock=lambda: now[0])
    assert isinstance(state.session.jobs, JobTracker)
    tick(state, 1.0, {0: (9000,)})
    assert [j.labels.hpc_job for j in state.jobs.values()] == ["111"]
    proc.add(P(9000, "python", 1, "0::/\n", ("python", "b.py"), session=9000, start=7777,
               environ=b"SLURM_JOB_ID=222\0"))  # fmt: skip
    now[0] += RECHECK_S
    tick(state, 2.0, {0: (9000,)})
    assert [lb.hpc_job for lb in state.jobs_of(0)] == ["222"]
    assert "222" in {j.labels.hpc_job for j in state.jobs.values()}
