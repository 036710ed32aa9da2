#!/usr/bin/env bash
# Stage of scripts/k8s-e2e.sh: the images, without a Docker daemon. `build`: a Debian 12 base
# made with debootstrap (the stand-in for python:3.11-slim-bookworm, which no registry here
# serves) and a Redis image on it, then podman (rootful) runs the project's own Dockerfiles on
# that base; the machine's pip configuration, local package folders and CA bundle (a proxy may
# sign what the registries serve) are mounted read-only for the build steps only. `import`: the
# saved images into the cluster's containerd.
set -euo pipefail
source "$(dirname "$0")/common.sh"
IMAGES="$CACHE/images"
TAG=0.1.0
BASE=localhost/cascade-e2e/python:3.11-bookworm
REDIS=localhost/cascade-e2e/redis:7-bookworm
CPU=ghcr.io/cascade-serving/cascade-cpu:$TAG
GATEWAY=ghcr.io/cascade-serving/cascade-gateway:$TAG
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
TORCH_INDEX_URL="${E2E_TORCH_INDEX_URL:-https://pypi.org/simple}"  # +cpu wheels come from find-links

rootfs_image() {  # rootfs_image TAG PACKAGES...: debootstrap minbase + packages, imported
  local tag="$1"; shift
  "${PODMAN[@]}" image exists "$tag" && return
  local root="$CACHE/rootfs-build"
  rm -rf "$root"
  if [ ! -f "$CACHE/minbase.tar" ]; then
    log "images: debootstrap Debian 12 minbase"
    debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >"$CACHE/debootstrap.log" 2>&1 \
      || die "debootstrap failed ($CACHE/debootstrap.log)"
    tar -C "$root" -cf "$CACHE/minbase.tar" .
  else
    mkdir -p "$root" && tar -C "$root" -xf "$CACHE/minbase.tar"
  fi
  log "images: $tag ($*)"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  mount --bind /proc "$root/proc"
  chroot "$root" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $* >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*" \
    || { umount "$root/proc"; die "packages for $tag failed"; }
  umount "$root/proc"
  : > "$root/etc/resolv.conf"
  tar -C "$root" -c . | "${PODMAN[@]}" import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$tag" >/dev/null
  rm -rf "$root"
}

pip_config() {  # the machine's pip settings, for the build containers
  local conf="$CACHE/pip.conf"
  { echo "[global]"
    python3 -m pip config list 2>/dev/null | sed -E "s/^[^.]*\.//; s/='(.*)'$/ = \1/" | sort -u -t= -k1,1
  } > "$conf"
  echo "$conf"
}

build_mounts() {
  local args=(-v "$(pip_config):/etc/pip.conf:ro")
  for d in /etc/xdg/pip /opt/wheels /opt/pypi /opt/pypi-more /etc/ssl/certs/ca-certificates.crt; do
    [ -e "$d" ] && args+=(-v "$d:$d:ro")
  done
  printf '%s\n' "${args[@]}"
}

context_hash() {  # the files a Dockerfile's COPY steps can see, as git sees the work tree
  (cd "$REPO" && git ls-files -z -co --exclude-standard -- pyproject.toml README.md cascade \
    drafter_service verifier_service gateway docker | xargs -0 sha256sum | sha256sum | cut -c1-16)
}

dockerfile_image() {  # dockerfile_image TAG DOCKERFILE
  local stamp="$IMAGES/$(basename "$2").context" hash
  hash="$(context_hash)"
  if "${PODMAN[@]}" image exists "$1" && [ "$hash" = "$(cat "$stamp" 2>/dev/null)" ]; then
    log "images: $1 is up to date"; return
  fi
  log "images: $1 from $2 (podman build)"
  local mounts; mapfile -t mounts < <(build_mounts)
  "${PODMAN[@]}" build --network host --layers "${mounts[@]}" -f "$REPO/$2" \
    --build-arg PYTHON_IMAGE="$BASE" --build-arg TORCH_INDEX_URL="$TORCH_INDEX_URL" \
    -t "$1" "$REPO" >"$CACHE/build-$(basename "$2").log" 2>&1 || { tail -20 "$CACHE/build-$(basename "$2").log"; die "podman build of $2 failed"; }
  echo "$hash" > "$stamp"
}

pause_image() {
  "${PODMAN[@]}" image exists cascade.local/pause:1 && return
  local dir; dir="$(mktemp -d)"
  cp "$CACHE/bin/pause" "$dir/pause"
  tar -C "$dir" -c pause | "${PODMAN[@]}" import --change 'ENTRYPOINT ["/pause"]' - cascade.local/pause:1 >/dev/null
  rm -rf "$dir"
}

build() {
  mkdir -p "$IMAGES"
  rootfs_image "$BASE" python3 python3-venv python-is-python3 ca-certificates passwd
  rootfs_image "$REDIS" redis-server redis-tools procps
  pause_image
  dockerfile_image "$CPU" docker/Dockerfile.cpu
  dockerfile_image "$GATEWAY" docker/Dockerfile.gateway
  local images=("$CPU" "$GATEWAY" "$REDIS" cascade.local/pause:1) ids
  ids="$("${PODMAN[@]}" image inspect --format '{{.Id}}' "${images[@]}")"
  if [ -f "$IMAGES/all.tar" ] && [ "$ids" = "$(cat "$IMAGES/ids" 2>/dev/null)" ]; then
    log "images: unchanged since the last save"; return
  fi
  log "images: saving for containerd"
  "${PODMAN[@]}" save --format docker-archive -m -o "$IMAGES/all.tar.new" "${images[@]}"
  mv "$IMAGES/all.tar.new" "$IMAGES/all.tar"
  echo "$ids" > "$IMAGES/ids"
}

import() {
  [ -f "$IMAGES/all.tar" ] || die "no images: run scripts/k8s_e2e/images.sh build first"
  if cmp -s "$IMAGES/ids" "$CACHE/containerd.ids" \
      && ctr -a "$RUN/containerd.sock" -n k8s.io images ls -q | grep -qx "$CPU"; then
    log "images: already in containerd"; return
  fi
  log "images: importing into containerd"
  ctr -a "$RUN/containerd.sock" -n k8s.io images import --no-unpack=false "$IMAGES/all.tar" >/dev/null
  cp "$IMAGES/ids" "$CACHE/containerd.ids"
}

case "${1:-}" in
  build) build ;;
  import) import ;;
  *) echo "usage: $0 build|import" >&2; exit 2 ;;
esac
