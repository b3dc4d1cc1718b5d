"""gpumon's own trace format: versioned JSON lines, a header then one line per tick.

Documented in ``docs/trace-format.md``.  Writing then reading a trace gives back equal
``Snapshot`` objects: every field is written, ``None`` by omission, and floats through
``repr`` (which JSON keeps exactly).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import fields, replace
from typing import IO, Any

from gpumon.errors import TraceFormatError
from gpumon.model import (
    GpuIdentity,
    GpuProcess,
    GpuSample,
    HostSample,
    MigActivity,
    ProcessRole,
    ProcessSample,
    ProcTreeSample,
    Snapshot,
    StackFrame,
    StackSample,
    TraceHeader,
)
from gpumon.traces._common import Tally, non_finite_times, shown
from gpumon.traces.reader import Reader
from gpumon.traces.source import MAX_LINE, Source, as_source
from gpumon.traces.timefmt import NonFiniteTime

log = logging.getLogger(__name__)

FORMAT_NAME = "gpumon-trace"
# 2: GPM fields (sm_active_ratio, sm_occupancy_ratio, tensor_active_ratio, mig_activity).
# 3: hardware health (mem_clock_mhz ... nvlink_rx_bytes) and xid_errors.
# 4: row remapping, reserved memory, encoder/decoder, GPM DRAM and FP pipes
#    (remapped_rows_corrected ... fp16_active_ratio): a version 3 reader would stop on them.
# A reader reads every version up to its own.
FORMAT_VERSION = 4
_INF = float("inf")
# The Python stacks (--stacks) travel in event lines of their own ("event": "stacks"),
# which readers that do not know them skip: no trace version bump.  This is their version.
STACKS_VERSION = 1


# --- encoding ---------------------------------------------------------------------------


def _plain(obj: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """A dataclass as a dict of its set fields (None and empty tuples omitted)."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        if f.name in skip:
            continue
        value = getattr(obj, f.name)
        if value is None or value == () or value is False:
            continue
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def encode_gpu(sample: GpuSample) -> dict[str, Any]:
    out = _plain(sample, skip=("util_samples", "processes", "t_s", "mig_activity"))
    if sample.util_samples:
        out["util_samples"] = [[t, u] for t, u in sample.util_samples]
    if sample.processes is not None:
        out["processes"] = [_plain(p) for p in sample.processes]
    if sample.mig_activity:
        out["mig_activity"] = [_plain(m) for m in sample.mig_activity]
    return out


def encode_snapshot(snapshot: Snapshot) -> dict[str, Any]:
    """One tick as a JSON object.  GPU samples share the tick's time unless they differ."""
    out: dict[str, Any] = {"t": snapshot.t_s}
    gpus = []
    for g in snapshot.gpus:
        encoded = encode_gpu(g)
        if g.t_s != snapshot.t_s:
            encoded["t_s"] = g.t_s
        gpus.append(encoded)
    if gpus:
        out["gpus"] = gpus
    if snapshot.host is not None:
        # (The busiest outside processes are for the live view; a trace keeps the numbers.)
        host = _plain(snapshot.host, skip=("t_s", "busiest_outside"))
        if snapshot.host.t_s != snapshot.t_s:
            host["t_s"] = snapshot.host.t_s
        out["host"] = host
    if snapshot.tree is not None:
        tree = _plain(snapshot.tree, skip=("t_s", "processes", "root_alive"))
        tree["root_alive"] = snapshot.tree.root_alive
        tree["processes"] = [_plain(p) for p in snapshot.tree.processes]
        if snapshot.tree.t_s != snapshot.t_s:
            tree["t_s"] = snapshot.tree.t_s
        out["tree"] = tree
    return out


def encode_stacks(t_s: float, samples: tuple[StackSample, ...]) -> dict[str, Any]:
    """A window's stack samples as one event line: a table of its frames, then each sample
    as ``[t, seconds, pid, role, [frame index, ... innermost first]]``."""
    index: dict[StackFrame, int] = {}
    frames: list[list[Any]] = []
    rows: list[list[Any]] = []
    for s in samples:
        ids = []
        for f in s.frames:
            k = index.get(f)
            if k is None:
                k = index[f] = len(frames)
                row: list[Any] = [f.name, f.file, f.line, 1 if f.library else 0, f.code]
                while row and row[-1] is None:
                    row.pop()
                frames.append(row)
            ids.append(k)
        rows.append([s.t_s, s.seconds, s.pid, s.role.value, ids])
    return {
        "t": t_s,
        "event": "stacks",
        "version": STACKS_VERSION,
        "frames": frames,
        "samples": rows,
    }


