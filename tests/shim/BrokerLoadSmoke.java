// Loads the shaded shim jar the way a broker does with remote.log.storage.manager.class.path: in
// Kafka's own ChildFirstClassLoader (child-first for every class, Kafka's and SLF4J's included),
// with Kafka (kafka-clients, kafka-storage-api) and slf4j-api on the parent class path, and the
// thread context class loader set to the plugin loader around calls (as
// ClassLoaderAwareRemoteStorageManager does). Then drives every RSM method against a
// sidecar. Run by tests/shim/test_shim_jar.py:
//   java -cp <kafka-clients>:<kafka-storage-api>:<slf4j-api>:<BrokerPlugin classes> BrokerLoadSmoke.java <shim jar> <target> <dir>
// Prints one "OK <step> ..." line per step; any failure is an exception (exit 1).

import java.io.InputStream;
import java.net.URLClassLoader;
import java.nio.file.Path;
import java.util.Map;
import java.util.Optional;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;

public class BrokerLoadSmoke {
    public static void main(String[] args) throws Exception {
        Path jar = Path.of(args[0]);
        String target = args[1];
        Path dir = Path.of(args[2]);
        try (URLClassLoader plugin = BrokerPlugin.childFirstClassLoader(jar)) {
            RemoteStorageManager rsm = BrokerPlugin.newShim(plugin);
            if (rsm.getClass().getClassLoader() != plugin) {
                throw new AssertionError("the shim came from " + rsm.getClass().getClassLoader());
            }
            Thread.currentThread().setContextClassLoader(plugin);
            rsm.configure(Map.of("sidecar.target", target, "broker.id", 1, "retry.max.attempts", "1"));
            System.out.println("OK configure");

            RemoteLogSegmentMetadata md = BrokerPlugin.segment("smoke", 3000);
            LogSegmentData data = BrokerPlugin.segmentFiles(dir, new byte[3000]);
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
