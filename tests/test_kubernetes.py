"""deploy/kubernetes: every kustomization renders with `kubectl kustomize`, and what it
renders passes `kubernetes-validate --strict`; the objects agree with each other, with the
image and with the files the other tests check (rules, dashboard, gpumon.toml).

kubernetes-validate has no schemas for the Prometheus Operator's kinds: the
PrometheusRule's rules go through `promtool check rules` instead, and the ServiceMonitor is
checked against the Service it must select.

The PrometheusRule and the dashboard ConfigMap's JSON are copies (kustomize reads no file
outside a kustomization's folder); `python3 tests/test_kubernetes.py --write` makes them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KUBE = REPO / "deploy" / "kubernetes"
RULES = REPO / "deploy" / "prometheus" / "gpumon-rules.yml"
REPORT_RULES = REPO / "deploy" / "prometheus" / "gpumon-report-rules.yml"
DCGM_RULES = REPO / "deploy" / "prometheus" / "gpumon-dcgm-rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "gpumon-dashboard.json"
RULE_COPY = KUBE / "components" / "prometheus-operator" / "prometheusrule.yaml"
DCGM_RULE_COPY = KUBE / "components" / "dcgm-exporter-names" / "prometheusrule.yaml"
DASHBOARD_COPY = KUBE / "components" / "grafana-dashboard" / "gpumon-dashboard.json"
DOCS = REPO / "docs" / "kubernetes.md"
OVERLAYS = ("base", "overlays/kube-prometheus-stack", "overlays/secured")
COMPONENTS = sorted(p.name for p in (KUBE / "components").iterdir())
NAMESPACE = "gpumon"
# Kinds that live in no namespace (the Namespace itself).
CLUSTER_SCOPED = {"Namespace"}
# The oldest Kubernetes still maintained by major distributions, and the newest schemas.
KUBE_VERSIONS = ("1.29.0", None)
# Each generated PrometheusRule: its name, and the rules files whose groups it holds.
PROMETHEUS_RULES = {
    RULE_COPY: ("gpumon", (RULES, REPORT_RULES)),
    DCGM_RULE_COPY: ("gpumon-dcgm", (DCGM_RULES,)),
}


def prometheus_rule_text(name: str, files: tuple[Path, ...]) -> str:
    """A PrometheusRule: the first rules file as its spec, indented (block YAML nests as
    is); the other files' groups follow under the same ``groups:``."""
    first, *rest = files
    rules = first.read_text() + "".join(f.read_text().split("\ngroups:\n", 1)[1] for f in rest)
    body = "".join(("  " + ln if ln.strip() else ln) for ln in rules.splitlines(keepends=True))
    sources = " and ".join(f.name for f in files)
    return (
        f"# GENERATED from deploy/prometheus/{sources} (python3\n"
        "# tests/test_kubernetes.py --write); edit the rules there, not this copy.\n"
        "# tests/test_kubernetes.py checks they agree.\n"
        "apiVersion: monitoring.coreos.com/v1\n"
        "kind: PrometheusRule\n"
        "metadata:\n"
        f"  name: {name}\n"
        f"  namespace: {NAMESPACE}\n"
        "  labels:\n"
        "    app.kubernetes.io/name: gpumon\n"
        "spec:\n" + body
    )


def write_copies() -> None:
    for copy, (name, files) in PROMETHEUS_RULES.items():
        copy.write_text(prometheus_rule_text(name, files))
    shutil.copyfile(DASHBOARD, DASHBOARD_COPY)


# --------------------------------------------------------------------------- tools
@pytest.fixture(scope="module")
def kubectl() -> str:
    exe = shutil.which("kubectl")
    if exe is None:
        pytest.skip("kubectl not installed (apt-get install kubernetes-client)")
    res = subprocess.run(
        [exe, "version", "--client", "-o", "json"], capture_output=True, text=True, check=False
    )
    version = json.loads(res.stdout or "{}").get("kustomizeVersion", "")
    m = re.match(r"v(\d+)\.", version)
    if not m or int(m.group(1)) < 4:
        pytest.skip(f"kubectl's kustomize {version or '(unknown)'} has no components (needs v4+)")
    return exe


