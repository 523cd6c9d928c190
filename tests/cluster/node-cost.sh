#!/usr/bin/env bash
# What an idle node costs: CPU (share of one core over SECONDS, default 30) and RSS of each node's
# kubelet, containerd, kube-proxy and containerd shims, for every node of the cluster(s) running.
#   tests/cluster/node-cost.sh [SECONDS]
set -euo pipefail
source "$(dirname "$0")/common.sh"
seconds="${1:-30}"
hz="$(getconf CLK_TCK)"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
declare -A pids_of
for dir in "$cache_dir"/cluster "$cache_dir"/cluster-*; do
  [[ -d "$dir/pids" ]] || continue
  for f in "$dir"/pids/{kubelet,containerd,kube-proxy}-*.pid; do
    [[ -f "$f" ]] || continue
    pids_of["$(basename "$f" .pid)"]="$(cat "$f")"
  done
done
# Shims: the containerd-shim processes in each node's daemons cgroup (node-runtime.sh).
for g in /sys/fs/cgroup/pids/ferry*.daemons; do
  [[ -d "$g" ]] || continue
  shims=""
  for p in $(cat "$g/cgroup.procs"); do
    [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == containerd-shim* ]] && shims+="${shims:+,}$p"
  done
  name="$(basename "$g" .daemons)"
  [[ -n "$shims" ]] && pids_of["shims-${name#ferry?-}"]="$shims"
done
declare -A before
for name in "${!pids_of[@]}"; do
  t=0
  for p in ${pids_of[$name]//,/ }; do t=$((t + $(ticks "$p"))); done
  before[$name]=$t
done
sleep "$seconds"
printf '%-24s %8s %10s\n' process "cpu %" "rss MiB"
for name in $(printf '%s\n' "${!pids_of[@]}" | sort); do
  t=0 r=0
  for p in ${pids_of[$name]//,/ }; do t=$((t + $(ticks "$p"))); r=$((r + $(rss_kib "$p"))); done
  awk -v n="$name" -v d=$((t - ${before[$name]})) -v hz="$hz" -v s="$seconds" -v r="$r" \
    'BEGIN { printf "%-24s %8.2f %10.1f\n", n, 100 * d / hz / s, r / 1024 }'
done
