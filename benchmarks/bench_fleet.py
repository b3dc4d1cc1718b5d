"""Issue 31 item 5: `gpumon report --top` and `report --job` against a real Prometheus
holding a synthetic cluster's week, at two scales with the same jobs.

A cluster of NODES nodes x 8 GPUs runs JOBS whole-node Slurm jobs back to back for DAYS:
healthy, starved (cpu, io or gil), straggling (one node starved, the others busy-waiting
on it), hung (working, then spinning on a collective) and idle (working, then holding
memory with no work), the states of gpumon's detector and lab.  The TSDB gets what
Prometheus would hold had it scraped every node's `gpumon serve` at STEP and evaluated
gpumon-rules.yml's fleet group every 5 minutes:

* from every node, per job: ``gpumon_job_gpu_seconds_total``,
  ``gpumon_job_lost_gpu_seconds_total`` (per state and cause) and ``gpumon_job_gpus``;
* from every GPU: ``gpumon_gpu_job_info``, ``gpumon_gpu_state_seconds_total`` (5 states)
  and ``gpumon_gpu_utilization_ratio`` -- the GPUs x samples bulk a fleet query must not
  read; on the nodes of the job `report --job` is timed on, also every other series that
  report reads (state gauges, the utilisation record per state, cause, reason, power,
  memory, host CPU, ``up``, ``process_start_time_seconds``); the rest (clocks,
  temperatures, histograms, ...) is left out: no report reads it, it would only make the
  TSDB bigger;
* the recording rules' outputs (``job_user_cause:...:increase5m`` and
  ``user_cause:...``), as series: promtool backfills raw samples and evaluates no rule, so
  the records are written as the rule would have recorded them (each job's GPU-seconds
  of the 5 minutes before each evaluation, summed over its nodes).

Both scales are written as OpenMetrics text (streamed, one file per 2-hour block: promtool
2.42 re-reads its whole input for every 2-hour block it makes, so one week in one file
would be read 84 times) and backfilled with ``promtool tsdb create-blocks-from
openmetrics``; generation and backfill are timed apart.  Then a Prometheus on each TSDB
(loopback, compaction off: ``--storage.tsdb.max-block-duration=2h``, so no background
compaction runs while queries are timed), and the real CLI in a subprocess, alternating
scales: wall time, gpumon's peak RSS (``wait4``), and from Prometheus' query log what each
query touched (``totalQueryableSamples``) and took.  The small scale is the baseline: same
jobs, GPUs x 8 fewer; the ratios say what grows with GPUs x samples.

    python benchmarks/bench_fleet.py            # 512 nodes vs 64, 7 days, 120 s scrapes
    python benchmarks/bench_fleet.py --quick    # 128 nodes vs 16
    python benchmarks/bench_fleet.py --smoke    # 16 nodes vs 4, 1 day: every figure once
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import add_modes, exit_status, machine_load, say_load, table

GPUS_PER_NODE = 8
BLOCK_S = 7200  # promtool's block: each input file holds one
RULE_EVERY_S = 300  # the fleet group's interval and window (gpumon-rules.yml)
ALIGN_S = 3600  # jobs start and phases turn on the hour: records sum to the counters
LOST = "job_user_cause:gpumon_job_lost_gpu_seconds:increase5m"
USED = "job_user_cause:gpumon_job_gpu_seconds:increase5m"
USER_LOST = "user_cause:gpumon_job_lost_gpu_seconds:increase5m"
STATES = ("healthy", "starved", "sync_stall", "idle", "unknown")
KINDS = ("healthy", "starved", "straggling", "hung", "idle")
MIX = (0.5, 0.2, 0.1, 0.1, 0.1)
USERS = tuple(f"user{k:02d}" for k in range(24))


@dataclass(frozen=True, slots=True)
class Phase:
    """A stretch of a job on one node: every GPU there in one state (and why)."""

    start: int
    end: int
    state: str
    cause: str  # the starved cause or the reason ("" where none)
    util: float
    lost: float  # share of the GPU time lost


@dataclass(frozen=True)
class Job:
    ident: str
    user: str
    kind: str
    nodes: tuple[int, ...]
    start: int
    end: int
    phases: dict[int, tuple[Phase, ...]]  # node -> its phases

    def pairs(self) -> list[tuple[str, str]]:
        return sorted({(p.state, p.cause) for ps in self.phases.values() for p in ps})


@dataclass
class Cluster:
    nodes: int
    days: float
    step: int
    t0: int
    t1: int
    jobs: list[Job]
    detail: frozenset[int]  # nodes with every series report --job reads
    target: str  # the job report --job is timed on
    by_node: dict[int, list[Job]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for job in self.jobs:
            for n in job.nodes:
                self.by_node.setdefault(n, []).append(job)

    def truth(
        self, since: float | None = None, until: float | None = None
    ) -> dict[str, tuple[str, str, float, float]]:
        """Job -> (user, kind, lost GPU-seconds, GPU-seconds) in [since, until)."""
        lo = self.t0 if since is None else since
        hi = self.t1 if until is None else until
        out = {}
        for j in self.jobs:
            lost = used = 0.0
            for ps in j.phases.values():
                for p in ps:
                    secs = GPUS_PER_NODE * max(0.0, min(hi, p.end) - max(lo, p.start))
                    used += secs
                    lost += secs * p.lost
            out[j.ident] = (j.user, j.kind, lost, used)
        return out


def instance(n: int) -> str:
    return f"n{n:04d}:9400"


def make_cluster(
    nodes: int,
    groups: int,
    jobs: int,
    days: float,
    step: int,
    end: int,
    seed: int = 31,
    kinds: Sequence[str] = (),
) -> Cluster:
    """``jobs`` whole-node jobs in ``groups`` partitions of nodes // groups nodes, back to
    back; the same seed gives the same jobs (kinds, users, shares) at every scale.
    ``kinds``: the jobs' kinds in turn, instead of drawn from MIX."""
    if 3600 % math.lcm(step, RULE_EVERY_S):
        raise SystemExit(f"--step {step}: must divide 3600 and make 5-minute windows whole")
    if step > RULE_EVERY_S // 2:
        raise SystemExit(f"--step {step}: the fleet rules' [5m] needs two scrapes a window")
    if nodes % groups or jobs % groups:
        raise SystemExit(f"{nodes} nodes or {jobs} jobs do not split into {groups} groups")
    t1 = end - end % ALIGN_S
    t0 = t1 - int(days * 86400)
    per_group = jobs // groups
    slot = (t1 - t0) // per_group // ALIGN_S * ALIGN_S
    if slot < ALIGN_S:
        raise SystemExit(f"{per_group} jobs a group do not fit in {days} days")
    rng = random.Random(seed)
    npj = nodes // groups
    out = []
    for g in range(groups):
        for k in range(per_group):
            i = g * per_group + k
            start = t0 + k * slot
            stop = t1 if k == per_group - 1 else start + slot
            kind = rng.choices(KINDS, MIX)[0]
            kind = kinds[i % len(kinds)] if kinds else kind
            user = USERS[min(len(USERS) - 1, int(rng.expovariate(0.25)))]
            share = round(rng.uniform(0.3, 0.8), 2)
            cut = start + max(1, round((stop - start) * rng.uniform(0.2, 0.7) / ALIGN_S)) * ALIGN_S
            cut = min(cut, stop - ALIGN_S) if stop - start > ALIGN_S else start
            members = tuple(range(g * npj, (g + 1) * npj))
            phases = {}
            for n in members:
                healthy = Phase(start, stop, "healthy", "", 0.95, 0.0)
                if kind == "starved":
                    cause = ("cpu", "io", "gil")[i % 3]
                    ps: tuple[Phase, ...] = (
                        Phase(start, stop, "starved", cause, 1 - share, share),
                    )
                elif kind == "straggling" and n == members[0]:
                    ps = (Phase(start, stop, "starved", "cpu", 1 - share, share),)
                elif kind == "straggling":
                    ps = (Phase(start, stop, "sync_stall", "busy_wait", 1.0, share),)
                elif kind == "hung" and cut > start:
                    ps = (
                        Phase(start, cut, "healthy", "", 0.95, 0.0),
                        Phase(cut, stop, "sync_stall", "hang", 1.0, 1.0),
                    )
                elif kind == "idle" and cut > start:
                    ps = (
                        Phase(start, cut, "healthy", "", 0.95, 0.0),
                        Phase(cut, stop, "idle", "memory_held", 0.0, 1.0),
                    )
                else:
                    ps = (healthy,)
                phases[n] = ps
            out.append(Job(str(700000 + i), user, kind, members, start, stop, phases))
    # report --job is timed on the first straggling job (many nodes, two kinds of node).
    target = next((j for j in out if j.kind == "straggling"), out[0])
    return Cluster(nodes, days, step, t0, t1, out, frozenset(target.nodes), target.ident)


