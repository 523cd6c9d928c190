#!/usr/bin/env bash
# Prints the shell lines that point kubectl and helm at the local cluster:  eval "$(tests/cluster/env.sh)"
# (FERRY_CLUSTER=peer for the second one).
set -euo pipefail
source "$(dirname "$0")/common.sh"
bin="$("$repo_root/tests/k8s/build.sh")"
echo "export FERRY_CLUSTER=$cluster_name"
[[ "$cluster_name" == ferry ]] && echo "export FERRY_CLUSTER_DIR=$cluster_dir"
echo "export KUBECONFIG=$kubeconfig"
echo "export PATH=$bin:\$PATH"
