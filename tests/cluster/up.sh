#!/usr/bin/env bash
# Starts one of ferry's local Kubernetes clusters (FERRY_CLUSTER, default `ferry`; see common.sh):
# the network (net.sh: a namespace per node behind a router namespace, which also runs the image
# registry), the images (images.sh), etcd, kube-apiserver (Node and RBAC authorization, the usual
# admission plugins), kube-controller-manager, kube-scheduler in the control plane's namespace,
# then per node containerd, the kubelet and kube-proxy (node-runtime.sh), kube-network-policies
# as a DaemonSet (NetworkPolicies are enforced as on a real cluster), CoreDNS as a pod behind
# the kube-dns Service, and MetalLB for LoadBalancer Services, every pod from an image in the
# local registry. Writes <state dir>/kubeconfig and <state dir>/images.env and returns once every
# node is Ready and CoreDNS is.
# A cluster of the same name left over from an earlier run is stopped first. Needs root.
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/net.sh"
source "$(dirname "$0")/procs.sh"
source "$(dirname "$0")/metallb.sh"
source "$(dirname "$0")/node-runtime.sh"
started=$(date +%s.%N)
"$repo_root/tests/scripts/deps.sh"
bin="$("$repo_root/tests/k8s/build.sh")"
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}/$profile"
cargo_flags=()
[[ "$profile" == release ]] && cargo_flags+=(--release)
# The binaries the images carry; a no-op when `make build` already built them.
# The whole workspace, as `make build` does: building a subset of packages unifies features
# differently and would recompile shared dependencies (minutes) before every start.
(cd "$repo_root" && cargo build -q "${cargo_flags[@]}" --workspace)

# The router and its registry stay: the other cluster may be starting and pushing beside this one.
FERRY_KEEP_ROUTER=1 "$(dirname "$0")/down.sh" 2>/dev/null || true
# FERRY_IMAGES_ENV: the images a caller (up-pair.sh) has built and pushed already.
images_env="${FERRY_IMAGES_ENV:-$("$(dirname "$0")/images.sh")}"
set -a
source "$images_env"
set +a

