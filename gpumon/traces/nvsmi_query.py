"""``nvidia-smi -q`` output: one report, or many (``nvidia-smi -q -l 1``, ``-q -d
UTILIZATION,MEMORY,POWER`` in a loop).

    ==============NVSMI LOG==============

    Timestamp                                 : Wed Apr 30 17:22:38 2025
    Driver Version                            : 570.124.06
    Attached GPUs                             : 2
    GPU 00000000:3B:00.0
        Product Name                          : NVIDIA A100-PCIE-40GB
        GPU UUID                              : GPU-...
        Minor Number                          : 1
        FB Memory Usage
            Total                             : 40960 MiB
            Used                              : 30111 MiB
        Utilization
            Gpu                               : 97 %
        GPU Power Readings
            Power Draw                        : 287.40 W
            Current Power Limit               : 300.00 W

Each report is one tick at its ``Timestamp`` (without one, reports are ``--interval``
apart).  GPUs are known by their bus id (the ``GPU 0000...`` line) and numbered in the
order nvidia-smi lists them, which is its own index order; their minor numbers (the
``/dev/nvidiaN`` of each) need not follow it and are not the index.  Fields are read by
their section and name, whatever the driver calls them (``Gpu`` or ``GPU``, ``Power
Readings`` or ``GPU Power Readings``, ``Power Draw`` or ``Average``/``Instantaneous Power
Draw``); a field gpumon reads whose value is not a reading is counted and named.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, GpuSample, Snapshot, TraceHeader
from gpumon.traces._common import (
    MIB,
    Tally,
    add_note,
    assume_interval,
    closed_items,
    median_interval,
    num,
    read_ahead,
)
from gpumon.traces.reader import Reader
from gpumon.traces.source import Source, numbered_lines
from gpumon.traces.timefmt import ctime_words, line_time

FORMAT = "nvidia-smi-q"
BANNER = "NVSMI LOG"
PREFIX_LINES = 4000  # lines read ahead for the GPUs and the interval (a report is ~200)
MAX_GPUS = 1024

# (section, field name) -> (field, preference: lower wins within one report), lower-cased.
FIELDS: dict[tuple[str, str], tuple[str, int]] = {
    ("", "product name"): ("name", 0),
    ("", "gpu uuid"): ("uuid", 0),
    ("fb memory usage", "used"): ("mem_used", 0),
    ("fb memory usage", "total"): ("mem_total", 0),
    ("fb memory usage", "free"): ("mem_free", 0),
    ("utilization", "gpu"): ("util", 0),
    ("utilization", "memory"): ("mem_util", 0),
    ("temperature", "gpu current temp"): ("temp", 0),
    ("temperature", "gpu"): ("temp", 1),
    ("power readings", "power draw"): ("power", 0),
    ("gpu power readings", "power draw"): ("power", 0),
    ("gpu power readings", "average power draw"): ("power", 1),
    ("gpu power readings", "instantaneous power draw"): ("power", 2),
    ("power readings", "enforced power limit"): ("power_limit", 0),
    ("gpu power readings", "current power limit"): ("power_limit", 0),
    ("power readings", "power limit"): ("power_limit", 1),
    ("gpu ceiling power limit", "current power limit"): ("power_limit", 0),  # 610+ drivers
    ("gpu power readings", "power limit"): ("power_limit", 1),
    ("clocks", "sm"): ("sm_clock", 0),
}
_TEXT_FIELDS = frozenset(("name", "uuid"))


def _is_gpu_line(line: str) -> str | None:
    """The bus id of a ``GPU 00000000:3B:00.0`` line, else None."""
    s = line.rstrip()
    if not s.startswith("GPU ") or s[:1].isspace():
        return None
    bus = s[4:].strip()
    return bus if bus.count(":") == 2 and "." in bus and " " not in bus else None


def sniff(head: list[str]) -> bool:
    """The ``NVSMI LOG`` banner, or a ``GPU <bus id>`` line followed by indented fields."""
    for i, ln in enumerate(head[:400]):
        if BANNER in ln and ln.strip().startswith("="):
            return True
        if _is_gpu_line(ln) is not None:
            nxt = next((x for x in head[i + 1 : i + 4] if x.strip()), "")
            return nxt.startswith("    ") and ":" in nxt
    return False


@dataclass
class _Gpu:
    bus: str
    fields: dict[str, float | str | None] = field(default_factory=dict)
    prefs: dict[str, int] = field(default_factory=dict)


@dataclass
class _Report:
    line: int
    t: float | None = None
    gpus: list[_Gpu] = field(default_factory=list)


class _Parser:
    """Lines to reports: the section each field is in, by indentation."""

    def __init__(self, path: str):
        self.path = path
        self.report: _Report | None = None
        self.gpu: _Gpu | None = None
        self.sections: list[tuple[int, str]] = []
        self.bad = Tally("field(s) gpumon reads whose value is not a reading: read as none")
        self.stray = Tally("line(s) outside any report (banners, other output): skipped")

    def feed(self, no: int, line: str) -> _Report | None:
        """Take one line; the report it closed, if any."""
        text = line.rstrip("\r\n")
        s = text.strip()
        if not s:
            return None
        if BANNER in s and s.startswith("="):
            return self._start(no)
        indent = len(text) - len(text.lstrip(" "))
        if indent == 0:
            return self._top(no, s)
        if self.gpu is None:
            return None  # a report's own indented lines (none gpumon reads)
        while self.sections and self.sections[-1][0] >= indent:
            self.sections.pop()
        key, sep, value = s.partition(":")
        if not sep:
            self.sections.append((indent, s.lower()))
            return None
        section = self.sections[-1][1] if self.sections else ""
        self._field(no, s, section, key.strip().lower(), value.strip())
        return None

    def _top(self, no: int, s: str) -> _Report | None:
        """A line at the left margin: a report's time, a GPU, or a report field."""
        bus = _is_gpu_line(s)
        if bus is not None:
            if self.report is None:
                self._start(no)
            assert self.report is not None
            if len(self.report.gpus) < MAX_GPUS:
                self.gpu = _Gpu(bus)
                self.report.gpus.append(self.gpu)
            self.sections = []
            return None
        key, sep, value = s.partition(":")
        if sep and key.strip().lower() == "timestamp":
            closed = None
            if self.report is None or self.report.t is not None or self.report.gpus:
                closed = self._start(no)
            assert self.report is not None
            self.report.t = _time(value.strip())
            return closed
        if not sep:
            self.stray.note(no, s)
        self.gpu = None if not sep else self.gpu
        return None

    def _field(self, no: int, text: str, section: str, key: str, value: str) -> None:
        spec = FIELDS.get((section, key))
        if spec is None or self.gpu is None:
            return
        fld, pref = spec
        gpu = self.gpu
        if pref > gpu.prefs.get(fld, 99):
            return
        if fld in _TEXT_FIELDS:
            got: float | str | None = value if value and value.upper() != "N/A" else None
        else:
            try:
                got = num(value)
            except ValueError:
                self.bad.note(no, text)
                got = None
        if got is None and fld in gpu.fields:
            return  # a lesser-preferred field with no reading keeps the one already read
        gpu.fields[fld] = got
        gpu.prefs[fld] = pref

    def _start(self, no: int) -> _Report | None:
        old = self.report
        self.report = _Report(line=no)
        self.gpu = None
        self.sections = []
        return old if old is not None and old.gpus else None

    def flush(self) -> _Report | None:
        old, self.report = self.report, None
        return old if old is not None and old.gpus else None


