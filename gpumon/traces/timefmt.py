"""Timestamps as logs write them, to seconds: one parser chosen per file from its first cells.

Forms read: nvidia-smi's ``2024/05/01 12:00:00.123``; ISO 8601 with ``T`` or a space, a
``.`` or ``,`` fraction (GNU ``date --iso-8601=ns`` writes a comma), ``Z`` or an offset;
epoch seconds, milliseconds, micro- or nanoseconds (told apart by magnitude); seconds since
the start, with or without an ``s`` suffix (``35s``), or ``[H:]MM:SS`` elapsed; a time of
day alone (``12:00:05``, the day rolling over at midnight); dmon's ``YYYYMMDD`` date column.

Times without a zone are read as UTC: durations stay right and results reproducible (the
header says so).  Day epochs are cached: millions of rows share a few days.  Hand-written
parsing, no regular expressions: every form is checked position by position.
"""

from __future__ import annotations

import calendar
from collections.abc import Callable, Sequence
from dataclasses import dataclass


class NonFiniteTime(ValueError):
    """A time cell that is a number but not a finite one (``nan``, ``inf``, ``1e999``): the
    row is skipped, not taken for a malformed one."""


_day_cache: dict[tuple[int, int, int], int] = {}
_DIGITS = frozenset("0123456789")


def _day(y: int, m: int, d: int) -> int:
    key = (y, m, d)
    base = _day_cache.get(key)
    if base is None:
        if not (1 <= m <= 12 and 1 <= d <= 31 and 1900 <= y <= 2200):
            raise ValueError(f"no such date {y:04d}-{m:02d}-{d:02d}")
        base = calendar.timegm((y, m, d, 0, 0, 0, 0, 0, 0))
        if len(_day_cache) < 100_000:
            _day_cache[key] = base
    return base


def _int(s: str, a: int, b: int) -> int:
    part = s[a:b]
    if len(part) != b - a or not part.isdecimal() or not part.isascii():
        raise ValueError(f"{s!r} is not a timestamp")
    return int(part)


def clock_seconds(s: str, i: int = 0) -> tuple[float, int]:
    """``HH:MM[:SS[.frac]]`` starting at ``s[i]``: (seconds into the day, index after it)."""
    h = _int(s, i, i + 2)
    if s[i + 2 : i + 3] != ":":
        raise ValueError(f"{s!r} is not a timestamp")
    mi = _int(s, i + 3, i + 5)
    j = i + 5
    sec = 0.0
    if s[j : j + 1] == ":":
        sec = float(_int(s, j + 1, j + 3))
        j += 3
        if s[j : j + 1] in (".", ","):
            k = j + 1
            while k < len(s) and s[k] in _DIGITS and k - j <= 12:
                k += 1
            if k == j + 1:
                raise ValueError(f"{s!r} is not a timestamp")
            sec += float("0." + s[j + 1 : k])
            j = k
    if h > 24 or mi > 59 or sec >= 61:
        raise ValueError(f"{s!r} is not a timestamp")
    return h * 3600 + mi * 60 + sec, j


def _zone(s: str, j: int) -> float:
    """The offset (seconds east of UTC) written from ``s[j]`` on; 0 when none."""
    rest = s[j:].strip()
    if not rest or rest in ("Z", "z", "UTC", "GMT"):
        return 0.0
    sign = rest[0]
    if sign not in "+-" or len(rest) > 6:
        raise ValueError(f"{s!r} is not a timestamp")
    digits = rest[1:].replace(":", "")
    if not digits.isdecimal() or len(digits) not in (2, 4):
        raise ValueError(f"{s!r} is not a timestamp")
    offset = int(digits[:2]) * 3600 + (int(digits[2:]) * 60 if len(digits) == 4 else 0)
    return offset if sign == "+" else -offset


_day_text: dict[str, int] = {}


