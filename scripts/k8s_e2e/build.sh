#!/usr/bin/env bash
# Stage 1 of scripts/k8s-e2e.sh: the host packages and a single-node Kubernetes built from
# Debian's source package (1.20.2, the newest packaged), cached under $CACHE/bin.
# Re-running skips what is already there.
set -euo pipefail
source "$(dirname "$0")/common.sh"

PACKAGES=(golang-go rsync etcd-server containerd runc containernetworking-plugins debootstrap
  podman dpkg-dev iptables conntrack dnsmasq-base gcc libc6-dev openssl curl ca-certificates)
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy)

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then log "host packages: present"; return; fi
  log "host packages: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

enable_sources() {  # Debian's deb822 sources: add deb-src to the main archive entry
  local list=/etc/apt/sources.list.d/cascade-k8s-src.sources
  [ -f "$list" ] && return
  cat > "$list" <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  apt-get update -qq
}

fetch_source() {
  local src="$CACHE/src"
  if [ -d "$src/kubernetes" ]; then return; fi
  enable_sources
  mkdir -p "$src"
  log "kubernetes: fetching Debian's source package"
  (cd "$src" && apt-get source -qq kubernetes >/dev/null 2>&1 && mv kubernetes-*/ kubernetes)
}

build_kubernetes() {
  local ok=1
  for b in "${BINARIES[@]}"; do [ -x "$CACHE/bin/$b" ] || ok=0; done
  if [ $ok = 1 ] && [ -x "$CACHE/bin/pause" ]; then log "kubernetes: built (cached)"; return; fi
  fetch_source
  local src="$CACHE/src/kubernetes"
  log "kubernetes: building (about 10 minutes on 2 cores, the first time)"
  (
    cd "$src"
    export GOPATH="$src/.go" GO111MODULE=off CGO_ENABLED=0 GOFLAGS=-mod=vendor
    export GOCACHE="$CACHE/go-cache"
    make gen_openapi >"$CACHE/build-openapi.log" 2>&1 || true
    make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet cmd/kubectl cmd/kube-proxy" \
      >"$CACHE/build.log" 2>&1 || { tail -30 "$CACHE/build.log"; die "kubernetes build failed ($CACHE/build.log)"; }
  )
  mkdir -p "$CACHE/bin"
  for b in "${BINARIES[@]}"; do
    cp "$(find "$src/_output" -type f -name "$b" -path "*bin*" | head -1)" "$CACHE/bin/$b"
  done
  gcc -static -O2 -o "$CACHE/bin/pause" "$src/build/pause/linux/pause.c"
  "$CACHE/bin/kube-apiserver" --version
}

install_packages
build_kubernetes
