"""The live lab: an emulated GPU that real processes drive, and gpumon's live path scored on it.

First the emulator's causality, through the real pynvml against the fake library: what a
process does (kernels, spinning at a barrier, allocations, exiting) is what the driver's
sample buffer, power, GPM counters, memory and process list say, sample by sample.  Then
the lab: six runs of training jobs (tests/livelab/workloads.py), each observed at once by
``gpumon watch``, ``gpumon serve`` and ``gpumon analyze`` of watch's recording
(tests/livelab/runner.py), scored against the jobs' own truth (tests/livelab/score.py).
The mechanics must hold; each issue scenario then has a test holding the faces to the
targets (precision and recall >= 0.95 per state, cause accuracy >= 0.95, healthy within
3 s of a GPU busy from its first sample, at most one cause change per steady phase, and
the faces telling one story).  What gpumon misses today is a ``KnownMiss``: its reason in
words and the shape of the failures it makes, so each run decides -- a run that meets the
targets passes, one that misses only in the known way is an xfail saying so, any other
miss fails; a phase the machine kept from its design (the run's own truth says so) is not
scored.  The jobs run as Slurm jobs; the noisy neighbour's run also runs on a node with
no scheduler (a typed command, and a container-like cgroup), where serve must find the
job itself for its story to be watch's.

CI runs seed 0 (of the tuning range, 0-99) at scale 1 (phases of 10-20 s);
``benchmarks/bench_live.py`` runs longer phases over the tuning and the held-out range.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from fakenvml import FakeGPU, Scenario
from livelab import cgroup, emulator, runner, score, workloads
from livelab.pipeline import make_data_file
from livelab.truth import read_truth, too_busy_for_a_run

pytestmark = [pytest.mark.slow, pytest.mark.owns_machine]

TESTS = Path(__file__).resolve().parent
CI_SEED = 0
PERIOD_S = 1.0 / 6.0  # the fake's driver sample period


# --------------------------------------------------------------------------- the emulator


def _child(emu: Path, body: str, report: bool = True) -> subprocess.Popen[str]:
    """A process that opens the emulated GPU as ``dev`` and runs ``body``; it prints one
    JSON line per event and (``report``) its kernels' intervals last."""
    code = f"""
import json, sys, time
sys.path.insert(0, {str(TESTS)!r})
from livelab.emulator import EmulatedDevice, GiB
dev = EmulatedDevice({str(emu)!r})
def say(**kw):
    print(json.dumps(dict(kw, t=time.monotonic())), flush=True)
{body}
if {report!r}:
    print(json.dumps({{"intervals": dev.intervals}}), flush=True)
"""
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True
    )


def _intervals(out: str) -> list[tuple[float, float, int]]:
    last = json.loads(out.strip().splitlines()[-1])
    return [(a * 1e-9, b * 1e-9, k) for a, b, k in last["intervals"]]


def _cover(ivs: list[tuple[float, float, int]], t0: float, t1: float, kind: int | None) -> float:
    return sum(
        max(0.0, min(b, t1) - max(a, t0)) for a, b, k in ivs if kind is None or k == kind
    ) / (t1 - t0)


def _mono(ts_us: int, wall_minus_mono: float) -> float:
    """A driver sample's timestamp (CLOCK_REALTIME µs) on the monotonic clock."""
    return ts_us * 1e-6 - wall_minus_mono


@pytest.fixture
def driven(fake_nvml, tmp_path: Path) -> Iterator[tuple[Path, object]]:
    """One driven H100 with GPM, loaded in this process: (its file, pynvml)."""
    emu = emulator.create(tmp_path / "gpu0.emu")
    fake_nvml.set(Scenario(gpus=[FakeGPU(driven=emu, gpm_supported=True)]))
    fake_nvml.load()
    import pynvml

    pynvml.nvmlInit()
    yield emu, pynvml
    pynvml.nvmlShutdown()


