"""Python stacks (``--stacks``) of real processes, read by the real py-spy.

The processes are ``tests/helpers/stackjob.py``: each mode does one thing (waits on its
loader while workers decode, writes a checkpoint with pickle.dump, evaluates, blocks in a
``.item()``, waits in a collective ...).  The stacks are real; only the GPU is the fake
NVML, where a face is driven end to end.  Tests that need torch (a real DataLoader,
torch.save, gloo ranks) skip without it; every activity is also covered without torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakenvml import FakeGPU, Pattern, Process, Scenario

from gpumon.detect.activities import Activity, decide, where
from gpumon.errors import StacksRefusedError
from gpumon.model import ProcessRole, StackSample
from gpumon.sample.stacks import StackSampler, Target, find_py_spy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        find_py_spy() is None, reason="py-spy is not installed (gpumon-why[stacks])"
    ),
]

ROOT = Path(__file__).resolve().parent.parent
STACKJOB = Path(__file__).parent / "helpers" / "stackjob.py"
try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")


class Job:
    """A running stackjob.py: its pid and its workers' (or ranks') pids."""

    def __init__(self, mode: str, lifetime: float = 90.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(STACKJOB), mode, str(lifetime)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        assert line and line[0] == "ready", line
        self.pid = int(line[1])
        self.children = [int(x) for x in line[2:]]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    started: list[Job] = []
    yield started
    for j in started:
        j.stop()


def record(targets: list[Target], seconds: int = 3, rate_hz: int = 20) -> list[StackSample]:
    """One window of the real sampler over ``targets``."""
    sampler = StackSampler()
    try:
        assert sampler.start(targets, rate_hz=rate_hz, seconds=seconds) == len(targets)
        got: list[StackSample] = []
        deadline = time.monotonic() + seconds + 30
        while sampler.busy and time.monotonic() < deadline:
            time.sleep(0.2)
            got += sampler.collect()
        return got
    finally:
        sampler.close()


def shares(samples: list[StackSample]) -> dict[tuple[ProcessRole, int], Counter[Activity]]:
    """Seconds per activity, per (role, pid)."""
    out: dict[tuple[ProcessRole, int], Counter[Activity]] = {}
    for s in samples:
        out.setdefault((s.role, s.pid), Counter())[decide(s.frames, s.role)[0]] += s.seconds
    return out


def top(c: Counter[Activity]) -> tuple[Activity, float]:
    act, secs = c.most_common(1)[0]
    return act, secs / sum(c.values())


def wheres(samples: list[StackSample], role: ProcessRole) -> Counter[str]:
    out: Counter[str] = Counter()
    for s in samples:
        if s.role is role:
            out[where(s.frames, decide(s.frames, s.role)[1])] += s.seconds
    return out


# --- each activity, on a real process -----------------------------------------------------

# The line of evaluate() where its time goes, as py-spy names a frame without its source.
EVALUATE_LINE = next(
    no
    for no, text in enumerate(STACKJOB.read_text().splitlines(), 1)
    if text.strip() == "correct += forward(i) % 2"
)


@pytest.mark.parametrize(
    ("mode", "activity", "place"),
    [
        ("main-decode", Activity.DECODE, "decode_image"),
        ("read", Activity.READ, "load_shard: chunk = fh.read(1 << 20)"),
        ("checkpoint", Activity.CHECKPOINT, "persist: pickle.dump(state, fh)"),
        ("evaluation", Activity.EVALUATION, f"stackjob.py:{EVALUATE_LINE} evaluate"),
        ("gpu-wait", Activity.GPU_WAIT, "run_gpu_wait: value = loss.item()"),
        ("step", Activity.STEP, "train_step"),
    ],
)
def test_a_main_process_activity_is_named_by_its_frames(
    jobs: list[Job], mode: str, activity: Activity, place: str
) -> None:
    job = Job(mode)
    jobs.append(job)
    began = time.monotonic()
    samples = record([Target(job.pid, ProcessRole.MAIN)])
    window_s = time.monotonic() - began
    assert samples, "py-spy read nothing"
    assert all(s.pid == job.pid and s.role is ProcessRole.MAIN for s in samples)
    act, share = top(shares(samples)[(ProcessRole.MAIN, job.pid)])
    assert act is activity and share >= 0.6, shares(samples)
    assert place in wheres(samples, ProcessRole.MAIN).most_common(1)[0][0]
    # Timed: the samples cover the window, back to back, on gpumon's clock: at least half
    # of py-spy's 3 s, at most the time it ran (a busy machine stretches its attach).
    assert 1.5 < sum(s.seconds for s in samples) <= window_s
    assert abs(samples[0].t_s - time.monotonic()) < 40


@pytest.mark.parametrize(
    ("mode", "place"),
    [
        ("loader", " consume -> multiprocessing.queues.Queue.get"),
        pytest.param(
            "torch-loader",
            " run_torch_loader -> torch.utils.data.dataloader._BaseDataLoaderIter.__next__",
            marks=needs_torch,
        ),
    ],
)
def test_a_loader_wait_with_workers_decoding(jobs: list[Job], mode: str, place: str) -> None:
    job = Job(mode)
    jobs.append(job)
    assert len(job.children) == 2
    targets = [Target(job.pid, ProcessRole.MAIN)]
    targets += [Target(w, ProcessRole.WORKER) for w in job.children]
    samples = record(targets)
    by = shares(samples)
    assert top(by[(ProcessRole.MAIN, job.pid)])[0] is Activity.LOADER_WAIT, by
    assert any(p.endswith(place) for p in wheres(samples, ProcessRole.MAIN))
    for w in job.children:
        assert top(by[(ProcessRole.WORKER, w)])[0] is Activity.DECODE, by
    # A worker's frames outside multiprocessing's _bootstrap are its parent's: not named
    # (but for a stack py-spy read torn, which --nonblocking allows, now and then).
    places = wheres(samples, ProcessRole.WORKER)
    parents = sum(x for p, x in places.items() if "run_" in p)
    assert parents <= 0.05 * sum(places.values()), places


@pytest.mark.parametrize(
    "mode",
    ["collective", pytest.param("torch-gloo", marks=needs_torch)],
)  # collective: the stand-in torch.distributed (torch's names, no torch); gloo: real ranks
def test_ranks_in_a_collective_and_the_one_elsewhere(jobs: list[Job], mode: str) -> None:
    job = Job(mode)
    jobs.append(job)
    samples = record([Target(r, ProcessRole.RANK) for r in job.children])
    by = shares(samples)
    waiting, straggler = job.children
    assert top(by[(ProcessRole.RANK, waiting)])[0] is Activity.COLLECTIVE, by
    assert top(by[(ProcessRole.RANK, straggler)])[0] is not Activity.COLLECTIVE, by
    assert any(
        p.endswith(" -> torch.distributed.distributed_c10d.all_reduce")
        for p in wheres(samples, ProcessRole.RANK)
    )
    assert any(
        p.endswith("next_batch_slowly: time.sleep(0.6)") for p in wheres(samples, ProcessRole.RANK)
    )


@needs_torch
def test_torch_save_is_a_checkpoint(jobs: list[Job]) -> None:
    job = Job("torch-save")
    jobs.append(job)
    samples = record([Target(job.pid, ProcessRole.MAIN)])
    act, share = top(shares(samples)[(ProcessRole.MAIN, job.pid)])
    assert act is Activity.CHECKPOINT and share >= 0.6
    # Named at torch's own save: ``save`` or the ``_save`` it calls, as py-spy catches it.
    place = wheres(samples, ProcessRole.MAIN).most_common(1)[0][0]
    assert re.search(r"-> torch\.serialization\._?save$", place), place


# --- what py-spy cannot read ----------------------------------------------------------------


def test_a_process_that_is_not_python_is_not_asked_again() -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    sampler = StackSampler()
    try:
        sampler.start([Target(sleeper.pid, ProcessRole.MAIN)], rate_hz=5, seconds=1)
        deadline = time.monotonic() + 60
        while sampler.busy and time.monotonic() < deadline:
            time.sleep(0.2)
            assert sampler.collect() == []
        assert sampler.skip(sleeper.pid)
        assert not sampler.off  # nothing was refused
        assert sampler.start([Target(sleeper.pid, ProcessRole.MAIN)], rate_hz=5, seconds=1) == 0
    finally:
        sampler.close()
        sleeper.kill()
        sleeper.wait()


REFUSED_SCRIPT = """
import json, sys, time
from gpumon.errors import StacksRefusedError
from gpumon.model import ProcessRole
from gpumon.sample.stacks import StackSampler, Target
sampler = StackSampler(sys.argv[2])
sampler.start([Target(int(sys.argv[1]), ProcessRole.MAIN)], rate_hz=5, seconds=1)
said = []
for _ in range(300):
    time.sleep(0.1)
    try:
        sampler.collect()
    except StacksRefusedError as exc:
        said.append(str(exc))
    if not sampler.busy:
        break
