"""`gpumon watch` end to end: the real CLI in a subprocess, the fake NVML, a real process tree.

The tree is ``tests/helpers/proctree.py`` (a parent with CPU-burning or sleeping workers);
the fake lists one worker's pid as a GPU process, so the Monitor follows that GPU and the
detector sees both the GPU's bursts and the workers' CPU.  Scenarios use a 1 s burst period
and ``--window 3`` so the detector decides within a few seconds.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from fakenvml import FakeGPU, Pattern, Process, Scenario

from gpumon import open_trace

pytestmark = pytest.mark.slow

PROCTREE = Path(__file__).parent / "helpers" / "proctree.py"
ROOT = Path(__file__).resolve().parent.parent
STATE_LINE = re.compile(r"gpu0=(\d+)% state=(\w+) cause=(\S+)")


class Tree:
    """A running proctree.py: parent pid and its workers' pids."""

    def __init__(self, proc: subprocess.Popen[str], workers: list[int]) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.workers = workers


def start_tree(burners: int, sleepers: int, lifetime: float, *extra: float) -> Tree:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(PROCTREE),
            str(burners),
            str(sleepers),
            str(lifetime),
            *map(str, extra),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline().split()  # type: ignore[union-attr]
    assert line and line[0] == "ready", line
    return Tree(proc, [int(x) for x in line[1:]])


@pytest.fixture
def trees() -> Iterator[list[Tree]]:
    started: list[Tree] = []
    yield started
    for t in started:
        if t.proc.poll() is None:
            t.proc.terminate()
            t.proc.wait(5)


