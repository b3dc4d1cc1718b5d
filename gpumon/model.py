"""The one data model every part of gpumon speaks: samples in, findings out.

All times are seconds on one monotonic clock (``time.monotonic()`` of the process that
sampled; a trace keeps the wall-clock time of its start in its header so humans can read
it).  NVML's own sample timestamps are converted to that clock once, in
``gpumon.sample.nvml``.

"No reading" is ``None``, never 0: the detector must tell an idle GPU from a field the
card does not support.  Units are in the field names.

Samples are values: treat them as immutable (``dataclasses.replace`` makes changed
copies).  The per-tick sample types are not ``frozen`` only because a frozen dataclass
costs five times as much to build, and ``gpumon analyze`` builds millions of them; they
stay hashable by value (``unsafe_hash``) like frozen ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, NamedTuple, TypedDict


class State(StrEnum):
    """What a GPU (or a run) is doing, as the detector classifies it."""

    HEALTHY = "healthy"
    STARVED = "starved"
    SYNC_STALL = "sync_stall"
    IDLE = "idle"
    UNKNOWN = "unknown"


class Cause(StrEnum):
    """Why a starved GPU waits, where host data can tell."""

    CPU = "cpu"  # the job's data-loading workers (or the job as a whole) saturate the CPUs
    GIL = "gil"  # one process of the job pinned at one core does the loading
    IO = "io"  # storage does not keep up
    CONTENTION = "contention"  # processes outside the job take the CPUs the job needs
    UNKNOWN = "unknown"


class Reason(StrEnum):
    """Why an episode has its state, where that is more than the state itself says.

    Faces decide on these (dstat shows start-up apart, the exporter marks the straggler),
    never on the note text, which is for people.
    """

    START_UP = "start-up"  # before the first sustained work
    JUDGING = "judging"  # work has begun, too little of it to judge: a provisional reading
    NO_PROCESS = "no process"
    MEMORY_HELD = "memory allocated, no work"
    NO_WORK = "no work"
    GPU_LOST = "GPU lost"
    NO_DATA = "no utilisation data"
    TOO_LITTLE_DATA = "too little data"
    COARSE_DATA = "coarse data"
    SHORT_LOG = "short log"
    PERIODIC_GAPS = "periodic gaps"
    STRAGGLER = "straggler"  # its peers wait on it
    BUSY_WAIT = "busy-wait"  # waits on a peer, reading busy
    SYNC_PAUSES = "all GPUs pause together"
    HANG = "hang"  # every GPU spins in a collective and none computes: no progress
    CHECKPOINT = "checkpoint"  # its waits are spent writing a checkpoint (Python stacks)
    EVALUATION = "evaluation"  # its waits are spent in an evaluation loop (Python stacks)
    NOT_CLASSIFIED = "no GPU could be classified"


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """A GPU as discovered once at start-up; keyed by UUID, index kept as a label."""

    index: int
    uuid: str
    name: str | None = None
    pci_bus_id: str | None = None
    mem_total_bytes: int | None = None
    power_limit_watts: float | None = None  # nvmlDeviceGetEnforcedPowerLimit at discovery


class UtilPoint(NamedTuple):
    """One sample from the driver's utilisation buffer (nvmlDeviceGetSamples).

    ``util_pct`` is the share of the driver's sample period (1/6 s to 1 s, by product)
    during which any kernel ran.  ``t_s`` is the end of that period on gpumon's clock.

    A point is a ``(t_s, util_pct)`` pair and code reads it as one (``for t, u in
    points``): the trace readers hand on plain tuples, which cost a tenth of building a
    named object per sample, and ``gpumon analyze`` reads millions of them.
    """

    t_s: float
    util_pct: float


Point = tuple[float, float]  # (t_s, util_pct): a UtilPoint or a plain pair


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention (docstring)
class GpuProcess:
    """A process holding a CUDA context on a GPU (nvmlDeviceGetComputeRunningProcesses)."""

    pid: int
    used_mem_bytes: int | None = None
    sm_util_pct: float | None = None  # nvmlDeviceGetProcessUtilization, where supported


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention (docstring)
class MigActivity:
    """Hopper's GPM counters for one MIG GPU instance over the last tick (0-1 each)."""

    gpu_instance_id: int
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention (docstring)
class GpuSample:
    """Everything read from one GPU in one tick."""

    t_s: float
    gpu: int  # NVML index (a label; identity is the uuid)
    uuid: str
    # Driver buffer samples recorded since the previous tick, oldest first.  Empty when the
    # buffer had nothing new (NVML's NotFound) or is unsupported.
    util_samples: tuple[Point, ...] = ()
    util_pct: float | None = None  # nvmlDeviceGetUtilizationRates().gpu (utilization.gpu)
    mem_util_pct: float | None = None  # ...().memory (utilization.memory)
    mem_used_bytes: int | None = None  # memory.used
    mem_total_bytes: int | None = None  # memory.total
    power_watts: float | None = None  # power.draw
    power_limit_watts: float | None = None  # enforced.power.limit
    sm_clock_mhz: int | None = None  # clocks.sm
    clock_event_reasons: int | None = None  # clocks_event_reasons.active (bitmask)
    pcie_rx_bytes_per_s: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    temperature_c: float | None = None  # temperature.gpu
    processes: tuple[GpuProcess, ...] | None = None  # None: could not be read
    lost: bool = False  # NVML said GpuIsLost: the GPU fell off the bus
    # Fields NVML reported as NotSupported on this GPU (asked again only rarely).
    unsupported: tuple[str, ...] = ()
    # Hopper's GPM counters (nvmlGpmMetricsGet) over the interval since the previous tick,
    # as ratios 0-1; None on GPUs without GPM, on the first tick, or a metric not offered.
    sm_active_ratio: float | None = None  # share of SMs busy (NVML_GPM_METRIC_SM_UTIL)
    sm_occupancy_ratio: float | None = None  # warps resident vs the maximum (SM_OCCUPANCY)
    tensor_active_ratio: float | None = None  # SMs busy in tensor ops (ANY_TENSOR_UTIL)
    mig_activity: tuple[MigActivity, ...] = ()  # per MIG GPU instance, where MIG is on
    # Hardware health, read every few seconds (they change slowly); None where the GPU does
    # not report it (its name then in ``unsupported``) or before the first read.
    mem_clock_mhz: int | None = None  # clocks.mem (nvmlDeviceGetClockInfo, NVML_CLOCK_MEM)
    memory_temperature_c: float | None = None  # temperature.memory (NVML_FI_DEV_MEMORY_TEMP)
    fan_speed_pct: float | None = None  # fan.speed (nvmlDeviceGetFanSpeed)
    pstate: int | None = None  # pstate, 0 (P0, fastest) to 15 (nvmlDeviceGetPerformanceState)
    # Counters since the driver loaded (aggregate ECC: over the GPU's life), read with the
    # memory temperature in one nvmlDeviceGetFieldValues call:
    energy_joules: float | None = None  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ / 1000)
    ecc_corrected_errors: int | None = None  # ecc.errors.corrected.volatile.total
    ecc_uncorrected_errors: int | None = None  # ecc.errors.uncorrected.volatile.total
    ecc_corrected_errors_aggregate: int | None = None  # ...corrected.aggregate.total (lifetime)
    ecc_uncorrected_errors_aggregate: int | None = None  # ...uncorrected.aggregate.total
    pcie_replays: int | None = None  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
    nvlink_tx_bytes: int | None = None  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, all links
    nvlink_rx_bytes: int | None = None  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, all links
    # HBM rows remapped (Ampere and later; the GPU's life), in the same call:
    remapped_rows_corrected: int | None = None  # NVML_FI_DEV_REMAPPED_COR
    remapped_rows_uncorrected: int | None = None  # NVML_FI_DEV_REMAPPED_UNC
    row_remap_pending: int | None = None  # 1: a remapping waits for a GPU reset (..._PENDING)
    row_remap_failed: int | None = None  # 1: a remapping failed, the GPU needs service
    memory_reserved_bytes: int | None = None  # memory.reserved (nvmlMemory_v2): the driver's
    encoder_util_pct: float | None = None  # utilization.encoder (nvmlDeviceGetEncoderUtil...)
    decoder_util_pct: float | None = None  # utilization.decoder
    # GPM (Hopper and later) over the last tick, read with the health: 0-1 each.
    dram_active_ratio: float | None = None  # DRAM bandwidth used (NVML_GPM_METRIC_DRAM_BW_UTIL)
    fp64_active_ratio: float | None = None  # SMs busy in non-tensor FP64 math (FP64_UTIL)
    fp32_active_ratio: float | None = None  # ... FP32 (FP32_UTIL)
    fp16_active_ratio: float | None = None  # ... FP16 (FP16_UTIL)
    # XID codes of the critical errors NVML reported since the previous tick (an event set,
    # nvmlEventSetWait_v2), oldest first; "xid_events" in ``unsupported`` where not watched.
    xid_errors: tuple[int, ...] = ()


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention (docstring)
class HostSample:
    """Machine-wide CPU, iowait, load and memory over the last tick (psutil)."""

    t_s: float
    cpu_pct_per_core: tuple[float, ...] = ()
    cpu_pct: float | None = None  # mean over all cores, 0-100
    iowait_pct: float | None = None  # share of all-core time in iowait, 0-100
    load_1m: float | None = None
    load_5m: float | None = None
    load_15m: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    disk_read_bytes_per_s: float | None = None
    disk_write_bytes_per_s: float | None = None
    # The busiest processes outside the watched job, by CPU (% of one core) since the
    # previous scan: looked for only while the host is busy, a few times a minute (live).
    busiest_outside: tuple[ProcessSample, ...] = ()


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention (docstring)
class ProcessSample:
    """One process of the watched tree over the last tick."""

    pid: int
    ppid: int | None
    name: str | None
    cpu_pct: float | None  # percent of one core (200 = two cores busy)
    num_threads: int | None
    read_bytes_per_s: float | None
    write_bytes_per_s: float | None
    status: str | None  # psutil status: running, sleeping, disk-sleep, zombie, ...


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention (docstring)
class ProcTreeSample:
    """The watched process and all its descendants (DataLoader workers included)."""

    t_s: float
    root_pid: int
    processes: tuple[ProcessSample, ...] = ()
    root_alive: bool = True

    @property
    def root(self) -> ProcessSample | None:
        return next((p for p in self.processes if p.pid == self.root_pid), None)

    @property
    def workers(self) -> tuple[ProcessSample, ...]:
        return tuple(p for p in self.processes if p.pid != self.root_pid)


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention (docstring)
class Snapshot:
    """One tick: every GPU, the host and the watched tree, on one clock."""

    t_s: float
    gpus: tuple[GpuSample, ...] = ()
    host: HostSample | None = None
    tree: ProcTreeSample | None = None
    # The job's Python stacks sampled since the previous stacks (``--stacks``): empty
    # on most ticks, a window's worth on the tick it completed.
    stacks: tuple[StackSample, ...] = ()


