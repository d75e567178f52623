"""Command line: `rsm-sidecar serve | config | keys | inspect | iceberg`."""
