"""The daemon's JSON-lines log under faults: short writes, a full disk, a log moved away.

Faults are real where the kernel can make them without privileges a developer lacks: a
file-size limit (RLIMIT_FSIZE) makes the kernel cut a write short exactly as a filling
disk does; a small tmpfs is a really full filesystem (root only: skipped elsewhere).  The
one injected fault replaces the ``os.write`` the writer calls, nothing above it.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpumon.faces.serve.log as log_module
from gpumon.faces.serve.log import FILE_MODE, EventLog


def whole_lines(path: Path) -> list[dict[str, object]]:
    """Every line of the file parsed; fails on a fragment or two lines glued together."""
    raw = path.read_bytes()
    assert not raw or raw.endswith(b"\n"), raw[-200:]
    return [json.loads(line) for line in raw.splitlines()]


def test_a_short_write_is_truncated_away_and_counted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills in the middle of a line: half of it lands, then ENOSPC."""
    err = io.StringIO()
    path = tmp_path / "g.jsonl"
    log = EventLog(str(path), stderr=err)
    assert log.write({"event": "before"})
    full = {"on": False}

    def filling_disk(fd: int, data: bytes) -> int:
        if not full["on"]:
            return os.write(fd, data)
        if len(data) > 8:
            return os.write(fd, bytes(data[: len(data) // 2]))  # what fits
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(log_module, "_write", filling_disk)
    full["on"] = True
    assert not log.write({"event": "episode_start", "pad": "x" * 100})
    assert not log.write({"event": "episode_end", "pad": "y" * 100})
    assert log.errors_total == 2
    assert [r["event"] for r in whole_lines(path)] == ["before"]
    full["on"] = False
    assert log.write({"event": "after"})
    assert [r["event"] for r in whole_lines(path)] == ["before", "after"]
    text = err.getvalue()
    assert text.count("cannot write the log") == 1, text
    assert "works again (2 lines lost)" in text
    log.close()


def test_a_write_retried_after_a_signal_completes_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short write that is not a fault (a signal arrived) is finished, not dropped."""
    path = tmp_path / "g.jsonl"
    log = EventLog(str(path))

    def interrupted(fd: int, data: bytes) -> int:
        return os.write(fd, bytes(data[:5]))  # five bytes per call

    monkeypatch.setattr(log_module, "_write", interrupted)
    assert log.write({"event": "slow", "n": 1})
    assert whole_lines(path) == [{"event": "slow", "n": 1}]
    assert log.errors_total == 0


_FSIZE_CHILD = r"""
import json, resource, signal, sys
from gpumon.faces.serve.log import EventLog
path, limit = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
log = EventLog(path)
ok = [log.write({"event": "line", "i": i, "pad": "z" * 37}) for i in range(40)]
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space freed
ok.append(log.write({"event": "after"}))
print(json.dumps({"ok": ok, "lost": log.errors_total}))
"""


def test_the_kernel_cutting_a_write_short_leaves_whole_lines(tmp_path: Path) -> None:
    """RLIMIT_FSIZE: the kernel writes up to the limit and returns a short count."""
    path = tmp_path / "g.jsonl"
    limit = 1000  # not a multiple of the line length: one line is cut by the kernel
    res = subprocess.run(
        [sys.executable, "-c", _FSIZE_CHILD, str(path), str(limit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    lines = whole_lines(path)
    written = sum(out["ok"][:-1])
    assert 0 < written < 40 and len(lines) == written + 1
    assert out["lost"] == 40 - written
    assert [r["i"] for r in lines[:-1]] == list(range(written))
    assert lines[-1] == {"event": "after"} and out["ok"][-1]
    assert res.stderr.count("cannot write the log") == 1, res.stderr
    assert f"works again ({40 - written} lines lost)" in res.stderr


def test_a_removed_log_is_reopened_at_its_path(tmp_path: Path) -> None:
    err = io.StringIO()
    path = tmp_path / "g.jsonl"
    log = EventLog(str(path), stderr=err)
    assert log.write({"event": "a"})
    path.unlink()
    assert log.write({"event": "b"})  # not into the deleted file
    assert whole_lines(path) == [{"event": "b"}]
    assert log.reopens["removed"] == 1 and log.errors_total == 0
    assert "was removed" in err.getvalue()
    log.close()


def test_a_replaced_log_is_reopened_and_the_new_file_kept(tmp_path: Path) -> None:
    path = tmp_path / "g.jsonl"
    log = EventLog(str(path), stderr=io.StringIO())
    assert log.write({"event": "a"})
    other = tmp_path / "other"
    other.write_text('{"event":"from-elsewhere"}\n')
    os.replace(other, path)  # e.g. a copy put in place by a careless rotation script
    assert log.write({"event": "b"})
    assert [r["event"] for r in whole_lines(path)] == ["from-elsewhere", "b"]
    assert log.reopens["replaced"] == 1
    log.close()


def test_a_new_log_is_created_0640_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = tmp_path / "g.jsonl"
        log = EventLog(str(path))
        assert log.write({"event": "a"})
        path.unlink()
        assert log.write({"event": "b"})  # the reopened file too
        assert (path.stat().st_mode & 0o777) == FILE_MODE == 0o640
        log.close()
    finally:
        os.umask(old)


def test_sighup_reopen_is_counted_by_reason(tmp_path: Path) -> None:
    path = tmp_path / "g.jsonl"
    log = EventLog(str(path))
    assert log.write({"event": "a"})
    path.rename(tmp_path / "g.jsonl.1")
    log.request_reopen()
    assert log.write({"event": "b"})
    assert log.reopens == {"signal": 1, "removed": 0, "replaced": 0}
    assert whole_lines(path) == [{"event": "b"}]
    log.close()


# --------------------------------------------------------------------------- a real full disk
@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs: a filesystem that really fills (needs root and mount(8))."""
    mount = shutil.which("mount")
    if mount is None or os.geteuid() != 0:
        pytest.skip("a tmpfs mount needs root and mount(8)")
    where = tmp_path / "small"
    where.mkdir()
    res = subprocess.run(
        [mount, "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {res.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(fs: Path, leave: int) -> Path:
    """Fill ``fs`` up to ``leave`` bytes free (a filler file); returns the filler."""
    filler = fs / "filler"
    st = os.statvfs(fs)
    free = st.f_bavail * st.f_frsize
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


@pytest.mark.slow
def test_the_daemon_on_a_disk_that_fills_keeps_json_lines(
    fake_nvml, tmp_path: Path, small_tmpfs: Path
) -> None:
    from fakenvml import Scenario
    from test_serve_daemon import start_daemon

    fake_nvml.set(Scenario.uniform(8))  # 8 GPUs: summary lines of ~2.5 kB
    cfg = tmp_path / "gpumon.toml"
    cfg.write_text("[log]\nsummary_interval_s = 1\n")
    log = small_tmpfs / "gpumon.jsonl"
    filler = fill(small_tmpfs, leave=6000)
    d = start_daemon(fake_nvml.env, tmp_path, "--config", str(cfg), "--log", str(log), log=False)
    try:
        d.wait_for(lambda m: m.get("gpumon_log_write_errors_total", 0) >= 2, 20, "lines lost")
        full_lines = whole_lines(log)  # whatever fitted, whole
        filler.unlink()  # space freed: the next summary line goes in
        d.wait_for(
            lambda m: len(whole_lines(log)) > len(full_lines) + 1, 20, "writing again after space"
        )
        lost = d.metrics()["gpumon_log_write_errors_total"]
    finally:
        assert d.stop() == 0, d.stderr_text
    records = whole_lines(log)
    assert records[0]["event"] == "start" and records[-1]["event"] == "stop"
    # Said once per failing streak (a shorter line may fit where a longer one did not),
    # never once per line, and each recovery says how many lines were lost.
    failed = d.stderr_text.count("cannot write the log")
    recovered = [int(n) for n in re.findall(r"works again \((\d+) lines? lost\)", d.stderr_text)]
    assert 1 <= failed == len(recovered) <= lost, d.stderr_text
    assert sum(recovered) == lost
    assert "Traceback" not in d.stderr_text


# --------------------------------------------------------------------------- what is opened
def _planted(tmp_path: Path, kind: str) -> tuple[Path, Path | None]:
    """The log path with something other than a log of its own in its place; and the file
    a link there would lead to (a 0600 file elsewhere), which must stay untouched."""
    path = tmp_path / "logs" / "gpumon.jsonl"
    path.parent.mkdir()
    victim = tmp_path / "secret"
    victim.write_text("root's own\n")
    victim.chmod(0o600)
    if kind == "symlink":
        path.symlink_to(victim)
    elif kind == "dangling symlink":  # O_CREAT would create the link's target elsewhere
        victim.unlink()
        path.symlink_to(victim)
    elif kind == "hard link":
        os.link(victim, path)
    elif kind == "fifo":  # opening it for writing would wait for a reader forever
        os.mkfifo(path)
        victim.unlink()
        return path, None
    return path, victim


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "hard link", "fifo"])
def test_a_log_path_that_is_not_a_file_of_its_own_is_not_written(tmp_path: Path, kind: str) -> None:
    path, victim = _planted(tmp_path, kind)
    before = victim.read_bytes() if victim is not None and victim.exists() else None
    err = io.StringIO()
    log = EventLog(str(path), stderr=err)  # a FIFO must not block here
    assert not log.write({"event": "start"}) and not log.write({"event": "tick"})
    assert log.errors_total == 2 and log.lines_total == 0
    log.reopen("signal")  # SIGHUP: the same checks again
    assert not log.write({"event": "after-hup"})
    if victim is not None:
        after = victim.read_bytes() if victim.exists() else None
        assert after == before, after  # not appended to, not created
    said = err.getvalue()
    assert said.count("cannot write the log") == 1, said
    assert "not" in said and "regular file of its own" in said, said
    log.close()


def test_a_link_swapped_in_mid_run_is_not_followed(tmp_path: Path) -> None:
    path = tmp_path / "gpumon.jsonl"
    victim = tmp_path / "secret"
    victim.write_text("root's own\n")
    victim.chmod(0o600)
    err = io.StringIO()
    log = EventLog(str(path), stderr=err)
    assert log.write({"event": "a"})
    moved = tmp_path / "gpumon.jsonl.1"
    os.rename(path, moved)  # rotated away, and a link planted before the next line
    path.symlink_to(victim)
    assert not log.write({"event": "b"})
    log.reopen("signal")  # logrotate's postrotate
    assert not log.write({"event": "c"})
    assert victim.read_text() == "root's own\n"
    assert [r["event"] for r in whole_lines(moved)] == ["a"]
    assert log.reopens["replaced"] == 1 and log.errors_total == 2
    path.unlink()  # the link removed: the log is written again, at its path
    assert log.write({"event": "d"})
    assert whole_lines(path) == [{"event": "d"}]
    assert "symbolic link" in err.getvalue() and "works again (2 lines lost)" in err.getvalue()
    log.close()
