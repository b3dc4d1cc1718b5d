"""GPU columns for dstat and dool: the logic behind ``dstat --gpu`` and ``dool --gpu``.

dstat (Debian's 0.7.4) and dool ``exec()`` a plugin file inside their ``main()``; the
plugin files (``dstat_plugins/dstat_gpu.py``, ``dool_gpu.py``) only put gpumon on
``sys.path`` and call :func:`plugin_class` with the host's base class and globals, so all
the logic lives here, importable and testable without dstat.

Per tick, the plugin asks a :class:`~gpumon.engine.Session` (NVML, no host, and the
detector) for a snapshot.  Utilisation is the mean of the driver's buffered samples since
the previous definitive tick, so nothing between dstat's ticks is lost; the state is that of the
detector's open episode for each GPU (what its verdict would say, followed through its
updates rather than built every tick), so the detector runs across ticks for the whole
dstat session.  The driver's buffer (up to ~20 s before dstat started) is fed to the
detector on the first tick, so a verdict is there within seconds rather than after a full
window.

dstat prints an exception raised by ``extract()`` on stdout every tick, and dool dies of
it: ``extract()`` here never raises.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from gpumon.model import GpuSample, Reason, State

if TYPE_CHECKING:
    from gpumon.engine import Session

# The state words of the dstat column (5 characters at most: the column is 5 wide).
WORDS: dict[State, str] = {
    State.HEALTHY: "ok",
    State.STARVED: "STARV",
    State.SYNC_STALL: "SYNC",
    State.IDLE: "idle",
    State.UNKNOWN: "?",
}
LOST = "lost"
# The aggregate band shows the worst word across GPUs: a lost GPU first, then the states
# that cost training time, then an idle GPU (a GPU doing nothing is waste), then "no
# verdict yet", then ok.
_RANK = {LOST: 5, "STARV": 4, "SYNC": 3, "idle": 2, "?": 1, "ok": 0}
# What the CSV (--output) writes for each word: the detector's own names, easier to
# read back than the screen's abbreviations.
CSV_WORDS = {
    "ok": "healthy",
    "STARV": "starved",
    "SYNC": "sync_stall",
    "idle": "idle",
    "?": "unknown",
    LOST: "lost",
}

# (header, width) of the columns of one band: utilisation %, memory used %, state word.
COLUMNS: tuple[tuple[str, int], ...] = (("util", 4), ("mem", 3), ("state", 5))
BAND_WIDTH = sum(w for _, w in COLUMNS) + len(COLUMNS) - 1


# Internal marker for the detector's start-up (state idle, reason start-up).
STARTUP = "start-up"
STARTUP_BUSY_PCT = 5.0


def _word(state: State, reason: Reason | None) -> str:
    if state is State.IDLE and reason is Reason.START_UP:
        return STARTUP
    return WORDS.get(state, "?")


class PluginLoadError(Exception):
    """Why the plugin cannot run; dstat prints it as ``Module dstat_gpu failed to load. (..)``."""


@dataclass(frozen=True, slots=True)
class GpuCell:
    """What one band shows for one GPU (or, with ``gpu=None``, for all of them)."""

    gpu: int | None
    util_pct: float | None
    mem_pct: float | None
    word: str


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def aggregate(cells: Sequence[GpuCell]) -> GpuCell:
    """The compact band: mean utilisation and memory over the GPUs read, worst state."""
    util = mean([c.util_pct for c in cells if c.util_pct is not None])
    mem = mean([c.mem_pct for c in cells if c.mem_pct is not None])
    word = max((c.word for c in cells), key=lambda w: _RANK.get(w, 1), default="?")
    return GpuCell(gpu=None, util_pct=util, mem_pct=mem, word=word)


class GpuColumns:
    """Samples every GPU per dstat tick and keeps the detector running across ticks.

    ``session_factory`` builds the session in :meth:`start` (tests pass stand-ins).
    """

    def __init__(
        self,
        session_factory: Callable[[], Session] | None = None,
        *,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self._factory = session_factory or default_session
        self._warn = warn or _stderr
        self.session: Session | None = None
        self.gpus: tuple[int, ...] = ()
        self.cells: tuple[GpuCell, ...] = ()
        # Utilisation points since the last definitive tick, per GPU index.
        self._points: dict[int, list[float]] = {}
        self._window_start = float("-inf")
        self._warned: set[str] = set()

    def start(self, interval_s: float = 1.0) -> None:
        """Open NVML and find the GPUs; raises PluginLoadError with one clear reason."""
        from gpumon.errors import GpumonError

        try:
            self.session = self._factory()
        except GpumonError as exc:
            raise PluginLoadError(str(exc).rstrip(".")) from None
        except Exception as exc:  # an unexpected NVML or import failure: say what it was
            raise PluginLoadError(f"cannot read GPUs: {type(exc).__name__}: {exc}") from None
        self.gpus = tuple(g.index for g in self.session.gpus)
        if not self.gpus:
            raise PluginLoadError("the NVIDIA driver reports no GPU on this machine")
        self._window_start = time.monotonic() - interval_s
        self.cells = tuple(GpuCell(i, None, None, "?") for i in self.gpus)

    def tick(self, final: bool = True) -> tuple[GpuCell, ...]:
        """Read every GPU once; ``final`` ends the utilisation window.  Never raises."""
        try:
            self.cells = self._tick(final)
        except Exception as exc:  # dstat would print it on stdout every tick; dool would die
            self.warn_once("tick", f"dstat_gpu: reading the GPUs failed: {exc!r}")
            self.cells = tuple(GpuCell(i, None, None, "?") for i in self.gpus)
        return self.cells

    def _tick(self, final: bool) -> tuple[GpuCell, ...]:
        assert self.session is not None, "start() first"
        reading = self.session.read()  # the GPUs' numbers
        words: dict[int, str] = {}
        try:
            self.session.fold(reading)  # the detector judges them
            words = self._words()
        except Exception as exc:  # keep the numbers coming even if the detector breaks
            self.warn_once("verdict", f"dstat_gpu: the detector failed: {exc!r}")
        view = reading.polled.view
        cells = [self._cell(g, words.get(g.gpu, "?")) for g in view.gpus]
        if final:
            self._points.clear()
            self._window_start = view.t_s
        return tuple(cells)

    def _words(self) -> dict[int, str]:
        """Each GPU's word from the episode the detector has open for it (state and
        reason only: no full verdict, with evidence and advice, per tick)."""
        assert self.session is not None
        return {
            gpu: _word(ep.state, ep.reason)
            for gpu, ep in self.session.open_episodes().items()
            if gpu is not None  # the run's own episode: not a column
        }

    def _cell(self, g: GpuSample, word: str) -> GpuCell:
        if g.lost:
            self._points.pop(g.gpu, None)
            return GpuCell(g.gpu, None, None, LOST)
        pts = self._points.setdefault(g.gpu, [])
        pts.extend(u for t, u in g.util_samples if t > self._window_start)
        util = mean(pts)
        if util is None:  # no driver buffer (MIG, old GPU) or nothing new: the 1-s rate
            util = g.util_pct
        mem = None
        if g.mem_used_bytes is not None and g.mem_total_bytes:
            mem = 100.0 * g.mem_used_bytes / g.mem_total_bytes
        if word == STARTUP:
            # The detector calls every GPU idle until its first full window of work (the
            # driver's backlog gives it one on the second tick; without a backlog, ~10 s of
            # ticks): a busy GPU then has no verdict yet; a quiet one is idle.
            word = "idle" if util is None or util < STARTUP_BUSY_PCT else "?"
        return GpuCell(g.gpu, util, mem, word)

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self._warn(message)


def default_session() -> Session:
    """NVML + detector, no host sampling: the dstat columns show only GPU facts.

    ``backlog`` keeps the driver's buffered history on the first tick, so the detector
    has a full window to judge from the start.
    """
    from gpumon.engine import LiveOptions, Session

    return Session.live(LiveOptions(host=False, backlog=True))


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


# --- rendering inside dstat / dool ---------------------------------------------------------


class _Host:
    """The host program's globals (``op``, ``step``, ``theme``, ``cprint``...), read live.

    dstat rebinds ``step`` and edits ``theme`` as it runs, so nothing is copied.
    """

    def __init__(self, g: MutableMapping[str, Any], kind: str) -> None:
        self.g = g
        self.kind = kind

    @property
    def op(self) -> Any:
        return self.g["op"]

    def final(self) -> bool:
        """True on the definitive step of a tick (dstat updates the line in between)."""
        try:
            return bool(self.g.get("step", self.op.delay) == self.op.delay)
        except Exception:
            return True

    def theme(self, key: str) -> str:
        value = self.g.get("theme", {}).get(key, "")
        return value if isinstance(value, str) else ""

    def color(self, key: str) -> str:
        value = self.g.get("color", {}).get(key, "")
        return value if isinstance(value, str) else ""

    def char(self, key: str, default: str) -> str:
        return str(self.g.get("char", {}).get(key, default))

    def percent(self, value: float | None, width: int) -> str:
        """A percentage the way dstat colours its own (``cprint`` with scale 34)."""
        if value is None:
            return self.theme("text_lo") + "-".rjust(width) + self.theme("default")
        cprint = self.g.get("cprint")
        if cprint is not None:
            try:
                return str(cprint(value, "p", width, 34))
            except Exception:
                pass
        return str(round(value)).rjust(width)

    def word(self, word: str, width: int) -> str:
        colour = {
            "ok": self.color("green"),
            "STARV": self.color("red"),
            "SYNC": self.color("yellow"),
            "idle": self.theme("text_lo"),
            "?": self.theme("unit_hi") or self.color("darkgray"),
            LOST: self.theme("error"),
        }.get(word, "")
        return colour + word[:width].ljust(width) + self.theme("default")


def install_csv_types(g: MutableMapping[str, Any]) -> None:
    """Repair Debian dstat 0.7.4's ``--output``: its ``showcsv()`` uses ``types.ListType``
    but never imports ``types`` (a NameError that kills the run).  A stand-in in dstat's
    globals makes CSV work for every plugin of the run."""
    if "types" not in g:
        g["types"] = SimpleNamespace(ListType=list, TupleType=tuple, StringType=str)


def _csv_number(value: float | None) -> str:
    """dstat's own CSV number format; empty where there is no reading."""
    if value is None:
        return ""
    if value != round(value):
        return f"{value:.3f}"
    return str(round(value))


