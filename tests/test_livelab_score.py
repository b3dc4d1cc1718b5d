"""The lab's scorer on runs written here: what "the faces tell one story" accepts and refuses.

A lab run takes a minute and a quiet machine; these take a second and hold the scorer's
rules to data where the answer is known.
"""

from __future__ import annotations

from pathlib import Path

from livelab.score import LIVE_MARGIN_S, Label, Obs, Run, Seg, agreement

PHASE_S = 40.0


def _run(lines: list[Obs], episodes: list[tuple[float, float, Obs]]) -> Run:
    """One GPU starved by its CPU for a whole phase; watch's lines (one a second) and the
    summary's episodes as given; serve telling what the lines do."""
    return Run(
        dir=Path("."),
        meta={"go_t": 0.0},
        truth={0: [Seg(0.0, PHASE_S, Label("starved", "cpu"), "starved-cpu")]},
        faces={"watch": {0: lines}, "serve": {0: lines}},
        intervals={"analyze": {0: episodes}, "serve_log": {0: episodes}},
        summary=None,
        analysis=None,
        serve_stop=None,
        invalid_phases=[],
        watch_spans=[],
    )


def _lines(cause_at: dict[float, str]) -> list[Obs]:
    """A line a second, starved, with the cause that ``cause_at`` gives from each time on."""
    out, cause = [], "cpu"
    t = 0.0
    while t < PHASE_S:
        cause = cause_at.get(t, cause)
        out.append(Obs(t, "starved", cause, None))
        t += 1.0
    return out


def _episodes(change_s: float, to: str) -> list[tuple[float, float, Obs]]:
    return [
        (0.0, change_s, Obs(0.0, "starved", "cpu", None)),
        (change_s, PHASE_S, Obs(change_s, "starved", to, None)),
    ]


def _summary_check(run: Run) -> tuple[bool, str]:
    (check,) = [c for c in agreement(run) if c.name.startswith("watch lines = the summary")]
    return check.ok, check.detail


def test_a_change_the_truth_did_not_make_shown_late_by_the_lines_is_one_story() -> None:
    # Other work comes mid-phase: the summary places "contention" where it began (20 s),
    # the lines show it once confirmed, 4 s later.  Before the rule: 27/31 seconds, a fail.
    ok, detail = _summary_check(_run(_lines({24.0: "contention"}), _episodes(20.0, "contention")))
    assert ok, detail


def test_lines_that_never_show_the_summarys_change_are_another_story() -> None:
    ok, detail = _summary_check(_run(_lines({}), _episodes(20.0, "contention")))
    assert not ok, detail


def test_lines_later_than_the_live_margin_are_another_story() -> None:
    late = 20.0 + LIVE_MARGIN_S + 4.0
    ok, detail = _summary_check(_run(_lines({late: "contention"}), _episodes(20.0, "contention")))
    assert not ok, detail
