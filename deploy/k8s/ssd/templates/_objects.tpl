{{/*
_objects.tpl: whole Kubernetes objects that several component templates stamp out: a PodDisruptionBudget, the
headless Service of a worker pool, a NetworkPolicy admitting only the router, and a worker's PodMonitor.
*/}}

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
