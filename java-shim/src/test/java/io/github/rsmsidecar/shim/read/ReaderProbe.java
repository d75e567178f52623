package io.github.rsmsidecar.shim.read;

import java.util.concurrent.TimeUnit;

/** What tests outside this package may ask of a {@link RemoteReader}. */
public final class ReaderProbe {

    private ReaderProbe() {
    }

    /**
     * Waits at most 10 s until {@code reader} has no read-ahead or index prefetch under way; false
     * if one still is. A background request the reader started has reached the sidecar by then
     * (each waits for its answer), so a test can assert that a read started none.
     */
    public static boolean awaitBackgroundIdle(RemoteReader reader) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (reader.backgroundTasks() > 0) {
            if (System.nanoTime() > deadline) {
                return false;
            }
            Thread.sleep(2);
        }
        return true;
    }
}
