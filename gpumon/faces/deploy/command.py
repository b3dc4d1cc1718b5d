"""`gpumon deploy DIR`: the systemd unit, logrotate snippet, Prometheus rules, Grafana
dashboard, pcp-dstat plugin and Kubernetes files, written where an admin wants them.

A pip-installed gpumon has no clone to copy deploy/ from, so the files travel inside the
package and this writes them out.  Files that already exist are left alone when they are
the same and refused (nothing written at all) when they differ, unless --force: an admin
who edited a copy loses nothing by running it again.  The unit and the epilog run the
gpumon that wrote them (``where.py``), wherever pip, a venv or pipx put it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpumon.errors import GpumonError, UsageError
from gpumon.faces.deploy.shipped import Action, DeployFile, plan, shipped, write
from gpumon.faces.deploy.where import SHIPPED_GPUMON, point_at, running_gpumon, writable_as_is

# What to do next, per folder written (README.md there says more).
NEXT_STEPS = (
    ("systemd", "systemd: install systemd/gpumon.service and gpumon.toml (README.md: how)"),
    ("kubernetes", "Kubernetes: kubectl apply -k {dir}/kubernetes/overlays/kube-prometheus-stack"),
    ("prometheus", "Prometheus: add prometheus/gpumon-rules.yml to rule_files"),
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "deploy",
        help="write the deployment files (systemd, logrotate, Prometheus, Grafana, Kubernetes)",
        description="Write the files that deploy gpumon serve on nodes and clusters: the "
        "systemd unit and logrotate snippet, an example gpumon.toml, Prometheus rules and "
        "scrape configs, the Grafana dashboard, the pcp-dstat plugin and the Kubernetes "
        "kustomizations.  DIR/README.md says where each goes.",
    )
    p.add_argument("dir", nargs="?", metavar="DIR", help="folder to write them into")
    p.add_argument(
        "--force", action="store_true", help="overwrite files in DIR that differ from gpumon's"
    )
    p.add_argument("--list", action="store_true", help="only list the files, write nothing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    files = shipped()
    if not files:
        raise GpumonError(
            "this gpumon was installed without its deployment files (the package "
            "gpumon.faces.deploy.files is empty): reinstall it from a wheel or a clone."
        )
    if args.list:
        for f in files:
            print(f.path)
        return 0
    if not args.dir:
        raise UsageError("name the folder to write into: gpumon deploy DIR (or --list).")
    dest = Path(args.dir).expanduser()
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{dest} exists and is not a folder.")
    files, runs = _run_this_gpumon(files)
    steps = plan(files, dest)
    different = [f for f, action in steps if action is Action.DIFFERENT]
    if different and not args.force:
        more = f" (and {len(different) - 1} more)" if len(different) > 1 else ""
        raise UsageError(
            f"{dest / different[0].path} differs from gpumon's copy{more}; nothing was "
            "written: keep your edits elsewhere, or use --force to overwrite."
        )
    written = 0
    for f, action in steps:
        if action is Action.SAME:
            continue
        try:
            write(f, dest)
        except OSError as exc:
            raise GpumonError(
                f"cannot write {dest / f.path}: {exc.strerror or exc} "
                f"({written} of {len(files)} files written)."
            ) from None
        written += 1
    same = len(files) - written
    kept = f", {same} already there unchanged" if same else ""
    print(f"gpumon deploy: wrote {written} files to {dest}{kept}.")
    print(f"  {runs}")
    tops = {f.path.parts[0] for f in files}
    for top, step in NEXT_STEPS:
        if top in tops:
            print(f"  {step.format(dir=dest)}")
    if "README.md" in tops:
        print(f"  {dest / 'README.md'} says where every file goes.")
    return 0


def _run_this_gpumon(files: list[DeployFile]) -> tuple[list[DeployFile], str]:
    """The files naming the gpumon that runs now, and the sentence that says which."""
    exe = running_gpumon()
    if exe is None:
        return files, (
            f"the unit and the epilog run {SHIPPED_GPUMON}: no gpumon command was found "
            "beside this Python; edit ExecStart= and GPUMON_BIN if it is elsewhere."
        )
    if not writable_as_is(exe):
        return files, (
            f"the unit and the epilog run {SHIPPED_GPUMON}, not {exe} (a path with spaces "
            "or quotes); edit ExecStart= and GPUMON_BIN."
        )
    said = f"the unit and the epilog run {exe} (the gpumon that wrote them)"
    if exe.is_relative_to("/tmp") or exe.is_relative_to("/var/tmp"):
        said += "; the unit's PrivateTmp=yes hides /tmp and /var/tmp from it: install it elsewhere"
    return point_at(files, exe), said + "."
