"""Which pod and container holds which GPU: the kubelet's pod-resources API.

The kubelet serves ``v1.PodResourcesLister/List`` (gRPC) on a unix socket; for every pod on
the node it lists each container's devices by the ids the device plugin reported, which
for NVIDIA's plugin are the GPU UUIDs NVML gives (``GPU-...``; ``GPU-...::N`` for a
time-sliced replica).  That names the container, which /proc cannot: a cgroup only
carries the container's id.  dcgm-exporter reads the same socket.

gRPC itself (HTTP/2 framing, flow control, status trailers) is grpcio's job, an optional
dependency (``pip install 'gpumon-why[kubernetes]'``); the messages are decoded here from the
protobuf wire format, since four nested messages of strings do not justify generated code
and a protobuf runtime.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
# The kubelet caps its own answers at 16 MiB; grpcio's default limit is 4 MiB.
MAX_MESSAGE_BYTES = 16 << 20

# Field numbers of kubelet's pod-resources v1 api.proto.
_RESPONSE_POD_RESOURCES = 1  # ListPodResourcesResponse.pod_resources
_POD_NAME, _POD_NAMESPACE, _POD_CONTAINERS = 1, 2, 3  # PodResources
_CONTAINER_NAME, _CONTAINER_DEVICES = 1, 2  # ContainerResources
_DEVICES_RESOURCE, _DEVICES_IDS = 1, 2  # ContainerDevices


class PodResourcesError(Exception):
    """The socket could not be asked, or its answer could not be read."""


@dataclass(frozen=True, slots=True)
class Holder:
    """A container that holds a device."""

    namespace: str
    pod: str
    container: str


DeviceMap = dict[str, tuple[Holder, ...]]


def device_key(device_id: str) -> str:
    """A device id as NVML names the GPU: time-slicing replicas ``GPU-x::3`` are ``GPU-x``."""
    return device_id.split("::", 1)[0]


def parse_list_response(data: bytes) -> DeviceMap:
    """Device id -> the containers holding it, from a ListPodResourcesResponse."""
    out: dict[str, list[Holder]] = {}
    for field, pod in _fields(data):
        if field != _RESPONSE_POD_RESOURCES:
            continue
        name = namespace = ""
        containers: list[bytes] = []
        for f, value in _fields(pod):
            if f == _POD_NAME:
                name = value.decode(errors="replace")
            elif f == _POD_NAMESPACE:
                namespace = value.decode(errors="replace")
            elif f == _POD_CONTAINERS:
                containers.append(value)
        for c in containers:
            cname = ""
            ids: list[str] = []
            for f, value in _fields(c):
                if f == _CONTAINER_NAME:
                    cname = value.decode(errors="replace")
                elif f == _CONTAINER_DEVICES:
                    ids += [
                        device_key(v.decode(errors="replace"))
                        for df, v in _fields(value)
                        if df == _DEVICES_IDS
                    ]
            holder = Holder(namespace, name, cname)
            for dev in ids:
                holders = out.setdefault(dev, [])
                if holder not in holders:
                    holders.append(holder)
    return {dev: tuple(h) for dev, h in out.items()}


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise PodResourcesError("truncated or overlong varint in the kubelet's answer")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(field number, bytes) of each length-delimited field; other wire types skipped."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:  # varint (cpu ids, sizes)
            _, i = _varint(data, i)
        elif wire == 1:  # fixed 64-bit
            i += 8
        elif wire == 5:  # fixed 32-bit
            i += 4
        elif wire == 2:
            n, i = _varint(data, i)
            if i + n > len(data):
                raise PodResourcesError("a field runs past the end of the kubelet's answer")
            yield field, data[i : i + n]
            i += n
        else:
            raise PodResourcesError(f"unknown protobuf wire type {wire} in the kubelet's answer")
        if i > len(data):
            raise PodResourcesError("a field runs past the end of the kubelet's answer")


def grpc_available() -> bool:
    try:
        import grpc  # noqa: F401
    except ImportError:
        return False
    return True


class PodResourcesClient:
    """Asks the kubelet's socket; one channel for the daemon's lifetime."""

    def __init__(self, socket_path: str = SOCKET, *, timeout_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._call: Callable[..., DeviceMap] | None = None
        self._channel: Any = None  # a grpc.Channel (grpc ships no type information)

    def _stub(self) -> Callable[..., DeviceMap]:
        if self._call is None:
            import grpc

            self._channel = grpc.insecure_channel(
                f"unix://{os.path.abspath(self.socket_path)}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
            )
            self._call = self._channel.unary_unary(
                LIST_METHOD,
                request_serializer=lambda _request: b"",  # ListPodResourcesRequest {}
                response_deserializer=parse_list_response,
            )
        return self._call

    def devices(self) -> DeviceMap:
        """Every allocated device and its holders, asked now."""
        try:
            import grpc
        except ImportError as exc:
            raise PodResourcesError("grpcio is not installed") from exc
        try:
            return self._stub()(None, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            raise PodResourcesError(f"{self.socket_path}: {code}: {detail}") from None

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = self._call = None
