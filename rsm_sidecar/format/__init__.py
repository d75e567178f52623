"""The on-remote format (pure, no I/O): object keys, chunk indexes, segment manifests,
KIP-917 custom metadata. Compatible with Aiven's tiered-storage plugin; the written
specification is docs/format.md."""
