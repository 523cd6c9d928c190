#!/usr/bin/env bash
# Shows a pod's container logs (through the kubelets, as kubectl logs):  logs.sh POD [NAMESPACE]
# A component's name (kube-apiserver, etcd, kubelet-node-a, containerd-node-a, ...) shows its log.
# Without arguments, lists the component logs.
set -euo pipefail
source "$(dirname "$0")/common.sh"
if [[ $# -eq 0 || -z "${1:-}" ]]; then
  ls -1 "$log_dir"
  exit 0
fi
pod="$1"
ns="${2:-default}"
if [[ -f "$log_dir/$pod.log" ]]; then
  cat "$log_dir/$pod.log"
  exit 0
fi
bin="$("$repo_root/tests/k8s/build.sh")"
exec "$bin/kubectl" --kubeconfig "$kubeconfig" logs -n "$ns" "$pod" --all-containers --prefix
