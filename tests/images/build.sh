#!/usr/bin/env bash
# Builds every image the local clusters run and pushes it to their registry:
#   tests/images/build.sh REGISTRY ENV_FILE
# ferry-operator and ferry-mover from deploy/Dockerfile (the recipe users build), the rest from
# tests/images/Dockerfile, all with buildah. Binaries: the workspace's $FERRY_PROFILE build
# (debug by default), the Kubernetes cache's CoreDNS and MetalLB, the local-path provisioner, kube-network-policies, the pause program next to this
# script. Each image is tagged with a digest of its staged root, so an unchanged image is neither
# rebuilt nor pushed again. Writes ENV_FILE: one FERRY_IMAGE_<NAME>=REGISTRY/NAME:TAG per image.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo_root="$(cd "$here/../.." && pwd)"
source "$repo_root/deploy/rootfs.sh"
registry="${1:?usage: build.sh REGISTRY ENV_FILE}"
env_file="${2:?usage: build.sh REGISTRY ENV_FILE}"
cache="${FERRY_CACHE:-$HOME/.cache/ferry}"
profile="${FERRY_PROFILE:-debug}"
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}/$profile"
k8s_bin="$("$repo_root/tests/k8s/build.sh")"
work="$cache/images/$profile"
mkdir -p "$work"
# Two clusters start at once: one build at a time.
exec {lock_fd}>"$cache/images/build.lock"
flock "$lock_fd"

# The pause program, rebuilt when its source changes.
pause_bin="$cache/images/pause-$(cat "$here/pause/go.mod" "$here/pause/main.go" | sha256sum | cut -c1-12)"
if [[ ! -x "$pause_bin" ]]; then
  (cd "$here/pause" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$pause_bin.partial" .)
  mv "$pause_bin.partial" "$pause_bin"
fi

ctx="$work/context"
rm -rf "$ctx"
BIN_DIR="$target_dir" DEBUG_DIR="$work/debug" "$repo_root/deploy/images.sh" context "$ctx"
rootfs_add_program "$ctx/pause" "$pause_bin" /pause
rootfs_add_program "$ctx/coredns" "$k8s_bin/coredns" /coredns
rootfs_add_program "$ctx/metallb-controller" "$k8s_bin/metallb-controller" /controller
rootfs_add_program "$ctx/metallb-speaker" "$k8s_bin/metallb-speaker" /speaker
rootfs_add_program "$ctx/local-path-provisioner" "$("$repo_root/tests/k8s/local-path/build.sh")" /local-path-provisioner
rootfs_add_program "$ctx/kube-network-policies" "$("$repo_root/tests/k8s/netpol/build.sh")" /bin/netpol
rootfs_add_program "$ctx/ferry-cluster-probe" "$target_dir/ferry-cluster-probe" /usr/local/bin/ferry-cluster-probe
rootfs_add_users "$ctx/ferry-cluster-probe"
tools="$ctx/ferry-test-tools"
rootfs_add_program "$tools" "$(command -v busybox)" /bin/busybox
for applet in $(busybox --list); do
  [[ -e "$tools/bin/$applet" ]] || ln -s busybox "$tools/bin/$applet"
done
for program in socat curl openssl getent; do
  rm -f "$tools/bin/$program"
  rootfs_add_program "$tools" "$(command -v "$program")" "/usr/bin/$program"
done
# openssl reads its configuration from OPENSSLDIR (req needs it).
install -D -m 0644 /etc/ssl/openssl.cnf "$tools/usr/lib/ssl/openssl.cnf"
rootfs_add_users "$tools"
install -d -m 1777 "$tools/tmp" "$tools/var/tmp"

# $1 = stage name -> image path under the registry.
image_path() {
  case "$1" in
    metallb-controller) echo metallb/controller ;;
    metallb-speaker) echo metallb/speaker ;;
    *) echo "$1" ;;
  esac
}
# True when the registry already holds $1:$2.
registry_has() {
  curl -fs -o /dev/null -I --max-time 10 \
    -H 'Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json' \
    "http://${registry%%/*}/v2/${registry#*/}/$1/manifests/$2"
}

revision="$(git -C "$repo_root" rev-parse HEAD 2>/dev/null || echo unknown)"
: >"$env_file.partial"
for stage in ferry-operator ferry-mover pause coredns metallb-controller metallb-speaker local-path-provisioner kube-network-policies ferry-cluster-probe ferry-test-tools; do
  path="$(image_path "$stage")"
  tag="$(rootfs_digest "$ctx/$stage")"
  ref="$registry/$path:$tag"
  if ! registry_has "$path" "$tag"; then
    case "$stage" in
      ferry-operator | ferry-mover) recipe="$repo_root/deploy/Dockerfile" ;;
      *) recipe="$here/Dockerfile" ;;
    esac
    buildah bud -q --layers=false --target "$stage" -f "$recipe" \
      --build-arg "VERSION=dev-$tag" --build-arg "REVISION=$revision" -t "localhost/ferry-test/$path:$tag" "$ctx" >/dev/null
    buildah push -q --tls-verify=false "localhost/ferry-test/$path:$tag" "docker://$ref"
    buildah rmi "localhost/ferry-test/$path:$tag" >/dev/null
    echo "build.sh: pushed $ref ($(du -sh "$ctx/$stage" | cut -f1) uncompressed)" >&2
  fi
  printf 'FERRY_IMAGE_%s=%s\n' "$(echo "$stage" | tr 'a-z-' 'A-Z_')" "$ref" >>"$env_file.partial"
done
mv "$env_file.partial" "$env_file"