again = sampler.start([Target(int(sys.argv[1]), ProcessRole.MAIN)], rate_hz=5, seconds=1)
sampler.close()
print(json.dumps({"said": said, "off": sampler.off, "again": again}))
"""


NOBODY = 65534


REPO = Path(__file__).resolve().parent.parent


def _as_nobody(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    # This checkout on the path: an editable install under /root is not nobody's to read.
    env = {**os.environ, "HOME": "/tmp", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        argv, user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True, text=True,
        env=env, cwd="/", **kw,  # type: ignore[call-overload]
    )  # fmt: skip


def _python_for_nobody() -> str | None:
    """A Python 3.11+ that user nobody may run (a pyenv under /root is not one) and that
    can import the sampler from this checkout (which nobody must be able to read)."""
    probe = "import sys; assert sys.version_info >= (3, 11); import gpumon.sample.stacks"
    for exe in (sys.executable, "/usr/bin/python3"):
        try:
            r = _as_nobody([exe, "-c", probe], timeout=30)
        except OSError:
            continue
        if r.returncode == 0:
            return exe
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the sampler as another user")
def test_another_users_process_is_refused_in_one_sentence(jobs: list[Job]) -> None:
    """The real refusal: gpumon (as nobody) asks py-spy for a process of root's."""
    python = _python_for_nobody()
    if python is None:
        pytest.skip("no Python that user nobody may run with this checkout importable")
    job = Job("step")
    jobs.append(job)
    exe = find_py_spy()
    assert exe is not None
    reachable = Path(tempfile.mkdtemp(prefix="gpumon-stacks-test-"))  # /tmp: nobody reaches it
    try:
        reachable.chmod(0o755)
        spy = reachable / "py-spy"
        shutil.copy(exe, spy)
        spy.chmod(0o755)
        r = _as_nobody([python, "-c", REFUSED_SCRIPT, str(job.pid), str(spy)], timeout=120)
    finally:
        shutil.rmtree(reachable, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["said"]) == 1  # once
    sentence = out["said"][0]
    assert sentence.startswith(f"cannot read the Python stacks of pid {job.pid}: ")
    assert "another user (uid 0)" in sentence and "run gpumon as root" in sentence
    assert sentence.endswith("Carrying on without them.")
    assert out["off"] is True and out["again"] == 0  # turned itself off