@dataclass(frozen=True, slots=True)
class JobLabels:
    """A process's job, as label values ("" where unknown: Prometheus' 'absent').

    From the kubelet's pod-resources socket, ``pod`` and ``container`` are names.  From
    /proc only, ``pod`` is the pod's name where the process environment is readable, else
    its UID, and ``container`` the container id's first 12 hex digits (what ``crictl ps``
    shows), since /proc has no container names.

    Every job also has a ``kind`` (``slurm``, ``pod``, ``container``: Docker, Podman,
    containerd, nspawn outside Kubernetes; ``unit``: a systemd service or named scope;
    ``session``: a process tree in a login session or a desktop's terminal; ``process``: a
    process tree nobody placed), a ``name`` a person knows it by (the Slurm job id, the
    pod's, container's or unit's name; for a session or process, the pid of its top
    process, the one to give ``gpumon watch --pid``), its ``user`` (Slurm's job user, a
    pod's namespace, else the top process's user) and ``command`` (the top process's
    program and script, ``python train.py``).  A Docker or Podman container's name is also
    its ``container``.
    """

    hpc_job: str = ""
    pod: str = ""
    namespace: str = ""
    container: str = ""
    kind: str = ""
    name: str = ""
    user: str = ""
    command: str = ""

    @property
    def known(self) -> bool:
        return bool(self.hpc_job or self.pod or self.kind)

    def job_key(self) -> tuple[str, ...]:
        """What makes two processes the same job (containers of one pod are one job; a
        Slurm job is its id, whatever else its processes say)."""
        if self.hpc_job or self.pod:
            return (self.hpc_job, self.namespace, self.pod)
        return ("", self.kind, self.name, self.user)

    def as_dict(self) -> dict[str, str]:
        """The label names and values (as the exporter's series carry them)."""
        return {
            "hpc_job": self.hpc_job,
            "pod": self.pod,
            "namespace": self.namespace,
            "container": self.container,
            "job_kind": self.kind,
            "job_name": self.name,
            "user": self.user,
            "command": self.command,
        }


