# Shared settings for the local cluster scripts (sourced, not run).
# Fixed places: state in $FERRY_CLUSTER_DIR (default ~/.cache/ferry/cluster), kubeconfig at
# $FERRY_CLUSTER_DIR/kubeconfig, node N's host filesystem at $FERRY_CLUSTER_DIR/nodes/N/.
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cache_dir="${FERRY_CACHE:-$HOME/.cache/ferry}"
cluster_dir="${FERRY_CLUSTER_DIR:-$cache_dir/cluster}"
kubeconfig="$cluster_dir/kubeconfig"
pid_dir="$cluster_dir/pids"
log_dir="$cluster_dir/logs"
pki_dir="$cluster_dir/pki"
# The marker down.sh checks before it deletes anything: only a directory up.sh created is removed.
marker="$cluster_dir/.ferry-cluster"

etcd_port="${FERRY_ETCD_PORT:-23790}"
etcd_peer_port="${FERRY_ETCD_PEER_PORT:-23800}"
apiserver_port="${FERRY_APISERVER_PORT:-6443}"
kcm_port="${FERRY_KCM_PORT:-10357}"
scheduler_port="${FERRY_SCHEDULER_PORT:-10359}"
nodes="${FERRY_NODES:-node-a,node-b}"
# debug or release: which build of the workspace binaries the pods run.
profile="${FERRY_PROFILE:-debug}"

# True when a cluster started by up.sh is serving: its node agent runs and the apiserver is ready.
# $1 = kubectl binary.
cluster_running() {
  local pid
  [[ -f "$kubeconfig" && -f "$pid_dir/node-agent.pid" ]] || return 1
  pid="$(cat "$pid_dir/node-agent.pid")"
  kill -0 "$pid" 2>/dev/null || return 1
  "$1" --kubeconfig "$kubeconfig" get --raw /readyz >/dev/null 2>&1
}
