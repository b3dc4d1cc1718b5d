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


def classify(cell: str) -> Column:
    """The meaning of one header cell, from its name alone (values may still settle it)."""
    label = cell.strip().strip('"').strip()
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
    toks = tokens(lname)
    scale, percent = _unit_scale(toks, lname)
    words = [t for t in toks if not t.isdecimal() and t != "%"]
    # A GPU number: next to a GPU word ("gpu0", "gpu_1", "cuda:0") or leading ("0GPU (%)").
    gpu = None
    for i, t in enumerate(toks):
        if not t.isdecimal() or len(t) > 4:
            continue
        before = toks[i - 1] if i > 0 else ""
        after = toks[i + 1] if i + 1 < len(toks) else ""
        if before in GPU_WORDS or (i == 0 and after.isalpha()):
            gpu = int(t)
            break
    wset = set(words)
    col = Column(None, gpu, scale, label, percent)
    if not words:
        return col
    if wset & _TIME and wset <= (_TIME | _TIME_QUALIFIERS | {"date", "of", "day", "stamp"}):
        return Column("time", None, 1.0, label)
    if wset <= {"date", "day"}:
        return Column("date", None, 1.0, label)
    if "cpu" in wset and not (wset & GPU_WORDS) and not (wset & _MEM):
        rest = wset - {"cpu", "host", "total", "system", "avg", "mean", "all"} - _UTIL
        if not rest:
            if any(t.isdecimal() for t in toks) and gpu is None:
                return Column("host_core", label=label, percent=True)
            return Column("host_cpu", label=label, percent=True)
        return Column(None, label=label)
    if wset & {"ram", "swap", "disk", "net", "network", "step", "epoch_num", "loss", "lr"}:
        return Column(None, gpu, scale, label, percent)
    if wset & {"uuid"}:
        return Column("uuid", label=label)
    if wset & {"bus", "pci"} and not wset & {"rx", "tx", "throughput"}:
        return Column("bus", label=label)
    if wset <= {"name", "model", "gpu", "product", "card"} and wset & {"name", "model", "product"}:
        return Column("name", label=label)
    if gpu is None and (
        wset in ({"index"}, {"idx"}, {"rank"}, {"local", "rank"}, {"device"})
        or (wset & {"index", "idx", "id", "ordinal", "num", "no"} and wset & GPU_WORDS)
        or wset == {"cuda", "device"}
    ):
        return Column("index", label=label)
    if wset & {"fan", "enc", "dec", "encoder", "decoder", "jpg", "ofa", "pstate", "ecc"}:
        return Column(None, gpu, scale, label, percent)
    if wset & {"temp", "temperature", "gtemp", "tmptr", "celsius"} and not wset & _MEM:
        return Column("temp", gpu, 1.0, label)
    if wset & {"power", "pwr", "watts", "watt", "energy"} or words == ["w"]:
        if "energy" in wset:
            return Column(None, gpu, scale, label)
        if wset & {"limit", "max", "cap", "enforced", "tdp"}:
            return Column("power_limit", gpu, 1.0, label)
        if percent:
            return Column("power_pct", gpu, 1.0, label, True)
        return Column("power", gpu, 1.0, label)
    if wset & {"clock", "clocks", "freq", "frequency", "mhz", "sm", "graphics"} and not (
        wset & _UTIL
    ):
        if wset & _MEM:
            return Column(None, gpu, scale, label)
        return Column("sm_clock", gpu, 1.0, label)
    if wset & _MEM:
        if wset & {"total", "max", "capacity", "size", "installed"}:
            return Column("mem_total", gpu, scale, label)
        if wset & {"free", "avail", "available"}:
            return Column("mem_free", gpu, scale, label)
        if wset & {"util", "utilization", "utilisation", "bandwidth", "bw", "busy", "activity"}:
            return Column("mem_util", gpu, 1.0, label, True)
        if percent:
            return Column("mem_pct", gpu, 1.0, label, True)
        return Column("mem_used", gpu, scale, label)
    if wset & _UTIL or wset & {"sm", "gr"} or wset == {"gpu"} or wset <= GPU_WORDS:
        if wset & {"process", "proc"}:
            return Column(None, gpu, scale, label, percent)
        return Column("util", gpu, 1.0, label, True)
    if len(words) == 1 and "gpu" in words[0]:
        return Column("series", gpu, 1.0, label, percent)  # e.g. "LGPU": its own series
    return col


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

    @property
    def key(self) -> str | None:
        for fld in ("index", "uuid", "bus"):
            if fld in self.at:
                return fld
        return None


_PRIORITY = {"time": 0}


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
            continue
        nv = NVSMI_FIELDS.get(canonical(col.label))
        if fld == "time":
            if lay.time_at is None:
                lay.time_at = i
            elif lay.date_at is not None and lay.clock_at is None:
                lay.clock_at = i
            continue
        if fld == "date":
            if lay.date_at is None:
                lay.date_at = i
            continue
        if fld == "host_cpu":
            if lay.host_cpu is None:
                lay.host_cpu = i
            continue
        if fld == "host_core":
            lay.host_cores.append(i)
            continue
        if fld == "series":
            lay.series.append(i)
            continue
        if col.gpu is not None:
            per = lay.wide.setdefault(col.gpu, {})
            base = fld.removesuffix("@process")
            if fld.endswith("@process"):
                per.setdefault(f"{base}@process", i)
            elif base not in per:
                per[base] = i
            continue
        if nv is not None:
            if fld not in lay.at or nv[1] < nv_prio.get(fld, 99):
                lay.at[fld] = i
                nv_prio[fld] = nv[1]
        elif fld not in lay.at:
            lay.at[fld] = i
    # A bare "gpu" column beside a real utilisation column is the GPU's index.
    util_cols = [i for i, c in enumerate(cols) if c.field == "util" and c.gpu is None]
    if len(util_cols) > 1 and "index" not in lay.at:
        first = util_cols[0]
        if set(tokens(cols[first].label)) <= GPU_WORDS:
            lay.at["index"] = first
            lay.at["util"] = util_cols[1]
    # "Date" and "Time" columns: the time column holds the time of day.
    if lay.date_at is not None and lay.time_at is not None and lay.clock_at is None:
        lay.clock_at, lay.time_at = lay.time_at, None
    # W&B process-level metrics stand in only where the device-level one is absent.
    for per in lay.wide.values():
        for key in [k for k in per if k.endswith("@process")]:
            per.setdefault(key.removesuffix("@process"), per[key])
            del per[key]
    if lay.wide and "util" in lay.at and not any("util" in p for p in lay.wide.values()):
        lay.wide.clear()
    if "util" in lay.at and cols[lay.at["util"]].label.strip().lower() == "gpu":
        lay.aggregate = True
    return lay
