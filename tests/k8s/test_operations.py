"""Operations in the Kubernetes manifests: persistent Redis, disruption budgets, autoscalers (HPA,
or KEDA in the gpu overlay), the Grafana dashboard and the Dockerfiles."""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from drafter_service.speculation import SpeculationConfig

from k8s_helpers import (
    COMPONENT,
    K8S,
    REPLICATED_REDIS,
    NEEDS_KUBECTL,
    ROLES,
    ROOT,
    TARGETS,
    arg_value,
    main_container,
    named,
    of_kind,
    pod_template,
    render_all,
    role_of,
    selector_matches,
)

pytestmark = NEEDS_KUBECTL


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
    # not CPU: a speculating drafter keeps its CPU busy at any load; the session target is the
    # number up to which a drafter speculates
    assert all(m["type"] == "Pods" for m in drafter["spec"]["metrics"])
    (sessions,) = drafter["spec"]["metrics"]
    assert sessions["pods"]["target"]["averageValue"] == str(
        SpeculationConfig().max_sessions)
    # a single verifier makes every node drain or crash a full outage
    assert named(objects, "Deployment", "verifier")["spec"]["replicas"] >= 2
    if target == "gpu":
        assert not hpa_for(objects, "verifier"), "gpu overlay still has the verifier HPA"
        (scaled,) = scaled_objects_for(objects, "verifier")
        assert scaled["spec"]["minReplicaCount"] >= 2
        triggers = scaled["spec"]["triggers"]
        for metric in VERIFIER_SIGNALS:
            assert any(t["type"] == "prometheus" and metric in t["metadata"]["query"]
                       and float(t["metadata"]["threshold"]) > 0 for t in triggers), metric
    else:
        (verifier,) = hpa_for(objects, "verifier")
        assert pods_metric_names(verifier) == set(VERIFIER_SIGNALS)
        assert verifier["spec"]["minReplicas"] >= 2


VERIFIER_SIGNALS = ("cascade:verifier_queue_depth", "cascade:num_requests_waiting",
                    "cascade:kv_cache_usage_perc")
"""What scales verifiers: queued blocks, sessions waiting for KV memory, KV usage."""


# ----------------------------------------------------------------------------- other files


def test_dashboard():
    dashboard = json.loads((K8S / "dashboards" / "cascade.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert any(v["type"] == "datasource" and v["query"] == "prometheus"
               for v in variables.values())
    assert variables["model_name"]["query"]["query"] == (
        "label_values(cascade:num_requests_running, model_name)")
    raw = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    selector = '{model_name=~"$model_name"}'
    assert len(re.findall(r"cascade:[a-z_]+", raw)) == raw.count(selector)  # every series
    exprs = raw.replace(selector, "")
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
        "cascade:ssd_rounds_total",
        "cascade:ssd_wasted_blocks_total",
    ]:
        assert needed in exprs, needed
    assert "by (position)" in exprs
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert set(re.findall(r"cascade:[a-z_]+", raw)) <= exported_series()


def exported_series() -> set[str]:
    """Every series name the services expose (a counter's ``_total``, a histogram's
    ``_bucket``/``_count``/``_sum``), from their metric registries."""
    from cascade.serving import metrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                "gauge": ("",)}
    index = metrics.MemoryCollector(type("Index", (), dict(
        num_sequences=0, num_tokens=0, num_hits=0, num_lookups=0))())
    families = [f for registry in metrics.REGISTRIES.values() for f in registry.collect()]
    families += list(index.collect())
    return {f.name + suffix for f in families for suffix in suffixes[f.type]}


def test_every_series_the_scaling_rules_read_is_exported():
    rendered = json.dumps(render_all())
    named = set(re.findall(r"cascade:[a-z_]+", rendered))
    assert named and named <= exported_series(), named - exported_series()


