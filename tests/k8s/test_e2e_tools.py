"""The real-cluster script's helpers (scripts/k8s_e2e), without a cluster: the 1.20
compatibility rendering and the NetworkPolicy judgement of observed flows."""

from __future__ import annotations

import pytest

from k8s_helpers import NEEDS_KUBECTL, compat

import flows  # noqa: E402  (k8s_helpers puts scripts/k8s_e2e on the path)


@NEEDS_KUBECTL
@pytest.mark.parametrize("target", ["overlays/local", "overlays/local+components/redis-ha"])
def test_the_compatibility_rendering_speaks_kubernetes_1_20(target, tmp_path, monkeypatch):
    monkeypatch.setenv("CASCADE_K8S_CACHE", str(tmp_path / "cache"))
    objects = [compat.adapt(o) for o in compat.render(target)]
    pdbs = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert pdbs and all(o["apiVersion"] == "policy/v1beta1" for o in pdbs)
    assert not any("unhealthyPodEvictionPolicy" in o["spec"] for o in pdbs)
    namespace = next(o for o in objects if o["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["kubernetes.io/metadata.name"] == "cascade"
    for obj in objects:
        spec = compat.pod_spec(obj)
        if spec is None:
            continue
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in \
            spec.get("affinity", {}).get("podAntiAffinity", {})
        for container in spec["containers"]:
            assert container["imagePullPolicy"] == "Never"
            assert not container["image"].startswith("redis:")
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                assert "grpc" not in container.get(probe, {}), (obj["metadata"]["name"], probe)


def test_a_grpc_probe_becomes_the_same_health_check_run_in_the_container():
    probe = {"grpc": {"port": 50061}, "timeoutSeconds": 3, "periodSeconds": 5}
    compat.exec_probe(probe)
    command = probe["exec"]["command"]
    assert command[:2] == ["python", "-c"] and "127.0.0.1:50061" in command[2]
    assert "grpc" not in probe and probe["periodSeconds"] == 5
    compile(command[2], "probe", "exec")  # the generated program parses


def test_every_claim_gets_a_pre_bound_volume_statefulset_templates_included(tmp_path):
    objects = [{"kind": "PersistentVolumeClaim", "metadata": {"name": "models", "namespace": "ns"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}}},
               {"kind": "StatefulSet", "metadata": {"name": "redis", "namespace": "ns"},
                "spec": {"replicas": 3, "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}}]
    names = [name for _, name, _ in compat.claims(objects)]
    assert names == ["models", "data-redis-0", "data-redis-1", "data-redis-2"]
    pv = compat.volume("ns", "data-redis-1", objects[1]["spec"]["volumeClaimTemplates"][0]["spec"],
                       tmp_path / "v")
    assert pv["spec"]["claimRef"] == {"namespace": "ns", "name": "data-redis-1"}
    assert (tmp_path / "v").is_dir()


class Watch(flows.FlowWatch):
    def __init__(self, pods: dict[str, dict]) -> None:
        super().__init__()
        self.pods = {f"10.88.0.{i + 2}": {"metadata": {"name": name, "labels": labels},
                                          "spec": {"containers": [{"ports": [
                                              {"name": "grpc", "containerPort": 50061}]}]}}
                     for i, (name, labels) in enumerate(pods.items())}


def labels(component: str) -> dict:
    return {"app.kubernetes.io/name": "cascade", "app.kubernetes.io/component": component}


POLICIES = [
    {"metadata": {"name": "deny"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}},
    {"metadata": {"name": "drafter"}, "spec": {
        "podSelector": {"matchLabels": labels("drafter")}, "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {"matchLabels": labels("gateway")}}],
                     "ports": [{"port": "grpc", "protocol": "TCP"}]}]}},
    {"metadata": {"name": "redis"}, "spec": {
        "podSelector": {"matchLabels": labels("redis")}, "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {"matchExpressions": [
            {"key": "app.kubernetes.io/component", "operator": "In", "values": ["gateway", "drafter"]}]}}],
            "ports": [{"port": 6379}]}]}},
]


def test_flows_are_judged_by_the_policies_that_select_their_destination():
    watch = Watch({"gw": labels("gateway"), "dr": labels("drafter"), "ve": labels("verifier"),
                   "rd": labels("redis")})
    assert flows.allowed(flows.Flow("gw", "dr", 50061), POLICIES, watch) == "drafter"  # named port
    assert flows.allowed(flows.Flow("dr", "rd", 6379), POLICIES, watch) == "redis"
    assert flows.allowed(flows.Flow("ve", "rd", 6379), POLICIES, watch) is None  # not in the list
    assert flows.allowed(flows.Flow("gw", "dr", 9090), POLICIES, watch) is None  # other port
    assert flows.allowed(flows.Flow("gw", "ve", 50051), POLICIES, watch) is None  # only deny-all
    assert flows.allowed(flows.Flow("gw", "ve", 50051), POLICIES[1:], watch) == "no policy"
