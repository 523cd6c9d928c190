#!/usr/bin/env bash
# Renders ferry's install for people without Helm: the namespace ferry-system and the chart with its
# default values (`helm template --no-hooks`). Edit the chart, not the file.
#
#   deploy/render-manifests.sh                  rewrite deploy/install.yaml, whose images are
#                                               REGISTRY/ferry-operator:VERSION and
#                                               REGISTRY/ferry-mover:VERSION (a placeholder)
#   deploy/render-manifests.sh --check          exit 1 if deploy/install.yaml is not what the chart
#                                               renders (charts/ferry/check.sh)
#   deploy/render-manifests.sh REGISTRY [TAG]   print the install for images pushed to REGISTRY
#                                               (host[:port][/prefix], as `make push REGISTRY=`)
#                                               with tag TAG (default: the chart's appVersion)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$repo/deploy/install.yaml"
HELM=${HELM:-}
if [[ -z $HELM ]]; then
  HELM="${FERRY_CACHE:-$HOME/.cache/ferry}/k8s-v1.35.4/bin/helm"
  [[ -x $HELM ]] || HELM=$(command -v helm) || { echo "render-manifests: helm not found (make k8s-bin, or set HELM=)" >&2; exit 1; }
fi

render() { # render REGISTRY [TAG]
  local registry=$1 tag=${2:-} images manifest
  local args=(--set-string "imageRegistry=$registry")
  [[ -z $tag ]] || args+=(--set-string "image.tag=$tag" --set-string "moverImage.tag=$tag")
  manifest=$("$HELM" template ferry "$repo/charts/ferry" --namespace ferry-system --no-hooks "${args[@]}")
  if [[ $registry == REGISTRY ]]; then
    images="# The images (ferry-operator, ferry-mover) are in the placeholder registry REGISTRY: replace it
# with the registry you pushed them to (make push REGISTRY=host:port/prefix), for example
#   sed 's#REGISTRY/#10.0.0.5:5000/ferry/#' deploy/install.yaml | kubectl apply --server-side -f -
# or render your own: deploy/render-manifests.sh 10.0.0.5:5000/ferry [TAG] >install.yaml"
  else
    images="# Its images are in $registry (deploy/render-manifests.sh $registry${tag:+ $tag})."
  fi
  cat <<HEADER
# ferry's install without Helm: kubectl apply --server-side -f install.yaml
# Rendered by deploy/render-manifests.sh from charts/ferry with its default values; do not edit.
$images
# The defaults grant no host path: add --host-root=NAMESPACE=/ROOT to the operator's args (or use
# the chart's hostRoots). Before \`kubectl delete -f\` this file, delete every Transfer
# (kubectl delete xfer --all -A) while the operator runs: their finalizer needs it.
---
apiVersion: v1
kind: Namespace
metadata:
  name: ferry-system
  labels:
    app.kubernetes.io/part-of: ferry
HEADER
  printf '%s\n' "$manifest"
}

case "${1:-}" in
  "")
    render REGISTRY >"$out.tmp" && mv "$out.tmp" "$out"
    echo "wrote $out ($(grep -c '^kind:' "$out") objects)"
    ;;
  --check)
    if ! diff -u "$out" <(render REGISTRY) >/dev/null; then
      diff -u "$out" <(render REGISTRY) | head -40 >&2
      echo "render-manifests: deploy/install.yaml differs from what the chart renders; run make manifests" >&2
      exit 1
    fi
    echo "ok   deploy/install.yaml is what the chart renders"
    ;;
  -*) echo "usage: $0 [--check | REGISTRY [TAG]]" >&2; exit 2 ;;
  *)
    [[ $# -le 2 ]] || { echo "usage: $0 [--check | REGISTRY [TAG]]" >&2; exit 2; }
    render "$1" "${2:-}"
    ;;
esac
