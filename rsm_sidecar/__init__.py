"""rsm-sidecar: the Python side of a Kafka tiered-storage RemoteStorageManager."""

__version__ = "0.1.0"
