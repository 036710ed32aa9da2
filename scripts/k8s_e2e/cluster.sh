#!/usr/bin/env bash
# Stage 2 of scripts/k8s-e2e.sh: start (`up`) or remove (`down`) the single-node cluster built by
# build.sh: etcd, the control plane, containerd + runc, kubelet, kube-proxy, a CNI bridge and a
# DNS stand-in for cluster.local. Everything lives under $RUN; `down` restores the host.
set -euo pipefail
source "$(dirname "$0")/common.sh"
NODE=cascade-node
SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.conf.all.route_localnet
  net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables)

start() {  # start NAME COMMAND...: a background daemon with its log and pid under $RUN
  local name="$1"; shift
  "$@" >"$RUN/log/$name.log" 2>&1 &
  echo $! >"$RUN/pid/$name"
}

wait_for() {  # wait_for WHAT SECONDS COMMAND...
  local what="$1" secs="$2"; shift 2
  for _ in $(seq "$secs"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  die "$what not ready after ${secs}s (logs: $RUN/log)"
}

certificates() {
  local d="$RUN/pki"; mkdir -p "$d"; cd "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj /CN=cascade-e2e-ca 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,IP:%s,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n' "$BRIDGE_IP" > san.ext
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 30 -extfile san.ext 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null && openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  local admin node
  admin="$(openssl rand -hex 16)"; node="$(openssl rand -hex 16)"
  printf '%s,admin,admin,system:masters\n%s,system:node:%s,system:node:%s,system:nodes\n' \
    "$admin" "$node" "$NODE" "$NODE" > tokens.csv
  kubeconfig "$KUBECONFIG" "$admin"
  kubeconfig "$RUN/kubelet.kubeconfig" "$node"
  cd - >/dev/null
}

kubeconfig() {  # kubeconfig FILE TOKEN
  cat > "$1" <<KC
apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: "$API", certificate-authority: "$RUN/pki/ca.crt"}}]
users: [{name: e2e, user: {token: "$2"}}]
contexts: [{name: e2e, context: {cluster: e2e, user: e2e, namespace: $NAMESPACE}}]
current-context: e2e
KC
}

save_sysctls() {
  [ -f "$CACHE/sysctls.saved" ] && return  # a run that died before `down` keeps the first values
  for s in "${SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s" 2>/dev/null || echo)"; done > "$CACHE/sysctls.saved"
}

