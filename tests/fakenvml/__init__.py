"""A scripted fake of NVIDIA's ``libnvidia-ml.so.1`` for tests.

The real ``pynvml`` module loads the fake unmodified, so tests exercise the actual binding code
(symbol names, struct layouts, size-query protocols, error codes) without a GPU.  What the fake
reports comes from a scenario file; tests describe it with the dataclasses below and may rewrite
it while a monitor runs (the library re-reads a changed file within about 10 ms).

Typical use::

    scn = Scenario(gpus=[
        FakeGPU(pattern=Pattern.burst(period_s=1.0, duty=0.3),
                processes=[Process(pid=4242, used_mem=2 * GiB)]),
        FakeGPU(pattern=Pattern.steady(95)),
    ])
    path = write_scenario(tmp_path / "scenario.txt", scn)
    subprocess.run([...], env=fake_env(path))      # a child process
    load_in_process(path); pynvml.nvmlInit()        # or this process

Time model: utilisation patterns are functions of ``time.monotonic()`` (CLOCK_MONOTONIC)
measured from ``Scenario.epoch`` (default: when the file was written).  Driver samples
(``nvmlDeviceGetSamples``) carry microsecond timestamps on ``Scenario.timestamp_clock``
(realtime by default, as NVML documents; ``boottime`` reproduces what some drivers reportedly
do) at multiples of ``sample_period_s``.  Rewriting the file does not rewrite the past: until
the new epoch the old pattern still holds (so unread samples from before a steady → burst switch
stay steady), and a GPU whose pattern is unchanged keeps its phase.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

__all__ = [
    "CALL_NAMES",
    "ERROR_NAMES",
    "FakeGPU",
    "GiB",
    "MiB",
    "MigInstance",
    "Pattern",
    "Process",
    "Scenario",
    "XidError",
    "build_library",
    "call_count",
    "fake_env",
    "lib_dir",
    "load_in_process",
    "missing_library_env",
    "unload_in_process",
    "write_scenario",
]

MiB = 1 << 20
GiB = 1 << 30

HERE = Path(__file__).resolve().parent
C_SOURCE = HERE / "fakenvml.c"
LIB_NAME = "libnvidia-ml.so.1"
ENV_SCENARIO = "FAKE_NVML_SCENARIO"
MAX_GPUS = 64  # MAX_GPUS in fakenvml.c
MAX_PROCS = 64  # MAX_PROCS in fakenvml.c
MAX_XIDS = 64  # MAX_XIDS in fakenvml.c

#: Short call names accepted by ``unsupported`` and ``errors`` (mirrors CALL_LIST in the C file).
CALL_NAMES = frozenset(
    {
        "handle", "uuid", "name", "pci", "index", "serial", "minor", "brand", "utilization",
        "samples", "memory", "power", "power_limit", "energy", "clocks", "clock_reasons", "pcie",
        "temperature", "fan", "pstate", "processes", "process_utilization", "persistence",
        "compute_mode", "mig", "display", "ecc", "field_values", "gpm", "misc",
        # system-wide calls (only meaningful in Scenario.errors / Scenario.unsupported)
        "count", "driver_version", "nvml_version", "cuda_version", "process_name",
        # field values of their own (nvmlDeviceGetFieldValues fails that field alone), and
        # NVML events (the event set's calls; "events" in Scenario.errors fails the wait)
        "memory_temperature", "pcie_replay", "nvlink", "events",
        # the video engines' utilisation, and HBM row remapping (its call and its fields)
        "encoder", "decoder", "remapped_rows",
    }
)  # fmt: skip

#: NVML error names (without the ``NVML_ERROR_`` prefix) the fake can return.
ERROR_NAMES = frozenset(
    {
        "UNINITIALIZED", "INVALID_ARGUMENT", "NOT_SUPPORTED", "NO_PERMISSION",
        "ALREADY_INITIALIZED", "NOT_FOUND", "INSUFFICIENT_SIZE", "INSUFFICIENT_POWER",
        "DRIVER_NOT_LOADED", "TIMEOUT", "IRQ_ISSUE", "LIBRARY_NOT_FOUND", "FUNCTION_NOT_FOUND",
        "CORRUPTED_INFOROM", "GPU_IS_LOST", "RESET_REQUIRED", "OPERATING_SYSTEM",
        "LIB_RM_VERSION_MISMATCH", "IN_USE", "MEMORY", "NO_DATA", "VGPU_ECC_NOT_SUPPORTED",
        "INSUFFICIENT_RESOURCES", "FREQ_NOT_SUPPORTED", "ARGUMENT_VERSION_MISMATCH",
        "DEPRECATED", "NOT_READY", "GPU_NOT_FOUND", "INVALID_STATE", "RESET_TYPE_NOT_SUPPORTED",
        "UNKNOWN",
    }
)  # fmt: skip

TIMESTAMP_CLOCKS = ("realtime", "monotonic", "boottime")


# --------------------------------------------------------------------------- scenario model
@dataclass(frozen=True)
class Pattern:
    """Utilisation over time: ``steady`` (always busy), ``burst`` or ``off``.

    Busy iff ``(t - epoch + phase_s) mod period_s < duty * period_s`` for ``burst``.  While
    busy the driver reports ``busy_pct``, while idle ``idle_pct``; ``noise_pct`` adds a
    deterministic jitter (a hash of the sample index) to each driver sample.
    """

    kind: str = "steady"
    busy_pct: float = 100.0
    idle_pct: float = 0.0
    period_s: float = 1.0
    duty: float = 0.5
    phase_s: float = 0.0
    noise_pct: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("steady", "burst", "off"):
            raise ValueError(f"unknown pattern kind {self.kind!r}")
        if not 0.0 <= self.duty <= 1.0:
            raise ValueError(f"duty must be within 0..1, not {self.duty}")
        if self.period_s <= 0:
            raise ValueError("period_s must be positive")

    @classmethod
    def steady(cls, pct: float = 100.0, noise_pct: float = 0.0) -> Pattern:
        """Always busy at ``pct`` (e.g. a compute-bound job, or a sync stall spinning)."""
        return cls("steady", busy_pct=pct, noise_pct=noise_pct)

    @classmethod
    def burst(
        cls,
        period_s: float = 1.0,
        duty: float = 0.5,
        *,
        busy_pct: float = 100.0,
        idle_pct: float = 0.0,
        phase_s: float = 0.0,
        noise_pct: float = 0.0,
    ) -> Pattern:
        """Busy for ``duty * period_s`` out of every ``period_s`` (a starved input pipeline)."""
        return cls("burst", busy_pct, idle_pct, period_s, duty, phase_s, noise_pct)

    @classmethod
    def off(cls) -> Pattern:
        """Never busy (an idle GPU)."""
        return cls("off")

    def busy_fraction(self, t0: float, t1: float, epoch: float) -> float:
        """Busy fraction of [t0, t1] (monotonic seconds): what the fake integrates, for tests."""

        def cum(u: float) -> float:
            if self.kind == "off":
                return 0.0
            if self.kind == "steady":
                return u
            n = u // self.period_s
            r = u - n * self.period_s
            return n * self.duty * self.period_s + min(r, self.duty * self.period_s)

        off = self.phase_s - epoch
        return (cum(t1 + off) - cum(t0 + off)) / (t1 - t0)


@dataclass(frozen=True)
class Process:
    """A process holding a CUDA context on a GPU.

    ``sm_util=None`` makes its per-process SM utilisation follow the GPU's 1 s utilisation.
    """

    pid: int
    used_mem: int = 1 * GiB
    sm_util: int | None = None
    mem_util: int = 0


@dataclass(frozen=True)
class MigInstance:
    """A MIG GPU instance of a GPU, with its GPM percentages while the GPU is busy.

    ``None`` makes that metric NOT_SUPPORTED.  Listing any instance turns MIG on for the GPU
    (``nvmlDeviceGetMigMode`` says enabled; the whole-GPU GPM sample is NOT_SUPPORTED, each
    instance is read with ``nvmlGpmMigSampleGet``).
    """

    gpu_instance_id: int
    sm_active_pct: float | None = 80.0
    sm_occupancy_pct: float | None = 40.0
    tensor_active_pct: float | None = 30.0


@dataclass(frozen=True)
class XidError:
    """An XID critical error the GPU reports at ``t_mono_s`` (time.monotonic(), default:
    when this is made), delivered through NVML events (nvmlEventSetWait_v2) to every event
    set that registered the GPU before then.  The time is absolute, so a scenario rewritten
    with the same errors delivers none of them twice."""

    code: int
    t_mono_s: float = field(default_factory=time.monotonic)


def _pct(value: float | None) -> str:
    return "-1" if value is None else repr(float(value))


@dataclass
class FakeGPU:
    """One scripted GPU; the defaults describe an H100 SXM (80 GiB, 700 W)."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str | None = None  #: None: derived from the index
    bus_id: str | None = None  #: None: ``00000000:<0x17+index>:00.0``
    serial: str | None = None
    mem_total: int = 80 * GiB
    mem_used: int | None = None  #: None: mem_reserved + the processes' memory
    mem_reserved: int = 512 * MiB
    power_limit_w: float = 700.0
    power_idle_w: float = 90.0
    power_busy_w: float = 650.0  #: drawn at 100 % duty; low values model a busy-wait stall
    sm_clock_mhz: int = 1980
    sm_clock_idle_mhz: int = 0  #: 0: the clock stays at sm_clock_mhz while idle
    sm_clock_max_mhz: int = 1980
    mem_clock_mhz: int = 2619
    temperature_c: int = 40
    fan_pct: int = 30
    pcie_rx_kbps: int = 0
    pcie_tx_kbps: int = 0
    sample_period_s: float = 1.0 / 6.0
    buffer_len: int = 120
    idle_no_samples: bool = False  #: a sample period under 0.5 % busy records no sample
    samples_supported: bool = True
    pattern: Pattern = field(default_factory=Pattern)
    mem_busy_pct: float = 40.0  #: memory-controller utilisation while busy
    clock_reasons: int = 0  #: extra clocks-event bits (0x1 "idle" is added when idle)
    pstate_idle: int = 0  #: performance state when idle for the last second
    processes: list[Process] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)  #: call names → NOT_SUPPORTED
    errors: dict[str, str] = field(default_factory=dict)  #: call name → NVML error name
    lost: bool = False  #: every call on this GPU returns GPU_IS_LOST
    #: Hopper's GPM counters: nvmlGpmQueryDeviceSupport says supported, samples can be taken.
    #: Over two samples each metric is the pattern's busy fraction between them times the
    #: percentage below (None: that metric NOT_SUPPORTED).  Steady 100 % with
    #: ``gpm_sm_active_pct=2`` is a GPU that reads busy while its SMs idle (NCCL spinning).
    gpm_supported: bool = False
    gpm_sm_active_pct: float | None = 80.0
    gpm_sm_occupancy_pct: float | None = 40.0
    gpm_tensor_active_pct: float | None = 30.0
    #: GPM's DRAM bandwidth and FP pipes, read the same way (NVML_GPM_METRIC_DRAM_BW_UTIL,
    #: FP64_UTIL, FP32_UTIL, FP16_UTIL); a MIG instance has none of them here.
    gpm_dram_active_pct: float | None = 50.0
    gpm_fp64_active_pct: float | None = 10.0
    gpm_fp32_active_pct: float | None = 20.0
    gpm_fp16_active_pct: float | None = 5.0
    mig: list[MigInstance] = field(default_factory=list)  #: MIG instances (MIG on if any)
    memory_temperature_c: int = 50  #: field NVML_FI_DEV_MEMORY_TEMP
    #: ECC error counts: volatile (since the driver loaded) and aggregate (the GPU's life).
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    ecc_corrected_aggregate: int = 0
    ecc_uncorrected_aggregate: int = 0
    pcie_replays: int = 0  #: PCIe replay counter
    nvlink_links: int = 18  #: 0: no NVLink (its fields are NOT_SUPPORTED)
    nvlink_tx_kbps: int = 0  #: KiB/s over all links; the throughput fields count KiB
    nvlink_rx_kbps: int = 0
    xid_errors: list[XidError] = field(default_factory=list)  #: delivered as NVML events
    #: The video engines' utilisation, % (nvmlDeviceGetEncoderUtilization / Decoder...).
    encoder_pct: int = 0
    decoder_pct: int = 0
    #: HBM row remapping (Ampere and later; nvmlDeviceGetRemappedRows and the field values
    #: NVML_FI_DEV_REMAPPED_*): rows remapped for correctable and uncorrectable errors, a
    #: remapping waiting for a GPU reset, a remapping that failed (the GPU needs service).
    remapped_rows_corrected: int = 0
    remapped_rows_uncorrected: int = 0
    row_remap_pending: bool = False
    row_remap_failed: bool = False
    #: A file processes write their kernels, spins, contexts and allocations into
    #: (tests/livelab/emulator.py): utilisation, power, GPM, memory and the process list
    #: then follow what they do, and ``pattern`` is not used.
    driven: str | os.PathLike[str] | None = None

    def default_uuid(self, index: int) -> str:
        """The UUID used when ``uuid`` is None (stable per index)."""
        return f"GPU-{0xFA4E0000 + index:08x}-0000-4000-8000-{index:012x}"

    def effective_uuid(self, index: int) -> str:
        return self.uuid or self.default_uuid(index)

    def effective_bus_id(self, index: int) -> str:
        return self.bus_id or f"00000000:{0x17 + index:02X}:00.0"

    def effective_mem_used(self) -> int:
        if self.mem_used is not None:
            return self.mem_used
        return self.mem_reserved + sum(p.used_mem for p in self.processes)

    def lines(self, index: int) -> list[str]:
        """Serialise to the scenario file's ``[gpu]`` block."""
        _check_calls(self.unsupported, self.errors)
        if len(self.processes) > MAX_PROCS:
            raise ValueError(f"the fake supports at most {MAX_PROCS} processes per GPU")
        pat = self.pattern
        out = [
            "[gpu]",
            f"name={_clean(self.name)}",
            f"uuid={_clean(self.effective_uuid(index))}",
            f"bus_id={_clean(self.effective_bus_id(index))}",
            f"serial={_clean(self.serial or f'16543210{index:04d}')}",
            f"mem_total={int(self.mem_total)}",
            f"mem_used={int(self.effective_mem_used())}",
            f"mem_reserved={int(self.mem_reserved)}",
            f"power_limit_w={self.power_limit_w!r}",
            f"power_idle_w={self.power_idle_w!r}",
            f"power_busy_w={self.power_busy_w!r}",
            f"sm_clock_mhz={int(self.sm_clock_mhz)}",
            f"sm_clock_idle_mhz={int(self.sm_clock_idle_mhz)}",
            f"sm_clock_max_mhz={int(self.sm_clock_max_mhz)}",
            f"mem_clock_mhz={int(self.mem_clock_mhz)}",
            f"temperature_c={int(self.temperature_c)}",
            f"fan_pct={int(self.fan_pct)}",
            f"pcie_rx_kbps={int(self.pcie_rx_kbps)}",
            f"pcie_tx_kbps={int(self.pcie_tx_kbps)}",
            f"sample_period_s={self.sample_period_s!r}",
            f"buffer_len={int(self.buffer_len)}",
            f"idle_no_samples={int(self.idle_no_samples)}",
            f"samples_supported={int(self.samples_supported)}",
            f"pattern={pat.kind}",
            f"busy_pct={pat.busy_pct!r}",
            f"idle_pct={pat.idle_pct!r}",
            f"period_s={pat.period_s!r}",
            f"duty={pat.duty!r}",
            f"phase_s={pat.phase_s!r}",
            f"noise_pct={pat.noise_pct!r}",
            f"mem_busy_pct={self.mem_busy_pct!r}",
            f"clock_reasons={int(self.clock_reasons)}",
            f"pstate_idle={int(self.pstate_idle)}",
            f"lost={int(self.lost)}",
            f"gpm_supported={int(self.gpm_supported)}",
            f"gpm_sm_active_pct={_pct(self.gpm_sm_active_pct)}",
            f"gpm_sm_occupancy_pct={_pct(self.gpm_sm_occupancy_pct)}",
            f"gpm_tensor_active_pct={_pct(self.gpm_tensor_active_pct)}",
            f"gpm_dram_active_pct={_pct(self.gpm_dram_active_pct)}",
            f"gpm_fp64_active_pct={_pct(self.gpm_fp64_active_pct)}",
            f"gpm_fp32_active_pct={_pct(self.gpm_fp32_active_pct)}",
            f"gpm_fp16_active_pct={_pct(self.gpm_fp16_active_pct)}",
            f"encoder_pct={int(self.encoder_pct)}",
            f"decoder_pct={int(self.decoder_pct)}",
            f"remapped_rows_corrected={int(self.remapped_rows_corrected)}",
            f"remapped_rows_uncorrected={int(self.remapped_rows_uncorrected)}",
            f"row_remap_pending={int(self.row_remap_pending)}",
            f"row_remap_failed={int(self.row_remap_failed)}",
        ]
        if len(self.mig) > 7:
            raise ValueError("a GPU has at most 7 MIG GPU instances")
        if self.driven is not None:
            driven = _clean(str(Path(self.driven).resolve()))
            if len(driven.encode()) > 255:
                raise ValueError(f"the driven file's path is too long for the fake: {driven}")
            out.append(f"driven={driven}")
        for m in self.mig:
            out.append(
                f"mig_instance={int(m.gpu_instance_id)},{_pct(m.sm_active_pct)},"
                f"{_pct(m.sm_occupancy_pct)},{_pct(m.tensor_active_pct)}"
            )
        out += [
            f"memory_temperature_c={int(self.memory_temperature_c)}",
            f"ecc_corrected={int(self.ecc_corrected)}",
            f"ecc_uncorrected={int(self.ecc_uncorrected)}",
            f"ecc_corrected_aggregate={int(self.ecc_corrected_aggregate)}",
            f"ecc_uncorrected_aggregate={int(self.ecc_uncorrected_aggregate)}",
            f"pcie_replays={int(self.pcie_replays)}",
            f"nvlink_links={int(self.nvlink_links)}",
            f"nvlink_tx_kbps={int(self.nvlink_tx_kbps)}",
            f"nvlink_rx_kbps={int(self.nvlink_rx_kbps)}",
        ]
        if len(self.xid_errors) > MAX_XIDS:
            raise ValueError(f"the fake supports at most {MAX_XIDS} XID errors per GPU")
        if len({x.t_mono_s for x in self.xid_errors}) != len(self.xid_errors):
            raise ValueError("two XID errors of one GPU at the same time: give each its own")
        out += [f"xid={x.t_mono_s!r},{int(x.code)}" for x in self.xid_errors]
        for p in self.processes:
            if not isinstance(p, Process):
                p = Process(*p)
            sm = -1 if p.sm_util is None else int(p.sm_util)
            out.append(f"process={int(p.pid)},{int(p.used_mem)},{sm},{int(p.mem_util)}")
        out += _error_lines(self.unsupported, self.errors)
        return out


