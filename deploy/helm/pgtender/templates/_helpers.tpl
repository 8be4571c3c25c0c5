{{/* Names and labels, as `helm create` makes them. */}}
{{- define "pgtender.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pgtender.fullname" -}}
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

{{- define "pgtender.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pgtender.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pgtender.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "pgtender.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "pgtender.usersSecretName" -}}
{{- if .Values.users.existingSecret }}{{ .Values.users.existingSecret }}{{ else }}{{ include "pgtender.fullname" . }}-users{{ end }}
{{- end }}

{{/*
pgtender.tomlValue renders one TOML value. JSON strings, numbers, booleans and arrays of them
are valid TOML; toJson also prints a large integer such as 86400000 without an exponent
(a plain print of a YAML number would give 8.64e+07, which pgtender's strict integers refuse).
*/}}
{{- define "pgtender.tomlValue" -}}
{{- if kindIs "map" . }}{{ fail "pgtender: a map is not a TOML value here; write its keys one by one" }}{{ end }}
{{- toJson . }}
{{- end }}

{{/* pgtender.tomlTable renders the keys of a map, sorted, one `key = value` a line. */}}
{{- define "pgtender.tomlTable" -}}
{{- range $key := keys . | sortAlpha }}
{{ $key }} = {{ include "pgtender.tomlValue" (get $ $key) }}
{{- end }}
{{- end }}

{{/* Keys the chart sets itself from its own values; writing them in pgtender.general is an error. */}}
{{- define "pgtender.chartOwnedKeys" -}}
port openmetrics_port openmetrics_namespace listen_backlog shutdown_timeout shutdown_readiness_delay tls_certificate tls_private_key
{{- end }}

{{/*
Keys a reload cannot change (restart:"true" in pgtender's config/config.go; the "restart"
column of docs/configuration.md). With config.rollOnChange false, a change to one of them
still rolls the pods. The test in deploy/kubernetes compares this list with config.go.
*/}}
{{- define "pgtender.restartKeys" -}}
host port workers listen_backlog passthrough_auth passthrough_reverify_interval max_logins_in_progress openmetrics_port openmetrics_host openmetrics_namespace healthcheck_port log_level log_format
{{- end }}

{{- define "pgtender.listenBacklog" -}}
{{- if not (kindIs "invalid" .Values.pgtender.listenBacklog) }}
{{- int64 .Values.pgtender.listenBacklog }}
{{- else if not (kindIs "invalid" .Values.kernel.somaxconn) }}
{{- int64 .Values.kernel.somaxconn }}
{{- else }}1024{{ end }}
{{- end }}

{{/*
pgtender.general is the whole [general] table as a map: the user's keys and the chart's.
*/}}
{{- define "pgtender.general" -}}
{{- $general := dict }}
{{- range $key, $value := .Values.pgtender.general }}
{{- if has $key (splitList " " (include "pgtender.chartOwnedKeys" $)) }}
{{- fail (printf "pgtender: general.%s is set by the chart; use its own value (README.md)" $key) }}
{{- end }}
{{- $_ := set $general $key $value }}
{{- end }}
{{- $_ := set $general "port" (int64 .Values.pgtender.port) }}
{{- $_ := set $general "openmetrics_port" (int64 .Values.pgtender.metricsPort) }}
{{- $_ := set $general "openmetrics_namespace" .Values.pgtender.metricsNamespace }}
{{- $_ := set $general "listen_backlog" (int64 (include "pgtender.listenBacklog" .)) }}
{{- $_ := set $general "shutdown_timeout" (int64 .Values.pgtender.shutdownTimeout) }}
{{- $_ := set $general "shutdown_readiness_delay" (int64 .Values.pgtender.shutdownReadinessDelay) }}
{{- if .Values.tls.existingSecret }}
{{- $_ := set $general "tls_certificate" "/etc/pgtender/tls/tls.crt" }}
{{- $_ := set $general "tls_private_key" "/etc/pgtender/tls/tls.key" }}
{{- end }}
{{- toJson $general }}
{{- end }}

{{/* pgtender.pgdogToml is the rendered pgdog.toml. */}}
{{- define "pgtender.pgdogToml" -}}
# Rendered by the pgtender Helm chart from its values; edit the values, not this file.
[general]
{{- include "pgtender.tomlTable" (include "pgtender.general" . | fromJson) }}
{{- range .Values.pgtender.databases }}

[[databases]]
{{- include "pgtender.tomlTable" . }}
{{- end }}
{{- end }}

{{/* pgtender.usersToml is the rendered users.toml ([admin] included, as PgDog allows). */}}
{{- define "pgtender.usersToml" -}}
# Rendered by the pgtender Helm chart from its values; edit the values, not this file.
{{- if .Values.users.admin.password }}
[admin]
{{- include "pgtender.tomlTable" .Values.users.admin }}
{{- end }}
{{- range .Values.users.list }}

[[users]]
{{- include "pgtender.tomlTable" . }}
{{- end }}
{{- end }}

{{/*
pgtender.restartChecksum covers only the keys a reload cannot change, so that with
rollOnChange false those still roll the pods. Values are read from the rendered [general].
*/}}
{{- define "pgtender.restartChecksum" -}}
{{- $general := include "pgtender.general" . | fromJson }}
{{- $restart := dict }}
{{- range $key := splitList " " (include "pgtender.restartKeys" .) }}
{{- if hasKey $general $key }}{{ $_ := set $restart $key (get $general $key) }}{{ end }}
{{- end }}
{{- toJson $restart | sha256sum }}
{{- end }}

{{/*
Seconds the pod needs from deletion to exit: the preStop sleep, then
shutdown_readiness_delay, then shutdown_timeout (both in milliseconds, rounded up), then a
margin. terminationGracePeriodSeconds counts from deletion and includes the preStop hook:
https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination
*/}}
{{- define "pgtender.terminationGracePeriodSeconds" -}}
{{- $drain := div (add (int64 .Values.pgtender.shutdownTimeout) 999) 1000 }}
{{- $delay := div (add (int64 .Values.pgtender.shutdownReadinessDelay) 999) 1000 }}
{{- add (int64 .Values.preStopSleepSeconds) $delay $drain (int64 .Values.terminationGraceMarginSeconds) }}
{{- end }}
