package io.github.rsmsidecar.shim.read;

import java.io.IOException;
import java.io.InputStream;

/**
 * An input stream that reads in bulk: its one-byte {@code read()} is a bulk read of one byte, so a
 * stream has one read path to get right.
 */
abstract class BulkInputStream extends InputStream {

    @Override
    public int read() throws IOException {
        byte[] one = new byte[1];
        int n = read(one, 0, 1);
        return n < 0 ? -1 : one[0] & 0xff;
    }

    @Override
    public abstract int read(byte[] b, int off, int len) throws IOException;
}
