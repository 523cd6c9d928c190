#!/usr/bin/env bash
# Starts ferry's local Kubernetes cluster on loopback: etcd, kube-apiserver (RBAC + the usual admission
# plugins), kube-controller-manager (service accounts and tokens, GC, namespaces, PV binding, node
# lifecycle), kube-scheduler and the node agent (simulated nodes that run pods as local processes).
# Writes $FERRY_CLUSTER_DIR/kubeconfig and returns once every node is Ready.
# A cluster left over from an earlier run is stopped first.
set -euo pipefail
source "$(dirname "$0")/common.sh"
started=$(date +%s.%N)

"$repo_root/tests/scripts/deps.sh"
bin="$("$repo_root/tests/k8s/build.sh")"
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}/$profile"
cargo_flags=()
[[ "$profile" == release ]] && cargo_flags+=(--release)
# The agent and the probe binary pods run; a no-op when `make build` already built them.
# The whole workspace, as `make build` does: building a subset of packages unifies features
# differently and would recompile shared dependencies (minutes) before every start.
(cd "$repo_root" && cargo build -q "${cargo_flags[@]}" --workspace)

"$(dirname "$0")/down.sh" 2>/dev/null || true
for port in "$etcd_port" "$etcd_peer_port" "$apiserver_port" "$kcm_port" "$scheduler_port"; do
  if ss -Hltn "sport = :$port" | grep -q .; then
    echo "up.sh: port $port is in use by another process; set FERRY_*_PORT to move the cluster" >&2
    exit 1
  fi
done

mkdir -p "$cluster_dir" "$pid_dir" "$log_dir" "$pki_dir" "$cluster_dir/nodes" "$cluster_dir/run"
touch "$marker"

