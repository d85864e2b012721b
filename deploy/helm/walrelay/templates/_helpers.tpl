{{/* The chart's name, and the release's name for its objects. */}}
{{- define "walrelay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "walrelay.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "walrelay.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "walrelay.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The labels that select every pod of the release (every shard). */}}
{{- define "walrelay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "walrelay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "walrelay.labels" -}}
{{ include "walrelay.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/*
The relays, one per slot: a YAML list of {name, slot, publication, shard}.
Unsharded, one relay on config's slot and publication (shard -1, and the
chart leaves both keys to the configuration); sharded, sharding.count
relays, shard k on <slot>_shard_<k>_of_<n> and <publication>_shard_<k>_of_<n>
(the count in both: another count names new slots, never an old slot on a
new publication).
*/}}
{{- define "walrelay.relays" -}}
{{- $pg := (.Values.config | default dict).postgres | default dict }}
{{- $slot := $pg.slot | default "walrelay" }}
{{- $pub := $pg.publication | default "walrelay_outbox" }}
{{- if .Values.sharding.enabled }}
{{- $n := int .Values.sharding.count }}
{{- if lt $n 2 }}
{{- fail "sharding.count must be at least 2 with sharding.enabled" }}
{{- end }}
{{- if ((.Values.config | default dict).kafka | default dict).transactional_id }}
{{- fail "config.kafka.transactional_id with sharding.enabled: every shard would share it, and walrelay refuses two slots on one id; leave it empty (each shard derives its own from its slot)" }}
{{- end }}
{{- range $e := .Values.env }}
{{- if has $e.name (list "WALRELAY_KAFKA_TRANSACTIONAL_ID" "WALRELAY_POSTGRES_SLOT" "WALRELAY_POSTGRES_PUBLICATION") }}
{{- fail (printf "env %s with sharding.enabled: every shard would share it (the environment wins over each shard's file), and walrelay refuses two slots on one id or one slot twice; remove it (each shard gets its own)" $e.name) }}
{{- end }}
{{- end }}
{{- range $k := until $n }}
{{- $names := dict "slot" (printf "%s_shard_%d_of_%d" $slot $k $n) "publication" (printf "%s_shard_%d_of_%d" $pub $k $n) }}
{{- range $what, $name := $names }}
{{- /* PostgreSQL's names: 63 bytes at most (a longer one is cut); a slot's of [a-z0-9_], and the notes write the publication's unquoted. */}}
{{- if gt (len $name) 63 }}
{{- fail (printf "shard %d's %s %s is over 63 bytes (PostgreSQL would cut it): shorten config.postgres.%s" $k $what $name $what) }}
{{- end }}
{{- if not (regexMatch "^[a-z0-9_]+$" $name) }}
{{- fail (printf "shard %d's %s %q is not lower-case letters, digits and underscores: change config.postgres.%s" $k $what $name $what) }}
{{- end }}
{{- end }}
- name: {{ printf "%s-shard-%d" (include "walrelay.fullname" $) $k }}
  slot: {{ $names.slot }}
  publication: {{ $names.publication }}
  shard: {{ $k }}
{{- end }}
{{- else }}
- name: {{ include "walrelay.fullname" . }}
  slot: {{ $slot }}
  publication: {{ $pub }}
  shard: -1
{{- end }}
{{- end }}

{{/* The labels that select one relay's pods. */}}
{{- define "walrelay.relaySelectorLabels" -}}
{{ include "walrelay.selectorLabels" .root }}
{{- if ge (int .relay.shard) 0 }}
walrelay.io/shard: {{ .relay.shard | quote }}
{{- end }}
{{- end }}

{{- define "walrelay.secretDir" -}}/run/secrets/walrelay{{- end }}

