"""`gpumon serve` as a real subprocess against the fake NVML library.

Each test starts the daemon as an admin would (``python -m gpumon serve``), with the fake
``libnvidia-ml.so.1`` in its environment, and checks what it serves, logs and how it exits.
Intervals are short (0.2 s) and burst periods short (0.5 s) to keep the suite fast; the
detector needs ~8 s of data before it judges a GPU, which bounds the starvation tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fakenvml import FakeGPU, Pattern, Process, Scenario

pytestmark = pytest.mark.slow

INTERVAL = "0.2"
# The detector promises a state change within max(3 burst periods, 10 s) of the change.
STARVED_LATENCY_S = 10.0
STEADY = Pattern.steady(100)
BURSTY = Pattern.burst(period_s=0.5, duty=0.3)


START_DEADLINE_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_metrics(text: str) -> dict[str, float]:
    """``name{labels}`` -> value, labels sorted as the exposition writes them."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
    return out


def series(metrics: dict[str, float], name: str, **labels: str) -> dict[str, float]:
    """Every series of ``name`` whose labels include ``labels``."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return {
        k: v
        for k, v in metrics.items()
        if (k == name or k.startswith(name + "{")) and all(w in k for w in want)
    }


def one(metrics: dict[str, float], name: str, **labels: str) -> float:
    found = series(metrics, name, **labels)
    assert len(found) == 1, f"expected one {name} {labels}, got {found}"
    return next(iter(found.values()))


def gpu_state(metrics: dict[str, float], gpu: int) -> str | None:
    for k, v in series(metrics, "gpumon_gpu_state", gpu=str(gpu)).items():
        if v == 1.0:
            return re.search(r'state="([a-z_]+)"', k).group(1)  # type: ignore[union-attr]
    return None


@dataclass
class Daemon:
    """A running ``gpumon serve`` and how to reach it."""

    proc: subprocess.Popen[str]
    port: int
    log: Path | None
    scheme: str = "http"
    stderr_text: str = ""
    _ctx: ssl.SSLContext | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/metrics"

    def text(self, timeout: float = 5.0) -> str:
        with urllib.request.urlopen(self.url, timeout=timeout, context=self._ctx) as r:
            return r.read().decode()

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self.text())

    def wait_for(
        self, check: Callable[[dict[str, float]], bool], timeout: float, what: str
    ) -> float:
        """Poll /metrics until ``check``; the seconds it took."""
        start = time.monotonic()
        last: dict[str, float] = {}
        while time.monotonic() - start < timeout:
            assert self.proc.poll() is None, f"daemon exited: {self.stop()}"
            try:
                last = self.metrics()
                if check(last):
                    return time.monotonic() - start
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.2)
        states = {k: v for k, v in last.items() if "gpu_state{" in k and v == 1.0}
        raise AssertionError(f"not {what} within {timeout} s; states: {states}")

    def log_records(self) -> list[dict[str, object]]:
        assert self.log is not None
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        self.stderr_text += err or ""
        return self.proc.returncode


def serve_argv(port: int | None = None, *args: str) -> list[str]:
    """``gpumon serve`` as the tests start it: no configuration file (only defaults and
    flags), on loopback at ``port`` when one is given."""
    listen = ["--listen", f"127.0.0.1:{port}"] if port is not None else []
    return [sys.executable, "-m", "gpumon", "serve", "--config", os.devnull, *listen, *args]


def start_daemon(
    env: dict[str, str],
    tmp: Path,
    *args: str,
    log: bool = True,
    scheme: str = "http",
    ctx: ssl.SSLContext | None = None,
    wait: bool = True,
) -> Daemon:
    port = free_port()
    log_path = tmp / "gpumon.jsonl" if log else None
    cmd = serve_argv(
        port, "--interval", INTERVAL, "--log", str(log_path) if log_path else "", *args
    )
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    d = Daemon(proc, port, log_path, scheme, _ctx=ctx)
    if wait:
        # A start on a busy machine takes seconds (the imports alone): the deadline only
        # ends the wait on a daemon that never listens, it times nothing.
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"daemon exited {proc.returncode}: {d.stop()} {d.stderr_text}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            d.stop()
            raise AssertionError(f"daemon did not listen within {START_DEADLINE_S:g} s")
    return d


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Daemons started by a test; any still running are stopped at the end."""
    started: list[Daemon] = []
    yield started
    for d in started:
        if d.proc.poll() is None:
            d.stop(signal.SIGKILL)


