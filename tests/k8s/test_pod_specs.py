"""Each pod's life cycle and hardening in the rendered manifests: probes on the right ports
with a startup window long enough for a model load, a termination grace period covering preStop
and drain, pinned images, non-root pods with read-only root filesystems, and named ports (of
probes and of Services' targetPorts) that resolve."""

from __future__ import annotations

import pytest

from k8s_helpers import (
    ALL_TARGETS,
    GPU,
    K8S,
    MAIN_PORTS,
    MIN_STARTUP_S,
    NEEDS_KUBECTL,
    POD_KINDS,
    ROLES,
    TARGETS,
    WORKLOAD_KINDS,
    arg_value,
    containers,
    image_is_pinned,
    main_container,
    named,
    of_kind,
    pod_template,
    prestop_sleep_s,
    probe_window_s,
    render,
    role_of,
    selector_matches,
)

pytestmark = NEEDS_KUBECTL


@pytest.mark.parametrize("target", TARGETS)
def test_probes(rendered, target):
    for role in ROLES:
        container = main_container(named(rendered[target], "Deployment", role))
        port = int(arg_value(container, "--port"))
        assert port == MAIN_PORTS[role]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        probed = int(env.get("CASCADE_HEALTH_PORT") or port)  # health alone, beside mutual TLS
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.get(kind)
            assert probe, f"{target} {role}: no {kind}"
            if role == "gateway":
                assert "httpGet" in probe, f"{target} gateway {kind} is not httpGet"
                assert probe["httpGet"]["port"] in (port, "http")
            else:
                assert probe.get("grpc", {}).get("port") == probed, \
                    f"{target} {role} {kind} is not a gRPC probe on {probed}"
        if role == "gateway":
            assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
            assert container["livenessProbe"]["httpGet"]["path"] == "/health"


@pytest.mark.parametrize("target", TARGETS)
def test_startup_probes_allow_slow_model_loads(rendered, target):
    for obj in of_kind(rendered[target], *WORKLOAD_KINDS):
        for container in containers(obj):
            probe = container.get("startupProbe")
            if role_of(obj) in ROLES:
                assert probe, f"{target} {container['name']}: no startupProbe"
            if probe:
                assert probe_window_s(probe) >= MIN_STARTUP_S, \
                    f"{target} {container['name']}: startup window {probe_window_s(probe)} s"


@pytest.mark.parametrize("target", TARGETS)
def test_termination_grace_covers_prestop_and_drain(rendered, target):
    for obj in of_kind(rendered[target], *WORKLOAD_KINDS):
        spec = pod_template(obj)["spec"]
        grace_period = spec.get("terminationGracePeriodSeconds", 30)
        for container in containers(obj):
            sleep = prestop_sleep_s(container)
            drain = float(arg_value(container, "--grace-s") or 0)
            if role_of(obj) in ROLES:
                assert sleep > 0, f"{target} {container['name']}: no preStop sleep"
            assert grace_period >= sleep + drain, (
                f"{target} {obj['metadata']['name']}: terminationGracePeriodSeconds "
                f"{grace_period} < preStop {sleep} + --grace-s {drain}")
    for role in ("gateway", "drafter", "verifier"):
        assert arg_value(main_container(named(rendered[target], "Deployment", role)),
                         "--grace-s") is not None


@pytest.mark.parametrize("target", TARGETS)
def test_images_are_pinned(rendered, target):
    for obj in of_kind(rendered[target], *POD_KINDS):
        for container in containers(obj):
            assert image_is_pinned(container["image"]), \
                f"{target} {container['name']}: image {container['image']!r} is not pinned"


@pytest.mark.parametrize("target", TARGETS)
def test_pods_run_as_non_root(rendered, target):
    for obj in of_kind(rendered[target], *POD_KINDS):
        spec = pod_template(obj)["spec"]
        pod_level = spec.get("securityContext", {}).get("runAsNonRoot") is True
        for container in containers(obj):
            context = container.get("securityContext", {})
            where = f"{target} {obj['metadata']['name']}/{container['name']}"
            assert pod_level or context.get("runAsNonRoot") is True, f"{where}: may run as root"
            assert context.get("allowPrivilegeEscalation") is False, where
            assert context.get("readOnlyRootFilesystem") is True, where
            mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
            assert "/tmp" in mounts, f"{where}: read-only root needs a writable /tmp"


def declared_port_names(container: dict) -> set[str]:
    return {p["name"] for p in container.get("ports", []) if "name" in p}


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_probe_ports_are_declared(rendered, target):
    """A probe that names a port names one its own container declares: an unknown name fails
    the probe (the pod never turns ready, or is restarted), and nothing before the cluster
    says so."""
    for workload in of_kind(rendered[target], *POD_KINDS):
        for container in containers(workload):
            declared = declared_port_names(container)
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = container.get(kind, {})
                for action in ("httpGet", "tcpSocket", "grpc"):
                    port = probe.get(action, {}).get("port")
                    assert not isinstance(port, str) or port in declared, (
                        f"{target} {workload['metadata']['name']}/{container['name']} "
                        f"{kind}: port {port!r} is not one of {sorted(declared)}")


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_service_target_ports_resolve(rendered, target):
    """Every Service with a selector selects pods (selector labels within the pod template's
    labels), and a targetPort that names a port names one a container of every selected pod
    declares: otherwise the Service has no endpoints."""
    objects = rendered[target]
    workloads = of_kind(objects, *POD_KINDS)
    for service in of_kind(objects, "Service"):
        selector = service["spec"].get("selector")
        if not selector:  # endpoints managed by hand (or ExternalName): nothing to resolve
            continue
        where = f"{target} Service {service['metadata']['name']}"
        selected = [w for w in workloads
                    if selector_matches({"matchLabels": selector},
                                        pod_template(w)["metadata"]["labels"])]
        assert selected, f"{where}: selector {selector} matches no pod template"
        for workload in selected:
            declared = set().union(*map(declared_port_names, containers(workload)))
            for port in service["spec"].get("ports", []):
                target_port = port.get("targetPort")
                assert not isinstance(target_port, str) or target_port in declared, (
                    f"{where}: targetPort {target_port!r} is not a port of "
                    f"{workload['metadata']['name']} ({sorted(declared)})")


def _verifier_ranks(objects: list[dict]) -> tuple[str, str, str]:
    """(GPU request, GPU limit, CASCADE_TENSOR_PARALLEL) of the verifier's container."""
    container = main_container(named(objects, "Deployment", "verifier"))
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    resources = container["resources"]
    return (resources["requests"][GPU], resources["limits"][GPU],
            env["CASCADE_TENSOR_PARALLEL"])


@pytest.mark.parametrize("count", ["1", "4"])
def test_the_verifiers_gpus_are_its_tensor_parallel_ranks(count, tmp_path):
    """One value in the GPU overlay sets the pod's GPU request, limit and ranks (a copy of
    the overlay beside it, with the count changed)."""
    import shutil

    copy = K8S / "overlays" / f".gpu-{count}-{tmp_path.name}"
    shutil.copytree(K8S / "overlays" / "gpu", copy)
    try:
        kustomization = copy / "kustomization.yaml"
        text = kustomization.read_text()
        assert "      - count=1" in text
        kustomization.write_text(text.replace("      - count=1", f"      - count={count}"))
        assert _verifier_ranks(render(copy)) == (count, count, count)
    finally:
        shutil.rmtree(copy)
