#!/usr/bin/env bash
# Copies the cluster's logs (components and containers) to $1 before down.sh removes them.
set -euo pipefail
source "$(dirname "$0")/common.sh"
dest="${1:?usage: save-logs.sh DIR}"
[[ -d "$log_dir" ]] || exit 0
rm -rf "$dest"
mkdir -p "$dest"
cp -r "$log_dir/." "$dest/"
# Containers' logs as the kubelets keep them: <dest>/pods/<node>/<namespace>_<pod>_<uid>/<container>/N.log
for dir in "$cluster_dir"/node-state/*/pod-logs; do
  [[ -d "$dir" ]] || continue
  node="$(basename "$(dirname "$dir")")"
  mkdir -p "$dest/pods/$node"
  cp -rL "$dir/." "$dest/pods/$node/" 2>/dev/null || true
done
# What the nodes said last: a pod the scheduler refused is explained by their taints and conditions.
{
  bin="$("$repo_root/tests/k8s/build.sh")"
  "$bin/kubectl" --kubeconfig "$kubeconfig" --request-timeout=5s get nodes -o 'custom-columns=NODE:.metadata.name,TAINTS:.spec.taints[*].key,TRUE:.status.conditions[?(@.status=="True")].type' || true
  df -h "$cluster_dir" || true
} >&2 2>/dev/null
echo "save-logs.sh: cluster logs copied to $dest" >&2