def yaml_module():  # type: ignore[no-untyped-def]
    return pytest.importorskip("yaml", reason="PyYAML not installed (pip install pyyaml)")


def render(kubectl: str, path: Path) -> list[dict]:
    res = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return [d for d in yaml_module().safe_load_all(res.stdout) if d]


def by_kind(docs: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for d in docs:
        assert d["kind"] not in out, f"two {d['kind']} objects"
        out[d["kind"]] = d
    return out


@pytest.fixture(scope="module")
def rendered(kubectl: str) -> dict[str, list[dict]]:
    return {name: render(kubectl, KUBE / name) for name in OVERLAYS}


# --------------------------------------------------------------------------- validation
def validate_strict(docs: list[dict], version: str | None) -> list[str]:
    """kubernetes-validate --strict on each object; the kinds it has no schema for, apart."""
    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate not installed (pip install it)"
    )
    version = version or kv.latest_version()
    unknown = []
    for d in docs:
        try:
            kv.validate(d, version, strict=True)
        except kv.SchemaNotFoundError:
            unknown.append(d["kind"])
        except kv.ValidationError as exc:
            pytest.fail(f"{d['kind']}/{d['metadata']['name']} against {version}: {exc.message}")
    return unknown


@pytest.mark.parametrize("version", KUBE_VERSIONS, ids=lambda v: v or "latest")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_renders_and_validates_strictly(
    rendered: dict[str, list[dict]], overlay: str, version: str | None
) -> None:
    unknown = validate_strict(rendered[overlay], version)
    assert set(unknown) <= {"ServiceMonitor", "PrometheusRule"}, unknown


