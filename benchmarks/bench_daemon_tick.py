"""The daemon's tick against the in-process tick, in one run, on the fake NVML library.

    python benchmarks/bench_daemon_tick.py [--quick] [--profile]

Both read the same 8 fake GPUs (H100s with GPM) held by one Slurm job: a real process
tree of 32 processes (a parent and 31 sleeping workers, ``SLURM_JOB_ID`` in their
environment) whose parent and 7 workers are the GPUs' processes, one per GPU.

* **in-process tick**: what ``gpumon watch --pid`` runs, ``Session.live(pid=parent,
  interval_s=1).tick()``: NVML + host + the parent's tree + the detector.
* **daemon tick**: what ``gpumon serve`` runs, built as ``faces/serve/command.py`` builds
  it (``Session.live(interval_s=1)``, ``ServeState(session, ServeConfig(), EventLog(...))``)
  and stepped as its loop steps it (``state.step()``): NVML + host, the job labels of the
  GPUs' pids (read once, then cached), the job table, the job's process tree (its lowest
  GPU pid and descendants: the same 32 processes), the node's detector fed that tree, the
  gap and burst histograms, the time per state; the log is a file, written to only when
  an episode opens or closes.  Scrapes are not part of the tick (bench_serve measures
  them).

Interleaved in rotating order (benchmarks/_timing.py), each on its own emulated 1 Hz
clock (``OneHertz``: a second of driver samples per tick, the detector on its 1 Hz
schedule); medians of process CPU time per call; the ratio is the median of per-round
ratios.  Target (issue 12): the daemon's tick costs no more than 1.2x the in-process tick.
``--profile`` prints where the daemon's extra time goes (cProfile of both, the functions
whose own time differs most).
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import OneHertz, clock_modules, interleaved, nvml_sampler_of, ratio, table  # noqa: E402
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
    parser.add_argument("--quick", action="store_true", help="fewer rounds (smoke run)")
    parser.add_argument("--profile", action="store_true", help="where the daemon's time goes")
    args = parser.parse_args()
    rounds = 7 if args.quick else 31

    from gpumon.engine import Session
    from gpumon.faces.serve.config import ServeConfig
    from gpumon.faces.serve.daemon import ServeState
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
        modules = clock_modules()

        watch = Session.live(pid=pids[0], interval_s=1.0)
        hz_watch = OneHertz(nvml_sampler_of(watch), modules)

        cfg = ServeConfig(log_path=str(tmp / "gpumon.jsonl"))
        node = Session.live(interval_s=cfg.interval_s)  # as `gpumon serve` builds it
        log = EventLog(cfg.log_path)
        state = ServeState(node, cfg, log)
        hz_daemon = OneHertz(nvml_sampler_of(node), modules)

        def in_process() -> None:
            hz_watch.step()
            watch.tick()

        def daemon() -> None:
            hz_daemon.step()
            state.step()

        with hz_watch.installed():
            for _ in range(3):
                in_process()
                daemon()
            # Both see what they should before they are timed.
            assert len(watch.tick().snapshot.tree.processes) == N_PROCS  # type: ignore[union-attr]
            (job,) = state.jobs.values()
            assert job.labels.hpc_job == JOB_ID and job.detector is None  # the whole node
            assert job.tree_sample is not None and len(job.tree_sample.processes) == N_PROCS
            assert state.tick_errors_total == 0
            res = interleaved(
                {"in_process": in_process, "daemon": daemon},
                rounds=rounds,
                per_batch=4,
                warmup=5,
            )
            verdicts = (watch.verdict(), state.detector.verdict())
            report = profile(daemon, in_process, 200) if args.profile else ""
        log.close()
    finally:
        tree.terminate()
        tree.wait()
    states = [v.state.value for v in verdicts if v is not None]
    assert states == ["starved", "starved"], states  # both judge the stream they read
    r = ratio(res["daemon"], res["in_process"])
    ok = r <= 1.2
    print(
        f"\n{N_GPUS} GPUs, a {N_PROCS}-process Slurm job; CPU us per tick (process time), "
        "medians over rounds, each at an emulated 1 Hz:"
    )
    for name in ("in_process", "daemon"):
        t = res[name]
        print(f"  {name:10} cpu {t.cpu_us:7.0f} us   wall {t.wall_us:7.0f} us")
    if report:
        print("\n" + report)
    print()
    print(
        table(
            [
                (
                    f"daemon tick / in-process tick, {N_GPUS} GPU, {N_PROCS} procs (CPU us)",
                    f"{res['daemon'].cpu_us:.0f}",
                    f"{res['in_process'].cpu_us:.0f}",
                    f"{r:.2f}",
                    "<= 1.20x",
                    "PASS" if ok else "FAIL",
                )
            ]
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
