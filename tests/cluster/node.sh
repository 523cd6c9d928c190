#!/usr/bin/env bash
# Fails or restores one node of the local cluster (FERRY_CLUSTER), as a power cut would:
#   tests/cluster/node.sh stop NODE    every process of the node dies at once (agent, kube-proxy,
#                                      pods), its link goes down; its Lease stops being renewed
#   tests/cluster/node.sh start NODE   link up, agent and kube-proxy start again; returns when Ready
# The real node lifecycle controller does the rest (NotReady after its grace period, taints,
# eviction). In the default cluster node-x is the node for this: it is tainted so only pods that
# tolerate ferry.dev/disruptive land there.
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/net.sh"
source "$(dirname "$0")/procs.sh"
[[ $# -eq 2 && ( "$1" == stop || "$1" == start ) ]] || { echo "usage: $0 stop|start NODE" >&2; exit 2; }
action="$1" node="$2"
node_number "$node" >/dev/null
ns="$netns_prefix-$node"
[[ -f "$marker" ]] && ns_exists "$ns" || { echo "node.sh: cluster $cluster_name has no running node $node" >&2; exit 1; }

case "$action" in
  stop)
    for name in "node-agent-$node" "kube-proxy-$node"; do
      pid="$(cat "$pid_dir/$name.pid" 2>/dev/null || true)"
      [[ "$pid" =~ ^[0-9]+$ ]] && kill -KILL "$pid" 2>/dev/null || true
      rm -f "$pid_dir/$name.pid"
    done
    # Pods in their own namespaces, then whatever still runs in the node's (hostNetwork pods).
    net_node_pods_kill "$node"
    ip netns pids "$ns" | xargs -r kill -KILL 2>/dev/null || true
    in_ns "$ns" ip link set eth0 down
    echo "node.sh: $node stopped" >&2
    ;;
  start)
    bin="$("$repo_root/tests/k8s/build.sh")"
    target_dir="${CARGO_TARGET_DIR:-$repo_root/target}/$profile"
    if [[ -f "$pid_dir/node-agent-$node.pid" ]] && kill -0 "$(cat "$pid_dir/node-agent-$node.pid")" 2>/dev/null; then
      echo "node.sh: $node is running" >&2
      exit 0
    fi
    in_ns "$ns" ip link set eth0 up
    in_ns "$ns" ip route replace default via "$router_ip"
    start_node "$node"
    kc() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }
    deadline=$(($(date +%s) + 60))
    until [[ "$(kc get node "$node" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]; do
      kill -0 "$(cat "$pid_dir/node-agent-$node.pid")" 2>/dev/null || { echo "node.sh: the agent of $node exited; see $log_dir/node-agent-$node.log" >&2; exit 1; }
      (($(date +%s) < deadline)) || { echo "node.sh: $node not Ready after 60 s" >&2; exit 1; }
      sleep 0.2
    done
    echo "node.sh: $node started" >&2
    ;;
esac
