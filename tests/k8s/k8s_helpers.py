"""Rendering the Kubernetes manifests (k8s/) and reading the rendered objects: shared by the
manifest tests."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "k8s_e2e"))
import compat  # noqa: E402  (the real-cluster script's rendering)

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir()
                  if (p / "kustomization.yaml").is_file())
TARGETS = ["base", *OVERLAYS]
COMBINATIONS = {"local+redis-ha": ("overlays/local", ("components/redis-ha",))}
"""Overlays with a component that no shipped overlay adds, as a user's own overlay would combine
them (a small test cluster with replicated Redis): {name: (overlay, components)}."""
ALL_TARGETS = [*TARGETS, *COMBINATIONS]
REPLICATED_REDIS = {"ha", "local+redis-ha"}
"""Targets with k8s/components/redis-ha: three Redis data nodes and three sentinels."""
KUBERNETES_VERSION = "1.30.0"
CRD_GROUPS = {"keda.sh", "cert-manager.io"}  # custom resources: no schema in kubernetes-validate
ROLES = ("gateway", "drafter", "verifier")
COMPONENT = "app.kubernetes.io/component"
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet"}
POD_KINDS = WORKLOAD_KINDS | {"Job"}
# The listening port of each role's main container, as the services are started.
MAIN_PORTS = {"gateway": 8000, "drafter": 50061, "verifier": 50051, "redis": 6379,
              "redis-sentinel": 26379}
MIN_STARTUP_S = 300
GPU = "nvidia.com/gpu"

NEEDS_KUBECTL = pytest.mark.skipif(
    shutil.which("kubectl") is None,
    reason="kubectl is not on PATH: the manifests are rendered with `kubectl kustomize`")



def kustomize_dir(target: str) -> Path:
    return K8S / target if target == "base" else K8S / "overlays" / target


def render(path: Path) -> list[dict]:
    result = subprocess.run(["kubectl", "kustomize", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {path} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_combination(overlay: str, components: tuple[str, ...]) -> list[dict]:
    """An overlay with more components, as the real-cluster script renders it
    (scripts/k8s_e2e/compat.py: a kustomization in a temporary folder)."""
    return compat.render("+".join((overlay, *components)))


def render_all() -> dict[str, list[dict]]:
    """{target: rendered objects} for the base, every overlay and every combination."""
    out = {target: render(kustomize_dir(target)) for target in TARGETS}
    for name, (overlay, components) in COMBINATIONS.items():
        out[name] = render_combination(overlay, components)
    return out


# ----------------------------------------------------------------------------- helpers


def of_kind(objects: list[dict], *kinds: str) -> list[dict]:
    return [o for o in objects if o["kind"] in kinds]


def named(objects: list[dict], kind: str, name: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def pod_template(obj: dict) -> dict:
    return obj["spec"]["template"]


def containers(obj: dict) -> Iterator[dict]:
    spec = pod_template(obj)["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def role_of(obj: dict) -> str:
    return pod_template(obj)["metadata"]["labels"].get(COMPONENT, "")


def main_container(obj: dict) -> dict:
    role = role_of(obj)
    matches = [c for c in pod_template(obj)["spec"]["containers"] if c["name"] == role]
    assert len(matches) == 1, f"{obj['metadata']['name']}: no container named {role!r}"
    return matches[0]


def arg_value(container: dict, flag: str) -> str | None:
    args = [*container.get("command", []), *container.get("args", [])]
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def selector_matches(selector: dict | None, labels: dict) -> bool:
    """Kubernetes label selector semantics; an empty selector matches everything."""
    selector = selector or {}
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def is_empty_selector(selector: dict | None) -> bool:
    return not (selector or {}).get("matchLabels") and not (selector or {}).get(
        "matchExpressions")


def prestop_sleep_s(container: dict) -> int:
    pre_stop = container.get("lifecycle", {}).get("preStop")
    if not pre_stop:
        return 0
    if "sleep" in pre_stop:
        return int(pre_stop["sleep"]["seconds"])
    command = " ".join(pre_stop.get("exec", {}).get("command", []))
    match = re.search(r"\bsleep\s+(\d+)", command)
    assert match, f"{container['name']}: preStop is not a sleep: {pre_stop}"
    return int(match.group(1))


def probe_window_s(probe: dict) -> int:
    return (probe.get("initialDelaySeconds", 0)
            + probe.get("failureThreshold", 3) * probe.get("periodSeconds", 10))


def image_is_pinned(image: str) -> bool:
    if re.search(r"@sha256:[0-9a-f]{64}$", image):
        return True
    name = image.rsplit("/", 1)[-1]
    if ":" not in name:
        return False
    tag = name.rsplit(":", 1)[1]
    return bool(tag) and tag != "latest"


def resource_names(container: dict) -> set[str]:
    resources = container.get("resources", {})
    return set(resources.get("requests", {})) | set(resources.get("limits", {}))


def cpu_cores(quantity: str | int | float) -> float:
    """A Kubernetes CPU quantity ("250m", "2", 0.5) in cores."""
    text = str(quantity)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def pod_cpu_request(obj: dict) -> float:
    """CPU the scheduler reserves for one pod of a workload: its containers' requests summed,
    or its largest init container's where that is more."""
    spec = pod_template(obj)["spec"]

    def request(container: dict) -> float:
        return cpu_cores(container.get("resources", {}).get("requests", {}).get("cpu", 0))
    running = sum(map(request, spec["containers"]))
    return max([running, *map(request, spec.get("initContainers", []))])


