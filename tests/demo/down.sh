#!/usr/bin/env bash
# `make demo-down`: deletes the demo's Transfers while the operator still runs (so it cleans up
# their pods and staging), uninstalls ferry and stops the local cluster, which removes its state
# and every node's files.
set -uo pipefail
source "$(dirname "$0")/../cluster/common.sh"
bin="$("$repo_root/tests/k8s/build.sh")"
export PATH="$bin:$PATH" KUBECONFIG="$kubeconfig"
if cluster_running "$bin/kubectl"; then
  kubectl delete namespace demo --ignore-not-found --wait --timeout=120s
  if helm status ferry -n ferry-system >/dev/null 2>&1; then
    helm uninstall ferry -n ferry-system --wait --timeout 3m
  fi
fi
"$repo_root/tests/cluster/down.sh"
