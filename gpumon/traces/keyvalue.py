"""Home-made loggers that print ``Key: value`` lines, a block per sample:

    === 2024-10-31 18:47:06 ===
    GPU Load: 42.0%
    GPU Memory: 1200.0MB / 6144.0MB (19.5%)
    GPU Temperature: 48.0°C
    CPU Usage: 12.5%
    RAM Usage: 8.1GB / 15.9GB (51.0%)

Keys mean what the same words mean in a table's header (``columns.classify``): a GPU's load
or utilisation, memory used (and, after a ``/``, total), temperature, power (and limit);
``GPU 1 Load`` is GPU 1's; ``CPU Usage`` is the host's.  A line that is only a time (framed
or not) starts a block and gives it its time; without one a key seen again starts the next
block, and blocks are ``--interval`` apart.  Other lines (banners, separators) are skipped
and counted in a note; keys gpumon has no use for (RAM, disk) are named in the header.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, GpuSample, HostSample, Snapshot, TraceHeader
from gpumon.traces._common import (
    MIB,
    Tally,
    add_note,
    assume_interval,
    cut_short_warning,
    is_cut_short,
    median_interval,
    mem_mib,
    num,
    read_ahead,
)
from gpumon.traces.columns import classify
from gpumon.traces.reader import Reader
from gpumon.traces.source import Source, numbered_lines
from gpumon.traces.timefmt import FRAME, line_time

FORMAT = "key-value"
PREFIX_LINES = 400
MAX_IGNORED = 64  # keys named as not read, at most
_GPU_FIELDS = frozenset(("util", "mem_used", "mem_total", "mem_util", "temp", "power", "sm_clock"))


def _key_value(line: str) -> tuple[str, str] | None:
    """``("GPU Load", "42.0%")`` for a ``Key: value`` line whose value starts like a number
    (or a no-reading mark); None for any other line."""
    key, sep, value = line.partition(":")
    key, value = key.strip(), value.strip()
    if not sep or not key or len(key) > 48 or not key[0].isalpha() or not value:
        return None
    if not (value[0].isdigit() or value[0] in "-.+" or value.upper().startswith("N/A")):
        return None
    return key, value


def _pairs(line: str) -> tuple[str, list[tuple[str, str]]]:
    """A line's ``Key: value`` pairs -- one, or several two spaces apart (``Temp: 58C  Power:
    1/250 W  Utilization: 0%``) -- and the text before the first (a time, a prompt)."""
    one = _key_value(line)
    chunks = [c for c in line.strip().split("  ") if c.strip()]
    if len(chunks) < 2:
        return "", [one] if one is not None else []
    pairs = [kv for c in chunks if (kv := _key_value(c)) is not None]
    if len(pairs) < 2:
        return "", [one] if one is not None else []
    first = next(i for i, c in enumerate(chunks) if _key_value(c) is not None)
    return " ".join(chunks[:first]), pairs


def sniff(head: list[str]) -> bool:
    """Mostly lines of ``Key: value`` pairs with numbers, a GPU's utilisation among the
    keys, and nothing else but time lines and blank ones."""
    lines = [ln for ln in head[:200] if ln.strip()]
    if len(lines) < 3:
        return False
    found = [_pairs(ln)[1] for ln in lines]
    if sum(1 for p in found if p) < 0.6 * len(lines):
        return False
    if not any(classify(k).field == "util" for p in found for k, _ in p):
        return False
    others = [ln for ln, p in zip(lines, found, strict=True) if not p]
    return all(line_time(ln) is not None or not ln.strip(FRAME + "\r\n") for ln in others)


@dataclass
class _Block:
    """One sample: its time (None: none given) and the values of its keys."""

    t: float | None = None
    line: int = 0
    gpus: dict[int, dict[str, float | None]] = field(default_factory=dict)
    cpu: float | None = None
    keys: set[str] = field(default_factory=set)


def _value(fld: str, value: str) -> dict[str, float | None]:
    """A key's reading(s): memory and power may carry their total after a ``/``."""
    first, _, rest = value.partition("/")
    second = rest.split("(", 1)[0].strip()
    if fld in ("mem_used", "mem_total") and first.strip().endswith("%"):
        return {}  # memory as a share of the card ("GPU Memory Usage: 45%"): no amount
    if fld == "mem_used":
        got = {"mem_used": mem_mib(first)}
        if second:
            got["mem_total"] = mem_mib(second)
        return got
    if fld == "mem_total":
        return {"mem_total": mem_mib(first)}
    got = {fld: num(first.split("(", 1)[0])}
    if fld == "power" and second:
        got["power_limit"] = num(second)
    return got


