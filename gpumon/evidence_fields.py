"""Every evidence field once: its name, unit, meaning, and how people read it.

The numbers behind a finding (``model.Evidence``) were listed by hand in four places (the
TypedDict, its ``EvidenceKey``, ``detect/host.py``'s ``HostKey``, ``engine/words.py``'s
labels) that drifted apart: four keys printed as raw names.  As glances' plugins carry
one ``fields_description``, this table is the one list: ``engine/words.py`` words
evidence from it, the docs' table of evidence (docs/cli.md) is written from it, and
``tests/test_evidence_fields.py`` holds the types mypy needs spelled out (``Evidence``,
``EvidenceKey``, ``HostKey``) to it.  A new evidence field is a row here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpumon.model import EvidenceKey

# How a value is written for people (engine/words.py holds the writers): a 0-1 ratio as
# a percentage, a 0-100 one with %, seconds as a duration, watts, bytes (per second),
# whole numbers, 2 or 1 decimals, a GPU's index, an activity in words, text as it is.
EvidenceFormat = Literal[
    "ratio", "pct", "s", "W", "bytes", "Bps", "int", "f2", "f1", "gpu", "act", "text"
]
# What the number is about: the GPU over its window, the host and the job's process tree
# over the GPU's gaps, the run as a whole, the job's Python stacks (``--stacks``).
EvidenceGroup = Literal["gpu", "host", "run", "stacks"]


@dataclass(frozen=True, slots=True)
class EvidenceField:
    """One evidence key, as code, people and the docs read it."""

    name: EvidenceKey
    unit: str  # base units, as the JSON carries it
    label: str | None  # its words for people; None: kept for machines (JSON, the log)
    fmt: EvidenceFormat
    group: EvidenceGroup
    description: str
    # A gap-weighted mean detect/host.py keeps over a window (a ``HostKey``).
    host_window: bool = False


# In the order people read them (most telling first); those kept for machines last.
# Columns: name, unit, label, fmt, group, description (, host_window).
_f = EvidenceField
EVIDENCE_FIELDS: tuple[EvidenceField, ...] = (
    _f(
        "duty_cycle",
        "0-1",
        "duty cycle",
        "ratio",
        "gpu",
        "utilisation-weighted busy share of the window (a closed episode's: over the episode)",
    ),
    _f("burst_p50_s", "s", "burst p50", "s", "gpu", "median length of the GPU's bursts of work"),
    _f("gap_p50_s", "s", "gap p50", "s", "gpu", "median length of the GPU's gaps between bursts"),
    _f("gap_p90_s", "s", "gap p90", "s", "gpu", "90th percentile of the gaps"),
    _f("period_s", "s", "period", "s", "gpu", "length of one burst-and-gap cycle"),
    _f(
        "pause_interval_p50_s",
        "s",
        "pause every",
        "s",
        "gpu",
        "median time between long pauses (a rhythm of long gaps, or the run's all-GPU pauses)",
    ),
    _f("pause_p50_s", "s", "pause p50", "s", "gpu", "median length of those pauses"),
    _f("pauses", "count", "pauses", "int", "run", "pauses every GPU took at once"),
    _f(
        "workers_cpu_pct",
        "% of one core",
        "CPU per worker",
        "pct",
        "host",
        "mean CPU of one of the job's worker processes",
        host_window=True,
    ),
    _f(
        "workers",
        "count",
        "workers",
        "int",
        "host",
        "mean number of the job's worker processes",
        host_window=True,
    ),
    _f(
        "main_cpu_pct",
        "% of one core",
        "main CPU",
        "pct",
        "host",
        "CPU of the job's main process",
        host_window=True,
    ),
    _f(
        "tree_cpu_pct",
        "% of one core",
        "job CPU",
        "pct",
        "host",
        "CPU of the job's whole process tree (300: three cores)",
        host_window=True,
    ),
    _f(
        "tree_runnable",
        "count",
        "job runnable",
        "f1",
        "host",
        "mean number of the job's processes running or waiting to run",
        host_window=True,
    ),
    _f(
        "outside_cpu_pct",
        "% of one core",
        "CPU outside the job",
        "pct",
        "host",
        "CPU used by processes outside the job",
    ),
    _f(
        "outside_top",
        "text",
        "busiest outside the job",
        "text",
        "host",
        'the busiest process outside the job: "name (pid N, 340 %)"',
    ),
    _f(
        "host_cpu_pct",
        "%",
        "host CPU",
        "pct",
        "host",
        "CPU of the whole host, all cores (0-100)",
        host_window=True,
    ),
    _f(
        "iowait_pct",
        "%",
        "iowait",
        "pct",
        "host",
        "share of CPU time waiting on I/O",
        host_window=True,
    ),
    _f(
        "read_bytes_per_s",
        "bytes/s",
        "read",
        "Bps",
        "host",
        "bytes the job's processes read from storage per second",
        host_window=True,
    ),
    _f("power_watts", "W", "power", "W", "gpu", "mean power draw over the window"),
    _f(
        "power_share_of_peak",
        "0-1",
        "power/peak",
        "ratio",
        "gpu",
        "power draw as a share of the peak seen in the run (or the power limit)",
    ),
    _f(
        "sm_active_ratio",
        "0-1",
        "SM active",
        "ratio",
        "gpu",
        "share of time SMs had work (GPM: Hopper and later)",
    ),
    _f(
        "tensor_active_ratio",
        "0-1",
        "tensor active",
        "ratio",
        "gpu",
        "share of time tensor cores were busy (GPM)",
    ),
    _f(
        "sm_occupancy_ratio",
        "0-1",
        "SM occupancy",
        "ratio",
        "gpu",
        "warps resident as a share of the SMs' maximum (GPM)",
    ),
    _f("straggler_gpu", "GPU index", "straggler", "gpu", "run", "the GPU the others wait for"),
    _f("skew_s", "s", "skew", "s", "run", "how far the straggler's pauses lag its peers'"),
    _f(
        "effective_gpus",
        "GPUs",
        "effective GPUs",
        "f2",
        "run",
        "the GPUs' duty cycles summed: how many GPUs' worth of work the run did",
    ),
    _f(
        "mem_headroom_ratio",
        "0-1",
        "mem headroom",
        "ratio",
        "gpu",
        "share of the GPU's memory left free",
    ),
    _f(
        "max_core_pct",
        "%",
        "busiest core",
        "pct",
        "host",
        "CPU of the busiest core",
        host_window=True,
    ),
    _f(
        "lost_gpu_seconds",
        "GPU-s",
        "lost GPU-s",
        "f1",
        "run",
        "GPU-seconds spent waiting rather than computing",
    ),
    _f(
        "main_activity",
        "activity",
        "main process",
        "act",
        "stacks",
        "what the main process did most while the GPU waited",
    ),
    _f(
        "main_activity_share",
        "0-1",
        "of its gaps",
        "ratio",
        "stacks",
        "share of the main process's gap time in that activity",
    ),
    _f(
        "main_where",
        "text",
        "in",
        "text",
        "stacks",
        'where in the code: "train.py:42 train -> torch...dataloader.__next__"',
    ),
    _f(
        "workers_activity",
        "activity",
        "workers",
        "act",
        "stacks",
        "what the workers did most while the GPU waited",
    ),
    _f(
        "workers_activity_share",
        "0-1",
        "of their gaps",
        "ratio",
        "stacks",
        "share of the workers' gap time in that activity",
    ),
    _f("workers_where", "text", "in", "text", "stacks", "where in the workers' code"),
    _f(
        "straggler_where",
        "text",
        "straggler in",
        "text",
        "stacks",
        "the straggler rank's code while its peers wait in a collective",
    ),
    # Kept for machines (JSON, the log): bookkeeping, or a number another one words better.
    _f("samples", "count", None, "int", "gpu", "driver samples behind the window"),
    _f("sample_period_s", "s", None, "s", "gpu", "time between the driver's samples"),
    _f("mem_used_bytes", "bytes", None, "bytes", "gpu", "GPU memory in use"),
    _f("mem_total_bytes", "bytes", None, "bytes", "gpu", "the GPU's memory"),
    _f("power_limit_watts", "W", None, "W", "gpu", "the GPU's power limit"),
    _f("power_peak_watts", "W", None, "W", "gpu", "the highest power draw seen"),
    _f("burst_p90_s", "s", None, "s", "gpu", "90th percentile of the bursts"),
    _f("cpu_count", "count", None, "int", "host", "the host's CPU cores"),
    _f("window_s", "s", None, "s", "gpu", "length of the window judged"),
    _f("gpus", "count", None, "int", "run", "GPUs in the run"),
    _f("processes", "count", None, "int", "gpu", "processes on the GPU"),
    _f(
        "larger_batch_fits",
        "yes/no",
        None,
        "text",
        "gpu",
        'whether memory headroom leaves room for a larger batch: "yes" or "no"',
    ),
    _f("duration_s", "s", None, "s", "gpu", "a closed episode's length"),
    _f(
        "stack_seconds",
        "s",
        None,
        "s",
        "stacks",
        "seconds of stack samples behind the activities (gap-weighted)",
    ),
)