def test_kernels_then_sleeps_are_the_driver_samples(driven) -> None:
    """kernel(0.3 s) then sleep(0.3 s): ~50 % in bursts, each sample the busy share of its
    period as the process's own intervals give it."""
    emu, pynvml = driven
    child = _child(emu, "dev.context()\nfor _ in range(6):\n    dev.kernel(0.3); time.sleep(0.3)")
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0
    ivs = _intervals(out)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    offset = time.time() - time.monotonic()
    _, samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    start, end = ivs[0][0], ivs[-1][1]
    inside = []
    for s in samples:
        t1 = _mono(s.timeStamp, offset)
        if start + PERIOD_S <= t1 <= end:
            want = 100 * _cover(ivs, t1 - PERIOD_S, t1, None)
            assert abs(s.sampleValue.uiVal - want) <= 3, (s.sampleValue.uiVal, want)
            inside.append(s.sampleValue.uiVal)
    assert len(inside) >= 18
    assert 40 <= sum(inside) / len(inside) <= 60
    assert max(inside) == 100 and min(inside) == 0  # bursts and gaps, not a flat 50 %
    assert all(
        abs(a - b) < 0.02 for a, b in zip([b - a for a, b, _ in ivs], [0.3] * len(ivs), strict=True)
    )


def test_spinning_reads_busy_at_low_power_on_few_sms(driven) -> None:
    """A rank spinning at a barrier: every sample 100 %, power a little above idle, SM
    activity a few percent -- where a kernel draws the busy power on most SMs."""
    emu, pynvml = driven
    child = _child(
        emu,
        """
dev.context()
dev.kernel(1.2)
end = time.monotonic() + 1.2
dev.spin_until(lambda: time.monotonic() >= end)
time.sleep(0.5)
""",
    )
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    gpm: list[tuple[float, object]] = []
    t_end = time.monotonic() + 3.2
    while time.monotonic() < t_end:  # GPM samples all along, whenever this process runs
        s = pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(h, s)
        gpm.append((time.monotonic(), s))
        time.sleep(0.25)
    out, _ = child.communicate(timeout=30)
    ivs = _intervals(out)
    offset = time.time() - time.monotonic()
    _, util = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    _, power = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_TOTAL_POWER_SAMPLES, 0)
    spin = [iv for iv in ivs if iv[2] == emulator.SPIN]
    comp = [iv for iv in ivs if iv[2] == emulator.COMPUTE]
    assert len(spin) == 1 and len(comp) == 1
    idle_w, busy_w = FakeGPU().power_idle_w, FakeGPU().power_busy_w
    for s in util:
        t1 = _mono(s.timeStamp, offset)
        if spin[0][0] + PERIOD_S <= t1 <= spin[0][1]:
            assert s.sampleValue.uiVal == 100
    for s in power:
        t1 = _mono(s.timeStamp, offset)
        c = _cover(ivs, t1 - PERIOD_S, t1, emulator.COMPUTE)
        sp = _cover(ivs, t1 - PERIOD_S, t1, emulator.SPIN)
        want = idle_w + (c * emulator.COMPUTE_POWER + sp * emulator.SPIN_POWER) * (busy_w - idle_w)
        assert abs(s.sampleValue.uiVal / 1000 - want) <= 2.0
        if sp == 1.0:
            assert s.sampleValue.uiVal / 1000 < idle_w + 0.1 * (busy_w - idle_w)
    seen = set()
    for (ta, a), (tb, b) in itertools.pairwise(gpm):
        m = pynvml.c_nvmlGpmMetricsGet_t()
        m.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        m.numMetrics, m.sample1, m.sample2 = 1, a, b
        m.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
        pynvml.nvmlGpmMetricsGet(m)
        c, sp = _cover(ivs, ta, tb, emulator.COMPUTE), _cover(ivs, ta, tb, emulator.SPIN)
        want = 100 * (c * emulator.COMPUTE_SM + sp * emulator.SPIN_SM)
        # (The GPM sample is taken a moment before this process reads the clock.)
        assert abs(m.metrics[0].value - want) <= 100 * 0.02 / (tb - ta) + 1, (ta, tb, want)
        seen.add("spin" if sp > 0.9 else "compute" if c > 0.9 else "mixed")
    for _, s in gpm:
        pynvml.nvmlGpmSampleFree(s)
    assert {"spin", "compute"} <= seen


