"""Where a process was placed, from its /proc/PID/cgroup text: pure parsing, no reads.

Whoever starts a job on Linux puts it in a cgroup of its own, and the path says who:

- Slurm: ``.../job_<id>/step_<n>/...`` (cgroup v1 ``/slurm/uid_<uid>/job_<id>/...``, v2
  ``/system.slice/slurmstepd.scope/job_<id>/...``; a Slurm that keys its v2 tree by
  another id puts that id below ``slurmstepd.scope``);
- the kubelet: ``kubepods.../pod<uid>/<container>`` (systemd and cgroupfs drivers);
- a container runtime: ``docker-<id>.scope``, ``libpod-<id>.scope`` (Podman, rootful or
  under ``user@UID.service``), ``cri-containerd-<id>.scope``, ``crio-<id>.scope``,
  ``nerdctl-<id>.scope``, or cgroupfs's ``/docker/<id>`` (any parent, ``/default/<id>``
  for containerd's namespaces); systemd-nspawn's ``machine-<name>.scope``;
- systemd: a service (``system.slice/foo.service``, a user's ``user@1000.service/app.slice/
  foo.service``) or a scope someone named (``systemd-run --scope --unit=train``);
- logind: a login session's ``session-3.scope``; a desktop's launched app or terminal
  (``app-*.scope``, ``vte-spawn-*.scope``, ``tmux-spawn-*.scope``) is one too: what runs in
  it is found by its process tree, not by the scope.

cgroup v2 has one line (``0::/path``); v1 a line per hierarchy (``4:memory:/path``), with
``name=systemd`` the tree systemd keeps; a hybrid host has both.  Lines disagree: Docker's
cgroupfs driver on a hybrid host puts the v1 controllers under ``/docker/<id>`` while the
unified line says ``/system.slice/containerd.service``.  So Slurm, pods and containers are
looked for on every line (they are placed on purpose, and only there), and systemd's units
and sessions on the line systemd keeps: the unified one where it is not the root, else
``name=systemd``, else the first controller line that is not the root.  Paths may start
with ``/../..`` when the reader is in another cgroup namespace; components are matched
wherever they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SLURM_JOB_ID = re.compile(r"[0-9]{1,10}")
_JOB_DIR = re.compile(r"job_([0-9]{1,10})")
_SLURMSTEPD = re.compile(r"(?:[A-Za-z0-9._-]+_)?slurmstepd\.scope")
_SLURM_KEY = re.compile(r"[A-Za-z0-9]{1,32}")  # a job's directory below slurmstepd.scope
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
# <runtime>-<64 hex>.scope, or a bare 64-hex id (cgroupfs; "crio-conmon-<id>" is conmon's).
_CONTAINER = re.compile(r"(?:([a-z][a-z0-9]*(?:-[a-z][a-z0-9]*)*)-)?([0-9a-f]{64})(?:\.scope)?")
_MACHINE = re.compile(r"machine-(.+)\.scope")
_SESSION = re.compile(r"session-[A-Za-z0-9]+\.scope")
_USER_MANAGER = re.compile(r"user@[0-9]+\.service")
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")

KINDS = ("slurm", "pod", "container", "unit", "session")


@dataclass(frozen=True, slots=True)
class Placement:
    """What a process's cgroups say about its job ("" where they say nothing)."""

    kind: str = ""  # one of KINDS, or "" (the root, init.scope, a path no one named)
    slurm_job: str = ""  # job_<id>'s id, or the directory below slurmstepd.scope
    slurm_numeric: bool = False  # slurm_job is a job id (job_<id>), not another key
    pod_uid: str = ""
    container_id: str = ""  # the full id, as in the path
    runtime: str = ""  # docker, libpod, cri-containerd, crio, nerdctl, machine, ...
    container_name: str = ""  # where the path itself names it (machine-<name>.scope)
    unit: str = ""  # the systemd unit (service or scope) the process is in
    user_unit: bool = False  # a unit of a user's manager (under user@UID.service)
    cgroups: str = ""  # every line, as read: two processes in one place read the same


def parse_lines(text: str) -> list[tuple[str, str, str]]:
    """(hierarchy id, controllers, path) of each line; lines that are not such skipped."""
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/"):
            out.append((parts[0], parts[1], parts[2]))
    return out


