"""`gpumon serve`'s parts on data: job labels, the log, histograms, the daemon state and
the collector — no NVML, no subprocess.

Ticks are synthetic: each GPU delivers driver points every 1/6 s, busy (100) or idle (0)
following a burst pattern, as ``nvmlDeviceGetSamples`` would.
"""

from __future__ import annotations

import io
import json
import os
import pwd
import weakref
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from gpumon.engine import Polled, Reading, Session
from gpumon.engine.memory import Durations
from gpumon.faces.serve.collector import METRIC_NAMES, make_registry
from gpumon.faces.serve.config import ServeConfig
from gpumon.faces.serve.daemon import ServeState, job_options
from gpumon.faces.serve.log import EventLog
from gpumon.model import (
    GpuIdentity,
    GpuProcess,
    GpuSample,
    HostSample,
    Snapshot,
    State,
    TraceHeader,
)
from gpumon.sample.joblabels import JobLabels, JobResolver, parse_cgroup, parse_environ

PERIOD = 1.0 / 6.0
POD_UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
CID = "a" * 64


# --------------------------------------------------------------------------- job labels
@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        ("0::/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0\n", ("1234", "", "")),
        (
            "12:memory:/slurm/uid_1000/job_77/step_batch/task_0\n4:cpu:/slurm/uid_1000/job_77\n",
            ("77", "", ""),
        ),
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
            ("", POD_UID, CID[:12]),
        ),
        (f"11:devices:/kubepods/besteffort/pod{POD_UID}/{CID}\n", ("", POD_UID, CID[:12])),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", ("", "", "")),
        ("0::/system.slice/docker-" + CID + ".scope\n", ("", "", "")),
    ],
)
def test_parse_cgroup(cgroup: str, expected: tuple[str, str, str]) -> None:
    assert parse_cgroup(cgroup) == expected


def test_parse_environ_takes_only_what_it_needs() -> None:
    env = b"PATH=/bin\0SLURM_JOB_ID=991\0HOSTNAME=trainer-0\0SECRET=x\0"
    assert parse_environ(env) == {"SLURM_JOB_ID": "991", "HOSTNAME": "trainer-0"}


def fake_proc(
    root: Path, pid: int, cgroup: str, environ: bytes | None = None, namespace: str | None = None
) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(cgroup)
    if environ is not None:
        (d / "environ").write_bytes(environ)
    if namespace is not None:
        ns = d / "root/var/run/secrets/kubernetes.io/serviceaccount"
        ns.mkdir(parents=True)
        (ns / "namespace").write_text(namespace + "\n")


def test_resolver_reads_each_pid_once_and_forgets_gone_pids(tmp_path: Path) -> None:
    fake_proc(tmp_path, 10, "0::/user.slice\n", b"SLURM_JOB_ID=55\0")
    fake_proc(
        tmp_path,
        11,
        f"0::/kubepods/burstable/pod{POD_UID}/{CID}\n",
        b"HOSTNAME=bert-worker-1\0",
        namespace="ml",
    )
    fake_proc(tmp_path, 12, f"0::/kubepods/burstable/pod{POD_UID}/{CID}\n")  # no environ
    r = JobResolver(procfs=str(tmp_path))
    me = pwd.getpwuid(os.getuid()).pw_name  # who owns the fake /proc's files
    assert r.labels(10) == JobLabels(hpc_job="55", kind="slurm", name="55", user=me)
    pod = JobLabels("", "bert-worker-1", "ml", CID[:12], "pod", "bert-worker-1", user="ml")
    assert r.labels(11) == pod  # a pod's user is its namespace
    uid_only = JobLabels(pod=POD_UID, container=CID[:12], kind="pod", name=POD_UID)
    assert r.labels(12) == uid_only  # the pod's uid when no name
    assert r.labels(999) == JobLabels() and not r.labels(999).known  # vanished: no labels
    assert r.reads == 4
    r.labels(10)
    r.labels(11)
    assert r.reads == 4  # cached
    r.retain({11})
    assert len(r) == 1
    r.labels(10)
    assert r.reads == 5  # read again after it left the GPUs (its pid may be reused)


def test_resolver_sources_can_be_turned_off(tmp_path: Path) -> None:
    fake_proc(tmp_path, 10, "0::/slurm/uid_0/job_9/step_0\n", b"SLURM_JOB_ID=9\0")
    fake_proc(tmp_path, 11, f"0::/kubepods/pod{POD_UID}/{CID}\n", b"HOSTNAME=p\0")
    assert JobResolver(["kubernetes"], procfs=str(tmp_path)).labels(10) == JobLabels()
    assert JobResolver(["slurm"], procfs=str(tmp_path)).labels(11) == JobLabels()
    assert JobResolver([], procfs=str(tmp_path)).labels(10) == JobLabels()


def test_resolver_cache_is_bounded(tmp_path: Path) -> None:
    r = JobResolver(procfs=str(tmp_path), max_cached=3)
    for pid in range(10):
        r.labels(pid)
    assert len(r) == 3


