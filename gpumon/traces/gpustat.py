"""gpustat's text output, logged (``gpustat -i 1 > log``, ``watch gpustat``, a loop)::

    compute3                          Mon Dec 19 18:33:32 2022  465.19.01
    [0] NVIDIA GeForce RTX 2070 SUPER | 60'C,  68 % |  3712 /  7982 MB | root(3709M)

Every variant gpustat prints: temperature as ``'C`` or ``°C``; fan speed before the
utilisation (``80°C,  16 %,  76 %``); encoder/decoder ``(E: 88 %  D: 67 %)``; power
``125 / 250 W`` (``??`` for no reading); process lines under a GPU; colour codes.  The
header line (hostname, date, driver) starts each snapshot and gives its time; without it
(``--no-header``) a GPU index seen again starts one, ``--interval`` apart (1 s unless said).
Split on ``|`` and ``,``: no regular expressions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, GpuSample, Point, Snapshot, TraceHeader
from gpumon.traces._common import (
    Assembler,
    bad_line,
    cut_short_warning,
    median_interval,
    mem_mib,
    mib_bytes,
    num,
)
from gpumon.traces.reader import Reader
from gpumon.traces.source import Source, numbered_lines
from gpumon.traces.timefmt import ctime_words

FORMAT = "gpustat"
PREFIX_LINES = 400
# (index, name, temp, fan, util, power, power_limit, used, total) as cells
Row = tuple[int, str, str, str | None, str, str | None, str | None, str, str]


def strip_ansi(line: str) -> str:
    """Drop terminal colour codes (``ESC [ ... letter``) and shift-in characters, linearly."""
    if "\x1b" not in line and "\x0f" not in line:
        return line
    out = []
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == "\x1b":
            i += 1
            if i < n and line[i] in "[(":
                i += 1
                while i < n and not line[i].isalpha():
                    i += 1
            i += 1
            continue
        if c != "\x0f":
            out.append(c)
        i += 1
    return "".join(out)


def parse_row(line: str) -> Row | None:
    """One GPU line of gpustat, or None when the line is not one."""
    s = line.strip()
    if not s.startswith("[") or s.count("|") < 2:
        return None
    close = s.find("]")
    if close < 2 or close > 5 or not s[1:close].isdecimal():
        return None
    parts = s.split("|")
    name = parts[0][close + 1 :].strip()
    stats = [p.strip() for p in parts[1].split(",")]
    if not stats or not stats[0].rstrip().endswith(("'C", "°C", "C")):
        return None
    temp = stats[0].removesuffix("°C").removesuffix("'C").strip()
    pct: list[str] = []
    power = limit = None
    for item in stats[1:]:
        cut = item.find("(")
        if cut >= 0:
            item = item[:cut].strip()  # (E: .. %  D: .. %)
        if item.endswith("W") and "/" in item:
            a, _, b = item[:-1].partition("/")
            power, limit = a.strip(), b.strip()
        elif item.endswith("%"):
            pct.append(item[:-1].strip())
    if not pct:
        return None
    fan, util = (pct[0], pct[1]) if len(pct) >= 2 else (None, pct[0])
    mem = parts[2].strip()
    if not mem.endswith("MB") or "/" not in mem:
        return None
    used, _, total = mem[:-2].partition("/")
    return int(s[1:close]), name, temp, fan, util, power, limit, used.strip(), total.strip()


def parse_header(line: str) -> tuple[str | None, float, str | None] | None:
    """``host  Mon Dec 19 18:33:32 2022  465.19.01`` -> (hostname, Unix time, driver)."""
    toks = line.split()
    for k in range(min(len(toks) - 4, 4)):
        t = ctime_words(toks[k : k + 5])
        if t is not None:
            host = toks[0] if k > 0 else None
            driver = toks[k + 5] if len(toks) > k + 5 else None
            return host, t, driver
    return None


def sniff(head: list[str]) -> bool:
    return any(parse_row(strip_ansi(ln)) is not None for ln in head[:200])


def _watch_interval(line: str) -> float | None:
    """``Every 1.0s: gpustat`` (watch's title line) -> 1.0."""
    s = line.strip()
    if not s.startswith("Every "):
        return None
    word = s[6:].split(":", 1)[0].strip()
    try:
        return float(word.rstrip("s"))
    except ValueError:
        return None


def read(
    lines: Iterable[str] | Source,
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse logged gpustat output: the header now, the snapshots lazily."""
    warns, numbered = numbered_lines(lines, path, warnings)
    prefix: list[tuple[int, str]] = []
    times: list[float] = []
    identities: dict[int, GpuIdentity] = {}
    host = driver = None
    watch = None
    for no, line in numbered:
        prefix.append((no, line))
        text = strip_ansi(line)
        row = parse_row(text)
        if row is not None:
            identities.setdefault(
                row[0], GpuIdentity(index=row[0], uuid=f"gpu{row[0]}", name=row[1] or None)
            )
            continue
        h = parse_header(text)
        if h is not None:
            host, t, driver = h[0] or host, h[1], h[2] or driver
            times.append(t)
        elif watch is None:
            watch = _watch_interval(text)
        if len(prefix) >= PREFIX_LINES:
            break
    if not identities:
        raise TraceFormatError(
            "no gpustat GPU lines ('[0] NAME | 45'C, 30 % | ...') found", path=path
        )
    extra: dict[str, object] = {}
    if len(times) >= 2:
        interval = median_interval(times) or 1.0
        extra["timestamps"] = "local time of the logging machine, read as UTC (1 s resolution)"
    else:
        interval = interval_s or watch or 1.0
        why = "watch's interval" if (watch and not interval_s) else f"{interval:g} s apart"
        extra["interval_assumed"] = (
            f"no gpustat header lines with times: snapshots assumed {interval:g} s apart ({why})"
            if watch and not interval_s
            else f"no gpustat header lines with times: snapshots assumed {why}"
            + ("" if interval_s else " (say otherwise with --interval)")
        )
    header = TraceHeader(
        version=1,
        source=FORMAT,
        hostname=host,
        started_wall_s=times[0] if times else None,
        started_mono_s=0.0,
        interval_s=interval,
        driver_version=driver,
        gpus=tuple(identities[g] for g in sorted(identities)),
        extra=extra,
    )
    return header, _snapshots(chain(prefix, numbered), header, bool(times), path, warns)


def _build(
    gpu: int, t: float, util: float | None, points: tuple[Point, ...], payload: tuple
) -> GpuSample:
    row: Row = payload[0]
    return GpuSample(
        t_s=t,
        gpu=gpu,
        uuid=f"gpu{gpu}",
        util_samples=points,
        util_pct=util,
        mem_used_bytes=mib_bytes(mem_mib(row[7])),
        mem_total_bytes=mib_bytes(mem_mib(row[8])),
        power_watts=None if row[5] is None else num(row[5]),
        power_limit_watts=None if row[6] is None else num(row[6]),
        temperature_c=num(row[2]),
    )


def _snapshots(
    lines: Iterator[tuple[int, str]],
    header: TraceHeader,
    timed: bool,
    path: str,
    warns: list[str],
) -> Iterator[Snapshot]:
    interval = header.interval_s or 1.0
    t0 = header.started_wall_s or 0.0
    asm = Assembler(_build, interval, path)
    tick = -1
    t_snap: float | None = None
    seen: set[int] = set()
    early = False
    for no, line in lines:
        text = strip_ansi(line)
        if "[" in text[:4]:
            row = parse_row(text)
            if row is None:
                if text.strip().startswith("[") and "|" in text and not line.endswith("\n"):
                    warns.append(cut_short_warning(path, no))
                    break
                continue
            gpu = row[0]
            if gpu in seen or not seen:
                seen.clear()
                tick += 1
            seen.add(gpu)
            if timed and t_snap is None:
                if not early:
                    warns.append(f"{path}:{no}: GPU lines before the first header line; skipped")
                early = True
                continue
            t = round(t_snap - t0, 6) if t_snap is not None else round(tick * interval, 6)
            try:
                util = num(row[4])
            except ValueError as exc:
                if not line.endswith("\n"):
                    warns.append(cut_short_warning(path, no))
                    break
                raise bad_line(path, no, line, f"malformed value ({exc})") from None
            snap = asm.add(t, gpu, util, (row, no, line))
            if snap is not None:
                yield snap
            continue
        h = parse_header(text) if timed else None
        if h is not None:
            t_snap = h[1]
            seen.clear()
    snap = asm.flush()
    if snap is not None:
        yield snap


READER = Reader(
    FORMAT, "gpustat text ('[0] NVIDIA ... | 45'C,  30 % | 7564 / 7982 MB | ...')", sniff, read
)
