"""The dstat/dool column logic on data: windows of driver samples, verdict words, the
aggregate band, rendering and CSV, and that nothing raises into dstat."""

from __future__ import annotations

import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpumon.detect import DetectorUpdate
from gpumon.engine import Session
from gpumon.engine.sources import LiveSource
from gpumon.errors import NoDriverError
from gpumon.faces.dstat import columns as dc
from gpumon.faces.dstat.columns import GpuCell, GpuColumns, PluginLoadError, aggregate
from gpumon.model import Episode, GpuIdentity, GpuSample, Reason, State, UtilPoint, Verdict
from gpumon.sample.monitor import Monitor

REPO = Path(__file__).resolve().parent.parent
GiB = 1 << 30


class StubSampler:
    """Hands out prepared ticks of GpuSamples, like NvmlSampler.sample()."""

    def __init__(self, n: int, ticks: list[list[GpuSample]]) -> None:
        self.gpus = tuple(GpuIdentity(index=i, uuid=f"GPU-{i}") for i in range(n))
        self.ticks = ticks
        self.driver_version = self.nvml_version = None

    def sample(self) -> tuple[GpuSample, ...]:
        return tuple(self.ticks.pop(0))


class StubDetector:
    """Has one episode open per GPU in its given state, as the detector does once it has
    judged; ``fail`` makes the open episodes unreadable."""

    def __init__(self, states: dict[int, tuple[State, Reason | None]] | None = None) -> None:
        self.states = states or {}
        self.seen = 0
        self.fail = False

    def update(self, snapshot: Any) -> Any:
        self.seen += 1
        if self.fail:
            raise RuntimeError("broken detector")
        if self.seen > 1:
            return DetectorUpdate()
        return DetectorUpdate(
            opened=tuple(
                Episode(
                    gpu=i,
                    uuid=f"GPU-{i}",
                    state=s,
                    cause=None,
                    start_s=0.0,
                    end_s=None,
                    reason=reason,
                )
                for i, (s, reason) in self.states.items()
            )
        )

    def gpu_totals(self) -> dict[int, Any]:
        return {}

    def verdict(self) -> Verdict:
        raise AssertionError("the columns need no full verdict per tick")


def sample(gpu: int, t: float, points: list[tuple[float, float]], **kw: Any) -> GpuSample:
    kw.setdefault("mem_used_bytes", 20 * GiB)
    kw.setdefault("mem_total_bytes", 80 * GiB)
    return GpuSample(
        t_s=t,
        gpu=gpu,
        uuid=f"GPU-{gpu}",
        util_samples=tuple(UtilPoint(a, b) for a, b in points),
        **kw,
    )


def columns(
    n: int, ticks: list[list[GpuSample]], detector: StubDetector | None = None
) -> tuple[GpuColumns, list[str]]:
    warnings: list[str] = []
    det = detector or StubDetector()
    c = GpuColumns(
        lambda: Session(LiveSource(Monitor(StubSampler(n, ticks))), detector=det),  # type: ignore[arg-type]
        warn=warnings.append,
    )
    c.start(1.0)
    return c, warnings


# --- utilisation windows ---------------------------------------------------------------------


def test_util_is_the_mean_of_the_driver_samples_since_the_previous_tick() -> None:
    now = time.monotonic()
    history = [(now - 10 + k / 6, 0.0) for k in range(30)]  # before dstat's first interval
    ticks = [
        [sample(0, now, [*history, (now - 0.5, 100.0), (now - 0.2, 50.0)])],
        [sample(0, now + 1, [(now + 0.5, 10.0), (now + 0.9, 30.0)])],
    ]
    c, _ = columns(1, ticks)
    assert c.tick()[0].util_pct == pytest.approx(75.0)  # history goes to the detector only
    assert c.tick()[0].util_pct == pytest.approx(20.0)  # nothing carried over, nothing lost


def test_intermediate_updates_accumulate_until_the_definitive_tick() -> None:
    now = time.monotonic()
    ticks = [
        [sample(0, now, [(now - 0.1, 100.0)])],
        [sample(0, now + 1, [(now + 0.5, 0.0)])],
        [sample(0, now + 2, [(now + 1.5, 50.0)])],
    ]
    c, _ = columns(1, ticks)
    assert c.tick(final=False)[0].util_pct == 100.0
    assert c.tick(final=True)[0].util_pct == 50.0  # both points of the 2-s interval
    assert c.tick(final=True)[0].util_pct == 50.0  # a fresh window


