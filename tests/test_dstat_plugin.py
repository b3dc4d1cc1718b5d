"""`dstat --gpu` and `dool --gpu` for real: Debian's dstat 0.7.4 under /usr/bin/python3 and
dool from PyPI, with the plugin installed by `gpumon dstat install` and the fake NVML library.

Every run starts at once in a module fixture (each must run long enough for its verdict),
so the whole module takes about as long as its longest run.
"""

from __future__ import annotations

import csv
import fcntl
import os
import pty
import re
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from fakenvml import FakeGPU, Pattern, Process, Scenario, fake_env, missing_library_env
from fakenvml import write_scenario as write

if TYPE_CHECKING:
    from conftest import SystemDstat

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
# Ticks for the runs that must reach a verdict: the detector judges the driver's backlog on
# the second tick; the rest is margin for a loaded machine.
VERDICT_TICKS = 8
BUSY = [Process(pid=4242)]  # a process holds each GPU: the detector's "in use"
# How long a run may take before it is killed: a deadline for a hung dstat, not a measure.
RESULT_DEADLINE_S = 180.0


def _dool() -> str | None:
    beside = Path(sys.executable).with_name("dool")
    if beside.exists():
        return str(beside)
    return shutil.which("dool")


def _clean_env(env: dict[str, str]) -> dict[str, str]:
    """No PYTHONPATH: the plugin must find gpumon through what the installer wrote."""
    env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["TERM"] = "dumb"
    return env


@dataclass
class Run:
    """One dstat/dool process started by the fixture; ``result()`` waits for it."""

    argv: list[str]
    proc: subprocess.Popen[str]
    csv_path: Path | None = None
    _out: tuple[str, str] | None = None

    def result(self, timeout: float = RESULT_DEADLINE_S) -> tuple[int, str, str]:
        if self._out is None:
            try:
                self._out = self.proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self._out = self.proc.communicate()
        return self.proc.returncode, self._out[0], self._out[1]


class LosingRun(Run):
    """A run without a tick count whose rows are read as they come: GPU 1 falls off the
    bus once the first row is out (whenever a busy machine let dstat print it), and the
    run is stopped (Ctrl-C, as a person stops dstat) once ``AFTER_LOSS`` rows followed."""

    AFTER_LOSS = 3

    def __init__(
        self, argv: list[str], env: dict[str, str], cwd: Path, lose: Callable[[], None]
    ) -> None:
        super().__init__(argv, _start(argv, env, cwd).proc)
        self._lines: list[str] = []
        self._lose = lose
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        data = lost_at = 0
        for line in self.proc.stdout:
            self._lines.append(line)
            plain = re.sub(r"\x1b\[[0-9;]*[a-zA-Z]", "", line)
            if not plain.strip() or "util" in plain or "gpu0" in plain:
                continue  # the header lines (and dool's terminal settings)
            data += 1
            if data == 1:
                self._lose()
                lost_at = 1
            elif lost_at and data - lost_at >= self.AFTER_LOSS and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
                lost_at = 0

    def result(self, timeout: float = RESULT_DEADLINE_S) -> tuple[int, str, str]:
        if self._out is None:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(10)
            assert self.proc.stderr is not None
            if self._lines and not self._lines[-1].endswith("\n"):
                self._lines.pop()  # a row Ctrl-C cut short
            # dool erases the terminal's "^C" after the row it ends on (backspaces, blanks)
            self._lines = [re.sub(r"\x08+ *", "", ln) for ln in self._lines]
            self._out = ("".join(self._lines), self.proc.stderr.read())
        return self.proc.returncode, self._out[0], self._out[1]