# --------------------------------------------------------------------------- the log
def test_log_writes_reopens_and_survives_failures(tmp_path: Path) -> None:
    err = io.StringIO()
    path = tmp_path / "g.jsonl"
    log = EventLog(str(path), stderr=err)
    assert log.write({"event": "a", "x": float("nan")})
    path.rename(tmp_path / "g.jsonl.1")
    log.request_reopen()
    assert log.write({"event": "b"})
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"event": "b"}]
    assert json.loads((tmp_path / "g.jsonl.1").read_text()) == {"event": "a", "x": None}
    # The directory disappears: failures are counted, reported once, then recovery once.
    path.unlink()
    (tmp_path / "g.jsonl.1").unlink()
    tmp_path.rename(tmp_path.with_name(tmp_path.name + "-moved"))
    log.reopen()
    assert not log.write({"event": "c"})
    assert not log.write({"event": "d"})
    assert log.errors_total == 2  # the two lines lost (the failed reopen lost none)
    assert err.getvalue().count("cannot write the log") == 1
    tmp_path.mkdir()
    assert log.write({"event": "e"})
    assert "works again" in err.getvalue()
    log.close()


def test_log_off_writes_nothing() -> None:
    log = EventLog(None)
    assert not log.write({"event": "a"}) and log.errors_total == 0


# --------------------------------------------------------------------------- histograms
def test_histogram_is_cumulative_and_fixed_size() -> None:
    h = Durations((0.1, 1.0))
    for x in (0.05, 0.1, 0.5, 3.0, float("nan"), -1.0):
        h.add(x)
    assert h.cumulative() == [("0.1", 2), ("1.0", 3), ("+Inf", 4)]
    assert h.count == 4 and h.total == pytest.approx(3.65)
    for _ in range(10000):
        h.add(0.2)
    assert len(h.export_counts) == 3 and len(h.counts) == Durations.BINS


# --------------------------------------------------------------------------- daemon state
IDENTS = (
    GpuIdentity(0, "GPU-0", "H100", "0:17", 80 << 30, 700.0),
    GpuIdentity(1, "GPU-1", "H100", "0:18", 80 << 30, 700.0),
)


def busy(pattern: str, t: float) -> bool:
    """'steady', 'spin' (pinned at half the power: a collective's spin), or 'burst'
    (0.5 s period, 30 % busy)."""
    return pattern in ("steady", "spin") or (t % 0.5) < 0.15


class Feeder:
    """Drives a ServeState with synthetic ticks of 0.5 s, like the loop would."""

    def __init__(
        self, state: ServeState, pids: dict[int, tuple[int, ...]], *, via_step: bool = False
    ) -> None:
        self.state = state
        self.pids = pids
        self.t = 100.0
        self.next_point = self.t
        self.via_step = via_step  # through step() (the loop's path), not ingest()
        self.xids: dict[int, tuple[int, ...]] = {}  # XID errors in the next tick, by GPU

    def run(
        self, seconds: float, patterns: dict[int, str], lost: frozenset[int] = frozenset()
    ) -> None:
        end = self.t + seconds
        while self.t < end:
            self.t += 0.5
            gpus = []
            for g in IDENTS:
                if g.index in lost:
                    xids = self.xids.pop(g.index, ())  # XID 79: how a GPU goes
                    gpus.append(
                        GpuSample(t_s=self.t, gpu=g.index, uuid=g.uuid, lost=True, xid_errors=xids)
                    )
                    continue
                pts = []
                tp = self.next_point
                while tp + PERIOD <= self.t + 1e-9:
                    tp += PERIOD
                    pts.append((tp, 100.0 if busy(patterns[g.index], tp) else 0.0))
                from gpumon.model import UtilPoint

                gpus.append(
                    GpuSample(
                        t_s=self.t,
                        gpu=g.index,
                        uuid=g.uuid,
                        util_samples=tuple(UtilPoint(a, b) for a, b in pts),
                        util_pct=pts[-1][1] if pts else None,
                        mem_used_bytes=4 << 30,
                        mem_total_bytes=80 << 30,
                        power_watts=600.0 if patterns[g.index] == "steady" else 300.0,
                        power_limit_watts=700.0,
                        processes=tuple(GpuProcess(pid) for pid in self.pids.get(g.index, ())),
                        # GPM on GPU 1 only: GPU 0 is a card without it.
                        sm_active_ratio=None if g.index == 0 else 0.8,
                        sm_occupancy_ratio=None if g.index == 0 else 0.4,
                        tensor_active_ratio=None if g.index == 0 else 0.5,
                        mem_util_pct=40.0,
                        sm_clock_mhz=1980,
                        clock_event_reasons=0x4 | 0x40,  # power cap, hardware thermal
                        temperature_c=71.0,
                        # GPU 0 is passively cooled, without NVLink, with ECC off.
                        unsupported=("fan", "nvlink", "ecc_volatile") if g.index == 0 else (),
                        mem_clock_mhz=2619,
                        memory_temperature_c=80.0,
                        fan_speed_pct=None if g.index == 0 else 55.0,
                        pstate=0,
                        energy_joules=600.0 * self.t,
                        ecc_corrected_errors=None if g.index == 0 else 4,
                        ecc_uncorrected_errors=None if g.index == 0 else 1,
                        ecc_corrected_errors_aggregate=40,
                        ecc_uncorrected_errors_aggregate=2,
                        pcie_replays=9,
                        nvlink_tx_bytes=None if g.index == 0 else 1 << 40,
                        nvlink_rx_bytes=None if g.index == 0 else 1 << 39,
                        pcie_tx_bytes_per_s=3.0e9,
                        pcie_rx_bytes_per_s=1.5e9,
                        # GPU 0 predates row remapping; GPU 1 has a remap awaiting a reset.
                        remapped_rows_corrected=None if g.index == 0 else 2,
                        remapped_rows_uncorrected=None if g.index == 0 else 1,
                        row_remap_pending=None if g.index == 0 else 1,
                        row_remap_failed=None if g.index == 0 else 0,
                        memory_reserved_bytes=512 << 20,
                        encoder_util_pct=None if g.index == 0 else 12.0,
                        decoder_util_pct=None if g.index == 0 else 37.0,
                        dram_active_ratio=None if g.index == 0 else 0.64,
                        fp64_active_ratio=None if g.index == 0 else 0.08,
                        fp32_active_ratio=None if g.index == 0 else 0.3,
                        fp16_active_ratio=None if g.index == 0 else 0.02,
                        xid_errors=self.xids.pop(g.index, ()),
                    )
                )
            while self.next_point + PERIOD <= self.t + 1e-9:
                self.next_point += PERIOD
            host = HostSample(t_s=self.t, cpu_pct=35.0, iowait_pct=2.0)
            snap = Snapshot(t_s=self.t, gpus=tuple(gpus), host=host)
            if self.via_step:
                self.state.session.source.push(snap)  # type: ignore[attr-defined]
                self.state.step()
                assert self.state.tick_errors_total == 0
            else:
                ingest(self.state, snap)


