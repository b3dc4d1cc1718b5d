"""Labelled synthetic GPU traces: the corpus the detector is measured on, and `gpumon demo`.

Pure and deterministic (a seed in, snapshots and ground truth out).  Each GPU's activity is
a timeline of compute and spin (busy-wait) intervals; the driver's utilisation samples are
the share of each sample period those intervals cover, plus noise, at one of the periods
real products use (1/6 s to 1 s) or coarser (2 s, or `util_pct` only as in an nvidia-smi
CSV).  Power, memory, processes, host CPU and the process tree follow the phase, so each
starvation cause has the host signature that should reveal it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from gpumon.model import (
    Cause,
    GpuIdentity,
    GpuProcess,
    GpuSample,
    HostSample,
    ProcessSample,
    ProcTreeSample,
    Snapshot,
    State,
    TraceHeader,
    UtilPoint,
)

SCENARIOS = (
    "healthy",
    "starved_cpu",
    "starved_gil",
    "starved_io",
    "healthy_then_starved",
    "straggler",
    "checkpoint",
    "sync_pauses",
    "idle",
    "idle_mem",
    "finished",
    "coarse_starved",
    "coarse_healthy",
    "starved_periodic",
    "starved_lockstep",
)
# Driver sample periods of real products (1/6 s .. 1 s) and a coarser one.
PERIODS = (1 / 6, 0.2, 0.25, 0.5, 1.0, 2.0)
_GIB = 1024**3


@dataclass(frozen=True, slots=True)
class Label:
    """Ground truth: what one GPU was doing over [start_s, end_s)."""

    start_s: float
    end_s: float
    gpu: int
    state: State
    cause: Cause | None = None
    note: str | None = None


@dataclass(frozen=True, slots=True)
class Phase:
    """One stretch of a run, the same on every GPU (a straggler phase names its GPU)."""

    kind: str  # startup, healthy, starved, straggler, pauses, idle, idle_mem
    duration_s: float
    cause: Cause | None = None
    label: State | None = None  # overrides the kind's default label (pauses)
    params: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SynthTrace:
    """A generated trace with its ground truth."""

    name: str
    seed: int
    header: TraceHeader
    snapshots: tuple[Snapshot, ...]
    labels: tuple[Label, ...]
    phases: tuple[Phase, ...]
    period_s: float | None  # driver sample period; None = util_pct only (coarse log)

    def label_at(self, t: float, gpu: int) -> Label | None:
        for lab in self.labels:
            if lab.gpu == gpu and lab.start_s <= t < lab.end_s:
                return lab
        return None


# --- activity timelines -----------------------------------------------------------------


def _jit(rng: random.Random, x: float, sigma: float = 0.2) -> float:
    return x * math.exp(rng.gauss(0.0, sigma))


def _alternate(
    rng: random.Random,
    t0: float,
    t1: float,
    burst: float,
    gap: float,
    out: list[tuple[float, float]],
    sigma: float = 0.2,
) -> None:
    """Bursts of ~burst s separated by gaps of ~gap s, random phase, jittered."""
    t = t0 + rng.uniform(0.0, burst + gap)
    if t - t0 > gap:  # start inside a burst
        out.append((t0, min(t1, t - gap)))
    while t < t1:
        b = _jit(rng, burst, sigma)
        out.append((t, min(t1, t + b)))
        t += b + _jit(rng, gap, sigma)


def _busy_overlap(iv: list[tuple[float, float]], a: float, b: float, j: int) -> tuple[float, int]:
    """Time [a, b) overlaps the sorted intervals; j is a cursor that only moves forward."""
    n = len(iv)
    while j < n and iv[j][1] <= a:
        j += 1
    s = 0.0
    k = j
    while k < n and iv[k][0] < b:
        lo = iv[k][0] if iv[k][0] > a else a
        hi = iv[k][1] if iv[k][1] < b else b
        if hi > lo:
            s += hi - lo
        k += 1
    return s, j


@dataclass
class _Gpu:
    index: int
    compute: list[tuple[float, float]] = field(default_factory=list)
    spin: list[tuple[float, float]] = field(default_factory=list)
    labels: list[Label] = field(default_factory=list)


def _build(rng: random.Random, phases: Sequence[Phase], n: int, straggler: int) -> list[_Gpu]:
    gpus = [_Gpu(i) for i in range(n)]
    t = 0.0
    pause_grid: list[tuple[float, float]] = []
    for ph in phases:
        t1 = t + ph.duration_s
        if ph.kind == "pauses":
            length, every = ph.params["pause_s"], ph.params["every_s"]
            pt = t + rng.uniform(0.3, 1.0) * every
            pause_grid = []
            while pt < t1:
                pause_grid.append((pt, min(t1, pt + _jit(rng, length, 0.15))))
                pt += _jit(rng, every, 0.1)
        for g in gpus:
            st, cause, note = _label_of(ph, g.index, straggler)
            g.labels.append(Label(t, t1, g.index, st, cause, note))
            if ph.kind == "startup":
                for _ in range(rng.randint(0, 3)):
                    a = rng.uniform(t, t1)
                    g.compute.append((a, min(t1, a + rng.uniform(0.05, 0.3))))
            elif ph.kind == "healthy":
                _alternate(
                    rng, t, t1, rng.uniform(0.3, 3.0), rng.uniform(0.002, 0.03), g.compute, 0.3
                )
            elif ph.kind == "starved":
                burst, duty = ph.params["burst_s"], ph.params["duty"]
                _alternate(
                    rng, t, t1, _jit(rng, burst, 0.1), burst * (1.0 - duty) / duty, g.compute
                )
            elif ph.kind == "straggler":
                if g.index == straggler:
                    burst, duty = ph.params["burst_s"], ph.params["duty"]
                    _alternate(rng, t, t1, burst, burst * (1.0 - duty) / duty, g.compute)
                else:
                    # Short compute, then spin in the collective until the straggler arrives.
                    comp: list[tuple[float, float]] = []
                    _alternate(
                        rng,
                        t,
                        t1,
                        0.15,
                        0.15 * (1 - ph.params["peer_compute"]) / ph.params["peer_compute"],
                        comp,
                    )
                    g.compute += comp
                    prev = t
                    for a, b in comp:
                        if a > prev:
                            g.spin.append((prev, a))
                        prev = b
                    if prev < t1:
                        g.spin.append((prev, t1))
            elif ph.kind == "pauses":
                busy: list[tuple[float, float]] = []
                _alternate(rng, t, t1, rng.uniform(0.3, 3.0), rng.uniform(0.002, 0.03), busy, 0.3)
                spin = ph.params.get("spin", 0.0) > 0.5
                _cut(busy, pause_grid, g.compute, g.spin if spin else None, rng.uniform(-0.2, 0.2))
        t = t1
    for g in gpus:
        g.compute.sort()
        g.spin.sort()
    return gpus


def _cut(
    busy: list[tuple[float, float]],
    pauses: list[tuple[float, float]],
    out: list[tuple[float, float]],
    spin_out: list[tuple[float, float]] | None,
    shift: float,
) -> None:
    """Remove the (shifted) pauses from busy intervals; spin through them if asked."""
    ps = [(a + shift, b + shift) for a, b in pauses]
    for a, b in busy:
        segs = [(a, b)]
        for pa, pb in ps:
            nxt = []
            for sa, sb in segs:
                if pb <= sa or pa >= sb:
                    nxt.append((sa, sb))
                    continue
                if sa < pa:
                    nxt.append((sa, pa))
                if pb < sb:
                    nxt.append((pb, sb))
            segs = nxt
        out.extend(segs)
    if spin_out is not None:
        spin_out.extend(ps)


def _label_of(ph: Phase, gpu: int, straggler: int) -> tuple[State, Cause | None, str | None]:
    if ph.label is not None:
        return ph.label, ph.cause if ph.label is State.STARVED else None, None
    if ph.kind == "startup":
        return State.IDLE, None, "start-up"
    if ph.kind == "healthy":
        return State.HEALTHY, None, None
    if ph.kind == "starved":
        return State.STARVED, ph.cause or Cause.UNKNOWN, None
    if ph.kind == "straggler":
        return State.SYNC_STALL, None, "straggler" if gpu == straggler else "busy-wait"
    if ph.kind in ("idle", "idle_mem"):
        return State.IDLE, None, ph.kind
    return State.UNKNOWN, None, None


# --- host and process tree --------------------------------------------------------------


def _host_tree(
    rng: random.Random, ph: Phase, t: float, cores: int, nworkers: int, root: int
) -> tuple[HostSample, ProcTreeSample | None]:
    kind, cause = ph.kind, ph.cause
    main = rng.uniform(55, 95)
    wcpu = [rng.uniform(25, 60) for _ in range(nworkers)]
    iowait = rng.uniform(0.0, 2.0)
    read = rng.uniform(10e6, 80e6)
    status = "sleeping"
    workers = nworkers
    if kind == "startup":
        main, wcpu = rng.uniform(90, 100), [rng.uniform(0, 5) for _ in range(nworkers)]
    elif kind == "starved" and cause is Cause.CPU:
        main = rng.uniform(20, 50)
        wcpu = [rng.uniform(92, 100) for _ in range(nworkers)]
    elif kind == "starved" and cause is Cause.GIL:
        main = rng.uniform(96, 100)
        wcpu = [rng.uniform(0, 3) for _ in range(nworkers)]
    elif kind == "starved" and cause is Cause.IO:
        main = rng.uniform(15, 40)
        wcpu = [rng.uniform(8, 35) for _ in range(nworkers)]
        iowait = rng.uniform(15, 45)
        read = rng.uniform(300e6, 900e6)
        status = "disk-sleep"
    elif kind == "idle":
        main, wcpu, workers = 0.0, [], 0
        read = rng.uniform(0, 1e6)
    elif kind == "idle_mem":
        main, wcpu = rng.uniform(0, 3), [rng.uniform(0, 2) for _ in range(nworkers)]
    busy_cores = (main + sum(wcpu)) / 100 + rng.uniform(0.0, 0.3)
    per_core = [min(100.0, max(0.0, rng.gauss(100 * busy_cores / cores, 5))) for _ in range(cores)]
    cpu = min(100.0, 100 * busy_cores / cores + rng.uniform(0, 2))
    host = HostSample(
        t,
        tuple(per_core),
        cpu,
        iowait,
        busy_cores,
        busy_cores,
        busy_cores,
        disk_read_bytes_per_s=read * rng.uniform(1.0, 1.2),
    )
    if kind == "idle":
        return host, None
    procs = [ProcessSample(root, 1, "python", main, 12, read * 0.05, 0.0, "running")]
    for k in range(workers):
        procs.append(
            ProcessSample(
                root + 1 + k,
                root,
                "pt_data_worker",
                wcpu[k],
                2,
                read * 0.95 / max(1, workers),
                0.0,
                status,
            )
        )
    return host, ProcTreeSample(t, root, tuple(procs))


# --- scenarios --------------------------------------------------------------------------


def _phases(rng: random.Random, scenario: str, n: int, dur: float) -> list[Phase]:
    startup = Phase("startup", rng.uniform(8.0, 40.0))

    def starved(d: float, cause: Cause | None = None) -> Phase:
        return Phase(
            "starved",
            d,
            cause or rng.choice((Cause.CPU, Cause.GIL, Cause.IO)),
            params={
                "burst_s": math.exp(rng.uniform(math.log(0.08), math.log(2.0))),
                "duty": rng.uniform(0.15, 0.65),
            },
        )

    if scenario == "healthy":
        return [startup, Phase("healthy", dur)]
    if scenario == "starved_periodic":
        # Long-period and high-duty starvation: a loader stalling once per epoch, a slow
        # step every N: periods of 2 s to 2 min, duty cycles up to 0.85.
        period = math.exp(rng.uniform(math.log(2.0), math.log(120.0)))
        duty = rng.uniform(0.3, 0.85)
        ph = Phase(
            "starved",
            max(dur, 7.0 * period),
            rng.choice((Cause.CPU, Cause.GIL, Cause.IO)),
            params={"burst_s": period * duty, "duty": duty},
        )
        return [startup, ph]
    if scenario == "starved_lockstep":
        # Data-parallel ranks all starved: every GPU idles together, more than it works.
        pause = rng.uniform(3.0, 12.0)
        return [
            startup,
            Phase("healthy", dur * 0.25),
            Phase(
                "pauses",
                dur * 0.75,
                cause=Cause.UNKNOWN,
                label=State.STARVED,
                params={"pause_s": pause, "every_s": pause / rng.uniform(0.6, 0.85)},
            ),
        ]
    if scenario.startswith("starved_"):
        return [startup, starved(dur, Cause(scenario.split("_", 1)[1]))]
    if scenario == "healthy_then_starved":
        return [startup, Phase("healthy", dur * 0.5), starved(dur * 0.5)]
    if scenario == "straggler":
        return [
            startup,
            Phase("healthy", dur * 0.3),
            Phase(
                "straggler",
                dur * 0.7,
                params={
                    "burst_s": rng.uniform(0.3, 1.5),
                    "duty": rng.uniform(0.35, 0.7),
                    "peer_compute": rng.uniform(0.1, 0.3),
                },
            ),
        ]
    if scenario == "checkpoint":
        return [
            startup,
            Phase(
                "pauses",
                dur,
                label=State.HEALTHY,
                params={"pause_s": rng.uniform(1.0, 4.0), "every_s": rng.uniform(60.0, 180.0)},
            ),
        ]
    if scenario == "sync_pauses":
        return [
            startup,
            Phase("healthy", dur * 0.25),
            Phase(
                "pauses",
                dur * 0.75,
                label=State.SYNC_STALL,
                params={
                    "pause_s": (pause := rng.uniform(6.0, 15.0)),
                    # Pauses between stretches of work longer than themselves (a
                    # checkpoint or an evaluation every N steps): idling more than working
                    # in lock step is every rank's input pipeline (starved_lockstep).
                    "every_s": rng.uniform(max(20.0, 2.2 * pause), 40.0),
                    "spin": float(rng.random() < 0.4),
                },
            ),
        ]
    if scenario == "idle":
        return [Phase("idle", dur)]
    if scenario == "idle_mem":
        return [Phase("idle_mem", dur)]
    if scenario == "finished":
        return [startup, Phase("healthy", dur * 0.5), Phase("idle", dur * 0.5)]
    if scenario == "coarse_starved":
        return [startup, starved(dur)]
    if scenario == "coarse_healthy":
        return [startup, Phase("healthy", dur)]
    raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")


def generate(
    scenario: str,
    seed: int = 0,
    *,
    gpus: int | None = None,
    period_s: float | None = None,
    duration_s: float | None = None,
    tick_s: float = 1.0,
    phases: Sequence[Phase] | None = None,
) -> SynthTrace:
    """One labelled trace.  Unset knobs are drawn from the seed (deterministically).

    ``phases`` replaces the scenario's own story (the scenario name still seeds the
    machine: GPU count, power, cores, workers), e.g. for a demo told in chosen phases.
    """
    rng = random.Random(f"{scenario}:{seed}")
    multi = scenario in ("straggler", "sync_pauses", "starved_lockstep")
    n = gpus if gpus is not None else rng.choice((2, 4, 8) if multi else (1, 1, 2, 4, 8))
    if multi and n < 2:
        raise ValueError(f"{scenario} needs at least 2 GPUs")
    coarse = scenario.startswith("coarse_")
    period = None if coarse else (period_s if period_s is not None else rng.choice(PERIODS))
    dur = duration_s if duration_s is not None else rng.uniform(180.0, 420.0)
    story = _phases(rng, scenario, n, dur)
    phases = list(phases) if phases is not None else story
    straggler = rng.randrange(n)
    timelines = _build(rng, phases, n, straggler)
    total = sum(p.duration_s for p in phases)
    limit = rng.choice((300.0, 400.0, 700.0))
    mem_total = rng.choice((24, 40, 80)) * _GIB
    no_power = not multi and rng.random() < 0.15
    mem_share = rng.uniform(0.3, 0.95)
    cores = rng.choice((16, 32, 64))
    nworkers = rng.randint(2, min(8, cores // max(1, n)))
    if any(p.cause is Cause.GIL for p in phases):
        nworkers = rng.choice((0, nworkers))
    identities = tuple(
        GpuIdentity(
            i,
            f"GPU-synth-{seed:04d}-{i}",
            "Synthetic H100",
            f"00000000:{i + 1:02X}:00.0",
            mem_total,
            limit,
        )
        for i in range(n)
    )
    header = TraceHeader(
        1,
        "synth",
        "synth-host",
        1_700_000_000.0,
        0.0,
        tick_s,
        cpu_count=cores,
        watched_pid=4242,
        command=("python", "train.py"),
        gpus=identities,
        extra={"scenario": scenario, "seed": seed},
    )
    busy_w = [limit * rng.uniform(0.78, 0.95) for _ in range(n)]
    spin_w = [limit * rng.uniform(0.2, 0.32) for _ in range(n)]
    idle_w = limit * 0.1
    offsets = [rng.uniform(0.0, period or 1.0) for _ in range(n)]
    cursors = [[0, 0, 0, 0] for _ in range(n)]
    next_pt = [offsets[i] + (period or 1.0) for i in range(n)]
    last_u: list[float] = [0.0] * n
    snaps: list[Snapshot] = []
    t = 0.0
    ph_i, ph_end = 0, phases[0].duration_s
    ph_start = 0.0
    while t + tick_s <= total + 1e-9:
        t_prev = t
        t = round(t + tick_s, 6)
        while t > ph_end and ph_i < len(phases) - 1:
            ph_i += 1
            ph_start = ph_end
            ph_end += phases[ph_i].duration_s
        ph = phases[ph_i]
        tick_t = t + rng.uniform(-0.005, 0.005)
        silent_idle = ph.kind in ("idle", "idle_mem") and (seed % 2 == 0)
        samples = []
        for i, g in enumerate(timelines):
            cur = cursors[i]
            pts: list[UtilPoint] = []
            if period is not None:
                while next_pt[i] <= t:
                    b = next_pt[i]
                    a = b - period
                    c, cur[0] = _busy_overlap(g.compute, a, b, cur[0])
                    s, cur[1] = _busy_overlap(g.spin, a, b, cur[1])
                    u = 100.0 * (c + s) / period
                    u = u + rng.gauss(0, 1.5) if u > 0 else (rng.choice((0, 0, 0, 1)))
                    u = min(100.0, max(0.0, round(u)))
                    pts.append(UtilPoint(b + rng.uniform(-0.002, 0.002), u))
                    last_u[i] = u
                    next_pt[i] = b + period
            else:
                c, cur[0] = _busy_overlap(g.compute, t_prev, t, cur[0])
                s, cur[1] = _busy_overlap(g.spin, t_prev, t, cur[1])
                last_u[i] = min(100.0, max(0.0, round(100 * (c + s) / tick_s + rng.gauss(0, 1.0))))
            cshare, cur[2] = _busy_overlap(g.compute, t_prev, t, cur[2])
            sshare, cur[3] = _busy_overlap(g.spin, t_prev, t, cur[3])
            power = (
                None
                if no_power
                else round(
                    idle_w
                    + (busy_w[i] - idle_w) * cshare / tick_s
                    + (spin_w[i] - idle_w) * sshare / tick_s
                    + rng.gauss(0, 3),
                    1,
                )
            )
            procs: tuple[GpuProcess, ...] | None
            if ph.kind == "idle":
                mem, procs = 300 * 1024**2, ()
            else:
                frac = 1.0 if ph.kind != "startup" else min(1.0, (t - ph_start) / ph.duration_s)
                mem = int(mem_total * mem_share * frac) + 500 * 1024**2
                procs = (GpuProcess(4242 + i, mem),)
            if coarse:
                procs = None
            samples.append(
                GpuSample(
                    tick_t,
                    i,
                    identities[i].uuid,
                    util_samples=() if (silent_idle or coarse) else tuple(pts),
                    util_pct=last_u[i],
                    mem_used_bytes=mem,
                    mem_total_bytes=mem_total,
                    power_watts=power,
                    power_limit_watts=None if no_power else limit,
                    processes=procs,
                    unsupported=("power",) if no_power else (),
                )
            )
        host, tree = (None, None) if coarse else _host_tree(rng, ph, tick_t, cores, nworkers, 4242)
        snaps.append(Snapshot(tick_t, tuple(samples), host, tree))
    labels = tuple(lab for g in timelines for lab in g.labels)
    if coarse:  # no host data: no cause can be known
        labels = tuple(
            Label(
                lab.start_s,
                lab.end_s,
                lab.gpu,
                lab.state,
                Cause.UNKNOWN if lab.state is State.STARVED else lab.cause,
                lab.note,
            )
            for lab in labels
        )
    return SynthTrace(
        f"{scenario}/{seed}", seed, header, tuple(snaps), labels, tuple(phases), period
    )


def corpus(
    seeds: Sequence[int] = range(8), scenarios: Sequence[str] = SCENARIOS, **kw: float | int | None
) -> Iterator[SynthTrace]:
    """Every scenario for every seed (knobs not given are drawn per trace)."""
    for seed in seeds:
        for sc in scenarios:
            yield generate(sc, seed, **kw)  # type: ignore[arg-type]
