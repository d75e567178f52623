package io.github.rsmsidecar.shim;

import io.grpc.Status;
import io.grpc.StatusException;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Runs an idempotent sidecar call, retrying it with exponential backoff while the sidecar answers
 * {@code UNAVAILABLE} (not reachable, restarting, storage throttling), up to
 * {@code retry.max.attempts} attempts in total. Other statuses are mapped at once. An interrupt
 * (during an attempt or a backoff) ends the call with {@link RemoteStorageException} and leaves the
 * thread's interrupt flag set.
 */
final class Retrier {

    private static final Logger LOG = LoggerFactory.getLogger(Retrier.class);

    /** One attempt. It must cancel its gRPC call before throwing {@link InterruptedException}. */
    @FunctionalInterface
    interface Attempt<T> {
        T run(int attempt) throws StatusException, InterruptedException, RemoteStorageException;
    }

    private final int maxAttempts;
    private final long initialBackoffMs;
    private final long maxBackoffMs;
    private final ErrorMapper errors;
    private final Runnable beforeRetry;

    /**
     * @param beforeRetry run before each retry; the shim resets the channel's reconnect backoff so
     *                    a sidecar that is back is reached at once, not after grpc's (up to 120 s)
     *                    reconnect delay
     */
    Retrier(ShimConfig config, ErrorMapper errors, Runnable beforeRetry) {
        this.maxAttempts = config.retryMaxAttempts();
        this.initialBackoffMs = config.retryInitialBackoffMs();
        this.maxBackoffMs = config.retryMaxBackoffMs();
        this.errors = errors;
        this.beforeRetry = beforeRetry;
    }

    <T> T call(String operation, boolean delete, Attempt<T> attempt) throws RemoteStorageException {
        for (int n = 1; ; n++) {
            try {
                return attempt.run(n);
            } catch (StatusException e) {
                Status status = e.getStatus();
                if (status.getCode() == Status.Code.UNAVAILABLE && n < maxAttempts) {
                    long delay = backoffMs(n, initialBackoffMs, maxBackoffMs, ThreadLocalRandom.current().nextDouble());
                    LOG.warn("{}: attempt {} of {} failed with UNAVAILABLE ({}); retrying in {} ms",
                            operation, n, maxAttempts,
                            status.getDescription() != null ? status.getDescription() : "no description", delay);
                    try {
                        TimeUnit.MILLISECONDS.sleep(delay);
                    } catch (InterruptedException ie) {
                        Thread.currentThread().interrupt();
                        throw new RemoteStorageException(operation + " interrupted while waiting to retry (attempt "
                                + n + " failed: " + ErrorMapper.describe("call", status) + ")", ie);
                    }
                    beforeRetry.run();
                    continue;
                }
                String op = n > 1 ? operation + " (attempt " + n + " of " + maxAttempts + ")" : operation;
                if (n > 1) {
                    // Kafka 4.3+ logs a retriable copy failure without its cause: say it here
                    LOG.warn("{}: giving up after attempt {} of {}: {}", operation, n, maxAttempts,
                            ErrorMapper.describe("call", status));
                }
                throw errors.map(op, status, delete);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new RemoteStorageException(operation + " interrupted; the sidecar call was cancelled", e);
            }
        }
    }

    /**
     * The wait after failed attempt {@code attempt} (1-based): {@code initial * 2^(attempt-1)},
     * capped at {@code max}, times a jitter factor in [0.8, 1.2) (never above {@code max}).
     */
    static long backoffMs(int attempt, long initial, long max, double random) {
        double base = Math.min((double) max, initial * Math.pow(2, attempt - 1));
        double jittered = base * (0.8 + 0.4 * random);
        return (long) Math.min(max, jittered);
    }
}
