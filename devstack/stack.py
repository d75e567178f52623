"""The local stack: a real Kafka broker with tiered storage through the Java shim, the
rsm-sidecar process, and object storage (local directory by default; SeaweedFS for
``s3``, fake-gcs-server for ``gcs``, Azurite for ``azure``). One launcher for ``make up``, ``make demo`` and
the end-to-end tests. Broker and sidecar settings come from ``config/`` (the files the
docker-compose cluster mounts too); this module only fills in paths and addresses.

Logs: ``<workdir>/logs/`` (sidecar.log) and ``<workdir>/kafka/logs/`` (server.log).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from devstack.common import REPO_ROOT, default_cache_dir, free_ports
from devstack.kafka import KafkaBroker, KafkaDistribution
from devstack.ports import start_retrying
from devstack.sidecar import SidecarProcess

CONFIG_DIR = REPO_ROOT / "config"
SHIM_JAR = REPO_ROOT / "java-shim" / "target" / "rsm-sidecar-shim.jar"
DEMO_KEY_ID = "demo-key-1"
#: the name in the test sidecar certificate (``sidecar_tls``); the shim checks it
TLS_AUTHORITY = "sidecar.test"
BUCKET = "tiered-storage"


def _serving(socket_path: Path) -> bool:
    """Whether a process accepts connections on the Unix socket ``socket_path``."""
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(socket_path))
        except OSError:
            return False
    return True


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


class LocalStack:
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
        sidecar_tls: bool = False,
        sidecar_tcp: bool = False,
        sidecar_host: str = "127.0.0.1",
        sidecar_prefix: Sequence[str] = (),
        shim_on_classpath: bool = False,
        broker_jvm_options: Sequence[str] = (),
        shim_jar: Path | None = None,
        broker_options: Mapping[str, object] | None = None,
        metrics: bool = False,
        storage_host: str = "127.0.0.1",
    ):
        """``sidecar_tls``: the sidecar is reached over TCP with mutual TLS (certificates of a test
        CA in Secret-volume-like directories, ``tls_ca``, ``sidecar_secret``, ``broker_secret``)
        at ``sidecar_host``, as when it is not in the broker's pod (``sidecar_tcp``: over TCP
        without TLS, for benchmarks that measure what TLS costs); ``sidecar_prefix`` runs it
        under another command (``ip netns exec NS``). ``shim_on_classpath``: the shim jar is on
        the broker's own class path instead of ``remote.log.storage.manager.class.path`` (what
        KIP-877 plugin metrics need, docs/shim.md). ``shim_jar``: another build of the shim than
        ``make shim``'s (benchmarks compare builds). ``broker_options``: more arguments of the
        broker's :class:`~devstack.kafka.KafkaBroker` (a broker of a cluster: devstack/cluster.py).
        ``metrics``: the sidecar serves its metrics at :attr:`metrics_url`. ``storage_host``: the
        address of this machine the S3 server listens on (``s3``), when a sidecar run under
        ``sidecar_prefix`` in a network namespace cannot reach loopback (benchmarks/netns.py:
        the namespace's ``outer_ip``).

        The sidecar's TCP and metrics ports come from :mod:`devstack.ports`; its first start
        tries again on new ones if it finds one taken (noted in its log), later starts
        (:meth:`restart_sidecar`) keep them: the broker dials the same address."""
        self.workdir = Path(workdir).resolve()
        self.storage = storage
        if storage_host != "127.0.0.1" and storage != "s3":
            raise ValueError(f"storage_host {storage_host!r} is for storage 's3', not {storage!r}")
        self.storage_host = storage_host
        self.transfer_mode = transfer_mode
        self.kafka_version = kafka_version
        self.broker_port = broker_port
        self.extra_sidecar_env = dict(sidecar_env or {})
        self.extra_broker_properties = dict(broker_properties or {})
        self.encryption = encryption
        self.sidecar_tls = sidecar_tls
        self.sidecar_host = sidecar_host
        self.sidecar_prefix = list(sidecar_prefix)
        self.shim_on_classpath = shim_on_classpath
        self.broker_jvm_options = list(broker_jvm_options)
        self.shim_jar = Path(shim_jar) if shim_jar else SHIM_JAR
        self.broker_options = dict(broker_options or {})
        self.tls_ca = None
        self.sidecar_secret = None
        self.broker_secret = None
        self.sidecar_tcp = sidecar_tcp or sidecar_tls
        self.metrics = metrics
        self.sidecar_port: int | None = None
        self.metrics_port: int | None = None
        self._choose_sidecar_ports()
        self._sidecar_started_once = False
        self.storage_server = None
        self.sidecar: SidecarProcess | None = None
        #: whether start_sidecar created the runtime directory (stop removes only that)
        self._created_runtime_dir = False
        self.broker: KafkaBroker | None = None

    # -- paths ------------------------------------------------------------------------
    @property
    def runtime_dir(self) -> Path:
        """The sidecar's socket and its fetch hand-off directory: on the tmpfs ``/dev/shm``
        when there is one (as production puts them in ``/run``: hand-off files then never
        meet a disk's writeback), else ``<workdir>/run``."""
        shm = Path("/dev/shm")
        if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
            digest = hashlib.sha256(str(self.workdir).encode()).hexdigest()[:12]
            return shm / f"rsm-sidecar-{os.getuid()}-{digest}"
        return self.workdir / "run"

    @property
    def socket_path(self) -> Path:
        return self.runtime_dir / "rsm.sock"

    @property
    def remote_root(self) -> Path:
        return self.workdir / "remote"

    @property
    def stored_dir(self) -> Path:
        """The directory on this machine's disk that holds what the sidecar stored:
        :attr:`remote_root`, or the storage server's data (what a benchmark drops from the page
        cache before a cold read)."""
        if self.storage == "local":
            return self.remote_root
        if self.storage_server is None:
            raise RuntimeError(f"storage {self.storage!r} is not started (start_storage)")
        return self.storage_server.data_dir

    @property
    def keys_dir(self) -> Path:
        return self.workdir / "keys"

    @property
    def broker_log_dir(self) -> Path:
        """The broker's `log.dirs`: the only directory the sidecar reads in path mode."""
        return self.workdir / "kafka" / "data"

    @property
    def sidecar_target(self) -> str:
        if self.sidecar_tcp:
            return f"{self.sidecar_host}:{self.sidecar_port}"
        return f"unix://{self.socket_path}"

    def _ensure_tls(self) -> None:
        if self.tls_ca is not None:
            return
        from devstack.tls import SecretVolume, TestCA

        self.tls_ca = ca = TestCA("rsm-sidecar stack CA")
        server = ca.issue(TLS_AUTHORITY, dns=[TLS_AUTHORITY], ips=[self.sidecar_host])
        client = ca.issue("kafka-broker")
        self.sidecar_secret = SecretVolume(
            self.workdir / "tls" / "sidecar",
            {"tls.crt": server.cert_pem, "tls.key": server.key_pem, "ca.crt": ca.cert_pem},
        )
        self.broker_secret = SecretVolume(
            self.workdir / "tls" / "broker",
            {"tls.crt": client.cert_pem, "tls.key": client.key_pem, "ca.crt": ca.cert_pem},
        )

    # -- pieces -----------------------------------------------------------------------
    def ensure_keys(self) -> None:
        """The demo key pair in :attr:`keys_dir`, written once (not safe to race: a cluster
        writes it before its nodes start in parallel)."""
        from rsm_sidecar.transform.keyring import write_key_pair

        pub = self.keys_dir / f"{DEMO_KEY_ID}.public.pem"
        priv = self.keys_dir / f"{DEMO_KEY_ID}.private.pem"
        if pub.exists() and priv.exists():
            return
        self.keys_dir.mkdir(parents=True, exist_ok=True)
        write_key_pair(pub, priv, 2048, overwrite=True)

    @property
    def metrics_url(self) -> str:
        if self.metrics_port is None:
            raise RuntimeError("the stack was set up without sidecar metrics (metrics=True)")
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def _choose_sidecar_ports(self) -> None:
        """The sidecar's TCP port (``sidecar_tcp``) and metrics port (``metrics``), leased."""
        leased = iter(free_ports(int(self.sidecar_tcp) + int(self.metrics)))
        self.sidecar_port = next(leased) if self.sidecar_tcp else None
        self.metrics_port = next(leased) if self.metrics else None

    def sidecar_environment(self) -> dict[str, str]:
        env = {
            "RSM__SERVER__LISTEN": self.sidecar_target,
            "RSM__METRICS__LISTEN": f"127.0.0.1:{self.metrics_port}" if self.metrics_port else "",
            "RSM__STORAGE__BACKEND": self.storage,
            "RSM__COPY__JOURNAL_DIR": str(self.workdir / "journal"),
            "RSM__COPY__ALLOWED_DIRS": str(self.broker_log_dir),
        }
        self.broker_log_dir.mkdir(parents=True, exist_ok=True)
        env.update(self.storage_environment())
        if self.sidecar_tls:
            self._ensure_tls()
            assert self.sidecar_secret is not None
            env["RSM__SERVER__TLS__CERT_FILE"] = str(self.sidecar_secret.file("tls.crt"))
            env["RSM__SERVER__TLS__KEY_FILE"] = str(self.sidecar_secret.file("tls.key"))
            env["RSM__SERVER__TLS__CLIENT_CA_FILE"] = str(self.sidecar_secret.file("ca.crt"))
        if self.encryption:
            self.ensure_keys()
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
                self.workdir / "s3",
                access_key="stack-access",
                secret_key="stack-secret-key",
                host=self.storage_host,
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

    def start_sidecar(self) -> SidecarProcess:
        if not self.socket_path.parent.exists():
            self.socket_path.parent.mkdir(mode=0o700, parents=True)
            self._created_runtime_dir = True
        retry = not self._sidecar_started_once and (self.sidecar_tcp or self.metrics)
        start_retrying(
            self._start_sidecar_once,
            what="rsm-sidecar",
            log_file=self.workdir / "logs" / "sidecar.log",  # SidecarProcess.log_file
            ports=lambda: {"server.listen": self.sidecar_port, "metrics.listen": self.metrics_port},
            choose_new_ports=self._new_sidecar_ports if retry else None,
        )
        self._sidecar_started_once = True
        assert self.sidecar is not None
        return self.sidecar

    def _new_sidecar_ports(self) -> None:
        self._choose_sidecar_ports()
        self.sidecar = None  # made again with the new addresses

    def _start_sidecar_once(self) -> None:
        if self.sidecar is None:
            env = self.sidecar_environment()
            tls = None
            if self.sidecar_tls:
                assert self.broker_secret is not None  # the health check dials as the broker does
                tls = tuple(self.broker_secret.file(n).read_bytes() for n in ("ca.crt", "tls.key", "tls.crt"))
            self.sidecar = SidecarProcess(
                CONFIG_DIR / "sidecar.toml",
                self.workdir,
                env,
                self.sidecar_target,
                tls=tls,  # type: ignore[arg-type]
                authority=TLS_AUTHORITY if self.sidecar_tls else None,
                prefix=self.sidecar_prefix,
            )
        try:
            self.sidecar.start()
        except BaseException:
            self.sidecar.kill()  # not serving after all (a start that timed out): no second one beside it
            raise

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

    def sidecar_config_env(self) -> tuple[Path, dict[str, str]]:
        """The config file and environment the sidecar runs with: what `rsm-sidecar
        inspect --config` needs to see the same storage and keys."""
        return CONFIG_DIR / "sidecar.toml", self.sidecar_environment()

    def broker_properties(self) -> dict[str, object]:
        if not self.shim_jar.exists():
            raise FileNotFoundError(f"{self.shim_jar} is missing: run `make shim`")
        plugin = self.workdir / "shim"
        plugin.mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.shim_jar, plugin / SHIM_JAR.name)
        props: dict[str, object] = dict(
            read_properties(
                CONFIG_DIR / "broker-tiered.properties",
                {
                    "SHIM_DIR": str(plugin),
                    "SIDECAR_TARGET": self.sidecar_target,
                    "TRANSFER_MODE": self.transfer_mode,
                },
            )
        )
        props["log.dirs"] = str(self.broker_log_dir)
        if self.sidecar_tls:
            self._ensure_tls()
            assert self.broker_secret is not None
            props["rsm.config.tls.enabled"] = "true"
            props["rsm.config.tls.ca.file"] = str(self.broker_secret.file("ca.crt"))
            props["rsm.config.tls.cert.file"] = str(self.broker_secret.file("tls.crt"))
            props["rsm.config.tls.key.file"] = str(self.broker_secret.file("tls.key"))
            props["rsm.config.tls.authority.override"] = TLS_AUTHORITY
        if self.shim_on_classpath:
            props["remote.log.storage.manager.class.path"] = None  # KafkaBroker drops it
        props.update(self.extra_broker_properties)
        return props

    def start_broker(self) -> KafkaBroker:
        if self.broker is None:
            dist = (
                KafkaDistribution.ensure(self.kafka_version, default_cache_dir())
                if self.kafka_version
                else KafkaDistribution.ensure()
            )
            ports = {"broker": self.broker_port} if self.broker_port else None
            props = self.broker_properties()
            self.broker = KafkaBroker(
                dist,
                self.workdir / "kafka",
                extra_properties=props,
                ports=ports,
                jvm_options=self.broker_jvm_options,
                extra_classpath=[self.workdir / "shim" / SHIM_JAR.name] if self.shim_on_classpath else (),
                **self.broker_options,  # type: ignore[arg-type]
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
        if self.storage_server is not None:
            self.storage_server.stop()
        self._remove_runtime_dir()

    def _remove_runtime_dir(self) -> None:
        """Remove what this stack's sidecar left in the runtime directory (socket, its lock, the
        hand-off directory), and the directory if this stack created it, unless another sidecar
        serves on that socket now (one started by hand after this stack's sidecar was stopped);
        files this stack did not put there stay, and so does their directory."""
        if self.sidecar is None or not self.runtime_dir.is_dir() or _serving(self.socket_path):
            return
        for leftover in (self.socket_path, self.socket_path.with_name(self.socket_path.name + ".lock")):
            leftover.unlink(missing_ok=True)
        if self._created_runtime_dir:
            try:
                self.runtime_dir.rmdir()
            except OSError:  # not empty: holds what someone else put there
                return
            self._created_runtime_dir = False

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what tests and the demo look at ---------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        return self.broker.bootstrap_servers

    def object_store(self):
        """An ObjectStore on the same storage the sidecar uses (for assertions)."""
        from rsm_sidecar.config import Config
        from rsm_sidecar.storage.factory import open_store

        env = self.sidecar_environment()
        return open_store(Config.load(CONFIG_DIR / "sidecar.toml", environ=env))
