#!/bin/sh
# kafka-health.sh BOOTSTRAP: the compose broker's health check. Exits 0 once the broker at
# BOOTSTRAP answers an ApiVersions request (what kafka-broker-api-versions.sh asks).
set -eu
kafka=${KAFKA_HOME:-/opt/kafka}
exec "${JAVA:-java}" -Xmx64m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
  -Dlog4j2.configurationFile="$kafka/config/log4j2.properties" -Dlog4j2.level=WARN \
  -cp "$kafka/libs/*" org.apache.kafka.tools.BrokerApiVersionsCommand --bootstrap-server "${1:?usage: kafka-health.sh HOST:PORT}" >/dev/null
