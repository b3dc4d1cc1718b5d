"""``gpumon watch --hang-after S`` and what watch says while every rank spins (issue 35,
item 9): the threshold serve sets with ``[detector] hang_after_s``, and, before it is
reached, advice that says no rank here computes -- for how long, and when it is a hang --
never that one local rank is the straggler."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
from test_cli import gpumon
from test_hang import header, run

from gpumon.detect import DetectorConfig
from gpumon.engine import LiveOptions, Session, StackOptions, analyze
from gpumon.faces.watch import WatchOptions, watch
from gpumon.model import Advice, Lever, Reason, State


def test_while_every_rank_spins_watch_says_none_computes_and_when_it_is_a_hang() -> None:
    """Four GPUs work 2 minutes, then all spin in a collective for 2 minutes (short of the
    5-minute hang): no GPU here is the straggler, so the advice says that none computes,
    for how long, and when it will be called a hang."""
    v = analyze(header(4), run(4, [(120, "work"), (120, "spin")])).verdict
    assert v.state is State.SYNC_STALL, (v.state, v.note)
    assert {g.reason for g in v.gpus} == {Reason.BUSY_WAIT}, v.note
    advice = " ".join(a.text for a in v.advice)
    assert "data loader" not in advice and "is the straggler" not in advice, advice
    stuck, after, left = spun(v.advice)
    assert abs(stuck - 120) <= 10  # since the spinning began
    assert after == 300 and left == pytest.approx(after - stuck, abs=6)


def test_the_hang_it_announces_follows_the_configured_threshold() -> None:
    cfg = DetectorConfig(hang_after_s=600.0)
    v = analyze(header(2), run(2, [(60, "work"), (90, "spin")]), cfg).verdict
    stuck, after, left = spun(v.advice)
    assert abs(stuck - 90) <= 10 and after == 600
    assert left == pytest.approx(after - stuck, abs=6)


_SPAN = r"([\d.]+) (s|min)"
_SPUN = re.compile(
    rf"none has computed for {_SPAN}; at {_SPAN} without progress it is called a hang "
    rf"\(in {_SPAN}\)"
)


def spun(advice: tuple[Advice, ...]) -> tuple[float, float, float]:
    """(seconds spinning, the hang threshold, seconds left) as the advice says them."""
    hang = next(a for a in advice if a.lever is Lever.HANG)
    text = hang.text
    assert text.startswith("no rank on this node computes"), text
    m = _SPUN.search(text)
    assert m is not None, text
    vals = [float(m[k]) * (60 if m[k + 1] == "min" else 1) for k in (1, 3, 5)]
    return vals[0], vals[1], vals[2]


def test_a_rank_computing_while_the_others_spin_is_still_the_straggler() -> None:
    """Not every GPU spins: one computes, its peers wait on it -- the straggler's advice."""
    from test_detect import LIMIT, square, stream

    def power(i: int, t: float, u: float) -> float:
        return 0.9 * LIMIT if i == 0 else 0.3 * LIMIT  # GPU 0 computes, its peers spin

    snaps = stream([square(0.6, 0.4), lambda t: 100.0, lambda t: 100.0], 90, power_fn=power)
    v = analyze(header(3), snaps).verdict
    advice = " ".join(a.text for a in v.advice)
    assert "no rank on this node computes" not in advice, advice
    assert "GPU 0 is the straggler" in advice, (v.note, advice)


@pytest.mark.parametrize("bad", ["5", "86401", "nan", "inf", "-300", "five"])
def test_bad_hang_after_values_are_refused_in_one_sentence(bad: str) -> None:
    proc = gpumon(None, "watch", "--hang-after", bad, "--pid", str(os.getpid()))
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gpumon watch: error: argument --hang-after: "), proc.stderr
    assert "must be between 10 and 86400 seconds" in last or "not a number of seconds" in last, last
    assert repr(bad) in last


def test_a_misspelt_option_of_watch_gets_its_usage_and_the_option_meant() -> None:
    """watch's ``-- CMD`` shares its name with the command's: an unknown option still gets
    watch's usage and one sentence, not a traceback."""
    proc = gpumon(None, "watch", "--hang-afer", "30", "--pid", str(os.getpid()))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("usage: gpumon watch"), proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        "gpumon watch: error: unrecognized arguments: --hang-afer (did you mean --hang-after?)"
    ), proc.stderr


def test_watch_judges_with_the_hang_after_it_is_given(tmp_path: Path) -> None:
    """The watch face hands --hang-after to its session: a trace of two GPUs spinning for
    90 s after a minute of work, replayed through watch, is a hang at 60 s, and not at the
    default 300 s."""
    snaps = run(2, [(60, "work"), (90, "spin")])

    def watched(hang_after: float | None) -> dict:
        out = tmp_path / f"summary-{hang_after}.json"
        options = WatchOptions(
            pid=4242, interval=0.05, plain=True, summary_json=str(out), hang_after=hang_after
        )
        status = watch(
            options,
            session_factory=lambda _options, **kw: Session.replay(
                header(2), snaps, speed=400.0, config=kw.get("config")
            ),
        )
        assert status == 0
        return json.loads(out.read_text())

    assert watched(60.0)["reason"] == Reason.HANG.value
    assert watched(None)["reason"] != Reason.HANG.value


def test_watch_asks_for_its_session_with_one_live_options_value(tmp_path: Path) -> None:
    """What watch's live source reads travels as one ``LiveOptions`` (the pid, the pace,
    the tree's GPUs only), and --window and --hang-after as the detector's settings."""
    asked: list[tuple[LiveOptions, DetectorConfig | None]] = []

    def factory(
        options: LiveOptions,
        /,
        *,
        config: DetectorConfig | None = None,
        stacks: StackOptions | None = None,
    ) -> Session:
        asked.append((options, config))
        return Session.replay(header(1), run(1, [(20, "work")]), speed=400.0, config=config)

    base = WatchOptions(pid=4242, interval=0.05, plain=True)
    assert watch(base, session_factory=factory) == 0
    tuned = dataclasses.replace(base, window=45.0, hang_after=90.0)
    assert watch(tuned, session_factory=factory) == 0
    want = LiveOptions(pid=4242, interval_s=0.05, tree_gpus_only=True)
    assert asked[0] == (want, None)
    assert asked[1][0] == want
    cfg = asked[1][1]
    assert cfg == dataclasses.replace(DetectorConfig(), window_s=45.0, hang_after_s=90.0)
