"""`gpumon analyze FILE`: why the GPUs waited, from a recorded trace or an existing log.

Reads gpumon traces and the logs people already have (nvidia-smi CSV / dmon / tables /
-q reports, gpustat, W&B, dcgmi, Prometheus exports, other monitors' JSON lines, long
tables, one-line monitors, key-value blocks, home-made CSV) by content (``--format``
overrides; ``--columns`` names a headerless table's columns), from a file or stdin
(``-``), streams them through the detector and prints the report.  What a reader had to
assume (GPU count, interval) is printed as ``gpumon: note:``.

Exit status: 0 whatever the verdict.  A FILE that does not exist or is a folder is a
usage error (status 2).  A file no reader recognises, or malformed before any valid tick,
is an error (the message names the line; status 2); an empty or binary one is said so.
A malformed line *after* valid data -- a log cut short, a line mangled mid-file -- still
gets the report of the valid part on stdout, then the error on stderr and status 2: the
user sees what could be analysed, and a script sees that the file was not read to the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpumon.errors import GpumonError, TraceFormatError
from gpumon.faces.analyze.notalog import check_exists, why_not_a_log
from gpumon.faces.common import (
    HANG_AFTER_MAX_S,
    HANG_AFTER_MIN_S,
    finite_json,
    hang_after_arg,
    settings_in,
)
from gpumon.model import Snapshot
from gpumon.terminal import printable
from gpumon.traces.sniff import FORMATS, open_trace

if TYPE_CHECKING:
    from gpumon.engine import DetectorConfig

# Assumptions a reader had to make (header ``extra``) that change how to read the report;
# ``notes`` is a list of further sentences.
_NOTES = {"interval_assumed": "", "gpus_inferred": "GPUs: ", "util_scale": "", "date": ""}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze",
        help="say why the GPUs waited, from a gpumon trace or an nvidia-smi log",
        description="Analyse a gpumon trace or a log you already have: nvidia-smi "
        "--query-gpu CSV, nvidia-smi dmon, repeated nvidia-smi tables, nvidia-smi -q reports, "
        "gpustat (text or --json), W&B system metrics (wandb-events.jsonl or a CSV export), "
        "dcgmi dmon, a Prometheus query_range JSON export, other monitors' JSON lines, long "
        "tables (one row per GPU, time and field), one-line monitors ('GPU0: util=97% ...'), "
        "'Key: value' blocks, or a CSV/TSV with GPU columns (UTF-8/UTF-16, gzip). The format "
        "is detected from the content; --columns names the columns of a table without a "
        "header.",
    )
    p.add_argument("file", metavar="FILE", help="trace or log to analyse ('-': stdin)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument(
        "--format",
        choices=("auto", *FORMATS),
        default="auto",
        help="the file's format (default: detect it from the content)",
    )
    p.add_argument(
        "--interval",
        type=_seconds,
        metavar="S",
        help="seconds between rows for logs that carry no times (dmon without -o T, dcgmi, "
        "gpustat --no-header, a CSV without a time column); default 1",
    )
    p.add_argument(
        "--columns",
        type=_column_names,
        metavar="NAMES",
        help="name the columns of a table without a header line, in order, in nvidia-smi's "
        "query names (as given to --query-gpu): e.g. "
        "timestamp,index,utilization.gpu,memory.used,memory.total",
    )
    p.add_argument(
        "--hang-after",
        type=hang_after_arg,
        metavar="S",
        help="seconds every GPU may spin in a collective with none computing before the run "
        "is called a hang (default: what a gpumon recording names, as watch --hang-after "
        f"set it, else the detector's, 300 s; {HANG_AFTER_MIN_S:g} to {HANG_AFTER_MAX_S:g})",
    )
    p.set_defaults(func=run)


def _column_names(text: str) -> list[str]:
    """``timestamp, index,utilization.gpu`` -> its names; every column named."""
    names = [n.strip() for n in text.split(",")]
    if len(names) < 2 or not all(names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: name every column, comma-separated (e.g. "
            "timestamp,index,utilization.gpu,memory.used)"
        )
    return names


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (0.001 <= value <= 86400):
        raise argparse.ArgumentTypeError(f"{text} s is not an interval between 1 ms and a day")
    return value


def _config(recorded: dict[str, float], hang_after: float | None) -> DetectorConfig | None:
    """analyze's detector, with the settings the recording names (watch's --window,
    --hang-after: the story it told) and --hang-after over them; None: the defaults."""
    from gpumon.engine import OFFLINE_CONFIG

    if not recorded and hang_after is None:
        return None
    base = OFFLINE_CONFIG
    return dataclasses.replace(
        base,
        window_s=recorded.get("window_s", base.window_s),
        hang_after_s=recorded.get(
            "hang_after_s", base.hang_after_s if hang_after is None else hang_after
        ),
    )


def _said(settings: dict[str, float]) -> str:
    words = {"window_s": "window {:g} s", "hang_after_s": "hang after {:g} s"}
    return ", ".join(words[k].format(v) for k, v in settings.items())


class _UntilError:
    """Yields snapshots until the reader fails, keeping the error for after the report."""

    def __init__(self, snapshots: Iterator[Snapshot], path: str):
        self._snapshots = snapshots
        self._path = path
        self.count = 0
        self.error: GpumonError | None = None

    def __iter__(self) -> Iterator[Snapshot]:
        try:
            for snap in self._snapshots:
                self.count += 1
                yield snap
        except GpumonError as exc:
            self.error = exc
        except (OSError, EOFError) as exc:  # a gzip stream cut short, a disk error
            self.error = TraceFormatError(f"cannot read further ({exc})", path=self._path)


def run(args: argparse.Namespace) -> int:
    from gpumon.engine import analyze
    from gpumon.faces.analyze.report import render_text, to_json

    check_exists(args.file)
    try:
        opened = open_trace(
            args.file,
            args.format,
            getattr(args, "interval", None),
            getattr(args, "columns", None),
        )
    except TraceFormatError:
        why = why_not_a_log(args.file)
        if why is None:
            raise
        raise TraceFormatError(why) from None
    with opened as trace:
        recorded, ignored = settings_in(trace.header.extra)
        hang_after = getattr(args, "hang_after", None)
        if hang_after is not None:  # the command line's over the recording's
            recorded.pop("hang_after_s", None)
        config = _config(recorded, hang_after)
        guarded = _UntilError(iter(trace), trace.path)
        result = analyze(trace.header, iter(guarded), config)
        if result.bad_tick is not None:
            t, what = result.bad_tick
            guarded.error = TraceFormatError(
                f"malformed values in the tick at t={t} ({what})",
                path=trace.path,
                line=trace.line_of_last(),
            )
            guarded.count = result.ticks
    if guarded.error is not None and guarded.count == 0:
        raise guarded.error
    if args.json:
        # Written as it is encoded: a day's report is megabytes, never one string in memory.
        json.dump(finite_json(to_json(result)), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(printable(render_text(result), keep_newlines=True))
    sys.stdout.flush()
    for warning in trace.warnings:
        print(f"gpumon: warning: {warning}", file=sys.stderr)
    for what in ignored:
        print(f"gpumon: warning: the recording's detector setting {what}: ignored", file=sys.stderr)
    if recorded:
        print(
            f"gpumon: note: judged with the recording's settings: {_said(recorded)}",
            file=sys.stderr,
        )
    if guarded.count == 0 and guarded.error is None:
        print(f"gpumon: warning: {trace.path}: no samples in this file", file=sys.stderr)
    extra = trace.header.extra
    for key, label in _NOTES.items():
        if key in extra:
            print(f"gpumon: note: {label}{extra[key]}", file=sys.stderr)
    notes = extra.get("notes")
    for note in notes if isinstance(notes, list) else ():
        print(f"gpumon: note: {note}", file=sys.stderr)
    if guarded.error is not None:
        print(
            f"gpumon: {guarded.error} (the report above covers the {guarded.count} ticks "
            "before it)",
            file=sys.stderr,
        )
        return guarded.error.exit_status
    return 0
