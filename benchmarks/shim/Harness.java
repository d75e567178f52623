// Drives the real shim (io.github.rsmsidecar.shim.SidecarRemoteStorageManager) for benchmarks/shim.py.
// Run with Java's single-file source launcher:
//
//   java -cp <rsm-sidecar-shim.jar>:<kafka-clients.jar>:<kafka-storage-api.jar>:<slf4j-api.jar> \
//        benchmarks/shim/Harness.java <sidecar target>
//
// It creates one shim per transfer mode (path, stream), configured as a broker would (raw strings,
// plus broker.id), then reads one command per line on stdin and answers each with one line
// "RESULT {json}" on stdout (anything else on stdout/stderr is logging). Commands:
//
//   copy <path|stream> <dir> <base offset> <end offset>   copyLogSegmentData of <dir>/<base>.log (+ .index,
//                                                         .timeindex, .snapshot, .txnindex if present);
//                                                         answers the new segment id and the time taken
//   fetch <segment id> <start> <bytes> [<verify file>]    fetchLogSegment(md, start), read <bytes> as the
//                                                         broker does (Utils.readFully-like loop), close;
//                                                         time to first byte and to the last byte
//   local <file> <start> <bytes>                          the same read loop on a FileInputStream at <start>
//   index <segment id> <OFFSET|TIMESTAMP|TRANSACTION|...> fetchIndex + read all + close
//   delete <segment id>                                   deleteLogSegmentData
//   ping                                                  fetchIndex(TRANSACTION) of an unknown segment: a
//                                                         round trip that touches no manifest (expects NOT_FOUND)
//   readfile <file>                                       read a whole file with 1 MiB reads
//   copyfile <src> <dst>                                  plain file copy with 1 MiB reads + fsync
//   quit
//
// Times are System.nanoTime() differences in seconds. A failed command answers {"error": "..."}.

import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Optional;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;

public class Harness {
    static final int MiB = 1024 * 1024;
    static final TopicIdPartition TIP = new TopicIdPartition(Uuid.randomUuid(), new TopicPartition("bench", 0));
    /** Segment id -> the metadata the broker would pass on fetch (state COPY_SEGMENT_FINISHED + custom metadata). */
    static final Map<String, RemoteLogSegmentMetadata> SEGMENTS = new HashMap<>();
    static final Map<String, RemoteStorageManager> SHIMS = new HashMap<>();
    static final byte[] BUF = new byte[MiB];

    public static void main(String[] args) throws Exception {
        String target = args[0];
        for (String mode : new String[] {"path", "stream"}) {
            RemoteStorageManager rsm = (RemoteStorageManager) Class
                    .forName("io.github.rsmsidecar.shim.SidecarRemoteStorageManager").getConstructor().newInstance();
            Map<String, Object> conf = new HashMap<>();
            conf.put("sidecar.target", target);
            conf.put("transfer.mode", mode);
            conf.put("broker.id", 1);
            for (int i = 1; i < args.length; i++) { // more rsm.config keys: key=value (TLS over TCP)
                String[] kv = args[i].split("=", 2);
                conf.put(kv[0], kv[1]);
            }
            rsm.configure(conf);
            SHIMS.put(mode, rsm);
        }
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        answer(Map.of("ready", true, "topic_id", TIP.topicId().toString()));
        String line;
        while ((line = in.readLine()) != null) {
            String[] a = line.trim().split(" ");
            if (a[0].equals("quit")) {
                break;
            }
            try {
                answer(run(a));
            } catch (Throwable e) {
                answer(Map.of("error", String.valueOf(e)));
            }
        }
        for (RemoteStorageManager rsm : SHIMS.values()) {
            rsm.close();
        }
        answer(Map.of("closed", true));
    }

    static Map<String, Object> run(String[] a) throws Exception {
        switch (a[0]) {
            case "copy": return copy(a[1], Path.of(a[2]), Long.parseLong(a[3]), Long.parseLong(a[4]));
            case "fetch": return fetch(a[1], Integer.parseInt(a[2]), Integer.parseInt(a[3]), a.length > 4 ? a[4] : null);
            case "local": return local(Path.of(a[1]), Integer.parseInt(a[2]), Integer.parseInt(a[3]));
            case "index": return index(a[1], RemoteStorageManager.IndexType.valueOf(a[2]));
            case "delete": return delete(a[1]);
            case "ping": return ping();
            case "readfile": return readFile(Path.of(a[1]));
            case "copyfile": return copyFile(Path.of(a[1]), Path.of(a[2]));
            default: throw new IllegalArgumentException("unknown command " + a[0]);
        }
    }

    static Map<String, Object> copy(String mode, Path dir, long base, long end) throws Exception {
        String name = String.format("%020d", base);
        Path log = dir.resolve(name + ".log");
        Path txn = dir.resolve(name + ".txnindex");
        int size = (int) Files.size(log);
        LogSegmentData data = new LogSegmentData(log, dir.resolve(name + ".index"), dir.resolve(name + ".timeindex"),
                Files.exists(txn) ? Optional.of(txn) : Optional.empty(),
                dir.resolve(String.format("%020d", end + 1) + ".snapshot"),
                ByteBuffer.wrap("0\n1\n0 0\n".getBytes(StandardCharsets.US_ASCII)));
        RemoteLogSegmentId id = new RemoteLogSegmentId(TIP, Uuid.randomUuid());
        RemoteLogSegmentMetadata md = new RemoteLogSegmentMetadata(id, base, end, 1_700_000_000_000L, 1,
                System.currentTimeMillis(), size, Map.of(0, 0L));
        long t0 = System.nanoTime();
        Optional<RemoteLogSegmentMetadata.CustomMetadata> custom = SHIMS.get(mode).copyLogSegmentData(md, data);
        double s = secs(t0);
        SEGMENTS.put(id.id().toString(), new RemoteLogSegmentMetadata(id, base, end, md.maxTimestampMs(), 1,
                System.currentTimeMillis(), size, custom, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, Map.of(0, 0L)));
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("segment_id", id.id().toString());
        r.put("seconds", s);
        r.put("bytes", size);
        r.put("custom_metadata_bytes", custom.map(c -> c.value().length).orElse(-1));
        return r;
    }