def date_time(cell: str) -> float:
    """``YYYY?MM?DD[T ]HH:MM[:SS[.f]][zone]`` (``?`` any of ``-/.``) as Unix seconds.

    The fast path (a day already seen, no zone) costs a dict lookup and three conversions:
    nvidia-smi logs call this once per tick, millions of times.
    """
    s = cell.strip()
    base = _day_text.get(s[:10])
    if base is not None and s[13:14] == ":":
        try:
            return base + int(s[11:13]) * 3600 + int(s[14:16]) * 60 + float(s[17:])
        except ValueError:
            pass  # a zone, a comma fraction, no seconds: the full parse below
    return _date_time(s)


def _date_time(cell: str) -> float:
    s = cell.strip('"').strip()
    if len(s) < 16 or s[4] not in "-/." or s[7] != s[4] or s[10] not in "T t_":
        raise ValueError(f"{s!r} is not a timestamp")
    base = _day(_int(s, 0, 4), _int(s, 5, 7), _int(s, 8, 10))
    secs, j = clock_seconds(s, 11)
    zone = _zone(s, j)
    if len(_day_text) < 100_000:
        _day_text[s[:10]] = base
    return base + secs - zone


def date_only(cell: str) -> int:
    """A date column alone: ``YYYYMMDD`` (dmon), ``YYYY-MM-DD``, ``YYYY/MM/DD``."""
    s = cell.strip()
    if len(s) == 8 and s.isdecimal():
        return _day(int(s[0:4]), int(s[4:6]), int(s[6:8]))
    if len(s) == 10 and s[4] in "-/." and s[7] == s[4]:
        return _day(_int(s, 0, 4), _int(s, 5, 7), _int(s, 8, 10))
    raise ValueError(f"{s!r} is not a date")


def day_first_date(cell: str, day_first: bool) -> int:
    """``DD-MM-YYYY`` or ``MM-DD-YYYY`` (separator ``-``, ``/`` or ``.``)."""
    s = cell.strip()
    if len(s) != 10 or s[2] not in "-/." or s[5] != s[2]:
        return date_only(s)
    a, b, y = _int(s, 0, 2), _int(s, 3, 5), _int(s, 6, 10)
    return _day(y, b, a) if day_first else _day(y, a, b)


def date_column(dates: Sequence[str]) -> tuple[Callable[[str], int], str | None]:
    """The parser of a date column from its first cells, and how it reads them: a
    ``DD-MM-YYYY`` or ``MM-DD-YYYY`` column is day-first when a first field exceeds 12."""
    day_first = any(int(d.strip()[:2]) > 12 for d in dates if d.strip()[:2].isdecimal())
    if dates and dates[0].strip()[2:3] in ("-", "/", "."):
        note = f"dates read as {'DD-MM-YYYY' if day_first else 'MM-DD-YYYY'}"
        return (lambda c: day_first_date(c, day_first)), note
    return date_only, None


def _elapsed(cell: str) -> float:
    s = cell.strip().strip('"').strip()
    if s.endswith("ms"):
        return float(s[:-2]) / 1000
    if s.endswith(("s", "S")):
        s = s[:-1].rstrip()
    if ":" in s:
        parts = s.split(":")
        if len(parts) > 3 or not all(parts):
            raise ValueError(f"{cell.strip()!r} is not a time")
        total = 0.0
        for p in parts:
            total = total * 60 + float(p)
        return total
    v = float(s)
    if v != v or v in (float("inf"), float("-inf")):
        raise NonFiniteTime(f"{cell.strip()!r} is not a finite time")
    return v


@dataclass(frozen=True)
class TimeParser:
    """How one file writes its times: ``parse(cell) -> seconds``.

    ``absolute``: Unix time (else seconds since the start, or a time of day).
    ``note``: how it was read, for the header (None when obvious).
    """

    kind: str
    parse: Callable[[str], float]
    absolute: bool
    note: str | None = None
    time_of_day: bool = False


