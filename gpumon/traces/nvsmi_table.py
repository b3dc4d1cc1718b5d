"""Repeated plain ``nvidia-smi`` tables (``nvidia-smi -l 1 > log``, a ``while`` loop, ...).

Both layouts are read: the pre-2023 one (``| GPU  Name        Persistence-M| Bus-Id ...``)
and the 535+ one (wider first column); the two GPU lines are the same in both::

    |   0  NVIDIA A100-SXM4-80GB          On  | 00000000:17:00.0 Off |                    0 |
    | N/A   34C    P0              61W / 400W |      4MiB / 81920MiB |      0%      Default |

Grep'd logs of the second lines alone are read too (GPUs by position within a tick, their
count from the repeating pattern of memory totals, power caps and memory use).  Times come
from the date line nvidia-smi prints above each table (``Wed May  1 12:00:00 2024``);
without one, tables are ``--interval`` apart (1 s unless said) and the header says so.

Rows are split on ``|`` and whitespace, never matched with a regular expression: a crafted
line costs time in proportion to its length.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, GpuSample, Point, Snapshot, TraceHeader
from gpumon.traces import identity as ident
from gpumon.traces._common import (
    Assembler,
    add_note,
    bad_line,
    median_interval,
    mem_mib,
    mib_bytes,
    num,
)
from gpumon.traces.reader import Reader
from gpumon.traces.source import Source, numbered_lines
from gpumon.traces.timefmt import ctime_words

FORMAT = "nvidia-smi-table"
PREFIX_LINES = 2000

_PERSISTENCE = ("On", "Off", "N/A", "WDDM", "TCC")

# (fan, temp, perf, power, cap, used, total, util, mode)
Stats = tuple[str, str, str, str, str, str, str, str, str]
# (index, name, bus)
Ident = tuple[int, str, str]


def parse_stats(line: str) -> Stats | None:
    """``| N/A 34C P0 61W / 400W | 4MiB / 81920MiB | 0% Default |`` -> its fields."""
    if not line.startswith("|") or line.count("|") < 4:
        return None
    parts = line.split("|", 4)
    a = parts[1].split()
    if len(a) < 4:
        return None
    b = parts[2].split("/")
    c = parts[3].split()
    if len(b) != 2 or len(c) < 2:
        return None
    if "/" in a:
        slash = a.index("/")
        if slash < 3 or slash + 1 >= len(a):
            return None
        fan, temp, perf, pwr, cap = a[0], a[1], a[2], " ".join(a[3:slash]), " ".join(a[slash + 1 :])
    else:
        if len(a) != 5 or "/" not in a[3] + a[4]:
            return None
        fan, temp, perf = a[0], a[1], a[2]
        pwr, cap = (a[3] + a[4]).split("/", 1)
    used, total = b[0].strip(), b[1].strip()
    if not (used.endswith(("MiB", "N/A")) and total.endswith(("MiB", "N/A"))):
        return None
    util = c[0]
    if not (util.endswith("%") or util in ("N/A", "ERR!")):
        return None
    return fan, temp, perf, pwr, cap, used, total, util, c[1]


def parse_ident(line: str) -> Ident | None:
    """``|   0  NVIDIA A100-SXM4-80GB   On  | 00000000:17:00.0 Off |`` -> index, name, bus."""
    if not line.startswith("|") or line.count("|") < 3:
        return None
    parts = line.split("|", 3)
    a = parts[1].split()
    b = parts[2].split()
    if (
        len(a) < 3
        or not (a[0].isdecimal() and len(a[0]) <= 4)
        or a[-1] not in _PERSISTENCE
        or not b
    ):
        return None
    bus = b[0]
    pieces = bus.split(":")
    if len(pieces) != 3 or "." not in pieces[2] or not all(p for p in pieces):
        return None
    try:
        int(pieces[0], 16)
        int(pieces[1], 16)
        int(pieces[2].replace(".", ""), 16)
    except ValueError:
        return None
    return int(a[0]), " ".join(a[1:-1]), bus


def parse_date(line: str) -> float | None:
    """``Wed May  1 12:00:00 2024`` -> Unix seconds (read as UTC)."""
    return ctime_words(line.split())


def _driver(line: str) -> str | None:
    at = line.find("Driver Version:")
    if at < 0:
        return None
    rest = line[at + 15 :].split()
    return rest[0] if rest else None


def sniff(head: list[str]) -> bool:
    return any(parse_stats(ln) for ln in head[:400]) and not any(
        ln.startswith("# gpu") for ln in head[:5]
    )


def _sample(
    gpu: int,
    t: float,
    util: float | None,
    points: tuple[Point, ...],
    stats: Stats,
    ident_: Ident | None,
) -> GpuSample:
    return GpuSample(
        t_s=t,
        gpu=gpu,
        uuid=ident_[2] if ident_ is not None else f"gpu{gpu}",
        util_samples=points,
        util_pct=util,
        mem_used_bytes=mib_bytes(mem_mib(stats[5])),
        mem_total_bytes=mib_bytes(mem_mib(stats[6])),
        power_watts=num(stats[3]),
        power_limit_watts=num(stats[4]),
        temperature_c=num(stats[1]),
        lost=stats[7].startswith("ERR") and "ERR!" in stats[:5],
    )


def _fingerprint(stats: Stats) -> ident.Fingerprint:
    def val(cell: str) -> float | None:
        try:
            return num(cell)
        except ValueError:
            return None

    return (
        None,
        val(stats[6]),
        val(stats[4]),
        val(stats[5]),
        val(stats[1]),
        val(stats[3]),
        val(stats[7]),
    )


def read(
    lines: Iterable[str] | Source,
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse repeated nvidia-smi tables (or grep'd GPU rows): header now, snapshots lazily."""
    warns, numbered = numbered_lines(lines, path, warnings)
    prefix: list[tuple[int, str]] = []
    dates: list[float] = []
    fps: list[ident.Fingerprint] = []
    identities: dict[int, GpuIdentity] = {}
    driver = None
    has_ids = False
    for no, line in numbered:
        prefix.append((no, line))
        if (st := parse_stats(line)) is not None:
            fps.append(_fingerprint(st))
        elif (d := parse_date(line)) is not None:
            dates.append(d)
        elif (i := parse_ident(line)) is not None:
            has_ids = True
            gpu = i[0]
            identities.setdefault(
                gpu, GpuIdentity(index=gpu, uuid=i[2], name=i[1] or None, pci_bus_id=i[2])
            )
        elif driver is None:
            driver = _driver(line)
        if len(prefix) >= PREFIX_LINES:
            break
    if not fps:
        raise TraceFormatError(
            "no nvidia-smi GPU rows ('| N/A 34C P0 61W / 400W | ...') found", path=path
        )
    extra: dict[str, object] = {}
    n = 1
    if not has_ids:
        period, by = ident.cycle_period(fps)
        n = period if period else 1
        how = (
            f"each GPU's {ident.FP_LABELS[by]} recurs every {n} rows"
            if period and period > 1
            else "no repeating pattern"
        )
        extra["gpus_inferred"] = (
            f"{n} (GPU rows without their first line: GPUs taken in order, their count from "
            f"the repeating memory use, totals and power caps; {how})"
        )
        identities = {g: GpuIdentity(index=g, uuid=f"gpu{g}") for g in range(n)}
    if len(dates) >= 2:
        interval = median_interval(dates) or 1.0
        extra["timestamps"] = "local time of the logging machine, read as UTC"
    else:
        interval = interval_s or 1.0
        extra["interval_assumed"] = f"no date lines: tables assumed {interval:g} s apart"
        if not interval_s:
            add_note(extra, "say how far apart the tables are with --interval")
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
    return header, _snapshots(chain(prefix, numbered), n, has_ids, bool(dates), header, path, warns)


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
        stats, ident_ = payload[:2]
        return _sample(gpu, t, util, points, stats, ident_)

    asm = Assembler(build, interval, path)
    pos = -1
    tick = -1
    t_table: float | None = None
    current: Ident | None = None
    seen: set[int] = set()
    for no, line in lines:
        c = line[:1]
        if c == "|":
            st = parse_stats(line)
            if st is None:
                i = parse_ident(line)
                if i is not None:
                    current = i
                continue
            if has_ids:
                if current is None:
                    raise bad_line(path, no, line, "GPU row without the line naming its GPU")
                gpu = current[0]
            else:
                pos = (pos + 1) % n
                gpu = pos
            if gpu in seen or not seen:
                seen.clear()
                tick += 1
            seen.add(gpu)
            t = t_table - t0 if (use_dates and t_table is not None) else tick * interval
            try:
                util = num(st[7])
            except ValueError:
                raise bad_line(path, no, line, f"malformed GPU-Util {st[7]!r}") from None
            snap = asm.add(t, gpu, util, (st, current, no, line))
            current = None
            if snap is not None:
                yield snap
        elif c.isalpha():
            d = parse_date(line)
            if d is not None:
                t_table = d
                seen.clear()
                pos = -1
    snap = asm.flush()
    if snap is not None:
        yield snap


READER = Reader(
    FORMAT, "plain nvidia-smi tables ('| N/A 34C P0 61W / 400W | ...' rows)", sniff, read
)
