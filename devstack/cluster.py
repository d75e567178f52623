"""A tiered-storage Kafka cluster on this machine (``make up BROKERS=3``, tests/cluster/):
one KRaft controller, N brokers, and one sidecar per broker, each sidecar on its own Unix
socket and reading only its own broker's log directory, all of them sharing one object store
(a local directory, S3, GCS or Azure, as :class:`~devstack.stack.LocalStack`) and one keyring.

The brokers take config/broker-tiered.properties, then config/cluster.properties (the
metadata topic and every other topic at replication factor 3, min ISR 2), then what the caller
adds; the controller takes config/cluster.properties too. The controller is a node of its own
(``process.roles=controller``), not a broker: a test can then kill any broker with SIGKILL,
wipe its disk or stop it without touching the quorum.
One controller, not three: nothing here exercises a controller failover, and each controller
is one more JVM on a 2-core machine (a quorum of three costs about 0.5 GB and a few seconds of
CPU at start, for a failure no test causes).

Everything starts in parallel: the controller, and per broker its sidecar then the broker (a
broker counts as started once it is registered and unfenced). Layout of ``workdir``::

    controller/            the controller (server.properties, data/, logs/server.log)
    broker-<id>/kafka/     broker <id>: data/ (its log.dirs), logs/server.log
    broker-<id>/logs/      its sidecar's sidecar.log; broker-<id>/journal/ its copy journal
    remote/ | s3/ | ...    the shared object store; keys/ the shared encryption keys

Example::

    with ClusterStack(tmp_path, brokers=3, storage="s3") as cluster:
        producer = Producer({"bootstrap.servers": cluster.bootstrap_servers})
        cluster.nodes[2].broker.kill()
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from devstack.common import default_cache_dir
from devstack.kafka import KafkaBroker, KafkaDistribution, random_cluster_id
from devstack.stack import CONFIG_DIR, LocalStack, read_properties

#: the controller's node id; brokers are 1..N
CONTROLLER_ID = 0
#: heap of each broker and of the controller (four JVMs share the machine)
BROKER_HEAP = ("-Xms256m", "-Xmx768m")
CONTROLLER_HEAP = ("-Xms128m", "-Xmx256m")
#: the controller validates topic configurations: it must know that tiered storage is on, or it
#: refuses ``remote.storage.enable=true`` ("Tiered Storage functionality is disabled in the broker")
CONTROLLER_PROPERTIES = {"remote.log.storage.system.enable": "true"}


class ClusterNode(LocalStack):
    """Broker ``node_id`` and its sidecar, in ``<cluster workdir>/broker-<id>``: a
    :class:`LocalStack` whose broker is a broker-only node of the cluster and whose object store
    and keys are the cluster's (it starts no storage of its own)."""

    def __init__(self, cluster: ClusterStack, node_id: int, port: int | None = None):
        self.cluster = cluster
        self.node_id = node_id
        super().__init__(
            cluster.workdir / f"broker-{node_id}",
            storage=cluster.storage,
            transfer_mode=cluster.transfer_mode,
            kafka_version=cluster.kafka_version,
            broker_port=port,
            sidecar_env=cluster.extra_sidecar_env,
            metrics=cluster.metrics,
            broker_properties=cluster.extra_broker_properties,
            encryption=cluster.encryption,
            broker_jvm_options=cluster.jvm_options,
            broker_options={
                "heap_options": cluster.broker_heap,
                "node_id": node_id,
                "cluster_id": cluster.cluster_id,
                "role": "broker",
                # read when the broker starts: the controller may have moved to other ports
                "quorum_voters": lambda: cluster.quorum_voters,
            },
        )

    # the cluster's object store and keys
    @property
    def remote_root(self) -> Path:
        return self.cluster.shared.remote_root

    @property
    def keys_dir(self) -> Path:
        return self.cluster.shared.keys_dir

    def start_storage(self) -> None:
        """Nothing: the cluster started the object store."""

    def storage_environment(self) -> dict[str, str]:
        return self.cluster.shared.storage_environment()

    def broker_properties(self) -> dict[str, object]:
        """config/broker-tiered.properties, then config/cluster.properties, then the cluster's
        extra broker properties."""
        props = super().broker_properties()
        for key, value in read_properties(CONFIG_DIR / "cluster.properties", {}).items():
            if key not in self.extra_broker_properties:
                props[key] = value
        return props

    @property
    def log_dir(self) -> Path:
        """The broker's ``log.dirs``: the only directory its sidecar reads in path mode."""
        return self.broker_log_dir

    def __repr__(self) -> str:
        return f"ClusterNode({self.node_id}, {self.broker!r})"


