# Starting the cluster's processes (sourced by up.sh and node.sh after common.sh; needs $bin, the
# Kubernetes binaries' directory). Nodes' daemons: node-runtime.sh.

# Starts a process in its own session inside a network namespace, its pid recorded for down.sh.
# $1 = name (log and pid file), $2 = network namespace, rest = command.
start() {
  local name="$1" ns="$2"
  shift 2
  setsid ip netns exec "$ns" "$@" >"$log_dir/$name.log" 2>&1 </dev/null &
  echo $! > "$pid_dir/$name.pid"
}
