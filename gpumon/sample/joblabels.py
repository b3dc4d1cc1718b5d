"""Which job a GPU process belongs to: Slurm job id, Kubernetes pod/namespace/container.

NVML gives pids only; a fleet needs jobs, so that a multi-node job can be followed from
node to node and joined with dcgm-exporter's ``hpc_job``/``pod``/``namespace``/
``container`` labels.  Sources:

- the kubelet's pod-resources socket (``sample/podresources.py``), where it is mounted and
  grpcio installed: the pod, namespace and container *names* of whoever holds the GPU
  the process is on.  A process counts as a pod's only if its cgroup says it is in one
  (or cannot be read), so a host process on a pod's GPU is not given the pod's labels;
  a GPU two pods share (time-slicing) is told apart by the pod name in the environment.
  Otherwise, and wherever the socket cannot be asked, /proc:
- ``/proc/PID/cgroup``: Slurm's ``.../job_<id>/step_...`` (cgroup v1 and v2) and the
  kubelet's ``kubepods.../pod<uid>/<container id>`` (systemd and cgroupfs drivers);
  readable by anyone.
- ``/proc/PID/environ``: ``SLURM_JOB_ID``, and in a pod ``HOSTNAME`` (the pod's name) and
  ``POD_NAMESPACE`` where the downward API sets it; readable only with ptrace rights
  (root, or ``CAP_SYS_PTRACE``).
- ``/proc/PID/root/var/run/secrets/kubernetes.io/serviceaccount/namespace``: the pod's
  namespace, mounted in every pod that has a service account token.

Each pid is read once and cached until it leaves every GPU's process list (pids are only
reused after the process is gone, so a cached pid that is still on a GPU is the same
process); nothing here runs per tick for a known pid.  The kubelet is asked when a new
pid needs it, at most once per ``POD_RESOURCES_MAX_AGE_S`` (new pids of one tick share an
answer), and not for ``POD_RESOURCES_BACKOFF_S`` after it failed.
"""

from __future__ import annotations

import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Literal, Protocol

from gpumon.model import JobLabels
from gpumon.sample.podresources import (
    SOCKET,
    DeviceMap,
    Holder,
    PodResourcesClient,
    PodResourcesError,
    grpc_available,
)

_SLURM_CGROUP = re.compile(r"/job_(\d+)(?:/|$)")
_POD_CGROUP = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)
_CONTAINER = re.compile(r"^(?:[a-z]+-)*([0-9a-f]{64})(?:\.scope)?$")
_SA_NAMESPACE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"
_ENV_LIMIT = 1 << 20
POD_RESOURCES_MAX_AGE_S = 1.0
POD_RESOURCES_BACKOFF_S = 30.0


NO_JOB = JobLabels()


def parse_cgroup(text: str) -> tuple[str, str, str]:
    """(slurm job id, pod uid, container id) from a /proc/PID/cgroup text; "" if absent."""
    job = pod = container = ""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if not job:
            m = _SLURM_CGROUP.search(path)
            if m:
                job = m.group(1)
        if not pod:
            m = _POD_CGROUP.search(path)
            if m:
                pod = m.group(1).replace("_", "-")
                last = path.rstrip("/").rsplit("/", 1)[-1]
                c = _CONTAINER.match(last)
                if c:
                    container = c.group(1)[:12]
    return job, pod, container


def parse_environ(data: bytes) -> dict[str, str]:
    """The few variables we use from a NUL-separated /proc/PID/environ."""
    wanted = (b"SLURM_JOB_ID=", b"HOSTNAME=", b"POD_NAMESPACE=", b"POD_NAME=")
    out: dict[str, str] = {}
    for item in data.split(b"\0"):
        for w in wanted:
            if item.startswith(w):
                out[w[:-1].decode()] = item[len(w) :].decode(errors="replace")
    return out


class DeviceSource(Protocol):
    """Where GPU holders come from (``PodResourcesClient``; tests may pass their own)."""

    def devices(self) -> DeviceMap: ...