def test_memory_and_process_list_follow_the_process(driven) -> None:
    """A context lists the pid with its overhead; allocations add up, frees subtract; a
    process killed without cleaning up drops out with its memory."""
    emu, pynvml = driven
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    base = pynvml.nvmlDeviceGetMemoryInfo(h).used
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    child = _child(
        emu,
        """
dev.context(); say(step="context"); sys.stdin.readline()
a = dev.alloc(4 * GiB); say(step="alloc"); sys.stdin.readline()
dev.free(a); say(step="free"); sys.stdin.readline()
dev.alloc(2 * GiB); say(step="held"); time.sleep(60)
""",
    )
    assert child.stdout is not None and child.stdin is not None

    def step(expect: str) -> tuple[int, list[tuple[int, int]]]:
        assert json.loads(child.stdout.readline())["step"] == expect  # type: ignore[union-attr]
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        return pynvml.nvmlDeviceGetMemoryInfo(h).used, [(p.pid, p.usedGpuMemory) for p in procs]

    ctx = emulator.CONTEXT_BYTES
    assert step("context") == (base + ctx, [(child.pid, ctx)])
    child.stdin.write("\n")
    child.stdin.flush()
    assert step("alloc") == (base + ctx + 4 * emulator.GiB, [(child.pid, ctx + 4 * emulator.GiB)])
    child.stdin.write("\n")
    child.stdin.flush()
    assert step("free") == (base + ctx, [(child.pid, ctx)])
    child.stdin.write("\n")
    child.stdin.flush()
    assert step("held")[0] == base + ctx + 2 * emulator.GiB
    child.kill()  # no close(): the driver frees a dead process's context
    child.wait(10)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    assert pynvml.nvmlDeviceGetMemoryInfo(h).used == base


def test_a_writer_lapping_a_small_ring_never_shows_a_torn_entry(fake_nvml, tmp_path) -> None:
    """Readers racing a writer that overwrites an 8-entry ring thousands of times read only
    whole entries: every sample, power and SM figure stays within what entries allow."""
    emu = emulator.create(tmp_path / "gpu0.emu", ring_len=8)
    fake_nvml.set(Scenario(gpus=[FakeGPU(driven=emu, gpm_supported=True)]))
    child = _child(
        emu,
        """
dev.context()
end = time.monotonic() + 2.5
while time.monotonic() < end:
    dev.launch(0.0005, sm=0.5, power=0.5); dev.synchronize()
""",
        report=False,
    )
    fake_nvml.load()
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        idle_w, busy_w = FakeGPU().power_idle_w, FakeGPU().power_busy_w
        reads = 0
        while child.poll() is None:
            for s in pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)[1]:
                assert 0 <= s.sampleValue.uiVal <= 100
            w = pynvml.nvmlDeviceGetPowerUsage(h) / 1000
            assert idle_w - 0.5 <= w <= idle_w + 0.5 * (busy_w - idle_w) + 0.5
            reads += 1
        assert reads > 20 and child.returncode == 0
    finally:
        child.communicate(timeout=10)
        pynvml.nvmlShutdown()


def test_pattern_gpus_beside_driven_ones_are_unchanged(fake_nvml, tmp_path) -> None:
    """A driven GPU added to a scenario leaves the pattern GPUs' readings as they were."""
    from fakenvml import Pattern, Process

    emu = emulator.create(tmp_path / "gpu1.emu")
    pattern = FakeGPU(pattern=Pattern.steady(100), processes=[Process(pid=os.getpid())])
    fake_nvml.set(Scenario(gpus=[pattern, FakeGPU(driven=emu)]))
    fake_nvml.load()
    import pynvml

    pynvml.nvmlInit()
    try:
        h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
        assert pynvml.nvmlDeviceGetUtilizationRates(h0).gpu == 100
        assert pynvml.nvmlDeviceGetPowerUsage(h0) == 650_000
        assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h0)] == [os.getpid()]
        assert pynvml.nvmlDeviceGetUtilizationRates(h1).gpu == 0  # nothing drives it yet
        assert pynvml.nvmlDeviceGetComputeRunningProcesses(h1) == []
    finally:
        pynvml.nvmlShutdown()


# --------------------------------------------------------------------------- the lab runs


