"""Driver: the topic's copy lag (KIP-1241, Kafka 4.4), read from the broker through the admin API.

``remote.copy.lag.ms`` / ``remote.copy.lag.bytes`` delay the upload of a rolled segment: it is
eligible once its newest record is that old (time check) **or** that many bytes of newer log
follow it (size check). ``0`` on either check makes every rolled segment eligible at once (the
default, as before 4.4); ``-1`` takes the topic's effective local retention (``local.retention.*``,
whose ``-2`` means ``retention.*``), and an unlimited one (``-1``) turns that check off; with both
off nothing is ever uploaded. The follow mode converts what is tiered, so a topic that delays
uploads bounds the table's freshness from below: :class:`CopyLag` says by how much, for
``iceberg status`` and the follow metrics (docs/iceberg.md "Copy lag").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

#: the topic settings read, in the order they are reported
SETTINGS = (
    "remote.copy.lag.ms",
    "remote.copy.lag.bytes",
    "local.retention.ms",
    "local.retention.bytes",
    "retention.ms",
    "retention.bytes",
)


def _effective(lag: int | None, local: int | None, total: int | None) -> float:
    """One check's threshold: 0 (no delay), a positive number, or ``inf`` (the check is off)."""
    if lag is None or lag == 0:
        return 0.0
    if lag == -1:
        lag = total if local == -2 else local
        if lag is None or lag < 0:
            return math.inf
    return float(lag)


@dataclasses.dataclass(frozen=True)
class CopyLag:
    """The topic's copy-lag settings (None: the broker has no such setting, Kafka before 4.4)."""

    topic: str
    settings: Mapping[str, int | None]

    @property
    def ms(self) -> float:
        """Threshold of the time check (ms; ``inf``: off)."""
        s = self.settings
        return _effective(s.get("remote.copy.lag.ms"), s.get("local.retention.ms"), s.get("retention.ms"))

    @property
    def bytes(self) -> float:
        """Threshold of the size check (bytes; ``inf``: off)."""
        s = self.settings
        return _effective(
            s.get("remote.copy.lag.bytes"), s.get("local.retention.bytes"), s.get("retention.bytes")
        )

    @property
    def delays_uploads(self) -> bool:
        """Whether a rolled segment waits before it is uploaded (neither check is 0)."""
        return self.ms != 0 and self.bytes != 0

    @property
    def never_uploads(self) -> bool:
        return self.ms == math.inf and self.bytes == math.inf

    def describe(self) -> str:
        s = self.settings
        given = (
            f"remote.copy.lag.ms = {s.get('remote.copy.lag.ms')}, "
            f"remote.copy.lag.bytes = {s.get('remote.copy.lag.bytes')}"
        )
        if s.get("remote.copy.lag.ms") is None and s.get("remote.copy.lag.bytes") is None:
            return (
                f"topic {self.topic}: the broker has no copy lag settings (Kafka before 4.4): "
                f"uploads are not delayed"
            )
        if not self.delays_uploads:
            return f"topic {self.topic}: {given}: uploads are not delayed"
        if self.never_uploads:
            return (
                f"topic {self.topic}: {given} with unlimited local retention: the broker never "
                f"uploads its segments (KIP-1241), so they never reach the table"
            )
        when = []
        if self.ms != math.inf:
            when.append(f"its newest record is {self.ms / 1000:g} s old")
        if self.bytes != math.inf:
            when.append(f"{int(self.bytes):,} bytes of newer log follow it")
        return (
            f"topic {self.topic}: {given}: the broker uploads a rolled segment only once "
            f"{' or '.join(when)} (KIP-1241), so its rows reach the table that much later at least"
        )

    def as_dict(self) -> dict:
        """For ``iceberg status --json``: the settings, the two thresholds (None: off) and the
        verdict."""

        def finite(x: float) -> float | None:
            return None if x == math.inf else x

        return {
            **{k: self.settings.get(k) for k in SETTINGS},
            "time_threshold_ms": finite(self.ms),
            "size_threshold_bytes": finite(self.bytes),
            "delays_uploads": self.delays_uploads,
            "summary": self.describe(),
        }


def client_config(bootstrap: str, client: Mapping[str, str]) -> dict[str, str]:
    """librdkafka settings: the bootstrap servers and ``iceberg.kafka.client.<name>`` (``_`` in
    the name -> ``.``: ``security_protocol`` -> ``security.protocol``)."""
    conf = {"bootstrap.servers": bootstrap}
    conf.update({k.replace("_", "."): str(v) for k, v in client.items()})
    return conf


class CopyLagUnavailable(Exception):
    """The broker did not tell the topic's copy lag. ``kind`` names the failure (a librdkafka
    error name such as ``_TRANSPORT`` or ``UNKNOWN_TOPIC_OR_PART``; ``_TIMED_OUT`` for no answer
    in time, however the wait ended), so a caller can say each kind once."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


def read_copy_lag(topic: str, conf: Mapping[str, str], timeout: float = 15.0) -> CopyLag:
    """The topic's settings from the broker (``DescribeConfigs``); raises
    :class:`CopyLagUnavailable` (broker unreachable or silent, unknown topic, not authorized)."""
    import concurrent.futures

    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient(dict(conf))
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    future = admin.describe_configs([resource], request_timeout=timeout)[resource]
    try:
        # the request's own timeout normally answers first; both ends mean the same to a caller
        entries = future.result(timeout + 1)
    except concurrent.futures.TimeoutError:
        raise CopyLagUnavailable("_TIMED_OUT", f"no answer from the broker within {timeout:g} s") from None
    except KafkaException as exc:
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if err is None:
            raise CopyLagUnavailable(type(exc).__name__, str(exc)) from exc
        if err.code() == KafkaError._TIMED_OUT:
            raise CopyLagUnavailable(
                "_TIMED_OUT", f"no answer from the broker within {timeout:g} s ({err.str()})"
            ) from exc
        raise CopyLagUnavailable(err.name(), err.str()) from exc
    values: dict[str, int | None] = {}
    for name in SETTINGS:
        entry = entries.get(name)
        values[name] = None if entry is None or entry.value is None else int(entry.value)
    return CopyLag(topic, values)
