"""The command line's edges: exit statuses (each row of docs/cli.md run as the CLI runs it),
output files that exist or are named .gz, and the sentences a new user reads first.

Every case is the real CLI in a subprocess, against the fake NVML where a GPU is read.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from fakenvml import FakeGPU, Pattern, Process, Scenario
from test_nvml_sampler import run_gpumon

ROOT = Path(__file__).resolve().parent.parent
CLI_DOC = ROOT / "docs" / "cli.md"


def gpumon(env: dict[str, str] | None, *args: str, timeout: float = 30) -> CompletedProcess[str]:
    """``python -m gpumon ARGS`` in ``env`` (None: this process's)."""
    return run_gpumon(*args, env=env, timeout=timeout)  # type: ignore[arg-type]


def one_sentence(stderr: str) -> str:
    """The error gpumon printed: exactly one line, prefixed, no traceback."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpumon: "), stderr
    return lines[0]


def a_gone_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


# --- the sentences a new user reads ---------------------------------------------------------


@pytest.mark.slow
def test_help_and_the_no_driver_sentence_call_the_demo_trace_generated(fake_nvml) -> None:
    top = gpumon(None, "--help").stdout
    demo_line = " ".join(top.split("demo", 1)[1].split()[:30])
    assert "generated" in demo_line and "recorded run" not in demo_line
    demo = " ".join(gpumon(None, "demo", "--help").stdout.split())
    assert "synthetic" in demo and "generated" in demo and "a recorded" not in demo
    r = gpumon(fake_nvml.missing_env(), "record", "-o", os.devnull, "--duration", "1")
    assert r.returncode == 3
    said = one_sentence(r.stderr)
    assert "gpumon demo" in said and "synthetic trace" in said and "recorded" not in said


@pytest.mark.slow
def test_a_gpu_lost_warning_is_a_gpumon_line(fake_nvml, tmp_path: Path) -> None:
    fake_nvml.set(Scenario(gpus=[FakeGPU(), FakeGPU(lost=True)]))
    r = gpumon(
        fake_nvml.env,
        "record",
        "-o",
        str(tmp_path / "t.jsonl"),
        "--duration",
        "0.5",
        "--interval",
        "0.1",
    )
    assert r.returncode == 0, r.stderr
    lost = [ln for ln in r.stderr.splitlines() if "GPU 1" in ln]
    assert lost, r.stderr  # the loss is said ...
    assert all(ln.startswith("gpumon: ") for ln in r.stderr.splitlines()), r.stderr  # ... as ours


def test_readme_dstat_line_gives_dool_its_flag() -> None:
    readme = (ROOT / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if "gpumon dstat install" in ln and "dool" in ln)
    assert "--dool" in line  # `gpumon dstat install` alone installs the dstat plugin only


# --- exit statuses: every row of docs/cli.md is what the CLI returns ---------------------------


def _doc_statuses() -> list[str]:
    """The status column of the exit-status table in docs/cli.md."""
    rows = re.findall(r"^\| *`?([0-9+N /]+?)`? *\|", CLI_DOC.read_text(), flags=re.M)
    return [r.strip() for r in rows if r.strip()[0].isdigit()]


def _case_success(fake, tmp: Path) -> list[int]:
    return [gpumon(fake.env, "watch", "--", sys.executable, "-c", "pass").returncode]


def _case_failed(fake, tmp: Path) -> list[int]:
    out = tmp / "no-such-dir" / "t.jsonl"
    return [gpumon(fake.env, "record", "-o", str(out), "--duration", "0.2").returncode]


def _case_usage(fake, tmp: Path) -> list[int]:
    existing = tmp / "exists.jsonl"
    existing.write_text("x\n")
    junk = tmp / "junk.txt"
    junk.write_text("hello world\n")
    return [
        gpumon(fake.env, "watch").returncode,  # nothing to watch
        gpumon(fake.env, "--no-such-option").returncode,
        gpumon(fake.env).returncode,  # no command at all
        gpumon(fake.env, "record", "-o", str(existing), "--duration", "0.2").returncode,
        gpumon(fake.env, "analyze", str(junk)).returncode,  # no format gpumon reads
    ]


def _case_no_driver(fake, tmp: Path) -> list[int]:
    out = tmp / "t.jsonl"
    return [gpumon(fake.missing_env(), "record", "-o", str(out), "--duration", "0.2").returncode]


def _case_no_pid(fake, tmp: Path) -> list[int]:
    out = str(tmp / "r.jsonl")
    return [
        gpumon(fake.env, "watch", "--pid", "0").returncode,
        gpumon(fake.env, "watch", "--pid", "-5").returncode,
        gpumon(fake.env, "watch", "--pid", str(a_gone_pid())).returncode,
        gpumon(fake.env, "record", "-o", out, "--pid", str(a_gone_pid())).returncode,
    ]


def _case_fail_on(fake, tmp: Path) -> list[int]:
    """An idle GPU held by the watched process, and --fail-on idle at any share: the
    process ends once the watch has shown it idle (however long gpumon took to start)."""
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        fake.set(Scenario(gpus=[FakeGPU(pattern=Pattern.off(), processes=[Process(sleeper.pid)])]))
        args = ("--interval", "0.2", "--fail-on", "idle", "--fail-threshold", "0")
        watch = subprocess.Popen(
            [sys.executable, "-m", "gpumon", "watch", "--pid", str(sleeper.pid), *args],
            env=fake.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert watch.stdout is not None
        guard = threading.Timer(120, sleeper.kill)  # a watch that never says idle ends too
        guard.daemon = True
        guard.start()
        seen = next((line for line in watch.stdout if "state=idle" in line), None)
        assert seen, "the watch never showed the GPU idle"
        sleeper.communicate(timeout=30)  # stdin closed: the watched process exits
        watch.communicate(timeout=60)
        guard.cancel()
        return [watch.returncode]
    finally:
        sleeper.kill()
        sleeper.wait(10)


def _case_command_cannot_run(fake, tmp: Path) -> list[int]:
    return [
        gpumon(fake.env, "watch", "--", str(CLI_DOC)).returncode,  # a file, not executable
        gpumon(fake.env, "watch", "--", "/nonexistent/train.py").returncode,
    ]


def _case_command_killed(fake, tmp: Path) -> list[int]:
    kill_self = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    return [gpumon(fake.env, "watch", "--", sys.executable, "-c", kill_self).returncode]


def _case_interrupted(fake, tmp: Path) -> list[int]:
    """Ctrl-C while gpumon waits on a file (a FIFO nobody writes: a slow network mount)."""
    fifo = tmp / "never-written"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpumon", "analyze", str(fifo)],
        env=fake.env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_until_it_opens(proc.pid, fifo)  # not while Python still imports: no test
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)  # a bound on a hang: Ctrl-C is what is tested
    finally:
        if proc.poll() is None:  # a failed wait must not leave it blocked on the FIFO
            proc.kill()
            proc.communicate()
    return [proc.returncode]


def _wait_until_it_opens(pid: int, path: Path, timeout_s: float = 60.0) -> None:
    """Until process ``pid`` is blocked opening the FIFO ``path`` (the kernel waits for a
    writer in ``wait_for_partner``): past Python's start-up and gpumon's imports."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/wchan").read_text().strip() == "wait_for_partner":
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never blocked opening {path}")


