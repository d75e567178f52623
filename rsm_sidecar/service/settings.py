"""The service's keys: ``[server]``, ``[metrics]``, ``[log]``, and the ``[copy]`` and ``[fetch]``
limits of the calls it admits; declared once, as the fields of the dataclasses below.

Light on purpose: every ``Config()`` loads this module, so it imports nothing but the
configuration code.
"""

from __future__ import annotations

import dataclasses

from rsm_sidecar.config import Settings, group, setting
from rsm_sidecar.errors import ConfigError

MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class TlsSettings(Settings):
    """The server's TLS files (``server.tls.*``); none: plaintext."""

    cert_file: str | None = setting(
        "path", None, "PEM server certificate; enables TLS together with `server.tls.key_file`."
    )
    key_file: str | None = setting("path", None, "PEM private key of `server.tls.cert_file`.")
    client_ca_file: str | None = setting(
        "path", None, "PEM CA bundle; when set, clients must present a certificate it signed (mTLS)."
    )


@dataclasses.dataclass(frozen=True)
class ServerSettings(Settings):
    """Where and how the gRPC server listens (``[server]``)."""

    listen: str = setting(
        "str",
        "127.0.0.1:9095",
        "gRPC listen address: `host:port`, or `unix:///path/to.sock` for a Unix domain socket.",
    )
    max_workers: int = setting(
        "int", 64, "Threads serving gRPC calls (copies, fetch streams, indexes, deletes).", min=4, max=1024
    )
    stream_window_bytes: int = setting(
        "size",
        4 * MiB,
        "HTTP/2 flow-control window of each call the sidecar receives: how many bytes of a "
        "stream-mode copy its gRPC transport takes in ahead of the copy, per copy. Fixed, so a copy's"
        " memory has a bound that does not depend on the machine's load; 0 lets gRPC size it from its"
        " bandwidth-delay probes, which on a busy host let a 1 GiB copy's memory grow by up to 30 MiB"
        " more (docs/operations.md, Memory). Otherwise at least 65535 (HTTP/2's default window).",
        min=0,
        max=256 * MiB,
    )
    shutdown_grace_seconds: float = setting(
        "seconds",
        30.0,
        "On SIGTERM: stop accepting connections, close fetch channel connections between exchanges,"
        " then wait this long for in-flight copies, fetches and fetch channel exchanges; past it the"
        " rest are cut (the shim resumes a cut read on the restarted sidecar; a cut copy is retried).",
        min=0,
    )
    tls: TlsSettings = group(TlsSettings)
    allow_plaintext_non_loopback: bool = setting(
        "bool",
        False,
        "Allow `server.listen` on a non-loopback TCP address without client certificates. Anyone who "
        "reaches the port can then copy, read and delete every tiered segment: only for a network "
        "that only the broker can reach (a pod or a private container network).",
    )

    def __post_init__(self) -> None:
        if 0 < self.stream_window_bytes < 65535:
            raise ConfigError(
                f"server.stream_window_bytes: {self.stream_window_bytes} is below HTTP/2's default "
                f"window of 65535 bytes (0: gRPC's automatic sizing)"
            )


@dataclasses.dataclass(frozen=True)
class MetricsSettings(Settings):
    """The Prometheus endpoint (``[metrics]``)."""

    listen: str = setting(
        "str",
        "127.0.0.1:9096",
        "Prometheus metrics HTTP address `host:port` (path `/metrics`; `:port` alone listens on "
        "127.0.0.1); empty disables.",
    )


@dataclasses.dataclass(frozen=True)
class LogSettings(Settings):
    """What the sidecar logs, and how (``[log]``)."""

    level: str = setting(
        "str",
        "INFO",
        "Lowest level of the log lines written to stderr.",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
    )
    format: str = setting(
        "str", "json", "Log line format: one JSON object per line, or plain text.", choices=("json", "text")
    )


@dataclasses.dataclass(frozen=True)
class CopyLimits(Settings):
    """How many copies the service admits, how long it waits for one, and where it keeps
    their journal (the ``[copy]`` keys that are not the copier's own: ``CopySettings``)."""

    max_concurrent: int = setting(
        "int",
        16,
        "Copies processed at once; a further copy is answered RESOURCE_EXHAUSTED at once (the broker "
        "retries it at its next copy interval). Memory per copy is about (copy.parallelism + 2) x "
        "chunk size plus the storage upload buffer.",
        min=1,
        max=256,
    )
    journal_dir: str | None = setting(
        "path",
        None,
        "Directory (local disk) where each copy records the keys it is writing until it completes; "
        "what a killed or failed copy left in storage is deleted right after start-up (beside "
        "serving) and by a periodic sweep. Unset: no journal (find leftovers with `rsm-sidecar "
        "inspect orphans`).",
    )
    journal_sweep_seconds: float = setting(
        "seconds",
        60.0,
        "How often leftovers of interrupted copies are looked for while the sidecar runs.",
        min=1,
    )
    allowed_dirs: tuple[str, ...] = setting(
        "list",
        (),
        "Path transfer mode: the broker's log directories (log.dirs); only regular files under them "
        "are read. Empty: path transfer mode is disabled (copies must use stream mode). Each entry "
        "must be an existing absolute directory other than `/`.",
    )
    idle_timeout_seconds: float = setting(
        "seconds",
        60.0,
        "A copy that makes no progress (no message from the client, no byte stored) for this long is "
        "abandoned and its slot freed.",
        min=1,
    )
    max_index_file_bytes: int = setting(
        "size",
        64 * MiB,
        "Largest index file (offset, time, producer snapshot, transaction index) a copy accepts; "
        "index files are held in memory while they are encrypted.",
        min=1024,
    )


@dataclasses.dataclass(frozen=True)
class FetchLimits(Settings):
    """How many fetches the service admits and how long it waits for one (the ``[fetch]`` keys
    that are not the reader's own: ``ReaderSettings``)."""

    max_concurrent: int = setting(
        "int",
        32,
        "Fetch and index streams served at once; further ones are refused with RESOURCE_EXHAUSTED "
        "(the broker reads with `remote.log.reader.threads`, 10 by default). `server.max_workers` "
        "must exceed `copy.max_concurrent` + `fetch.max_concurrent` by at least 8.",
        min=1,
        max=1024,
    )
    idle_timeout_seconds: float = setting(
        "seconds",
        60.0,
        "A fetch stream whose client reads nothing for this long is cancelled and its slot freed.",
        min=1,
    )


@dataclasses.dataclass(frozen=True)
class ServiceSettings(Settings):
    """Every key the service reads itself (the copier's and the reader's are in
    :mod:`rsm_sidecar.segment.settings`, the keyring's in
    :mod:`rsm_sidecar.transform.keyring_settings`)."""

    server: ServerSettings = group(ServerSettings)
    metrics: MetricsSettings = group(MetricsSettings)
    log: LogSettings = group(LogSettings)
    copy: CopyLimits = group(CopyLimits)
    fetch: FetchLimits = group(FetchLimits)

    def __post_init__(self) -> None:
        reserved = self.copy.max_concurrent + self.fetch.max_concurrent + 8
        if self.server.max_workers < reserved:
            raise ConfigError(
                f"server.max_workers: {self.server.max_workers} threads cannot serve "
                f"copy.max_concurrent ({self.copy.max_concurrent}) + fetch.max_concurrent "
                f"({self.fetch.max_concurrent}) calls and keep 8 for health checks and deletes; "
                f"set it to at least {reserved}"
            )


CONFIG_KEYS = ServiceSettings.keys()
