"""Laying out a table without a header line (``nvidia-smi --format=csv,noheader``): each
column is named from what its values are -- a time, a uuid, a bus id, an index, a name, or
a number with a unit (``92 %``, ``49140 MiB``, ``250.00 W``, ``1410 MHz``).
"""

from __future__ import annotations

from itertools import pairwise

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
    cols = _Columns(sample, kinds)
    if not any(k in UNITS for k in kinds):
        return _guess_bare(cols)
    lay = Layout(count=ncols, columns=[])
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


# --- rows of bare numbers (``--format=csv,noheader,nounits``) -----------------------------

EPOCH_S = (1e9, 4.2e9)  # 2001-09 to 2103: epoch seconds a log can hold
_EPOCH_SCALES = ((1.0, "seconds"), (1e3, "milliseconds"), (1e6, "microseconds"))
MIN_BARE_ROWS = 3  # fewer rows cannot tell a column that changes from one that does not
MEM_TOTAL_MIB = (4000.0, float(1 << 20))  # a training GPU's memory in MiB: 4 GB to 1 TiB


def _numbers(cols: _Columns, i: int) -> list[float] | None:
    """Column ``i``'s values as numbers without units, or None (a unit, a name, no reading)."""
    out = []
    for r in cols.sample:
        try:
            got = split_number(r[i])
        except ValueError:
            return None
        if got is None or got[1]:
            return None
        out.append(got[0])
    return out


def epoch_scale(values: list[float]) -> str | None:
    """The unit ("seconds", "milliseconds", ...) of a column of epoch times that never go
    back, or None when the values are not such times."""
    for scale, unit in _EPOCH_SCALES:
        lo, hi = EPOCH_S[0] * scale, EPOCH_S[1] * scale
        if all(lo <= v <= hi for v in values) and all(b >= a for a, b in pairwise(values)):
            return unit
    return None


def _bare_time(lay: Layout, cols: _Columns, nums: dict[int, list[float]]) -> bool:
    """The time column: a timestamp, or numbers that can only be epoch times (said)."""
    if cols.of("time"):
        lay.time_at = cols.of("time")[0]
        return True
    for i, values in nums.items():
        unit = epoch_scale(values)
        if unit is not None:
            lay.time_at = i
            lay.notes.append(
                f"column {i + 1} holds numbers only epoch {unit} can be: read as the time"
            )
            del nums[i]
            return True
    return False


def _bare_total(lay: Layout, nums: dict[int, list[float]]) -> None:
    """The GPU's memory total: a constant whole number of a memory's size (4 GB to 1 TiB
    in MiB) that no value of another column exceeds (used and free memory never do)."""
    sizes = [
        i
        for i, v in nums.items()
        if len(set(v)) == 1 and MEM_TOTAL_MIB[0] <= v[0] <= MEM_TOTAL_MIB[1] and v[0] == int(v[0])
    ]
    if not sizes:
        return
    i = max(sizes, key=lambda k: nums[k][0])
    total = nums[i][0]
    if any(x > total for k, v in nums.items() if k != i for x in v) or [
        k for k in sizes if nums[k][0] == total and k != i
    ]:
        return
    lay.at["mem_total"] = i
    lay.notes.append(
        f"column {i + 1} is constant at {total:g}, a GPU's memory size, and no other value "
        "exceeds it: read as memory.total in MiB"
    )
    del nums[i]


def _bare_index(lay: Layout, cols: _Columns, nums: dict[int, list[float]]) -> None:
    """An index column: whole numbers cycling 0..n-1 over at least two GPUs."""
    for i in cols.of("index"):
        values = nums.get(i)
        if values is not None and len(set(values)) >= 2:
            lay.at["index"] = i
            lay.notes.append(
                f"column {i + 1} cycles through 0-{int(max(values))}: read as the index"
            )
            del nums[i]
            return


def _bare_util(lay: Layout, nums: dict[int, list[float]]) -> bool:
    """The utilisation: the one column of 0-100 values that changes (or, when none
    changes, the only column of 0-100 values); False when the values leave a choice."""
    percent = [i for i, v in nums.items() if all(0 <= x <= 100 for x in v)]
    varying = [i for i in percent if len(set(nums[i])) > 1]
    pick = varying if varying else percent
    if len(pick) != 1:
        return False
    i = pick[0]
    lay.at["util"] = i
    why = (
        "the one column of 0-100 values that changes"
        if varying
        else "the one column of 0-100 values"
    )
    lay.notes.append(f"column {i + 1} is {why}: read as utilization.gpu (%)")
    del nums[i]
    return True


def _guess_bare(cols: _Columns) -> Layout | None:
    """Columns of rows of bare numbers, where the values leave one reading only: a time
    (a timestamp, or epoch numbers), the GPU's memory total (the one constant column of a
    memory size), an index (cycling 0..n-1) and the utilisation (the one 0-100 column
    that changes); None when they leave a choice (``--columns`` names them then).  What
    was assumed is in ``notes``; other columns are not read."""
    ncols = len(cols.kinds)
    if len(cols.sample) < MIN_BARE_ROWS:
        return None
    lay = Layout(count=ncols, columns=[])
    for kind in ("uuid", "bus", "name"):
        if cols.of(kind):
            lay.at[kind] = cols.of(kind)[0]
    nums = {i: v for i in range(ncols) if (v := _numbers(cols, i)) is not None}
    if not _bare_time(lay, cols, nums):
        return None
    _bare_total(lay, nums)
    _bare_index(lay, cols, nums)
    if not _bare_util(lay, nums):
        return None
    if nums:
        lay.notes.append(
            "column(s) " + ", ".join(str(i + 1) for i in sorted(nums)) + " not read (their "
            "values leave more than one reading; name them with --columns)"
        )
    return lay


def bare_rows(rows: list[list[str]]) -> bool:
    """Rows of two or more bare numbers, the first an epoch time or a timestamp: a table
    without a header or units (read if its values allow, else refused naming --columns)."""
    if len(rows) < 2 or len(rows[0]) < 2:
        return False
    ncols = len(rows[0])
    sample = [r for r in rows[:SAMPLE_ROWS] if len(r) == ncols]
    if len(sample) < 2:
        return False
    cols = _Columns(sample, [column_kind([r[0].strip() for r in sample])])
    rest = [_numbers(cols, i) for i in range(1, ncols)]
    if any(v is None for v in rest):
        return False
    first = _numbers(cols, 0)
    return cols.kinds[0] == "time" or (first is not None and epoch_scale(first) is not None)
