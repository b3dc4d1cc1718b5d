"""gpumon on Kubernetes, scraped as the Prometheus Operator scrapes it: a real Prometheus
under the scrape job the Operator generates from the rendered ServiceMonitor (or
PodMonitor), with the rendered PrometheusRules loaded, stores no series whose `pod`,
`namespace` or `container` are gpumon's own; the training pod's labels are kept
(honorLabels), and dcgm-exporter's DCGM_* names carry them; a dashboard written for
dcgm-exporter (Grafana 12239) answers every query.

`operator_scrape_config` reproduces the Operator's generator (prometheus-operator,
pkg/prometheus/promcfg.go: generateServiceMonitorConfig, generatePodMonitorConfig and
generateRelabelConfig; the relabelings it writes, in its order, the sharding rules with
the config reloader's $(SHARD) filled in) for the fields gpumon's monitors use, and fails
on any other field, so a monitor that grows one is not checked against a configuration
the Operator would not write.  The one part replaced is kubernetes_sd: a file_sd target
carrying the __meta_kubernetes_* labels Kubernetes discovery gives a gpumon pod (built
from the rendered DaemonSet and Service), offered only if it is in a namespace the job's
discovery watches, as the Operator limits it to the monitor's own.  The scrape interval
is 1 s instead of the monitor's, to keep the test short.

The training pod is a real process in a cgroup the test creates the way the kubelet
names them (kubepods.../pod<uid>/cri-containerd-<id>.scope), with the pod's name and
namespace in its environment: gpumon finds it as it would on a node without the
kubelet's socket.  Needs root and a writable cgroup2 mount (skips, saying so, without).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_kubernetes
import test_serve_daemon
from fakenvml import FakeGPU, Process, Scenario
from test_kubernetes import KUBE, render
from test_serve_daemon import start_daemon
from test_serve_dcgm import check_the_dashboard
from test_serve_http import Prometheus

pytestmark = pytest.mark.slow
daemons = test_serve_daemon.daemons  # the fixture: daemons a test started, stopped after it
kubectl = test_kubernetes.kubectl  # the fixture: kubectl with components, or a skip

NODE = "gpu-node-7"
EXPORTER_POD = "gpumon-x7k2p"  # the DaemonSet's pod on NODE
EXPORTER_IP = "127.0.0.1"  # the pod's IP: where the daemon listens here
TRAINER_POD, TRAINER_NAMESPACE = "trainer-0", "ml"
SLURM_JOB = "4242"
SHARD = "0"  # what the Operator's config reloader puts in $(SHARD) (one shard)


# --------------------------------------------------------------------------- the Operator
def _label_name(name: str) -> str:
    """The Operator's sanitizeLabelName: every character outside [a-zA-Z0-9_] becomes _."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _relabel_config(rc: dict) -> dict:
    """generateRelabelConfig: the CRD's camelCase fields, in the Operator's order."""
    known = {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement"}
    unknown = set(rc) - known - {"action"}
    assert not unknown, f"the emulation does not know {unknown}"
    out: dict = {}
    if rc.get("sourceLabels"):
        out["source_labels"] = rc["sourceLabels"]
    for field, key in (("separator", "separator"), ("targetLabel", "target_label")):
        if field in rc:
            out[key] = rc[field]
    if rc.get("regex"):
        out["regex"] = rc["regex"]
    if rc.get("modulus"):
        out["modulus"] = rc["modulus"]
    if "replacement" in rc:
        out["replacement"] = rc["replacement"]
    if rc.get("action"):
        out["action"] = rc["action"].lower()
    return out


def _sharding() -> list[dict]:
    """appendShardingRelabelingWithAddress, one shard, $(SHARD) filled in."""
    return [
        {"source_labels": ["__address__", "__tmp_hash"], "target_label": "__tmp_hash",
         "regex": "(.+);", "replacement": "$1", "action": "replace"},
        {"source_labels": ["__tmp_hash"], "target_label": "__tmp_hash", "modulus": 1,
         "action": "hashmod"},
        {"source_labels": ["__tmp_hash", "__tmp_disable_sharding"],
         "regex": f"{SHARD};|.+;.+", "action": "keep"},
    ]  # fmt: skip


RUNNING = {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
           "regex": "(Failed|Succeeded)"}  # fmt: skip
# The endpoint fields the emulation writes; any other fails the test.
ENDPOINT_FIELDS = {"port", "path", "interval", "honorLabels", "relabelings"}


def operator_scrape_config(monitor: dict) -> dict:
    """The scrape job the Operator writes for a ServiceMonitor's or PodMonitor's first
    endpoint (role endpoints, the default; the selector as relabelings, the default)."""
    kind, meta, spec = monitor["kind"], monitor["metadata"], monitor["spec"]
    assert set(spec) <= {"selector", "endpoints", "podMetricsEndpoints"}, set(spec)
    assert set(spec["selector"]) == {"matchLabels"}, spec["selector"]
    service = kind == "ServiceMonitor"
    (ep,) = spec["endpoints" if service else "podMetricsEndpoints"]
    assert set(ep) <= ENDPOINT_FIELDS, set(ep) - ENDPOINT_FIELDS
    ns, name = meta["namespace"], meta["name"]
    job: dict = {
        "job_name": f"{'serviceMonitor' if service else 'podMonitor'}/{ns}/{name}/0",
        "honor_labels": bool(ep.get("honorLabels", False)),
        "kubernetes_sd_configs": [
            {"role": "endpoints" if service else "pod", "namespaces": {"names": [ns]}}
        ],
    }
    if "interval" in ep:
        job["scrape_interval"] = ep["interval"]
    if "path" in ep:
        job["metrics_path"] = ep["path"]
    rel: list[dict] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    obj = "service" if service else "pod"
    if not service:
        rel.append(RUNNING)
    for k, v in sorted(spec["selector"]["matchLabels"].items()):
        rel.append({
            "action": "keep",
            "source_labels": [f"__meta_kubernetes_{obj}_label_{_label_name(k)}",
                              f"__meta_kubernetes_{obj}_labelpresent_{_label_name(k)}"],
            "regex": f"({v});true",
        })  # fmt: skip
    port_label = "endpoint_port_name" if service else "pod_container_port_name"
    rel.append(
        {
            "action": "keep",
            "source_labels": [f"__meta_kubernetes_{port_label}"],
            "regex": ep["port"],
        }
    )
    if service:
        target = ["__meta_kubernetes_endpoint_address_target_kind",
                  "__meta_kubernetes_endpoint_address_target_name"]  # fmt: skip
        rel += [
            {"source_labels": target, "separator": ";", "regex": "Node;(.*)",
             "replacement": "${1}", "target_label": "node"},
            {"source_labels": target, "separator": ";", "regex": "Pod;(.*)",
             "replacement": "${1}", "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"],
             "target_label": "container"},
            RUNNING,
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job",
             "replacement": "${1}"},
        ]  # fmt: skip
    else:
        rel += [
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"],
             "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{ns}/{name}"},
        ]  # fmt: skip
    rel.append({"target_label": "endpoint", "replacement": ep["port"]})
    rel += [_relabel_config(rc) for rc in ep.get("relabelings", [])]
    job["relabel_configs"] = rel + _sharding()
    return job