def decode_stacks(obj: dict[str, Any]) -> tuple[StackSample, ...]:
    """A stacks event line's samples (``ValueError`` and friends on a malformed one)."""
    frames = []
    for row in obj["frames"]:
        name, file, *rest = row
        line = rest[0] if rest else None
        if not isinstance(name, str) or not isinstance(file, str):
            raise ValueError("a stack frame's name and file must be text")
        if line is not None and not isinstance(line, int):
            raise ValueError("a stack frame's line must be a number")
        library = bool(rest[1]) if len(rest) > 1 else False
        code = rest[2] if len(rest) > 2 else None
        frames.append(StackFrame(name, file, line, library, code))
    out = []
    for t, seconds, pid, role, ids in obj["samples"]:
        if not isinstance(t, int | float) or not isinstance(seconds, int | float):
            raise ValueError("a stack sample's t and seconds must be numbers")
        if not all(isinstance(i, int) and 0 <= i < len(frames) for i in ids):
            raise ValueError("a stack sample names a frame the line does not have")
        out.append(
            StackSample(float(t), float(seconds), int(pid), ProcessRole(role),
                        tuple(frames[i] for i in ids))
        )  # fmt: skip
    return tuple(out)


# The command line a header keeps: the header must fit in the head every reader looks at
# (HEAD_CHARS), and a 200 KB command line (a job's arguments inline) does not.
MAX_COMMAND_CHARS = 4096


def _bounded_header(header: TraceHeader) -> TraceHeader:
    """``header`` with its command cut to ``MAX_COMMAND_CHARS`` (the cut said in it)."""
    command = header.command
    if command is None or sum(len(a) + 1 for a in command) <= MAX_COMMAND_CHARS:
        return header
    kept: list[str] = []
    room = MAX_COMMAND_CHARS
    for arg in command:
        if len(arg) + 1 > room:
            if room > 1:
                kept.append(arg[: room - 1])
            break
        kept.append(arg)
        room -= len(arg) + 1
    total = sum(len(a) + 1 for a in command)
    kept.append(f"[command cut: {total - MAX_COMMAND_CHARS} more characters not kept]")
    return replace(header, command=tuple(kept))


def encode_header(header: TraceHeader) -> dict[str, Any]:
    body = _plain(header, skip=("gpus", "extra", "version"))
    body["gpus"] = [_plain(g) for g in header.gpus]
    if header.extra:
        body["extra"] = header.extra
    return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "header": body}


def _dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


class TraceWriter:
    """Appends ticks to a trace file, flushing each so a crash loses at most one tick.

    A write that fails (full disk) raises ``OSError`` to the caller; nothing already
    written is touched.
    """

    def __init__(self, stream: IO[str], header: TraceHeader, *, fsync: bool = False):
        self._stream = stream
        self._fsync = fsync
        self._failed = False
        self._said_cut = False
        self._write_line(_dumps(encode_header(_bounded_header(header))))

    @classmethod
    def open(cls, path: str | os.PathLike[str], header: TraceHeader, **kw: Any) -> TraceWriter:
        stream = open(path, "w", encoding="utf-8")  # noqa: SIM115 - owned by the writer
        try:
            return cls(stream, header, **kw)
        except BaseException:
            with contextlib.suppress(OSError):
                stream.close()
            raise

    def write(self, snapshot: Snapshot) -> None:
        if snapshot.stacks:  # before its tick, so a reader hands them over with it
            self._write_line(_dumps(encode_stacks(snapshot.t_s, snapshot.stacks)))
        line = _dumps(encode_snapshot(snapshot))
        if len(line) > MAX_LINE:
            line = self._bounded_tick(snapshot)
        self._write_line(line)

    def _bounded_tick(self, snapshot: Snapshot) -> str:
        """A tick too long for one line a reader takes (MAX_LINE): its tree's processes
        cut to the busiest that fit (a job of ~8,500 processes), said once."""
        tree = snapshot.tree
        procs = () if tree is None else tree.processes
        busiest = sorted(procs, key=lambda p: -(p.cpu_pct or 0.0))
        keep = len(busiest)
        while True:
            keep //= 2
            cut = replace(tree, processes=tuple(busiest[:keep])) if tree is not None else None
            line = _dumps(encode_snapshot(replace(snapshot, tree=cut)))
            if len(line) <= MAX_LINE or keep == 0:
                break
        if not self._said_cut:
            self._said_cut = True
            log.warning(
                "a tick of %d processes is too long for one trace line; the busiest %d of "
                "them are kept in each such tick",
                len(procs),
                keep,
            )
        return line

    def write_event(self, t_s: float, event: str, **data: Any) -> None:
        """A marker line (a phase label, a note); readers skip what they don't know."""
        self._write_line(_dumps({"t": t_s, "event": event, **data}))

    def _write_line(self, line: str) -> None:
        try:
            self._stream.write(line + "\n")
            self._stream.flush()
            if self._fsync:
                os.fsync(self._stream.fileno())
        except OSError:
            self._failed = True
            raise

    def close(self) -> None:
        """Close; after a failed write the unwritten rest is dropped, not flushed again
        (that would raise the same error a second time, over the caller's report)."""
        if self._failed:
            with contextlib.suppress(OSError):
                self._stream.close()
        else:
            self._stream.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- decoding ---------------------------------------------------------------------------


