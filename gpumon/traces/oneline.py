"""One-line monitors: a GPU's readings as ``key=value`` pairs after its label, a line
per tick or per GPU, other lines in between.

    [12:52:31] GPU2: util=100% mem=33769MiB free=11616MiB | GPU3: util=97% mem=33701MiB ...
    [2025-01-06 10:00:01] GPU0: Util=45%, Mem=1234/24576MB (5.0%), Temp=60°C
    2025-02-03 21:49:59,959 | GPU0: Util=0%, Mem=0.5% | GPU1: Util=0%, Mem=0.5%
    🚨 ALERT: GPU2 memory above 90%          <- not a reading: skipped, counted

A label is ``GPU`` and a number (``GPU2:``, ``GPU 2:``, ``GPU[2]:``); its pairs run to
the next label.  Keys mean what the same words mean in a table's header
(``columns.classify``): ``util``, ``mem`` (used, or ``used/total``, or a percent), ``free``,
``temp``, ``power``, ``clock``.  The text before the first label is the time (a date and
time, or a time of day rolling over at midnight); without one, ticks are ``--interval``
apart.  A GPU seen again, or a new time, starts the next tick.  Lines with no GPU label
(banners, alerts, the host's own line) are skipped and counted; a reading that is not a
number is counted and named, and read as none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import chain

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, GpuSample, Snapshot, TraceHeader
from gpumon.traces._common import (
    MIB,
    Tally,
    add_note,
    assume_interval,
    closed_items,
    is_no_reading,
    median_interval,
    mem_mib,
    num,
    split_number,
)
from gpumon.traces.columns import classify
from gpumon.traces.reader import Reader
from gpumon.traces.source import Source, numbered_lines
from gpumon.traces.timefmt import TimeParser, pick, rolling

FORMAT = "one-line"
PREFIX_LINES = 400
MAX_GPUS = 1024
_FRAME = " \t[]()<>|-:,"
_READ = frozenset(("util", "mem_used", "mem_free", "mem_total", "mem_pct", "temp", "power"))

Readings = dict[str, float | None]


def _labels(line: str) -> list[tuple[int, int, int]]:
    """Each GPU label in a line: (its start, where its pairs start, the GPU number)."""
    out = []
    low = line.lower()
    i = low.find("gpu")
    while i >= 0:
        j = i + 3
        if j < len(low) and low[j] in " [#":
            j += 1
        k = j
        while k < len(low) and low[k].isdigit() and k - j < 4:
            k += 1
        before = low[i - 1] if i else " "
        if k > j and k < len(low) and low[k] in ":]" and not before.isalnum():
            end = k + 1
            if low[k] == "]" and end < len(low) and low[end] == ":":
                end += 1
            out.append((i, end, int(low[j:k])))
        i = low.find("gpu", i + 3)
    return out


def _pairs(text: str) -> list[tuple[str, str]]:
    """``util=100% mem=22971/24576 MiB, temp=60°C`` -> its (key, value) pairs: a value
    runs to the word before the next ``key=``."""
    eqs = [i for i, c in enumerate(text) if c == "="]
    pairs = []
    starts = []
    for e in eqs:
        k = e
        while k > 0 and (text[k - 1].isalnum() or text[k - 1] in "_."):
            k -= 1
        starts.append(k)
    for n, e in enumerate(eqs):
        key = text[starts[n] : e]
        end = starts[n + 1] if n + 1 < len(eqs) else len(text)
        value = text[e + 1 : end].strip().rstrip(",;|").strip()
        if key and key[0].isalpha():
            pairs.append((key, value))
    return pairs


def _gpu_pairs(line: str) -> tuple[str, list[tuple[int, list[tuple[str, str]]]]]:
    """The text before the first label (a time), and each labelled GPU's pairs."""
    labels = _labels(line)
    if not labels:
        return line, []
    out = []
    for n, (_, begin, gpu) in enumerate(labels):
        end = labels[n + 1][0] if n + 1 < len(labels) else len(line)
        pairs = [(k, v) for k, v in _pairs(line[begin:end]) if _field(k) is not None]
        if pairs:
            out.append((gpu, pairs))
    return line[: labels[0][0]], out


