"""Job label values made safe to export: ids checked for their shape, text bounded.

Everything a job label carries comes from other people's processes (their environment,
their command line, the names they gave a container or unit) or from the kubelet, and ends
up on every job series of every scrape: a 120 KB ``SLURM_JOB_ID`` would make each of them
120 KB.  So an id read from an environment must have its id's shape and length or is taken
as absent (never cut: a cut id names another job), and free text (names, commands) is cut
to a bound with control characters shown as ``?``.  A command is only the program and the
script or module it runs (``python train.py``, ``python -m torch.distributed.run``): its
arguments may hold tokens and paths that are nobody's business on a dashboard.
"""

from __future__ import annotations

import pwd
import re

# Slurm job ids are 32-bit integers.
SLURM_JOB_ID = re.compile(r"[0-9]{1,10}")
# A pod's name: a DNS-1123 subdomain; its namespace: a DNS-1123 label (Kubernetes'
# validation rules).
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
POD_NAME = re.compile(rf"(?=.{{1,253}}$){_DNS_LABEL}(\.{_DNS_LABEL})*")
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# A user name as Slurm passes it (POSIX names, plus the '@', '.' and '$' of directory users).
USER_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.@-]{0,62}\$?")

NAME_MAX = 64  # container, unit, pod names as labels
COMMAND_MAX = 64
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SCRIPT = re.compile(r".+\.(py|sh|bash|zsh|jl|R|r|lua|pl|rb|js|mjs|ts|ipynb)")
_INTERPRETER_MODULE = ("-m",)


def env_id(value: str | None, shape: re.Pattern[str]) -> str:
    """``value`` if it has the id's shape (whole), else "" (absent)."""
    if value is None or len(value) > 253 or not shape.fullmatch(value):
        return ""
    return value


def bounded(text: str, limit: int = NAME_MAX) -> str:
    """Printable text of at most ``limit`` characters (cut with an ellipsis)."""
    text = _CONTROL.sub("?", text.strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short_command(argv: tuple[str, ...], comm: str = "") -> str:
    """What a person calls the command: the program, and the script or module it runs."""
    if not argv or not argv[0]:
        return bounded(comm, COMMAND_MAX)
    program = argv[0].rsplit("/", 1)[-1] or argv[0]
    words = [program.lstrip("-")]  # a login shell's argv[0] is "-bash"
    args = argv[1:]
    for i, arg in enumerate(args):
        if arg in _INTERPRETER_MODULE and i + 1 < len(args):
            words += [arg, args[i + 1]]
            break
        if not arg.startswith("-") and _SCRIPT.fullmatch(arg):
            words.append(arg.rsplit("/", 1)[-1])
            break
    return bounded(" ".join(words), COMMAND_MAX)


class UserNames:
    """uid -> user name (the passwd database, once per uid; the number where unknown)."""

    def __init__(self, max_cached: int = 1024) -> None:
        self._names: dict[int, str] = {}
        self._max = max_cached

    def __call__(self, uid: int | None) -> str:
        if uid is None:
            return ""
        name = self._names.get(uid)
        if name is None:
            try:
                name = bounded(pwd.getpwuid(uid).pw_name, 32)
            except (KeyError, OverflowError):  # no such user here (a container's)
                name = str(uid)
            if len(self._names) >= self._max:
                self._names.clear()
            self._names[uid] = name
        return name
