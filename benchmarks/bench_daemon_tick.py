"""The daemon's tick against the in-process tick, in one run, on the fake NVML library.

    python benchmarks/bench_daemon_tick.py [--quick | --smoke] [--profile]

Both read the same 8 fake GPUs (H100s with GPM) held by one Slurm job: a real process
tree of 32 processes (a parent and 31 sleeping workers, ``SLURM_JOB_ID`` in their
environment) whose parent and 7 workers are the GPUs' processes, one per GPU.

* **in-process tick**: what ``gpumon watch --pid`` runs,
  ``Session.live(LiveOptions(pid=parent, interval_s=1)).tick()``: NVML + host + the
  parent's tree + the detector.
* **daemon tick**: what ``gpumon serve`` runs, built as ``faces/serve/command.py`` builds
  it (``Session.live(LiveOptions(interval_s=1), jobs=job_options(cfg),
  config=detector_config(cfg))``, ``ServeState(session, cfg, EventLog(...))``) and
  stepped as its loop steps it (``state.step()``): NVML + host, the job labels of the
  GPUs' pids (read once, then cached), the job table, the job's process tree (its lowest
  GPU pid and descendants: the same 32 processes), the node's detector fed that tree, the
  gap and burst histograms, the time per state; the log is a file, written to only when
  an episode opens or closes.  Scrapes are not part of the tick (bench_serve measures
  them).

Both are called once a second, as their loops call them (benchmarks/_timing.py
``at_cadence``: slots half a second apart, order rotating, sleeping in between, so each
tick finds caches as cold as at 1 Hz and reads a real second of driver samples); the
figure is the mean process CPU time per tick over a run (what comes every few seconds, as
the scan of processes outside the job, counted in), the median of several runs, and the
ratio the median of the runs' ratios.  Target (issue 12): the daemon's tick costs no more
than 1.2x the in-process tick.  ``--profile`` prints where the daemon's extra time goes
(cProfile of both, the functions whose own time differs most).  ``--smoke``: a few ticks
50 ms apart, only to prove the figure is produced.  Exit status 0 when the target is met,
3 when it is missed.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import time
from dataclasses import astuple
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import (  # noqa: E402
    add_modes,
    at_cadence,
    cadence_of,
    exit_status,
    machine_load,
    run_ratio,
    say_load,
    table,
)
from fakenvml import FakeGPU, Pattern, Process, Scenario, load_in_process, write_scenario  # noqa: E402

PROCTREE = ROOT / "tests" / "helpers" / "proctree.py"
N_GPUS = 8
N_PROCS = 32
JOB_ID = "4242"


def start_job() -> tuple[subprocess.Popen[str], list[int]]:
    """A Slurm job's tree: the parent and N_PROCS - 1 sleeping workers (parent first)."""
    env = dict(os.environ, SLURM_JOB_ID=JOB_ID)
    proc = subprocess.Popen(
        [sys.executable, str(PROCTREE), "0", str(N_PROCS - 1), "600"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "ready", line
    return proc, [proc.pid, *(int(p) for p in line[1:])]


def _own_time(stats: pstats.Stats) -> dict[str, tuple[float, int]]:
    """Per function: own time (s) and calls."""
    out = {}
    for (file, line, name), (_cc, calls, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        short = f"{Path(file).name}:{line}({name})"
        out[short] = (tottime, calls)
    return out


def profile(daemon: object, in_process: object, ticks: int) -> str:
    """Where the daemon's tick spends time the in-process tick does not."""
    per: list[dict[str, tuple[float, int]]] = []
    for fn in (daemon, in_process):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(ticks):
            fn()  # type: ignore[operator]
        prof.disable()
        per.append(_own_time(pstats.Stats(prof)))
    d, p = per
    rows = []
    for key in set(d) | set(p):
        dt, dc = d.get(key, (0.0, 0))
        pt, pc = p.get(key, (0.0, 0))
        rows.append((dt - pt, key, dt, pt, dc, pc))
    rows.sort(reverse=True)
    lines = ["own time per tick under cProfile (us): daemon, in-process, daemon - in-process"]
    for diff, key, dt, pt, dc, pc in rows[:15]:
        lines.append(
            f"  {1e6 * dt / ticks:7.1f} {1e6 * pt / ticks:7.1f} {1e6 * diff / ticks:+7.1f}"
            f"  calls {dc / ticks:5.1f} / {pc / ticks:5.1f}  {key}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_modes(parser, "a shorter run (about 40 s)")
    parser.add_argument("--profile", action="store_true", help="where the daemon's time goes")
    args = parser.parse_args()
    calls, runs, period_s = astuple(cadence_of(args, full=(120, 5), quick=(30, 3)))

    from gpumon.engine import LiveOptions, Session
    from gpumon.faces.serve.config import ServeConfig
    from gpumon.faces.serve.daemon import ServeState, detector_config, job_options
    from gpumon.faces.serve.log import EventLog

    tree, pids = start_job()
    tmp = Path(tempfile.mkdtemp())
    try:
        assert min(pids) == pids[0], "the parent must be the job's lowest GPU pid"
        gpus = [
            FakeGPU(
                pattern=Pattern.burst(1.0, 0.4),
                processes=[Process(pids[i * (len(pids) // N_GPUS)])],
                gpm_supported=True,
            )
            for i in range(N_GPUS)
        ]
        write_scenario(tmp / "scenario.txt", Scenario(gpus=gpus))
        load_in_process(tmp / "scenario.txt")
        time.sleep(0.05)

        watch = Session.live(LiveOptions(pid=pids[0], interval_s=1.0))
        cfg = ServeConfig(log_path=str(tmp / "gpumon.jsonl"))
        node = Session.live(  # as `gpumon serve` builds it (faces/serve/command.py)
            LiveOptions(interval_s=cfg.interval_s),
            jobs=job_options(cfg),
            config=detector_config(cfg),
        )
        log = EventLog(cfg.log_path)
        state = ServeState(node, cfg, log)
        contenders = {"in_process": watch.tick, "daemon": state.step}
        say_load("start")
        load0 = machine_load()
        res = at_cadence(contenders, calls=calls, period_s=period_s, warmup=3)
        load1 = machine_load()
        say_load("end")
        # Both saw what they should while they were timed.
        tree_sample = watch.tick().snapshot.tree
        assert tree_sample is not None and len(tree_sample.processes) == N_PROCS
        state.step()
        (job,) = state.jobs.values()
        assert job.labels.hpc_job == JOB_ID and job.detector is None  # the whole node
        assert job.tree_sample is not None and len(job.tree_sample.processes) == N_PROCS
        assert state.tick_errors_total == 0, state.tick_errors_total
        verdicts = (watch.verdict(), node.verdict())
        report = profile(state.step, watch.tick, 200) if args.profile else ""
        log.close()
        watch.close()
        node.close()
    finally:
        tree.terminate()
        tree.wait()
    if not args.smoke:  # both judge the stream they read
        states = [v.state.value for v in verdicts if v is not None]
        assert states == ["starved", "starved"], states
    r = run_ratio(res["daemon"], res["in_process"], runs)
    ok = r <= 1.2
    print(
        f"\n{N_GPUS} GPUs, a {N_PROCS}-process Slurm job ({load0} -> {load1}); CPU us per "
        f"tick (process time), one a {period_s:g} s, median over {runs} runs of the mean:"
    )
    for name in ("in_process", "daemon"):
        t = res[name]
        lo, hi = t.spread(runs)
        print(f"  {name:10} cpu {t.figure(runs):7.0f} us ({lo:.0f}-{hi:.0f})")
    if report:
        print("\n" + report)
    print()
    print(
        table(
            [
                (
                    f"daemon tick / in-process tick, {N_GPUS} GPU, {N_PROCS} procs (CPU us)",
                    f"{res['daemon'].figure(runs):.0f}",
                    f"{res['in_process'].figure(runs):.0f}",
                    f"{r:.2f}",
                    "<= 1.20x",
                    "PASS" if ok else "FAIL",
                )
            ]
        )
    )
    return exit_status(ok)


if __name__ == "__main__":
    raise SystemExit(main())
