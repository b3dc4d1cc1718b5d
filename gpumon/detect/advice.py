"""Short, actionable advice per finding, chosen from the evidence that backs it."""

from __future__ import annotations

from gpumon.model import Cause, Evidence, Reason, State

_GIB = 1024**3


def _memory_advice(ev: Evidence) -> list[str]:
    head = ev.get("mem_headroom_ratio")
    used, total = ev.get("mem_used_bytes"), ev.get("mem_total_bytes")
    if not isinstance(head, float) or not isinstance(used, int) or not isinstance(total, int):
        return []
    if ev.get("larger_batch_fits") == "yes":
        return [
            f"{head * 100:.0f} % of GPU memory is free ({(total - used) / _GIB:.0f} GiB): "
            "a larger batch would fit and amortises per-step host work"
        ]
    if head < 0.1:
        return [
            "memory is close to full: a larger batch needs bf16/fp16 activations "
            "or activation checkpointing"
        ]
    return []


def advice_for(
    state: State,
    cause: Cause | None,
    ev: Evidence,
    reason: Reason | None = None,
    host_seen: bool = False,
) -> tuple[str, ...]:
    """Advice strings for one finding; empty for a healthy GPU.

    ``host_seen``: the stream carries host data (gpumon watch/record), so the advice never
    asks the user to record it.
    """
    out: list[str] = []
    if state is State.STARVED:
        if cause is Cause.CPU:
            workers = ev.get("workers")
            cores = ev.get("cpu_count")
            msg = "data-loading workers are CPU-saturated during the gaps: raise num_workers"
            if isinstance(workers, float | int) and isinstance(cores, int):
                msg += f" (now {int(workers)} on {cores} cores)"
            out += [
                msg,
                "move decoding/augmentation onto the GPU (e.g. NVIDIA DALI) or "
                "pre-process the dataset offline",
            ]
        elif cause is Cause.GIL:
            out += [
                "one process is pinned at ~100 % of one core while the rest idle: load "
                "data in DataLoader worker processes (num_workers > 0)",
                "move Python-side preprocessing off the GIL (worker processes) or onto "
                "the GPU (e.g. NVIDIA DALI)",
            ]
        elif cause is Cause.IO:
            out += [
                "storage does not keep up: cache the dataset on local NVMe or in RAM, "
                "or use a sharded sequential format (WebDataset, TFRecord)",
                "overlap reads with compute: more workers, prefetch_factor >= 2",
            ]
        else:
            if reason is Reason.PERIODIC_GAPS:
                out.append(
                    "a regular stall: if it falls at epoch boundaries, keep the DataLoader's "
                    "workers alive (persistent_workers=True); if it is a checkpoint or an "
                    "evaluation, make it asynchronous or less frequent"
                )
            if not host_seen:
                out.append(
                    "record host data too (gpumon watch --pid PID) to tell CPU, GIL and I/O apart"
                )
            out.append("try more DataLoader workers, pin_memory=True and prefetch_factor >= 2")
        out.append("pin_memory=True and non_blocking=True copies let transfers overlap compute")
        out += _memory_advice(ev)
    elif state is State.SYNC_STALL:
        if reason is Reason.SYNC_PAUSES:
            out += [
                "checkpoint less often or asynchronously (e.g. torch.distributed."
                "checkpoint.async_save) and keep host-side sync (.item(), logging) out "
                "of the step loop"
            ]
        else:
            strag = ev.get("straggler_gpu")
            who = f"GPU {strag}" if strag is not None else "one rank"
            out += [
                f"{who} is the straggler: check its data loader, clocks and throttling, "
                "and that work is split evenly",
                "use a batch size divisible by the number of GPUs so every rank gets the same work",
            ]
        out += _memory_advice(ev)
    elif state is State.IDLE:
        if reason is Reason.MEMORY_HELD:
            out.append(
                "memory is allocated but no kernels run: the process may be stuck, "
                "waiting on input, or finished without releasing the GPU"
            )
    elif state is State.UNKNOWN and reason is Reason.COARSE_DATA:
        out.append(
            "record with gpumon (driver sample buffer, ~6 samples/s) to see "
            "sub-second bursts and gaps"
        )
    return tuple(out)