def _tuple_fields(obj: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    for name in names:
        if name in obj:
            obj[name] = tuple(obj[name])
    return obj


def decode_gpu(obj: dict[str, Any], t_s: float) -> GpuSample:
    """``obj`` is a freshly parsed line's and is changed in place (the hot path of
    ``gpumon analyze``: one call per GPU per tick, a point per driver sample).

    Points become plain ``(t, u)`` tuples, unchecked: a point of the wrong shape or type
    fails where it is read (``gpumon analyze`` names its line), which costs nothing on
    the millions of good ones."""
    if "t_s" not in obj:
        obj["t_s"] = t_s
    points = obj.get("util_samples")
    if points is not None:
        obj["util_samples"] = tuple(map(tuple, points))
    procs = obj.get("processes")
    if procs is not None:
        obj["processes"] = tuple([GpuProcess(**p) for p in procs])
    unsupported = obj.get("unsupported")
    if unsupported is not None:
        obj["unsupported"] = tuple(unsupported)
    xids = obj.get("xid_errors")
    if xids is not None:
        obj["xid_errors"] = tuple(xids)
    mig = obj.get("mig_activity")
    if mig is not None:
        obj["mig_activity"] = tuple([MigActivity(**m) for m in mig])
    return GpuSample(**obj)


def decode_snapshot(obj: dict[str, Any]) -> Snapshot:
    """One tick line's object (changed in place, like ``decode_gpu``'s)."""
    t_s = obj["t"]
    if not isinstance(t_s, int | float):
        raise ValueError("'t' must be a number")
    if not -_INF < t_s < _INF:
        raise NonFiniteTime(f"'t' is {t_s!r}, not a finite time")
    gpus = obj.get("gpus")
    samples = tuple([decode_gpu(g, t_s) for g in gpus]) if gpus is not None else ()
    host = obj.get("host")
    if host is not None:
        if "t_s" not in host:
            host["t_s"] = t_s
        cores = host.get("cpu_pct_per_core")
        if cores is not None:
            host["cpu_pct_per_core"] = tuple(cores)
        host = HostSample(**host)
    tree = obj.get("tree")
    if tree is not None:
        if "t_s" not in tree:
            tree["t_s"] = t_s
        procs = tree.get("processes")
        tree["processes"] = tuple([_process(p) for p in procs]) if procs else ()
        tree = ProcTreeSample(**tree)
    return Snapshot(t_s, samples, host, tree)


_PROCESS_DEFAULTS: dict[str, Any] = {f.name: None for f in fields(ProcessSample)}


def _process(obj: dict[str, Any]) -> ProcessSample:
    return ProcessSample(**{**_PROCESS_DEFAULTS, **obj})


def decode_header(obj: dict[str, Any]) -> TraceHeader:
    if obj.get("format") != FORMAT_NAME:
        raise ValueError(f'not a gpumon trace (first line lacks "format": "{FORMAT_NAME}")')
    version = obj.get("version")
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"unknown trace version {version!r}")
    if version > FORMAT_VERSION:
        raise ValueError(
            f"trace version {version} is newer than this gpumon reads ({FORMAT_VERSION}); "
            "upgrade gpumon"
        )
    body = dict(obj.get("header", {}))
    body["gpus"] = tuple(GpuIdentity(**g) for g in body.get("gpus", ()))
    _tuple_fields(body, ("command",))
    return TraceHeader(version=version, **body)