def plugin_class(base: type, g: MutableMapping[str, Any], kind: str = "dstat") -> type:
    """Build the plugin class for dstat (``kind="dstat"``) or dool (``kind="dool"``).

    ``base`` is the host's plugin base class and ``g`` its module globals; the returned
    class is what ``dstat_plugin`` / ``dool_plugin`` must be.
    """
    host = _Host(g, kind)

    class GpuPlugin(base):
        """gpumon's GPU band(s): utilisation, memory and the detector's verdict."""

        def __init__(self, columns: GpuColumns | None = None) -> None:
            self.gpumon = columns or GpuColumns()
            self.full = False
            self.name: str | list[str] = "gpu"
            self.nick = tuple(n for n, _ in COLUMNS)
            self.vars: list[str] = list(self.nick)
            self.val: dict[str, tuple[float | None, float | None, str]] = {}
            self.type = "s"
            self.width = BAND_WIDTH
            self.scale = 0
            self.cols = 0

        # dstat calls check() then prepare() at load; an exception there is reported as
        # "Module dstat_gpu failed to load. (<message>)" and dstat carries on without it.
        def check(self) -> bool:
            try:
                delay = float(host.op.delay)
            except Exception:
                delay = 1.0
            self.gpumon.start(delay)
            if kind == "dstat":
                install_csv_types(g)
            return True

        def prepare(self) -> None:
            try:
                self.full = bool(host.op.full)
            except Exception:
                self.full = False
            gpus = self.gpumon.gpus
            if len(gpus) == 1:
                self.name = f"gpu{gpus[0]}"
            elif self.full:
                self.name = [f"gpu{i}" for i in gpus]
            else:
                self.name = "total-gpu"
            # One key per band, as dstat's multi-instance plugins have.
            self.vars = [self.name] if isinstance(self.name, str) else list(self.name)
            self.val = {v: (None, None, "?") for v in self.vars}

        def _bands(self) -> list[GpuCell]:
            cells = list(self.gpumon.cells)
            if not cells:
                return [GpuCell(None, None, None, "?")] * len(self.vars)
            if len(self.vars) == 1 and len(cells) > 1:
                return [aggregate(cells)]
            return cells[: len(self.vars)]

        def extract(self) -> None:
            try:
                self.gpumon.tick(final=host.final())
                for var, cell in zip(self.vars, self._bands(), strict=False):
                    self.val[var] = (cell.util_pct, cell.mem_pct, cell.word)
            except Exception as exc:  # never let dstat print a traceback per tick
                self.gpumon.warn_once("extract", f"dstat_gpu: {exc!r}")

        # --- layout: three columns of different widths in each band ------------------
        def statwidth(self) -> int:
            return len(self.vars) * BAND_WIDTH + len(self.vars) - 1

        def colwidth(self) -> int:
            return BAND_WIDTH

        def title(self) -> str:
            names = [self.name] if isinstance(self.name, str) else list(self.name)
            dash = host.char("dash", "-")
            sep = host.char("space", " ")
            if getattr(host.op, "color", False):  # as dstat's own multi-band titles
                sep = host.theme("frame") + dash + host.theme("title")
            parts = [n[:BAND_WIDTH].center(BAND_WIDTH).replace(" ", dash) for n in names]
            return host.theme("title") + sep.join(parts) + host.theme("default")

        def subtitle(self) -> str:
            band = " ".join(
                host.theme("subtitle") + nick[:w].center(w) + host.theme("default")
                for nick, w in COLUMNS
            )
            colon = host.theme("frame") + host.char("colon", ":")
            return colon.join([band] * len(self.vars))

        def show(self) -> str:
            colon = host.theme("subframe" if kind == "dool" else "frame") + host.char("colon", ":")
            out = []
            for var in self.vars:
                util, mem, word = self.val.get(var, (None, None, "?"))
                (_, wu), (_, wm), (_, ws) = COLUMNS
                util = util if isinstance(util, int | float) else None
                mem = mem if isinstance(mem, int | float) else None
                out.append(
                    host.percent(util, wu)
                    + " "
                    + host.percent(mem, wm)
                    + " "
                    + host.word(str(word), ws)
                )
            return colon.join(out)

        def showcsv(self) -> str:
            sep = host.char("sep", ",")
            out = []
            for var in self.vars:
                util, mem, word = self.val.get(var, (None, None, "?"))
                num_u = util if isinstance(util, int | float) else None
                num_m = mem if isinstance(mem, int | float) else None
                out += [_csv_number(num_u), _csv_number(num_m), CSV_WORDS.get(str(word), "unknown")]
            return sep.join(out)

    GpuPlugin.__name__ = GpuPlugin.__qualname__ = f"{kind}_plugin"
    return GpuPlugin


__all__: Sequence[str] = (
    "COLUMNS",
    "CSV_WORDS",
    "LOST",
    "WORDS",
    "GpuCell",
    "GpuColumns",
    "PluginLoadError",
    "aggregate",
    "install_csv_types",
    "plugin_class",
)
