"""Score `gpumon analyze` on GPU logs other people published, against what a person says
each run was (issue 35: "the public logs you collect yourselves are scored").

The logs are not in this repository (they are other people's files): a manifest lists
each one's source (repository, path, commit, how many of its first lines were taken), the
label a person gave it from the author's own evidence *before* gpumon read it, the GPU
count, and the evidence.  benchmarks/README.md lists the sources so anyone can fetch them.

    python benchmarks/score_public_logs.py /path/to/publiclogs/manifest.toml

Manifest, one table per log (the file beside the manifest):

    [logs."some_gpu_usage.csv"]
    repo = "owner/name"
    path = "gpu_usage.csv"
    commit = "0123..."
    lines = 81               # the first 81 lines of the file; "all" for the whole file
    label = "starved"        # healthy | starved | sync_stall | idle | unknown
    gpus = 1
    evidence = "what the author's log and repository show"
    columns = "timestamp,..."  # optional: --columns for a headerless log

A log counts as right when gpumon reads it (exit 0, or 2 after a report) and its verdict
and GPU count are the label's.  Prints one row per log and the totals; exits 0 (a score,
not a test).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

VERDICTS = ("healthy", "starved", "sync_stall", "idle", "unknown")


@dataclass
class Outcome:
    name: str
    label: str
    gpus: int
    verdict: str  # gpumon's, or "refused" when it read nothing
    got_gpus: int | None
    why: str  # the first line of gpumon's error, when refused

    @property
    def verdict_right(self) -> bool:
        return self.verdict == self.label

    @property
    def gpus_right(self) -> bool:
        return self.got_gpus == self.gpus

    @property
    def right(self) -> bool:
        return self.verdict_right and self.gpus_right


def analyze(path: Path, columns: str | None) -> tuple[dict | None, str]:
    """gpumon's JSON report of one log (None when it read nothing) and its stderr."""
    cmd = [sys.executable, "-m", "gpumon", "analyze", "--json", str(path)]
    if columns:
        cmd += ["--columns", columns]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if not proc.stdout.strip():
        return None, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def score(manifest: Path) -> list[Outcome]:
    entries = tomllib.loads(manifest.read_text(encoding="utf-8"))["logs"]
    out = []
    for name, entry in sorted(entries.items()):
        label = entry["label"]
        if label not in VERDICTS:
            raise SystemExit(f"{name}: label {label!r} is not one of {', '.join(VERDICTS)}")
        doc, err = analyze(manifest.parent / name, entry.get("columns"))
        if doc is None:
            first = next((ln for ln in err.splitlines() if ln.strip()), "")
            out.append(Outcome(name, label, entry["gpus"], "refused", None, first[:160]))
        else:
            out.append(Outcome(name, label, entry["gpus"], doc["verdict"], len(doc["gpus"]), ""))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("manifest", type=Path, help="manifest.toml beside the logs")
    args = ap.parse_args()
    outcomes = score(args.manifest)
    width = max(len(o.name) for o in outcomes)
    print(f"{'log':<{width}}  {'label':<10} {'gpumon':<10} gpus     right")
    for o in outcomes:
        gpus = f"{o.got_gpus if o.got_gpus is not None else '-'}/{o.gpus}"
        mark = "yes" if o.right else "NO"
        print(f"{o.name:<{width}}  {o.label:<10} {o.verdict:<10} {gpus:<8} {mark}")
        if o.why:
            print(f"{'':<{width}}  refused: {o.why}")
    n = len(outcomes)
    print()
    print(f"verdict right: {sum(o.verdict_right for o in outcomes)}/{n}")
    print(f"GPU count right: {sum(o.gpus_right for o in outcomes)}/{n}")
    print(f"both right: {sum(o.right for o in outcomes)}/{n}")
    print(f"read (not refused): {sum(o.verdict != 'refused' for o in outcomes)}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
