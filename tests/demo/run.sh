#!/usr/bin/env bash
# `make demo`: a real Transfer end to end on the local cluster, with live progress.
#
# Builds what is missing, starts the local cluster (a real control plane, real kubelets with
# containerd) unless one is running, builds ferry's images and pushes them to the cluster's
# registry, installs ferry through its Helm chart (make deploy-local), writes a dataset on
# node-a, applies a Transfer to node-b, shows its progress live until it succeeds, verifies the copy
# and prints the figures from the Transfer's status. Run it again: the second Transfer finds its
# blocks in node-b's block store. `make demo-down` removes everything.
#
# Knobs (environment): DEMO_FILES=2000 DEMO_LARGE_MIB=192 DEMO_BANDWIDTH_LIMIT=48Mi ("" for none)
# DEMO_SKIP_BUILD=1 (the tests: everything is built already).
set -euo pipefail
source "$(dirname "$0")/../cluster/common.sh"

files="${DEMO_FILES:-2000}"
large_mib="${DEMO_LARGE_MIB:-192}"
limit="${DEMO_BANDWIDTH_LIMIT-48Mi}"
ns=demo
root=/data/demo
name=stage-imagenet
mover_uid=65532
target="${CARGO_TARGET_DIR:-$repo_root/target}/$profile"

bold=""; plain=""
if [[ -t 1 ]]; then bold=$'\033[1m'; plain=$'\033[0m'; fi
steps=5; n=0; t0=$SECONDS
step() { n=$((n + 1)); printf '\n%s[%d/%d] %s%s  (%ds)\n' "$bold" "$n" "$steps" "$*" "$plain" "$((SECONDS - t0))"; }

if [[ -z "${DEMO_SKIP_BUILD:-}" ]]; then
  steps=8
  step "Debian packages the cluster needs (installed once, then a no-op)"
  "$repo_root/tests/scripts/deps.sh"
  step "building ferry: cargo build --workspace (the first build takes several minutes)"
  (cd "$repo_root" && cargo build --workspace)
  step "Kubernetes from source: etcd, apiserver, controller-manager, scheduler, kubelet, kube-proxy, kubectl, helm, CoreDNS, MetalLB (first time about 13 minutes, then cached in ${cache_dir/#$HOME/\~})"
  "$repo_root/tests/k8s/build.sh" >/dev/null
fi
bin="$("$repo_root/tests/k8s/build.sh")"
export PATH="$bin:$PATH" KUBECONFIG="$kubeconfig"

step "building ferry's images FROM scratch (buildah) and pushing them to the cluster's registry"
images_env="$("$repo_root/tests/cluster/images.sh")"
export FERRY_IMAGES_ENV="$images_env"
grep -E 'FERRY_IMAGE_FERRY_(OPERATOR|MOVER)=' "$images_env" | cut -d= -f2

if cluster_running "$bin/kubectl"; then
  step "the local cluster is already running: using it"
else
  step "starting the local cluster: control plane, six nodes node-a to node-e and node-x (each a kubelet with its own containerd, in a network namespace of its own), kube-proxy, CoreDNS"
  "$repo_root/tests/cluster/up.sh"
fi
kubectl get nodes

step "installing ferry with its Helm chart (make deploy-local): the operator runs as a pod"
"$repo_root/tests/demo/deploy-local.sh" >/dev/null
kubectl -n ferry-system get pods -l app.kubernetes.io/component=operator -o wide

src="$cluster_dir/nodes/node-a$root/imagenet"
dst="$cluster_dir/nodes/node-b$root/imagenet"
for node in node-a node-b; do
  install -d -o "$mover_uid" -g "$mover_uid" "$cluster_dir/nodes/$node$root"
done
dataset_id="files=$files large_mib=$large_mib"
if [[ "$(cat "$src.complete" 2>/dev/null)" == "$dataset_id" ]]; then
  step "the dataset on node-a is there from an earlier run ($(du -sh "$src" | cut -f1))"
