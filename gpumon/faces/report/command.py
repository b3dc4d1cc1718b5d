"""`gpumon report --prometheus URL --job ID`: one job across its nodes, from Prometheus.

The cluster already runs Prometheus, and every node's ``gpumon serve`` exports what its
detector keeps; this reads it back for one job (a Slurm job id, or a Kubernetes pod) and
gives the job's verdict with the same words ``gpumon analyze`` gives a trace, per node and
per GPU, with the straggler node no single node can see.

Exit status: 0 whatever the verdict; 1 when Prometheus cannot be reached, refuses the
credentials or cannot run a query; 2 for a bad option or HTTP configuration; 4 when no
series of the job are in the range (no such job, or none of its nodes runs gpumon).
Series missing for part of the job are said on stderr (``gpumon: warning:``) and in the
report, and the rest is judged.

A Slurm job's report can be kept (``--keep``, as the epilog runs it) past Prometheus'
retention; ``--job ID`` then reads the kept report first and says where it came from
(``kept.py``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import time
from typing import TYPE_CHECKING

from gpumon.errors import GpumonError, UsageError
from gpumon.faces.report.kept import (
    DEFAULT_STORE,
    STORE_ENV,
    FileStore,
    Kept,
    SlurmComment,
    default_store,
    keep,
    kept_since,
    read_kept,
    valid_job_id,
)
from gpumon.terminal import printable

if TYPE_CHECKING:
    from gpumon.faces.report.client import PrometheusClient

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
# The most rows --top shows (each shown job is judged: three queries).
MAX_TOP = 1000
# What --top ranks (ranking.LIST_KEY names each one's JSON list).
BY = ("job", "user", "namespace", "cause")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
DEFAULT_LAST = "24h"
# The times a report can be about, and say as dates: from 1970 (Unix time 0) to the end
# of year 9999 (the last date Python writes).
EARLIEST_S = 0.0
LATEST_S = 253402300800.0
_RANGE = "from 1970-01-01 to 9999-12-31"


def parse_duration(text: str) -> float:
    """A Prometheus duration (``90s``, ``2h``, ``1h30m``, ``7d``) in seconds."""
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += int(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text or total <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 30m, 2h, 1h30m or 7d")
    return total


def parse_time(text: str, now: float | None = None) -> float:
    """A time as promtool takes it: RFC 3339 (``2026-05-01T12:00:00Z``; without a zone,
    local time), Unix seconds (``1714564800``, ``@1714564800``), or ``now``; or a duration
    before now as Prometheus users type them (``7d``, ``2m``, ``1h30m``)."""
    t = text.strip()
    if t == "now":
        return time.time() if now is None else now
    if _DURATION.match(t) and not t.isdigit():
        try:
            ago = parse_duration(t)
        except argparse.ArgumentTypeError:
            pass
        else:
            value = (time.time() if now is None else now) - ago
            if value < EARLIEST_S:
                raise argparse.ArgumentTypeError(f"{text!r} reaches back before 1970")
            return value
    try:
        value = float(t[1:] if t.startswith("@") else t)
    except ValueError:
        try:
            dt = datetime.datetime.fromisoformat(t)
            value = dt.timestamp() if dt.tzinfo else dt.astimezone().timestamp()
        except (ValueError, OverflowError, OSError):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a time (RFC 3339 such as 2026-05-01T12:00:00Z, Unix seconds, "
                "now, or a duration before now such as 7d)"
            ) from None
    if not EARLIEST_S <= value < LATEST_S:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time {_RANGE}")
    return value


def _pod(text: str) -> tuple[str, str]:
    ns, sep, name = text.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAMESPACE/NAME")
    return ns, name


def _top(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_TOP:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of rows from 1 to {MAX_TOP}")
    return n


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="judge one job across its nodes, or rank the fleet's jobs by GPU time lost, "
        "from the Prometheus that scrapes gpumon serve",
        description="Read back what every node's gpumon serve exported for one job (Slurm "
        "job id, Kubernetes pod, or KIND:NAME@INSTANCE) and say why its GPUs waited: the "
        "verdict and cause, per node and per GPU, the straggler node, lost GPU-seconds and "
        "advice.  With --top N: the fleet's jobs (or users, namespaces, causes) that lost "
        "the most GPU time in the range, each with its verdict, cause and advice.",
    )
    p.add_argument(
        "--prometheus",
        metavar="URL",
        default=os.environ.get("GPUMON_PROMETHEUS"),
        help="Prometheus' URL, e.g. http://prometheus:9090 (default: $GPUMON_PROMETHEUS)",
    )
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument(
        "--job",
        metavar="ID",
        help="the Slurm job id (label hpc_job), or KIND:NAME@INSTANCE for a job of a node "
        "without a scheduler (process:4242@node7:9977, as --top names it)",
    )
    who.add_argument(
        "--pod",
        metavar="NAMESPACE/NAME",
        type=_pod,
        help="a Kubernetes pod (labels namespace, pod)",
    )
    who.add_argument(
        "--top",
        metavar="N",
        type=_top,
        help="the N jobs (or --by users, namespaces, causes) that lost the most GPU time in "
        "the range, across the fleet",
    )
    p.add_argument(
        "--by",
        choices=BY,
        default="job",
        help="with --top: rank jobs (default), users (a digest short enough to mail), "
        "namespaces or causes",
    )
    when = p.add_mutually_exclusive_group()
    when.add_argument(
        "--last",
        metavar="DURATION",
        type=parse_duration,
        help=f"look for the job in the last DURATION (30m, 2h, 7d; default {DEFAULT_LAST})",
    )
    when.add_argument(
        "--since",
        metavar="TIME",
        type=parse_time,
        help="from TIME (RFC 3339, Unix seconds, or a duration before now: 7d, 2m)",
    )
    p.add_argument(
        "--until",
        metavar="TIME",
        type=parse_time,
        help="to TIME (RFC 3339, Unix seconds, or a duration before now; default: now)",
    )
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default=None,
        help="text (default) or one JSON object",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (--format json)")
    p.add_argument(
        "--http.config.file",
        dest="http_config",
        metavar="FILE",
        help="basic auth, bearer token and TLS for Prometheus, in Prometheus' http_config "
        "format (as promtool and amtool take it)",
    )
    p.add_argument(
        "--timeout",
        metavar="S",
        type=float,
        default=30.0,
        help="seconds to wait for each answer (default 30)",
    )
    p.add_argument(
        "--no-recording-rules",
        action="store_true",
        help="query the raw series only, even where gpumon-report-rules.yml is loaded",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep this report of a Slurm job (--job) for later, past Prometheus' retention: "
        "in the job's AdminComment where Slurm takes it (root, a comment empty or gpumon's), "
        "else in --store",
    )
    p.add_argument(
        "--store",
        metavar="DIR",
        default=None,
        help="folder of kept reports, one file per job, read before Prometheus (default "
        f"${STORE_ENV}, else {DEFAULT_STORE})",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="ask Prometheus even when a report of the job is kept",
    )
    p.set_defaults(func=run)


def _range(args: argparse.Namespace, now: float) -> tuple[float, float]:
    """The report's [since, until] from --last, --since and --until."""
    until = args.until if args.until is not None else now
    if args.since is not None:
        since = args.since
    else:
        since = until - (args.last if args.last is not None else parse_duration(DEFAULT_LAST))
    if since < EARLIEST_S:
        raise UsageError(f"--last reaches back before 1970: a report covers times {_RANGE}")
    if since >= until:
        raise UsageError("--since must be before --until")
    return since, until