@pytest.fixture
def slurm_job() -> Iterator[subprocess.Popen[bytes]]:
    """A real process with SLURM_JOB_ID in its environment, to put on a fake GPU."""
    env = dict(os.environ, SLURM_JOB_ID="4242")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    yield p
    p.kill()
    p.wait()


# --------------------------------------------------------------------------- the main flow
def test_metrics_show_the_scenario_then_starvation_and_the_log_gets_episodes(
    fake_nvml, tmp_path, daemons, slurm_job
) -> None:
    scn = Scenario(
        gpus=[
            FakeGPU(
                pattern=STEADY,
                power_busy_w=610.0,
                power_limit_w=700.0,
                mem_reserved=512 << 20,
                processes=[Process(pid=slurm_job.pid, used_mem=3 << 30)],
            ),
            FakeGPU(pattern=STEADY, power_limit_w=400.0),
        ]
    )
    fake_nvml.set(scn)
    d = start_daemon(fake_nvml.env, tmp_path)
    daemons.append(d)
    d.wait_for(
        lambda m: gpu_state(m, 0) == "healthy" and gpu_state(m, 1) == "healthy", 20, "healthy"
    )
    m = d.metrics()
    uuid0 = scn.gpus[0].effective_uuid(0)
    assert one(m, "gpumon_gpu_utilization_ratio", gpu="0") == 1.0
    assert one(m, "gpumon_gpu_power_watts", gpu="0") == pytest.approx(610.0)
    assert one(m, "gpumon_gpu_power_limit_watts", gpu="1") == pytest.approx(400.0)
    assert one(m, "gpumon_gpu_memory_total_bytes", gpu="0", uuid=uuid0) == 80 * 2**30
    assert one(m, "gpumon_gpu_memory_used_bytes", gpu="0") == (512 << 20) + (3 << 30)
    assert one(m, "gpumon_gpu_processes", gpu="0") == 1
    assert one(m, "gpumon_gpu_info", gpu="0", driver="550.54.15") == 1
    # The GPU's job, found from the process's environment; no pid label anywhere.
    assert one(m, "gpumon_gpu_job_info", gpu="0", hpc_job="4242") == 1
    assert not series(m, "gpumon_gpu_job_info", gpu="1")
    assert not any("pid=" in k for k in m)
    assert one(m, "gpumon_job_gpus", hpc_job="4242") == 1
    assert one(m, "gpumon_job_state", hpc_job="4242", state="healthy") == 1
    assert one(m, "gpumon_build_info") == 1
    assert time.time() - one(m, "gpumon_last_sample_timestamp_seconds") < 5
    assert one(m, "gpumon_gpu_state_seconds_total", gpu="0", state="healthy") > 0
    assert not any(k.endswith("_created") or "_created{" in k for k in m)

    # The input pipeline starts starving the GPUs.
    fake_nvml.set(scn.with_gpu(0, pattern=BURSTY).with_gpu(1, pattern=BURSTY))
    took = d.wait_for(
        lambda m: gpu_state(m, 0) == "starved" and gpu_state(m, 1) == "starved",
        STARVED_LATENCY_S + 2,
        "starved",
    )
    print(f"starved {took:.1f} s after the switch (promised <= {STARVED_LATENCY_S:.0f} s)")
    assert took <= STARVED_LATENCY_S, f"starved after {took:.1f} s"
    m = d.metrics()
    assert one(m, "gpumon_node_state", state="starved") == 1
    assert one(m, "gpumon_job_state", hpc_job="4242", state="starved") == 1
    # Gaps of ~0.35 s and bursts of ~0.15 s were counted in the histograms.
    assert one(m, "gpumon_gpu_idle_gap_seconds_count", gpu="0") >= 5
    assert one(m, "gpumon_gpu_idle_gap_seconds_bucket", gpu="0", le="0.5") >= 5
    assert one(m, "gpumon_gpu_idle_gap_seconds_bucket", gpu="0", le="0.25") <= 1
    assert one(m, "gpumon_gpu_busy_burst_seconds_count", gpu="0") >= 5
    assert sum(series(m, "gpumon_gpu_cause", gpu="0").values()) == 1

    records = d.log_records()
    starts = [r for r in records if r["event"] == "episode_start" and r["state"] == "starved"]
    gpu0 = [r for r in starts if r["gpu"] == 0]
    assert gpu0, records
    assert gpu0[0]["job"] == "4242" and gpu0[0]["uuid"] == uuid0
    assert gpu0[0]["evidence"]["duty_cycle"] < 0.75 and gpu0[0]["advice"]
    assert any(r["scope"] == "job" and r["jobs"][0]["hpc_job"] == "4242" for r in starts) or any(
        r["scope"] == "node" for r in starts
    )
    assert any(r["event"] == "episode_end" and r["state"] == "healthy" for r in records)
    assert records[0]["event"] == "start"

    # SIGTERM: a final line with the states as they were, exit 0.
    assert d.stop() == 0, d.stderr_text
    last = d.log_records()[-1]
    assert last["event"] == "stop" and last["stop_reason"] == "signal SIGTERM"
    assert last["node_state"] == "starved"
    assert "Traceback" not in d.stderr_text