def watch(env: dict[str, str], *args: str, timeout: float = 40) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpumon", "watch", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def watch_until(
    env: dict[str, str],
    tree: Tree,
    state: str,
    *args: str,
    after_s: float = 1.5,
    deadline_s: float = 40.0,
) -> subprocess.CompletedProcess:
    """Watch ``tree`` until a plain line reports ``state``, ``after_s`` more, then end the tree.

    The detector decides within a few seconds on an idle machine and later on a loaded one;
    ending the run on what was observed keeps the test short on the first and correct on
    the second.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpumon", "watch", "--pid", str(tree.pid), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    lines: list[str] = []
    deadline = time.monotonic() + deadline_s
    seen_at: float | None = None
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        now = time.monotonic()
        if seen_at is None and f" state={state} " in line:
            seen_at = now
        if (seen_at is not None and now - seen_at >= after_s) or now > deadline:
            break
    tree.proc.terminate()  # the watched process exits: gpumon ends with a summary
    tree.proc.wait(5)
    rest, err = proc.communicate(timeout=20)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines) + rest, err)


def gpu_with(pid: int, pattern: Pattern, **kw: object) -> FakeGPU:
    return FakeGPU(pattern=pattern, processes=[Process(pid=pid)], **kw)  # type: ignore[arg-type]


def recorded_util_samples(trace: Path, gpu: int) -> list[tuple[float, float]]:
    """The driver samples a ``--record`` trace holds for one GPU, in order (read by gpumon's
    own trace reader, as analyze reads it)."""
    return [
        (p[0], p[1])
        for snap in open_trace(trace)
        for g in snap.gpus
        if g.gpu == gpu
        for p in g.util_samples
    ]


def plain_states(stdout: str) -> list[tuple[int, str, str]]:
    return [(int(m[1]), m[2], m[3]) for m in STATE_LINE.finditer(stdout)]


class LiveWatch:
    """``gpumon watch`` running, its plain lines read as they come, so a test acts on
    what the watch has shown (an event), never on seconds: a busy machine starts gpumon
    and its children late.  The deadlines only end a wait for a line that never comes."""

    def __init__(self, env: dict[str, str], *args: str, stdin: int | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpumon", "watch", *args],
            env=env,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self.lines: list[str] = []

    def wait_line(self, pattern: str, deadline_s: float = 300.0) -> re.Match[str]:
        """The first line from now on matching ``pattern`` (read lines are kept)."""
        assert self.proc.stdout is not None
        end = time.monotonic() + deadline_s
        for line in self.proc.stdout:
            self.lines.append(line)
            m = re.search(pattern, line)
            if m:
                return m
            assert time.monotonic() < end, f"no line matched {pattern!r}: {self.lines[-5:]}"
        raise AssertionError(f"the watch ended before a line matched {pattern!r}: {self.lines}")

    def finish(self, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        rest, err = self.proc.communicate(timeout=timeout)
        out = "".join(self.lines) + rest
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


# A plain line once the run's GPU has a reading (before: "waiting for the run ...").
USED_GPU = r" gpu0=\d+% state="


# --- verdicts on a real tree -----------------------------------------------------------


def test_burst_gap_with_busy_workers_is_starved_by_cpu(fake_nvml, trees, tmp_path: Path) -> None:
    tree = start_tree(2, 0, 60)  # two workers burning CPU
    trees.append(tree)
    # A second GPU busy for someone else: never this run's.
    other = FakeGPU(pattern=Pattern.steady(100), processes=[Process(pid=1)])
    fake_nvml.set(Scenario(gpus=[gpu_with(tree.workers[0], Pattern.burst(1.0, 0.3)), other]))
    out = tmp_path / "summary.json"
    trace = tmp_path / "trace.jsonl"
    r = watch_until(
        fake_nvml.env, tree, "starved",
        "--interval", "0.25", "--window", "3", "--summary-json", str(out),
        "--fail-on", "starved,sync_stall", "--record", str(trace),
    )  # fmt: skip
    assert "\x1b" not in r.stdout  # not a terminal: no escape codes at all
    states = plain_states(r.stdout)
    assert len(states) > 10, r.stdout
    # The workers burn the CPU: cause cpu -- or contention, where this machine's other load
    # holds the cores the workers need (a cause is the job's own only if it gets the CPU).
    cause = "contention" if ("starved", "contention") in {(s, c) for _, s, c in states} else "cpu"
    assert ("starved", cause) in {(s, c) for _, s, c in states}, r.stdout
    assert "gpu1" not in r.stdout  # the other user's GPU is not shown
    summary = json.loads(out.read_text())
    assert summary["pid"] == tree.pid
    assert summary["command"][-4:] == [str(PROCTREE), "2", "0", "60"]
    assert summary["verdict"] == "starved" and summary["cause"] in ("cpu", "contention")
    assert set(summary["seconds"]) == {"healthy", "starved", "sync_stall", "idle", "unknown"}
    assert summary["seconds"]["starved"] > 1.5
    assert [g["gpu"] for g in summary["gpus"]] == [0]
    assert summary["gpus"][0]["uuid"] == FakeGPU().default_uuid(0)
    # The duty cycle is the driver samples' own: each covers one period, so it is their mean
    # (the first too), whatever span a loaded machine let the watch judge; a last tick that
    # finds the buffer silent adds the instantaneous reading.  The 30 % pattern holds it in a
    # band over any span of two periods or more.
    samples = [u for _, u in recorded_util_samples(trace, gpu=0)]
    duty = summary["gpus"][0]["duty_cycle"]
    assert duty == pytest.approx(sum(samples) / len(samples) / 100, abs=0.03), (
        summary["gpus"][0],
        trace.read_text(),
    )
    assert 0.2 < summary["gpus"][0]["duty_cycle"] < 0.4
    assert summary["lost_gpu_seconds"] > 1.5
    assert any(
        ("num_workers" if summary["cause"] == "cpu" else "outside the job") in a
        for a in summary["advice"]
    )
    assert summary["ended"] == "exited"
    # --fail-on starved: the run spent well over 25 % starved.
    assert summary["fail_on"]["failed"] is True
    assert r.returncode == 5, r.stderr
    assert f"verdict          starved (cause: {summary['cause']})" in r.stdout
    assert trace.read_text().count("\n") > 10  # --record kept the trace
    # The recording names the window this watch judged on: analyze of it judges on it too.
    with open_trace(trace) as recording:
        assert recording.header.extra["detector"] == {"window_s": 3.0}


def test_steady_work_is_healthy_and_fail_on_passes(fake_nvml, trees, tmp_path: Path) -> None:
    tree = start_tree(0, 1, 60)
    trees.append(tree)
    fake_nvml.set(Scenario(gpus=[gpu_with(tree.workers[0], Pattern.steady(100))]))
    out = tmp_path / "summary.json"
    r = watch_until(
        fake_nvml.env, tree, "healthy",
        "--interval", "0.25", "--window", "3", "--summary-json", str(out),
        "--fail-on", "starved,sync_stall",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    states = plain_states(r.stdout)
    assert states[-1][1] == "healthy", r.stdout
    assert "starved" not in {s for _, s, _ in states}
    summary = json.loads(out.read_text())
    assert summary["verdict"] == "healthy" and summary["cause"] is None
    assert summary["seconds"]["healthy"] > 1.5 and summary["seconds"]["starved"] == 0
    assert summary["gpus"][0]["duty_cycle"] > 0.95
    assert summary["fail_on"] == {
        "states": ["starved", "sync_stall"],
        "threshold": 0.25,
        "share": 0.0,
        "failed": False,
    }


# --- watch -- CMD ---------------------------------------------------------------------------


def test_command_exit_status_is_returned_and_no_gpu_is_said(fake_nvml, tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    r = watch(
        fake_nvml.env,
        "--interval",
        "0.2",
        "--summary-json",
        str(out),
        "--",
        sys.executable,
        "-c",
        "import sys, time; print('training', flush=True); time.sleep(0.8); sys.exit(3)",
    )
    assert r.returncode == 3, r.stderr
    assert "training" in r.stdout
    assert "waiting for the run to use a GPU" in r.stdout
    summary = json.loads(out.read_text())
    assert summary["exit_status"] == 3 and summary["used_gpu"] is False
    assert summary["gpus"] == []
    assert "never used a GPU" in " ".join(summary["notes"])
    assert "never used a GPU" in r.stdout


def test_command_on_a_gpu_is_followed_and_succeeds(fake_nvml, tmp_path: Path) -> None:
    """The test finds the command's pid, lists it on the GPU, and watches it be picked up."""
    fake_nvml.set(Scenario(gpus=[FakeGPU(pattern=Pattern.steady(90))]))
    out = tmp_path / "summary.json"
    gpumon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpumon",
            "watch",
            "--interval",
            "0.2",
            "--summary-json",
            str(out),
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(3)",
        ],
        env=fake_nvml.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    child = _wait_for_child(gpumon.pid)
    fake_nvml.set(Scenario(gpus=[gpu_with(child, Pattern.steady(90))]))
    stdout, stderr = gpumon.communicate(timeout=20)
    assert gpumon.returncode == 0, stderr
    summary = json.loads(out.read_text())
    assert summary["used_gpu"] is True and summary["pid"] == child
    assert summary["command"][-2:] == ["-c", "import time; time.sleep(3)"]
    assert summary["gpus"][0]["duty_cycle"] == pytest.approx(0.9, abs=0.05)
    assert "gpu0=90%" in stdout


