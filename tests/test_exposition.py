"""The scrape's one-pass writer writes exactly what client_python's encoders write: for
every Accept a scraper sends, on gpumon's own registry and on families with every kind,
value and label value that needs escaping; and hands anything unusual to client_python."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, exposition
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from test_serve_units import Feeder, make_state

from gpumon.faces.serve.collector import make_registry
from gpumon.faces.serve.exposition import choose

ACCEPTS = [
    "",  # curl
    "text/plain;version=0.0.4",
    "text/plain;version=1.0.0",
    "text/plain;version=1.0.0;escaping=allow-utf-8",
    "application/openmetrics-text;version=1.0.0",
    # What Prometheus 2.x and 3.x send.
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
    "version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
    "application/openmetrics-text;version=1.0.0;escaping=underscores",
    "application/openmetrics-text;version=1.0.0;escaping=values",
    "application/openmetrics-text",
]


class Fixed:
    """A collector of given families, the same at every collect."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def odd_families() -> list[Metric]:
    g = GaugeMetricFamily("x_gauge", 'help with \\ and "quotes"\nand a newline', labels=["a", "b"])
    for i, v in enumerate([0.0, -0.0, 1.0, 1e21, 1234567.0, 1e-7, float("inf"), -float("inf"),
                           float("nan"), 3, 2**63]):  # fmt: skip
        g.add_metric([f"v{i}", 'q"\\\n'], v)
    g.add_metric(["z", "ünïcode"], 5)
    c = CounterMetricFamily("x_things", "a counter", labels=["k"])
    c.add_metric(["1"], 42)
    h = HistogramMetricFamily("x_lengths", "a histogram", labels=["gpu"])
    h.add_metric(["0"], [("0.05", 1), ("1.0", 3), ("+Inf", 4)], 2.5)
    i = InfoMetricFamily("x_build", "info", value={"version": "1.0", "commit": "abc"})
    u = GaugeMetricFamily("x_temperature_celsius", "with a unit", unit="celsius", value=40)
    bare = GaugeMetricFamily("x_plain", "no labels", value=1.5)
    return [g, c, h, i, u, bare]


@pytest.mark.parametrize("accept", ACCEPTS)
def test_writes_what_client_python_writes(accept: str) -> None:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(Fixed(odd_families()))  # type: ignore[arg-type]
    ProcessCollector(registry=registry)
    ours, our_type = choose(accept)
    theirs, their_type = exposition.choose_encoder(accept)
    assert our_type == their_type
    mine = ours(registry)
    assert _without_scrape_stats(mine) == _without_scrape_stats(theirs(registry))
    assert mine.count(b"process_") >= 5  # (their values move between two scrapes)


@pytest.mark.parametrize("accept", ACCEPTS[:6])
def test_writes_gpumons_own_scrape_as_client_python(tmp_path: Path, accept: str) -> None:
    state, _ = make_state(tmp_path)
    feeder = Feeder(state, {0: (101,), 1: (102,)})
    feeder.run(30, {0: "burst", 1: "steady"})
    registry = make_registry(state)
    exposition.generate_latest(registry)  # a first scrape: the second has its duration
    theirs, _ = exposition.choose_encoder(accept)
    ours, _ = choose(accept)
    expected = _without_scrape_stats(theirs(registry))
    assert _without_scrape_stats(ours(registry)) == expected
    assert len(expected) > 200


def _without_scrape_stats(body: bytes) -> list[bytes]:
    """The lines that do not change from one scrape to the next."""
    return [ln for ln in body.splitlines() if b"gpumon_scrape_" not in ln and b"process_" not in ln]


def test_hands_unusual_names_to_client_python_collecting_once() -> None:
    collected = []

    class Once:
        def collect(self) -> list[Metric]:
            collected.append(1)
            return [GaugeMetricFamily("odd:name", "a colon", value=1)]

    registry = CollectorRegistry(auto_describe=True)
    registry.register(Once())  # type: ignore[arg-type]
    collected.clear()  # (registering collects once, to learn the names)
    accept = ACCEPTS[4]
    ours, _ = choose(accept)
    body = ours(registry)
    assert collected == [1]  # the collectors ran once, whoever wrote the bytes
    theirs, _ = exposition.choose_encoder(accept)
    assert body == theirs(registry)
