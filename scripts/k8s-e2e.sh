#!/usr/bin/env bash
# Run Cascade's manifests on a real single-node Kubernetes built on this machine, and check
# them: every pod Ready, completions and streams through the gateway Service, 401 without a
# key, pods killed and drained mid-stream, drafters scaled, Redis failovers, the observed
# flows against the NetworkPolicies, and a teardown that restores the node.
#
#   sudo bash scripts/k8s-e2e.sh            # everything: build (cached), cluster, both phases, teardown
#   sudo bash scripts/k8s-e2e.sh build      # host packages, Kubernetes 1.20 from Debian's source, images
#   sudo bash scripts/k8s-e2e.sh up|down    # the cluster alone (KEEP=1 with the default keeps it up)
#   sudo bash scripts/k8s-e2e.sh check local|redis-ha   # one phase against a running cluster
#
# Needs root on a Debian 12 machine (apt, debootstrap, podman, containerd), Python 3.11, and
# the package registries. Slow and outside CI: about 20 minutes the first time on 2 cores
# (most of it building Kubernetes and the images, cached in $CASCADE_K8S_CACHE, default
# /var/cache/cascade-k8s), about 6 minutes after. docs/deploy.md has its latest results.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/k8s_e2e/common.sh"
PY="$REPO/.venv/bin/python"
RESULTS="$CACHE/results.md"

python_env() {
  [ -x "$PY" ] || bash "$REPO/scripts/install.sh"
}

host_state() {  # what the cluster may change on the node, to compare after teardown
  for s in vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.conf.all.route_localnet \
           net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables; do
    echo "$s=$(sysctl -n "$s" 2>/dev/null)"
  done
  echo "cni0=$(ip link show cni0 >/dev/null 2>&1 && echo present || echo absent)"
  echo "chains=$(iptables-save 2>/dev/null | grep -cE '^:(KUBE|CNI)-' || true)"
  echo "mounts=$(grep -c " $RUN/" /proc/mounts || true)"
  echo "processes=$(pgrep -fc "$CACHE/bin/|containerd --config $RUN" || true)"
}

apply_phase() {  # apply_phase PHASE TARGET: a fresh namespace with TARGET applied and prepared
  local phase="$1" target="$2"
  log "$phase: applying $target"
  kc delete namespace "$NAMESPACE" --ignore-not-found --wait=true --timeout=180s >/dev/null
  kc get pv -o name | { grep '/e2e-' || true; } | xargs -r "$CACHE/bin/kubectl" delete >/dev/null
  rm -rf "$RUN/volumes"
  "$PY" "$HERE/k8s_e2e/compat.py" "$target" "$RUN/volumes" cascade-models > "$RUN/$phase.yaml"
  kc apply -f <(yq_namespace "$RUN/$phase.yaml") >/dev/null
  if [ "$phase" = redis-ha ]; then REDIS_HA=1 bash "$REPO/scripts/k8s-secrets.sh"; else bash "$REPO/scripts/k8s-secrets.sh"; fi
  kc apply -f "$RUN/$phase.yaml" >/dev/null
  log "$phase: waiting for the model volume (the models-prepare Job)"
  kc -n "$NAMESPACE" wait --for=condition=complete job/cascade-models-prepare --timeout=900s >/dev/null
}

yq_namespace() {  # the Namespace documents of a rendered file
  "$PY" -c 'import sys, yaml; yaml.safe_dump_all([d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Namespace"], sys.stdout)' "$1"
}

check_phase() {
  local phase="$1" target
  target=overlays/local; [ "$phase" = redis-ha ] && target=overlays/local+components/redis-ha
  local started=$SECONDS
  apply_phase "$phase" "$target"
  log "$phase: checks (Ready at +$((SECONDS - started)) s)"
  (cd "$HERE/k8s_e2e" && KUBECONFIG="$KUBECONFIG" "$PY" checks.py "$phase" "$RESULTS") || FAILED=1
}

teardown_row() {
  if diff <(cat "$RUN.host-before") <(host_state) >"$CACHE/teardown.diff"; then
    echo "| teardown | the node restored (sysctls, bridge, iptables chains, mounts, processes) | PASS | | |" >> "$RESULTS"
  else
    echo "| teardown | the node restored | FAIL | | $(tr '\n' ' ' < "$CACHE/teardown.diff") |" >> "$RESULTS"
    FAILED=1
  fi
}

everything() {
  FAILED=0
  local started=$SECONDS
  python_env
  bash "$HERE/k8s_e2e/build.sh"
  bash "$HERE/k8s_e2e/images.sh" build
  local built=$((SECONDS - started))
  host_state > "$RUN.host-before"
  { echo "| phase | check | result | time | detail |"; echo "|---|---|---|---|---|"; } > "$RESULTS"
  [ "${KEEP:-0}" = 1 ] || trap 'bash "$HERE/k8s_e2e/cluster.sh" down' EXIT
  bash "$HERE/k8s_e2e/cluster.sh" up
  check_phase local
  check_phase redis-ha
  if [ "${KEEP:-0}" != 1 ]; then
    trap - EXIT
    bash "$HERE/k8s_e2e/cluster.sh" down
    teardown_row
  fi
  log "done in $((SECONDS - started)) s (build and images $built s); results: $RESULTS"
  cat "$RESULTS"
  exit "$FAILED"
}

case "${1:-all}" in
  all) everything ;;
  build) python_env; bash "$HERE/k8s_e2e/build.sh"; bash "$HERE/k8s_e2e/images.sh" build ;;
  up|down) bash "$HERE/k8s_e2e/cluster.sh" "$1" ;;
  check) FAILED=0; check_phase "${2:?local or redis-ha}"; exit "$FAILED" ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
