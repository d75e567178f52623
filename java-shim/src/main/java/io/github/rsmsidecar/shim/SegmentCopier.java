package io.github.rsmsidecar.shim;

import com.google.protobuf.ByteString;
import com.google.protobuf.UnsafeByteOperations;
import io.github.rsmsidecar.proto.v1.CopyBegin;
import io.github.rsmsidecar.proto.v1.CopyData;
import io.github.rsmsidecar.proto.v1.CopySegmentRequest;
import io.github.rsmsidecar.proto.v1.CopySegmentResponse;
import io.github.rsmsidecar.proto.v1.FileKind;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.github.rsmsidecar.proto.v1.SegmentFiles;
import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import io.github.rsmsidecar.proto.v1.TransferMode;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedByInterruptException;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;

/**
 * One attempt of the client-streaming CopySegment call.
 *
 * <p>Stream mode sends {@code CopyBegin} and then each non-empty file in the given order as
 * {@code CopyData} messages of at most {@link #MAX_MESSAGE_BYTES}. Before each message it waits
 * until the call is ready ({@link ClientCall#isReady()}), i.e. until gRPC/HTTP2 flow control has
 * room, so a slow sidecar slows the copy down instead of piling the segment up in the heap: at most
 * one message beyond the transport's small ready threshold is held at a time. Path mode sends
 * {@code CopyBegin} alone.
 */
final class SegmentCopier {

    /** The proto's limit for {@code CopyData.data}. */
    static final int MAX_MESSAGE_BYTES = 1 << 20;
    /** A message's bytes are read into arrays of at most this size: never a humongous object for G1. */
    static final int PIECE_BYTES = 256 * 1024;

    /** A file to stream: its kind, path and the size declared in {@code CopyBegin}. */
    static final class FilePart {
        final FileKind kind;
        final Path path;
        final long size;

        FilePart(FileKind kind, Path path, long size) {
            this.kind = kind;
            this.path = path;
            this.size = size;
        }
    }

    private final Object lock = new Object();
    private final ClientCall<CopySegmentRequest, CopySegmentResponse> call;
    private final String operation;
    private volatile CopySegmentResponse response;
    private volatile Status status;

    /**
     * The {@code CopyBegin} of a copy of {@code data} in {@code mode}; in stream mode the files to
     * stream are added to {@code parts}, in proto order.
     */
    static CopyBegin begin(String op, SegmentMetadata metadata, ByteString leaderEpochs, LogSegmentData data,
                           ShimConfig.TransferMode mode, List<FilePart> parts) throws RemoteStorageException {
        CopyBegin.Builder begin = CopyBegin.newBuilder().setMetadata(metadata).setLeaderEpochCheckpoint(leaderEpochs);
        if (mode == ShimConfig.TransferMode.PATH) {
            SegmentFiles.Builder files = SegmentFiles.newBuilder()
                    .setLogPath(absolute(data.logSegment()))
                    .setOffsetIndexPath(absolute(data.offsetIndex()))
                    .setTimeIndexPath(absolute(data.timeIndex()))
                    .setProducerSnapshotPath(absolute(data.producerSnapshotIndex()));
            data.transactionIndex().ifPresent(p -> files.setTransactionIndexPath(absolute(p)));
            begin.setMode(TransferMode.PATH).setFiles(files);
        } else {
            SegmentFiles.Builder files = SegmentFiles.newBuilder();
            // The proto's file order: LOG, OFFSET_INDEX, TIME_INDEX, PRODUCER_SNAPSHOT_FILE, TRANSACTION_INDEX.
            parts.add(part(op, FileKind.LOG, data.logSegment()));
            parts.add(part(op, FileKind.OFFSET_INDEX, data.offsetIndex()));
            parts.add(part(op, FileKind.TIME_INDEX, data.timeIndex()));
            parts.add(part(op, FileKind.PRODUCER_SNAPSHOT_FILE, data.producerSnapshotIndex()));
            if (data.transactionIndex().isPresent()) {
                parts.add(part(op, FileKind.TRANSACTION_INDEX, data.transactionIndex().get()));
            }
            for (SegmentCopier.FilePart p : parts) {
                switch (p.kind) {
                    case LOG:
                        files.setLogSize(p.size);
                        break;
                    case OFFSET_INDEX:
                        files.setOffsetIndexSize(p.size);
                        break;
                    case TIME_INDEX:
                        files.setTimeIndexSize(p.size);
                        break;
                    case PRODUCER_SNAPSHOT_FILE:
                        files.setProducerSnapshotSize(p.size);
                        break;
                    case TRANSACTION_INDEX:
                        files.setTransactionIndexSize(p.size);
                        break;
                    default:
                        throw new IllegalStateException(p.kind.toString());
                }
            }
            begin.setMode(TransferMode.STREAM).setFiles(files);
        }
        return begin.build();
    }

    /** The bytes of a segment's files, as counted in {@link ShimMetrics#copyBytes}. */
    static long copiedBytes(LogSegmentData data) {
        long n = data.leaderEpochIndex().remaining();
        List<Path> files = new ArrayList<>(List.of(data.logSegment(), data.offsetIndex(), data.timeIndex(),
                data.producerSnapshotIndex()));
        data.transactionIndex().ifPresent(files::add);
        for (Path p : files) {
            try {
                n += Files.size(p);
            } catch (IOException e) {
                // gone after the copy: not counted
            }
        }
        return n;
    }

