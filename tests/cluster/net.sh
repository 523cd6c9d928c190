# The local cluster's network (sourced by up.sh, down.sh and node.sh after common.sh; needs root).
#
# Every address lives in network namespaces this file creates; see the diagram in tests/README.md.
#   ferry-net        the router shared by all local clusters: one bridge per cluster (its node
#                    network), a veth to the host, no default route, and a FORWARD filter that lets
#                    only a cluster's own nodes and pods, and the host, reach that cluster's pods;
#   <ns>-cp          the cluster's control plane (etcd, apiserver, controller-manager, scheduler);
#   <ns>-<node>      one per node: node IP on eth0, containerd, the kubelet and kube-proxy, the
#                    pods' bridge cni0 (pods' own namespaces are containerd's, node-runtime.sh).
# The host reaches node and pod addresses through a route into ferry-net, and holds an unreachable
# route for the whole 10.96.0.0/11 besides, so no packet for a cluster address leaves the machine.

router_ns=ferry-net
host_link=ferry-net          # the host's end of the veth into the router
host_link_ip=10.99.0.1       # /30 with the router's end
router_link_ip=10.99.0.2
cluster_supernet=10.96.0.0/11
# The image registry every cluster's nodes pull from (plain HTTP), on the router's end of the host
# link: the host pushes to it directly, nodes and pods reach it through the router.
registry_addr="$router_link_ip:5000"
registry_dir="${FERRY_CACHE:-$HOME/.cache/ferry}/registry"
# Images are tagged by content, so old ones pile up: past this size the store starts empty.
registry_max_mib=4096

# Runs `ip` (or any command) in namespace $1.
in_ns() {
  local ns="$1"
  shift
  ip netns exec "$ns" "$@"
}

ns_exists() {
  [[ -e "/run/netns/$1" ]]
}