@dataclass(frozen=True, slots=True)
class TraceHeader:
    """What a trace (or a live session) knows about where its samples came from."""

    version: int
    source: str  # "gpumon", "nvidia-smi-csv", "dmon", "nvidia-smi-table", "csv"
    hostname: str | None = None
    started_wall_s: float | None = None  # Unix time when t_s == started_mono_s
    started_mono_s: float | None = None
    interval_s: float | None = None
    driver_version: str | None = None
    nvml_version: str | None = None
    cpu_count: int | None = None
    watched_pid: int | None = None
    command: tuple[str, ...] | None = None
    gpus: tuple[GpuIdentity, ...] = ()
    extra: dict[str, object] = field(default_factory=dict)


# --- What the detector says -------------------------------------------------------------


class Evidence(TypedDict, total=False):
    """The numbers behind a finding, in base units: a flat, JSON-friendly mapping (the
    log file, ``analyze --json`` and the summary carry it unchanged).  A key that could
    not be measured is absent, never 0.  Each key is a row of the one table of evidence
    fields (``gpumon.evidence_fields``: its unit, meaning and words); mypy needs the keys
    spelled out here and in ``EvidenceKey``, and a test holds both to the table."""

    # The GPU over its window (a closed episode's duty cycle is over the episode).
    duty_cycle: float  # 0-1, utilisation-weighted busy share
    window_s: float
    duration_s: float  # a closed episode's length
    samples: int
    sample_period_s: float
    burst_p50_s: float
    burst_p90_s: float
    gap_p50_s: float
    gap_p90_s: float
    period_s: float  # of its burst/gap cycle
    pause_interval_p50_s: float  # a rhythm of long gaps, or all-GPU pauses
    pause_p50_s: float
    pauses: int
    power_watts: float
    power_peak_watts: float
    power_limit_watts: float
    power_share_of_peak: float
    sm_active_ratio: float  # GPM, Hopper and later
    sm_occupancy_ratio: float
    tensor_active_ratio: float
    mem_used_bytes: int
    mem_total_bytes: int
    mem_headroom_ratio: float
    larger_batch_fits: str  # "yes" or "no"
    processes: int
    # The host and the job's process tree, averaged over the GPU's gaps.
    cpu_count: int
    main_cpu_pct: float  # the job's main process, % of one core
    workers_cpu_pct: float  # per worker, % of one core
    workers: float  # mean worker count over the gaps
    host_cpu_pct: float  # all cores, 0-100
    iowait_pct: float
    read_bytes_per_s: float
    max_core_pct: float
    tree_cpu_pct: float  # the job's whole process tree, % of one core (300: three cores)
    tree_runnable: float  # the job's processes running or waiting to run (mean)
    outside_cpu_pct: float  # used by processes outside the job, % of one core
    outside_top: str  # the busiest of them: "name (pid N, 340 %)"
    # The run.
    gpus: int
    effective_gpus: float
    straggler_gpu: int
    skew_s: float
    lost_gpu_seconds: float
    # The job's Python stacks over the gaps (``--stacks``): what its processes did while
    # the GPU waited, by role (an Activity value), its share and where in the code.
    main_activity: str
    main_activity_share: float
    main_where: str  # "train.py:42 train -> torch...dataloader._BaseDataLoaderIter.__next__"
    workers_activity: str
    workers_activity_share: float
    workers_where: str
    straggler_where: str  # the straggler rank's code while its peers wait in a collective
    stack_seconds: float  # seconds of stack samples behind these (gap-weighted)