def _start(argv: list[str], env: dict[str, str], cwd: Path, **kw: Path) -> Run:
    proc = subprocess.Popen(
        argv,
        env=_clean_env(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    return Run(argv, proc, **kw)


class TtyRun(Run):
    """A run on a pseudo-terminal (80x40): dstat then colours and updates the line each second."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        tty_env = {**_clean_env(env), "TERM": "xterm"}
        proc = subprocess.Popen(
            argv,
            env=tty_env,
            cwd=cwd,
            stdin=slave,
            stdout=slave,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(slave)
        super().__init__(argv, proc)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, args=(master,), daemon=True)
        self._reader.start()

    def _read(self, fd: int) -> None:
        try:
            while chunk := os.read(fd, 65536):
                self._chunks.append(chunk)
        except OSError:  # EIO: the child closed the terminal
            pass
        finally:
            os.close(fd)

    def result(self, timeout: float = RESULT_DEADLINE_S) -> tuple[int, str, str]:
        if self._out is None:
            try:
                err = self.proc.communicate(timeout=timeout)[1]
            except subprocess.TimeoutExpired:
                self.proc.kill()
                err = self.proc.communicate()[1]
            self._reader.join(10)
            self._out = (b"".join(self._chunks).decode("utf-8", "replace"), err)
        return self.proc.returncode, self._out[0], self._out[1]


def _install(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpumon", "dstat", "install", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class Runs(dict[str, Run]):
    """The fixture's runs; a test asking for one it could not start skips, saying why."""

    def __init__(self) -> None:
        super().__init__()
        self.why_not: dict[str, str] = {}

    def __missing__(self, name: str) -> Run:
        pytest.skip(self.why_not.get(name, f"run {name!r} was not started"))


DSTAT_RUNS = ("steady", "burst", "csv", "lost", "nodriver", "nogpu", "bare", "tty")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, system_dstat: SystemDstat) -> Iterator[Runs]:
    root = tmp_path_factory.mktemp("dstat")
    # dstat and dool look in ~/.dstat/ and ~/.dool/ first: every run and install gets an
    # empty HOME, so a plugin an earlier `gpumon dstat install` left in the real one is
    # never the one that runs, and none is left there.
    home = root / "home"
    home.mkdir()
    henv = {**os.environ, "HOME": str(home)}

    def scenario(name: str, scn: Scenario) -> dict[str, str]:
        return fake_env(write(root / f"{name}.txt", scn), henv)

    steady = Scenario(gpus=[FakeGPU(pattern=Pattern.steady(97), processes=BUSY)])
    burst = Scenario(gpus=[FakeGPU(pattern=Pattern.burst(1.0, 0.3), processes=BUSY)])
    two = Scenario.uniform(2, Pattern.steady(90), processes=BUSY)
    mixed = Scenario(
        gpus=[
            FakeGPU(pattern=Pattern.steady(97), processes=BUSY),
            FakeGPU(pattern=Pattern.burst(1.0, 0.3), processes=BUSY),
        ]
    )
    n = str(VERDICT_TICKS)
    out = Runs()

    def losing(env: dict[str, str]) -> Callable[[], None]:
        return lambda: write(env["FAKE_NVML_SCENARIO"], two.with_gpu(1, lost=True))

    if system_dstat.unusable is None:
        # dstat through a symlink, so it finds <root>/bin/plugins/ (installed by --dir).
        bindir = root / "bin"
        (bindir / "plugins").mkdir(parents=True)
        (bindir / "dstat").symlink_to(system_dstat.path)
        installed = _install(["--dir", str(bindir / "plugins")], henv)
        assert installed.returncode == 0, installed.stderr
        dstat = [str(bindir / "dstat")]
        # A plugin folder holding the bare plugin file, never wired to gpumon.
        barebin = root / "bare"
        (barebin / "plugins").mkdir(parents=True)
        (barebin / "dstat").symlink_to(system_dstat.path)
        shutil.copy(REPO / "dstat_plugins" / "dstat_gpu.py", barebin / "plugins")

        out["steady"] = _start([*dstat, "--gpu", "1", n], scenario("steady", steady), root)
        out["burst"] = _start([*dstat, "--gpu", "1", n], scenario("burst", burst), root)
        csv_path = root / "dstat.csv"
        out["csv"] = _start(
            [*dstat, "-c", "--gpu", "--output", str(csv_path), "1", "3"],
            scenario("csv", two),
            root,
            csv_path=csv_path,
        )
        lost = scenario("lost", two)
        out["lost"] = LosingRun([*dstat, "-f", "--gpu", "1"], lost, root, losing(lost))
        nodriver = missing_library_env(henv)
        out["nodriver"] = _start([*dstat, "--gpu", "1", "1"], nodriver, root)
        nogpu = scenario("nogpu", Scenario(gpus=[]))
        out["nogpu"] = _start([*dstat, "--gpu", "1", "1"], nogpu, root)
        out["bare"] = _start(
            [str(barebin / "dstat"), "--gpu", "1", "1"], scenario("bare", steady), root
        )
        # On a terminal: colours, and extract() every second with only every 2nd line final.
        tty_env = scenario("tty", two.with_gpu(1, lost=True))
        out["tty"] = TtyRun([*dstat, "-c", "-f", "--gpu", "2", "3"], tty_env, root)
    else:
        out.why_not.update(dict.fromkeys(DSTAT_RUNS, system_dstat.unusable))

    dool = _dool()
    if dool is not None:
        installed = _install(["--dool"], henv)
        assert installed.returncode == 0, installed.stderr
        assert (home / ".dool" / "dool_gpu.py").exists()
        d = [dool, "--nocolor"]
        out["dool_mixed"] = _start([*d, "-f", "--gpu", "1", n], scenario("dool_mixed", mixed), root)
        dcsv = root / "dool.csv"
        out["dool_csv"] = _start(
            [*d, "-c", "-f", "--gpu", "--output", str(dcsv), "1", "3"],
            scenario("dool_csv", two),
            root,
            csv_path=dcsv,
        )
        lost = scenario("dool_lost", two)
        out["dool_lost"] = LosingRun([*d, "-f", "--gpu", "1"], lost, root, losing(lost))
        out["dool_nodriver"] = _start([*d, "--gpu", "1", "1"], missing_library_env(henv), root)

    yield out
    for run in out.values():
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.communicate()


MISSED = re.compile(r"\s*missed (\d+) ticks\s*$")


def rows(stdout: str) -> list[str]:
    """The data rows of dstat's output: everything after the two header lines.

    On a loaded machine dstat skips a tick it is over a second late for and appends
    "missed N ticks" to the next row it prints (N: that row's tick and those skipped).
    """
    lines = [MISSED.sub("", ln) for ln in stdout.splitlines() if ln.strip()]
    return lines[2:]


def ticks(stdout: str) -> int:
    """The ticks dstat accounts for: each row, and those its rows say it missed."""
    return sum(
        int(m[1]) - 1 if (m := MISSED.search(ln)) else 0 for ln in stdout.splitlines()
    ) + len(rows(stdout))


def enough(stdout: str, expected: int) -> bool:
    """dstat ran its ticks: a row for each, or a word that it missed some (``ticks``), but
    for a tail it was late for when the run ended (dstat ends the loop without a row), so
    never more than the count and at least the first and one after."""
    return 2 <= ticks(stdout) <= expected


def gpu_part(row: str) -> str:
    """The GPU band(s) of a row: after the last '|' when other bands precede it."""
    return row.rsplit("|", 1)[-1].rsplit("\u2502", 1)[-1]


def words(row: str) -> list[str]:
    """The state word of every GPU band in a row (util mem state per band)."""
    out = []
    for band in gpu_part(row).replace("\u250a", ":").split(":"):
        parts = band.split()
        out.append(parts[-1] if parts else "")
    return out


def read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    """dstat's CSV: a preamble, two title lines, then one line per tick."""
    lines = list(csv.reader(path.read_text().splitlines()))
    header_at = next(i for i, r in enumerate(lines) if r and r[0] == "usr")
    return lines[header_at], [r for r in lines[header_at + 1 :] if r]


# --- dstat ----------------------------------------------------------------------------------


def test_dstat_gpu_prints_header_and_rows(runs: dict[str, Run]) -> None:
    rc, out, err = runs["steady"].result()
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].strip() == "-----gpu0-----", out
    assert lines[1].split() == ["util", "mem", "state"]
    data = rows(out)
    assert enough(out, VERDICT_TICKS), out
    for row in data:
        util, mem, _ = row.split()
        assert int(util) == 97  # the mean of the driver samples since the last tick
        assert int(mem) == 2  # 1.5 GiB of 80 GiB
    assert "Exception" not in out and "Traceback" not in err


