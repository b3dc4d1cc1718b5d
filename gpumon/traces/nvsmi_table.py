"""Repeated plain ``nvidia-smi`` tables (``nvidia-smi -l 1 > log``, a ``while`` loop, ...).

Both layouts are read: the pre-2023 one (``| GPU  Name        Persistence-M| Bus-Id ...``)
and the 535+ one (wider first column); the two GPU lines are the same in both::

    |   0  NVIDIA A100-SXM4-80GB          On  | 00000000:17:00.0 Off |                    0 |
    | N/A   34C    P0              61W / 400W |      4MiB / 81920MiB |      0%      Default |

Grep'd logs of the second lines alone are read too (GPUs by position within a tick, their
count from the repeating pattern of memory totals and power caps).  Times come from the
date line nvidia-smi prints above each table (``Wed May  1 12:00:00 2024``); without one,
tables are assumed 1 s apart and the header's ``extra`` says so.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable, Iterator
from itertools import chain

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, GpuSample, Point, Snapshot, TraceHeader
from gpumon.traces._common import (
    Assembler,
    Positional,
    bad_line,
    median_interval,
    mib_bytes,
    num,
    repeat_period,
)

FORMAT = "nvidia-smi-table"
PREFIX_LINES = 2000

# | N/A   34C    P0              61W / 400W |      4MiB / 81920MiB |      0%      Default |
_STATS_RE = re.compile(
    r"^\|\s*(?P<fan>\S+)\s+(?P<temp>\S+)\s+(?P<perf>P\d+|\S+)\s+(?P<pwr>\S+)\s*/\s*(?P<cap>\S+)\s*"
    r"\|\s*(?P<used>\S+)\s*/\s*(?P<total>\S+)\s*\|\s*(?P<util>\S+)\s+(?P<mode>\S+)\s*\|"
)
# |   0  NVIDIA A100-SXM4-80GB          On  | 00000000:17:00.0 Off |                    0 |
_ID_RE = re.compile(
    r"^\|\s*(?P<index>\d+)\s+(?P<name>.*?)\s+(?P<persist>On|Off|N/A)\s*\|\s*"
    r"(?P<bus>[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f])"
)
# Wed May  1 12:00:00 2024
_DATE_RE = re.compile(
    r"^\s*(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) "
    r"(?P<hms>\d{2}:\d{2}:\d{2}) (?P<year>\d{4})\s*$"
)
_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}
_DRIVER_RE = re.compile(r"Driver Version:\s*(\S+)")


def sniff(head: list[str]) -> bool:
    return any(_STATS_RE.match(ln) for ln in head[:400]) and not any(
        ln.startswith("# gpu") for ln in head[:5]
    )


def _date(m: re.Match[str]) -> float:
    h, mi, s = (int(x) for x in m.group("hms").split(":"))
    return float(
        calendar.timegm(
            (int(m.group("year")), _MONTHS[m.group("mon")], int(m.group("day")), h, mi, s, 0, 0, 0)
        )
    )


def _sample(
    gpu: int,
    t: float,
    util: float | None,
    points: tuple[Point, ...],
    stats: re.Match[str],
    ident: re.Match[str] | None,
) -> GpuSample:
    temp = num(stats.group("temp"))
    return GpuSample(
        t_s=t,
        gpu=gpu,
        uuid=ident.group("bus") if ident is not None else f"gpu{gpu}",
        util_samples=points,
        util_pct=util,
        mem_used_bytes=mib_bytes(num(stats.group("used"))),
        mem_total_bytes=mib_bytes(num(stats.group("total"))),
        power_watts=num(stats.group("pwr")),
        power_limit_watts=num(stats.group("cap")),
        temperature_c=temp,
        lost="ERR!" in stats.group(0) and stats.group("util").startswith("ERR"),
    )


def read(
    lines: Iterable[str], path: str = "<input>", warnings: list[str] | None = None
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse repeated nvidia-smi tables (or grep'd GPU rows): header now, snapshots lazily."""
    warns = warnings if warnings is not None else []
    numbered = enumerate(lines, 1)
    prefix: list[tuple[int, str]] = []
    dates: list[float] = []
    stats_keys: list[tuple[str, str, str]] = []
    identities: dict[int, GpuIdentity] = {}
    driver = None
    has_ids = False
    for no, line in numbered:
        prefix.append((no, line))
        if (m := _STATS_RE.match(line)) is not None:
            stats_keys.append((m.group("used"), m.group("total"), m.group("cap")))
        elif (d := _DATE_RE.match(line)) is not None:
            dates.append(_date(d))
        elif (i := _ID_RE.match(line)) is not None:
            has_ids = True
            gpu = int(i.group("index"))
            identities.setdefault(
                gpu,
                GpuIdentity(
                    index=gpu, uuid=i.group("bus"), name=i.group("name"), pci_bus_id=i.group("bus")
                ),
            )
        elif driver is None and (dv := _DRIVER_RE.search(line)) is not None:
            driver = dv.group(1)
        if len(prefix) >= PREFIX_LINES:
            break
    if not stats_keys:
        raise TraceFormatError(
            "no nvidia-smi GPU rows ('| N/A 34C P0 61W / 400W | ...') found", path=path
        )
    extra: dict[str, object] = {}
    n = 1
    if not has_ids:
        n = repeat_period([k for k in stats_keys]) or 1
        extra["gpus_inferred"] = (
            f"{n} (GPU rows without their first line: GPUs taken in order, their count from "
            "the repeating memory use, totals and power caps)"
        )
        identities = {g: GpuIdentity(index=g, uuid=f"gpu{g}") for g in range(n)}
    if len(dates) >= 2:
        interval = median_interval(dates) or 1.0
        extra["timestamps"] = "local time of the logging machine, read as UTC"
    else:
        interval = 1.0
        extra["interval_assumed"] = "no date lines: tables assumed 1 s apart"
    header = TraceHeader(
        version=1,
        source=FORMAT,
        started_wall_s=dates[0] if dates else None,
        started_mono_s=0.0,
        interval_s=interval,
        driver_version=driver,
        gpus=tuple(identities[g] for g in sorted(identities)),
        extra=extra,
    )
    use_dates = len(dates) >= 1
    return header, _snapshots(chain(prefix, numbered), n, has_ids, use_dates, header, path, warns)