@dataclass
class Scenario:
    """The whole fake machine: driver facts, injected failures and the GPUs."""

    gpus: list[FakeGPU] = field(default_factory=lambda: [FakeGPU()])
    driver_version: str = "550.54.15"
    nvml_version: str = "12.550.54.15"
    cuda_version: int = 12040
    init_error: str | None = None  #: e.g. "DRIVER_NOT_LOADED": nvmlInit fails with it
    timestamp_clock: str = "realtime"  #: clock of driver-sample timestamps (µs)
    #: seconds added to that clock: rewritten mid-run, the clock steps (NTP, a resumed VM)
    timestamp_offset_s: float = 0.0
    #: time.monotonic() origin of the patterns.  None: when the file is written, snapped back
    #: (by less than one sample period) to each GPU's sample grid, so a burst starts on a sample
    #: boundary and sample values do not depend on where the write fell between two samples.
    epoch: float | None = None
    unsupported: set[str] = field(default_factory=set)  #: for every GPU / system call
    errors: dict[str, str] = field(default_factory=dict)  #: e.g. {"count": "NO_PERMISSION"}

    @classmethod
    def uniform(cls, n_gpus: int, pattern: Pattern | None = None, **kwargs: object) -> Scenario:
        """``n_gpus`` identical GPUs (each with its own UUID and bus id).

        Keyword arguments naming a Scenario field (``epoch``, ``timestamp_clock``, ...) go to
        the scenario, the rest to every FakeGPU.
        """
        own = {f.name for f in fields(cls)} - {"gpus"}
        scn_kw = {k: v for k, v in kwargs.items() if k in own}
        gpu_kw = {k: v for k, v in kwargs.items() if k not in own}
        pat = pattern or Pattern()
        gpus = [FakeGPU(pattern=pat, **gpu_kw) for _ in range(n_gpus)]  # type: ignore[arg-type]
        return cls(gpus=gpus, **scn_kw)  # type: ignore[arg-type]

    @classmethod
    def no_driver(cls) -> Scenario:
        """nvmlInit fails with DRIVER_NOT_LOADED (the library exists, the kernel module not)."""
        return cls(gpus=[], init_error="DRIVER_NOT_LOADED")

    def with_gpu(self, index: int, **changes: object) -> Scenario:
        """A copy with GPU ``index`` changed (handy for mid-run rewrites)."""
        gpus = list(self.gpus)
        gpus[index] = replace(gpus[index], **changes)  # type: ignore[arg-type]
        return replace(self, gpus=gpus)

    def to_text(self, now: float | None = None) -> str:
        """Serialise; ``now`` (time.monotonic()) fills a missing epoch."""
        if self.timestamp_clock not in TIMESTAMP_CLOCKS:
            raise ValueError(f"timestamp_clock must be one of {TIMESTAMP_CLOCKS}")
        _check_calls(self.unsupported, self.errors)
        if len(self.gpus) > MAX_GPUS:
            raise ValueError(f"the fake supports at most {MAX_GPUS} GPUs")
        if self.init_error is not None:
            _check_error(self.init_error)
        epoch = self.epoch if self.epoch is not None else (time.monotonic() if now is None else now)
        lines = [
            "# fakenvml scenario (tests/fakenvml)",
            f"driver_version={_clean(self.driver_version)}",
            f"nvml_version={_clean(self.nvml_version)}",
            f"cuda_version={int(self.cuda_version)}",
            f"init_error={self.init_error or ''}",
            f"timestamp_clock={self.timestamp_clock}",
            f"timestamp_offset_s={float(self.timestamp_offset_s)!r}",
            f"epoch={epoch!r}",
            f"epoch_align={int(self.epoch is None)}",
            *_error_lines(self.unsupported, self.errors),
        ]
        for i, gpu in enumerate(self.gpus):
            lines += gpu.lines(i)
        return "\n".join(lines) + "\n"


