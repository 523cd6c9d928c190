# Shared settings for the local cluster scripts (sourced, not run).
# FERRY_CLUSTER names the cluster (default `ferry`; `peer` is the second one the tests use); the
# name selects the state directory, the node names and the address ranges, so two clusters run
# side by side. Fixed places: state in $FERRY_CLUSTER_DIR (default ~/.cache/ferry/cluster; other
# clusters always ~/.cache/ferry/cluster-<name>), kubeconfig at <state>/kubeconfig, node N's host
# filesystem at <state>/nodes/N/.
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cache_dir="${FERRY_CACHE:-$HOME/.cache/ferry}"
cluster_name="${FERRY_CLUSTER:-ferry}"
case "$cluster_name" in
  ferry) cluster_index=0 default_nodes=node-a,node-b,node-c,node-d,node-e,node-x ;;
  peer) cluster_index=1 default_nodes=peer-a,peer-b ;;
  *) cluster_index="${FERRY_CLUSTER_INDEX:-}" default_nodes="$cluster_name-a,$cluster_name-b" ;;
esac
if ! [[ "$cluster_index" =~ ^[0-7]$ && "$cluster_name" =~ ^[a-z][a-z0-9]{0,9}$ ]]; then
  echo "cluster $cluster_name: a name of up to 10 lower-case letters and digits, and FERRY_CLUSTER_INDEX 2-7 for names other than ferry and peer" >&2
  exit 1
fi
if [[ "$cluster_name" == ferry ]]; then
  cluster_dir="${FERRY_CLUSTER_DIR:-$cache_dir/cluster}"
else
  # Not FERRY_CLUSTER_DIR: a shell pointed at the default cluster (env.sh) must not send a second
  # cluster into the first one's directory.
  cluster_dir="$cache_dir/cluster-$cluster_name"
fi
kubeconfig="$cluster_dir/kubeconfig"
# The kubeconfig's context (and cluster) name.
if [[ "$cluster_name" == ferry ]]; then kube_context=ferry-local; else kube_context="ferry-$cluster_name"; fi
pid_dir="$cluster_dir/pids"
log_dir="$cluster_dir/logs"
pki_dir="$cluster_dir/pki"
# The marker down.sh checks before it deletes anything: only a directory up.sh created is removed.
marker="$cluster_dir/.ferry-cluster"

# The control plane has a network namespace of its own, so these ports never meet the host's.
etcd_port=2379
etcd_peer_port=2380
apiserver_port=6443
kcm_port=10257
scheduler_port=10259
# Node names. In the default cluster node-x is tainted ferry.dev/disruptive: tests that stop a node
# use it, so no other test's pod is evicted.
nodes="${FERRY_NODES:-$default_nodes}"

# Addresses (cluster index c): nodes 10.(100+c).0.11+, control plane 10.(100+c).0.2, the router
# 10.(100+c).0.1, node k's pods 10.(100+c).(128+k).0/24, Services 10.(96+c).0.0/16.
net_prefix="10.$((100 + cluster_index))"
cluster_block="$net_prefix.0.0/16"
router_ip="$net_prefix.0.1"
apiserver_ip="$net_prefix.0.2"
pod_range="$net_prefix.128.0/17"
service_range="10.$((96 + cluster_index)).0.0/16"
kubernetes_service_ip="10.$((96 + cluster_index)).0.1"
dns_service_ip="10.$((96 + cluster_index)).0.10"
netns_prefix="ferry${cluster_index}"
# $1 = node name: its position (1-based) in $nodes.
node_number() {
  local i=1 n
  for n in ${nodes//,/ }; do
    [[ "$n" == "$1" ]] && { echo "$i"; return 0; }
    i=$((i + 1))
  done
  echo "no node $1 in cluster $cluster_name ($nodes)" >&2
  return 1
}
node_ip() { echo "$net_prefix.0.$((10 + $(node_number "$1")))"; }
node_pod_cidr() { echo "$net_prefix.$((128 + $(node_number "$1"))).0/24"; }
# debug or release: which build of the workspace binaries the pods run.
profile="${FERRY_PROFILE:-debug}"

# True when a cluster started by up.sh is serving: its apiserver runs and is ready.
# $1 = kubectl binary.
cluster_running() {
  local pid
  [[ -f "$kubeconfig" && -f "$pid_dir/kube-apiserver.pid" ]] || return 1
  pid="$(cat "$pid_dir/kube-apiserver.pid")"
  kill -0 "$pid" 2>/dev/null || return 1
  "$1" --kubeconfig "$kubeconfig" get --raw /readyz >/dev/null 2>&1
}
