"""The server's TLS files, read again when they change: certificates renewed in place need no
restart.

cert-manager renews a certificate in place (the same Secret, new contents), and a Kubernetes
Secret volume swaps all its files at once through its ``..data`` symlink; other tools write one
file after the other. The listener asks :meth:`ServerTls.context` before each new TLS handshake; it
compares each file's identity (``os.stat``: device, inode, size, modification time; cheap, no read) with
what it loaded, and when one changed it reads the set again and uses it if it is usable
(every file parses, the key is the certificate's). Connections already open keep the TLS session
they have, so calls in flight are not disturbed; new connections present the new certificate and
trust the new client CA bundle. A set that is not usable (caught half-written, a key from another
renewal) is warned about once and the files in use stay in use; the next handshake checks again.

During a CA change both sides trust both CAs for a while (the bundle in
``server.tls.client_ca_file`` holds the old and the new CA) before the leaves are reissued by the
new CA and the old CA is dropped (docs/operations.md, "Certificate rotation").
"""

from __future__ import annotations

import logging
import os
import ssl
import threading

from rsm_sidecar.errors import ConfigError

log = logging.getLogger(__name__)

#: reads of a changed set before its identity is taken as what was read (files changing meanwhile)
LOAD_ATTEMPTS = 3
#: what identifies a file's contents without reading it
Signature = tuple[tuple[int, int, int, int] | None, ...]


def _signature(paths: tuple[str, ...]) -> Signature:
    out: list[tuple[int, int, int, int] | None] = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _read(path: str, key: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{key}: cannot read {path}: {e.strerror}") from None


def load(cert_file: str, key_file: str, client_ca_file: str | None) -> tuple[bytes, bytes, bytes | None]:
    """(key, certificate chain, client CA bundle) as PEM bytes, checked: each file parses and the
    key is the certificate's. Raises ``ConfigError`` naming the key of the file at fault."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    key_pem = _read(key_file, "server.tls.key_file")
    cert_pem = _read(cert_file, "server.tls.cert_file")
    ca_pem = _read(client_ca_file, "server.tls.client_ca_file") if client_ca_file else None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"server.tls.key_file: {key_file} is not a PEM private key ({e})") from None
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError as e:
        raise ConfigError(f"server.tls.cert_file: {cert_file} is not a PEM certificate ({e})") from None
    if ca_pem is not None:
        try:
            x509.load_pem_x509_certificates(ca_pem)
        except ValueError as e:
            raise ConfigError(
                f"server.tls.client_ca_file: {client_ca_file} is not a PEM certificate ({e})"
            ) from None
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, spki) != chain[0].public_key().public_bytes(der, spki):
        raise ConfigError(
            f"server.tls.key_file: {key_file} is not the key of the certificate in "
            f"server.tls.cert_file ({cert_file}: {chain[0].subject.rfc4514_string()})"
        )
    return key_pem, cert_pem, ca_pem


def _context(cert_file: str, key_file: str, ca_pem: bytes | None, alpn: list[str]) -> ssl.SSLContext:
    """A server context for these files (checked by ``load``): TLS 1.2 or later, the ALPN protocols
    of the listener's two services, and client certificates required when there is a CA bundle."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as e:  # the files changed since load() read them
        raise ConfigError(f"server.tls.cert_file/key_file: {cert_file}, {key_file}: {e}") from None
    if ca_pem is not None:
        ctx.load_verify_locations(cadata=ca_pem.decode("ascii", "replace"))
        ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(alpn)
    return ctx


class ServerTls:
    """The server's TLS files and the TLS context that follows them (module docstring)."""

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str | None, alpn: list[str]):
        self.paths = (cert_file, key_file) + ((client_ca_file,) if client_ca_file else ())
        self.cert_file, self.key_file, self.client_ca_file = cert_file, key_file, client_ca_file
        self.alpn = alpn
        self._lock = threading.Lock()
        self._loaded = _signature(self.paths)
        self._rejected: Signature | None = None
        self._context = self._load()  # raises ConfigError: start-up fails on bad files
        self.reloads = 0

    @property
    def requires_client_certificate(self) -> bool:
        return self.client_ca_file is not None

    def _load(self) -> ssl.SSLContext:
        _, _, ca = load(self.cert_file, self.key_file, self.client_ca_file)
        return _context(self.cert_file, self.key_file, ca, self.alpn)

    def context(self) -> ssl.SSLContext:
        """The context for a new connection's handshake: the files' current set when they changed
        and are usable, else the one in use. Never raises (a handshake must not fail because of
        this check)."""
        try:
            now = _signature(self.paths)
            if now == self._loaded or now == self._rejected:
                return self._context
            with self._lock:
                for _ in range(LOAD_ATTEMPTS):
                    if now == self._loaded:
                        return self._context
                    try:
                        context = self._load()
                    except ConfigError as e:
                        self._rejected = now
                        log.warning(
                            "TLS files changed but are not usable yet (%s); keeping the ones in use", e
                        )
                        return self._context
                    # what was read is what ``now`` describes only if nothing changed meanwhile (a
                    # renewal landing between the stat and the read, or a stat of half a swap):
                    # else read again, so the next handshake does not load the same files twice
                    after = _signature(self.paths)
                    if after == now:
                        break
                    now = after
                self._loaded = now
                self._context = context
                self.reloads += 1
            log.info(
                "TLS files changed: new connections use them (server.tls.cert_file %s)",
                self.cert_file,
                extra={"fields": {"tls_reloads": self.reloads}},
            )
            return self._context
        except Exception as e:
            log.warning("checking the TLS files failed: %s", e)
            return self._context
