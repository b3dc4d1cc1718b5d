"""The format of gpumon serve's own messages on stderr (``--log.format``), as exporters do.

node_exporter and nvidia_gpu_exporter take ``--log.format logfmt|json`` for what they say
while running, so a journal or a log shipper can parse it; gpumon serve takes the same.
Without the flag, the messages stay ``gpumon: ...`` lines, as every gpumon command writes
them.  The events log (``--log FILE``) is JSON lines whatever this says.
"""

from __future__ import annotations

import datetime
import json
import logging
import re

FORMATS = ("logfmt", "json")
# slog's level names, as node_exporter (promslog) writes them.
_LEVELS = {logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARN"}
# A logfmt value is written bare only when nothing in it needs quoting.
_BARE = re.compile(r"^[^\s\"=\\]+$")


def _time(record: logging.LogRecord) -> str:
    t = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _level(record: logging.LogRecord) -> str:
    return _LEVELS.get(record.levelno, "ERROR" if record.levelno > logging.WARNING else "DEBUG")


def _message(record: logging.LogRecord) -> str:
    """The sentence alone: the level says what a leading "warning: " said."""
    text = record.getMessage()
    return text.removeprefix("warning: ") if record.levelno == logging.WARNING else text


class PlainFormatter(logging.Formatter):
    """``gpumon: message``, the line every gpumon command writes."""

    def format(self, record: logging.LogRecord) -> str:
        return f"gpumon: {record.getMessage()}"


class LogfmtFormatter(logging.Formatter):
    """``time=... level=INFO msg="..."``: one logfmt line per message."""

    def format(self, record: logging.LogRecord) -> str:
        pairs = {"time": _time(record), "level": _level(record), "msg": _message(record)}
        return " ".join(f"{k}={logfmt_value(v)}" for k, v in pairs.items())


class JsonFormatter(logging.Formatter):
    """``{"time": ..., "level": ..., "msg": ...}``: one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        obj = {"time": _time(record), "level": _level(record), "msg": _message(record)}
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def logfmt_value(value: str) -> str:
    """A value bare where it can be, else quoted with JSON's escapes (as Go's %q does)."""
    return value if _BARE.match(value) else json.dumps(value, ensure_ascii=False)


def formatter(name: str | None) -> logging.Formatter:
    """The formatter for ``--log.format NAME`` (None: gpumon's own lines)."""
    if name == "logfmt":
        return LogfmtFormatter()
    if name == "json":
        return JsonFormatter()
    return PlainFormatter()
