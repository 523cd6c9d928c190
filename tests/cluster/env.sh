#!/usr/bin/env bash
# Prints the shell lines that point kubectl and helm at the local cluster:  eval "$(tests/cluster/env.sh)"
# (FERRY_CLUSTER=peer for the second one). FERRY_REGISTRY is the registry the cluster's nodes pull
# from (reachable from the machine too): buildah push --tls-verify=false IMAGE docker://$FERRY_REGISTRY/NAME:TAG
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/net.sh"
bin="$("$repo_root/tests/k8s/build.sh")"
echo "export FERRY_CLUSTER=$cluster_name"
[[ "$cluster_name" == ferry ]] && echo "export FERRY_CLUSTER_DIR=$cluster_dir"
echo "export KUBECONFIG=$kubeconfig"
echo "export FERRY_REGISTRY=$registry_addr/ferry"
echo "export PATH=$bin:\$PATH"