def test_promtool_accepts_the_exposition(fake_nvml, tmp_path, daemons, slurm_job) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    fake_nvml.set(
        Scenario(
            gpus=[
                FakeGPU(pattern=BURSTY, processes=[Process(pid=slurm_job.pid)]),
                FakeGPU(pattern=STEADY, errors={"power": "UNKNOWN"}),
            ]
        )
    )
    d = start_daemon(fake_nvml.env, tmp_path)
    daemons.append(d)
    d.wait_for(
        lambda m: (
            series(m, "gpumon_nvml_errors_total")
            and one(m, "gpumon_gpu_idle_gap_seconds_count", gpu="0") > 0
        ),
        10,
        "sampled",
    )
    text = d.text()
    res = subprocess.run([promtool, "check", "metrics"], input=text, text=True, capture_output=True)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), (
        res.stdout + res.stderr
    )


# --------------------------------------------------------------------------- faults
def test_gpu_lost_midrun_nvml_errors_and_vanished_processes(fake_nvml, tmp_path, daemons) -> None:
    scn = Scenario(
        gpus=[FakeGPU(pattern=STEADY, processes=[Process(pid=2**22 - 3)]), FakeGPU(pattern=STEADY)]
    )
    fake_nvml.set(scn)
    d = start_daemon(fake_nvml.env, tmp_path)
    daemons.append(d)
    d.wait_for(lambda m: bool(series(m, "gpumon_gpu_utilization_ratio", gpu="1")), 10, "sampling")
    # GPU 1 falls off the bus; GPU 0's power reads start failing.
    fake_nvml.set(scn.with_gpu(1, lost=True).with_gpu(0, errors={"power": "UNKNOWN"}))
    d.wait_for(lambda m: one(m, "gpumon_gpu_lost", gpu="1") == 1, 5, "GPU 1 lost")
    t0 = d.metrics()["gpumon_last_sample_timestamp_seconds"]
    time.sleep(1.0)
    m = d.metrics()
    assert m["gpumon_last_sample_timestamp_seconds"] > t0, "sampling stopped"
    assert one(m, "gpumon_gpu_lost", gpu="0") == 0
    assert one(m, "gpumon_gpu_utilization_ratio", gpu="0") == 1.0
    assert not series(m, "gpumon_gpu_utilization_ratio", gpu="1")  # absent, not 0
    assert not series(m, "gpumon_gpu_power_watts", gpu="0")
    assert one(m, "gpumon_nvml_errors_total", kind="unknown") >= 1
    assert one(m, "gpumon_gpu_info", gpu="1") == 1  # still listed
    assert one(m, "gpumon_sample_errors_total") == 0
    # The process on GPU 0 does not exist in /proc: no job, no crash.
    assert not series(m, "gpumon_gpu_job_info")
    assert d.stop() == 0, d.stderr_text
    assert "Traceback" not in d.stderr_text
    assert "fell off the bus" in d.stderr_text