# --------------------------------------------------------------------------- OpenMetrics
class Writer:
    """One 2-hour block's OpenMetrics text: families in turn, each series' samples in
    time order, the lines of a series joined in one go (Python's cost per line is what
    bounds the generator)."""

    def __init__(self, path: Path) -> None:
        self.fh = path.open("w", buffering=1 << 22)
        self.lines = 0

    def family(self, name: str, kind: str) -> None:
        self.fh.write(f"# TYPE {name} {kind}\n")

    def series(self, pre: str, vals: list[str], stamps: list[str]) -> None:
        if vals:
            self.fh.write(pre + ("\n" + pre).join(map(str.__add__, vals, stamps)) + "\n")
            self.lines += len(vals)

    def close(self) -> None:
        self.fh.write("# EOF\n")
        self.fh.close()


def _labels(**kw: str) -> str:
    return ",".join(f'{k}="{v}"' for k, v in kw.items() if v)


def _gpu_labels(n: int, g: int, **kw: str) -> str:
    return _labels(instance=instance(n), job="gpumon", gpu=str(g), uuid=f"GPU-{n:04d}-{g}", **kw)


def _job_labels(j: Job) -> dict[str, str]:
    return {"hpc_job": j.ident, "job_kind": "slurm", "job_name": j.ident, "user": j.user}