def ingest(state: ServeState, snap: Snapshot) -> None:
    """A tick as the loop folds it: the reads (jobs' /proc) first, then the fold."""
    reading = state.session.read(snap)
    state.ingest(Reading(Polled(reading.polled.due, snap, 0.004), reading.jobs))


def serve_session(procfs: Path, cfg: ServeConfig, *, trees_procfs: str | None = None) -> Session:
    """The daemon's session over IDENTS, fed by the test (no NVML), labels from ``procfs``."""
    opts = job_options(cfg)
    if trees_procfs is not None:
        from dataclasses import replace

        opts = replace(opts, procfs=trees_procfs)
    return Session.offline(
        TraceHeader(1, "gpumon", gpus=IDENTS),
        live=True,
        jobs=opts,
        resolver=JobResolver(procfs=str(procfs)),
    )


def make_state(tmp_path: Path, **cfg: object) -> tuple[ServeState, Path]:
    for pid, job in ((101, "A"), (102, "B"), (103, "A")):
        fake_proc(
            tmp_path / "proc",
            pid,
            f"0::/slurm/uid_0/job_{job}/step_0\n".replace(f"job_{job}", f"job_{ord(job)}"),
        )
    log = tmp_path / "g.jsonl"
    config = ServeConfig(**cfg)  # type: ignore[arg-type]
    state = ServeState(serve_session(tmp_path / "proc", config), config, EventLog(str(log)))
    return state, log


_REGISTRIES: weakref.WeakKeyDictionary[ServeState, object] = weakref.WeakKeyDictionary()


def metrics(state: ServeState) -> dict[str, float]:
    """One scrape through the state's registry (one per state, as the daemon has)."""
    registry = _REGISTRIES.setdefault(state, make_registry(state))
    out = {}
    for line in generate_latest(registry).decode().splitlines():  # type: ignore[arg-type]
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


