"""The gRPC service the broker's shim talks to (proto/rsm/v1/rsm.proto)."""
