"""The container image: the Containerfile builds with buildah (chroot isolation, from a
Debian base made with debootstrap: no registry is reachable here), and gpumon runs in it
against the fake NVML, answering /metrics with the fake GPU, as the DaemonSet would run it.

Needs root, buildah and debootstrap (CI installs them).  The first run on a machine
bootstraps Debian from its mirror and downloads gpumon's dependency wheels from PyPI (the
package registries CI reaches); the base and buildah's layers are cached under
$GPUMON_IMAGE_CACHE (default /var/tmp/gpumon-image-cache) for the runs after it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakenvml import Pattern, Scenario, lib_dir, write_scenario
from helpers.image import Builder, BuildError

from gpumon import DISTRIBUTION, __version__
from gpumon.cli import build_parser

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
KUBE_BASE = REPO / "deploy" / "kubernetes" / "base"


def daemonset_image_and_args() -> tuple[str, list[str]]:
    """The image and args the DaemonSet runs (kustomization's images: sets the tag)."""
    yaml = pytest.importorskip("yaml", reason="PyYAML not installed (pip install pyyaml)")
    ds = yaml.safe_load((KUBE_BASE / "daemonset.yaml").read_text())
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    kust = yaml.safe_load((KUBE_BASE / "kustomization.yaml").read_text())
    tag = next(i["newTag"] for i in kust["images"] if i["name"] == c["image"])
    return f"{c['image']}:{tag}", c["args"]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Builder, str]]:
    for tool, package in (("buildah", "buildah"), ("debootstrap", "debootstrap")):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (apt-get install {package})")
    if os.geteuid() != 0:
        pytest.skip("building with --isolation chroot needs root")
    builder = Builder()
    name, _ = daemonset_image_and_args()
    context = tmp_path_factory.mktemp("image-context")
    builder.cache.mkdir(parents=True, exist_ok=True)
    # The image's tag and storage are the machine's (a cache): a second suite running at
    # once would rebuild and prune them under this one's containers, so it waits its turn.
    with open(builder.cache / "suite.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        t0 = time.monotonic()
        try:
            builder.wheelhouse(context / "dist" / "wheelhouse")
            builder.build(name, context)
        except BuildError as exc:
            pytest.fail(str(exc))
        builder.timings["total"] = round(time.monotonic() - t0, 1)
        builder.timings["size_mb"] = builder.size_mb(name)
        # For whoever tunes CI time: what this run cost (cold: debootstrap and import too).
        (builder.cache / "last-build.json").write_text(json.dumps(builder.timings) + "\n")
        yield builder, name
        with contextlib.suppress(BuildError):
            builder.buildah("rmi", "--prune")  # earlier builds' layers, no longer tagged


@pytest.fixture
def container(image: tuple[Builder, str]) -> Iterator[tuple[Builder, str]]:
    builder, name = image
    ctr = builder.buildah("from", "--pull=never", "--quiet", name).strip()
    yield builder, ctr
    builder.buildah("rm", ctr)


def test_the_image_runs_this_gpumon(container: tuple[Builder, str]) -> None:
    builder, ctr = container
    out = builder.buildah("run", "--isolation", "chroot", ctr, "--", "gpumon", "--version")
    assert out.strip() == f"gpumon {__version__}"
    # As a user of its own, not root (NVML needs only the device nodes).
    who = builder.buildah("run", "--isolation", "chroot", ctr, "--", "id", "-un")
    assert who.strip() == "gpumon"


def test_the_image_runs_what_the_daemonset_asks(image: tuple[Builder, str]) -> None:
    builder, name = image
    config = json.loads(builder.buildah("inspect", "--type", "image", name))["OCIv1"]["config"]
    assert config["Entrypoint"] == ["gpumon"]
    assert config["User"] == "65532:65532"
    labels = config["Labels"]
    assert labels["org.opencontainers.image.title"] == DISTRIBUTION
    assert labels["org.opencontainers.image.version"] == __version__
    _, args = daemonset_image_and_args()
    parsed = build_parser().parse_args(args)  # the DaemonSet's args are gpumon's own
    assert parsed.command == "serve" and parsed.config == "/etc/gpumon/gpumon.toml"
    assert "9977/tcp" in config["ExposedPorts"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_with_the_fake_gpus(
    builder: Builder, ctr: str, tmp_path: Path, command: list[str]
) -> tuple[list[str], Scenario]:
    """``buildah run`` of ``command`` in the container, the fake NVML library where the
    NVIDIA runtime would put the driver's, and two fake GPUs: (argv, the scenario)."""
    scn = Scenario.uniform(2, Pattern.steady(80))
    tmp_path.chmod(0o755)  # the image's user reads the scenario: it is not root
    scenario = write_scenario(tmp_path / "scenario.txt", scn)
    scenario.chmod(0o644)
    argv = [
        "buildah",
        "--root", str(builder.cache / "storage"),
        "--runroot", str(builder.cache / "run"),
        "--storage-driver", "vfs",
        "run", "--isolation", "chroot",
        "--volume", f"{lib_dir()}:/opt/fakenvml:ro",
        "--volume", f"{tmp_path}:/scenario:ro",
        "--env", "LD_LIBRARY_PATH=/opt/fakenvml",
        "--env", f"FAKE_NVML_SCENARIO=/scenario/{scenario.name}",
        ctr, "--", *command,
    ]  # fmt: skip
    return argv, scn


def scrape_until(url: str, proc: subprocess.Popen[str], wrap: list[str] | None = None) -> str:
    """/metrics once it shows a GPU's utilisation (60 s at most, while ``proc`` runs);
    fetched through ``wrap`` (a command to run the fetch in another namespace) if given."""
    fetch = (
        "import sys, urllib.request\n"
        "with urllib.request.urlopen(sys.argv[1], timeout=5) as r:\n"
        "    sys.stdout.write(r.read().decode())\n"
    )
    body = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        res = subprocess.run(
            [*(wrap or []), sys.executable, "-c", fetch, url],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        body = res.stdout
        if res.returncode == 0 and "gpumon_gpu_utilization_ratio{" in body:
            break
        time.sleep(0.5)
    return body


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(15)


def test_gpumon_serve_in_the_image_reads_the_fake_gpu(
    container: tuple[Builder, str], fake_nvml_lib: Path, tmp_path: Path
) -> None:
    builder, ctr = container
    port = free_port()
    argv, scn = run_with_the_fake_gpus(
        builder, ctr, tmp_path, ["gpumon", "serve", "--listen", f"127.0.0.1:{port}", "--log", ""]
    )
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        body = scrape_until(f"http://127.0.0.1:{port}/metrics", proc)
        assert proc.poll() is None, proc.communicate()[0]
        for i in range(2):
            uuid = scn.gpus[i].effective_uuid(i)
            assert f'uuid="{uuid}"' in body, body[-2000:]
        assert "gpumon_gpu_lost" in body
    finally:
        stop(proc)


def test_a_plain_run_of_the_image_serves_on_its_defaults(
    image: tuple[Builder, str],
    container: tuple[Builder, str],
    fake_nvml_lib: Path,
    tmp_path: Path,
) -> None:
    """The image's own command, nothing mounted at /etc/gpumon: it serves on every address
    at 9977 (run in a network namespace of its own, so the port is free and private), with
    no log file to write."""
    for tool in ("unshare", "nsenter", "ip"):  # loopback up in a network namespace
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (apt-get install util-linux iproute2)")
    builder, name = image
    _, ctr = container
    config = json.loads(builder.buildah("inspect", "--type", "image", name))["OCIv1"]["config"]
    command = [*config["Entrypoint"], *config["Cmd"]]
    argv, scn = run_with_the_fake_gpus(builder, ctr, tmp_path, command)
    private = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
    proc = subprocess.Popen(
        [*private, *argv],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        inside = ["nsenter", f"--net=/proc/{proc.pid}/ns/net", "--"]
        body = scrape_until("http://127.0.0.1:9977/metrics", proc, inside)
        assert proc.poll() is None, proc.communicate()[0]
        assert f'uuid="{scn.gpus[0].effective_uuid(0)}"' in body, body[-2000:]
    finally:
        stop(proc)
    out = proc.communicate()[0]
    assert "serving 2 GPU(s) on http://0.0.0.0:9977/metrics" in out, out


def test_the_image_says_the_commit_it_was_built_from(container: tuple[Builder, str]) -> None:
    builder, ctr = container
    out = builder.buildah("run", "--isolation", "chroot", ctr, "--", "gpumon", "serve", "--version")
    first = out.splitlines()[0]
    assert (
        first == f"gpumon serve, version {__version__} (revision: {builder.revision or 'unknown'})"
    )
    if builder.revision is None:
        pytest.skip("git not installed (apt-get install git): the wheel was built from no clone")