def value(m: dict[str, float], name: str, **labels: str) -> float:
    hits = [
        v
        for k, v in m.items()
        if (k == name or k.startswith(name + "{"))
        and all(f'{a}="{b}"' in k for a, b in labels.items())
    ]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def test_two_jobs_get_their_own_states_and_every_metric_is_emitted(tmp_path: Path) -> None:
    state, log = make_state(tmp_path)
    f = Feeder(state, {0: (101,), 1: (102,)})  # job 65 ("A") on GPU 0, job 66 on GPU 1
    f.run(15, {0: "steady", 1: "steady"})
    f.run(15, {0: "burst", 1: "steady"})
    m = metrics(state)
    assert value(m, "gpumon_gpu_state", gpu="0", state="starved") == 1
    assert value(m, "gpumon_gpu_state", gpu="1", state="healthy") == 1
    assert value(m, "gpumon_job_state", hpc_job="65", state="starved") == 1
    assert value(m, "gpumon_job_state", hpc_job="66", state="healthy") == 1
    assert value(m, "gpumon_gpu_job_info", gpu="0", hpc_job="65") == 1
    assert (
        value(m, "gpumon_gpu_cause", gpu="0", cause="unknown")
        + value(m, "gpumon_gpu_cause", gpu="0", cause="cpu")
        <= 1
    )
    assert value(m, "gpumon_gpu_idle_gap_seconds_bucket", gpu="0", le="0.5") >= 20
    assert value(m, "gpumon_gpu_idle_gap_seconds_bucket", gpu="0", le="0.25") == 0
    assert value(m, "gpumon_gpu_state_seconds_total", gpu="0", state="starved") > 0
    assert value(m, "gpumon_host_cpu_ratio") == pytest.approx(0.35)
    assert value(m, "gpumon_host_iowait_ratio") == pytest.approx(0.02)
    assert value(m, "gpumon_gpu_power_watts", gpu="1") == 600
    assert value(m, "gpumon_gpu_sm_active_ratio", gpu="1") == 0.8
    assert value(m, "gpumon_gpu_tensor_active_ratio", gpu="1") == 0.5
    assert not [k for k in m if k.startswith("gpumon_gpu_sm_active_ratio{") and 'gpu="0"' in k]
    assert value(m, "gpumon_sample_duration_seconds") == pytest.approx(0.004)
    assert value(m, "gpumon_samples_total") == 60
    # Every family the collector can emit was emitted, and nothing else.
    metrics(state)  # a second scrape adds gpumon_scrape_duration_seconds
    families = {k.split("{")[0] for k in metrics(state)}
    families = {
        n.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for n in families
    }
    emitted = {n.removesuffix("_total") for n in families}
    declared = {n.removesuffix("_total") for n in METRIC_NAMES}
    missing = declared - emitted
    assert emitted <= declared, emitted - declared
    # No NVML errors without NVML; no reason for a plainly starved or healthy GPU.
    assert not missing - {"gpumon_nvml_errors", "gpumon_gpu_reason", "gpumon_job_reason"}, missing
    assert all(ep.reason is None for ep in state.memory.open.values() if ep is not None)
    # Two jobs on subsets of the GPUs: each has its own detector.
    assert all(j.detector is not None for j in state.jobs.values())
    records = [json.loads(x) for x in log.read_text().splitlines()]
    starved = [r for r in records if r["event"] == "episode_start" and r["state"] == "starved"]
    assert any(r["scope"] == "gpu" and r["gpu"] == 0 and r["job"] == "65" for r in starved)
    assert any(r["scope"] == "job" and r["jobs"][0]["hpc_job"] == "65" for r in starved)
    assert not any(r.get("job") == "66" for r in starved)


def test_one_job_on_every_gpu_shares_the_node_detector(tmp_path: Path) -> None:
    state, _ = make_state(tmp_path)
    Feeder(state, {0: (101,), 1: (103,)}).run(5, {0: "steady", 1: "steady"})
    (job,) = state.jobs.values()
    assert job.detector is None and job.gpus == frozenset({0, 1})


@pytest.mark.parametrize(
    "pids, compared", [({0: (101,), 1: (103,)}, True), ({0: (101,), 1: (102,)}, False)]
)
def test_gpus_are_compared_as_peers_only_within_one_job(
    tmp_path: Path, pids: dict[int, tuple[int, ...]], compared: bool
) -> None:
    """A GPU pinned at half the power of another is one job's rank spinning on its
    straggler; the same two GPUs held by two jobs are two healthy jobs of different
    weight, and the node's detector must not compare them."""
    state, _ = make_state(tmp_path)
    Feeder(state, pids).run(40, {0: "spin", 1: "steady"})
    det = state.session.detector
    assert det is not None
    got = {i: ep.state for i, ep in det.open_episodes().items() if i is not None}
    if compared:
        assert got[0] == State.SYNC_STALL, got
    else:
        assert got == {0: State.HEALTHY, 1: State.HEALTHY}, got


def test_jobs_are_forgotten_and_capped(tmp_path: Path) -> None:
    state, _ = make_state(tmp_path, job_linger_s=3.0, max_jobs=1)
    f = Feeder(state, {0: (101,), 1: (102,)})
    f.run(3, {0: "steady", 1: "steady"})
    # The second job is counted once, not once per tick it stays untracked.
    assert len(state.jobs) == 1 and state.jobs_dropped_total == 1
    f.pids = {}
    f.run(5, {0: "steady", 1: "steady"})
    assert not state.jobs and len(state.session.jobs.resolver) == 0  # type: ignore[union-attr]
    assert value(metrics(state), "gpumon_jobs_untracked_total") == state.jobs_dropped_total


