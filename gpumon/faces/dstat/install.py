"""`gpumon dstat install | uninstall`: put the ``--gpu`` plugin where dstat or dool finds it.

dstat (Debian's 0.7.4) runs under the system Python (``/usr/bin/python3``), which cannot
see the virtualenv or user site gpumon was installed in.  The installer therefore writes
the site directories of *this* gpumon (including where an editable install's ``.pth``
points) into the installed plugin file, which adds them with ``site.addsitedir()``.
Before installing it runs the target interpreter once on the new file, so an install
that cannot work is refused with the reason instead of failing later inside dstat:

- dstat's loader needs ``imp``, removed in Python 3.12: a dstat whose interpreter is
  3.12 or newer cannot load any external plugin;
- gpumon needs Python 3.11 (Ubuntu 22.04's dstat runs 3.10);
- a compiled module built for another Python ABI will not import there.

dool (``pip install dool``) has none of these limits; ``--dool`` installs ``dool_gpu.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.resources
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import gpumon
from gpumon.errors import GpumonError
from gpumon.files import replace_whole


def _plugin_dir() -> Path:
    """The plugin files: the installed package's, else (a clone run from its own tree,
    never installed, where the package mapping does not exist) the clone's dstat_plugins/."""
    try:
        return Path(str(importlib.resources.files("gpumon.faces.dstat.plugins")))
    except ModuleNotFoundError:
        return Path(gpumon.__file__).resolve().parent.parent / "dstat_plugins"


PLUGIN_DIR = _plugin_dir()
MARKER = "gpumon.faces.dstat.columns"  # every plugin file gpumon writes contains it
SITE_DIRS_LINE = re.compile(r"^GPUMON_SITE_DIRS = .*$", re.MULTILINE)
MIN_PYTHON = (3, 11)


@dataclass(frozen=True, slots=True)
class Target:
    """Which program the plugin is for, and what it is called there."""

    program: str  # "dstat" or "dool"
    filename: str  # dstat_gpu.py / dool_gpu.py
    user_dir: Path
    system_dir: Path


def targets() -> dict[str, Target]:
    home = Path.home()
    return {
        "dstat": Target("dstat", "dstat_gpu.py", home / ".dstat", Path("/usr/local/share/dstat")),
        "dool": Target("dool", "dool_gpu.py", home / ".dool", Path("/usr/local/share/dool")),
    }


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dstat",
        help="install the `dstat --gpu` / `dool --gpu` plugin",
        description="Install or remove the plugin that makes `dstat --gpu` (and `dool --gpu`) "
        "show GPU utilisation, memory and gpumon's verdict (ok, STARV, SYNC, idle) beside "
        "dstat's own columns.",
    )
    p.set_defaults(func=lambda _args: _usage(p))
    actions = p.add_subparsers(dest="dstat_action", metavar="ACTION")
    for name, helptext in (
        ("install", "install the plugin (default: for you, in ~/.dstat/)"),
        ("uninstall", "remove a plugin installed by `gpumon dstat install`"),
    ):
        a = actions.add_parser(name, help=helptext, description=helptext)
        where = a.add_mutually_exclusive_group()
        where.add_argument("--dir", metavar="DIR", help="install into DIR (a plugin folder)")
        where.add_argument(
            "--system",
            action="store_true",
            help="system-wide: /usr/local/share/dstat/ (or /usr/local/share/dool/)",
        )
        a.add_argument(
            "--dool", action="store_true", help="for dool (~/.dool/dool_gpu.py) instead of dstat"
        )
        if name == "install":
            a.add_argument(
                "--program",
                metavar="PATH",
                help="the dstat (or dool) executable to check against (default: from PATH)",
            )
            a.add_argument(
                "--force",
                action="store_true",
                help="install even where the check says the plugin cannot load",
            )
            a.set_defaults(func=run_install)
        else:
            a.set_defaults(func=run_uninstall)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _target(args: argparse.Namespace) -> tuple[Target, Path]:
    target = targets()["dool" if args.dool else "dstat"]
    if args.dir:
        folder = Path(args.dir).expanduser()
    elif args.system:
        folder = target.system_dir
    else:
        folder = target.user_dir
    return target, folder / target.filename


# --- where this gpumon lives -------------------------------------------------------------


def site_dirs() -> list[str]:
    """Folders that make this gpumon (and its pynvml) importable from another interpreter.

    The site-packages holding gpumon's metadata comes first: ``site.addsitedir()`` on it
    also runs an editable install's ``.pth``.  The package's parent folder (the source
    tree of an editable install) and pynvml's folder follow, in case no ``.pth`` does it.
    """
    out: list[str] = []

    def add(path: os.PathLike[str] | str | None) -> None:
        if path is None:
            return
        resolved = str(Path(path).resolve())
        if resolved not in out and Path(resolved).is_dir():
            out.append(resolved)

    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        add(importlib.metadata.distribution(gpumon.DISTRIBUTION).locate_file(""))  # type: ignore[arg-type]
    add(Path(gpumon.__file__).resolve().parent.parent)
    spec = importlib.util.find_spec("pynvml")
    if spec is not None and spec.origin:
        add(Path(spec.origin).parent)
    return out


def render_plugin(target: Target, dirs: list[str]) -> str:
    """The packaged plugin file with this install's site directories filled in."""
    source = (PLUGIN_DIR / target.filename).read_text(encoding="utf-8")
    line = f"GPUMON_SITE_DIRS = {json.dumps(dirs)}  # written by `gpumon dstat install`"
    text, n = SITE_DIRS_LINE.subn(lambda _m: line, source, count=1)
    if n != 1:
        raise GpumonError(f"the packaged {target.filename} has no GPUMON_SITE_DIRS line.")
    return text


# --- which Python runs dstat / dool ------------------------------------------------------


def find_program(target: Target, explicit: str | None) -> Path | None:
    if explicit:
        path = Path(explicit).expanduser()
        if not path.exists():
            raise GpumonError(f"{explicit} does not exist.")
        return path
    found = shutil.which(target.program)
    return Path(found) if found else None


def interpreter_of(program: Path) -> list[str]:
    """The interpreter command in ``program``'s ``#!`` line (``env`` resolved on PATH).

    pyenv/asdf shims and other shell wrappers have no Python shebang; those raise.
    """
    try:
        with open(program, "rb") as f:
            first = f.readline(512).decode("utf-8", "replace").strip()
    except OSError as exc:
        raise GpumonError(f"cannot read {program}: {exc.strerror or exc}.") from None
    if not first.startswith("#!"):
        raise GpumonError(f"{program} is not a script with a #! line; cannot tell its Python.")
    words = first[2:].split()
    if not words:
        raise GpumonError(f"{program} has an empty #! line.")
    if Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        found = shutil.which(words[0]) if words else None
        if not found:
            raise GpumonError(f"{program} runs `{first[2:].strip()}`, not found on PATH.")
        words[0] = found
    if "python" not in Path(words[0]).name:
        raise GpumonError(f"{program} runs {words[0]}, not Python.")
    return words


