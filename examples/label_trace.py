#!/usr/bin/env python3
"""Label a gpumon recording with the starvation lab's phases.

    python examples/label_trace.py lab-raw.jsonl lab-phases.jsonl -o lab.jsonl

The lab prints each phase's start and end with ``time.monotonic()``, the same clock the
samples of a gpumon trace recorded on the same machine use, so no clock matching is
needed: each phase becomes an event line ``{"t": start, "event": "phase", "phase": NAME,
"end": END}`` placed in time order among the ticks.  Ticks are copied unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from gpumon.traces.jsonl import TraceReader, TraceWriter


def read_phases(path: str) -> list[dict[str, Any]]:
    """(phase, start, end) from the lab's JSON lines; other lines (warnings) are skipped."""
    starts: dict[str, float] = {}
    phases = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            if obj.get("event") == "phase_start":
                starts[obj["phase"]] = obj["mono_s"]
            elif obj.get("event") == "phase_end" and obj["phase"] in starts:
                phases.append(
                    {"phase": obj["phase"], "start": starts.pop(obj["phase"]), "end": obj["mono_s"]}
                )
    return sorted(phases, key=lambda p: p["start"])


def label(trace_in: str, phases_in: str, trace_out: str) -> int:
    """Write the labelled trace; returns how many phases fell inside the recording."""
    reader = TraceReader(trace_in)
    phases = read_phases(phases_in)
    placed = 0
    with TraceWriter.open(trace_out, reader.header) as writer:
        first = last = None
        for snap in reader:
            if first is None:
                first = snap.t_s
            while phases and phases[0]["start"] <= snap.t_s:
                p = phases.pop(0)
                writer.write_event(p["start"], "phase", phase=p["phase"], end=p["end"])
                placed += p["end"] > first
            writer.write(snap)
            last = snap.t_s
        for p in phases:  # phases that started after the last tick: outside the recording
            print(
                f"label_trace: phase {p['phase']} starts after the recording's last tick "
                f"({p['start']:.1f} > {last}); skipped",
                file=sys.stderr,
            )
    return placed


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("trace", help="the gpumon trace recorded while the lab ran")
    p.add_argument("phases", help="the lab's JSON lines (its stdout or --phase-log file)")
    p.add_argument("-o", "--output", required=True, help="the labelled trace to write")
    args = p.parse_args(argv)
    n = label(args.trace, args.phases, args.output)
    print(f"label_trace: {n} phases labelled in {args.output}", file=sys.stderr)
    return 0 if n else 1


if __name__ == "__main__":
    raise SystemExit(main())