# Interface names are at most 15 bytes: the router's end of a node's veth is c<index>-<node>,
# shortened with a hash when the node's name is long.
router_port() {
  local name="c${cluster_index}-$1"
  if ((${#name} > 15)); then
    name="c${cluster_index}-$(printf '%s' "$1" | sha256sum | cut -c1-10)"
  fi
  printf '%s' "$name"
}

# Clusters start and stop concurrently: the router's creation and removal are serialised.
net_lock() {
  exec {net_lock_fd}>/run/lock/ferry-net.lock
  flock "$net_lock_fd"
}
net_unlock() {
  flock -u "$net_lock_fd"
}

# The router and the host's route into it; shared by every cluster, so created once.
net_router_up() {
  net_lock
  local other
  # Refuse to shadow a network the machine really uses.
  other="$(ip -4 route show to root "$cluster_supernet" | grep -v -e "dev $host_link" -e '^unreachable' || true)"
  if [[ -n "$other" ]]; then
    echo "net.sh: the host already routes addresses in $cluster_supernet ($other); the local cluster needs that range" >&2
    net_unlock
    return 1
  fi
  if ! ns_exists "$router_ns"; then
    ip netns add "$router_ns"
    in_ns "$router_ns" ip link set lo up
    in_ns "$router_ns" sysctl -qw net.ipv4.ip_forward=1
    ip link add "$host_link" type veth peer name host netns "$router_ns"
    ip addr add "$host_link_ip/30" dev "$host_link"
    ip link set "$host_link" up
    in_ns "$router_ns" ip addr add "$router_link_ip/30" dev host
    in_ns "$router_ns" ip link set host up
    # Anything not a cluster's is unreachable: the router never hands a packet back to the host
    # for it to send out.
    in_ns "$router_ns" ip route add unreachable default
    in_ns "$router_ns" iptables -w -P FORWARD ACCEPT
  fi
  ip route replace unreachable "$cluster_supernet"
  registry_up || { net_unlock; return 1; }
  net_unlock
}

# The registry process of this store (a zombie has no command line, so it does not count).
registry_running() {
  pgrep -f "^docker-registry serve $registry_dir/config.yml\$" >/dev/null
}

# The registry (the CNCF distribution registry from Debian's docker-registry package) in the
# router's namespace; its store survives the clusters, so images are pushed once.
registry_up() {
  curl -fs -o /dev/null --max-time 2 "http://$registry_addr/v2/" && return 0
  # One that runs but does not answer (left in a router namespace since removed) goes first.
  if registry_running; then
    registry_down
    local gone=$(($(date +%s) + 10))
    while registry_running && (($(date +%s) < gone)); do sleep 0.1; done
  fi
  mkdir -p "$registry_dir/data"
  if (($(du -sm "$registry_dir/data" | cut -f1) > registry_max_mib)); then
    rm -rf "$registry_dir/data"
    mkdir -p "$registry_dir/data"
  fi
  cat >"$registry_dir/config.yml" <<YAML
version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage:
  filesystem: {rootdirectory: $registry_dir/data}
  delete: {enabled: true}
http:
  addr: $registry_addr
YAML
  setsid ip netns exec "$router_ns" docker-registry serve "$registry_dir/config.yml" \
    >"$registry_dir/registry.log" 2>&1 </dev/null &
  local deadline=$(($(date +%s) + 30))
  until curl -fs -o /dev/null --max-time 2 "http://$registry_addr/v2/"; do
    if (($(date +%s) > deadline)); then
      echo "net.sh: the registry did not start; last lines of $registry_dir/registry.log:" >&2
      tail -n 20 "$registry_dir/registry.log" >&2
      return 1
    fi
    sleep 0.1
  done
}

registry_down() {
  pkill -TERM -f "^docker-registry serve $registry_dir/config.yml\$" || true
}

# Removes the router (and the registry in it) once no cluster uses it; FERRY_KEEP_ROUTER=1 keeps
# them (up.sh clearing a leftover cluster of its name while another one may be starting).
net_router_down_if_unused() {
  [[ "${FERRY_KEEP_ROUTER:-0}" == 1 ]] && return 0
  net_lock
  if ! ns_exists "$router_ns" || ! in_ns "$router_ns" ip -o link show type bridge | grep -q .; then
    registry_down
    ip link del "$host_link" 2>/dev/null || true
    ip netns del "$router_ns" 2>/dev/null || true
    ip route del unreachable "$cluster_supernet" 2>/dev/null || true
  fi
  net_unlock
}

# The cluster's node network (a bridge in the router) and its filter chain.
net_cluster_up() {
  local br="br${cluster_index}" chain="FERRY-C${cluster_index}"
  in_ns "$router_ns" ip link add "$br" type bridge
  in_ns "$router_ns" ip addr add "$router_ip/24" dev "$br"
  in_ns "$router_ns" ip link set "$br" up
  ip route replace "$cluster_block" via "$router_link_ip" dev "$host_link"
  # A cluster's pods are reachable from its own nodes and pods and from the host only; other
  # clusters' pods reach its node IPs (NodePorts) after their node masqueraded them.
  in_ns "$router_ns" iptables -w -N "$chain"
  in_ns "$router_ns" iptables -w -A "$chain" -i host -j RETURN
  in_ns "$router_ns" iptables -w -A "$chain" -s "$cluster_block" -j RETURN
  in_ns "$router_ns" iptables -w -A "$chain" -d "$pod_range" -j REJECT --reject-with icmp-host-unreachable
  in_ns "$router_ns" iptables -w -A FORWARD -d "$pod_range" -j "$chain"
}

net_cluster_down() {
  local br="br${cluster_index}" chain="FERRY-C${cluster_index}" ns
  # Pods' namespaces first (their processes are gone by now), then nodes and the control plane.
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${netns_prefix}-" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  ip route del "$cluster_block" 2>/dev/null || true
  if ns_exists "$router_ns"; then
    in_ns "$router_ns" iptables -w -D FORWARD -d "$pod_range" -j "$chain" 2>/dev/null || true
    in_ns "$router_ns" iptables -w -F "$chain" 2>/dev/null || true
    in_ns "$router_ns" iptables -w -X "$chain" 2>/dev/null || true
    in_ns "$router_ns" ip link del "$br" 2>/dev/null || true
  fi
  net_router_down_if_unused
}

# A namespace on the cluster's node network. $1 = namespace, $2 = address, $3 = router port name.
net_attach() {
  local ns="$1" addr="$2" port="$3"
  ip netns add "$ns"
  in_ns "$ns" ip link set lo up
  ip link add "$port" netns "$router_ns" type veth peer name eth0 netns "$ns"
  in_ns "$router_ns" ip link set "$port" master "br${cluster_index}"
  in_ns "$router_ns" ip link set "$port" up
  in_ns "$ns" ip addr add "$addr/24" dev eth0
  in_ns "$ns" ip link set eth0 up
  in_ns "$ns" ip route add default via "$router_ip"
}

net_control_plane_up() {
  net_attach "$netns_prefix-cp" "$apiserver_ip" "$(router_port cp)"
}

# A node's namespace, its pod range routed to it, and its egress masquerade.
# $1 = node name, $2 = node IP, $3 = pod CIDR.
net_node_up() {
  local node="$1" ip="$2" cidr="$3" ns="$netns_prefix-$1"
  ns_exists "$ns" || net_attach "$ns" "$ip" "$(router_port "$node")"
  in_ns "$ns" sysctl -qw net.ipv4.ip_forward=1
  in_ns "$router_ns" ip route replace "$cidr" via "$ip" dev "br${cluster_index}"
  # Pod traffic leaving the cluster carries the node's address, as on a real cluster's nodes.
  in_ns "$ns" iptables -w -t nat -C POSTROUTING -s "$cidr" ! -d "$cluster_block" -j MASQUERADE 2>/dev/null ||
    in_ns "$ns" iptables -w -t nat -A POSTROUTING -s "$cidr" ! -d "$cluster_block" -j MASQUERADE
}