def _epoch(scale: float) -> Callable[[str], float]:
    def parse(cell: str) -> float:
        v = float(cell.strip().strip('"'))
        if v != v or v in (float("inf"), float("-inf")):
            raise NonFiniteTime(f"{cell.strip()!r} is not a finite time")
        return v * scale

    return parse


def _time_of_day(cell: str) -> float:
    s = cell.strip()
    secs, j = clock_seconds(s, 0)
    if s[j:].strip():
        raise ValueError(f"{s!r} is not a time of day")
    return secs


def _looks_date_time(s: str) -> bool:
    return len(s) >= 16 and s[:4].isdecimal() and s[4] in "-/." and s[10:11] in ("T", " ", "t", "_")


_LOCAL_NOTE = "local time of the logging machine, read as UTC"
_TIME_OF_DAY = TimeParser(
    "time-of-day",
    _time_of_day,
    False,
    "times of day without a date: the first day is counted as day 0",
    time_of_day=True,
)
_ELAPSED = TimeParser("elapsed", _elapsed, False, "times are seconds since the start of the log")
_UNITS = {1.0: "seconds", 1e-3: "milliseconds", 1e-6: "microseconds", 1e-9: "ns"}


def _date_time_candidate(cells: list[str]) -> TimeParser | None:
    if not all(_looks_date_time(c) for c in cells):
        return None
    zoned = all(c.endswith(("Z", "z")) or c[-6:-5] in "+-" or c[-5:-4] in "+-" for c in cells)
    return TimeParser("datetime", date_time, True, None if zoned else _LOCAL_NOTE)


def _time_of_day_candidate(cells: list[str]) -> TimeParser | None:
    if all(len(c) == 8 and c[2] == ":" and c[5] == ":" for c in cells) or all(
        len(c) >= 8 and c[2] == ":" and c[5] == ":" and c[8:9] in (".", ",") for c in cells
    ):
        return _TIME_OF_DAY
    return None


def _numbers(cells: list[str]) -> list[float]:
    """The cells as numbers, or [] when one is not a number."""
    try:
        return [float(c) for c in cells]
    except ValueError:
        return []


def _number_scale(hi: float, lname: str) -> float:
    """Seconds per unit of a numeric time column: its name's unit, else its magnitude
    (epoch nanoseconds, microseconds, milliseconds or seconds)."""
    if lname.endswith(("_ms", "(ms)", "[ms]", " ms", "millis", "milliseconds")):
        return 1e-3
    if lname.endswith(("_us", "(us)", "[us]")):
        return 1e-6
    if lname.endswith(("_ns", "(ns)", "[ns]")) or hi > 1e17:
        return 1e-9
    if hi > 1e14:
        return 1e-6
    if hi > 1e11:
        return 1e-3
    return 1.0


def _numeric_candidate(numeric: list[float], name: str) -> TimeParser:
    hi = max(abs(v) for v in numeric)
    scale = _number_scale(hi, name.lower())
    absolute = hi * scale > 1e8  # after 1973: an epoch, else seconds since the start
    unit = _UNITS[scale]
    if absolute:
        note = f"times read as epoch {unit}"
    elif scale != 1.0:
        note = f"times are {unit} since the start of the log"
    else:
        note = "times are seconds since the start of the log"
    return TimeParser("epoch" if absolute else "elapsed", _epoch(scale), absolute, note)


def _reads_all(cand: TimeParser, cells: list[str]) -> bool:
    try:
        for c in cells:
            cand.parse(c)
    except ValueError:
        return False
    return True


def pick(samples: Sequence[str], name: str = "") -> TimeParser | None:
    """The parser that reads every one of ``samples`` (a column's first cells), or None.

    ``name`` (the column header, lower-cased) settles units a number cannot show:
    ``_ms`` milliseconds, ``(s)`` elapsed seconds.  Forms are tried from the most
    particular: a date and time, a time of day, a number, an elapsed time.
    """
    cells = [c.strip().strip('"').strip() for c in samples if c.strip().strip('"').strip()]
    if not cells:
        return None
    candidates = [_date_time_candidate(cells), _time_of_day_candidate(cells)]
    numeric = _numbers(cells)
    if numeric:
        candidates.append(_numeric_candidate(numeric, name))
    elif all(_is_elapsed(c) for c in cells):
        candidates.append(_ELAPSED)
    return next((c for c in candidates if c is not None and _reads_all(c, cells)), None)


