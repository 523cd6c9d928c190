#!/usr/bin/env bash
# Builds Rancher's local-path provisioner from the Go module next to this script into
# ${FERRY_CACHE:-~/.cache/ferry}/local-path-<version>/local-path-provisioner and prints that path
# (and nothing else). Apart from ../build.sh so that adding it did not invalidate the Kubernetes
# build; idempotent the same way (a stamp keyed by go.mod, go.sum and this script).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
command -v go >/dev/null || { echo "local-path/build.sh: go is not installed" >&2; exit 1; }
version="$(sed -n 's#^require github.com/rancher/local-path-provisioner \(v[0-9.]*\)$#\1#p' go.mod)"
[[ -n "$version" ]] || { echo "local-path/build.sh: cannot read the version from go.mod" >&2; exit 1; }
out="${FERRY_CACHE:-$HOME/.cache/ferry}/local-path-$version"
bin="$out/local-path-provisioner"
stamp="$out/build-$(cat go.mod go.sum build.sh | sha256sum | cut -c1-16).stamp"
if [[ -f "$stamp" && -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$out"
echo "local-path/build.sh: building local-path-provisioner $version (about 4 min cold)" >&2
CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" nice -n 10 go build -trimpath \
  -ldflags "-s -w -X main.VERSION=$version" -o "$bin.partial" github.com/rancher/local-path-provisioner >&2
mv "$bin.partial" "$bin"
rm -f "$out"/build-*.stamp
touch "$stamp"
echo "$bin"