def test_lost_gpu_is_marked_and_its_values_absent(tmp_path: Path) -> None:
    state, _ = make_state(tmp_path)
    f = Feeder(state, {0: (101,)})
    f.run(3, {0: "steady", 1: "steady"})
    f.run(2, {0: "steady", 1: "steady"}, lost=frozenset({1}))
    m = metrics(state)
    assert value(m, "gpumon_gpu_lost", gpu="1") == 1
    assert value(m, "gpumon_gpu_lost", gpu="0") == 0
    assert not [k for k in m if k.startswith("gpumon_gpu_power_watts") and 'gpu="1"' in k]
    assert value(m, "gpumon_gpu_info", gpu="1") == 1


def steady_for(tmp_path: Path, seconds: float) -> tuple[ServeState, Path, Feeder]:
    """A state fed ``seconds`` of two steady GPUs, GPU 0 held by job 65."""
    state, log = make_state(tmp_path)
    feeder = Feeder(state, {0: (101,)})
    feeder.run(seconds, {0: "steady", 1: "steady"})
    return state, log, feeder


def keys_of(m: dict[str, float], name: str, gpu: int) -> list[str]:
    return [k for k in m if k.startswith(name + "{") and f'gpu="{gpu}"' in k]


def test_hardware_series_follow_the_samples_in_base_units(tmp_path: Path) -> None:
    state, _, f = steady_for(tmp_path, 2)
    m = metrics(state)
    assert value(m, "gpumon_gpu_temperature_celsius", gpu="1") == 71.0
    assert value(m, "gpumon_gpu_memory_temperature_celsius", gpu="1") == 80.0
    assert value(m, "gpumon_gpu_sm_clock_hertz", gpu="1") == 1980e6
    assert value(m, "gpumon_gpu_memory_clock_hertz", gpu="1") == 2619e6
    reasons = {
        k.split('reason="')[1].split('"')[0]: m[k]
        for k in keys_of(m, "gpumon_gpu_clock_event_reason", 1)
    }
    assert len(reasons) == 9 and {r for r, v in reasons.items() if v} == {
        "sw_power_cap",
        "hw_thermal_slowdown",
    }
    assert value(m, "gpumon_gpu_fan_speed_ratio", gpu="1") == 0.55
    assert value(m, "gpumon_gpu_performance_state", gpu="1") == 0
    assert value(m, "gpumon_gpu_memory_utilization_ratio", gpu="1") == 0.4
    assert value(m, "gpumon_gpu_energy_joules_total", gpu="1") == 600.0 * f.t
    assert value(m, "gpumon_gpu_ecc_errors_total", gpu="1", type="uncorrected") == 1
    assert value(m, "gpumon_gpu_ecc_aggregate_errors_total", gpu="0", type="corrected") == 40
    assert value(m, "gpumon_gpu_pcie_replays_total", gpu="0") == 9
    assert value(m, "gpumon_gpu_nvlink_transmit_bytes_total", gpu="1") == 1 << 40
    assert value(m, "gpumon_gpu_nvlink_receive_bytes_total", gpu="1") == 1 << 39
    # dcgm-exporter's other default counters that NVML gives.
    assert value(m, "gpumon_gpu_pcie_transmit_bytes_per_second", gpu="0") == 3.0e9
    assert value(m, "gpumon_gpu_pcie_receive_bytes_per_second", gpu="1") == 1.5e9
    assert value(m, "gpumon_gpu_memory_reserved_bytes", gpu="0") == 512 << 20
    assert value(m, "gpumon_gpu_remapped_rows_total", gpu="1", type="corrected") == 2
    assert value(m, "gpumon_gpu_remapped_rows_total", gpu="1", type="uncorrected") == 1
    assert value(m, "gpumon_gpu_row_remap_pending", gpu="1") == 1
    assert value(m, "gpumon_gpu_row_remap_failed", gpu="1") == 0
    assert value(m, "gpumon_gpu_encoder_utilization_ratio", gpu="1") == 0.12
    assert value(m, "gpumon_gpu_decoder_utilization_ratio", gpu="1") == 0.37
    assert value(m, "gpumon_gpu_dram_active_ratio", gpu="1") == 0.64
    assert value(m, "gpumon_gpu_fp64_active_ratio", gpu="1") == 0.08
    assert value(m, "gpumon_gpu_fp32_active_ratio", gpu="1") == 0.3
    assert value(m, "gpumon_gpu_fp16_active_ratio", gpu="1") == 0.02
    # What GPU 0 does not report is absent, never 0.
    for name in (
        "fan_speed_ratio", "ecc_errors_total", "nvlink_transmit_bytes_total",
        "remapped_rows_total", "row_remap_pending", "row_remap_failed",
        "encoder_utilization_ratio", "dram_active_ratio", "fp16_active_ratio",
    ):  # fmt: skip
        assert not keys_of(m, f"gpumon_gpu_{name}", 0)


