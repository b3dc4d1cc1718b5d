"""Pod attribution through the kubelet's pod-resources API, against a real gRPC server.

The server is grpcio's, on a unix socket in a temporary folder, answering List with
messages that the protobuf library encodes from the kubelet's api.proto (built here from
its field numbers), so gpumon's own wire-format decoder is checked against another
implementation, not against itself.  /proc is a fake tree of cgroup/environ files.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpumon.sample.joblabels import (
    POD_RESOURCES_BACKOFF_S,
    POD_RESOURCES_MAX_AGE_S,
    JobLabels,
    JobResolver,
)
from gpumon.sample.podresources import (
    Holder,
    PodResourcesClient,
    PodResourcesError,
    parse_list_response,
)

grpc = pytest.importorskip("grpc", reason="grpcio not installed (pip install grpcio)")
pytest.importorskip("google.protobuf", reason="protobuf not installed (pip install protobuf)")
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: E402

GPU_A = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
GPU_B = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
GPU_SHARED = "GPU-cccccccc-0000-4000-8000-000000000000"
POD_UID = "0d3e4a41-7c5b-4a8e-9f1d-2b6c8e9a0f12"
CID = "3f" * 32


# --------------------------------------------------------------------------- protobuf
def _api_messages() -> dict[str, type]:
    """The kubelet's v1 messages (as in its api.proto), for protobuf to encode."""
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="gpumon_test_podresources.proto", package="v1", syntax="proto3"
    )
    shapes = {
        "ListPodResourcesRequest": [],
        "ListPodResourcesResponse": [("pod_resources", 1, f.TYPE_MESSAGE, ".v1.PodResources")],
        "PodResources": [
            ("name", 1, f.TYPE_STRING, None),
            ("namespace", 2, f.TYPE_STRING, None),
            ("containers", 3, f.TYPE_MESSAGE, ".v1.ContainerResources"),
        ],
        "ContainerResources": [
            ("name", 1, f.TYPE_STRING, None),
            ("devices", 2, f.TYPE_MESSAGE, ".v1.ContainerDevices"),
            ("cpu_ids", 3, f.TYPE_INT64, None),
            ("memory", 4, f.TYPE_MESSAGE, ".v1.ContainerMemory"),
        ],
        "ContainerMemory": [
            ("memory_type", 1, f.TYPE_STRING, None),
            ("size", 2, f.TYPE_UINT64, None),
            ("topology", 3, f.TYPE_MESSAGE, ".v1.TopologyInfo"),
        ],
        "ContainerDevices": [
            ("resource_name", 1, f.TYPE_STRING, None),
            ("device_ids", 2, f.TYPE_STRING, None),
            ("topology", 3, f.TYPE_MESSAGE, ".v1.TopologyInfo"),
        ],
        "TopologyInfo": [("nodes", 1, f.TYPE_MESSAGE, ".v1.NUMANode")],
        "NUMANode": [("ID", 1, f.TYPE_INT64, None)],
    }
    repeated = {"pod_resources", "containers", "devices", "cpu_ids", "memory", "device_ids"}
    repeated |= {"nodes"}
    for name, fields in shapes.items():
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, type_name in fields:
            label = f.LABEL_REPEATED if fname in repeated else f.LABEL_OPTIONAL
            fd = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                fd.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}"))
        for name in shapes
    }


API = _api_messages()


def response(pods: list[tuple[str, str, list[tuple[str, list[str]]]]]) -> object:
    """A ListPodResourcesResponse: [(namespace, pod, [(container, [device ids])])]."""
    msg = API["ListPodResourcesResponse"]()
    for namespace, pod, containers in pods:
        p = msg.pod_resources.add(name=pod, namespace=namespace)
        for cname, ids in containers:
            c = p.containers.add(name=cname, cpu_ids=[2, 3])
            c.memory.add(memory_type="memory", size=1 << 30).topology.nodes.add(ID=0)
            if ids:
                d = c.devices.add(resource_name="nvidia.com/gpu", device_ids=ids)
                d.topology.nodes.add(ID=1)
            c.devices.add(resource_name="example.com/nic", device_ids=["eth9"])
    return msg


NODE = [
    ("ml", "bert-0", [("trainer", [GPU_A]), ("sidecar", [])]),
    ("ml", "bert-1", [("trainer", [GPU_B])]),
    # Time-sliced: two replicas of one GPU, to two pods.
    ("dev", "nb-x", [("lab", [f"{GPU_SHARED}::0"])]),
    ("dev", "nb-y", [("lab", [f"{GPU_SHARED}::1"])]),
]


# --------------------------------------------------------------------------- the kubelet
@dataclass
class Kubelet:
    """A gRPC server on a unix socket, answering v1.PodResourcesLister/List."""

    socket: Path
    pods: list = field(default_factory=lambda: list(NODE))
    calls: int = 0
    fail: bool = False

    def list(self, request: object, context: grpc.ServicerContext) -> object:
        self.calls += 1
        if self.fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet restarting")
        return response(self.pods)