# --------------------------------------------------------------------------- discovery
def _labels(prefix: str, labels: dict[str, str]) -> dict[str, str]:
    out = {}
    for k, v in labels.items():
        out[f"{prefix}_label_{_label_name(k)}"] = v
        out[f"{prefix}_labelpresent_{_label_name(k)}"] = "true"
    return out


def discovered(role: str, objects: list[dict], port: int) -> tuple[str, list[dict]]:
    """(the namespace it is in, the targets) that Kubernetes discovery of ``role`` finds
    for the gpumon pod on NODE, with the __meta_ labels it gives them."""
    (ds,) = [d for d in objects if d["kind"] == "DaemonSet"]
    namespace = ds["metadata"]["namespace"]
    template = ds["spec"]["template"]
    (c,) = template["spec"]["containers"]
    (cport,) = c["ports"]
    pod = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": EXPORTER_POD,
        "__meta_kubernetes_pod_ip": EXPORTER_IP,
        "__meta_kubernetes_pod_node_name": NODE,
        "__meta_kubernetes_pod_host_ip": "10.1.0.7",
        "__meta_kubernetes_pod_uid": str(uuid.uuid4()),
        "__meta_kubernetes_pod_ready": "true",
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_controller_kind": "DaemonSet",
        "__meta_kubernetes_pod_controller_name": ds["metadata"]["name"],
        "__meta_kubernetes_pod_container_name": c["name"],
        "__meta_kubernetes_pod_container_image": c["image"],
        "__meta_kubernetes_pod_container_init": "false",
        "__meta_kubernetes_pod_container_port_name": cport["name"],
        "__meta_kubernetes_pod_container_port_number": str(cport["containerPort"]),
        "__meta_kubernetes_pod_container_port_protocol": cport.get("protocol", "TCP"),
        **_labels("__meta_kubernetes_pod", template["metadata"]["labels"]),
    }
    for k, v in template["metadata"].get("annotations", {}).items():
        pod[f"__meta_kubernetes_pod_annotation_{_label_name(k)}"] = v
        pod[f"__meta_kubernetes_pod_annotationpresent_{_label_name(k)}"] = "true"
    address = f"{EXPORTER_IP}:{port}"
    if role == "pod":
        return namespace, [{"targets": [address], "labels": pod}]
    (svc,) = [d for d in objects if d["kind"] == "Service"]
    assert svc["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    targets = []
    for sport in svc["spec"]["ports"]:
        assert sport["targetPort"] == cport["name"]
        labels = {
            **pod,
            "__meta_kubernetes_namespace": svc["metadata"]["namespace"],
            "__meta_kubernetes_endpoints_name": svc["metadata"]["name"],
            "__meta_kubernetes_service_name": svc["metadata"]["name"],
            **_labels("__meta_kubernetes_service", svc["metadata"]["labels"]),
            "__meta_kubernetes_endpoint_port_name": sport["name"],
            "__meta_kubernetes_endpoint_port_protocol": sport.get("protocol", "TCP"),
            "__meta_kubernetes_endpoint_ready": "true",
            "__meta_kubernetes_endpoint_node_name": NODE,
            "__meta_kubernetes_endpoint_address_target_kind": "Pod",
            "__meta_kubernetes_endpoint_address_target_name": EXPORTER_POD,
        }
        targets.append({"targets": [address], "labels": labels})
    return svc["metadata"]["namespace"], targets


def with_file_discovery(job: dict, objects: list[dict], port: int, folder: Path) -> dict:
    """The job with kubernetes_sd replaced by a file of what it would discover."""
    (sd,) = job.pop("kubernetes_sd_configs")
    namespace, targets = discovered(sd["role"], objects, port)
    if namespace not in sd["namespaces"]["names"]:
        targets = []  # the job's discovery does not watch the pod's namespace
    path = folder / f"{re.sub(r'[^a-zA-Z0-9]', '_', job['job_name'])}.json"
    path.write_text(json.dumps(targets))
    return {**job, "scrape_interval": "1s", "file_sd_configs": [{"files": [str(path)]}]}


# --------------------------------------------------------------------------- the pod
def _cgroup2_root() -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


@pytest.fixture
def training_pod() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A process in a pod's container, as the kubelet's cgroups and environment say it:
    (the process, its container id as gpumon labels it)."""
    root = _cgroup2_root()
    if os.geteuid() != 0 or root is None:
        pytest.skip("a pod's cgroup needs root and a cgroup2 mount")
    pod_uid = str(uuid.uuid4())
    cid = secrets.token_hex(32)
    top = root / f"gpumon-test-{secrets.token_hex(4)}"
    leaf = (
        top
        / "kubepods.slice"
        / "kubepods-besteffort.slice"
        / f"kubepods-besteffort-pod{pod_uid.replace('-', '_')}.slice"
        / f"cri-containerd-{cid}.scope"
    )
    try:
        leaf.mkdir(parents=True)
    except OSError as exc:
        shutil.rmtree(top, ignore_errors=True)  # empty cgroup folders only
        pytest.skip(f"cannot create a cgroup under {root}: {exc.strerror}")
    env = dict(os.environ, HOSTNAME=TRAINER_POD, POD_NAMESPACE=TRAINER_NAMESPACE)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
    try:
        (leaf / "cgroup.procs").write_text(f"{proc.pid}\n")
        assert (
            f"-pod{pod_uid.replace('-', '_')}.slice/"
            in Path(f"/proc/{proc.pid}/cgroup").read_text()
        )
        yield proc, cid[:12]
    finally:
        proc.kill()
        proc.wait()
        for d in (leaf, *leaf.parents):
            if d == root:
                break
            for _ in range(50):  # a killed process leaves its cgroup a moment later
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


@pytest.fixture
def slurm_job() -> Iterator[subprocess.Popen[bytes]]:
    env = dict(os.environ, SLURM_JOB_ID=SLURM_JOB)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
    yield p
    p.kill()
    p.wait()


# --------------------------------------------------------------------------- Prometheus
def stored_series(prom: Prometheus, match: str) -> list[dict[str, str]]:
    """Every series Prometheus stored that ``match`` selects, over all time."""
    query = urllib.parse.urlencode({"match[]": match, "start": "0", "end": str(time.time() + 60)})
    url = f"http://127.0.0.1:{prom.port}/api/v1/series?{query}"
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)["data"]


def one(prom: Prometheus, query: str) -> dict[str, str]:
    (series,) = prom.wait_for(query)
    return series["metric"]  # type: ignore[return-value]


def overlay_objects(exe: str, tmp_path: Path, podmonitor: bool) -> list[dict]:
    """The kube-prometheus-stack overlay as rendered, with its PodMonitor line or not."""
    overlay = KUBE / "overlays" / "kube-prometheus-stack"
    if not podmonitor:
        return render(exe, overlay)
    here = tmp_path / "podmonitor-overlay"
    here.mkdir()
    text = (overlay / "kustomization.yaml").read_text()
    text = text.replace("  # - ../../components/podmonitor", "  - ../../components/podmonitor")
    (here / "kustomization.yaml").write_text(
        text.replace("../../", os.path.relpath(KUBE, here) + "/")
    )
    return render(exe, here)


def test_the_operators_scrape_stores_no_series_of_gpumons_own_pod(
    kubectl: str, fake_nvml, tmp_path: Path, daemons, training_pod, slurm_job
) -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML not installed (pip install pyyaml)")
    trainer, container_id = training_pod
    fake_nvml.set(
        Scenario(gpus=[
            FakeGPU(temperature_c=61, processes=[Process(pid=trainer.pid)], gpm_supported=True,
                    ecc_uncorrected=1, ecc_corrected_aggregate=9, nvlink_tx_kbps=4096),
            FakeGPU(temperature_c=62, processes=[Process(pid=slurm_job.pid)], gpm_supported=True),
            FakeGPU(temperature_c=63, gpm_supported=True),
        ])
    )  # fmt: skip
    d = start_daemon(dict(fake_nvml.env, NODE_NAME=NODE), tmp_path, log=False)
    daemons.append(d)
    by_monitor = {
        "ServiceMonitor": overlay_objects(kubectl, tmp_path, podmonitor=False),
        "PodMonitor": overlay_objects(kubectl, tmp_path, podmonitor=True),
    }
    # The control: the ServiceMonitor without the relabeling that drops gpumon's own labels.
    control_objects = json.loads(json.dumps(by_monitor["ServiceMonitor"]))
    (control_monitor,) = [o for o in control_objects if o["kind"] == "ServiceMonitor"]
    (ep,) = control_monitor["spec"]["endpoints"]
    ep["relabelings"] = [r for r in ep["relabelings"] if r.get("action") != "labeldrop"]
    runs = {**by_monitor, "control": control_objects}
    proms: dict[str, Prometheus] = {}
    try:
        for run, objects in runs.items():
            folder = tmp_path / run
            folder.mkdir()
            (monitor,) = [o for o in objects if o["kind"] in ("ServiceMonitor", "PodMonitor")]
            job = with_file_discovery(operator_scrape_config(monitor), objects, d.port, folder)
            rules = []
            for r in (o for o in objects if o["kind"] == "PrometheusRule"):
                path = folder / f"{r['metadata']['name']}.rules.yml"
                path.write_text(yaml.safe_dump(r["spec"]))
                rules.append(path)
            proms[run] = Prometheus(folder, yaml.safe_dump([job]), rules=tuple(rules))

        for run in by_monitor:
            prom = proms[run]
            # The target, as the monitor's relabelings leave it: the node, the job the
            # alerts ask for, the exporter's pod under a name of its own.
            up = one(prom, 'up{job="gpumon"} == 1')
            assert up["node"] == NODE and up["gpumon_pod"] == EXPORTER_POD, (run, up)
            assert not {"pod", "namespace", "container"} & set(up), (run, up)
            # The training pod's labels, kept by honorLabels, and on dcgm-exporter's names.
            info = one(prom, 'gpumon_gpu_job_info{gpu="0"}')
            assert (info.get("pod"), info.get("namespace"), info.get("container")) == (
                TRAINER_POD, TRAINER_NAMESPACE, container_id
            ), (run, info)  # fmt: skip
            temp = one(prom, 'DCGM_FI_DEV_GPU_TEMP{gpu="0", pod!=""}')
            assert (temp["pod"], temp["namespace"]) == (TRAINER_POD, TRAINER_NAMESPACE), temp
            slurm = one(prom, 'DCGM_FI_DEV_GPU_TEMP{gpu="1", hpc_job!=""}')
            assert slurm["hpc_job"] == SLURM_JOB and "pod" not in slurm, (run, slurm)
            free = one(prom, 'DCGM_FI_DEV_GPU_TEMP{gpu="2"}')
            assert not {"pod", "namespace", "container", "hpc_job"} & set(free), (run, free)
            util = one(prom, 'gpumon_gpu_utilization_ratio{gpu="0"}')
            assert "pod" not in util, (run, util)  # a per-GPU series names no pod
            # Nothing stored, then or now, names gpumon's own pod, namespace or container.
            for match in (
                f'{{pod="{EXPORTER_POD}"}}',
                '{namespace="gpumon"}',
                '{container="gpumon"}',
            ):
                assert stored_series(prom, match) == [], (run, match)
            pods = {s["pod"] for s in stored_series(prom, '{pod!=""}')}
            assert pods == {TRAINER_POD}, (run, pods)
            # A dashboard written for dcgm-exporter (Grafana 12239) works here as it does
            # on a plain Prometheus (test_serve_dcgm.py), from the overlay's PrometheusRule.
            prom.wait_for("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")  # a rate: two scrapes
            prom.wait_for("DCGM_FI_PROF_DRAM_ACTIVE")  # GPM: the second hardware read
            check_the_dashboard(prom, {"Hostname": [NODE], "gpu": ["0", "1", "2"]})
        # The control shows the scrape would have stored them: the emulated Operator does
        # attach gpumon's own pod, and the relabeling is what keeps it off.
        control = proms["control"]
        control.wait_for(f'gpumon_gpu_utilization_ratio{{pod="{EXPORTER_POD}"}}')
        assert stored_series(control, '{namespace="gpumon"}')
    finally:
        for prom in proms.values():
            prom.close()
