"""``gpustat --json`` output, one snapshot or many (a loop appending to one file).

Each snapshot is one JSON object -- pretty-printed over many lines by gpustat, or one per
line after ``jq -c`` -- with ``query_time`` (local ISO time) and ``gpus``: ``index``,
``uuid``, ``name``, ``temperature.gpu``, ``utilization.gpu``, ``power.draw``,
``enforced.power.limit``, ``memory.used``/``memory.total`` (MiB).  ``null`` is no reading.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from gpumon.errors import TraceFormatError
from gpumon.model import GpuIdentity, GpuSample, Snapshot, TraceHeader
from gpumon.traces._common import MIB, cut_short_warning, median_interval
from gpumon.traces.jsonstream import Buffer, values
from gpumon.traces.reader import Reader
from gpumon.traces.source import Source, as_source
from gpumon.traces.timefmt import date_time

FORMAT = "gpustat-json"
PREFIX_SNAPSHOTS = 16
MAX_SNAPSHOT = 1 << 20  # characters: a gpustat object is a few kB


def sniff(head: list[str]) -> bool:
    text = "".join(head[:200])
    return text.lstrip().startswith("{") and '"query_time"' in text and '"gpus"' in text


def _num(entry: dict[str, Any], key: str) -> float | None:
    v = entry.get(key)
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    raise ValueError(f"{key} is {v!r}, not a number")


def _snapshot(obj: Any, t0: float | None) -> tuple[float, list[tuple[int, dict[str, Any]]]]:
    if not isinstance(obj, dict) or not isinstance(obj.get("gpus"), list):
        raise ValueError('not a gpustat snapshot (no "gpus" list)')
    when = obj.get("query_time")
    if not isinstance(when, str):
        raise ValueError("no query_time")
    t = date_time(when)
    gpus = []
    for g in obj["gpus"]:
        if not isinstance(g, dict) or not isinstance(g.get("index"), int):
            raise ValueError("a GPU entry without an index")
        gpus.append((g["index"], g))
    return t, gpus


def _sample(gpu: int, t: float, g: dict[str, Any]) -> GpuSample:
    used, total = _num(g, "memory.used"), _num(g, "memory.total")
    uuid = g.get("uuid")
    return GpuSample(
        t_s=t,
        gpu=gpu,
        uuid=uuid if isinstance(uuid, str) and uuid else f"gpu{gpu}",
        util_pct=_num(g, "utilization.gpu"),
        mem_used_bytes=None if used is None else int(used * MIB),
        mem_total_bytes=None if total is None else int(total * MIB),
        power_watts=_num(g, "power.draw"),
        power_limit_watts=_num(g, "enforced.power.limit"),
        temperature_c=_num(g, "temperature.gpu"),
    )


def read(
    lines: Iterable[str] | Source,
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """Parse gpustat --json snapshots: the header now, the snapshots lazily."""
    warns = warnings if warnings is not None else []
    buf = Buffer(as_source(lines, path).chunks(), path, MAX_SNAPSHOT)
    stream = values(buf)
    prefix: list[tuple[Any, int]] = []
    cut = False
    try:
        for item in stream:
            prefix.append(item)
            if len(prefix) >= PREFIX_SNAPSHOTS:
                break
    except EOFError:
        cut = True
    if not prefix:
        raise TraceFormatError("no gpustat --json snapshot found", path=path)
    times: list[float] = []
    identities: dict[int, GpuIdentity] = {}
    first_obj = prefix[0][0] if isinstance(prefix[0][0], dict) else {}
    for obj, _line in prefix:
        try:
            t, gpus = _snapshot(obj, None)
        except ValueError:
            break
        times.append(t)
        for index, g in gpus:
            name = g.get("name") if isinstance(g.get("name"), str) else None
            uuid = g.get("uuid") if isinstance(g.get("uuid"), str) else f"gpu{index}"
            total = g.get("memory.total")
            identities.setdefault(
                index,
                GpuIdentity(
                    index=index,
                    uuid=uuid or f"gpu{index}",
                    name=name,
                    mem_total_bytes=int(total * MIB) if isinstance(total, int | float) else None,
                    power_limit_watts=g.get("enforced.power.limit")
                    if isinstance(g.get("enforced.power.limit"), int | float)
                    else None,
                ),
            )
    extra: dict[str, object] = {"timestamps": "local time of the logging machine, read as UTC"}
    interval = median_interval(times) or interval_s or 1.0
    header = TraceHeader(
        version=1,
        source=FORMAT,
        hostname=first_obj.get("hostname") if isinstance(first_obj.get("hostname"), str) else None,
        started_wall_s=times[0] if times else None,
        started_mono_s=0.0,
        interval_s=interval,
        driver_version=first_obj.get("driver_version")
        if isinstance(first_obj.get("driver_version"), str)
        else None,
        gpus=tuple(identities[g] for g in sorted(identities)),
        extra=extra,
    )
    return header, _snapshots(prefix, stream, cut, header, buf, path, warns)


def _snapshots(
    prefix: list[tuple[Any, int]],
    stream: Iterator[tuple[Any, int]],
    cut: bool,
    header: TraceHeader,
    buf: Buffer,
    path: str,
    warns: list[str],
) -> Iterator[Snapshot]:
    t0 = header.started_wall_s or 0.0

    def rest() -> Iterator[tuple[Any, int]]:
        nonlocal cut
        yield from prefix
        if cut:
            return
        try:
            yield from stream
        except EOFError:
            cut = True

    for obj, line in rest():
        try:
            t, gpus = _snapshot(obj, t0)
            t = round(t - t0, 6)
            samples = tuple(_sample(index, t, g) for index, g in sorted(gpus, key=lambda x: x[0]))
        except (ValueError, TypeError, OverflowError) as exc:
            raise TraceFormatError(
                f"malformed gpustat snapshot ({exc})", path=path, line=line
            ) from None
        yield Snapshot(t_s=t, gpus=samples)
    if cut:
        warns.append(cut_short_warning(path, buf.line))


READER = Reader(FORMAT, "gpustat --json output", sniff, read)
