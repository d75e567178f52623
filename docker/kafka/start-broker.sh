#!/bin/bash
# Entrypoint of the compose Kafka nodes. NODE_ROLE=broker (the default) writes server.properties
# from the compose settings (server.properties next to this script), config/broker-tiered.properties
# and, when CLUSTER_PROPERTIES names it, config/cluster.properties, with their placeholders
# filled from the environment (NODE_ID, HOST_PORT, SHIM_DIR, SIDECAR_TARGET, TRANSFER_MODE);
# NODE_ROLE=controller writes controller.properties (next to this script) and, when
# CLUSTER_PROPERTIES names it, config/cluster.properties.
# Then it formats the KRaft storage on first start and runs Kafka (the jars in $KAFKA_HOME/libs,
# logging to the console through $KAFKA_HOME/config/log4j2.properties) in the foreground.
set -euo pipefail

here=${RSM_HOME:-/opt/rsm-sidecar}
kafka=${KAFKA_HOME:-/opt/kafka}
tiered=${BROKER_TIERED_PROPERTIES:-/etc/rsm-sidecar/broker-tiered.properties}
cluster=${CLUSTER_PROPERTIES:-}
out=${BROKER_CONFIG:-$kafka/config/server.properties}
: "${CLUSTER_ID:?set CLUSTER_ID (a Kafka Uuid, e.g. from kafka-storage.sh random-uuid)}"

case "${NODE_ROLE:-broker}" in
  broker) sources=("$here/server.properties" "$tiered" ${cluster:+"$cluster"}) ;;
  controller) sources=("$here/controller.properties" ${cluster:+"$cluster"}) ;;
  *) echo "start-broker: NODE_ROLE must be broker or controller, not ${NODE_ROLE}" >&2; exit 64 ;;
esac
"$here/bin/render-properties.sh" "${sources[@]}" > "$out.tmp"
mv "$out.tmp" "$out"
echo "===> $out (from ${sources[*]}):"
sed 's/^/     /' "$out"

# The log dirs are the kafka-data volume, shared with the sidecar: say so if its owner is wrong.
for dir in $(sed -n 's/^log\.dirs=//p' "$out" | tr ',' ' '); do
  if [ ! -w "$dir" ]; then
    echo "start-broker: log dir $dir is not writable by uid $(id -u) (owner: $(stat -c %u "$dir" 2>/dev/null));" \
         "recreate the kafka-data volume (docker compose down -v)" >&2
    exit 1
  fi
done

java=${JAVA:-java}
classpath="$kafka/libs/*"
logging="-Dlog4j2.configurationFile=$kafka/config/log4j2.properties"

# First start only: an already formatted log dir is left as it is.
"$java" -Xmx256m "$logging" -cp "$classpath" kafka.tools.StorageTool \
  format --ignore-formatted --cluster-id "$CLUSTER_ID" --config "$out"
# KAFKA_HEAP_OPTS is split into words on purpose (several JVM options).
# shellcheck disable=SC2086
exec "$java" ${KAFKA_HEAP_OPTS:--Xms512m -Xmx1g} -XX:+UseG1GC -Djava.awt.headless=true "$logging" \
  -cp "$classpath" kafka.Kafka "$out"
