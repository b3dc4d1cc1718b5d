"""Cgroups a test makes as root, to place real processes as a runtime or systemd would.

``Placement.create(v2=..., v1=...)`` makes a cgroup below a folder of its own in the v2
hierarchy (``/sys/fs/cgroup`` on a v2 host, ``/sys/fs/cgroup/unified`` on a hybrid one)
and/or in a v1 hierarchy (``pids``, else the first controller mounted), e.g. a Docker
container's ``docker-<id>.scope`` or cgroupfs's ``docker/<id>``; ``argv(cmd)`` wraps a
command so that it enters them before it runs (a shell that moves itself, then execs the
command: the command's pid is the Popen's, and everything it starts is inside);
``close()`` kills what is left inside and removes the folders.  ``unavailable()`` says why
cgroups cannot be made here (not root, no hierarchy mounted, read-only), for a clear skip.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

V1_CONTROLLERS = ("pids", "memory", "cpu", "cpuacct", "freezer", "devices", "blkio")


def mounts() -> tuple[Path | None, dict[str, Path]]:
    """(the v2 mount, v1 mounts by controller) from /proc/self/mountinfo."""
    v2: Path | None = None
    v1: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype, _, options = [*right.split(" "), "", ""][:3]
        point = Path(left.split(" ")[4])
        if fstype == "cgroup2" and v2 is None:
            v2 = point
        elif fstype == "cgroup":
            for opt in options.split(","):
                if opt in (
                    "pids",
                    "memory",
                    "cpu",
                    "cpuacct",
                    "freezer",
                    "devices",
                    "blkio",
                ) or opt.startswith("name="):
                    v1.setdefault(opt, point)
    return v2, v1


def unavailable(v1: bool = False) -> str | None:
    """Why cgroups cannot be made here (``v1``: a v1 hierarchy too), or None."""
    if os.geteuid() != 0:
        return "making cgroups needs root"
    v2_mount, v1_mounts = mounts()
    if v2_mount is None:
        return "no cgroup v2 hierarchy is mounted"
    if not os.access(v2_mount, os.W_OK) or not _can_make(v2_mount):
        return f"the cgroup v2 hierarchy at {v2_mount} is read-only here"
    if v1 and not _v1_mount(v1_mounts):
        return "no cgroup v1 hierarchy is mounted (a v2-only host)"
    return None


def _v1_mount(v1_mounts: dict[str, Path]) -> Path | None:
    for key in ("pids", "name=systemd", *sorted(v1_mounts)):
        point = v1_mounts.get(key)
        if point is not None and _can_make(point):
            return point
    return None


def _can_make(point: Path) -> bool:
    probe = point / f"gpumon-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return False
    return True


@dataclass
class Placement:
    """Cgroups made for one test; the process given ``argv()`` enters all of them."""

    folders: list[Path] = field(default_factory=list)  # top folders, removed at close
    leaves: list[Path] = field(default_factory=list)  # where the process goes

    @classmethod
    def create(cls, v2: str | None = None, v1: str | None = None) -> Placement:
        """Cgroups at ``v2`` (a path below a folder of this test's in the v2 hierarchy)
        and ``v1`` (likewise, in a v1 hierarchy)."""
        v2_mount, v1_mounts = mounts()
        made = cls()
        top = f"gpumon-test-{os.getpid()}-{time.monotonic_ns()}"
        try:
            for point, rel in ((v2_mount, v2), (_v1_mount(v1_mounts) if v1 else None, v1)):
                if rel is None:
                    continue
                assert point is not None, "check unavailable() first"
                made.folders.append(point / top)
                leaf = point / top / rel
                leaf.mkdir(parents=True)
                made.leaves.append(leaf)
        except BaseException:
            made.close()
            raise
        return made

    def argv(self, cmd: list[str]) -> list[str]:
        """``cmd``, entering every leaf first (then exec'd: its pid is the shell's)."""
        procs = [str(leaf / "cgroup.procs") for leaf in self.leaves]
        script = 'for f in $GPUMON_CGROUPS; do echo $$ > "$f" || exit 97; done; exec "$@"'
        return ["env", f"GPUMON_CGROUPS={' '.join(procs)}", "sh", "-c", script, "sh", *cmd]

    def pids(self) -> set[int]:
        out: set[int] = set()
        for leaf in self.leaves:
            with contextlib.suppress(OSError, ValueError):
                out |= {int(x) for x in (leaf / "cgroup.procs").read_text().split()}
        return out

    def close(self, timeout_s: float = 10.0) -> None:
        """Kill what is still inside, then remove the folders (leaves first)."""
        deadline = time.monotonic() + timeout_s
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        for top in self.folders:
            if not top.exists():
                continue
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