@pytest.fixture
def kubelet() -> Iterator[Kubelet]:
    folder = Path(tempfile.mkdtemp(prefix="gpumon-kubelet-"))  # short: sun_path is 108 bytes
    k = Kubelet(folder / "kubelet.sock")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(
        k.list,
        request_deserializer=API["ListPodResourcesRequest"].FromString,
        response_serializer=lambda m: m.SerializeToString(),
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": handler}),)
    )
    assert server.add_insecure_port(f"unix://{k.socket}")
    server.start()
    yield k
    server.stop(grace=None).wait(5)
    shutil.rmtree(folder, ignore_errors=True)


def fake_proc(root: Path, pid: int, cgroup: str | None, environ: bytes | None = None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    if cgroup is not None:
        (d / "cgroup").write_text(cgroup)
    if environ is not None:
        (d / "environ").write_bytes(environ)


ME = pwd.getpwuid(os.getuid()).pw_name  # who owns the fake /proc's files


def pod_job(name: str, namespace: str = "", container: str = "") -> JobLabels:
    """A pod's labels: its kind, name and (a pod's user) namespace."""
    return JobLabels(
        pod=name, namespace=namespace, container=container, kind="pod", name=name, user=namespace
    )


IN_POD = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-pod{POD_UID.replace('-', '_')}"
IN_POD += f".slice/cri-containerd-{CID}.scope\n"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# --------------------------------------------------------------------------- decoding
def test_the_answer_is_decoded_into_gpu_holders() -> None:
    data = response(NODE).SerializeToString()  # type: ignore[attr-defined]
    devices = parse_list_response(data)
    assert devices[GPU_A] == (Holder("ml", "bert-0", "trainer"),)
    assert devices[GPU_B] == (Holder("ml", "bert-1", "trainer"),)
    assert devices[GPU_SHARED] == (Holder("dev", "nb-x", "lab"), Holder("dev", "nb-y", "lab"))
    assert devices["eth9"]  # every device plugin's ids; GPUs are looked up by UUID
    assert parse_list_response(b"") == {}


@pytest.mark.parametrize("cut", [1, 7, 30])
def test_a_truncated_answer_is_an_error_not_a_guess(cut: int) -> None:
    data = response(NODE).SerializeToString()  # type: ignore[attr-defined]
    with pytest.raises(PodResourcesError):
        parse_list_response(data[:-cut])


def test_the_client_asks_a_real_grpc_server(kubelet: Kubelet) -> None:
    client = PodResourcesClient(str(kubelet.socket))
    try:
        assert client.devices()[GPU_B] == (Holder("ml", "bert-1", "trainer"),)
        kubelet.fail = True
        with pytest.raises(PodResourcesError, match=r"UNAVAILABLE.*kubelet restarting"):
            client.devices()
    finally:
        client.close()


def test_no_socket_is_an_error_quickly(tmp_path: Path) -> None:
    client = PodResourcesClient(str(tmp_path / "absent.sock"), timeout_s=0.5)
    with pytest.raises(PodResourcesError, match=r"absent\.sock"):
        client.devices()
    client.close()


# --------------------------------------------------------------------------- the resolver
def resolver(kubelet_socket: Path, procfs: Path, clock: Clock | None = None) -> JobResolver:
    return JobResolver(
        procfs=str(procfs),
        pod_resources=PodResourcesClient(str(kubelet_socket), timeout_s=1.0),
        clock=clock or Clock(),
    )


def test_pod_processes_get_container_names(kubelet: Kubelet, tmp_path: Path) -> None:
    fake_proc(tmp_path, 10, IN_POD)  # no environ readable: names still come
    fake_proc(tmp_path, 11, IN_POD, b"SLURM_JOB_ID=77\0")
    r = resolver(kubelet.socket, tmp_path)
    assert r.labels(10, GPU_A) == pod_job("bert-0", "ml", "trainer")
    # Slurm inside a pod keeps its job id beside the pod's names.
    assert r.labels(11, GPU_B) == JobLabels("77", "bert-1", "ml", "trainer", "slurm", "77", ME)
    assert kubelet.calls == 1  # new pids of one moment share one answer


def test_a_host_process_on_a_pods_gpu_is_not_the_pods(kubelet: Kubelet, tmp_path: Path) -> None:
    fake_proc(tmp_path, 20, "0::/user.slice/user-0.slice/session-3.scope\n")
    r = resolver(kubelet.socket, tmp_path)
    assert r.labels(20, GPU_A) == JobLabels()
    assert kubelet.calls == 0  # not even asked


def test_a_shared_gpu_is_told_apart_by_the_pod_name(kubelet: Kubelet, tmp_path: Path) -> None:
    fake_proc(tmp_path, 30, IN_POD, b"HOSTNAME=nb-y\0")
    fake_proc(tmp_path, 31, IN_POD)  # no environment: /proc's own labels
    r = resolver(kubelet.socket, tmp_path)
    assert r.labels(30, GPU_SHARED) == pod_job("nb-y", "dev", "lab")
    assert r.labels(31, GPU_SHARED) == pod_job(POD_UID, container=CID[:12])


def test_an_unknown_gpu_or_no_gpu_falls_back_to_proc(kubelet: Kubelet, tmp_path: Path) -> None:
    fake_proc(tmp_path, 40, IN_POD, b"HOSTNAME=bert-9\0")
    fake_proc(tmp_path, 41, IN_POD, b"HOSTNAME=bert-8\0")
    r = resolver(kubelet.socket, tmp_path)
    assert r.labels(40, "GPU-not-allocated") == pod_job("bert-9", container=CID[:12])
    assert r.labels(41) == pod_job("bert-8", container=CID[:12])


def test_the_kubelet_is_asked_again_for_new_pods_only_after_a_while(
    kubelet: Kubelet, tmp_path: Path
) -> None:
    clock = Clock()
    for pid in (50, 51, 52):
        fake_proc(tmp_path, pid, IN_POD)
    r = resolver(kubelet.socket, tmp_path, clock)
    assert r.labels(50, GPU_A).pod == "bert-0"
    kubelet.pods = [("ml", "gpt-0", [("trainer", [GPU_A])])]  # bert-0 ended, gpt-0 got GPU A
    clock.t += POD_RESOURCES_MAX_AGE_S / 2
    assert r.labels(51, GPU_A).pod == "bert-0"  # the same moment's answer
    clock.t += POD_RESOURCES_MAX_AGE_S
    assert r.labels(52, GPU_A).pod == "gpt-0"
    assert kubelet.calls == 2
    assert r.labels(50, GPU_A).pod == "bert-0"  # a known pid is never asked about again
    assert kubelet.calls == 2


def test_a_failing_kubelet_backs_off_and_proc_answers(kubelet: Kubelet, tmp_path: Path) -> None:
    clock = Clock()
    for pid in (60, 61, 62):
        fake_proc(tmp_path, pid, IN_POD, b"HOSTNAME=bert-0\0")
    r = resolver(kubelet.socket, tmp_path, clock)
    kubelet.fail = True
    assert r.labels(60, GPU_A) == pod_job("bert-0", container=CID[:12])
    assert r.pod_resources_errors == 1 and "kubelet restarting" in (r.pod_resources_error or "")
    kubelet.fail = False
    clock.t += POD_RESOURCES_BACKOFF_S / 2
    assert r.labels(61, GPU_A).container == CID[:12]  # still backing off: not asked
    assert kubelet.calls == 1
    clock.t += POD_RESOURCES_BACKOFF_S
    assert r.labels(62, GPU_A).container == "trainer"
    assert kubelet.calls == 2


def test_without_the_socket_mounted_nothing_is_asked(tmp_path: Path) -> None:
    r = JobResolver(procfs=str(tmp_path))  # the default: the kubelet's path, absent here
    if Path("/var/lib/kubelet/pod-resources/kubelet.sock").exists():
        pytest.skip("this machine runs a kubelet")
    assert r.pod_resources is None
    assert JobResolver(["slurm"], procfs=str(tmp_path)).pod_resources is None


# --------------------------------------------------------------------------- the daemon
def test_the_daemon_exports_the_kubelets_names(kubelet: Kubelet, tmp_path: Path) -> None:
    """gpumon serve's own path: a GPU's process list in, the job-info series out."""
    from prometheus_client import generate_latest

    from gpumon.engine import Session
    from gpumon.faces.serve.collector import make_registry
    from gpumon.faces.serve.config import ServeConfig
    from gpumon.faces.serve.daemon import ServeState, job_options
    from gpumon.faces.serve.log import EventLog
    from gpumon.model import (
        GpuIdentity,
        GpuProcess,
        GpuSample,
        HostSample,
        Snapshot,
        TraceHeader,
    )

    fake_proc(tmp_path / "proc", 4242, IN_POD)
    idents = (GpuIdentity(0, GPU_A), GpuIdentity(1, GPU_B))
    cfg = ServeConfig(process_trees=False)
    session = Session.offline(
        TraceHeader(1, "gpumon", gpus=idents),
        live=True,
        jobs=job_options(cfg),
        resolver=resolver(kubelet.socket, tmp_path / "proc"),
    )
    state = ServeState(session, cfg, EventLog(""))
    gpus = tuple(
        GpuSample(t_s=1.0, gpu=g.index, uuid=g.uuid, util_pct=90.0,
                  processes=(GpuProcess(4242),) if g.index == 0 else ())
        for g in idents
    )  # fmt: skip
    snap = Snapshot(t_s=1.0, gpus=gpus, host=HostSample(t_s=1.0, cpu_pct=10.0))
    session.source.push(snap)  # type: ignore[attr-defined]
    state.step()
    assert state.tick_errors_total == 0
    text = generate_latest(make_registry(state)).decode()  # type: ignore[arg-type]
    info = [ln for ln in text.splitlines() if ln.startswith("gpumon_gpu_job_info{")]
    assert len(info) == 1, info
    for label in ('gpu="0"', 'pod="bert-0"', 'namespace="ml"', 'container="trainer"'):
        assert label in info[0], info[0]
