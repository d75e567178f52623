#!/bin/bash
# Entrypoint of the compose Kafka nodes; NODE_ROLE says which settings it writes into
# server.properties, the placeholders filled from the environment:
#   combined (the default)  a single broker+controller node: server.properties (next to this
#                           script) and config/broker-tiered.properties (SHIM_DIR, SIDECAR_TARGET,
#                           TRANSFER_MODE);
#   broker                  a broker of the cluster: broker.properties (NODE_ID, HOST_PORT), then
#                           config/broker-tiered.properties and config/cluster.properties;
#   controller              the cluster's KRaft controller: controller.properties, then
#                           config/cluster.properties;
# then the files named in BROKER_EXTRA_PROPERTIES (space-separated; later keys win: the remote
# topology's TLS settings, docker-compose.remote.yml). It formats the KRaft storage on first start
# and runs Kafka (the jars in $KAFKA_HOME/libs, logging to the console through
# $KAFKA_HOME/config/log4j2.properties, JVM options from KAFKA_HEAP_OPTS and KAFKA_OPTS) in the
# foreground.
set -euo pipefail

here=${RSM_HOME:-/opt/rsm-sidecar}
kafka=${KAFKA_HOME:-/opt/kafka}
tiered=${BROKER_TIERED_PROPERTIES:-/etc/rsm-sidecar/broker-tiered.properties}
out=${BROKER_CONFIG:-$kafka/config/server.properties}
: "${CLUSTER_ID:?set CLUSTER_ID (a Kafka Uuid, e.g. from kafka-storage.sh random-uuid)}"
# shellcheck disable=SC2206
extra=(${BROKER_EXTRA_PROPERTIES:-})

cluster=${CLUSTER_PROPERTIES:-/etc/rsm-sidecar/cluster.properties}
case "${NODE_ROLE:-combined}" in
  combined) sources=("$here/server.properties" "$tiered") ;;
  broker) sources=("$here/broker.properties" "$tiered" "$cluster") ;;
  controller) sources=("$here/controller.properties" "$cluster") ;;
  *) echo "start-broker: NODE_ROLE must be combined, broker or controller, not ${NODE_ROLE}" >&2; exit 64 ;;
esac
"$here/bin/render-properties.sh" "${sources[@]}" "${extra[@]}" > "$out.tmp"
mv "$out.tmp" "$out"
echo "===> $out (from ${sources[*]}${extra[*]:+ and ${extra[*]}}):"
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
# KAFKA_HEAP_OPTS and KAFKA_OPTS are split into words on purpose (several JVM options).
# shellcheck disable=SC2086
exec "$java" ${KAFKA_HEAP_OPTS:--Xms512m -Xmx1g} ${KAFKA_OPTS:-} -XX:+UseG1GC -Djava.awt.headless=true \
  "$logging" -cp "$classpath" kafka.Kafka "$out"