def test_util_falls_back_to_the_one_second_rate_without_driver_samples() -> None:
    now = time.monotonic()
    c, _ = columns(1, [[sample(0, now, [], util_pct=64.0)]])
    assert c.tick()[0].util_pct == 64.0


def test_memory_percent_and_missing_memory() -> None:
    now = time.monotonic()
    ticks = [[sample(0, now, [], mem_used_bytes=None), sample(1, now, [])]]
    c, _ = columns(2, ticks)
    cells = c.tick()
    assert cells[0].mem_pct is None
    assert cells[1].mem_pct == pytest.approx(25.0)


# --- state words ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "reason", "util", "word"),
    [
        (State.HEALTHY, None, 90.0, "ok"),
        (State.STARVED, None, 30.0, "STARV"),
        (State.SYNC_STALL, None, 99.0, "SYNC"),
        (State.IDLE, None, 0.0, "idle"),
        (State.UNKNOWN, None, 50.0, "?"),
        (State.IDLE, Reason.START_UP, 97.0, "?"),  # busy but not judged yet: not "idle"
        (State.IDLE, Reason.START_UP, 0.0, "idle"),
    ],
)
def test_detector_states_become_short_words(
    state: State, reason: Reason | None, util: float, word: str
) -> None:
    now = time.monotonic()
    det = StubDetector({0: (state, reason)})
    c, _ = columns(1, [[sample(0, now, [(now - 0.1, util)])]], det)
    assert c.tick()[0].word == word
    assert det.seen == 1  # the detector runs on every tick


def test_a_lost_gpu_shows_lost_and_the_others_keep_their_numbers() -> None:
    now = time.monotonic()
    det = StubDetector({0: (State.HEALTHY, None), 1: (State.HEALTHY, None)})
    ticks = [[sample(0, now, [(now - 0.1, 80.0)]), GpuSample(now, 1, "GPU-1", lost=True)]]
    c, warnings = columns(2, ticks, det)
    cells = c.tick()
    assert cells[0] == GpuCell(0, 80.0, 25.0, "ok")
    assert cells[1] == GpuCell(1, None, None, "lost")
    assert warnings == []


def test_tick_never_raises_and_warns_once() -> None:
    c, warnings = columns(2, [])  # sample() will fail: no ticks prepared
    for _ in range(3):
        cells = c.tick()
        assert [x.word for x in cells] == ["?", "?"]
    assert len(warnings) == 1 and "reading the GPUs failed" in warnings[0]


def test_a_failing_detector_leaves_the_numbers() -> None:
    now = time.monotonic()
    det = StubDetector()
    det.fail = True
    c, warnings = columns(1, [[sample(0, now, [(now - 0.1, 42.0)])]], det)
    cell = c.tick()[0]
    assert (cell.util_pct, cell.word) == (42.0, "?")
    assert "detector failed" in warnings[0]


def test_start_turns_no_driver_and_no_gpu_into_one_reason() -> None:
    def no_driver() -> Session:
        raise NoDriverError("cannot read GPUs: no NVIDIA driver found.")

    with pytest.raises(PluginLoadError, match=r"^cannot read GPUs: no NVIDIA driver found$"):
        GpuColumns(no_driver).start()
    empty = GpuColumns(lambda: Session(LiveSource(Monitor(StubSampler(0, []))), judge=False))  # type: ignore[arg-type]
    with pytest.raises(PluginLoadError, match="reports no GPU"):
        empty.start()


# --- the aggregate band --------------------------------------------------------------------


