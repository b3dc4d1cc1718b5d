"""Precision, recall, cause accuracy, latency and speed of the detector on the synthetic corpus.

Runs every trace through the live path (``Detector.update`` tick by tick) and scores:

* **Precision/recall over time**: every whole second of every GPU is one item, its truth
  the ground-truth label at the second's midpoint, its prediction the detector's final
  (closed) episode there.  Seconds within a *grace window* after each ground-truth
  transition (and after the start) are not scored: the window is the latency the targets
  allow, ``max(3 burst/gap periods, 10 s)`` of the state entered, so a detector is not
  charged twice for the latency it is allowed.
* **Cause accuracy**: of the seconds truly starved and flagged starved, the share whose
  cause matches.
* **Latency**: for each ground-truth transition into a state, the stream time from its
  onset until the update in which the detector first *opened* an episode of that state for
  that GPU (live, not backdated); a transition never detected counts as a miss.
* **Throughput**: driver points per second of detector time (generation excluded).

Usage: ``python benchmarks/bench_detector.py [--seeds N] [--quick | --smoke]``.  Exit
status 0 when every target is met, 3 when one is missed.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import exit_status

from gpumon.detect import Detector, DetectorConfig
from gpumon.lab.synth import SCENARIOS, Label, Phase, SynthTrace, generate
from gpumon.model import Cause, Episode, State

TARGET = 0.95
SCORED = (State.STARVED, State.HEALTHY, State.SYNC_STALL, State.IDLE)


def phase_period(ph: Phase) -> float:
    """The burst/gap (or pause) period of a phase, 0 where there is none."""
    p = ph.params
    if "burst_s" in p:
        return p["burst_s"] / p["duty"]
    if "every_s" in p:
        return p["every_s"]
    return 0.0


def allowance(ph: Phase) -> float:
    return max(3 * phase_period(ph), 10.0)


def _phase_of(trace: SynthTrace, lab: Label) -> Phase:
    t = 0.0
    for ph in trace.phases:
        if t <= lab.start_s + 1e-9 < t + ph.duration_s:
            return ph
        t += ph.duration_s
    return trace.phases[-1]


def run_trace(
    trace: SynthTrace, config: DetectorConfig | None = None
) -> tuple[list[Episode], list[tuple[float, Episode]], float, int]:
    det = Detector(config, gpus=trace.header.gpus)
    opened: list[tuple[float, Episode]] = []
    points = 0
    t0 = time.process_time()
    for snap in trace.snapshots:
        upd = det.update(snap)
        for ep in upd.opened:
            if ep.gpu is not None:
                opened.append((snap.t_s, ep))
    fin = det.finish()
    dt = time.process_time() - t0
    for snap in trace.snapshots:
        for g in snap.gpus:
            points += len(g.util_samples) or (1 if g.util_pct is not None else 0)
    closed = [ep for ep in fin.closed if ep.gpu is not None]
    # Closed episodes arrive over the stream too; rebuild them from opened + the final close.
    eps = _final_episodes(opened, closed)
    return eps, opened, dt, points


def _final_episodes(opened: list[tuple[float, Episode]], last: list[Episode]) -> list[Episode]:
    """Each GPU's episodes with their final (backdated) extents."""
    by_gpu: dict[int, list[Episode]] = defaultdict(list)
    for _, ep in opened:
        by_gpu[ep.gpu].append(ep)  # type: ignore[index]
    out: list[Episode] = []
    for gpu, eps in by_gpu.items():
        eps.sort(key=lambda e: e.start_s)
        ends = {e.gpu: e.end_s for e in last}
        for a, b in zip(eps, [*eps[1:], None], strict=True):
            end = b.start_s if b is not None else ends.get(gpu, a.start_s)
            out.append(
                Episode(
                    gpu=a.gpu,
                    uuid=a.uuid,
                    state=a.state,
                    cause=a.cause,
                    start_s=a.start_s,
                    end_s=end,
                )
            )
    return out


