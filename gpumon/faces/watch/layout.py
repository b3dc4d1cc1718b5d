"""The full screen of `gpumon watch`, laid out by priority for the terminal it is in.

Every line is exactly one terminal row, cropped and never wrapped by the terminal or by
rich, so what fits is known before anything is drawn and no value is ever split across
lines.  Always on screen, from 80x24 up: the top line (run, state, cause, elapsed), one
timeline row per GPU (as many as fit, then "+N more" and paging), the single most useful
advice line and the footer with the keys.  What is left goes, in this order, to the rest
of that advice, the evidence, further advice, the command's output, a few rows of the
process tree, per-GPU details (memory and power bars, clocks), then the rest of the tree.
A terminal narrower than ``MIN_WIDTH`` gets the plain per-interval lines instead.
"""

from __future__ import annotations

import contextlib
import math
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from gpumon.engine import GpuMemory
from gpumon.engine.words import (
    ACTIVITY_WORDS,
    duration,
    evidence_items,
    fmt_bytes,
    share,
    short_command,
    stack_roles,
)
from gpumon.faces.watch.keys import ADVICE, HELP, ViewControls
from gpumon.faces.watch.view import (
    BLOCKS,
    HOLE,
    STATE_STYLE,
    WatchState,
    bar,
    tick_duty,
    timeline,
)
from gpumon.model import GpuVerdict, ProcessSample, Reason, State, Verdict
from gpumon.terminal import printable

MIN_WIDTH = 80
LABEL_WIDTH = 6  # "GPU 10": the label column of GPU rows and evidence lines
# Ticks drawn without a driver sample before a GPU's buffer is said to be unavailable.
SILENT_TICKS = 3
MIN_TIMELINE = 30  # cells at 80 columns (5 s of samples); half the width, less 10, wider
BAR_WIDTH = 12
TREE_FEW_ROWS = 3  # process rows shown before per-GPU details get the room
UNLIMITED = 10_000  # rows, when printed without a height (tests, a plain `console.print`)

STACKS_SPAN_S = 60.0  # the stacks panel: what the job did during the last minute's gaps

# Screen order, top to bottom.
_TOP, _STATUS, _GPUS, _ADVICE, _EVIDENCE, _STACKS, _OUTPUT, _TREE = range(8)


# --- the entry point ------------------------------------------------------------------------


def compose(
    st: WatchState, controls: ViewControls | None, *, width: int, height: int | None
) -> list[Text]:
    """The lines of the screen, each at most ``width`` cells; at most ``height`` of them
    (footer on the last) when a height is given."""
    width = max(1, width)
    if width < MIN_WIDTH:
        return _narrow(st, width, height)
    overlay = None if controls is None else controls.overlay
    paused = controls is not None and controls.paused
    top = _top_line(st, width, paused)
    if overlay == HELP:
        cmd_mode = controls is not None and controls.quit_closes_view_only
        return _framed(top, _help_lines(width, cmd_mode), _footer(controls, st, width), height)
    if overlay == ADVICE:
        advice = _all_advice(st.verdict)
        body = [_rule(f"advice ({len(advice)}, in full)", width)]
        body += (
            _advice_lines(advice, width, full=True) if advice else [_no_advice(st.verdict, width)]
        )
        body += _evidence_lines(st, _ordered(st.gpus.values()), width)
        return _framed(top, body, _footer(controls, st, width), height)
    return _main(st, controls, width, height, top)


@dataclass
class _Want:
    """Lines a part of the screen would like: ``build(n)`` gives at most ``n`` of them.

    ``replace``: an upgrade of lines already placed in its slot (it costs only the rows
    it adds); otherwise its lines go after what the slot holds.
    """

    slot: int
    build: Callable[[int], list[Text]]
    need: int
    most: int
    replace: bool = False


def _fill(musts: dict[int, list[Text]], wants: Iterable[_Want], rows: int) -> dict[int, list[Text]]:
    """Place each want in turn, as much of it as the rows left allow (never under ``need``)."""
    placed = {slot: list(lines) for slot, lines in musts.items()}
    left = rows - sum(len(x) for x in placed.values())
    for w in wants:
        have = len(placed.get(w.slot, ())) if w.replace else 0
        n = min(w.most, left + have)
        if n < w.need or n <= 0:
            continue
        lines = w.build(n)
        cost = len(lines) - have
        if not lines or cost > left:
            continue
        placed[w.slot] = lines if w.replace else [*placed.get(w.slot, ()), *lines]
        left -= cost
    return placed


