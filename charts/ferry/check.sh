#!/usr/bin/env bash
# Offline checks of the ferry chart (no cluster): lint, renders, schema rejections, the CRDs and the
# RBAC rules against the repository's sources. Exits non-zero on the first failure.
#
#   charts/ferry/check.sh             (HELM=/path/to/helm to pick the binary)
set -euo pipefail

chart=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$chart/../.." && pwd)
HELM=${HELM:-}
if [[ -z $HELM ]]; then
  if [[ -x "${FERRY_CACHE:-$HOME/.cache/ferry}/k8s-v1.35.4/bin/helm" ]]; then
    HELM="${FERRY_CACHE:-$HOME/.cache/ferry}/k8s-v1.35.4/bin/helm"
  else
    HELM=$(command -v helm) || { echo "check: helm not found (set HELM=)" >&2; exit 1; }
  fi
fi

# The CRDs the chart templates: crds/ferry.dev_<name>.yaml -> templates/crd-<name>.yaml (sync-crd.sh).
crd_names=(transfers peers)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
step=0
ok() { echo "ok   $*"; }
fail() { echo "FAIL $*" >&2; exit 1; }
run() { step=$((step + 1)); echo "---- [$step] $*"; }

# Structured checks need PyYAML; without it (or with CHECK_NO_PYYAML=1) text comparisons stand in.
have_yaml=0
if [[ -z ${CHECK_NO_PYYAML:-} ]] && python3 -c 'import yaml' 2>/dev/null; then have_yaml=1; fi

# ferry publishes no images: every render names a registry (imageRegistry); `noreg CMD...` runs a
# render or expect_reject without it.
registry=10.0.0.5:5000/ferry
reg=(--set "imageRegistry=$registry")
noreg() { local reg=(); "$@"; }

render() { # render OUT [helm template args...]
  local out=$1; shift
  "$HELM" template ferry "$chart" --namespace ferry-system "${reg[@]}" "$@" >"$out" 2>"$out.err" \
    || { cat "$out.err" >&2; fail "helm template $* did not render"; }
}

expect_reject() { # expect_reject WHAT PATTERN [helm template args...]: must fail, stderr matching PATTERN
  local what=$1 pattern=$2; shift 2
  if "$HELM" template ferry "$chart" --namespace ferry-system "${reg[@]}" "$@" >/dev/null 2>"$work/reject.err"; then
    fail "$what: helm template accepted it"
  fi
  grep -Eq -- "$pattern" "$work/reject.err" \
    || { cat "$work/reject.err" >&2; fail "$what: rejected, but the error does not match /$pattern/"; }
  ok "$what: rejected ($(grep -E -m1 -- "$pattern" "$work/reject.err" | sed 's/^[- ]*//'))"
}

run "helm: $("$HELM" version --short 2>/dev/null || echo "$HELM"); PyYAML: $([[ $have_yaml == 1 ]] && echo yes || echo no, text comparisons)"

run "the CRD templates are in sync with crds/ (${crd_names[*]})"
"$chart/sync-crd.sh" --check

run "helm lint --strict (default values, ci/full-values.yaml)"
"$HELM" lint --strict "$chart" "${reg[@]}" || fail "helm lint --strict"
"$HELM" lint --strict "$chart" -f "$chart/ci/full-values.yaml" || fail "helm lint --strict -f ci/full-values.yaml"
ok "lint clean"

run "helm template: default values and ci/full-values.yaml"
render "$work/default.yaml"
render "$work/full.yaml" -f "$chart/ci/full-values.yaml"
render "$work/install.yaml" --set 'hostRoots[0].namespace=ml,hostRoots[0].root=/data'
for f in default full install; do
  echo "ok   $f: $(grep -c '^kind:' "$work/$f.yaml") objects: $(grep '^kind:' "$work/$f.yaml" | awk '{print $2}' | sort | paste -sd' ')"
done

run "the values schema rejects bad values"
expect_reject "tests/bad-hostroot-values.yaml (relative root)" "hostRoots/1/root.*does not match pattern '\^/'" \
  -f "$chart/tests/bad-hostroot-values.yaml"
expect_reject "a root with a '..' component" "hostRoots/0/root" \
  --set 'hostRoots[0].namespace=ml,hostRoots[0].root=/data/../etc'
expect_reject "a hostRoots entry without root" "hostRoots/0.*missing propert.*root" \
  --set 'hostRoots[0].namespace=ml'
expect_reject "a hostRoots entry with a misspelt key" "hostRoots/0.*additional propert.*path" \
  --set 'hostRoots[0].namespace=ml,hostRoots[0].root=/data,hostRoots[0].path=/x'
expect_reject "replicas=0" "/replicas.*minimum" --set replicas=0
expect_reject "logFormat=yaml" "/logFormat.*(text|json)" --set logFormat=yaml
expect_reject "maxActive=-1" "/maxActive.*minimum" --set maxActive=-1
expect_reject "maxActivePerNode=-2" "/maxActivePerNode.*minimum" --set maxActivePerNode=-2
expect_reject "a mover label in ferry.dev/" "moverDefaults/labels/ferry.dev" --set 'moverDefaults.labels.ferry\.dev/x=y'
expect_reject "moverDefaults.streams=17" "/moverDefaults/streams.*maximum" --set moverDefaults.streams=17
expect_reject "moverDefaults.compression=gzip" "/moverDefaults/compression.*(auto|zstd)" --set moverDefaults.compression=gzip
expect_reject "nodeService.capacity=lots" "/nodeService/capacity" --set nodeService.capacity=lots
expect_reject "nodeService.hostPath=relative" "/nodeService/hostPath" --set nodeService.hostPath=relative
expect_reject "nodeService.persistentVolume.size=lots" "/nodeService/persistentVolume/size" --set nodeService.persistentVolume.size=lots
expect_reject "an unknown top-level value" "additional propert.*hostRoot" --set 'hostRoot=x'
expect_reject "a relative root with --skip-schema-validation (template guard)" \
  "hostRoots\[1\]\.root must be an absolute path" \
  --skip-schema-validation -f "$chart/tests/bad-hostroot-values.yaml"
expect_reject "extraArgs repeating a rendered flag" "extraArgs: --log-format is already rendered" \
  --set 'extraArgs[0]=--log-format=json'
expect_reject "crossCluster.service.type=ClusterIP" "/crossCluster/service/type.*(NodePort|LoadBalancer)" \
  --set crossCluster.service.type=ClusterIP
expect_reject "crossCluster.receiverServiceType=ClusterIP" "/crossCluster/receiverServiceType.*(NodePort|LoadBalancer)" \
  --set crossCluster.receiverServiceType=ClusterIP
expect_reject "crossCluster.port=0" "/crossCluster/port.*minimum" --set crossCluster.port=0
expect_reject "a nodePort with crossCluster.service.type=LoadBalancer" "/crossCluster/service/type.*NodePort" \
  --set crossCluster.service.type=LoadBalancer,crossCluster.service.nodePort=30743
expect_reject "a nodePort with type LoadBalancer and --skip-schema-validation (template guard)" \
  "crossCluster.service.nodePort is for type NodePort only" \
  --skip-schema-validation --set crossCluster.service.type=LoadBalancer,crossCluster.service.nodePort=30743
expect_reject "crossCluster.port equal to metrics.port" "crossCluster.port and metrics.port must differ" \
  --set crossCluster.enabled=true,crossCluster.port=8080

run "images: imageRegistry prefixes both repositories, refused without one; digests; pull secrets"
noreg expect_reject "no imageRegistry (the default values)" \
  'imageRegistry is not set and image.repository \("ferry-operator"\) names no registry.*make push REGISTRY='
noreg expect_reject "no imageRegistry, image.repository a full reference" \
  'imageRegistry is not set and moverImage.repository \("ferry-mover"\) names no registry' \
  --set image.repository=10.0.0.5:5000/ferry/ferry-operator
noreg expect_reject "no imageRegistry with --skip-schema-validation (template guard)" "imageRegistry is not set" \
  --skip-schema-validation
expect_reject "imageRegistry with a scheme" "/imageRegistry.*does not match pattern" --set imageRegistry=https://10.0.0.5:5000
expect_reject "imageRegistry with a space" "/imageRegistry.*does not match pattern" --set 'imageRegistry=10.0.0.5:5000/fer ry'
images() { # images FILE: every container image, then "mover" and the --mover-image value
  { grep -E '^ +image: ' "$1" | sed -E 's/^ +image: "?([^"]*)"?$/\1/'
    grep -E -- '- "?--mover-image=' "$1" | sed -E 's/^.*--mover-image=([^"]*)"?$/mover \1/'; } | paste -sd' '
}
expect_images() { # expect_images WHAT FILE WANT
  [[ $(images "$2") == "$3" ]] || fail "$1: images '$(images "$2")', want '$3'"
  ok "$1: $3"
}
# Each render has the node service's two mover images (its init and main containers), two operator
# images (the Deployment's, the pre-delete hook's) and the movers'.
render "$work/img.yaml"
expect_images "imageRegistry=$registry" "$work/img.yaml" \
  "$registry/ferry-mover:0.1.0 $registry/ferry-mover:0.1.0 $registry/ferry-operator:0.1.0 $registry/ferry-operator:0.1.0 mover $registry/ferry-mover:0.1.0"
render "$work/img-slash.yaml" --set "imageRegistry=$registry/,image.tag=1.2.3,moverImage.tag=1.2.4"
expect_images "imageRegistry with a trailing '/', tags set" "$work/img-slash.yaml" \
  "$registry/ferry-mover:1.2.4 $registry/ferry-mover:1.2.4 $registry/ferry-operator:1.2.3 $registry/ferry-operator:1.2.3 mover $registry/ferry-mover:1.2.4"
# Content-hash tags can be all digits; callers pass them with --set-string, and the chart keeps
# them verbatim (a leading zero included) rather than as numbers.
render "$work/img-digits.yaml" --set-string "image.tag=0776261033,moverImage.tag=0123456789"
expect_images "all-digit tags given as strings" "$work/img-digits.yaml" \
  "$registry/ferry-mover:0123456789 $registry/ferry-mover:0123456789 $registry/ferry-operator:0776261033 $registry/ferry-operator:0776261033 mover $registry/ferry-mover:0123456789"
expect_reject "a numeric image.tag" "/image/tag.*string" --set image.tag=7762610332812818
noreg render "$work/img-full.yaml" --set image.repository=10.0.0.6/x/op,moverImage.repository=10.0.0.6/x/mv
expect_images "no imageRegistry, both repositories full references" "$work/img-full.yaml" \
  "10.0.0.6/x/mv:0.1.0 10.0.0.6/x/mv:0.1.0 10.0.0.6/x/op:0.1.0 10.0.0.6/x/op:0.1.0 mover 10.0.0.6/x/mv:0.1.0"
d1=sha256:1111111111111111111111111111111111111111111111111111111111111111
d2=sha256:2222222222222222222222222222222222222222222222222222222222222222
render "$work/img-digest.yaml" --set "image.tag=9.9.9,image.digest=$d1,moverImage.tag=9.9.9,moverImage.digest=$d2"
expect_images "digests pin both images (over the tags)" "$work/img-digest.yaml" \
  "$registry/ferry-mover@$d2 $registry/ferry-mover@$d2 $registry/ferry-operator@$d1 $registry/ferry-operator@$d1 mover $registry/ferry-mover@$d2"
grep -Fq -- '--mover-image-pull-secret' "$work/img.yaml" && fail "default: --mover-image-pull-secret without imagePullSecrets"
grep -q 'imagePullSecrets:' "$work/img.yaml" && fail "default: imagePullSecrets rendered without any"
render "$work/img-secrets.yaml" --set 'imagePullSecrets[0].name=regcred,imagePullSecrets[1].name=other'
[[ $(grep -E -- '- "?--mover-image-pull-secret=' "$work/img-secrets.yaml" | sed -E 's/^.*=([^"]*)"?$/\1/' | paste -sd' ') \
  == "regcred other" ]] || fail "imagePullSecrets: not one --mover-image-pull-secret per entry, in order"
[[ $(grep -A2 '^      imagePullSecrets:' "$work/img-secrets.yaml" | grep -cE -- '- name: (regcred|other)$') == 6 ]] \
  || fail "imagePullSecrets: the operator's, the hook's and the node service's pods do not all carry them"
expect_reject "extraArgs repeating --mover-image" "extraArgs: --mover-image is already rendered" \
  --set 'extraArgs[0]=--mover-image=10.0.0.5:5000/ferry/ferry-mover:x'
ok "imagePullSecrets: on the operator's and the hook's pods, and --mover-image-pull-secret=regcred, =other"

run "the rendered RBAC rules equal deploy/rbac.yaml's"
if [[ $have_yaml == 1 ]]; then
  python3 - "$repo/deploy/rbac.yaml" "$work/default.yaml" "$work/full.yaml" <<'EOF'
import sys, yaml

def docs(path):
    # The release's objects; hooks (the pre-delete Job and its own RBAC) are checked apart.
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f)
                if d and "helm.sh/hook" not in (d.get("metadata", {}).get("annotations") or {})]

def one(ds, kind, path):
    found = [d for d in ds if d.get("kind") == kind]
    if len(found) != 1:
        sys.exit(f"FAIL {path}: expected one {kind}, found {len(found)}")
    return found[0]

ref = docs(sys.argv[1])
for path in sys.argv[2:]:
    ds = docs(path)
    for kind in ("ClusterRole", "Role"):
        want, got = one(ref, kind, sys.argv[1])["rules"], one(ds, kind, path)["rules"]
        if want != got:
            sys.exit(f"FAIL {path}: {kind} rules differ from deploy/rbac.yaml:\n  want {want}\n  got  {got}")
    sa = one(ds, "ServiceAccount", path)
    role, crole = one(ds, "Role", path), one(ds, "ClusterRole", path)
    for kind, target in (("ClusterRoleBinding", crole), ("RoleBinding", role)):
        b = one(ds, kind, path)
        if b["roleRef"]["name"] != target["metadata"]["name"]:
            sys.exit(f"FAIL {path}: {kind} refers to {b['roleRef']['name']}, not {target['metadata']['name']}")
        subj = [(s["kind"], s["name"], s["namespace"]) for s in b["subjects"]]
        if subj != [("ServiceAccount", sa["metadata"]["name"], "ferry-system")]:
            sys.exit(f"FAIL {path}: {kind} subjects {subj}")
    dep = one(ds, "Deployment", path)
    if dep["spec"]["template"]["spec"]["serviceAccountName"] != sa["metadata"]["name"]:
        sys.exit(f"FAIL {path}: the Deployment does not run as the ServiceAccount")
    if role["metadata"]["namespace"] != "ferry-system":
        sys.exit(f"FAIL {path}: the Role is not in the release namespace")
    print(f"ok   {path.rsplit('/', 1)[-1]}: ClusterRole and Role rules equal; bindings name "
          f"{sa['metadata']['name']} in ferry-system")
EOF
else
  # Text fallback: the chart writes the rules in deploy/rbac.yaml's own flow style, so the rules
  # blocks of the ClusterRole and the Role compare line for line.
  rules() { # rules FILE KIND: the rules block of the document of that kind
    awk -v kind="$2" '
      /^---/ { if (is) exit; inrules = 0; next }
      $0 == "kind: " kind { is = 1 }
      /^rules:/ { inrules = 1 }
      /^[a-z]/ && !/^rules:/ { inrules = 0 }
      inrules { body = body $0 "\n" }
      END { if (is) printf "%s", body }
    ' "$1" | sed 's/[[:space:]]*$//'
  }
  for f in default full; do
    for kind in ClusterRole Role; do
      diff <(rules "$repo/deploy/rbac.yaml" "$kind") <(rules "$work/$f.yaml" "$kind") \
        || fail "$f: $kind rules differ from deploy/rbac.yaml"
      [[ -n $(rules "$work/$f.yaml" "$kind") ]] || fail "$f: no $kind rules rendered"
    done
    ok "$f: ClusterRole and Role rules equal (text)"
  done
fi

run "the rendered CRDs are crds/ferry.dev_{$(IFS=,; echo "${crd_names[*]}")}.yaml (plus the keep annotation)"
for crd in "${crd_names[@]}"; do
  render "$work/crd-$crd-keep.yaml" --show-only "templates/crd-$crd.yaml"
  render "$work/crd-$crd-nokeep.yaml" --show-only "templates/crd-$crd.yaml" --set crds.keep=false
  grep -q 'helm.sh/resource-policy: keep' "$work/crd-$crd-keep.yaml" || fail "$crd: crds.keep=true: no keep annotation"
  grep -q 'helm.sh/resource-policy' "$work/crd-$crd-nokeep.yaml" && fail "$crd: crds.keep=false: keep annotation rendered"
  # Byte for byte, but for Helm's "---"/"# Source:" header and the generator's comment.
  diff <(grep -v -e '^---$' -e '^# Source:' "$work/crd-$crd-nokeep.yaml") \
    <(grep -v '^#' "$repo/crds/ferry.dev_$crd.yaml") || fail "the rendered $crd CRD differs from crds/"
  grep -Fqx "  name: $crd.ferry.dev" "$work/default.yaml" || fail "default: the CRD $crd.ferry.dev is not rendered"
  ok "$crd: crds.keep=false renders crds/ferry.dev_$crd.yaml byte for byte; crds.keep=true adds the annotation"
done
if "$HELM" template ferry "$chart" "${reg[@]}" --set crds.install=false | grep -q '^kind: CustomResourceDefinition'; then
  fail "crds.install=false still renders a CRD"
fi
ok "crds.install=false renders no CRD"

run "the operator's command line from ci/full-values.yaml"
expect_arg() {
  grep -Fq -- "- $1" "$work/full.yaml" || fail "full: argument $1 not rendered"
}
for a in --cluster-name=prod-eu-1 \
  --mover-image=10.0.0.5:5000/ferry/ferry-mover@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef \
  --mover-image-pull-secret=regcred --mover-image-pull-secret=mirror-cred \
  --mover-uid=10001 --allow-root-movers --allow-privileged-readers --host-root=ml=/data --host-root=ml=/scratch/ \
  '--host-root=*=/srv/shared:ro' '--host-root=*=/data/tenants/{namespace}' --block-service=ferry-node.ferry-system.svc:7443 \
  --max-active=20 --max-active-per-node=2 --max-active-per-namespace=5 --mover-pending-timeout=600 --cert-days=7 --default-streams=8 --default-compression=zstd --data-port=7500 --progress-port=7501 \
  --mover-priority-class=ferry-movers --allowed-priority-class=batch-low --allowed-priority-class=batch-high --mover-label=cost-center=1234 --mover-label=team=vision \
  '--metrics-addr=[::]:9090' '--peering-listen=[::]:7543' --peering-service-type=LoadBalancer \
  --leader-election-id=ferry-operator-lease --log-format=json; do
  expect_arg "$a"
done
grep -Fq -- '--block-service=ferry-node.' "$work/default.yaml" || fail "default: no --block-service"
grep -Fq -- '--cap=100Gi' "$work/full.yaml" || fail "full: the node service's cap not rendered"
grep -Fq -- 'nvidia.com/gpu' "$work/full.yaml" || fail "full: the node service's tolerations not rendered"
grep -Fq -- '- --peering-service-type=NodePort' "$work/default.yaml" || fail "default: no --peering-service-type=NodePort"
grep -Fq -- '--peering-listen' "$work/default.yaml" && fail "default: --peering-listen rendered (crossCluster.enabled is false)"
render "$work/nocas.yaml" --set nodeService.enabled=false
grep -Eq -- '- "?--block-service="?$' "$work/nocas.yaml" || fail 'nodeService.enabled=false does not render --block-service= (dedup off)'
grep -q 'kind: DaemonSet' "$work/nocas.yaml" && fail 'nodeService.enabled=false still renders the DaemonSet'
render "$work/pvstore.yaml" --set nodeService.persistentVolume.enabled=true --set nodeService.capacity=50Gi
grep -A3 -- '- name: store$' "$work/pvstore.yaml" | grep -q 'hostPath' \
  && fail 'nodeService.persistentVolume.enabled still mounts the store from hostPath'
grep -Fq 'volumeClaimTemplate:' "$work/pvstore.yaml" || fail 'nodeService.persistentVolume.enabled renders no claim template'
grep -Fq 'storage: "50Gi"' "$work/pvstore.yaml" || fail 'the store claim does not default its size to capacity'
# Only the DaemonSet's claim template: the CRD's schema names storageClassName too.
awk '/^kind: DaemonSet/,/^---/' "$work/pvstore.yaml" | grep -Fq 'storageClassName' \
  && fail 'an empty storageClassName is rendered (it must take the default class)'
render "$work/pvstore-class.yaml" --set nodeService.persistentVolume.enabled=true --set nodeService.persistentVolume.storageClassName=fast-local --set nodeService.persistentVolume.size=60Gi
grep -Fq 'storageClassName: "fast-local"' "$work/pvstore-class.yaml" || fail 'the store claim does not name its class'
grep -Fq 'storage: "60Gi"' "$work/pvstore-class.yaml" || fail 'the store claim does not request its size'
grep -Fq -- '--node-store-volumes' "$work/pvstore.yaml" && fail 'a claim per pod renders --node-store-volumes'
grep -Fq -- 'ferry.dev/node-store' "$work/pvstore.yaml" && fail 'a claim per pod selects the per-node volumes or grants their ClusterRole'
render "$work/pvstore-node.yaml" --set nodeService.persistentVolume.enabled=true \
  --set nodeService.persistentVolume.perNode=true --set nodeService.persistentVolume.storageClassName=ferry-node-store
awk '/^kind: DaemonSet/,/^---/' "$work/pvstore-node.yaml" | grep -Fq 'ferry.dev/node-store: "true"' \
  || fail 'perNode: the store claims do not select the volumes labelled ferry.dev/node-store'
grep -Fq -- '--node-store-volumes' "$work/pvstore-node.yaml" || fail 'perNode: the operator is not given --node-store-volumes'
# The extra ClusterRole and its binding equal deploy/rbac-node-store.yaml's: their kinds, names,
# rules, role and subjects, line for line (labels and comments aside).
node_store_rbac() { # node_store_rbac FILE
  awk '
    function flush() { if (doc ~ /\n  name: ferry-operator-node-store\n/) printf "%s", doc; doc = "\n" }
    BEGIN { doc = "\n" }
    /^---/ { flush(); next }
    /^ *(- )?(kind|name|apiGroups|resources|verbs|apiGroup|namespace):/ { doc = doc $0 "\n" }
    END { flush() }
  ' "$1" | sed '/^$/d'
}
diff <(node_store_rbac "$repo/deploy/rbac-node-store.yaml") <(node_store_rbac "$work/pvstore-node.yaml") \
  || fail 'perNode: the node-store ClusterRole or binding differs from deploy/rbac-node-store.yaml'
[[ $(node_store_rbac "$work/pvstore-node.yaml" | grep -c '^kind: ClusterRole') == 2 ]] \
  || fail 'perNode: no ClusterRole and ClusterRoleBinding ferry-operator-node-store rendered'
ok "nodeService.persistentVolume.perNode: claims select ferry.dev/node-store volumes, --node-store-volumes, RBAC equal to deploy/rbac-node-store.yaml"
if [[ $have_yaml == 1 ]]; then
  python3 - "$work/full.yaml" "$work/default.yaml" <<'EOF'
import json, sys, yaml

def deployment(path):
    with open(path) as f:
        return next(d for d in yaml.safe_load_all(f) if d and d["kind"] == "Deployment")

def flag(args, name):
    vals = [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]
    return vals

d = deployment(sys.argv[1])
pod = d["spec"]["template"]["spec"]
c = pod["containers"][0]
args = c["args"]
tol = json.loads(flag(args, "--mover-tolerations")[0])
if tol != [
    {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"},
    {"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "operator": "Exists", "tolerationSeconds": 300},
    ]:
    sys.exit(f"FAIL full: --mover-tolerations {tol}")
res = json.loads(flag(args, "--mover-resources")[0])
# Every quantity a string (the operator's Quantity type), big integers not in float notation.
if res != {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "1", "memory": "1073741824"}}:
    sys.exit(f"FAIL full: --mover-resources {res}")
names = [x.split("=", 1)[0] for x in args
         if not x.startswith(("--host-root", "--mover-label", "--mover-image-pull-secret", "--allowed-priority-class"))]
if len(names) != len(set(names)):
    sys.exit(f"FAIL full: a flag is repeated: {names}")
print("ok   full: --mover-tolerations and --mover-resources are the values as JSON (quantities strings); no flag repeated")

for path in sys.argv[1:]:
    d = deployment(path)
    pod = d["spec"]["template"]["spec"]
    c = pod["containers"][0]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]}
    name = path.rsplit("/", 1)[-1]
    def check(cond, what):
        if not cond:
            sys.exit(f"FAIL {name}: {what}")
    check(env.get("POD_NAMESPACE") == "metadata.namespace" and env.get("POD_NAME") == "metadata.name",
          f"POD_NAMESPACE/POD_NAME not from the downward API: {env}")
    check(c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"},
          f"liveness probe is not GET /healthz on port metrics: {c['livenessProbe']}")
    check(c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"},
          f"readiness probe is not GET /readyz on port metrics: {c['readinessProbe']}")
    port = [p for p in c["ports"] if p["name"] == "metrics"][0]["containerPort"]
    check(any(a.startswith("--metrics-addr=") and a.endswith(f":{port}") for a in c["args"]),
          f"--metrics-addr does not use the metrics port {port}")
    sc, psc = c["securityContext"], pod["securityContext"]
    check(sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
          and sc["capabilities"]["drop"] == ["ALL"], f"container securityContext {sc}")
    check(psc["runAsNonRoot"] is True and psc["runAsUser"] == 65532
          and psc["seccompProfile"]["type"] == "RuntimeDefault", f"pod securityContext {psc}")
    check(pod["automountServiceAccountToken"] is True, "automountServiceAccountToken is not true")
    check(pod["terminationGracePeriodSeconds"] >= 30, "terminationGracePeriodSeconds < 30")
    check(d["spec"]["strategy"]["type"] == "RollingUpdate", "strategy is not RollingUpdate")
    check(any(a.startswith("--leader-election-id=") for a in c["args"]), "no --leader-election-id")
    peering = [p["containerPort"] for p in c["ports"] if p["name"] == "peering"]
    listen = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--peering-listen=")]
    check(len(peering) == len(listen) <= 1, f"container port peering {peering} but --peering-listen {listen}")
    check(all(l.endswith(f":{p}") for l, p in zip(listen, peering)),
          f"--peering-listen {listen} does not use the container port peering {peering}")
    print(f"ok   {path.rsplit('/', 1)[-1]}: downward-API env, probes on the metrics port, locked-down security context, RollingUpdate")
EOF
else
  grep -Fq -- '--mover-tolerations=[{"effect":"NoSchedule","key":"nvidia.com/gpu","operator":"Exists"}' "$work/full.yaml" \
    || fail "full: --mover-tolerations"
  grep -Fq -- '"requests":{"cpu":"1","memory":"1073741824"}' "$work/full.yaml" || fail "full: --mover-resources"
  for f in default full; do
    grep -q 'fieldPath: metadata.namespace' "$work/$f.yaml" && grep -q 'path: /readyz' "$work/$f.yaml" \
      && grep -q 'readOnlyRootFilesystem: true' "$work/$f.yaml" || fail "$f: env, probes or securityContext"
  done
fi
ok "operator flags rendered from every value"

run "optional objects: ServiceMonitor, PodDisruptionBudget, Services"
grep -q '^kind: ServiceMonitor' "$work/default.yaml" && fail "default: a ServiceMonitor is rendered"
grep -q '^apiVersion: monitoring.coreos.com/v1' "$work/full.yaml" || fail "full: no ServiceMonitor"
grep -q '^kind: PodDisruptionBudget' "$work/full.yaml" || fail "full: no PodDisruptionBudget"
grep -A3 '^  ports:' "$work/default.yaml" | grep -q 'name: metrics' || fail "default: no Service port named metrics"
grep -q '^# Source: ferry/templates/service-peering.yaml' "$work/default.yaml" \
  && fail "default: the cross-cluster Service is rendered (crossCluster.enabled is false)"
render "$work/peering.yaml" -f "$chart/ci/full-values.yaml" --show-only templates/service-peering.yaml
for want in '  name: ferry-full-peering' '  type: NodePort' '    - name: peering' '      port: 7543' \
  '      targetPort: 7543' '      nodePort: 30743' '    app.kubernetes.io/component: operator' \
  '    example.com/exposed-by: platform' '    ferry.dev/peering-leader: "true"'; do
  grep -Fqx -- "$want" "$work/peering.yaml" || fail "full: the cross-cluster Service has no line '$want'"
done
render "$work/peering-lb.yaml" --show-only templates/service-peering.yaml \
  --set crossCluster.enabled=true,crossCluster.service.type=LoadBalancer
grep -Fqx '  type: LoadBalancer' "$work/peering-lb.yaml" && ! grep -q 'nodePort:' "$work/peering-lb.yaml" \
  || fail "crossCluster.service.type=LoadBalancer: not a LoadBalancer without nodePort"
grep -Fqx '  name: ferry-peering' "$work/peering-lb.yaml" || fail "release ferry: the Service is not ferry-peering"
ok "ServiceMonitor only when enabled; PDB when enabled; Service port metrics; Service <fullname>-peering only with crossCluster.enabled"

run "NetworkPolicies: on by default (the node services' policy, --network-policies, RBAC on networkpolicies), none when off"
grep -q '^kind: NetworkPolicy' "$work/default.yaml" || fail "default: no NetworkPolicy for the node services"
grep -q -- '- --network-policies' "$work/default.yaml" || fail "default: the operator is not given --network-policies"
grep -q 'networkpolicies' "$work/default.yaml" || fail "default: the ClusterRole may not write NetworkPolicies"
grep -q -- '- --network-policy-peer=10.20.0.0/16' "$work/full.yaml" || fail "full: networkPolicy.extraFrom is not passed to the operator"
grep -Fq 'cidr: "10.20.0.0/16"' "$work/full.yaml" || fail "full: networkPolicy.extraFrom is not admitted to the node services"
render "$work/nopolicy.yaml" --set networkPolicy.enabled=false
grep -q '^kind: NetworkPolicy' "$work/nopolicy.yaml" && fail "networkPolicy.enabled=false: a NetworkPolicy is rendered"
grep -q -- '--network-policies' "$work/nopolicy.yaml" && fail "networkPolicy.enabled=false: the operator still keeps policies"
grep -q 'networkpolicies' "$work/nopolicy.yaml" && fail "networkPolicy.enabled=false: the ClusterRole still writes NetworkPolicies"
expect_reject "networkPolicy.extraFrom=[not-a-cidr]" 'extraFrom|pattern' --set-json 'networkPolicy.extraFrom=["not-a-cidr"]'
ok "the node services' policy, the operator's flag and its RBAC come and go together"

run "Grafana dashboard and PrometheusRule: only when enabled; JSON with panels; the four alerts; metric names the operator exposes"
grep -q '^kind: PrometheusRule' "$work/default.yaml" && fail "default: a PrometheusRule is rendered"
grep -q 'grafana_dashboard:' "$work/default.yaml" && fail "default: a dashboard ConfigMap is rendered"
grep -q '^kind: PrometheusRule' "$work/full.yaml" || fail "full: no PrometheusRule"
grep -q '^    grafana_dashboard: "1"$' "$work/full.yaml" || fail "full: no ConfigMap labelled grafana_dashboard: \"1\""
render "$work/dashboard.yaml" -f "$chart/ci/full-values.yaml" --show-only templates/grafana-dashboard.yaml
render "$work/rule.yaml" -f "$chart/ci/full-values.yaml" --show-only templates/prometheusrule.yaml
render "$work/rule-default.yaml" --show-only templates/prometheusrule.yaml --set metrics.prometheusRule.enabled=true
expect_reject "metrics.prometheusRule.job with a quote" "/metrics/prometheusRule/job.*does not match pattern" \
  --set 'metrics.prometheusRule.job=a"b'
# The families the operator renders: every "ferry_*" string in metrics.rs before its tests. The
# text format names a counter's samples <family>_total and a histogram's <family>_bucket, _sum and
# _count; any of these may appear in a query.
sed '/^#\[cfg(test)\]/q' "$repo/operator/src/metrics.rs" | grep -oE '"ferry_[a-z_]+[a-z]"' | tr -d '"' | sort -u >"$work/families"
[[ $(wc -l <"$work/families") -ge 15 ]] || fail "operator/src/metrics.rs: only $(wc -l <"$work/families") metric names found"
while read -r f; do printf '%s\n' "$f" "${f}_total" "${f}_bucket" "${f}_sum" "${f}_count"; done <"$work/families" | sort -u >"$work/exposed"
# docs/operator.md lists each family (a counter with its _total).
while read -r f; do
  grep -Fq -- "\`$f" "$repo/docs/operator.md" || fail "docs/operator.md does not list $f (operator/src/metrics.rs renders it)"
done <"$work/families"
ok "docs/operator.md lists all $(wc -l <"$work/families") metric families of operator/src/metrics.rs"
for a in FerryOperatorDown FerryTransferStuck FerryTransferFailureRate FerryReconcileErrors; do
  grep -Eq -- "- alert: $a\$" "$work/rule.yaml" || fail "full: the PrometheusRule has no alert $a"
done
if [[ $have_yaml == 1 ]]; then
  python3 - "$work/exposed" "$work/dashboard.yaml" "$work/rule.yaml" "$work/rule-default.yaml" "$work/default.yaml" <<'EOF2'
import json, re, sys, yaml

exposed = set(open(sys.argv[1]).read().split())
def one(path):
    ds = [d for d in yaml.safe_load_all(open(path)) if d]
    if len(ds) != 1:
        sys.exit(f"FAIL {path}: {len(ds)} objects, want 1")
    return ds[0]
def check(cond, what):
    if not cond:
        sys.exit(f"FAIL {what}")
def unknown(expr):
    return sorted(set(re.findall(r"\bferry_[a-z_]+\b", expr)) - exposed)

cm = one(sys.argv[2])
meta = cm["metadata"]
check(cm["kind"] == "ConfigMap" and meta["namespace"] == "monitoring", f"dashboard: {cm['kind']} in {meta.get('namespace')}")
check(meta["labels"].get("grafana_dashboard") == "1" and meta["labels"].get("team") == "platform",
      f"dashboard: labels {meta['labels']}")
check(meta.get("annotations") == {"grafana_folder": "Storage"}, f"dashboard: annotations {meta.get('annotations')}")
check(list(cm["data"]) == ["ferry.json"], f"dashboard: data keys {list(cm['data'])}")
try:
    dash = json.loads(cm["data"]["ferry.json"])
except ValueError as e:
    sys.exit(f"FAIL dashboard: ferry.json is not JSON: {e}")
panels = [p for p in dash.get("panels", []) if p.get("type") != "row"]
check(isinstance(dash.get("panels"), list) and len(panels) >= 9, f"dashboard: {len(panels)} panels")
ids = [p["id"] for p in dash["panels"]]
check(len(ids) == len(set(ids)), f"dashboard: panel ids repeat: {ids}")
exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
check(all(p.get("targets") for p in panels), "dashboard: a panel without a query")
for e in exprs:
    check(not unknown(e), f"dashboard: {e} uses {unknown(e)}, which operator/src/metrics.rs does not render")
    check('job=~"$job"' in e, f"dashboard: {e} does not select job=~\"$job\"")
used = {m for e in exprs for m in re.findall(r"\bferry_[a-z_]+\b", e)}
for want in ("ferry_transfers", "ferry_transfers_queued", "ferry_reconcile_duration_seconds_bucket",
             "ferry_reconcile_errors_total", "ferry_api_requests_total", "ferry_status_patches_total",
             "ferry_transfer_bytes_done", "ferry_transfer_throughput_bytes_per_second"):
    check(want in used, f"dashboard: no panel uses {want}")
print(f"ok   dashboard: ConfigMap in monitoring, grafana_dashboard \"1\", {len(panels)} panels, {len(exprs)} queries of rendered metrics")

svc = next(d for d in yaml.safe_load_all(open(sys.argv[5]))
           if d and d["kind"] == "Service" and d["metadata"]["name"] != "ferry-node")["metadata"]["name"]
for path, job, ns in ((sys.argv[3], "ferry-scraped", "monitoring"), (sys.argv[4], svc, "ferry-system")):
    rule = one(path)
    check(rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule",
          f"{path}: {rule['apiVersion']} {rule['kind']}")
    check(rule["metadata"]["namespace"] == ns, f"{path}: namespace {rule['metadata']['namespace']}, want {ns}")
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    names = sorted(r["alert"] for r in rules)
    check(names == sorted(["FerryOperatorDown", "FerryTransferStuck", "FerryTransferFailureRate", "FerryReconcileErrors"]),
          f"{path}: alerts {names}")
    for r in rules:
        check(not unknown(r["expr"]), f"{path}: {r['alert']} uses {unknown(r['expr'])}, not rendered by the operator")
        check(f'job="{job}"' in r["expr"], f"{path}: {r['alert']} does not select job=\"{job}\": {r['expr']}")
        check(r["labels"].get("severity") in ("warning", "critical"), f"{path}: {r['alert']} severity")
        check("{{ $labels" not in r["expr"], f"{path}: {r['alert']}: a template in the expression")
    check(rule["metadata"]["labels"].get("release") == "prometheus" or path == sys.argv[4], f"{path}: labels")
print(f"ok   PrometheusRule: the four alerts over rendered metrics; job ferry-scraped when set, else the metrics Service {svc}")
EOF2
else
  grep -q '"panels": \[' "$work/dashboard.yaml" || fail "dashboard: no panels array"
  grep -Fq 'job="ferry-scraped"' "$work/rule.yaml" || fail "full: the rules do not select job=\"ferry-scraped\""
  grep -Fq 'job="ferry-operator-metrics"' "$work/rule-default.yaml" || fail "default job: not the metrics Service"
fi
ok "dashboard and PrometheusRule only when enabled"

if [[ $have_yaml == 1 ]]; then
  run "ci/full-values.yaml sets every value of values.yaml"
  python3 - "$chart/values.yaml" "$chart/ci/full-values.yaml" <<'EOF'
import sys, yaml
def leaves(v, p=""):
    if isinstance(v, dict) and v:
        for k, x in v.items():
            yield from leaves(x, f"{p}.{k}" if p else k)
    else:
        yield p
defaults = yaml.safe_load(open(sys.argv[1]))
full = yaml.safe_load(open(sys.argv[2]))
def get(d, path):
    for k in path.split("."):
        if not isinstance(d, dict) or k not in d:
            return KeyError
        d = d[k]
    return d
missing = [p for p in leaves(defaults) if get(full, p) is KeyError]
if missing:
    sys.exit(f"FAIL ci/full-values.yaml does not set: {', '.join(missing)}")
print(f"ok   all {len(list(leaves(defaults)))} leaf values are set")
EOF
fi

run "the pre-delete hook: refuses by default, deletes with uninstall.deleteTransfers, none when off"
render "$work/hook.yaml" --show-only templates/pre-delete-hook.yaml
render "$work/hook-delete.yaml" --show-only templates/pre-delete-hook.yaml --set uninstall.deleteTransfers=true
grep -q 'helm.sh/hook: pre-delete' "$work/hook.yaml" || fail "default: no pre-delete hook"
grep -Fq 'verbs: ["list"]' "$work/hook.yaml" || fail "default: the hook may do more than list Transfers"
grep -Fq -- '--delete-transfers' "$work/hook.yaml" && fail "default: the hook deletes Transfers"
grep -Fq 'verbs: ["list", "delete"]' "$work/hook-delete.yaml" || fail "deleteTransfers: the hook cannot delete"
grep -Fq -- '- --delete-transfers' "$work/hook-delete.yaml" || fail "deleteTransfers: no --delete-transfers"
if "$HELM" template ferry "$chart" "${reg[@]}" --set uninstall.hook=false | grep -q 'helm.sh/hook'; then
  fail "uninstall.hook=false still renders a hook"
fi
expect_reject "uninstall.timeoutSeconds=5" "/uninstall/timeoutSeconds.*minimum" --set uninstall.timeoutSeconds=5
ok "hook: list-only refusal by default; list+delete with deleteTransfers; absent when off"

run "ci/local-values.yaml (make deploy-local); metrics.bindAddress=\$(POD_IP) binds the pod's own address"
render "$work/local.yaml" -f "$chart/ci/local-values.yaml" --set 'metrics.bindAddress=$(POD_IP)'
grep -Fq -- '- --metrics-addr=$(POD_IP):8080' "$work/local.yaml" || fail "local: --metrics-addr is not \$(POD_IP):8080"
render "$work/local-peering.yaml" -f "$chart/ci/local-values.yaml" --set 'metrics.bindAddress=$(POD_IP)' --set crossCluster.enabled=true
grep -Fq -- '- --peering-listen=$(POD_IP):7443' "$work/local-peering.yaml" \
  || fail "local with crossCluster.enabled: --peering-listen is not \$(POD_IP):7443"
render "$work/v4-peering.yaml" --set crossCluster.enabled=true
grep -Fq -- '- --peering-listen=0.0.0.0:7443' "$work/v4-peering.yaml" \
  || fail "crossCluster.enabled: --peering-listen is not 0.0.0.0:7443"
grep -Fq -- '- --host-root=*=/data' "$work/local.yaml" || fail "local: /data is not granted to every namespace"
noreg render "$work/local-images.yaml" -f "$chart/ci/local-values.yaml"
expect_images "local: the images of make images" "$work/local-images.yaml" \
  "localhost/ferry/ferry-mover:dev localhost/ferry/ferry-mover:dev localhost/ferry/ferry-operator:dev localhost/ferry/ferry-operator:dev mover localhost/ferry/ferry-mover:dev"
grep -A3 'name: POD_IP' "$work/local.yaml" | grep -q 'fieldPath: status.podIP' || fail "local: POD_IP not from status.podIP"
ok "local: --metrics-addr=\$(POD_IP):8080 (--peering-listen=\$(POD_IP):7443 when enabled), --host-root=*=/data; default 0.0.0.0:7443"

run "deploy/Dockerfile and the chart agree on users; deploy/install.yaml is current"
stage_user() { # the USER of Dockerfile stage $1
  awk -v s="$1" 'toupper($1) == "FROM" { cur = (tolower($(NF-1)) == "as") ? $NF : "" } cur == s && toupper($1) == "USER" { print $2 }' "$repo/deploy/Dockerfile"
}
[[ $(stage_user ferry-operator) == 65532:65532 ]] || fail "Dockerfile: ferry-operator USER is $(stage_user ferry-operator), not 65532:65532"
grep -q 'runAsUser: 65532' "$work/default.yaml" || fail "the chart's operator does not run as the image's uid 65532"
[[ $(stage_user ferry-mover) == "$(sed -n 's/^moverUid: //p' "$chart/values.yaml"):$(sed -n 's/^moverUid: //p' "$chart/values.yaml")" ]] \
  || fail "Dockerfile: ferry-mover USER $(stage_user ferry-mover) is not the chart's moverUid"
ok "operator and mover images run as 65532:65532, as the chart's pods do"
# The recipe stays one that docker build, podman build and buildah accept without pulling anything:
# only FROM scratch, and only the instructions every builder knows, ENTRYPOINT in exec form.
for recipe in "$repo/deploy/Dockerfile" "$repo/tests/images/Dockerfile"; do
  bad="$(grep -vE '^\s*(#|$)' "$recipe" | grep -vE '^\s+' |
    grep -vE '^(ARG|COPY|LABEL|USER|ENV) |^FROM scratch AS [a-z-]+$|^ENTRYPOINT \["[^"]+"(, "[^"]+")*\]$' || true)"
  [[ -z "$bad" ]] || fail "$(basename "$(dirname "$recipe")")/Dockerfile: not FROM scratch or an unexpected instruction: $bad"
done
ok "deploy/Dockerfile and tests/images/Dockerfile: FROM scratch only, exec-form entrypoints"
HELM="$HELM" "$repo/deploy/render-manifests.sh" --check || fail "deploy/install.yaml is stale: make manifests"

run "helm package (the .helmignore keeps the dev scripts out)"
"$HELM" package "$chart" -d "$work" >/dev/null || fail "helm package"
tar -tzf "$work"/ferry-0.1.0.tgz >"$work/files"
grep -Eq 'check\.sh|sync-crd\.sh|/tests/' "$work/files" && fail "the package contains dev files: $(cat "$work/files")"
ok "ferry-0.1.0.tgz: $(wc -l <"$work/files") files"

echo "---- all chart checks passed"