def _open_text(path: str) -> IO[str]:
    """The trace as text, gzip-compressed or not (told by its magic bytes, not its name)."""
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


class TraceReader:
    """Reads a gpumon trace (plain or gzip) lazily: ``header`` first, then iterate.

    A malformed line raises ``TraceFormatError`` naming the file and line, after every
    valid snapshot before it has been yielded.  A final line cut short without its newline
    (the recorder was killed mid-write) is skipped with a warning instead, since that is
    how a crash is supposed to look.
    """

    def __init__(self, path: str | os.PathLike[str], lines: Iterator[str] | None = None):
        self.path = os.fspath(path)
        self.warnings: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.line: int | None = None  # line of the snapshot last yielded
        self._stream: IO[str] | None = None
        if lines is None:
            try:
                self._stream = _open_text(self.path)
            except OSError as exc:
                raise TraceFormatError(
                    f"cannot read the trace ({exc.strerror or exc})", path=self.path
                ) from None
            lines = iter(self._stream)
        self._lines = lines
        try:
            self.header = decode_header(json.loads(next(lines, "")))
        except (
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
            OSError,
            EOFError,
            RecursionError,
        ) as exc:
            self.close()
            raise TraceFormatError(_describe(exc), path=self.path, line=1) from None

    @classmethod
    def from_lines(cls, lines: Iterator[str], path: str) -> TraceReader:
        """A trace already open as lines (stdin, a decompressed stream)."""
        return cls(path, lines)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Snapshot]:
        line_no = 1
        stacks: tuple[StackSample, ...] = ()  # a stacks line's, for the tick after it
        non_finite = non_finite_times()  # a NaN or inf time: the tick is skipped, not fatal
        one_run = _OneRun()
        try:
            for line in self._lines:
                line_no += 1
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                    if "format" in obj and "t" not in obj:
                        self.warnings.append(
                            f"{self.path}:{line_no}: another recording's header: this file "
                            "holds more than one recording (two recorders on one path, or "
                            "files joined); only the first is read"
                        )
                        return
                    if "event" in obj:
                        if obj.get("event") == "stacks":
                            stacks += self._stacks(obj)
                        else:
                            self.events.append(obj)
                        continue
                    snapshot = decode_snapshot(obj)
                    if stacks:
                        snapshot = replace(snapshot, stacks=stacks)
                        stacks = ()
                except NonFiniteTime:
                    non_finite.note(line_no, line)
                    continue
                except (
                    ValueError,
                    TypeError,
                    KeyError,
                    AttributeError,
                    OverflowError,
                    RecursionError,
                ) as exc:
                    if not line.endswith("\n"):
                        self.warnings.append(
                            f"{self.path}:{line_no}: last line is incomplete (the recorder "
                            "stopped mid-write); ignored"
                        )
                        return
                    raise TraceFormatError(
                        f"malformed trace line ({_describe(exc)})", path=self.path, line=line_no
                    ) from None
                checked = one_run.check(snapshot, line_no, line)
                if checked is None:
                    continue
                self.line = line_no
                yield checked
        finally:
            non_finite.say(self.path, self.warnings)
            one_run.say(self.path, self.warnings)
            self.close()

    def _stacks(self, obj: dict[str, Any]) -> tuple[StackSample, ...]:
        """A stacks line's samples; one of a newer stacks version is skipped, said once."""
        version = obj.get("version")
        if isinstance(version, int) and version > STACKS_VERSION:
            note = f"{self.path}: stacks version {version} is newer than this gpumon reads; skipped"
            if note not in self.warnings:
                self.warnings.append(note)
            return ()
        return decode_stacks(obj)