def _client(args: argparse.Namespace) -> PrometheusClient:
    from gpumon.faces.report.client import PrometheusClient
    from gpumon.faces.report.httpconfig import HttpConfig, load

    if not args.prometheus:
        raise UsageError("gpumon report needs --prometheus URL (or $GPUMON_PROMETHEUS)")
    if not 0 < args.timeout <= 3600:
        raise UsageError(f"--timeout {args.timeout:g} is not between 0 and 3600 seconds")
    http = load(args.http_config) if args.http_config else HttpConfig()
    return PrometheusClient(args.prometheus, http, args.timeout)


def run(args: argparse.Namespace) -> int:
    from gpumon.engine import judge_job
    from gpumon.faces.common import finite_json
    from gpumon.faces.report.queries import JobQueries, JobSelector
    from gpumon.faces.report.render import missing_sentences, render_text, to_json

    if args.format is not None:
        args.json = args.json or args.format == "json"
    if args.by != "job" and args.top is None:
        raise UsageError("--by ranks --top N: give --top")
    if (args.keep or args.store) and args.top is not None:
        if args.keep:
            raise UsageError("--keep keeps one job's report: --job ID")
    elif (args.keep or args.store) and (args.job is None or not valid_job_id(args.job)):
        raise UsageError("--keep and --store are for a Slurm job: --job ID (digits, 123_4, 123+1)")
    store, slurm = FileStore(args.store or default_store()), SlurmComment()
    if args.top is not None:
        return run_top(args, store, slurm)
    if args.job is not None and not (args.fresh or args.keep) and valid_job_id(args.job):
        kept = read_kept(args.job, store, slurm)
        if kept is not None:
            return _print_kept(kept, args.json)
    client = _client(args)
    now = time.time()
    since, until = _range(args, now)
    if args.job is not None:
        sel = JobSelector.parse(args.job)
    else:
        sel = JobSelector(namespace=args.pod[0], pod=args.pod[1])
    fetched = JobQueries(client, sel, use_rules=not args.no_recording_rules).fetch(since, until)
    judged = judge_job(fetched.readings)
    cost = {"queries": client.requests, "bytes_received": client.bytes_received}
    report = finite_json(to_json(fetched, judged, client.url, cost))
    text = render_text(fetched, judged, client.url)
    if args.json:
        print(json.dumps(report, indent=2, allow_nan=False))
    else:
        print(printable(text, keep_newlines=True), end="")
    sys.stdout.flush()
    for m in missing_sentences(fetched):
        print(f"gpumon: warning: {m}", file=sys.stderr)
    if args.keep:
        assert isinstance(report, dict)
        made = Kept(args.job, now, client.url, text, report)
        try:
            where = keep(made, store, slurm)
        except OSError as exc:
            raise GpumonError(
                f"the report was not kept: {store.path(args.job)}: {exc.strerror or exc}"
            ) from None
        print(f"gpumon: kept the report of job {args.job} in {where}", file=sys.stderr)
    return 0