def test_sigterm_is_forwarded_and_the_command_status_returned(fake_nvml) -> None:
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('child got TERM', flush=True), "
        "sys.exit(42)))\n"
        "print('child ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    w = LiveWatch(fake_nvml.env, "--interval", "0.2", "--", sys.executable, "-c", script)
    try:
        w.wait_line("child ready")  # its handler is in place: it printed after
        w.proc.send_signal(signal.SIGTERM)
        r = w.finish()
    finally:
        w.kill()
    assert "child got TERM" in r.stdout
    assert r.returncode == 42, r.stderr


def test_sigterm_while_gpumon_starts_reaches_the_command(fake_nvml) -> None:
    """A SIGTERM that arrives once the command exists but before gpumon's session is up
    (the command sends it to gpumon as the first thing it does) is the command's too:
    gpumon neither dies of it nor leaves the command running without it."""
    script = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('child got TERM', flush=True), "
        "sys.exit(42)))\n"
        "os.kill(os.getppid(), signal.SIGTERM)\n"
        "time.sleep(600)\n"
    )
    w = LiveWatch(fake_nvml.env, "--interval", "0.2", "--", sys.executable, "-c", script)
    try:
        r = w.finish()
    finally:
        w.kill()
    assert "child got TERM" in r.stdout
    assert r.returncode == 42, r.stderr


def test_command_that_cannot_start_is_one_sentence(fake_nvml) -> None:
    r = watch(fake_nvml.env, "--", "/nonexistent/train.py")
    assert r.returncode == 127
    assert r.stderr.strip() == "gpumon: cannot run '/nonexistent/train.py': command not found."


# --- bad input and a tree that changes under us -----------------------------------------------


def test_pid_that_does_not_exist(fake_nvml) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    r = watch(fake_nvml.env, "--pid", str(gone.pid))
    assert r.returncode == 4
    assert r.stderr.strip() == f"gpumon: no process with pid {gone.pid} exists."
    assert r.stdout == ""


