#!/usr/bin/env bash
# Stops every process the local cluster (FERRY_CLUSTER) started (by the pids up.sh and the node
# agents recorded), removes its network namespaces and routes and its state directory. Safe to run
# when no cluster is up.
set -uo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/net.sh"
source "$(dirname "$0")/node-runtime.sh"

# Stops one process (group) politely, then forcefully. $1 = pid, $2 = the program it runs.
stop_pid() {
  local pid="$1" what="$2"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  # A stale pid file may name a pid the system has reused: only stop the process it was.
  tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$what" || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "down.sh: $what (pid $pid) ignored SIGTERM for 10 s, killing it" >&2
  kill -KILL "$pid" 2>/dev/null
  return 0
}

if [[ -d "$pid_dir" ]]; then
  # Reverse start order: nodes first (every process of theirs, pods included), etcd last.
  [[ -f "$pid_dir/ferry-operator.pid" ]] && stop_pid "$(cat "$pid_dir/ferry-operator.pid")" ferry-operator
  for node in ${nodes//,/ }; do
    remove_node "$node" &
  done
  for f in "$pid_dir"/kube-proxy-*.pid; do
    [[ -f "$f" ]] && stop_pid "$(cat "$f")" kube-proxy &
  done
  wait
  for name in kube-scheduler kube-controller-manager kube-apiserver etcd; do
    f="$pid_dir/$name.pid"
    [[ -f "$f" ]] && stop_pid "$(cat "$f")" "$name"
  done
fi
# Nodes whose pid files are gone (an interrupted start) still have cgroups and namespaces.
for node in ${nodes//,/ }; do
  remove_node "$node"
done

net_cluster_down

if [[ -d "$cluster_dir" ]]; then
  if [[ -f "$marker" ]]; then
    rm -rf "$cluster_dir"
  else
    echo "down.sh: $cluster_dir has no $(basename "$marker") marker; not deleting it" >&2
    exit 1
  fi
fi
echo "down.sh: cluster stopped" >&2