class _OneRun:
    """What one recording's ticks cannot be, found as they are read and said once each:
    a tick earlier than the one before (two recorders' ticks interleaved: skipped), a GPU
    listed twice in a tick (the later reading skipped), a GPU whose uuid changes mid-file
    (said: another card, or recordings joined)."""

    def __init__(self) -> None:
        self.back = Tally(
            "tick(s) earlier than the tick before them: not one recording's ticks (two "
            "recorders on one file?); skipped"
        )
        self.twice = Tally("tick(s) listing a GPU twice: the later reading of it skipped")
        self.uuids: dict[int, str] = {}
        self.changed: list[str] = []
        self.last_t = -_INF

    def check(self, snap: Snapshot, line_no: int, line: str) -> Snapshot | None:
        if snap.t_s < self.last_t:
            self.back.note(line_no, line)
            return None
        self.last_t = snap.t_s
        gpus = snap.gpus
        uuids = self.uuids
        for g in gpus:
            known = uuids.setdefault(g.gpu, g.uuid)
            if known != g.uuid:
                uuids[g.gpu] = g.uuid
                unknown = known.startswith("unknown-gpu-") or g.uuid.startswith("unknown-gpu-")
                if not unknown and len(self.changed) < 8:  # the first few are enough
                    self.changed.append(
                        f"line {line_no}: GPU {g.gpu} is {g.uuid}, {known} before: not one "
                        "run's GPU (another card at that index, or recordings joined)"
                    )
        if len(gpus) > 1 and len({g.gpu for g in gpus}) < len(gpus):
            self.twice.note(line_no, line)
            firsts: dict[int, GpuSample] = {}
            for g in gpus:
                firsts.setdefault(g.gpu, g)
            return replace(snap, gpus=tuple(firsts.values()))
        return snap

    def say(self, path: str, warns: list[str]) -> None:
        self.back.say(path, warns)
        self.twice.say(path, warns)
        warns.extend(f"{path}: {c}" for c in self.changed)


def _describe(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"invalid JSON at column {exc.colno}: {exc.msg}"
    if isinstance(exc, KeyError):
        return f"missing field {exc}"
    if isinstance(exc, RecursionError):
        return "JSON nested too deeply"
    return str(exc)


def read_trace(path: str | os.PathLike[str]) -> tuple[TraceHeader, list[Snapshot]]:
    """Read a whole trace into memory (tests, small files)."""
    reader = TraceReader(path)
    return reader.header, list(reader)


# --- as one of the readers ``gpumon analyze`` chooses from --------------------------------


def sniff(head: list[str]) -> bool:
    first = next((ln for ln in head if ln.strip()), "")
    return first.lstrip("\ufeff").startswith("{") and FORMAT_NAME in first


class _Tracked:
    """A trace's snapshots, knowing the line of the one last yielded (``line``)."""

    def __init__(self, reader: TraceReader):
        self._reader = reader
        self._it = iter(reader)

    @property
    def line(self) -> int | None:
        return self._reader.line

    def __iter__(self) -> Iterator[Snapshot]:
        return self

    def __next__(self) -> Snapshot:
        return next(self._it)

    def close(self) -> None:
        self._it.close()  # type: ignore[attr-defined]


def read(
    lines: Iterable[str] | Source,
    path: str = "<input>",
    warnings: list[str] | None = None,
    interval_s: float | None = None,
) -> tuple[TraceHeader, Iterator[Snapshot]]:
    """A gpumon trace from lines (``interval_s`` unused: a trace carries its times)."""
    src = as_source(lines, path)
    _check_header(src.head, path)
    reader = TraceReader.from_lines(src.lines(), path)
    if warnings is not None:
        reader.warnings = warnings
    return reader.header, _Tracked(reader)


def _check_header(head: list[str], path: str) -> None:
    first = next((ln for ln in head if ln.strip()), "")
    try:
        obj = json.loads(first)
    except (ValueError, RecursionError):
        raise TraceFormatError(
            f"not a gpumon trace: its first line is not JSON ({shown(first.strip())!r}); "
            "leave out --format to let gpumon detect the format",
            path=path,
            line=1,
        ) from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
        raise TraceFormatError(
            f'not a gpumon trace: its first line lacks "format": "{FORMAT_NAME}"; leave out '
            "--format to let gpumon detect the format",
            path=path,
            line=1,
        )


READER = Reader(
    "gpumon",
    'gpumon trace (JSON lines with a "format": "gpumon-trace" header)',
    sniff,
    read,
    checks_own_header=True,
    own_clock=True,
)
