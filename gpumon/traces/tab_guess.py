"""Laying out a table without a header line (``nvidia-smi --format=csv,noheader``): each
column is named from what its values are -- a time, a uuid, a bus id, an index, a name, or
a number with a unit (``92 %``, ``49140 MiB``, ``250.00 W``, ``1410 MHz``).
"""

from __future__ import annotations

from gpumon.traces._common import num, split_number
from gpumon.traces.columns import Layout
from gpumon.traces.timefmt import pick

SAMPLE_ROWS = 64  # rows whose values name the columns
UNITS = ("%", "mib", "w", "mhz")  # a log must carry one of these to be laid out


def _unit(cell: str) -> str | None:
    try:
        got = split_number(cell)
    except ValueError:
        return None
    return None if got is None else got[1]


def _is_time(v: str) -> bool:
    return pick([v]) is not None and not v.replace(".", "").isdecimal()


def _is_bus(v: str) -> bool:
    return v.count(":") == 2 and "." in v and " " not in v


def _kind_by_unit(values: list[str]) -> str:
    """A column of numbers with one unit (``%``, ``mib``, ``w``, ``mhz``), of names, or ``?``."""
    units = {_unit(v) for v in values} - {None}
    if len(units) == 1 and units != {""}:
        return str(units.pop())
    if all(v[:1].isalpha() and not v.startswith("[") for v in values):
        return "name"
    return "?"


def column_kind(values: list[str]) -> str:
    """What one column's values are: ``time``, ``uuid``, ``bus``, ``index`` (0..n-1),
    ``int``, a unit, ``name`` or ``?``."""
    if all(_is_time(v) for v in values):
        return "time"
    if all(v.startswith(("GPU-", "MIG-")) for v in values):
        return "uuid"
    if all(_is_bus(v) for v in values):
        return "bus"
    if all(v.isdecimal() for v in values):
        ints = {int(v) for v in values}
        return "index" if ints == set(range(len(ints))) else "int"
    return _kind_by_unit(values)


class _Columns:
    """The sampled rows and each column's kind, asked by the placing steps below."""

    def __init__(self, sample: list[list[str]], kinds: list[str]):
        self.sample = sample
        self.kinds = kinds

    def of(self, kind: str) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k == kind]

    def constant(self, i: int) -> bool:
        return len({r[i].strip() for r in self.sample}) == 1


def _place_keys(lay: Layout, cols: _Columns) -> None:
    for kind in ("uuid", "bus", "index", "name"):
        if cols.of(kind):
            lay.at[kind] = cols.of(kind)[0]
    if cols.of("time"):
        lay.time_at = cols.of("time")[0]


def _place_percents(lay: Layout, cols: _Columns) -> None:
    """nvidia-smi's order: utilization.gpu before utilization.memory."""
    pct = cols.of("%")
    if pct:
        lay.at["util"] = pct[0]
    if len(pct) > 1:
        lay.at["mem_util"] = pct[1]


def _place_memory(lay: Layout, cols: _Columns) -> None:
    """The constant MiB column of the largest value is the total; then used, then free."""
    mib = cols.of("mib")
    totals = [i for i in mib if cols.constant(i)]
    if totals and len(mib) > 1:
        total = max(totals, key=lambda i: num(cols.sample[0][i]) or 0.0)
        lay.at["mem_total"] = total
        rest = [i for i in mib if i != total]
        lay.at["mem_used"] = rest[0]
        if len(rest) > 1:
            lay.at["mem_free"] = rest[1]
    elif mib:
        lay.at["mem_used"] = mib[0]


def _place_power(lay: Layout, cols: _Columns) -> None:
    """The watts that vary are the draw, a constant one beside it the limit."""
    watts = cols.of("w")
    if not watts:
        return
    varying = [i for i in watts if not cols.constant(i)]
    lay.at["power"] = (varying or watts)[0]
    limits = [i for i in watts if i != lay.at["power"] and cols.constant(i)]
    if limits:
        lay.at["power_limit"] = limits[0]


def _place_rest(lay: Layout, cols: _Columns) -> None:
    """The SM clock (MHz) and a temperature (bare integers within 5-120)."""
    if cols.of("mhz"):
        lay.at["sm_clock"] = cols.of("mhz")[0]
    temps = [i for i in cols.of("int") if all(5 <= int(r[i]) <= 120 for r in cols.sample)]
    if temps:
        lay.at["temp"] = temps[0]


def guess_layout(rows: list[list[str]]) -> Layout | None:
    """Columns of a headerless nvidia-smi log, from the units in its values; None if the
    values carry none (then nothing tells utilisation from memory)."""
    if not rows:
        return None
    ncols = len(rows[0])
    sample = [r for r in rows[:SAMPLE_ROWS] if len(r) == ncols]
    if not sample or ncols < 2:
        return None
    kinds = [column_kind([r[i].strip() for r in sample]) for i in range(ncols)]
    if not any(k in UNITS for k in kinds):
        return None
    lay = Layout(count=ncols, columns=[])
    cols = _Columns(sample, kinds)
    for place in (_place_keys, _place_percents, _place_memory, _place_power, _place_rest):
        place(lay, cols)
    return lay


def index_that_names(lay: Layout, rows: list[list[str]]) -> None:
    """A bare "GPU" column taken for the index holds the GPU's name (``NVIDIA GeForce
    RTX 3070 Laptop GPU``) in some home-made logs: read it as the name, by its values."""
    at = lay.at.get("index")
    if at is None or not rows:
        return
    cells = [r[at].strip() for r in rows[:SAMPLE_ROWS] if at < len(r)]
    if cells and not all(c.isdigit() for c in cells if c):
        del lay.at["index"]
        lay.at.setdefault("name", at)
