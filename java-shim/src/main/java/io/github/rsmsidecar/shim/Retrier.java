package io.github.rsmsidecar.shim;

import io.grpc.Status;
import io.grpc.StatusException;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Supplier;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Runs an idempotent sidecar call, retrying it with exponential backoff while the sidecar answers
 * {@code UNAVAILABLE} (not reachable, restarting, storage throttling), up to
 * {@code retry.max.attempts} attempts in total. Fetches and index calls ({@link #readBudgetMs})
 * retry longer: for up to {@code retry.fetch.max.ms} from the moment the sidecar was first
 * missed, so that the broker's remote reads ride out a restart of the sidecar (a rolling update
 * of its DaemonSet is routine) instead of failing with an error every consumer sees; a read that
 * outlasts the broker's {@code remote.fetch.max.wait.ms} only makes the broker answer that fetch
 * without data, quietly, and the consumer asks again. Copies and deletes keep to the attempts:
 * the broker retries them at its next interval anyway. A fetch or index call that finds the
 * sidecar's fetch slots busy ({@code RESOURCE_EXHAUSTED}) waits for one instead, asking again
 * every few milliseconds up to its open deadline ({@code fetch.deadline.ms},
 * {@code fetch.index.deadline.ms}): routine back-pressure, one WARN line a minute, never an error
 * the broker logs with a stack trace (see {@link #awaitSlot}). A TLS refusal ({@link TlsRefusal})
 * is not retried: it is reported at once, in one line that says why. Other statuses are mapped at
 * once. An interrupt (during an attempt or a wait) ends the call with
 * {@link RemoteStorageException} and leaves the thread's interrupt flag set.
 */
public final class Retrier {

    private static final Logger LOG = LoggerFactory.getLogger(Retrier.class);

    /** One attempt. It must cancel its gRPC call before throwing {@link InterruptedException}. */
    @FunctionalInterface
    public interface Attempt<T> {
        T run(int attempt) throws StatusException, InterruptedException, RemoteStorageException;
    }

    /** First wait before asking a busy sidecar again; doubles up to {@link #BUSY_MAX_BACKOFF_MS}. */
    static final long BUSY_INITIAL_BACKOFF_MS = 5;
    static final long BUSY_MAX_BACKOFF_MS = 100;
    /** One WARN line about a busy sidecar per this many ms; the rest at DEBUG. */
    static final long BUSY_WARN_EVERY_MS = 60_000;
    /**
     * The longest wait between two attempts of a fetch or index call waiting for a sidecar that
     * went away ({@code retry.fetch.max.ms}): a sidecar back from a restart is reached within it.
     */
    static final long READ_RETRY_MAX_BACKOFF_MS = 200;
    /** The same TLS refusal is logged at WARN at most once per this many ms; the rest at DEBUG. */
    static final long TLS_WARN_EVERY_MS = 60_000;
    /** {@link #missedSinceNanos} while the sidecar answers. */
    private static final long REACHABLE = Long.MIN_VALUE;

    private final int maxAttempts;
    private final long initialBackoffMs;
    private final long maxBackoffMs;
    private final long fetchDeadlineMs;
    private final long fetchIndexDeadlineMs;
    private final ErrorMapper errors;
    private final Runnable beforeRetry;
    private final ShimMetrics metrics;
    /** {@link System#nanoTime()} from which a busy sidecar is logged at WARN again. */
    private volatile long busyWarnAfterNanos = System.nanoTime();
    private final long readRetryMs;
    private final String target;
    private final TlsRefusal tls;
    /**
     * {@link System#nanoTime()} of the first {@code UNAVAILABLE} since the sidecar last answered,
     * or {@link #REACHABLE}: fetches and index calls retry until {@code retry.fetch.max.ms} after it.
     */
    private final AtomicLong missedSinceNanos = new AtomicLong(REACHABLE);
    private String tlsWarned; // guarded by this: the TLS refusal last logged at WARN
    private long tlsWarnAfterNanos; // guarded by this

    /**
     * @param beforeRetry run before each retry; the shim resets the channel's reconnect backoff so
     *                    a sidecar that is back is reached at once, not after grpc's (up to 120 s)
     *                    reconnect delay
     */
    Retrier(ShimConfig config, ErrorMapper errors, Runnable beforeRetry, ShimMetrics metrics) {
        this(config, errors, beforeRetry, metrics, () -> null);
    }

    /**
     * @param tlsFiles the TLS files the channel uses now (null without TLS), for saying why TLS
     *                 refused ({@link TlsRefusal})
     */
    Retrier(ShimConfig config, ErrorMapper errors, Runnable beforeRetry, ShimMetrics metrics,
            Supplier<TlsFiles> tlsFiles) {
        this.readRetryMs = config.retryFetchMaxMs();
        this.target = config.target();
        this.tls = new TlsRefusal(config, tlsFiles);
        this.maxAttempts = config.retryMaxAttempts();
        this.initialBackoffMs = config.retryInitialBackoffMs();
        this.maxBackoffMs = config.retryMaxBackoffMs();
        this.fetchDeadlineMs = config.fetchDeadlineMs();
        this.fetchIndexDeadlineMs = config.fetchIndexDeadlineMs();
        this.errors = errors;
        this.beforeRetry = beforeRetry;
        this.metrics = metrics;
    }

    /**
     * Runs {@code attempt} as a call of kind {@code op} ({@link ShimMetrics.Op#DELETE}: NOT_FOUND
     * is not mapped to {@code RemoteResourceNotFoundException}), counting it in the metrics.
     */
    public <T> T call(ShimMetrics.Op op, String operation, Attempt<T> attempt) throws RemoteStorageException {
        long started = System.nanoTime();
        Status failed = null;
        try {
            return run(op, operation, attempt, started);
        } catch (RemoteStorageException | RuntimeException e) {
            failed = Status.fromThrowable(e.getCause() != null ? e.getCause() : e);
            throw e;
        } finally {
            metrics.ended(op, System.nanoTime() - started, failed);
        }
    }

    private <T> T run(ShimMetrics.Op op, String operation, Attempt<T> attempt, long started)
            throws RemoteStorageException {
        boolean delete = op == ShimMetrics.Op.DELETE;
        long slotDeadlineMs = op == ShimMetrics.Op.FETCH ? fetchDeadlineMs
                : op == ShimMetrics.Op.FETCH_INDEX ? fetchIndexDeadlineMs : 0;
        long readBudgetMs = readBudgetMs(op);
        int busy = 0;
        for (int n = 1; ; n++) {
            try {
                metrics.call(op);
                T result = attempt.run(n);
                metrics.answered(null);
                reached();
                if (busy > 0) {
                    LOG.debug("{}: got a fetch slot after {} ms", operation,
                            TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started));
                }
                return result;
            } catch (StatusException e) {
                Status status = e.getStatus();
                metrics.answered(status);
                String refused = tls.reason(status);
                if (refused != null) {
                    warnTlsRefused(operation, refused);
                    throw errors.map(operation, Status.UNAVAILABLE.withDescription(refused).withCause(status.getCause()),
                            delete);
                }
                if (status.getCode() != Status.Code.UNAVAILABLE && status.getCode() != Status.Code.DEADLINE_EXCEEDED
                        && status.getCode() != Status.Code.CANCELLED) {
                    reached(); // it answered
                }
                if (status.getCode() == Status.Code.RESOURCE_EXHAUSTED && slotDeadlineMs > 0) {
                    long waitedMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started);
                    if (waitedMs < slotDeadlineMs) {
                        metrics.of(op).busyWaits.increment();
                        try {
                            awaitSlot(operation, status, busy++, slotDeadlineMs - waitedMs, slotDeadlineMs);
                        } catch (InterruptedException ie) {
                            Thread.currentThread().interrupt();
                            throw new RemoteStorageException(operation + " interrupted while waiting for a fetch slot ("
                                    + ErrorMapper.describe("call", status) + ")", ie);
                        }
                        n--; // waiting for a slot is not a failed attempt
                        continue;
                    }
                    LOG.warn("{}: the sidecar's fetch slots stayed busy for {} ms ({} ms allowed); giving up",
                            operation, waitedMs, slotDeadlineMs);
                }
                // a sidecar that shuts down cancels the calls it had received but not started (gRPC core)
                boolean attempts = status.getCode() == Status.Code.UNAVAILABLE && n < maxAttempts;
                boolean away = status.getCode() == Status.Code.UNAVAILABLE
                        || (status.getCode() == Status.Code.CANCELLED && readBudgetMs > 0);
                long readWaitMs = away ? readWaitLeftMs(readBudgetMs, operation, status) : 0;
                if (attempts || readWaitMs > 0) {
                    metrics.of(op).retries.increment();
                    long delay = backoffMs(n, initialBackoffMs, maxBackoffMs, ThreadLocalRandom.current().nextDouble());
                    if (readBudgetMs > 0) { // a read: one WARN for the outage (readWaitLeftMs), see readBudgetMs
                        delay = Math.max(1, Math.min(delay, readWaitMs > 0 ? Math.min(READ_RETRY_MAX_BACKOFF_MS,
                                readWaitMs) : READ_RETRY_MAX_BACKOFF_MS));
                        LOG.debug("{}: attempt {} failed ({}); retrying in {} ms", operation, n,
                                ErrorMapper.describe("call", status), delay);
                    } else {
                        LOG.warn("{}: attempt {} of {} failed with UNAVAILABLE ({}); retrying in {} ms",
                                operation, n, maxAttempts, status.getDescription() != null
                                        ? StatusText.oneLine(status.getDescription()) : "no description", delay);
                    }
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
                if (n > 1) {
                    // Kafka 4.3+ logs a retriable copy failure without its cause: say it here
                    LOG.warn("{}: giving up after attempt {}{}: {}", operation, n,
                            n > maxAttempts ? " (the sidecar was not reachable for " + readBudgetMs + " ms, rsm.config."
                                    + ShimConfig.RETRY_FETCH_MAX_MS + ")" : " of " + maxAttempts,
                            ErrorMapper.describe("call", status));
                }
                throw errors.map(n > 1 ? operation + " (attempt " + n + (n > maxAttempts ? "" : " of " + maxAttempts)
                        + ")" : operation, status, delete);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new RemoteStorageException(operation + " interrupted; the sidecar call was cancelled", e);
            }
        }
    }

    /**
     * How long a call of kind {@code op} waits for a sidecar that went away: fetches and index
     * calls (the broker's remote reads, the shim's prefetches of them) {@code retry.fetch.max.ms};
     * others (copies, deletes, read-ahead in the background) 0, they keep to {@code retry.max.attempts}.
     */
    long readBudgetMs(ShimMetrics.Op op) {
        return op == ShimMetrics.Op.FETCH || op == ShimMetrics.Op.FETCH_INDEX ? readRetryMs : 0;
    }

    /**
     * After an {@code UNAVAILABLE}: how much longer a call with {@code budgetMs} may wait for the
     * sidecar, counted from when it was first missed (0: no longer). The first call to miss it logs
     * one WARN line for all.
     */
    private long readWaitLeftMs(long budgetMs, String operation, Status status) {
        long now = System.nanoTime();
        boolean first = missedSinceNanos.compareAndSet(REACHABLE, now);
        long since = first ? now : missedSinceNanos.get();
        if (since == REACHABLE) { // reached in between by another call
            return budgetMs;
        }
        if (first && readRetryMs > 0) {
            LOG.warn("The sidecar at {} is not reachable ({}: {}); fetches and index reads wait for it up to {} ms "
                            + "(rsm.config.{})", target, operation, ErrorMapper.describe("call", status), readRetryMs,
                    ShimConfig.RETRY_FETCH_MAX_MS);
        }
        return Math.max(0, budgetMs - TimeUnit.NANOSECONDS.toMillis(now - since));
    }

    /** The sidecar answered a call: it is reachable (again). */
    private void reached() {
        long since = missedSinceNanos.getAndSet(REACHABLE);
        if (since != REACHABLE && readRetryMs > 0) {
            LOG.info("The sidecar at {} is reachable again, {} ms after it was first missed", target,
                    TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - since));
        }
    }

    /** One WARN line per TLS refusal and minute, the rest at DEBUG: the failed call's exception says it anyway. */
    private void warnTlsRefused(String operation, String refused) {
        long now = System.nanoTime();
        boolean warn;
        synchronized (this) {
            warn = !refused.equals(tlsWarned) || now - tlsWarnAfterNanos >= 0;
            if (warn) {
                tlsWarned = refused;
                tlsWarnAfterNanos = now + TimeUnit.MILLISECONDS.toNanos(TLS_WARN_EVERY_MS);
            }
        }
        if (warn) {
            LOG.warn("{}: {}", operation, refused);
        } else {
            LOG.debug("{}: {}", operation, refused);
        }
    }

    /**
     * Waits before asking a busy sidecar again ({@code RESOURCE_EXHAUSTED}: all its
     * {@code fetch.max_concurrent} slots taken), {@code busy} waits done so far, at most
     * {@code remainingMs}. A sidecar with its slots full is routine back-pressure (bursts of
     * parallel reads, read-ahead and index prefetches, several brokers on one sidecar): the call
     * waits for a slot instead of failing, since a failure here is an ERROR with a stack trace in
     * the broker's log and "Unknown broker error" for the consumer, while a wait longer than the
     * broker's {@code remote.fetch.max.wait.ms} only makes the broker answer the consumer without
     * data, quietly, and the consumer fetches again. One WARN line a minute says so.
     */
    private void awaitSlot(String operation, Status status, int busy, long remainingMs, long allowedMs)
            throws InterruptedException {
        long now = System.nanoTime();
        if (now - busyWarnAfterNanos >= 0) {
            busyWarnAfterNanos = now + TimeUnit.MILLISECONDS.toNanos(BUSY_WARN_EVERY_MS);
            LOG.warn("{}: the sidecar is busy ({}); waiting for a fetch slot, up to {} ms. Raise the sidecar's "
                            + "fetch.max_concurrent if this repeats (further waits in the next {} s are logged at DEBUG)",
                    operation, ErrorMapper.describe("call", status), allowedMs, BUSY_WARN_EVERY_MS / 1000);
        } else if (busy == 0) {
            LOG.debug("{}: the sidecar is busy ({}); waiting for a fetch slot", operation, status.getDescription());
        }
        long delay = backoffMs(busy + 1, BUSY_INITIAL_BACKOFF_MS, BUSY_MAX_BACKOFF_MS,
                ThreadLocalRandom.current().nextDouble());
        TimeUnit.MILLISECONDS.sleep(Math.max(1, Math.min(delay, remainingMs)));
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
