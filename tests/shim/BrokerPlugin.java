// What the programs beside it (BrokerLoadSmoke.java, UnixSocketOutage.java, VanishedAddress.java)
// share: the shaded shim jar loaded as a broker loads it with remote.log.storage.manager.class.path,
// and a segment's files written the way the broker hands them over. Java 17's source launcher
// runs one file, so tests/shim/test_shim_jar.py compiles this class first and puts it on the
// class path of each program.

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
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;

public final class BrokerPlugin {
    private BrokerPlugin() {
    }

    /**
     * The shim jar in Kafka's own ChildFirstClassLoader (child-first for every class, Kafka's and
     * SLF4J's included), with the Kafka API this program runs with as its parent: the class loader
     * a broker makes for the plugin. The class is in common.utils up to 4.3, in
     * common.utils.internals from 4.4.
     */
    public static URLClassLoader childFirstClassLoader(Path jar) throws Exception {
        Class<?> c;
        try {
            c = Class.forName("org.apache.kafka.common.utils.internals.ChildFirstClassLoader");
        } catch (ClassNotFoundException e) {
            c = Class.forName("org.apache.kafka.common.utils.ChildFirstClassLoader");
        }
        ClassLoader parent = RemoteStorageManager.class.getClassLoader();
        return (URLClassLoader) c.getConstructor(String.class, ClassLoader.class)
                .newInstance(jar.toString(), parent);
    }

    /**
     * A new, unconfigured SidecarRemoteStorageManager out of {@code plugin}. Fails with
     * ClassCastException if the jar bundled its own Kafka API classes.
     */
    public static RemoteStorageManager newShim(ClassLoader plugin) throws Exception {
        Class<?> c = Class.forName("io.github.rsmsidecar.shim.SidecarRemoteStorageManager", true, plugin);
        return (RemoteStorageManager) c.getConstructor().newInstance();
    }

    /** The metadata of a new segment of partition {@code topic}-0: offsets 0-9, {@code size} bytes. */
    public static RemoteLogSegmentMetadata segment(String topic, int size) {
        TopicIdPartition tip = new TopicIdPartition(Uuid.randomUuid(), new TopicPartition(topic, 0));
        return new RemoteLogSegmentMetadata(new RemoteLogSegmentId(tip, Uuid.randomUuid()),
                0L, 9L, 1L, 1, 2L, size, Map.of(0, 0L));
    }

    /**
     * The files of a segment whose log is {@code log}, written into {@code dir} (offset index 16
     * bytes, time index 12, producer snapshot 8, no transaction index), as the broker hands them to
     * copyLogSegmentData.
     */
    public static LogSegmentData segmentFiles(Path dir, byte[] log) throws Exception {
        Path logFile = Files.write(dir.resolve("0.log"), log);
        Path idx = Files.write(dir.resolve("0.index"), new byte[16]);
        Path time = Files.write(dir.resolve("0.timeindex"), new byte[12]);
        Path snap = Files.write(dir.resolve("10.snapshot"), new byte[8]);
        return new LogSegmentData(logFile, idx, time, Optional.empty(), snap,
                ByteBuffer.wrap("0\n1\n0 0\n".getBytes()));
    }
}
