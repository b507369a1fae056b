{{/*
_validate.tpl: ssd.validate, the install-time checks across values (Redis, router mode and discovery, API keys,
draft autoscaling, the models volume, models.download, monitoring.podMonitor).
*/}}

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
