"""The NVML sampler: the only module in gpumon that imports ``pynvml``.

It never loads CUDA and never creates a context: NVML alone reads the driver's counters.
``nvmlInit`` runs once per process (``nvml_init``); devices are discovered once and keyed
by UUID, their index kept as a label.  Each tick reads, per GPU, the driver's utilisation
sample buffer since the previous tick (``nvmlDeviceGetSamples`` with ``lastSeenTimeStamp``,
so no sub-second burst or gap between ticks is lost) and the other fields gpumon needs.

Faults are contained per field and per GPU: ``NotSupported`` marks the field absent and it
is asked again only every ``retry_unsupported_s``; ``GpuIsLost`` marks that GPU lost while
the others keep being sampled; any other NVML error leaves that field ``None`` for the
tick and is counted by kind (the daemon exports the counts).

Where the GPU has Hopper's GPM counters (``nvmlGpmQueryDeviceSupport``, asked once when
the GPU is opened), each tick also reads SM activity, SM occupancy and tensor activity
over the interval since the previous tick (``_Gpm``: two kept sample buffers, two C calls
per GPU), and per MIG GPU instance where MIG is on.  A GPU without GPM is never asked
again; a metric it lacks is ``None``.

Hardware health that changes slowly (memory clock and temperature, fan, P-state, energy,
ECC, PCIe replay and row-remapping counters, NVLink traffic, the reserved memory, the
video engines' utilisation) is read every ``hardware_every_s``: the counters in one
``nvmlDeviceGetFieldValues`` call into a kept buffer (``_FieldValues``), the rest in six
calls, and, where the GPU has GPM, its DRAM bandwidth and FP64/32/16 pipes in one more
``nvmlGpmMetricsGet`` over the tick's own two samples (``_Gpm.read_pipes``: GPM is
sampled once per tick, whatever is read of it).  Each is asked once and, where NVML says
NotSupported (no fan on a passively cooled card, no NVLink on a PCIe card, no row
remapping before Ampere), left alone until the GPU is opened again, without costing the
tick its fast path.  A sampler made with ``hardware=False`` (a daemon that exports none
of it) reads none of this, nor the PCIe throughput.  XID critical errors come from one NVML
event set for all GPUs (``_XidEvents``), drained without blocking once per tick.

Every ``rediscover_every_s`` the sampler looks again, at a bounded cost (one
``nvmlDeviceGetCount``, plus one handle and UUID call per lost GPU): a lost GPU that
answers again (a reset, a flaky riser) is read again, and a GPU that appeared (hot-plug,
a GPU back from a driver reset under a new index) is opened and read from then on.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar, cast

import pynvml

from gpumon.errors import NoDriverError
from gpumon.model import GpuIdentity, GpuProcess, GpuSample, MigActivity, Point

log = logging.getLogger(__name__)

T = TypeVar("T")

_CLOCK_SM = pynvml.NVML_CLOCK_SM
_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

_init_lock = threading.Lock()
_init_done = False

# NVML error codes that mean "there is no usable driver here".
_NO_DRIVER = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "no NVIDIA driver found (libnvidia-ml.so.1, the "
    "driver's NVML library, cannot be loaded); run gpumon on a machine with an NVIDIA GPU "
    "and driver, or try `gpumon demo` to see it work on a bundled synthetic trace",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded "
    "(nvidia-smi would fail too); load it or run gpumon on a GPU node",
    pynvml.NVML_ERROR_NO_PERMISSION: "no permission to talk to the NVIDIA driver; check "
    "access to /dev/nvidia*",
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "the NVIDIA driver is too old for these NVML bindings",
}


def nvml_init() -> None:
    """Initialise NVML once per process; later calls are free.

    Raises ``NoDriverError`` with one clear sentence when there is no usable driver.
    """
    global _init_done
    with _init_lock:
        if _init_done:
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            reason = _NO_DRIVER.get(exc.value, f"NVML failed to start ({exc})")
            raise NoDriverError(f"cannot read GPUs: {reason}.", nvml_code=exc.value) from None
        _init_done = True


def _error_kind(exc: pynvml.NVMLError) -> str:
    """A stable, label-friendly name for an NVML error ('not_supported', 'gpu_is_lost')."""
    name = type(exc).__name__.removeprefix("NVMLError_")
    if name == "NVMLError":
        return f"code_{exc.value}"
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


# The NVML errors a query can return in practice, as ``_error_kind`` names them: the daemon
# exports each at 0 before it happens, so a dashboard panel shows 0, not "No data".
# NotSupported is absent on purpose: it marks a field unsupported and is never counted.
KNOWN_ERROR_KINDS = (
    "unknown",
    "gpu_is_lost",
    "timeout",
    "no_permission",
    "invalid_argument",
    "insufficient_size",
    "not_found",
    "uninitialized",
    "driver_not_loaded",
    "irq_issue",
    "reset_required",
    "lib_rm_version_mismatch",
    "memory",
    "no_data",
)


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


# A sample is never stamped in the future, but two clocks are read a few µs apart: a
# stamp this far ahead of the clock is the clock having stepped back, not jitter.
_STEP_SLACK_US = 1_000_000
# A GPU whose samples stopped this long ago is looked at (once per this) for a step back.
_STEP_PROBE_S = 1.0


# A buffered sample can be up to ~20 s old (120 samples at 1/6 s); allow slack.
_MAX_AGE_S = 120.0


class SampleClock:
    """Converts NVML sample timestamps (µs on some CPU clock) to gpumon's monotonic clock.

    NVML documents the timestamps only as "CPU timestamp in microseconds"; drivers have
    been seen using CLOCK_REALTIME and CLOCK_BOOTTIME.  The clock is chosen from the first
    samples (the one whose 'now' is just after the newest sample), re-chosen if converted
    times land in the future; if none fits, the newest sample is anchored to 'now' (and
    re-anchored whenever a newer one would land after the moment it is read).
    """

    _CLOCKS: tuple[tuple[str, int], ...] = (
        ("realtime", time.CLOCK_REALTIME),
        ("monotonic", time.CLOCK_MONOTONIC),
        ("boottime", getattr(time, "CLOCK_BOOTTIME", 7)),
    )
    _MAX_AHEAD_S = 1.0

    def __init__(self, max_age_s: float = _MAX_AGE_S) -> None:
        # How old the newest sample may be on the clock chosen (after a step, the newest
        # is known to be recent: a clock it is seconds old on is not the driver's).
        self._max_age_s = max_age_s
        self.clock_name: str | None = None
        self._clock_id: int | None = None
        self._anchor_offset_s: float | None = None

    def offset_s(
        self, newest_ts_us: int, tick: dict[int, tuple[float, float]] | None = None
    ) -> float:
        """Seconds to subtract from ``ts_us / 1e6`` to land on time.monotonic().

        ``tick``: the clocks' offsets read once per tick for every GPU (two clocks drift
        apart by microseconds a second at most, NTP's slew; a jump is caught below).
        """
        newest_s = newest_ts_us / 1e6
        clock_id = self._clock_id
        if clock_id is not None:
            known = None if tick is None else tick.get(clock_id)
            if known is None:
                offset = time.clock_gettime(clock_id) - (now := time.monotonic())
                if tick is not None:
                    tick[clock_id] = (offset, now)
            else:
                offset, now = known
            if newest_s - offset <= now + self._MAX_AHEAD_S:
                return offset
            self._clock_id = None  # the clock jumped or was misjudged: choose again
        elif self._anchor_offset_s is not None:
            # The newest sample is at most 'now': an anchor set while the reading thread
            # lagged its read (a busy machine) would place later samples in the future.
            # Raised to each tick's bound, it never does, and nears the true offset.
            self._anchor_offset_s = max(self._anchor_offset_s, newest_s - time.monotonic())
            return self._anchor_offset_s
        for name, clock_id in self._CLOCKS:
            age = time.clock_gettime(clock_id) - newest_s
            if -self._MAX_AHEAD_S <= age <= self._max_age_s:
                self.clock_name, self._clock_id = name, clock_id
                return time.clock_gettime(clock_id) - time.monotonic()
        self.clock_name = "anchored"
        self._anchor_offset_s = newest_s - time.monotonic()
        return self._anchor_offset_s

    def chosen_offset_s(self, tick: dict[int, tuple[float, float]] | None = None) -> float | None:
        """The chosen clock's offset from time.monotonic() now (None while none is chosen:
        an anchored clock is no clock the system can be asked)."""
        clock_id = self._clock_id
        if clock_id is None:
            return None
        known = None if tick is None else tick.get(clock_id)
        if known is not None:
            return known[0]
        offset = time.clock_gettime(clock_id) - (now := time.monotonic())
        if tick is not None:
            tick[clock_id] = (offset, now)
        return offset


# nvmlSample_t: unsigned long long timeStamp; nvmlValue_t sampleValue (an 8-byte union;
# uiVal, an unsigned int, at its start).
_SAMPLE = struct.Struct("@QI4x")


class _SampleBuffer:
    """``nvmlDeviceGetSamples`` for utilisation in one C call, into a buffer kept per GPU.

    pynvml's wrapper makes two calls (the count, then the data), allocates an array and
    returns a struct object per sample whose fields cost ~1 µs each to read (pynvml's
    ``__getattribute__`` is Python); here one call fills a buffer larger than any driver's
    history (NVML's is ~120 samples) and the (timestamp, value) pairs are unpacked from its
    bytes at once: ~3 µs instead of ~13 µs per GPU per tick.  Errors are raised as pynvml
    raises them; a full buffer (maybe truncated) returns None: the caller asks pynvml.
    """

    CAPACITY = 1024
    _LAYOUT = _SAMPLE
    _TYPE = ctypes.c_uint(pynvml.NVML_GPU_UTILIZATION_SAMPLES)

    def __init__(self, fn: Callable[..., int], capacity: int = CAPACITY) -> None:
        self._fn = fn
        self.capacity = capacity
        self._buf = (pynvml.c_nvmlSample_t * capacity)()
        self._bytes = memoryview(self._buf).cast("B")
        self._count = ctypes.c_uint(0)
        self._value_type = ctypes.c_uint(0)
        self._count_ref = ctypes.byref(self._count)
        self._value_type_ref = ctypes.byref(self._value_type)

    @classmethod
    def create(cls, capacity: int = CAPACITY) -> _SampleBuffer | None:
        """None where the bindings' layout or function lookup differs from what is known."""
        if ctypes.sizeof(pynvml.c_nvmlSample_t) != cls._LAYOUT.size:
            return None
        try:
            return cls(pynvml._nvmlGetFunctionPointer("nvmlDeviceGetSamples"), capacity)
        except (pynvml.NVMLError, AttributeError):
            return None

    def read(self, handle: Any, last_seen_us: int) -> list[tuple[int, int]] | None:
        """(timeStamp, uiVal) of the samples after ``last_seen_us``, oldest first; None if
        the buffer filled."""
        count, capacity = self._count, self.capacity
        count.value = capacity
        ret = self._fn(
            handle,
            self._TYPE,
            ctypes.c_ulonglong(last_seen_us),
            self._value_type_ref,
            self._count_ref,
            self._buf,
        )
        if ret:
            raise pynvml.NVMLError(ret)  # the specific subclass, as pynvml raises it
        n = count.value
        if n >= capacity:
            return None
        # Sorted: the driver returns them oldest first, so this is one pass to confirm.
        return sorted(_SAMPLE.iter_unpack(self._bytes[: n * _SAMPLE.size]))


def _left_alone(exc: pynvml.NVMLError) -> bool:
    """NVML says this GPU (or driver) has no such reading: ask no more until reopened (a
    driver that knows no such struct version will not learn it either)."""
    return isinstance(
        exc,
        pynvml.NVMLError_NotSupported
        | pynvml.NVMLError_FunctionNotFound
        | pynvml.NVMLError_ArgumentVersionMismatch,
    )


# nvmlFieldValue_t: unsigned int fieldId, scopeId; long long timestamp, latencyUsec;
# nvmlValueType_t valueType; nvmlReturn_t nvmlReturn; nvmlValue_t value (an 8-byte union).
_FIELD_VALUE = struct.Struct("@IIqqii8s")
_FIELD_ANSWER = "24xii8s"  # what is read of it: valueType, nvmlReturn, value
# nvmlValue_t's member for each nvmlValueType_t (double, unsigned int, unsigned long,
# unsigned long long, signed long long, signed int, unsigned short), all at its start:
# its format, padded to the union's 8 bytes.
_VALUE_FORMATS = ("d", "I4x", "L", "Q", "q", "i4x", "H6x")
_VALUE_TYPES = tuple(struct.Struct("@" + f) for f in _VALUE_FORMATS)
_ALL_LINKS = 0xFFFFFFFF  # scopeId: the NVLink counters summed over every link
FieldReading = tuple[int | float | None, ...]


class _FieldValues:
    """A GPU's slow health fields in one ``nvmlDeviceGetFieldValues`` call.

    The request (field and scope ids) is built once into a kept buffer and the answers
    unpacked from its bytes; pynvml's wrapper would build a struct array and set each id
    in Python on every call.  NVML answers SUCCESS when any field was filled, so each
    entry's own return is read: a field NotSupported on this GPU (ECC off, no NVLink) is
    dropped from the request for good, a field failing otherwise is None this time.
    """

    # (name for GpuSample.unsupported, field id, scope id, scale to gpumon's unit), in the
    # order GpuSample lists them.
    FIELDS: tuple[tuple[str, int, int, float | None], ...] = (
        ("memory_temperature", pynvml.NVML_FI_DEV_MEMORY_TEMP, 0, 1.0),
        ("energy", pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 0, 1e-3),  # mJ -> J
        ("ecc_volatile", pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, 0, None),
        ("ecc_volatile", pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, 0, None),
        ("ecc_aggregate", pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, 0, None),
        ("ecc_aggregate", pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, 0, None),
        ("pcie_replays", pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, 0, None),
        ("nvlink", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS, 1024),  # KiB
        ("nvlink", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS, 1024),
        ("remapped_rows", pynvml.NVML_FI_DEV_REMAPPED_COR, 0, None),  # Ampere and later
        ("remapped_rows", pynvml.NVML_FI_DEV_REMAPPED_UNC, 0, None),
        ("remapped_rows", pynvml.NVML_FI_DEV_REMAPPED_PENDING, 0, None),
        ("remapped_rows", pynvml.NVML_FI_DEV_REMAPPED_FAILURE, 0, None),
    )
    NONE: FieldReading = (None,) * len(FIELDS)

    def __init__(self, fn: Callable[..., int]) -> None:
        self._fn = fn
        self._asked = list(range(len(self.FIELDS)))  # indexes into FIELDS still asked
        self._build()

    def _build(self) -> None:
        n = len(self._asked)
        self._buf = (pynvml.c_nvmlFieldValue_t * max(n, 1))()
        for entry, i in zip(self._buf, self._asked, strict=False):
            entry.fieldId, entry.scopeId = self.FIELDS[i][1], self.FIELDS[i][2]
        self._view = memoryview(self._buf).cast("B")[: n * _FIELD_VALUE.size]
        # Every entry's answer in one unpack: (valueType, nvmlReturn, value) n times.
        self._answers = struct.Struct("@" + _FIELD_ANSWER * n)
        # Once every field has answered, the value types it gave, and one unpack that
        # reads each value in its type: the common case, a GPU answering as it did.
        self._kinds: tuple[int, ...] = ()
        self._typed: struct.Struct | None = None
        # The values (by their place in the request) scaled to gpumon's unit, and how.
        scales = [self.FIELDS[i][3] for i in self._asked]
        self._scaled = [(j, scale) for j, scale in enumerate(scales) if scale is not None]
        self._count = ctypes.c_int32(n)
        self._ref = ctypes.byref(self._buf)

    @classmethod
    def create(cls) -> _FieldValues | None:
        """None where the bindings' layout or function lookup differs from what is known."""
        if ctypes.sizeof(pynvml.c_nvmlFieldValue_t) != _FIELD_VALUE.size:
            return None
        try:
            return cls(pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues"))
        except (pynvml.NVMLError, AttributeError):
            return None

    @property
    def empty(self) -> bool:
        return not self._asked

    def read(
        self, handle: Any
    ) -> tuple[FieldReading, tuple[str, ...], tuple[tuple[str, int], ...]]:
        """The values in FIELDS' order, the names newly found unsupported, and the other
        failures as (name, NVML error code); raises NVMLError when the call fails."""
        ret = self._fn(handle, self._count, self._ref)
        if ret:
            raise pynvml.NVMLError(ret)
        typed = self._typed
        if typed is not None:
            flat = typed.unpack(self._view)
            if flat[0::3] == self._kinds and not any(flat[1::3]):
                values = list(flat[2::3])
                for j, scale in self._scaled:
                    values[j] *= scale
                return self._placed(values), (), ()
        return self._read_each()

    def _placed(self, values: list[int | float | None]) -> FieldReading:
        """Values of the fields asked, in FIELDS' order with None for the others."""
        if len(values) == len(self.FIELDS):
            return tuple(values)
        out: list[int | float | None] = list(self.NONE)
        for i, value in zip(self._asked, values, strict=True):
            out[i] = value
        return tuple(out)

    def _read_each(self) -> tuple[FieldReading, tuple[str, ...], tuple[tuple[str, int], ...]]:
        """The answers entry by entry: what failed, what NVML does not support here."""
        values: list[int | float | None] = []
        dropped: set[str] = set()
        failed: list[tuple[str, int]] = []
        flat = self._answers.unpack(self._view)
        kinds = flat[0::3]
        for i, kind, code, raw in zip(self._asked, kinds, flat[1::3], flat[2::3], strict=True):
            name, _, _, scale = self.FIELDS[i]
            value = None
            if code == 0 and 0 <= kind < len(_VALUE_TYPES):  # NVML_SUCCESS, a known type
                value = _VALUE_TYPES[kind].unpack_from(raw)[0]
                value = value if scale is None else value * scale
            elif code in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                dropped.add(name)
            else:
                failed.append((name, code))
            values.append(value)
        reading = self._placed(values)
        if dropped:
            self._asked = [i for i in self._asked if self.FIELDS[i][0] not in dropped]
            self._build()
        elif not failed:  # every field answered: read them in their types from now on
            self._kinds = kinds
            self._typed = struct.Struct("@" + "".join("24xii" + _VALUE_FORMATS[k] for k in kinds))
        return reading, tuple(sorted(dropped)), tuple(failed)


# GpuSample's health fields, mem_clock_mhz to fp16_active_ratio, in its order: the clock,
# temperature, fan, P-state and counters; the row remapping (the field values); the
# reserved memory and video engines (_engines); GPM's DRAM and FP pipes (_Gpm.read_pipes).
Health = tuple[
    int | None, float | None, float | None, int | None, float | None,
    int | None, int | None, int | None, int | None, int | None, int | None, int | None,
    int | None, int | None, int | None, int | None,
    int | None, float | None, float | None,
    float | None, float | None, float | None, float | None,
]  # fmt: skip
NO_HEALTH: Health = cast(Health, (None,) * 23)
Engines = tuple[int | None, float | None, float | None]
PipeReading = tuple[float | None, float | None, float | None, float | None]
_NO_PIPES: PipeReading = (None, None, None, None)


def _memory_v2(handle: Any) -> Any:
    """nvmlMemory_v2: the memory the driver reserves, which v1 counts as used.  Called
    through ctypes, not pynvml's wrapper: a library that replaces the wrapper in this
    process (nvitop does) may take no ``version``."""
    mem = pynvml.c_nvmlMemory_v2_t()
    mem.version = pynvml.nvmlMemory_v2
    ret = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo_v2")(handle, ctypes.byref(mem))
    if ret:
        raise pynvml.NVMLError(ret)  # the specific subclass, as pynvml raises it
    return mem


def _address(handle: Any) -> int | None:
    """A device handle's address: the key NVML's events name the GPU by."""
    return ctypes.cast(handle, ctypes.c_void_p).value


class _XidEvents:
    """XID critical errors of every GPU through one NVML event set, read without blocking.

    ``nvmlEventSetWait_v2`` with a timeout of 0 returns at once (NVML_ERROR_TIMEOUT when
    nothing is pending), so a tick costs one C call for all GPUs, into a kept struct; at
    most ``MAX_PER_TICK`` errors are taken per tick, the rest on the next.
    """

    MAX_PER_TICK = 64
    XID = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self) -> None:
        self._set = pynvml.nvmlEventSetCreate()
        self._wait = pynvml._nvmlGetFunctionPointer("nvmlEventSetWait_v2")
        self._data = pynvml.c_nvmlEventData_t()
        self._data_ref = ctypes.byref(self._data)
        self._no_wait = ctypes.c_uint(0)

    @classmethod
    def create(cls) -> _XidEvents | None:
        """None where the driver or bindings offer no event sets."""
        try:
            return cls()
        except (pynvml.NVMLError, AttributeError):
            return None

    def watch(self, handle: Any) -> int | None:
        """Register the GPU's XID errors (raises NVMLError); its key in ``drain``'s output."""
        if not pynvml.nvmlDeviceGetSupportedEventTypes(handle) & self.XID:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        pynvml.nvmlDeviceRegisterEvents(handle, self.XID, self._set)
        return _address(handle)

    def drain(self) -> list[tuple[int | None, int]]:
        """(GPU key, XID code) of the errors pending, oldest first; raises NVMLError (after
        handing over what was taken, on the next call)."""
        wait, event_set, data_ref, no_wait = self._wait, self._set, self._data_ref, self._no_wait
        ret = wait(event_set, data_ref, no_wait)
        if ret == pynvml.NVML_ERROR_TIMEOUT:  # nothing pending: the common case
            return []
        out: list[tuple[int | None, int]] = []
        data = self._data
        for taken in range(1, self.MAX_PER_TICK + 1):
            if ret:
                if out:
                    break
                raise pynvml.NVMLError(ret)
            if data.eventType & self.XID:
                out.append((_address(data.device), int(data.eventData)))
            if taken == self.MAX_PER_TICK:
                break  # the rest on the next tick
            ret = wait(event_set, data_ref, no_wait)
            if ret == pynvml.NVML_ERROR_TIMEOUT:
                break
        return out


GpmReading = tuple[float | None, float | None, float | None]
_NO_GPM: GpmReading = (None, None, None)


class _Gpm:
    """GPM metrics of one GPU, or one MIG GPU instance, over the interval between ticks.

    Two sample buffers are allocated once and filled in turn: each tick's sample and the
    one before it give the metrics over the time between them (``nvmlGpmSampleGet`` or
    ``nvmlGpmMigSampleGet``, then ``nvmlGpmMetricsGet``: two C calls, through ctypes).
    Two requests are kept, one per order of the buffers, so a tick sets no field, and the
    values are unpacked from the request's bytes at once.  The first tick has no interval
    yet: no reading.  Ticks closer than ``MIN_INTERVAL_S`` (NVML: below ~100 ms GPM's
    counters are not refreshed) repeat the last reading without sampling.
    """

    # What gpumon reads, in the order ``read`` returns them (as ratios, 0-1).
    METRICS = (
        "NVML_GPM_METRIC_SM_UTIL",
        "NVML_GPM_METRIC_SM_OCCUPANCY",
        "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    )
    # nvmlGpmMetric_t: unsigned int metricId; nvmlReturn_t nvmlReturn; double value; then
    # metricInfo, three pointers (names and unit).
    _METRIC = struct.Struct("@Iid24x")
    MIN_INTERVAL_S = 0.1

    def __init__(self, gpu_instance_id: int | None) -> None:
        self.gpu_instance_id = gpu_instance_id
        name = "nvmlGpmSampleGet" if gpu_instance_id is None else "nvmlGpmMigSampleGet"
        self._sample_fn = pynvml._nvmlGetFunctionPointer(name)
        self._metrics_fn = pynvml._nvmlGetFunctionPointer("nvmlGpmMetricsGet")
        self._gi = None if gpu_instance_id is None else ctypes.c_uint(gpu_instance_id)
        # Two GPM sample buffers (NVML's memory), freed by close(): then none.
        self._buffers: tuple[Any, ...] = (pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc())
        self._views = self._metric_requests(self.METRICS)
        self._requests = [ctypes.byref(req) for req, _ in self._views]
        self._layout = struct.Struct("@" + "Iid24x" * len(self.METRICS))
        # Per turn: the buffer filled, then the request that has it as sample2 and its bytes.
        self._steps = tuple(
            (self._buffers[k], self._requests[1 - k], self._views[1 - k][1]) for k in (0, 1)
        )
        self._turn = 0  # which buffer the next sample goes into
        self._last_t: float | None = None
        self.values: GpmReading = _NO_GPM

    @classmethod
    def create(cls, gpu_instance_id: int | None = None) -> _Gpm | None:
        """None where the bindings' layout or the driver's functions are not the known ones."""
        try:
            if ctypes.sizeof(pynvml.c_nvmlGpmMetric_t) != cls._METRIC.size:
                return None
            return cls(gpu_instance_id)
        except (pynvml.NVMLError, AttributeError, TypeError):
            return None

    def read(self, handle: Any, t_s: float) -> GpmReading:
        """(SM activity, SM occupancy, tensor activity) since the last read; raises NVMLError."""
        last = self._last_t
        if last is not None and t_s - last < self.MIN_INTERVAL_S:
            return self.values
        turn = self._turn
        buf, request, view = self._steps[turn]
        if self._gi is None:
            ret = self._sample_fn(handle, buf)
        else:
            ret = self._sample_fn(handle, self._gi, buf)
        if ret:
            raise pynvml.NVMLError(ret)
        self._turn = 1 - turn
        self._last_t = t_s
        if last is None:
            return _NO_GPM  # one sample: no interval yet
        ret = self._metrics_fn(request)  # the previous sample and this one
        if ret:
            self.values = _NO_GPM
            raise pynvml.NVMLError(ret)
        raw = self._layout.unpack(view)
        self.values = (
            raw[2] / 100.0 if raw[1] == 0 and raw[2] >= 0.0 else None,
            raw[5] / 100.0 if raw[4] == 0 and raw[5] >= 0.0 else None,
            raw[8] / 100.0 if raw[7] == 0 and raw[8] >= 0.0 else None,
        )
        return self.values

    # GPM's DRAM bandwidth and FP pipes, in the order ``read_pipes`` returns them: read with
    # the hardware health (every few seconds) over the tick's last two samples.
    PIPES = (
        "NVML_GPM_METRIC_DRAM_BW_UTIL",
        "NVML_GPM_METRIC_FP64_UTIL",
        "NVML_GPM_METRIC_FP32_UTIL",
        "NVML_GPM_METRIC_FP16_UTIL",
    )
    # Per order of the two buffers (as ``_requests``): a request for PIPES and its bytes;
    # built on the first read_pipes.
    _pipes: tuple[tuple[Any, memoryview], ...] | None = None

    def read_pipes(self) -> PipeReading:
        """(DRAM bandwidth, FP64, FP32, FP16 activity) over the interval ``read`` last
        measured: the same two samples, so GPM is sampled once per tick whatever is read
        of it; a metric this GPU lacks is None.  Raises NVMLError."""
        if self.values is _NO_GPM:  # no interval measured yet (or its metrics failed)
            return _NO_PIPES
        pipes = self._pipes
        if pipes is None:
            pipes = self._pipes = self._metric_requests(self.PIPES)
            self._pipe_layout = struct.Struct("@" + "Iid24x" * len(self.PIPES))
        # ``read`` filled the buffer before self._turn last: the request with it second.
        request, view = pipes[self._turn]
        ret = self._metrics_fn(ctypes.byref(request))
        if ret:
            raise pynvml.NVMLError(ret)
        raw = self._pipe_layout.unpack(view)
        return cast(
            PipeReading,
            tuple(
                raw[i + 2] / 100.0 if raw[i + 1] == 0 and raw[i + 2] >= 0.0 else None
                for i in range(0, len(raw), 3)
            ),
        )

    def _metric_requests(self, metrics: tuple[str, ...]) -> tuple[tuple[Any, memoryview], ...]:
        """For each order of the two buffers, a request for ``metrics`` and the bytes of
        its answers (each an nvmlGpmMetric_t), built once."""
        ids = [getattr(pynvml, m) for m in metrics]
        offset = pynvml.c_nvmlGpmMetricsGet_t.metrics.offset
        out = []
        for first, second in (self._buffers, self._buffers[::-1]):
            req = pynvml.c_nvmlGpmMetricsGet_t()
            req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(ids)
            req.sample1, req.sample2 = first, second
            for i, metric_id in enumerate(ids):
                req.metrics[i].metricId = metric_id
            view = memoryview(req).cast("B")[offset : offset + len(ids) * self._METRIC.size]
            out.append((req, view))
        return tuple(out)

    def close(self) -> None:
        """Free the two sample buffers (NVML's memory)."""
        buffers, self._buffers = self._buffers, ()
        for buf in buffers:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlGpmSampleFree(buf)


@dataclass
class _GpuState:
    """Per-GPU sampling state: handle, buffer cursor, unsupported fields, lost flag."""

    identity: GpuIdentity
    handle: Any
    last_sample_ts_us: int = 0
    # The newest driver sample taken, on the monotonic clock: the samples' own clock,
    # which a step of the wall clock does not move (None: none taken yet).
    last_sample_t: float | None = None
    step_probe_at: float = 0.0  # when a silent GPU is next looked at for a step back
    last_proc_ts_us: int = 0
    lost: bool = False
    lost_since_s: float | None = None  # monotonic time NVML first said GpuIsLost
    unsupported_until: dict[str, float] = field(default_factory=dict)
    pcie: tuple[float | None, float | None] = (None, None)
    pcie_read_at: float = float("-inf")
    clock: SampleClock = field(default_factory=SampleClock)
    processes_fn: Callable[[Any], Any] | None = None
    sample_buffer: _SampleBuffer | None = field(default_factory=_SampleBuffer.create)
    gpm: _Gpm | None = None  # None: no GPM on this GPU (or not in these bindings)
    mig_gpm: tuple[_Gpm, ...] = ()  # one per MIG GPU instance, where MIG is on
    # The slow health readings (GpuSample's fields from mem_clock_mhz on), when read, and
    # the ones NotSupported here (left alone until the GPU is opened again).
    health: Health = NO_HEALTH
    health_read_at: float = float("-inf")
    health_unsupported: tuple[str, ...] = ()
    fields: _FieldValues | None = field(default_factory=_FieldValues.create)
    xids: tuple[int, ...] = ()  # XID codes drained for this GPU, not yet in a sample


class NvmlSampler:
    """Reads every GPU once per ``sample()`` call.

    ``start_s`` (monotonic) drops samples the driver buffered before monitoring began,
    so a trace starts when the recording does.
    """

    def __init__(
        self,
        *,
        retry_unsupported_s: float = 60.0,
        pcie_every_s: float = 5.0,
        start_s: float | None = None,
        rediscover_every_s: float = 10.0,
        hardware_every_s: float = 10.0,
        hardware: bool = True,
    ) -> None:
        nvml_init()
        # False: the hardware health readings and the PCIe throughput are never read (a
        # daemon that exports no hardware series: no one else looks at them).
        self.hardware = hardware
        self.retry_unsupported_s = retry_unsupported_s
        # Clocks and temperatures of memory, fan, P-state and the health counters change
        # slowly (dcgm-exporter reads them every 30 s): read every hardware_every_s, so a
        # scrape every 15 s finds them at most 10 s old.  They cost a tick's NVML part 8 %
        # at 5 s, 4 % at 10 s (benchmarks/bench_tick.py, 8 GPUs).
        self.hardware_every_s = hardware_every_s if hardware else float("inf")
        # Lost GPUs asked again and new GPUs looked for this often (see _rediscover).
        self.rediscover_every_s = rediscover_every_s
        # nvmlDeviceGetPcieThroughput measures over a 20 ms window per call, so reading it
        # every tick on 8 GPUs would cost 320 ms; it is read at most every pcie_every_s.
        self.pcie_every_s = pcie_every_s if hardware else float("inf")
        self.start_s = time.monotonic() if start_s is None else start_s
        self.errors: Counter[str] = Counter()
        self.driver_version = self._system_text(pynvml.nvmlSystemGetDriverVersion)
        self.nvml_version = self._system_text(pynvml.nvmlSystemGetNVMLVersion)
        self.known_error_kinds = KNOWN_ERROR_KINDS
        self.rediscoveries = 0  # how often _rediscover ran (its cost is measured on it)
        self._clock_offsets: dict[int, tuple[float, float]] = {}  # this tick's (SampleClock)
        self.clock_steps_back = 0  # times a GPU's sample clock was found stepped back
        self._events = _XidEvents.create()
        self._xid_gpus: dict[int | None, _GpuState] = {}  # by the handle's address
        self._gpus = self._discover()
        self._rediscover_at = time.monotonic() + rediscover_every_s

    # --- discovery --------------------------------------------------------------------

    def _system_text(self, fn: Callable[[], bytes | str]) -> str | None:
        try:
            return _text(fn())
        except pynvml.NVMLError as exc:
            self.errors[_error_kind(exc)] += 1
            return None

    def _discover(self) -> list[_GpuState]:
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            raise NoDriverError(
                f"cannot count GPUs: NVML says {exc}.", nvml_code=exc.value
            ) from None
        return [self._open(index) for index in range(count)]

    def _open(self, index: int) -> _GpuState:
        """The GPU at ``index`` with its identity; marked lost if it cannot be opened."""
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError as exc:
            self.errors[_error_kind(exc)] += 1
            log.warning("GPU %d cannot be opened (%s); it is reported as lost", index, exc)
            lost = GpuIdentity(index=index, uuid=f"unknown-gpu-{index}")
            return _GpuState(identity=lost, handle=None, lost=True, lost_since_s=time.monotonic())
        state = _GpuState(identity=GpuIdentity(index=index, uuid=uuid), handle=handle)
        self._identify(state, index, uuid)
        self._probe_gpm(state)
        self._watch_xids(state)
        return state

    def _identify(self, state: _GpuState, index: int, uuid: str) -> None:
        """Read what does not change while the GPU is up: name, bus id, memory, limit."""
        handle = state.handle
        name = self._read(state, "name", pynvml.nvmlDeviceGetName, handle)
        pci = self._read(state, "pci", pynvml.nvmlDeviceGetPciInfo, handle)
        mem = self._read(state, "memory", pynvml.nvmlDeviceGetMemoryInfo, handle)
        limit = self._read(state, "power_limit", pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        state.identity = GpuIdentity(
            index=index,
            uuid=uuid,
            name=None if name is None else _text(name),
            pci_bus_id=None if pci is None else _text(pci.busId),
            mem_total_bytes=None if mem is None else int(mem.total),
            power_limit_watts=None if limit is None else limit / 1000.0,
        )

    def _probe_gpm(self, state: _GpuState) -> None:
        """Whether the GPU has GPM (asked once per opening) and, where MIG is on, its GPU
        instances.  A GPU without it, or bindings or a driver without it, is not asked
        again and reads no GPM fields; nothing is logged or counted."""
        for old in (state.gpm, *state.mig_gpm):
            if old is not None:
                old.close()
        state.gpm, state.mig_gpm = None, ()
        query = getattr(pynvml, "nvmlGpmQueryDeviceSupport", None)
        if query is None or state.handle is None:
            return
        try:
            supported = bool(query(state.handle).isSupportedDevice)
        except pynvml.NVMLError_GpuIsLost:
            self._mark_lost(state)
            return
        except pynvml.NVMLError:  # NotSupported, FunctionNotFound (older driver), ...
            return
        if not supported:
            return
        state.gpm = _Gpm.create()
        readers = (_Gpm.create(gi) for gi in self._mig_instances(state.handle))
        state.mig_gpm = tuple(r for r in readers if r is not None)

    def _watch_xids(self, state: _GpuState) -> None:
        """Register the GPU's XID errors on the event set (asked once per opening)."""
        events = self._events
        if events is None or state.handle is None:
            self._leave_alone(state, "xid_events")
            return
        try:
            self._xid_gpus[events.watch(state.handle)] = state
        except pynvml.NVMLError as exc:
            if not _left_alone(exc):
                self._fault(state, "xid_events", exc)
            self._leave_alone(state, "xid_events")

    @staticmethod
    def _leave_alone(state: _GpuState, name: str) -> None:
        if name not in state.health_unsupported:
            log.debug("GPU %d: %s is not supported", state.identity.index, name)
            state.health_unsupported += (name,)

    @staticmethod
    def _mig_instances(handle: Any) -> tuple[int, ...]:
        """The GPU instance ids of a GPU in MIG mode; () when MIG is off or unreadable."""
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
            if current != pynvml.NVML_DEVICE_MIG_ENABLE:
                return ()
            slots = pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)
        except pynvml.NVMLError:
            return ()
        ids: set[int] = set()
        for i in range(slots):
            try:  # an empty slot says NotFound; several compute instances share a GI
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
                ids.add(int(pynvml.nvmlDeviceGetGpuInstanceId(mig)))
            except pynvml.NVMLError:
                continue
        return tuple(sorted(ids))

    def _rediscover(self, now: float) -> None:
        """Ask lost GPUs again and look for new ones: one GetCount, plus per lost GPU one
        handle and one UUID call.  Never raises; NVML errors are counted."""
        self.rediscoveries += 1
        for state in self._gpus:
            if state.lost:
                self._revive(state, now)
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            self.errors[_error_kind(exc)] += 1
            return
        for index in range(len(self._gpus), count):
            state = self._open(index)
            self._gpus.append(state)
            if not state.lost:
                log.warning(
                    "GPU %d (%s) appeared; it is read from now on",
                    index,
                    state.identity.uuid,
                )

    def _revive(self, state: _GpuState, now: float) -> None:
        """A lost GPU that answers (handle and UUID) is read again from the next tick."""
        index = state.identity.index
        known = not state.identity.uuid.startswith("unknown-gpu-")
        try:
            if known:
                handle = pynvml.nvmlDeviceGetHandleByUUID(state.identity.uuid)
            else:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError:
            return  # still gone: not counted again, it was counted when lost
        state.handle, state.lost = handle, False
        state.unsupported_until.clear()
        state.pcie_read_at = state.health_read_at = float("-inf")
        state.health_unsupported, state.fields = (), _FieldValues.create()
        if not known or uuid != state.identity.uuid:
            self._identify(state, index, uuid)
        self._probe_gpm(state)
        self._watch_xids(state)
        since = state.lost_since_s
        state.lost_since_s = None
        log.warning(
            "GPU %d (%s) answers again after %s lost; it is read again",
            index,
            uuid,
            "?" if since is None else f"{now - since:.0f} s",
        )

    @property
    def gpus(self) -> tuple[GpuIdentity, ...]:
        return tuple(s.identity for s in self._gpus)

    # --- one NVML call, with every fault contained ------------------------------------

    def _read(self, state: _GpuState, name: str, fn: Callable[..., T], *args: Any) -> T | None:
        """Call ``fn``; None when unsupported (and remember it), lost, or failing."""
        if self._skip(state, name):
            return None
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            self._fault(state, name, exc)
            return None

    def _skip(self, state: _GpuState, name: str) -> bool:
        """True while the GPU is lost or ``name`` is known unsupported and not due a retry."""
        if state.lost:
            return True
        retry_at = state.unsupported_until.get(name)
        if retry_at is None:
            return False
        if time.monotonic() < retry_at:
            return True
        del state.unsupported_until[name]
        return False

    def _fault(self, state: _GpuState, name: str, exc: pynvml.NVMLError) -> None:
        """Record one failed read: unsupported, lost, or an error counted by kind."""
        if isinstance(exc, pynvml.NVMLError_NotSupported):
            if name not in state.unsupported_until:
                log.debug("GPU %d: %s is not supported", state.identity.index, name)
            state.unsupported_until[name] = time.monotonic() + self.retry_unsupported_s
        elif isinstance(exc, pynvml.NVMLError_GpuIsLost):
            self._mark_lost(state)
        else:
            kind = _error_kind(exc)
            if self.errors[kind] == 0:
                log.warning("GPU %d: reading %s failed: %s", state.identity.index, name, exc)
            self.errors[kind] += 1

    def _mark_lost(self, state: _GpuState) -> None:
        if not state.lost:
            log.error(
                "GPU %d (%s) fell off the bus (NVML GpuIsLost); the other GPUs are still read",
                state.identity.index,
                state.identity.uuid,
            )
            self.errors["gpu_is_lost"] += 1
            state.lost_since_s = time.monotonic()
        state.lost = True

    # --- the tick ---------------------------------------------------------------------

    def sample(self) -> tuple[GpuSample, ...]:
        """Read every GPU once.  Never raises for a fault confined to one GPU or field."""
        t_s = time.monotonic()
        if t_s >= self._rediscover_at:
            self._rediscover_at = t_s + self.rediscover_every_s
            self._rediscover(t_s)
        self._clock_offsets.clear()
        if self._xid_gpus and self._events is not None:  # some GPU's XID errors are watched
            self._drain_xids()
        return tuple([self._sample_gpu(state, t_s) for state in self._gpus])

    def _drain_xids(self) -> None:
        """Hand each pending XID error to its GPU's next sample.  Never blocks or raises."""
        events = self._events
        assert events is not None
        try:
            pending = events.drain()
        except pynvml.NVMLError as exc:
            if _left_alone(exc):  # no events after all: every GPU says so
                self._events = None
                for state in self._gpus:
                    self._leave_alone(state, "xid_events")
                return
            kind = _error_kind(exc)
            if self.errors[kind] == 0:
                log.warning("reading NVML events failed: %s", exc)
            self.errors[kind] += 1
            return
        for key, code in pending:
            target = self._xid_gpus.get(key)
            if target is not None:
                log.warning("GPU %d: XID %d (NVML event)", target.identity.index, code)
                target.xids += (code,)

    def _sample_gpu(self, st: _GpuState, t_s: float) -> GpuSample:
        ident = st.identity
        xids = st.xids
        if xids:
            st.xids = ()
        if st.lost:
            return GpuSample(t_s, ident.index, ident.uuid, lost=True, xid_errors=xids)
        # The common case, nothing known unsupported, skips every per-field check.
        fast = not st.unsupported_until
        util_samples = self._util_samples(st, fast)
        rates, mem, power_mw, limit_mw, sm_clock, reasons, temp = self._scalars(st, fast)
        rx, tx = st.pcie if t_s - st.pcie_read_at < self.pcie_every_s else self._pcie(st, t_s)
        processes = self._processes(st, fast)
        gpm = st.gpm
        sm_active = sm_occupancy = tensor_active = None
        if gpm is not None and (fast or not self._skip(st, "gpm")):
            try:
                sm_active, sm_occupancy, tensor_active = gpm.read(st.handle, t_s)
            except pynvml.NVMLError as exc:  # NotSupported (MIG on): asked again rarely
                self._fault(st, "gpm", exc)
        mig = self._mig_activity(st, t_s) if st.mig_gpm else ()
        health = (
            st.health if t_s - st.health_read_at < self.hardware_every_s else self._health(st, t_s)
        )
        if _found_lost(st):  # a call above found the GPU gone: report it lost, not half-read
            return GpuSample(t_s, ident.index, ident.uuid, lost=True, xid_errors=xids)
        # Positional, in GpuSample's field order (checked at import, _FIELD_ORDER): keyword
        # arguments cost four times as much, and this runs for every GPU every tick.
        return GpuSample(
            t_s,
            ident.index,
            ident.uuid,
            util_samples,
            None if rates is None else float(rates.gpu),
            None if rates is None else float(rates.memory),
            None if mem is None else int(mem.used),
            None if mem is None else int(mem.total),
            None if power_mw is None else power_mw / 1000.0,
            None if limit_mw is None else limit_mw / 1000.0,
            sm_clock,
            reasons,
            rx,
            tx,
            None if temp is None else float(temp),
            processes,
            False,
            (*st.unsupported_until, *st.health_unsupported)
            if st.unsupported_until
            else st.health_unsupported,
            sm_active,
            sm_occupancy,
            tensor_active,
            mig,
            *health,
            xids,
        )

    def _health(self, st: _GpuState, t_s: float) -> Health:
        """The slow health readings, in GpuSample's order (mem_clock_mhz on)."""
        st.health_read_at = t_s
        if not self.hardware:  # never read; asked once per opening, then due never again
            return st.health
        h = st.handle
        fields = _FieldValues.NONE
        reader = st.fields
        if reader is None:  # bindings without it, or NVML said NotSupported
            self._leave_alone(st, "field_values")
        elif not reader.empty:
            try:
                fields, dropped, failed = reader.read(h)
            except pynvml.NVMLError as exc:
                if _left_alone(exc):
                    st.fields = None
                else:
                    self._fault(st, "field_values", exc)
            else:
                for name in dropped:
                    self._leave_alone(st, name)
                for name, code in failed:
                    self._fault(st, name, pynvml.NVMLError(code))
        mem_clock = self._health_call(st, "mem_clock", pynvml.nvmlDeviceGetClockInfo, h, _CLOCK_MEM)
        fan = self._health_call(st, "fan", pynvml.nvmlDeviceGetFanSpeed, h)
        pstate = self._health_call(st, "pstate", pynvml.nvmlDeviceGetPerformanceState, h)
        # The fields come in their types already (FIELDS' scales: float or int).
        st.health = cast(
            Health,
            (
                mem_clock,
                fields[0],
                None if fan is None else float(fan),
                None if pstate is None or not 0 <= pstate <= 15 else pstate,  # 32: unknown
                *fields[1:],
                *self._engines(st),
                *self._gpm_pipes(st),
            ),
        )
        return st.health

    def _engines(self, st: _GpuState) -> Engines:
        """The memory the driver reserves, and the video engines' utilisation (%)."""
        h = st.handle
        mem = self._health_call(st, "memory_reserved", _memory_v2, h)
        enc = self._health_call(st, "encoder", pynvml.nvmlDeviceGetEncoderUtilization, h)
        dec = self._health_call(st, "decoder", pynvml.nvmlDeviceGetDecoderUtilization, h)
        return (
            None if mem is None else int(mem.reserved),
            None if enc is None else float(enc[0]),
            None if dec is None else float(dec[0]),
        )

    def _gpm_pipes(self, st: _GpuState) -> PipeReading:
        """GPM's DRAM and FP pipe activity over the tick's interval (Hopper and later)."""
        gpm = st.gpm
        if gpm is None:
            return _NO_PIPES
        return self._health_call(st, "gpm_pipes", gpm.read_pipes) or _NO_PIPES

    def _health_call(self, st: _GpuState, name: str, fn: Callable[..., T], *args: Any) -> T | None:
        """One slow reading; None when failing, and left alone when NotSupported."""
        if name in st.health_unsupported or st.lost:
            return None
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            if _left_alone(exc):
                self._leave_alone(st, name)
            else:
                self._fault(st, name, exc)
            return None

    def _mig_activity(self, st: _GpuState, t_s: float) -> tuple[MigActivity, ...]:
        if self._skip(st, "gpm_mig"):
            return ()
        out = []
        for gpm in st.mig_gpm:
            try:
                values = gpm.read(st.handle, t_s)
            except pynvml.NVMLError as exc:  # an instance gone (reconfigured), or a fault
                self._fault(st, "gpm_mig", exc)
                if st.lost:
                    return ()
                values = _NO_GPM
            assert gpm.gpu_instance_id is not None
            out.append(MigActivity(gpm.gpu_instance_id, *values))
        return tuple(out)

    # The scalar fields of a tick, in the order ``_scalars`` returns them.
    _SCALARS: tuple[tuple[str, str, tuple[int, ...]], ...] = (
        ("utilization", "nvmlDeviceGetUtilizationRates", ()),
        ("memory", "nvmlDeviceGetMemoryInfo", ()),
        ("power", "nvmlDeviceGetPowerUsage", ()),
        ("power_limit", "nvmlDeviceGetEnforcedPowerLimit", ()),
        ("clocks", "nvmlDeviceGetClockInfo", (pynvml.NVML_CLOCK_SM,)),
        ("clock_reasons", "nvmlDeviceGetCurrentClocksEventReasons", ()),
        ("temperature", "nvmlDeviceGetTemperature", (pynvml.NVML_TEMPERATURE_GPU,)),
    )

    _SCALAR_NAMES = frozenset(name for name, _, _ in _SCALARS)

    def _scalars(self, st: _GpuState, fast: bool) -> tuple[Any, ...]:
        """The scalar fields, each None where unreadable.

        The common case, a GPU that supports everything, makes the calls back to back in
        one ``try``: per-field guarding costs about as much as the calls themselves.  Any
        fault sends the tick (and, while a field is known unsupported, later ticks) down
        the guarded path, field by field.
        """
        h = st.handle
        if fast or not st.unsupported_until.keys() & self._SCALAR_NAMES:
            try:
                return (
                    pynvml.nvmlDeviceGetUtilizationRates(h),
                    pynvml.nvmlDeviceGetMemoryInfo(h),
                    pynvml.nvmlDeviceGetPowerUsage(h),
                    pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
                    pynvml.nvmlDeviceGetClockInfo(h, _CLOCK_SM),
                    pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
                    pynvml.nvmlDeviceGetTemperature(h, _TEMPERATURE_GPU),
                )
            except pynvml.NVMLError:
                pass
        return tuple(
            self._read(st, name, getattr(pynvml, fn), h, *args) for name, fn, args in self._SCALARS
        )

    def _util_samples(self, st: _GpuState, fast: bool) -> tuple[Point, ...]:
        """The driver's samples since the last one taken, on the monotonic clock.

        Only samples after the newest one taken (``last_sample_t``) are kept, whatever the
        wall clock did meanwhile: a step forward re-stamps the driver's buffer (its older
        samples would come again, now "newer"), and a step back leaves every new sample
        stamped before ``last_sample_ts_us``, which NVML then never returns; that is found
        (``_after_step_back``) and the samples since are read from their new stamps."""
        if not fast and self._skip(st, "samples"):
            return ()
        last_seen = st.last_sample_ts_us
        stamped = self._driver_samples(st, last_seen)
        if stamped is None:
            return ()
        if not stamped and last_seen and st.last_sample_t is not None:
            stamped = self._after_step_back(st, last_seen)
        if not stamped:
            return ()
        newest = stamped[-1][0]
        offset = st.clock.offset_s(newest, self._clock_offsets)
        if newest > last_seen or newest < last_seen - _STEP_SLACK_US:
            st.last_sample_ts_us = newest
        after = st.last_sample_t
        if after is None:  # the first call: drop what was buffered before the start
            points = [
                (t, float(v))
                for ts, v in stamped
                if ts > 0 and (t := ts / 1e6 - offset) >= self.start_s
            ]
        else:
            # Plain (t, util) pairs: a UtilPoint per sample would cost a third of the tick.
            points = [
                (t, float(v)) for ts, v in stamped if ts > 0 and (t := ts / 1e6 - offset) > after
            ]
        if points:
            st.last_sample_t = points[-1][0]
        return tuple(points)

    def _after_step_back(self, st: _GpuState, last_seen: int) -> list[tuple[int, int]]:
        """Nothing new after ``last_seen``: has the clock the driver stamps with stepped
        back (NTP, a VM resumed), leaving every new sample stamped below it?  Found when
        that clock, read now, is behind ``last_seen``, or when a GPU silent for a while
        holds only samples stamped behind it (looked at once a second: one more NVML
        call).  Then the clock is chosen afresh from the new stamps and the samples after
        the newest one taken are read from the buffer.  Said once per sampler."""
        now = time.monotonic()
        offset = st.clock.chosen_offset_s(self._clock_offsets)
        clock_now_us = None if offset is None else (offset + now) * 1e6
        behind = clock_now_us is not None and clock_now_us < last_seen - _STEP_SLACK_US
        if not behind:
            silent = st.last_sample_t is not None and now - st.last_sample_t >= _STEP_PROBE_S
            if not silent or now < st.step_probe_at:
                return []
            st.step_probe_at = now + _STEP_PROBE_S
        buffered = self._driver_samples(st, 0) or []
        newest = buffered[-1][0] if buffered else None
        if newest is None or newest >= last_seen - _STEP_SLACK_US or st.last_sample_t is None:
            return []  # the GPU has no new samples: nothing stepped
        self.clock_steps_back += 1
        if self.clock_steps_back == 1:
            log.warning(
                "the clock GPU %d stamps its samples with stepped back by %.0f s (NTP, a "
                "resumed VM?); its samples are read from their new times on",
                st.identity.index,
                (last_seen - newest) / 1e6,
            )
        st.clock = SampleClock(max_age_s=_STEP_SLACK_US / 1e6)  # chosen from the new stamps
        reference = int(clock_now_us) if behind and clock_now_us is not None else newest
        resume = (st.last_sample_t + st.clock.offset_s(reference, self._clock_offsets)) * 1e6
        return [p for p in buffered if resume < p[0] <= reference + _STEP_SLACK_US]

    def _driver_samples(self, st: _GpuState, last_seen: int) -> list[tuple[int, int]] | None:
        """(timestamp µs, value) of the buffered samples after ``last_seen``, oldest first;
        [] when there are none, None when they cannot be read (counted)."""
        try:
            stamped = None
            if st.sample_buffer is not None:
                stamped = st.sample_buffer.read(st.handle, last_seen)
            if stamped is None:
                _, raw = pynvml.nvmlDeviceGetSamples(
                    st.handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last_seen
                )
                # Each field read once: a pynvml struct's attribute access runs Python
                # code and builds a union object for the value, about 1 µs each.
                stamped = sorted([(s.timeStamp, s.sampleValue.uiVal) for s in raw])
        except pynvml.NVMLError_NotFound:
            return []  # nothing new since lastSeenTimeStamp: not an error
        except pynvml.NVMLError as exc:
            # Unsupported (MIG), lost, or failing; util_pct from GetUtilizationRates
            # still carries the duty cycle.
            self._fault(st, "samples", exc)
            return None
        return stamped

    def _pcie(self, st: _GpuState, t_s: float) -> tuple[float | None, float | None]:
        if t_s - st.pcie_read_at >= self.pcie_every_s:
            st.pcie_read_at = t_s
            if not self.hardware:
                return st.pcie
            rx = self._read(
                st,
                "pcie",
                pynvml.nvmlDeviceGetPcieThroughput,
                st.handle,
                pynvml.NVML_PCIE_UTIL_RX_BYTES,
            )
            tx = self._read(
                st,
                "pcie",
                pynvml.nvmlDeviceGetPcieThroughput,
                st.handle,
                pynvml.NVML_PCIE_UTIL_TX_BYTES,
            )
            st.pcie = (None if rx is None else rx * 1024.0, None if tx is None else tx * 1024.0)
        return st.pcie

    def _processes(self, st: _GpuState, fast: bool) -> tuple[GpuProcess, ...] | None:
        fn = st.processes_fn
        if fn is None:
            fn = st.processes_fn = pynvml.nvmlDeviceGetComputeRunningProcesses
        try:
            if fast:
                try:
                    raw = fn(st.handle)
                except pynvml.NVMLError as exc:
                    self._fault(st, "processes", exc)
                    return None
            else:
                raw = self._read(st, "processes", fn, st.handle)
        except pynvml.NVMLLibraryMismatchError:
            # Driver lacks the _v3 symbol (not an NVMLError subclass): use _v2 from now on.
            st.processes_fn = pynvml.nvmlDeviceGetComputeRunningProcesses_v2
            raw = self._read(st, "processes", st.processes_fn, st.handle)
        if raw is None:
            return None
        if not raw:
            return ()
        sm_by_pid = self._process_sm_util(st, fast)
        out = []
        for p in raw:
            pid = int(p.pid)
            used = p.usedGpuMemory
            out.append(GpuProcess(pid, None if used is None else int(used), sm_by_pid.get(pid)))
        return tuple(out)

    def _process_sm_util(self, st: _GpuState, fast: bool) -> dict[int, float]:
        if not fast and self._skip(st, "process_utilization"):
            return {}
        try:
            raw = pynvml.nvmlDeviceGetProcessUtilization(st.handle, st.last_proc_ts_us)
        except pynvml.NVMLError_NotFound:
            return {}
        except pynvml.NVMLError as exc:
            self._fault(st, "process_utilization", exc)
            return {}
        out: dict[int, float] = {}
        newest = st.last_proc_ts_us
        for s in raw:
            ts = int(s.timeStamp)
            if ts > newest:
                newest = ts
            out[int(s.pid)] = float(s.smUtil)
        st.last_proc_ts_us = newest
        return out


# GpuSample's fields in the order _sample_gpu passes them (positionally, for speed).
_FIELD_ORDER = (
    "t_s", "gpu", "uuid", "util_samples", "util_pct", "mem_util_pct", "mem_used_bytes",
    "mem_total_bytes", "power_watts", "power_limit_watts", "sm_clock_mhz",
    "clock_event_reasons", "pcie_rx_bytes_per_s", "pcie_tx_bytes_per_s", "temperature_c",
    "processes", "lost", "unsupported", "sm_active_ratio", "sm_occupancy_ratio",
    "tensor_active_ratio", "mig_activity", "mem_clock_mhz", "memory_temperature_c",
    "fan_speed_pct", "pstate", "energy_joules", "ecc_corrected_errors",
    "ecc_uncorrected_errors", "ecc_corrected_errors_aggregate",
    "ecc_uncorrected_errors_aggregate", "pcie_replays", "nvlink_tx_bytes", "nvlink_rx_bytes",
    "remapped_rows_corrected", "remapped_rows_uncorrected", "row_remap_pending",
    "row_remap_failed", "memory_reserved_bytes", "encoder_util_pct", "decoder_util_pct",
    "dram_active_ratio", "fp64_active_ratio", "fp32_active_ratio", "fp16_active_ratio",
    "xid_errors",
)  # fmt: skip
if tuple(f.name for f in fields(GpuSample)) != _FIELD_ORDER:
    raise ImportError("gpumon.model.GpuSample's fields changed: update nvml._FIELD_ORDER")


def _found_lost(st: _GpuState) -> bool:
    """Whether the GPU is lost, read anew: a read that fails marks it, and a type checker
    keeps an earlier check of ``st.lost`` across the calls that may have changed it."""
    return st.lost
