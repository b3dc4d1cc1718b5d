"""JSON lines written by other monitors: one object per GPU per tick, or one per tick
holding a list of GPUs.

    {"ts": "2025-03-02T10:15:01.250Z", "gpu_index": 0, "util_gpu": 97, "pstate": "P0"}
    {"timestamp": 1718943658, "index": 0, "memory_used": 4, "temperature_gpu": 30}
    {"time": 1629639339.0, "devices": [{"id": 0, "util": 0.99, "mem_used": 36.8}]}

An object's keys are a table's column names, read with the same vocabulary as a CSV
header (``columns.classify``: ``gpu_index``, ``util_gpu``, ``utilization.gpu``,
``mem_used_mb``, ``power_draw_w`` ...); nested objects are flattened (``gpu.util``,
``gpus.0.util``), and a list of objects naming GPU fields is one row per GPU (its
position the GPU's index unless it says one; the outer object's time and host fields
shared).  Each object becomes a row, on its own line number, and the table reader
(``tabular.read_table``) reads the rows: times in any form it reads, GPUs by index, key or
cycle, sub-second windows, fractions, notes.  ``null`` is no reading.  Lines that are not
a JSON object, and objects with no GPU field (events a monitor writes between samples),
are skipped and counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from itertools import chain
from math import isfinite
from typing import Any

from gpumon.errors import TraceFormatError
from gpumon.model import Snapshot, TraceHeader
from gpumon.traces._common import Tally, cut_short_warning, is_cut_short
from gpumon.traces.columns import Layout, classify, decamel, resolve
from gpumon.traces.reader import Reader
from gpumon.traces.source import Source, as_source
from gpumon.traces.tab_header import GPU_FIELDS, gpu_fields, names_utilisation
from gpumon.traces.tabular import read_table

FORMAT = "json-lines"
PREFIX_LINES = 200  # lines whose objects name the columns
MAX_KEYS = 256  # columns, at most (a row of a hostile file can hold any number)
MAX_DEPTH = 4  # nesting flattened, at most
MAX_LIST = 1024  # GPUs in one object's list, at most
SEP = "\x1f"  # the unit separator: no value a monitor writes holds it
_KEY_FIELDS = frozenset(("index", "uuid", "bus"))
_INDEX_KEYS = frozenset(("id", "gpu", "device", "gpu_id", "idx", "index", "minor"))

Row = dict[str, Any]


def _flatten(
    obj: dict[str, Any], prefix: str, out: Row, lists: list[list[Any]], depth: int
) -> None:
    """``obj``'s scalars into ``out`` (nested keys joined by ``.``), its lists of objects
    into ``lists``; bounded in keys and depth."""
    for k, v in obj.items():
        if len(out) >= MAX_KEYS:
            return
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            if depth < MAX_DEPTH:
                _flatten(v, key + ".", out, lists, depth + 1)
        elif isinstance(v, list):
            if v and isinstance(v[0], dict):
                lists.append(v)
        else:
            out[key] = v


def _fields(keys: Iterable[str]) -> set[str | None]:
    return {classify(decamel(k)).field for k in keys}


def _is_gpu_list(items: list[Any]) -> bool:
    """A list of objects that name GPU fields (a monitor's ``gpus`` / ``devices``)."""
    first = items[0]
    return isinstance(first, dict) and bool(_fields(first) & set(GPU_FIELDS))


def rows_of(obj: Any) -> list[Row] | None:
    """The table rows one JSON value makes (None: not an object)."""
    if not isinstance(obj, dict):
        return None
    flat: Row = {}
    lists: list[list[Any]] = []
    _flatten(obj, "", flat, lists, 0)
    gpus = next((items for items in lists if _is_gpu_list(items)), None)
    if gpus is None:
        return [flat]
    shared = {k: v for k, v in flat.items() if classify(decamel(k)).field not in GPU_FIELDS}
    rows = []
    for position, item in enumerate(gpus[:MAX_LIST]):
        if not isinstance(item, dict):
            continue
        own: Row = {}
        _flatten(item, "", own, [], 1)
        if not _fields(own) & _KEY_FIELDS:
            named = next((k for k in own if k.lower() in _INDEX_KEYS), None)
            own["index"] = own.pop(named) if named is not None else position
        rows.append({**shared, **own})
    return rows


def _parse(line: str) -> list[Row] | None:
    """The rows of one line (None: not a JSON object)."""
    s = line.strip()
    if not s.startswith("{"):
        return None
    try:
        obj = json.loads(s)
    except (ValueError, RecursionError):
        return None
    return rows_of(obj)


def _cell(v: Any) -> str:
    """A value as a table cell: numbers as written, text without what would split or
    quote a row, null (and true/false) as no reading."""
    if v is None or isinstance(v, bool):
        return ""
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if isfinite(v) else "nan"
    if isinstance(v, str):
        text = v.translate(_CLEAN)
        return "_" + text if text.lstrip().startswith("#") else text
    return ""


_CLEAN = str.maketrans({SEP: " ", '"': "'", "\n": " ", "\r": " "})


def _layout(keys: Iterable[str]) -> Layout:
    return resolve([decamel(k) for k in keys])


def _says_gpu(lay: Layout) -> bool:
    """Keys that are a GPU's: its utilisation, power, temperature or clock, or a GPU key
    beside a memory field (``memory_used`` alone may be the host's)."""
    if not gpu_fields(lay):
        return False
    if names_utilisation(lay) or lay.wide or lay.key is not None:
        return True
    return any(f in lay.at for f in ("power", "temp", "sm_clock"))


def sniff(head: list[str]) -> bool:
    """Lines of JSON objects (the first non-blank line one), whose keys name a GPU's."""
    keys: dict[str, None] = {}
    seen = 0
    for ln in head[:50]:
        s = ln.strip()
        if not s:
            continue
        if seen == 0 and not s.startswith("{"):
            return False
        seen += 1
        for row in _parse(s) or ():
            keys.update(dict.fromkeys(list(row)[:MAX_KEYS]))
    return bool(keys) and _says_gpu(_layout(list(keys)[:MAX_KEYS]))


class _Rows:
    """Numbered JSON lines to numbered table lines over ``columns``: what is skipped is
    counted (and the first named), said once the reading ends."""

    def __init__(self, columns: list[str], path: str, warns: list[str]):
        self.columns = columns
        self.at = {k: i for i, k in enumerate(columns)}
        lay = _layout(columns)
        self.gpu_keys = {
            k for k, col in zip(columns, lay.columns, strict=True) if col.field in GPU_FIELDS
        }
        self.path = path
        self.warns = warns
        self.not_json = Tally("line(s) that are not a JSON object: skipped")
        self.no_gpu = Tally("object(s) with no GPU reading (events, other records): skipped")
        self.new_keys = Tally("object(s) with keys the first objects lack: those keys not read")

    def lines(
        self, numbered: Iterator[tuple[int, str, list[Row] | None]]
    ) -> Iterator[tuple[int, str]]:
        empty = [""] * len(self.columns)
        for no, line, rows in numbered:
            if rows is None:
                if not line.strip():
                    continue
                if is_cut_short(line):
                    self.warns.append(cut_short_warning(self.path, no))
                    return
                self.not_json.note(no, line.strip())
                continue
            for row in rows:
                if not self.gpu_keys.intersection(row):
                    self.no_gpu.note(no, line.strip())
                    continue
                cells = list(empty)
                extra = False
                for k, v in row.items():
                    i = self.at.get(k)
                    if i is None:
                        extra = True
                    else:
                        cells[i] = _cell(v)
                if extra:
                    self.new_keys.note(no, line.strip())
                yield no, SEP.join(cells) + "\n"

    def finish(self) -> None:
        for tally in (self.not_json, self.no_gpu, self.new_keys):
            tally.say(self.path, self.warns)


def read(
    lines: Iterable[str] | Source,
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse JSON lines of GPU readings: the header now, the snapshots lazily."""
    warns = warnings if warnings is not None else []
    numbered = ((no, ln, _parse(ln)) for no, ln in enumerate(as_source(lines, path).lines(), 1))
    prefix = []
    keys: dict[str, None] = {}
    for item in numbered:
        prefix.append(item)
        for row in item[2] or ():
            for k in row:
                if len(keys) < MAX_KEYS:
                    keys.setdefault(k)
        if len(prefix) >= PREFIX_LINES:
            break
    columns = list(keys)
    if not columns or not _says_gpu(_layout(columns)):
        raise TraceFormatError(
            "no JSON objects naming GPU fields ('gpu_util', ...) found", path=path
        )
    rows = _Rows(columns, path, warns)
    header, snapshots = read_table(
        rows.lines(chain(prefix, numbered)),
        path,
        warns,
        interval_s,
        columns=[decamel(k) for k in columns],
        delim=SEP,
        source=FORMAT,
    )
    return header, _finishing(snapshots, rows)


def _finishing(snapshots: Iterator[Snapshot], rows: _Rows) -> Iterator[Snapshot]:
    try:
        yield from snapshots
    finally:
        rows.finish()


READER = Reader(
    FORMAT,
    "JSON lines of other monitors (an object per GPU per tick, or per tick with a list of "
    "GPUs: gpu_index, util_gpu, mem_used, power_draw, ts ...)",
    sniff,
    read,
)
