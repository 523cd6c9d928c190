{{/*
The chart name, or nameOverride.
*/}}
{{- define "ferry.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name that prefixes every resource name: fullnameOverride, else the release name when it
contains the chart name (release "ferry" -> "ferry"), else "<release>-<chart>".
*/}}
{{- define "ferry.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Name of the operator's Deployment, ServiceAccount, ClusterRole and bindings: "<fullname>-operator"
("ferry-operator" for a release named ferry, as in deploy/rbac.yaml).
*/}}
{{- define "ferry.operatorName" -}}
{{- printf "%s-operator" (include "ferry.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{- define "ferry.metricsServiceName" -}}
{{- printf "%s-metrics" (include "ferry.operatorName" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/*
Name of the Service in front of the cross-cluster API (crossCluster.enabled): "<fullname>-peering".
*/}}
{{- define "ferry.peeringServiceName" -}}
{{- printf "%s-peering" (include "ferry.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{- define "ferry.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ferry.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ferry.leaderElectionId" -}}
{{- default (include "ferry.operatorName" .) .Values.leaderElection.id }}
{{- end }}

{{- define "ferry.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels of the operator's pods (also the metrics Service's selector).
*/}}
{{- define "ferry.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ferry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
Labels of every resource the chart renders (except the CRD, which is kept identical to crds/).
*/}}
{{- define "ferry.labels" -}}
helm.sh/chart: {{ include "ferry.chart" . }}
{{ include "ferry.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ferry
{{- end }}

{{/*
An image reference from {repository, tag, digest}: "<imageRegistry>/<repository>" when imageRegistry
is set, else the repository as it is (then it must name a registry: it must contain a '/'); the tag
defaults to the chart's appVersion; a digest takes precedence over the tag.
Call with (dict "image" .Values.image "root" . "value" "image").
*/}}
{{- define "ferry.imageRef" -}}
{{- $registry := trimSuffix "/" (toString (default "" .root.Values.imageRegistry)) }}
{{- $repo := .image.repository }}
{{- if $registry }}
{{- $repo = printf "%s/%s" $registry (trimPrefix "/" $repo) }}
{{- else if not (contains "/" $repo) }}
{{- fail (printf "imageRegistry is not set and %s.repository (%q) names no registry. ferry publishes no images: build them and push them to your own registry (make images; make push REGISTRY=host:port/prefix), then set imageRegistry=host:port/prefix (see the chart's README, Images)" .value $repo) }}
{{- end }}
{{- if .image.digest }}
{{- printf "%s@%s" $repo .image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{/*
A resource quantity as a string, as the Kubernetes API writes it: Helm reads a bare YAML number
(cpu: 1, memory: 1073741824) as a float, and this keeps it an integer string ("1", "1073741824")
rather than a JSON number in --mover-resources (or 1.073741824e+09 where a float is printed).
*/}}
{{- define "ferry.quantity" -}}
{{- if kindIs "float64" . }}
{{- if eq (float64 (int64 .)) . }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{/*
moverDefaults.resources as JSON with every quantity a string.
*/}}
{{- define "ferry.moverResourcesJson" -}}
{{- $out := dict }}
{{- range $section, $vals := .Values.moverDefaults.resources }}
{{- if has $section (list "requests" "limits") }}
{{- $m := dict }}
{{- range $k, $q := $vals }}
{{- $_ := set $m $k (include "ferry.quantity" $q) }}
{{- end }}
{{- $_ := set $out $section $m }}
{{- else }}
{{- $_ := set $out $section $vals }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
Checks the schema cannot express (and repeats the vital ones for installs with
--skip-schema-validation), with messages that name the value.
*/}}
{{- define "ferry.validate" -}}
{{- range $i, $g := .Values.hostRoots }}
{{- $root := toString (default "" $g.root) }}
{{- if or (not $g.namespace) (contains "=" (toString $g.namespace)) }}
{{- fail (printf "hostRoots[%d].namespace must be a namespace name or \"*\", got %q" $i (toString (default "" $g.namespace))) }}
{{- end }}
{{- if not (hasPrefix "/" $root) }}
{{- fail (printf "hostRoots[%d].root must be an absolute path (start with /), got %q" $i $root) }}
{{- end }}
{{- if regexMatch "(^|/)\\.\\.(/|$)" $root }}
{{- fail (printf "hostRoots[%d].root must not contain a '..' component, got %q" $i $root) }}
{{- end }}
{{- end }}
{{- range $k, $v := .Values.moverDefaults.labels }}
{{- if hasPrefix "ferry.dev/" $k }}
{{- fail (printf "moverDefaults.labels: the key %q is in ferry.dev/, which the operator reserves" $k) }}
{{- end }}
{{- end }}
{{- if eq (int64 .Values.moverPorts.data) (int64 .Values.moverPorts.progress) }}
{{- fail (printf "moverPorts.data and moverPorts.progress must differ (both %d)" (int64 .Values.moverPorts.data)) }}
{{- end }}
{{- if lt (int64 .Values.replicas) 1 }}
{{- fail "replicas must be at least 1" }}
{{- end }}
{{- $cc := .Values.crossCluster }}
{{- if not (has $cc.service.type (list "NodePort" "LoadBalancer")) }}
{{- fail (printf "crossCluster.service.type must be NodePort or LoadBalancer, got %q" (toString $cc.service.type)) }}
{{- end }}
{{- if not (has $cc.receiverServiceType (list "NodePort" "LoadBalancer")) }}
{{- fail (printf "crossCluster.receiverServiceType must be NodePort or LoadBalancer, got %q" (toString $cc.receiverServiceType)) }}
{{- end }}
{{- if and $cc.enabled (eq (int64 $cc.port) (int64 .Values.metrics.port)) }}
{{- fail (printf "crossCluster.port and metrics.port must differ (both %d)" (int64 $cc.port)) }}
{{- end }}
{{- if and (not (kindIs "invalid" $cc.service.nodePort)) (ne $cc.service.type "NodePort") }}
{{- fail (printf "crossCluster.service.nodePort is for type NodePort only (type is %s); set it to null" $cc.service.type) }}
{{- end }}
{{- end }}

{{/*
The operator's command line, one flag per list item in --flag=value form (a value may start with
'-' or be empty, as --block-service= is).
*/}}
{{- define "ferry.operatorArgs" -}}
{{- $v := .Values }}
{{- $args := list
  (printf "--cluster-name=%s" $v.clusterName)
  (printf "--mover-image=%s" (include "ferry.imageRef" (dict "image" $v.moverImage "root" . "value" "moverImage")))
  (printf "--mover-uid=%d" (int64 $v.moverUid))
  (printf "--block-service=%s" (ternary (printf "%s.%s.svc:%d" (include "ferry.nodeServiceName" .) .Release.Namespace (int64 $v.nodeService.port)) "" $v.nodeService.enabled))
  (printf "--max-active=%d" (int64 $v.maxActive))
  (printf "--max-active-per-node=%d" (int64 $v.maxActivePerNode))
  (printf "--max-active-per-namespace=%d" (int64 $v.maxActivePerNamespace))
  (printf "--mover-pending-timeout=%d" (int64 $v.moverPendingTimeoutSeconds))
  (printf "--status-patch-qps=%v" $v.statusPatchQPS)
  (printf "--max-progress-watchers=%d" (int64 $v.maxProgressWatchers))
  (printf "--peer-silence-grace=%d" (int64 $v.crossCluster.silenceGraceSeconds))
  (printf "--cert-days=%d" (int64 $v.certDays))
  (printf "--default-streams=%d" (int64 $v.moverDefaults.streams))
  (printf "--default-compression=%s" $v.moverDefaults.compression)
  (printf "--data-port=%d" (int64 $v.moverPorts.data))
  (printf "--progress-port=%d" (int64 $v.moverPorts.progress))
}}
{{- if $v.allowRootMovers }}
{{- $args = append $args "--allow-root-movers" }}
{{- end }}
{{- if $v.networkPolicy.enabled }}
{{- $args = append $args "--network-policies" }}
{{- range $v.networkPolicy.extraFrom }}
{{- $args = append $args (printf "--network-policy-peer=%s" .) }}
{{- end }}
{{- end }}
{{- if (include "ferry.nodeStorePerNode" .) }}
{{- $args = append $args "--node-store-volumes" }}
{{- end }}
{{- if $v.allowPrivilegedReaders }}
{{- $args = append $args "--allow-privileged-readers" }}
{{- end }}
{{- range $v.hostRoots }}
{{- $args = append $args (printf "--host-root=%s=%s%s" .namespace .root (ternary ":ro" "" (default false .readOnly))) }}
{{- end }}
{{- with $v.moverDefaults.tolerations }}
{{- $args = append $args (printf "--mover-tolerations=%s" (toJson .)) }}
{{- end }}
{{- if $v.moverDefaults.resources }}
{{- $args = append $args (printf "--mover-resources=%s" (include "ferry.moverResourcesJson" .)) }}
{{- end }}
{{- range $v.imagePullSecrets }}
{{- $args = append $args (printf "--mover-image-pull-secret=%s" .name) }}
{{- end }}
{{- with $v.moverDefaults.priorityClassName }}
{{- $args = append $args (printf "--mover-priority-class=%s" .) }}
{{- end }}
{{- range $v.moverDefaults.allowedPriorityClasses }}
{{- $args = append $args (printf "--allowed-priority-class=%s" .) }}
{{- end }}
{{- range $k, $val := $v.moverDefaults.labels }}
{{- $args = append $args (printf "--mover-label=%s=%s" $k (toString $val)) }}
{{- end }}
{{- $addr := $v.metrics.bindAddress }}
{{- if contains ":" $addr }}
{{- $addr = printf "[%s]" $addr }}
{{- end }}
{{- $args = append $args (printf "--metrics-addr=%s:%d" $addr (int64 $v.metrics.port)) }}
{{- if $v.crossCluster.enabled }}
{{- /* The address follows metrics.bindAddress: "$(POD_IP)" stays (pods that share a network
namespace); any other address becomes the wildcard of its family (0.0.0.0 or [::]), as the API
must be reachable through its Service. */}}
{{- $peerAddr := "0.0.0.0" }}
{{- if eq $v.metrics.bindAddress "$(POD_IP)" }}
{{- $peerAddr = "$(POD_IP)" }}
{{- else if contains ":" $v.metrics.bindAddress }}
{{- $peerAddr = "[::]" }}
{{- end }}
{{- $args = append $args (printf "--peering-listen=%s:%d" $peerAddr (int64 $v.crossCluster.port)) }}
{{- end }}
{{- $args = append $args (printf "--peering-service-type=%s" $v.crossCluster.receiverServiceType) }}
{{- $args = append $args (printf "--leader-election-id=%s" (include "ferry.leaderElectionId" .)) }}
{{- $args = append $args (printf "--log-format=%s" $v.logFormat) }}
{{- $rendered := list }}
{{- range $args }}
{{- $rendered = append $rendered (regexReplaceAll "=.*$" . "") }}
{{- end }}
{{- range $v.extraArgs }}
{{- $flag := regexReplaceAll "=.*$" . "" }}
{{- if and (has $flag $rendered) (not (has $flag (list "--host-root" "--mover-label" "--mover-image-pull-secret" "--allowed-priority-class"))) }}
{{- fail (printf "extraArgs: %s is already rendered from a value (the operator rejects a repeated flag); set the value instead" $flag) }}
{{- end }}
{{- $args = append $args . }}
{{- end }}
{{- toYaml $args }}
{{- end }}

{{/*
The node service's DaemonSet, Service and Secret name.
*/}}
{{- define "ferry.nodeServiceName" -}}
ferry-node
{{- end }}

{{/*
"true" when each node's store is kept on that node's own PersistentVolume across pod
replacements (the claims select labelled volumes and the operator binds them again), else "".
*/}}
{{- define "ferry.nodeStorePerNode" -}}
{{- $ns := .Values.nodeService }}
{{- $pv := $ns.persistentVolume | default dict }}
{{- if and $ns.enabled $pv.enabled $pv.perNode }}true{{ end }}
{{- end }}