def test_aggregate_means_and_worst_word() -> None:
    cells = [
        GpuCell(0, 90.0, 50.0, "ok"),
        GpuCell(1, 30.0, None, "STARV"),
        GpuCell(2, None, None, "lost"),
    ]
    agg = aggregate(cells)
    assert agg.util_pct == pytest.approx(60.0)
    assert agg.mem_pct == pytest.approx(50.0)
    assert agg.word == "lost"
    assert aggregate(cells[:2]).word == "STARV"
    assert aggregate([GpuCell(0, 1, 1, "ok"), GpuCell(1, 1, 1, "SYNC")]).word == "SYNC"
    assert aggregate([GpuCell(0, 1, 1, "ok"), GpuCell(1, 0, 1, "idle")]).word == "idle"
    assert aggregate([GpuCell(0, 1, 1, "ok"), GpuCell(1, 1, 1, "?")]).word == "?"
    assert aggregate([GpuCell(0, 1, 1, "ok")] * 2).word == "ok"


# --- rendering in a dstat-like host ----------------------------------------------------------


class Base:
    """dstat's base class stand-in: the plugin must not rely on more than its attributes."""


def host(**op: Any) -> dict[str, Any]:
    g: dict[str, Any] = {
        "op": SimpleNamespace(**{"delay": 1, "full": False, "color": False, **op}),
        "step": 1,
        "theme": {"default": "", "error": "<E>", "frame": "", "title": "", "subtitle": ""},
        "color": {"green": "<G>", "red": "<R>", "yellow": "<Y>"},
        "char": {"dash": "-", "space": " ", "colon": ":", "sep": ","},
    }
    return g


def plugin(n: int, ticks: list[list[GpuSample]], g: dict[str, Any], det: StubDetector) -> Any:
    cls = dc.plugin_class(Base, g, "dstat")
    cols = GpuColumns(
        lambda: Session(LiveSource(Monitor(StubSampler(n, ticks))), detector=det),
        warn=lambda m: None,
    )  # type: ignore[arg-type]
    p = cls(cols)
    p.check()
    p.prepare()
    return p


def strip(text: str) -> str:
    return re.sub(r"<[A-Z]>", "", text)


def test_one_band_for_all_gpus_by_default_and_one_per_gpu_with_full() -> None:
    now = time.monotonic()
    det = StubDetector({0: (State.HEALTHY, None), 1: (State.STARVED, None)})

    def ticks() -> list[list[GpuSample]]:
        return [[sample(0, now, [(now - 0.1, 90.0)]), sample(1, now, [(now - 0.1, 30.0)])]]

    p = plugin(2, ticks(), host(), det)
    p.extract()
    assert p.title() == "--total-gpu---"
    assert p.subtitle() == "util mem state"
    assert len(p.title()) == len(p.subtitle()) == p.statwidth()
    assert strip(p.show()) == "  60  25 STARV"
    assert "<R>STARV" in p.show()
    assert p.showcsv() == "60,25,starved"

    full = plugin(2, ticks(), host(full=True), StubDetector(det.states))
    full.extract()
    assert full.title() == "-----gpu0----- -----gpu1-----"
    assert full.subtitle() == "util mem state:util mem state"
    assert strip(full.show()) == "  90  25 ok   :  30  25 STARV"
    assert len(full.title()) == len(strip(full.show())) == full.statwidth()
    assert full.showcsv() == "90,25,healthy,30,25,starved"


def test_lost_gpu_renders_dashes_and_empty_csv_cells() -> None:
    now = time.monotonic()
    ticks = [[sample(0, now, [(now - 0.1, 90.0)]), GpuSample(now, 1, "GPU-1", lost=True)]]
    p = plugin(2, ticks, host(full=True), StubDetector())
    p.extract()
    assert strip(p.show()).split(":")[1] == "   -   - lost "
    assert "<E>lost" in p.show()
    assert p.showcsv().split(",")[3:] == ["", "", "lost"]


def test_extract_never_raises() -> None:
    p = plugin(1, [], host(), StubDetector())  # no ticks: sampling fails
    p.extract()
    p.extract()
    assert strip(p.show()).split()[-1] == "?"


def test_check_repairs_dstat_csv_writer_once() -> None:
    g = host()
    plugin(1, [], g, StubDetector())
    assert g["types"].ListType is list and g["types"].StringType is str
    mine = object()
    g2 = host()
    g2["types"] = mine
    plugin(1, [], g2, StubDetector())
    assert g2["types"] is mine