{{/*
One relay's walrelay.yaml: config, with what the chart owns set on top
(the admin listener, the secrets' files, a shard's slot and publication).
*/}}
{{- define "walrelay.config" -}}
{{- $v := .root.Values }}
{{- $cfg := deepCopy ($v.config | default dict) }}
{{- $own := dict "admin" (dict "listen" (include "walrelay.adminListen" .root)) }}
{{- $dir := include "walrelay.secretDir" . }}
{{- $pg := dict }}
{{- $kafka := dict }}
{{- with $v.existingSecret }}
{{- if and .name .postgresPasswordKey }}
{{- $_ := set $pg "password_file" (printf "%s/%s" $dir .postgresPasswordKey) }}
{{- end }}
{{- if and .name .kafkaSaslPasswordKey }}
{{- $_ := set $kafka "sasl" (dict "password_file" (printf "%s/%s" $dir .kafkaSaslPasswordKey)) }}
{{- end }}
{{- if and .name .schemaRegistryPasswordKey }}
{{- $_ := set $kafka "schema_registry" (dict "password_file" (printf "%s/%s" $dir .schemaRegistryPasswordKey)) }}
{{- end }}
{{- end }}
{{- if ge (int .relay.shard) 0 }}
{{- $_ := set $pg "slot" .relay.slot }}
{{- $_ := set $pg "publication" .relay.publication }}
{{- $_ := set $pg "allow_row_filter" true }}
{{- end }}
{{- if $pg }}{{- $_ := set $own "postgres" $pg }}{{- end }}
{{- if $kafka }}{{- $_ := set $own "kafka" $kafka }}{{- end }}
{{- toYaml (mustMergeOverwrite $cfg $own) }}
{{- end }}

{{/* The admin listener: every interface, on adminPort. */}}
{{- define "walrelay.adminListen" -}}
{{- printf "0.0.0.0:%d" (int .Values.adminPort) }}
{{- end }}

{{/*
Values that would install a relay walrelay refuses, or one that is not
what the values say: each fails the render, naming the value.
*/}}
{{- define "walrelay.checks" -}}
{{- $secret := .Values.existingSecret | default dict }}
{{- $kafka := (.Values.config | default dict).kafka | default dict }}
{{- $envNames := list }}
{{- range $e := .Values.env }}
{{- $envNames = append $envNames $e.name }}
{{- end }}
{{- if not $secret.name }}
{{- range $k := list "postgresPasswordKey" "kafkaSaslPasswordKey" "schemaRegistryPasswordKey" }}
{{- if index $secret $k }}
{{- fail (printf "existingSecret.%s is set and existingSecret.name is empty: the key would not be mounted and walrelay would start without that password; name the Secret, or set the key to \"\"" $k) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* Passwords come from existingSecret: a ConfigMap, and a Deployment's env, are no Secret. */}}
{{- if ($kafka.sasl | default dict).password }}
{{- fail "config.kafka.sasl.password in plain text: the ConfigMap is no Secret; put it in existingSecret (existingSecret.kafkaSaslPasswordKey)" }}
{{- end }}
{{- if ($kafka.schema_registry | default dict).password }}
{{- fail "config.kafka.schema_registry.password in plain text: the ConfigMap is no Secret; put it in existingSecret (existingSecret.schemaRegistryPasswordKey)" }}
{{- end }}
{{- $dsn := toString (((.Values.config | default dict).postgres | default dict).dsn | default "") }}
{{- if regexMatch `^postgres(ql)?://[^/@]*:[^/@]*@|[?&]password=|(^|\s)password\s*=` $dsn }}
{{- fail "config.postgres.dsn holds a password: the ConfigMap is no Secret; put it in existingSecret (existingSecret.postgresPasswordKey), or the whole DSN in a Secret of yours (env WALRELAY_POSTGRES_DSN with valueFrom.secretKeyRef)" }}
{{- end }}
{{- range $e := .Values.env }}
{{- if and (hasKey $e "value") (or (hasSuffix "_PASSWORD" $e.name) (hasSuffix "_DSN" $e.name)) }}
{{- fail (printf "env %s holds its value in plain text: give it from a Secret (valueFrom.secretKeyRef), or use existingSecret" $e.name) }}
{{- end }}
{{- end }}
{{- with ($kafka.sasl | default dict).mechanism }}
{{- if not (or (and $secret.name $secret.kafkaSaslPasswordKey) (has "WALRELAY_KAFKA_SASL_PASSWORD" $envNames) (has "WALRELAY_KAFKA_SASL_PASSWORD_FILE" $envNames)) }}
{{- fail (printf "config.kafka.sasl.mechanism %s without a password: walrelay exits at start; set existingSecret.name and existingSecret.kafkaSaslPasswordKey (or env WALRELAY_KAFKA_SASL_PASSWORD from a Secret), or set config.kafka.sasl to null" .) }}
{{- end }}
{{- end }}
{{- range $e := .Values.env }}
{{- if eq $e.name "WALRELAY_ADMIN_LISTEN" }}
{{- fail "env WALRELAY_ADMIN_LISTEN: the chart sets it from adminPort (the probes, the Service, the NetworkPolicy and the monitors use that port); set adminPort instead" }}
{{- end }}
{{- end }}
{{- end }}
