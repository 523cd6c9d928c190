#!/usr/bin/env bash
# Packages the Helm chart (charts/ferry) and pushes it to REGISTRY as an OCI artifact:
#   deploy/chart-push.sh REGISTRY      -> oci://REGISTRY/charts/ferry:<chart version>
# PLAIN_HTTP=1 for a registry without TLS. Users then install it with
#   helm install ferry oci://REGISTRY/charts/ferry --version <chart version> --set imageRegistry=REGISTRY
set -euo pipefail
repo_root="$(cd "$(dirname "$0")/.." && pwd)"
registry="${1:?usage: chart-push.sh REGISTRY}"
helm="$(command -v helm || echo "$("$repo_root/tests/k8s/build.sh")/helm")"
flags=()
[[ "${PLAIN_HTTP:-0}" == 1 ]] && flags+=(--plain-http)
version="$(sed -n 's/^version: *//p' "$repo_root/charts/ferry/Chart.yaml")"
package_dir="$(mktemp -d)"
trap 'rm -rf "$package_dir"' EXIT
"$helm" package "$repo_root/charts/ferry" -d "$package_dir" >/dev/null
"$helm" push "$package_dir/ferry-$version.tgz" "oci://$registry/charts" "${flags[@]}" >&2
echo "oci://$registry/charts/ferry --version $version"
