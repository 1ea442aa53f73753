{{/* The chart's name, or nameOverride. */}}
{{- define "joist.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Every object's name: fullnameOverride, else the release name when it holds the chart's name
or Karpenter's (a release named karpenter keeps the ServiceAccount karpenter, which the IAM role
Karpenter's users have trusts), else <release>-<chart>. */}}
{{- define "joist.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if or (contains $name .Release.Name) (contains "karpenter" .Release.Name) }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels that select the controller's pods. */}}
{{- define "joist.selectorLabels" -}}
app.kubernetes.io/name: {{ include "joist.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "joist.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "joist.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.additionalLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The service account's name. */}}
{{- define "joist.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "joist.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image: repository:tag (the appVersion by default), @digest when given. */}}
{{- define "joist.image" -}}
{{- $image := .Values.controller.image }}
{{- $reference := printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- if $image.digest }}{{ printf "%s@%s" $reference $image.digest }}{{ else }}{{ $reference }}{{ end }}
{{- end }}

{{/* The Lease the replicas elect a leader with. */}}
{{- define "joist.leaseName" -}}joist-leader-election{{- end }}

{{/* Karpenter's FEATURE_GATES form, of the gates Joist accepts. */}}
{{- define "joist.featureGates" -}}
{{- $gates := .Values.settings.featureGates -}}
NodeRepair={{ $gates.nodeRepair }},ReservedCapacity={{ $gates.reservedCapacity }},SpotToSpotConsolidation={{ $gates.spotToSpotConsolidation }},StaticCapacity={{ $gates.staticCapacity }},NodeOverlay={{ $gates.nodeOverlay }},CapacityBuffer={{ $gates.capacityBuffer }}
{{- end }}

{{/* Adds the selector labels to pod-affinity terms and spread constraints that select nothing (as Karpenter's chart does). */}}
{{- define "joist.withSelector" -}}
{{- $selector := include "joist.selectorLabels" .context | fromYaml }}
{{- $terms := list }}
{{- range .terms }}
{{- if not .labelSelector }}
{{- $terms = append $terms (merge (dict "labelSelector" (dict "matchLabels" $selector)) .) }}
{{- else }}
{{- $terms = append $terms . }}
{{- end }}
{{- end }}
{{- toYaml $terms }}
{{- end }}

{{/* Refuses values a Karpenter chart accepts and Joist cannot honour, naming the value. */}}
{{- define "joist.validate" -}}
{{- $s := .Values.settings }}
{{- if not $s.clusterName }}
{{- fail "settings.clusterName is required: the name of the EKS cluster Joist manages nodes for" }}
{{- end }}
{{- if ne (toString $s.preferencePolicy) "Respect" }}
{{- fail (printf "settings.preferencePolicy=%v is not supported: Joist always respects preferences (Respect)" $s.preferencePolicy) }}
{{- end }}
{{- if ne (toString $s.minValuesPolicy) "Strict" }}
{{- fail (printf "settings.minValuesPolicy=%v is not supported: Joist enforces minValues strictly (Strict)" $s.minValuesPolicy) }}
{{- end }}
{{- range $key := list "eksControlPlane" "enableZonalShift" }}
{{- if index $s $key }}
{{- fail (printf "settings.%s=true is not supported by Joist" $key) }}
{{- end }}
{{- end }}
{{- if not $s.ignoreDRARequests }}
{{- fail "settings.ignoreDRARequests=false is not supported: Joist does not model dynamic resource allocation" }}
{{- end }}
{{- range $key := list "amiRefreshInterval" "subnetRefreshInterval" }}
{{- if ne (toString (index $s $key)) "1m" }}
{{- fail (printf "settings.%s=%v is not supported: Joist resolves EC2NodeClasses every minute (1m)" $key (index $s $key)) }}
{{- end }}
{{- end }}
{{- if $s.awsFeatureGates.nodeClassCEL }}
{{- fail "settings.awsFeatureGates.nodeClassCEL=true is not supported by Joist" }}
{{- end }}
{{- range $key := list "logOutputPaths" "logErrorOutputPaths" }}
{{- range (index $.Values $key) }}
{{- if not (has . (list "stdout" "stderr")) }}
{{- fail (printf "%s: %q is not supported: Joist logs to the container's output (stdout or stderr)" $key .) }}
{{- end }}
{{- end }}
{{- end }}
{{- if not (has (toString .Values.logLevel) (list "debug" "info" "error")) }}
{{- fail (printf "logLevel=%v is not supported: debug, info or error" .Values.logLevel) }}
{{- end }}
{{- end }}