def outside_gpumons_namespace(docs: list[dict]) -> list[str]:
    """The namespaced objects that ``kubectl apply -k`` would put anywhere but gpumon's."""
    return [
        f"{d['kind']}/{d['metadata']['name']} in {d['metadata'].get('namespace')!r}"
        for d in docs
        if d["kind"] not in CLUSTER_SCOPED and d["metadata"].get("namespace") != NAMESPACE
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_in_gpumons_namespace(
    rendered: dict[str, list[dict]], overlay: str
) -> None:
    """With no namespace, `kubectl apply -k` puts an object in the current one (usually
    default), where a ServiceMonitor selects no Service and finds no scrape Secret."""
    docs = rendered[overlay]
    assert not outside_gpumons_namespace(docs), outside_gpumons_namespace(docs)
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"] == [NAMESPACE]


def test_the_cli_agrees(kubectl: str, tmp_path: Path) -> None:
    """The same check as its own command line would make it, on the whole secured render."""
    exe = shutil.which("kubernetes-validate")
    if exe is None:
        pytest.skip("kubernetes-validate not installed (pip install kubernetes-validate)")
    out = tmp_path / "secured.yaml"
    res = subprocess.run(
        [kubectl, "kustomize", str(KUBE / "overlays/secured")],
        capture_output=True,
        text=True,
        check=True,
    )
    out.write_text(res.stdout)
    res = subprocess.run(
        [exe, "--strict", "--quiet", "--no-warn", str(out)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_component_renders_alone_on_the_base(
    kubectl: str, tmp_path: Path, component: str
) -> None:
    """Users pick components: each must work without the others (save what it patches)."""
    patches_the_monitor = component.startswith("scrape-") or component == "podmonitor"
    needs = ["prometheus-operator"] if patches_the_monitor else []
    parts = [*needs, component] if component not in needs else needs
    here = tmp_path / "overlay"
    here.mkdir()

    def rel(p: Path) -> str:  # kustomize takes no absolute paths
        return os.path.relpath(p, here)

    (here / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{rel(KUBE / 'base')}]\n"
        f"components: [{', '.join(rel(KUBE / 'components' / p) for p in parts)}]\n"
    )
    docs = render(kubectl, here)
    validate_strict(docs, None)
    # In gpumon's namespace on their own: an overlay of the user's need not say it.
    assert not outside_gpumons_namespace(docs), outside_gpumons_namespace(docs)


# --------------------------------------------------------------------------- contents
def test_generated_copies_are_current() -> None:
    for copy, (name, files) in PROMETHEUS_RULES.items():
        assert copy.read_text() == prometheus_rule_text(name, files), (
            f"{copy.name}: run tests/test_kubernetes.py --write"
        )
    assert DASHBOARD_COPY.read_bytes() == DASHBOARD.read_bytes(), (
        "run tests/test_kubernetes.py --write"
    )


def test_daemonset_runs_on_gpu_nodes_takes_no_gpu_and_is_scraped(
    rendered: dict[str, list[dict]],
) -> None:
    from gpumon.faces.serve.config import parse
    from gpumon.sample.podresources import SOCKET

    docs = by_kind(rendered["base"])
    assert set(docs) == {"Namespace", "ConfigMap", "DaemonSet", "Service"}
    assert {d["metadata"].get("namespace") for k, d in docs.items() if k != "Namespace"} == {
        docs["Namespace"]["metadata"]["name"]
    }
    pod = docs["DaemonSet"]["spec"]["template"]
    spec = pod["spec"]
    assert spec["hostPID"] is True  # NVML's pids are the host's
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    (c,) = spec["containers"]
    assert c["image"] == "ghcr.io/gpumon/gpumon-why:0.1.0"
    assert "nvidia.com/gpu" not in json.dumps(c.get("resources", {}))
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    port = c["ports"][0]["containerPort"]
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) == port
    assert c["readinessProbe"]["httpGet"]["path"] == "/-/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    # The config the pod reads is the generated ConfigMap's, and it listens where declared.
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert volumes["config"]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    assert f"{mounts['config']}/gpumon.toml" == c["args"][c["args"].index("--config") + 1]
    cfg = parse(docs["ConfigMap"]["data"]["gpumon.toml"], "configmap")
    assert cfg.port == port and cfg.address == "0.0.0.0"
    assert "kubernetes" in cfg.job_sources
    # The kubelet's socket is where the job-label reader looks for it.
    assert f"{mounts['pod-resources']}/kubelet.sock" == SOCKET
    assert volumes["pod-resources"]["hostPath"] == {
        "path": mounts["pod-resources"],
        "type": "DirectoryOrCreate",  # a node without the socket still runs gpumon
    }
    svc = docs["Service"]["spec"]
    assert svc["clusterIP"] == "None"
    assert svc["selector"].items() <= pod["metadata"]["labels"].items()


def test_kube_prometheus_stack_finds_monitor_rules_and_dashboard(
    rendered: dict[str, list[dict]], tmp_path: Path
) -> None:
    docs = rendered["overlays/kube-prometheus-stack"]
    kinds = [d["kind"] for d in docs]
    assert sorted(kinds) == sorted(
        ["Namespace", "ConfigMap", "ConfigMap", "DaemonSet", "Service", "ServiceMonitor",
         "PrometheusRule", "PrometheusRule"]
    )  # fmt: skip
    objs = {d["kind"]: d for d in docs if d["kind"] not in ("ConfigMap", "PrometheusRule")}
    rules = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PrometheusRule"}
    for obj in [objs["ServiceMonitor"], *rules.values()]:
        # kube-prometheus-stack's default serviceMonitorSelector and ruleSelector.
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    mon = objs["ServiceMonitor"]["spec"]
    svc = objs["Service"]
    assert mon["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert mon["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert mon["endpoints"][0]["honorLabels"] is True
    # No namespaceSelector: the monitor selects Services in its own namespace, the Service's.
    assert "namespaceSelector" not in mon
    assert objs["ServiceMonitor"]["metadata"]["namespace"] == svc["metadata"]["namespace"]
    # Each rule's spec is the rules files the promtool tests check, and promtool takes it.
    yaml = yaml_module()
    assert set(rules) == {name for name, _ in PROMETHEUS_RULES.values()}
    for name, files in PROMETHEUS_RULES.values():
        groups = [g for f in files for g in yaml.safe_load(f.read_text())["groups"]]
        assert rules[name]["spec"] == {"groups": groups}, name
        promtool = shutil.which("promtool")
        if promtool:
            spec = tmp_path / f"{name}.yml"
            spec.write_text(yaml.safe_dump(rules[name]["spec"]))
            res = subprocess.run(
                [promtool, "check", "rules", str(spec)], capture_output=True, text=True
            )
            assert res.returncode == 0, res.stdout + res.stderr
    (dash,) = [d for d in docs if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]]
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dash["data"]["gpumon-dashboard.json"]) == json.loads(DASHBOARD.read_text())