def test_xid_errors_are_counted_by_code_and_kept_while_lost(tmp_path: Path) -> None:
    state, log, f = steady_for(tmp_path, 1)
    m = metrics(state)
    # The codes people page on are there at 0 before any error, so the first is an increase.
    assert value(m, "gpumon_gpu_xid_errors_total", gpu="1", xid="79") == 0
    assert value(m, "gpumon_gpu_last_xid", gpu="1") == 0
    f.xids = {1: (13, 13, 48)}
    f.run(0.5, {0: "steady", 1: "steady"})
    f.xids = {1: (79,)}
    f.run(0.5, {0: "steady", 1: "steady"}, lost=frozenset({1}))
    m = metrics(state)
    assert value(m, "gpumon_gpu_xid_errors_total", gpu="1", xid="13") == 2
    assert value(m, "gpumon_gpu_xid_errors_total", gpu="1", xid="48") == 1
    assert value(m, "gpumon_gpu_xid_errors_total", gpu="1", xid="79") == 1  # lost: still here
    assert value(m, "gpumon_gpu_last_xid", gpu="1") == 79
    assert value(m, "gpumon_gpu_xid_errors_total", gpu="0", xid="79") == 0
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["xid"] for r in records if r["event"] == "xid"] == [13, 13, 48, 79]
    # Bounded: codes beyond MAX_XID_LABELS distinct ones per GPU count as "other".
    f.xids = {0: tuple(range(100, 140))}
    f.run(0.5, {0: "steady", 1: "steady"})
    m = metrics(state)
    assert len(keys_of(m, "gpumon_gpu_xid_errors_total", 0)) == 7 + 32 + 1
    assert value(m, "gpumon_gpu_xid_errors_total", gpu="0", xid="other") == 40 - 32
    assert value(m, "gpumon_gpu_last_xid", gpu="0") == 139


def test_xid_series_are_absent_where_xid_events_are_not_watched(tmp_path: Path) -> None:
    state, _ = make_state(tmp_path)
    unwatched = GpuSample(1.0, 0, IDENTS[0].uuid, unsupported=("xid_events",))
    watched = GpuSample(1.0, 1, IDENTS[1].uuid)
    ingest(state, Snapshot(1.0, (unwatched, watched)))
    m = metrics(state)
    assert not [k for k in m if "xid" in k and 'gpu="0"' in k]  # unknown, not 0
    assert value(m, "gpumon_gpu_xid_errors_total", gpu="1", xid="48") == 0


def test_the_reason_is_exported_while_the_episode_has_one(tmp_path: Path) -> None:
    state, _ = make_state(tmp_path)
    f = Feeder(state, {0: (101,)})
    f.run(2, {0: "steady", 1: "steady"})
    m = metrics(state)
    # Busy from its first sample, 2 s in: being judged, never "idle (start-up)".
    assert value(m, "gpumon_gpu_reason", gpu="0", reason="judging") == 1
    assert value(m, "gpumon_gpu_state", gpu="0", state="idle") == 0
    f.run(20, {0: "steady", 1: "steady"})
    f.run(3, {0: "steady", 1: "steady"}, lost=frozenset({1}))
    m = metrics(state)
    assert value(m, "gpumon_gpu_reason", gpu="1", reason="gpu_lost") == 1
    assert value(m, "gpumon_gpu_state", gpu="0", state="healthy") == 1
    assert not [k for k in m if k.startswith("gpumon_gpu_reason") and 'gpu="0"' in k]


def test_a_failing_part_never_fails_the_scrape(tmp_path: Path, monkeypatch) -> None:
    state, _ = make_state(tmp_path)
    Feeder(state, {}).run(2, {0: "steady", 1: "steady"})

    def boom() -> None:
        raise RuntimeError("detector bug")

    monkeypatch.setattr(state.session.detector, "lost_gpu_seconds", boom)
    m = metrics(state)
    assert value(m, "gpumon_scrape_errors_total") == 1
    assert value(m, "gpumon_scrape_group_success", group="detection") == 0
    for group in ("build", "gpus", "jobs", "host", "health"):
        assert value(m, "gpumon_scrape_group_success", group=group) == 1
        assert value(m, "gpumon_scrape_group_duration_seconds", group=group) >= 0
    assert value(m, "gpumon_gpu_utilization_ratio", gpu="0") == 1.0  # the rest is served
    assert not [k for k in m if k.startswith("gpumon_gpu_state{")]


def test_a_failing_tick_is_counted_and_skipped(tmp_path: Path, capsys) -> None:
    state, _ = make_state(tmp_path)

    def broken() -> Polled:
        raise OSError("driver hiccup")

    state.session.source.poll = broken  # type: ignore[method-assign]
    state.step()
    state.step()
    assert state.tick_errors_total == 2
    assert capsys.readouterr().err.count("a tick failed") == 1


def test_stop_line_keeps_the_states_and_closes_episodes(tmp_path: Path) -> None:
    state, log = make_state(tmp_path)
    Feeder(state, {0: (101,), 1: (102,)}).run(15, {0: "steady", 1: "steady"})
    state.finish("signal SIGTERM")
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert records[-1]["event"] == "stop" and records[-1]["node_state"] == str(State.HEALTHY)
    opened = sum(r["event"] == "episode_start" for r in records)
    closed = sum(r["event"] == "episode_end" for r in records)
    assert opened == closed > 0


