// The sidecar's address vanishing under the shim's open TCP connection (its pod replaced, its
// node lost): packets to the old connection go nowhere, not even a reset comes back. Run by
// tests/shim/vanished_address.py inside a network namespace of its own, where the test drops
// the connection's packets with iptables when this program says so:
//   java -cp <kafka-clients>:<kafka-storage-api>:<slf4j-api>:<BrokerPlugin classes> VanishedAddress.java <shim jar> <host:port> <dir>
// The shim is loaded in Kafka's ChildFirstClassLoader (BrokerPlugin.java: as a broker loads it) and reaches a real
// `rsm-sidecar serve` over TCP. Protocol on stdout, one line each; after a line ending in "?" the
// program waits for one line on stdin (the test has changed the firewall by then):
//   "READY?"                  the test answers once the sidecar serves
//   "COPIED bytes=<n>"
//   "BLACKHOLE READING?"      a fetch stream is open and partly read: drop its connection
//   "INFLIGHT ms=<n> error=<message>"      how long until the stream's read() failed
//   "FRESH ms=<n> equal=<true|false>"      a new fetch of the whole segment right after
//   "BLACKHOLE IDLE?"         no call is open: drop the connection the fetch above used
//   "DEADCONN ms=<n> equal=<true|false>"   a fetch on the dead connection, retried on a new one
//   "BLACKHOLE CONNECT?"      drop every new connection to the sidecar (SYNs)
//   "CONNECT ms=<n> error=<message>"       a call of a new shim (one attempt) that cannot connect
// The timeouts of the calls are 12 s, so that without a bound on dead connections each phase
// ends there instead of after netty's or TCP's own timeouts.

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.net.URLClassLoader;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.Random;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;

public class VanishedAddress {
    static final int SEGMENT_BYTES = 4 * 1024 * 1024;
    static final BufferedReader STDIN = new BufferedReader(new InputStreamReader(System.in));

    static void ask(String question) throws IOException {
        System.out.println(question);
        System.out.flush();
        if (STDIN.readLine() == null) {
            throw new AssertionError("stdin closed");
        }
    }

    static void say(String line) {
        System.out.println(line.replace('\n', ' '));
        System.out.flush();
    }

    static long millisSince(long t0) {
        return (System.nanoTime() - t0) / 1_000_000;
    }

    /** Fetches the whole segment and says "{@code word} ms=<n> equal=<true|false>[ error=<message>]". */
    static void fetchWhole(String word, RemoteStorageManager rsm, RemoteLogSegmentMetadata md, byte[] bytes) {
        long t0 = System.nanoTime();
        try (InputStream in = rsm.fetchLogSegment(md, 0)) {
            boolean equal = Arrays.equals(bytes, in.readAllBytes());
            say(word + " ms=" + millisSince(t0) + " equal=" + equal);
        } catch (RemoteStorageException | IOException e) {
            say(word + " ms=" + millisSince(t0) + " equal=false error=" + e.getMessage());
        }
    }

    static RemoteStorageManager shim(ClassLoader plugin, String target, Map<String, String> extra) throws Exception {
        RemoteStorageManager rsm = BrokerPlugin.newShim(plugin);
        Map<String, Object> config = new HashMap<>(Map.of(
                "sidecar.target", target, "broker.id", 1, "transfer.mode", "stream",
                "keepalive.time.ms", "1000", "keepalive.timeout.ms", "2000", "connect.timeout.ms", "2000",
                "fetch.deadline.ms", "12000", "fetch.read.timeout.ms", "12000", "fetch.index.deadline.ms", "12000",
                // one call per fetch: the stream read when the connection dies is the one the test looks at
                "fetch.window.bytes", "0"));
        config.put("fetch.readahead.bytes", "0");
        config.putAll(extra);
        rsm.configure(config);
        return rsm;
    }

    public static void main(String[] args) throws Exception {
        Path jar = Path.of(args[0]);
        String target = args[1];
        Path dir = Path.of(args[2]);

        try (URLClassLoader plugin = BrokerPlugin.childFirstClassLoader(jar)) {
            Thread.currentThread().setContextClassLoader(plugin);
            ask("READY?"); // the sidecar starts while this JVM does
            RemoteStorageManager rsm = shim(plugin, target, Map.of());

            byte[] bytes = new byte[SEGMENT_BYTES];
            new Random(30).nextBytes(bytes);
            RemoteLogSegmentMetadata md = BrokerPlugin.segment("vanished", bytes.length);
            rsm.copyLogSegmentData(md, BrokerPlugin.segmentFiles(dir, bytes));
            say("COPIED bytes=" + bytes.length);

            // 1. A fetch stream read when its connection dies.
            try (InputStream in = rsm.fetchLogSegment(md, 0)) {
                in.readNBytes(64 * 1024);
                ask("BLACKHOLE READING?");
                long t0 = System.nanoTime();
                try {
                    while (in.read(new byte[64 * 1024]) >= 0) {
                        // what was under way arrives; then the stream has to fail
                    }
                    say("INFLIGHT ms=" + millisSince(t0) + " error=none: the stream ended cleanly");
                } catch (IOException e) {
                    say("INFLIGHT ms=" + millisSince(t0) + " error=" + e.getMessage());
                }
            }
            fetchWhole("FRESH", rsm, md, bytes);

            // 2. A call made on a connection that died while no call was open.
            ask("BLACKHOLE IDLE?");
            fetchWhole("DEADCONN", rsm, md, bytes);
            rsm.close();

            // 3. A new connection to an address nobody answers.
            ask("BLACKHOLE CONNECT?");
            // one attempt: the time of one connection attempt (reads would otherwise wait for a sidecar
            // that went away, retry.fetch.max.ms)
            RemoteStorageManager fresh = shim(plugin, target, Map.of("retry.max.attempts", "1", "retry.fetch.max.ms", "0"));
            long t3 = System.nanoTime();
            try {
                fresh.fetchIndex(md, RemoteStorageManager.IndexType.OFFSET);
                say("CONNECT ms=" + millisSince(t3) + " error=none: the call succeeded");
            } catch (RemoteStorageException e) {
                say("CONNECT ms=" + millisSince(t3) + " error=" + e.getMessage());
            }
            fresh.close();
        }
    }
}
