"""`gpumon serve`'s groups of metrics switched on and off, node_exporter's way.

``--[no-]collector.<group>`` and ``[collectors] <group> = true|false`` for every group
that ``gpumon_scrape_group_success`` names: each switch leaves its group out of the
scrape (and the group's health series), the file and the flag say the same, a flag wins
over the file, an unknown group is refused in one sentence; with the hardware off, NVML's
hardware readings are not taken at all (counted in the fake library's calls).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import test_serve_daemon
from fakenvml import FakeGPU, Scenario, call_count
from prometheus_client import generate_latest
from test_serve_daemon import one, series, start_daemon
from test_serve_units import Feeder, make_state

from gpumon.cli import build_parser
from gpumon.errors import ConfigError
from gpumon.faces.serve import config as c
from gpumon.faces.serve.collector import make_registry
from gpumon.faces.serve.collectors import GROUPS
from gpumon.faces.serve.command import load_config

daemons = test_serve_daemon.daemons  # the fixture: daemons a test started, stopped after it
NAMES = {g.group: g.names for g in GROUPS}


def scrape(tmp_path: Path, collectors: tuple[str, ...]) -> str:
    """One scrape of a daemon state fed two GPUs, two jobs, with these groups on."""
    state, _ = make_state(tmp_path, collectors=collectors)
    Feeder(state, {0: (101,), 1: (102,)}).run(12, {0: "steady", 1: "burst"})
    return generate_latest(make_registry(state)).decode()


def families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def exported(name: str, fams: set[str]) -> bool:
    """A family as a group names it is in the scrape (counters are typed without _total)."""
    return name in fams or name.removesuffix("_total") in fams


def groups_reported(text: str) -> set[str]:
    return {
        line.split('"')[1]
        for line in text.splitlines()
        if line.startswith("gpumon_scrape_group_success{")
    }


def parse(*argv: str, config: Path | None = None) -> c.ServeConfig:
    args = build_parser().parse_args(["serve", "--config", str(config or os.devnull), *argv])
    return load_config(args)


def test_the_switches_name_every_group_the_scrape_reports() -> None:
    assert c.COLLECTORS == tuple(NAMES) == (
        "build", "gpus", "hardware", "detection", "jobs", "host", "health",
    )  # fmt: skip
    assert c.ServeConfig().collectors == c.COLLECTORS  # all on by default


@pytest.mark.parametrize("group", c.COLLECTORS)
def test_each_switch_leaves_its_group_out_of_the_scrape(tmp_path: Path, group: str) -> None:
    text = scrape(tmp_path, tuple(g for g in c.COLLECTORS if g != group))
    fams = families(text)
    assert not [n for n in NAMES[group] if exported(n, fams)], f"{group} still exported"
    assert groups_reported(text) == set(c.COLLECTORS) - {group}
    for other in set(c.COLLECTORS) - {group}:  # every other group is whole
        assert NAMES[other][0] in fams or exported(NAMES[other][0], fams), other
    assert exported("gpumon_scrape_errors_total", fams)  # the scrape's own stay


def test_all_groups_on_is_every_family(tmp_path: Path) -> None:
    fams = families(scrape(tmp_path, c.COLLECTORS))
    missing = [n for names in NAMES.values() for n in names if not exported(n, fams)]
    assert not missing


def test_the_file_and_the_flags_say_the_same(tmp_path: Path) -> None:
    toml = tmp_path / "g.toml"
    toml.write_text("[collectors]\nhardware = false\nhost = false\n")
    by_file = parse(config=toml).collectors
    by_flags = parse("--no-collector.hardware", "--no-collector.host").collectors
    assert by_file == by_flags == ("build", "gpus", "detection", "jobs", "health")
    assert parse().collectors == c.COLLECTORS
    toml.write_text("[collectors]\nhardware = true\n")  # on, as by default
    assert parse(config=toml).collectors == parse("--collector.hardware").collectors


def test_a_flag_wins_over_the_file(tmp_path: Path) -> None:
    toml = tmp_path / "g.toml"
    toml.write_text("[collectors]\nhardware = false\njobs = false\n")
    cfg = parse("--collector.hardware", "--no-collector.gpus", config=toml)
    assert cfg.collectors == ("build", "hardware", "detection", "host", "health")


def test_an_unknown_group_in_the_file_is_refused_in_one_sentence() -> None:
    with pytest.raises(ConfigError) as info:
        c.parse("[collectors]\nhardware = false\ngpu = false\n", "gpumon.toml")
    msg = str(info.value)
    assert msg == (
        "gpumon.toml:3: [collectors] gpu: unknown key (known: build, gpus, hardware, "
        "detection, jobs, host, health); gpumon serve did not start."
    )
    with pytest.raises(ConfigError, match=r"\[collectors\] hardware: must be true or false"):
        c.parse('[collectors]\nhardware = "off"\n', "gpumon.toml")


@pytest.mark.parametrize("flag", ["--no-collector.gpu", "--collector.hardwares", "--collector.x"])
def test_an_unknown_group_on_the_command_line_is_refused_in_one_sentence(flag: str) -> None:
    """No abbreviation either: --no-collector.gpu is not --no-collector.gpus."""
    res = subprocess.run(
        [sys.executable, "-m", "gpumon", "serve", "--config", os.devnull, flag],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and not res.stdout
    said = res.stderr.strip().splitlines()[-1]
    assert said.startswith(f"gpumon serve: error: unrecognized arguments: {flag}"), said


def test_hardware_off_reads_nothing_of_it_from_nvml(fake_nvml, monkeypatch) -> None:
    """The hardware's readings (every 10 s: field values, memory clock, fan, P-state, the
    video engines; the PCIe throughput every 5 s) are not asked for when no group shows
    them."""
    import gpumon.sample.nvml as nvml_module
    from gpumon.sample.nvml import NvmlSampler

    fake_nvml.set(Scenario(gpus=[FakeGPU(), FakeGPU(gpm_supported=True)]))
    fake_nvml.load()
    monkeypatch.setattr(nvml_module, "_init_done", False)  # this process's NVML: the fake
    hardware_calls = ("field_values", "fan", "pstate", "pcie", "encoder", "decoder")
    counted = {name: call_count(name) for name in hardware_calls}
    off = NvmlSampler(hardware=False, hardware_every_s=0.0, pcie_every_s=0.0)
    for _ in range(3):
        (s, _) = off.sample()
        assert s.util_pct == 100.0 and s.memory_temperature_c is None
        assert s.energy_joules is None and s.pcie_tx_bytes_per_s is None
    assert {name: call_count(name) - counted[name] for name in hardware_calls} == dict.fromkeys(
        hardware_calls, 0
    )
    on = NvmlSampler(hardware_every_s=0.0, pcie_every_s=0.0)
    (s, _) = on.sample()
    assert s.memory_temperature_c == 50 and s.energy_joules is not None
    assert all(call_count(name) > counted[name] for name in hardware_calls)


@pytest.mark.slow
def test_a_daemon_with_the_hardware_off_by_file_and_jobs_on_by_flag(
    fake_nvml, tmp_path, daemons
) -> None:
    fake_nvml.set(Scenario(gpus=[FakeGPU(temperature_c=61)]))
    toml = tmp_path / "gpumon.toml"
    toml.write_text("[collectors]\nhardware = false\njobs = false\n")
    d = start_daemon(fake_nvml.env, tmp_path, "--config", str(toml), "--collector.jobs")
    daemons.append(d)
    d.wait_for(lambda m: bool(series(m, "gpumon_gpu_utilization_ratio")), 20, "sampling")
    m = d.metrics()
    assert not series(m, "gpumon_gpu_temperature_celsius")
    assert not series(m, "gpumon_gpu_xid_errors_total")
    assert not series(m, "gpumon_scrape_group_success", group="hardware")
    assert one(m, "gpumon_scrape_group_success", group="jobs") == 1
    assert one(m, "gpumon_jobs_untracked_total") == 0
    assert one(m, "gpumon_gpu_power_watts", gpu="0") > 0
    assert d.stop() == 0, d.stderr_text
