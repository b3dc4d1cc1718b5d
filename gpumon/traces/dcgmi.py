"""``dcgmi dmon -e 203,252,155,... [-d ms]`` logs (NVIDIA DCGM's command-line monitor).

dcgmi prints a ``#Entity`` line naming each field by its five-letter tag (``GPUTL``,
``FBUSD``, ``POWER``, ...), an ``ID`` line with units, and re-prints both every few rows.
Rows are ``GPU 0  75  28456  185.300 ...`` (``N/A`` where the engine has no value),
GPUs in any order (often from the last).  No row carries a time: ticks are counted (a GPU
seen again starts one) and placed ``-d`` apart -- ``--interval``, else dcgmi's default 1 s.
``DVNAM`` (the device name) may hold spaces: its cells are joined back.  Entities other
than whole GPUs (``GPU-I``, ``GPU-CI``, ``CPU``) are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, GpuSample, Point, Snapshot, TraceHeader
from gpumon.traces import dcgm_fields
from gpumon.traces._common import MIB, Assembler, add_note, bad_line, cut_short_warning, num
from gpumon.traces.reader import Reader
from gpumon.traces.source import Source, numbered_lines

FORMAT = "dcgmi"
PREFIX_LINES = 400

# dcgmi's short field names -> (field, scale to gpumon's unit), from DCGM's one table.
TAGS: dict[str, tuple[str, float]] = {
    short: (f.field, f.scale) for short, f in dcgm_fields.BY_SHORT.items()
}
_ENTITY = ("#entity", "#entityid")


def _names(line: str) -> list[str] | None:
    """The field tags of an ``#Entity`` line (``# Entity``, ``# EntityId`` too), else None."""
    s = line.strip()
    if not s.startswith("#"):
        return None
    toks = s[1:].split()
    if not toks or toks[0].lower() not in ("entity", "entityid", "entity_id"):
        return None
    return toks[1:]


def _gpu_id(tok: str) -> bool:
    return tok.isdecimal() and len(tok) <= 4


def _is_units(line: str) -> bool:
    first = line.strip().lstrip("#").split()
    return bool(first) and first[0].lower() in ("id", "entityid")


def sniff(head: list[str]) -> bool:
    named = False
    for ln in head:
        if _names(ln) is not None:
            named = True
        elif named:
            toks = ln.split()
            if len(toks) >= 3 and toks[0] in ("GPU", "GPU-I", "GPU-CI") and toks[1].isdecimal():
                return True
    return False


class _Columns:
    def __init__(self, names: list[str]):
        self.names = names
        self.count = len(names)
        self.at: dict[str, tuple[int, float]] = {}
        for i, tag in enumerate(names):
            known = TAGS.get(tag.upper())
            if known is not None and known[0] not in self.at:
                self.at[known[0]] = (i, known[1])
        self.name_at = self.at.get("name", (None, 1.0))[0]
        util = self.at.get("util") or self.at.get("util_prof")
        self.util_at: int | None
        self.util_at, self.util_scale = util if util else (None, 1.0)
        self.ignored = [n for n in names if n.upper() not in TAGS]

    def values(self, toks: list[str]) -> list[str] | None:
        """The value cells of a row's tokens after the entity (DVNAM's spaces joined)."""
        cells = toks[2:]
        if len(cells) == self.count:
            return cells
        if self.name_at is not None and len(cells) > self.count:
            extra = len(cells) - self.count
            i = self.name_at
            return [*cells[:i], " ".join(cells[i : i + extra + 1]), *cells[i + extra + 1 :]]
        return None

    def get(self, cells: list[str], fld: str) -> float | None:
        spec = self.at.get(fld)
        if spec is None:
            return None
        v = num(cells[spec[0]])
        return None if v is None else v * spec[1]


