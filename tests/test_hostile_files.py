"""Hostile input, third round: files that are not files.

A FIFO, a device, a symbolic link, a file of gigabytes, where gpumon expects a file it
reads (a configuration, a web configuration, a TLS file, a kept report) or one it writes
(``--summary-json``, ``record -o``, the report store).  gpumon often runs as root: it
must neither hang, nor grow without bound, nor replace what is not its file.  Every case
runs the real CLI, bounded by a timeout (a hang fails), the memory ones under setrlimit.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpumon import files
from gpumon.faces.report.kept import FileStore, Kept
from gpumon.faces.watch.summary import Summary
from gpumon.model import GpuIdentity, ProcessSample, ProcTreeSample, Snapshot, TraceHeader
from gpumon.traces.jsonl import TraceWriter

ROOT = Path(__file__).resolve().parent.parent
MEMORY_LIMIT = 2 << 30  # address space a refused file must leave room in


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def gpumon(
    env: dict[str, str] | None, *args: str, timeout: float = 30
) -> subprocess.CompletedProcess:
    """The CLI, bounded in time and (setrlimit) in memory: a hang or a growth fails."""
    return subprocess.run(
        [sys.executable, "-m", "gpumon", *args],
        env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        preexec_fn=_limited,
    )  # fmt: skip


def refused(done: subprocess.CompletedProcess, what: str) -> None:
    """One sentence, no traceback, naming what the path is."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("gpumon: "), done.stderr
    assert what in lines[0], lines[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


@pytest.fixture
def full_device(tmp_path: Path) -> Path:
    """A character device like /dev/full, made in the test's folder (root only)."""
    path = tmp_path / "full"
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("making a device node needs root")
    return path


# --- reading ----------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--config", "--web.config.file"])
def test_a_fifo_for_a_configuration_is_refused_not_waited_on(fake_nvml, fifo, flag) -> None:
    refused(gpumon(fake_nvml.env, "serve", flag, str(fifo)), "it is a FIFO, not a regular file")


@pytest.mark.parametrize("flag", ["--config", "--web.config.file"])
def test_dev_zero_for_a_configuration_is_refused_before_it_is_read(fake_nvml, flag) -> None:
    """It grew to 1.3 GB in 11 s; under a 2 GiB address space it is refused at once."""
    refused(gpumon(fake_nvml.env, "serve", flag, "/dev/zero"), "it is a device")


def test_a_configuration_larger_than_any_real_one_is_refused_unread(fake_nvml, tmp_path) -> None:
    big = tmp_path / "gpumon.toml"
    big.write_text("# padding\n" * 200_000)
    refused(gpumon(fake_nvml.env, "serve", "--config", str(big)), "more than the 1 MiB")


def test_dev_null_is_still_an_empty_configuration(fake_nvml) -> None:
    """The usual way to say "no configuration file" (the tests' own daemons use it)."""
    assert files.read_bounded("/dev/null", files.CONFIG_LIMIT) == b""


def test_a_kept_report_that_is_a_fifo_or_dev_zero_is_passed_over(tmp_path, fifo) -> None:
    """``JOB.json`` as a FIFO hung ``report``; as a link to /dev/zero it grew to 7.4 GB."""
    store = tmp_path / "store"
    store.mkdir()
    for job, target in (("81423", fifo), ("81424", Path("/dev/zero"))):
        (store / f"{job}.json").symlink_to(target)
        done = gpumon(None, "report", "--job", job, "--store", str(store), timeout=30)
        assert done.returncode == 2, done.stderr  # not kept: Prometheus is needed
        assert "needs --prometheus" in done.stderr and "Traceback" not in done.stderr


def test_the_report_store_reads_a_report_it_wrote_and_escapes_its_text(tmp_path) -> None:
    """A kept report's text (anyone who can write the store can write it) reached the
    terminal raw."""
    store = FileStore(tmp_path / "store")
    text = "job 81423: starved\x1b]0;pwned\x07\x1b[2J\n"
    store.write(Kept("81423", time.time(), "http://prom:9090", text, {"job": "81423"}))
    done = gpumon(None, "report", "--job", "81423", "--store", str(tmp_path / "store"))
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\\x1b]0;pwned\\x07\\x1b[2J" in done.stdout


# --- writing ----------------------------------------------------------------------------------


def _summary_json(env: dict[str, str], path: Path) -> subprocess.CompletedProcess:
    return gpumon(env, "watch", "--plain", "--summary-json", str(path), "--", "true")


def test_summary_json_never_replaces_a_fifo_a_device_or_a_link(
    fake_nvml, tmp_path, fifo, full_device
) -> None:
    """``--summary-json /dev/full`` run as root replaced the machine's /dev/full."""
    precious = tmp_path / "precious"
    precious.write_text("keep me\n")
    link = tmp_path / "link.json"
    link.symlink_to(precious)
    for path, what in ((fifo, "a FIFO"), (full_device, "a device"), (link, "a symbolic link")):
        before = os.lstat(path)
        refused(_summary_json(fake_nvml.env, path), f"it is {what}, not a regular file")
        after = os.lstat(path)
        assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode), path
    assert precious.read_text() == "keep me\n"
    good = tmp_path / "summary.json"
    done = _summary_json(fake_nvml.env, good)
    assert done.returncode == 0, done.stderr
    assert json.loads(good.read_text())["command"] == ["true"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".summary")] == []


