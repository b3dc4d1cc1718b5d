"""Pieces several faces share: argument types and writing a tick to a trace."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpumon.errors import GpumonError

if TYPE_CHECKING:
    from gpumon.model import Snapshot
    from gpumon.traces.jsonl import TraceWriter


# Seconds between ticks, for every face that samples (record, watch, serve, demo): below
# 50 ms a tick is a busy loop that costs more than it tells (the driver samples every
# 1/6 s at best); above a minute the driver's buffer of samples (about 20 s) has long
# been overwritten between ticks, and a face answers its stop only at the next tick.
MIN_INTERVAL_S = 0.05
MAX_INTERVAL_S = 60.0


def positive_float(text: str) -> float:
    """A finite number above 0 (``inf``, ``1e400`` and ``nan`` are refused: no wait or
    deadline can be computed from them)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number: {text!r}")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0: {text!r}")
    return value


def check_interval(value: object) -> float:
    """Seconds between ticks, checked against the one range every face takes;
    ValueError saying the range otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"must be a number of seconds, not {value!r}")
    if not MIN_INTERVAL_S <= value <= MAX_INTERVAL_S:
        raise ValueError(
            f"must be between {MIN_INTERVAL_S:g} and {MAX_INTERVAL_S:g} seconds, not {value!r}"
        )
    return float(value)


def interval(text: str) -> float:
    """``--interval S`` for argparse (``check_interval``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    try:
        return check_interval(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def write_tick(writer: TraceWriter, snapshot: Snapshot, path: str) -> None:
    """Append one tick to a trace; a failed write (full disk) becomes one clear sentence."""
    try:
        writer.write(snapshot)
    except OSError as exc:
        raise GpumonError(
            f"writing {path} failed ({exc.strerror or exc}); the ticks before this one are "
            "intact in the file."
        ) from None


def finite_json(obj: object) -> object:
    """NaN/inf would make the output invalid JSON; they are "no value" (null)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_json(v) for v in obj]
    return obj


# Seconds of spinning before a hang, as serve's ``[detector] hang_after_s`` and watch's
# ``--hang-after`` take them: at least a few ticks of spinning, at most a day.
HANG_AFTER_MIN_S, HANG_AFTER_MAX_S = 10.0, 86400.0


# A recording made with detector settings of its own (watch --window, --hang-after) names
# them in its header's ``extra`` under this key, so that analyze of it judges as watch did.
RECORDED_SETTINGS = "detector"
_SETTING_RANGES = {
    "window_s": (1e-3, HANG_AFTER_MAX_S),
    "hang_after_s": (HANG_AFTER_MIN_S, HANG_AFTER_MAX_S),
}


def recorded_settings(window_s: float | None, hang_after_s: float | None) -> dict[str, object]:
    """The header ``extra`` of a recording judged with these settings (those set only: a
    recording made with the defaults says nothing, and is analysed with analyze's own)."""
    chosen = {
        name: value
        for name, value in (("window_s", window_s), ("hang_after_s", hang_after_s))
        if value is not None
    }
    return {RECORDED_SETTINGS: chosen} if chosen else {}


def settings_in(extra: Mapping[str, object]) -> tuple[dict[str, float], list[str]]:
    """The detector settings a recording's header names, and what in them was ignored
    (a header edited by hand, or written by another tool, is read, never trusted)."""
    named = extra.get(RECORDED_SETTINGS)
    if named is None:
        return {}, []
    if not isinstance(named, Mapping):
        return {}, [f"{RECORDED_SETTINGS}: not a table of settings"]
    settings: dict[str, float] = {}
    ignored = []
    for name, value in named.items():
        span = _SETTING_RANGES.get(name)
        if span is None:
            ignored.append(f"{name}: not a setting this gpumon knows")
        elif (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (math.isfinite(value) and span[0] <= value <= span[1])
        ):
            ignored.append(f"{name}: {value!r} is not {span[0]:g} to {span[1]:g} seconds")
        else:
            settings[name] = float(value)
    return settings, ignored


def hang_after_arg(text: str) -> float:
    """``--hang-after S`` (watch, analyze): seconds, in the range serve's configuration
    takes."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and HANG_AFTER_MIN_S <= value <= HANG_AFTER_MAX_S):
        raise argparse.ArgumentTypeError(
            f"must be between {HANG_AFTER_MIN_S:g} and {HANG_AFTER_MAX_S:g} seconds: {text!r}"
        )
    return value