def _g(x: float) -> str:
    return repr(round(x, 4))


def write_block(
    c: Cluster, w: int, path: Path, acc: dict[int, dict[str, int]], records_only: bool = False
) -> int:
    """The block [w, w + 2 h) of cluster ``c``; ``acc``: each node's state seconds so far
    (carried from block to block).  Returns the lines (samples) written.  ``records_only``:
    the fleet records alone (what a global store fed only the recorded series holds)."""
    lo, hi = max(w, c.t0), min(w + BLOCK_S, c.t1)
    grid = list(range(lo + (-lo) % c.step, hi, c.step))
    stamp = {t: f" {t}" for t in grid}
    out = Writer(path)

    def running(j: Job) -> bool:
        return j.start < hi and j.end > lo

    def where(t0: int, t1: int) -> list[int]:
        return [t for t in grid if t0 <= t < t1]

    # Per node and time: the phase its GPUs are in.
    phase_at: dict[int, list[Phase | None]] = {}
    for n in range(c.nodes):
        row: list[Phase | None] = [None] * len(grid)
        for j in c.by_node.get(n, ()):
            if running(j):
                for p in j.phases[n]:
                    for k, t in enumerate(grid):
                        if p.start <= t < p.end:
                            row[k] = p
        phase_at[n] = row

    # --- per node, per job: the job counters and its GPUs
    counters = (
        ()
        if records_only
        else (("gpumon_job_gpu_seconds", None), ("gpumon_job_lost_gpu_seconds", "lost"))
    )
    for name, attr in counters:
        out.family(name, "counter")
        for n in range(c.nodes):
            for j in c.by_node.get(n, ()):
                if not running(j):
                    continue
                for p in j.phases[n]:
                    ts = where(p.start, j.end)
                    rate = GPUS_PER_NODE * (p.lost if attr else 1.0)
                    vals = [_g(rate * (min(t, p.end) - p.start)) for t in ts]
                    lb = _labels(
                        instance=instance(n),
                        job="gpumon",
                        **_job_labels(j),
                        state=p.state,
                        cause=p.cause,
                    )
                    out.series(f"{name}_total{{{lb}}} ", vals, [stamp[t] for t in ts])
    out.family("gpumon_job_gpus", "gauge")
    for n in range(0 if records_only else c.nodes):
        for j in c.by_node.get(n, ()):
            if running(j):
                ts = where(j.start, j.end)
                lb = _labels(instance=instance(n), job="gpumon", **_job_labels(j))
                out.series(f"gpumon_job_gpus{{{lb}}} ", ["8"] * len(ts), [stamp[t] for t in ts])

    # --- the fleet records, every 5 minutes: the GPU-seconds of the 5 minutes before
    # (the evaluation at t1 counts the week's last 5 minutes: the last block holds it)
    last = min(w + BLOCK_S - 1, c.t1)
    evals = [e for e in range(w + (-w) % RULE_EVERY_S, last + 1, RULE_EVERY_S) if e > c.t0]
    per_user: dict[tuple[str, str, str], dict[int, float]] = {}
    for rec, attr in ((LOST, "lost"), (USED, None)):
        out.family(rec, "gauge")
        for j in c.jobs:
            if not (j.start < last and j.end + RULE_EVERY_S > w):
                continue
            for state, cause in j.pairs():
                es = [e for e in evals if j.start < e <= j.end]
                vals = []
                for e in es:
                    v = 0.0
                    for ps in j.phases.values():
                        for p in ps:
                            if (p.state, p.cause) == (state, cause):
                                over = max(0, min(e, p.end) - max(e - RULE_EVERY_S, p.start))
                                v += GPUS_PER_NODE * over * (p.lost if attr else 1.0)
                    vals.append(v)
                    if attr:
                        got = per_user.setdefault((j.user, state, cause), {})
                        got[e] = got.get(e, 0.0) + v
                lb = _labels(**_job_labels(j), state=state, cause=cause)
                out.series(f"{rec}{{{lb}}} ", [_g(v) for v in vals], [f" {e}" for e in es])
    out.family(USER_LOST, "gauge")
    for (user, state, cause), at in sorted(per_user.items()):
        es = sorted(at)
        lb = _labels(user=user, state=state, cause=cause)
        out.series(f"{USER_LOST}{{{lb}}} ", [_g(at[e]) for e in es], [f" {e}" for e in es])
    if records_only:
        out.close()
        return out.lines

    # --- per GPU: the bulk every GPU has
    stamps = [stamp[t] for t in grid]
    out.family("gpumon_gpu_job_info", "gauge")
    for n in range(c.nodes):
        for j in c.by_node.get(n, ()):
            if running(j):
                ts = where(j.start, j.end)
                for g in range(GPUS_PER_NODE):
                    lb = _gpu_labels(n, g, **_job_labels(j))
                    out.series(
                        f"gpumon_gpu_job_info{{{lb}}} ", ["1"] * len(ts), [stamp[t] for t in ts]
                    )
    out.family("gpumon_gpu_state_seconds", "counter")
    counted: dict[int, dict[str, list[str]]] = {}
    for n in range(c.nodes):
        have = acc.setdefault(n, dict.fromkeys(STATES, 0))
        series: dict[str, list[str]] = {s: [] for s in STATES}
        for p in phase_at[n]:
            for s in STATES:
                series[s].append(str(have[s]))
            have["unknown" if p is None else p.state] += c.step
        counted[n] = series
    for n in range(c.nodes):
        for s in STATES:
            for g in range(GPUS_PER_NODE):
                lb = _gpu_labels(n, g, state=s)
                out.series(f"gpumon_gpu_state_seconds_total{{{lb}}} ", counted[n][s], stamps)

    def per_gpu(name: str, value: object, nodes: Iterator[int] | range) -> None:
        out.family(name, "gauge")
        for n in nodes:
            vals = [value(p) for p in phase_at[n]]  # type: ignore[operator]
            for g in range(GPUS_PER_NODE):
                lb = _gpu_labels(n, g)
                out.series(f"{name}{{{lb}}} ", vals, stamps)

    per_gpu(
        "gpumon_gpu_utilization_ratio", lambda p: "0" if p is None else _g(p.util), range(c.nodes)
    )

    # --- per GPU, the rest report --job reads: on the timed job's nodes only
    detail = sorted(c.detail)
    per_gpu("gpumon_gpu_straggler", lambda p: "0", iter(detail))
    per_gpu("gpumon_gpu_lost", lambda p: "0", iter(detail))
    per_gpu(
        "gpumon_gpu_power_watts",
        lambda p: (
            "60"
            if p is None
            else _g(60 + 540 * p.util * (0.2 if p.cause in ("busy_wait", "hang") else 1.0))
        ),
        iter(detail),
    )
    per_gpu(
        "gpumon_gpu_memory_used_bytes", lambda p: "0" if p is None else "68719476736", iter(detail)
    )
    per_gpu("gpumon_gpu_memory_total_bytes", lambda p: "85899345920", iter(detail))
    recorded = "instance_gpu_state:gpumon_gpu_utilization:ratio"
    for name, whole in (("gpumon_gpu_state", False), (recorded, True)):
        out.family(name, "gauge")
        for n in detail:
            for s in STATES:
                vals = []
                for p in phase_at[n]:
                    on = ("unknown" if p is None else p.state) == s
                    if not whole:
                        vals.append("1" if on else "0")
                    else:
                        vals.append(_g(p.util) if on and p is not None else "0")
                for g in range(GPUS_PER_NODE):
                    lb = _gpu_labels(n, g, state=s)
                    out.series(f"{name}{{{lb}}} ", vals, stamps)
    marks = (("gpumon_gpu_cause", "cause", "starved"), ("gpumon_gpu_reason", "reason", None))
    for name, label, of in marks:
        out.family(name, "gauge")
        for n in detail:
            runs: dict[str, list[int]] = {}
            for k, p in enumerate(phase_at[n]):
                if p is not None and p.cause and (of is None) == (p.state != "starved"):
                    runs.setdefault(p.cause, []).append(k)
            for why, ks in runs.items():
                for g in range(GPUS_PER_NODE):
                    lb = _gpu_labels(n, g, **{label: why})
                    out.series(f"{name}{{{lb}}} ", ["1"] * len(ks), [stamps[k] for k in ks])

    # --- per node: scrapes, the daemon's start, the host
    nodes = range(c.nodes)
    for name, val in (
        ("up", lambda n: "1"),
        ("process_start_time_seconds", lambda n: str(c.t0 - 3600)),
        ("gpumon_host_cpu_ratio", lambda n: "0.35"),
        ("gpumon_host_iowait_ratio", lambda n: "0.02"),
    ):
        out.family(name, "gauge")
        for n in nodes:
            lb = _labels(instance=instance(n), job="gpumon")
            out.series(f"{name}{{{lb}}} ", [val(n)] * len(grid), stamps)
    out.close()
    return out.lines


