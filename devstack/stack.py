"""The local stack: a real Kafka broker with tiered storage through the Java shim, the
rsm-sidecar process, and object storage (local directory by default; SeaweedFS for
``s3``, fake-gcs-server for ``gcs``, Azurite for ``azure``). One launcher for ``make up``, ``make demo`` and
the end-to-end tests. Broker and sidecar settings come from ``config/`` (the files the
docker-compose cluster mounts too); this module only fills in paths and addresses.
:class:`TieredStorageBase` is what a stack of several brokers shares with it
(devstack/cluster.py).

Logs: ``<workdir>/logs/`` (sidecar.log) and ``<workdir>/kafka/logs/`` (server.log).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from devstack.common import REPO_ROOT, default_cache_dir
from devstack.kafka import KafkaBroker, KafkaDistribution
from devstack.sidecar import SidecarProcess

CONFIG_DIR = REPO_ROOT / "config"
SHIM_JAR = REPO_ROOT / "java-shim" / "target" / "rsm-sidecar-shim.jar"
DEMO_KEY_ID = "demo-key-1"
BUCKET = "tiered-storage"


def read_properties(path: Path, values: Mapping[str, str]) -> dict[str, str]:
    """A .properties file with ``${NAME}`` placeholders filled from ``values``."""
    props: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        for name, v in values.items():
            value = value.replace("${" + name + "}", v)
        if "${" in value:
            raise ValueError(f"{path}: unfilled placeholder in {key}={value}")
        props[key.strip()] = value.strip()
    return props


def runtime_dir_for(workdir: Path) -> Path:
    """Where a sidecar of ``workdir`` keeps its socket and its fetch hand-off directory: on the
    tmpfs ``/dev/shm`` when there is one (as production puts them in ``/run``: hand-off files then
    never meet a disk's writeback), else ``<workdir>/run``."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        digest = hashlib.sha256(str(workdir).encode()).hexdigest()[:12]
        return shm / f"rsm-sidecar-{os.getuid()}-{digest}"
    return workdir / "run"


class TieredStorageBase:
    """What every stack shares, whatever its number of brokers: the object store (started by
    :meth:`start_storage`), the encryption keys, and the sidecar environment and broker
    properties of one broker-sidecar pair."""

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        storage: str = "local",
        transfer_mode: str = "path",
        kafka_version: str | None = None,
        sidecar_env: Mapping[str, str] | None = None,
        broker_properties: Mapping[str, object] | None = None,
        encryption: bool = True,
    ):
        self.workdir = Path(workdir).resolve()
        self.storage = storage
        self.transfer_mode = transfer_mode
        self.kafka_version = kafka_version
        self.extra_sidecar_env = dict(sidecar_env or {})
        self.extra_broker_properties = dict(broker_properties or {})
        self.encryption = encryption
        self.storage_server = None

    @property
    def remote_root(self) -> Path:
        return self.workdir / "remote"

    @property
    def keys_dir(self) -> Path:
        return self.workdir / "keys"

    def distribution(self) -> KafkaDistribution:
        if self.kafka_version:
            return KafkaDistribution.ensure(self.kafka_version, default_cache_dir())
        return KafkaDistribution.ensure()

    # -- pieces -----------------------------------------------------------------------
    def _ensure_keys(self) -> None:
        from rsm_sidecar.transform.keyring import write_key_pair

        pub = self.keys_dir / f"{DEMO_KEY_ID}.public.pem"
        priv = self.keys_dir / f"{DEMO_KEY_ID}.private.pem"
        if pub.exists() and priv.exists():
            return
        self.keys_dir.mkdir(parents=True, exist_ok=True)
        write_key_pair(pub, priv, 2048, overwrite=True)

    def sidecar_environment_for(self, socket_path: Path, journal_dir: Path, log_dir: Path) -> dict[str, str]:
        """RSM__ settings of a sidecar listening on ``socket_path`` for the broker whose
        ``log.dirs`` is ``log_dir`` (the only directory it reads in path mode)."""
        env = {
            "RSM__SERVER__LISTEN": f"unix://{socket_path}",
            "RSM__METRICS__LISTEN": "",
            "RSM__STORAGE__BACKEND": self.storage,
            "RSM__COPY__JOURNAL_DIR": str(journal_dir),
            "RSM__COPY__ALLOWED_DIRS": str(log_dir),
        }
        log_dir.mkdir(parents=True, exist_ok=True)
        env.update(self.storage_environment())
        if self.encryption:
            self._ensure_keys()
            for leaf in ("public", "private"):
                env[f"RSM__ENCRYPTION__KEYS__{DEMO_KEY_ID}__{leaf.upper()}_KEY_FILE"] = str(
                    self.keys_dir / f"{DEMO_KEY_ID}.{leaf}.pem"
                )
        else:
            env["RSM__ENCRYPTION__ENABLED"] = "false"
        env.update(self.extra_sidecar_env)
        return env

    def start_storage(self) -> None:
        """The object store: a local directory, or a local S3 (SeaweedFS with SigV4
        credentials), GCS (fake-gcs-server) or Azure Blob (Azurite, with a shared key) server
        with the bucket (container) created."""
        if self.storage == "local":
            self.remote_root.mkdir(parents=True, exist_ok=True)
        elif self.storage == "s3":
            from devstack.s3server import SeaweedS3Server

            self.storage_server = SeaweedS3Server(
                self.workdir / "s3", access_key="stack-access", secret_key="stack-secret-key"
            ).start()
            self.storage_server.create_bucket(BUCKET)
        elif self.storage == "gcs":
            from devstack.gcsserver import FakeGcsServer

            self.storage_server = FakeGcsServer(self.workdir / "gcs").start()
            self.storage_server.create_bucket(BUCKET)
        elif self.storage == "azure":
            from devstack.azurite import AzuriteServer

            self.storage_server = AzuriteServer(self.workdir / "azure").start()
            self.storage_server.create_bucket(BUCKET)
        else:
            raise ValueError(f"unknown storage {self.storage!r} (local, s3, gcs or azure)")

    def storage_environment(self) -> dict[str, str]:
        """RSM__ settings that point the sidecar at the storage server."""
        if self.storage == "s3":
            srv = self.storage_server
            return {
                "RSM__STORAGE__S3__BUCKET": BUCKET,
                "RSM__STORAGE__S3__ENDPOINT_URL": srv.endpoint_url,
                "RSM__STORAGE__S3__REGION": "us-east-1",
                "RSM__STORAGE__S3__ADDRESSING_STYLE": "path",
                "RSM__STORAGE__S3__ACCESS_KEY_ID": srv.access_key,
                "RSM__STORAGE__S3__SECRET_ACCESS_KEY": srv.secret_key,
            }
        if self.storage == "gcs":
            return {
                "RSM__STORAGE__GCS__BUCKET": BUCKET,
                "RSM__STORAGE__GCS__ENDPOINT_URL": self.storage_server.endpoint_url,
                "RSM__STORAGE__GCS__CREDENTIALS": "anonymous",
                "RSM__STORAGE__GCS__PROJECT": "test",
            }
        if self.storage == "azure":
            srv = self.storage_server
            return {
                "RSM__STORAGE__AZURE__CONTAINER": BUCKET,
                "RSM__STORAGE__AZURE__ENDPOINT_URL": srv.endpoint_url,
                "RSM__STORAGE__AZURE__ACCOUNT_NAME": srv.account,
                "RSM__STORAGE__AZURE__ACCOUNT_KEY": srv.account_key,
            }
        return {"RSM__STORAGE__LOCAL__ROOT": str(self.remote_root)}

    def broker_properties_for(
        self, plugin_dir: Path, target: str, log_dir: Path, cluster: bool = False
    ) -> dict[str, object]:
        """The tiered-storage properties of a broker whose sidecar listens on ``target``, with the
        shim jar copied into ``plugin_dir``: config/broker-tiered.properties, then (``cluster``)
        config/cluster.properties, then the stack's own extra properties."""
        if not SHIM_JAR.exists():
            raise FileNotFoundError(f"{SHIM_JAR} is missing: run `make shim`")
        plugin_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(SHIM_JAR, plugin_dir / SHIM_JAR.name)
        values = {"SHIM_DIR": str(plugin_dir), "SIDECAR_TARGET": target, "TRANSFER_MODE": self.transfer_mode}
        props: dict[str, object] = dict(read_properties(CONFIG_DIR / "broker-tiered.properties", values))
        if cluster:
            props.update(read_properties(CONFIG_DIR / "cluster.properties", values))
        props["log.dirs"] = str(log_dir)
        props.update(self.extra_broker_properties)
        return props

    def sidecar_environment(self) -> dict[str, str]:
        """The RSM__ settings of the (first) sidecar."""
        raise NotImplementedError

    def sidecar_config_env(self) -> tuple[Path, dict[str, str]]:
        """The config file and environment the sidecar runs with: what `rsm-sidecar
        inspect --config` needs to see the same storage and keys (every sidecar of a stack
        shares them)."""
        return CONFIG_DIR / "sidecar.toml", self.sidecar_environment()

    def object_store(self):
        """An ObjectStore on the same storage the sidecars use (for assertions)."""
        from rsm_sidecar.config import Config
        from rsm_sidecar.storage.factory import open_store

        return open_store(Config.load(*self.sidecar_config_env()))

    def stop_storage(self) -> None:
        if self.storage_server is not None:
            self.storage_server.stop()