_BARE_MEMORY = frozenset(("free", "used", "total", "avail", "available"))


def _field(key: str) -> str | None:
    """The field a key names (``free`` alone: the GPU's free memory)."""
    fld = classify("mem " + key if key.lower() in _BARE_MEMORY else key).field
    return fld if fld in _READ else None


def sniff(head: list[str]) -> bool:
    """At least two lines with a GPU label and a reading after it, one a utilisation."""
    found = 0
    util = False
    for ln in head[:200]:
        _, gpus = _gpu_pairs(ln[:4096])
        if gpus:
            found += 1
            util = util or any(_field(k) == "util" for _, pairs in gpus for k, _ in pairs)
    return found >= 2 and util


def _amount(fld: str, value: str) -> Readings:
    """A pair's reading(s): memory as ``used``, ``used/total`` (the unit after the total
    is the used's too) or a percent of the card; the rest a number with its unit."""
    if is_no_reading(value):
        return {fld: None}
    first, slash, rest = value.partition("/") if fld.startswith("mem") else (value, "", "")
    first = first.split("(", 1)[0].strip()
    rest = rest.split("(", 1)[0].strip()
    if fld in ("mem_used", "mem_pct") and first.endswith("%"):
        return {"mem_pct": num(first)}
    if fld in ("mem_used", "mem_free", "mem_total"):
        unit = ""
        if slash and rest:
            got = split_number(rest)
            unit = got[1] if got is not None else ""
        used = mem_mib(first + (unit if unit and first[-1:].isdigit() else ""))
        out: Readings = {fld: used}
        if slash and rest:
            out["mem_total"] = mem_mib(rest)
        return out
    return {fld: num(first)}


class _Ticks:
    """Lines to ticks: the GPUs' readings of one moment."""

    def __init__(self, path: str, parse: Callable[[str], float] | None):
        self.path = path
        self.parse = parse
        self.t: float | None = None
        self.line = 0
        self.gpus: dict[int, Readings] = {}
        self.not_readings = Tally("line(s) without GPU readings (banners, alerts): skipped")
        self.bad = Tally("reading(s) that are not a number: read as none")
        self.bad_times = Tally("line(s) whose time is not one: their readings skipped")

    def feed(self, no: int, line: str) -> tuple[float | None, dict[int, Readings]] | None:
        """Take one line; the tick it closed, if any."""
        before, gpus = _gpu_pairs(line.rstrip("\r\n"))
        if not gpus:
            if line.strip():
                self.not_readings.note(no, line.strip())
            return None
        t = None
        stamp = before.strip(_FRAME)
        if self.parse is not None and stamp:
            try:
                t = self.parse(stamp)
            except (ValueError, IndexError):
                self.bad_times.note(no, line.strip())
                return None
        done = None
        if (t is not None and t != self.t) or any(g in self.gpus for g, _ in gpus):
            done = self._start(t, no)
        elif not self.gpus:
            self.t, self.line = t, no
        for gpu, pairs in gpus:
            if gpu >= MAX_GPUS or (gpu not in self.gpus and len(self.gpus) >= MAX_GPUS):
                continue
            got = self.gpus.setdefault(gpu, {})
            for key, value in pairs:
                fld = _field(key)
                if fld is None or fld in got:
                    continue
                try:
                    got.update({k: v for k, v in _amount(fld, value).items() if k not in got})
                except ValueError:
                    self.bad.note(no, f"{key}={value}")
                    got[fld] = None
        return done

    def _start(self, t: float | None, no: int) -> tuple[float | None, dict[int, Readings]] | None:
        old = (self.t, self.gpus) if self.gpus else None
        self.t, self.line, self.gpus = t, no, {}
        return old

    def flush(self) -> tuple[float | None, dict[int, Readings]] | None:
        return self._start(None, 0)

    def say(self, warns: list[str]) -> None:
        for tally in (self.not_readings, self.bad, self.bad_times):
            tally.say(self.path, warns)


