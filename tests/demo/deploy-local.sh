#!/usr/bin/env bash
# `make deploy-local`: installs or upgrades ferry through its Helm chart into the local cluster
# (started first when none is running), ready for Transfers: the operator runs as a pod on a
# simulated node under the chart's service account and RBAC, and /data is granted to every
# namespace (charts/ferry/ci/local-values.yaml). Extra arguments go to `helm upgrade`
# (for example --set maxActive=4).
set -euo pipefail
source "$(dirname "$0")/../cluster/common.sh"
bin="$("$repo_root/tests/k8s/build.sh")"
export PATH="$bin:$PATH" KUBECONFIG="$kubeconfig"
mover_uid=65532

if ! cluster_running "$bin/kubectl"; then
  "$repo_root/tests/cluster/up.sh"
fi

# Host directories the movers write, owned by their uid: an admin's one-time step on a real node.
for node in ${nodes//,/ }; do
  install -d -o "$mover_uid" -g "$mover_uid" "$cluster_dir/nodes/$node/data" "$cluster_dir/nodes/$node/data/.ferry-cas"
done

# --take-ownership: objects an earlier kubectl-applied install created (the CRD from crds/,
# deploy/rbac.yaml) become the release's instead of failing the install.
helm upgrade --install ferry "$repo_root/charts/ferry" --namespace ferry-system --create-namespace \
  -f "$repo_root/charts/ferry/ci/local-values.yaml" --take-ownership --wait --timeout 3m "$@"
kubectl -n ferry-system rollout status deployment/ferry-operator --timeout=120s
kubectl wait --for=condition=Established crd/transfers.ferry.dev --timeout=60s >/dev/null
