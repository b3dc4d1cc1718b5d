"""Run one lab scenario and observe it with every face of gpumon at once.

One run of the job is watched by ``gpumon watch --pid PID --plain --summary-json F --record
R`` (its lines stamped as they arrive; with ``--stacks`` where a test asks), by ``gpumon
serve`` on a loopback port with ``--log`` (``/metrics`` scraped every second), and
afterwards by ``gpumon analyze --json R`` of watch's recording: only gpumon's public command
line, each in its own process, against the fake NVML whose GPUs the job drives.  Every face
is given one hang threshold (``truth.HANG_AFTER_S``: watch ``--hang-after``, serve's
``[detector] hang_after_s`` in ``serve.toml``; analyze reads it from watch's recording).
Everything lands in the run's folder::

    run.json        the scenario, seed, when the job was told to go and when it exited
    truth-rank*.jsonl  the job's truth (truth.py)
    watch.jsonl     watch's plain lines, each with the monotonic time it arrived
    summary.json    watch's end-of-run summary;  record.jsonl  watch's recording
    metrics.jsonl   serve's per-GPU state, cause and reason at each scrape
    serve.jsonl     serve's log;  analyze.json  ``gpumon analyze --json record.jsonl``

Where the job runs (``placement``): ``slurm``, with ``SLURM_JOB_ID`` in its environment
(serve finds it as a Slurm job); ``plain``, a node with no scheduler: the job is started
below a shell that leads its own session, as a command typed in an ssh login or a tmux
pane is, and serve must find it from its process tree; ``container``, the job placed in a
cgroup shaped as a Docker container's (``docker-<id>.scope``, made as root: livelab/
cgroup.py), found from its cgroup.  metrics.jsonl also keeps the jobs serve's series name
(``gpumon_job_state``), so the scorer can check that they name this job.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fakenvml import FakeGPU, Scenario, fake_env, write_scenario

from livelab import cgroup, emulator
from livelab.truth import HANG_AFTER_S
from livelab.workloads import LabScenario

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
JOB = TESTS / "livelab" / "job.py"
SLURM_JOB_ID = "4242"
PLACEMENTS = ("slurm", "plain", "container")
CONTAINER_ID = "1ab" + "0" * 61  # the lab's container-like cgroup: docker-<id>.scope

_METRIC = re.compile(r"^gpumon_gpu_(state|cause|reason)\{([^}]*)\} ([0-9.e+-]+)$")
_JOB_STATE = re.compile(r"^gpumon_job_state\{([^}]*)\} 1(?:\.0)?$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class Observed:
    """Where a run's files are, once it is done."""

    dir: Path
    scenario: LabScenario
    go_t: float
    exit_t: float | None
    end_t: float
    errors: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fake_machine(scn: LabScenario, run_dir: Path) -> Path:
    """The fake NVML's scenario: one H100 per rank, driven by that rank's file."""
    gpus = []
    for rank in range(scn.ranks):
        emu = emulator.create(run_dir / f"gpu{rank}.emu")
        gpus.append(FakeGPU(driven=emu, gpm_supported=scn.gpm))
    return write_scenario(run_dir / "fakenvml.txt", Scenario(gpus=gpus))