def _time_parser(prefix: list[tuple[int, str]]) -> TimeParser | None:
    stamps = [
        before.strip(_FRAME)
        for _, ln in prefix
        for before, gpus in (_gpu_pairs(ln.rstrip("\r\n")),)
        if gpus and before.strip(_FRAME)
    ]
    return pick(stamps[:64]) if stamps else None


def read(
    lines: Iterable[str] | Source,
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse a one-line monitor's log: the header now, the snapshots lazily."""
    warns, numbered = numbered_lines(lines, path, warnings)
    prefix: list[tuple[int, str]] = []
    for item in numbered:
        prefix.append(item)
        if len(prefix) >= PREFIX_LINES:
            break
    parser = _time_parser(prefix)

    def parse_fn() -> Callable[[str], float] | None:
        if parser is None:
            return None
        return rolling(parser.parse) if parser.time_of_day else parser.parse

    probe = _Ticks(path, parse_fn())
    ticks = list(closed_items(prefix, probe.feed, probe.flush))
    if not ticks:
        raise TraceFormatError("no GPU readings ('GPU0: util=97% ...') found", path=path)
    gpus = sorted({g for _, tick in ticks for g in tick})
    times = [t for t, _ in ticks if t is not None]
    extra: dict[str, object] = {}
    interval = median_interval(times) if times else None
    if not times:
        interval = assume_interval(extra, "no times: ticks", interval_s)
    elif parser is not None:
        extra["timestamps"] = parser.note or "local time of the logging machine, read as UTC"
    if probe.not_readings.count:
        add_note(
            extra,
            f"{probe.not_readings.count} of the first {len(prefix)} lines hold no GPU reading "
            "(banners, alerts): such lines are skipped",
        )
    header = TraceHeader(
        version=1,
        source=FORMAT,
        started_wall_s=times[0] if times and parser is not None and parser.absolute else None,
        started_mono_s=0.0,
        interval_s=interval or interval_s or 1.0,
        gpus=tuple(GpuIdentity(index=g, uuid=f"gpu{g}") for g in gpus),
        extra=extra,
    )
    t0 = times[0] if times else 0.0
    return header, _snapshots(chain(prefix, numbered), parse_fn(), header, t0, path, warns)


def _sample(gpu: int, t: float, f: Readings) -> GpuSample:
    used, total, free = f.get("mem_used"), f.get("mem_total"), f.get("mem_free")
    pct = f.get("mem_pct")
    if used is None and total is not None and free is not None:
        used = total - free
    if used is None and total is not None and pct is not None:
        used = total * pct / 100
    util = f.get("util")
    return GpuSample(
        t_s=t,
        gpu=gpu,
        uuid=f"gpu{gpu}",
        util_pct=util if util is None or 0.0 <= util <= 100.0 else None,
        mem_used_bytes=None if used is None else int(used * MIB),
        mem_total_bytes=None if total is None else int(total * MIB),
        power_watts=f.get("power"),
        temperature_c=f.get("temp"),
    )


def _snapshots(
    lines: Iterator[tuple[int, str]],
    parse: Callable[[str], float] | None,
    header: TraceHeader,
    t0: float,
    path: str,
    warns: list[str],
) -> Iterator[Snapshot]:
    ticks = _Ticks(path, parse)
    interval = header.interval_s or 1.0
    count = 0

    def snapshot(tick: tuple[float | None, dict[int, Readings]]) -> Snapshot:
        nonlocal count
        t_abs, gpus = tick
        t = round(t_abs - t0, 6) if t_abs is not None else count * interval
        count += 1
        return Snapshot(t, tuple(_sample(g, t, f) for g, f in sorted(gpus.items())))

    try:
        for tick in closed_items(lines, ticks.feed, ticks.flush):
            yield snapshot(tick)
    finally:
        ticks.say(warns)


READER = Reader(
    FORMAT,
    "one-line monitors ('[12:52:31] GPU2: util=100% mem=33769MiB | ...'), other lines between",
    sniff,
    read,
)
