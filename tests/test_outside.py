"""Whose load it is: the busiest processes outside the watched job, found only while the
host is busy, named in a contention verdict's evidence and advice."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from gpumon.detect import Detector, DetectorConfig
from gpumon.detect.advice import advice_for
from gpumon.model import (
    Cause,
    GpuIdentity,
    GpuProcess,
    GpuSample,
    HostSample,
    ProcessSample,
    ProcTreeSample,
    Snapshot,
    State,
)
from gpumon.sample.host import ProcessTreeSampler
from gpumon.sample.monitor import Monitor
from gpumon.sample.outside import OutsideScanner, read_stat

BURN = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end: pass\n"
SLEEP = "import time; time.sleep(300)"


def burn() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", BURN])


def burned(*procs: subprocess.Popen[bytes], cpu_s: float = 0.1) -> None:
    """Wait until each process has run ``cpu_s`` more seconds of CPU (however few a busy
    machine gives it per second): what a scan compares is CPU used, not time passed."""
    start = {p.pid: (read_stat("/proc", p.pid) or ("", 0.0, 0))[1] for p in procs}
    end = time.monotonic() + 300
    while True:
        now = {p.pid: (read_stat("/proc", p.pid) or ("", 0.0, 0))[1] for p in procs}
        if all(now[pid] - start[pid] >= cpu_s for pid in now):
            return
        assert time.monotonic() < end, "the burners never got the CPU"
        time.sleep(0.05)


class StepClock:
    """A scanner's clock that moves ``step`` each time it is read: the baseline is fair
    at every scan (a busy machine's late tick does not make the previous scan stale)."""

    def __init__(self, step: float) -> None:
        self.t, self.step = 100.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def test_the_scanner_finds_a_burning_process_outside_the_job_and_not_the_jobs_own() -> None:
    outsider = burn()
    job = burn()  # busy too, but the job's
    try:
        scanner = OutsideScanner(every_s=0.3, keep=1000, clock=StepClock(0.3))
        assert scanner.scan({job.pid}) == ()  # the first scan is the baseline
        burned(outsider, job)
        found = {p.pid: p for p in scanner.scan({job.pid})}
        assert outsider.pid in found and job.pid not in found
        burner = found[outsider.pid]
        assert burner.name == "python3" or (burner.name or "").startswith("python")
        assert burner.cpu_pct is not None and burner.cpu_pct > 5
        assert burner.ppid is not None
    finally:
        for p in (outsider, job):
            p.kill()
            p.wait()


def test_a_stale_baseline_names_nobody(tmp_path: Path) -> None:
    now = [100.0]
    scanner = OutsideScanner(every_s=1.0, clock=lambda: now[0])
    scanner.scan(set())
    now[0] += 10.0  # far past 3 x every_s: CPU since then says nothing of now
    assert scanner.scan(set()) == ()
    assert read_stat(str(tmp_path), 1) is None  # a process gone mid-scan is skipped


class BusyHost:
    """The host sampler as a saturated machine reports it."""

    def sample(self) -> HostSample:
        return HostSample(time.monotonic(), cpu_pct_per_core=(99.0, 99.0), cpu_pct=99.0)


def test_the_monitor_looks_only_while_the_host_is_busy() -> None:
    job = subprocess.Popen([sys.executable, "-c", SLEEP])
    outsider = burn()
    try:
        scanner = OutsideScanner(every_s=0.2, keep=1000, clock=StepClock(0.25))  # due, then scan
        mon = Monitor(None, BusyHost(), ProcessTreeSampler(job.pid), outside=scanner)  # type: ignore[arg-type]
        mon.sample()
        burned(outsider)
        snap = mon.sample()
        assert snap.host is not None
        pids = {p.pid for p in snap.host.busiest_outside}
        assert outsider.pid in pids and job.pid not in pids
        quiet = Monitor(None, None, ProcessTreeSampler(job.pid), outside=OutsideScanner())
        assert quiet.sample().host is None  # no host reading: nothing looked for
    finally:
        for p in (job, outsider):
            p.kill()
            p.wait()


def test_contention_names_the_busiest_outsider_in_its_evidence_and_advice() -> None:
    """The job's loader runnable but held to a sliver of a core, 16 cores busy with
    someone's build: contention, and who."""
    det = Detector(DetectorConfig(), (GpuIdentity(0, "GPU-0", power_limit_watts=700.0),))
    culprit = ProcessSample(4242, 1, "cc1plus", 1480.0, None, None, None, None)
    t = 0.0
    tp = 0.0
    for _ in range(80):
        t += 0.5
        pts = []
        while tp + 1 / 6 <= t + 1e-9:
            tp += 1 / 6
            pts.append((tp, 100.0 if tp % 1.0 < 0.3 else 0.0))
        gpu = GpuSample(t, 0, "GPU-0", tuple(pts), processes=(GpuProcess(10),), power_watts=200.0)
        host = HostSample(t, (99.0,) * 16, 99.0, busiest_outside=(culprit,))
        tree = ProcTreeSample(t, 10, (ProcessSample(10, 1, "python", 6.0, 4, 0.0, 0.0, "running"),))
        det.update(Snapshot(t, (gpu,), host, tree))
    g = det.verdict().gpus[0]
    assert (g.state, g.cause) == (State.STARVED, Cause.CONTENTION)
    assert g.evidence.get("outside_top") == "cc1plus (pid 4242, 1480 %)"
    assert "cc1plus (pid 4242" in g.advice[0].text and "num_workers" not in g.advice[0].text
    assert advice_for(State.STARVED, Cause.CONTENTION, g.evidence, None, True)[0] == g.advice[0]
