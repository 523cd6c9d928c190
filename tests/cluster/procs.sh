# Starting the cluster's processes (sourced by up.sh and node.sh after common.sh; needs $bin, the
# Kubernetes binaries' directory, and $target_dir, the workspace's build directory).

# Starts a process in its own session inside a network namespace, its pid recorded for down.sh.
# $1 = name (log and pid file), $2 = network namespace, rest = command.
start() {
  local name="$1" ns="$2"
  shift 2
  setsid ip netns exec "$ns" "$@" >"$log_dir/$name.log" 2>&1 </dev/null &
  echo $! > "$pid_dir/$name.pid"
}

# Starts node $1: its agent and its kube-proxy, both in the node's namespace.
start_node() {
  local node="$1" pod_bin_dir metallb_bin_dir
  pod_bin_dir="$(cat "$cluster_dir/pod-bin-dir")"
  metallb_bin_dir="$(cat "$cluster_dir/metallb-bin-dir")"
  # The agent joins the node's namespace itself (--netns) rather than through `ip netns exec`, whose
  # private mount namespace would hide the pod namespaces it creates from the host's `ip netns`.
  setsid "$target_dir/ferry-node-agent" \
    --kubeconfig "$pki_dir/node-agent.kubeconfig" --cluster-dir "$cluster_dir" --node "$node" \
    --netns "/run/netns/$netns_prefix-$node" --node-ip "$(node_ip "$node")" \
    --pod-cidr "$(node_pod_cidr "$node")" --pod-netns-prefix "$netns_prefix-$node" \
    --cluster-dns "$dns_service_ip" --apiserver-host "$kubernetes_service_ip" --apiserver-port 443 \
    --kubelet-port 10250 --kubelet-cert "$pki_dir/kubelet-$node.crt" --kubelet-key "$pki_dir/kubelet-$node.key" \
    --bin-dir "$pod_bin_dir" --dockerfile "$repo_root/deploy/Dockerfile" --image "coredns=$bin/coredns" \
    --image "metallb/controller=$metallb_bin_dir/metallb-controller" \
    --image "metallb/speaker=$metallb_bin_dir/metallb-speaker" \
    >>"$log_dir/node-agent-$node.log" 2>&1 </dev/null &
  echo $! > "$pid_dir/node-agent-$node.pid"
  start "kube-proxy-$node" "$netns_prefix-$node" "$bin/kube-proxy" \
    --kubeconfig "$pki_dir/kube-proxy.kubeconfig" --hostname-override "$node" \
    --proxy-mode iptables --cluster-cidr "$pod_range" \
    --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0 \
    --healthz-bind-address 127.0.0.1:10256 --metrics-bind-address 127.0.0.1:10249 --v 1
}