def resolve_program(program: Path) -> Path:
    """pyenv-style shims (a shell script on PATH) stand for the real console script."""
    try:
        head = program.read_bytes()[:4096]
    except OSError:
        return program
    if b"pyenv" in head and b"exec" in head:
        try:
            real = subprocess.run(
                ["pyenv", "which", program.name], capture_output=True, text=True, timeout=20
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return program
        if real:
            return Path(real)
    return program


# Run by the target interpreter on the freshly written plugin: Python-3.0-compatible
# syntax, so that even an old interpreter reports its version.
PROBE = r"""
import json, sys
out = {"version": list(sys.version_info[:3]), "executable": sys.executable}
try:
    import imp
    out["imp"] = True
except ImportError:
    out["imp"] = False
if sys.version_info >= (3, 11):
    path, kind = sys.argv[1], sys.argv[2]
    try:
        import warnings
        warnings.simplefilter("ignore")
        g = {"__name__": "gpumon_probe", kind: object}
        exec(compile(open(path).read(), path, "exec"), g, {})
        import gpumon, gpumon.detect, gpumon.engine, gpumon.sample.nvml
        out["gpumon"] = None
        out["gpumon_file"] = gpumon.__file__
    except BaseException as e:
        out["gpumon"] = "%s: %s" % (type(e).__name__, e)
    try:
        import psutil
        out["psutil"] = None
    except BaseException as e:
        out["psutil"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out))
"""


@dataclass(frozen=True, slots=True)
class Probe:
    """What the target interpreter said about the plugin file."""

    python: str
    version: tuple[int, ...]
    has_imp: bool
    gpumon_error: str | None
    psutil_error: str | None
    gpumon_file: str | None


def probe(python: list[str], plugin: Path, kind: str) -> Probe:
    try:
        proc = subprocess.run(
            [*python, "-c", PROBE, str(plugin), kind],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")},
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise GpumonError(f"cannot run {' '.join(python)}: {exc}.") from None
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise GpumonError(
            f"{' '.join(python)} failed to run the plugin check: "
            f"{(proc.stderr or proc.stdout).strip()[-400:]}"
        ) from None
    return Probe(
        python=str(out.get("executable") or python[0]),
        version=tuple(out["version"]),
        has_imp=bool(out.get("imp")),
        gpumon_error=out.get("gpumon"),
        psutil_error=out.get("psutil"),
        gpumon_file=out.get("gpumon_file"),
    )


def problems(target: Target, program: Path, p: Probe) -> list[str]:
    """Why the plugin cannot load under ``p`` (empty: it can)."""
    ver = ".".join(str(v) for v in p.version[:3])
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    out: list[str] = []
    if target.program == "dstat" and not p.has_imp:
        out.append(
            f"{program} runs under Python {ver} ({p.python}), on which dstat 0.7.4 cannot "
            "load any external plugin (its loader needs the `imp` module, removed in Python "
            "3.12). Use dool, the maintained fork, instead: "
            "`pip install dool && gpumon dstat install --dool`, then `dool --gpu`."
        )
        return out
    if tuple(p.version[:2]) < MIN_PYTHON:
        out.append(
            f"{program} runs under Python {ver} ({p.python}) but gpumon needs Python "
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer. Use dool in gpumon's environment "
            "instead: `pip install dool && gpumon dstat install --dool`, then `dool --gpu`."
        )
        return out
    if p.gpumon_error:
        msg = (
            f"{p.python} (Python {ver}, which runs {program}) cannot import gpumon: "
            f"{p.gpumon_error}"
        )
        if tuple(p.version[:2]) != tuple(sys.version_info[:2]):
            msg += (
                f". gpumon is installed for Python {here}; compiled modules built for "
                f"{here} do not load under {ver}: install gpumon for that Python instead "
                f"(`{p.python} -m pip install --user {gpumon.DISTRIBUTION}`) or use dool"
            )
        out.append(msg + ".")
    return out


def warnings_for(p: Probe) -> list[str]:
    if p.psutil_error:
        return [
            f"note: psutil does not import under {p.python} ({p.psutil_error}); the --gpu "
            "plugin does not need it, but gpumon's host sampling would not work there "
            "(its compiled part must match that Python's ABI)."
        ]
    return []


# --- the commands --------------------------------------------------------------------------


def run_install(args: argparse.Namespace) -> int:
    target, dest = _target(args)
    dirs = site_dirs()
    text = render_plugin(target, dirs)
    program = find_program(target, args.program)
    notes: list[str] = []
    check: Probe | None = None
    with tempfile.TemporaryDirectory(prefix="gpumon-dstat-") as tmp:
        candidate = Path(tmp) / target.filename
        candidate.write_text(text, encoding="utf-8")
        if program is None:
            notes.append(
                f"note: {target.program} is not on PATH, so the plugin was not checked "
                + (
                    "(apt-get install dstat)."
                    if target.program == "dstat"
                    else "(pip install dool)."
                )
            )
        else:
            if _is_pcp_dstat(program):
                raise GpumonError(
                    f"{program} is pcp-dstat (Performance Co-Pilot's dstat), which reads ini "
                    "plugins, not Python: `gpumon deploy DIR` writes its plugin "
                    "DIR/pcp/dstat/gpumon, fed by gpumon serve through DIR/pcp/gpumon.url "
                    "(see docs/dstat.md)."
                )
            python = interpreter_of(resolve_program(program))
            # The check starts another Python that imports gpumon: seconds on a busy
            # machine, so say what is happening before it.
            print(
                f"Checking that {target.program}'s Python ({python[0]}) can load the plugin...",
                flush=True,
            )
            check = probe(python, candidate, target.program)
            found = problems(target, program, check)
            if found and not args.force:
                raise GpumonError(" ".join(found) + " Nothing was installed.")
            notes += [f"warning: {m}" for m in found] + warnings_for(check)
        _write(dest, text, args)
    for note in notes:
        print(note, file=sys.stderr)
    print(f"Installed {dest}.")
    if check is not None:
        ver = ".".join(str(v) for v in check.version[:3])
        print(f"{target.program} runs Python {ver} ({check.python}); it finds gpumon in:")
        for d in dirs:
            print(f"  {d}")
    print(f"Try: {target.program} -c -d --gpu     (-f for one band per GPU)")
    if target.program == "dstat" and args.dir and dest.parent.name != "plugins":
        print(
            "note: dstat finds plugins only in ~/.dstat/, <the dstat command's folder>/plugins/, "
            "/usr/share/dstat/ and /usr/local/share/dstat/."
        )
    return 0


def _is_pcp_dstat(program: Path) -> bool:
    real = program.resolve()
    if "pcp" in real.name:
        return True
    try:
        head = real.read_bytes()[:4096]
    except OSError:
        return False
    return b"pcp" in head.split(b"\n", 1)[0] or b"from pcp import" in head


def _write(dest: Path, text: str, args: argparse.Namespace) -> None:
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        # Whole, through an exclusive temporary file (a failed write leaves none behind).
        replace_whole(dest, text.encode("utf-8"), mode=0o644)
    except OSError as exc:
        hint = (
            " (run it with sudo, or install for yourself without --system)" if args.system else ""
        )
        raise GpumonError(f"cannot write {dest}: {exc.strerror or exc}{hint}.") from None


def run_uninstall(args: argparse.Namespace) -> int:
    _, dest = _target(args)
    if not dest.exists():
        print(f"Nothing to remove: {dest} does not exist.")
        return 0
    try:
        ours = MARKER in dest.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise GpumonError(f"cannot read {dest}: {exc.strerror or exc}.") from None
    if not ours:
        raise GpumonError(f"{dest} was not installed by gpumon; left in place.")
    try:
        dest.unlink()
    except OSError as exc:
        raise GpumonError(f"cannot remove {dest}: {exc.strerror or exc}.") from None
    print(f"Removed {dest}.")
    return 0