    private static String absolute(Path p) {
        return p.toAbsolutePath().toString();
    }

    private static SegmentCopier.FilePart part(String op, FileKind kind, Path path) throws RemoteStorageException {
        try {
            return new SegmentCopier.FilePart(kind, path, Files.size(path));
        } catch (IOException e) {
            throw new RemoteStorageException(op + " failed: cannot read the size of " + kind + " file " + path
                    + ": " + e, e);
        }
    }

    private SegmentCopier(Channel channel, CallOptions options, String operation) {
        this.call = channel.newCall(RemoteStorageGrpc.getCopySegmentMethod(), options);
        this.operation = operation;
    }

    /**
     * Runs one attempt.
     *
     * @param files the files to stream, in proto order; empty for path mode
     * @throws StatusException the call failed (mapped/retried by the caller)
     * @throws InterruptedException the thread was interrupted; the call is cancelled
     * @throws RemoteStorageException a local file could not be read as declared; the call is cancelled
     */
    static CopySegmentResponse copy(Channel channel, CallOptions options, String operation, CopyBegin begin,
                                    List<FilePart> files)
            throws StatusException, InterruptedException, RemoteStorageException {
        return new SegmentCopier(channel, options, operation).run(begin, files);
    }

    private CopySegmentResponse run(CopyBegin begin, List<FilePart> files)
            throws StatusException, InterruptedException, RemoteStorageException {
        call.start(new ClientCall.Listener<CopySegmentResponse>() {
            @Override
            public void onMessage(CopySegmentResponse message) {
                response = message;
            }

            @Override
            public void onClose(Status s, Metadata trailers) {
                synchronized (lock) {
                    status = s;
                    lock.notifyAll();
                }
            }

            @Override
            public void onReady() {
                synchronized (lock) {
                    lock.notifyAll();
                }
            }
        }, new Metadata());
        call.request(1);
        try {
            if (send(CopySegmentRequest.newBuilder().setBegin(begin).build())) {
                for (FilePart file : files) {
                    if (!sendFile(file)) {
                        break;
                    }
                }
            }
            if (status == null) {
                call.halfClose();
            }
            synchronized (lock) {
                while (status == null) {
                    lock.wait();
                }
            }
        } catch (InterruptedException e) {
            call.cancel("interrupted", e);
            throw e;
        } catch (RuntimeException e) {
            call.cancel("failed: " + e, e);
            throw e;
        }
        Status s = status;
        if (!s.isOk()) {
            throw s.asException();
        }
        CopySegmentResponse r = response;
        if (r == null) {
            throw Status.INTERNAL.withDescription("the sidecar closed CopySegment with OK but sent no response")
                    .asException();
        }
        return r;
    }

    /** Waits for flow-control room, then sends; false if the call already ended. */
    private boolean send(CopySegmentRequest message) throws InterruptedException {
        synchronized (lock) {
            while (status == null && !call.isReady()) {
                lock.wait();
            }
            if (status != null) {
                return false;
            }
        }
        call.sendMessage(message);
        return true;
    }

    private boolean sendFile(FilePart file) throws InterruptedException, RemoteStorageException {
        if (file.size == 0) {
            return true;
        }
        try (FileChannel in = FileChannel.open(file.path, StandardOpenOption.READ)) {
            long remaining = file.size;
            while (remaining > 0) {
                // one message of up to 1 MiB, read into arrays of at most 256 KiB (a rope): a 1 MiB
                // array is a humongous object for G1 with a broker's 1-2 MiB heap regions
                int messageBytes = (int) Math.min(MAX_MESSAGE_BYTES, remaining);
                com.google.protobuf.ByteString data = com.google.protobuf.ByteString.EMPTY;
                for (int filled = 0; filled < messageBytes; ) {
                    byte[] piece = new byte[Math.min(PIECE_BYTES, messageBytes - filled)];
                    ByteBuffer buffer = ByteBuffer.wrap(piece);
                    while (buffer.hasRemaining()) {
                        if (in.read(buffer) < 0) {
                            String why = file.kind + " file " + file.path + " shrank during the copy: "
                                    + file.size + " bytes declared, "
                                    + (file.size - remaining + filled + buffer.position()) + " found";
                            call.cancel(why, null);
                            throw new RemoteStorageException(operation + " failed: " + why);
                        }
                    }
                    filled += piece.length;
                    data = data.concat(UnsafeByteOperations.unsafeWrap(piece));
                }
                CopySegmentRequest message = CopySegmentRequest.newBuilder()
                        .setData(CopyData.newBuilder().setFile(file.kind).setData(data))
                        .build();
                if (!send(message)) {
                    return false;
                }
                remaining -= messageBytes;
            }
            return true;
        } catch (ClosedByInterruptException e) {
            call.cancel("interrupted", e);
            InterruptedException ie = new InterruptedException("interrupted while reading " + file.path);
            ie.initCause(e);
            throw ie;
        } catch (IOException e) {
            String why = "cannot read " + file.kind + " file " + file.path + ": " + e;
            call.cancel(why, e);
            throw new RemoteStorageException(operation + " failed: " + why, e);
        }
    }
}