def test_nothing_to_watch_is_an_error(fake_nvml) -> None:
    r = watch(fake_nvml.env)
    assert r.returncode != 0
    assert "nothing to watch" in r.stderr and "Traceback" not in r.stderr


def test_process_exiting_mid_run_ends_the_watch_cleanly(fake_nvml, trees, tmp_path) -> None:
    # The burning workers and their parent exit together once the watch has seen the GPU
    # used, amid 0.1 s ticks.
    tree = start_tree(2, 0, 600)
    trees.append(tree)
    fake_nvml.set(Scenario(gpus=[gpu_with(tree.workers[1], Pattern.burst(1.0, 0.3))]))
    out = tmp_path / "summary.json"
    w = LiveWatch(
        fake_nvml.env, "--pid", str(tree.pid), "--interval", "0.1", "--summary-json", str(out)
    )
    try:
        w.wait_line(USED_GPU)
        tree.proc.terminate()  # the parent kills its workers and exits
        tree.proc.wait(60)
        r = w.finish()  # the watch ends by itself: nothing else stops it
    finally:
        w.kill()
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    summary = json.loads(out.read_text())
    assert summary["ended"] == "exited" and summary["used_gpu"] is True


# A parent that forks a burning worker when told (a line on stdin), kills it when told
# again, and exits on the third line.
WORKER_ON_CUE = """
import os, signal, sys, time
sys.stdin.readline()
pid = os.fork()
if pid == 0:
    while True:
        pass
print(pid, flush=True)
sys.stdin.readline()
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
print("gone", flush=True)
sys.stdin.readline()
"""