def test_dool_host_is_not_given_types() -> None:
    g = host()
    cls = dc.plugin_class(Base, g, "dool")
    cols = GpuColumns(
        lambda: Session(LiveSource(Monitor(StubSampler(1, []))), judge=False), warn=lambda m: None
    )  # type: ignore[arg-type]
    cls(cols).check()
    assert "types" not in g
    assert cls.__name__ == "dool_plugin"


# --- the plugin files ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dstat_gpu.py", "dool_gpu.py"])
def test_packaged_plugin_files_are_the_sources(name: str) -> None:
    # dstat_plugins/ holds the one copy; the installer reads it as the package data of
    # gpumon.faces.dstat.plugins (pyproject maps that package onto the folder).
    from gpumon.faces.dstat.install import PLUGIN_DIR

    source = (REPO / "dstat_plugins" / name).read_text()
    assert not (REPO / "dstat_plugins" / name).is_symlink()
    assert (PLUGIN_DIR / name).read_text() == source
    assert "GPUMON_SITE_DIRS = []" in source
    assert "gpumon.faces.dstat.columns" in source


@pytest.mark.parametrize(("name", "kind"), [("dstat_gpu.py", "dstat"), ("dool_gpu.py", "dool")])
def test_plugin_file_builds_its_class_from_the_host_globals(name: str, kind: str) -> None:
    """Exec the file as dstat/dool do (separate locals) with a stand-in base class."""
    g: dict[str, Any] = {"__name__": "host", kind: Base}
    scope: dict[str, Any] = {}
    exec(compile((REPO / "dstat_plugins" / name).read_text(), name, "exec"), g, scope)
    cls = scope[f"{kind}_plugin"]
    assert issubclass(cls, Base)
    assert cls.__name__ == f"{kind}_plugin"


@pytest.mark.parametrize("scenario", ["healthy_then_starved", "straggler", "checkpoint"])
def test_words_followed_through_updates_match_the_full_verdict(scenario: str) -> None:
    """The columns follow the detector's opened/closed episodes instead of building a
    verdict every tick: tick by tick, the words are those the verdict would give."""
    from gpumon.engine import DetectorConfig
    from gpumon.lab.synth import generate

    trace = generate(scenario, seed=1, duration_s=200.0)
    session = Session.offline(trace.header, DetectorConfig(), live=True)
    det = session.detector
    assert det is not None
    c = GpuColumns(lambda: session, warn=pytest.fail)
    c.start(1.0)
    seen: set[str] = set()
    for snap in trace.snapshots:
        session.source.push(snap)  # type: ignore[attr-defined]
        cells = c.tick()
        want = {v.gpu: dc._word(v.state, v.reason) for v in det.verdict().gpus}
        for cell in cells:
            if cell.word == "lost":
                continue
            word = want.get(cell.gpu, "?")
            if word == dc.STARTUP:
                util = cell.util_pct
                word = "idle" if util is None or util < dc.STARTUP_BUSY_PCT else "?"
            assert cell.word == word
            seen.add(word)
    assert len(seen) >= 2, seen  # the run went through more than one state


@pytest.mark.parametrize("pattern, word", [("burst", "STARV"), ("steady", "ok")])
def test_first_verdict_comes_from_the_drivers_backlog(
    fake_nvml, monkeypatch: pytest.MonkeyPatch, pattern: str, word: str
) -> None:
    """dstat starts on a GPU that has been working for a while: the driver's buffer holds
    its last ~20 s, which the detector judges at once instead of after 10 s of ticks."""
    from fakenvml import FakeGPU, Pattern, Process, Scenario

    import gpumon.sample.nvml as nvml_module

    fake_nvml.load()
    monkeypatch.setattr(nvml_module, "_init_done", False)
    pat = Pattern.burst(1.0, 0.3) if pattern == "burst" else Pattern.steady(97.0)
    fake_nvml.set(
        Scenario(
            gpus=[FakeGPU(pattern=pat, processes=[Process(4242)])], epoch=time.monotonic() - 60.0
        )
    )
    cols = GpuColumns()  # the plugin's own monitor: the NVML sampler through pynvml
    cols.start()
    words = []
    for _ in range(4):
        time.sleep(0.5)
        words.append(cols.tick()[0].word)
    assert words[-1] == word, words  # 2 s after start, not 10