def test_dstat_state_turns_ok_for_a_steady_gpu(runs: dict[str, Run]) -> None:
    rc, out, err = runs["steady"].result()
    assert rc == 0, err
    states = [words(r)[0] for r in rows(out)]
    assert states[0] == "?"  # no verdict before the detector's first window
    assert states[-1] == "ok", out
    assert not {"STARV", "SYNC", "idle"} & set(states), out


def test_dstat_state_turns_starved_for_bursts_and_gaps(runs: dict[str, Run]) -> None:
    rc, out, err = runs["burst"].result()
    assert rc == 0, err
    data = rows(out)
    # 30 % duty: a tick's window holds 6 or 7 driver samples of 1/6 s, so 30 give or take
    # one -- where dstat kept to its ticks: one it ran late, straight after a tick it had
    # to skip, covers a fraction of a second (a burst or a gap alone).
    utils = sorted(int(r.split()[0]) for r in data)
    assert abs(utils[len(utils) // 2] - 30) <= 12 and 0 <= utils[0] <= utils[-1] <= 100, out
    states = [words(r)[0] for r in data]
    assert states[-1] == "STARV", out
    assert "ok" not in states, out


def test_dstat_output_csv_has_numeric_gpu_columns(runs: dict[str, Run]) -> None:
    run = runs["csv"]
    rc, out, err = run.result()
    assert rc == 0, err  # dstat 0.7.4's own CSV writer dies of a NameError without the repair
    assert "Exception" not in out
    assert run.csv_path is not None
    header, body = read_csv(run.csv_path)
    assert header[-3:] == ["util", "mem", "state"]
    assert enough(out, 3) and len(body) == len(rows(out)), out  # a CSV line per row shown
    for r in body:
        assert len(r) == len(header)
        float(r[0])  # dstat's own cpu column, written by the repaired writer
        assert float(r[-3]) == pytest.approx(90.0)
        assert float(r[-2]) == pytest.approx(100 * 1.5 / 80)
        assert r[-1] in ("unknown", "healthy")
    # And the screen still shows both bands.
    assert rows(out)[0].count("|") == 1


def test_dstat_gpu_lost_mid_run_keeps_printing_rows(runs: dict[str, Run]) -> None:
    rc, out, err = runs["lost"].result()
    assert rc == 0, f"{err}\n--- the rows dstat printed:\n{out}"
    assert "Exception" not in out and "Traceback" not in err
    lines = out.splitlines()
    assert lines[0].split() == ["-----gpu0-----", "-----gpu1-----"]
    data = rows(out)
    # GPU 1 was lost after the first row; the rows after it kept coming (the run was
    # stopped after LosingRun.AFTER_LOSS of them).
    assert len(data) >= 1 + LosingRun.AFTER_LOSS, out
    assert words(data[0]) == ["?", "?"]
    last = data[-1]
    assert words(last)[1] == "lost", out
    assert words(last)[0] != "lost"
    assert int(gpu_part(last).split()[0]) == 90  # GPU 0 is still read
    assert gpu_part(last).split(":")[1].split()[:2] == ["-", "-"]


def test_dstat_without_a_driver_says_why(runs: dict[str, Run]) -> None:
    rc, _, err = runs["nodriver"].result()
    assert rc == 8  # dstat: "None of the stats you selected are available."
    assert "Module dstat_gpu failed to load. (cannot read GPUs: no NVIDIA driver found" in err
    assert "Traceback" not in err


def test_dstat_without_a_gpu_says_why(runs: dict[str, Run]) -> None:
    rc, _, err = runs["nogpu"].result()
    assert rc == 8
    assert "Module dstat_gpu failed to load. (the NVIDIA driver reports no GPU" in err


def test_dstat_plugin_not_wired_to_gpumon_says_why(runs: dict[str, Run]) -> None:
    rc, _, err = runs["bare"].result()
    assert rc == 8
    assert "Module dstat_gpu failed to load. (gpumon cannot be imported by /usr/bin/python3" in err
    assert "gpumon dstat install" in err


def test_dstat_on_a_terminal_colours_and_updates_the_line(runs: dict[str, Run]) -> None:
    rc, out, err = runs["tty"].result()
    assert rc == 0, err
    assert "Exception" not in out and "Traceback" not in err
    assert "\x1b[u" in out  # dstat's in-place updates between definitive lines
    # The state words, coloured as the theme says: GPU 1 is lost (white on red).
    assert "\x1b[1;37m\x1b[41mlost " in out
    assert "\x1b[4mutil" in out and "\x1b[4mstate" in out  # underlined sub-titles
    plain = re.sub(r"\x1b(\[[0-9;]*[a-zA-Z]|[78])", "", out)
    # In colour dstat joins band titles with a dash of the frame colour, as for its own.
    assert "-----gpu0-----------gpu1-----" in plain
    assert re.search(r"\b90 +2 \? +: +- +- lost", plain), plain


# --- dool -----------------------------------------------------------------------------------


def _need_dool(runs: dict[str, Run]) -> None:
    if "dool_mixed" not in runs:
        pytest.skip("dool is not installed (pip install dool)")


def test_dool_gpu_full_shows_ok_and_starved_bands(runs: dict[str, Run]) -> None:
    _need_dool(runs)
    rc, out, err = runs["dool_mixed"].result()
    assert rc == 0, err
    assert "Traceback" not in err
    text = out.replace("\x1b[0;0m", "")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("\x1b")]
    assert "gpu0" in lines[0] and "gpu1" in lines[0]
    data = rows("\n".join(lines))
    assert enough("\n".join(lines), VERDICT_TICKS), text
    bands = [
        [int(b.split()[0]) for b in gpu_part(r).replace("\u250a", ":").split(":")] for r in data
    ]
    bursty = sorted(u[1] for u in bands)  # the median row, as for dstat's bursty GPU
    assert all(u[0] == 97 for u in bands) and abs(bursty[len(bursty) // 2] - 30) <= 12, text
    assert words(data[-1]) == ["ok", "STARV"], text


def test_dool_output_csv(runs: dict[str, Run]) -> None:
    _need_dool(runs)
    run = runs["dool_csv"]
    rc, _, err = run.result()
    assert rc == 0, err
    assert run.csv_path is not None
    header, body = read_csv(run.csv_path)
    assert header[-6:] == [
        "gpu0:util",
        "gpu0:mem",
        "gpu0:state",
        "gpu1:util",
        "gpu1:mem",
        "gpu1:state",
    ]
    # dool writes CSV rows only (nothing on the screen): a row per tick it kept up with.
    assert 1 <= len(body) <= 3, body
    assert all(float(r[-3]) == pytest.approx(90.0) for r in body)


def test_dool_gpu_lost_mid_run_keeps_printing_rows(runs: dict[str, Run]) -> None:
    _need_dool(runs)
    rc, out, err = runs["dool_lost"].result()
    assert rc == 0, err  # dool does not catch extract() errors: one would end the run
    assert "Traceback" not in err
    text = out.replace("\x1b[0;0m", "")
    data = rows("\n".join(ln for ln in text.splitlines() if not ln.startswith("\x1b")))
    assert len(data) >= 1 + LosingRun.AFTER_LOSS, text  # see the dstat test above
    assert words(data[-1])[1] == "lost", repr(text)


def test_dool_without_a_driver_says_why(runs: dict[str, Run]) -> None:
    _need_dool(runs)
    rc, _, err = runs["dool_nodriver"].result()
    assert rc == 8
    assert "dool_gpu.py failed to load. (cannot read GPUs: no NVIDIA driver found" in err
