"""`gpumon report`'s parts that need no cluster: times and durations, the HTTP
configuration file, PromQL quoting, missing stretches, the client's sentences for answers
that are not Prometheus', and the rules file's metric names."""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import http.server
import math
import os
import re
import resource
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_cli import gpumon, one_sentence
from test_deploy import load_yaml_all, metric_names_in

from gpumon.errors import ConfigError
from gpumon.faces.report.client import MAX_ANSWER_BYTES, PrometheusClient, PrometheusError
from gpumon.faces.report.command import parse_duration, parse_time
from gpumon.faces.report.httpconfig import load, parse
from gpumon.faces.report.queries import (
    RECORDED_UTIL,
    JobSelector,
    missing_stretches,
    present_runs,
    promql_string,
    regex_alternation,
    step_for,
)
from gpumon.faces.serve.collector import METRIC_NAMES

REPO = Path(__file__).resolve().parent.parent
REPORT_RULES = REPO / "deploy" / "prometheus" / "gpumon-report-rules.yml"
QUERIES = REPO / "gpumon" / "faces" / "report" / "queries.py"


# --------------------------------------------------------------------------- times
@pytest.mark.parametrize(
    "text, seconds",
    [("90s", 90), ("2h", 7200), ("1h30m", 5400), ("7d", 604800), ("1w", 604800), ("500ms", 0.5)],
)
def test_durations_as_prometheus_writes_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2", "h", "2 h", "1.5h", "-2h", "0s", "2hours", "30m2h3"])
def test_a_bad_duration_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is not a duration"):
        parse_duration(text)


def test_times_as_promtool_takes_them() -> None:
    assert parse_time("2026-05-01T12:00:00Z") == 1777636800.0
    assert parse_time("2026-05-01T14:00:00+02:00") == 1777636800.0
    assert parse_time("1777636800") == parse_time("@1777636800") == 1777636800.0
    assert parse_time("now", now=5.0) == 5.0
    local = datetime.datetime(2026, 5, 1, 12, 0, 0).astimezone().timestamp()
    assert parse_time("2026-05-01T12:00:00") == local  # no zone: local time, as Slurm writes
    with pytest.raises(argparse.ArgumentTypeError, match="is not a time"):
        parse_time("yesterday")


def test_usage_errors_are_one_sentence_with_status_2() -> None:
    env = {k: v for k, v in __import__("os").environ.items() if k != "GPUMON_PROMETHEUS"}
    res = gpumon(env, "report", "--job", "1")
    assert res.returncode == 2
    assert "needs --prometheus URL" in one_sentence(res.stderr)
    res = gpumon(
        env, "report", "--prometheus", "http://x", "--job", "1", "--since", "200", "--until", "100"
    )
    assert res.returncode == 2 and "--since must be before --until" in one_sentence(res.stderr)
    res = gpumon(env, "report", "--prometheus", "ftp://x", "--job", "1")
    assert res.returncode == 1 and "is not an http:// or https:// URL" in res.stderr
    for bad in (
        ["--pod", "no-slash"],
        ["--job", "1", "--pod", "a/b"],
        ["--job", "1", "--last", "x"],
    ):
        res = gpumon(env, "report", "--prometheus", "http://x", *bad)
        assert res.returncode == 2 and "Traceback" not in res.stderr