PERIOD_BANDS = (
    (0.0, 2.0, "<2 s"),
    (2.0, 10.0, "2-10 s"),
    (10.0, 30.0, "10-30 s"),
    (30.0, 1e9, "30-120 s"),
)
DUTY_BANDS = ((0.0, 0.5, "<0.5"), (0.5, 0.7, "0.5-0.7"), (0.7, 1.0, "0.7-0.85"))


def band_of(ph: Phase) -> str | None:
    """The (period, duty) band of a starved phase, e.g. ``"10-30 s x 0.7-0.85"``."""
    p = ph.params
    if ph.kind != "starved" or "burst_s" not in p:
        return None
    period, duty = p["burst_s"] / p["duty"], p["duty"]
    pb = next(name for lo, hi, name in PERIOD_BANDS if lo <= period < hi)
    db = next(name for lo, hi, name in DUTY_BANDS if lo <= duty < hi)
    return f"{pb} x {db}"


def score(
    trace: SynthTrace,
    eps: list[Episode],
    opened: list[tuple[float, Episode]],
    conf: dict,
    causes: list[int],
    lat: list[tuple[float, float, str]],
    bands: dict | None = None,
) -> None:
    """Fill the confusion counts, cause counts and latencies (and, per starved (period,
    duty) band: ``bands[band] = [truth starved s, caught s, predicted starved s, of which
    right]`` over the traces whose starved phase is in that band)."""
    trace_band = next((b for ph in trace.phases if (b := band_of(ph)) is not None), None)
    by_gpu: dict[int, list[Episode]] = defaultdict(list)
    for ep in eps:
        by_gpu[ep.gpu].append(ep)  # type: ignore[index]
    labels_by_gpu: dict[int, list[Label]] = defaultdict(list)
    for lab in trace.labels:
        labels_by_gpu[lab.gpu].append(lab)
    for gpu, labs in labels_by_gpu.items():
        labs.sort(key=lambda lab: lab.start_s)
        geps = sorted(by_gpu.get(gpu, []), key=lambda e: e.start_s)
        # Transitions: where the labelled state (and cause) changes.
        prev: Label | None = None
        graces: list[tuple[float, float]] = []
        for lab in labs:
            if prev is None or (lab.state, lab.cause) != (prev.state, prev.cause):
                ph = _phase_of(trace, lab)
                graces.append((lab.start_s, lab.start_s + allowance(ph)))
                if prev is not None:
                    hit = next(
                        (
                            t
                            for t, ep in opened
                            if ep.gpu == gpu
                            and ep.state is lab.state
                            and t >= lab.start_s - 1e-9
                            and t < lab.end_s + allowance(ph)
                        ),
                        None,
                    )
                    # An episode of that state already open at onset counts as detected.
                    cur = next((e for e in geps if e.start_s <= lab.start_s < (e.end_s or 0)), None)
                    if cur is not None and cur.state is lab.state:
                        hit = lab.start_s
                    per = "csv-1s" if trace.period_s is None else f"{trace.period_s:.2f}s"
                    band = band_of(ph)
                    lat.append(
                        (
                            math.inf if hit is None else hit - lab.start_s,
                            allowance(ph),
                            f"{trace.name} gpu{gpu} ->{lab.state} [{band or '-'}] (samples {per})",
                        )
                    )
            prev = lab
        end = int(labs[-1].end_s)
        j = 0
        li = 0
        for s in range(end):
            m = s + 0.5
            if any(a <= m < b for a, b in graces):
                continue
            while li < len(labs) - 1 and labs[li].end_s <= m:
                li += 1
            lab = labs[li]
            while j < len(geps) - 1 and (geps[j].end_s or 0) <= m:
                j += 1
            ep = geps[j] if geps and geps[j].start_s <= m < (geps[j].end_s or 0) else None
            pred = ep.state if ep is not None else State.UNKNOWN
            conf[(lab.state, pred)] += 1
            if bands is not None and trace_band is not None:
                row = bands.setdefault(trace_band, [0, 0, 0, 0])
                row[0] += lab.state is State.STARVED
                row[1] += lab.state is State.STARVED and pred is State.STARVED
                row[2] += pred is State.STARVED
                row[3] += pred is State.STARVED and lab.state is State.STARVED
            if lab.state is State.STARVED and pred is State.STARVED and ep is not None:
                causes[0] += 1
                causes[1] += int(ep.cause == lab.cause)
                conf[("cause", lab.cause, ep.cause)] += 1


