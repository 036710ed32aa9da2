# Shared settings of scripts/k8s-e2e.sh's stages (sourced, not run).
CACHE="${CASCADE_K8S_CACHE:-/var/cache/cascade-k8s}"   # build outputs kept between runs
RUN="${CASCADE_K8S_RUN:-/var/lib/cascade-k8s}"          # the cluster's state, removed by `down`
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BRIDGE_IP=10.88.0.1
BRIDGE_NET=10.88.0.0/16
SERVICE_NET=10.96.0.0/16
API=https://127.0.0.1:6443
NAMESPACE=cascade
export KUBECONFIG="$RUN/kubeconfig"
mkdir -p "$CACHE" "$RUN"

log() { printf '[k8s-e2e %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { log "ERROR: $*"; exit 1; }
kc() { "$CACHE/bin/kubectl" "$@"; }