def test_worker_appearing_and_vanishing_is_followed(fake_nvml, tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", WORKER_ON_CUE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdin is not None and parent.stdout is not None
    trace = tmp_path / "trace.jsonl"
    fake_nvml.set(Scenario(gpus=[gpu_with(parent.pid, Pattern.steady(100))]))
    w = LiveWatch(
        fake_nvml.env, "--pid", str(parent.pid), "--interval", "0.1", "--record", str(trace)
    )
    try:
        w.wait_line(r"procs=1\b")
        parent.stdin.write("fork\n")
        parent.stdin.flush()
        worker = int(parent.stdout.readline())
        w.wait_line(r"procs=2\b")
        parent.stdin.write("end the worker\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "gone"
        w.wait_line(r"procs=1\b")
        parent.stdin.write("exit\n")
        parent.stdin.flush()
        parent.wait(60)
        r = w.finish()
    finally:
        w.kill()
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert r.returncode == 0, r.stderr
    counts = [int(m) for m in re.findall(r"procs=(\d+)", r.stdout)]
    # One process, then two while the worker lives, then one again.
    assert counts[0] == 1 and 2 in counts
    first_two, last_two = counts.index(2), len(counts) - 1 - counts[::-1].index(2)
    assert all(c == 2 for c in counts[first_two : last_two + 1])
    assert 1 in counts[last_two + 1 :]
    ticks = [json.loads(x) for x in trace.read_text().splitlines()[1:]]
    seen = [
        any(p["pid"] == worker for p in t.get("tree", {}).get("processes", []))
        for t in ticks
        if "tree" in t
    ]
    assert seen.index(True) > 0 and True in seen and not seen[-1]


def test_gpu_pids_not_visible_here_say_container(fake_nvml, trees, tmp_path: Path) -> None:
    tree = start_tree(0, 1, 2.5)
    trees.append(tree)
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    ghost = pid_max + 12345 if pid_max < 4_000_000 else 4_194_000
    assert not psutil.pid_exists(ghost)
    fake_nvml.set(Scenario(gpus=[gpu_with(ghost, Pattern.steady(100))]))
    out = tmp_path / "summary.json"
    r = watch(
        fake_nvml.env,
        "--pid",
        str(tree.pid),
        "--interval",
        "0.2",
        "--summary-json",
        str(out),
        timeout=20,
    )
    assert r.returncode == 0, r.stderr
    assert "container without the host PID namespace?" in r.stdout
    summary = json.loads(out.read_text())
    assert summary["used_gpu"] is False and summary["invisible_gpu_pids"] == [ghost]


def _wait_for_child(pid: int, timeout: float = 10.0) -> int:
    """The pid of gpumon's first child (the command it started)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = psutil.Process(pid).children()
        if kids:
            return kids[0].pid
        time.sleep(0.02)
    raise AssertionError("gpumon did not start the command")


def test_env_fixture_points_at_the_fake(fake_nvml) -> None:
    """Guard: every subprocess above must load the fake, never a real driver."""
    assert "LD_LIBRARY_PATH" in fake_nvml.env
    assert os.path.exists(
        os.path.join(fake_nvml.env["LD_LIBRARY_PATH"].split(":")[0], "libnvidia-ml.so.1")
    )


def test_no_driver_is_said_before_the_command_starts(fake_nvml, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    r = watch(
        fake_nvml.missing_env(dict(os.environ)),
        "--",
        sys.executable,
        "-c",
        f"open({str(marker)!r}, 'w')",
    )
    assert r.returncode == 3
    assert r.stderr.startswith("gpumon: cannot read GPUs: no NVIDIA driver found")
    assert "Traceback" not in r.stderr
    assert not marker.exists()  # the command was never started


def test_gpu_lost_mid_run_is_shown_and_the_watch_goes_on(fake_nvml, trees, tmp_path) -> None:
    tree = start_tree(0, 1, 600)
    trees.append(tree)
    scn = Scenario(gpus=[gpu_with(tree.workers[0], Pattern.steady(100))])
    fake_nvml.set(scn)
    out = tmp_path / "summary.json"
    w = LiveWatch(
        fake_nvml.env, "--pid", str(tree.pid), "--interval", "0.2", "--summary-json", str(out)
    )
    try:
        w.wait_line(r" gpu0=100% state=")  # a second of readings
        w.wait_line(r" gpu0=100% state=")
        fake_nvml.set(scn.with_gpu(0, lost=True))
        w.wait_line(r"gpu0=lost")
        w.wait_line(r"gpu0=lost")  # and the watch goes on
        tree.proc.terminate()
        tree.proc.wait(60)
        r = w.finish()
    finally:
        w.kill()
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert json.loads(out.read_text())["gpus"][0]["duty_cycle"] > 0.9


def test_a_failure_of_gpumon_never_orphans_the_command(fake_nvml, tmp_path: Path) -> None:
    marker = tmp_path / "finished"
    r = watch(
        fake_nvml.env,
        "--record",
        str(tmp_path / "no" / "such" / "dir.jsonl"),
        "--",
        sys.executable,
        "-c",
        f"import time; time.sleep(1); open({str(marker)!r}, 'w')",
    )
    assert "cannot write" in r.stderr and "Still waiting for the command" in r.stderr
    assert marker.exists()  # gpumon waited for the command to finish
    assert r.returncode == 1


def test_a_closed_output_pipe_keeps_the_command_and_its_status(fake_nvml) -> None:
    """`gpumon watch -- CMD | head -1`: the reader leaves, the command and its status stay."""
    gpumon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpumon",
            "watch",
            "--interval",
            "0.1",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(1.5); raise SystemExit(4)",
        ],
        env=fake_nvml.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert gpumon.stdout is not None and gpumon.stdout.readline()
    gpumon.stdout.close()
    gpumon.wait(15)
    assert gpumon.returncode == 4
    assert b"Traceback" not in gpumon.stderr.read()  # type: ignore[union-attr]


def test_output_pump_keeps_draining_after_a_failed_write(monkeypatch) -> None:
    """Passing output through fails (reader gone): the pump discards but keeps reading,
    so a command writing far more than a pipe holds never blocks."""
    import threading
    import types

    from gpumon.faces.watch.child import OutputPump

    class Broken:
        def write(self, _data: bytes) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            pass

        def writelines(self, _lines: object) -> None:
            pass

    monkeypatch.setattr(sys, "stdout", types.SimpleNamespace(buffer=Broken()))
    r, w = os.pipe()
    with os.fdopen(r, "rb") as reader:
        pump = OutputPump(reader)
        pump.release()
        payload = b"x" * 1023 + b"\n"
        done = threading.Event()

        def write_lots() -> None:
            with os.fdopen(w, "wb") as out:
                for _ in range(512):  # 512 KiB, eight times a pipe's buffer
                    out.write(payload)
            done.set()

        threading.Thread(target=write_lots, daemon=True).start()
        assert done.wait(10), "the command blocked: the pump stopped draining"
        pump.join(5)
        assert pump.broken
