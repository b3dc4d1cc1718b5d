"""The job's Python stacks, read by py-spy: the only module that runs it.

Why windows of ``py-spy record`` and not a ``py-spy dump`` per tick (measured with py-spy
0.4.3 on an 8-worker job, CPU time of py-spy itself; ``benchmarks/bench_stacks.py``):

- A dump attaches afresh every time (reads the interpreter's binary, finds its state):
  ~9 ms of CPU per process per call.  One sample a second of a main process and 8 workers
  is 8 % of a core, and a second apart is too coarse to see a step.
- A record attaches once (~10 ms) and then costs ~0.4 ms per sample (mostly the kernel's
  ``process_vm_readv``).  Ten samples a second for 10 s of three processes is ~1.5 % of a
  core.  ``--subprocesses`` would find the workers itself, but it scans every process of
  the host all the time (5 % of a core at 5 samples a second): the tree already names them.
- Every output format is written when the window ends; chrometrace's is the one that keeps
  *when* each stack began and ended, so the samples can be laid over the GPU's gaps.
- ``--nonblocking``: the job is never paused (py-spy's default stops each process per
  sample).  py-spy refuses ``--native`` with it, so a call into C (``pickle.dump``,
  ``tensor.item()``, ``cv2.imdecode``) shows only as the Python line that made it: that
  line's source is read here, for the innermost frame.  ``--idle``: a process waiting (on
  its loader, a queue, a collective) is what must be seen; ``--threads``: each thread's OS
  id, to tell the main thread apart.
- py-spy runs at nice 10: on a job starved for CPU it takes the leftovers.

A refusal (ptrace not permitted) is said once, as a ``StacksRefusedError`` whose sentence
names the fix that applies here; the refused processes are not asked again, and the sampler
turns itself off unless some of the job's processes did answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpumon.errors import StacksRefusedError, StacksUnavailableError
from gpumon.model import ProcessRole, StackFrame, StackSample

# What py-spy costs, measured (module docstring): CPU seconds to attach to one process for
# a window, and per sample of one process.  The engine sizes windows with these.
ATTACH_CPU_S = 0.010
SAMPLE_CPU_S = 0.0004
MAX_RATE_HZ = 20
PY_SPY_NICE = 10
INSTALL_HINT = "pip install 'gpumon-why[stacks]'"

# py-spy's own words when the kernel refuses to let it read a process.
_REFUSED = re.compile(r"Permission Denied|Operation not permitted|os error (1|13)\)", re.I)
# ... and when the process is not Python (a shell launcher, torchrun's C++ agent).
_NOT_PYTHON = re.compile(r"Failed to find python version|Failed to find a python interpreter")
_SITE = re.compile(r"/(?:site|dist)-packages/")
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?t?/")
_CODE_LINES_KEPT = 4096
_CAP_SYS_PTRACE = 19


@dataclass(frozen=True, slots=True)
class Target:
    """A process to read, and what it is for."""

    pid: int
    role: ProcessRole


def find_py_spy() -> str | None:
    """The py-spy binary: the one installed beside this Python (``gpumon-why[stacks]``
    puts it in the same scripts directory as ``gpumon``), else the first on PATH."""
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        exe = Path(folder) / "py-spy"
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    return shutil.which("py-spy")


def shorten(path: str) -> tuple[str, bool]:
    """(the file as people name it, whether it is installed code): a file under
    site-packages or the standard library by its package path (``PIL/Image.py``), the
    job's own by its name (``dataset.py``)."""
    if path.startswith("<"):
        return path, True  # <frozen importlib._bootstrap>, <string>
    m = _SITE.search(path)
    if m is None:
        m = _STDLIB.search(path)
    if m is not None:
        return path[m.end() :], True
    return os.path.basename(path) or path, False


def parse_chrometrace(
    events: Sequence[dict[str, object]],
    pid: int,
    role: ProcessRole,
    t0_s: float,
    frame_of: FrameCache,
) -> list[StackSample]:
    """py-spy's chrometrace of one process as stack samples of its main thread.

    The trace holds a begin (``B``) and end (``E``) event per frame each time a thread's
    stack changes, at microseconds since py-spy started (``t0_s`` on our clock); with
    ``--threads`` each thread's outermost frame is ``thread (OS_TID): NAME``, and the main
    thread's OS id is the pid.  A stack holds from one change to the next.
    """
    main_tid = _main_thread(events, pid)
    if main_tid is None:
        return []
    stack: list[tuple[str, str, int | None]] = []
    out: list[StackSample] = []
    since: float | None = None
    for e in events:
        if e.get("tid") != main_tid:
            continue
        ts = e.get("ts")
        if not isinstance(ts, int | float):
            continue
        if since is not None and ts > since and stack:
            out.append(_sample(stack, since, ts, pid, role, t0_s, frame_of))
        since = ts
        name = str(e.get("name", ""))
        if name.startswith("thread ("):
            continue
        args = e.get("args")
        file, line = "", None
        if isinstance(args, dict):
            file = str(args.get("filename", ""))
            ln = args.get("line")
            line = ln if isinstance(ln, int) and ln > 0 else None
        if e.get("ph") == "B":
            stack.append((name, file, line))
        elif e.get("ph") == "E" and stack:
            stack.pop()
    return _merged(out)