def test_a_jobs_process_tree_feeds_the_detector(tmp_path: Path) -> None:
    """The job's lowest GPU pid and its workers (no CUDA context) are sampled each tick."""
    import subprocess
    import sys

    helper = Path(__file__).resolve().parent / "helpers" / "proctree.py"
    proc = subprocess.Popen(
        [sys.executable, str(helper), "1", "1", "10"], stdout=subprocess.PIPE, text=True
    )
    try:
        workers = [int(x) for x in proc.stdout.readline().split()[1:]]  # type: ignore[union-attr]
        fake_proc(tmp_path / "proc", proc.pid, "0::/slurm/uid_0/job_4321/step_0\n")
        # Labels from a fake procfs, the tree from the real one.
        cfg = ServeConfig()
        session = serve_session(tmp_path / "proc", cfg, trees_procfs="/proc")
        state = ServeState(session, cfg, EventLog(None))
        f = Feeder(state, {0: (proc.pid,), 1: (proc.pid,)})
        import time

        for _ in range(6):
            f.run(0.5, {0: "steady", 1: "steady"})
            time.sleep(0.1)
        (job,) = state.jobs.values()
        assert job.labels.hpc_job == "4321" and job.detector is None  # the whole node
        assert job.tree_sample is not None
        assert {p.pid for p in job.tree_sample.processes} == {proc.pid, *workers}
        burner = next(p for p in job.tree_sample.processes if p.pid == workers[0])
        assert burner.cpu_pct is not None and burner.cpu_pct > 1  # it burns (load permitting)
        # Without trees (config), nothing is sampled.
        cfg = ServeConfig(process_trees=False)
        session = serve_session(tmp_path / "proc", cfg, trees_procfs="/proc")
        off = ServeState(session, cfg, EventLog(None))
        Feeder(off, {0: (proc.pid,)}).run(1, {0: "steady", 1: "steady"})
        assert off.jobs and not off.session.jobs.trees_open  # type: ignore[union-attr]
        assert all(j.tree_sample is None for j in off.jobs.values())
    finally:
        proc.terminate()  # its SIGTERM handler kills the workers too
        proc.wait()


def test_memory_stays_flat_over_thousands_of_ticks(tmp_path: Path) -> None:
    """Bounded state: episodes, histograms, jobs, pid cache, process trees — nothing grows
    with time, nor with pid and job churn (new processes and jobs every 100 s)."""
    import itertools
    import tracemalloc

    state, _ = make_state(tmp_path, summary_interval_s=50.0)
    proc = tmp_path / "proc"
    serial = itertools.count(1000)

    def new_job() -> tuple[int, ...]:
        """A Slurm job of two GPU processes, with stat files: its tree is really sampled."""
        job = next(serial)
        pids = (next(serial), next(serial))
        for pid in pids:
            fake_proc(proc, pid, f"0::/slurm/uid_0/job_{job}/step_0\n")
            (proc / str(pid) / "stat").write_text(
                f"{pid} (python) S 1 {pid} 1 0 -1 0 0 0 0 0 10 5 0 0 20 0 1 0 7 0 0 0\n"
            )
            (proc / str(pid) / "task" / str(pid)).mkdir(parents=True)
            (proc / str(pid) / "task" / str(pid) / "children").write_text("")
        return pids

    f = Feeder(state, {})

    def churn(pattern: str) -> None:
        f.pids = {0: new_job(), 1: new_job()}
        f.run(100, {0: pattern, 1: "steady"})

    for _ in range(3):  # warm up: rings fill, jobs come and expire
        churn("steady")
    tracemalloc.start()
    try:
        sizes = []
        for block in range(3):
            for i in range(6):  # alternate states so episodes open and close
                churn("burst" if (block + i) % 2 else "steady")
                metrics(state)
            sizes.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert state.ticks_total > 4000
    assert next(serial) == 1000 + 21 * 2 * 3  # 21 runs, each two new jobs of two pids
    # Only the current processes, jobs and trees are kept.
    tracker = state.session.jobs
    assert tracker is not None and len(tracker.resolver) == 4
    assert len(state.jobs) == 2 and tracker.trees_open <= 4
    assert all(j.tree_sample is not None for j in state.jobs.values())
    assert sizes[2] - sizes[1] < 64 * 1024, sizes


# --------------------------------------------------------------------------- the server
def test_a_server_never_started_closes_at_once(tmp_path: Path) -> None:
    """Closing after a failed start-up (the server built, never started) must not hang."""
    import threading

    from gpumon.faces.serve.http import MetricsServer

    state, _ = make_state(tmp_path)
    server = MetricsServer(ServeConfig(address="127.0.0.1", port=0), make_registry(state))
    closer = threading.Thread(target=server.close, daemon=True)
    closer.start()
    closer.join(5.0)
    assert not closer.is_alive()


