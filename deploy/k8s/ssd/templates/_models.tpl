{{/*
_models.tpl: model folders (ssd.modelPath, ssd.downloadFolder), the Hub token Secret of models.download
(ssd.hfTokenSecret) and the init containers running `ssd models prepare` / `ssd models download`.
*/}}

{{/* A model folder: absolute paths as given, others relative to models.mountPath. */}}
{{- define "ssd.modelPath" -}}
{{- if hasPrefix "/" .model }}{{ .model }}{{ else }}{{ printf "%s/%s" (trimSuffix "/" .root.Values.models.mountPath) .model }}{{ end }}
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
