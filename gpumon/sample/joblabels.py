"""Which job a GPU process belongs to, on any node: Slurm, Kubernetes, a container, a
systemd unit, a login session, or a process tree someone started.

NVML gives pids only; a node's state per job needs jobs, so that a job's own process tree
names the cause of its GPUs' waits (as ``gpumon watch --pid`` does) and a multi-node job
can be followed from node to node.  Sources, in order:

- the kubelet's pod-resources socket (``sample/podresources.py``), where it is mounted and
  grpcio installed: the pod, namespace and container *names* of whoever holds the GPU
  the process is on.  A process counts as a pod's only if its cgroup says it is in one
  (or cannot be read), so a host process on a pod's GPU is not given the pod's labels;
  a GPU two pods share (time-slicing) is told apart by the pod name in the environment.
- ``/proc/PID/cgroup`` (``sample/cgroups.py``, any reader): a Slurm job's ``job_<id>``, a
  pod's ``kubepods.../pod<uid>/<container id>``, a Docker/Podman/containerd/CRI-O
  container's scope, a systemd unit, a login session's scope; cgroup v1, v2 and hybrid.
- ``/proc/PID/environ`` (root, or ``CAP_SYS_PTRACE``): ``SLURM_JOB_ID``, ``SLURM_JOB_USER``;
  in a pod ``HOSTNAME`` (the pod's name) and ``POD_NAMESPACE`` where the downward API sets
  it; each must have its id's shape (``sample/jobvalues.py``) or is taken as absent.
- ``/proc/PID/root/var/run/secrets/kubernetes.io/serviceaccount/namespace``: the pod's
  namespace, mounted in every pod that has a service account token.
- the process's ancestors (``sample/ancestry.py``): the job's top process, below the
  session leader, sshd, tmux, a container's shim or init, or its cgroup's edge; its user
  and command label the job, and its tree is the job's (``engine/jobs.py``).
- a container runtime's files (``sample/containers.py``): the container's name.

NVML's pids are the host's (the initial pid namespace's).  Where gpumon runs in a pid
namespace of its own (a container without ``hostPID``), /proc/PID names other processes
or none: nothing is read from /proc then (the kubelet's answer by GPU still names pods),
and that is said once, on the ``gpumon.jobs`` logger.

Each pid is read once, when it first appears on a GPU, and cached by pid and start time
until it leaves every GPU's process list; every ``RECHECK_S`` the start time of each
cached pid is read again (one small read each), so a pid reused by another process while
it stays listed is read afresh.  The kubelet is asked when a new pid needs it, at most
once per ``POD_RESOURCES_MAX_AGE_S`` (new pids of one tick share an answer), and not for
``POD_RESOURCES_BACKOFF_S`` after it failed.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from gpumon.model import JobLabels
from gpumon.sample import cgroups
from gpumon.sample.ancestry import ProcFacts, parse_stat, top_of_job
from gpumon.sample.containers import ContainerNames
from gpumon.sample.jobvalues import (
    NAME_MAX,
    NAMESPACE,
    POD_NAME,
    SLURM_JOB_ID,
    USER_NAME,
    UserNames,
    bounded,
    env_id,
    short_command,
)
from gpumon.sample.podresources import (
    SOCKET,
    DeviceMap,
    Holder,
    PodResourcesClient,
    PodResourcesError,
    grpc_available,
)

_SA_NAMESPACE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"
_ENV_LIMIT = 1 << 20
_CMDLINE_LIMIT = 64 << 10
_CGROUP_LIMIT = 64 << 10
POD_RESOURCES_MAX_AGE_S = 1.0
POD_RESOURCES_BACKOFF_S = 30.0
RECHECK_S = 5.0
# The initial pid namespace's inode (the kernel's PROC_PID_INIT_INO): NVML's pids are its.
INITIAL_PID_NS = 0xEFFFFFFC
# Where every kind of job comes from; all on by default (a node runs what it runs).
SOURCES = ("slurm", "kubernetes", "containers", "units", "processes")
_NS_LINK = re.compile(r"pid:\[([0-9]+)\]")

NO_JOB = JobLabels()
log = logging.getLogger("gpumon.jobs")


def parse_cgroup(text: str) -> tuple[str, str, str]:
    """(Slurm job id, pod uid, the pod's container id's first 12 digits) of a
    /proc/PID/cgroup text; "" where absent."""
    place = cgroups.parse(text)
    job = place.slurm_job if place.slurm_numeric else ""
    container = place.container_id[:12] if place.pod_uid else ""
    return job, place.pod_uid, container


def parse_environ(data: bytes) -> dict[str, str]:
    """The few variables we use from a NUL-separated /proc/PID/environ."""
    wanted = (b"SLURM_JOB_ID=", b"SLURM_JOB_USER=", b"HOSTNAME=", b"POD_NAMESPACE=", b"POD_NAME=")
    out: dict[str, str] = {}
    for item in data.split(b"\0"):
        for w in wanted:
            if item.startswith(w):
                out[w[:-1].decode()] = item[len(w) :].decode(errors="replace")
    return out


def host_pid_namespace(procfs: str = "/proc") -> bool | None:
    """Whether this process sees the initial pid namespace's pids (NVML's): None where
    it cannot tell (no ns link)."""
    try:
        m = _NS_LINK.fullmatch(os.readlink(f"{procfs}/self/ns/pid"))
    except OSError:
        return None
    return None if m is None else int(m.group(1)) == INITIAL_PID_NS


class DeviceSource(Protocol):
    """Where GPU holders come from (``PodResourcesClient``; tests may pass their own)."""

    def devices(self) -> DeviceMap: ...


def default_pod_resources(sources: frozenset[str]) -> DeviceSource | None:
    """The kubelet's socket where it is mounted and grpcio can ask it; else None."""
    if "kubernetes" in sources and os.path.exists(SOCKET) and grpc_available():
        return PodResourcesClient(SOCKET)
    return None