def _main_thread(events: Sequence[dict[str, object]], pid: int) -> object | None:
    prefix = f"thread ({pid})"
    for e in events:
        if str(e.get("name", "")).startswith(prefix):
            return e.get("tid")
    return None


def _sample(
    stack: list[tuple[str, str, int | None]],
    start_us: float,
    end_us: float,
    pid: int,
    role: ProcessRole,
    t0_s: float,
    frame_of: FrameCache,
) -> StackSample:
    inner = len(stack) - 1
    frames = tuple(frame_of.get(*stack[i], pid, code=i == inner) for i in range(inner, -1, -1))
    return StackSample(t0_s + start_us / 1e6, (end_us - start_us) / 1e6, pid, role, frames)


def _merged(samples: list[StackSample]) -> list[StackSample]:
    """Back-to-back samples of one stack as one (a line change of an outer frame that
    returned to where it was, say)."""
    out: list[StackSample] = []
    for s in samples:
        last = out[-1] if out else None
        if (
            last is not None
            and last.frames == s.frames
            and abs(last.t_s + last.seconds - s.t_s) < 1e-6
        ):
            out[-1] = StackSample(last.t_s, last.seconds + s.seconds, s.pid, s.role, s.frames)
        else:
            out.append(s)
    return out


class FrameCache:
    """One ``StackFrame`` per (function, file, line), the innermost with its source line:
    a window repeats the same few frames thousands of times (bounded)."""

    def __init__(self, procfs: str = "/proc") -> None:
        self.procfs = procfs
        self._frames: OrderedDict[tuple[object, ...], StackFrame] = OrderedDict()
        self._lines: OrderedDict[tuple[str, int], str | None] = OrderedDict()

    def get(
        self, name: str, path: str, line: int | None, pid: int, *, code: bool = False
    ) -> StackFrame:
        key = (name, path, line, code)
        frame = self._frames.get(key)
        if frame is None:
            short, library = shorten(path)
            text = self.source_line(path, line, pid) if code else None
            frame = StackFrame(name, short, line, library, text)
            self._frames[key] = frame
            if len(self._frames) > _CODE_LINES_KEPT:
                self._frames.popitem(last=False)
        return frame

    def source_line(self, path: str, line: int | None, pid: int) -> str | None:
        """The line's source, stripped, read as the process sees its files (a container's
        through /proc/PID/root); None where it cannot be read."""
        if line is None or not path or path.startswith("<"):
            return None
        key = (path, line)
        if key in self._lines:
            return self._lines[key]
        text = None
        for candidate in (f"{self.procfs}/{pid}/root{path}", path):
            with contextlib.suppress(OSError, UnicodeDecodeError, ValueError):
                with open(candidate, encoding="utf-8", errors="replace") as fh:
                    for i, src in enumerate(fh, 1):
                        if i == line:
                            text = src.strip()[:200] or None
                            break
                break
        self._lines[key] = text
        if len(self._lines) > _CODE_LINES_KEPT:
            self._lines.popitem(last=False)
        return text


@dataclass
class _Recording:
    target: Target
    proc: subprocess.Popen[bytes]
    out: str
    err: str
    t0_s: float


