#!/usr/bin/env bash
# Installs the Debian packages ferry's tests and benchmarks need, once. Idempotent: a stamp file
# records the package list that was installed, so a second run with the same list does nothing.
set -euo pipefail

packages=(
  # benchmark peers and references
  rsync openssh-server openssh-client stunnel4 socat time
  # benchmark harness: dataset keystream (openssl), text-ratio self-test (zstd), tar reference,
  # unshare/findmnt (util-linux); the harness itself is Python 3 stdlib only
  openssl zstd tar util-linux python3
  # network namespaces and traffic shaping for network tests
  iproute2
  # local Kubernetes cluster: certificates, health checks, port checks
  openssl curl ca-certificates
  # the cluster's network: kube-proxy's iptables (nf_tables backend) and conntrack, the router's
  # filter, DNS and reachability checks in tests
  iptables conntrack iputils-ping dnsutils
  # the local clusters' nodes: one containerd (with runc) per node, the CNI bridge/host-local/loopback
  # plugins, the plain-HTTP registry the nodes pull from, and the daemonless image builder
  containerd runc containernetworking-plugins docker-registry buildah
  # images: strip/objcopy (binaries without their debug info), a static shell for the test tools image
  binutils busybox-static
  # the Argo CD health check's test: the Lua interpreter and its JSON module
  lua5.4 lua-cjson
)

cache="${FERRY_CACHE:-$HOME/.cache/ferry}"
stamp="$cache/apt-${#packages[@]}-$(printf '%s\n' "${packages[@]}" | md5sum | cut -c1-12).stamp"
if [[ -f "$stamp" ]]; then
  exit 0
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "deps.sh: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
mkdir -p "$cache"
touch "$stamp"
