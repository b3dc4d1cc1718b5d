"""What the columns of a table-shaped GPU log mean, from their header names (and values).

Three vocabularies meet here: nvidia-smi's query names (``utilization.gpu [%]``), W&B's
system metrics (``system/gpu.0.gpu``, CSV exports prefixed ``<run> - ``), and the names
people give their own loggers (``gpu_util_pct``, ``Power Used``, ``mem_used_mb``,
``0GPU (%)``, ``gpu1_util``).  A name is cut into word tokens (``gpu0_util`` ->
``gpu 0 util``); a number next to ``gpu``/``cuda``/``device`` makes it a per-GPU column of a
wide file; the remaining words say the field; a unit in brackets or a suffix (``_mb``,
``(W)``, ``_ms``) says the scale.  ``CPU`` columns feed the host sample, never a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# nvidia-smi --query-gpu names -> field (lower priority number wins for a shared field).
NVSMI_FIELDS: dict[str, tuple[str, int]] = {
    "timestamp": ("time", 0),
    "index": ("index", 0),
    "uuid": ("uuid", 0),
    "gpu_uuid": ("uuid", 0),
    "name": ("name", 0),
    "gpu_name": ("name", 0),
    "pci.bus_id": ("bus", 0),
    "gpu_bus_id": ("bus", 0),
    "utilization.gpu": ("util", 0),
    "utilization.memory": ("mem_util", 0),
    "memory.used": ("mem_used", 0),
    "memory.total": ("mem_total", 0),
    "memory.free": ("mem_free", 0),
    "power.draw": ("power", 0),
    "power.draw.instant": ("power", 1),
    "power.draw.average": ("power", 2),
    "enforced.power.limit": ("power_limit", 0),
    "power.limit": ("power_limit", 1),
    "temperature.gpu": ("temp", 0),
    "clocks.sm": ("sm_clock", 0),
    "clocks.current.sm": ("sm_clock", 0),
    "clocks_event_reasons.active": ("reasons", 0),
    "clocks_throttle_reasons.active": ("reasons", 0),
}

# Any of these starts an nvidia-smi query name (a header of them is nvidia-smi's).
NVSMI_PREFIXES = (
    "timestamp",
    "driver_version",
    "count",
    "name",
    "gpu_name",
    "gpu_uuid",
    "gpu_bus_id",
    "gpu_serial",
    "serial",
    "uuid",
    "index",
    "pci.",
    "pcie.",
    "display_",
    "persistence_mode",
    "accounting.",
    "driver_model.",
    "vbios_version",
    "inforom.",
    "gom.",
    "fan.speed",
    "pstate",
    "clocks",
    "memory.",
    "compute_mode",
    "compute_cap",
    "utilization.",
    "encoder.",
    "fbc.",
    "ecc.",
    "retired_pages.",
    "remapped_rows.",
    "temperature.",
    "power.",
    "enforced.power",
    "mig.",
    "reset_status.",
    "protected_memory",
    "module_id",
    "addressing_mode",
)

# W&B system metric names (after "system.gpu.N." / "system/gpu.N.") -> field.
WANDB_GPU_FIELDS = {
    "gpu": "util",
    "memory": "mem_util",
    "memoryallocated": "mem_pct",
    "memoryallocatedbytes": "mem_used_bytes",
    "memorytotalbytes": "mem_total_bytes",
    "powerwatts": "power",
    "enforcedpowerlimitwatts": "power_limit",
    "powerpercent": "power_pct",
    "temp": "temp",
    "smclock": "sm_clock",
}

GPU_WORDS = frozenset(("gpu", "cuda", "device", "dev", "gpus"))
_UTIL = frozenset(
    ("util", "utilization", "utilisation", "usage", "load", "busy", "active", "pct", "percent")
)
_MEM = frozenset(("mem", "memory", "vram", "fb", "framebuffer"))
_TIME = frozenset(
    (
        "time",
        "timestamp",
        "ts",
        "t",
        "datetime",
        "elapsed",
        "epoch",
        "unix",
        "runtime",
        "walltime",
        "seconds",
        "secs",
    )
)
_TIME_QUALIFIERS = frozenset(
    ("s", "sec", "ms", "us", "ns", "wall", "relative", "process", "unix", "utc", "local", "iso")
)


def canonical(cell: str) -> str:
    """``" utilization.gpu [%]"`` -> ``"utilization.gpu"`` (nvidia-smi's own names)."""
    name = cell.strip().strip('"').strip().lower()
    bracket = name.find(" [")
    return name[:bracket] if bracket >= 0 else name


def is_nvsmi_name(cell: str) -> bool:
    name = canonical(cell)
    return bool(name[:1].isalpha()) and name.startswith(NVSMI_PREFIXES)


def tokens(name: str) -> list[str]:
    """``"gpu0_util (%)"`` -> ``["gpu", "0", "util", "%"]``: letters, digits and ``%`` apart."""
    out: list[str] = []
    word = ""
    kind = ""
    for c in name.lower():
        k = "a" if c.isalpha() else "d" if c.isdecimal() else "%" if c == "%" else ""
        if k and k == kind and k != "%":
            word += c
            continue
        if word:
            out.append(word)
        word, kind = (c, k) if k else ("", "")
    if word:
        out.append(word)
    return out


_UNIT_WORDS = ("MiB", "GiB", "KiB", "TiB")


def decamel(name: str) -> str:
    """``gpuUtilPct`` -> ``gpu Util Pct``, ``GPUId`` -> ``GPU Id``, ``memUsedMiB`` ->
    ``mem Used MiB``: camel-case names (JSON keys, DCGM's examples) cut into the words
    ``tokens`` reads; binary units (``MiB``) stay whole.  Linear in the name."""
    out: list[str] = []
    i, n = 0, len(name)
    while i < n:
        unit = next((u for u in _UNIT_WORDS if name.startswith(u, i)), None)
        if unit is not None:
            if out and out[-1] != " ":
                out.append(" ")
            out.append(unit)
            i += len(unit)
            continue
        c = name[i]
        prev = name[i - 1] if i else ""
        nxt = name[i + 1] if i + 1 < n else ""
        if c.isupper() and (prev.islower() or (prev.isupper() and nxt.islower())):
            out.append(" ")
        out.append(c)
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class Column:
    """One column's meaning: ``field`` (None: not used), ``gpu`` (its GPU in a wide file),
    ``scale`` (to the field's unit: MiB, W, %, s), ``label`` (the header cell as written)."""

    field: str | None
    gpu: int | None = None
    scale: float = 1.0
    label: str = ""
    percent: bool = False  # the name says percent ("%", "pct", "percent")


def _unit_scale(toks: list[str], lname: str) -> tuple[float, bool]:
    """(scale to MiB for memory / 1 otherwise, percent?) from the unit words in the name."""
    percent = "%" in toks or "pct" in toks or "percent" in toks or "ratio" in toks
    scale = 1.0
    if any(t in ("gib", "gb") for t in toks):
        scale = 1024.0
    elif any(t in ("kib", "kb") for t in toks):
        scale = 1 / 1024
    elif "bytes" in toks or lname.endswith(("_b", "(b)", "[b]")):
        scale = 1 / (1 << 20)
    return scale, percent


def _wandb(lname: str) -> Column | None:
    """``system.gpu.0.gpu``, ``system/gpu.0.powerWatts``, ``run - system/gpu.1.temp``."""
    at = lname.find("system")
    if at < 0:
        return None
    rest = lname[at + 6 :]
    if rest[:1] not in "./":
        return None
    rest = rest[1:]
    if rest.endswith(("__min", "__max", "__step")):
        return Column(None)
    if rest in ("cpu", "cpu_percent"):
        return Column("host_cpu", percent=True)
    if not rest.startswith("gpu."):
        return Column(None)
    parts = rest.split(".")
    if len(parts) == 4 and parts[1] == "process":  # system.gpu.process.0.gpu: the process's
        parts = ["gpu", parts[2], parts[3], "process"]
    if len(parts) < 3 or not parts[1].isdecimal() or len(parts[1]) > 4:
        return Column(None)
    fld = WANDB_GPU_FIELDS.get(parts[2])
    if fld is None:
        return Column(None)
    if len(parts) > 3:
        fld = f"{fld}@process"  # used only when the device-level metric is absent
    return Column(fld, gpu=int(parts[1]))


def _by_full_name(label: str) -> Column | None:
    """Names read whole: nvidia-smi's query names, W&B's system metrics, tegrastats'."""
    lname = label.lower()
    nv = NVSMI_FIELDS.get(canonical(label))
    if nv is not None:
        return Column(nv[0], label=label, percent="[%]" in lname)
    if lname.startswith(("utilization.", "memory.", "power.", "clocks", "temperature.")):
        return Column(None, label=label)  # another nvidia-smi query: not one we use
    wb = _wandb(lname)
    if wb is not None:
        return Column(wb.field, wb.gpu, wb.scale, label, wb.percent or wb.field == "util")
    if "gr3d" in lname:  # tegrastats' GR3D_FREQ: the (Jetson) GPU's load in percent
        return Column("util", None, 1.0, label, True)
    return None


def _gpu_number(toks: list[str]) -> int | None:
    """A GPU number: next to a GPU word ("gpu0", "gpu_1", "cuda:0") or leading ("0GPU (%)")."""
    for i, t in enumerate(toks):
        if not t.isdecimal() or len(t) > 4:
            continue
        before = toks[i - 1] if i > 0 else ""
        after = toks[i + 1] if i + 1 < len(toks) else ""
        if before in GPU_WORDS or (i == 0 and after.isalpha()):
            return int(t)
    return None


@dataclass(frozen=True)
class _Name:
    """A header cell cut into words (``gpu0_util (%)``: words ``gpu util``, GPU 0, percent)."""

    label: str
    toks: list[str]
    words: tuple[str, ...]  # the tokens that are not numbers or "%"
    wset: frozenset[str]
    gpu: int | None
    scale: float
    percent: bool

    @classmethod
    def of(cls, label: str) -> _Name:
        lname = label.lower()
        toks = tokens(lname)
        scale, percent = _unit_scale(toks, lname)
        words = tuple(t for t in toks if not t.isdecimal() and t != "%")
        return cls(label, toks, words, frozenset(words), _gpu_number(toks), scale, percent)

    def unused(self) -> Column:
        """A column of no field we read (kept with what its name said)."""
        return Column(None, self.gpu, self.scale, self.label, self.percent)

    def field(self, fld: str, *, scaled: bool = False, percent: bool = False) -> Column:
        """A GPU field, of this column's GPU (a wide file) and its unit's scale if ``scaled``."""
        return Column(fld, self.gpu, self.scale if scaled else 1.0, self.label, percent)


_TIME_WORDS = _TIME | _TIME_QUALIFIERS | {"date", "of", "day", "stamp"}
_HOST_CPU_WORDS = frozenset(("cpu", "host", "total", "system", "avg", "mean", "all")) | _UTIL
_NOT_GPU = frozenset(("ram", "swap", "disk", "net", "network", "step", "epoch_num", "loss", "lr"))
_ENGINES = frozenset(("fan", "enc", "dec", "encoder", "decoder", "jpg", "ofa", "pstate", "ecc"))
_INDEX_WORDS = frozenset(("index", "idx", "id", "ordinal", "num", "no"))
_INDEX_NAMES = ({"index"}, {"idx"}, {"rank"}, {"local", "rank"}, {"device"}, {"cuda", "device"})
_TEMP_WORDS = frozenset(("temp", "temperature", "gtemp", "tmptr", "celsius"))
_POWER_WORDS = frozenset(("power", "pwr", "watts", "watt", "energy"))
_CLOCK_WORDS = frozenset(("clock", "clocks", "freq", "frequency", "mhz", "sm", "graphics"))
_MEM_ACTIVITY = frozenset(
    ("util", "utilization", "utilisation", "bandwidth", "bw", "busy", "activity")
)


def _time_or_date(n: _Name) -> Column | None:
    if n.wset & _TIME and n.wset <= _TIME_WORDS:
        return Column("time", None, 1.0, n.label)
    if n.wset <= {"date", "day"}:
        return Column("date", None, 1.0, n.label)
    return None


def _host_cpu(n: _Name) -> Column | None:
    """``CPU``, ``cpu_util``: the host's share; ``cpu3``: one core; other CPU columns unused."""
    if "cpu" not in n.wset or n.wset & GPU_WORDS or n.wset & _MEM:
        return None
    if n.wset - _HOST_CPU_WORDS:
        return Column(None, label=n.label)
    if any(t.isdecimal() for t in n.toks) and n.gpu is None:
        return Column("host_core", label=n.label, percent=True)
    return Column("host_cpu", label=n.label, percent=True)


def _not_a_gpu_field(n: _Name) -> Column | None:
    """The host's memory, disks, network, the trainer's step and loss: not read."""
    return n.unused() if n.wset & _NOT_GPU else None


def _gpu_engines(n: _Name) -> Column | None:
    """A GPU's fans, media engines, P-state, ECC: not read."""
    return n.unused() if n.wset & _ENGINES else None


def _gpu_key(n: _Name) -> Column | None:
    """What names a GPU: its uuid, bus id, name, or index (a rank, a CUDA device)."""
    w = n.wset
    if "uuid" in w:
        return Column("uuid", label=n.label)
    if w & {"bus", "pci"} and not w & {"rx", "tx", "throughput"}:
        return Column("bus", label=n.label)
    if w <= {"name", "model", "gpu", "product", "card"} and w & {"name", "model", "product"}:
        return Column("name", label=n.label)
    if n.gpu is None and (w in _INDEX_NAMES or (w & _INDEX_WORDS and w & GPU_WORDS)):
        return Column("index", label=n.label)
    return None


def _temperature(n: _Name) -> Column | None:
    return n.field("temp") if n.wset & _TEMP_WORDS and not n.wset & _MEM else None


def _power(n: _Name) -> Column | None:
    """The draw, the limit, or the draw as a percent of the limit (energy: not read)."""
    if not (n.wset & _POWER_WORDS or n.words == ("w",)):
        return None
    if "energy" in n.wset:
        return Column(None, n.gpu, n.scale, n.label)
    if n.wset & {"limit", "max", "cap", "enforced", "tdp"}:
        return n.field("power_limit")
    if n.percent:
        return n.field("power_pct", percent=True)
    return n.field("power")


def _clock(n: _Name) -> Column | None:
    """The SM (graphics) clock; a memory clock is not read."""
    if not n.wset & _CLOCK_WORDS or n.wset & _UTIL:
        return None
    if n.wset & _MEM:
        return Column(None, n.gpu, n.scale, n.label)
    return n.field("sm_clock")


def _memory(n: _Name) -> Column | None:
    """Memory total, free, activity (utilization.memory), percent used, or used."""
    w = n.wset
    if not w & _MEM:
        return None
    if w & {"total", "max", "capacity", "size", "installed"}:
        return n.field("mem_total", scaled=True)
    if w & {"free", "avail", "available"}:
        return n.field("mem_free", scaled=True)
    if w & _MEM_ACTIVITY:
        return n.field("mem_util", percent=True)
    if n.percent:
        return n.field("mem_pct", percent=True)
    return n.field("mem_used", scaled=True)


def _utilisation(n: _Name) -> Column | None:
    """The GPU's utilisation (a process's share of it is not the GPU's)."""
    w = n.wset
    if not (w & _UTIL or w & {"sm", "gr"} or w == {"gpu"} or w <= GPU_WORDS):
        return None
    if w & {"process", "proc"}:
        return n.unused()
    return n.field("util", percent=True)


def _series(n: _Name) -> Column | None:
    """One word holding "gpu" (``LGPU``): a utilisation series of its own."""
    if len(n.words) == 1 and "gpu" in n.words[0]:
        return Column("series", n.gpu, 1.0, n.label, n.percent)
    return None


# Asked in order; the first that knows the name decides.
_WORD_RULES = (
    _time_or_date,
    _host_cpu,
    _not_a_gpu_field,
    _gpu_key,
    _gpu_engines,
    _temperature,
    _power,
    _clock,
    _memory,
    _utilisation,
    _series,
)


def classify(cell: str) -> Column:
    """The meaning of one header cell, from its name alone (values may still settle it)."""
    label = cell.strip().strip('"').strip()
    whole = _by_full_name(label)
    if whole is not None:
        return whole
    name = _Name.of(label)
    if not name.wset:
        return name.unused()
    for rule in _WORD_RULES:
        col = rule(name)
        if col is not None:
            return col
    return name.unused()


@dataclass
class Layout:
    """A header's columns, resolved: where each field sits, per GPU for wide files."""

    count: int
    columns: list[Column]
    at: dict[str, int] = field(default_factory=dict)  # long layout: field -> column
    wide: dict[int, dict[str, int]] = field(default_factory=dict)  # gpu -> field -> column
    series: list[int] = field(default_factory=list)  # extra utilisation series (aggregates)
    host_cpu: int | None = None
    host_cores: list[int] = field(default_factory=list)
    time_at: int | None = None
    date_at: int | None = None
    clock_at: int | None = None
    ignored: list[str] = field(default_factory=list)
    aggregate: bool = False  # the utilisation column is named just "GPU"
    notes: list[str] = field(default_factory=list)  # what was assumed laying it out

    @property
    def key(self) -> str | None:
        for fld in ("index", "uuid", "bus"):
            if fld in self.at:
                return fld
        return None


_PRIORITY = {"time": 0}


def _place_time(lay: Layout, fld: str, i: int) -> None:
    """The first time column; after a date column, a second one is the time of day."""
    if fld == "time":
        if lay.time_at is None:
            lay.time_at = i
        elif lay.date_at is not None and lay.clock_at is None:
            lay.clock_at = i
    elif lay.date_at is None:
        lay.date_at = i


def _place_host(lay: Layout, fld: str, i: int) -> None:
    """The host's CPU (the first such column), its cores, a utilisation series of its own."""
    if fld == "host_cpu":
        if lay.host_cpu is None:
            lay.host_cpu = i
    elif fld == "host_core":
        lay.host_cores.append(i)
    else:
        lay.series.append(i)


def _place_wide(lay: Layout, col: Column, fld: str, i: int) -> None:
    """One GPU's column in a wide file (its first of each field; W&B's process-level
    metrics kept apart, to stand in where the device-level one is absent)."""
    per = lay.wide.setdefault(col.gpu, {})  # type: ignore[arg-type]
    base = fld.removesuffix("@process")
    if fld.endswith("@process"):
        per.setdefault(f"{base}@process", i)
    elif base not in per:
        per[base] = i


def _place_long(lay: Layout, col: Column, fld: str, i: int, nv_prio: dict[str, int]) -> None:
    """A field of a one-GPU-per-row layout: the first column wins, except that nvidia-smi's
    own names rank (``power.draw`` before ``power.draw.instant``)."""
    nv = NVSMI_FIELDS.get(canonical(col.label))
    if nv is not None:
        if fld not in lay.at or nv[1] < nv_prio.get(fld, 99):
            lay.at[fld] = i
            nv_prio[fld] = nv[1]
    elif fld not in lay.at:
        lay.at[fld] = i


def _settle(lay: Layout) -> None:
    """What only the whole header says: a bare "gpu" column beside a real utilisation
    column is the index; "Date" and "Time" columns hold a date and a time of day; W&B's
    process-level metrics fill in; a long utilisation column wins over a wide file's
    other columns; a utilisation column named just "GPU" is an aggregate."""
    cols = lay.columns
    util_cols = [i for i, c in enumerate(cols) if c.field == "util" and c.gpu is None]
    if len(util_cols) > 1 and "index" not in lay.at:
        first = util_cols[0]
        if set(tokens(cols[first].label)) <= GPU_WORDS:
            lay.at["index"] = first
            lay.at["util"] = util_cols[1]
    if lay.date_at is not None and lay.time_at is not None and lay.clock_at is None:
        lay.clock_at, lay.time_at = lay.time_at, None
    for per in lay.wide.values():
        for key in [k for k in per if k.endswith("@process")]:
            per.setdefault(key.removesuffix("@process"), per[key])
            del per[key]
    if lay.wide and "util" in lay.at and not any("util" in p for p in lay.wide.values()):
        lay.wide.clear()
    if "util" in lay.at and cols[lay.at["util"]].label.strip().lower() == "gpu":
        lay.aggregate = True


def resolve(cells: list[str]) -> Layout:
    """A header row -> its Layout (the first column wins when two give one field)."""
    cols = [classify(c) for c in cells]
    lay = Layout(count=len(cells), columns=cols)
    nv_prio: dict[str, int] = {}
    for i, col in enumerate(cols):
        fld = col.field
        if fld is None:
            if col.label:
                lay.ignored.append(col.label)
        elif fld in ("time", "date"):
            _place_time(lay, fld, i)
        elif fld in ("host_cpu", "host_core", "series"):
            _place_host(lay, fld, i)
        elif col.gpu is not None:
            _place_wide(lay, col, fld, i)
        else:
            _place_long(lay, col, fld, i, nv_prio)
    _settle(lay)
    return lay
