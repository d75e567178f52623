#!/bin/bash
# Entrypoint of the compose broker: writes server.properties from the compose settings
# (server.properties next to this script) plus config/broker-tiered.properties with its
# placeholders filled from the environment (SHIM_DIR, SIDECAR_TARGET, TRANSFER_MODE),
# formats the KRaft storage on first start and runs Kafka in the foreground.
set -euo pipefail

here=/opt/rsm-sidecar
tiered=${BROKER_TIERED_PROPERTIES:-/etc/rsm-sidecar/broker-tiered.properties}
out=/opt/kafka/config/server.properties
: "${CLUSTER_ID:?set CLUSTER_ID (a Kafka Uuid, e.g. from kafka-storage.sh random-uuid)}"

"$here/bin/render-properties.sh" "$here/server.properties" "$tiered" > "$out.tmp"
mv "$out.tmp" "$out"
echo "===> $out (from $here/server.properties and $tiered):"
sed 's/^/     /' "$out"

# First start only: an already formatted log dir is left as it is.
/opt/kafka/bin/kafka-storage.sh format --ignore-formatted --cluster-id "$CLUSTER_ID" --config "$out"
exec /opt/kafka/bin/kafka-server-start.sh "$out"