def run_top(args: argparse.Namespace, store: FileStore, slurm: SlurmComment) -> int:
    """`--top N`: the fleet's jobs (or users, namespaces, causes) by GPU time lost."""
    from gpumon.engine import judge_job
    from gpumon.faces.common import finite_json
    from gpumon.faces.report.client import JobNotFoundError
    from gpumon.faces.report.fleet import FleetQueries, readings
    from gpumon.faces.report.ranking import (
        Ranking,
        count,
        judged_from,
        judged_kept,
        rank,
        render_text,
        to_json,
    )

    client = _client(args)
    since, until = _range(args, time.time())
    fleet = FleetQueries(client, use_rules=not args.no_recording_rules)
    totals = fleet.totals(since, until)
    kept = kept_since(since, until, store, slurm)
    counted = count(totals, kept, since, until)
    if not counted:
        raise JobNotFoundError(
            f"Prometheus at {client.url} has no GPU time of any job between "
            f"{_stamp(since)} and {_stamp(until)} ({fleet.source}), and no report of one is "
            "kept: no job ran, or the nodes' gpumon serve exports no per-job time "
            "(gpumon_job_lost_gpu_seconds_total)"
        )
    rows = rank(counted, args.by)
    shown = rows[: args.top]
    if args.by != "cause":
        for e in shown:  # the job, or the group's worst job, judged
            c = e.worst
            if c.source == "kept" and c.kept is not None:
                e.judged = judged_kept(c.kept)
                continue
            nodes = fleet.nodes(c.totals.job, since, until)
            got = readings(nodes)
            if got:
                e.judged = judged_from(c.totals.job, judge_job(got), nodes, c.totals.lost)
    ranking = Ranking(
        args.by,
        since,
        until,
        client.url,
        shown,
        sum(c.totals.lost_s for c in counted),
        sum(c.totals.used_s for c in counted),
        len(counted),
        len(rows),
        fleet.source,
        sum(1 for c in counted if c.source == "kept"),
        {"queries": client.requests, "bytes_received": client.bytes_received},
    )
    if args.json:
        print(json.dumps(finite_json(to_json(ranking)), indent=2, allow_nan=False))
    else:
        print(printable(render_text(ranking), keep_newlines=True), end="")
    sys.stdout.flush()
    return 0


def _stamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def _print_kept(kept: Kept, as_json: bool) -> int:
    """The report as it was made, and where it was kept (Prometheus is not asked)."""
    made = datetime.datetime.fromtimestamp(kept.made_s).astimezone().strftime("%Y-%m-%d %H:%M")
    if as_json:
        doc = {**kept.report, "kept": {"where": kept.where, "made": kept.made_s}}
        print(json.dumps(doc, indent=2, allow_nan=False))
    else:
        print(printable(kept.text, keep_newlines=True), end="")
    sys.stdout.flush()
    print(
        f"gpumon: note: the report of job {kept.job} kept in {printable(kept.where)}, made "
        f"{made} from {printable(kept.prometheus)}; --fresh asks Prometheus again",
        file=sys.stderr,
    )
    return 0