mkdir -p "$cluster_dir" "$pid_dir" "$log_dir" "$pki_dir" "$cluster_dir/nodes" "$cluster_dir/run"
touch "$marker"
cp "$images_env" "$cluster_dir/images.env"

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
subjectAltName=IP:127.0.0.1,IP:$apiserver_ip,IP:$kubernetes_service_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
client_ext="basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
issue admin "/O=system:masters/CN=ferry-admin" "$client_ext"
issue kube-controller-manager "/CN=system:kube-controller-manager" "$client_ext"
issue kube-scheduler "/CN=system:kube-scheduler" "$client_ext"
issue kube-proxy "/CN=system:kube-proxy" "$client_ext"
# The apiserver's client identity towards the kubelets (logs, exec).
issue apiserver-kubelet-client "/CN=kube-apiserver-kubelet-client" "$client_ext"
for node in ${nodes//,/ }; do
  issue "kubelet-$node" "/CN=system:node:$node" "basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:$(node_ip "$node"),DNS:$node"
  # The kubelet's own identity, which the Node authorizer and NodeRestriction confine to its node.
  issue "kubelet-client-$node" "/O=system:nodes/CN=system:node:$node" "$client_ext"
done
pki ecparam -name prime256v1 -genkey -noout -out "$pki_dir/sa.key"
pki ec -in "$pki_dir/sa.key" -pubout -out "$pki_dir/sa.pub"
chmod 600 "$pki_dir"/*.key

server="https://$apiserver_ip:$apiserver_port"
# $1 = output file, $2 = client cert stem
write_kubeconfig() {
  cat > "$1" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: $kube_context
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 < "$pki_dir/ca.crt")
users:
- name: $kube_context-$2
  user:
    client-certificate-data: $(base64 -w0 < "$pki_dir/$2.crt")
    client-key-data: $(base64 -w0 < "$pki_dir/$2.key")
contexts:
- name: $kube_context
  context:
    cluster: $kube_context
    user: $kube_context-$2
current-context: $kube_context
KCFG
  chmod 600 "$1"
}
write_kubeconfig "$kubeconfig" admin
for c in kube-controller-manager kube-scheduler kube-proxy; do
  write_kubeconfig "$pki_dir/$c.kubeconfig" "$c"
done

# --- network -----------------------------------------------------------------------------------
net_router_up
net_cluster_up
net_control_plane_up
for node in ${nodes//,/ }; do
  net_node_up "$node" "$(node_ip "$node")" "$(node_pod_cidr "$node")"
done

cp_ns="$netns_prefix-cp"
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

start etcd "$cp_ns" "$bin/etcd" --name ferry --data-dir "$cluster_dir/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "ferry=http://127.0.0.1:$etcd_peer_port" --unsafe-no-fsync --log-level warn
wait_for etcd 30 etcd in_ns "$cp_ns" curl -fsS "http://127.0.0.1:$etcd_port/health"

# The audit log records only the operator's own requests (its service account; metadata only):
# what `make bench-operator` counts per Transfer, by verb and resource, as the apiserver saw them.
audit_policy="$cluster_dir/audit-policy.yaml"
cat >"$audit_policy" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    users: ["system:serviceaccount:ferry-system:ferry-operator"]
  - level: None
POLICY

# Listens on every address of the control plane's namespace; the kubernetes Service's endpoint is
# the advertised address, so pods reach it through kube-proxy as on a real cluster.
start kube-apiserver "$cp_ns" "$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 0.0.0.0 --advertise-address "$apiserver_ip" --secure-port "$apiserver_port" \
  --kubelet-client-certificate "$pki_dir/apiserver-kubelet-client.crt" \
  --kubelet-client-key "$pki_dir/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority "$pki_dir/ca.crt" \
  --kubelet-preferred-address-types InternalIP \
  --tls-cert-file "$pki_dir/apiserver.crt" --tls-private-key-file "$pki_dir/apiserver.key" \
  --client-ca-file "$pki_dir/ca.crt" \
  --service-account-key-file "$pki_dir/sa.pub" --service-account-signing-key-file "$pki_dir/sa.key" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --api-audiences https://kubernetes.default.svc.cluster.local \
  --authorization-mode Node,RBAC \
  --enable-admission-plugins NodeRestriction,NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultStorageClass,DefaultTolerationSeconds,PersistentVolumeClaimResize,StorageObjectInUseProtection,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ResourceQuota,PodSecurity,Priority \
  --allow-privileged=true \
  --service-cluster-ip-range "$service_range" \
  --profiling=false \
  --audit-policy-file "$audit_policy" --audit-log-path "$cluster_dir/logs/audit-operator.log" \
  --audit-log-maxsize 200 --audit-log-maxbackup 1 \
  --v 1
wait_for "kube-apiserver /readyz" 60 kube-apiserver "$bin/kubectl" --kubeconfig "$kubeconfig" get --raw /readyz
# The apiserver's identity towards the kubelets (logs, exec, port-forward) may use their API.
"$bin/kubectl" --kubeconfig "$kubeconfig" create clusterrolebinding ferry:apiserver-kubelet-client \
  --clusterrole system:kubelet-api-admin --user kube-apiserver-kubelet-client >/dev/null

start kube-controller-manager "$cp_ns" "$bin/kube-controller-manager" \
  --kubeconfig "$pki_dir/kube-controller-manager.kubeconfig" \
  --authentication-kubeconfig "$pki_dir/kube-controller-manager.kubeconfig" \
  --authorization-kubeconfig "$pki_dir/kube-controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$kcm_port" --leader-elect=false \
  --service-account-private-key-file "$pki_dir/sa.key" --root-ca-file "$pki_dir/ca.crt" \
  --use-service-account-credentials \
  --cluster-signing-cert-file "$pki_dir/ca.crt" --cluster-signing-key-file "$pki_dir/ca.key" \
  --controllers '*' --service-cluster-ip-range "$service_range" --cluster-cidr "$pod_range" \
  --profiling=false --v 1
start kube-scheduler "$cp_ns" "$bin/kube-scheduler" \
  --kubeconfig "$pki_dir/kube-scheduler.kubeconfig" \
  --authentication-kubeconfig "$pki_dir/kube-scheduler.kubeconfig" \
  --authorization-kubeconfig "$pki_dir/kube-scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$scheduler_port" --leader-elect=false --profiling=false --v 1
for node in ${nodes//,/ }; do
  node_config "$node"
done
for node in ${nodes//,/ }; do
  start_node "$node"
done

kc() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }
nodes_ready() {
  local n
  for n in ${nodes//,/ }; do
    [[ "$(kc get node "$n" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" == True ]] || return 1
    # The node lifecycle controller removes the not-ready taint once it has seen the node Ready.
    ! kc get node "$n" -o 'jsonpath={.spec.taints[*].key}' | grep -q node.kubernetes.io/not-ready || return 1
  done
}
first_node="${nodes%%,*}"
wait_for "nodes Ready" 60 "kubelet-$first_node" nodes_ready
if [[ ",$nodes," == *,node-x,* ]]; then
  kc taint node node-x ferry.dev/disruptive=true:NoSchedule --overwrite >/dev/null
fi
wait_for "the default service account" 30 kube-controller-manager kc -n default get serviceaccount default
wait_for "the kube-root-ca.crt config map" 30 kube-controller-manager kc -n default get configmap kube-root-ca.crt
alive_or_die kube-scheduler
alive_or_die kube-controller-manager

# --- NetworkPolicies ----------------------------------------------------------------------------------
sed -e "s#@IMAGE@#$FERRY_IMAGE_KUBE_NETWORK_POLICIES#" "$(dirname "$0")/netpol.yaml" | kc apply -f - >/dev/null

# --- cluster DNS --------------------------------------------------------------------------------------
sed -e "s/@DNS_IP@/$dns_service_ip/" -e "s#@IMAGE@#$FERRY_IMAGE_COREDNS#" "$(dirname "$0")/coredns.yaml" | kc apply -f - >/dev/null
# LoadBalancer Services, installed while CoreDNS starts (its pods are not waited for: tests that
# use a LoadBalancer wait for its address).
metallb_up >"$log_dir/metallb-install.log" 2>&1 &
metallb_install=$!
# Dynamic provisioning: the default StorageClass and its provisioner.
sed -e "s#@IMAGE@#$FERRY_IMAGE_LOCAL_PATH_PROVISIONER#" -e "s#@HELPER_IMAGE@#$FERRY_IMAGE_FERRY_TEST_TOOLS#" \
  "$(dirname "$0")/local-path.yaml" | kc apply -f - >/dev/null
coredns_ready() {
  [[ "$(kc -n kube-system get deploy coredns -o 'jsonpath={.status.readyReplicas}')" == 1 ]]
}
wait_for "CoreDNS Ready" 60 kube-controller-manager coredns_ready
# Every node enforces NetworkPolicies before a test runs.
netpol_ready() {
  local want
  want="$(kc -n kube-system get ds kube-network-policies -o 'jsonpath={.status.desiredNumberScheduled}')"
  [[ -n "$want" && "$want" != 0 && "$(kc -n kube-system get ds kube-network-policies -o 'jsonpath={.status.numberReady}')" == "$want" ]]
}
wait_for "kube-network-policies Ready on every node" 60 kube-controller-manager netpol_ready
provisioner_ready() {
  [[ "$(kc -n local-path-storage get deploy local-path-provisioner -o 'jsonpath={.status.readyReplicas}')" == 1 ]]
}
wait_for "the local-path provisioner Ready" 60 kube-controller-manager provisioner_ready
for node in ${nodes//,/ }; do
  alive_or_die "containerd-$node"
  alive_or_die "kubelet-$node"
  alive_or_die "kube-proxy-$node"
done
if ! wait "$metallb_install"; then
  echo "up.sh: installing MetalLB failed:" >&2
  cat "$log_dir/metallb-install.log" >&2
  "$(dirname "$0")/down.sh" >/dev/null 2>&1 || true
  exit 1
fi

awk -v a="$started" -v b="$(date +%s.%N)" -v k="$kubeconfig" \
  -v n="$cluster_name" 'BEGIN { printf "up.sh: cluster %s Ready in %.1f s; export KUBECONFIG=%s\n", n, b - a, k }' >&2