else
  step "writing a dataset on node-a: $files small files and a ${large_mib} MiB file"
  rm -rf "$src" "$src.complete"
  python3 - "$src" "$files" "$large_mib" <<'PY'
import os, sys, random
root, files, large = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(7)
for i in range(files):
    d = os.path.join(root, "train", f"n{i % 40:05d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"img{i:05d}.jpg"), "wb") as f:
        f.write(rng.randbytes(1024 + rng.randrange(8192)))
with open(os.path.join(root, "shard-000.tar"), "wb") as f:
    for _ in range(large):
        f.write(rng.randbytes(1 << 20))
PY
  echo "$dataset_id" > "$src.complete"
  chown -R "$mover_uid:$mover_uid" "$src"
fi

# A second run starts from an empty destination: its blocks come from node-b's block store.
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
if kubectl -n "$ns" get transfer "$name" >/dev/null 2>&1; then
  kubectl -n "$ns" delete transfer "$name" --wait --timeout=120s >/dev/null
fi
# The destination directory does not exist: the receiver creates it beneath the granted root.
rm -rf "$dst"

step "applying a Transfer: node-a:$root/imagenet -> node-b:$root/imagenet${limit:+, capped at $limit/s so the progress is easy to watch}"
manifest="$(cat <<YAML
apiVersion: ferry.dev/v1alpha1
kind: Transfer
metadata: {name: $name, namespace: $ns}
spec:
  source: {hostPath: {node: node-a, path: $root/imagenet}}
  destination: {hostPath: {node: node-b, path: $root/imagenet}}
  streams: 4${limit:+
  bandwidthLimit: $limit}
YAML
)"
echo "$manifest"
kubectl apply -f - <<<"$manifest" >/dev/null
echo
if [[ -x "$target/kubectl-ferry" ]]; then
  "$target/kubectl-ferry" watch -n "$ns" "$name" --timeout 600s || {
    "$target/kubectl-ferry" describe -n "$ns" "$name" || true
    echo "demo: the Transfer did not succeed" >&2
    exit 1
  }
else
  kubectl get transfer -n "$ns" -w &
  watcher=$!
  ok=1
  kubectl wait -n "$ns" --for=condition=Succeeded "transfer/$name" --timeout=600s >/dev/null || ok=0
  kill "$watcher" 2>/dev/null || true
  wait "$watcher" 2>/dev/null || true
  if [[ $ok == 0 ]]; then
    kubectl get transfer -n "$ns" "$name" -o yaml
    echo "demo: the Transfer did not succeed" >&2
    exit 1
  fi
fi

echo
echo "${bold}result${plain}"
kubectl get transfer -n "$ns" "$name" -o jsonpath='{.status}' | python3 -c "$(cat <<'PY'
import json, sys
s = json.load(sys.stdin)
p, w, t = s["progress"], s.get("wire", {}), s.get("throughput", {})
print("phase %s after %d attempt(s): %d files, %d bytes" % (s["phase"], s["attempts"], p["filesDone"], p["bytesDone"]))
print("average %s, %d bytes on the wire, %d blocks (%d bytes) from node-b's block store"
      % (t.get("display", "?"), w.get("bytes", 0), w.get("dedupBlocks", 0), w.get("dedupBytes", 0)))
print("receiver %s on %s, sender %s on %s" % (s["receiver"]["pod"], s["receiver"]["node"], s["sender"]["pod"], s["sender"]["node"]))
print("digest %s (both movers agree)" % s.get("digest", "?"))
PY
)"
if diff -r "$src" "$dst" >/dev/null; then
  echo "node-b's copy is identical to node-a's dataset (diff -r)"
else
  echo "demo: the copy differs from the source" >&2
  exit 1
fi

cat <<DONE

Done in $((SECONDS - t0)) s. The cluster is still up. Try:
  export KUBECONFIG=$kubeconfig PATH=$bin:${target}:\$PATH
  kubectl ferry describe -n $ns $name
  kubectl get events -n $ns
  make demo        # again: the blocks now come from node-b's block store
  make demo-down   # remove ferry, the demo's data and the cluster
DONE
