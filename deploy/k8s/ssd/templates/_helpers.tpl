{{/*
Names. Every resource is named through "ssd.fullname" (plus a component suffix), so two releases never clash.
*/}}
{{- define "ssd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ssd.fullname" -}}
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

{{/* "<fullname>-<component>"; call with (dict "root" $ "component" "router"). */}}
{{- define "ssd.componentName" -}}
{{- printf "%s-%s" (include "ssd.fullname" .root | trunc 50 | trimSuffix "-") .component }}
{{- end }}

{{- define "ssd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels; call with (dict "root" $ "component" "draft"). */}}
{{- define "ssd.labels" -}}
helm.sh/chart: {{ include "ssd.chart" .root }}
{{ include "ssd.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: ssd
{{- end }}

{{- define "ssd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ssd.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "ssd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ssd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image of a component: its own image block overrides the global one; the tag defaults to appVersion. */}}
{{- define "ssd.image" -}}
{{- $img := .values.image | default dict -}}
{{- $repo := $img.repository | default .root.Values.image.repository -}}
{{- $tag := $img.tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{- define "ssd.pullPolicy" -}}
{{- $img := .values.image | default dict -}}
{{- $img.pullPolicy | default .root.Values.image.pullPolicy }}
{{- end }}

{{/* Redis: the in-chart Service or the external URL ("" when neither). */}}
{{- define "ssd.redisUrl" -}}
{{- if .Values.redis.externalUrl }}
{{- .Values.redis.externalUrl }}
{{- else if .Values.redis.enabled }}
{{- printf "redis://%s:%d/0" (include "ssd.componentName" (dict "root" . "component" "redis")) (int .Values.redis.ports.redis) }}
{{- end }}
{{- end }}

{{/* A model folder: absolute paths as given, others relative to models.mountPath. */}}
{{- define "ssd.modelPath" -}}
{{- if hasPrefix "/" .model }}{{ .model }}{{ else }}{{ printf "%s/%s" (trimSuffix "/" .root.Values.models.mountPath) .model }}{{ end }}
{{- end }}

{{/* Settings that cannot work together fail the install with a message that says what to change. */}}
{{- define "ssd.validate" -}}
{{- if and (gt (int .Values.router.replicaCount) 1) (not (include "ssd.redisUrl" .)) }}
{{- fail (printf "router.replicaCount=%d needs Redis request state so a stream can resume on another router: set redis.enabled=true or redis.externalUrl" (int .Values.router.replicaCount)) }}
{{- end }}
{{- if and .Values.redis.enabled .Values.redis.externalUrl }}
{{- fail "set either redis.enabled=true (in-chart Redis) or redis.externalUrl, not both" }}
{{- end }}
{{- if and (ne .Values.router.mode "ar") (not .Values.draft.enabled) }}
{{- fail (printf "router.mode=%s needs draft replicas: set draft.enabled=true, or router.mode=ar" .Values.router.mode) }}
{{- end }}
{{- if and (eq .Values.router.discovery "redis") (not (include "ssd.redisUrl" .)) }}
{{- fail "router.discovery=redis needs Redis: set redis.enabled=true or redis.externalUrl" }}
{{- end }}
{{- if and .Values.router.apiKeys.enabled (not .Values.router.apiKeys.existingSecret) (not .Values.router.apiKeys.keys) }}
{{- fail "router.apiKeys.enabled needs router.apiKeys.existingSecret (a Secret you manage) or router.apiKeys.keys" }}
{{- end }}
{{- with .Values.draft.autoscaling }}
{{- if and .enabled (not .lateEntryRatio.enabled) (not .targetCPUUtilizationPercentage) }}
{{- fail "draft.autoscaling.enabled needs a metric: draft.autoscaling.lateEntryRatio.enabled or targetCPUUtilizationPercentage" }}
{{- end }}
{{- if and .enabled (gt (int .minReplicas) (int .maxReplicas)) }}
{{- fail (printf "draft.autoscaling.minReplicas (%d) is above maxReplicas (%d)" (int .minReplicas) (int .maxReplicas)) }}
{{- end }}
{{- end }}
{{- if and (eq .Values.models.volume.type "persistentVolumeClaim") (not .Values.models.volume.claimName) }}
{{- fail "models.volume.type=persistentVolumeClaim needs models.volume.claimName" }}
{{- end }}
{{- if and (eq .Values.models.volume.type "hostPath") (not .Values.models.volume.hostPath) }}
{{- fail "models.volume.type=hostPath needs models.volume.hostPath" }}
{{- end }}
{{- with .Values.models.download }}
{{- if .enabled }}
{{- if not .repos }}
{{- fail "models.download.enabled needs models.download.repos, e.g. [{repo: Qwen/Qwen3-0.6B, role: draft}]" }}
{{- end }}
{{- if and .token .tokenSecret.name }}
{{- fail "set models.download.tokenSecret.name (a Secret you manage) or models.download.token (the chart creates the Secret), not both" }}
{{- end }}
{{- range .repos }}
{{- if and (or (eq .role "target") $.Values.draft.enabled) (not (index $.Values .role).model) }}
{{- fail (printf "models.download.repos fetches %s into %s for the %s, but %s.model is empty (the embedded default): set %s.model=%s" .repo (include "ssd.modelPath" (dict "root" $ "model" (include "ssd.downloadFolder" .))) .role .role .role (include "ssd.downloadFolder" .)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.monitoring.podMonitor.enabled }}
{{- if not (int .Values.target.ports.metrics) }}
{{- fail "monitoring.podMonitor.enabled scrapes the workers' /metrics: set target.ports.metrics (e.g. 9400)" }}
{{- end }}
{{- if and .Values.draft.enabled (not (int .Values.draft.ports.metrics)) }}
{{- fail "monitoring.podMonitor.enabled scrapes the workers' /metrics: set draft.ports.metrics (e.g. 9400)" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Pod-level settings shared by every component; call with (dict "root" $ "values" .Values.draft "component" "draft"). */}}
{{- define "ssd.podSpecCommon" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .values.topologySpreadConstraints }}
{{- $selector := include "ssd.selectorLabels" . | fromYaml }}
topologySpreadConstraints:
{{- range .values.topologySpreadConstraints }}
  - {{ toYaml (merge (deepCopy .) (dict "labelSelector" (dict "matchLabels" $selector))) | nindent 4 | trim }}
{{- end }}
{{- end }}
{{- end }}

{{/* Pod annotations and labels of a component's pod template. */}}
{{- define "ssd.podMetadata" -}}
labels:
  {{- include "ssd.labels" . | nindent 2 }}
  {{- with .values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* grpc.health.v1 startup, readiness and liveness probes on `port`; timings from the component's probes block. */}}
{{- define "ssd.grpcProbes" -}}
{{- $port := int .port }}
{{- range $kind := list "startup" "readiness" "liveness" }}
{{ $kind }}Probe:
  grpc:
    port: {{ $port }}
  {{- toYaml (index $.probes $kind) | nindent 2 }}
{{- end }}
{{- end }}

{{/* preStop: keep serving while endpoints drop this pod, then SIGTERM starts the service's drain. */}}
{{- define "ssd.lifecycle" -}}
{{- if .preStopSleepSeconds }}
lifecycle:
  preStop:
    exec:
      command: ["sleep", "{{ int .preStopSleepSeconds }}"]
{{- end }}
{{- end }}

{{/* The models volume and scratch space (the root filesystem is read-only). */}}
{{- define "ssd.volumes" -}}
{{- $v := .Values.models.volume }}
- name: models
{{- if eq $v.type "persistentVolumeClaim" }}
  persistentVolumeClaim:
    claimName: {{ $v.claimName }}
    readOnly: {{ and $v.readOnly (not (or .Values.models.prepare.enabled .Values.models.download.enabled)) }}
{{- else if eq $v.type "hostPath" }}
  hostPath:
    path: {{ $v.hostPath }}
    type: DirectoryOrCreate
{{- else if $v.sizeLimit }}
  emptyDir:
    sizeLimit: {{ $v.sizeLimit }}
{{- else }}
  emptyDir: {}
{{- end }}
- name: tmp
  emptyDir: {}
{{- if .Values.dataPlane.curve.enabled }}
- name: curve-keys
  secret:
    secretName: {{ required "dataPlane.curve.existingSecret: name the Secret made from `ssd keys generate` (router.key, router.key_secret, worker.key, worker.key_secret)" .Values.dataPlane.curve.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "ssd.volumeMounts" -}}
- name: models
  mountPath: {{ .Values.models.mountPath }}
- name: tmp
  mountPath: /tmp
{{- if .Values.dataPlane.curve.enabled }}
- name: curve-keys
  mountPath: /etc/ssd/curve
  readOnly: true
{{- end }}
{{- end }}

{{- define "ssd.env" -}}
- name: SSD_MODELS_DIR
  value: {{ .root.Values.models.mountPath | quote }}
- name: XDG_CACHE_HOME
  value: /tmp/.cache
- name: HF_HOME
  value: /tmp/.cache/huggingface
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- with .values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The folder a models.download entry lands in under models.mountPath: its name, else the repo's last part
     lowercased (the default of `ssd models download`). */}}
{{- define "ssd.downloadFolder" -}}
{{- .name | default (splitList "/" .repo | last | lower) }}
{{- end }}

{{/* The Secret with the Hub token of models.download: the one named, the chart's own (from token), or "". */}}
{{- define "ssd.hfTokenSecret" -}}
{{- with .Values.models.download }}
{{- if .tokenSecret.name }}{{ .tokenSecret.name }}{{ else if .token }}{{ include "ssd.componentName" (dict "root" $ "component" "hf-token") }}{{ end }}
{{- end }}
{{- end }}

{{/* Init containers of an ssd pod; call with (dict "root" $ "values" .Values.x "component" "x"):
     `ssd models prepare` (models.prepare: the embedded default pair), then one `ssd models download` per entry of
     models.download.repos for this pod's role (the router's is target: it reads the target's tokenizer). */}}
{{- define "ssd.initContainers" -}}
{{- $root := .root }}
{{- $dl := $root.Values.models.download }}
{{- $role := ternary "target" .component (eq .component "router") }}
{{- $downloads := list }}
{{- if $dl.enabled }}
{{- range $i, $r := $dl.repos }}
{{- if eq $r.role $role }}
{{- $downloads = append $downloads (dict "index" $i "repo" $r) }}
{{- end }}
{{- end }}
{{- end }}
{{- if or $root.Values.models.prepare.enabled $downloads }}
initContainers:
{{- if $root.Values.models.prepare.enabled }}
  - name: prepare-models
    image: {{ include "ssd.image" . }}
    imagePullPolicy: {{ include "ssd.pullPolicy" . }}
    args:
      - models
      - prepare
      - --models-dir={{ $root.Values.models.mountPath }}
    env:
      {{- include "ssd.env" . | trim | nindent 6 }}
    securityContext:
      {{- toYaml $root.Values.securityContext | nindent 6 }}
    resources:
      {{- toYaml $root.Values.models.prepare.resources | nindent 6 }}
    volumeMounts:
      {{- include "ssd.volumeMounts" $root | trim | nindent 6 }}
{{- end }}
{{- $dlCtx := dict "root" $root "values" $dl }}
{{- $secret := include "ssd.hfTokenSecret" $root }}
{{- range $downloads }}
  - name: download-models-{{ .index }}
    image: {{ include "ssd.image" $dlCtx }}
    imagePullPolicy: {{ include "ssd.pullPolicy" $dlCtx }}
    args:
      - models
      - download
      - {{ .repo.repo | quote }}
      - {{ printf "--models-dir=%s" $root.Values.models.mountPath | quote }}
      - {{ printf "--name=%s" (include "ssd.downloadFolder" .repo) | quote }}
      {{- with .repo.revision }}
      - {{ printf "--revision=%s" . | quote }}
      {{- end }}
    env:
      {{- include "ssd.env" (dict "root" $root "values" dict) | trim | nindent 6 }}
      # The image and the ssd CLI are offline (HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1): only this container
      # reaches the Hub.
      - name: HF_HUB_OFFLINE
        value: "0"
      - name: TRANSFORMERS_OFFLINE
        value: "0"
      {{- with $secret }}
      - name: HF_TOKEN
        valueFrom:
          secretKeyRef:
            name: {{ . }}
            key: {{ $dl.tokenSecret.key }}
      {{- end }}
      {{- with $dl.extraEnv }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    securityContext:
      {{- toYaml $root.Values.securityContext | nindent 6 }}
    resources:
      {{- toYaml $dl.resources | nindent 6 }}
    volumeMounts:
      {{- include "ssd.volumeMounts" $root | trim | nindent 6 }}
{{- end }}
{{- end }}
{{- end }}

{{/* A PodDisruptionBudget for a component; call with (dict "root" $ "values" .Values.x "component" "x"). */}}
{{- define "ssd.pdb" -}}
{{- if .values.podDisruptionBudget.enabled }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "ssd.componentName" . }}
  labels:
    {{- include "ssd.labels" . | nindent 4 }}
spec:
  maxUnavailable: {{ .values.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "ssd.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end }}

{{/* The headless Service of a worker pool: its EndpointSlices list the ready pods the router connects to. */}}
{{- define "ssd.workerService" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "ssd.componentName" . }}
  labels:
    {{- include "ssd.labels" . | nindent 4 }}
spec:
  clusterIP: None
  publishNotReadyAddresses: false
  selector:
    {{- include "ssd.selectorLabels" . | nindent 4 }}
  ports:
    - name: data
      port: {{ .values.ports.data }}
      targetPort: data
      protocol: TCP
    - name: control
      port: {{ .values.ports.control }}
      targetPort: control
      protocol: TCP
      appProtocol: kubernetes.io/h2c
{{- end }}

{{/* Ingress to a component only from the router pods, on the given ports (a list). */}}
{{- define "ssd.fromRouterPolicy" -}}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "ssd.componentName" . }}
  labels:
    {{- include "ssd.labels" . | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "ssd.selectorLabels" . | nindent 6 }}
  policyTypes:
    - Ingress
  ingress:
    - from:
        - podSelector:
            matchLabels:
              {{- include "ssd.selectorLabels" (dict "root" .root "component" "router") | nindent 14 }}
        {{- range .alsoFrom }}
        - podSelector:
            matchLabels:
              {{- include "ssd.selectorLabels" (dict "root" $.root "component" .) | nindent 14 }}
        {{- end }}
      ports:
        {{- range .ports }}
        - port: {{ . }}
          protocol: TCP
        {{- end }}
    {{- with .metricsPort }}
    # Prometheus scrapes /metrics (from networkPolicy.clients when set, else from anywhere).
    - ports:
        - port: {{ . }}
          protocol: TCP
      {{- with $.root.Values.networkPolicy.clients }}
      from:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    {{- end }}
{{- end }}

{{/* Container spec of a worker (target or draft); call with (dict "root" $ "values" .Values.x "component" "x"
     "roleArgs" (list ...) "gpus" N). */}}
{{- define "ssd.workerContainer" -}}
{{- $root := .root }}
{{- $v := .values }}
- name: {{ .component }}
  image: {{ include "ssd.image" . }}
  imagePullPolicy: {{ include "ssd.pullPolicy" . }}
  args:
    - {{ .component }}
    - --data-address=tcp://0.0.0.0:{{ $v.ports.data }}
    - --control-address=0.0.0.0:{{ $v.ports.control }}
    - --models-dir={{ $root.Values.models.mountPath }}
    {{- with $v.model }}
    - --model={{ include "ssd.modelPath" (dict "root" $root "model" .) }}
    {{- end }}
    - --max-seqs={{ $v.maxSeqs }}
    - --max-len={{ $v.maxLen }}
    {{- if $v.threads }}
    - --threads={{ $v.threads }}
    {{- end }}
    {{- range .roleArgs }}
    - {{ . }}
    {{- end }}
    {{- if eq $root.Values.router.discovery "redis" }}
    - --redis-url={{ include "ssd.redisUrl" $root }}
    - --advertise-address=tcp://$(POD_IP):{{ $v.ports.data }}
    {{- end }}
    - --log-level={{ $v.logLevel }}
    {{- if $v.ports.metrics }}
    - --metrics-address=0.0.0.0:{{ $v.ports.metrics }}
    {{- end }}
    {{- if $root.Values.dataPlane.curve.enabled }}
    - --curve-secret-key-file=/etc/ssd/curve/worker.key_secret
    - --curve-authorized-keys=/etc/ssd/curve/router.key
    {{- end }}
    {{- with $v.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  env:
    {{- include "ssd.env" . | trim | nindent 4 }}
  ports:
    - name: data
      containerPort: {{ $v.ports.data }}
      protocol: TCP
    - name: control
      containerPort: {{ $v.ports.control }}
      protocol: TCP
    {{- if $v.ports.metrics }}
    - name: metrics
      containerPort: {{ $v.ports.metrics }}
      protocol: TCP
    {{- end }}
  {{- include "ssd.grpcProbes" (dict "port" $v.ports.control "probes" $v.probes) | trim | nindent 2 }}
  {{- with include "ssd.lifecycle" $v }}
  {{- . | trim | nindent 2 }}
  {{- end }}
  securityContext:
    {{- toYaml $root.Values.securityContext | nindent 4 }}
  {{- $resources := deepCopy ($v.resources | default dict) }}
  {{- if $v.gpu.enabled }}
  {{- $gpus := dict $v.gpu.resourceName (int .gpus) }}
  {{- $_ := set $resources "limits" (merge (deepCopy ($resources.limits | default dict)) $gpus) }}
  {{- $_ := set $resources "requests" (merge (deepCopy ($resources.requests | default dict)) $gpus) }}
  {{- end }}
  resources:
    {{- toYaml $resources | nindent 4 }}
  volumeMounts:
    {{- include "ssd.volumeMounts" $root | trim | nindent 4 }}
{{- end }}

{{/* Pod spec of a worker: security, scheduling, the init containers, the container and volumes. */}}
{{- define "ssd.workerPodSpec" -}}
serviceAccountName: {{ include "ssd.serviceAccountName" .root }}
automountServiceAccountToken: false
terminationGracePeriodSeconds: {{ .values.terminationGracePeriodSeconds }}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with include "ssd.podSpecCommon" . }}
{{ . | trim }}
{{- end }}
{{- with include "ssd.initContainers" . }}
{{ . | trim }}
{{- end }}
containers:
  {{- include "ssd.workerContainer" . | trim | nindent 2 }}
volumes:
  {{- include "ssd.volumes" .root | trim | nindent 2 }}
{{- end }}

{{/* A prometheus-operator PodMonitor for a worker component's /metrics (the `metrics` container port, set by
     <component>.ports.metrics); call with (dict "root" $ "component" "target"). */}}
{{- define "ssd.podMonitor" -}}
{{- $pm := .root.Values.monitoring.podMonitor }}
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata:
  name: {{ include "ssd.componentName" . }}
  labels:
    {{- include "ssd.labels" . | nindent 4 }}
    {{- with $pm.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- include "ssd.selectorLabels" . | nindent 6 }}
  namespaceSelector:
    matchNames:
      - {{ .root.Release.Namespace }}
  # The release and component as labels of every series (the dashboard selects by app_kubernetes_io_instance).
  podTargetLabels:
    - app.kubernetes.io/instance
    - app.kubernetes.io/component
  podMetricsEndpoints:
    - port: metrics
      path: /metrics
      interval: {{ $pm.interval }}
{{- end }}