class _Blocks:
    """Lines to blocks: what a block holds, where one ends, what was skipped."""

    def __init__(self, path: str):
        self.path = path
        self.block = _Block()
        self.skipped = 0
        self.ignored: list[str] = []
        self.unread = Tally(
            "line(s) whose value is not one reading (several values, words): not read as a "
            "sample field"
        )
        self.has_times = False

    def feed(self, no: int, line: str) -> _Block | None:
        """Take one line; the block it closed, if any."""
        if not line.strip():
            return None
        before, pairs = _pairs(line)
        if not pairs:
            t = line_time(line)
            if t is None:
                self.skipped += 1
                return None
            self.has_times = True
            return self._start(_Block(t=t, line=no))
        if len(pairs) > 1:  # a whole sample on one line: a block of its own
            t = line_time(before.strip(FRAME + ">:"))
            self.has_times = self.has_times or t is not None
            done = self._start(_Block(t=t, line=no))
            for key, value in pairs:
                self._take(key, value, no, line)
            return done
        return self._take(*pairs[0], no, line)

    def _take(self, key: str, value: str, no: int, line: str) -> _Block | None:
        """One reading into the block; the block a key seen again closed, if any."""
        col = classify(key)
        fld = col.field
        if fld not in _GPU_FIELDS and fld != "host_cpu":
            self._ignore(key)
            return None
        try:
            got = {"host_cpu": num(value)} if fld == "host_cpu" else _value(fld, value)
        except ValueError:
            # Not one reading ("Allocated: 0.0MB, Reserved: 0.0MB"): not a sample field.
            self.unread.note(no, line.strip())
            self._ignore(key)
            return None
        done = None
        if key in self.block.keys and not self.has_times:
            done = self._start(_Block(line=no))
        gpu = self.block.gpus.setdefault(col.gpu or 0, {}) if fld != "host_cpu" else {}
        if any(f in gpu for f in got) and key not in self.block.keys:
            self._ignore(key)  # a second key for a field this block has (a framework's view)
            return done
        self.block.keys.add(key)
        if fld == "host_cpu":
            self.block.cpu = got["host_cpu"]
        else:
            gpu.update(got)
        if not self.block.line:
            self.block.line = no
        return done

    def _ignore(self, key: str) -> None:
        if key not in self.ignored and len(self.ignored) < MAX_IGNORED:
            self.ignored.append(key)

    def _start(self, new: _Block) -> _Block | None:
        old, self.block = self.block, new
        return old if old.gpus else None

    def flush(self) -> _Block | None:
        return self._start(_Block())


def read(
    lines: Iterable[str] | Source,
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse a log of ``Key: value`` blocks: the header now, the snapshots lazily."""
    warns, numbered = numbered_lines(lines, path, warnings)
    probe = _Blocks(path)
    prefix, blocks = read_ahead(numbered, probe.feed, probe.flush, PREFIX_LINES)
    if not blocks:
        raise TraceFormatError("no blocks of GPU readings ('GPU Load: 42%') found", path=path)
    extra: dict[str, object] = {}
    times = [b.t for b in blocks if b.t is not None]
    interval = median_interval(times) if times else None
    if interval is None:
        interval = assume_interval(extra, "no time lines: blocks", interval_s)
    else:
        extra["timestamps"] = "local time of the logging machine, read as UTC"
    if probe.ignored:
        extra["ignored_columns"] = probe.ignored
    if probe.skipped:
        add_note(
            extra,
            f"{probe.skipped} of the first {len(prefix)} lines are neither a reading nor a "
            "time (banners, separators): such lines are skipped",
        )
    gpus = sorted({g for b in blocks for g in b.gpus})
    header = TraceHeader(
        version=1,
        source=FORMAT,
        started_wall_s=times[0] if times else None,
        started_mono_s=0.0,
        interval_s=interval,
        gpus=tuple(GpuIdentity(index=g, uuid=f"gpu{g}") for g in gpus),
        extra=extra,
    )
    t0 = times[0] if times else 0.0
    return header, _snapshots(chain(prefix, numbered), header, t0, path, warns)


def _sample(gpu: int, t: float, f: dict[str, float | None]) -> GpuSample:
    used, total = f.get("mem_used"), f.get("mem_total")
    util = f.get("util")
    return GpuSample(
        t_s=t,
        gpu=gpu,
        uuid=f"gpu{gpu}",
        util_pct=util if util is None or 0.0 <= util <= 100.0 else None,
        mem_util_pct=f.get("mem_util"),
        mem_used_bytes=None if used is None else int(used * MIB),
        mem_total_bytes=None if total is None else int(total * MIB),
        power_watts=f.get("power"),
        power_limit_watts=f.get("power_limit"),
        temperature_c=f.get("temp"),
    )


def _snapshots(
    lines: Iterator[tuple[int, str]], header: TraceHeader, t0: float, path: str, warns: list[str]
) -> Iterator[Snapshot]:
    blocks = _Blocks(path)
    interval = header.interval_s or 1.0
    count = 0

    def snapshot(b: _Block) -> Snapshot:
        nonlocal count
        t = round(b.t - t0, 6) if b.t is not None else count * interval
        count += 1
        host = None if b.cpu is None or not 0 <= b.cpu <= 100 else HostSample(t, cpu_pct=b.cpu)
        return Snapshot(t, tuple(_sample(g, t, f) for g, f in sorted(b.gpus.items())), host)

    try:
        for no, line in lines:
            if is_cut_short(line) and not _pairs(line)[1]:
                warns.append(cut_short_warning(path, no))
                break
            done = blocks.feed(no, line)
            if done is not None:
                yield snapshot(done)
        last = blocks.flush()
        if last is not None:
            yield snapshot(last)
    finally:
        blocks.unread.say(path, warns)


READER = Reader(
    FORMAT,
    "home-made logs of 'Key: value' lines ('GPU Load: 42%', 'GPU Memory: 1200MB / 6144MB'), "
    "a block per sample",
    sniff,
    read,
)