def read(
    lines: Iterable[str] | Source,
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse a dcgmi dmon log: the header now, the snapshots lazily."""
    warns, numbered = numbered_lines(lines, path, warnings)
    prefix: list[tuple[int, str]] = []
    cols: _Columns | None = None
    identities: dict[int, GpuIdentity] = {}
    for no, line in numbered:
        prefix.append((no, line))
        names = _names(line)
        if names is not None:
            cols = cols or _Columns(names)
            continue
        toks = line.split()
        if cols is not None and len(toks) >= 2 and toks[0] == "GPU" and _gpu_id(toks[1]):
            g = int(toks[1])
            cells = cols.values(toks)
            name = None
            if cells is not None and cols.name_at is not None:
                name = cells[cols.name_at]
            identities.setdefault(g, GpuIdentity(index=g, uuid=f"gpu{g}", name=name))
        if len(prefix) >= PREFIX_LINES:
            break
    if cols is None:
        raise TraceFormatError("no dcgmi dmon header ('#Entity ...') found", path=path)
    extra: dict[str, object] = {}
    interval = interval_s or 1.0
    extra["interval_assumed"] = (
        f"dcgmi dmon rows carry no time: ticks assumed {interval:g} s apart"
        + ("" if interval_s else " (dcgmi's default -d 1000; say otherwise with --interval)")
    )
    if "util" not in cols.at and "util_prof" in cols.at:
        add_note(extra, "no GPUTL column: utilisation read from GRACT (graphics engine active)")
    elif cols.util_at is None:
        warns.append(f"{path}: no GPUTL or GRACT column; the GPUs' activity cannot be judged")
    if cols.ignored:
        extra["ignored_columns"] = cols.ignored
    header = TraceHeader(
        version=1,
        source=FORMAT,
        started_mono_s=0.0,
        interval_s=interval,
        gpus=tuple(identities[g] for g in sorted(identities)),
        extra=extra,
    )
    return header, _snapshots(chain(prefix, numbered), cols, interval, path, warns)


def _build(
    gpu: int, t: float, util: float | None, points: tuple[Point, ...], payload: tuple
) -> GpuSample:
    cols, cells = payload[0], payload[1]
    used = cols.get(cells, "mem_used")
    total = cols.get(cells, "mem_total")
    if used is None and total is not None:
        free = cols.get(cells, "mem_free")
        used = None if free is None else total - free
    clock = cols.get(cells, "sm_clock")
    return GpuSample(
        t_s=t,
        gpu=gpu,
        uuid=f"gpu{gpu}",
        util_samples=points,
        util_pct=util,
        mem_util_pct=cols.get(cells, "mem_util"),
        mem_used_bytes=None if used is None else int(used * MIB),
        mem_total_bytes=None if total is None else int(total * MIB),
        power_watts=cols.get(cells, "power"),
        power_limit_watts=cols.get(cells, "power_limit"),
        sm_clock_mhz=None if clock is None else int(clock),
        pcie_rx_bytes_per_s=cols.get(cells, "pcie_rx"),
        pcie_tx_bytes_per_s=cols.get(cells, "pcie_tx"),
        temperature_c=cols.get(cells, "temp"),
        sm_active_ratio=cols.get(cells, "sm_active"),
        sm_occupancy_ratio=cols.get(cells, "sm_occupancy"),
        tensor_active_ratio=cols.get(cells, "tensor_active"),
    )


def _snapshots(
    lines: Iterator[tuple[int, str]],
    cols: _Columns,
    interval: float,
    path: str,
    warns: list[str],
) -> Iterator[Snapshot]:
    asm = Assembler(_build, interval, path)
    tick = -1
    seen: set[int] = set()
    for no, line in lines:
        names = _names(line)
        if names is not None:
            if names != cols.names:
                cols = _Columns(names)
            continue
        toks = line.split()
        if not toks or _is_units(line) or toks[0].startswith("#"):
            continue
        if toks[0] != "GPU":
            if toks[0] in ("GPU-I", "GPU-CI", "CPU", "CPU-C", "SWITCH", "LINK"):
                continue
            if not line.endswith("\n"):
                warns.append(cut_short_warning(path, no))
                break
            raise bad_line(path, no, line, "not a dcgmi dmon row ('GPU 0 ...')")
        cells = cols.values(toks)
        try:
            if cells is None or not _gpu_id(toks[1]):
                raise ValueError(f"expected {cols.count} values after the entity")
            gpu = int(toks[1])
            util = None
            if cols.util_at is not None:
                u = num(cells[cols.util_at])
                util = None if u is None else u * cols.util_scale
        except (ValueError, IndexError, OverflowError) as exc:
            if not line.endswith("\n"):
                warns.append(cut_short_warning(path, no))
                break
            raise bad_line(path, no, line, f"malformed value ({exc})") from None
        if gpu in seen or not seen:
            seen.clear()
            tick += 1
        seen.add(gpu)
        snap = asm.add(round(tick * interval, 6), gpu, util, (cols, cells, no, line))
        if snap is not None:
            yield snap
    snap = asm.flush()
    if snap is not None:
        yield snap


READER = Reader(FORMAT, "dcgmi dmon output ('#Entity ...' header, 'GPU 0 ...' rows)", sniff, read)
