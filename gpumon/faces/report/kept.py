"""Job reports kept past Prometheus' retention: a Slurm job's report, read back months later.

Prometheus keeps a job's series for weeks; a user asks why a job's GPUs waited long after.
As jobstats keeps its summary in Slurm's AdminComment, ``gpumon report --job ID --keep``
(which the Slurm epilog runs) keeps the report it made: in the job's AdminComment where
``scontrol update`` accepts it (root or a Slurm operator, and a comment that is empty or
gpumon's own: another tool's is never overwritten), else as a file per job in a folder
(``--store``, shared between nodes where users should read it).  ``gpumon report --job ID``
reads the folder first, then the AdminComment (``sacct``), and only then Prometheus.

What is kept is the report itself, as text and as JSON, with where and when it was made:
what a user reads later is what the epilog appended to the job's output.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import os
import re
import shutil
import subprocess
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumon.files import REPORT_LIMIT, read_bounded, replace_whole

FORMAT = "gpumon-report"
VERSION = 1
# The AdminComment's prefix, as jobstats' "JS1:": whose comment it is, and which encoding.
COMMENT_PREFIX = "GPUMON1:"
STORE_ENV = "GPUMON_REPORT_STORE"
DEFAULT_STORE = "/var/lib/gpumon/reports"
# Slurm job ids: 81423, an array task 81423_7, a heterogeneous component 81423+1.
_JOB_ID = re.compile(r"^[0-9]+(?:[_+][0-9]+)?$")
# Beyond this an AdminComment is not asked to carry it (slurmdbd keeps it whole, but a
# report of hundreds of GPUs is better as a file).
MAX_COMMENT_CHARS = 60_000
# How long scontrol and sacct may take before the kept copy is given up on.
SLURM_TIMEOUT_S = 20.0
# The most kept reports one ranking reads (a site's week is thousands of jobs).
MAX_KEPT_READ = 100_000


@dataclass(frozen=True, slots=True)
class Kept:
    """One job's report as it was made, and where it is kept."""

    job: str
    made_s: float  # Unix time the report was made
    prometheus: str  # the Prometheus it was read from
    text: str  # the report as `gpumon report` printed it
    report: dict[str, Any]  # the report as `gpumon report --json` printed it
    where: str = ""  # where it was read from or written to

    def to_record(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "job": self.job,
            "made": self.made_s,
            "prometheus": self.prometheus,
            "text": self.text,
            "report": self.report,
        }


def valid_job_id(job: str) -> bool:
    return bool(_JOB_ID.match(job))