def _main(
    st: WatchState, controls: ViewControls | None, width: int, height: int | None, top: Text
) -> list[Text]:
    rows = UNLIMITED if height is None else height
    v = st.verdict
    traces = _ordered(st.gpus.values())
    # The GPU page: what the musts (top, advice line, footer, the GPUs' rule) leave.
    room = max(1, rows - 4)
    start, pages, shown = 0, 1, traces
    if len(traces) > room:
        per_page = max(1, room - 1)  # one row says "+N more"
        pages = math.ceil(len(traces) / per_page)
        page = controls.page % pages if controls is not None else 0
        if controls is not None:
            controls.page = page
        start = page * per_page
        shown = traces[start : start + per_page]
    gpus = _GpuRows(st, shown, len(traces), start, width)
    advice = _all_advice(v)
    first = _advice_lines(advice[:1], width, full=True) if advice else [_no_advice(v, width)]
    first_line = first[0]
    if len(first) > 1:
        first_line = _crop(first_line.copy().append(" …"), width)
    footer = _footer(controls, st, width, page_note=gpus.page_note)
    musts = {_TOP: [top], _GPUS: gpus.lines(detail=False), _ADVICE: [first_line]}
    evidence = _evidence_lines(st, shown, width)
    more_advice = [_advice_lines([a], width, full=True, first=False) for a in advice[1:]]
    output = _output_lines(st, width)
    stacks = _stack_lines(st, width)
    tree = _TreeLines(st, width)
    detail = gpus.lines(detail=True)
    wants = [
        _Want(_STATUS, lambda n: [_status_line(st, width)], 1, 1 if st.status else 0),
        _Want(_ADVICE, lambda n: first[:n], len(first), len(first), replace=True),
        _Want(_EVIDENCE, lambda n: evidence[:n], 2, len(evidence)),
        _Want(_STACKS, lambda n: stacks[:n], 2, len(stacks)),
        _Want(_ADVICE, lambda n: _whole(more_advice, n), 1, sum(map(len, more_advice))),
        _Want(_OUTPUT, lambda n: output[:n], 2, len(output)),
        _Want(_TREE, tree.build, 4, min(tree.most, 3 + TREE_FEW_ROWS)),
        _Want(_GPUS, lambda n: detail, len(detail), len(detail), replace=True),
        _Want(_TREE, tree.build, 4, tree.most, replace=True),
    ]
    placed = _fill(musts, wants, rows - 1)  # the footer's row
    body = [line for slot in sorted(placed) for line in placed[slot]]
    if height is not None:
        body = body[: rows - 1]
        body += [Text("")] * (rows - 1 - len(body))
    return [*body, footer]


def _framed(top: Text, body: list[Text], footer: Text, height: int | None) -> list[Text]:
    """An overlay: top line, its body (cut with a mark when too long), footer."""
    if height is not None:
        room = max(0, height - 2)
        if len(body) > room:
            body = [*body[: max(0, room - 1)], Text("…", style="dim")][:room]
        body += [Text("")] * (room - len(body))
    return [top, *body, footer][: height if height is not None else None]


# --- lines and chips ------------------------------------------------------------------------


def _crop(text: Text, width: int) -> Text:
    """One row: cut at ``width`` cells with an ellipsis, never wrapped.  A line break or
    tab inside (a command line given to ``python -c``, a worker's output) is a space; any
    other control character (a process's name holding an escape sequence) is shown escaped,
    never sent to the terminal (``gpumon.terminal``)."""
    if not text.plain.isprintable():
        plain = text.plain.replace("\r", " ").replace("\n", " ").replace("\t", " ")
        text = Text(printable(plain), style=text.style)
    text.no_wrap = True
    text.overflow = "ellipsis"
    if text.cell_len > width:
        text.truncate(width, overflow="ellipsis")
    return text


def _rule(title: str, width: int, right: str = "") -> Text:
    t = Text("── ", style="dim")
    t.append(title, style="bold")
    tail = f" {right} ──" if right else ""
    fill = width - t.cell_len - 1 - Text(tail).cell_len
    t.append(" " + "─" * max(0, fill), style="dim")
    if tail:
        t.append(tail, style="dim")
    return _crop(t, width)


