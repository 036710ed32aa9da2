#!/usr/bin/env bash
# Create the Secrets Cascade's manifests reference, with random values, in namespace
# ${NAMESPACE:-cascade} (REDIS_HA=1: the Redis URL names the sentinels of k8s/overlays/ha).
# Existing Secrets are left as they are (rotate them on purpose, see
# docs/deploy.md). Needs kubectl and openssl; prints no secret value.
set -euo pipefail
ns="${NAMESPACE:-cascade}"
kubectl get namespace "$ns" >/dev/null 2>&1 || kubectl create namespace "$ns"

make() {  # make NAME KEY=VALUE...
  local name="$1"; shift
  if kubectl -n "$ns" get secret "$name" >/dev/null 2>&1; then
    echo "secret/$name exists, kept"
    return
  fi
  local args=()
  for pair in "$@"; do args+=("--from-literal=$pair"); done
  kubectl -n "$ns" create secret generic "$name" "${args[@]}" >/dev/null
  echo "secret/$name created"
}

make cascade-api-keys "CASCADE_API_KEYS=$(openssl rand -hex 24)"
make cascade-mesh "token=$(openssl rand -hex 32)"
make cascade-session-key "key=$(openssl rand -hex 32)"
password="$(openssl rand -hex 24)"
if [ "${REDIS_HA:-0}" = 1 ]; then  # k8s/overlays/ha: the services ask the sentinels
  sentinels=""
  for i in 0 1 2; do sentinels="$sentinels${sentinels:+,}redis-sentinel-$i.redis-sentinel-headless:26379"; done
  url="redis+sentinel://:$password@$sentinels/cascade/0"
else
  url="redis://:$password@redis:6379/0"
fi
make cascade-redis "password=$password" "url=$url"
echo "the API key: kubectl -n $ns get secret cascade-api-keys -o jsonpath='{.data.CASCADE_API_KEYS}' | base64 -d"