def pct(vals: list[float], q: float) -> float:
    s = sorted(vals)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else math.nan


def speed_line(minutes: float = 20.0) -> None:
    """Throughput at analyze's design load: 8 GPUs x 6 driver samples/s, CPU time."""
    from gpumon.engine import OFFLINE_CONFIG, analyze

    tr = generate("healthy_then_starved", 99, gpus=8, period_s=1 / 6, duration_s=minutes * 60)
    n = sum(len(g.util_samples) for s in tr.snapshots for g in s.gpus)
    out = []
    for name, cfg in (("live", None), ("offline", OFFLINE_CONFIG)):
        det = Detector(cfg, tr.header.gpus)
        t0 = time.process_time()
        for snap in tr.snapshots:
            det.update(snap)
        out.append((name, n / (time.process_time() - t0)))
    t0 = time.process_time()
    analyze(tr.header, tr.snapshots)
    rate = n / (time.process_time() - t0)
    print(
        f"speed (8 GPUs x 6 samples/s, {n:,} points): detector live {out[0][1]:,.0f} "
        f"points/s, offline {out[1][1]:,.0f} points/s; analyze {rate:,.0f} "
        f"points/s -> 4 M points in {4e6 / rate:.1f} s (parsing not included)"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="3 seeds")
    mode.add_argument("--smoke", action="store_true", help="1 seed (the tables, not the score)")
    ap.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="start of the seed range (other seeds: a held-out corpus)",
    )
    ap.add_argument("--verbose", action="store_true", help="list missed/late transitions")
    ap.add_argument("--scenario", action="append", help="only these scenarios")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a DetectorConfig field (for tuning)",
    )
    args = ap.parse_args()
    config = DetectorConfig(
        **{
            k: type(getattr(DetectorConfig(), k))(v)
            for k, v in (kv.split("=", 1) for kv in args.set)
        }
    )
    n_seeds = 1 if args.smoke else 3 if args.quick else args.seeds
    seeds = range(args.first_seed, args.first_seed + n_seeds)
    scenarios = args.scenario or SCENARIOS
    conf: dict = defaultdict(int)
    causes = [0, 0]
    lat: list[tuple[float, float, str]] = []
    det_s = 0.0
    points = 0
    wall = time.perf_counter()
    ntr = 0
    per_trace: list[tuple[str, float]] = []
    flaps = [0, 0]  # episodes shorter than 10 s (flapping), all episodes
    bands: dict[str, list[int]] = {}
    for seed in seeds:
        for sc in scenarios:
            tr = generate(sc, seed)
            eps, opened, dt, npts = run_trace(tr, config)
            det_s += dt
            points += npts
            ntr += 1
            flaps[0] += sum(
                1
                for e in eps
                if (e.end_s or e.start_s) - e.start_s < 10.0 and e.end_s != tr.snapshots[-1].t_s
            )
            flaps[1] += len(eps)
            before = dict(conf)
            score(tr, eps, opened, conf, causes, lat, bands)
            good = sum(
                v - before.get(k, 0) for k, v in conf.items() if len(k) == 2 and k[0] == k[1]
            )
            allv = sum(v - before.get(k, 0) for k, v in conf.items() if len(k) == 2)
            per_trace.append(
                (f"{tr.name} p={tr.period_s} n={len(tr.header.gpus)}", good / allv if allv else 1.0)
            )
    wall = time.perf_counter() - wall
    ok = True
    print(
        f"corpus: {ntr} traces ({len(scenarios)} scenarios x {len(seeds)} seeds), "
        f"{points:,} util points"
    )
    print(f"{'state':<11} {'precision':>9} {'recall':>7} {'seconds':>8}  target>={TARGET}")
    for st in SCORED:
        tp = conf[(st, st)]
        pred = sum(v for k, v in conf.items() if len(k) == 2 and k[1] == st)
        truth = sum(v for k, v in conf.items() if len(k) == 2 and k[0] == st)
        p = tp / pred if pred else math.nan
        r = tp / truth if truth else math.nan
        passed = p >= TARGET and r >= TARGET
        ok &= passed
        print(f"{st.value:<11} {p:>9.3f} {r:>7.3f} {truth:>8}  {'PASS' if passed else 'FAIL'}")
    unk = sum(v for k, v in conf.items() if len(k) == 2 and k[1] == State.UNKNOWN)
    tot = sum(v for k, v in conf.items() if len(k) == 2)
    print(f"{'(unknown)':<11} predicted for {unk} of {tot} scored seconds")
    print(f"episodes: {flaps[1]} GPU episodes, {flaps[0]} of them shorter than 10 s")
    acc = causes[1] / causes[0] if causes[0] else math.nan
    print(f"cause accuracy: {acc:.3f} over {causes[0]} starved seconds")
    for c in Cause:
        row = {k[2]: v for k, v in conf.items() if len(k) == 3 and k[1] == c}
        if row:
            print(
                f"  truth {c.value:<7} -> "
                + ", ".join(
                    f"{(p.value if p else None)}:{v}"
                    for p, v in sorted(row.items(), key=lambda kv: -kv[1])
                )
            )
    finite = [x for x, _, _ in lat if x != math.inf]
    within = sum(1 for x, a, _ in lat if x <= a)
    missed = sum(1 for x, _, _ in lat if x == math.inf)
    lat_ok = within == len(lat)
    ok &= lat_ok
    print(
        f"latency: {len(lat)} transitions, p50 {pct(finite, 0.5):.1f} s, "
        f"p90 {pct(finite, 0.9):.1f} s, max {max(finite, default=math.nan):.1f} s; "
        f"{within}/{len(lat)} within max(3 periods, 10 s), {missed} missed  "
        f"{'PASS' if lat_ok else 'FAIL'}"
    )
    by_period: dict[str, list[bool]] = defaultdict(list)
    for x, a, name in lat:
        by_period[name.rsplit("(samples ", 1)[1].rstrip(")")].append(x <= a)
    print(
        "  within target by sample period: "
        + ", ".join(f"{k} {sum(v)}/{len(v)}" for k, v in sorted(by_period.items()))
    )
    if bands:
        print("starved by (period, duty) band: recall, precision, latency within target")
        band_lat: dict[str, list[bool]] = defaultdict(list)
        for x, a, name in lat:
            if "->starved [" in name:
                band_lat[name.split("[", 1)[1].split("]", 1)[0]].append(x <= a)
        order = [f"{p} x {d}" for _, _, p in PERIOD_BANDS for _, _, d in DUTY_BANDS]
        for b in sorted(bands, key=order.index):
            truth, caught, pred, right = bands[b]
            rec = caught / truth if truth else math.nan
            prec = right / pred if pred else math.nan
            ok_l = band_lat.get(b, [])
            print(
                f"  {b:<18} recall {rec:.3f}  precision {prec:.3f}  latency "
                f"{sum(ok_l)}/{len(ok_l)}  ({truth} starved s)"
            )
    rate = points / det_s if det_s else math.nan
    print(
        f"throughput: {rate:,.0f} points/s in the detector ({det_s:.1f} s); bench wall {wall:.1f} s"
    )
    if args.verbose:
        for x, a, name in sorted(lat, key=lambda v: -(v[0] - v[1])):
            if x > a:
                print(f"  late/missed: {name}: {x:.1f} s > {a:.1f} s")
        for name, acc_t in sorted(per_trace, key=lambda v: v[1])[:15]:
            print(f"  worst: {name}: {acc_t:.3f}")
        print("confusion (truth -> predicted: seconds):")
        for st in State:
            row = {k[1]: v for k, v in conf.items() if len(k) == 2 and k[0] == st}
            if row:
                print(f"  {st.value:<10} " + ", ".join(f"{p.value}:{v}" for p, v in row.items()))
    speed_line()
    return exit_status(ok)


if __name__ == "__main__":
    raise SystemExit(main())
