package io.github.rsmsidecar.shim.read;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.junit.jupiter.api.Test;

/** The read-ahead's bound on the windows being read ahead ({@link ReadAhead#claimNext}). */
class ReadAheadTest {

    static final int MIB = 1024 * 1024;

    static TopicIdPartition partition(int p) {
        return new TopicIdPartition(org.apache.kafka.common.Uuid.fromString("f9T6yUyYRTiFbrzrTEOxkw"), p, "orders");
    }

    @Test
    void aWindowCutShortBySegmentsEndIsCountedAtItsLength() {
        ReadAhead ra = new ReadAhead(MIB, 2L * MIB);
        long segment = 4L * MIB + 100_000; // the window from 4 MiB is the segment's last 100,000 bytes
        ReadAhead.Claim tail = ra.claimNext(partition(0), RemoteLogSegmentId.generateNew(partition(0)),
                3L * MIB, 4L * MIB, segment);
        assertNotNull(tail);
        assertEquals(100_000, tail.bytes());
        ReadAhead.Claim whole = ra.claimNext(partition(1), RemoteLogSegmentId.generateNew(partition(1)), 0, MIB,
                segment);
        assertNotNull(whole);
        assertEquals(MIB, whole.bytes());
        // 1,200,000 bytes under way: another tail fits under 2 MiB (counted as whole windows, 3 MiB did not)
        ReadAhead.Claim another = ra.claimNext(partition(2), RemoteLogSegmentId.generateNew(partition(2)),
                3L * MIB, 4L * MIB, segment);
        assertNotNull(another, "a 100,000-byte window fits beside 1,100,000 bytes under a 2 MiB bound");
        // a whole window does not (2,200,000 + 1 MiB > 2 MiB) until one under way is done
        RemoteLogSegmentId id3 = RemoteLogSegmentId.generateNew(partition(3));
        assertNull(ra.claimNext(partition(3), id3, 0, MIB, segment));
        ra.pendingDone(partition(1), whole);
        ra.pendingDone(partition(1), whole); // idempotent: counted off once
        assertNotNull(ra.claimNext(partition(3), id3, 0, MIB, segment));
        assertNull(ra.claimNext(partition(4), RemoteLogSegmentId.generateNew(partition(4)), 0, MIB, segment),
                "1,200,000 + 1 MiB is over 2 MiB");
    }

    @Test
    void moreReadersThanTheBoundHoldsWholeWindowsForShareItInSmallerWindows() {
        ReadAhead ra = new ReadAhead(8 * MIB, 64L * MIB);
        long segment = 1024L * MIB;
        assertEquals(8 * MIB, ra.currentWindowBytes(), "nobody reading: the configured window");
        for (int p = 0; p < 4; p++) {
            ra.readEnded(partition(p), RemoteLogSegmentId.generateNew(partition(p)), 0, MIB, segment);
        }
        assertEquals(8 * MIB, ra.currentWindowBytes(), "4 readers x 2 windows x 8 MiB fit in 64 MiB");
        for (int p = 4; p < 12; p++) {
            ra.readEnded(partition(p), RemoteLogSegmentId.generateNew(partition(p)), 0, MIB, segment);
        }
        assertEquals(64 * MIB / 24, ra.currentWindowBytes(), "12 readers: a 24th of the bound each window");
        // every one of the 12 gets its read-ahead under way, under the bound
        for (int p = 0; p < 12; p++) {
            ReadAhead.Claim c = ra.claimNext(partition(p), RemoteLogSegmentId.generateNew(partition(p)), 0, MIB,
                    segment);
            assertNotNull(c, "partition " + p);
            assertEquals(64 * MIB / 24, c.bytes());
        }
        for (int p = 12; p < 48; p++) {
            ra.readEnded(partition(p), RemoteLogSegmentId.generateNew(partition(p)), 0, MIB, segment);
        }
        assertEquals(MIB, ra.currentWindowBytes(), "never below 1 MiB");
    }
}
