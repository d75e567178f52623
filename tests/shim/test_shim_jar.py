"""Checks of the shaded shim jar, java-shim/target/rsm-sidecar-shim.jar.

The broker loads the jar child-first (remote.log.storage.manager.class.path), so it must bring its
own gRPC/protobuf relocated out of the way and must not bring Kafka or SLF4J classes. The last tests
run the jar's connectivity check over a Unix domain socket against a Python gRPC server, which
proves the relocated service files and the renamed epoll native library work.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

ROOT = Path(__file__).resolve().parents[2]
JAR = ROOT / "java-shim" / "target" / "rsm-sidecar-shim.jar"
SHADED = "io/github/rsmsidecar/shaded/"
SHIM_CLASS = "io/github/rsmsidecar/shim/SidecarRemoteStorageManager.class"


@contextlib.contextmanager
def grpc_server_on_a_unix_socket(add_handlers: Callable[[grpc.Server], None], workers: int) -> Iterator[Path]:
    """A Python gRPC server (handlers added by ``add_handlers``) on a Unix socket in a fresh
    temporary directory; yields the socket path."""
    with tempfile.TemporaryDirectory(prefix="rsm-shim-") as tmp:
        sock = Path(tmp) / "rsm.sock"
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
        add_handlers(server)
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        try:
            yield sock
        finally:
            server.stop(grace=None)


@pytest.fixture(scope="module")
def jar() -> zipfile.ZipFile:
    if not JAR.is_file():
        pytest.fail(
            f"{JAR.relative_to(ROOT)} is missing: build it first with "
            "`cd java-shim && mvn -q -B package` (or `make shim`)",
            pytrace=False,
        )
    with zipfile.ZipFile(JAR) as z:
        yield z


@pytest.fixture(scope="module")
def names(jar: zipfile.ZipFile) -> list[str]:
    return jar.namelist()


def test_contains_the_shim_and_the_generated_stubs(names: list[str]) -> None:
    for required in (
        SHIM_CLASS,
        "io/github/rsmsidecar/shim/Diagnose.class",
        "io/github/rsmsidecar/proto/v1/RemoteStorageGrpc.class",
        "io/github/rsmsidecar/proto/v1/CopySegmentRequest.class",
    ):
        assert required in names, f"{required} is not in the jar"


def test_grpc_protobuf_guava_and_netty_are_relocated(names: list[str]) -> None:
    for required in (
        SHADED + "io/grpc/ManagedChannel.class",
        SHADED + "io/grpc/stub/ClientCalls.class",
        SHADED + "io/grpc/protobuf/ProtoUtils.class",
        SHADED + "com/google/protobuf/Message.class",
        SHADED + "com/google/common/util/concurrent/ListenableFuture.class",
        SHADED + "io/perfmark/PerfMark.class",
        SHADED + "io/grpc/netty/shaded/io/grpc/netty/NettyChannelBuilder.class",
        SHADED + "io/grpc/netty/shaded/io/netty/channel/epoll/EpollDomainSocketChannel.class",
    ):
        assert required in names, f"{required} is not in the jar"


@pytest.mark.parametrize(
    "prefix",
    [
        "org/apache/kafka/",  # provided by the broker; a copy breaks the RSM types (child-first)
        "org/slf4j/",  # provided by the broker; a copy cuts the shim off the broker's logging
        "io/grpc/",
        "com/google/",
        "io/perfmark/",
        "io/netty/",
        "META-INF/services/io.grpc.",
    ],
)
def test_nothing_unrelocated_or_provided(names: list[str], prefix: str) -> None:
    offending = [n for n in names if n.startswith(prefix) and not n.endswith("/")]
    assert not offending, f"{len(offending)} entries under {prefix}, e.g. {offending[:5]}"


def test_shim_bytecode_references_relocated_grpc_and_real_kafka(jar: zipfile.ZipFile) -> None:
    code = jar.read(SHIM_CLASS)
    assert b"org/apache/kafka/server/log/remote/storage/RemoteStorageManager" in code
    assert b"org/slf4j/Logger" in code, "slf4j must stay unrelocated (the broker provides it)"
    assert (SHADED + "io/grpc/").encode() in code
    for m in re.finditer(rb"(?<![/\w])(io/grpc/|com/google/)", code):
        raise AssertionError(
            f"unrelocated reference at byte {m.start()}: {code[m.start() : m.start() + 60]!r}"
        )


def test_service_files_are_relocated_and_resolvable(jar: zipfile.ZipFile, names: list[str]) -> None:
    services = [n for n in names if n.startswith("META-INF/services/") and not n.endswith("/")]
    grpc_services = [n for n in services if n.startswith("META-INF/services/" + SHADED.replace("/", "."))]
    kinds = {n.rsplit(".", 1)[-1] for n in grpc_services}
    assert {"ManagedChannelProvider", "NameResolverProvider"} <= kinds, services
    for service in grpc_services:
        for line in jar.read(service).decode().splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            assert line.startswith(SHADED.replace("/", ".")), f"{service}: unrelocated provider {line}"
            assert line.replace(".", "/") + ".class" in names, f"{service}: {line} is not in the jar"
    resolvers = jar.read(
        "META-INF/services/" + SHADED.replace("/", ".") + "io.grpc.NameResolverProvider"
    ).decode()
    assert "UdsNameResolverProvider" in resolvers, "unix:// targets need the UDS name resolver"


def test_epoll_native_library_matches_the_relocated_package(names: list[str]) -> None:
    lib = (
        "META-INF/native/"
        "libio_github_rsmsidecar_shaded_io_grpc_netty_shaded_netty_transport_native_epoll_x86_64.so"
    )
    assert lib in names, "netty finds its JNI library by the mangled relocated package name"
    stale = [n for n in names if n.startswith("META-INF/native/libio_grpc_")]
    assert not stale, stale


def test_boringssl_is_there_for_linux_only(jar: zipfile.ZipFile) -> None:
    """netty-tcnative's BoringSSL for the brokers' platforms (TLS to a sidecar over TCP), renamed
    for the relocated package as the epoll library is; no macOS or Windows libraries."""
    natives = {n for n in jar.namelist() if n.startswith("META-INF/native/") and "tcnative" in n}
    prefix = "META-INF/native/libio_github_rsmsidecar_shaded_io_grpc_netty_shaded_netty_tcnative_"
    assert natives == {prefix + "linux_x86_64.so", prefix + "linux_aarch_64.so"}


def test_jar_size_is_reasonable(jar: zipfile.ZipFile) -> None:
    size = JAR.stat().st_size
    assert 1_000_000 < size < 25_000_000, f"{size} bytes"


# ---- run the jar ------------------------------------------------------------------------------


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        pytest.fail("java is not on PATH (Java 17 is needed to build and run the shim)", pytrace=False)
    return java


@pytest.fixture()
def uds_sidecar():
    """A Python gRPC server on a Unix socket that answers FetchIndex with NOT_FOUND."""
    seen: list[bytes] = []

    def fetch_index(request: bytes, context: grpc.ServicerContext):
        seen.append(request)
        context.abort(grpc.StatusCode.NOT_FOUND, "no such segment (pytest sidecar)")
        yield b""  # pragma: no cover (abort raises)

    handler = grpc.method_handlers_generic_handler(
        "rsm.v1.RemoteStorage", {"FetchIndex": grpc.unary_stream_rpc_method_handler(fetch_index)}
    )
    with grpc_server_on_a_unix_socket(lambda server: server.add_generic_rpc_handlers((handler,)), 2) as sock:
        yield sock, seen


def test_connectivity_check_over_a_unix_socket(jar: zipfile.ZipFile, uds_sidecar) -> None:
    sock, seen = uds_sidecar
    run = subprocess.run(
        [_java(), "-jar", str(JAR), f"unix://{sock}"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ended with NOT_FOUND: no such segment (pytest sidecar)" in run.stdout, run.stdout + run.stderr
    assert len(seen) == 1 and b"rsm-sidecar-shim-diagnose" in seen[0]
    # this pytest sidecar is gRPC alone: an older sidecar, without the fetch channel
    assert "fetch channel: not offered" in run.stdout and "fetches go over gRPC" in run.stdout, run.stdout


def test_connectivity_check_finds_the_fetch_channel_of_a_real_sidecar(
    jar: zipfile.ZipFile, tmp_path: Path
) -> None:
    from rsm_sidecar.config import Config
    from rsm_sidecar.service.server import SidecarServer

    sock = tmp_path / "s" / "rsm.sock"
    cfg = Config(
        {
            "server": {"listen": f"unix://{sock}", "shutdown_grace_seconds": 1},
            "metrics": {"listen": ""},
            "storage": {"local": {"root": str(tmp_path / "remote"), "fsync": False}},
        },
        environ={},
    )
    server = SidecarServer(cfg)
    server.start()
    try:
        run = subprocess.run(
            [_java(), "-jar", str(JAR), f"unix://{sock}"], capture_output=True, text=True, timeout=120
        )
    finally:
        server.stop(grace=0)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ended with NOT_FOUND" in run.stdout, run.stdout + run.stderr
    assert f"fetch channel: ready (unix://{sock})" in run.stdout, run.stdout + run.stderr


def test_connectivity_check_reports_an_absent_sidecar(jar: zipfile.ZipFile, tmp_path: Path) -> None:
    run = subprocess.run(
        [_java(), "-jar", str(JAR), f"unix://{tmp_path}/none.sock"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "ended with UNAVAILABLE" in run.stdout, run.stdout + run.stderr


def test_connectivity_check_rejects_a_bad_key(jar: zipfile.ZipFile) -> None:
    run = subprocess.run(
        [_java(), "-jar", str(JAR), "127.0.0.1:9095", "transfer.mode=fast"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 64, run.stdout + run.stderr
    assert "rsm.config.transfer.mode" in run.stderr


# ---- load it like a broker -----------------------------------------------------------------------


def broker_api_jars() -> list[Path]:
    """The jars a broker provides to the plugin (kafka-clients, kafka-storage-api, slf4j-api),
    taken from the real broker distribution the end-to-end tests run (`make kafka-jars`)."""
    from devstack.kafka import KafkaDistribution

    lib = KafkaDistribution.ensure().lib_dir
    jars = []
    for name in ("kafka-clients", "kafka-storage-api", "slf4j-api"):
        found = sorted(p for p in lib.glob(f"{name}-*.jar") if p.name[len(name) + 1].isdigit())
        assert found, f"{name} is missing from {lib}"
        jars.append(found[0])
    return jars


def broker_class_path(work: Path) -> list[Path]:
    """:func:`broker_api_jars` and the classes of BrokerPlugin.java, which the programs run
    below share (Java 17's source launcher runs one file: what they share is compiled first)."""
    jars = broker_api_jars()
    javac = shutil.which("javac")
    if javac is None:
        pytest.fail("javac is not on PATH (a JDK 17 is needed to build and run the shim)", pytrace=False)
    classes = work / "broker-plugin-classes"
    source = Path(__file__).with_name("BrokerPlugin.java")
    run = subprocess.run(
        [javac, "-d", str(classes), "-cp", ":".join(map(str, jars)), str(source)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return [*jars, classes]


@pytest.fixture()
def proto_sidecar():
    """A small in-memory sidecar over a Unix socket, from the project's generated rsm.v1 stubs."""
    from rsm_sidecar._proto.rsm.v1 import rsm_pb2, rsm_pb2_grpc

    calls: dict[str, list] = {"copy": [], "fetch": [], "index": [], "delete": []}
    store: dict[str, bytes] = {}

    class Servicer(rsm_pb2_grpc.RemoteStorageServicer):
        def CopySegment(self, request_iterator, context):
            messages = list(request_iterator)
            calls["copy"].append(messages)
            begin = messages[0].begin
            log = b"".join(m.data.data for m in messages[1:] if m.data.file == rsm_pb2.LOG)
            store[begin.metadata.segment_id] = log
            return rsm_pb2.CopySegmentResponse(custom_metadata=b"\x01\x02", stored_bytes=len(log))

        def FetchSegment(self, request, context):
            calls["fetch"].append(request)
            data = store.get(request.metadata.segment_id)
            if data is None:
                context.abort(grpc.StatusCode.NOT_FOUND, "no such segment")
            yield rsm_pb2.FetchSegmentResponse(data=data[request.start_position :])

        def FetchIndex(self, request, context):
            calls["index"].append(request)
            context.abort(grpc.StatusCode.NOT_FOUND, "segment has no transaction index")
            yield  # pragma: no cover

        def DeleteSegment(self, request, context):
            calls["delete"].append(request)
            store.pop(request.metadata.segment_id, None)
            return rsm_pb2.DeleteSegmentResponse()

    def add(server: grpc.Server) -> None:
        rsm_pb2_grpc.add_RemoteStorageServicer_to_server(Servicer(), server)

    with grpc_server_on_a_unix_socket(add, 4) as sock:
        yield sock, calls


def test_broker_style_loading_drives_every_call(jar: zipfile.ZipFile, proto_sidecar, tmp_path: Path) -> None:
    provided = broker_class_path(tmp_path)
    sock, calls = proto_sidecar
    smoke = Path(__file__).with_name("BrokerLoadSmoke.java")
    run = subprocess.run(
        [_java(), "-cp", ":".join(map(str, provided)), str(smoke), str(JAR), f"unix://{sock}", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert "OK configure" in lines
    assert "OK copy custom=2" in lines
    assert "OK fetch bytes=2900" in lines
    assert any(
        line.startswith("OK fetchIndex RemoteResourceNotFoundException") and "no transaction index" in line
        for line in lines
    ), run.stdout
    assert "OK delete" in lines and "OK close" in lines
    (copy,) = calls["copy"]
    assert copy[0].WhichOneof("kind") == "begin"
    assert copy[0].begin.files.log_size == 3000
    assert [m.data.file for m in copy[1:]] == [
        1,
        2,
        3,
        5,
    ]  # LOG, OFFSET_INDEX, TIME_INDEX, PRODUCER_SNAPSHOT_FILE
    assert calls["fetch"][0].start_position == 100 and not calls["fetch"][0].HasField("end_position")
    assert calls["index"][0].index_type == 4  # TRANSACTION
    assert len(calls["delete"]) == 1


# ---- a sidecar outage over a Unix socket ---------------------------------------------------------

OUTAGE_SECONDS = 8  # grpc's reconnect backoff (1 s, x1.6, jitter) gives 4 or more connection attempts


def test_unix_socket_outage_fails_unavailable_without_netty_warnings_then_recovers(
    jar: zipfile.ZipFile, tmp_path: Path
) -> None:
    """The shim calls a Unix socket path where no sidecar listens, for OUTAGE_SECONDS, alternately
    over its fetch channel (an index) and gRPC (a delete): every call fails UNAVAILABLE, the first
    one's message says there is no socket file, and the log (netty and grpc-java made to log
    through java.util.logging, every record printed) has no `Unknown channel option
    'SO_KEEPALIVE'` warning, one of which used to come with every connection attempt. Then a real
    `rsm-sidecar serve` starts on the path and the same shim, once both its channel and gRPC
    answer, copies and fetches a segment through it."""
    from devstack.sidecar import SidecarProcess

    provided = broker_class_path(tmp_path)
    program = Path(__file__).with_name("UnixSocketOutage.java")
    with tempfile.TemporaryDirectory(prefix="rsm-shim-") as short:  # a socket path has at most 107 bytes
        sock = Path(short) / "rsm.sock"
        config = tmp_path / "sidecar.toml"
        config.write_text(
            f'[server]\nlisten = "unix://{sock}"\n[metrics]\nlisten = ""\n'
            f'[storage.local]\nroot = "{tmp_path / "remote"}"\n[segment]\ncompression_heuristic = false\n'
        )
        sidecar = SidecarProcess(config, tmp_path / "sidecar", {}, f"unix://{sock}")
        shim = subprocess.Popen(
            [
                _java(),
                "-cp",
                ":".join(map(str, provided)),
                str(program),
                str(JAR),
                str(sock),
                str(tmp_path),
                str(OUTAGE_SECONDS),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        output: list[str] = []
        try:
            for line in shim.stdout:
                output.append(line.rstrip("\n"))
                if line.startswith("WAITING"):
                    break
            assert output and output[-1] == "WAITING", "\n".join(output)
            sidecar.start()
            shim.stdin.write("go\n")
            shim.stdin.flush()
            output.extend(line.rstrip("\n") for line in shim.stdout)
            assert shim.wait(timeout=120) == 0, "\n".join(output)
        finally:
            if shim.poll() is None:
                shim.kill()
                shim.wait(10)
            sidecar.stop()
    text = "\n".join(output)

    outage = next(line for line in output if line.startswith("OUTAGE "))
    calls, unavailable = (int(v.split("=")[1]) for v in outage.split()[1:])
    assert calls >= 10 and unavailable == calls, text
    first = next(line for line in output if line.startswith("FIRST "))
    # Names the call, the segment and the cause (no socket file).
    assert "fetchIndex(outage-0 segment" in first and "UNAVAILABLE" in first, first
    assert "no socket file at" in first, first

    # grpc-java's channel trace (FINER): one "Started transport" per connection attempt.
    before_sidecar = output[: output.index("WAITING")]
    attempts = [
        line
        for line in before_sidecar
        if line.startswith("LOG ") and "Started transport NettyClientTransport" in line
    ]
    assert len(attempts) >= 3, f"only {len(attempts)} connection attempts during the outage\n{text}"

    keepalive = [line for line in output if "SO_KEEPALIVE" in line]
    assert not keepalive, f"{len(keepalive)} SO_KEEPALIVE lines, e.g. {keepalive[0]}\n{text}"
    # The capture is real: netty's own records (debug ones included) reached the handler.
    assert any(line.startswith("LOG ") and ".shaded.io.netty." in line for line in output), text

    assert any(line.startswith("RECOVERED ") for line in output), text
    assert "OK copy" in output and "OK fetch equal=true" in output, text


# ---- the sidecar's address vanishes under an open TCP connection ---------------------------------


def test_a_vanished_sidecar_address_fails_over_in_seconds(jar: zipfile.ZipFile, tmp_path: Path) -> None:
    """A real `rsm-sidecar serve` over TCP and the shim as a broker loads it, in a network
    namespace of their own (tests/shim/vanished_address.py, VanishedAddress.java), where the
    packets of the shim's connection are dropped, both ways, as when the sidecar's pod is
    replaced and its old address answers nothing, not even a reset. With
    keepalive.timeout.ms=2000 and connect.timeout.ms=2000 (the calls' own timeouts are 12 s):
    a fetch stream being read fails within seconds (the shim's unacknowledged flow-control
    updates: TCP_USER_TIMEOUT), and the next fetch reads the whole segment over a new
    connection; a fetch made on a connection that died while idle is retried on a new one; a
    connection attempt nobody answers fails after the connect timeout. Before these settings the
    stream waited for fetch.read.timeout.ms, the idle connection's call for its deadline, and the
    connection attempt for netty's 30 s."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail("`unshare` (util-linux) is needed for a network namespace", pytrace=False)
    work = tmp_path / "vanished"
    work.mkdir()
    run = subprocess.run(
        [
            unshare,
            "--user",
            "--map-root-user",
            "--net",
            sys.executable,
            "-m",
            "tests.shim.vanished_address",
            str(JAR),
            str(work),
            *map(str, broker_class_path(tmp_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    text = run.stdout + run.stderr
    assert run.returncode == 0, text
    results = json.loads(run.stdout.strip().splitlines()[-1])
    assert results["exit"] == "0", text
    print(json.dumps(results, indent=1))  # docs/shim.md's figures (pytest -s)

    def ms(word: str) -> int:
        return int(re.search(r"ms=(\d+)", results[word]).group(1))

    # the stream read when its connection died: IOException within about keepalive.timeout.ms
    assert "UNAVAILABLE" in results["INFLIGHT"], text
    assert ms("INFLIGHT") < 6000, text
    # then a new connection: the whole segment, at once
    assert "equal=true" in results["FRESH"] and ms("FRESH") < 3000, text
    # a call on a connection that died idle: retried on a new one after keepalive.timeout.ms
    assert "equal=true" in results["DEADCONN"] and ms("DEADCONN") < 6000, text
    # a connection attempt to an address nobody answers: connect.timeout.ms
    assert "UNAVAILABLE" in results["CONNECT"] and 1500 <= ms("CONNECT") < 6000, text