def _time(value: str) -> float | None:
    """A report's ``Timestamp`` (``Wed Apr 30 17:22:38 2025``, or ISO from a wrapper)."""
    words = value.split()
    got = ctime_words([w for w in words if w not in ("UTC", "GMT")])
    return got if got is not None else line_time(value)


def read(
    lines: Iterable[str] | Source,
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse ``nvidia-smi -q`` reports: the header now, the snapshots lazily."""
    warns, numbered = numbered_lines(lines, path, warnings)
    probe = _Parser(path)
    prefix, reports = read_ahead(numbered, probe.feed, probe.flush, PREFIX_LINES)
    if not reports:
        raise TraceFormatError("no GPU in the nvidia-smi -q output ('GPU 0000...')", path=path)
    order: dict[str, int] = {}
    firsts: dict[str, _Gpu] = {}
    for r in reports:
        for g in r.gpus:
            if g.bus not in order:
                order[g.bus] = len(order)
                firsts[g.bus] = g
    times = [r.t for r in reports if r.t is not None]
    extra: dict[str, object] = {}
    interval = median_interval(times) if len(times) > 1 else None
    if not times:
        interval = assume_interval(extra, "no Timestamp lines: reports", interval_s)
    else:
        extra["timestamps"] = "local time of the logging machine, read as UTC"
    if len(reports) == 1:
        add_note(extra, "one nvidia-smi -q report: a single moment, not a run")
    if not any("util" in g.fields for g in firsts.values()):
        warns.append(
            f"{path}: no Utilization section (nvidia-smi -q -d without UTILIZATION?); the "
            "GPUs' activity cannot be judged"
        )
    gpus = tuple(_identity(order[bus], g) for bus, g in firsts.items())
    header = TraceHeader(
        version=1,
        source=FORMAT,
        started_wall_s=times[0] if times else None,
        started_mono_s=0.0,
        interval_s=interval or interval_s or 1.0,
        gpus=gpus,
        extra=extra,
    )
    t0 = times[0] if times else 0.0
    return header, _snapshots(chain(prefix, numbered), order, header, t0, path, warns)


def _identity(index: int, g: _Gpu) -> GpuIdentity:
    f = g.fields
    name, uuid, total, limit = (
        f.get("name"),
        f.get("uuid"),
        f.get("mem_total"),
        f.get("power_limit"),
    )
    return GpuIdentity(
        index=index,
        uuid=uuid if isinstance(uuid, str) else g.bus,
        name=name if isinstance(name, str) else None,
        pci_bus_id=g.bus,
        mem_total_bytes=int(total * MIB) if isinstance(total, float) else None,
        power_limit_watts=limit if isinstance(limit, float) else None,
    )


def _reading(f: dict[str, float | str | None], key: str) -> float | None:
    v = f.get(key)
    return v if isinstance(v, float) else None


def _sample(index: int, t: float, g: _Gpu) -> GpuSample:
    f = g.fields
    used, total, free = _reading(f, "mem_used"), _reading(f, "mem_total"), _reading(f, "mem_free")
    if used is None and total is not None and free is not None:
        used = total - free
    util = _reading(f, "util")
    clock = _reading(f, "sm_clock")
    uuid = f.get("uuid")
    return GpuSample(
        t_s=t,
        gpu=index,
        uuid=uuid if isinstance(uuid, str) else g.bus,
        util_pct=util if util is None or 0 <= util <= 100 else None,
        mem_util_pct=_reading(f, "mem_util"),
        mem_used_bytes=None if used is None else int(used * MIB),
        mem_total_bytes=None if total is None else int(total * MIB),
        power_watts=_reading(f, "power"),
        power_limit_watts=_reading(f, "power_limit"),
        sm_clock_mhz=None if clock is None else int(clock),
        temperature_c=_reading(f, "temp"),
    )


def _snapshots(
    lines: Iterator[tuple[int, str]],
    order: dict[str, int],
    header: TraceHeader,
    t0: float,
    path: str,
    warns: list[str],
) -> Iterator[Snapshot]:
    parser = _Parser(path)
    interval = header.interval_s or 1.0
    count = 0
    late = Tally(
        "GPU(s) first seen after the first reports (a GPU added?): numbered after the rest"
    )

    def snapshot(r: _Report) -> Snapshot:
        nonlocal count
        t = round(r.t - t0, 6) if r.t is not None else count * interval
        count += 1
        samples = {}
        for g in r.gpus:
            index = order.get(g.bus)
            if index is None:
                late.note(r.line, g.bus)
                if len(order) >= MAX_GPUS:
                    continue  # bounded: a file naming ever new buses is not a machine
                index = order[g.bus] = len(order)
            samples[index] = _sample(index, t, g)
        return Snapshot(t, tuple(samples[i] for i in sorted(samples)))

    try:
        for report in closed_items(lines, parser.feed, parser.flush):
            yield snapshot(report)
    finally:
        for tally in (parser.bad, parser.stray, late):
            tally.say(path, warns)


READER = Reader(
    FORMAT,
    "nvidia-smi -q reports (one, or many from -q -l or a loop; 'GPU 0000:...' sections)",
    sniff,
    read,
)
