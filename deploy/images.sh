#!/usr/bin/env bash
# ferry's images (deploy/Dockerfile), built without a daemon:
#   deploy/images.sh context DIR          stages the build context (each image's root) into DIR,
#                                         for `docker build` / `podman build` of deploy/Dockerfile
#   deploy/images.sh build                builds ferry-operator and ferry-mover with buildah as
#                                         localhost/ferry/NAME:TAG and prints their sizes
#   deploy/images.sh push REGISTRY        pushes them to REGISTRY (host[:port][/prefix]) as
#                                         REGISTRY/NAME:TAG and prints each reference by digest
# Binaries come from $BIN_DIR (default target/release). TAG defaults to the workspace version.
# PLAIN_HTTP=1 pushes to a registry without TLS. Needs buildah (Debian's package) for build and push.
set -euo pipefail
repo_root="$(cd "$(dirname "$0")/.." && pwd)"
source "$repo_root/deploy/rootfs.sh"
bin_dir="${BIN_DIR:-$repo_root/target/release}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo_root/Cargo.toml" | head -n1)"
tag="${TAG:-$version}"
revision="$(git -C "$repo_root" rev-parse HEAD 2>/dev/null || echo unknown)"
images=(ferry-operator ferry-mover)
# Debug information stays beside the build, not in the images.
export DEBUG_DIR="${DEBUG_DIR:-$repo_root/target/images/debug}"

stage_context() {
  local dir="$1" name
  rm -rf "$dir"
  for name in "${images[@]}"; do
    [[ -x "$bin_dir/$name" ]] || { echo "images.sh: $bin_dir/$name is missing (cargo build --release)" >&2; exit 1; }
    rootfs_add_program "$dir/$name" "$bin_dir/$name" "/usr/local/bin/$name"
    rootfs_add_users "$dir/$name"
  done
}

case "${1:-}" in
  context)
    stage_context "${2:?usage: images.sh context DIR}"
    ;;
  build)
    ctx="$repo_root/target/images/context"
    stage_context "$ctx"
    for name in "${images[@]}"; do
      buildah bud -q --layers=false --target "$name" -f "$repo_root/deploy/Dockerfile" \
        --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
        --annotation "org.opencontainers.image.source=https://github.com/ferry-dev/ferry" \
        --annotation "org.opencontainers.image.version=$version" \
        --annotation "org.opencontainers.image.revision=$revision" \
        -t "localhost/ferry/$name:$tag" "$ctx" >/dev/null
      printf 'images.sh: localhost/ferry/%s:%s  binary %s, image %s (uncompressed)\n' "$name" "$tag" \
        "$(du -h "$ctx/$name/usr/local/bin/$name" | cut -f1)" "$(du -sh "$ctx/$name" | cut -f1)"
    done
    ;;
  push)
    registry="${2:?usage: images.sh push REGISTRY}"
    tls=()
    [[ "${PLAIN_HTTP:-0}" == 1 ]] && tls=(--tls-verify=false)
    for name in "${images[@]}"; do
      digest_file="$(mktemp)"
      buildah push -q "${tls[@]}" --digestfile "$digest_file" "localhost/ferry/$name:$tag" "docker://$registry/$name:$tag"
      echo "$registry/$name:$tag@$(cat "$digest_file")"
      rm -f "$digest_file"
    done
    ;;
  *)
    sed -n '2,11p' "$0" >&2
    exit 2
    ;;
esac
