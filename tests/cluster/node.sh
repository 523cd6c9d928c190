#!/usr/bin/env bash
# Fails or restores one node of the local cluster (FERRY_CLUSTER), as a power cut would:
#   tests/cluster/node.sh stop NODE    every process of the node dies at once (kubelet, containerd,
#                                      its shims and every container, kube-proxy), its link goes
#                                      down; its Lease stops being renewed; its disk stays
#   tests/cluster/node.sh start NODE   link up, containerd, kubelet and kube-proxy start again;
#                                      returns when the node is Ready
# The real node lifecycle controller does the rest (NotReady after its grace period, taints,
# eviction). In the default cluster node-x is the node for this: it is tainted so only pods that
# tolerate ferry.dev/disruptive land there.
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/net.sh"
source "$(dirname "$0")/procs.sh"
source "$(dirname "$0")/node-runtime.sh"
[[ $# -eq 2 && ( "$1" == stop || "$1" == start ) ]] || { echo "usage: $0 stop|start NODE" >&2; exit 2; }
action="$1" node="$2"
node_number "$node" >/dev/null
ns="$(node_ns "$node")"
[[ -f "$marker" ]] && ns_exists "$ns" || { echo "node.sh: cluster $cluster_name has no running node $node" >&2; exit 1; }

case "$action" in
  stop)
    # The link first: a node without power sends no FIN or reset for its connections, so its
    # peers must find out it is gone by themselves.
    in_ns "$ns" ip link set eth0 down
    stop_node "$node"
    echo "node.sh: $node stopped" >&2
    ;;
  start)
    bin="$("$repo_root/tests/k8s/build.sh")"
    if [[ -f "$pid_dir/kubelet-$node.pid" ]] && kill -0 "$(cat "$pid_dir/kubelet-$node.pid")" 2>/dev/null; then
      echo "node.sh: $node is running" >&2
      exit 0
    fi
    in_ns "$ns" ip link set eth0 up
    in_ns "$ns" ip route replace default via "$router_ip"
    start_node "$node"
    kc() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }
    deadline=$(($(date +%s) + 60))
    until [[ "$(kc get node "$node" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]; do
      for d in containerd kubelet; do
        kill -0 "$(cat "$pid_dir/$d-$node.pid")" 2>/dev/null || { echo "node.sh: $d of $node exited; see $log_dir/$d-$node.log" >&2; exit 1; }
      done
      (($(date +%s) < deadline)) || { echo "node.sh: $node not Ready after 60 s" >&2; exit 1; }
      sleep 0.2
    done
    echo "node.sh: $node started" >&2
    ;;
esac
