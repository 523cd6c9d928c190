#!/usr/bin/env bash
# Shows container logs of a pod run by the node agent:  logs.sh POD [NAMESPACE]
# Without arguments, lists every log file (pods and control-plane components).
set -euo pipefail
source "$(dirname "$0")/common.sh"
if [[ $# -eq 0 || -z "${1:-}" ]]; then
  ls -1 "$log_dir"
  exit 0
fi
pod="$1"
ns="${2:-default}"
shopt -s nullglob
files=("$log_dir/${ns}_${pod}_"*.log)
if ((${#files[@]} == 0)); then
  # A bare component name (kube-apiserver, etcd, node-agent...) shows that component's log.
  if [[ -f "$log_dir/$pod.log" ]]; then
    files=("$log_dir/$pod.log")
  else
    echo "logs.sh: no logs for pod $ns/$pod in $log_dir" >&2
    exit 1
  fi
fi
for f in "${files[@]}"; do
  echo "==> $f <=="
  cat "$f"
done