def _chip(label: str, value: str | Text) -> Text:
    t = Text(f"{label} ", style="dim")
    t.append(value)
    return t


def _pack(chips: Sequence[Text], width: int, label: Text | None = None) -> list[Text]:
    """Chips flowed into lines, two spaces apart, never one split across lines;
    continuation lines are indented under the first chip."""
    indent = 0 if label is None else LABEL_WIDTH + 1
    lines: list[Text] = []
    line = Text(" " * indent) if label is None else label.copy()
    if label is not None:
        line.pad_right(indent - line.cell_len)
    fresh = True
    for chip in chips:
        need = chip.cell_len + (0 if fresh else 2)
        if not fresh and line.cell_len + need > width:
            lines.append(_crop(line, width))
            line, fresh = Text(" " * indent), True
            need = chip.cell_len
        if not fresh:
            line.append("  ")
        line.append_text(chip)
        fresh = False
    if not fresh or not lines:
        lines.append(_crop(line, width))
    return lines


def _wrap(text: str, width: int, first: Text, indent: int, style: str = "") -> list[Text]:
    """Prose wrapped at spaces (never inside a word or at a hyphen) under a first-line prefix."""
    room = max(10, width - indent)
    parts = textwrap.wrap(text, room, break_on_hyphens=False, break_long_words=False) or [""]
    out = []
    for i, part in enumerate(parts):
        line = first.copy() if i == 0 else Text(" " * indent)
        line.append(part, style=style)
        out.append(_crop(line, width))
    return out


def _whole(groups: Sequence[list[Text]], n: int) -> list[Text]:
    """As many whole groups (a bullet and its wrapped lines) as fit in ``n`` rows."""
    out: list[Text] = []
    for g in groups:
        if len(out) + len(g) > n:
            break
        out += g
    return out


def _ordered(traces: Iterable[GpuMemory]) -> list[GpuMemory]:
    return sorted(traces, key=lambda t: t.identity.index)


# --- the top line and the footer --------------------------------------------------------------


def _top_line(st: WatchState, width: int, paused: bool) -> Text:
    """Run, state, cause and elapsed: the state and the clock at the right, always; the
    command gets what is left."""
    v = st.verdict
    state = State.UNKNOWN if v is None else v.state
    core = Text("state: ", style="bold")
    core.append(state.value, style=STATE_STYLE.get(state, "bold"))
    if v is not None and v.cause is not None:
        core.append("  cause: ", style="bold")
        core.append(v.cause.value, style="bold")
    stuck = no_progress_s(v)
    if stuck is not None:  # a hang says how long, always (the job will be killed)
        core.append(f"  no progress for {duration(stuck)}", style="bold red")
    clock = Text(f"  elapsed {duration(st.elapsed_s)}")
    if paused:
        clock.append("  ")
        clock.append("PAUSED", style="bold reverse")
    left = Text("gpumon watch", style="bold")
    if st.pid is not None:
        left.append(f"  pid {st.pid}")
    room = width - core.cell_len - clock.cell_len - 2
    if left.cell_len > room:
        left = Text("" if st.pid is None else f"pid {st.pid}")
    room -= left.cell_len
    note = None if v is None else v.note
    if note is None and v is None:
        note = "no verdict yet"
    if note and room >= len(note) + 4 + 12:
        core.append(f"  ({note})", style="dim")
        room -= len(note) + 4
    if st.command and room >= 12:
        cmd = short_command(st.command, room - 2)
        left.append(f"  {cmd}", style="cyan")
    line = left.copy()
    line.append(" " * max(2, width - left.cell_len - core.cell_len - clock.cell_len))
    line.append_text(core)
    line.append_text(clock)
    return _crop(line, width)


def no_progress_s(v: Verdict | None) -> float | None:
    """How long the run has made no progress, when it hangs: since its GPUs last computed."""
    if v is None or v.reason is not Reason.HANG or v.t_s is None:
        return None
    since = [g.since_s for g in v.gpus if g.reason is Reason.HANG and g.since_s is not None]
    return v.t_s - min(since) if since else None


def _footer(controls: ViewControls | None, st: WatchState, width: int, page_note: str = "") -> Text:
    """The keys, always; what the view is doing (paused, which page) at the right."""
    t = Text()
    overlay = None if controls is None else controls.overlay
    n_advice = len(_all_advice(st.verdict))
    keys = [
        ("?", "close help" if overlay == HELP else "help"),
        ("a", "close advice" if overlay == ADVICE else f"advice ({n_advice})"),
        ("g/←/→", "GPUs"),
        ("p", "resume" if controls is not None and controls.paused else "pause"),
        ("q", "close view" if controls is not None and controls.quit_closes_view_only else "quit"),
    ]
    for i, (key, what) in enumerate(keys):
        if i:
            t.append("  ")
        t.append(key, style="bold reverse")
        t.append(f" {what}")
    right = page_note
    if controls is not None and controls.paused:
        right = "paused: sampling goes on" + (f" · {page_note}" if page_note else "")
    if right and t.cell_len + 2 + len(right) <= width:
        t.append(" " * (width - t.cell_len - len(right)))
        t.append(right, style="dim")
    return _crop(t, width)


def _status_line(st: WatchState, width: int) -> Text:
    return _crop(Text(st.status or "", style="yellow"), width)


# --- GPU rows ---------------------------------------------------------------------------------

# Columns after the timeline, in screen order; dropped in _DROP order when the timeline
# would get fewer than MIN_TIMELINE cells.
_COLUMNS = ("duty", "gap", "since", "mem", "power")
_DROP = ("mem", "gap", "since", "power", "duty")


