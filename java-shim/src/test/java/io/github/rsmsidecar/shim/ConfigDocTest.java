package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/** docs/shim.md's key table must list exactly the keys of {@link ShimConfig#KEYS}, with the same defaults. */
class ConfigDocTest {

    /** A table row: | `key` | type | `default` or (none) | meaning |. */
    static final Pattern ROW = Pattern.compile("^\\| `([a-z.]+)` \\| [^|]+ \\| (?:`([^`]*)`|\\(none\\)) \\| .+\\|$");

    static Map<String, String> documentedKeys() throws Exception {
        Path doc = Path.of(System.getProperty("rsm.docs.shim", "../docs/shim.md"));
        assertTrue(Files.isRegularFile(doc), "docs/shim.md not found at " + doc.toAbsolutePath());
        Map<String, String> keys = new LinkedHashMap<>();
        boolean inTable = false;
        for (String line : Files.readAllLines(doc)) {
            if (line.startsWith("| Key | Type | Default | Meaning |")) {
                inTable = true;
                continue;
            }
            if (inTable && !line.startsWith("|")) {
                break;
            }
            if (inTable && !line.startsWith("|---")) {
                Matcher m = ROW.matcher(line);
                assertTrue(m.matches(), "malformed row in docs/shim.md: " + line);
                String previous = keys.put(m.group(1), m.group(2) == null ? "" : m.group(2));
                assertEquals(null, previous, "key documented twice: " + m.group(1));
            }
        }
        assertTrue(inTable, "docs/shim.md has no '| Key | Type | Default | Meaning |' table");
        return keys;
    }

    @Test
    void docTableMatchesTheCode() throws Exception {
        Map<String, String> documented = documentedKeys();
        assertEquals(ShimConfig.KEYS.keySet(), documented.keySet(), "keys in docs/shim.md vs ShimConfig.KEYS");
        assertEquals(ShimConfig.KEYS, documented, "defaults in docs/shim.md vs ShimConfig.KEYS");
    }

    @Test
    void everyDocumentedDefaultParses() {
        ShimConfig c = ShimConfig.parse(Map.of());
        assertEquals("127.0.0.1:9095", c.target());
        assertEquals(ShimConfig.TransferMode.STREAM, c.transferMode());
        assertEquals(Long.parseLong(ShimConfig.KEYS.get(ShimConfig.COPY_DEADLINE_MS)), c.copyDeadlineMs());
        assertEquals(Long.parseLong(ShimConfig.KEYS.get(ShimConfig.FETCH_DEADLINE_MS)), c.fetchDeadlineMs());
        assertEquals(Long.parseLong(ShimConfig.KEYS.get(ShimConfig.FETCH_READ_TIMEOUT_MS)), c.fetchReadTimeoutMs());
        assertEquals(Long.parseLong(ShimConfig.KEYS.get(ShimConfig.FETCH_IDLE_TIMEOUT_MS)), c.fetchIdleTimeoutMs());
        assertEquals(Long.parseLong(ShimConfig.KEYS.get(ShimConfig.FETCH_INDEX_DEADLINE_MS)), c.fetchIndexDeadlineMs());
        assertEquals(Long.parseLong(ShimConfig.KEYS.get(ShimConfig.DELETE_DEADLINE_MS)), c.deleteDeadlineMs());
        assertEquals(Integer.parseInt(ShimConfig.KEYS.get(ShimConfig.RETRY_MAX_ATTEMPTS)), c.retryMaxAttempts());
        assertEquals(Long.parseLong(ShimConfig.KEYS.get(ShimConfig.RETRY_INITIAL_BACKOFF_MS)), c.retryInitialBackoffMs());
        assertEquals(Long.parseLong(ShimConfig.KEYS.get(ShimConfig.RETRY_MAX_BACKOFF_MS)), c.retryMaxBackoffMs());
        assertEquals(Long.parseLong(ShimConfig.KEYS.get(ShimConfig.CLOSE_TIMEOUT_MS)), c.closeTimeoutMs());
        assertEquals(Long.parseLong(ShimConfig.KEYS.get(ShimConfig.CONNECT_TIMEOUT_MS)), c.connectTimeoutMs());
        assertEquals(Long.parseLong(ShimConfig.KEYS.get(ShimConfig.KEEPALIVE_TIME_MS)), c.keepaliveTimeMs());
        assertEquals(Long.parseLong(ShimConfig.KEYS.get(ShimConfig.KEEPALIVE_TIMEOUT_MS)), c.keepaliveTimeoutMs());
        assertEquals(false, c.tlsEnabled());
    }
}