def blocks(c: Cluster) -> list[int]:
    return list(range(c.t0 - c.t0 % BLOCK_S, c.t1 + 1, BLOCK_S))


# --------------------------------------------------------------------------- Prometheus
@dataclass
class Scale:
    name: str
    cluster: Cluster
    here: Path
    samples: int = 0
    gen_s: float = 0.0
    gen_cpu_s: float = 0.0
    fill_s: float = 0.0
    fill_cpu_s: float = 0.0
    text_bytes: int = 0
    tsdb_bytes: int = 0
    elapsed_s: float = 0.0
    proc: subprocess.Popen[str] | None = None
    url: str = ""
    records_only: bool = False


def generate(s: Scale) -> None:
    """Each block's text written, then backfilled by promtool while the next is written
    (two cores: the week would take twice as long in turn).  Timed apart: the generator's
    own CPU and wall time writing, promtool's CPU (its rusage, ``wait4``) and the wall
    time from each file's start to its exit, summed."""
    text = s.here / "text"
    text.mkdir(parents=True)
    tsdb = s.here / "tsdb"
    acc: dict[int, dict[str, int]] = {}
    pending: tuple[subprocess.Popen[bytes], Path, float] | None = None

    def finish() -> None:
        nonlocal pending
        if pending is None:
            return
        proc, path, started = pending
        _, status, usage = os.wait4(proc.pid, 0)
        s.fill_s += time.perf_counter() - started
        s.fill_cpu_s += usage.ru_utime + usage.ru_stime
        if os.waitstatus_to_exitcode(status):
            err = (path.with_suffix(".err")).read_text().strip()[-2000:]
            raise SystemExit(f"promtool failed on {path.name}: {err}")
        path.unlink()  # the text is not needed once in blocks
        pending = None

    every = blocks(s.cluster)
    for k, w in enumerate(every):
        if k and k % 12 == 0:
            print(
                f"#   {s.name}: block {k}/{len(every)}, {s.samples:,} samples, "
                f"{time.strftime('%H:%M:%S')}",
                file=sys.stderr,
                flush=True,
            )
        path = text / f"{w}.om"
        c0, w0 = time.process_time(), time.perf_counter()
        s.samples += write_block(s.cluster, w, path, acc, s.records_only)
        s.gen_s += time.perf_counter() - w0
        s.gen_cpu_s += time.process_time() - c0
        s.text_bytes += path.stat().st_size
        finish()
        cmd = ["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(path), str(tsdb)]
        with path.with_suffix(".err").open("w") as err:
            pending = (
                subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err),
                path,
                time.perf_counter(),
            )
    finish()
    s.tsdb_bytes = sum(p.stat().st_size for p in tsdb.rglob("*") if p.is_file())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_prometheus(s: Scale) -> None:
    port = free_port()
    (s.here / "prometheus.yml").write_text(
        f"global:\n  scrape_interval: 1m\n  query_log_file: {s.here / 'queries.log'}\n"
    )
    s.proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={s.here / 'prometheus.yml'}",
            f"--storage.tsdb.path={s.here / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=30d",
            "--storage.tsdb.min-block-duration=2h",
            "--storage.tsdb.max-block-duration=2h",  # no compaction while timing
        ],
        stdout=subprocess.DEVNULL,
        stderr=(s.here / "prometheus.err").open("w"),
        text=True,
    )
    s.url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        if s.proc.poll() is not None:
            raise SystemExit((s.here / "prometheus.err").read_text()[-2000:])
        try:
            with urllib.request.urlopen(f"{s.url}/-/ready", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("Prometheus was not ready in 10 minutes")
        time.sleep(0.5)


def prometheus_rss_mib(s: Scale) -> tuple[float, float]:
    """(resident now, peak) of Prometheus, MiB."""
    assert s.proc is not None
    got = {}
    for line in Path(f"/proc/{s.proc.pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            got[k] = int(v.split()[0]) / 1024
    return got.get("VmRSS", math.nan), got.get("VmHWM", math.nan)


@dataclass
class Run:
    wall_s: float
    rss_mib: float
    queries: int
    touched: int
    touched_ranking: int
    query_s: float
    slowest_s: float
    out: str


# `python -m gpumon ARGS` that writes its peak RSS (VmHWM, KiB) to a file as it exits: a
# child's ru_maxrss counts the parent's pages it was forked with (this benchmark's, tens of
# MiB at 512 nodes) before its exec; VmHWM is the exec'd process's own.
PEAK = (
    "import atexit, runpy, sys\n"
    "def peak():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            open({!r}, 'w').write(line.split()[1])\n"
    "atexit.register(peak)\n"
    "sys.argv[0] = 'gpumon'\n"
    "runpy.run_module('gpumon', run_name='__main__', alter_sys=True)\n"
)


def run_report(s: Scale, args: list[str], store: Path) -> Run:
    """The CLI as a person runs it, in its own process: wall time, its peak RSS, and what
    Prometheus' query log says its queries touched."""
    log = s.here / "queries.log"
    seen = log.stat().st_size if log.exists() else 0
    out = s.here / "report.out"
    hwm = s.here / "report.hwm"
    cmd = [sys.executable, "-c", PEAK.format(str(hwm)), "report", "--prometheus", s.url,
           "--timeout", "600"]  # fmt: skip
    env = {**os.environ, "GPUMON_REPORT_STORE": str(store)}
    w0 = time.perf_counter()
    with out.open("w") as fh, (s.here / "report.err").open("w") as err:
        proc = subprocess.Popen([*cmd, *args], stdout=fh, stderr=err, env=env)
        _, status, _usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - w0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0,):
        raise SystemExit(
            f"gpumon report {' '.join(args)} exited {proc.returncode}: "
            f"{(s.here / 'report.err').read_text()[-2000:]}"
        )
    time.sleep(0.2)  # the query log is written as each query ends
    entries = []
    with log.open() as fh:
        fh.seek(seen)
        entries = [json.loads(line) for line in fh if line.strip()]
    touched = ranking = 0
    spent = []
    for e in entries:
        n = int(e.get("stats", {}).get("samples", {}).get("totalQueryableSamples", 0))
        touched += n
        if LOST in e["params"]["query"] or USED in e["params"]["query"]:
            ranking += n
        spent.append(float(e.get("stats", {}).get("timings", {}).get("evalTotalTime", 0.0)))
    return Run(
        wall,
        int(hwm.read_text()) / 1024,
        len(entries),
        touched,
        ranking,
        sum(spent),
        max(spent, default=0.0),
        out.read_text(),
    )


# --------------------------------------------------------------------------- the run
GENERATED = ("samples", "gen_s", "gen_cpu_s", "fill_s", "fill_cpu_s", "text_bytes",
             "tsdb_bytes", "elapsed_s")  # fmt: skip

MODES = {
    # (big nodes, base nodes, groups, jobs, days, step, runs)
    "full": (512, 64, 16, 512, 7.0, 120, 3),
    "quick": (128, 16, 4, 256, 7.0, 120, 2),
    "smoke": (16, 4, 1, 8, 1.0, 120, 1),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_modes(parser, "128 nodes against 16, 7 days")
    parser.add_argument("--nodes", type=int, help="nodes of the large scale")
    parser.add_argument("--base-nodes", type=int, help="nodes of the baseline scale")
    parser.add_argument("--jobs", type=int, help="jobs at each scale")
    parser.add_argument("--days", type=float, help="days of history")
    parser.add_argument("--step", type=int, help="scrape interval, seconds (<= 150)")
    parser.add_argument("--workdir", type=Path, help="where the TSDBs go (kept afterwards)")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="time the reports again on the TSDBs an earlier run left in --workdir",
    )
    args = parser.parse_args()
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    big_n, base_n, groups, jobs, days, step, runs = MODES[mode]
    big_n = args.nodes or big_n
    base_n = args.base_nodes or base_n
    jobs, days, step = args.jobs or jobs, args.days or days, args.step or step
    for tool in ("promtool", "prometheus"):
        if shutil.which(tool) is None:
            print(f"skipped: {tool} is not installed (apt-get install prometheus)")
            return 0
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    store = work / "no-kept-reports"
    store.mkdir(exist_ok=True)
    print(
        f"# {mode}: {big_n} nodes against {base_n}, x{GPUS_PER_NODE} GPUs, {jobs} jobs, "
        f"{days:g} days, a scrape every {step} s; TSDBs in {work}"
    )
    state = work / "generated.json"
    if args.reuse and not state.exists():
        raise SystemExit(f"--reuse: {state} does not exist (run once with --workdir first)")
    kept = json.loads(state.read_text()) if args.reuse else {}
    end = int(kept.get("end", time.time()))
    scales = [
        Scale(f"{n} nodes", make_cluster(n, groups, jobs, days, step, end), work / f"n{n}")
        for n in (base_n, big_n)
    ]
    big = scales[1]
    try:
        for s in scales:
            if s.name in kept:
                for k, v in kept[s.name].items():
                    setattr(s, k, v)
            else:
                say_load(f"generating {s.name}")
                started = time.perf_counter()
                generate(s)
                s.elapsed_s = time.perf_counter() - started
                kept[s.name] = {k: getattr(s, k) for k in GENERATED}
            print(
                f"{s.name}: {s.samples:,} samples in {len(blocks(s.cluster))} blocks; "
                f"generation {s.gen_s:.0f} s ({s.samples / s.gen_s / 1e3:.0f} k samples/s, "
                f"CPU {s.gen_cpu_s:.0f} s, text {s.text_bytes / 2**30:.2f} GiB); promtool "
                f"{s.fill_s:.0f} s (CPU {s.fill_cpu_s:.0f} s, "
                f"{s.samples / max(s.fill_cpu_s, 1e-9) / 1e3:.0f} k samples/CPU s); both, "
                f"overlapped: {s.elapsed_s:.0f} s; TSDB {s.tsdb_bytes / 2**20:.0f} MiB",
                flush=True,
            )
        state.write_text(json.dumps({**kept, "end": end}))
        for s in scales:
            start_prometheus(s)
        target = next(j for j in big.cluster.jobs if j.ident == big.cluster.target)
        commands = {
            "report --top 20 --since 7d": ["--top", "20", "--since", f"{days:g}d"],
            "report --top 20 --since 7d --by user": [
                "--top",
                "20",
                "--since",
                f"{days:g}d",
                "--by",
                "user",
            ],
            "report --top 20 --since 7d --json": ["--top", "20", "--since", f"{days:g}d", "--json"],
            "report --job ID --since 7d": ["--job", target.ident, "--since", f"{days:g}d"],
        }
        results: dict[tuple[str, str], list[Run]] = {}
        say_load("timing the reports")
        for r in range(runs):
            order = list(commands.items())
            for name, cmd in order[r % len(order) :] + order[: r % len(order)]:
                for s in scales if r % 2 == 0 else scales[::-1]:
                    results.setdefault((name, s.name), []).append(run_report(s, cmd, store))
        say_load("timed")
        return report(scales, commands, results, target, runs, step)
    finally:
        for s in scales:
            if s.proc is not None:
                s.proc.terminate()
                s.proc.wait(timeout=60)
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def report(
    scales: list[Scale],
    commands: dict[str, list[str]],
    results: dict[tuple[str, str], list[Run]],
    target: Job,
    runs: int,
    step: int,
) -> int:
    base, big = scales
    gpus = big.cluster.nodes / base.cluster.nodes
    stored = big.samples / base.samples
    ok = True
    # The ranking is right: the top jobs and their lost GPU-seconds are the generator's.
    top = json.loads(results[("report --top 20 --since 7d --json", big.name)][-1].out)
    truth = big.cluster.truth(top["since"], top["until"])
    expect = sorted(truth, key=lambda j: -truth[j][2])
    got = [row["job"] for row in top["jobs"]]
    agree = sum(1 for j in got if j in expect[: len(got)])
    off = max(
        (
            abs(row["lost_gpu_seconds"] - truth[row["job"]][2]) / max(1.0, truth[row["job"]][2])
            for row in top["jobs"]
        ),
        default=math.nan,
    )
    kinds: dict[str, list[str]] = {}
    for row in top["jobs"]:
        kinds.setdefault(truth[row["job"]][1], []).append(f"{row['verdict']}/{row['cause']}")
    print(
        f"\nranking at {big.name}: {agree} of its {len(got)} jobs among the {len(got)} that "
        f"lost most (ties aside); lost GPU-seconds within {off:.1%} of the generator's; "
        f"verdicts by kind: "
        + "; ".join(f"{k}: {', '.join(sorted(set(v)))}" for k, v in sorted(kinds.items()))
    )
    print(
        f"report --job {target.ident} ({target.kind}, {len(target.nodes)} nodes at "
        f"{big.name}): "
        + results[("report --job ID --since 7d", big.name)][-1].out.splitlines()[0][:160]
    )
    print(
        f"\nstored samples: {base.name} {base.samples:,}, {big.name} {big.samples:,} "
        f"(x{stored:.1f}); GPUs x{gpus:.0f}; TSDB {base.tsdb_bytes / 2**20:.0f} and "
        f"{big.tsdb_bytes / 2**20:.0f} MiB; a scrape every {step} s"
    )
    for s in scales:
        now, peak = prometheus_rss_mib(s)
        print(f"Prometheus at {s.name}: RSS {now:.0f} MiB now, {peak:.0f} MiB peak")
    rows = []
    print(
        f"\n{'command':40} {'scale':10} {'wall s':>8} {'RSS MiB':>8} {'queries':>8} "
        f"{'samples touched':>16} {'of it ranking':>14} {'PromQL s':>9} {'slowest':>8}"
    )
    for name in commands:
        for s in scales:
            rs = results[(name, s.name)]
            print(
                f"{name:40} {s.name:10} {med([r.wall_s for r in rs]):8.2f} "
                f"{med([r.rss_mib for r in rs]):8.1f} {rs[-1].queries:8d} "
                f"{rs[-1].touched:16,} {rs[-1].touched_ranking:14,} "
                f"{med([r.query_s for r in rs]):9.2f} {max(r.slowest_s for r in rs):8.2f}"
            )
        b, g = results[(name, base.name)], results[(name, big.name)]
        wall = med([x.wall_s / y.wall_s for x, y in zip(g, b, strict=True)])
        touched = g[-1].touched / max(1, b[-1].touched)
        rows.append(
            (
                f"{name}, wall s",
                f"{med([r.wall_s for r in g]):.2f}",
                f"{med([r.wall_s for r in b]):.2f}",
                f"{wall:.2f}",
                "<= 10 s",
                _pass(med([r.wall_s for r in g]) <= 10),
            )
        )
        rows.append(
            (
                f"{name}, peak RSS MiB",
                f"{med([r.rss_mib for r in g]):.0f}",
                f"{med([r.rss_mib for r in b]):.0f}",
                f"{med([r.rss_mib for r in g]) / med([r.rss_mib for r in b]):.2f}",
                "<= 1.5x",
                _pass(med([r.rss_mib for r in g]) <= 1.5 * med([r.rss_mib for r in b])),
            )
        )
        share = g[-1].touched / big.samples
        fleet = name.startswith("report --top")
        rows.append(
            (
                f"{name}, samples touched",
                f"{g[-1].touched:,}",
                f"{b[-1].touched:,}",
                f"{touched:.2f}",
                "<= 1 % of stored" if fleet else "-",
                _pass(share <= 0.01) if fleet else f"{share:.2%}",
            )
        )
        ok = ok and all(r[-1] != "MISS" for r in rows[-3:])
    rk_b = results[("report --top 20 --since 7d", base.name)][-1].touched_ranking
    rk_g = results[("report --top 20 --since 7d", big.name)][-1].touched_ranking
    rows.append(
        (
            "samples touched by the ranking query (records)",
            f"{rk_g:,}",
            f"{rk_b:,}",
            f"{rk_g / max(1, rk_b):.2f}",
            "<= 1.2x (same jobs)",
            _pass(rk_g <= 1.2 * rk_b),
        )
    )
    ok = ok and rows[-1][-1] == "PASS"
    print(
        f"\n{big.name} (gpumon) against {base.name} (baseline), same {len(big.cluster.jobs)} jobs; "
        f"median of {runs} run(s); {machine_load()}\n"
    )
    print(table(rows))
    return exit_status(ok)


def _pass(ok: bool) -> str:
    return "PASS" if ok else "MISS"


if __name__ == "__main__":
    raise SystemExit(main())
