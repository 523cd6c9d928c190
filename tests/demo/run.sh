#!/usr/bin/env bash
# `make demo`: a real Transfer end to end on the local cluster, with live progress.
#
# Starts the local cluster (a real control plane, two simulated nodes), installs the CRD and the
# operator's RBAC from this repository, runs ferry-operator under its own service account, writes
# a dataset on node-a, applies a Transfer to node-b and shows its status as it moves. The cluster
# stays up afterwards for a look around; `make cluster-down` stops it.
set -euo pipefail
source "$(dirname "$0")/../cluster/common.sh"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
ns=demo
root=/ferry-demo
mover_uid=65532

say "starting the local cluster (etcd, apiserver, controller-manager, scheduler, 2 nodes)"
"$repo_root/tests/cluster/up.sh"
export KUBECONFIG="$kubeconfig"
bin="$("$repo_root/tests/k8s/build.sh")"
export PATH="$bin:$PATH"
target="${CARGO_TARGET_DIR:-$repo_root/target}/$profile"

say "installing the Transfer CRD and the operator's RBAC"
kubectl apply --server-side -f "$repo_root/crds/ferry.dev_transfers.yaml" >/dev/null
kubectl apply --server-side -f "$repo_root/deploy/rbac.yaml" >/dev/null
kubectl wait --for=condition=Established crd/transfers.ferry.dev --timeout=60s >/dev/null

# The operator runs as a host process under its service account's token (as it would in its pod).
token="$(kubectl create token ferry-operator -n ferry-system --duration=8h)"
server="$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.server}')"
ca="$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
op_kubeconfig="$cluster_dir/ferry-operator.kubeconfig"
cat > "$op_kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$server", certificate-authority-data: "$ca"}}]
users: [{name: ferry-operator, user: {token: "$token"}}]
contexts: [{name: ferry-operator, context: {cluster: local, user: ferry-operator}}]
current-context: ferry-operator
KUBECONFIG

# Host directories the movers write must belong to the movers' uid (an admin's one-time step).
for node in node-a node-b; do
  install -d -o "$mover_uid" -g "$mover_uid" "$cluster_dir/nodes/$node$root" "$cluster_dir/nodes/$node$root/cas"
done
install -d -o "$mover_uid" -g "$mover_uid" "$cluster_dir/nodes/node-b$root/imagenet"

say "starting ferry-operator (log: $log_dir/ferry-operator.log)"
KUBECONFIG="$op_kubeconfig" POD_NAME=ferry-operator-demo RUST_LOG=info \
  setsid "$target/ferry-operator" --namespace ferry-system --host-root "$ns=$root" \
  --cas-root "$root/cas" --mover-image ghcr.io/ferry-dev/ferry-mover:dev \
  --metrics-addr 127.0.0.1:0 >"$log_dir/ferry-operator.log" 2>&1 &
echo $! > "$pid_dir/ferry-operator.pid"
for _ in $(seq 1 100); do
  grep -q "leading" "$log_dir/ferry-operator.log" && break
  sleep 0.2
done
grep -o 'user=[^ ]*' "$log_dir/ferry-operator.log" | head -1 | sed 's/^/operator authenticated as /'

say "writing a dataset on node-a: 2000 small files and a 192 MiB file"
src="$cluster_dir/nodes/node-a$root/imagenet"
python3 - "$src" <<'PY'
import os, sys, random
root = sys.argv[1]
rng = random.Random(7)
for i in range(2000):
    d = os.path.join(root, "train", f"n{i % 40:05d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"img{i:05d}.jpg"), "wb") as f:
        f.write(rng.randbytes(1024 + rng.randrange(8192)))
with open(os.path.join(root, "shard-000.tar"), "wb") as f:
    for _ in range(192):
        f.write(rng.randbytes(1 << 20))
PY
chown -R "$mover_uid:$mover_uid" "$src"

kubectl create namespace "$ns" >/dev/null
say "applying a Transfer (node-a:$root/imagenet -> node-b:$root/imagenet, capped at 48Mi/s so the progress is easy to watch)"
cat <<YAML | tee /dev/stderr | kubectl apply -f - >/dev/null
apiVersion: ferry.dev/v1alpha1
kind: Transfer
metadata: {name: stage-imagenet, namespace: $ns}
spec:
  source: {hostPath: {node: node-a, path: $root/imagenet}}
  destination: {hostPath: {node: node-b, path: $root/imagenet}}
  streams: 4
  bandwidthLimit: 48Mi
YAML

say "kubectl get transfer -w"
kubectl get transfer -n "$ns" -w &
watcher=$!
kubectl wait -n "$ns" --for=condition=Succeeded transfer/stage-imagenet --timeout=300s >/dev/null || {
  kill "$watcher" 2>/dev/null
  kubectl get transfer -n "$ns" stage-imagenet -o yaml
  echo "demo: the Transfer did not succeed; operator log: $log_dir/ferry-operator.log" >&2
  exit 1
}
sleep 1
kill "$watcher" 2>/dev/null || true
wait "$watcher" 2>/dev/null || true

say "result"
kubectl get transfer -n "$ns" stage-imagenet -o jsonpath='{.status}' | python3 -c "$(cat <<'PY'
import json, sys
s = json.load(sys.stdin)
p, w, t = s["progress"], s.get("wire", {}), s.get("throughput", {})
print("phase %s after %d attempt(s): %d files, %d bytes" % (s["phase"], s["attempts"], p["filesDone"], p["bytesDone"]))
print("average %s, %d bytes on the wire, %d blocks from the block store" % (t.get("display", "?"), w.get("bytes", 0), w.get("dedupBlocks", 0)))
print("receiver %s on %s, sender %s on %s" % (s["receiver"]["pod"], s["receiver"]["node"], s["sender"]["pod"], s["sender"]["node"]))
PY
)"
if diff -r "$src" "$cluster_dir/nodes/node-b$root/imagenet" >/dev/null; then
  echo "node-b's copy is identical to node-a's dataset (diff -r)"
else
  echo "demo: the copy differs from the source" >&2
  exit 1
fi
kubectl get events -n "$ns" --field-selector involvedObject.name=stage-imagenet \
  -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message 2>/dev/null | head -8 || true

cat <<DONE

The cluster is still up. Try:
  export KUBECONFIG=$kubeconfig PATH=$bin:\$PATH
  kubectl describe transfer -n $ns stage-imagenet
  kubectl patch transfer -n $ns stage-imagenet --type merge -p '{"spec":{"trigger":"again"}}'   # run it again: unchanged files are skipped
  make cluster-down                                                                         # stop everything
DONE
