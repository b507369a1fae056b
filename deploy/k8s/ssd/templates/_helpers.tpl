{{/*
_helpers.tpl: naming and the basics every template uses: ssd.name, ssd.fullname, ssd.componentName, ssd.chart,
ssd.labels / ssd.selectorLabels, ssd.serviceAccountName, ssd.image / ssd.pullPolicy and ssd.redisUrl.
The other partials (Helm loads every templates/_*.tpl):
  _validate.tpl  ssd.validate: settings that cannot work together fail the install
  _pod.tpl       pod and container spec pieces: pod metadata and scheduling, probes, lifecycle, env, volumes,
                 the worker container and pod spec
  _models.tpl    model folders and the init containers of models.prepare / models.download, its token Secret
  _objects.tpl   whole objects stamped out per component: PodDisruptionBudget, headless worker Service,
                 from-router NetworkPolicy, PodMonitor
*/}}

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
