"""Chunk transforms: zstd compression, AES-256-GCM encryption, and the keyring that
wraps per-segment data keys."""
