"""NetworkPolicy coverage, the allowed traffic graph and the Services of the Kubernetes manifests."""

from __future__ import annotations

import pytest

from k8s_helpers import (
    REPLICATED_REDIS,
    MAIN_PORTS,
    NEEDS_KUBECTL,
    POD_KINDS,
    TARGETS,
    WORKLOAD_KINDS,
    ingress_sources,
    is_empty_selector,
    named,
    of_kind,
    pod_template,
    policies_selecting,
    role_of,
    rule_is_open,
    rule_ports,
    selector_matches,
)

pytestmark = NEEDS_KUBECTL


@pytest.mark.parametrize("target", TARGETS)
def test_default_deny_ingress(rendered, target):
    policies = of_kind(rendered[target], "NetworkPolicy")
    assert any(is_empty_selector(p["spec"]["podSelector"])
               and "Ingress" in p["spec"].get("policyTypes", [])
               and not p["spec"].get("ingress") for p in policies), "no default-deny ingress"


@pytest.mark.parametrize("target", TARGETS)
def test_every_workload_has_its_own_network_policy(rendered, target):
    objects = rendered[target]
    for workload in of_kind(objects, *WORKLOAD_KINDS):
        labels = pod_template(workload)["metadata"]["labels"]
        own = [p for p in policies_selecting(objects, labels)
               if not is_empty_selector(p["spec"]["podSelector"])]
        assert own, f"{target} {workload['metadata']['name']}: no NetworkPolicy selects it"


@pytest.mark.parametrize("target", TARGETS)
def test_only_the_gateway_is_open_to_everyone(rendered, target):
    objects = rendered[target]
    for workload in of_kind(objects, *POD_KINDS):
        labels = pod_template(workload)["metadata"]["labels"]
        open_rules = [r for p in policies_selecting(objects, labels)
                      for r in p["spec"].get("ingress", []) if rule_is_open(r)]
        if role_of(workload) == "gateway":
            assert open_rules
            for rule in open_rules:
                assert rule_ports(rule, {}) == {8000, 50050}, rule
        else:
            assert not open_rules, f"{target} {workload['metadata']['name']} is open to all"


@pytest.mark.parametrize("target", TARGETS)
def test_traffic_graph(rendered, target):
    objects = rendered[target]

    def workload(role: str) -> dict:
        return next(w for w in of_kind(objects, *WORKLOAD_KINDS) if role_of(w) == role)

    monitoring = "namespace:monitoring"
    assert ingress_sources(objects, workload("gateway"), 8000) == {"anywhere"}
    assert ingress_sources(objects, workload("gateway"), 50050) == {"anywhere"}
    assert ingress_sources(objects, workload("drafter"), 50061) == {"pod:gateway"}
    assert ingress_sources(objects, workload("verifier"), 50051) == {"pod:gateway",
                                                                    "pod:drafter"}
    services = {"pod:gateway", "pod:drafter", "pod:verifier"}
    if target in REPLICATED_REDIS:  # data nodes replicate from each other, sentinels watch them
        redis_set = {"pod:redis", "pod:redis-sentinel"}
        assert ingress_sources(objects, workload("redis"), 6379) == services | redis_set
        assert ingress_sources(objects, workload("redis-sentinel"), 26379) == \
            services | redis_set
        assert ingress_sources(objects, workload("redis-sentinel"), 6379) == set()
    else:
        assert ingress_sources(objects, workload("redis"), 6379) == services
    for role in ("drafter", "verifier"):
        assert ingress_sources(objects, workload(role), 9090) == {monitoring}
    assert ingress_sources(objects, workload("redis"), 9090) == set()


@pytest.mark.parametrize("target", TARGETS)
def test_services(rendered, target):
    objects = rendered[target]
    pods = [pod_template(w)["metadata"]["labels"] for w in of_kind(objects, *WORKLOAD_KINDS)]
    for service in of_kind(objects, "Service"):
        assert any(selector_matches({"matchLabels": service["spec"]["selector"]}, labels)
                   for labels in pods), f"Service {service['metadata']['name']} selects nothing"
    for role in ("drafter", "verifier"):
        service = named(objects, "Service", f"{role}-headless")
        assert service["spec"]["clusterIP"] == "None"
        grpc = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
        assert grpc and grpc[0]["port"] == MAIN_PORTS[role]
    gateway = named(objects, "Service", "gateway")
    assert gateway["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert {p["port"] for p in gateway["spec"]["ports"]} == {8000, 50050}
    if target in REPLICATED_REDIS:  # clients go through the sentinels: no one-address Service
        assert not [o for o in of_kind(objects, "Service") if o["metadata"]["name"] == "redis"]
        sentinels = named(objects, "Service", "redis-sentinel-headless")
        assert [p["port"] for p in sentinels["spec"]["ports"]] == [26379]
        assert sentinels["spec"]["clusterIP"] == "None"
    else:
        redis = named(objects, "Service", "redis")
        assert [p["port"] for p in redis["spec"]["ports"]] == [6379]
    ingress = named(objects, "Ingress", "gateway")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"] \
        == "off"