def from_record(obj: object, where: str) -> Kept | None:
    """A kept report from its JSON object, or None if it is not one this gpumon reads."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or obj.get("version") != VERSION:
        return None
    job, made, prom = obj.get("job"), obj.get("made"), obj.get("prometheus")
    text, report = obj.get("text"), obj.get("report")
    if not (isinstance(job, str) and isinstance(made, int | float) and isinstance(prom, str)):
        return None
    if not (isinstance(text, str) and isinstance(report, dict)):
        return None
    return Kept(job, float(made), prom, text, report, where)


def encode_comment(kept: Kept) -> str:
    """The AdminComment: the prefix, then the record, zlib-compressed, in base64."""
    data = json.dumps(kept.to_record(), separators=(",", ":")).encode()
    return COMMENT_PREFIX + base64.b64encode(zlib.compress(data, 9)).decode("ascii")


def decode_comment(comment: str, where: str) -> Kept | None:
    """The kept report in an AdminComment, or None (another tool's comment, or damaged)."""
    comment = comment.strip()
    if not comment.startswith(COMMENT_PREFIX):
        return None
    try:
        data = zlib.decompress(base64.b64decode(comment[len(COMMENT_PREFIX) :], validate=True))
        return from_record(json.loads(data), where)
    except (binascii.Error, zlib.error, ValueError):
        return None


class FileStore:
    """One file per job, ``JOB.json``, in a folder (written whole: never half a file)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)

    def path(self, job: str) -> Path:
        return self.folder / f"{job}.json"

    def read(self, job: str) -> Kept | None:
        path = self.path(job)
        try:
            obj = json.loads(read_bounded(path, REPORT_LIMIT))
        except (OSError, ValueError, RecursionError):
            return None
        kept = from_record(obj, str(path))
        return kept if kept is not None and kept.job == job else None

    def recent(self, since: float) -> Iterator[Kept]:
        """The reports kept since ``since`` (Unix seconds): those of jobs that ended
        then or after (a report is kept when its job ends), at most MAX_KEPT_READ."""
        try:
            entries = list(os.scandir(self.folder))
        except OSError:
            return
        read = 0
        for entry in sorted(entries, key=lambda e: e.name):
            job = entry.name.removesuffix(".json")
            if not entry.name.endswith(".json") or not valid_job_id(job):
                continue
            try:
                if entry.stat(follow_symlinks=False).st_mtime < since:
                    continue
            except OSError:
                continue
            kept = self.read(job)
            if kept is not None:
                yield kept
            read += 1
            if read >= MAX_KEPT_READ:
                return

    def write(self, kept: Kept) -> str:
        """Write the job's file; OSError when the folder cannot be made or written."""
        target = self.path(kept.job)
        self.folder.mkdir(parents=True, exist_ok=True)
        data = json.dumps(kept.to_record(), separators=(",", ":")).encode() + b"\n"
        # 0644: a report is the job's user's to read, like its output.
        replace_whole(target, data, mode=0o644)
        return str(target)


class SlurmComment:
    """The job's AdminComment, through Slurm's own commands (absent: nothing kept there)."""

    def __init__(self, scontrol: str = "scontrol", sacct: str = "sacct") -> None:
        self.scontrol = scontrol
        self.sacct = sacct

    def _run(self, *cmd: str) -> str | None:
        if shutil.which(cmd[0]) is None:
            return None
        try:
            res = subprocess.run(
                cmd, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return res.stdout if res.returncode == 0 else None

    def current(self, job: str) -> str | None:
        """The job's AdminComment as slurmctld has it ("" when empty), None if unknown."""
        out = self._run(self.scontrol, "-o", "show", "job", job)
        if out is None:
            return None
        m = re.search(r"(?:^|\s)AdminComment=(\S*)", out)
        return "" if m is None or m.group(1) == "(null)" else m.group(1)

    def read(self, job: str) -> Kept | None:
        where = f"Slurm's AdminComment of job {job}"
        out = self._run(self.sacct, "-n", "-X", "-P", "-j", job, "-o", "AdminComment")
        for line in (out or "").splitlines():
            kept = decode_comment(line, where)
            if kept is not None and kept.job == job:
                return kept
        now = self.current(job)  # a job slurmctld still holds, without accounting
        kept = decode_comment(now, where) if now else None
        return kept if kept is not None and kept.job == job else None

    def recent(self, since: float, until: float) -> Iterator[Kept]:
        """The reports kept in the AdminComments of the jobs that ran in [since, until]
        (``sacct -a``: every user's, as root or a Slurm operator)."""
        out = self._run(
            self.sacct, "-a", "-X", "-n", "-P", "-S", _slurm_time(since), "-E",
            _slurm_time(until), "-o", "JobIDRaw,AdminComment",
        )  # fmt: skip
        for line in (out or "").splitlines()[:MAX_KEPT_READ]:
            comment = line.rpartition("|")[2]
            if comment.startswith(COMMENT_PREFIX):
                kept = decode_comment(comment, "Slurm's AdminComment")
                if kept is not None:
                    yield Kept(
                        kept.job, kept.made_s, kept.prometheus, kept.text, kept.report,
                        f"Slurm's AdminComment of job {kept.job}",
                    )  # fmt: skip

    def write(self, kept: Kept) -> str | None:
        """Keep it in the AdminComment if Slurm takes it there; where, or None."""
        comment = encode_comment(kept)
        now = self.current(kept.job)
        if now is None or len(comment) > MAX_COMMENT_CHARS:
            return None
        if now and not now.startswith(COMMENT_PREFIX):
            return None  # another tool's (jobstats' JS1:, an admin's note): never ours to replace
        done = self._run(self.scontrol, "update", f"JobId={kept.job}", f"AdminComment={comment}")
        return None if done is None else f"Slurm's AdminComment of job {kept.job}"


def _slurm_time(t: float) -> str:
    """A time as sacct takes it (local time, to the second)."""
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")


def kept_since(since: float, until: float, store: FileStore, slurm: SlurmComment) -> list[Kept]:
    """The reports kept of jobs that ran in [since, until], each job once (the folder's
    copy first, as ``read_kept`` reads it)."""
    out: dict[str, Kept] = {}
    for kept in (*store.recent(since), *slurm.recent(since, until)):
        out.setdefault(kept.job, kept)
    return list(out.values())


def default_store() -> str:
    return os.environ.get(STORE_ENV) or DEFAULT_STORE


def read_kept(job: str, store: FileStore, slurm: SlurmComment) -> Kept | None:
    """The job's kept report: the folder first (a file is cheap to read), then Slurm."""
    return store.read(job) or slurm.read(job)


def keep(kept: Kept, store: FileStore, slurm: SlurmComment) -> str:
    """Keep the report: in the AdminComment where Slurm takes it, else in the folder.
    Where it went; OSError when neither could keep it."""
    return slurm.write(kept) or store.write(kept)