@pytest.fixture(scope="session")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The I/O-bound scenario's data, on the disk (not tmpfs), written once."""
    return make_data_file(tmp_path_factory.mktemp("livelab-data") / "data.bin", 256 << 20)


@pytest.fixture(scope="module")
def lab(
    tmp_path_factory: pytest.TempPathFactory, data_file: Path, fake_nvml_lib: Path
) -> Callable[..., Path]:
    """``lab(name, placement="slurm")``: the folder of the CI run of scenario ``name``, the
    job run as ``placement`` says (runner.PLACEMENTS; run once per module; kept under
    $LIVELAB_KEEP when set, to read a failure with ``score.timeline``)."""
    done: dict[tuple[str, str], Path] = {}
    keep = os.environ.get("LIVELAB_KEEP")

    def get(name: str, placement: str = "slurm") -> Path:
        if (name, placement) not in done:
            busy = too_busy_for_a_run()
            if busy:
                pytest.skip(busy)  # (asked again by the next test: the load may have gone)
            scn = workloads.build(name, CI_SEED, 1.0)
            label = name if placement == "slurm" else f"{name}-{placement}"
            if keep:
                run_dir = Path(keep) / f"{label}-{time.strftime('%H%M%S')}"
            else:
                run_dir = tmp_path_factory.mktemp(f"livelab-{label}")
            runner.run(scn, run_dir, data_file, placement=placement)
            done[(name, placement)] = run_dir
        return done[(name, placement)]

    return get


RUNS = workloads.names()


@pytest.mark.parametrize("name", RUNS)
def test_each_scenario_starts_logs_its_truth_and_exits_cleanly(lab, name: str) -> None:
    run_dir = lab(name)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["errors"] == [], meta["errors"]
    scn = workloads.LabScenario.from_json(meta["scenario"])
    for rank in range(scn.ranks):
        truth = read_truth(run_dir / f"truth-rank{rank}.jsonl")
        ends = [r for r in truth if r.get("event") == "phase_end"]
        assert [r["phase"] for r in ends] == [p.name for p in scn.phases]
        for r, phase in zip(ends, scn.phases, strict=True):
            assert r["t"] - r["start"] >= phase.seconds - 0.5
        seconds = [r for r in truth if "event" not in r]
        assert len(seconds) >= scn.seconds - 2  # one line per second, for the whole run
        assert truth[-1]["event"] == "exit"
    # Everything the job started is gone (workers reaped, ranks exited).
    left = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if str(run_dir) in " ".join(p.info["cmdline"] or [])
    ]
    assert left == []
    for f in (
        "watch.jsonl",
        "summary.json",
        "record.jsonl",
        "metrics.jsonl",
        "serve.jsonl",
        "analyze.json",
    ):
        assert (run_dir / f).stat().st_size > 0, f


@dataclass(frozen=True)
class KnownMiss:
    """What gpumon gets wrong today in one scenario: the reason, in words, and the shape of
    the failures it makes (one pattern per kind of failure line, ``score.failures()``).

    A run decides: one that meets every target passes (the miss did not happen this time:
    how often it does depends on the machine), one that misses only in these ways is an
    xfail saying so, and one that misses in any other way fails.  A strict xfail mark
    could do neither: on a machine where the miss did not happen it failed the suite, and
    it passed a run that failed for a new reason."""

    reason: str
    patterns: tuple[str, ...]

    def covers(self, failure: str) -> bool:
        return any(re.search(p, failure) for p in self.patterns)


def _decide(failures: list[str], known: KnownMiss | None) -> None:
    if failures and known is not None and all(known.covers(f) for f in failures):
        pytest.xfail(f"{known.reason} [this run: {'; '.join(failures)}]")
    assert not failures, "\n".join(failures)


def _hold_to_targets(run_dir: Path, *phases: str, known: KnownMiss | None = None) -> None:
    rs = score.score_run(run_dir, phases)
    if rs.invalid_phases:
        pytest.skip(f"the machine kept a phase from its design: {rs.invalid_phases}")
    _decide(rs.failures(), known)


