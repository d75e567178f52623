// Loads the shaded shim jar the way a broker does with remote.log.storage.manager.class.path: in
// Kafka's own ChildFirstClassLoader (child-first for every class, Kafka's and SLF4J's included),
// with Kafka (kafka-clients, kafka-storage-api) and slf4j-api on the parent class path, and the
// thread context class loader set to the plugin loader around calls (as
// ClassLoaderAwareRemoteStorageManager does). Then drives every RSM method against a
// sidecar. Run by tests/shim/test_shim_jar.py:
//   java -cp <kafka-clients>:<kafka-storage-api>:<slf4j-api> BrokerLoadSmoke.java <shim jar> <target> <dir>
// Prints one "OK <step> ..." line per step; any failure is an exception (exit 1).

import java.io.InputStream;
import java.net.URLClassLoader;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.Optional;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;

public class BrokerLoadSmoke {
    /** Kafka's ChildFirstClassLoader: in common.utils up to 4.3, in common.utils.internals from 4.4. */
    static URLClassLoader childFirstClassLoader(String classPath, ClassLoader parent) throws Exception {
        Class<?> c;
        try {
            c = Class.forName("org.apache.kafka.common.utils.internals.ChildFirstClassLoader");
        } catch (ClassNotFoundException e) {
            c = Class.forName("org.apache.kafka.common.utils.ChildFirstClassLoader");
        }
        return (URLClassLoader) c.getConstructor(String.class, ClassLoader.class).newInstance(classPath, parent);
    }

    public static void main(String[] args) throws Exception {
        Path jar = Path.of(args[0]);
        String target = args[1];
        Path dir = Path.of(args[2]);
        ClassLoader parent = RemoteStorageManager.class.getClassLoader();
        try (URLClassLoader plugin = childFirstClassLoader(jar.toString(), parent)) {
            Class<?> c = Class.forName("io.github.rsmsidecar.shim.SidecarRemoteStorageManager", true, plugin);
            if (c.getClassLoader() != plugin) {
                throw new AssertionError("the shim came from " + c.getClassLoader());
            }
            // Fails with ClassCastException if the jar bundled its own Kafka API classes.
            RemoteStorageManager rsm = (RemoteStorageManager) c.getConstructor().newInstance();
            Thread.currentThread().setContextClassLoader(plugin);
            rsm.configure(Map.of("sidecar.target", target, "broker.id", 1, "retry.max.attempts", "1"));
            System.out.println("OK configure");

            TopicIdPartition tip = new TopicIdPartition(Uuid.randomUuid(), new TopicPartition("smoke", 0));
            RemoteLogSegmentMetadata md = new RemoteLogSegmentMetadata(new RemoteLogSegmentId(tip, Uuid.randomUuid()),
                    0L, 9L, 1L, 1, 2L, 3000, Map.of(0, 0L));
            Path log = Files.write(dir.resolve("0.log"), new byte[3000]);
            Path idx = Files.write(dir.resolve("0.index"), new byte[16]);
            Path time = Files.write(dir.resolve("0.timeindex"), new byte[12]);
            Path snap = Files.write(dir.resolve("10.snapshot"), new byte[8]);
            LogSegmentData data = new LogSegmentData(log, idx, time, Optional.empty(), snap,
                    ByteBuffer.wrap("0\n1\n0 0\n".getBytes()));
            Optional<RemoteLogSegmentMetadata.CustomMetadata> custom = rsm.copyLogSegmentData(md, data);
            System.out.println("OK copy custom=" + custom.map(m -> m.value().length).orElse(-1));

            try (InputStream in = rsm.fetchLogSegment(md, 100)) {
                System.out.println("OK fetch bytes=" + in.readAllBytes().length);
            }
            try {
                rsm.fetchIndex(md, RemoteStorageManager.IndexType.TRANSACTION);
                throw new AssertionError("a missing transaction index must throw");
            } catch (RemoteResourceNotFoundException e) {
                System.out.println("OK fetchIndex RemoteResourceNotFoundException " + e.getMessage());
            }
            rsm.deleteLogSegmentData(md);
            System.out.println("OK delete");
            rsm.close();
            System.out.println("OK close");
        }
    }
}