def test_a_link_planted_at_the_old_temporary_name_is_not_followed(tmp_path) -> None:
    """The temporary was ``PATH.tmp<PID>``: a link planted there had its target overwritten
    and PATH became a link to it."""
    path = tmp_path / "summary.json"
    target = tmp_path / "target"
    target.write_text("keep me\n")
    (tmp_path / f"summary.json.tmp{os.getpid()}").symlink_to(target)
    summary = Summary.__new__(Summary)
    summary.to_json = lambda: {"verdict": "healthy"}  # type: ignore[method-assign]
    summary.write_json(str(path))
    assert target.read_text() == "keep me\n"
    assert not path.is_symlink() and json.loads(path.read_text()) == {"verdict": "healthy"}


def test_record_into_a_fifo_is_refused_and_stops_on_a_signal(fake_nvml, fifo) -> None:
    """``record -o FIFO --force`` with no reader swallowed SIGTERM and Ctrl-C."""
    refused(gpumon(fake_nvml.env, "record", "-o", str(fifo), "--force"), "it is a FIFO")


def test_two_recorders_on_one_path_the_second_is_refused(fake_nvml, tmp_path) -> None:
    """Both exited 0 and the file was torn (``analyze`` stopped at line 18)."""
    out = tmp_path / "t.jsonl"
    first = subprocess.Popen(
        [sys.executable, "-m", "gpumon", "record", "-o", str(out), "--interval", "0.1"],
        env=fake_nvml.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and out.stat().st_size == 0 if out.exists() else True:
            assert first.poll() is None, first.communicate()
            time.sleep(0.1)
        second = gpumon(fake_nvml.env, "record", "-o", str(out), "--force", "--duration", "1")
        refused(second, "is being written by another process")
        time.sleep(0.5)
    finally:
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=30)
    assert first.returncode == 0, err
    done = gpumon(fake_nvml.env, "analyze", str(out))
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr


# --- what gpumon writes, it reads back ---------------------------------------------------------


def _header(command: tuple[str, ...] | None = None) -> TraceHeader:
    gpu = GpuIdentity(index=0, uuid="GPU-0", name="H100")
    return TraceHeader(version=3, source="gpumon", interval_s=1.0, command=command, gpus=(gpu,))


def test_a_trace_of_a_200kb_command_line_and_8500_processes_reads_back(tmp_path) -> None:
    """The header line of a 200 KB command line was "not JSON" to the trace check, and a
    tick of ~8,500 processes passed the readers' 1 MiB line."""
    path = tmp_path / "t.jsonl"
    procs = tuple(
        ProcessSample(1000 + i, 1, f"worker-{i}", float(i % 97), 4, 1e6, 2e5, "sleeping")
        for i in range(8500)
    )
    with open(path, "w", encoding="utf-8") as fh, TraceWriter(fh, _header(("x" * 200_000,))) as w:
        for k in range(3):
            w.write(Snapshot(float(k), (), None, ProcTreeSample(float(k), 1000, procs)))
    assert max(len(line) for line in path.read_text().splitlines()) <= 1 << 20
    done = gpumon(None, "analyze", "--json", str(path))
    assert done.returncode == 0, done.stderr


def _write_lines(path: Path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _tick(t: float, *gpus: tuple[int, str]) -> dict:
    return {"t": t, "gpus": [{"gpu": g, "uuid": u, "util_pct": 50.0} for g, u in gpus]}


def test_what_cannot_be_one_run_is_said_not_merged_silently(tmp_path) -> None:
    """Two recorders' ticks interleaved, a GPU whose uuid changes, a GPU twice in a tick,
    a second recording after the first: each was read as one run without a word."""
    head = {"format": "gpumon-trace", "version": 3, "header": {"source": "gpumon"}}
    path = tmp_path / "t.jsonl"
    _write_lines(path, [
        head,
        _tick(1.0, (0, "GPU-a")), _tick(2.0, (0, "GPU-a")), _tick(1.5, (0, "GPU-a")),
        _tick(3.0, (0, "GPU-a"), (0, "GPU-a")), _tick(4.0, (0, "GPU-b")),
        head, _tick(1.0, (0, "GPU-a")),
    ])  # fmt: skip
    done = gpumon(None, "analyze", str(path))
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert "1 tick(s) earlier than the tick before them" in err
    assert "1 tick(s) listing a GPU twice" in err
    assert "GPU 0 is GPU-b, GPU-a before" in err
    assert ":7: another recording's header" in err


@pytest.mark.parametrize(
    "when", [["--last", "800000d"], ["--since", "-99999999999"], ["--until", "253402300800"]]
)
def test_report_times_outside_1970_to_9999_are_refused_not_a_traceback(when) -> None:
    """They ended in "year -164 is out of range" (a traceback), before any query."""
    done = gpumon(None, "report", "--prometheus", "http://127.0.0.1:9", "--job", "81423",
                  "--fresh", *when)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "1970" in done.stderr