def _story(run_dir: Path, known: KnownMiss | None = None) -> None:
    rs = score.score_run(run_dir)
    if rs.invalid_phases:
        # The faces told the story of another run than the one designed (a phase the
        # machine turned into another state leaves its mark on the ones after it).
        pytest.skip(f"the machine kept a phase from its design: {rs.invalid_phases}")
    _decide([f"{c.name}: {c.detail}" for c in rs.checks if not c.ok], known)


def _cause_miss(*pairs: str) -> str:
    """A face's cause accuracy short of the target, every wrong second one of ``pairs``."""
    one = "|".join(pairs)
    return rf"^\w+: cause accuracy [\d.]+ < [\d.]+ \(((?:{one}) \d+s(?:, )?)+\)$"


def _recall_miss(state: str, *said: str) -> str:
    """A face's recall of ``state`` short of the target, the seconds missed shown as ``said``."""
    one = "|".join(said)
    return rf"^\w+: recall of {state} [\d.]+ < [\d.]+ \(said ((?:{one}) \d+s(?:, )?)+\)$"


def _precision_miss(state: str) -> str:
    return rf"^\w+: precision of {state} [\d.]+ < "


CAUSE_FLAPS = r"^\w+: \d+ cause changes in one steady phase$"


# --- lifecycle: busy from the first sample, workers forked, evaluation, memory held, exit


def test_busy_from_its_first_sample_is_healthy_within_3_s(lab) -> None:
    _hold_to_targets(lab("lifecycle"), "healthy")


def test_workers_forked_mid_run_keep_it_healthy(lab) -> None:
    _hold_to_targets(lab("lifecycle"), "workers-forked")


EVALUATION_MISS = KnownMiss(
    "on a busy machine the eval worker, held below 80 % of a core by other work, leaves the "
    "cause to host CPU near 90 %, and serve's log flaps cpu <-> unknown for a second or two",
    (_cause_miss("cpu->unknown", "cpu->contention"), CAUSE_FLAPS),
)


def test_evaluation_phase_starved_by_its_loader(lab) -> None:
    _hold_to_targets(lab("lifecycle"), "evaluation", known=EVALUATION_MISS)


def test_memory_held_with_no_work_is_idle(lab) -> None:
    _hold_to_targets(lab("lifecycle"), "memory-held")


def test_job_exiting_leaves_its_gpu_idle_with_no_process(lab) -> None:
    _hold_to_targets(lab("lifecycle"), "exited")


def test_lifecycle_faces_tell_one_story(lab) -> None:
    _story(lab("lifecycle"))


# --- starved: by saturated workers, then GIL-bound


SATURATED_MISS = KnownMiss(
    "the cause is right but for a second or two at the phase's start, where watch reads "
    "processes outside the job (the lab's own faces starting) as contention",
    (_cause_miss("cpu->contention"),),
)


def test_starved_by_saturated_workers(lab) -> None:
    _hold_to_targets(lab("starved"), "starved-cpu", known=SATURATED_MISS)


GIL_MISS = KnownMiss(
    "num_workers=0, the main process building every batch: the cause turns from cpu to gil "
    "within seconds of the change, but serve (a reading a second) and analyze keep cpu for "
    "1-2 s past the margin; on a busy machine a main process held to a share of a core "
    "never reads 'pinned'",
    (_cause_miss("gil->cpu", "gil->unknown", "gil->contention"), CAUSE_FLAPS),
)


def test_gil_bound_main_process(lab) -> None:
    _hold_to_targets(lab("starved"), "starved-gil", known=GIL_MISS)


STARVED_STORY_MISS = KnownMiss(
    "watch's lines and serve's metrics differ on the seconds around the change of cause "
    "(each face reads the host over its own ticks)",
    (r"^watch lines = serve metrics: ",),
)


def test_starved_faces_tell_one_story(lab) -> None:
    _story(lab("starved"), STARVED_STORY_MISS)


# --- I/O-bound


IO_MISS = KnownMiss(
    "a GPU starved from its first sample is shown idle for a second past its first work: "
    "recall 0.92 of a short phase",
    (_recall_miss("starved", "idle"), _precision_miss("idle")),
)


def test_io_bound_workers(lab) -> None:
    _hold_to_targets(lab("io"), "starved-io", known=IO_MISS)


