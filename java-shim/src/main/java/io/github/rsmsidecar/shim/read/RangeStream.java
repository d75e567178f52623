package io.github.rsmsidecar.shim.read;

import io.github.rsmsidecar.proto.v1.SegmentMetadata;

/**
 * The bytes of one asked-for range as they arrive from the sidecar (over the fetch channel, or over
 * gRPC from a sidecar without one). An error after bytes started flowing, and a range that ends
 * early, are {@link java.io.IOException}s from {@code read}, never a short stream; closing it before
 * its end tells the sidecar to stop.
 */
abstract class RangeStream extends BulkInputStream {

    /**
     * The partition's next segment, as the sidecar named it at the end of a range that reached the
     * end of its segment ({@code want_next_segment} in rsm.proto); null when it named none or the
     * range has not ended.
     */
    SegmentMetadata nextSegment() {
        return null;
    }

    /** Ends the stream (the sidecar stops) once the reader has not read for {@code idleMs}; 0: never. */
    abstract void armIdleTimeout(java.util.concurrent.ScheduledExecutorService scheduler, long idleMs);
}