def test_a_job_that_moves_gpus_gets_a_detector_for_its_new_gpus(tmp_path: Path) -> None:
    """A job's detector tracks the GPUs it was built for: when the job's GPUs change it is
    rebuilt, so a GPU left behind does not hold the job's state and a new one has its
    identity."""
    state, log = make_state(tmp_path)
    f = Feeder(state, {0: (101,), 1: (102,)})
    f.run(15, {0: "burst", 1: "steady"})  # job 65 starved on GPU 0
    m = metrics(state)
    assert value(m, "gpumon_job_state", hpc_job="65", state="starved") == 1
    f.pids = {1: (101,)}  # job 65 moves to GPU 1 (healthy), job 66 leaves
    f.run(20, {0: "burst", 1: "steady"})
    job = state.jobs[("65", "", "")]
    assert job.gpus == frozenset({1}) and job.detector is not None
    assert set(job.detector._ident) == {1}  # GPU 1's identity, not GPU 0's
    m = metrics(state)
    assert value(m, "gpumon_job_state", hpc_job="65", state="healthy") == 1
    records = [json.loads(x) for x in log.read_text().splitlines()]
    ends = [
        r
        for r in records
        if r["event"] == "episode_end"
        and r["scope"] == "job"
        and r["jobs"][0]["hpc_job"] == "65"
        and r["state"] == "starved"
    ]
    assert ends  # the old detector's open episode was closed, not dropped


def test_an_unreadable_process_list_has_no_process_count(tmp_path: Path) -> None:
    state, _ = make_state(tmp_path)
    f = Feeder(state, {0: (101,), 1: (102,)})
    f.run(2, {0: "steady", 1: "steady"})
    assert value(metrics(state), "gpumon_gpu_processes", gpu="0") == 1
    # The next tick NVML cannot list GPU 0's processes: no count (series absent), the
    # last known job stays.
    snap = Snapshot(
        t_s=f.t + 0.5,
        gpus=(
            GpuSample(t_s=f.t + 0.5, gpu=0, uuid="GPU-0", util_pct=100.0, processes=None),
            GpuSample(
                t_s=f.t + 0.5, gpu=1, uuid="GPU-1", util_pct=100.0, processes=(GpuProcess(102),)
            ),
        ),
    )
    ingest(state, snap)
    m = metrics(state)
    assert not [k for k in m if k.startswith("gpumon_gpu_processes") and 'gpu="0"' in k]
    assert value(m, "gpumon_gpu_processes", gpu="1") == 1
    assert value(m, "gpumon_gpu_job_info", gpu="0", hpc_job="65") == 1


def test_fake_pids_are_not_sampled_from_the_real_proc(tmp_path: Path) -> None:
    """Process trees are read from the daemon's procfs (the resolver's): a fake pid 1 in a
    test's procfs is not the machine's init."""
    fake_proc(tmp_path / "proc", 1, "0::/slurm/uid_0/job_7/step_0\n")
    cfg = ServeConfig()
    state = ServeState(serve_session(tmp_path / "proc", cfg), cfg, EventLog(None))
    assert state.session.jobs.procfs == str(tmp_path / "proc")  # type: ignore[union-attr]
    Feeder(state, {0: (1,), 1: (1,)}).run(2, {0: "steady", 1: "steady"})
    (job,) = state.jobs.values()
    assert job.labels.hpc_job == "7" and job.tree_sample is None


def test_proc_reads_and_log_writes_happen_outside_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scrape waits on the lock: label resolution, tree sampling and log writes (disk)
    must not run under it."""
    from gpumon.sample import host

    state, _ = make_state(tmp_path, summary_interval_s=1.0)
    for pid in (101, 102):  # fake stat files: the trees are really sampled
        (tmp_path / "proc" / str(pid) / "stat").write_text(
            f"{pid} (python) S 1 {pid} 1 0 -1 0 0 0 0 0 10 5 0 0 20 0 1 0 1000 0 0 0\n"
        )
        (tmp_path / "proc" / str(pid) / "task" / str(pid)).mkdir(parents=True)
        (tmp_path / "proc" / str(pid) / "task" / str(pid) / "children").write_text("")
    seen: dict[str, list[bool]] = {"labels": [], "tree": [], "log": []}
    resolver = state.session.jobs.resolver  # type: ignore[union-attr]
    resolve, write = resolver._read, state.log.write
    tree_sample = host.ProcessTreeSampler.sample

    def spy(kind, fn):  # type: ignore[no-untyped-def]
        def wrapped(*a, **k):  # type: ignore[no-untyped-def]
            seen[kind].append(state.lock.locked())
            return fn(*a, **k)

        return wrapped

    monkeypatch.setattr(resolver, "_read", spy("labels", resolve))
    monkeypatch.setattr(state.log, "write", spy("log", write))
    monkeypatch.setattr(host.ProcessTreeSampler, "sample", spy("tree", tree_sample))
    Feeder(state, {0: (101,), 1: (102,)}, via_step=True).run(15, {0: "burst", 1: "steady"})
    assert all(seen.values()), seen  # each kind happened
    assert not any(any(v) for v in seen.values()), seen
    assert any(j.tree_sample is not None for j in state.jobs.values())