class LocalStack(TieredStorageBase):
    """One broker (a combined KRaft node) and its sidecar."""

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        storage: str = "local",
        transfer_mode: str = "path",
        kafka_version: str | None = None,
        broker_port: int | None = None,
        sidecar_env: Mapping[str, str] | None = None,
        broker_properties: Mapping[str, object] | None = None,
        encryption: bool = True,
    ):
        super().__init__(
            workdir,
            storage=storage,
            transfer_mode=transfer_mode,
            kafka_version=kafka_version,
            sidecar_env=sidecar_env,
            broker_properties=broker_properties,
            encryption=encryption,
        )
        self.broker_port = broker_port
        self.sidecar: SidecarProcess | None = None
        self.broker: KafkaBroker | None = None

    # -- paths ------------------------------------------------------------------------
    @property
    def runtime_dir(self) -> Path:
        """The sidecar's socket and its fetch hand-off directory (:func:`runtime_dir_for`)."""
        return runtime_dir_for(self.workdir)

    @property
    def socket_path(self) -> Path:
        return self.runtime_dir / "rsm.sock"

    @property
    def broker_log_dir(self) -> Path:
        """The broker's `log.dirs`: the only directory the sidecar reads in path mode."""
        return self.workdir / "kafka" / "data"

    @property
    def sidecar_target(self) -> str:
        return f"unix://{self.socket_path}"

    # -- pieces -----------------------------------------------------------------------
    def sidecar_environment(self) -> dict[str, str]:
        return self.sidecar_environment_for(self.socket_path, self.workdir / "journal", self.broker_log_dir)

    def start_sidecar(self) -> SidecarProcess:
        self.socket_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.sidecar is None:
            self.sidecar = SidecarProcess(
                CONFIG_DIR / "sidecar.toml", self.workdir, self.sidecar_environment(), self.sidecar_target
            )
        self.sidecar.start()
        return self.sidecar

    def restart_sidecar(
        self, env: Mapping[str, str] | None = None, unset: Iterable[str] = ()
    ) -> SidecarProcess:
        """Stop the sidecar and start it again, optionally with changed RSM__ settings
        (key rotation, another storage prefix) or without some (``unset``: variable
        names, e.g. the files of a retired key); the broker keeps running."""
        if self.sidecar is not None:
            self.sidecar.stop()
        if env:
            self.extra_sidecar_env.update(env)
        for name in unset:
            self.extra_sidecar_env.pop(name, None)
        self.sidecar = None
        return self.start_sidecar()

    def broker_properties(self) -> dict[str, object]:
        return self.broker_properties_for(self.workdir / "shim", self.sidecar_target, self.broker_log_dir)

    def start_broker(self) -> KafkaBroker:
        if self.broker is None:
            dist = self.distribution()
            ports = {"broker": self.broker_port} if self.broker_port else None
            self.broker = KafkaBroker(
                dist, self.workdir / "kafka", extra_properties=self.broker_properties(), ports=ports
            )
        self.broker.start()
        return self.broker

    def start(self) -> LocalStack:
        try:
            self.start_storage()
            self.start_sidecar()
            self.start_broker()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop()
        if self.sidecar is not None:
            self.sidecar.stop()
        self.stop_storage()
        if self.runtime_dir.parent == Path("/dev/shm"):
            shutil.rmtree(self.runtime_dir, ignore_errors=True)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what tests and the demo look at ---------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        return self.broker.bootstrap_servers
