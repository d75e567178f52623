"""A real sidecar gRPC server per test, on local-directory storage."""

from __future__ import annotations

import contextlib

import pytest

from rsm_sidecar.config import Config
from rsm_sidecar.service.server import SidecarServer
from rsm_sidecar.service.sidecar import Sidecar
from rsm_sidecar.storage.local import LocalObjectStore
from tests.keys_fixture import encryption_config
from tests.service.mtls import tls_settings
from tests.service.rsm_client import Client


class RunningSidecar:
    def __init__(self, server: SidecarServer, root):
        self.server = server
        self.sidecar = server.sidecar
        self.store = server.sidecar.store
        self.root = root
        self.client = Client(server.address)

    def objects(self) -> list[str]:
        return [o.key for o in self.store.list("")]


@pytest.fixture
def start_sidecar(tmp_path, rsa_keys):
    started = []

    def start(store=None, encryption: bool | str = False, key_ids=("A", "B"), **overrides) -> RunningSidecar:
        root = tmp_path / "remote"
        values = {
            "server": {"listen": "127.0.0.1:0", "shutdown_grace_seconds": 5},
            "metrics": {"listen": ""},
            "storage": {"local": {"root": str(root), "fsync": False}},
            "segment": {"chunk_size": 64 * 1024},
            # the tests write their segment files under tmp_path, like a broker under log.dirs
            "copy": {"allowed_dirs": [str(tmp_path)]},
        }
        if encryption:
            values["encryption"] = encryption_config(
                rsa_keys, "A" if encryption is True else encryption, key_ids
            )
        for path, value in overrides.items():
            section, _, key = path.partition("__")
            values.setdefault(section, {})[key] = value
        cfg = Config(values, environ={})
        sidecar = Sidecar.from_config(cfg, store=store or LocalObjectStore(root, fsync=False))
        server = SidecarServer(cfg, sidecar)
        server.start()
        running = RunningSidecar(server, root)
        started.append(running)
        return running

    yield start
    for r in started:
        r.client.close()
        with contextlib.suppress(Exception):
            r.server.stop(grace=0)


@pytest.fixture
def mtls_sidecar(start_sidecar):
    """Starts a sidecar serving mTLS with the files of a Secret volume (:mod:`tests.service.mtls`):
    its server."""

    def start(volume) -> SidecarServer:
        return start_sidecar(server__shutdown_grace_seconds=1, server__tls=tls_settings(volume)).server

    return start