Root = tuple[int, int]  # a process: (pid, start time in clock ticks since boot)


@dataclass(frozen=True, slots=True)
class _Entry:
    start: int | None  # the process's start time; None: not readable
    labels: JobLabels
    root: Root | None  # the job's top process, where its ancestors were followed


class JobResolver:
    """Pid -> JobLabels, read once per process and cached while it is on a GPU."""

    def __init__(
        self,
        sources: Iterable[str] = SOURCES,
        *,
        procfs: str = "/proc",
        max_cached: int = 4096,
        pod_resources: DeviceSource | Literal["auto"] | None = "auto",
        clock: Callable[[], float] = time.monotonic,
        containers: ContainerNames | None = None,
        host_pids: bool | None = None,
    ) -> None:
        self.sources = frozenset(sources)
        self.procfs = procfs
        self.max_cached = max_cached
        self.pod_resources = (
            default_pod_resources(self.sources) if pod_resources == "auto" else pod_resources
        )
        self._clock = clock
        self._devices: DeviceMap = {}
        self._devices_at: float | None = None  # when last asked (answer or failure)
        self._devices_failed = False
        self.pod_resources_errors = 0
        self.pod_resources_error: str | None = None  # the last failure
        self.containers = containers if containers is not None else ContainerNames()
        self._container_names: dict[str, str] = {}
        self._users = UserNames()
        if host_pids is None:
            host_pids = procfs != "/proc" or host_pid_namespace(procfs) is not False
        self.host_pids = host_pids
        self.notice: str | None = None  # said once, on the gpumon.jobs logger
        if not host_pids and self.sources:
            self._say(
                "gpumon runs in a pid namespace of its own (a container without the host's "
                "pids): NVML names GPU processes by the host's pids, which name no process "
                "here, so jobs are not found from /proc (only the kubelet's GPU assignments "
                "name pods); run it with the host's pid namespace (hostPID: true, docker "
                "run --pid=host)."
            )
        self._cache: OrderedDict[int, _Entry] = OrderedDict()
        self._checked_at = clock()
        self.reads = 0  # for tests: how often /proc was actually read

    def labels(self, pid: int, gpu_uuid: str | None = None) -> JobLabels:
        """The job of ``pid``; ``gpu_uuid`` (a GPU it is on) lets the kubelet name it."""
        return self._entry(pid, gpu_uuid).labels

    def root(self, pid: int) -> Root | None:
        """The top process of ``pid``'s job (cached: no read), where its ancestors were
        followed (None for Slurm jobs and pods: their trees start at their lowest pid)."""
        hit = self._cache.get(pid)
        return None if hit is None else hit.root

    def _entry(self, pid: int, gpu_uuid: str | None) -> _Entry:
        hit = self._cache.get(pid)
        if hit is not None:
            self._cache.move_to_end(pid)
            return hit
        entry = self._read(pid, gpu_uuid) if self.sources else _Entry(None, NO_JOB, None)
        self._cache[pid] = entry
        while len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)
        return entry

    def retain(self, pids: Iterable[int]) -> None:
        """Forget every pid not in ``pids`` (they left the GPUs; the pid may be reused)."""
        keep = set(pids)
        for pid in [p for p in self._cache if p not in keep]:
            del self._cache[pid]

    def recheck(self) -> frozenset[int]:
        """Every ``RECHECK_S``: the cached pids whose process changed (another start time:
        the pid was reused), forgotten so that they are read afresh."""
        now = self._clock()
        if now - self._checked_at < RECHECK_S or not self.host_pids:
            return frozenset()
        self._checked_at = now
        changed = [
            pid
            for pid, entry in self._cache.items()
            if entry.start is not None and self._start(pid) != entry.start
        ]
        for pid in changed:
            del self._cache[pid]
        return frozenset(changed)

    def __len__(self) -> int:
        return len(self._cache)

    # --- reads: each failure just leaves that label empty ---------------------------------

    def _read(self, pid: int, gpu_uuid: str | None) -> _Entry:
        self.reads += 1
        facts = self._facts(pid) if self.host_pids else None
        cgroup = facts.cgroups if facts is not None else None
        if facts is None and self.host_pids:  # a stat gpumon cannot read: its cgroups still
            cgroup = _read_text(f"{self.procfs}/{pid}/cgroup", _CGROUP_LIMIT)
        place = cgroups.parse(cgroup or "")
        start = None if facts is None else facts.start_ticks
        labels = self._scheduled(pid, place, cgroup is None, gpu_uuid)
        if labels is not None or facts is None:
            return _Entry(start, labels or NO_JOB, None)
        return self._placed(facts, place)

    def _scheduled(
        self, pid: int, place: cgroups.Placement, unread: bool, gpu_uuid: str | None
    ) -> JobLabels | None:
        """A Slurm job's or a pod's labels; None where the process is neither's."""
        want_slurm = "slurm" in self.sources
        want_k8s = "kubernetes" in self.sources
        pod_uid = place.pod_uid if want_k8s else ""
        holders: tuple[Holder, ...] = ()
        if want_k8s and gpu_uuid and (pod_uid or unread):
            holders = self._holders(gpu_uuid)
        numeric = want_slurm and place.slurm_numeric
        env: dict[str, str] = {}
        if self.host_pids and (
            (want_slurm and not numeric) or pod_uid or (want_k8s and len(holders) > 1)
        ):
            raw = _read_bytes(f"{self.procfs}/{pid}/environ", _ENV_LIMIT)
            env = parse_environ(raw) if raw else {}
        hpc_job = ""
        if want_slurm:
            hpc_job = (
                (place.slurm_job if numeric else "")
                or env_id(env.get("SLURM_JOB_ID"), SLURM_JOB_ID)
                or place.slurm_job
            )
        pod_name = env_id(env.get("POD_NAME"), POD_NAME) or env_id(env.get("HOSTNAME"), POD_NAME)
        holder = _pick(holders, pod_name)
        pod = namespace = container = ""
        if holder is not None:
            pod, namespace, container = holder.pod, holder.namespace, holder.container
        elif pod_uid:
            pod, container = pod_name or pod_uid, place.container_id[:12]
            namespace = env_id(env.get("POD_NAMESPACE"), NAMESPACE) or env_id(
                (_read_text(f"{self.procfs}/{pid}/root/{_SA_NAMESPACE}", 256) or "").strip(),
                NAMESPACE,
            )
        if not (hpc_job or pod):
            return None
        if hpc_job:
            user = env_id(env.get("SLURM_JOB_USER"), USER_NAME) or self._user_of(pid)
            kind, name = "slurm", hpc_job
        else:
            kind, name, user = "pod", pod, namespace
        return JobLabels(
            hpc_job=bounded(hpc_job),
            pod=bounded(pod, 253),
            namespace=bounded(namespace),
            container=bounded(container),
            kind=kind,
            name=bounded(name, 253),
            user=bounded(user),
        )

    def _placed(self, facts: ProcFacts, place: cgroups.Placement) -> _Entry:
        """A container's, a unit's or a process tree's labels, rooted at the job's top."""
        kind = place.kind
        if (kind == "container" and "containers" not in self.sources) or (
            kind == "unit" and "units" not in self.sources
        ):
            kind = "process"
        if kind not in ("container", "unit") and "processes" not in self.sources:
            return _Entry(facts.start_ticks, NO_JOB, None)
        top = top_of_job(facts, self._parent)
        user = self._user_of(top.pid)
        argv = _read_text(f"{self.procfs}/{top.pid}/cmdline", _CMDLINE_LIMIT) or ""
        command = short_command(tuple(argv.rstrip("\0").split("\0")) if argv else (), top.name)
        container = ""
        if kind == "container":
            name = container = self._container_name(place, top.pid)
        elif kind == "unit":
            name = bounded(place.unit, NAME_MAX)
        else:
            kind = "session" if kind == "session" else "process"
            name = str(top.pid)
        labels = JobLabels(container=container, kind=kind, name=name, user=user, command=command)
        return _Entry(facts.start_ticks, labels, (top.pid, top.start_ticks))

    def _container_name(self, place: cgroups.Placement, pid: int) -> str:
        cid = place.container_id
        if not cid:
            return bounded(place.container_name)
        name = self._container_names.get(cid)
        if name is None:
            rootless = ""
            if place.user_unit or place.runtime == "libpod":
                rootless = _storage_of_owner(self._uid_of(pid))
            name = bounded(self.containers.name(cid, place.runtime, rootless)) or cid[:12]
            if len(self._container_names) >= self.max_cached:
                self._container_names.clear()
            self._container_names[cid] = name
        return name

    def _facts(self, pid: int) -> ProcFacts | None:
        """The process's stat and cgroups (None: gone or unreadable)."""
        stat = _read_text(f"{self.procfs}/{pid}/stat", 4096)
        if stat is None:
            return None
        try:
            facts = parse_stat(pid, stat)
        except (ValueError, IndexError):
            return None
        cgroup = _read_text(f"{self.procfs}/{pid}/cgroup", _CGROUP_LIMIT)
        return ProcFacts(
            facts.pid, facts.name, facts.ppid, facts.session, facts.start_ticks, cgroup
        )

    def _parent(self, child: ProcFacts) -> ProcFacts | None:
        return self._facts(child.ppid) if child.ppid > 0 else None

    def _start(self, pid: int) -> int | None:
        """The process's start time: one read of its stat, no parse of the rest."""
        try:
            fd = os.open(f"{self.procfs}/{pid}/stat", os.O_RDONLY)
        except OSError:
            return None
        try:
            raw = os.read(fd, 4096)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:  # the 20th field after the name's closing parenthesis
            return int(raw[raw.rindex(b")") + 2 :].split(None, 20)[19])
        except (ValueError, IndexError):
            return None

    def _uid_of(self, pid: int) -> int | None:
        try:
            return os.stat(f"{self.procfs}/{pid}").st_uid
        except OSError:
            return None

    def _user_of(self, pid: int) -> str:
        return self._users(self._uid_of(pid))

    def _holders(self, gpu_uuid: str) -> tuple[Holder, ...]:
        """Who holds the GPU, by the kubelet; () where it cannot say."""
        if self.pod_resources is None:
            return ()
        now = self._clock()
        age = None if self._devices_at is None else now - self._devices_at
        wait = POD_RESOURCES_BACKOFF_S if self._devices_failed else POD_RESOURCES_MAX_AGE_S
        if age is None or age >= wait:
            self._devices_at = now
            try:
                self._devices = self.pod_resources.devices()
                self._devices_failed = False
            except PodResourcesError as exc:
                self._devices, self._devices_failed = {}, True
                self.pod_resources_errors += 1
                self.pod_resources_error = str(exc)
        return self._devices.get(gpu_uuid, ())

    def _say(self, message: str) -> None:
        if self.notice is None:
            self.notice = message
            log.warning("%s", message)


def _pick(holders: tuple[Holder, ...], pod_name: str | None) -> Holder | None:
    """The one holder; of several (a shared GPU), the one whose pod the environment names."""
    if len(holders) == 1:
        return holders[0]
    named = [h for h in holders if pod_name and h.pod == pod_name]
    return named[0] if len(named) == 1 else None


def _storage_of_owner(uid: int | None) -> str:
    """A rootless user's containers/storage root (their home's), or ""."""
    if not uid:
        return ""
    try:
        return f"{pwd.getpwuid(uid).pw_dir}/.local/share/containers/storage"
    except (KeyError, OverflowError):
        return ""


def _read_bytes(path: str, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:  # gone, permission denied, not a directory: the label stays empty
        return None


def _read_text(path: str, limit: int) -> str | None:
    raw = _read_bytes(path, limit)
    return None if raw is None else raw.decode(errors="replace")
