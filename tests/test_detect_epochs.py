"""Pauses and dips of a whole run, on data: what a rhythm of short dips is (issue 35, item
8) and whose all-GPU pauses the host's CPU fills (item 7).

Ticks are shaped as the live path makes them (tests/test_live_judgments.py): a tick every
0.5 s carrying the driver samples (1/6 s) since the previous one.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from test_live_judgments import busy, shown, ticks

from gpumon.engine import analyze
from gpumon.model import Reason, State, TraceHeader


def dips(startup_s: float, dip_s: float, every_s: float = 20.0) -> Callable[[float], float]:
    """Idle through a start-up of ``startup_s``, then busy (95-99 %) with an all-idle dip
    of ``dip_s`` at the end of every ``every_s``."""

    def f(x: float) -> float:
        if x < startup_s:
            return 0.0
        return 0.0 if (x - startup_s) % every_s >= every_s - dip_s else busy(x)

    return f


@pytest.mark.parametrize("startup_s", [0.0, 10.0])
@pytest.mark.parametrize("gpus", [1, 2])
def test_brief_periodic_dips_of_a_healthy_run_are_never_starvation(
    startup_s: float, gpus: int
) -> None:
    """A 2 s dip every 20 s is a tenth of the time, below the line (``rhythm_idle_share``):
    healthy throughout, live.  Measured from its first dip the rhythm read 14 %; the
    start-up's idle counted as a gap made the first dip no lone dip; and the second dip,
    read over an 8 s window (a quarter idle) or a sustained window reaching back into
    start-up, read starved."""
    f = dips(startup_s, 2.0)
    snaps = ticks(dict.fromkeys(range(gpus), f), 200)
    _, seen = shown(snaps, gpus)
    after = [(t, s, r) for t, s, r in seen if t >= startup_s + 4.0]
    assert all(s is State.HEALTHY for _, s, _ in after), [
        x for x in after if x[1] is not State.HEALTHY
    ][:3]
    header = TraceHeader(1, "gpumon")
    res = analyze(header, snaps)  # the same trace offline: the verdict agrees
    assert res.summary.verdict is State.HEALTHY, res.summary.notes
    assert res.summary.seconds.get(State.STARVED, 0.0) == 0.0


def test_periodic_dips_above_the_line_are_still_starvation() -> None:
    """A 4 s dip every 20 s on one GPU takes a fifth of the time: periodic starvation."""
    _, seen = shown(ticks({0: dips(10.0, 4.0)}, 200))
    _, state, reason = seen[-1]
    assert (state, reason) == (State.STARVED, Reason.PERIODIC_GAPS), seen[-1]
    first = next(t for t, s, _ in seen if s is State.STARVED)
    assert first <= 10.0 + 4 * 20.0  # by the fourth dip