def refusing_py_spy(tmp_path: Path) -> Path:
    """A stand-in binary that answers with py-spy's exact words for a refusal (for
    machines where the test above cannot run as another user)."""
    fake = tmp_path / "py-spy"
    fake.write_text(
        "#!/bin/sh\n"
        'echo "Permission Denied: Try running again with elevated permissions by going '
        '\'sudo env \\"PATH=\\$PATH\\" !!\'" >&2\n'
        "exit 1\n"
    )
    fake.chmod(0o755)
    return fake


def test_the_refusal_is_raised_once_and_turns_the_sampler_off(tmp_path: Path) -> None:
    sampler = StackSampler(str(refusing_py_spy(tmp_path)))
    try:
        sampler.start([Target(os.getpid(), ProcessRole.MAIN)], rate_hz=5, seconds=1)
        deadline = time.monotonic() + 20
        raised = []
        while time.monotonic() < deadline and not raised:
            time.sleep(0.05)
            try:
                sampler.collect()
            except StacksRefusedError as exc:
                raised.append(exc)
        assert len(raised) == 1 and raised[0].pid == os.getpid()
        assert sampler.off
        assert sampler.collect() == []  # said once
    finally:
        sampler.close()


def test_the_engine_says_a_refusal_once_and_reads_no_more(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from gpumon.engine.stacks import StackOptions, StackWatch
    from gpumon.model import Episode, GpuSample, ProcessSample, ProcTreeSample, Snapshot, State

    watch = StackWatch(StackOptions(every_s=1, py_spy=str(refusing_py_spy(tmp_path))), 50.0)
    me = ProcessSample(os.getpid(), os.getppid(), "python", 1.0, 1, None, None, "running")
    tree = ProcTreeSample(0.0, os.getpid(), (me,))
    snap = Snapshot(0.0, (GpuSample(0.0, 0, "GPU-0", util_pct=10.0),))
    waiting = {
        0: Episode(gpu=0, uuid="GPU-0", state=State.STARVED, cause=None, start_s=0.0, end_s=None)
    }
    try:
        with caplog.at_level("WARNING", logger="gpumon"):
            deadline = time.monotonic() + 20
            while watch.refusal is None and time.monotonic() < deadline:
                assert watch.read(snap, [tree], waiting) == ()
                time.sleep(0.05)
            for _ in range(5):
                watch.read(snap, [tree], waiting)
        assert watch.refusal is not None and watch.off
        assert watch.refusal.startswith(f"cannot read the Python stacks of pid {os.getpid()}: ")
        assert [r.getMessage() for r in caplog.records] == [watch.refusal]  # once
        assert watch.sampler.windows == 1  # nothing asked again
    finally:
        watch.close()


# --- end to end: `gpumon watch --stacks` on the fake GPU ------------------------------------


def watch_job(
    fake_nvml, jobs: list[Job], tmp_path: Path, mode: str, pattern: Pattern, *more: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    """A stackjob.py in ``mode`` on a fake GPU of ``pattern``, ``gpumon watch --stacks
    --pid``'d for 24 s; then the job ends.  The output, and the summary."""
    job = Job(mode)
    jobs.append(job)
    gpu = FakeGPU(pattern=pattern, processes=[Process(pid=job.pid)])
    fake_nvml.set(Scenario(gpus=[gpu]))
    out = tmp_path / "summary.json"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "gpumon", "watch", "--pid", str(job.pid), "--stacks",
            "--stacks-every", "2", "--interval", "0.25", "--window", "3",
            "--summary-json", str(out), *more,
        ],
        env=fake_nvml.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    time.sleep(24)
    job.stop()
    stdout, stderr = proc.communicate(timeout=60)
    r = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return r, json.loads(out.read_text())


def test_watch_names_a_pause_spent_in_pickle_dump_a_checkpoint(
    fake_nvml, jobs: list[Job], tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    pattern = Pattern.burst(1.0, 0.35)
    r, summary = watch_job(fake_nvml, jobs, tmp_path, "checkpoint", pattern, "--record", str(trace))
    # Without stacks this GPU is starved; its gaps spent in pickle.dump make it a checkpoint.
    assert "state=sync_stall" in r.stdout and "checkpoint: the main process in" in r.stdout, (
        r.stdout[-3000:]
    )
    assert summary["verdict"] == "sync_stall" and summary["reason"] == "checkpoint"
    stacks = summary["stacks"]
    assert isinstance(stacks, dict)
    main = stacks["main"]
    assert main["activities"]["checkpoint"] >= 0.6
    assert "persist: pickle.dump(state, fh)" in main["top"][0]["where"]
    assert any(a.startswith("checkpoint less often or asynchronously") for a in summary["advice"])
    assert "stacks           during the gaps, main process: writing a checkpoint" in r.stdout
    # record keeps the samples; analyze names them and judges the same.
    text = trace.read_text()
    assert '"event":"stacks"' in text
    a = subprocess.run(
        [sys.executable, "-m", "gpumon", "analyze", str(trace)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert a.returncode == 0, a.stderr
    assert "stacks during the gaps: main process: writing a checkpoint" in a.stdout
    assert "SYNC STALL" in a.stdout


def test_watch_names_the_decode_of_a_starved_gpu(
    fake_nvml, jobs: list[Job], tmp_path: Path
) -> None:
    r, summary = watch_job(fake_nvml, jobs, tmp_path, "loader", Pattern.burst(1.0, 0.3))
    assert summary["verdict"] == "starved", r.stdout[-3000:]
    # The workers decode: the CPU -- or contention where this machine's other load holds
    # the cores (the stacks cannot see processes outside the job).
    assert summary["cause"] in ("cpu", "contention")
    stacks = summary["stacks"]
    assert isinstance(stacks, dict)
    assert max(stacks["main"]["activities"], key=stacks["main"]["activities"].get) == "loader_wait"
    workers = stacks["workers"]
    assert max(workers["activities"], key=workers["activities"].get) == "decode"
    # The place the decoding took most is decode_image.  (Over all activities a worker
    # blocked in Queue.put can top the list: on a busy machine the main process takes the
    # decoded samples late, as a real loader's queue fills.)
    decoding = [s for s in workers["top"] if s["activity"] == "decode"]
    assert decoding and "decode_image" in decoding[0]["where"], workers
    advice = [a for a in summary["advice"] if a.startswith("the workers spend the gaps decoding")]
    assert advice and "decode_image" in advice[0], summary["advice"]
    assert "stacks           during the gaps, main process: waiting on the loader" in r.stdout


# --- serve: [stacks] ---------------------------------------------------------------------------


def test_serve_config_stacks_section() -> None:
    from gpumon.errors import ConfigError
    from gpumon.faces.serve.config import parse
    from gpumon.faces.serve.daemon import stack_options

    assert stack_options(parse("")) is None  # off by default
    on = parse("[stacks]\nenabled = true\nevery_s = 5\n")
    assert (on.stacks_enabled, on.stacks_every_s) == (True, 5.0)
    opts = stack_options(on)
    assert opts is not None and opts.every_s == 5.0
    with pytest.raises(ConfigError, match="every_s"):
        parse("[stacks]\nevery_s = 0\n")


def test_serve_logs_what_an_episodes_gaps_were_spent_on(
    fake_nvml, jobs: list[Job], tmp_path: Path
) -> None:
    from test_serve_daemon import start_daemon

    job = Job("checkpoint")
    jobs.append(job)
    gpu = FakeGPU(pattern=Pattern.burst(1.0, 0.35), processes=[Process(pid=job.pid)])
    fake_nvml.set(Scenario(gpus=[gpu]))
    cfg = tmp_path / "gpumon.toml"
    cfg.write_text("[stacks]\nenabled = true\nevery_s = 2\n[jobs]\nsources = []\n")
    d = start_daemon(fake_nvml.env, tmp_path, "--config", str(cfg))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(1.0)
            if any(r.get("reason") == "checkpoint" for r in d.log_records()):
                break
    finally:
        d.stop()
    records = d.log_records()
    starts = [r for r in records if r.get("event") == "episode_start"]
    ckpt = [r for r in starts if r.get("reason") == "checkpoint" and r.get("scope") == "gpu"]
    assert ckpt, [(r.get("state"), r.get("reason")) for r in starts]
    assert ckpt[0]["state"] == "sync_stall"
    ev = ckpt[0]["evidence"]
    assert isinstance(ev, dict)
    assert ev["main_activity"] == "checkpoint" and ev["main_activity_share"] >= 0.6
    assert "persist: pickle.dump(state, fh)" in ev["main_where"]
    ends = [
        r for r in records if r.get("event") == "episode_end" and r.get("reason") == "checkpoint"
    ]
    for end in ends:  # the GPU's and the node's: what the job did over the episode's gaps
        assert end["evidence"]["main_activity"] == "checkpoint", end
    assert {e["scope"] for e in ends} == {"gpu", "node"}


def test_stacks_without_py_spy_is_refused_before_the_command_starts(
    fake_nvml, tmp_path: Path
) -> None:
    """A Python whose scripts hold no py-spy, and a PATH without one.

    The new venv sees this Python's packages (rich, psutil, ...) through a .pth file that
    names this interpreter's site directories: ``--system-site-packages`` would expose the
    *base* interpreter's, which lack them when the tests run from a venv."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    here = [p for p in site.getsitepackages() if Path(p).is_dir()]
    lib = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    (lib / "site-packages" / "gpumon-test-deps.pth").write_text("\n".join(here) + "\n")
    marker = tmp_path / "started"
    env = {**fake_nvml.env, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "gpumon", "watch", "--stacks", "--", "touch",
         str(marker)],
        env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        "gpumon: --stacks needs py-spy, which is not installed here: "
        "pip install 'gpumon-why[stacks]'."
    )
    assert not marker.exists()
