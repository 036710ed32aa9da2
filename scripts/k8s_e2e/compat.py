"""Render an overlay for the test cluster: Kubernetes 1.20 on one node.

The shipped manifests keep current APIs; this writes a test-only copy that 1.20 accepts, with
the same behaviour where 1.20 can express it:
- PodDisruptionBudget policy/v1 -> policy/v1beta1 (without unhealthyPodEvictionPolicy);
- HorizontalPodAutoscaler autoscaling/v2 -> v2beta2 (same fields);
- gRPC probes -> an exec of the same grpc.health.v1 Check (1.20 has no gRPC probe);
- the ``kubernetes.io/metadata.name`` label on Namespaces (set by the API server from 1.21);
- images never pulled (built and imported on the node; Redis from the Debian-based stand-in);
- a required pod anti-affinity (one Redis node per machine) made preferred: one node here;
- a pre-bound hostPath PersistentVolume for every claim (no provisioner).

Usage: python compat.py OVERLAY[+COMPONENT...] VOLUMES_DIR [PERSISTENT_CLAIM...] > out.yaml
(paths relative to k8s/, e.g. ``overlays/local+components/redis-ha``). Claims named after
VOLUMES_DIR are kept under the cache instead (the model volume survives between runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

K8S = Path(__file__).resolve().parents[2] / "k8s"
REDIS_IMAGE = "localhost/cascade-e2e/redis:7-bookworm"
HEALTH_CHECK = ("import grpc,sys;from grpc_health.v1 import health_pb2 as h,health_pb2_grpc as g;"
                "c=grpc.insecure_channel('127.0.0.1:{port}');"
                "r=g.HealthStub(c).Check(h.HealthCheckRequest(service='{service}'),timeout={timeout});"
                "sys.exit(0 if r.status==1 else 1)")


def render(target: str) -> list[dict]:
    overlay, *components = target.split("+")
    with tempfile.TemporaryDirectory() as folder:
        def relative(path: str) -> str:
            return os.path.relpath(K8S / path, folder)
        kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                         "resources": [relative(overlay)],
                         "components": [relative(c) for c in components]}
        (Path(folder) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        out = subprocess.run(["kubectl", "kustomize", folder], capture_output=True, text=True,
                             check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def pod_spec(obj: dict) -> dict | None:
    spec = obj.get("spec", {})
    if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return spec["template"]["spec"]
    return None


def exec_probe(probe: dict) -> None:
    grpc = probe.pop("grpc", None)
    if grpc is None:
        return
    code = HEALTH_CHECK.format(port=grpc["port"], service=grpc.get("service", ""),
                               timeout=max(1, probe.get("timeoutSeconds", 1) - 0.5))
    probe["exec"] = {"command": ["python", "-c", code]}


def adapt_pod(spec: dict) -> None:
    for container in spec.get("initContainers", []) + spec.get("containers", []):
        container["imagePullPolicy"] = "Never"
        if container["image"].startswith("redis:"):
            container["image"] = REDIS_IMAGE
        for name in ("livenessProbe", "readinessProbe", "startupProbe"):
            if name in container:
                exec_probe(container[name])
    anti = spec.get("affinity", {}).get("podAntiAffinity", {})
    required = anti.pop("requiredDuringSchedulingIgnoredDuringExecution", [])
    if required:
        anti.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).extend(
            {"weight": 100, "podAffinityTerm": term} for term in required)


def adapt(obj: dict) -> dict:
    kind = obj["kind"]
    if kind == "PodDisruptionBudget":
        obj["apiVersion"] = "policy/v1beta1"
        obj["spec"].pop("unhealthyPodEvictionPolicy", None)
    elif kind == "HorizontalPodAutoscaler":
        obj["apiVersion"] = "autoscaling/v2beta2"
    elif kind == "Namespace":
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
    spec = pod_spec(obj)
    if spec is not None:
        adapt_pod(spec)
    return obj


def claims(objects: list[dict]) -> list[tuple[str, str, dict]]:
    """(namespace, claim name, claim spec) of every claim, StatefulSets' included."""
    out = []
    for obj in objects:
        ns = obj["metadata"].get("namespace", "default")
        if obj["kind"] == "PersistentVolumeClaim":
            out.append((ns, obj["metadata"]["name"], obj["spec"]))
        elif obj["kind"] == "StatefulSet":
            for template in obj["spec"].get("volumeClaimTemplates", []):
                for i in range(obj["spec"].get("replicas", 1)):
                    name = f"{template['metadata']['name']}-{obj['metadata']['name']}-{i}"
                    out.append((ns, name, template["spec"]))
    return out


def volume(ns: str, name: str, spec: dict, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o777)  # hostPath ignores fsGroup: every pod user may write
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"e2e-{ns}-{name}"},
            "spec": {"capacity": {"storage": spec["resources"]["requests"]["storage"]},
                     "accessModes": spec["accessModes"],
                     "persistentVolumeReclaimPolicy": "Retain",
                     "claimRef": {"namespace": ns, "name": name},
                     "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"}}}


def main(target: str, volumes: str, persistent: list[str]) -> None:
    objects = [adapt(obj) for obj in render(target)]
    cache = Path(os.environ.get("CASCADE_K8S_CACHE", "/var/cache/cascade-k8s")) / "volumes"
    for ns, name, spec in claims(objects):
        folder = (cache if name in persistent else Path(volumes)) / f"{ns}-{name}"
        objects.append(volume(ns, name, spec, folder))
    yaml.safe_dump_all(objects, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
