"""Should a segment be zstd-compressed? Not when the producer already compressed it.

Aiven's plugin looks only at the first record batch. A segment can mix compressed and
uncompressed batches (several producers with different settings), so we weigh the
batch headers of the whole first chunk: the segment counts as compressed when at least
half of those batch bytes are in producer-compressed batches. Headers only: nothing is
decompressed, and unreadable data (not Kafka batches, old message formats) means
"compress".
"""

from __future__ import annotations

import logging

from rsm_sidecar.kafka.batch import Compression
from rsm_sidecar.kafka.errors import KafkaLogError
from rsm_sidecar.kafka.reader import scan_batch_headers

log = logging.getLogger(__name__)
COMPRESSED_SHARE = 0.5


def compressed_share(head: bytes) -> float | None:
    """Share of record-batch bytes in ``head`` that are producer-compressed, or None
    when ``head`` holds no complete readable v2 batch."""
    try:
        by_codec = scan_batch_headers(head).bytes_by_compression()
    except KafkaLogError as e:
        log.debug("compression heuristic: first chunk is not readable as record batches: %s", e)
        return None
    total = sum(by_codec.values())
    if not total:
        return None
    return 1 - by_codec.get(Compression.NONE, 0) / total


def batches_already_compressed(head: bytes) -> bool:
    share = compressed_share(head)
    return share is not None and share >= COMPRESSED_SHARE
