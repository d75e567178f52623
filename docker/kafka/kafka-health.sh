#!/bin/sh
# kafka-health.sh BOOTSTRAP: the compose brokers' health check. Exits 0 once the broker at
# BOOTSTRAP answers an ApiVersions request (what kafka-broker-api-versions.sh asks).
# kafka-health.sh --controller ADDRESS: the controller's. Exits 0 once the KRaft quorum at
# ADDRESS has a leader (what kafka-metadata-quorum.sh --bootstrap-controller describe --status asks).
set -eu
kafka=${KAFKA_HOME:-/opt/kafka}
jvm="-Xmx64m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Dlog4j2.configurationFile=$kafka/config/log4j2.properties -Dlog4j2.level=WARN"
if [ "${1:-}" = "--controller" ]; then
  # shellcheck disable=SC2086
  exec "${JAVA:-java}" $jvm -cp "$kafka/libs/*" org.apache.kafka.tools.MetadataQuorumCommand \
    --bootstrap-controller "${2:?usage: kafka-health.sh --controller HOST:PORT}" describe --status >/dev/null
fi
# shellcheck disable=SC2086
exec "${JAVA:-java}" $jvm -cp "$kafka/libs/*" org.apache.kafka.tools.BrokerApiVersionsCommand \
  --bootstrap-server "${1:?usage: kafka-health.sh HOST:PORT}" >/dev/null
