#!/usr/bin/env bash
# Renders deploy/install.yaml, ferry's install for people without Helm: the namespace ferry-system
# and the chart with its default values (`helm template --no-hooks`). Edit the chart, not the file.
#
#   deploy/render-manifests.sh           rewrite deploy/install.yaml
#   deploy/render-manifests.sh --check   exit 1 if it is not what the chart renders (make test)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$repo/deploy/install.yaml"
HELM=${HELM:-}
if [[ -z $HELM ]]; then
  HELM="${FERRY_CACHE:-$HOME/.cache/ferry}/k8s-v1.35.4/bin/helm"
  [[ -x $HELM ]] || HELM=$(command -v helm) || { echo "render-manifests: helm not found (make k8s-bin, or set HELM=)" >&2; exit 1; }
fi

render() {
  cat <<'HEADER'
# ferry's install without Helm: kubectl apply --server-side -f deploy/install.yaml
# Rendered by `make manifests` from charts/ferry with its default values; do not edit.
# The defaults grant no host path: add --host-root=NAMESPACE=/ROOT to the operator's args (or use
# the chart's hostRoots). Before `kubectl delete -f` this file, delete every Transfer
# (kubectl delete xfer --all -A) while the operator runs: their finalizer needs it.
---
apiVersion: v1
kind: Namespace
metadata:
  name: ferry-system
  labels:
    app.kubernetes.io/part-of: ferry
HEADER
  "$HELM" template ferry "$repo/charts/ferry" --namespace ferry-system --no-hooks
}

case "${1:-}" in
  "")
    render >"$out.tmp" && mv "$out.tmp" "$out"
    echo "wrote $out ($(grep -c '^kind:' "$out") objects)"
    ;;
  --check)
    if ! diff -u "$out" <(render) >/dev/null; then
      diff -u "$out" <(render) | head -40 >&2
      echo "render-manifests: deploy/install.yaml differs from what the chart renders; run make manifests" >&2
      exit 1
    fi
    echo "ok   deploy/install.yaml is what the chart renders"
    ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac
