package io.github.rsmsidecar.shim;

import io.grpc.Status;
import io.grpc.StatusException;
import java.lang.reflect.Constructor;
import java.lang.reflect.InvocationTargetException;
import java.util.EnumSet;
import java.util.Set;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Maps a gRPC status from the sidecar to the KIP-405 exception the broker expects.
 *
 * <ul>
 *   <li>{@code NOT_FOUND} becomes {@link RemoteResourceNotFoundException} (except for delete, which
 *       must never throw it);
 *   <li>the transient codes {@code UNAVAILABLE}, {@code DEADLINE_EXCEEDED}, {@code RESOURCE_EXHAUSTED}
 *       and {@code ABORTED} become {@code RetriableRemoteStorageException} when the broker has that
 *       class (Kafka 4.2+), otherwise {@link RemoteStorageException};
 *   <li>everything else becomes {@link RemoteStorageException}.
 * </ul>
 *
 * Every message carries the status code and the sidecar's description; the cause is a
 * {@link StatusException} holding the status (and its own cause, e.g. a connection error).
 */
public final class ErrorMapper {

    private static final Logger LOG = LoggerFactory.getLogger(ErrorMapper.class);

    /** Added to kafka-storage-api in 4.2 (KAFKA-19523). */
    static final String RETRIABLE_CLASS = "org.apache.kafka.server.log.remote.storage.RetriableRemoteStorageException";

    static final Set<Status.Code> TRANSIENT = EnumSet.of(
            Status.Code.UNAVAILABLE, Status.Code.DEADLINE_EXCEEDED, Status.Code.RESOURCE_EXHAUSTED, Status.Code.ABORTED);

    private final Constructor<? extends RemoteStorageException> retriable;

    /**
     * @param loader the loader to look the retriable class up in: the one that defined
     *               {@link RemoteStorageException}, i.e. the broker's, so the broker can catch it
     * @param className the class to look up ({@link #RETRIABLE_CLASS} in production)
     */
    ErrorMapper(ClassLoader loader, String className) {
        this.retriable = lookup(loader, className);
    }

    /** The mapper for the running broker; the reflective lookup happens once per class loader. */
    static ErrorMapper forBroker() {
        return Holder.INSTANCE;
    }

    private static final class Holder {
        static final ErrorMapper INSTANCE = new ErrorMapper(RemoteStorageException.class.getClassLoader(), RETRIABLE_CLASS);
    }

    private static Constructor<? extends RemoteStorageException> lookup(ClassLoader loader, String className) {
        Class<?> c;
        try {
            c = Class.forName(className, false, loader);
        } catch (ClassNotFoundException | LinkageError e) {
            LOG.debug("{} not found (Kafka < 4.2): transient sidecar errors become RemoteStorageException", className);
            return null;
        }
        if (!RemoteStorageException.class.isAssignableFrom(c)) {
            LOG.warn("{} does not extend {}; not used", className, RemoteStorageException.class.getName());
            return null;
        }
        try {
            Constructor<? extends RemoteStorageException> ctor =
                    c.asSubclass(RemoteStorageException.class).getConstructor(String.class, Throwable.class);
            LOG.debug("transient sidecar errors become {}", className);
            return ctor;
        } catch (NoSuchMethodException e) {
            LOG.warn("{} has no (String, Throwable) constructor; not used", className);
            return null;
        }
    }

    /** Whether the retriable exception class was found. */
    boolean hasRetriableClass() {
        return retriable != null;
    }

    /**
     * The exception for a failed call.
     *
     * @param operation what failed, e.g. {@code "fetchLogSegment(Topic-0 segment X, start=10)"}
     * @param status the status from the sidecar (or from the local gRPC runtime)
     * @param delete whether this is a delete, for which NOT_FOUND must not become RRNFE
     */
    public RemoteStorageException map(String operation, Status status, boolean delete) {
        String message = describe(operation, status);
        StatusException cause = status.asException();
        Status.Code code = status.getCode();
        if (code == Status.Code.NOT_FOUND && !delete) {
            return new RemoteResourceNotFoundException(message, cause);
        }
        if (TRANSIENT.contains(code)) {
            return retriable(message, cause);
        }
        return new RemoteStorageException(message, cause);
    }

    /** A transient failure that did not come from a gRPC status (e.g. interrupted while waiting). */
    public RemoteStorageException retriable(String message, Throwable cause) {
        if (retriable != null) {
            try {
                return retriable.newInstance(message, cause);
            } catch (InstantiationException | IllegalAccessException | InvocationTargetException e) {
                LOG.debug("cannot instantiate {}: {}", retriable.getDeclaringClass().getName(), e.toString());
            }
        }
        return new RemoteStorageException(message, cause);
    }

    /**
     * {@code "<operation> failed: sidecar status <CODE>: <description> (cause: <cause>)"}, on one
     * line ({@link StatusText}).
     */
    public static String describe(String operation, Status status) {
        return StatusText.oneLine(operation + " failed: sidecar status " + StatusText.of(status));
    }
}