network() {
  ip link show cni0 >/dev/null 2>&1 || ip link add cni0 type bridge
  ip addr show cni0 | grep -q "$BRIDGE_IP/" || ip addr add "$BRIDGE_IP/16" dev cni0
  ip link set cni0 up
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
  mkdir -p "$RUN/cni"
  cat > "$RUN/cni/10-cascade.conflist" <<CNI
{"cniVersion": "0.4.0", "name": "cascade-e2e", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$BRIDGE_NET", "gateway": "$BRIDGE_IP"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$RUN/cni-ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
CNI
}

containerd_up() {  # its image store is kept in the cache: a warm run imports nothing
  cat > "$RUN/containerd.toml" <<TOML
version = 2
root = "$CACHE/containerd"
state = "$RUN/containerd-state"
[grpc]
  address = "$RUN/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "cascade.local/pause:1"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$RUN/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
TOML
  start containerd containerd --config "$RUN/containerd.toml"
  wait_for containerd 30 ctr -a "$RUN/containerd.sock" version
}

control_plane() {
  local b="$CACHE/bin" p="$RUN/pki"
  start etcd etcd --name e2e --data-dir "$RUN/etcd" --listen-client-urls http://127.0.0.1:2379 \
    --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380
  wait_for etcd 30 curl -sf http://127.0.0.1:2379/health
  start kube-apiserver "$b/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --advertise-address="$BRIDGE_IP" --secure-port=6443 --insecure-port=0 \
    --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" --client-ca-file="$p/ca.crt" \
    --token-auth-file="$p/tokens.csv" --authorization-mode=Node,RBAC --allow-privileged=true \
    --service-cluster-ip-range="$SERVICE_NET" --service-node-port-range=30000-32767 \
    --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --kubelet-preferred-address-types=InternalIP,Hostname
  wait_for kube-apiserver 90 kc get --raw /readyz
  start kube-controller-manager "$b/kube-controller-manager" --kubeconfig="$KUBECONFIG" \
    --service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" --leader-elect=false \
    --use-service-account-credentials=false --service-cluster-ip-range="$SERVICE_NET"
  start kube-scheduler "$b/kube-scheduler" --kubeconfig="$KUBECONFIG" --leader-elect=false
}

node_up() {
  local b="$CACHE/bin"
  start kubelet "$b/kubelet" --kubeconfig="$RUN/kubelet.kubeconfig" --hostname-override="$NODE" \
    --node-ip="$BRIDGE_IP" --root-dir="$RUN/kubelet" --cert-dir="$RUN/kubelet-pki" \
    --container-runtime=remote --container-runtime-endpoint="unix://$RUN/containerd.sock" \
    --pod-infra-container-image=cascade.local/pause:1 --cgroup-driver=cgroupfs --fail-swap-on=false \
    --cgroups-per-qos=false --enforce-node-allocatable= --cluster-dns="$BRIDGE_IP" \
    --cluster-domain=cluster.local --eviction-hard='memory.available<100Mi,nodefs.available<2%' \
    --image-gc-high-threshold=100 --image-gc-low-threshold=99 --resolv-conf=/etc/resolv.conf
  start kube-proxy "$b/kube-proxy" --kubeconfig="$KUBECONFIG" --hostname-override="$NODE" \
    --proxy-mode=iptables --cluster-cidr="$BRIDGE_NET" --nodeport-addresses="$BRIDGE_IP/32" \
    --conntrack-max-per-core=0
  wait_for "node $NODE" 120 bash -c "$(declare -f kc); CACHE=$CACHE; kc get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q True"
}

dns_up() {
  mkdir -p "$RUN/dns"
  start dnsmasq dnsmasq --keep-in-foreground --no-hosts --hostsdir="$RUN/dns" --listen-address="$BRIDGE_IP" \
    --bind-interfaces --local=/cluster.local/ --resolv-file=/etc/resolv.conf --cache-size=0 --user=root
  start dns-sync python3 "$(dirname "$0")/dns_sync.py" "$RUN/dns/cluster.hosts"
}

up() {
  [ -x "$CACHE/bin/kubelet" ] || die "no cluster binaries: run scripts/k8s_e2e/build.sh first"
  if [ -f "$RUN/pid/kube-apiserver" ] && kill -0 "$(cat "$RUN/pid/kube-apiserver")" 2>/dev/null; then
    log "cluster: already up"; return
  fi
  rm -rf "$RUN"; mkdir -p "$RUN/log" "$RUN/pid"
  save_sysctls
  log "cluster: starting (logs in $RUN/log)"
  certificates
  network
  containerd_up
  bash "$(dirname "$0")/images.sh" import
  control_plane
  node_up
  dns_up
  log "cluster: node $NODE Ready"
}

down() {  # best effort: every step runs, whatever failed before it
  set +e +o pipefail
  log "cluster: stopping"
  if [ -f "$KUBECONFIG" ] && kc get ns "$NAMESPACE" >/dev/null 2>&1; then
    kc delete ns "$NAMESPACE" --wait=false >/dev/null 2>&1 || true
  fi
  for name in dns-sync dnsmasq kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do
    [ -f "$RUN/pid/$name" ] && kill "$(cat "$RUN/pid/$name")" 2>/dev/null || true
  done
  sleep 2
  if [ -S "$RUN/containerd.sock" ]; then  # the pods' containers and sandboxes
    local ctr=(ctr -a "$RUN/containerd.sock" -n k8s.io)
    for t in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks kill -s KILL "$t" >/dev/null 2>&1; done
    sleep 1
    for t in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks delete -f "$t" >/dev/null 2>&1; done
    for c in $("${ctr[@]}" containers ls -q 2>/dev/null); do "${ctr[@]}" containers rm "$c" >/dev/null 2>&1; done
  fi
  [ -f "$RUN/pid/containerd" ] && kill "$(cat "$RUN/pid/containerd")" 2>/dev/null || true
  sleep 2
  pkill -f "containerd-shim-runc-v2 .*$RUN" 2>/dev/null || true
  for m in $(awk -v run="$RUN/" 'index($2, run) == 1 || $2 ~ "^/run/(netns|containerd)/" {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  clean_iptables
  ip link show cni0 >/dev/null 2>&1 && ip link delete cni0
  restore_sysctls
  rm -rf "$RUN" "$CACHE/containerd/io.containerd.grpc.v1.cri"  # the pods' records, not the images
  log "cluster: removed, host restored"
}

clean_iptables() {
  for table in filter nat mangle; do
    iptables-save -t "$table" | grep -E '^-A' | grep -E 'KUBE-|CNI-' | sed 's/^-A/-D/' | while read -r rule; do
      eval "iptables -t $table $rule" 2>/dev/null || true
    done
    for chain in $(iptables-save -t "$table" | grep -oE '^:(KUBE|CNI)-[^ ]+' | tr -d :); do
      iptables -t "$table" -F "$chain" 2>/dev/null || true
    done
    for chain in $(iptables-save -t "$table" | grep -oE '^:(KUBE|CNI)-[^ ]+' | tr -d :); do
      iptables -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
}

restore_sysctls() {
  [ -f "$CACHE/sysctls.saved" ] || return 0
  while IFS='=' read -r key value; do
    [ -n "$value" ] && sysctl -qw "$key=$value" 2>/dev/null || true
  done < "$CACHE/sysctls.saved"
  rm -f "$CACHE/sysctls.saved"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