class ClusterStack:
    """One controller, ``brokers`` brokers (node ids 1..N, at least three) and their sidecars.

    ``broker_ports`` fixes the brokers' ports (else free ones), ``broker_properties`` are added
    to every broker's (last), ``controller_properties`` to the controller's, ``sidecar_env`` to
    every sidecar's environment, ``jvm_options`` to every Kafka JVM's command line (after the
    heap). ``metrics=True`` gives every sidecar a metrics port (:attr:`ClusterNode.metrics_url`).
    After :meth:`start`, ``start_seconds`` is how long the start took.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        brokers: int = 3,
        storage: str = "local",
        transfer_mode: str = "path",
        kafka_version: str | None = None,
        broker_ports: Sequence[int] | None = None,
        sidecar_env: Mapping[str, str] | None = None,
        broker_properties: Mapping[str, object] | None = None,
        controller_properties: Mapping[str, object] | None = None,
        encryption: bool = True,
        metrics: bool = False,
        broker_heap: Iterable[str] = BROKER_HEAP,
        jvm_options: Iterable[str] = (),
    ):
        if brokers < 3:
            raise ValueError(
                f"a cluster has at least 3 brokers, not {brokers} (config/cluster.properties "
                "replicates every topic 3 times); one broker is LocalStack"
            )
        if broker_ports is not None and len(broker_ports) != brokers:
            raise ValueError(f"{len(broker_ports)} broker ports for {brokers} brokers")
        self.workdir = Path(workdir).resolve()
        self.storage = storage
        self.transfer_mode = transfer_mode
        self.kafka_version = kafka_version
        self.extra_sidecar_env = dict(sidecar_env or {})
        self.extra_broker_properties = dict(broker_properties or {})
        self.encryption = encryption
        #: the object store and the keys every node shares (its broker and sidecar are unused)
        self.shared = LocalStack(self.workdir, storage=storage, encryption=encryption)
        self.broker_count = brokers
        self.broker_ports: list[int | None] = list(broker_ports) if broker_ports else [None] * brokers
        self.controller_properties = {
            **read_properties(CONFIG_DIR / "cluster.properties", {}),
            **CONTROLLER_PROPERTIES,
            **(controller_properties or {}),
        }
        self.metrics = metrics
        self.broker_heap = tuple(broker_heap)
        self.jvm_options = tuple(jvm_options)
        self.cluster_id = self._existing_cluster_id() or random_cluster_id()
        self.controller: KafkaBroker | None = None
        self.nodes: dict[int, ClusterNode] = {}
        self.start_seconds: float | None = None
        self._dist: KafkaDistribution | None = None

    # -- set-up --------------------------------------------------------------------------
    def _existing_cluster_id(self) -> str | None:
        """The cluster id a previous run formatted ``workdir`` with (``make up`` keeps data)."""
        meta = self.workdir / "controller" / "data" / "meta.properties"
        if meta.exists():
            m = re.search(r"^cluster\.id=(\S+)$", meta.read_text(), flags=re.M)
            if m:
                return m.group(1)
        return None

    @property
    def dist(self) -> KafkaDistribution:
        if self._dist is None:
            self._dist = (
                KafkaDistribution.ensure(self.kafka_version, default_cache_dir())
                if self.kafka_version
                else KafkaDistribution.ensure()
            )
        return self._dist

    @property
    def quorum_voters(self) -> str:
        if self.controller is None:
            raise RuntimeError("the controller is not set up yet")
        return self.controller.controller_voter

    def start(self) -> ClusterStack:
        t0 = time.monotonic()
        try:
            self.shared.start_storage()
            if self.encryption:
                # once, before the nodes start in parallel: each would otherwise write a key pair
                # of its own under the same id when it finds none, and a sidecar that read an
                # overwritten pair cannot unwrap the data keys of the segments the others copy
                self.shared.ensure_keys()
            self.controller = KafkaBroker(
                self.dist,
                self.workdir / "controller",
                extra_properties=self.controller_properties,
                heap_options=CONTROLLER_HEAP,
                jvm_options=self.jvm_options,
                node_id=CONTROLLER_ID,
                cluster_id=self.cluster_id,
                role="controller",
            )
            for i, port in enumerate(self.broker_ports, start=1):
                self.nodes[i] = ClusterNode(self, i, port)
            parallel([self.controller.start, *(node.start for node in self.nodes.values())])
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def add_broker(self) -> ClusterNode:
        """One more broker with its own sidecar (node id: the highest so far + 1), started. It
        joins ``nodes`` (and so ``bootstrap_servers``) once it has started: a test may call this
        on another thread while it produces (a failed start stops what it had started)."""
        node = ClusterNode(self, max(self.nodes) + 1).start()
        self.nodes[node.node_id] = node
        return node

    def remove_broker(self, node_id: int) -> None:
        """Stop broker ``node_id`` and its sidecar and forget them (the controller keeps the
        broker registered, fenced, as after any broker failure)."""
        self.nodes.pop(node_id).stop()

    def stop(self, graceful: bool = True) -> None:
        """Every broker (controlled shutdowns, in parallel; ``graceful=False``: SIGKILL, for a
        cluster whose data is thrown away), every sidecar, the controller, the object store."""
        nodes = list(self.nodes.values())
        parallel([n.broker.stop if graceful else n.broker.kill for n in nodes if n.broker is not None])
        parallel([node.stop for node in nodes])  # the sidecars, their runtime directories
        if self.controller is not None:
            (self.controller.stop if graceful else self.controller.kill)()
        self.shared.stop()

    def __enter__(self) -> ClusterStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what tests and launchers look at ------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.bootstrap_servers for node in self.nodes.values())

    def sidecar_config_env(self) -> tuple[Path, dict[str, str]]:
        """The config file and environment of the sidecars (the first one's: they share the
        storage and the keys): what `rsm-sidecar inspect --config` needs."""
        return next(iter(self.nodes.values())).sidecar_config_env()

    def object_store(self):
        """An ObjectStore on the storage the sidecars share (for assertions)."""
        return next(iter(self.nodes.values())).object_store()


def parallel(calls: Iterable[Callable[[], object]]) -> None:
    """Run ``calls`` in threads, wait for all of them, raise the first failure (after all ended)."""
    errors: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        try:
            call()
        except BaseException as e:  # re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
