#!/usr/bin/env bash
# Writes a kubeconfig that authenticates to the local cluster as a service account (a bound token),
# so a process run on the host has exactly that account's rights, as it would in its pod.
#
#   tests/cluster/sa-kubeconfig.sh NAMESPACE SERVICEACCOUNT OUT [DURATION]   (DURATION default 8h)
set -euo pipefail
source "$(dirname "$0")/common.sh"
[[ $# -ge 3 ]] || { echo "usage: $0 NAMESPACE SERVICEACCOUNT OUT [DURATION]" >&2; exit 2; }
ns="$1" sa="$2" out="$3" duration="${4:-8h}"
bin="$("$repo_root/tests/k8s/build.sh")"
kc() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }
token="$(kc create token "$sa" -n "$ns" --duration="$duration")"
server="$(kc config view --raw -o jsonpath='{.clusters[0].cluster.server}')"
ca="$(kc config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
umask 077
cat > "$out.tmp" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$server", certificate-authority-data: "$ca"}}]
users: [{name: "$sa", user: {token: "$token"}}]
contexts: [{name: "$sa", context: {cluster: local, user: "$sa"}}]
current-context: "$sa"
KUBECONFIG
mv "$out.tmp" "$out"