def pod_count(obj: dict) -> int:
    """Pods a workload runs at once (a Job: its parallelism)."""
    return obj["spec"].get("parallelism" if obj["kind"] == "Job" else "replicas", 1)


def peer_is_anywhere(peer: dict) -> bool:
    if "ipBlock" in peer:
        return peer["ipBlock"]["cidr"] in ("0.0.0.0/0", "::/0")
    return ("namespaceSelector" in peer and is_empty_selector(peer["namespaceSelector"])
            and is_empty_selector(peer.get("podSelector")))


def rule_is_open(rule: dict) -> bool:
    peers = rule.get("from", [])
    return not peers or any(peer_is_anywhere(p) for p in peers)


def rule_ports(rule: dict, container_ports: dict[str, int]) -> set[int] | None:
    """Numeric ports a rule opens (named ports resolved); None means every port."""
    if not rule.get("ports"):
        return None
    ports = set()
    for port in rule["ports"]:
        value = port.get("port")
        if value is None:
            return None
        ports.add(container_ports.get(value, value) if isinstance(value, str) else value)
    return ports


def policies_selecting(objects: list[dict], labels: dict) -> list[dict]:
    return [p for p in of_kind(objects, "NetworkPolicy")
            if selector_matches(p["spec"].get("podSelector"), labels)]


def ingress_sources(objects: list[dict], workload: dict, port: int) -> set[str]:
    """Who may reach `port` of the workload's pods: "anywhere", "pod:<component>" (same
    namespace) or "namespace:<name>"."""
    labels = pod_template(workload)["metadata"]["labels"]
    container_ports = {p["name"]: p["containerPort"]
                       for c in containers(workload) for p in c.get("ports", []) if "name" in p}
    pods = [pod_template(w)["metadata"]["labels"] for w in of_kind(objects, *POD_KINDS)]
    sources: set[str] = set()
    for policy in policies_selecting(objects, labels):
        for rule in policy["spec"].get("ingress", []):
            ports = rule_ports(rule, container_ports)
            if ports is not None and port not in ports:
                continue
            if rule_is_open(rule):
                sources.add("anywhere")
                continue
            for peer in rule["from"]:
                if "namespaceSelector" in peer:
                    name = peer["namespaceSelector"].get("matchLabels", {}).get(
                        "kubernetes.io/metadata.name", "?")
                    sources.add(f"namespace:{name}")
                elif "podSelector" in peer:
                    sources |= {f"pod:{pod.get(COMPONENT)}" for pod in pods
                                if selector_matches(peer["podSelector"], pod)}
    return sources


# ----------------------------------------------------------------------------- rendering
