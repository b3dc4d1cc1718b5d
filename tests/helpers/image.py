"""Build gpumon's container image where no image registry can be reached (the test suite).

The Containerfile starts FROM debian:bookworm-slim.  Here that base is made from Debian's
own packages: ``debootstrap --variant=minbase bookworm`` from the mirror apt already uses,
imported into buildah and tagged with the name FROM asks for; the build then never pulls.
buildah keeps its storage under a cache folder (default /var/tmp/gpumon-image-cache, or
$GPUMON_IMAGE_CACHE), so the base and the unchanged layers are made once per machine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
CONTAINERFILE = REPO / "Containerfile"
BASE = "docker.io/library/debian:bookworm-slim"
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# dpkg's filter in Debian's slim images: what a container has no use for.
SLIM_DPKG = """\
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
"""
# What a wheel build of gpumon needs from the checkout.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "gpumon", "dstat_plugins", "deploy")


def copy_sources(dest: Path) -> Path:
    """What a build of gpumon reads, copied, so no build output lands in the checkout."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        p = REPO / name
        if p.is_dir():
            shutil.copytree(p, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(p, dest / name)
    return dest


def commit_sources(src: Path) -> str | None:
    """Make a copy of the sources a git checkout of one commit, as a clone is (a wheel
    built from it then knows its commit); the commit, or None where git is not installed."""
    git = shutil.which("git")
    if git is None:
        return None
    as_tests = [git, "-C", str(src), "-c", "user.name=gpumon tests", "-c", "user.email=t@invalid"]
    as_tests += ["-c", "commit.gpgsign=false"]
    run([git, "-C", str(src), "init", "--quiet"])
    run([*as_tests, "add", "--all"])
    # A fixed date: the same sources make the same commit (and the image cache holds).
    dated = dict(os.environ, GIT_AUTHOR_DATE=FIXED_DATE, GIT_COMMITTER_DATE=FIXED_DATE)
    run([*as_tests, "commit", "--quiet", "--no-verify", "--message", "under test"], env=dated)
    return run([git, "-C", str(src), "rev-parse", "HEAD"]).strip()


# The date a reproducible build gives its files (SOURCE_DATE_EPOCH, which the wheel
# builder honours): the same sources then make the same wheel, byte for byte.
FIXED_DATE = "2024-01-01T00:00:00Z"
FIXED_EPOCH = "1704067200"


def build_distribution(kind: str, src: Path, out: Path, *, reproducible: bool = False) -> Path:
    """A wheel or sdist by the PEP 517 hook pip would call, offline (installed setuptools);
    ``reproducible``: dated SOURCE_DATE_EPOCH, so unchanged sources give the same bytes."""
    code = f"from setuptools import build_meta as b; print(b.build_{kind}({str(out)!r}))"
    env = dict(os.environ, SOURCE_DATE_EPOCH=FIXED_EPOCH) if reproducible else None
    return out / run([sys.executable, "-c", code], cwd=src, env=env).strip().splitlines()[-1]


def cache_dir() -> Path:
    return Path(os.environ.get("GPUMON_IMAGE_CACHE", "/var/tmp/gpumon-image-cache"))


class BuildError(RuntimeError):
    """A step of the build failed; the message carries its command and output."""


def run(cmd: list[str], *, timeout: float = 900, **kw: object) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    if res.returncode != 0:
        tail = (res.stdout + res.stderr)[-6000:]
        raise BuildError(f"{' '.join(map(str, cmd))} failed ({res.returncode}):\n{tail}")
    return res.stdout


def debian_mirrors(sources_dir: Path = Path("/etc/apt")) -> tuple[str, str | None]:
    """(the Debian mirror, the security mirror or None) that this machine's apt uses."""
    text = ""
    for p in [sources_dir / "sources.list", *sorted((sources_dir / "sources.list.d").glob("*"))]:
        if p.is_file():
            text += p.read_text(errors="replace") + "\n"
    main = security = None
    # deb822 stanzas (URIs:/Suites:) and one-line entries (deb URI SUITE ...).
    for uri, suites in re.findall(r"^URIs:\s*(\S+)\s*\n(?:.*\n)*?Suites:\s*(.+)$", text, re.M):
        main, security = _pick(uri, suites.split(), main, security)
    for uri, suite in re.findall(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", text, re.M):
        main, security = _pick(uri, [suite], main, security)
    return main or DEFAULT_MIRROR, security


def _pick(
    uri: str, suites: list[str], main: str | None, sec: str | None
) -> tuple[str | None, str | None]:
    if f"{SUITE}-security" in suites and sec is None:
        sec = uri
    elif SUITE in suites and main is None:
        main = uri
    return main, sec


@dataclass
class Builder:
    """buildah with its own storage under ``cache``; timings of what it did."""

    cache: Path = field(default_factory=cache_dir)
    timings: dict[str, float] = field(default_factory=dict)
    revision: str | None = None  # the commit the last wheelhouse's gpumon was built from

    def buildah(self, *args: str, timeout: float = 1800) -> str:
        cmd = [
            "buildah",
            "--root", str(self.cache / "storage"),
            "--runroot", str(self.cache / "run"),
            "--storage-driver", "vfs",
            *args,
        ]  # fmt: skip
        return run(cmd, timeout=timeout)

    def has_image(self, name: str) -> bool:
        return bool(self.buildah("images", "--quiet", "--filter", f"reference={name}").strip())

    def _timed(self, what: str, t0: float) -> None:
        self.timings[what] = round(time.monotonic() - t0, 1)

    def ensure_base(self) -> None:
        """The FROM image, debootstrapped once into this builder's storage."""
        if self.has_image(BASE):
            return
        t0 = time.monotonic()
        mirror, security = debian_mirrors()
        rootfs = self.cache / "rootfs.tmp"
        shutil.rmtree(rootfs, ignore_errors=True)
        rootfs.parent.mkdir(parents=True, exist_ok=True)
        run(["debootstrap", "--variant=minbase", SUITE, str(rootfs), mirror], timeout=1800)
        (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
        stanza = "Types: deb\nURIs: {}\nSuites: {}\nComponents: main\nSigned-By: {}\n"
        sources = stanza.format(mirror, f"{SUITE} {SUITE}-updates", KEYRING)
        if security:
            sources += "\n" + stanza.format(security, f"{SUITE}-security", KEYRING)
        (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(sources)
        # As the slim image: no documentation, manual pages or translations (now or in
        # packages installed later), no package lists or caches.
        (rootfs / "etc/dpkg/dpkg.cfg.d/slim").write_text(SLIM_DPKG)
        for top in ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale"):
            for p in (rootfs / top).rglob("*"):
                if (p.is_file() or p.is_symlink()) and p.name != "copyright":
                    p.unlink()
        for junk in ("var/lib/apt/lists", "var/cache/apt", "var/cache/apt/archives"):
            for p in (rootfs / junk).glob("*"):
                if p.is_file():
                    p.unlink()
        self._timed("debootstrap", t0)
        t0 = time.monotonic()
        ctr = self.buildah("from", "scratch").strip()
        try:
            self.buildah("copy", "--quiet", ctr, f"{rootfs}/", "/")
            self.buildah(
                "config",
                "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--cmd", "bash",
                ctr,
            )  # fmt: skip
            self.buildah("commit", "--quiet", ctr, BASE)
        finally:
            self.buildah("rm", ctr)
        shutil.rmtree(rootfs, ignore_errors=True)
        self._timed("import", t0)

    def wheelhouse(self, dest: Path) -> Path:
        """gpumon's wheel from a copy of the checkout, and its dependencies' wheels."""
        t0 = time.monotonic()
        src = dest.parent / "src"
        shutil.rmtree(src, ignore_errors=True)
        copy_sources(src)
        self.revision = commit_sources(src)  # built from a clone, as a user builds it
        dest.mkdir(parents=True, exist_ok=True)
        # The same bytes for the same sources: the image's venv layer is cached by them.
        wheel = build_distribution("wheel", src, dest, reproducible=True)
        # The dependencies as the image's Python (CPython 3.11, glibc) takes them.
        run(
            [
                sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
                "--dest", str(dest), f"gpumon-why[kubernetes] @ {wheel.as_uri()}",
            ],
        )  # fmt: skip
        shutil.rmtree(src, ignore_errors=True)
        self._timed("wheelhouse", t0)
        return dest

    def build(self, tag: str, context: Path) -> None:
        """The Containerfile, as a user builds it, with the wheelhouse in ``context``."""
        self.ensure_base()
        t0 = time.monotonic()
        self.buildah(
            "bud", "--isolation", "chroot", "--pull=never", "--layers", "--quiet",
            "-f", str(CONTAINERFILE), "-t", tag, str(context),
        )  # fmt: skip
        self._timed("build", t0)

    def size_mb(self, tag: str) -> float:
        """The image's size as buildah reports it (uncompressed, decimal MB)."""
        text = self.buildah("images", "--format", "{{.Size}}", tag).strip()
        number, unit = text.splitlines()[0].split()
        return float(number) * {"kB": 1e-3, "MB": 1.0, "GB": 1e3}[unit]
