"""Prometheus metrics over HTTP, and the ``host:port`` settings that say where: what the sidecar
(``metrics.listen``) and the Iceberg follower (``iceberg.follow.metrics_listen``) serve. Light on
purpose (no gRPC): the follower runs under ``spark-submit`` with only this package shipped."""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

import prometheus_client

from rsm_sidecar.errors import ConfigError


def split_listen(listen: str, key: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) with a port in 0..65535; raises ``ConfigError``."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{key}: {listen!r} is not host:port with a port between 0 and 65535")
    return host.strip("[]"), int(port)


def serve_metrics(listen: str, key: str, registry: prometheus_client.CollectorRegistry) -> WSGIServer:
    """Serve ``registry`` at ``http://<listen>/metrics`` (``:port`` alone: 127.0.0.1); returns
    the HTTP server. Raises ``ConfigError`` naming ``key`` when the address is bad or taken."""
    host, port = split_listen(listen, key)
    try:
        server, _ = prometheus_client.start_http_server(port, addr=host or "127.0.0.1", registry=registry)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{key}: cannot serve metrics on {listen}: {e}") from None
    return server
