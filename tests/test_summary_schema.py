"""Every face's run summary JSON against the one published schema, and golden files.

gpumon writes a run's summary as JSON in four faces (`analyze --json`, `watch
--summary-json`, `report --json`, serve's start/summary/stop log lines); their core is
built once (``gpumon.engine.summary_json``) and the shape is published
(``gpumon/schema/summary.schema.json``).  Each face's real output is validated against
its part of the schema, and compared with a golden file in tests/data/summary/, as
client_python tests its exposition byte for byte:

- what is deterministic is compared whole: analyze of the bundled synthetic trace, and
  report's JSON of a fixed two-node job (the render function on judged data);
- what a live run makes (the demo replaying that trace through the watch face and the
  daemon: times, seconds, pids and versions vary with the machine's load) is compared by
  the keys it carries, every value normalised away; the schema checks their types.

``GPUMON_UPDATE_GOLDEN=1`` rewrites the golden files (then review the diff: it is the
change to what every consumer of gpumon's JSON reads).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakenvml import missing_library_env
from test_demo import NO_NVML

from gpumon.faces.demo.command import SYNTHETIC
from gpumon.model import Cause, Reason, State
from gpumon.schema import summary_schema

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates")

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "data" / "summary"
UPDATE = os.environ.get("GPUMON_UPDATE_GOLDEN") == "1"
# Maps whose keys vary with what was seen (the evidence of a state, errors by kind, the
# labels of a job, what stacks saw): their own keys are not the summary's shape.
OPEN_MAPS = {"evidence", "nvml_errors", "log_reopens", "stacks", "jobs", "selector", "sources"}


def validate(face: str, data: object) -> None:
    """``data`` against the schema's definition of ``face``; every error said at once."""
    schema = summary_schema()
    root = {k: v for k, v in schema.items() if k != "anyOf"}
    validator = jsonschema.Draft202012Validator({**root, "$ref": f"#/$defs/{face}"})
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    said = [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]
    assert not said, f"{face} does not follow the schema:\n" + "\n".join(said[:20])
    # The whole schema takes what a face wrote, too (a consumer need not know the face).
    if face in ("analyze", "watch", "serve", "report"):
        jsonschema.Draft202012Validator(schema).validate(data)


def key_paths(x: object, at: str = "") -> set[str]:
    """The keys a consumer reads: ``gpus[].seconds.idle``; a list's elements together."""
    out: set[str] = set()
    if isinstance(x, dict):
        for k, v in x.items():
            path = f"{at}.{k}" if at else k
            out.add(path)
            if k not in OPEN_MAPS:
                out |= key_paths(v, path)
    elif isinstance(x, list):
        for v in x:
            out |= key_paths(v, at + "[]")
    return out


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path.name}: run with GPUMON_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path.name} changed (GPUMON_UPDATE_GOLDEN=1 rewrites it)"


def as_text(data: object) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def shape_text(data: object) -> str:
    return "\n".join(sorted(key_paths(data))) + "\n"


# --- the schema itself -----------------------------------------------------------------------


def test_the_schema_is_valid_and_ships_with_the_package() -> None:
    schema = summary_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    faces = {"analyze", "watch", "serve", "serve_episode", "report", "report_node"}
    assert faces <= set(schema["$defs"])
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "gpumon.schema" in pyproject["packages"]
    assert "*.schema.json" in pyproject["package-data"]["gpumon.schema"]


@pytest.mark.slow
def test_a_built_wheel_carries_the_schema(tmp_path: Path) -> None:
    """A consumer's gpumon is an installed wheel, not this checkout: the file is in it."""
    import zipfile

    from helpers.image import build_distribution, copy_sources

    wheel = build_distribution("wheel", copy_sources(tmp_path / "src"), tmp_path)
    with zipfile.ZipFile(wheel) as whl:
        shipped = json.loads(whl.read("gpumon/schema/summary.schema.json"))
    assert shipped == summary_schema()


def test_the_schema_names_every_state_cause_and_reason_of_the_model() -> None:
    """A new state, cause or reason is a change to the published schema too."""
    defs = summary_schema()["$defs"]
    assert defs["state"]["enum"] == [s.value for s in State]
    assert defs["cause"]["enum"] == [*(c.value for c in Cause), None]
    assert defs["reason"]["enum"] == [*(r.value for r in Reason), None]
    assert defs["seconds"]["required"] == [s.value for s in State]


def test_the_schema_refuses_what_drifted() -> None:
    """The schema is not a formality: a renamed key, a wrong type and an unknown state are
    each refused (the checks below would pass anything otherwise)."""
    good = json.loads((GOLDEN / "analyze.json").read_text())
    validate("analyze", good)
    for broken in (
        {k: v for k, v in good.items() if k != "lost_gpu_seconds"},  # a core key gone
        {**good, "verdict": "stalled"},  # not a state
        {**good, "lost_gpu_secs": 1.0},  # a key the schema does not know
        {**good, "gpus": [{**good["gpus"][0], "seconds": {"healthy": 1.0}}]},  # states missing
    ):
        with pytest.raises(AssertionError):
            validate("analyze", broken)


# --- analyze ---------------------------------------------------------------------------------