class StackSampler:
    """Windows of ``py-spy record``, one per process, started by ``start`` and gathered
    by ``collect`` once they end; never waits on py-spy."""

    def __init__(self, py_spy: str | None = None, *, procfs: str = "/proc") -> None:
        exe = py_spy or find_py_spy()
        if exe is None:
            raise StacksUnavailableError(
                f"--stacks needs py-spy, which is not installed here: {INSTALL_HINT}."
            )
        self.exe = exe
        self.procfs = procfs
        self.off = False  # refused: asks nothing more
        self._dir = tempfile.mkdtemp(prefix="gpumon-stacks-")
        self._running: dict[int, _Recording] = {}
        self._refused: set[int] = set()
        self._not_python: set[int] = set()
        self._answered = False  # some process of the job has given its stacks
        self._told = False
        self._pending: list[StackSample] = []
        self._frames = FrameCache(procfs)
        self._seq = 0
        self.windows = 0  # recordings started (for tests and the benchmark)

    @property
    def busy(self) -> bool:
        """A window is being recorded."""
        return bool(self._running)

    def skip(self, pid: int) -> bool:
        """A process not worth asking: refused, or not Python."""
        return pid in self._refused or pid in self._not_python

    def start(self, targets: Sequence[Target], *, rate_hz: int, seconds: int) -> int:
        """Record each target (not already being recorded) for ``seconds``; how many
        windows started."""
        if self.off:
            return 0
        started = 0
        for target in targets:
            if target.pid in self._running or self.skip(target.pid):
                continue
            self._seq += 1
            out = os.path.join(self._dir, f"{target.pid}-{self._seq}.json")
            err = os.path.join(self._dir, f"{target.pid}-{self._seq}.err")
            argv = [
                self.exe, "record", "--pid", str(target.pid),
                "--rate", str(max(1, min(MAX_RATE_HZ, rate_hz))),
                "--duration", str(max(1, seconds)),
                "--nonblocking", "--idle", "--threads",
                "--format", "chrometrace", "--output", out,
            ]  # fmt: skip
            try:
                with open(err, "wb") as errf:
                    t0 = time.monotonic()
                    proc = subprocess.Popen(
                        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf
                    )
            except OSError as exc:
                self.off = True
                raise StacksUnavailableError(
                    f"cannot run py-spy ({self.exe}: {exc.strerror or exc}); carrying on "
                    "without stacks."
                ) from None
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, proc.pid, PY_SPY_NICE)
            self._running[target.pid] = _Recording(target, proc, out, err, t0)
            started += 1
        self.windows += started
        return started

    def collect(self) -> list[StackSample]:
        """The samples of every window that has ended.  The first refusal raises
        ``StacksRefusedError`` (once; the samples gathered with it come next time)."""
        samples, self._pending = self._pending, []
        refusal: StacksRefusedError | None = None
        for pid, rec in list(self._running.items()):
            if rec.proc.poll() is None:
                continue
            del self._running[pid]
            got, refused = self._finish(rec)
            samples += got
            if refused is not None and refusal is None:
                refusal = refused
        if refusal is not None and not self._told:
            self._told = True
            if not self._answered:
                self.off = True
                self.close()
            self._pending = samples
            raise refusal
        return samples

    def _finish(self, rec: _Recording) -> tuple[list[StackSample], StacksRefusedError | None]:
        pid = rec.target.pid
        try:
            if rec.proc.returncode != 0:
                err = _read(rec.err)
                alive = os.path.exists(f"{self.procfs}/{pid}")
                if alive and _REFUSED.search(err):
                    self._refused.add(pid)
                    return [], refused_error(pid, self.procfs)
                if alive and _NOT_PYTHON.search(err):
                    self._not_python.add(pid)
                return [], None  # it exited mid-window: nothing to say
            try:
                with open(rec.out, encoding="utf-8") as fh:
                    events = json.load(fh)
            except (OSError, ValueError):
                return [], None
            if not isinstance(events, list):
                return [], None
            got = parse_chrometrace(events, pid, rec.target.role, rec.t0_s, self._frames)
            if got:
                self._answered = True
            return got, None
        finally:
            for path in (rec.out, rec.err):
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def close(self) -> None:
        """Stop every window (their samples are dropped) and remove the scratch files."""
        for rec in self._running.values():
            with contextlib.suppress(OSError):
                rec.proc.kill()
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                rec.proc.wait(5)
        self._running.clear()
        shutil.rmtree(self._dir, ignore_errors=True)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(8192)
    except OSError:
        return ""


# --- the refusal, in one sentence with the fix that applies here ---------------------------


def refused_error(pid: int, procfs: str = "/proc") -> StacksRefusedError:
    """Why the kernel refused to let py-spy read ``pid``, and what would allow it."""
    scope = _ptrace_scope(procfs)
    euid = os.geteuid()
    owner = _owner(pid, procfs)
    if scope == 3:
        why = "kernel.yama.ptrace_scope is 3, which lets no process read another"
        fix = "only a boot with a lower setting allows it"
    elif euid != 0 and owner is not None and owner != euid:
        why = f"it belongs to another user (uid {owner}) and gpumon is not root"
        fix = "run gpumon as root or as that user"
    elif scope in (1, 2) and euid != 0:
        why = f"kernel.yama.ptrace_scope is {scope}"
        fix = "run gpumon as root, or allow it with `sudo sysctl kernel.yama.ptrace_scope=0`"
    elif euid == 0 and not _has_cap_sys_ptrace(procfs):
        why = "this container lacks CAP_SYS_PTRACE"
        fix = (
            "start it with --cap-add SYS_PTRACE (Kubernetes: securityContext.capabilities"
            ".add: [SYS_PTRACE])"
        )
    else:
        why = "the kernel refused ptrace access"
        fix = (
            "run gpumon as root (in a container, with --cap-add SYS_PTRACE), start the job "
            "under `gpumon watch --stacks -- CMD`, or `sudo sysctl kernel.yama.ptrace_scope=0`"
        )
    return StacksRefusedError(
        f"cannot read the Python stacks of pid {pid}: {why}; {fix}. Carrying on without them.",
        pid=pid,
        fix=fix,
    )


def _ptrace_scope(procfs: str) -> int | None:
    try:
        with open(f"{procfs}/sys/kernel/yama/ptrace_scope", encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def _owner(pid: int, procfs: str) -> int | None:
    try:
        return os.stat(f"{procfs}/{pid}").st_uid
    except OSError:
        return None


def _has_cap_sys_ptrace(procfs: str) -> bool:
    try:
        with open(f"{procfs}/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_PTRACE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return True  # unknown: not the reason to name
