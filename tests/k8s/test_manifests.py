"""The Kubernetes manifests render with `kubectl kustomize`, validate strictly against the
Kubernetes 1.30 API schemas, and keep the workload rules: labels, resources, env references,
read-only models, scrape annotations, GPUs only on the gpu overlay's verifier (probes, drain
timing, images and pod hardening: test_pod_specs.py)."""

from __future__ import annotations

import importlib
import os
import re

import pytest
import typer

from k8s_helpers import (
    ALL_TARGETS,
    CRD_GROUPS,
    GPU,
    K8S,
    KUBERNETES_VERSION,
    MAIN_PORTS,
    NEEDS_KUBECTL,
    OVERLAYS,
    POD_KINDS,
    REPLICATED_REDIS,
    ROLES,
    ROOT,
    TARGETS,
    WORKLOAD_KINDS,
    arg_value,
    containers,
    main_container,
    named,
    of_kind,
    pod_count,
    pod_cpu_request,
    pod_template,
    render,
    resource_names,
    role_of,
    selector_matches,
)

pytestmark = NEEDS_KUBECTL


def test_overlays_exist():
    assert {"local", "gpu"} <= set(OVERLAYS)


@pytest.mark.parametrize("target", ALL_TARGETS)
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
    sentinels = ["redis-sentinel"] if target in REPLICATED_REDIS else []
    assert sorted(role_of(w) for w in workloads) == sorted(
        ["drafter", "gateway", "redis", "verifier", *sentinels])
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


SMALL_NODE_CPU = 2.0
SMALL_NODE_HEADROOM_CPU = 0.5
"""CPU left on a small node for its own pods (kube-proxy, the CNI, DNS, a node agent)."""


@pytest.mark.parametrize("target", ["local", "local+redis-ha"])
def test_small_cluster_fits_a_two_cpu_node(rendered, target):
    """The local overlay, alone and with replicated Redis (its anti-affinity relaxed, every pod
    on one machine), schedules on one 2-CPU node with headroom: the scheduler reserves every
    pod's CPU request, the models-prepare Job's included, which must start while the serving
    pods already hold theirs."""
    workloads = of_kind(rendered[target], *POD_KINDS)
    requests = {w["metadata"]["name"]: round(pod_count(w) * pod_cpu_request(w), 3)
                for w in workloads}
    assert "cascade-models-prepare" in requests
    budget = SMALL_NODE_CPU - SMALL_NODE_HEADROOM_CPU
    assert sum(requests.values()) <= budget, (
        f"{target}: CPU requests {requests} sum to {sum(requests.values()):.2f} cores, "
        f"more than the {budget} a {SMALL_NODE_CPU:g}-CPU node has for them")


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
        assert arg_value(container, "--dtype") == "auto"  # bfloat16 on a GPU
        assert "cascade-cuda:" in container["image"]
        shm = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert shm and volumes[shm[0]["name"]]["emptyDir"]["medium"] == "Memory"
    else:
        assert arg_value(container, "--device") in (None, "cpu")
        assert arg_value(container, "--dtype") == "auto"
        assert "cascade-cpu:" in container["image"]


@pytest.mark.parametrize("target", TARGETS)
def test_drafters_and_gateway_stay_on_cpu_nodes(rendered, target):
    for role, image in (("drafter", "cascade-cpu:"), ("gateway", "cascade-gateway:")):
        deployment = named(rendered[target], "Deployment", role)
        spec = pod_template(deployment)["spec"]
        assert image in main_container(deployment)["image"]
        assert not any(t.get("key") == GPU for t in spec.get("tolerations", []))
        assert spec.get("nodeSelector", {}).get("nvidia.com/gpu.present") != "true"


# ----------------------------------------------------------------------------- network


ENTRY_POINTS = {"gateway": "gateway.__main__", "drafter_service": "drafter_service.__main__",
                "verifier_service": "verifier_service.__main__"}


@pytest.mark.parametrize("target", TARGETS)
def test_container_flags_parse_with_the_services_own_command_lines(rendered, target,
                                                                  monkeypatch):
    """Every service container's args are flags its entry point really has (a renamed or
    removed flag would crash-loop the pod), with the settings its environment gives (Secrets
    stand in as placeholders); the gateway's manifests turn the playground off."""
    checked = set()
    for obj in of_kind(rendered[target], *POD_KINDS):
        for container in containers(obj):
            command = container.get("command", [])
            if command[:2] != ["python", "-m"] or command[2] not in ENTRY_POINTS:
                continue
            for env in container.get("env", []):
                monkeypatch.setenv(env["name"], env.get("value", f"<{env['name']}>"))
            cli = importlib.import_module(ENTRY_POINTS[command[2]]).cli
            click_command = typer.main.get_command(cli)
            context = click_command.make_context(command[2], list(container.get("args", [])))
            if command[2] == "gateway":
                assert context.params["playground"] is False
            assert context.params["redis_url"] == "<CASCADE_REDIS_URL>"
            assert context.params["mesh_token_file"] is not None
            for env in container.get("env", []):
                monkeypatch.delenv(env["name"])
            checked.add(command[2])
    assert checked == set(ENTRY_POINTS)


def test_the_deploy_guides_own_models_patch_renders(tmp_path):
    """docs/deploy.md's patch pointing the pods at your own models applies to the gpu overlay
    (its `test` ops fail the build if the base's args move) and sets what it says."""
    guide = (ROOT / "docs" / "deploy.md").read_text()
    block, = re.findall(r"```yaml\n(# k8s/overlays/prod/kustomization\.yaml\n(?:(?!```).)*"
                        r"--kv-tokens.*?)```", guide, re.S)
    gpu = os.path.relpath(K8S / "overlays" / "gpu", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(block.replace("- ../gpu", f"- {gpu}"))
    objects = render(tmp_path)
    target = "/models/llama-3.1-8b-instruct"
    for role in ROLES:
        container = main_container(named(objects, "Deployment", role))
        assert arg_value(container, "--model-name") == "meta-llama/Llama-3.1-8B-Instruct"
        assert arg_value(container, "--target-model" if role == "drafter" else "--model") == target
    verifier = main_container(named(objects, "Deployment", "verifier"))
    assert int(arg_value(verifier, "--kv-tokens")) % 64 == 0
