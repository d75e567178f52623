package io.github.rsmsidecar.shim;

import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.lang.reflect.Field;
import java.nio.ByteBuffer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Unmaps a mapped file at once ({@code sun.misc.Unsafe.invokeCleaner}, from the JDK's
 * {@code jdk.unsupported} module, as Kafka's own index files are unmapped). Java has no public
 * unmap: a mapping otherwise lives until the garbage collector finds its buffer, and the pages of
 * a deleted hand-off file with it. Where the call is not available, mappings are left to the
 * collector (one warning); nothing else changes.
 *
 * <p>The caller must guarantee that nothing reads the buffer afterwards: a read of an unmapped
 * buffer crashes the JVM ({@link FetchHandoff.OpenFile}'s reference count).
 */
final class Unmapper {

    private static final Logger LOG = LoggerFactory.getLogger(Unmapper.class);
    private static final MethodHandle INVOKE_CLEANER = lookup();

    private Unmapper() {
    }

    private static MethodHandle lookup() {
        try {
            Class<?> unsafeClass = Class.forName("sun.misc.Unsafe");
            Field theUnsafe = unsafeClass.getDeclaredField("theUnsafe");
            theUnsafe.setAccessible(true);
            return MethodHandles.lookup()
                    .findVirtual(unsafeClass, "invokeCleaner", MethodType.methodType(void.class, ByteBuffer.class))
                    .bindTo(theUnsafe.get(null));
        } catch (ReflectiveOperationException | RuntimeException e) {
            LOG.warn("mapped hand-off files cannot be unmapped at once on this JVM ({}); their pages are "
                    + "freed when the garbage collector finds them", e.toString());
            return null;
        }
    }

    /** Unmaps {@code buffer} (a mapped, direct buffer nothing reads any more). */
    static void unmap(ByteBuffer buffer) {
        if (INVOKE_CLEANER == null || !buffer.isDirect()) {
            return;
        }
        try {
            INVOKE_CLEANER.invokeExact(buffer);
        } catch (Throwable e) {
            LOG.warn("unmapping a hand-off file failed ({}); its pages are freed by the garbage collector", e.toString());
        }
    }

    /** Whether mappings are unmapped at once (tests). */
    static boolean available() {
        return INVOKE_CLEANER != null;
    }
}
