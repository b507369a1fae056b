{{/*
_pod.tpl: pod and container spec pieces shared by the components: pod-level settings and metadata, gRPC health
probes, the preStop lifecycle, the volumes / volumeMounts / env every ssd container gets, and the worker (target,
draft) container and pod spec. The init containers are in _models.tpl.
*/}}

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
