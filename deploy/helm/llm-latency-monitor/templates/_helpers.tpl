{{/*
Labels every object of the chart has in metadata.labels: the kit's own (app.kubernetes.io/part-of,
from its settings file) and Helm's standard ones. Not in selectors or pod templates: those are the
kit's, so the objects are the kit's objects (tests/deploy/test_helm.py).
*/}}
{{- define "llm-latency.labels" -}}
app.kubernetes.io/part-of: llm-latency-monitor
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/*
What kube-prometheus-stack selects (the ServiceMonitor, the PrometheusRules, the dashboards): the
kit's marker and the label `release: <kubePrometheusStackRelease>`.
*/}}
{{- define "llm-latency.release" -}}
llm-latency/kube-prometheus-stack: "true"
{{- with .Values.kubePrometheusStackRelease }}
release: {{ . | quote }}
{{- end }}
{{- end }}

{{/* The image built by deploy/Dockerfile. */}}
{{- define "llm-latency.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The mode's targets YAML: the kit's, copied into files/<mode>/ by deploy/generate_kubernetes.py. */}}
{{- define "llm-latency.targets" -}}
{{ printf "files/%s/targets.yaml" .Values.mode }}
{{- end }}
