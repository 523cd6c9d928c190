#!/usr/bin/env bash
# Builds kube-network-policies (the NetworkPolicy agent of the local clusters) from the Go module
# next to this script into ${FERRY_CACHE:-~/.cache/ferry}/netpol-<version>/kube-network-policies.
#
# Idempotent: a stamp keyed by a hash of go.mod, go.sum and this script marks a finished build.
# Prints the binary's path on stdout (and nothing else).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
command -v go >/dev/null || { echo "netpol/build.sh: go is not installed" >&2; exit 1; }

version="$(sed -n 's#^require sigs.k8s.io/kube-network-policies \(v[0-9.]*\)$#\1#p' go.mod)"
[[ -n "$version" ]] || { echo "netpol/build.sh: cannot read the version from go.mod" >&2; exit 1; }
out="${FERRY_CACHE:-$HOME/.cache/ferry}/netpol-$version"
key="$(cat go.mod go.sum build.sh | sha256sum | cut -c1-16)"
if [[ -f "$out/build-$key.stamp" ]]; then
  echo "$out/kube-network-policies"
  exit 0
fi
export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false ${GOFLAGS:-}"
mkdir -p "$out"
rm -rf "$out/partial"
echo "netpol/build.sh: building kube-network-policies $version into $out (about 2 min cold)" >&2
nice -n 10 go build -trimpath -ldflags "-s -w" -o "$out/partial/" sigs.k8s.io/kube-network-policies/cmd >&2
mv "$out/partial/cmd" "$out/kube-network-policies"
rm -rf "$out/partial"
touch "$out/build-$key.stamp"
echo "$out/kube-network-policies"
