#!/usr/bin/env bash
# `make deploy-local`: installs or upgrades ferry into the local cluster (started first when none is
# running) the way a user installs a published release: the images are built and pushed to the
# cluster's registry (tests/cluster/images.sh), the chart is packaged and pushed there as an OCI
# artifact (`helm push`), and `helm upgrade --install oci://...` installs it. The operator runs as
# a pod from its image under the chart's service account and RBAC; /data is granted to every
# namespace (charts/ferry/ci/local-values.yaml). Extra arguments go to `helm upgrade`
# (for example --set maxActive=4).
set -euo pipefail
source "$(dirname "$0")/../cluster/common.sh"
source "$(dirname "$0")/../cluster/net.sh"
bin="$("$repo_root/tests/k8s/build.sh")"
export PATH="$bin:$PATH" KUBECONFIG="$kubeconfig"
mover_uid=65532

if ! cluster_running "$bin/kubectl"; then
  "$repo_root/tests/cluster/up.sh"
fi
# The images of the current build (a no-op when the registry holds them).
images_env="${FERRY_IMAGES_ENV:-$("$repo_root/tests/cluster/images.sh")}"
source "$images_env"
registry="$registry_addr/ferry"
tag_of() { echo "${1##*:}"; }

# The chart as a release would publish it: pushed to the registry, installed from there.
chart_version="$(sed -n 's/^version: *//p' "$repo_root/charts/ferry/Chart.yaml")"
out="$(PLAIN_HTTP=1 "$repo_root/deploy/chart-push.sh" "$registry" 2>&1)" || { echo "$out" >&2; exit 1; }

# Host directories the movers write, owned by their uid: an admin's one-time step on a real node.
for node in ${nodes//,/ }; do
  install -d -o "$mover_uid" -g "$mover_uid" "$cluster_dir/nodes/$node/data"
done

# --take-ownership: objects an earlier kubectl-applied install created (the CRD from crds/,
# deploy/rbac.yaml) become the release's instead of failing the install.
helm upgrade --install ferry "oci://$registry/charts/ferry" --version "$chart_version" --plain-http \
  --namespace ferry-system --create-namespace \
  -f "$repo_root/charts/ferry/ci/local-values.yaml" \
  --set-string "imageRegistry=$registry" \
  --set-string "image.tag=$(tag_of "$FERRY_IMAGE_FERRY_OPERATOR")" \
  --set-string "moverImage.tag=$(tag_of "$FERRY_IMAGE_FERRY_MOVER")" \
  --take-ownership --wait --timeout 3m "$@"
kubectl -n ferry-system rollout status deployment/ferry-operator --timeout=120s
kubectl wait --for=condition=Established crd/transfers.ferry.dev --timeout=60s >/dev/null
