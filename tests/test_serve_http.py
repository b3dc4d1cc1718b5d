"""`gpumon serve` as an exporter: its pages, flags, web configuration and connection faults.

The daemon runs as a real subprocess against the fake NVML library; requests are real
HTTP on loopback (``http.client``, raw sockets where a client must misbehave), and a real
Prometheus scrapes it through basic auth and through TLS.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import test_serve_daemon
from fakenvml import Scenario
from test_serve_daemon import (
    BURSTY,
    Daemon,
    _openssl,
    free_port,
    make_cert,
    one,
    series,
    serve_argv,
    start_daemon,
)

pytestmark = pytest.mark.slow
daemons = test_serve_daemon.daemons  # the fixture: daemons a test started, stopped after it

# bcrypt of "s3cret" (cost 4 keeps the test quick; the format is the toolkit's).
PASSWORD = "s3cret"


def bcrypt_hash(password: str) -> str:
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


def request(
    d: Daemon,
    path: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    ctx: ssl.SSLContext | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request exactly as given (the path is sent as is, not normalised)."""
    if d.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            "127.0.0.1", d.port, timeout=10, context=ctx or d._ctx
        )
    else:
        conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def wait_sampled(d: Daemon, headers: dict[str, str] | None = None, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert d.proc.poll() is None, d.stop()
        try:
            if request(d, "/-/ready", headers=headers)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("never ready")


# --------------------------------------------------------------------------- pages
def test_landing_page_404_head_and_health_endpoints(fake_nvml, tmp_path, daemons) -> None:
    scn = Scenario.uniform(2, BURSTY)
    fake_nvml.set(scn)
    d = start_daemon(fake_nvml.env, tmp_path)
    daemons.append(d)
    wait_sampled(d)
    status, headers, body = request(d, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    page = body.decode()
    import gpumon

    assert f"gpumon {gpumon.__version__}" in page and 'href="/metrics"' in page
    for i in range(2):
        assert scn.gpus[i].effective_uuid(i) in page
    assert "unknown" in page or "starved" in page or "healthy" in page  # the verdicts
    for path in ("/foo", "/healthz", "/metrics/", "/metrics/../../etc/passwd", "/favicon.ico"):
        status, _, body = request(d, path)
        assert status == 404, (path, status)
        assert b"gpumon_" not in body
    status, headers, body = request(d, "/metrics", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 1000
    assert headers["content-type"].startswith("text/plain")
    status, headers, _ = request(d, "/metrics", method="POST")
    assert status == 405 and "GET" in headers["allow"]
    assert request(d, "/-/healthy")[:1] == (200,)
    assert request(d, "/-/healthy", method="HEAD")[2] == b""
    status, _, body = request(d, "/-/ready")
    assert status == 200 and b"Ready" in body
    assert d.stop() == 0 and "Traceback" not in d.stderr_text


def test_the_scrape_has_build_info_process_metrics_and_errors_at_zero(
    fake_nvml, tmp_path, daemons
) -> None:
    d = start_daemon(fake_nvml.env, tmp_path)
    daemons.append(d)
    wait_sampled(d)
    m = d.metrics()
    import gpumon

    info = series(m, "gpumon_build_info")
    (key,) = info
    for label in ("revision", "python_version", "nvml_version", "driver_version"):
        assert f'{label}="' in key, key
    assert f'version="{gpumon.__version__}"' in key
    assert 'nvml_version="12.550.54.15"' in key and 'driver_version="550.54.15"' in key
    assert one(m, "process_resident_memory_bytes") > 1e6
    assert one(m, "process_cpu_seconds_total") > 0
    assert one(m, "process_open_fds") > 0
    # No error happened, yet each known kind is there at 0: no "No data" panel.
    assert one(m, "gpumon_nvml_errors_total", kind="unknown") == 0
    assert one(m, "gpumon_nvml_errors_total", kind="gpu_is_lost") == 0
    for kind in ("timeout", "reset", "tls", "overload", "other"):
        assert one(m, "gpumon_http_connection_errors_total", kind=kind) == 0
    for reason in ("signal", "removed", "replaced"):
        assert one(m, "gpumon_log_reopens_total", reason=reason) == 0
    assert one(m, "gpumon_log_write_errors_total") == 0
    promtool = shutil.which("promtool")
    if promtool is not None:
        res = subprocess.run(
            [promtool, "check", "metrics"], input=d.text(), text=True, capture_output=True
        )
        assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout
    assert d.stop() == 0


def test_telemetry_path_flag_moves_the_metrics(fake_nvml, tmp_path, daemons) -> None:
    d = start_daemon(fake_nvml.env, tmp_path, "--web.telemetry-path", "/gpu/metrics")
    daemons.append(d)
    wait_sampled(d)
    status, _, body = request(d, "/gpu/metrics")
    assert status == 200 and b"gpumon_build_info" in body
    assert request(d, "/metrics")[0] == 404
    assert 'href="/gpu/metrics"' in request(d, "/")[2].decode()
    assert d.stop() == 0
    assert f"127.0.0.1:{d.port}/gpu/metrics" in d.stderr_text  # the start line says where


def test_ready_says_503_until_sampled_and_when_sampling_is_stale(tmp_path) -> None:
    """In process: the real WSGI app over a real ServeState, its clock moved forward."""
    from io import BytesIO
    from wsgiref.util import setup_testing_defaults

    from gpumon.engine import Session
    from gpumon.faces.serve.collector import make_registry
    from gpumon.faces.serve.config import ServeConfig
    from gpumon.faces.serve.daemon import ServeState
    from gpumon.faces.serve.http import WebApp
    from gpumon.faces.serve.landing import StatePages
    from gpumon.faces.serve.log import EventLog
    from gpumon.model import GpuIdentity, GpuSample, Snapshot, TraceHeader

    ident = GpuIdentity(index=0, uuid="GPU-x")
    session = Session.offline(TraceHeader(1, "gpumon", gpus=(ident,)), live=True)
    state = ServeState(session, ServeConfig(interval_s=1.0), EventLog(None))
    now = {"t": time.time()}
    app = WebApp(state.cfg, make_registry(state), StatePages(state, wall=lambda: now["t"]))

    def get(path: str) -> tuple[str, bytes]:
        env: dict[str, object] = {"PATH_INFO": path, "wsgi.input": BytesIO()}
        setup_testing_defaults(env)
        out: list[str] = []
        body = b"".join(app(env, lambda s, h, e=None: out.append(s)))
        return out[0], body

    status, body = get("/-/ready")
    assert status.startswith("503") and b"no sample taken yet" in body
    t = time.monotonic()
    state.ingest(session.read(Snapshot(t_s=t, gpus=(GpuSample(t_s=t, gpu=0, uuid="GPU-x"),))))
    now["t"] = state.last_sample_wall_s + 1.0
    assert get("/-/ready")[0].startswith("200")
    now["t"] = state.last_sample_wall_s + 60.0  # the loop stopped ticking a minute ago
    status, body = get("/-/ready")
    assert status.startswith("503") and b"60 s old" in body
    assert get("/-/healthy")[0].startswith("200")  # the process is up all the same


# --------------------------------------------------------------------------- connections
def test_300_concurrent_connections_are_all_answered(fake_nvml, tmp_path, daemons) -> None:
    d = start_daemon(fake_nvml.env, tmp_path)
    daemons.append(d)
    wait_sampled(d)
    results: list[object] = []
    go = threading.Event()

    def client() -> None:
        go.wait()
        try:
            with socket.create_connection(("127.0.0.1", d.port), timeout=30) as s:
                s.sendall(b"GET /-/healthy HTTP/1.0\r\n\r\n")
                data = b""
                while chunk := s.recv(4096):
                    data += chunk
            results.append(data.split(b"\r\n", 1)[0])
        except OSError as exc:
            results.append(exc)

    threads = [threading.Thread(target=client) for _ in range(300)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(60)
    failed = [r for r in results if not (isinstance(r, bytes) and b" 200 " in r)]
    assert len(results) == 300 and not failed, f"{len(failed)} failed: {failed[:5]}"
    assert d.stop() == 0 and "Traceback" not in d.stderr_text


def test_silent_and_resetting_clients_are_counted_not_tracebacks(
    fake_nvml, tmp_path, daemons
) -> None:
    d = start_daemon(fake_nvml.env, tmp_path)
    daemons.append(d)
    wait_sampled(d)
    silent = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(5)]
    for _ in range(3):  # a partial request, then a reset (RST, not FIN)
        s = socket.create_connection(("127.0.0.1", d.port))
        s.sendall(b"GET /metr")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    # Scrapes go on while the silent clients hold their connections.
    assert b"gpumon_build_info" in request(d, "/metrics")[2]
    time.sleep(11.0)  # past the 10 s timeout
    for s in silent:
        s.close()
    m = d.metrics()
    assert one(m, "gpumon_http_connection_errors_total", kind="timeout") == 5
    assert one(m, "gpumon_http_connection_errors_total", kind="reset") >= 1
    assert d.stop() == 0
    assert "Traceback" not in d.stderr_text and "timed out" not in d.stderr_text, d.stderr_text


def _client_hello() -> bytes:
    """The first flight of a real TLS client (its ClientHello), to send and then stall."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


class Trickler(threading.Thread):
    """A client that sends ``data`` one byte every ``every_s`` seconds, never finishing, and
    notes whether (and after how long) the server closed on it."""

    def __init__(self, port: int, data: bytes, every_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.data, self.every_s = data, every_s
        self.cut_after_s: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        self.sock.settimeout(self.every_s)
        for i in range(len(self.data)):
            if self.stop.is_set():
                return
            try:
                self.sock.send(self.data[i : i + 1])
                if self.sock.recv(1) == b"":
                    break  # closed by the server
            except TimeoutError:
                continue  # nothing back yet: the next byte
            except OSError:
                break  # reset by the server
        self.cut_after_s = time.monotonic() - start
        self.sock.close()


def test_silent_half_open_and_trickling_clients_hold_no_scrape(
    fake_nvml, tmp_path, daemons
) -> None:
    """Before: 33 silent connections held the next scrape 10 s, 100 half-open handshakes
    held it 27 s, and a client sending a byte a second held its worker for ever."""
    openssl = _openssl()
    key, crt = make_cert(openssl, tmp_path, "server")
    key.chmod(0o644)  # readable by every user: said at start
    web = write_web_config(tmp_path, f"tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n")
    ctx = ssl.create_default_context(cafile=str(crt))
    d = start_daemon(
        fake_nvml.env, tmp_path, "--web.config.file", str(web), scheme="https", ctx=ctx
    )
    daemons.append(d)
    wait_sampled(d)
    hello = _client_hello()
    silent = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(600)]  # > 512
    half_open = []
    for _ in range(100):
        s = socket.create_connection(("127.0.0.1", d.port))
        s.sendall(hello)  # the server answers, then waits for a Finished that never comes
        half_open.append(s)
    trickling = [Trickler(d.port, hello) for _ in range(5)]
    trickling.append(Trickler(d.port, b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"a" * 100))
    for t in trickling:
        t.start()
    try:
        for _ in range(3):  # each within a few seconds, where each waited 10 to 30 s before
            conn = http.client.HTTPSConnection("127.0.0.1", d.port, timeout=5, context=ctx)
            conn.request("GET", "/metrics")
            r = conn.getresponse()
            assert r.status == 200 and b"gpumon_build_info" in r.read()
            conn.close()
        for t in trickling:  # each cut at the 10 s deadline, however steadily it sends
            t.join(25)
            assert t.cut_after_s is not None, "a trickling client was never cut"
    finally:
        for t in trickling:
            t.stop.set()
        for s in silent + half_open:
            s.close()
    m = d.metrics()
    assert one(m, "gpumon_http_connection_errors_total", kind="overload") >= 600 - 512
    assert one(m, "gpumon_http_connection_errors_total", kind="timeout") >= 1
    assert d.stop() == 0 and "Traceback" not in d.stderr_text
    said = [ln for ln in d.stderr_text.splitlines() if "readable by every user" in ln]
    assert len(said) == 1 and str(key) in said[0] and "0644" in said[0], d.stderr_text


def test_listening_beyond_loopback_without_tls_or_auth_warns(fake_nvml, tmp_path, daemons) -> None:
    port = free_port()
    d = start_daemon(fake_nvml.env, tmp_path, "--web.listen-address", f"0.0.0.0:{port}", wait=False)
    d.port = port  # the later flag wins over the helper's own --listen
    daemons.append(d)
    wait_sampled(d)
    assert d.stop() == 0
    warning = [ln for ln in d.stderr_text.splitlines() if "warning" in ln]
    assert (
        len(warning) == 1
        and "0.0.0.0" in warning[0]
        and "without TLS or authentication" in (warning[0])
    )
    quiet = start_daemon(fake_nvml.env, tmp_path)  # loopback: no warning
    daemons.append(quiet)
    wait_sampled(quiet)
    assert quiet.stop() == 0 and "warning" not in quiet.stderr_text


# --------------------------------------------------------------------------- web config
def write_web_config(tmp: Path, text: str) -> Path:
    path = tmp / "web.yml"
    path.write_text(text)
    return path


def test_basic_auth_refuses_without_and_with_wrong_credentials(fake_nvml, tmp_path, daemons):
    web = write_web_config(
        tmp_path,
        f"basic_auth_users:\n  prometheus: {bcrypt_hash(PASSWORD)}\n"
        "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n",
    )
    d = start_daemon(fake_nvml.env, tmp_path, "--web.config.file", str(web))
    daemons.append(d)
    good = basic("prometheus", PASSWORD)
    wait_sampled(d, headers=good)
    status, headers, body = request(d, "/metrics")
    assert status == 401 and headers["www-authenticate"] == "Basic" and b"gpumon_" not in body
    assert request(d, "/metrics", headers=basic("prometheus", "guess"))[0] == 401
    assert request(d, "/metrics", headers=basic("nobody", PASSWORD))[0] == 401
    assert request(d, "/", headers=basic("prometheus", "guess"))[0] == 401
    status, headers, body = request(d, "/metrics", headers=good)
    assert status == 200 and b"gpumon_build_info" in body
    assert headers["x-content-type-options"] == "nosniff"
    assert d.stop() == 0
    assert "basic auth" in d.stderr_text and "warning" not in d.stderr_text


def test_guessed_passwords_cost_their_sender_not_the_scrapes(fake_nvml, tmp_path, daemons):
    """Before: no limit on guesses, each holding the one lock every check took, and with
    rate_limit set the guesses' 401s emptied the bucket: 20 of 20 scrapes got 429."""
    import bcrypt

    from gpumon.faces.serve.auth import FAILURE_REFILL_S, FAILURES_BURST

    costly = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(12)).decode()  # ~0.3 s a check
    web = write_web_config(
        tmp_path, f"basic_auth_users:\n  prom: {costly}\nrate_limit:\n  interval: 1s\n  burst: 40\n"
    )
    d = start_daemon(fake_nvml.env, tmp_path, "--web.config.file", str(web))
    daemons.append(d)
    good = basic("prom", PASSWORD)
    wait_sampled(d, headers=good)
    stop = threading.Event()
    answers: list[int] = []
    retry_after: list[str | None] = []

    def guess(i: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            user = "prom" if n % 2 else "nobody"
            with contextlib.suppress(OSError):
                status, headers, _ = request(d, "/metrics", headers=basic(user, f"guess{i}-{n}"))
                answers.append(status)
                if status == 429:
                    retry_after.append(headers.get("retry-after"))

    guessers = [threading.Thread(target=guess, args=(i,), daemon=True) for i in range(6)]
    started = time.monotonic()
    for g in guessers:
        g.start()
    try:
        deadline = time.monotonic() + 30
        while 429 not in answers and time.monotonic() < deadline:
            time.sleep(0.1)  # until the guesses are refused (or the bucket is empty)
        scrapes = []
        for _ in range(20):  # as the guesses go on; 20 within the bucket's 40
            scrapes.append(request(d, "/metrics", headers=good))
            time.sleep(0.2)
    finally:
        stop.set()
        for g in guessers:
            g.join(30)
    assert [status for status, _, _ in scrapes] == [200] * 20
    assert all(b"gpumon_build_info" in body for _, _, body in scrapes)
    # The guesses: a burst checked (401), then refused unchecked (429) until it refills.
    assert answers.count(429) > 0
    refilled = int((time.monotonic() - started) / FAILURE_REFILL_S) + 1
    assert FAILURES_BURST <= answers.count(401) <= FAILURES_BURST + refilled, answers
    assert set(retry_after) == {"6"}  # when to try again: one failure refilled
    assert d.stop() == 0


def test_metrics_by_name_gzip_as_negotiated_and_no_server_header(
    fake_nvml, tmp_path, daemons
) -> None:
    """Before: ?name[]=gpumon_gpu_state answered an empty 200, gzip;q=0 still got gzip, and
    every answer said Server: WSGIServer/0.2 CPython/3.11.7."""
    import gzip

    d = start_daemon(fake_nvml.env, tmp_path)
    daemons.append(d)
    wait_sampled(d)
    status, headers, body = request(d, "/metrics?name[]=gpumon_gpu_state")
    names = {ln.split("{")[0].split()[0] for ln in body.decode().splitlines() if ln[:1] != "#"}
    assert status == 200 and names == {"gpumon_gpu_state"}, body[:500]
    query = "name[]=gpumon_gpu_state_seconds_total&name[]=gpumon_gpu_idle_gap_seconds"
    body = request(d, "/metrics?" + query)[2].decode()
    names = {ln.split("{")[0].split()[0] for ln in body.splitlines() if ln[:1] != "#"}
    assert names == {
        "gpumon_gpu_state_seconds_total",
        "gpumon_gpu_idle_gap_seconds_bucket",
        "gpumon_gpu_idle_gap_seconds_sum",
        "gpumon_gpu_idle_gap_seconds_count",
    }, names
    for accept, gzipped in [
        ("gzip", True),
        ("gzip;q=0", False),
        ("GZIP;q=0.5, identity", True),
        ("*", True),
        ("gzip;q=0, *", False),
        ("identity", False),
        ("br, x-gzip", True),
        ("", False),
    ]:
        _, headers, body = request(d, "/metrics", headers={"Accept-Encoding": accept})
        assert (headers.get("content-encoding") == "gzip") is gzipped, accept
        assert b"gpumon_build_info" in (gzip.decompress(body) if gzipped else body), accept
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        # An error the request handler answers itself (431: more than 100 header lines;
        # the head left unfinished, so nothing unread makes the close a reset).
        s.sendall(b"GET / HTTP/1.0\r\n" + b"X-A: b\r\n" * 101)
        bad = s.recv(65536)
    assert bad.startswith(b"HTTP/1.0 431") and b"\r\nserver:" not in bad.lower(), bad
    for path in ("/metrics", "/", "/-/healthy", "/nowhere"):
        assert "server" not in request(d, path)[1], path
    assert d.stop() == 0


def test_a_bad_web_config_names_file_line_and_key(fake_nvml, tmp_path) -> None:
    web = write_web_config(tmp_path, "tls_server_config:\n  cert_file: a.crt\n  keyfile: a.key\n")
    res = subprocess.run(
        [
            *serve_argv(),
            "--web.config.file",
            str(web),
            "--web.listen-address",
            f"127.0.0.1:{free_port()}",
        ],
        env=fake_nvml.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2, res.stderr
    assert f"{web}:3: tls_server_config.keyfile: unknown key" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_web_config_tls_and_mtls_policy(fake_nvml, tmp_path, daemons) -> None:
    openssl = _openssl()
    key, crt = make_cert(openssl, tmp_path, "server")
    ca = make_cert(openssl, tmp_path, "prometheus-ca")
    ckey, ccrt = make_cert(openssl, tmp_path, "prometheus", ca=ca)
    web = write_web_config(
        tmp_path,
        "tls_server_config:\n"
        f"  cert_file: {crt.name}\n"  # relative: read beside the web config
        f"  key_file: {key.name}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {ca[1].name}\n"
        "  min_version: TLS12\n",
    )
    with_cert = ssl.create_default_context(cafile=str(crt))
    with_cert.load_cert_chain(str(ccrt), str(ckey))
    d = start_daemon(
        fake_nvml.env, tmp_path, "--web.config.file", str(web), scheme="https", ctx=with_cert
    )
    daemons.append(d)
    wait_sampled(d)
    assert b"gpumon_build_info" in request(d, "/metrics")[2]
    anonymous = ssl.create_default_context(cafile=str(crt))
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        request(d, "/metrics", ctx=anonymous)
    m = d.metrics()
    assert one(m, "gpumon_http_connection_errors_total", kind="tls") >= 1
    assert d.stop() == 0 and "Traceback" not in d.stderr_text


# --------------------------------------------------------------------------- Prometheus
class Prometheus:
    """A real Prometheus scraping one target every second (and evaluating ``rules``)."""

    def __init__(self, tmp: Path, job: str, rules: tuple[Path, ...] = ()) -> None:
        exe = shutil.which("prometheus")
        if exe is None:
            pytest.skip("prometheus not installed (apt-get install prometheus)")
        self.port = free_port()
        conf = tmp / "prometheus.yml"
        rule_files = "".join(f"  - {r}\n" for r in rules)
        conf.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            + (f"rule_files:\n{rule_files}" if rules else "")
            + "scrape_configs:\n"
            + job
        )
        self.proc = subprocess.Popen(
            [
                exe,
                f"--config.file={conf}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def query(self, q: str) -> list[dict[str, object]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
        with urllib.request.urlopen(url, timeout=30) as r:
            return json.load(r)["data"]["result"]

    def wait_for(self, q: str, timeout: float = 40) -> list[dict[str, object]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()[1][-2000:]
            try:
                result = self.query(q)
                if result:
                    return result
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"Prometheus never saw {q}; targets: {self.targets()}")

    def targets(self) -> str:
        try:
            url = f"http://127.0.0.1:{self.port}/api/v1/targets"
            with urllib.request.urlopen(url, timeout=30) as r:
                return json.dumps(json.load(r)["data"]["activeTargets"])[:2000]
        except OSError as exc:
            return str(exc)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def test_real_prometheus_scrapes_through_basic_auth(fake_nvml, tmp_path, daemons) -> None:
    web = write_web_config(tmp_path, f"basic_auth_users:\n  prom: {bcrypt_hash(PASSWORD)}\n")
    d = start_daemon(fake_nvml.env, tmp_path, "--web.config.file", str(web))
    daemons.append(d)
    secret = tmp_path / "password"
    secret.write_text(PASSWORD)
    (tmp_path / "prom").mkdir()
    good = Prometheus(
        tmp_path / "prom",
        "  - job_name: gpumon\n"
        f"    basic_auth: {{username: prom, password_file: {secret}}}\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{d.port}']}}]\n"
        "  - job_name: anonymous\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{d.port}']}}]\n",
    )
    try:
        result = good.wait_for('gpumon_build_info{job="gpumon"}')
        assert result[0]["metric"]["instance"] == f"127.0.0.1:{d.port}"  # type: ignore[index]
        good.wait_for('up{job="anonymous"} == 0')  # refused without credentials
        assert good.query('up{job="gpumon"} == 1')
        assert good.query('process_resident_memory_bytes{job="gpumon"}')
    finally:
        good.close()
    assert d.stop() == 0


def test_real_prometheus_scrapes_through_tls(fake_nvml, tmp_path, daemons) -> None:
    openssl = _openssl()
    key, crt = make_cert(openssl, tmp_path, "server")
    web = write_web_config(tmp_path, f"tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n")
    ctx = ssl.create_default_context(cafile=str(crt))
    d = start_daemon(
        fake_nvml.env, tmp_path, "--web.config.file", str(web), scheme="https", ctx=ctx
    )
    daemons.append(d)
    (tmp_path / "prom").mkdir()
    prom = Prometheus(
        tmp_path / "prom",
        "  - job_name: gpumon\n    scheme: https\n"
        f"    tls_config: {{ca_file: {crt}, server_name: localhost}}\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{d.port}']}}]\n",
    )
    try:
        result = prom.wait_for('gpumon_gpu_info{job="gpumon"}')
        assert result[0]["metric"]["uuid"]  # type: ignore[index]
        assert prom.query('up{job="gpumon"} == 1')
    finally:
        prom.close()
    assert d.stop() == 0