def default_pod_resources(sources: frozenset[str]) -> DeviceSource | None:
    """The kubelet's socket where it is mounted and grpcio can ask it; else None."""
    if "kubernetes" in sources and os.path.exists(SOCKET) and grpc_available():
        return PodResourcesClient(SOCKET)
    return None


class JobResolver:
    """Pid -> JobLabels, read once per process and cached while it is on a GPU."""

    def __init__(
        self,
        sources: Iterable[str] = ("slurm", "kubernetes"),
        *,
        procfs: str = "/proc",
        max_cached: int = 4096,
        pod_resources: DeviceSource | Literal["auto"] | None = "auto",
        clock: Callable[[], float] = time.monotonic,
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
        self.pod_resources_error: str | None = None  # the last failure, said once by callers
        self._cache: OrderedDict[int, JobLabels] = OrderedDict()
        self.reads = 0  # for tests: how often /proc was actually read

    def labels(self, pid: int, gpu_uuid: str | None = None) -> JobLabels:
        """The job of ``pid``; ``gpu_uuid`` (a GPU it is on) lets the kubelet name it."""
        hit = self._cache.get(pid)
        if hit is not None:
            self._cache.move_to_end(pid)
            return hit
        labels = self._read(pid, gpu_uuid) if self.sources else NO_JOB
        self._cache[pid] = labels
        while len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)
        return labels

    def retain(self, pids: Iterable[int]) -> None:
        """Forget every pid not in ``pids`` (they left the GPUs; the pid may be reused)."""
        keep = set(pids)
        for pid in [p for p in self._cache if p not in keep]:
            del self._cache[pid]

    def __len__(self) -> int:
        return len(self._cache)

    # --- reads: each failure just leaves that label empty ---------------------------------

    def _read(self, pid: int, gpu_uuid: str | None) -> JobLabels:
        self.reads += 1
        base = f"{self.procfs}/{pid}"
        cgroup = _read_text(f"{base}/cgroup")
        job, pod_uid, container = parse_cgroup(cgroup or "")
        want_slurm = "slurm" in self.sources
        want_k8s = "kubernetes" in self.sources
        holders: tuple[Holder, ...] = ()
        if want_k8s and gpu_uuid and (pod_uid or cgroup is None):
            holders = self._holders(gpu_uuid)
        env: dict[str, str] = {}
        if (want_slurm and not job) or (want_k8s and (pod_uid or len(holders) > 1)):
            raw = _read_bytes(f"{base}/environ")
            env = parse_environ(raw) if raw else {}
        hpc_job = (job or env.get("SLURM_JOB_ID", "")) if want_slurm else ""
        holder = _pick(holders, env.get("POD_NAME") or env.get("HOSTNAME"))
        if holder is not None:
            return JobLabels(hpc_job, holder.pod, holder.namespace, holder.container)
        pod = namespace = ""
        if want_k8s and pod_uid:
            pod = env.get("POD_NAME") or env.get("HOSTNAME") or pod_uid
            namespace = (
                env.get("POD_NAMESPACE")
                or (_read_text(f"{base}/root/{_SA_NAMESPACE}") or "").strip()
            )
        else:
            container = ""
        return JobLabels(hpc_job=hpc_job, pod=pod, namespace=namespace, container=container)

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


def _pick(holders: tuple[Holder, ...], pod_name: str | None) -> Holder | None:
    """The one holder; of several (a shared GPU), the one whose pod the environment names."""
    if len(holders) == 1:
        return holders[0]
    named = [h for h in holders if pod_name and h.pod == pod_name]
    return named[0] if len(named) == 1 else None


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(_ENV_LIMIT)
    except OSError:  # gone, permission denied, not a directory: the label stays empty
        return None


def _read_text(path: str) -> str | None:
    raw = _read_bytes(path)
    return None if raw is None else raw.decode(errors="replace")
