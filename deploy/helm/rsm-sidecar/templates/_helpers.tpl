{{/* Names and labels ------------------------------------------------------------------------ */}}
{{- define "rsm-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rsm-sidecar.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "rsm-sidecar.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "rsm-sidecar.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "rsm-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rsm-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rsm-sidecar.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "rsm-sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: tiered-storage-sidecar
{{- end -}}

{{- define "rsm-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rsm-sidecar.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rsm-sidecar.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Service's DNS name: what the shim's rsm.config.sidecar.target names */}}
{{- define "rsm-sidecar.serviceHost" -}}
{{- printf "%s.%s.svc" (include "rsm-sidecar.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- define "rsm-sidecar.tlsSecretName" -}}
{{- if .Values.tls.certManager.enabled -}}
{{- printf "%s-tls" (include "rsm-sidecar.fullname" .) -}}
{{- else -}}
{{- required "tls.existingSecret: name a Secret with tls.crt, tls.key and ca.crt, or enable tls.certManager" .Values.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* Paths inside the container ------------------------------------------------------------- */}}
{{- define "rsm-sidecar.paths" -}}
config: /etc/rsm-sidecar
tls: /etc/rsm-sidecar/tls
keys: /etc/rsm-sidecar/keys
journal: /var/lib/rsm-sidecar/journal
diskCache: /var/cache/rsm-sidecar/chunks
{{- end -}}

{{/* The sidecar's configuration: `config` plus what the chart sets (YAML; fromYaml to use) -------- */}}
{{- define "rsm-sidecar.config" -}}
{{- $paths := include "rsm-sidecar.paths" . | fromYaml -}}
{{- $cfg := deepCopy (.Values.config | default dict) -}}
{{- $server := dict "listen" (printf "0.0.0.0:%d" (int .Values.service.port)) -}}
{{- if .Values.tls.disabled -}}
{{- $_ := set $server "allow_plaintext_non_loopback" true -}}
{{- else -}}
{{- $_ := set $server "tls" (dict "cert_file" (printf "%s/tls.crt" $paths.tls) "key_file" (printf "%s/tls.key" $paths.tls) "client_ca_file" (printf "%s/ca.crt" $paths.tls)) -}}
{{- end -}}
{{- $managed := dict "server" $server "metrics" (dict "listen" (printf "0.0.0.0:%d" (int .Values.metrics.port))) "copy" (dict "journal_dir" $paths.journal) -}}
{{- if .Values.encryption.enabled -}}
{{- $keys := dict -}}
{{- range .Values.encryption.keyIds -}}
{{- $_ := set $keys . (dict "public_key_file" (printf "%s/%s.public.pem" $paths.keys .) "private_key_file" (printf "%s/%s.private.pem" $paths.keys .)) -}}
{{- end -}}
{{- if not (has .Values.encryption.activeKeyId .Values.encryption.keyIds) -}}
{{- fail (printf "encryption.activeKeyId %q is not one of encryption.keyIds %v" .Values.encryption.activeKeyId .Values.encryption.keyIds) -}}
{{- end -}}
{{- $_ := set $managed "encryption" (dict "enabled" true "active_key_id" .Values.encryption.activeKeyId "keys" $keys) -}}
{{- else -}}
{{- $_ := set $managed "encryption" (dict "enabled" false) -}}
{{- end -}}
{{- if .Values.diskCache.enabled -}}
{{/* 90 % of the volume: the cache's files stay within `bytes`; its directories and the chunks
     being written (one per loader, in .tmp) need the rest, and an emptyDir over its sizeLimit
     gets the pod evicted */}}
{{- $bytes := div (mul (include "rsm-sidecar.quantityBytes" .Values.diskCache.size | int64) 9) 10 -}}
{{- $_ := set $managed "fetch" (dict "disk_cache" (dict "path" $paths.diskCache "bytes" $bytes)) -}}
{{- end -}}
{{- toYaml (mergeOverwrite $cfg $managed) -}}
{{- end -}}

{{/* TOML ------------------------------------------------------------------------------------- */}}
{{/* One table: its scalar keys, then its sub-tables as [path.key] (keys sorted, nulls dropped) */}}
{{- define "rsm-sidecar.tomlTable" -}}
{{- $path := .path -}}
{{- $scalars := list -}}
{{- range $k, $v := .table -}}
{{- if and (not (kindIs "map" $v)) (not (kindIs "invalid" $v)) -}}
{{- $scalars = append $scalars (printf "%s = %s" $k (toJson $v)) -}}
{{- end -}}
{{- end -}}
{{- if $scalars -}}
{{- if $path }}
[{{ $path }}]
{{- end }}
{{- range $scalars }}
{{ . }}
{{- end }}
{{ end -}}
{{- range $k, $v := .table -}}
{{- if kindIs "map" $v -}}
{{- include "rsm-sidecar.tomlTable" (dict "path" (ternary $k (printf "%s.%s" $path $k) (eq $path "")) "table" $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Sizes ------------------------------------------------------------------------------------ */}}
{{/* A size as the sidecar reads it (an integer, or digits + B, k/kB, KiB, m/MB, MiB, g/GB, GiB) -> bytes */}}
{{- define "rsm-sidecar.bytes" -}}
{{- $s := toString . | trim -}}
{{- $m := regexFind "^[0-9]+" $s -}}
{{- if not $m -}}{{- fail (printf "not a size: %q (use e.g. 4194304 or \"4MiB\")" $s) -}}{{- end -}}
{{- $unit := lower (trim (trimPrefix $m $s)) -}}
{{- $units := dict "" 1 "b" 1 "k" 1000 "kb" 1000 "kib" 1024 "m" 1000000 "mb" 1000000 "mib" 1048576 "g" 1000000000 "gb" 1000000000 "gib" 1073741824 -}}
{{- if not (hasKey $units $unit) -}}{{- fail (printf "not a size: %q (units: B, kB, KiB, MB, MiB, GB, GiB)" $s) -}}{{- end -}}
{{- mul (int64 $m) (get $units $unit) -}}
{{- end -}}

{{/* A Kubernetes quantity with a binary or decimal suffix (Ki, Mi, Gi, Ti, k, M, G, T) -> bytes */}}
{{- define "rsm-sidecar.quantityBytes" -}}
{{- $s := toString . | trim -}}
{{- $m := regexFind "^[0-9]+" $s -}}
{{- $unit := trimPrefix $m $s -}}
{{- $units := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- if or (not $m) (not (hasKey $units $unit)) -}}{{- fail (printf "diskCache.size: not a quantity: %q (e.g. 10Gi)" $s) -}}{{- end -}}
{{- mul (int64 $m) (get $units $unit) -}}
{{- end -}}

{{/*
The memory bound of docs/operations.md §4, in MiB (rounded up), from the rendered configuration
and the sidecar's defaults (tests/deploy/test_helm_chart.py checks these defaults against the
code's and the result against the formula):

  caches    cache.manifest_bytes + cache.index_bytes + cache.chunk_bytes
  copies    copy.max_concurrent x ((copy.parallelism + 2) x C + upload buffer
            + server.stream_window_bytes)
  fetches   fetch.max_concurrent x (R + C + 2 MiB)
  prefetch  4 x (R + C), when cache.prefetch_bytes and cache.chunk_bytes are not 0
  zstd      min(64, copy.max_concurrent x copy.parallelism) x 3.5 MiB
  base      85 MiB
  C = segment.chunk_size, R = max(fetch.max_range_bytes, C); upload buffer (docs/storage.md):
  S3 part_size x (max_parts_in_flight + 1) + 1 MiB x max_parts_in_flight, GCS 2 x chunk_size,
  Azure block_size x (max_blocks_in_flight + 1), local 0
*/}}
{{- define "rsm-sidecar.defaults" -}}
cache: {manifest_bytes: 32MiB, index_bytes: 64MiB, chunk_bytes: 256MiB, prefetch_bytes: 16MiB}
copy: {max_concurrent: 16, parallelism: 2}
server: {stream_window_bytes: 4MiB}
segment: {chunk_size: 4MiB}
fetch: {max_concurrent: 32, max_range_bytes: 8MiB}
storage:
  backend: local
  s3: {part_size: 8MiB, max_parts_in_flight: 2}
  gcs: {chunk_size: 8MiB}
  azure: {block_size: 8MiB, max_blocks_in_flight: 2}
{{- end -}}

{{- define "rsm-sidecar.memoryBoundMiB" -}}
{{- $c := mergeOverwrite (include "rsm-sidecar.defaults" . | fromYaml) (include "rsm-sidecar.config" . | fromYaml) -}}
{{- $mib := 1048576 -}}
{{- $chunk := include "rsm-sidecar.bytes" $c.segment.chunk_size | int64 -}}
{{- $range := max (include "rsm-sidecar.bytes" $c.fetch.max_range_bytes | int64) $chunk -}}
{{- $cacheChunk := include "rsm-sidecar.bytes" $c.cache.chunk_bytes | int64 -}}
{{- $caches := add (include "rsm-sidecar.bytes" $c.cache.manifest_bytes | int64) (include "rsm-sidecar.bytes" $c.cache.index_bytes | int64) $cacheChunk -}}
{{- $upload := 0 -}}
{{- $b := $c.storage.backend -}}
{{- if eq $b "s3" -}}
{{- $upload = add (mul (include "rsm-sidecar.bytes" $c.storage.s3.part_size | int64) (add (int64 $c.storage.s3.max_parts_in_flight) 1)) (mul $mib (int64 $c.storage.s3.max_parts_in_flight)) -}}
{{- else if eq $b "gcs" -}}
{{- $upload = mul 2 (include "rsm-sidecar.bytes" $c.storage.gcs.chunk_size | int64) -}}
{{- else if eq $b "azure" -}}
{{- $upload = mul (include "rsm-sidecar.bytes" $c.storage.azure.block_size | int64) (add (int64 $c.storage.azure.max_blocks_in_flight) 1) -}}
{{- end -}}
{{- $window := include "rsm-sidecar.bytes" $c.server.stream_window_bytes | int64 -}}
{{- $copies := mul (int64 $c.copy.max_concurrent) (add (mul (add (int64 $c.copy.parallelism) 2) $chunk) $upload $window) -}}
{{- $zstd := div (mul (min 64 (mul (int64 $c.copy.max_concurrent) (int64 $c.copy.parallelism))) 7 $mib) 2 -}}
{{- $fetches := mul (int64 $c.fetch.max_concurrent) (add $range $chunk (mul 2 $mib)) -}}
{{- $prefetch := 0 -}}
{{- if and (ne (include "rsm-sidecar.bytes" $c.cache.prefetch_bytes) "0") (ne $cacheChunk 0) -}}
{{- $prefetch = mul 4 (add $range $chunk) -}}
{{- end -}}
{{- $total := add $caches $copies $fetches $prefetch $zstd (mul 85 $mib) -}}
{{- div (add $total (sub $mib 1)) $mib -}}
{{- end -}}

{{- define "rsm-sidecar.memoryLimit" -}}
{{- $bound := include "rsm-sidecar.memoryBoundMiB" . | int64 -}}
{{- $withHeadroom := div (add (mul $bound (add 100 (int64 .Values.resources.memoryHeadroomPercent))) 99) 100 -}}
{{- printf "%dMi" $withHeadroom -}}
{{- end -}}

{{/* The probe command: rsm-healthcheck over mTLS with the sidecar's own certificate */}}
{{- define "rsm-sidecar.probe" -}}
{{- $paths := include "rsm-sidecar.paths" .root | fromYaml -}}
{{- if .root.Values.tls.disabled -}}
grpc:
  port: {{ .root.Values.service.port }}
  service: rsm.v1.RemoteStorage
{{- else -}}
exec:
  command:
    - rsm-healthcheck
    - {{ printf "127.0.0.1:%d" (int .root.Values.service.port) | quote }}
    - --timeout
    - {{ sub .root.Values.probes.timeoutSeconds 1 | max 1 | quote }}
    - --ca
    - {{ $paths.tls }}/ca.crt
    - --cert
    - {{ $paths.tls }}/tls.crt
    - --key
    - {{ $paths.tls }}/tls.key
    - --authority
    - {{ include "rsm-sidecar.serviceHost" .root }}
{{- end }}
timeoutSeconds: {{ .root.Values.probes.timeoutSeconds }}
periodSeconds: {{ .probe.periodSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
{{- end -}}
