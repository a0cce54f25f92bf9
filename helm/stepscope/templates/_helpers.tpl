{{- define "stepscope.fullname" -}}
{{- default "stepscope" .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "stepscope.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "stepscope.labels" -}}
app.kubernetes.io/name: stepscope
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "stepscope.selectorLabels" -}}
app.kubernetes.io/name: stepscope
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- /* The analysis Jobs' ServiceAccount in each namespace of operator.namespaces (rbac.yaml). */ -}}
{{- define "stepscope.analysisAccount" -}}
{{- include "stepscope.fullname" . }}-analysis
{{- end -}}

{{- define "stepscope.operatorUser" -}}
{{- printf "system:serviceaccount:%s:%s-operator" .Release.Namespace (include "stepscope.fullname" .) -}}
{{- end -}}