def pick_most(samples: Sequence[str], name: str = "") -> tuple[TimeParser | None, int | None]:
    """The parser that reads more than half of ``samples``, and the index of the first cell
    it cannot read (None when it reads them all).  A garbled cell -- the first row of a log
    copied from mid-line, a typo, a NaN -- does not decide how a column writes its times;
    the row holding it is named when it is read.  Without such a parser: (None, the index
    of the first cell the likeliest parser cannot read)."""
    got = pick(samples, name)
    if got is not None:
        return got, None
    best: tuple[int, TimeParser | None, int] = (0, None, 0)
    kinds: set[str] = set()
    for cell in samples[:8]:  # the forms single cells suggest
        cand = pick([cell], name)
        if cand is None or cand.kind in kinds:
            continue
        kinds.add(cand.kind)
        reads = [_reads_all(cand, [c]) for c in samples]
        good = [c for c, ok in zip(samples, reads, strict=True) if ok]
        if len(good) > best[0]:
            best = (len(good), pick(good, name) or cand, reads.index(False))
    count, parser, first_bad = best
    if parser is not None and count * 2 > len(samples):
        return parser, first_bad
    return None, first_bad


def _is_elapsed(c: str) -> bool:
    try:
        _elapsed(c)
    except ValueError:
        return False
    return True


def rolling(parse: Callable[[str], float]) -> Callable[[str], float]:
    """``parse`` for times of day: a time more than 12 h before the last one is on the
    next day (a log running past midnight).  Stateful: one per pass over a file."""
    day = 0.0
    last = float("-inf")

    def parse_rolling(cell: str) -> float:
        nonlocal day, last
        t = parse(cell) + day
        if t < last - 43200:
            day += 86400.0
            t += 86400.0
        last = t
        return t

    return parse_rolling


_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}


def ctime_words(words: Sequence[str]) -> float | None:
    """``["Wed", "May", "1", "12:00:00", "2024"]`` (``date``/ctime, as nvidia-smi and
    gpustat print it) -> Unix seconds (read as UTC); None when the words are not one."""
    if len(words) != 5 or words[0] not in _WEEKDAYS or words[1] not in _MONTHS:
        return None
    day, hms, year = words[2], words[3].split(":"), words[4]
    if not (day.isdecimal() and len(day) <= 2 and year.isdecimal() and len(year) == 4):
        return None
    if len(hms) != 3 or not all(x.isdecimal() and len(x) <= 2 for x in hms):
        return None
    h, mi, sec = (int(x) for x in hms)
    if not (1 <= int(day) <= 31 and h < 24 and mi < 60 and sec < 61):
        return None
    return float(calendar.timegm((int(year), _MONTHS[words[1]], int(day), h, mi, sec, 0, 0, 0)))


FRAME = "=-*#[]<>|~ \t"  # what loggers frame a time line with (``=== 18:47:06 ===``)


def line_time(line: str) -> float | None:
    """The Unix time of a line that holds only a date and time, as loggers print one
    above each sample (``=== 2024-10-31 18:47:06 ===``, ``Thu Oct 31 18:47:06 UTC 2024``,
    ``[2024/10/31 18:47:06]``), or None."""
    text = line.strip().strip(FRAME)
    if not text or len(text) > 64 or not text[0].isalnum():
        return None
    words = [w for w in text.split() if w not in ("UTC", "GMT")]
    got = ctime_words(words) if len(words) == 5 else None
    if got is not None:
        return got
    parser = pick([text])
    if parser is None or not parser.absolute:
        return None
    try:
        return parser.parse(text)
    except ValueError:
        return None
