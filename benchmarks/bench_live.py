"""The live path scored on the live lab: watch, serve and analyze against jobs' own truth.

Each scenario of the lab (tests/livelab/workloads.py: training jobs driving emulated GPUs
through the fake NVML) runs once per seed, observed at once by ``gpumon watch --pid`` (its
plain lines as they arrive, its summary and recording), ``gpumon serve`` (``/metrics``
scraped every second, its log) and ``gpumon analyze --json`` of watch's recording, all
through the public command line (tests/livelab/runner.py).  The scorer
(tests/livelab/score.py) compares every face, second by second, with the truth each job
logs (what it waited on, what its GPU ran), skipping a settling margin after each truth
change (8 s for the live faces, the detector's window; 3 s for the backdated episodes),
and reports per scenario and face:

- precision and recall per state, cause accuracy, reason accuracy (idle and sync_stall);
- latency from each truth change to the face showing it (and keeping it 3 s);
- state and cause changes per steady minute, the most cause changes in one steady phase;
- whether the faces tell one story (watch's lines against serve's metrics and against its
  own summary; the summary against analyze; per-GPU against run-level GPU-seconds lost;
  the advice: no repeats, a line for each cause; serve's job series naming the job).

``--placement plain`` runs the jobs as commands on a node with no scheduler, and
``--placement container`` in a container-like cgroup (as root): serve must find each job
itself (tests/livelab/runner.py).

Targets (the issue "Live verdicts you can trust"): precision and recall >= 0.95 per state,
cause accuracy >= 0.95, a GPU busy from its first sample shown healthy within 3 s, at most
one cause change per steady phase, every face agreeing.  Seeds 0-99 are the tuning range;
``--first-seed 7000`` runs the held-out range, never tuned on (run it once, report it).

    python benchmarks/bench_live.py                      # seeds 0-1, phases x2 (~20 min)
    python benchmarks/bench_live.py --first-seed 7000    # the held-out range
    python benchmarks/bench_live.py --quick              # one seed, CI-length phases
    python benchmarks/bench_live.py --smoke              # one short run: the tables, moot
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import exit_status  # noqa: E402
from livelab import runner, score, workloads  # noqa: E402
from livelab.pipeline import make_data_file  # noqa: E402

HELD_OUT_FIRST_SEED = 7000


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}"


def scenario_table(name: str, faces: dict[str, score.FaceScore]) -> list[str]:
    out = [f"\n-- {name}"]
    states = [s for s in score.STATES if any(fs.support(s) or fs.said(s) for fs in faces.values())]
    head = f"{'face':10}" + "".join(f"{s + ' P/R':>18}" for s in states)
    head += f"{'cause':>7}{'reason':>7}{'latency med/max s':>19}{'chg/min st/cause':>18}"
    head += f"{'max cause chg':>14}"
    out.append(head)
    for face, fs in faces.items():
        row = f"{face:10}"
        for s in states:
            row += f"{_fmt(fs.precision(s)) + '/' + _fmt(fs.recall(s)):>18}"
        lats = [lat["latency_s"] for lat in fs.latencies if lat["phase"] != "exited"]
        got = [v for v in lats if v is not None]
        lat = (
            "-"
            if not lats
            else f"{median(got) if got else 0:.1f}/"
            + (f"{max(got):.1f}" if len(got) == len(lats) else "never")
        )
        spm, cpm = fs.changes_per_min()
        row += f"{_fmt(fs.cause_accuracy):>7}{_fmt(fs.reason_accuracy):>7}{lat:>19}"
        row += f"{_fmt(spm) + '/' + _fmt(cpm):>18}{fs.max_cause_changes_per_phase:>14}"
        out.append(row)
    return out


def markdown(per_scn: dict[str, dict[str, score.FaceScore]], checks: dict[str, list[score.Check]],
             seeds: dict[str, list[int]]) -> list[str]:  # fmt: skip
    """The per-scenario tables as benchmarks/README.md shows them."""
    out = []
    for name, faces in per_scn.items():
        states = [
            s for s in score.STATES if any(fs.support(s) or fs.said(s) for fs in faces.values())
        ]
        out += ["", f"**{name}** (seeds {', '.join(map(str, seeds[name]))})", ""]
        out.append("| face | " + " | ".join(f"{s} P / R" for s in states) + " | cause | reason "
                   "| latency med / max s | changes / steady min (state, cause) | most cause "
                   "changes in a phase |")  # fmt: skip
        out.append("|---" * (len(states) + 6) + "|")
        for face, fs in faces.items():
            pr = [f"{_fmt(fs.precision(s))} / {_fmt(fs.recall(s))}" for s in states]
            spm, cpm = fs.changes_per_min()
            out.append(f"| {face} | " + " | ".join(pr) + f" | {_fmt(fs.cause_accuracy)} | "
                       f"{_fmt(fs.reason_accuracy)} | {_latency(fs)} | {_fmt(spm)} / {_fmt(cpm)} "
                       f"| {fs.max_cause_changes_per_phase} |")  # fmt: skip
        failed = [c for c in checks[name] if not c.ok]
        names = sorted({c.name for c in failed})
        out.append("")
        out.append(f"Faces agree: {len(checks[name]) - len(failed)}/{len(checks[name])} checks"
                   + (f"; failed: {'; '.join(names)}." if names else "."))  # fmt: skip
    return out


def _latency(fs: score.FaceScore) -> str:
    lats = [lat["latency_s"] for lat in fs.latencies if lat["phase"] != "exited"]
    got = [v for v in lats if v is not None]
    if not lats:
        return "-"
    worst = f"{max(got):.1f}" if len(got) == len(lats) else f"never ({len(lats) - len(got)})"
    return f"{median(got) if got else 0:.1f} / {worst}"


def report(run_dirs: list[Path], json_out: Path | None, md_out: Path | None = None) -> int:
    """Score the runs, print the tables and the targets; 0 when every target is met."""
    per_scn: dict[str, dict[str, score.FaceScore]] = {}
    checks: dict[str, list[score.Check]] = {}
    seeds: dict[str, list[int]] = {}
    results = []
    for run_dir in run_dirs:
        rs = score.score_run(run_dir)
        results.append(rs.to_json())
        seeds.setdefault(rs.scenario, []).append(rs.seed)
        faces = per_scn.setdefault(rs.scenario, {f: score.FaceScore(f) for f in score.FACES})
        for f, fs in rs.faces.items():
            faces[f].add(fs)
        checks.setdefault(rs.scenario, []).extend(rs.checks)
    lines = ["\nscores (seeds summed per scenario)"]
    for name, faces in per_scn.items():
        lines += scenario_table(name, faces)
        failed = [c for c in checks[name] if not c.ok]
        lines.append(f"  faces agree: {len(checks[name]) - len(failed)}/{len(checks[name])} checks")
        lines += [f"    x {c}" for c in sorted({c.name for c in failed})]
        off = [(r["seed"], p["phase"]) for r in results if r["scenario"] == name
               for p in r["invalid_phases"]]  # fmt: skip
        if off:
            lines.append(f"  off design, not scored (seed, phase): {off}")
    print("\n".join(lines))
    print(f"\n{'target':58}{'result':>10}")
    totals = {f: score.FaceScore(f) for f in score.FACES}
    for faces in per_scn.values():
        for f, fs in faces.items():
            totals[f].add(fs)
    for f, fs in totals.items():
        print(f"{f + ': worst precision/recall over states (>= 0.95)':58}{_fmt(fs.worst()):>10}")
        print(f"{f + ': cause accuracy (>= 0.95)':58}{_fmt(fs.cause_accuracy):>10}")
    met = sum(not r["failures"] for r in results)
    print(f"{'runs with every target met':58}{met:>5}/{len(results)}")
    if json_out:
        json_out.write_text(json.dumps(results, indent=1))
    if md_out:
        md_out.write_text("\n".join(markdown(per_scn, checks, seeds)) + "\n")
    return exit_status(met == len(results))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--first-seed", type=int, default=0, help="first seed (held-out: 7000)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per scenario (default 2)")
    ap.add_argument("--scale", type=float, default=2.0, help="phase length factor (default 2)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="one seed at CI length (scale 1)")
    mode.add_argument(
        "--smoke", action="store_true", help="one io run at CI length: the tables, not the score"
    )
    ap.add_argument(
        "--scenario", action="append", choices=workloads.names(), help="only these scenarios"
    )
    ap.add_argument("--keep", type=Path, help="keep every run's files under this folder")
    ap.add_argument("--json", type=Path, help="write every run's scores here")
    ap.add_argument("--markdown", type=Path, help="write the tables as markdown here")
    ap.add_argument(
        "--rescore", type=Path, metavar="DIR", help="score the runs kept under DIR (no new runs)"
    )
    ap.add_argument(
        "--gpumon-src", type=Path, metavar="DIR", help="observe with the gpumon of this checkout"
    )
    ap.add_argument(
        "--placement",
        choices=runner.PLACEMENTS,
        default="slurm",
        help="where the jobs run: as Slurm jobs (default), plain commands on a node with no "
        "scheduler, or in a container-like cgroup (root); serve must find them itself",
    )
    args = ap.parse_args()
    if args.rescore:
        runs = sorted(p.parent for p in args.rescore.glob("*/run.json"))
        return report(runs, args.json, args.markdown)
    if args.quick:
        args.seeds, args.scale = 1, 1.0
    if args.smoke:
        args.seeds, args.scale, args.scenario = 1, 1.0, ["io"]
    names = args.scenario or workloads.names()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    held_out = args.first_seed >= HELD_OUT_FIRST_SEED
    print(
        f"live lab: scenarios {', '.join(names)}; seeds {seeds.start}-{seeds.stop - 1} "
        f"({'held-out' if held_out else 'tuning'} range); phases x{args.scale}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp:
        base = args.keep or Path(tmp)
        data = make_data_file(Path(tmp) / "data.bin", 256 << 20)
        run_dirs = []
        started = time.monotonic()
        for name in names:
            for seed in seeds:
                run_dir = base / f"{name}-{seed}"
                t0 = time.monotonic()
                scn = workloads.build(name, seed, args.scale)
                runner.run(scn, run_dir, data, gpumon_src=args.gpumon_src, placement=args.placement)
                run_dirs.append(run_dir)
                print(f"{name} seed {seed}: {time.monotonic() - t0:.0f} s", flush=True)
        print(f"{len(run_dirs)} runs in {time.monotonic() - started:.0f} s")
        return report(run_dirs, args.json, args.markdown)


if __name__ == "__main__":
    sys.exit(main())