@pytest.mark.parametrize("name, base", [
    ("Dockerfile.cpu", "python:3.11.11-slim-bookworm"),
    ("Dockerfile.cuda", "nvidia/cuda:13.0.2-runtime-ubuntu22.04"),
    ("Dockerfile.gateway", "python:3.11.11-slim-bookworm"),
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


def test_model_images_pin_one_torch_within_the_projects_range():
    """The CPU and CUDA images install the same torch (the one the tests run on CPU), a version
    pyproject.toml allows, and repeat the pin when installing Cascade so pip cannot swap it."""
    from packaging.requirements import Requirement

    pins = {}
    for name in ("Dockerfile.cpu", "Dockerfile.cuda"):
        text = (ROOT / "docker" / name).read_text()
        pins[name], = re.findall(r"^ARG TORCH_VERSION=(\S+)$", text, re.M)
        assert 'pip install ".[models]" "torch==${TORCH_VERSION}"' in text, name
    assert len(set(pins.values())) == 1, f"the model images pin different torch versions: {pins}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = [*project["dependencies"], *project["optional-dependencies"]["models"]]
    torch, = [r for r in map(Requirement, listed) if r.name == "torch"]
    assert torch.specifier.contains(pins["Dockerfile.cpu"]), (pins, str(torch.specifier))


def test_the_gateway_image_installs_no_torch():
    text = (ROOT / "docker" / "Dockerfile.gateway").read_text()
    installs = [line for line in text.splitlines() if "pip install" in line]
    assert installs and not any("torch" in line or "[models]" in line for line in installs)
    assert "find_spec('torch') is None" in text  # the build fails if torch came in anyway
    for model_image in ("Dockerfile.cpu", "Dockerfile.cuda"):
        assert '".[models]"' in (ROOT / "docker" / model_image).read_text()


@pytest.mark.parametrize("target", sorted(REPLICATED_REDIS))
def test_replicated_redis_survives_losing_a_node_or_a_sentinel(rendered, target):
    """Three data nodes and three sentinels, one per machine (two sentinels on one machine
    would take the quorum with it), drained one at a time; both start through the scripts
    tests/k8s/test_redis_ha_scripts.py runs, and every sentinel and data node address the
    scripts are given is a pod of its StatefulSet."""
    objects = rendered[target]
    nodes = named(objects, "StatefulSet", "redis")
    sentinels = named(objects, "StatefulSet", "redis-sentinel")
    assert nodes["spec"]["replicas"] == sentinels["spec"]["replicas"] == 3
    for workload, script in ((nodes, "redis-node.sh"), (sentinels, "sentinel.sh")):
        spec = pod_template(workload)["spec"]
        anti_affinity = spec["affinity"]["podAntiAffinity"]
        assert "preferredDuringSchedulingIgnoredDuringExecution" not in anti_affinity
        term, = anti_affinity["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"][COMPONENT] == role_of(workload)
        container = main_container(workload)
        assert container["command"] == ["/bin/sh", f"/scripts/{script}"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["SENTINELS"].split() == [
            f"redis-sentinel-{i}.redis-sentinel-headless:26379" for i in range(3)]
        assert env["REDIS_NODES"].split() == [f"redis-{i}.redis-headless:6379" for i in range(3)]
        assert env["REDIS_INITIAL_PRIMARY"] == "redis-0.redis-headless"
        pdb = named(objects, "PodDisruptionBudget", role_of(workload))
        assert pdb["spec"]["maxUnavailable"] == 1
    config = next(o for o in of_kind(objects, "ConfigMap")
                  if o["metadata"]["name"].startswith("redis-ha-scripts"))
    folder = K8S / "components" / "redis-ha"
    for name in ("redis-node.sh", "sentinel.sh", "find-primary.sh"):
        assert config["data"][name] == (folder / name).read_text()
    quorum = {e["name"]: e.get("value") for e in main_container(sentinels)["env"]}
    assert quorum["SENTINEL_QUORUM"] == "2"  # a majority of three
    gateway = main_container(named(objects, "Deployment", "gateway"))
    assert arg_value(gateway, "--redis-wait-replicas") == "1"  # nothing a client saw is lost