# --- certificates: one CA signs the apiserver's serving cert and every client cert -----------------
pki() {
  openssl "$@" 2>>"$log_dir/pki.log" >/dev/null
}
pki ecparam -name prime256v1 -genkey -noout -out "$pki_dir/ca.key"
pki req -x509 -new -key "$pki_dir/ca.key" -sha256 -days 3650 -subj "/CN=ferry-local-ca" -out "$pki_dir/ca.crt"
# $1 = file stem, $2 = subject, $3 = extensions
issue() {
  local stem="$1" subject="$2" ext="$3"
  pki ecparam -name prime256v1 -genkey -noout -out "$pki_dir/$stem.key"
  pki req -new -key "$pki_dir/$stem.key" -subj "$subject" -out "$pki_dir/$stem.csr"
  printf '%s\n' "$ext" > "$pki_dir/$stem.ext"
  pki x509 -req -in "$pki_dir/$stem.csr" -CA "$pki_dir/ca.crt" -CAkey "$pki_dir/ca.key" -CAcreateserial \
    -days 3650 -sha256 -extfile "$pki_dir/$stem.ext" -out "$pki_dir/$stem.crt"
}
issue apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
client_ext="basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
issue admin "/O=system:masters/CN=ferry-admin" "$client_ext"
issue kube-controller-manager "/CN=system:kube-controller-manager" "$client_ext"
issue kube-scheduler "/CN=system:kube-scheduler" "$client_ext"
issue node-agent "/O=system:masters/CN=ferry-node-agent" "$client_ext"
pki ecparam -name prime256v1 -genkey -noout -out "$pki_dir/sa.key"
pki ec -in "$pki_dir/sa.key" -pubout -out "$pki_dir/sa.pub"
chmod 600 "$pki_dir"/*.key

server="https://127.0.0.1:$apiserver_port"
# $1 = output file, $2 = client cert stem
write_kubeconfig() {
  cat > "$1" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: ferry-local
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 < "$pki_dir/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 < "$pki_dir/$2.crt")
    client-key-data: $(base64 -w0 < "$pki_dir/$2.key")
contexts:
- name: ferry-local
  context:
    cluster: ferry-local
    user: $2
current-context: ferry-local
KCFG
  chmod 600 "$1"
}
write_kubeconfig "$kubeconfig" admin
for c in kube-controller-manager kube-scheduler node-agent; do
  write_kubeconfig "$pki_dir/$c.kubeconfig" "$c"
done

# --- processes: each in its own session, pid recorded for down.sh ----------------------------------
# $1 = name, rest = command
start() {
  local name="$1"
  shift
  setsid "$@" >"$log_dir/$name.log" 2>&1 </dev/null &
  echo $! > "$pid_dir/$name.pid"
}
alive_or_die() {
  local name="$1"
  if ! kill -0 "$(cat "$pid_dir/$name.pid")" 2>/dev/null; then
    echo "up.sh: $name exited; last lines of $log_dir/$name.log:" >&2
    tail -n 30 "$log_dir/$name.log" >&2
    "$(dirname "$0")/down.sh" >/dev/null 2>&1 || true
    exit 1
  fi
}
# $1 = what, $2 = timeout seconds, $3 = process that must stay alive, rest = check command
wait_for() {
  local what="$1" timeout="$2" proc="$3"
  shift 3
  local deadline=$(($(date +%s) + timeout))
  until "$@" >/dev/null 2>&1; do
    alive_or_die "$proc"
    if (($(date +%s) > deadline)); then
      echo "up.sh: timed out after ${timeout}s waiting for $what; see $log_dir" >&2
      tail -n 30 "$log_dir/$proc.log" >&2
      "$(dirname "$0")/down.sh" >/dev/null 2>&1 || true
      exit 1
    fi
    sleep 0.2
  done
}

start etcd "$bin/etcd" --name ferry --data-dir "$cluster_dir/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "ferry=http://127.0.0.1:$etcd_peer_port" --unsafe-no-fsync --log-level warn
wait_for etcd 30 etcd curl -fsS "http://127.0.0.1:$etcd_port/health"

# The endpoint reconciler is off: Endpoints may not hold loopback addresses, and pods reach the
# apiserver through KUBERNETES_SERVICE_HOST/PORT (set by the node agent) instead.
start kube-apiserver "$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$apiserver_port" \
  --endpoint-reconciler-type none \
  --tls-cert-file "$pki_dir/apiserver.crt" --tls-private-key-file "$pki_dir/apiserver.key" \
  --client-ca-file "$pki_dir/ca.crt" \
  --service-account-key-file "$pki_dir/sa.pub" --service-account-signing-key-file "$pki_dir/sa.key" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --api-audiences https://kubernetes.default.svc.cluster.local \
  --authorization-mode RBAC \
  --enable-admission-plugins NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultStorageClass,DefaultTolerationSeconds,PersistentVolumeClaimResize,StorageObjectInUseProtection,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ResourceQuota,PodSecurity,Priority \
  --allow-privileged=true \
  --service-cluster-ip-range 10.96.0.0/16 \
  --profiling=false \
  --v 1
wait_for "kube-apiserver /readyz" 60 kube-apiserver "$bin/kubectl" --kubeconfig "$kubeconfig" get --raw /readyz

start kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig "$pki_dir/kube-controller-manager.kubeconfig" \
  --authentication-kubeconfig "$pki_dir/kube-controller-manager.kubeconfig" \
  --authorization-kubeconfig "$pki_dir/kube-controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$kcm_port" --leader-elect=false \
  --service-account-private-key-file "$pki_dir/sa.key" --root-ca-file "$pki_dir/ca.crt" \
  --use-service-account-credentials \
  --cluster-signing-cert-file "$pki_dir/ca.crt" --cluster-signing-key-file "$pki_dir/ca.key" \
  --controllers '*' \
  --profiling=false --v 1
start kube-scheduler "$bin/kube-scheduler" \
  --kubeconfig "$pki_dir/kube-scheduler.kubeconfig" \
  --authentication-kubeconfig "$pki_dir/kube-scheduler.kubeconfig" \
  --authorization-kubeconfig "$pki_dir/kube-scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$scheduler_port" --leader-elect=false --profiling=false --v 1
# Pods may run as non-root users (movers run as 65532): when the build directory is not reachable
# for them (a checkout under /root, say), the binaries pods run are staged where it is.
pod_bin_dir="$target_dir"
if ! setpriv --reuid 65532 --regid 65532 --clear-groups test -x "$target_dir/ferry-mover"; then
  pod_bin_dir="/var/tmp/ferry-cluster-bin-$(id -u)"
  install -d -m 0755 "$pod_bin_dir"
  for b in ferry-mover ferry-operator ferry-cluster-probe; do
    install -m 0755 "$target_dir/$b" "$pod_bin_dir/$b"
  done
fi
start node-agent "$target_dir/ferry-node-agent" \
  --kubeconfig "$pki_dir/node-agent.kubeconfig" --cluster-dir "$cluster_dir" --nodes "$nodes" \
  --apiserver-host 127.0.0.1 --apiserver-port "$apiserver_port" --bin-dir "$pod_bin_dir" \
  --dockerfile "$repo_root/deploy/Dockerfile"

kc() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }
nodes_ready() {
  local n
  for n in ${nodes//,/ }; do
    [[ "$(kc get node "$n" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" == True ]] || return 1
    # The node lifecycle controller removes the not-ready taint once it has seen the node Ready.
    [[ -z "$(kc get node "$n" -o 'jsonpath={.spec.taints}')" ]] || return 1
  done
}
wait_for "nodes Ready" 60 node-agent nodes_ready
wait_for "the default service account" 30 kube-controller-manager kc -n default get serviceaccount default
wait_for "the kube-root-ca.crt config map" 30 kube-controller-manager kc -n default get configmap kube-root-ca.crt
alive_or_die kube-scheduler
alive_or_die kube-controller-manager

awk -v a="$started" -v b="$(date +%s.%N)" -v k="$kubeconfig" \
  'BEGIN { printf "up.sh: cluster Ready in %.1f s; export KUBECONFIG=%s\n", b - a, k }' >&2
