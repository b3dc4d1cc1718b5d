"""Hostile input, third round, on the daemon: logins at once, a node name that is not
UTF-8, a GPU plugged in while serving, a watchdog period past time_t, a web configuration
of hundreds of thousands of users or unknown tags.  The real daemon on the fake NVML."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import test_serve_daemon
from fakenvml import Pattern, Scenario
from test_serve_daemon import _openssl, free_port, make_cert, series, start_daemon
from test_serve_http import basic, request

from gpumon.faces.serve.notify import MAX_PERIOD_S, Notifier, Watchdog, watchdog_period_s

daemons = test_serve_daemon.daemons


def test_twenty_scrapes_with_the_right_password_at_once_all_pass_over_tls(
    fake_nvml, tmp_path, daemons
) -> None:
    """On a fresh daemon 10 of 20 got 429 "Too many failed logins": the failure budget was
    spent before bcrypt had answered.  Cost 10, as htpasswd -B makes them."""
    import bcrypt

    key, crt = make_cert(_openssl(), tmp_path, "server")
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(10)).decode()
    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n"
        f"basic_auth_users:\n  prometheus: {hashed}\n"
    )
    ctx = ssl.create_default_context(cafile=str(crt))
    d = start_daemon(fake_nvml.env, tmp_path, "--web.config.file", str(web), scheme="https",
                     ctx=ctx)  # fmt: skip
    daemons.append(d)
    statuses: list[int] = []
    go = threading.Event()

    def scrape() -> None:
        go.wait(10)
        statuses.append(request(d, "/metrics", headers=basic("prometheus", "right"))[0])

    threads = [threading.Thread(target=scrape) for _ in range(20)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(60)
    assert sorted(statuses) == [200] * 20, statuses
    assert request(d, "/metrics", headers=basic("prometheus", "wrong"))[0] == 401
    assert d.stop() == 0


def test_a_node_name_that_is_not_utf8_is_served_escaped(fake_nvml, tmp_path, daemons) -> None:
    """NODE_NAME's bytes that are not UTF-8 made every full scrape answer 500."""
    env = {**{k.encode(): v.encode() for k, v in fake_nvml.env.items()}, b"NODE_NAME": b"n\xffde"}
    d = start_daemon(env, tmp_path)  # type: ignore[arg-type]
    daemons.append(d)
    d.wait_for(lambda m: bool(series(m, "gpumon_gpu_info")), 15, "sampled")
    text = d.text()
    assert 'hostname="n\\\\xffde"' in text, [ln for ln in text.splitlines() if "gpu_info" in ln]
    assert d.stop() == 0


def test_a_gpu_plugged_in_while_serving_has_its_name_and_bus_id(fake_nvml, tmp_path, daemons):
    """It was exported with an empty name and bus id, though NVML gave both."""
    fake_nvml.set(Scenario.uniform(1, Pattern.steady(50.0)))
    d = start_daemon(fake_nvml.env, tmp_path)
    daemons.append(d)
    d.wait_for(lambda m: bool(series(m, "gpumon_gpu_info", gpu="0")), 15, "sampled")
    grown = Scenario.uniform(2, Pattern.steady(50.0))
    fake_nvml.set(grown)
    d.wait_for(lambda m: bool(series(m, "gpumon_gpu_info", gpu="1")), 25, "GPU 1 found")
    info = [
        ln for ln in d.text().splitlines() if ln.startswith("gpumon_gpu_info{") and 'gpu="1"' in ln
    ]
    gpu = grown.gpus[1]
    assert len(info) == 1 and f'name="{gpu.name}"' in info[0], info
    assert f'pci_bus_id="{gpu.effective_bus_id(1)}"' in info[0], info
    assert d.stop() == 0


def test_a_watchdog_period_past_time_t_still_pings() -> None:
    """WATCHDOG_USEC too large for a wait killed the pinging thread, silently."""
    env = {"WATCHDOG_USEC": "99999999999999999999"}
    period = watchdog_period_s(env)
    assert period == MAX_PERIOD_S
    dog = Watchdog(Notifier({}), period, 1.0).start()
    try:
        time.sleep(0.3)
        assert dog._thread.is_alive()
    finally:
        dog.stop()


def _serve(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpumon", "serve", "--config", os.devnull,
         "--listen", f"127.0.0.1:{free_port()}", *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_a_web_config_with_an_unknown_tag_is_one_sentence(fake_nvml, tmp_path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prometheus: !vault abc\n")
    done = _serve(fake_nvml.env, "--web.config.file", str(web), timeout=30)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{web}:2: not a value gpumon reads" in done.stderr


def test_a_web_config_of_many_users_is_read_in_seconds_and_a_huge_one_refused(
    fake_nvml, tmp_path
) -> None:
    """A 21 MB file of 300,000 users had not started after 120 s (513 MB): now files over
    1 MiB are refused unread, and the ~12,000 users that fit are checked in seconds."""
    import bcrypt

    hashed = bcrypt.hashpw(b"x", bcrypt.gensalt(10)).decode()
    line = "  user{}: " + hashed + "\n"
    huge = tmp_path / "huge.yml"
    huge.write_text("basic_auth_users:\n" + "".join(line.format(i) for i in range(300_000)))
    done = _serve(fake_nvml.env, "--web.config.file", str(huge), timeout=60)
    assert done.returncode == 2 and "more than the 1 MiB" in done.stderr, done.stderr
    many = tmp_path / "many.yml"
    many.write_text("basic_auth_users:\n" + "".join(line.format(i) for i in range(12_000)))
    assert many.stat().st_size < 1 << 20
    from gpumon.faces.serve import webconfig

    started = time.monotonic()
    cfg = webconfig.load(str(many))
    assert len(cfg.basic_auth_users) == 12_000
    print(f"12,000 users read in {time.monotonic() - started:.1f} s")
    assert time.monotonic() - started < 30


def test_a_fifo_or_a_device_for_a_tls_file_stops_the_start_at_once(fake_nvml, tmp_path) -> None:
    _, crt = make_cert(_openssl(), tmp_path, "server")
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    for bad_key in (fifo, Path("/dev/zero")):
        cfg = tmp_path / "gpumon.toml"
        cfg.write_text(f'[http]\ntls_cert_file = "{crt}"\ntls_key_file = "{bad_key}"\n')
        done = subprocess.run(
            [sys.executable, "-m", "gpumon", "serve", "--config", str(cfg),
             "--listen", f"127.0.0.1:{free_port()}"],
            env=fake_nvml.env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "not a regular file" in done.stderr and "Traceback" not in done.stderr
