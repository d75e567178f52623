"""Executors: stored segments -> raw record batches (one row per Kafka record)."""