# Evidence's keys as a type (a test holds it to Evidence and gpumon.evidence_fields).
EvidenceKey = Literal[
    "duty_cycle",
    "window_s",
    "duration_s",
    "samples",
    "sample_period_s",
    "burst_p50_s",
    "burst_p90_s",
    "gap_p50_s",
    "gap_p90_s",
    "period_s",
    "pause_interval_p50_s",
    "pause_p50_s",
    "pauses",
    "power_watts",
    "power_peak_watts",
    "power_limit_watts",
    "power_share_of_peak",
    "sm_active_ratio",
    "sm_occupancy_ratio",
    "tensor_active_ratio",
    "mem_used_bytes",
    "mem_total_bytes",
    "mem_headroom_ratio",
    "larger_batch_fits",
    "processes",
    "cpu_count",
    "main_cpu_pct",
    "workers_cpu_pct",
    "workers",
    "host_cpu_pct",
    "iowait_pct",
    "read_bytes_per_s",
    "max_core_pct",
    "tree_cpu_pct",
    "tree_runnable",
    "outside_cpu_pct",
    "outside_top",
    "gpus",
    "effective_gpus",
    "straggler_gpu",
    "skew_s",
    "lost_gpu_seconds",
    "main_activity",
    "main_activity_share",
    "main_where",
    "workers_activity",
    "workers_activity_share",
    "workers_where",
    "straggler_where",
    "stack_seconds",
]