def systemd_path(lines: list[tuple[str, str, str]]) -> str:
    """The path systemd keeps: unified (if not the root), name=systemd, or a controller's."""
    by_kind = {"unified": "", "systemd": "", "controller": ""}
    for hier, controllers, path in lines:
        if path in ("", "/"):
            continue
        if hier == "0" and controllers == "":
            by_kind["unified"] = by_kind["unified"] or path
        elif controllers == "name=systemd":
            by_kind["systemd"] = by_kind["systemd"] or path
        elif not controllers.startswith("name="):
            by_kind["controller"] = by_kind["controller"] or path
    return by_kind["unified"] or by_kind["systemd"] or by_kind["controller"]


def _tokens(path: str) -> list[str]:
    """The path's components, ``a:b:c`` components split too (containerd's v1 systemd
    driver names a container ``kubepods-...slice:cri-containerd:<id>``)."""
    return [t for comp in path.split("/") for t in comp.split(":") if t and t != ".."]


def _slurm(paths: list[str]) -> tuple[str, bool]:
    for path in paths:
        tokens = _tokens(path)
        for i, tok in enumerate(tokens):
            m = _JOB_DIR.fullmatch(tok)
            if m:
                return m.group(1), True
            if _SLURMSTEPD.fullmatch(tok) and i + 1 < len(tokens):
                below = tokens[i + 1]
                if below != "system" and _SLURM_KEY.fullmatch(below):
                    return below, False
    return "", False


def _container(paths: list[str]) -> tuple[str, str, str]:
    """(id, runtime, name) of the innermost container in any path (Docker in Docker: the
    inner one); ("", "", "") when none."""
    for path in paths:
        tokens = _tokens(path)
        for i in range(len(tokens) - 1, -1, -1):
            m = _CONTAINER.fullmatch(tokens[i])
            if m:
                runtime = m.group(1) or (tokens[i - 1] if i > 0 else "")
                return m.group(2), runtime.removesuffix(".slice"), ""
            m = _MACHINE.fullmatch(tokens[i])
            if m and not m.group(1).startswith("libpod"):
                return "", "machine", unescape(m.group(1))
    return "", "", ""


def _unit(path: str) -> tuple[str, str, bool]:
    """(kind, unit, user unit) from the path systemd keeps."""
    tokens = _tokens(path)
    for i in range(len(tokens) - 1, -1, -1):
        tok = tokens[i]
        if not tok.endswith((".service", ".scope")):
            continue
        if _USER_MANAGER.fullmatch(tok) or tok == "init.scope":
            return "", "", False  # a user's manager itself, or pid 1
        if _SESSION.fullmatch(tok) or tok.startswith("app-") or "-spawn-" in tok:
            return "session", tok, False
        user = any(_USER_MANAGER.fullmatch(t) for t in tokens[:i])
        return "unit", tok, user
    return "", "", False


def parse(text: str) -> Placement:
    """The job a /proc/PID/cgroup text places its process in (Slurm first, then a pod, a
    container, a unit, a session: a Slurm job in a pod keeps the pod's labels too)."""
    lines = parse_lines(text)
    paths = [p for _, _, p in lines if p != "/"]
    # The line systemd keeps first: a container's scope names its runtime there.
    main = systemd_path(lines)
    ordered = [main, *(p for p in paths if p != main)] if main else paths
    job, numeric = _slurm(ordered)
    pod = cid = runtime = name = ""
    for path in ordered:
        m = _POD.search(path)
        if m:
            pod, cid = m.group(1).replace("_", "-"), _container([path])[0]
            break
    if not pod:
        cid, runtime, name = _container(ordered)
    kind, unit, user = _unit(main)
    if job or pod or cid or name:
        kind = "slurm" if job else "pod" if pod else "container"
    return Placement(
        kind,
        slurm_job=job,
        slurm_numeric=numeric,
        pod_uid=pod,
        container_id=cid,
        runtime=runtime,
        container_name=name,
        unit=unit,
        user_unit=user,
        cgroups=text,
    )


def unescape(name: str) -> str:
    """A systemd unit-name escape (``\\x2d``) read back (``-``)."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), name)
