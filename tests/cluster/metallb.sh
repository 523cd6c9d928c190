# LoadBalancer Services through MetalLB (sourced by up.sh after common.sh; needs $bin and kc).
# The upstream manifest (kept next to the binaries by tests/k8s/build.sh) is applied with three
# changes: the images built from the same module (local registry), no validating webhook (its
# certificates would need a rotation loop the local cluster
# does not need; the controller runs with --webhook-mode=disabled), and the pods' veths excluded
# from L2 announcements. Addresses come from the top of the cluster's node network, where the
# router ARPs for them, so the host and the other cluster reach them as they reach node IPs.
lb_pool_first="$net_prefix.0.200"
lb_pool_last="$net_prefix.0.250"

metallb_up() {
  python3 - "$bin/metallb-native.yaml" "$FERRY_IMAGE_METALLB_CONTROLLER" "$FERRY_IMAGE_METALLB_SPEAKER" <<'PY' | kc apply -f - >/dev/null
import re, sys
docs = open(sys.argv[1]).read().split("\n---\n")
out = []
for d in docs:
    if "kind: ValidatingWebhookConfiguration" in d:
        continue
    if "name: controller\n" in d and "kind: Deployment" in d:
        d = d.replace("        - --log-level=info\n", "        - --log-level=info\n        - --webhook-mode=disabled\n        - --disable-cert-rotation\n", 1)
    d = d.replace('"^veth.*", ', '"^veth.*", "^p[0-9]+$", ')
    # The images built from the same module, in the local registry.
    d = re.sub(r"image: \S*/metallb/controller:\S+", "image: " + sys.argv[2], d)
    d = re.sub(r"image: \S*/metallb/speaker:\S+", "image: " + sys.argv[3], d)
    out.append(d)
print("\n---\n".join(out))
PY
  kc wait --for condition=established --timeout 30s crd/ipaddresspools.metallb.io crd/l2advertisements.metallb.io >/dev/null
  kc apply -f - >/dev/null <<YAML
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: local, namespace: metallb-system}
spec:
  addresses: ["$lb_pool_first-$lb_pool_last"]
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: local, namespace: metallb-system}
spec:
  ipAddressPools: [local]
YAML
  kc -n metallb-system get ipaddresspool local >/dev/null && kc -n metallb-system get l2advertisement local >/dev/null
}
