"""Watch a training job whose truth is known, on an emulated GPU: no GPU, no CUDA needed.

    python examples/live_lab.py                    # the "lifecycle" job under gpumon watch
    python examples/live_lab.py starved --seed 3   # another scenario, another draw
    python examples/live_lab.py ranks --score      # every face at once, scored against truth
    python examples/live_lab.py --list

The job is one of the live lab's (tests/livelab/workloads.py): a real training loop with
a DataLoader-shaped input pipeline (forked workers, queues, prefetch) whose "GPU" is an
emulated one: each step's kernels, each wait at a barrier (spinning), each allocation is
written to a small shared file that a fake ``libnvidia-ml.so.1`` (tests/fakenvml, built
here with gcc) turns into what NVML reports -- the driver's sample buffer, power, GPM
counters, memory and process list follow what the job really does.  gpumon itself is
unchanged: it loads the fake through ``LD_LIBRARY_PATH`` as it would load the driver.

Without ``--score`` the job runs under ``gpumon watch --pid`` (full screen on a terminal),
and afterwards the job's own truth is printed phase by phase beside watch's summary.  With
``--score`` it runs as the benchmark does (watch, serve and analyze at once, as plain
processes) and prints how each face did.  Needs gcc and a checkout (the lab lives in
tests/).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakenvml import fake_env  # noqa: E402
from livelab import runner, score, workloads  # noqa: E402
from livelab.pipeline import make_data_file  # noqa: E402
from livelab.truth import read_truth  # noqa: E402


def watch_live(scn: workloads.LabScenario, run_dir: Path, data: Path | None) -> int:
    """The job under `gpumon watch --pid` in this terminal; then its truth per phase."""
    env = fake_env(runner.fake_machine(scn, run_dir))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    job_env = dict(env, SLURM_JOB_ID=runner.SLURM_JOB_ID)
    cmd = [
        sys.executable,
        str(runner.JOB),
        scn.name,
        "--dir",
        str(run_dir),
        "--scenario-json",
        json.dumps(scn.to_json()),
    ]
    if data is not None:
        cmd += ["--data", str(data)]
    job = subprocess.Popen(cmd, env=job_env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert job.stdout is not None
    job.stdout.readline()  # "ready": calibrated, waiting for the go
    summary = run_dir / "summary.json"
    watch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpumon",
            "watch",
            "--pid",
            str(job.pid),
            "--summary-json",
            str(summary),
        ],
        env=env,
        cwd=ROOT,
    )
    time.sleep(1.0)  # let watch attach before the first kernel: the warm-up is part of it
    (run_dir / "go").write_text("go\n")
    try:
        job.wait()
        watch.wait()
    except KeyboardInterrupt:
        job.terminate()
        job.wait()
        watch.wait()
    print("\nwhat the job did (its own truth, phase by phase):")
    for rank in range(scn.ranks):
        for rec in read_truth(run_dir / f"truth-rank{rank}.jsonl"):
            if rec.get("event") != "phase_end":
                continue
            lab, m = rec["label"], rec["measured"]
            state = lab["state"] + (f"/{lab['cause']}" if lab["cause"] else "")
            state += f" ({lab['reason']})" if lab["reason"] else ""
            print(
                f"  GPU {rec['gpu']}  {rec['phase']:26} {m['seconds']:6.1f} s  {state:34} "
                f"compute {m['compute']:.0%}  spin {m['spin']:.0%}"
            )
    return job.returncode or 0


def scored(scn: workloads.LabScenario, run_dir: Path, data: Path | None) -> int:
    """Watch, serve and analyze at once; how each face did against the truth."""
    print(
        f"running {scn.name} ({scn.seconds:.0f} s of phases), observed by watch, serve and "
        "analyze ...",
        flush=True,
    )
    runner.run(scn, run_dir, data)
    rs = score.score_run(run_dir)
    for face, fs in rs.faces.items():
        fj = score.face_json(fs)
        states = "  ".join(
            f"{s} P {v['precision']} R {v['recall']}" for s, v in fj["states"].items()
        )
        print(f"{face:10} {states}  cause {fj['cause_accuracy']}")
    for line in score.timeline(run_dir):
        print(line)
    failures = rs.failures()
    print("\n".join(["", "targets missed:", *failures] if failures else ["", "every target met"]))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", nargs="?", default="lifecycle", choices=workloads.names())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=1.5, help="phase length factor (1.5)")
    ap.add_argument("--score", action="store_true", help="every face at once, scored")
    ap.add_argument("--dir", type=Path, help="keep the run's files here")
    ap.add_argument("--list", action="store_true", help="list the scenarios")
    args = ap.parse_args()
    if args.list:
        for name in workloads.names():
            scn = workloads.build(name, args.seed, args.scale)
            print(f"{name:10} {scn.title} [{', '.join(scn.covers)}]")
        return 0
    scn = workloads.build(args.scenario, args.seed, args.scale)
    with tempfile.TemporaryDirectory(prefix="live-lab-") as tmp:
        run_dir = args.dir or Path(tmp) / scn.name
        run_dir.mkdir(parents=True, exist_ok=True)
        data = None
        if any(p.data == "io" for p in scn.phases):
            data = make_data_file(Path(tmp) / "data.bin", 256 << 20)
        return (scored if args.score else watch_live)(scn, run_dir, data)


if __name__ == "__main__":
    sys.exit(main())