def test_a_lost_gpu_is_read_again_and_a_new_gpu_is_found(fake_nvml, tmp_path, daemons) -> None:
    """Re-enumeration (every 10 s): GPU 1 comes back from the bus, GPU 2 appears."""
    scn = Scenario.uniform(2, STEADY)
    fake_nvml.set(scn)
    d = start_daemon(fake_nvml.env, tmp_path)
    daemons.append(d)
    d.wait_for(lambda m: bool(series(m, "gpumon_gpu_utilization_ratio", gpu="1")), 10, "sampling")
    fake_nvml.set(scn.with_gpu(1, lost=True))
    d.wait_for(lambda m: one(m, "gpumon_gpu_lost", gpu="1") == 1, 5, "GPU 1 lost")
    time.sleep(1.0)
    grown = Scenario.uniform(3, STEADY)
    fake_nvml.set(grown)  # GPU 1 answers again, and a third GPU is there
    took = d.wait_for(
        lambda m: (
            one(m, "gpumon_gpu_lost", gpu="1") == 0
            and bool(series(m, "gpumon_gpu_utilization_ratio", gpu="1"))
            and bool(series(m, "gpumon_gpu_utilization_ratio", gpu="2"))
        ),
        15,
        "GPU 1 back and GPU 2 found",
    )
    print(f"GPU back and new GPU found {took:.1f} s after the change (rediscovery every 10 s)")
    m = d.metrics()
    assert one(m, "gpumon_gpu_info", gpu="2", uuid=grown.gpus[2].effective_uuid(2)) == 1
    assert one(m, "gpumon_gpu_state", gpu="2", state="unknown") in (0.0, 1.0)
    assert d.stop() == 0, d.stderr_text
    events = {r["event"]: r for r in d.log_records() if str(r["event"]).startswith("gpu_")}
    assert events["gpu_lost"]["gpu"] == 1
    back = events["gpu_recovered"]
    assert back["gpu"] == 1 and 1.0 <= back["lost_s"] <= 15.0 and back["lost_since"] < back["time"]
    assert events["gpu_appeared"]["gpu"] == 2
    assert events["gpu_appeared"]["uuid"] == grown.gpus[2].effective_uuid(2)
    err = d.stderr_text
    assert "gpumon: GPU 1" in err and "fell off the bus" in err and "answers again after" in err
    assert "gpumon: GPU 2" in err and "appeared" in err and "Traceback" not in err


@pytest.mark.parametrize("where", ["removed-dir", "full-disk"])
def test_unwritable_log_is_counted_and_sampling_goes_on(
    fake_nvml, tmp_path, daemons, where
) -> None:
    """A folder removed while the daemon runs, a full disk: lines lost and counted, the
    daemon on.  (A folder missing at start is made: test_serve_log_folder.py.)"""
    folder = tmp_path / "logs"
    log = folder / "gpumon.jsonl" if where == "removed-dir" else Path("/dev/full")
    if where == "full-disk" and not Path("/dev/full").exists():
        pytest.skip("/dev/full is absent")
    d = start_daemon(fake_nvml.env, tmp_path, "--log", str(log), log=False)
    daemons.append(d)
    if where == "removed-dir":
        shutil.rmtree(folder)
    d.wait_for(
        lambda m: (
            m.get("gpumon_log_write_errors_total", 0) >= 1 and m.get("gpumon_samples_total", 0) >= 5
        ),
        10,
        "log errors counted",
    )
    assert d.stop() == 0
    lines = [ln for ln in d.stderr_text.splitlines() if "cannot write the log" in ln]
    assert len(lines) == 1, d.stderr_text  # one line, not one per failed write
    assert "Traceback" not in d.stderr_text


