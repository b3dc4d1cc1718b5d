"""The top process of a job, from a GPU process's ancestors: pure logic over /proc facts.

The job of a process nobody placed (no scheduler, no container) is what a person started:
the command typed in an ssh session or a tmux pane, a script run by ``nohup``, the service
a unit runs.  So from the GPU process, go up its parents while the parent is part of the
same thing, and stop below the first parent that is not:

- pid 1 or a kernel thread (the top of the machine, or of a container's pid namespace);
- a process in other cgroups (the job was placed apart from it: a unit, a container, a
  ``systemd-run --scope``);
- a host of sessions: sshd, a terminal multiplexer (tmux, screen), login, su/sudo, a
  container's shim or init (containerd-shim, conmon, tini, docker-init, ...), slurmstepd;
- a shell that leads its session (a login shell, a tmux pane's or terminal's shell):
  where a person types commands.  A shell that does not lead one (``bash run.sh``) is part
  of the job.

The process found is the one ``gpumon watch --pid`` would be given: its tree holds the
job's workers (DataLoader workers hold no GPU context) and its own CPU is the job's main
process, so the daemon's cause and advice are watch's.  A launcher (torchrun, mpirun,
accelerate) that starts the ranks is part of the job: all ranks are one job, rooted there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Process names (comm, at most 15 characters) that host sessions or containers.
SESSION_HOSTS = frozenset(
    {
        "sshd",
        "sshd-session",
        "sshd-auth",
        "dropbear",
        "mosh-server",
        "tmux: server",
        "tmux",
        "screen",
        "SCREEN",
        "zellij",
        "login",
        "agetty",
        "su",
        "sudo",
        "doas",
        "runuser",
        "systemd",
        "init",
        "containerd-shim",  # containerd-shim-runc-v2, cut to 15
        "conmon",
        "runc",
        "crun",
        "tini",
        "docker-init",
        "dumb-init",
        "catatonit",
        "slurmstepd",
    }
)
SHELLS = frozenset(
    {"bash", "sh", "dash", "zsh", "fish", "ksh", "mksh", "ash", "tcsh", "csh", "nu", "xonsh"}
)
MAX_DEPTH = 64  # a chain longer than this is not a process tree a person made


@dataclass(frozen=True, slots=True)
class ProcFacts:
    """What /proc says of one process, as the search needs it."""

    pid: int
    name: str  # comm
    ppid: int
    session: int
    start_ticks: int
    cgroups: str | None = None  # None: not readable


def parse_stat(pid: int, text: str) -> ProcFacts:
    """A /proc/PID/stat line (the name may hold spaces and parentheses: fields follow the
    last ')'). ValueError or IndexError on a line that is not one."""
    open_paren, close_paren = text.index("("), text.rindex(")")
    fields = text[close_paren + 2 :].split(None, 20)
    return ProcFacts(
        pid=pid,
        name=text[open_paren + 1 : close_paren],
        ppid=int(fields[1]),
        session=int(fields[3]),
        start_ticks=int(fields[19]),
    )


def ends_job(parent: ProcFacts | None, child: ProcFacts) -> bool:
    """Whether ``child`` is the top of its job: ``parent`` is none of it."""
    if parent is None or parent.pid <= 1 or parent.ppid == 0:
        return True  # gone or unreadable; init; a kernel thread (kthreadd's children)
    if parent.cgroups != child.cgroups or parent.cgroups is None:
        return True
    if parent.name in SESSION_HOSTS or parent.name.startswith("containerd-shim"):
        return True
    return parent.name in SHELLS and parent.session == parent.pid


def top_of_job(start: ProcFacts, parent_of: Callable[[ProcFacts], ProcFacts | None]) -> ProcFacts:
    """The top process of ``start``'s job (``start`` itself when its parent ends it)."""
    node = start
    for _ in range(MAX_DEPTH):
        parent = parent_of(node)
        if ends_job(parent, node):
            return node
        assert parent is not None
        node = parent
    return node