# --------------------------------------------------------------------------- http config
def test_http_config_basic_auth_bearer_and_tls_files(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("s3cret\n")
    (tmp_path / "token").write_text("tok\n")
    (tmp_path / "ca.crt").write_text("x")
    f = tmp_path / "http.yml"
    f.write_text(
        "basic_auth:\n  username: prom\n  password_file: pw\ntls_config:\n  ca_file: ca.crt\n"
    )
    cfg = load(str(f))
    assert cfg.authorization == "Basic cHJvbTpzM2NyZXQ="  # prom:s3cret, read beside the file
    assert cfg.ca_file == str(tmp_path / "ca.crt")
    f.write_text("bearer_token_file: token\nfollow_redirects: true\n")
    assert load(str(f)).authorization == "Bearer tok"
    f.write_text("authorization:\n  type: Token\n  credentials_file: token\n")
    assert load(str(f)).authorization == "Token tok"
    assert parse("") == parse("# nothing\n")
    assert parse("").authorization is None


@pytest.mark.parametrize(
    "text, where",
    [
        ("basic_auth:\n  username: a\n  passwd: b\n", ":3: basic_auth.passwd: is not a key"),
        ("oauth2:\n  client_id: a\n", ":1: oauth2: OAuth 2 is not supported"),
        ("bearer_token: a\nbasic_auth: {username: b}\n", ":2: basic_auth: cannot be combined"),
        ("tls_config:\n  cert_file: /etc/hostname\n", "tls_config.key_file: is needed"),
        ("tls_config:\n  ca_file: /no/such.crt\n", ":2: tls_config.ca_file: /no/such.crt is not a"),
        ("tls_config:\n  ca: '-----BEGIN'\n", "inline PEM is not supported"),
        ("tls_config:\n  min_version: TLS9\n", ":2: tls_config.min_version: must be one of"),
        ("basic_auth: [a]\n", ":1: basic_auth: must be a mapping"),
        ("basic_auth:\n  password: x\n", "basic_auth: needs username"),
        ("a: [\n", ": not valid YAML"),
    ],
)  # fmt: skip
def test_http_config_errors_name_the_file_line_and_key(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(text, "http.yml")
    assert str(err.value).startswith("http.yml") and where in str(err.value)


def test_an_unreadable_http_config_is_status_2(tmp_path: Path) -> None:
    res = gpumon(
        None,
        "report",
        "--prometheus",
        "http://x",
        "--job",
        "1",
        "--http.config.file",
        str(tmp_path / "none.yml"),
    )
    assert res.returncode == 2 and "cannot read the HTTP configuration" in one_sentence(res.stderr)


# --------------------------------------------------------------------------- PromQL
def test_label_values_and_regexes_are_quoted_for_promql() -> None:
    assert promql_string('a"b\\c') == '"a\\"b\\\\c"'
    pattern = regex_alternation(["10.0.0.1:9977", "node-a.example:9977", "10.0.0.1:9977"])
    assert pattern == r"10\.0\.0\.1:9977|node-a\.example:9977"
    assert re.fullmatch(pattern, "10.0.0.1:9977") and not re.fullmatch(pattern, "10x0.0.1:9977")
    assert JobSelector(hpc_job='12"3').matchers() == 'hpc_job="12\\"3"'
    pod = JobSelector(namespace="train", pod="resnet-0")
    assert (
        pod.matchers() == 'namespace="train",pod="resnet-0"'
        and pod.describe() == "pod train/resnet-0"
    )


def test_a_range_query_holds_at_most_a_thousand_points() -> None:
    assert step_for(60) == 1.0 and step_for(7200) == 8 and step_for(86400) == 87


def test_missing_stretches_are_said_with_why() -> None:
    grid = [float(t) for t in range(0, 61)]
    have = [t for t in grid if not 20 <= t <= 29]
    assert present_runs(have, 0, 60, 1) == [(20.0, 29.0)]
    ups = {"n1": [(t, 0.0 if 20 <= t <= 29 else 1.0) for t in grid], "n2": [(t, 1.0) for t in grid]}
    late = [t for t in grid if t >= 2]  # its daemon saw the job two seconds after the others
    gone = [t for t in grid if t <= 40]  # served no series of the job from 41 s on
    (a, b) = missing_stretches({"n1": have, "n2": gone, "n3": late}, ups, 0, 60, 1)
    assert (a.instance, a.start, a.end) == ("n1", 20.0, 29.0) and "up == 0" in a.why
    assert (b.instance, b.start, b.end) == ("n2", 41.0, 60.0) and "served no series" in b.why


# --------------------------------------------------------------------------- answers
class _Answer(http.server.BaseHTTPRequestHandler):
    status, body = 200, b"<html>Grafana</html>"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[tuple[str, type[_Answer]]]:
    handler = type("Handler", (_Answer,), {})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    srv.shutdown()


def test_an_answer_that_is_not_the_prometheus_api_is_said(answering) -> None:
    url, handler = answering
    with pytest.raises(
        PrometheusError, match="answered HTTP 200 but not as the Prometheus HTTP API"
    ):
        PrometheusClient(url).query("up", 0)
    handler.status = 400
    handler.body = b'{"status":"error","errorType":"bad_data","error":"parse error at char 3"}'
    with pytest.raises(PrometheusError) as err:
        PrometheusClient(url).query("up{", 0)
    assert "could not run a query (HTTP 400, bad_data: parse error at char 3)" in str(err.value)
    assert str(err.value).endswith("the query was: up{")
    handler.status, handler.body = 403, b"forbidden"
    with pytest.raises(PrometheusError, match=r"refused the credentials \(HTTP 403\)"):
        PrometheusClient(url + "/prometheus/").query("up", 0)


# --------------------------------------------------------------------------- rules
def test_the_report_rules_and_queries_use_only_exported_metrics() -> None:
    (rules,) = load_yaml_all(REPORT_RULES)
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"]}  # type: ignore[index]
    assert recorded == {RECORDED_UTIL}
    known = set(METRIC_NAMES) | {f"{m}_total" for m in METRIC_NAMES} | recorded
    for g in rules["groups"]:  # type: ignore[index]
        for r in g["rules"]:
            assert metric_names_in(r["expr"]) <= known, r
    used = metric_names_in(QUERIES.read_text())
    histograms = {"gpumon_gpu_idle_gap_seconds_bucket", "gpumon_gpu_busy_burst_seconds_bucket"}
    assert used - histograms <= known, used - known


# --------------------------------------------------------------------------- hostile answers
class Hostile:
    """A TCP server answering every connection with ``serve(sock, request_head)``, each in a
    thread; the request heads it read are kept."""

    def __init__(self, serve) -> None:
        self.serve = serve
        self.heads: list[bytes] = []
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(sock,), daemon=True).start()

    def _one(self, sock: socket.socket) -> None:
        with sock:
            head = b""
            while b"\r\n\r\n" not in head and (chunk := sock.recv(65536)):
                head += chunk
            self.heads.append(head)
            with contextlib.suppress(OSError):
                self.serve(sock, self)

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


@pytest.fixture
def hostile() -> Iterator[Callable[..., Hostile]]:
    servers: list[Hostile] = []

    def start(serve) -> Hostile:
        servers.append(Hostile(serve))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _limited(megabytes: int) -> Callable[[], None]:
    """For preexec_fn: the child's address space capped, so a report that reads without a
    bound fails in it instead of growing on a shared machine."""

    def limit() -> None:
        cap = megabytes * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    return limit


def report(url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUMON_PROMETHEUS"}
    return subprocess.run(
        [sys.executable, "-m", "gpumon", "report", "--prometheus", url, "--job", "1", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_limited(512),
    )


def test_an_answer_that_never_ends_is_cut_at_its_size_limit(hostile) -> None:
    """Before: gpumon grew to 14.6 GiB on an endless answer (MemoryError here, capped)."""

    def endless(sock: socket.socket, _: Hostile) -> None:
        sock.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n[")
        block = b"1," * 32768
        while True:
            sock.sendall(block)

    res = report(hostile(endless).url)
    assert res.returncode == 1, res.stderr[-2000:]
    said = one_sentence(res.stderr)
    assert f"more than {MAX_ANSWER_BYTES // 2**20} MiB" in said, said


def test_an_answer_announced_too_large_is_refused_before_reading(hostile) -> None:
    def announced(sock: socket.socket, server: Hostile) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n{")
        server.stop.wait(30)  # then nothing: only the announcement can end it in time

    res = report(hostile(announced).url, "--timeout", "20")
    assert res.returncode == 1 and "more than" in one_sentence(res.stderr), res.stderr


@pytest.mark.parametrize("where", ["head", "body"])
def test_timeout_is_a_deadline_for_the_whole_answer(hostile, where: str) -> None:
    """Before: a server sending a byte every 0.5 s held --timeout 2 for as long as it sent."""
    head = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n"

    def trickle(sock: socket.socket, server: Hostile) -> None:
        data = head + b'{"status":"success","data":' + b" " * 1000 if where == "body" else head
        if where == "body":
            sock.sendall(head)
            data = data[len(head) :]
        for i in range(len(data)):
            if server.stop.wait(0.5):
                return
            sock.sendall(data[i : i + 1])

    res = report(hostile(trickle).url, "--timeout", "2", timeout=40)
    assert res.returncode == 1, res.stderr
    assert "no complete answer within 2 s" in one_sentence(res.stderr)


def test_credentials_in_the_url_are_sent_and_never_printed(hostile) -> None:
    def refuse(sock: socket.socket, _: Hostile) -> None:
        sock.sendall(b"HTTP/1.0 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")

    server = hostile(refuse)
    url = server.url.replace("//", "//alice:hunter%32@")  # %32: a percent-encoded '2'
    res = report(url)
    assert res.returncode == 1 and "refused the credentials" in one_sentence(res.stderr)
    assert "hunter" not in res.stderr and "alice:xxxxx@127.0.0.1" in res.stderr, res.stderr
    want = "Authorization: Basic " + base64.b64encode(b"alice:hunter2").decode()
    assert want.encode() in server.heads[0]
    for elsewhere in ("127.0.0.1:1", "127.0.0.1:port"):  # refused; not a URL
        res = report(f"http://alice:hunter2@{elsewhere}")
        assert res.returncode == 1 and "alice:xxxxx@" in one_sentence(res.stderr)
        assert "hunter" not in res.stderr, res.stderr


@pytest.mark.parametrize(
    "result",
    [
        '{"resultType":"vector","result":[{"metric":{}}]}',  # no value
        '{"resultType":"vector","result":[{"metric":{},"value":[1,"abc"]}]}',
        '{"resultType":"vector","result":[{"metric":{},"value":[1,true]}]}',
        '{"resultType":"vector","result":[{"metric":{},"value":["x","1"]}]}',
        '{"resultType":"vector","result":[{"metric":{},"value":null}]}',
        '{"resultType":"matrix","result":[{"metric":{},"values":[[1,"1"],[2]]}]}',
        '{"resultType":"matrix","result":[{"metric":{},"values":{"a":1}}]}',
        '{"resultType":"vector","result":[{"metric":{"a":1},"value":[1,"1"]}]}',
        '{"resultType":"vector","result":["x"]}',
        '{"resultType":"vector","result":3}',
    ],
)
def test_a_malformed_point_is_one_sentence(answering, result: str) -> None:
    url, handler = answering
    handler.status, handler.body = 200, f'{{"status":"success","data":{result}}}'.encode()
    with pytest.raises(PrometheusError, match="not as the Prometheus HTTP API does"):
        PrometheusClient(url).query("up", 0)


def test_special_values_are_read_as_prometheus_writes_them(answering) -> None:
    url, handler = answering
    points = '[[1,"NaN"],[2,"+Inf"],[3,"-Inf"],[4,"1e+06"],[5.5,-0.25]]'  # a bare number too
    handler.body = (
        '{"status":"success","data":{"resultType":"matrix","result":'
        f'[{{"metric":{{"instance":"n1"}},"values":{points}}}]}}}}'
    ).encode()
    (s,) = PrometheusClient(url).query_range("up", 0, 5, 1)
    assert s.labels == {"instance": "n1"} and s.points[1:] == (
        (2.0, math.inf),
        (3.0, -math.inf),
        (4.0, 1e6),
        (5.5, -0.25),
    )
    assert math.isnan(s.points[0][1])


def test_error_text_from_the_server_is_made_printable(answering) -> None:
    url, handler = answering
    handler.status = 400
    handler.body = (
        b'{"status":"error","errorType":"bad\\u001b[31m","error":"\\u001b[2J\\u001b[Hgotcha'
        b"\\u202e \\u0007" + b"x" * 2000 + b'"}'
    )
    with pytest.raises(PrometheusError) as err:
        PrometheusClient(url).query("up", 0)
    said = str(err.value)
    assert all(c.isprintable() for c in said), repr(said)
    assert "\\x1b[2J\\x1b[Hgotcha\\u202e \\x07" in said and "bad\\x1b[31m" in said
    assert len(said) < 1000 and said.endswith("the query was: up")