# Each status the docs/cli.md table names -> (the cases that must return it, what they return).
CASES: dict[str, tuple[Callable[..., list[int]], list[int]]] = {
    "0": (_case_success, [0]),
    "1": (_case_failed, [1]),
    "2": (_case_usage, [2] * 5),
    "3": (_case_no_driver, [3]),
    "4": (_case_no_pid, [4] * 4),
    "5": (_case_fail_on, [5]),
    "126 / 127": (_case_command_cannot_run, [126, 127]),
    "128+N": (_case_command_killed, [128 + signal.SIGTERM]),
    "130": (_case_interrupted, [130]),
}


def test_the_exit_status_table_lists_every_case_tested() -> None:
    assert sorted(_doc_statuses()) == sorted(CASES)


@pytest.mark.slow
@pytest.mark.parametrize("status", sorted(CASES))
def test_each_exit_status_in_the_table_is_what_the_cli_returns(
    status: str, fake_nvml, tmp_path: Path
) -> None:
    cases, want = CASES[status]
    assert cases(fake_nvml, tmp_path) == want


# --- standard output that cannot be written ---------------------------------------------------

# Each command that prints, as a user would run it; each must say so once and exit 1 when its
# standard output is closed (`>&-`) or on a full device (`>/dev/full`).  A report needs a
# Prometheus cluster before it prints: its --help stands for it (one stdout serves all).
_DEMO_TRACE = ROOT / "gpumon" / "data" / "demo-synthetic.jsonl.gz"
_SLEEP_1 = "import time; time.sleep(1)"
_PRINTING: dict[str, tuple[str, ...]] = {
    "analyze": ("analyze", str(_DEMO_TRACE)),
    "analyze --json": ("analyze", "--json", str(_DEMO_TRACE)),
    "watch -- CMD": ("watch", "--interval", "0.1", "--", sys.executable, "-c", _SLEEP_1),
    "demo": ("demo", "--no-serve", "--plain", "--speed", "100000"),
    "deploy --list": ("deploy", "--list"),
    "--help": ("--help",),
    "--version": ("--version",),
    "record --help": ("record", "--help"),
    "report --help": ("report", "--help"),
    "serve --help": ("serve", "--help"),
}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["closed", "full"])
@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_stdout_that_cannot_be_written_is_one_sentence_and_status_1(
    how: str, buffered: bool, fake_nvml
) -> None:
    if how == "full" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    env = dict(fake_nvml.env)
    env.pop("PYTHONUNBUFFERED", None)
    if not buffered:  # each write fails at once, rather than the flush at the end
        env["PYTHONUNBUFFERED"] = "1"
    failed = []
    for name, args in _PRINTING.items():
        cmd = [sys.executable, "-m", "gpumon", *args]
        if how == "closed":  # fd 1 closed, as the shell's >&- leaves it
            cmd = ["sh", "-c", 'exec "$@" >&-', "sh", *cmd]
            res = subprocess.run(cmd, env=env, stderr=subprocess.PIPE, text=True, timeout=60)
        else:
            with open("/dev/full", "w") as full:
                res = subprocess.run(
                    cmd, env=env, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60
                )
        lines = res.stderr.strip().splitlines()
        said = [ln for ln in lines if "standard output" in ln]
        if res.returncode != 1 or len(said) != 1 or "Traceback" in res.stderr:
            failed.append(f"{name}: status {res.returncode}, stderr {res.stderr[-600:]!r}")
            continue
        assert said[0].startswith("gpumon: cannot write to standard output: ")
        assert ("closed" if how == "closed" else "No space left") in said[0]
    assert not failed, "\n".join(failed)


def test_ci_runs_the_readmes_test_command() -> None:
    """The README's first block makes a venv and runs the test suite in it; .ci/run must
    run the same (after installing the system tools), or CI and a user's checkout disagree."""
    root = Path(__file__).resolve().parent.parent
    first_block = (root / "README.md").read_text().split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [ln.split("#", 1)[0].strip() for ln in first_block.splitlines()]
    venv = next(ln for ln in lines if " -m venv " in ln)
    suite = next(ln for ln in lines if "pytest" in ln)
    ci = (root / ".ci" / "run").read_text()
    for step in venv.split(" && "):
        assert step in ci, step
    install, _, checks = suite.partition(" && ")
    assert install in ci and checks in ci
    assert ci.index(venv.split(" && ")[-1]) < ci.index(install)  # installed into the venv
    assert "mypy" in checks and "pytest" in checks
