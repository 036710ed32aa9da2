"""Credentials in the manifests: every pod reads them from Secrets the manifests do not
contain (no placeholder to forget, nothing an apply restores after a rotation), Redis wants a
password, and every mesh call carries the shared token."""

import pytest

from k8s_helpers import (NEEDS_KUBECTL, ROLES, TARGETS, arg_value, main_container, named,
                         of_kind, pod_template)

pytestmark = NEEDS_KUBECTL
SECRETS = {"cascade-api-keys": {"CASCADE_API_KEYS"}, "cascade-mesh": {"token"},
           "cascade-redis": {"password", "url"}, "cascade-session-key": set()}


def secret_env(container: dict) -> dict[str, tuple[str, str]]:
    return {e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}


def referenced(objects: list[dict]) -> dict[str, set[str]]:
    """{Secret name: keys} every pod template refers to (env and volumes)."""
    found: dict[str, set[str]] = {}
    for obj in objects:
        if "template" not in obj.get("spec", {}):
            continue
        for container in pod_template(obj)["spec"]["containers"]:
            for name, key in secret_env(container).values():
                found.setdefault(name, set()).add(key)
        for volume in pod_template(obj)["spec"].get("volumes", []):
            if "secret" in volume:
                found.setdefault(volume["secret"]["secretName"], set())
    return found


@pytest.mark.parametrize("target", TARGETS)
def test_no_secret_values_ship_and_every_reference_is_documented(rendered, target):
    objects = rendered[target]
    assert not of_kind(objects, "Secret"), "a Secret with a value in the manifests"
    refs = referenced(objects)
    assert set(refs) >= set(SECRETS)
    for name, keys in refs.items():
        assert keys <= SECRETS.get(name, set()) or name.startswith("cascade-mesh-tls"), name
    for obj in objects:  # no credential in a ConfigMap or on a command line
        text = str(obj.get("data", "")) + str(obj.get("spec", ""))
        assert "redis://redis" not in text and "replace-me" not in text


@pytest.mark.parametrize("target", TARGETS)
def test_services_read_redis_and_the_mesh_token_from_secrets(rendered, target):
    objects = rendered[target]
    for role in ROLES:
        container = main_container(named(objects, "Deployment", role))
        assert secret_env(container)["CASCADE_REDIS_URL"] == ("cascade-redis", "url")
        assert arg_value(container, "--redis-url") is None  # not in the process list
        token = {e["name"]: e.get("value") for e in container["env"]}["CASCADE_MESH_TOKEN_FILE"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volume = mounts[token.rsplit("/", 1)[0]]
        volumes = {v["name"]: v for v in pod_template(
            named(objects, "Deployment", role))["spec"]["volumes"]}
        assert volumes[volume]["secret"]["secretName"] == "cascade-mesh"
    assert secret_env(main_container(named(objects, "Deployment", "gateway")))[
        "CASCADE_API_KEYS"] == ("cascade-api-keys", "CASCADE_API_KEYS")


@pytest.mark.parametrize("target", TARGETS)
def test_redis_requires_its_password_and_bounds_its_memory(rendered, target):
    redis = main_container(named(rendered[target], "StatefulSet", "redis"))
    assert arg_value(redis, "--requirepass") == "$(REDIS_PASSWORD)"
    assert secret_env(redis)["REDIS_PASSWORD"] == ("cascade-redis", "password")
    assert arg_value(redis, "--protected-mode") in (None, "yes")
    assert arg_value(redis, "--maxmemory-policy") == "noeviction"
    assert arg_value(redis, "--maxmemory") == "$(REDIS_MAXMEMORY)"
    limit = redis["resources"]["limits"]["memory"]
    limit_mb = int(limit[:-2]) * {"Gi": 1024, "Mi": 1}[limit[-2:]]
    maxmemory = {e["name"]: e.get("value") for e in redis["env"]}["REDIS_MAXMEMORY"]
    assert int(maxmemory.removesuffix("mb")) <= 0.8 * limit_mb


@pytest.mark.parametrize("target", [t for t in TARGETS if t == "gpu"])
def test_the_mesh_tls_component_mounts_certificates_and_moves_probes(rendered, target):
    from cascade.serving.mesh.security import DEFAULT_SERVER_NAME

    objects = rendered[target]
    member = named(objects, "Certificate", "cascade-mesh-tls")
    assert DEFAULT_SERVER_NAME in member["spec"]["dnsNames"]
    assert {"server auth", "client auth"} <= set(member["spec"]["usages"])
    for role in ROLES:
        deployment = named(objects, "Deployment", role)
        container = main_container(deployment)
        env = {e["name"]: e.get("value") for e in container["env"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod_template(deployment)["spec"]["volumes"]}
        assert volumes[mounts[env["CASCADE_TLS_DIR"]]]["secret"]["secretName"] == \
            member["spec"]["secretName"]
        if role == "gateway":
            continue
        health = int(env["CASCADE_HEALTH_PORT"])
        assert health in {p["containerPort"] for p in container["ports"]}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == health, (role, probe)


@pytest.mark.parametrize("target", TARGETS)
def test_only_gateways_and_verifiers_hold_the_session_key(rendered, target):
    """Drafters pass owner tags on; holding the key would let one open any session."""
    for role in ROLES:
        deployment = named(rendered[target], "Deployment", role)
        secrets = {v["secret"]["secretName"] for v in pod_template(deployment)["spec"]["volumes"]
                   if "secret" in v}
        env = {e["name"]: e.get("value") for e in main_container(deployment)["env"]}
        holds = "cascade-session-key" in secrets
        assert holds == (role != "drafter"), role
        assert ("CASCADE_SESSION_KEY_FILE" in env) == holds, role