def test_analyze_json_of_the_bundled_trace() -> None:
    """`gpumon analyze --json` as a user runs it: the schema, then the golden, whole."""
    r = subprocess.run(
        [sys.executable, "-m", "gpumon", "analyze", "--json", str(SYNTHETIC)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    validate("analyze", data)
    for g in data["gpus"]:
        assert g["state"] == g["verdict"]  # the key before the schema, kept
    check_golden("analyze.json", as_text(data))


# --- report ----------------------------------------------------------------------------------


def _report() -> dict[str, Any]:
    """`gpumon report --json` of a fixed job: node n1 starved on storage, n2's GPUs
    busy-waiting on it (the cross-node straggler), one stretch of n2 missing."""
    from test_report_metrics import gpu

    from gpumon.engine import judge_job
    from gpumon.faces.report.queries import Fetched, Gap, JobSelector, LostTime
    from gpumon.faces.report.render import to_json

    readings = [
        *(gpu("n1:9977", i, State.STARVED, 0.3, idle_s=10.0, cause=Cause.IO) for i in (0, 1)),
        *(gpu("n2:9977", i, State.SYNC_STALL, 1.0, idle_s=10.0) for i in (0, 1)),
    ]
    t0 = 1_767_225_600.0
    fetched = Fetched(
        selector=JobSelector(hpc_job="4242"),
        since=t0 - 60,
        until=t0 + 200,
        start=t0,
        end=t0 + 110,
        step_s=15.0,
        readings=readings,
        gaps=[Gap("n2:9977", t0 + 30, t0 + 45, "no scrape")],
        user="alice",
        lost_by_cause=[LostTime("sync_stall", "", 200.0), LostTime("starved", "io", 140.0)],
    )
    return to_json(fetched, judge_job(readings), "http://127.0.0.1:9090", {"queries": 7})


def test_report_json_of_a_two_node_job() -> None:
    data = _report()
    validate("report", data)
    for node in data["nodes"]:
        validate("report_node", node)
    assert data["verdict"] == "sync_stall" and data["straggler"]["instance"] == "n1:9977"
    check_golden("report.json", as_text(data))


# --- watch and serve, live: the demo replays the bundled trace through both ---------------


# Plain lines at 60x (the 7-minute trace in about ten seconds), then the summary's file.
DEMO_ARGS = ("--plain", "--speed", "60", "--summary-json")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict, list[dict]]]:
    """One demo run: the watch face's --summary-json and the daemon's log lines."""
    tmp = tmp_path_factory.mktemp("demo")
    summary = tmp / "summary.json"
    env = missing_library_env({**os.environ, "TMPDIR": str(tmp), "HOME": str(tmp)})
    r = subprocess.run(
        [sys.executable, "-c", NO_NVML, "demo", *DEMO_ARGS, str(summary)],
        capture_output=True,
        text=True,
        timeout=600,  # a deadline: the run itself is about ten seconds
        cwd=ROOT,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    logs = list(tmp.glob("gpumon-demo-*/gpumon-serve.log"))
    assert len(logs) == 1, r.stdout
    records = [json.loads(line) for line in logs[0].read_text().splitlines()]
    yield json.loads(summary.read_text()), records


@pytest.mark.slow
def test_watch_summary_json(demo_run: tuple[dict, list[dict]]) -> None:
    data, _ = demo_run
    validate("watch", data)
    assert [g["gpu"] for g in data["gpus"]] == [0, 1]
    assert all(g["verdict"] in ("starved", "healthy") and g["samples"] > 0 for g in data["gpus"])
    check_golden("watch.keys", shape_text(data))


@pytest.mark.slow
def test_serve_summary_and_episode_lines(demo_run: tuple[dict, list[dict]]) -> None:
    _, records = demo_run
    lines = [r for r in records if r["event"] in ("start", "summary", "stop")]
    episodes = [r for r in records if r["event"] in ("episode_start", "episode_end")]
    assert lines[0]["event"] == "start" and lines[-1]["event"] == "stop", records[-1]
    assert episodes
    for line in lines:
        validate("serve", line)
    for ep in episodes:
        validate("serve_episode", ep)
    stop = lines[-1]
    assert stop["stop_reason"] and stop["verdict"] == "starved"
    for g in stop["gpus"]:
        assert g["state"] == g["state_now"]  # the key before the schema, kept
    check_golden("serve-stop.keys", shape_text(stop))
    check_golden("serve-episode.keys", shape_text(episodes))


def test_every_face_writes_the_core_alike() -> None:
    """The drift the schema ended: one rounding of lost GPU-seconds, one name for a GPU's
    run verdict, in every golden file."""
    schema = summary_schema()["$defs"]
    core = set(schema["run"]["required"])
    gpu_core = set(schema["gpu"]["required"])
    for name in ("watch.keys", "serve-stop.keys"):
        keys = set((GOLDEN / name).read_text().split())
        assert core <= keys, (name, core - keys)
        assert {f"gpus[].{k}" for k in gpu_core} <= keys, name
    analyze = json.loads((GOLDEN / "analyze.json").read_text())
    report = json.loads((GOLDEN / "report.json").read_text())
    for gpu in [*analyze["gpus"], *(g for n in report["nodes"] for g in n["gpus"])]:
        assert gpu["lost_gpu_seconds"] == round(gpu["lost_gpu_seconds"], 1)
        assert gpu_core <= set(gpu)
