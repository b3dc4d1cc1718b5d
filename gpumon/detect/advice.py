"""Short, actionable advice per finding, chosen from the evidence that backs it.

Each piece of advice is a ``model.Advice``: the *lever* it pulls (the number of workers,
pinned memory, the batch size, ...), its words and the numbers in them.  Texts carry
numbers (``raise num_workers from 8 to about 20``), so a run's episodes give several
wordings of one lever; a summary says each lever once, in the wording that held most of
the time, and groups by the lever each piece carries, never by its words.  Every wording
is made here, by ``_say``, next to the lever it pulls.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumon.detect.config import DetectorConfig
from gpumon.model import Advice, Cause, Evidence, EvidenceKey, Lever, Reason, State

_GIB = 1024**3

# Levers that help whatever the cause: a summary says them after the causes' remedies.
GENERAL_LEVERS = frozenset({Lever.PINNING, Lever.BATCH})


def _say(lever: Lever, text: str, **numbers: float) -> Advice:
    """One piece of advice: its words, the lever they pull and the figures they name."""
    return Advice(lever, text, tuple(numbers.items()))


def _num(ev: Evidence, key: EvidenceKey) -> float | None:
    v = ev.get(key)
    return float(v) if isinstance(v, int | float) else None


def _free_cores(ev: Evidence) -> float | None:
    """Cores not busy now (from the host's mean CPU over the gaps), if known."""
    cores, host = _num(ev, "cpu_count"), _num(ev, "host_cpu_pct")
    if cores is None or host is None:
        return None
    return max(0.0, cores * (1.0 - host / 100.0))


@dataclass(frozen=True, slots=True)
class WorkerCount:
    """The DataLoader worker count the evidence asks for, worked out once for every
    advice that names one (saturated workers, or the main process loading alone).

    Loaders make batches at a rate proportional to their number (the main process counts
    as one where there are no workers); a GPU busy a duty ``d`` of the time would take
    1/d times as many, each needing the CPU one uses now, out of the cores free.
    """

    now: int  # workers the job runs now (0: the main process loads the data itself)
    want: int  # what would keep the GPU fed
    fits: int  # what the free cores hold: ``want`` at most, ``now`` at least
    free: float  # cores not busy now
    cores: int  # the host's
    need: float  # cores beyond the loaders' own that ``want`` takes

    @property
    def enough_cores(self) -> bool:
        return self.fits >= self.want


def worker_count(ev: Evidence) -> WorkerCount | None:
    """How many workers, from the duty cycle, the loaders' CPU and the free cores;
    None without the host readings to tell."""
    workers, per, duty = _num(ev, "workers"), _num(ev, "workers_cpu_pct"), _num(ev, "duty_cycle")
    free = _free_cores(ev)
    if duty is None or duty <= 0.02 or free is None:
        return None
    now = 0 if workers is None or workers < 0.5 else round(workers)
    loaders = max(now, 1)  # no workers: the main process is the one loader
    want = max(now + 1, 2, round(loaders / duty + 0.49))
    core_each = max(0.25, (per if now and per is not None else 100.0) / 100.0)
    need = (want - now) * core_each
    # Whole workers on the free cores as the advice names them (rounded: "8 of 16 free"
    # holds 8 more workers at 0.96 of a core each, not 7 because 7.7 cores were free).
    fits = min(want, now + round(free / core_each))
    return WorkerCount(now, want, fits, free, int(_num(ev, "cpu_count") or 0), need)


def worker_prescription(ev: Evidence) -> str | None:
    """Saturated workers: how many would keep the GPU fed, and whether the cores exist
    (the words that finish the workers' advice in ``advice_for``)."""
    n = worker_count(ev)
    if n is None or n.now == 0:
        return None
    if n.enough_cores:
        return (
            f"raise num_workers from {n.now} to about {n.want} (needs ~{n.need:.0f} more "
            f"cores; {n.free:.0f} of {n.cores} are free)"
        )
    if n.fits > n.now:
        return (
            f"raise num_workers from {n.now} to {n.fits} (all the free cores: {n.free:.0f} "
            f"of {n.cores}); ~{n.want} would be needed, so also move decoding onto the GPU "
            "(e.g. NVIDIA DALI) or pre-process the dataset offline"
        )
    return (
        f"no free cores (num_workers={n.now} on {n.cores} cores): move decoding/augmentation "
        "onto the GPU (e.g. NVIDIA DALI) or pre-process the dataset offline"
    )


def gil_prescription(ev: Evidence) -> Advice:
    """The main process does the loading while the rest idle: hand it to worker processes
    (as many as ``worker_count`` says), or, where the job has workers already and they
    idle, move the work the main process does per batch into them.

    Advice that names a worker count pulls the one lever of workers, whatever the cause:
    a run starved on saturated workers and, for a while, on its main process gets one
    count (``advice_for`` then says the GIL's own remedy on its own lever)."""
    head = "the main process is pinned at ~100 % of one core while the rest idle: "
    n = worker_count(ev)
    workers = _num(ev, "workers")
    if workers is not None and workers >= 0.5:
        return _say(
            Lever.GIL,
            head + f"its {round(workers)} DataLoader workers wait while it works; move what "
            "it does per batch (transforms, collate_fn) off the GIL into the workers' "
            "Dataset.__getitem__, or onto the GPU (e.g. NVIDIA DALI)",
            workers=round(workers),
        )
    if n is None:
        return _say(Lever.GIL, head + "load data in DataLoader worker processes (num_workers > 0)")
    return _say(
        Lever.WORKERS,
        head + f"load data in DataLoader worker processes, num_workers={max(1, n.fits)} "
        f"({n.free:.0f} cores are free)",
        workers=max(1, n.fits),
        free_cores=n.free,
    )


# The lines the cause was judged by (the advice reads evidence, not the detector's config):
# below the tree CPU that asks for the CPU the job's processes sleep; iowait that points at
# storage.
_LINES = DetectorConfig()


def asleep_prescription(ev: Evidence) -> Advice | None:
    """The job's processes barely run while its GPU waits: neither its CPU nor local
    storage holds it back, so more workers would not help; say what to look at."""
    job, iowait = _num(ev, "tree_cpu_pct"), _num(ev, "iowait_pct")
    if job is None or job >= _LINES.contention_min_tree_pct:
        return None
    if iowait is not None and iowait >= _LINES.io_iowait_pct:
        return None
    return _say(
        Lever.REMOTE_INPUT,
        f"the job's processes sleep while the GPU waits (together {job:.0f} % of a core): "
        "the input waits on something outside this host's CPUs and disks -- a network "
        "filesystem or object store, a remote service, a lock or a queue fed by another "
        "process; see where the main process waits (gpumon watch --stacks, py-spy dump)",
        job_cpu_pct=job,
    )


def contention_prescription(ev: Evidence) -> Advice:
    """Processes outside the job hold the CPUs: say how much, and who, where known."""
    outside, job = _num(ev, "outside_cpu_pct"), _num(ev, "tree_cpu_pct")
    top = ev.get("outside_top")
    cores = _num(ev, "cpu_count")
    amount = ""
    if outside is not None:
        amount = f" ({outside / 100:.1f} cores' worth"
        amount += f" of {cores:.0f}" if cores else ""
        amount += f", the job itself {job / 100:.1f})" if job is not None else ")"
    who = f"; the busiest: {top}" if isinstance(top, str) and top else ""
    return _say(
        Lever.CONTENTION,
        f"processes outside the job take the CPUs its input pipeline needs{amount}{who}: "
        "run the job where its cores are free, or hold the others back (cpusets or "
        "cgroup CPU limits, nice); more workers would only contend further",
        **({} if outside is None else {"outside_cpu_pct": outside}),
    )


def _memory_advice(ev: Evidence) -> list[Advice]:
    """The memory levers, in numbers: what a larger batch has room for, or what frees it."""
    head = ev.get("mem_headroom_ratio")
    used, total = ev.get("mem_used_bytes"), ev.get("mem_total_bytes")
    if not isinstance(head, float) or not isinstance(used, int) or not isinstance(total, int):
        return []
    if used <= 0:
        return []
    free_gib, total_gib = (total - used) / _GIB, total / _GIB
    gib = {"free_gib": free_gib, "total_gib": total_gib}
    if head >= 0.5:
        factor = total / used
        grow = "roughly double" if factor < 3 else f"grow about {factor:.0f}x"
        return [
            _say(
                Lever.BATCH,
                f"batch could {grow} ({free_gib:.0f} GiB free of {total_gib:.0f}): a larger "
                "batch amortises per-step host work",
                **gib,
            )
        ]
    if head >= 0.3:
        return [
            _say(
                Lever.BATCH,
                f"batch could grow by about {100 * (total / used - 1):.0f} % ({free_gib:.0f} "
                f"GiB free of {total_gib:.0f}): a larger batch amortises per-step host work",
                **gib,
            )
        ]
    if head < 0.1:
        return [
            _say(
                Lever.BATCH,
                f"memory is the limit ({free_gib:.1f} GiB free of {total_gib:.0f}): bf16/fp16 "
                "activations take half the memory of fp32, and half the batch (e.g. 64 "
                "instead of 128) half the activations; activation checkpointing trades "
                "compute for more",
                **gib,
            )
        ]
    return []


def _span(seconds: float) -> str:
    """Seconds as people read them: ``45 s``, ``5 min``, ``4.2 min``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    m = seconds / 60
    return f"{m:.0f} min" if abs(m - round(m)) < 0.05 else f"{m:.1f} min"


def no_rank_computes(spinning: tuple[float, float] | None = None) -> Advice:
    """Every GPU here spins in a collective and none computes (before it is a hang): no
    local rank is the straggler -- the one they wait on is elsewhere.  ``spinning``: for
    how long so far, and after how long it is called a hang, where known."""
    head = "no rank on this node computes: every GPU here spins in a collective"
    numbers: dict[str, float] = {}
    if spinning is not None:
        numbers = {"spinning_s": spinning[0], "hang_after_s": spinning[1]}
        stuck, after = spinning
        head += f" and none has computed for {_span(stuck)}"
        if stuck < after:
            head += (
                f"; at {_span(after)} without progress it is called a hang "
                f"(in {_span(after - stuck)})"
            )
    return _say(
        Lever.HANG,
        head + ": the rank they wait on is elsewhere (or stuck in another phase); "
        "`gpumon report --job` names the node whose GPUs do not spin, `py-spy dump --pid` "
        "shows where each rank's Python is",
        **numbers,
    )


def advice_for(
    state: State,
    cause: Cause | None,
    ev: Evidence,
    reason: Reason | None = None,
    host_seen: bool = False,
    spinning: tuple[float, float] | None = None,
) -> tuple[Advice, ...]:
    """Advice for one finding; empty for a healthy GPU.

    ``host_seen``: the stream carries host data (gpumon watch/record), so the advice never
    asks the user to record it.  ``spinning``: every GPU spins and none computes -- for how
    long, and after how long that is a hang.
    """
    if reason is Reason.JUDGING:
        return ()  # a provisional reading: advice waits for the verdict
    out: list[Advice] = stack_advice(state, reason, ev)
    if state is State.STARVED:
        if reason is Reason.SYNC_PAUSES:
            # Every rank's loader starting over at once, its CPU filling each pause: more
            # workers only restart more; the pipeline must not start over, or start ahead.
            out.append(
                _say(
                    Lever.RHYTHM,
                    "a regular stall that the CPU fills, on every GPU at once: the input "
                    "pipeline starting over at each epoch (DataLoader workers started anew, "
                    "loading their first batches); keep the workers alive "
                    "(persistent_workers=True) and have more batches ready ahead (a larger "
                    "prefetch_factor, e.g. 4)",
                )
            )
        elif cause is Cause.CPU:
            rx, n = worker_prescription(ev), worker_count(ev)
            # A count the free cores cannot hold already says to move the decoding.
            said_offload = rx is not None and n is not None and not n.enough_cores
            counts = {} if rx is None or n is None else {"workers": n.now, "want": n.want}
            out.append(
                _say(
                    Lever.WORKERS,
                    "data-loading workers are CPU-saturated during the gaps: "
                    + (rx or "raise num_workers"),
                    **counts,
                )
            )
            if not said_offload:
                out.append(
                    _say(
                        Lever.OFFLOAD,
                        "move decoding/augmentation onto the GPU (e.g. NVIDIA DALI) or "
                        "pre-process the dataset offline",
                    )
                )
        elif cause is Cause.GIL:
            loading = gil_prescription(ev)
            out.append(loading)
            if loading.lever is not Lever.GIL:
                # A worker count is the workers' lever, which another cause of the same
                # run may word (one count per run): the GIL's remedy keeps a line of its own.
                out.append(
                    _say(
                        Lever.GIL,
                        "move Python-side preprocessing off the main process's GIL (worker "
                        "processes) or onto the GPU (e.g. NVIDIA DALI)",
                    )
                )
        elif cause is Cause.CONTENTION:
            out.append(contention_prescription(ev))
        elif cause is Cause.IO:
            out += [
                _say(
                    Lever.STORAGE,
                    "storage does not keep up: cache the dataset on local NVMe or in RAM, "
                    "or use a sharded sequential format (WebDataset, TFRecord)",
                ),
                _say(
                    Lever.PREFETCH, "overlap reads with compute: more workers, prefetch_factor >= 2"
                ),
            ]
        else:
            if reason is Reason.PERIODIC_GAPS:
                out.append(
                    _say(
                        Lever.RHYTHM,
                        "a regular stall: if it falls at epoch boundaries, keep the "
                        "DataLoader's workers alive (persistent_workers=True); if it is a "
                        "checkpoint or an evaluation, make it asynchronous or less frequent",
                    )
                )
            if not host_seen:
                out.append(
                    _say(
                        Lever.RECORD,
                        "record host data too (gpumon watch --pid PID) to tell CPU, GIL and "
                        "I/O apart",
                    )
                )
            asleep = asleep_prescription(ev)
            if asleep:
                out.append(asleep)
            else:
                out.append(
                    _say(Lever.PREFETCH, "try more DataLoader workers and prefetch_factor >= 2")
                )
        out.append(
            _say(
                Lever.PINNING,
                "pin_memory=True and non_blocking=True copies let transfers overlap compute",
            )
        )
        out += _memory_advice(ev)
    elif state is State.SYNC_STALL:
        if reason is Reason.HANG:
            out.append(
                _say(
                    Lever.HANG,
                    "no rank on this node computes: the rank they all wait on is elsewhere "
                    "(or stuck in another phase); find it before NCCL's watchdog kills the "
                    "job: `gpumon report --job` names the node whose GPUs do not spin, "
                    "`py-spy dump --pid` shows where each rank's Python is, and NCCL's "
                    "flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE) which collective each "
                    "rank last entered",
                )
            )
        elif reason in (Reason.CHECKPOINT, Reason.EVALUATION):
            pass  # said by stack_advice, with the code the pauses are spent in
        elif reason is Reason.SYNC_PAUSES:
            out.append(
                _say(
                    Lever.CHECKPOINT,
                    "checkpoint less often or asynchronously (e.g. torch.distributed."
                    "checkpoint.async_save) and keep host-side sync (.item(), logging) out "
                    "of the step loop",
                )
            )
        elif reason is Reason.BUSY_WAIT and ev.get("straggler_gpu") is None:
            out.append(no_rank_computes(spinning))  # all spin: the straggler is not here
        else:
            out += straggler_advice(ev.get("straggler_gpu"))
        if reason is not Reason.HANG:  # a hang is no matter of memory
            out += _memory_advice(ev)
    elif state is State.IDLE:
        if reason is Reason.MEMORY_HELD:
            out.append(
                _say(
                    Lever.STUCK,
                    "memory is allocated but no kernels run: the process may be stuck, "
                    "waiting on input, or finished without releasing the GPU",
                )
            )
    elif state is State.UNKNOWN and reason is Reason.COARSE_DATA:
        out.append(
            _say(
                Lever.RESOLUTION,
                "record with gpumon (driver sample buffer, ~6 samples/s) to see "
                "sub-second bursts and gaps",
            )
        )
    return tuple(out)


def straggler_advice(gpu: int | None) -> list[Advice]:
    """One rank holds the others back (``gpu``: which, where this node knows; a rank it
    cannot name is advice the job's view across nodes may replace)."""
    who = f"GPU {gpu}" if gpu is not None else "one rank"
    return [
        _say(
            Lever.STRAGGLER,
            f"{who} is the straggler: check its data loader, clocks and throttling, "
            "and that work is split evenly",
            **({} if gpu is None else {"gpu": gpu}),
        ),
        _say(
            Lever.EVEN_SPLIT,
            "use a batch size divisible by the number of GPUs so every rank gets the same work",
        ),
    ]


def names_no_rank(a: Advice) -> bool:
    """Advice that says some rank elsewhere is waited on without naming it (a straggler
    this node cannot name, or a hang): the job's view across nodes knows more."""
    return a.lever is Lever.HANG or (a.lever is Lever.STRAGGLER and a.number("gpu") is None)


def straggler_node_advice(instance: str, what: str, peers: str, hung: bool) -> Advice:
    """A job across nodes waits on node ``instance`` (its GPUs ``what``; ``peers``: the
    nodes that wait, in words), or hangs on it where ``hung``."""
    if hung:
        return _say(
            Lever.STRAGGLER_NODE,
            f"node {instance} is what the job waits on: every GPU of {peers} spins in a "
            f"collective with none computing (a hang) while its GPUs are {what}; look at its "
            "ranks first (`py-spy dump --pid` for where their Python is, NCCL's flight "
            "recorder for the collective each rank last entered) before NCCL's watchdog "
            "kills the job",
        )
    return _say(
        Lever.STRAGGLER_NODE,
        f"node {instance} is the straggler: its GPUs are {what} while the GPUs of {peers} "
        f"busy-wait on it; fix that node first (its input pipeline, CPU and storage, clocks "
        "and throttling), then check that work is split evenly across nodes",
    )


_DOING = {
    "decode": ("decoding", "make it cheaper (smaller or pre-decoded samples, a faster decoder) "
               "or move it onto the GPU (e.g. NVIDIA DALI)"),
    "read": ("reading files", "cache the data closer (local NVMe, RAM) or read fewer, larger "
             "files"),
    "step": ("in their own Python", "make it cheaper, or do it once, offline"),
}  # fmt: skip


def stack_advice(state: State, reason: Reason | None, ev: Evidence) -> list[Advice]:
    """Advice that names the code (``--stacks``): what the job's processes were in while
    the GPU waited, and the lever that code pulls."""
    out: list[Advice] = []
    main, where = ev.get("main_activity"), ev.get("main_where", "?")
    if reason is Reason.CHECKPOINT:
        out.append(
            _say(
                Lever.CHECKPOINT,
                "checkpoint less often or asynchronously (e.g. torch.distributed.checkpoint."
                f"async_save): the pauses are spent in {where}",
            )
        )
    elif reason is Reason.EVALUATION:
        out.append(
            _say(
                Lever.EVALUATION,
                "evaluate less often, on a subset, or in a process of its own: the pauses "
                f"are spent in {where}",
            )
        )
    if state is State.STARVED:
        workers = ev.get("workers_activity")
        if main == "loader_wait" and workers in _DOING:
            doing, fix = _DOING[str(workers)]
            share = _num(ev, "workers_activity_share") or 0.0
            out.append(
                _say(
                    Lever.CODE,
                    f"the workers spend the gaps {doing} in {ev.get('workers_where', '?')} "
                    f"({share:.0%}): {fix}",
                    share=share,
                )
            )
        elif main in _DOING and main != "step":
            doing, _ = _DOING[str(main)]
            share = _num(ev, "main_activity_share") or 0.0
            out.append(
                _say(
                    Lever.CODE,
                    f"the main process spends the gaps {doing} in {where} ({share:.0%}): move "
                    "it into DataLoader workers (num_workers > 0)",
                    share=share,
                )
            )
    if state in (State.STARVED, State.SYNC_STALL) and main == "gpu_wait":
        out.append(
            _say(
                Lever.HOST_SYNC,
                f"the main process waits on the GPU in {where} during the gaps: a host-side "
                "sync each step (.item(), .cpu(), synchronize) keeps the GPU from running "
                "ahead; log less often, or accumulate on the GPU",
            )
        )
    strag = ev.get("straggler_where")
    if state is State.SYNC_STALL and isinstance(strag, str):
        out.append(
            _say(
                Lever.STRAGGLER_CODE,
                f"the straggler's rank is in {strag} while its peers wait in the collective: "
                "that is the work to even out",
            )
        )
    return out
