"""The lab's scorer on runs written here: what "the faces tell one story" accepts and refuses.

A lab run takes a minute and a quiet machine; these take a second and hold the scorer's
rules to data where the answer is known.
"""

from __future__ import annotations

from pathlib import Path

from livelab.score import (
    LIVE_MARGIN_S,
    Label,
    Obs,
    Run,
    Seg,
    _held_back_seconds,
    agreement,
    score_face,
)
from livelab.truth import HANG_AFTER_S, PhaseTotals, derive

PHASE_S = 40.0


def _run(
    lines: list[Obs],
    episodes: list[tuple[float, float, Obs]],
    cause: str = "cpu",
    held_back: list[float] | None = None,
) -> Run:
    """One GPU starved by ``cause`` for a whole phase; watch's lines (one a second) and the
    summary's episodes as given; serve telling what the lines do."""
    return Run(
        dir=Path("."),
        meta={"go_t": 0.0},
        truth={0: [Seg(0.0, PHASE_S, Label("starved", cause), f"starved-{cause}")]},
        faces={"watch": {0: lines}, "serve": {0: lines}},
        intervals={"analyze": {0: episodes}, "serve_log": {0: episodes}},
        summary=None,
        analysis=None,
        serve_stop=None,
        invalid_phases=[],
        watch_spans=[],
        held_back={0: held_back or []},
    )


def _lines(cause_at: dict[float, str], cause: str = "cpu") -> list[Obs]:
    """A line a second, starved, with the cause that ``cause_at`` gives from each time on."""
    out = []
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


# --- seconds that other processes held the job back, by the truth's own CPU reads


def _truth_records(busy_outside: dict[float, float]) -> list[dict]:
    """A rank's truth over 40 s on a 2-CPU machine: its main process waits on reads half
    of each second, its processes want half a CPU; others use ``busy_outside`` of the
    machine from each second given on (0 before), and then the job waits on the run queue
    for as long as it runs."""
    out: list[dict] = []
    share = 0.0
    for sec in range(int(PHASE_S)):
        share = busy_outside.get(float(sec), share)
        out.append({"t": float(sec), "gpu": 0, "wait": {"loader_io": 0.5}})
        for half in (0.0, 0.5):
            queued = 0.25 if share >= 0.6 else 0.0
            out.append(
                {
                    "event": "cpu",
                    "gpu": 0,
                    "start": sec + half,
                    "t": sec + half + 0.5,
                    "job_run_s": 0.25,
                    "job_wait_s": queued,
                    "host_busy_s": 0.25 + share * 1.0,
                    "host_total_s": 1.0,
                }
            )
    return out


def test_the_seconds_others_held_the_job_back_are_told_from_the_rest() -> None:
    held = _held_back_seconds(_truth_records({20.0: 0.9, 25.0: 0.0}))[0]
    # Others from 20 s to 25 s: the seconds whose window (3 s) they fill most of.
    assert set(held) == {21.0, 22.0, 23.0, 24.0, 25.0}
    assert not _held_back_seconds(_truth_records({}))  # others quiet: none
    # Others using half the machine, the job never queueing: nothing held it back.
    assert not _held_back_seconds(_truth_records({20.0: 0.5, 25.0: 0.0}))


def test_contention_said_while_others_held_an_io_bound_job_back_is_right() -> None:
    lines = _lines({22.0: "contention", 26.0: "io"}, cause="io")
    episodes = [
        (0.0, 20.0, Obs(0.0, "starved", "io", None)),
        (20.0, 25.0, Obs(20.0, "starved", "contention", None)),
        (25.0, PHASE_S, Obs(25.0, "starved", "io", None)),
    ]
    held = _run(lines, episodes, "io", held_back=[20.0, 21.0, 22.0, 23.0, 24.0])
    for face in ("watch", "analyze"):
        fs = score_face(held, face)
        assert fs.cause_accuracy == 1.0 and fs.max_cause_changes_per_phase == 0, face
    # The same faces where the truth saw no one else: a wrong cause, and two changes.
    quiet = _run(lines, episodes, "io")
    fs = score_face(quiet, "watch")
    assert fs.cause_accuracy is not None and fs.cause_accuracy < 0.9
    assert fs.max_cause_changes_per_phase == 2
    # Contention said far from any held second is wrong still.
    late = _run(_lines({35.0: "contention"}, cause="io"), episodes, "io", held_back=[5.0])
    assert score_face(late, "watch").cause_accuracy < 1.0


def test_spinning_is_a_hang_only_once_it_has_lasted_the_faces_threshold() -> None:
    """Every rank spinning, none computing: a wait that may still end (busy-wait) until it
    has gone on for the threshold the faces are given, a hang from then on."""
    spin = {"seconds": 8.0, "compute_s": 0.0, "spin_s": 8.0}
    assert derive(PhaseTotals(**spin)).reason == "busy-wait"
    assert derive(PhaseTotals(**spin, spun_before_s=HANG_AFTER_S / 2)).reason == "busy-wait"
    assert derive(PhaseTotals(**spin, spun_before_s=HANG_AFTER_S - 0.2)).reason == "hang"
    working = {"seconds": 8.0, "compute_s": 4.0, "spin_s": 4.0}  # a rank still computes
    assert derive(PhaseTotals(**working, spun_before_s=HANG_AFTER_S)).reason == "busy-wait"