def _clean(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise ValueError(f"newline in scenario value {value!r}")
    return value


def _check_error(name: str) -> str:
    name = name.upper().removeprefix("NVML_ERROR_")
    if name not in ERROR_NAMES:
        raise ValueError(f"unknown NVML error {name!r}")
    return name


def _check_calls(unsupported: Iterable[str], errors: Mapping[str, str]) -> None:
    for call in [*unsupported, *errors]:
        if call not in CALL_NAMES:
            raise ValueError(f"unknown call name {call!r}; known: {sorted(CALL_NAMES)}")
    for err in errors.values():
        _check_error(err)


def _error_lines(unsupported: Iterable[str], errors: Mapping[str, str]) -> list[str]:
    out = []
    if unsupported:
        out.append("unsupported=" + ",".join(sorted(unsupported)))
    out += [f"error={call}={_check_error(err)}" for call, err in sorted(errors.items())]
    return out


def write_scenario(path: str | os.PathLike[str], scenario: Scenario) -> Path:
    """Write atomically (temp file + os.replace) so a running fake never reads half a file."""
    path = Path(path)
    text = scenario.to_text()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# --------------------------------------------------------------------------- the library
def _cache_root() -> Path:
    """``tests/fakenvml/_build`` if writable, else a folder under $TMPDIR."""
    root = HERE / "_build"
    try:
        root.mkdir(exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    root = Path(tempfile.gettempdir()) / f"fakenvml-{os.getuid()}"
    root.mkdir(exist_ok=True)
    return root


# -Og: about twice as fast to build as -O2 (under a second), and calls cost about the same.
CFLAGS = ["-shared", "-fPIC", "-Og", "-pipe", "-Wall", "-Wextra", f"-Wl,-soname,{LIB_NAME}"]


def build_library(force: bool = False) -> Path:
    """Compile the fake once per source version (cached by hash); returns the .so path.

    Safe when several processes build at once: each compiles to its own temp name, then
    renames over the final name.
    """
    src = C_SOURCE.read_bytes()
    digest = hashlib.sha256(src + " ".join(CFLAGS).encode()).hexdigest()[:16]
    out_dir = _cache_root() / digest
    lib = out_dir / LIB_NAME
    if lib.exists() and not force:
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC", "gcc")
    tmp = out_dir / f".{LIB_NAME}.{os.getpid()}.tmp"
    cmd = [cc, *CFLAGS, "-o", str(tmp), str(C_SOURCE), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"building the fake NVML failed:\n{' '.join(cmd)}\n{proc.stderr}")
    os.replace(tmp, lib)
    return lib


def lib_dir() -> Path:
    """The folder holding the built ``libnvidia-ml.so.1`` (for LD_LIBRARY_PATH)."""
    return build_library().parent


def fake_env(
    scenario_path: str | os.PathLike[str], base_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment for a child process whose pynvml should load the fake."""
    env = dict(os.environ if base_env is None else base_env)
    old = env.get("LD_LIBRARY_PATH")
    d = str(lib_dir())
    env["LD_LIBRARY_PATH"] = d + (os.pathsep + old if old else "")
    env[ENV_SCENARIO] = str(Path(scenario_path).resolve())
    return env


def missing_library_env(base_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment in which ``libnvidia-ml.so.1`` cannot be loaded (pynvml: LibraryNotFound).

    LD_LIBRARY_PATH leads first to a non-ELF file of that name, so dlopen fails even on a
    machine with a real driver in the linker cache (an empty folder would not hide that one).
    """
    blocker = _cache_root() / "no-nvml"
    blocker.mkdir(exist_ok=True)
    stub = blocker / LIB_NAME
    if not stub.exists():
        tmp = blocker / f".{LIB_NAME}.{os.getpid()}.tmp"
        tmp.write_bytes(b"not an ELF file: fakenvml's stand-in for a missing driver\n" * 64)
        os.replace(tmp, stub)
    env = dict(os.environ if base_env is None else base_env)
    env["LD_LIBRARY_PATH"] = str(blocker)
    env.pop(ENV_SCENARIO, None)
    return env


_loaded: ctypes.CDLL | None = None


def load_in_process(scenario_path: str | os.PathLike[str]) -> ctypes.CDLL:
    """Make this process's pynvml use the fake; call ``pynvml.nvmlInit()`` afterwards.

    Preloads the fake with RTLD_GLOBAL (glibc then reuses it for pynvml's
    ``CDLL("libnvidia-ml.so.1")``) and resets pynvml's cached library and function pointers.
    The returned handle exposes the test hooks ``fakenvml_sizeof`` / ``fakenvml_reload``.
    Refuses if another library of that soname (a real driver) is already loaded here.
    """
    global _loaded
    import pynvml

    os.environ[ENV_SCENARIO] = str(Path(scenario_path).resolve())
    if _loaded is None:
        _loaded = ctypes.CDLL(str(build_library()), mode=ctypes.RTLD_GLOBAL)
        _loaded.fakenvml_reload.restype = ctypes.c_longlong
        _loaded.fakenvml_generation.restype = ctypes.c_longlong
        _loaded.fakenvml_sizeof.argtypes = [ctypes.c_char_p]
        _loaded.fakenvml_calls.restype = ctypes.c_longlong
        _loaded.fakenvml_calls.argtypes = [ctypes.c_char_p]
    check = ctypes.CDLL(LIB_NAME)
    if not hasattr(check, "fakenvml_sizeof"):
        raise RuntimeError("a real libnvidia-ml.so.1 is already loaded in this process")
    with pynvml.libLoadLock:
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
    return _loaded


def call_count(name: str) -> int:
    """How many calls of ``name`` (a scenario call name: "gpm", "samples", ...) this process
    made into the fake since it was loaded (``load_in_process`` first)."""
    if _loaded is None:
        raise RuntimeError("the fake is not loaded in this process (load_in_process first)")
    if name not in CALL_NAMES:
        raise ValueError(f"unknown call name {name!r}")
    return int(_loaded.fakenvml_calls(name.encode()))


def unload_in_process() -> None:
    """Undo ``load_in_process``: shut the fake down fully and make pynvml forget it.

    The library stays mapped (glibc keeps it), but the next ``load_in_process`` starts clean.
    """
    import pynvml

    if _loaded is not None:
        for _ in range(1000):  # until it answers UNINITIALIZED
            if _loaded.nvmlShutdown() != 0:
                break
    with pynvml.libLoadLock:
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
