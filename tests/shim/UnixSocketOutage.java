// A sidecar outage seen from the broker side over a Unix socket: the shaded shim jar, loaded in
// Kafka's ChildFirstClassLoader (BrokerPlugin.java, as BrokerLoadSmoke.java does), calls a socket path where nothing
// listens for a few seconds, so its gRPC channel goes through several reconnect attempts; then it
// waits for the test to start a real sidecar on that path and copies and fetches a segment. Run by
// tests/shim/test_shim_jar.py:
//   java -cp <kafka-clients>:<kafka-storage-api>:<slf4j-api>:<BrokerPlugin classes> UnixSocketOutage.java <shim jar> <socket> <dir> <outage seconds>
// Netty (inside the jar) is made to log through java.util.logging, and every record any logger
// publishes is printed as one "LOG <level> <logger> <message>" line, so the test sees exactly what
// a broker's log would get. Other lines:
//   "OUTAGE calls=<n> unavailable=<n>" then "FIRST <message of the first failure>",
//   "WAITING" (the test then starts the sidecar and writes one line to stdin),
//   "RECOVERED after=<failed calls before the first success>", "OK copy", "OK fetch equal=<true|false>".

import java.io.BufferedReader;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.net.URLClassLoader;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Map;
import java.util.Random;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogManager;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import java.util.logging.SimpleFormatter;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;

public class UnixSocketOutage {
    private static final String NETTY_LOGGING =
            "io.github.rsmsidecar.shaded.io.grpc.netty.shaded.io.netty.util.internal.logging.";

    public static void main(String[] args) throws Exception {
        Path jar = Path.of(args[0]);
        Path socket = Path.of(args[1]);
        Path dir = Path.of(args[2]);
        long outageMillis = Long.parseLong(args[3]) * 1000;

        // Every record of every logger, whatever its level, printed once on stdout.
        LogManager.getLogManager().reset();
        Logger root = Logger.getLogger("");
        root.setLevel(Level.ALL);
        SimpleFormatter format = new SimpleFormatter();
        root.addHandler(new Handler() {
            @Override
            public void publish(LogRecord r) {
                String message = format.formatMessage(r).replace('\n', ' ');
                synchronized (System.out) {
                    System.out.println("LOG " + r.getLevel() + " " + r.getLoggerName() + " " + message);
                }
            }

            @Override
            public void flush() {
                System.out.flush();
            }

            @Override
            public void close() {
            }
        });

        try (URLClassLoader plugin = BrokerPlugin.childFirstClassLoader(jar)) {
            // Netty picks SLF4J when a binding is present (a broker has one); here it must log
            // through java.util.logging, whatever the class path holds, so nothing escapes the handler.
            Class<?> factory = Class.forName(NETTY_LOGGING + "InternalLoggerFactory", true, plugin);
            Object jdk = Class.forName(NETTY_LOGGING + "JdkLoggerFactory", true, plugin).getField("INSTANCE").get(null);
            factory.getMethod("setDefaultFactory", factory).invoke(null, jdk);

            RemoteStorageManager rsm = BrokerPlugin.newShim(plugin);
            Thread.currentThread().setContextClassLoader(plugin);
            rsm.configure(Map.of("sidecar.target", "unix://" + socket, "broker.id", 1, "retry.max.attempts", "1",
                    "retry.fetch.max.ms", "0",
                    "fetch.index.deadline.ms", "2000", "copy.deadline.ms", "30000", "fetch.deadline.ms", "30000"));

            RemoteLogSegmentMetadata md = BrokerPlugin.segment("outage", 3000);

            // The outage: what the broker's remote log manager does, one call after another.
            int calls = 0;
            int unavailable = 0;
            String first = null;
            long end = System.nanoTime() + outageMillis * 1_000_000;
            while (System.nanoTime() < end) {
                calls++;
                try {
                    // alternately over the fetch channel (index) and gRPC (delete: netty's connection attempts)
                    if (calls % 2 == 1) {
                        rsm.fetchIndex(md, RemoteStorageManager.IndexType.TRANSACTION);
                    } else {
                        rsm.deleteLogSegmentData(md);
                    }
                    throw new AssertionError("a call succeeded while nothing listens on " + socket);
                } catch (RemoteResourceNotFoundException e) {
                    throw new AssertionError("NOT_FOUND while nothing listens on " + socket, e);
                } catch (RemoteStorageException e) {
                    if (first == null) {
                        first = e.getMessage();
                    }
                    if (e.getMessage().contains("UNAVAILABLE")) {
                        unavailable++;
                    }
                }
                Thread.sleep(200);
            }
            System.out.println("OUTAGE calls=" + calls + " unavailable=" + unavailable);
            System.out.println("FIRST " + String.valueOf(first).replace('\n', ' '));
            System.out.println("WAITING");
            System.out.flush();
            if (new BufferedReader(new InputStreamReader(System.in)).readLine() == null) {
                throw new AssertionError("stdin closed before the sidecar started");
            }

            // The sidecar is back: the same channel must reach it (within its reconnect backoff).
            int failedAfter = 0;
            long deadline = System.nanoTime() + 60_000_000_000L;
            while (true) {
                try {
                    rsm.fetchIndex(md, RemoteStorageManager.IndexType.TRANSACTION);
                    throw new AssertionError("a transaction index of a segment never copied was found");
                } catch (RemoteResourceNotFoundException e) {
                    break; // the sidecar answered
                } catch (RemoteStorageException e) {
                    if (System.nanoTime() > deadline) {
                        throw new AssertionError("still failing 60 s after the sidecar started", e);
                    }
                    failedAfter++;
                    Thread.sleep(200);
                }
            }
            // ... and the gRPC channel too (copies and deletes), once its reconnect backoff has passed
            while (true) {
                try {
                    rsm.deleteLogSegmentData(md); // nothing stored: succeeds once the sidecar answers
                    break;
                } catch (RemoteStorageException e) {
                    if (System.nanoTime() > deadline) {
                        throw new AssertionError("gRPC still failing 60 s after the sidecar started", e);
                    }
                    failedAfter++;
                    Thread.sleep(200);
                }
            }
            System.out.println("RECOVERED after=" + failedAfter);

            byte[] bytes = new byte[3000];
            new Random(42).nextBytes(bytes);
            rsm.copyLogSegmentData(md, BrokerPlugin.segmentFiles(dir, bytes));
            System.out.println("OK copy");
            try (InputStream in = rsm.fetchLogSegment(md, 0)) {
                System.out.println("OK fetch equal=" + Arrays.equals(bytes, in.readAllBytes()));
            }
            rsm.close();
        }
    }
}