def test_the_dcgm_names_answer_every_query_of_a_dcgm_dashboard() -> None:
    """The PrometheusRule records every DCGM_* series the dcgm-exporter dashboard queries
    (tests/test_serve_dcgm.py checks them against a real Prometheus with the same file)."""
    yaml = yaml_module()
    spec = yaml.safe_load(DCGM_RULE_COPY.read_text())["spec"]
    recorded = {r["record"] for g in spec["groups"] for r in g["rules"] if "record" in r}
    queries = json.loads((REPO / "tests" / "data" / "dcgm" / "dashboard-queries.json").read_text())
    used = {m for q in queries["queries"] for m in re.findall(r"DCGM_FI_\w+", q["expr"])}
    assert used and used <= recorded, sorted(used - recorded)


def test_a_podmonitor_can_take_the_servicemonitors_place(kubectl: str, tmp_path: Path) -> None:
    """kube-prometheus-stack with its podmonitor line uncommented: the pods are scraped by a
    PodMonitor, found by the same release label, and by it alone (no ServiceMonitor)."""
    overlay = KUBE / "overlays" / "kube-prometheus-stack"
    text = (overlay / "kustomization.yaml").read_text()
    commented = "  # - ../../components/podmonitor"
    assert commented in text
    here = tmp_path / "overlay"
    here.mkdir()
    kube = os.path.relpath(KUBE, here)
    text = text.replace(commented, "  - ../../components/podmonitor").replace("../../", kube + "/")
    (here / "kustomization.yaml").write_text(text)
    docs = render(kubectl, here)
    unknown = validate_strict(docs, None)
    assert set(unknown) == {"PodMonitor", "PrometheusRule"}, unknown
    objs = {d["kind"]: d for d in docs if d["kind"] != "ConfigMap"}
    assert "ServiceMonitor" not in objs
    assert not outside_gpumons_namespace(docs), outside_gpumons_namespace(docs)
    assert objs["PodMonitor"]["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    mon = objs["PodMonitor"]["spec"]
    pod = objs["DaemonSet"]["spec"]["template"]
    assert mon["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (c,) = pod["spec"]["containers"]
    (ep,) = mon["podMetricsEndpoints"]
    assert ep["port"] in {p["name"] for p in c["ports"]}
    assert ep["honorLabels"] is True
    # The same target labels as the ServiceMonitor gives (the alerts read job="gpumon").
    yaml = yaml_module()
    service_monitor = yaml.safe_load(
        (KUBE / "components" / "prometheus-operator" / "servicemonitor.yaml").read_text()
    )
    assert ep["relabelings"] == service_monitor["spec"]["endpoints"][0]["relabelings"]


def docs_overlays() -> dict[str, str]:
    """The overlays of one's own that docs/kubernetes.md shows (its YAML blocks opening
    with ``# my-gpumon/kustomization.yaml``), by that first line."""
    blocks = re.findall(r"^( *)```yaml\n(.*?)^\1```", DOCS.read_text(), re.M | re.S)
    texts = [textwrap.dedent(body) for _, body in blocks]
    return {
        text.splitlines()[0]: text
        for text in texts
        if text.startswith("# my-gpumon/kustomization.yaml")
    }


DOCS_OVERLAYS = docs_overlays()


@pytest.mark.parametrize("first_line", sorted(DOCS_OVERLAYS))
def test_the_overlays_the_docs_show_render(kubectl: str, tmp_path: Path, first_line: str) -> None:
    """Where `gpumon deploy ./gpumon-deploy` wrote deploy/, as the docs have it."""
    here = tmp_path / "my-gpumon"
    here.mkdir()
    text = DOCS_OVERLAYS[first_line]
    assert "../gpumon-deploy/kubernetes/" in text
    (here / "kustomization.yaml").write_text(
        text.replace("../gpumon-deploy/kubernetes/", os.path.relpath(KUBE, here) + "/")
    )
    docs = render(kubectl, here)
    validate_strict(docs, None)
    assert not outside_gpumons_namespace(docs), outside_gpumons_namespace(docs)


def test_the_kubelets_root_is_one_patch_away(kubectl: str, tmp_path: Path) -> None:
    """The docs' patch moves the host folder of the kubelet's socket; gpumon still finds
    it where it looks, and a node without it still starts the pod (DirectoryOrCreate)."""
    from gpumon.sample.podresources import SOCKET

    (first_line,) = [line for line, text in DOCS_OVERLAYS.items() if "pod-resources" in text]
    here = tmp_path / "my-gpumon"
    here.mkdir()
    text = DOCS_OVERLAYS[first_line]
    (here / "kustomization.yaml").write_text(
        text.replace("../gpumon-deploy/kubernetes/", os.path.relpath(KUBE, here) + "/")
    )
    (ds,) = [d for d in render(kubectl, here) if d["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    wanted = re.search(r"hostPath: \{path: (\S+)\}", text)
    assert wanted is not None
    assert volumes["pod-resources"]["hostPath"] == {
        "path": wanted.group(1),
        "type": "DirectoryOrCreate",
    }
    (c,) = spec["containers"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert f"{mounts['pod-resources']['mountPath']}/kubelet.sock" == SOCKET
    assert {"config", "log", "pod-resources"} <= set(volumes)  # the patch replaced none


def test_secured_serves_tls_and_basic_auth_from_the_web_config(
    rendered: dict[str, list[dict]],
) -> None:
    several = ("ConfigMap", "PrometheusRule")
    docs = by_kind([d for d in rendered["overlays/secured"] if d["kind"] not in several])
    spec = docs["DaemonSet"]["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    flag = next(a for a in c["args"] if a.startswith("--web.config.file="))
    path = Path(flag.split("=", 1)[1])
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert str(path.parent) == mounts["web-config"]["mountPath"]
    assert mounts["web-config"]["readOnly"] is True
    secret = {v["name"]: v for v in spec["volumes"]}["web-config"]["secret"]
    assert secret["secretName"] == "gpumon-web-config"
    # The kubelet has no password nor client certificate: its probes only connect.
    assert set(c["readinessProbe"]) >= {"tcpSocket"} and set(c["livenessProbe"]) >= {"tcpSocket"}
    ep = docs["ServiceMonitor"]["spec"]["endpoints"][0]
    assert ep["scheme"] == "https"
    assert ep["tlsConfig"]["ca"]["secret"]["name"] == "gpumon-scrape-tls"
    assert ep["basicAuth"]["password"] == {"name": "gpumon-scrape-auth", "key": "password"}


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python3 tests/test_kubernetes.py --write")
    write_copies()