def test_io_faces_tell_one_story(lab) -> None:
    _story(lab("io"))


# --- a noisy neighbour


def test_noisy_neighbour_job_healthy(lab) -> None:
    _hold_to_targets(lab("noisy"), "healthy-beside-neighbours")


def test_noisy_neighbour_job_starved(lab) -> None:
    _hold_to_targets(lab("noisy"), "starved-remote")


def test_noisy_faces_tell_one_story(lab) -> None:
    _story(lab("noisy"))


# --- gaps at a rhythm: workers restarted every epoch, checkpoints


EPOCH_MISS = KnownMiss(
    "workers restarted every epoch: the GPU busy for the first epoch's seconds is judged "
    "healthy until its second gap (10-11 s: the first gap after work is held as a lone dip, "
    "as a healthy run's brief dips must be, and the idle before the first work is start-up, "
    "not a gap; 3-5 s before issue 35's item 8), and the workers' CPU over the gaps (~80 %) "
    "sits on the CPU's line, so the cause reads unknown (analyze of the recording: io, 2 s "
    "once) for a third of the phase",
    (
        _recall_miss("starved", "healthy"),
        _precision_miss("healthy"),
        _cause_miss("cpu->unknown", "cpu->contention", "cpu->io"),
        CAUSE_FLAPS,
    ),
)


def test_workers_restarted_every_epoch(lab) -> None:
    _hold_to_targets(lab("periodic"), "epoch-restarts", known=EPOCH_MISS)


CHECKPOINT_MISS = KnownMiss(
    "a checkpoint written synchronously (O_DIRECT|O_DSYNC) every few seconds: io, but cpu or "
    "unknown for 1-2 s after the change from the epoch restarts (cause accuracy 0.82-0.94)",
    (_cause_miss("io->cpu", "io->unknown"), CAUSE_FLAPS),
)


def test_checkpoint_every_few_seconds(lab) -> None:
    _hold_to_targets(lab("periodic"), "checkpoints", known=CHECKPOINT_MISS)


PERIODIC_STORY_MISS = KnownMiss(
    "epoch restarts: watch's lines differ from serve's metrics on 6 of 23 settled seconds "
    "and from the summary's episodes on 8 (the cause near the CPU's line reads cpu in one "
    "face, unknown in another)",
    (r"^watch lines = serve metrics: ", r"^watch lines = the summary's episodes "),
)


def test_periodic_faces_tell_one_story(lab) -> None:
    _story(lab("periodic"), PERIODIC_STORY_MISS)


# --- ranks at a barrier: a straggler, then a hang


STRAGGLER_MISS = KnownMiss(
    "the peers computing ~40 % and spinning ~60 % of every step from the first sample: watch "
    "finds the busy-wait within the 3 s target now (CI seed), serve, reading a tick a second, "
    "still shows them healthy for 3-4 s past it on held-out seeds, and on the CI seed when "
    "runs share the machine (recall 0.89-0.91)",
    (_recall_miss("sync_stall", "healthy"), _precision_miss("healthy")),
)


def test_straggler_at_a_barrier(lab) -> None:
    _hold_to_targets(lab("ranks"), "straggler", known=STRAGGLER_MISS)


def test_hang_every_rank_spinning(lab) -> None:
    _hold_to_targets(lab("ranks"), "hang")


def test_ranks_faces_tell_one_story(lab) -> None:
    _story(lab("ranks"))


# --- a node with no scheduler: serve finds the job from its process tree or its cgroup


def test_plain_node_faces_tell_one_story(lab) -> None:
    """The noisy neighbour's run with no SLURM_JOB_ID, started below a session-leading
    shell as a typed command is: serve must find the job from its process tree (its top
    process, the one watch is given) for its cause to be watch's, and name it."""
    _story(lab("noisy", "plain"))


def test_container_faces_tell_one_story(lab) -> None:
    """The same run inside a cgroup shaped as a Docker container's (made as root): serve
    finds the job from its cgroup, follows its tree from the container's first process,
    and names it by the container's id."""
    why = cgroup.unavailable()
    if why is not None:
        pytest.skip(f"cgroups cannot be made here: {why}")
    _story(lab("noisy", "container"))
