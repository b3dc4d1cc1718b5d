"""What `gpumon serve` shows a person at ``/`` and tells a probe at ``/-/ready``.

The landing page is what the Prometheus guide for writing exporters asks for: the
version, the GPUs and their current verdicts, and a link to the metrics, so that someone
who opens the port in a browser sees what it is (and a probe need not scrape the whole
exposition).  Built from one consistent read of the daemon's state under its lock; the
HTML is rendered outside it, from plain values.
"""

from __future__ import annotations

import html
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpumon.faces.serve.daemon import ServeState
from gpumon.model import State


@dataclass(frozen=True, slots=True)
class GpuRow:
    index: int
    name: str
    uuid: str
    state: str
    cause: str
    lost: bool


@dataclass(frozen=True, slots=True)
class View:
    version: str
    driver: str
    node_state: str
    node_cause: str
    gpus: tuple[GpuRow, ...]
    jobs: int
    ticks: int
    sample_age_s: float | None


def ready_within_s(interval_s: float) -> float:
    """How old the last sample may be while the daemon still counts as ready."""
    return 2.0 * interval_s + 5.0


class StatePages:
    """The daemon's pages for the HTTP server (see ``http.Pages``)."""

    def __init__(self, state: ServeState, wall: Callable[[], float] = time.time) -> None:
        self.state = state
        self._wall = wall

    def view(self) -> View:
        st = self.state
        with st.lock:
            rows = []
            for idx in sorted(st.gpus):
                rt = st.gpus[idx]
                ep = st.memory.open.get(idx)
                lost = rt.lost
                rows.append(
                    GpuRow(
                        index=idx,
                        name=rt.identity.name or "",
                        uuid=rt.identity.uuid,
                        state=str(ep.state) if ep is not None else str(State.UNKNOWN),
                        cause="" if ep is None or ep.cause is None else str(ep.cause),
                        lost=lost,
                    )
                )
            node = st.memory.open.get(None)
            last = st.last_sample_wall_s
            return View(
                version=st.version,
                driver=st.driver_version or "",
                node_state=str(node.state) if node is not None else str(State.UNKNOWN),
                node_cause="" if node is None or node.cause is None else str(node.cause),
                gpus=tuple(rows),
                jobs=len(st.jobs),
                ticks=st.ticks_total,
                sample_age_s=None if last is None else max(0.0, self._wall() - last),
            )

    def ready(self) -> tuple[bool, str]:
        age = self.view().sample_age_s
        limit = ready_within_s(self.state.cfg.interval_s)
        if age is None:
            return False, "no sample taken yet"
        if age > limit:
            return False, f"the last sample is {age:.0f} s old (more than {limit:g} s)"
        return True, ""

    def landing(self, telemetry_path: str) -> str:
        return render(self.view(), telemetry_path)


def render(v: View, telemetry_path: str) -> str:
    """The landing page's HTML from a ``View`` (every value escaped)."""
    e = html.escape
    rows = "\n".join(
        f"<tr><td>{g.index}</td><td>{e(g.name)}</td><td><code>{e(g.uuid)}</code></td>"
        f'<td class="{e(g.state)}">{"lost (fell off the bus)" if g.lost else e(g.state)}</td>'
        f"<td>{e(g.cause)}</td></tr>"
        for g in v.gpus
    )
    age = "none yet" if v.sample_age_s is None else f"{v.sample_age_s:.1f} s ago"
    cause = f" ({e(v.node_cause)})" if v.node_cause else ""
    path = e(telemetry_path, quote=True)
    return f"""<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>gpumon</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }}
.healthy {{ color: #1a7f37; }} .starved, .sync_stall {{ color: #b35900; }}
</style></head>
<body>
<h1>gpumon</h1>
<p>Why the GPUs on this node wait: starvation and sync-stall detection.</p>
<ul>
<li><a href="{path}">Metrics</a> (<code>{path}</code>)</li>
<li><a href="/-/healthy">/-/healthy</a>, <a href="/-/ready">/-/ready</a></li>
</ul>
<h2>Node: <span class="{e(v.node_state)}">{e(v.node_state)}</span>{cause}</h2>
<table>
<tr><th>GPU</th><th>name</th><th>UUID</th><th>state</th><th>cause</th></tr>
{rows}
</table>
<p>{len(v.gpus)} GPU(s), {v.jobs} job(s) tracked, {v.ticks} ticks; last sample {age}.</p>
<p>gpumon {e(v.version)}, NVIDIA driver {e(v.driver) or "unknown"},
Python {e(platform.python_version())}.</p>
</body>
</html>
"""
