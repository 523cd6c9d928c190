#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet, kubectl, etcd and helm
# from the Go module next to this script, CoreDNS from coredns/ and MetalLB from metallb/, into
# ${FERRY_CACHE:-~/.cache/ferry}/k8s-<version>/bin.
#
# Idempotent: a stamp keyed by a hash of go.mod, go.sum and this script marks a finished build, so a
# second run does nothing. The binaries are built into a scratch directory and moved into place only
# when all of them built, so an interrupted build never leaves a half-filled bin directory behind.
# Prints the bin directory on stdout (and nothing else).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

command -v go >/dev/null || { echo "build.sh: go is not installed (need Go >= 1.25)" >&2; exit 1; }

k8s_version="$(sed -n 's#^\s*k8s.io/kubernetes \(v[0-9.]*\)$#\1#p' go.mod)"
helm_version="$(sed -n 's#^\s*helm.sh/helm/v3 \(v[0-9.]*\)$#\1#p' go.mod)"
[[ -n "$k8s_version" && -n "$helm_version" ]] || { echo "build.sh: cannot read versions from go.mod" >&2; exit 1; }

cache="${FERRY_CACHE:-$HOME/.cache/ferry}"
out="$cache/k8s-$k8s_version"
bin="$out/bin"
key="$(cat go.mod go.sum coredns/go.mod coredns/go.sum metallb/go.mod metallb/go.sum build.sh | sha256sum | cut -c1-16)"
stamp="$out/build-$key.stamp"
if [[ -f "$stamp" ]]; then
  echo "$bin"
  exit 0
fi

# Go's build and module caches default to ~/.cache/go-build and ~/go/pkg/mod, outside the checkout.
export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false ${GOFLAGS:-}"
GOFLAGS="$(echo "$GOFLAGS" | tr -s ' ')"

major="${k8s_version#v}"; major="${major%%.*}"
minor="${k8s_version#v*.}"; minor="${minor%%.*}"
build_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
# The module zip carries no git metadata; a fixed placeholder commit keeps `version` output parseable.
commit="0000000000000000000000000000000000000000"

ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.buildDate=$build_date -X $pkg.gitCommit=$commit -X $pkg.gitTreeState=clean"
done
ldflags+=" -X helm.sh/helm/v3/internal/version.version=$helm_version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=$major -X $pkg.k8sVersionMinor=$minor"
done
ldflags+=" -s -w"

scratch="$out/bin.partial"
rm -rf "$scratch"
mkdir -p "$scratch"
echo "build.sh: building Kubernetes $k8s_version, etcd, helm $helm_version CoreDNS and MetalLB into $bin (takes ~13 min cold)" >&2
# One `go build` for all commands shares the compiled dependencies and keeps both cores busy; `nice`
# leaves room for the cargo builds running next to it.
nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$scratch/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-proxy \
  k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kubectl \
  go.etcd.io/etcd/server/v3 \
  helm.sh/helm/v3/cmd/helm >&2
# Go names the binary of a /v3 module path after the element before it.
mv "$scratch/server" "$scratch/etcd"
coredns_version="$(sed -n 's#^\s*require github.com/coredns/coredns \(v[0-9.]*\)$#\1#p' coredns/go.mod)"
(cd coredns && nice -n 10 go build -trimpath \
  -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$coredns_version" \
  -o "$scratch/" github.com/coredns/coredns) >&2
# MetalLB: both commands, and the upstream manifest they are deployed with (tests/cluster/metallb.sh).
(cd metallb && nice -n 10 go build -trimpath -ldflags "-s -w" -o "$scratch/metallb/" \
  go.universe.tf/metallb/controller go.universe.tf/metallb/speaker &&
  cp "$(go list -m -f '{{.Dir}}' go.universe.tf/metallb)/config/manifests/metallb-native.yaml" "$scratch/metallb/") >&2
mv "$scratch/metallb/controller" "$scratch/metallb-controller"
mv "$scratch/metallb/speaker" "$scratch/metallb-speaker"
mv "$scratch/metallb/metallb-native.yaml" "$scratch/metallb-native.yaml"
rmdir "$scratch/metallb"
for b in kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl etcd helm coredns metallb-controller metallb-speaker; do
  [[ -x "$scratch/$b" ]] || { echo "build.sh: $b missing after build" >&2; exit 1; }
done
rm -rf "$bin"
mv "$scratch" "$bin"
rm -f "$out"/build-*.stamp
touch "$stamp"
echo "$bin"