class Lever(StrEnum):
    """What a piece of advice asks the user to change: a summary says each lever once,
    whatever the wording (``detect/advice.py`` words it)."""

    WORKERS = "workers"  # more DataLoader workers (CPU-saturated ones)
    OFFLOAD = "offload"  # decoding/augmentation onto the GPU, or offline
    GIL = "gil"  # loading out of the main process
    STORAGE = "storage"  # faster or closer storage, a sequential format
    PREFETCH = "prefetch"  # overlap loading with compute
    RHYTHM = "rhythm"  # a regular stall: persistent workers, async checkpoints
    RECORD = "record"  # record host data to tell causes apart
    PINNING = "pinning"  # pinned memory, non-blocking copies
    BATCH = "batch"  # the batch size, memory
    STRAGGLER = "straggler"  # the rank the others wait on
    EVEN_SPLIT = "even_split"  # equal work per rank
    CHECKPOINT = "checkpoint"  # checkpoints and host-side syncs
    STUCK = "stuck"  # memory held, no kernels
    RESOLUTION = "resolution"  # a finer recording
    CONTENTION = "contention"  # processes outside the job take the CPUs
    HANG = "hang"  # find the rank everyone waits on
    EVALUATION = "evaluation"  # evaluate less often, or elsewhere
    CODE = "code"  # the code the job's processes spend the gaps in (Python stacks)
    HOST_SYNC = "host_sync"  # the host waits on the GPU each step
    STRAGGLER_CODE = "straggler_code"  # where the straggler rank is while its peers wait
    REMOTE_INPUT = "remote_input"  # the job sleeps: its input waits beyond this host
    STRAGGLER_NODE = "straggler_node"  # the node a job across nodes waits on


@dataclass(frozen=True, slots=True)
class Advice:
    """One piece of advice: the lever it pulls, its words, and the numbers in them.

    Code groups and filters advice by ``lever`` (and ``numbers``), never by its words, so
    rewording a sentence changes what people read and nothing else."""

    lever: Lever
    text: str  # for people, worded once (``detect/advice.py``)
    # (name, value): the figures the text names, unrounded; two pieces that read the same
    # are the same advice, so they take no part in equality.
    numbers: tuple[tuple[str, float], ...] = field(default=(), compare=False)

    def number(self, name: str) -> float | None:
        """The figure named ``name`` in this advice, if it has one."""
        return next((v for k, v in self.numbers if k == name), None)

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True, kw_only=True)
class Episode:
    """A stretch of time one GPU (or the run, gpu=None) spent in one state."""

    gpu: int | None
    uuid: str | None
    state: State
    cause: Cause | None
    start_s: float
    end_s: float | None  # None while the episode is still open
    evidence: Evidence = field(default_factory=lambda: Evidence())
    advice: tuple[Advice, ...] = ()
    note: str | None = None  # for people: the reason in words, with its numbers
    reason: Reason | None = None  # for code: why this state (faces decide on it)

    @property
    def duration_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.start_s


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuVerdict:
    """The detector's current view of one GPU."""

    gpu: int
    uuid: str
    state: State
    cause: Cause | None
    since_s: float | None
    evidence: Evidence = field(default_factory=lambda: Evidence())
    advice: tuple[Advice, ...] = ()
    note: str | None = None
    reason: Reason | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The detector's current view of the run: every GPU and the run as a whole."""

    t_s: float | None
    state: State
    cause: Cause | None
    gpus: tuple[GpuVerdict, ...] = ()
    evidence: Evidence = field(default_factory=lambda: Evidence())
    advice: tuple[Advice, ...] = ()
    note: str | None = None
    reason: Reason | None = None


# --- Python stacks (``--stacks``) -----------------------------------------------------------


class ProcessRole(StrEnum):
    """What a process of the job is for, as its stacks are read."""

    MAIN = "main"  # the process driving the GPU (the only one, or the watched root)
    RANK = "rank"  # one of several processes driving GPUs (torchrun, mpirun)
    WORKER = "worker"  # a descendant of a main or rank process (DataLoader workers)


@dataclass(frozen=True, slots=True)
class StackFrame:
    """One Python frame as py-spy reads it."""

    name: str  # the function, qualified where Python says (``Queue.get``)
    file: str  # package-relative for installed code (``torch/utils/data/dataloader.py``),
    # the file's name for the job's own code (``dataset.py``)
    line: int | None = None
    library: bool = False  # installed code (site-packages or the standard library)
    code: str | None = None  # the line's source, read for the innermost frame (a call into
    # C, which no Python frame shows, shows only there: ``pickle.dump(state, f)``)


@dataclass(frozen=True, slots=True)
class StackSample:
    """A process's main-thread stack, held from ``t_s`` for ``seconds``."""

    t_s: float
    seconds: float
    pid: int
    role: ProcessRole
    frames: tuple[StackFrame, ...]  # innermost first