def test_sighup_reopens_the_log_for_logrotate(fake_nvml, tmp_path, daemons) -> None:
    d = start_daemon(fake_nvml.env, tmp_path)
    daemons.append(d)
    assert d.log is not None
    deadline = time.monotonic() + 5
    while not d.log_records() and time.monotonic() < deadline:
        time.sleep(0.05)
    rotated = tmp_path / "gpumon.jsonl.1"
    d.log.rename(rotated)  # what logrotate does before postrotate
    d.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 5
    while not d.log.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert d.log.exists(), "log not reopened after SIGHUP"
    assert d.proc.poll() is None, "SIGHUP killed the daemon"
    assert d.stop() == 0
    assert [r["event"] for r in d.log_records()] == ["log_reopened", "stop"]
    assert json.loads(rotated.read_text().splitlines()[0])["event"] == "start"


def test_port_in_use_is_one_clear_sentence(fake_nvml, tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = subprocess.run(
            serve_argv(port, "--log", str(tmp_path / "x.jsonl")),
            env=fake_nvml.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0, res.stderr
    assert f"127.0.0.1:{port}" in res.stderr and "already in use" in res.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_invalid_config_names_key_and_line_and_nothing_starts(fake_nvml, tmp_path) -> None:
    port = free_port()
    cfg = tmp_path / "gpumon.toml"
    cfg.write_text(
        f'[http]\naddress = "127.0.0.1"\nport = {port}\n\n[sampling]\ninterval_s = "fast"\n'
    )
    res = subprocess.run(
        [sys.executable, "-m", "gpumon", "serve", "--config", str(cfg)],
        env=fake_nvml.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2
    assert f"{cfg}:6: [sampling] interval_s" in res.stderr, res.stderr
    res = subprocess.run(
        [sys.executable, "-m", "gpumon", "serve", "--config", str(tmp_path / "absent.toml")],
        env=fake_nvml.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2 and "no such configuration file" in res.stderr


def test_no_driver_exits_with_one_sentence(fake_nvml, tmp_path) -> None:
    fake_nvml.set(Scenario.no_driver())
    res = subprocess.run(
        serve_argv(free_port()),
        env=fake_nvml.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 3 and "Traceback" not in res.stderr
    assert "driver" in res.stderr


# --------------------------------------------------------------------------- TLS
def _openssl() -> str:
    exe = shutil.which("openssl")
    if exe is None:
        pytest.skip("openssl CLI not installed (apt-get install openssl)")
    return exe


def make_cert(
    openssl: str, d: Path, name: str, ca: tuple[Path, Path] | None = None
) -> tuple[Path, Path]:
    """A P-256 certificate for 127.0.0.1: self-signed, or signed by ``ca``."""
    key, crt = d / f"{name}.key", d / f"{name}.crt"
    subj = ["-subj", f"/CN={name}"]
    san = ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"]
    newkey = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        str(key),
    ]
    if ca is None:
        subprocess.run(
            [openssl, "req", "-x509", *newkey, "-out", str(crt), "-days", "2", *subj, *san],
            check=True,
            capture_output=True,
        )
    else:
        csr = d / f"{name}.csr"
        subprocess.run(
            [openssl, "req", "-new", *newkey, "-out", str(csr), *subj],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                openssl,
                "x509",
                "-req",
                "-in",
                str(csr),
                "-CA",
                str(ca[1]),
                "-CAkey",
                str(ca[0]),
                "-CAcreateserial",
                "-out",
                str(crt),
                "-days",
                "2",
            ],
            check=True,
            capture_output=True,
        )
    return key, crt


def test_tls_serves_https_and_refuses_plain_http(fake_nvml, tmp_path, daemons) -> None:
    openssl = _openssl()
    key, crt = make_cert(openssl, tmp_path, "server")
    cfg = tmp_path / "gpumon.toml"
    cfg.write_text(f'[http]\ntls_cert_file = "{crt}"\ntls_key_file = "{key}"\n')
    ctx = ssl.create_default_context(cafile=str(crt))
    d = start_daemon(fake_nvml.env, tmp_path, "--config", str(cfg), scheme="https", ctx=ctx)
    daemons.append(d)
    d.wait_for(lambda m: bool(series(m, "gpumon_build_info")), 10, "served over HTTPS")
    plain = f"http://127.0.0.1:{d.port}/metrics"
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(plain, timeout=5).read()
    # Still serving after the refused plain request.
    assert "gpumon_build_info" in d.text()
    assert d.stop() == 0


def test_unreadable_tls_files_stop_the_start(fake_nvml, tmp_path) -> None:
    cfg = tmp_path / "gpumon.toml"
    cfg.write_text(
        f'[http]\nport = {free_port()}\ntls_cert_file = "{tmp_path}/no.crt"\n'
        f'tls_key_file = "{tmp_path}/no.key"\n'
    )
    res = subprocess.run(
        [sys.executable, "-m", "gpumon", "serve", "--config", str(cfg)],
        env=fake_nvml.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2 and "cannot load the TLS certificate" in res.stderr
    assert "Traceback" not in res.stderr


def test_mtls_requires_a_client_certificate_from_the_ca(fake_nvml, tmp_path, daemons) -> None:
    openssl = _openssl()
    key, crt = make_cert(openssl, tmp_path, "server")
    ca = make_cert(openssl, tmp_path, "prometheus-ca")
    ckey, ccrt = make_cert(openssl, tmp_path, "prometheus", ca=ca)
    cfg = tmp_path / "gpumon.toml"
    cfg.write_text(
        f'[http]\ntls_cert_file = "{crt}"\ntls_key_file = "{key}"\ntls_client_ca_file = "{ca[1]}"\n'
    )
    with_cert = ssl.create_default_context(cafile=str(crt))
    with_cert.load_cert_chain(str(ccrt), str(ckey))
    d = start_daemon(fake_nvml.env, tmp_path, "--config", str(cfg), scheme="https", ctx=with_cert)
    daemons.append(d)
    d.wait_for(lambda m: bool(series(m, "gpumon_build_info")), 10, "served over mTLS")
    anonymous = ssl.create_default_context(cafile=str(crt))
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(d.url, timeout=5, context=anonymous).read()
    assert d.stop() == 0


# --------------------------------------------------------------------------- Prometheus
def test_real_prometheus_scrapes_the_starved_state(fake_nvml, tmp_path, daemons) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    fake_nvml.set(Scenario.uniform(2, BURSTY))
    d = start_daemon(fake_nvml.env, tmp_path)
    daemons.append(d)
    prom_port = free_port()
    conf = tmp_path / "prometheus.yml"
    conf.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: gpumon\n    scrape_interval: 1s\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{d.port}']\n"
    )
    prom = subprocess.Popen(
        [
            prometheus,
            f"--config.file={conf}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        query = 'gpumon_gpu_state{state="starved"} == 1'
        url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": query}
        )
        deadline = time.monotonic() + 40
        result: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            assert prom.poll() is None, prom.communicate()[1][-2000:]
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    body = json.load(r)
                result = body["data"]["result"]
                if len(result) == 2:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.5)
        assert len(result) == 2, result
        labels = result[0]["metric"]
        assert labels["job"] == "gpumon" and labels["instance"] == f"127.0.0.1:{d.port}"
        assert {r["metric"]["gpu"] for r in result} == {"0", "1"}  # type: ignore[index]
        # Self-health reached Prometheus too.
        url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": "time() - gpumon_last_sample_timestamp_seconds"}
        )
        with urllib.request.urlopen(url, timeout=30) as r:
            age = float(json.load(r)["data"]["result"][0]["value"][1])
        assert age < 10
    finally:
        prom.terminate()
        prom.wait(timeout=10)
    assert d.stop() == 0
