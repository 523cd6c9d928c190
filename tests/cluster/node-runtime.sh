# A real node of the local cluster: containerd (with runc and the CNI bridge plugin) and the
# kubelet, both in the node's network namespace and in a mount namespace of the node's own
# (sourced by up.sh, node.sh and down.sh after common.sh and net.sh; needs root).
#
# The node's disk: hostPath /data, /var/lib/ferry and /mnt/disks on node N are bind mounts of
# <state>/nodes/N/{data,var/lib/ferry,mnt/disks} inside N's mount namespace, so two nodes never
# share a host directory and the tests read a node's files from the machine. Everything the
# daemons keep lives under <state>/node-state/N (kubelet root, container images, pod logs, CNI
# addresses) and /run/ferry-nodes/<netns> (sockets, runtime state). Each node's processes, pods
# included, live in two cgroup trees, /<netns> (the kubelet's cgroupRoot) and /<netns>.daemons,
# so stopping a node kills exactly its processes.

node_run_root=/run/ferry-nodes
# Host directories each node sees as its own.
node_disk_dirs=(data var/lib/ferry mnt/disks)

node_ns() { echo "$netns_prefix-$1"; }
node_run_dir() { echo "$node_run_root/$(node_ns "$1")"; }
node_state_dir() { echo "$cluster_dir/node-state/$1"; }
node_cgroup() { echo "/$(node_ns "$1")"; }
node_cgroup_hierarchies() {
  local h
  for h in /sys/fs/cgroup/*/; do
    h="${h%/}"
    [[ "$(basename "$h")" == unified ]] && continue
    [[ -f "$h/cgroup.procs" ]] && echo "$h"
  done
}

# Creates the node's cgroups (kubelet root and daemons) in every v1 hierarchy. The kubelet does not
# create its cgroupRoot, and a new cpuset cgroup has no CPUs until given its parent's.
node_cgroups_up() {
  local node="$1" h g
  for h in $(node_cgroup_hierarchies); do
    for g in "$(node_cgroup "$node")" "$(node_cgroup "$node").daemons"; do
      mkdir -p "$h$g"
      if [[ -f "$h/cpuset.cpus" ]]; then
        cat "$h/cpuset.cpus" >"$h$g/cpuset.cpus"
        cat "$h/cpuset.mems" >"$h$g/cpuset.mems"
      fi
    done
  done
}

# Every pid in the node's cgroups (pods, shims, daemons).
node_pids() {
  local node="$1" h g
  h="/sys/fs/cgroup/pids"
  [[ -d "$h" ]] || h="$(node_cgroup_hierarchies | head -n1)"
  for g in "$(node_cgroup "$node")" "$(node_cgroup "$node").daemons"; do
    [[ -d "$h$g" ]] && find "$h$g" -name cgroup.procs -exec cat {} + 2>/dev/null
  done
  return 0
}

# Kills every process of the node at once (a power cut): frozen first, so nothing forks or
# restarts in between, then SIGKILL, then thawed so the kills land.
node_kill_all() {
  local node="$1" g c freezer=/sys/fs/cgroup/freezer deadline
  g="$(node_cgroup "$node")"
  for c in "$g" "$g.daemons"; do
    [[ -d "$freezer$c" ]] && echo FROZEN >"$freezer$c/freezer.state"
  done
  # A process that exited since it was listed makes kill fail: not an error here.
  node_pids "$node" | xargs -r kill -KILL 2>/dev/null || true
  for c in "$g" "$g.daemons"; do
    [[ -d "$freezer$c" ]] && echo THAWED >"$freezer$c/freezer.state"
  done
  deadline=$(($(date +%s) + 20))
  while [[ -n "$(node_pids "$node")" ]]; do
    node_pids "$node" | xargs -r kill -KILL 2>/dev/null || true
    (($(date +%s) < deadline)) || { echo "node-runtime: processes of $node survive SIGKILL: $(node_pids "$node" | tr '\n' ' ')" >&2; return 1; }
    sleep 0.1
  done
}

# Removes the node's cgroups (after node_kill_all), deepest first.
node_cgroups_down() {
  local node="$1" h g
  for h in $(node_cgroup_hierarchies); do
    for g in "$(node_cgroup "$node")" "$(node_cgroup "$node").daemons"; do
      [[ -d "$h$g" ]] && find "$h$g" -depth -type d -exec rmdir {} \; 2>/dev/null
    done
  done
  return 0
}

# The node's mount namespace, kept by a bind mount of it at <run dir>/mnt, with the node's disk
# mounted over /data, /var/lib/ferry and /mnt/disks. Mounts made on the host still propagate in
# (slave), the node's never leak out.
node_mount_ns_up() {
  local node="$1" run d
  run="$(node_run_dir "$node")"
  # A namespace file may only be bind-mounted onto a private mount.
  if ! findmnt -n "$node_run_root" >/dev/null; then
    mkdir -p "$node_run_root"
    mount --bind "$node_run_root" "$node_run_root"
    mount --make-private "$node_run_root"
  fi
  mkdir -p "$run"
  findmnt -n "$run/mnt" >/dev/null && return 0
  touch "$run/mnt"
  unshare --mount="$run/mnt" --propagation slave true
  for d in "${node_disk_dirs[@]}"; do
    mkdir -p "$cluster_dir/nodes/$node/$d" "/$d"
    nsenter --mount="$run/mnt" mount --bind "$cluster_dir/nodes/$node/$d" "/$d"
  done
  # The kubelet links container logs from /var/log/containers, a path it does not let one choose.
  mkdir -p "$(node_state_dir "$node")/var-log"
  nsenter --mount="$run/mnt" mount --bind "$(node_state_dir "$node")/var-log" /var/log
}

node_mount_ns_down() {
  local run
  run="$(node_run_dir "$1")"
  umount "$run/mnt" 2>/dev/null
  rm -rf "$run"
  return 0
}

# Runs a command in node $1's namespaces (network and mount).
in_node() {
  local node="$1"
  shift
  nsenter --mount="$(node_run_dir "$node")/mnt" --net="/run/netns/$(node_ns "$node")" "$@"
}

# The node's configuration files: containerd's, the CNI network, the registry's hosts.toml and the
# kubelet's. Written once per cluster start; node.sh start reuses them.
node_config() {
  local node="$1" run state ip cidr gw
  run="$(node_run_dir "$node")"
  state="$(node_state_dir "$node")"
  ip="$(node_ip "$node")"
  cidr="$(node_pod_cidr "$node")"
  gw="${cidr%.0/24}.1"
  mkdir -p "$state/cni/net.d" "$state/certs.d/$registry_addr" "$state/pod-logs"
  cat >"$state/containerd.toml" <<TOML
version = 2
root = "$state/containerd"
state = "$run/containerd"
# The CRI plugin is all the kubelet uses.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "$run/containerd.sock"
[ttrpc]
  address = "$run/containerd-ttrpc.sock"
[debug]
  address = "$run/containerd-debug.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$state/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$FERRY_IMAGE_PAUSE"
  # The machine's bounding set lacks CAP_SYS_RESOURCE: lowering oom_score_adj would fail.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$run/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$state/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$state/certs.d"
TOML
  cat >"$state/certs.d/$registry_addr/hosts.toml" <<TOML
server = "http://$registry_addr"
[host."http://$registry_addr"]
  capabilities = ["pull", "resolve"]
TOML
  # Pods on a bridge in the node's namespace; the router routes the node's pod range to it.
  cat >"$state/cni/net.d/10-ferry.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "ferry",
  "plugins": [
    {
      "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$state/cni/ipam",
        "ranges": [[{"subnet": "$cidr", "gateway": "$gw"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
  cat >"$state/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki_dir/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $pki_dir/kubelet-$node.crt
tlsPrivateKeyFile: $pki_dir/kubelet-$node.key
containerRuntimeEndpoint: unix://$run/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: $(node_cgroup "$node")
# The machine has cgroup v1 (hybrid); 1.35 refuses it unless told.
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
clusterDNS: [$dns_service_ip]
clusterDomain: cluster.local
resolvConf: ""
podLogsDir: $state/pod-logs
serializeImagePulls: false
# The nodes share the machine's one disk and memory, which the tests' builds fill and empty
# while they run: a kubelet that saw a moment's pressure would taint its node for minutes
# (and a sibling that sampled a second later would not). "0%" turns each signal off.
evictionHard: {memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%", imagefs.inodesFree: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusReportFrequency: 10s
maxPods: 110
YAML
  write_kubeconfig "$state/kubelet.kubeconfig" "kubelet-client-$node"
}

# Starts node $1's containerd and kubelet (and kube-proxy) in the node's namespaces.
start_node() {
  local node="$1" run state
  run="$(node_run_dir "$node")"
  state="$(node_state_dir "$node")"
  node_cgroups_up "$node"
  node_mount_ns_up "$node"
  mkdir -p "$run"
  # Same-node Service traffic crosses the pods' bridge: it must pass through kube-proxy's rules.
  in_ns "$(node_ns "$node")" sysctl -qw net.bridge.bridge-nf-call-iptables=1
  node_daemon "containerd-$node" "$node" /usr/bin/containerd --config "$state/containerd.toml"
  # The kubelet gives up at once when the runtime does not answer.
  local deadline=$(($(date +%s) + 30))
  until [[ -S "$run/containerd.sock" ]] && ctr --address "$run/containerd.sock" version >/dev/null 2>&1; do
    if ! kill -0 "$(cat "$pid_dir/containerd-$node.pid")" 2>/dev/null || (($(date +%s) > deadline)); then
      echo "node-runtime: containerd of $node did not start; last lines of $log_dir/containerd-$node.log:" >&2
      tail -n 20 "$log_dir/containerd-$node.log" >&2
      return 1
    fi
    sleep 0.1
  done
  node_daemon "kubelet-$node" "$node" "$bin/kubelet" \
    --config "$state/kubelet.yaml" --kubeconfig "$state/kubelet.kubeconfig" \
    --root-dir "$state/kubelet" --hostname-override "$node" --node-ip "$(node_ip "$node")" --v 1
  start "kube-proxy-$node" "$(node_ns "$node")" "$bin/kube-proxy" \
    --kubeconfig "$pki_dir/kube-proxy.kubeconfig" --hostname-override "$node" \
    --proxy-mode iptables --cluster-cidr "$pod_range" \
    --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0 \
    --healthz-bind-address 127.0.0.1:10256 --metrics-bind-address 127.0.0.1:10249 --v 1
  netpol_queue_up "$node"
}

# Hands the first packet of every connection forwarded by node $1 (to or from its pods) to the
# NetworkPolicy agent (kube-network-policies, a DaemonSet: netpol.yaml). The agent installs
# nftables rules that do this, and this kernel has no nftables queue (CONFIG_NFT_QUEUE); the same
# hand-over is one iptables NFQUEUE rule (xt_NFQUEUE), so that rule is added here and the agent's
# own nftables rules fail to load (it logs that and goes on). The rule sits in the mangle table,
# whose forward hook runs before the filter table's: a packet the agent accepts still meets
# kube-proxy's filter rules. Until the agent listens, the queue is bypassed.
netpol_queue_up() {
  local ns rule=(FORWARD -m conntrack --ctstate NEW -j NFQUEUE --queue-num 100 --queue-bypass)
  ns="$(node_ns "$1")"
  in_ns "$ns" iptables -w -t mangle -C "${rule[@]}" 2>/dev/null ||
    in_ns "$ns" iptables -w -t mangle -I "${rule[@]}"
}

# A node daemon: in the node's namespaces and its daemons cgroup (so node_kill_all finds it and its
# children), in a session of its own. $1 = name (log and pid file), $2 = node, rest = command.
node_daemon() {
  local name="$1" node="$2" g
  shift 2
  g="$(node_cgroup "$node").daemons"
  setsid bash -c 'g="$1"; shift
    for h in /sys/fs/cgroup/*/; do
      [[ -f "$h${g#/}/cgroup.procs" ]] && echo $$ >"$h${g#/}/cgroup.procs"
    done
    exec "$@"' _ "$g" nsenter --mount="$(node_run_dir "$node")/mnt" --net="/run/netns/$(node_ns "$node")" "$@" \
    >"$log_dir/$name.log" 2>&1 </dev/null &
  echo $! >"$pid_dir/$name.pid"
}

# Stops node $1 at once and leaves its disk; the mount namespace stays, as a machine's disks do.
stop_node() {
  local node="$1" name pid
  for name in "kube-proxy-$node"; do
    pid="$(cat "$pid_dir/$name.pid" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -KILL "$pid" 2>/dev/null
  done
  node_kill_all "$node"
  rm -f "$pid_dir/kubelet-$node.pid" "$pid_dir/containerd-$node.pid" "$pid_dir/kube-proxy-$node.pid"
  # What the runtime kept in memory on a real machine is gone after a power cut: its state
  # directory with the mounts in it (container roots, sandboxes' shm and network namespaces).
  local state_dir
  state_dir="$(node_run_dir "$node")/containerd"
  in_node "$node" sh -c "findmnt -rn -o TARGET | grep '^$state_dir/' | sort -r | xargs -r -n1 umount -l" || true
  rm -rf "$state_dir" "$(node_run_dir "$node")/runc"
}

# Removes everything of node $1 but its disk (down.sh).
remove_node() {
  local node="$1"
  [[ -d "$(node_run_dir "$node")" ]] || { node_cgroups_down "$node"; return 0; }
  node_kill_all "$node"
  node_cgroups_down "$node"
  node_mount_ns_down "$node"
}
