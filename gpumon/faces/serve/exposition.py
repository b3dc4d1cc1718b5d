"""The exposition of a scrape, written in one pass: the bytes prometheus_client writes, at a
third of its cost.

client_python's encoders check every metric and label name of every sample against the
legacy character set, escape every sample's name character by character (OpenMetrics) and
format each line through ``str.format``: three quarters of a scrape of 8 GPUs went there
(~1,000 series).  gpumon's names are its own, fixed identifiers, so each is checked once
(the first scrape) and then written as it is; label values are escaped only where they
hold a character that needs it.  The text is byte for byte what ``choose_encoder``'s
encoder writes (tests/test_exposition.py holds it to that).  Only the two formats scrapers
ask for with the default escaping are written here -- text 0.0.4 (``curl``, an Accept
without OpenMetrics) and OpenMetrics 1.0.0 (Prometheus) -- and only families of plain
samples; anything else (another escaping, a name outside the legacy set, a timestamp, an
exemplar, a native histogram) is handed, families already collected, to client_python's
own encoder.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import exposition
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

Encoder = Callable[[Collector], bytes]

# Names both encoders write unchanged under the default escaping (metric names with a
# colon are left to client_python: OpenMetrics escapes it in sample names).
_PLAIN_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
# The text format moves these samples (OpenMetrics-only) to families of their own.
_OM_ONLY = ("_created", "_gsum", "_gcount")
_TEXT_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}
_TEXT_SUFFIX = {"counter": "_total", "info": "_info"}


class _Unusual(Exception):
    """Something only client_python's encoder writes (see the module docstring)."""


class _Families:
    """Families already collected, as a registry for client_python's encoder."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def choose(accept_header: str) -> tuple[Encoder, str]:
    """The encoder and content type for a scrape's Accept header, as client_python's
    ``choose_encoder`` chooses them; the one-pass writer where it writes the same bytes."""
    chosen, content_type = exposition.choose_encoder(accept_header)
    fmt = _format_of(chosen)
    if fmt is None:
        return chosen, content_type

    def encode(registry: Collector) -> bytes:
        families = list(registry.collect())  # collected once, whoever writes them
        try:
            return _write(families, openmetrics_format=fmt == "openmetrics")
        except _Unusual:
            return chosen(_Families(families))

    return encode, content_type


def _format_of(chosen: Encoder) -> str | None:
    """ "text" or "openmetrics" where ``chosen`` is one written here, else None."""
    func, kw = chosen, {}
    if isinstance(chosen, functools.partial):
        func, kw = chosen.func, chosen.keywords
    if kw.get("escaping", openmetrics.UNDERSCORES) != openmetrics.UNDERSCORES:
        return None
    if func is exposition.generate_latest:
        return "text"
    if func is openmetrics.generate_latest and kw.get("version", "1.0.0") == "1.0.0":
        return "openmetrics"
    return None


_checked: set[str] = set()  # names seen plain (they are few and fixed: bounded)


def _plain(name: str) -> str:
    if name not in _checked:
        if not _PLAIN_NAME.match(name) or name.startswith("__"):
            raise _Unusual(name)
        if len(_checked) < 4096:
            _checked.add(name)
    return name


def _value(v: str) -> str:
    if "\\" in v or "\n" in v or '"' in v:
        return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return v


# Label sets written before, by their items in the order given: a scrape writes the same
# few hundred sets (a GPU's, a GPU and a state's) every time.  Cleared when it outgrows
# what one scrape writes (jobs come and go).
_label_text: dict[tuple[tuple[str, str], ...], str] = {}


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    key = tuple(labels.items())
    text = _label_text.get(key)
    if text is None:
        if len(_label_text) >= 16384:
            _label_text.clear()
        pairs = [f'{_plain(k)}="{_value(v)}"' for k, v in sorted(labels.items())]
        text = _label_text[key] = "{" + ",".join(pairs) + "}"
    return text


def _write(families: Iterable[Metric], *, openmetrics_format: bool) -> bytes:
    out: list[str] = []
    add = out.append
    for metric in families:
        name, kind, doc = _plain(metric.name), metric.type, metric.documentation
        if openmetrics_format:
            head = name
            doc = doc.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        else:
            head = name + _TEXT_SUFFIX.get(kind, "")
            kind = _TEXT_TYPES.get(kind, "untyped" if kind == "unknown" else kind)
            doc = doc.replace("\\", r"\\").replace("\n", r"\n")
        add(f"# HELP {head} {doc}\n# TYPE {head} {kind}\n")
        if openmetrics_format and metric.unit:
            add(f"# UNIT {head} {metric.unit}\n")
        for s in metric.samples:
            if s.timestamp is not None or s.exemplar or s.native_histogram:
                raise _Unusual(s.name)
            if (
                not openmetrics_format
                and s.name.startswith(metric.name)
                and (s.name[len(metric.name) :] in _OM_ONLY)
            ):
                raise _Unusual(s.name)  # (moved to a family of its own: client_python's)
            # Typed a float, yet client_python's own OpenMetrics writer takes None (no value).
            raw: float | None = s.value
            value = "" if raw is None and openmetrics_format else floatToGoString(raw)
            add(f"{_plain(s.name)}{_labels(s.labels)} {value}\n")
    if openmetrics_format:
        add("# EOF\n")
    return "".join(out).encode("utf-8")
