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
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
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


def test_gpumon_serve_in_the_image_reads_the_fake_gpu(
    container: tuple[Builder, str], fake_nvml_lib: Path, tmp_path: Path
) -> None:
    builder, ctr = container
    scn = Scenario.uniform(2, Pattern.steady(80))
    tmp_path.chmod(0o755)  # the image's user reads the scenario: it is not root
    scenario = write_scenario(tmp_path / "scenario.txt", scn)
    scenario.chmod(0o644)
    port = free_port()
    cmd = [
        "buildah",
        "--root", str(builder.cache / "storage"),
        "--runroot", str(builder.cache / "run"),
        "--storage-driver", "vfs",
        "run", "--isolation", "chroot",
        # Where the NVIDIA runtime would put the driver's library: the fake one instead.
        "--volume", f"{lib_dir()}:/opt/fakenvml:ro",
        "--volume", f"{tmp_path}:/scenario:ro",
        "--env", "LD_LIBRARY_PATH=/opt/fakenvml",
        "--env", f"FAKE_NVML_SCENARIO=/scenario/{scenario.name}",
        ctr, "--", "gpumon", "serve", "--listen", f"127.0.0.1:{port}", "--log", "",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        body = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    body = r.read().decode()
                if "gpumon_gpu_utilization_ratio{" in body:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[0]
        for i in range(2):
            uuid = scn.gpus[i].effective_uuid(i)
            assert f'uuid="{uuid}"' in body, body[-2000:]
        assert "gpumon_gpu_lost" in body
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(15)