class _GpuRows:
    """One row per GPU on the page: label, state, timeline, then what numbers fit."""

    def __init__(
        self, st: WatchState, shown: list[GpuMemory], total: int, start: int, width: int
    ) -> None:
        self.st, self.shown, self.width = st, shown, width
        v = st.verdict
        self.by_uuid = {g.uuid: g for g in (v.gpus if v else ())}
        self.now = None if v is None else v.t_s
        self.more = total - len(shown)
        self.page_note = f"GPUs {start + 1}–{start + len(shown)} of {total}" if self.more else ""
        self.rows = [(t, *self._cells(t)) for t in shown]
        self._timelines: dict[tuple[str, int], tuple[Text, float]] = {}

    def _cells(self, t: GpuMemory) -> tuple[Text, Text, dict[str, str]]:
        g, gv = t.latest, self.by_uuid.get(t.identity.uuid)
        label = Text(f"GPU {t.identity.index}", style="bold")
        if g is not None and g.lost:
            state = Text("LOST", style="bold red")
        elif gv is not None:
            state = Text(gv.state.value, style=STATE_STYLE.get(gv.state, ""))
            if gv.cause is not None:
                state.append(f"/{gv.cause.value}")
        else:
            state = Text("–", style="dim")
        cells: dict[str, str] = {}
        duty = None if gv is None else gv.evidence.get("duty_cycle")
        if not isinstance(duty, int | float) and g is not None:
            duty = tick_duty(g)
        if isinstance(duty, int | float):
            cells["duty"] = f"duty {100 * duty:.0f}%"
        gap = None if gv is None else gv.evidence.get("gap_p50_s")
        if isinstance(gap, int | float):
            cells["gap"] = f"gap {gap:.2f}s"
        since = self._since(gv)
        if since:
            cells["since"] = f"for {since}"
        used = None if g is None else g.mem_used_bytes
        total = (None if g is None else g.mem_total_bytes) or t.identity.mem_total_bytes
        if used is not None:
            cells["mem"] = _fmt_mem(used, total)
        power = None if g is None else g.power_watts
        limit = (None if g is None else g.power_limit_watts) or t.identity.power_limit_watts
        if power is not None:
            cells["power"] = f"{power:.0f}/{limit:.0f} W" if limit else f"{power:.0f} W"
        return label, state, cells

    def _since(self, gv: GpuVerdict | None) -> str | None:
        if gv is None or gv.since_s is None or self.now is None or self.now < gv.since_s:
            return None
        return duration(self.now - gv.since_s)

    def lines(self, *, detail: bool) -> list[Text]:
        if self.st.waiting:
            return [_rule("GPUs", self.width), *_waiting_lines(self.st, self.width)]
        state_w = max((r[2].cell_len for r in self.rows), default=0)
        widths = {c: max((len(r[3].get(c, "")) for r in self.rows), default=0) for c in _COLUMNS}
        cols = [c for c in _COLUMNS if widths[c]]
        fixed = LABEL_WIDTH + 1 + state_w + 1
        least = max(MIN_TIMELINE, self.width // 2 - 10)  # the timeline is the signature
        for c in _DROP:
            if self.width - fixed - sum(widths[x] + 1 for x in cols) >= least:
                break
            if c in cols:
                cols.remove(c)
        tl_width = max(10, self.width - fixed - sum(widths[x] + 1 for x in cols))
        out: list[Text] = []
        spans: list[float] = []
        for trace, label, state, cells in self.rows:
            line = label.copy()
            line.pad_right(LABEL_WIDTH + 1 - line.cell_len)
            line.append_text(state)
            line.pad_right(fixed - line.cell_len)
            key = (trace.identity.uuid, tl_width)
            if key not in self._timelines:  # the rows and the detailed rows draw it alike
                self._timelines[key] = timeline(list(trace.points), tl_width)
            tl, span = self._timelines[key]
            spans.append(span)
            line.append_text(tl)
            for c in cols:
                value = cells.get(c, "")
                line.append(" " + value.rjust(widths[c]), style="" if c == "duty" else "dim")
            out.append(_crop(line, self.width))
            if detail:
                out += _pack(self._details(trace, "since" not in cols), self.width, Text(""))
        head = [_rule("GPUs", self.width, self._rule_note(spans))]
        if self.more:
            out.append(
                _crop(
                    Text(
                        f"+{self.more} more GPUs: g or → shows the next page, ← the previous",
                        style="dim",
                    ),
                    self.width,
                )
            )
        return head + out

    def _rule_note(self, spans: list[float]) -> str:
        # The first tick reads before the driver has recorded a sample for gpumon (its
        # buffer is read from the moment gpumon started), so it is drawn per tick: only a
        # buffer that stays silent over several ticks is said to be unavailable.
        ticks = [t.identity.index for t in self.shown if t.from_ticks]
        silent = [t for t in self.shown if t.from_ticks and len(t.points) >= SILENT_TICKS]
        if ticks and len(ticks) == len(self.shown):
            kind = (
                "per tick: the driver's sample buffer is unavailable"
                if len(silent) == len(self.shown)
                else "per tick until the driver's samples arrive"
            )
        else:
            kind = "one character per driver sample, newest right"
            if silent:
                which = ", ".join(str(t.identity.index) for t in silent)
                kind += f" (per tick on GPU {which}: no sample buffer)"
        span = max(spans, default=0.0)
        note = f"{kind} · last {span:.0f}s" if span else kind
        return f"{note} · {self.page_note}" if self.page_note else note

    def _details(self, t: GpuMemory, since: bool) -> list[Text]:
        """Memory and power as bars, the GPU's name, clocks and processes."""
        ident, g = t.identity, t.latest
        used = None if g is None else g.mem_used_bytes
        total = (None if g is None else g.mem_total_bytes) or ident.mem_total_bytes
        power = None if g is None else g.power_watts
        limit = (None if g is None else g.power_limit_watts) or ident.power_limit_watts
        mem = bar(used, total, BAR_WIDTH)
        mem.append(f" {fmt_bytes(used)} / {fmt_bytes(total)}")
        pw = bar(power, limit, BAR_WIDTH)
        pw.append(
            f" {'–' if power is None else f'{power:.0f} W'} / "
            f"{'–' if limit is None else f'{limit:.0f} W'}"
        )
        chips = [_chip("memory", mem), _chip("power", pw)]
        if g is not None and g.lost:
            chips.append(Text("LOST (fell off the bus)", style="bold red"))
        if ident.name:
            chips.append(Text(ident.name))
        chips.append(Text(ident.uuid, style="dim"))
        if g is not None and g.util_pct is not None:
            chips.append(_chip("utilization.gpu", f"{g.util_pct:.0f}%"))
        if g is not None and g.temperature_c is not None:
            chips.append(Text(f"{g.temperature_c:.0f}°C"))
        if g is not None and g.sm_clock_mhz is not None:
            chips.append(_chip("SM", f"{g.sm_clock_mhz} MHz"))
        if g is not None and g.processes is not None:
            chips.append(Text(f"{len(g.processes)} process(es)"))
        gv = self.by_uuid.get(ident.uuid)
        held = self._since(gv)
        if since and gv is not None and held:  # not already in the row
            chips.append(_chip(gv.state.value, f"for {held}"))
        return chips


def _fmt_mem(used: float, total: float | None) -> str:
    """``10.6/24.0 GiB``: both in the unit of the total, so they read as a fraction."""
    if not total:
        return fmt_bytes(used)
    div, unit = 1.0, "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if total < 1024 * div or unit == "TiB":
            break
        div *= 1024
    return f"{used / div:.1f}/{total / div:.1f} {unit}"


def _waiting_lines(st: WatchState, width: int) -> list[Text]:
    if st.invisible_gpu_pids:
        pids = ", ".join(str(p) for p in st.invisible_gpu_pids[:6])
        msg = (
            f"NVML lists GPU processes whose pids do not exist here ({pids}): running in a "
            "container without the host PID namespace? NVML reports host pids, so gpumon "
            "cannot tell which GPU is this run's (run the container with --pid=host)."
        )
    elif not st.identities:
        msg = "NVML reports no GPU on this machine."
    else:
        msg = (
            "waiting for the run to use a GPU (no process of its tree is in any GPU's "
            f"process list yet; {len(st.identities)} GPU(s) on this machine)."
        )
    return _wrap(msg, width, Text(""), 0, style="yellow")


# --- advice and evidence ----------------------------------------------------------------------


def _all_advice(v: Verdict | None) -> list[str]:
    """The run's advice, then each GPU's that says something else: advice that differs
    only in its numbers (each GPU's own count of workers needed) is given once."""
    if v is None:
        return []
    seen: dict[str, str] = {}
    for a in (*v.advice, *(a for g in v.gpus for a in g.advice)):
        seen.setdefault(_NUMBERS.sub("#", a.text), a.text)
    return list(seen.values())


_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


_ADVICE_INDENT = 9  # "advice • "


def _advice_lines(
    advice: Sequence[str], width: int, *, full: bool, first: bool = True
) -> list[Text]:
    """Bullets under an ``advice`` label, each wrapped at spaces."""
    out: list[Text] = []
    for i, a in enumerate(advice):
        prefix = Text("advice" if first and i == 0 else "", style="bold")
        prefix.pad_right(_ADVICE_INDENT - 2 - prefix.cell_len)
        prefix.append("• ")
        lines = _wrap(a, width, prefix, _ADVICE_INDENT)
        out += lines if full else lines[:1]
    return out


def _no_advice(v: Verdict | None, width: int) -> Text:
    t = Text("advice", style="bold")
    if v is None:
        why = "none yet: gpumon judges once it has a window of driver samples"
    elif v.state is State.HEALTHY:
        why = "none: the GPUs are kept busy"
    elif v.note:
        why = f"none yet ({v.note})"
    else:
        why = "none"
    t.append(f" – {why}", style="dim")
    return _crop(t, width)


def _evidence_lines(st: WatchState, shown: Sequence[GpuMemory], width: int) -> list[Text]:
    """The run's host evidence once, then each shown GPU's own numbers."""
    v = st.verdict
    if v is None:
        return []
    lines: list[Text] = []
    if v.evidence:
        lines += _pack(_chips(v.evidence), width, Text("run", style="bold"))
    on_page = {t.identity.uuid for t in shown}
    for g in v.gpus:
        if g.uuid not in on_page:
            continue
        own: Mapping[str, object] = {k: x for k, x in g.evidence.items() if k not in v.evidence}
        if own:
            lines += _pack(_chips(own), width, _gpu_label(g))
    return [_rule("evidence", width), *lines] if lines else []


def _gpu_label(g: GpuVerdict) -> Text:
    return Text(f"GPU {g.gpu}", style="bold")


def _chips(evidence: Mapping[str, object]) -> list[Text]:
    return [_chip(label, value) for label, value in evidence_items(evidence)]


# --- the job's Python stacks (--stacks) ---------------------------------------------------------


def _stack_lines(st: WatchState, width: int) -> list[Text]:
    """What the job's processes did during the last minute's gaps: per role its main
    activities with their shares, then the places in the code that took most."""
    win = None if st.memory is None else st.memory.stacks_window(STACKS_SPAN_S)
    if win is None:
        return []
    roles = stack_roles(win)
    if not roles:
        return []
    lines = [_rule("stacks during the gaps", width, f"last {STACKS_SPAN_S:.0f} s")]
    for name, shares in roles:
        acts = sorted(shares.activities.items(), key=lambda x: -x[1])[:3]
        acts = [(a, x) for a, x in acts if x >= 0.01 * shares.seconds]  # 0 % says nothing
        line = Text(f" {name.split()[0]:<8}", style="bold")
        for i, (act, secs) in enumerate(acts):
            line.append("  " if i else "")
            line.append(ACTIVITY_WORDS.get(act.value, act.value) + " ")
            line.append(share(secs / shares.seconds), style="bold")
        lines.append(_crop(line, width))
        for place, x in shares.top_where(None, 2):
            lines.append(_crop(Text(f"          {share(x):>4}  {place}", style="dim"), width))
    return lines


# --- the command's output and the process tree ------------------------------------------------


def _output_lines(st: WatchState, width: int) -> list[Text]:
    if st.output is None or not st.output:
        return []
    tail = list(st.output)[-6:]
    return [_rule("command output (last lines)", width)] + [_crop(Text(x), width) for x in tail]


class _TreeLines:
    """The host line and the process table, cut to however many rows it is given."""

    HEADER = ("pid", "role", "name", "CPU", "thr", "read", "status")
    RIGHT = frozenset({"pid", "CPU", "thr", "read"})

    def __init__(self, st: WatchState, width: int) -> None:
        self.width = width
        snap = st.snapshot
        self.host = None if snap is None else snap.host
        tree = None if snap is None else snap.tree
        self.exited = tree is not None and not tree.root_alive
        root = None if tree is None else tree.root_pid
        procs = _ordered_procs(tree.processes if tree else (), root)
        self.rows = [
            (
                str(p.pid),
                ("main" if p.pid == root else "worker") + ("+GPU" if p.pid in st.gpu_pids else ""),
                (p.name or "?")[:20],
                "–" if p.cpu_pct is None else f"{p.cpu_pct:.0f}%",
                "–" if p.num_threads is None else str(p.num_threads),
                fmt_bytes(p.read_bytes_per_s, "/s"),
                p.status or "?",
            )
            for p in procs
        ]
        self.widths = [
            max(len(h), *(len(r[i]) for r in self.rows)) if self.rows else len(h)
            for i, h in enumerate(self.HEADER)
        ]
        self.most = 3 + len(self.rows)

    def _host_line(self) -> Text:
        h = self.host
        chips: list[Text] = []
        if h is not None:
            chips.append(_chip("host CPU", "–" if h.cpu_pct is None else f"{h.cpu_pct:.0f}%"))
            chips.append(_chip("iowait", "–" if h.iowait_pct is None else f"{h.iowait_pct:.1f}%"))
            if h.cpu_pct_per_core:
                chips.append(_chip("cores", str(len(h.cpu_pct_per_core))))
            if h.load_1m is not None:
                chips.append(_chip("load", f"{h.load_1m:.2f}"))
            if h.disk_read_bytes_per_s is not None:
                chips.append(_chip("disk read", fmt_bytes(h.disk_read_bytes_per_s, "/s")))
        if self.exited:
            chips.append(Text("the watched process has exited", style="yellow"))
        return _pack(chips, self.width)[0] if chips else Text("")

    def _fmt(self, cells: Sequence[str], style: str = "") -> Text:
        parts = [
            c.rjust(w) if h in self.RIGHT else c.ljust(w)
            for c, w, h in zip(cells, self.widths, self.HEADER, strict=True)
        ]
        return _crop(Text(" " + " ".join(parts).rstrip(), style=style), self.width)

    def build(self, n: int) -> list[Text]:
        title = f"host and process tree ({len(self.rows)} processes)"
        out = [_rule(title, self.width), self._host_line(), self._fmt(self.HEADER, "bold dim")]
        room = n - len(out)
        if room < 1:
            return out[:n]
        rows = self.rows
        if len(rows) > room > 1:  # the last row says how many more there are
            rest = len(rows) - (room - 1)
            out += [self._fmt(r) for r in rows[: room - 1]]
            out.append(Text(f" … and {rest} more processes", style="dim"))
        else:
            out += [self._fmt(r) for r in rows[:room]]
        return out


def _ordered_procs(procs: Iterable[ProcessSample], root: int | None) -> list[ProcessSample]:
    """Main process first, then workers by CPU (the busiest are the telling ones)."""
    return sorted(procs, key=lambda p: (p.pid != root, -(p.cpu_pct or 0.0), p.pid))


# --- overlays and the narrow terminal -----------------------------------------------------------


def _help_lines(width: int, cmd_mode: bool) -> list[Text]:
    quit_text = (
        "close the view; the command runs on and gpumon waits for it"
        if cmd_mode
        else "quit, with the summary; the watched process is never touched"
    )
    keys = (
        ("?", "this help (? or Esc closes it)"),
        ("a", "all advice in full, and the evidence (a or Esc closes it)"),
        ("g  →  ←", "the next / previous page of GPUs, when not all fit"),
        ("p", "pause the view; sampling and the summary go on (p resumes)"),
        ("q", quit_text),
        ("Ctrl-C", "stop watching (in `watch -- CMD` it reaches the command)"),
    )
    out = [_rule("keys", width)]
    for key, text in keys:
        label = Text(key, style="bold")
        label.pad_right(10 - label.cell_len)
        out += _wrap(text, width, label, 10)
    out.append(_rule("a GPU row", width))
    legend = Text("GPU 0  ", style="bold")
    legend.append("starved/cpu ", style=STATE_STYLE[State.STARVED])
    for ch in BLOCKS:
        legend.append(ch, style="green" if ch in BLOCKS[4:] else "red")
    legend.append(HOLE * 2, style="dim")
    legend.append(" duty 41% gap 0.84s 10.6/24.0 GiB 145/300 W")
    out.append(_crop(legend, width))
    for text in (
        f"one character per driver sample (about 6 a second), newest at the right: "
        f"{BLOCKS[0]} idle to {BLOCKS[-1]} busy, {HOLE} no sample (the driver's buffer ran "
        "dry); duty: busy share over the judged window; gap: the median idle gap; for: time "
        "in this state; memory used/total; power drawn/limit",
    ):
        out += _wrap(text, width, Text(""), 0)
    out.append(_rule("states", width))
    states = Text()
    for i, (state, text) in enumerate(
        (
            (State.HEALTHY, "kept busy"),
            (
                State.STARVED,
                "bursts and gaps: the host cannot feed it (cpu, gil, io, contention)",
            ),
            (State.SYNC_STALL, "GPUs wait on each other"),
            (State.IDLE, "nothing runs, or memory held with no work"),
            (State.UNKNOWN, "too little or too coarse data, or being judged"),
        )
    ):
        chip = Text(state.value, style=STATE_STYLE[state])
        chip.append(f": {text}")
        states.append("  " if i else "")
        states.append_text(chip)
    out += _pack(_split_chips(states), width)
    return out


def _split_chips(text: Text) -> list[Text]:
    """A line of chips separated by two spaces, back into its chips."""
    return [c for c in text.split("  ") if c.plain]


def _narrow(st: WatchState, width: int, height: int | None) -> list[Text]:
    """Too narrow for the view: the plain per-interval lines, newest last, under a note."""
    note = (
        f"gpumon watch: this terminal is {width} columns wide and the full view needs "
        f"{MIN_WIDTH}: one plain line per interval until it is wider (q quits)."
    )
    head = _wrap(note, width, Text(""), 0, style="yellow")
    lines: list[Text] = []
    for plain in st.history:
        lines += _wrap(plain, width, Text(""), 2)
    if height is not None:
        room = max(0, height - len(head))
        lines = lines[-room:] if room else []
        lines += [Text("")] * (room - len(lines))
        return [*head, *lines][:height]
    return [*head, *lines]


# --- the full screen -----------------------------------------------------------------------


class LiveView:
    """A ``rich`` renderable over a ``WatchState``: the screen is laid out anew on each
    refresh for the size the terminal has then (a resize mid-run included)."""

    def __init__(self, state: WatchState, controls: ViewControls | None = None) -> None:
        self.state = state
        self.controls = controls

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        frozen = None if self.controls is None else self.controls.frozen
        st = frozen or self.state
        # Live passes no height, only the console's (the terminal's, as it is now).
        height = options.height if options.height is not None else options.max_height
        # Build under the lock, write outside it: a slow (or XOFF'd) terminal must not hold
        # up ``feed()`` and so the sampling.  A paused view's copy is its own.
        with contextlib.nullcontext() if frozen is not None else self.state.lock:
            lines = compose(st, self.controls, width=options.max_width, height=height)
        yield from lines