def _snapshots(
    lines: Iterator[tuple[int, str]],
    n: int,
    has_ids: bool,
    use_dates: bool,
    header: TraceHeader,
    path: str,
    warns: list[str],
) -> Iterator[Snapshot]:
    interval = header.interval_s or 1.0
    t0 = header.started_wall_s or 0.0

    def build(
        gpu: int, t: float, util: float | None, points: tuple[Point, ...], payload: tuple
    ) -> GpuSample:
        stats, ident = payload[:2]
        return _sample(gpu, t, util, points, stats, ident)

    asm = Assembler(build, interval, path)
    positional = Positional(n, None)
    tick = -1
    t_table: float | None = None
    ident: re.Match[str] | None = None
    seen: set[int] = set()
    for no, line in lines:
        c = line[:1]
        if c == "|":
            m = _STATS_RE.match(line)
            if m is None:
                i = _ID_RE.match(line)
                if i is not None:
                    ident = i
                continue
            if has_ids:
                if ident is None:
                    raise bad_line(path, no, line, "GPU row without the line naming its GPU")
                gpu = int(ident.group("index"))
            else:
                gpu = positional.gpu(None)
            if gpu in seen or not seen:
                seen.clear()
                tick += 1
            seen.add(gpu)
            t = t_table - t0 if (use_dates and t_table is not None) else tick * interval
            try:
                util = num(m.group("util"))
            except ValueError:
                raise bad_line(path, no, line, "malformed GPU-Util") from None
            snap = asm.add(t, gpu, util, (m, ident, no, line))
            ident = None
            if snap is not None:
                yield snap
        elif c.isalpha():
            d = _DATE_RE.match(line)
            if d is not None:
                t_table = _date(d)
                seen.clear()
                positional.reset()
    snap = asm.flush()
    if snap is not None:
        yield snap
