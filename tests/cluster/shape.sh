#!/usr/bin/env bash
# Caps one node's link of the local cluster (FERRY_CLUSTER) as a slower NIC would, in both
# directions, with tc tbf: on the node's eth0 (what leaves the node) and on the router's end of
# its veth (what reaches it). Pod traffic between two pods of one node never crosses the link.
#   tests/cluster/shape.sh NODE RATE     cap at RATE (tc's units: 400mbit, 1gbit, 50mbit)
#   tests/cluster/shape.sh NODE off      remove the cap
#   tests/cluster/shape.sh NODE          print the cap and the link's byte counters
# The counters (tx_bytes: left the node, rx_bytes: reached it) are what benchmarks read to tell
# how much crossed a node's link.
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/net.sh"
source "$(dirname "$0")/node-runtime.sh"
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: $0 NODE [RATE|off]" >&2; exit 2; }
node="$1" rate="${2:-}"
node_number "$node" >/dev/null
ns="$(node_ns "$node")"
port="$(router_port "$node")"
ns_exists "$ns" || { echo "shape.sh: cluster $cluster_name has no running node $node" >&2; exit 1; }

case "$rate" in
  "")
    printf '%s: ' "$node"
    in_ns "$ns" tc qdisc show dev eth0 root | head -1
    for c in tx_bytes rx_bytes; do
      printf '%s %s\n' "$c" "$(in_ns "$ns" cat "/sys/class/net/eth0/statistics/$c")"
    done
    ;;
  off)
    in_ns "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
    in_ns "$router_ns" tc qdisc del dev "$port" root 2>/dev/null || true
    echo "shape.sh: $node uncapped" >&2
    ;;
  *)
    [[ "$rate" =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]] ||
      { echo "shape.sh: RATE is a tc rate such as 400mbit or 1gbit, or off (got $rate)" >&2; exit 2; }
    # A burst of 256 KiB lets one TCP window through at line rate, as a NIC's queue would; 50 ms
    # of queue beyond it, then drops, so TCP finds the rate.
    tbf=(root tbf rate "$rate" burst 256kb latency 50ms)
    in_ns "$ns" tc qdisc replace dev eth0 "${tbf[@]}"
    in_ns "$router_ns" tc qdisc replace dev "$port" "${tbf[@]}"
    echo "shape.sh: $node capped at $rate each way" >&2
    ;;
esac
