"""What every log reader is: a name, a line saying what it reads, how it is recognised and
how it reads.

Each reader module declares one ``Reader`` (``tabular`` three: one table reader, three
vocabularies) and ``sniff.READERS`` lists them once, in the order content detection asks
them: ``--format``'s choices, the error listing the formats tried, detection and dispatch
all come from that list.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from gpumon.model import Snapshot, TraceHeader
from gpumon.traces.source import Source


class Sniff(Protocol):
    """Whether a log's first lines (each cut to ``sniff.SNIFF_LINE``) are in this format."""

    def __call__(self, head: list[str], /) -> bool: ...


class Read(Protocol):
    """The log's header now and its snapshots lazily.  ``lines`` keep their line endings
    (a last line without one was cut short); ``warnings`` collects what was skipped or
    assumed (complete once the snapshots are exhausted); ``interval_s`` is the user's word
    on the seconds between rows of a log that carries no times."""

    def __call__(
        self,
        lines: Iterable[str] | Source,
        path: str = "<input>",
        warnings: list[str] | None = None,
        interval_s: float | None = None,
    ) -> tuple[TraceHeader, Iterator[Snapshot]]: ...


@dataclass(frozen=True)
class Reader:
    """One format gpumon reads.

    ``name``: what ``--format`` takes and ``gpumon analyze`` prints.  ``description``:
    one line, named in the error for a file no reader recognises.  ``sniff``: recognises
    the format from the head.  ``read``: reads it.  ``checks_own_header``: the reader
    names what is wrong with a file forced on it (``--format``) itself, instead of being
    refused when its sniff says no.  ``own_clock``: the format's times come from gpumon's
    own monotonic clock, so a clock frozen across every tick needs no warning.
    """

    name: str
    description: str
    sniff: Sniff
    read: Read
    checks_own_header: bool = False
    own_clock: bool = False