    /** Reads like RemoteLogManager.read(): Utils.readFully into a buffer of the fetch size, then close. */
    static Map<String, Object> readLoop(InputStream in, long t0, int want, byte[] out) throws IOException {
        long first = -1;
        int firstBytes = 0;
        int got = 0;
        try (in) {
            while (got < want) {
                int n = in.read(out, got, want - got);
                if (n < 0) {
                    break;
                }
                if (first < 0 && n > 0) {
                    first = System.nanoTime();
                    firstBytes = n;
                }
                got += n;
            }
        }
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("ttfb", first < 0 ? -1.0 : (first - t0) / 1e9);
        r.put("seconds", secs(t0));
        r.put("bytes", got);
        r.put("first_read_bytes", firstBytes);
        return r;
    }

    static Map<String, Object> fetch(String segmentId, int start, int want, String verify) throws Exception {
        RemoteLogSegmentMetadata md = SEGMENTS.get(segmentId);
        byte[] out = new byte[want];
        long t0 = System.nanoTime();
        Map<String, Object> r = readLoop(SHIMS.get("stream").fetchLogSegment(md, start), t0, want, out);
        if (verify != null) {
            byte[] expected = new byte[(int) r.get("bytes")];
            try (FileInputStream f = new FileInputStream(verify)) {
                f.getChannel().read(ByteBuffer.wrap(expected), start);
            }
            r.put("verified", Arrays.equals(out, 0, expected.length, expected, 0, expected.length));
        }
        return r;
    }

    static Map<String, Object> local(Path file, int start, int want) throws Exception {
        byte[] out = new byte[want];
        long t0 = System.nanoTime();
        FileInputStream f = new FileInputStream(file.toFile());
        f.getChannel().position(start);
        return readLoop(f, t0, want, out);
    }

    static Map<String, Object> index(String segmentId, RemoteStorageManager.IndexType type) throws Exception {
        RemoteLogSegmentMetadata md = SEGMENTS.get(segmentId);
        long t0 = System.nanoTime();
        int n;
        try (InputStream in = SHIMS.get("stream").fetchIndex(md, type)) {
            n = in.readAllBytes().length;
        }
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("seconds", secs(t0));
        r.put("bytes", n);
        return r;
    }

    static Map<String, Object> ping() throws Exception {
        RemoteLogSegmentMetadata md = new RemoteLogSegmentMetadata(new RemoteLogSegmentId(TIP, Uuid.randomUuid()),
                0L, 0L, 0L, 1, 0L, 1, Map.of(0, 0L));
        long t0 = System.nanoTime();
        try {
            SHIMS.get("stream").fetchIndex(md, RemoteStorageManager.IndexType.TRANSACTION).close();
        } catch (RemoteResourceNotFoundException expected) {
            return Map.of("seconds", secs(t0));
        }
        throw new AssertionError("fetchIndex of an unknown segment did not throw RemoteResourceNotFoundException");
    }

    static Map<String, Object> delete(String segmentId) throws Exception {
        long t0 = System.nanoTime();
        SHIMS.get("stream").deleteLogSegmentData(SEGMENTS.remove(segmentId));
        return Map.of("seconds", secs(t0));
    }

    static Map<String, Object> readFile(Path file) throws Exception {
        long t0 = System.nanoTime();
        long total = 0;
        try (FileInputStream f = new FileInputStream(file.toFile())) {
            int n;
            while ((n = f.read(BUF)) > 0) {
                total += n;
            }
        }
        return Map.of("seconds", secs(t0), "bytes", total);
    }

    static Map<String, Object> copyFile(Path src, Path dst) throws Exception {
        long t0 = System.nanoTime();
        long total = 0;
        try (FileInputStream f = new FileInputStream(src.toFile()); FileOutputStream o = new FileOutputStream(dst.toFile())) {
            int n;
            while ((n = f.read(BUF)) > 0) {
                o.write(BUF, 0, n);
                total += n;
            }
            o.getFD().sync();
        }
        return Map.of("seconds", secs(t0), "bytes", total);
    }

    static double secs(long t0) {
        return (System.nanoTime() - t0) / 1e9;
    }

    static void answer(Map<String, Object> r) {
        StringBuilder b = new StringBuilder("RESULT {");
        boolean first = true;
        for (Map.Entry<String, Object> e : r.entrySet()) {
            if (!first) {
                b.append(", ");
            }
            first = false;
            b.append('"').append(e.getKey()).append("\": ");
            Object v = e.getValue();
            if (v instanceof Number || v instanceof Boolean) {
                b.append(v);
            } else {
                String s = String.valueOf(v);
                b.append('"');
                for (char c : s.toCharArray()) {
                    if (c == '"' || c == '\\') {
                        b.append('\\').append(c);
                    } else if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
                b.append('"');
            }
        }
        System.out.println(b.append('}'));
        System.out.flush();
    }
}