def gpumon(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpumon", *args]


# How long a face, the job or a wait on them may take before the run is called broken: a
# deadline for what never comes, not a measure (a face starts in seconds on a machine at
# load 20: its imports alone).
START_DEADLINE_S = 180.0


class _Lines(threading.Thread):
    """Reads a pipe line by line, stamping each line with time.monotonic() on arrival."""

    def __init__(self, pipe: IO[str], out: Path) -> None:
        super().__init__(daemon=True)
        self.pipe, self.out = pipe, out
        self.first = threading.Event()
        self.count = 0

    def run(self) -> None:
        with open(self.out, "w", encoding="utf-8") as f:
            for line in self.pipe:
                f.write(json.dumps({"t": time.monotonic(), "line": line.rstrip("\n")}) + "\n")
                f.flush()
                self.count += 1
                self.first.set()


class _Scraper(threading.Thread):
    """Scrapes the daemon's /metrics every ``every_s``: per-GPU state, cause and reason."""

    def __init__(self, port: int, out: Path, every_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.out, self.every_s = out, every_s
        self.stop = threading.Event()
        self.failures = 0

    def run(self) -> None:
        with open(self.out, "w", encoding="utf-8") as f:
            next_t = time.monotonic()
            while not self.stop.is_set():
                try:
                    with urllib.request.urlopen(self.url, timeout=5) as r:
                        text = r.read().decode()
                    t = time.monotonic()
                    rec = {"t": t, "gpus": parse_metrics(text), "jobs": parse_jobs(text)}
                    f.write(json.dumps(rec) + "\n")
                    f.flush()
                except OSError:
                    self.failures += 1
                next_t += self.every_s
                self.stop.wait(max(0.0, next_t - time.monotonic()))


def parse_metrics(text: str) -> dict[str, dict[str, str | None]]:
    """{gpu: {"state": s, "cause": c, "reason": r}} from an exposition."""
    out: dict[str, dict[str, str | None]] = {}
    for line in text.splitlines():
        m = _METRIC.match(line)
        if not m or float(m[3]) != 1.0:
            continue
        labels = dict(_LABEL.findall(m[2]))
        gpu = labels.get("gpu")
        if gpu is None:
            continue
        entry = out.setdefault(gpu, {"state": None, "cause": None, "reason": None})
        entry[m[1]] = labels.get(m[1])
    return out


def parse_jobs(text: str) -> list[dict[str, str]]:
    """The labels of each job serve's series name (its current gpumon_job_state)."""
    out = []
    for line in text.splitlines():
        m = _JOB_STATE.match(line)
        if m:
            labels = dict(_LABEL.findall(m[1]))
            labels.pop("state", None)
            out.append(labels)
    return out


def _placed(
    cmd: list[str], placement: str
) -> tuple[list[str], dict[str, Any], cgroup.Placement | None]:
    """The job's command as ``placement`` starts it, Popen's options, and its cgroup."""
    if placement == "plain":  # below a shell leading its session: a typed command
        return ["sh", "-c", '"$@"; exit $?', "sh", *cmd], {"start_new_session": True}, None
    if placement == "container":
        why = cgroup.unavailable()
        if why is not None:
            raise RuntimeError(f"no container-like cgroup can be made: {why}")
        place = cgroup.Placement.create(v2=f"system.slice/docker-{CONTAINER_ID}.scope")
        return place.argv(cmd), {}, place
    return cmd, {}, None


def _start(cmd: list[str], env: dict[str, str], **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, env=env, text=True, cwd=ROOT, **kw)


def _face(run_dir: Path, face: str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """``gpumon FACE ARGS`` with stdout piped (watch's lines) and stderr in FACE.err."""
    with open(run_dir / f"{face}.err", "w", encoding="utf-8") as err:
        out = subprocess.PIPE if face == "watch" else subprocess.DEVNULL
        return _start(gpumon(face, *args), env, stdout=out, stderr=err)


def _serve_config(run_dir: Path) -> Path:
    """serve's configuration: the hang threshold every face is given (truth.HANG_AFTER_S;
    watch takes it as --hang-after, analyze from watch's recording), defaults otherwise."""
    path = run_dir / "serve.toml"
    path.write_text(f"[detector]\nhang_after_s = {HANG_AFTER_S:g}\n", encoding="utf-8")
    return path


def _stop(proc: subprocess.Popen[str] | None, sig: int = signal.SIGTERM, wait: float = 10) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def run(
    scn: LabScenario,
    run_dir: Path,
    data_file: Path | None = None,
    *,
    watch_interval_s: float = 0.5,
    serve_interval_s: float = 1.0,
    use_torch: bool = False,
    gpumon_src: Path | None = None,
    stacks_every_s: float | None = None,
    placement: str = "slurm",
) -> Observed:
    """Run ``scn`` once, observed by watch, serve and (afterwards) analyze -- this checkout's
    gpumon, or the one in ``gpumon_src`` (another checkout, to compare).  ``stacks_every_s``:
    watch (only watch) also reads the job's Python stacks, a window that often.
    ``placement``: where the job runs (``PLACEMENTS``: see above)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r} (known: {', '.join(PLACEMENTS)})")
    run_dir.mkdir(parents=True, exist_ok=True)
    scenario_path = fake_machine(scn, run_dir)
    env = fake_env(scenario_path)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(gpumon_src or ROOT), str(TESTS), *filter(None, [env.get("PYTHONPATH")])]
    )
    # `python -m gpumon` would put its working folder (this checkout) first: the gpumon
    # observing is PYTHONPATH's, gpumon_src's where one is given.
    env["PYTHONSAFEPATH"] = "1"
    job_env = dict(env, SLURM_JOB_ID=SLURM_JOB_ID)
    if placement != "slurm":  # no scheduler (nor one the runner itself runs under)
        for name in [k for k in job_env if k.startswith("SLURM_")]:
            del job_env[name]
    job_env.pop("FAKE_NVML_SCENARIO", None)  # the job never calls NVML
    errors: list[str] = []
    neighbours: list[subprocess.Popen[str]] = []
    serve = job = watch = None
    job_pid: int | None = None
    place: cgroup.Placement | None = None
    scraper: _Scraper | None = None
    go_t = time.monotonic()
    exit_t: float | None = None
    wall_minus_mono = time.time() - time.monotonic()
    try:
        for _ in range(scn.neighbours):  # outside the job's tree: the runner's children
            neighbours.append(_start([sys.executable, "-c", "while True: pass"], env))
        port = free_port()
        serve_args = ["--listen", f"127.0.0.1:{port}", "--interval", str(serve_interval_s)]
        serve = _face(
            run_dir, "serve", env, "--config", str(_serve_config(run_dir)), *serve_args,
            "--log", str(run_dir / "serve.jsonl"),
        )  # fmt: skip
        _wait_port(port, serve)
        scraper = _Scraper(port, run_dir / "metrics.jsonl")
        scraper.start()
        cmd = [sys.executable, str(JOB), scn.name, "--seed", str(scn.seed), "--dir", str(run_dir)]
        cmd += ["--scenario-json", json.dumps(scn.to_json())]
        if data_file is not None:
            cmd += ["--data", str(data_file)]
        if use_torch:
            cmd.append("--torch")
        cmd, how, place = _placed(cmd, placement)
        err = open(run_dir / "job.err", "w")  # noqa: SIM115 (the job's, for its life)
        job = _start(cmd, job_env, stdout=subprocess.PIPE, stderr=err, **how)
        assert job.stdout is not None
        ready = job.stdout.readline().split()
        if not ready or ready[0] != "ready":
            raise RuntimeError(f"the job did not start: {(run_dir / 'job.err').read_text()}")
        job_pid = int(ready[1])  # the job's own process (below the shell, where one starts it)
        stacks = (
            [] if stacks_every_s is None else ["--stacks", "--stacks-every", str(stacks_every_s)]
        )
        watch = _face(
            run_dir, "watch", env, "--pid", str(job_pid), "--plain",
            "--interval", str(watch_interval_s), "--summary-json", str(run_dir / "summary.json"),
            "--record", str(run_dir / "record.jsonl"), "--hang-after", f"{HANG_AFTER_S:g}",
            *stacks,
        )  # fmt: skip
        assert watch.stdout is not None
        lines = _Lines(watch.stdout, run_dir / "watch.jsonl")
        lines.start()
        if not lines.first.wait(START_DEADLINE_S):
            raise RuntimeError(f"gpumon watch printed nothing in {START_DEADLINE_S:g} s")
        go_t = time.monotonic()
        (run_dir / "go").write_text("go\n")
        try:
            job.wait(scn.seconds + START_DEADLINE_S)
        except subprocess.TimeoutExpired:
            errors.append("the job ran past its time and was killed")
            _stop(job, signal.SIGKILL)
        exit_t = time.monotonic()
        try:
            watch.wait(START_DEADLINE_S)
        except subprocess.TimeoutExpired:
            errors.append("gpumon watch did not end after the job exited")
            _stop(watch, signal.SIGINT)
        lines.join(5)
        time.sleep(scn.observe_after_exit_s + 1.5)
    finally:
        if scraper is not None:
            scraper.stop.set()
            scraper.join(10)
        for p in (watch, job):
            _stop(p, signal.SIGKILL if p is job else signal.SIGINT)
        if placement == "plain" and job is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)  # the shell's session: the job's tree
        if place is not None:
            place.close()  # kills what is left inside, removes the cgroup
        _stop(serve)
        for n in neighbours:
            _stop(n, signal.SIGKILL)
    end_t = time.monotonic()
    wall_minus_mono = (wall_minus_mono + (time.time() - time.monotonic())) / 2
    for name, p in (("job", job), ("watch", watch), ("serve", serve)):
        if p is not None and p.returncode not in (0, None):
            errors.append(f"{name} exited with status {p.returncode}")
    record = run_dir / "record.jsonl"
    if record.exists():
        with open(run_dir / "analyze.json", "w", encoding="utf-8") as out:
            r = subprocess.run(
                gpumon("analyze", "--json", str(record)),
                env=env,
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                timeout=120,
            )
        if r.returncode != 0:
            errors.append(f"analyze exited with status {r.returncode}: {r.stderr.strip()}")
    else:
        errors.append("watch left no recording")
    meta = {
        "scenario": scn.to_json(),
        "go_t": go_t,
        "exit_t": exit_t,
        "end_t": end_t,
        "wall_minus_mono": wall_minus_mono,
        "errors": errors,
        "scrape_failures": scraper.failures if scraper else None,
        "placement": placement,
        "job_pid": job_pid,
        "container_id": CONTAINER_ID if placement == "container" else None,
    }
    (run_dir / "run.json").write_text(json.dumps(meta, indent=1))
    return Observed(run_dir, scn, go_t, exit_t, end_t, errors)


def _wait_port(port: int, proc: subprocess.Popen[str], timeout: float = START_DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gpumon serve exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"gpumon serve did not listen on port {port} in {timeout:.0f} s")
