"""The Kubernetes manifests (k8s/): every kustomization renders with `kubectl kustomize`,
validates strictly against the Kubernetes 1.30 API schemas, and keeps the deployment's rules:
resources on every container, gRPC/HTTP probes with a long enough startup window, drain timing
(terminationGracePeriodSeconds >= preStop sleep + --grace-s), pinned images, GPUs only on the
verifier of the gpu overlay, NetworkPolicy coverage and the allowed traffic graph, PDBs,
autoscalers (HPA, or KEDA in the gpu overlay) and non-root pods."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir()
                  if (p / "kustomization.yaml").is_file())
TARGETS = ["base", *OVERLAYS]
KUBERNETES_VERSION = "1.30.0"
CRD_GROUPS = {"keda.sh"}  # custom resources: no schema in kubernetes-validate
ROLES = ("gateway", "drafter", "verifier")
COMPONENT = "app.kubernetes.io/component"
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet"}
POD_KINDS = WORKLOAD_KINDS | {"Job"}
# The listening port of each role's main container, as the services are started.
MAIN_PORTS = {"gateway": 8000, "drafter": 50061, "verifier": 50051, "redis": 6379}
MIN_STARTUP_S = 300
GPU = "nvidia.com/gpu"

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None,
    reason="kubectl is not on PATH: the manifests are rendered with `kubectl kustomize`")


def kustomize_dir(target: str) -> Path:
    return K8S / target if target == "base" else K8S / "overlays" / target


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    """{target: rendered objects} for the base and every overlay."""
    out = {}
    for target in TARGETS:
        result = subprocess.run(["kubectl", "kustomize", str(kustomize_dir(target))],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"kubectl kustomize {target} failed:\n{result.stderr}"
        out[target] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
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


def test_overlays_exist():
    assert {"local", "gpu"} <= set(OVERLAYS)


@pytest.mark.parametrize("target", TARGETS)
def test_renders_and_validates_strictly(rendered, target):
    import kubernetes_validate
    from kubernetes_validate import SchemaNotFoundError

    objects = rendered[target]
    assert objects, f"{target} rendered nothing"
    errors = []
    for obj in objects:
        kind_name = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except SchemaNotFoundError:
            if obj["apiVersion"].split("/")[0] not in CRD_GROUPS:
                errors.append(f"{kind_name}: no schema for {obj['apiVersion']}")
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{kind_name}: {exc.message} at {'.'.join(map(str, exc.path))}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("target", TARGETS)
def test_everything_in_the_cascade_namespace(rendered, target):
    namespaced = [o for o in rendered[target] if o["kind"] != "Namespace"]
    assert {o["metadata"].get("namespace") for o in namespaced} == {"cascade"}
    assert named(rendered[target], "Namespace", "cascade")


@pytest.mark.parametrize("target", TARGETS)
def test_roles_and_labels(rendered, target):
    workloads = of_kind(rendered[target], *WORKLOAD_KINDS)
    assert sorted(role_of(w) for w in workloads) == ["drafter", "gateway", "redis", "verifier"]
    for workload in workloads:
        labels = pod_template(workload)["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "cascade"
        assert selector_matches(workload["spec"]["selector"], labels)


# ----------------------------------------------------------------------------- containers


@pytest.mark.parametrize("target", TARGETS)
def test_every_container_has_requests_and_limits(rendered, target):
    for obj in of_kind(rendered[target], *POD_KINDS):
        for container in containers(obj):
            resources = container.get("resources", {})
            where = f"{target} {obj['metadata']['name']}/{container['name']}"
            for section in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(section, {})), \
                    f"{where}: resources.{section} needs cpu and memory"


@pytest.mark.parametrize("target", TARGETS)
def test_probes(rendered, target):
    for role in ROLES:
        container = main_container(named(rendered[target], "Deployment", role))
        port = int(arg_value(container, "--port"))
        assert port == MAIN_PORTS[role]
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.get(kind)
            assert probe, f"{target} {role}: no {kind}"
            if role == "gateway":
                assert "httpGet" in probe, f"{target} gateway {kind} is not httpGet"
                assert probe["httpGet"]["port"] in (port, "http")
            else:
                assert probe.get("grpc", {}).get("port") == port, \
                    f"{target} {role} {kind} is not a gRPC probe on {port}"
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


@pytest.mark.parametrize("target", TARGETS)
def test_env_references_resolve(rendered, target):
    """Every $(VAR) in command, args or env values is defined in the container's env or in a
    ConfigMap it loads with envFrom; pods advertise their own IP from the downward API."""
    objects = rendered[target]
    configmaps = {c["metadata"]["name"]: c.get("data", {}) for c in of_kind(objects, "ConfigMap")}
    for obj in of_kind(objects, *POD_KINDS):
        for container in containers(obj):
            defined = {e["name"] for e in container.get("env", [])}
            for source in container.get("envFrom", []):
                name = source.get("configMapRef", {}).get("name")
                if name:
                    assert name in configmaps, f"{container['name']}: no ConfigMap {name}"
                    defined |= set(configmaps[name])
            texts = [*container.get("command", []), *container.get("args", []),
                     *(e.get("value", "") for e in container.get("env", []))]
            for text in texts:
                for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", text):
                    assert var in defined, f"{target} {container['name']}: $({var}) undefined"
    for role in ROLES:
        container = main_container(named(objects, "Deployment", role))
        env = {e["name"]: e for e in container.get("env", [])}
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert env["OTEL_SERVICE_NAME"]["value"] == f"cascade-{role}"
        assert arg_value(container, "--redis-url") == "$(REDIS_URL)"
    assert configmaps["cascade-config"]["REDIS_URL"] == "redis://redis:6379/0"
    gateway_env = {e["name"]: e for e in main_container(
        named(objects, "Deployment", "gateway"))["env"]}
    secret_ref = gateway_env["CASCADE_API_KEYS"]["valueFrom"]["secretKeyRef"]
    secret = named(objects, "Secret", secret_ref["name"])
    assert secret_ref["key"] in {**secret.get("data", {}), **secret.get("stringData", {})}
    for role in ("drafter", "verifier"):
        container = main_container(named(objects, "Deployment", role))
        assert arg_value(container, "--advertise") == f"$(POD_IP):{MAIN_PORTS[role]}"


@pytest.mark.parametrize("target", TARGETS)
def test_models_volume_is_read_only(rendered, target):
    objects = rendered[target]
    named(objects, "PersistentVolumeClaim", "cascade-models")
    for role in ROLES:
        deployment = named(objects, "Deployment", role)
        volumes = {v["name"]: v for v in pod_template(deployment)["spec"]["volumes"]}
        mount = [m for m in main_container(deployment)["volumeMounts"]
                 if m["mountPath"] == "/models"]
        assert len(mount) == 1 and mount[0].get("readOnly") is True, f"{target} {role}"
        claim = volumes[mount[0]["name"]]["persistentVolumeClaim"]
        assert claim["claimName"] == "cascade-models" and claim.get("readOnly") is True
        model = arg_value(main_container(deployment), "--model")
        assert model == ("/models/drafter" if role == "drafter" else "/models/target")


@pytest.mark.parametrize("target", TARGETS)
def test_prometheus_scrape_annotations(rendered, target):
    for role in ROLES:
        deployment = named(rendered[target], "Deployment", role)
        annotations = pod_template(deployment)["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == "true"
        ports = {p["containerPort"] for p in main_container(deployment)["ports"]}
        assert int(annotations["prometheus.io/port"]) in ports
        if role != "gateway":
            assert arg_value(main_container(deployment), "--metrics-port") == \
                annotations["prometheus.io/port"]


# ----------------------------------------------------------------------------- placement


@pytest.mark.parametrize("target", TARGETS)
def test_gpus_only_on_the_gpu_verifier(rendered, target):
    for obj in of_kind(rendered[target], *POD_KINDS):
        for container in containers(obj):
            if GPU in resource_names(container):
                assert target == "gpu" and role_of(obj) == "verifier" \
                    and container["name"] == "verifier", \
                    f"{target} {obj['metadata']['name']}/{container['name']} asks for a GPU"
    verifier = named(rendered[target], "Deployment", "verifier")
    container = main_container(verifier)
    if target == "gpu":
        resources = container["resources"]
        assert str(resources["limits"][GPU]) == "1" and str(resources["requests"][GPU]) == "1"
        spec = pod_template(verifier)["spec"]
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert any(t["key"] == GPU and t["effect"] == "NoSchedule" for t in spec["tolerations"])
        assert arg_value(container, "--device") == "cuda:0"
        assert arg_value(container, "--dtype") == "bfloat16"
        assert "cascade-cuda:" in container["image"]
        shm = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert shm and volumes[shm[0]["name"]]["emptyDir"]["medium"] == "Memory"
    else:
        assert arg_value(container, "--device") in (None, "cpu")
        assert arg_value(container, "--dtype") == "float32"
        assert "cascade-cpu:" in container["image"]


@pytest.mark.parametrize("target", TARGETS)
def test_drafters_and_gateway_stay_on_cpu_nodes(rendered, target):
    for role in ("drafter", "gateway"):
        deployment = named(rendered[target], "Deployment", role)
        spec = pod_template(deployment)["spec"]
        assert "cascade-cpu:" in main_container(deployment)["image"]
        assert not any(t.get("key") == GPU for t in spec.get("tolerations", []))
        assert spec.get("nodeSelector", {}).get("nvidia.com/gpu.present") != "true"


# ----------------------------------------------------------------------------- network


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
    assert ingress_sources(objects, workload("redis"), 6379) == {
        "pod:gateway", "pod:drafter", "pod:verifier"}
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
    redis = named(objects, "Service", "redis")
    assert [p["port"] for p in redis["spec"]["ports"]] == [6379]
    ingress = named(objects, "Ingress", "gateway")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"] \
        == "off"


@pytest.mark.parametrize("target", TARGETS)
def test_redis_is_persistent(rendered, target):
    redis = named(rendered[target], "StatefulSet", "redis")
    container = main_container(redis)
    assert container["image"].startswith("redis:7.2")
    assert arg_value(container, "--appendonly") == "yes"
    templates = redis["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[templates[0]["metadata"]["name"]] == "/data"


# ----------------------------------------------------------------------------- availability


@pytest.mark.parametrize("target", TARGETS)
def test_pod_disruption_budgets(rendered, target):
    objects = rendered[target]
    budgets = of_kind(objects, "PodDisruptionBudget")
    for role in ROLES:
        labels = pod_template(named(objects, "Deployment", role))["metadata"]["labels"]
        assert any(selector_matches(b["spec"]["selector"], labels) for b in budgets), \
            f"{target}: no PodDisruptionBudget for {role}"


def hpa_for(objects: list[dict], name: str) -> list[dict]:
    return [h for h in of_kind(objects, "HorizontalPodAutoscaler")
            if h["spec"]["scaleTargetRef"]["name"] == name]


def scaled_objects_for(objects: list[dict], name: str) -> list[dict]:
    return [s for s in of_kind(objects, "ScaledObject")
            if s["spec"]["scaleTargetRef"]["name"] == name]


def pods_metric_names(hpa: dict) -> set[str]:
    return {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}


@pytest.mark.parametrize("target", TARGETS)
def test_autoscalers(rendered, target):
    objects = rendered[target]
    for name in ("drafter", "verifier"):
        # One autoscaler at most per Deployment: an HPA and a ScaledObject would fight.
        assert len(hpa_for(objects, name)) + len(scaled_objects_for(objects, name)) <= 1
    if target == "local":
        assert not of_kind(objects, "HorizontalPodAutoscaler", "ScaledObject")
        for role in ROLES:
            assert named(objects, "Deployment", role)["spec"]["replicas"] == 1
        return
    (drafter,) = hpa_for(objects, "drafter")
    assert drafter["apiVersion"] == "autoscaling/v2"
    assert pods_metric_names(drafter) == {"cascade:drafter_active_sessions"}
    assert any(m["type"] == "Resource" and m["resource"]["name"] == "cpu"
               for m in drafter["spec"]["metrics"])
    if target == "gpu":
        assert not hpa_for(objects, "verifier"), "gpu overlay still has the verifier HPA"
        (scaled,) = scaled_objects_for(objects, "verifier")
        triggers = scaled["spec"]["triggers"]
        assert any(t["type"] == "prometheus"
                   and "cascade:verifier_queue_depth" in t["metadata"]["query"]
                   and float(t["metadata"]["threshold"]) > 0 for t in triggers)
    else:
        (verifier,) = hpa_for(objects, "verifier")
        assert pods_metric_names(verifier) == {"cascade:verifier_queue_depth"}


# ----------------------------------------------------------------------------- other files


def test_dashboard():
    dashboard = json.loads((K8S / "dashboards" / "cascade.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert any(v["type"] == "datasource" and v["query"] == "prometheus"
               for v in variables.values())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    for needed in [
        "sum(rate(cascade:spec_decode_num_accepted_tokens_total[1m])) / "
        "sum(rate(cascade:spec_decode_num_draft_tokens_total[1m]))",
        "1 + sum(rate(cascade:spec_decode_num_accepted_tokens_total[1m])) / "
        "sum(rate(cascade:spec_decode_num_drafts_total[1m]))",
        "cascade:spec_decode_num_accepted_tokens_per_pos_total",
        "cascade:time_to_first_token_seconds_bucket",
        "cascade:inter_token_latency_seconds_bucket",
        "cascade:verifier_queue_depth",
        "cascade:num_requests_running",
        "cascade:drafter_active_sessions",
    ]:
        assert needed in exprs, needed
    assert "by (position)" in exprs
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("name, base", [
    ("Dockerfile.cpu", "python:3.11.11-slim-bookworm"),
    ("Dockerfile.cuda", "nvidia/cuda:12.4.1-runtime-ubuntu22.04"),
])
def test_dockerfiles(name, base):
    text = (ROOT / "docker" / name).read_text()
    assert base in text
    assert len(re.findall(r"^FROM .* AS (builder|runtime)$", text, re.M)) == 2
    assert "COPY --from=builder /opt/venv /opt/venv" in text
    assert re.search(r"^USER 10001", text, re.M)
    assert "HF_HOME=/tmp/hf" in text and "PYTHONDONTWRITEBYTECODE=1" in text
    assert re.search(r"^EXPOSE ", text, re.M)
    assert not re.search(r"^(COPY|ADD) .*models", text, re.M), "weights come from the volume"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", "runs/"} <= set(ignored)
