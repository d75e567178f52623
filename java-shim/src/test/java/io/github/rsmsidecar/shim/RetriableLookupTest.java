package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.rsmsidecar.proto.v1.DeleteSegmentRequest;
import io.github.rsmsidecar.proto.v1.DeleteSegmentResponse;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.grpc.Status;
import io.grpc.StatusException;
import io.grpc.stub.StreamObserver;
import java.io.File;
import java.io.StringWriter;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The test class path has kafka-storage-api 3.6.2, which has no RetriableRemoteStorageException.
 * To test the 4.2+ path honestly, each test compiles a class with the real name
 * ({@code org.apache.kafka.server.log.remote.storage.RetriableRemoteStorageException extends
 * RemoteStorageException}, like Kafka's) into a temporary directory and loads it in a child class
 * loader of the one that defined {@link RemoteStorageException}, the way a 4.2 broker's class
 * path would provide it. The shim's lookup then runs unchanged against that loader. Putting such a
 * class on the main test class path instead would hide the 3.6 (class absent) path from every
 * other test.
 */
class RetriableLookupTest {

    @TempDir
    Path dir;

    /** Compiles {@code source} for class {@code fqcn} and returns a loader that sees it. */
    private ClassLoader loaderWith(String fqcn, String source) throws Exception {
        Path src = dir.resolve(fqcn.replace('.', '/') + ".java");
        Files.createDirectories(src.getParent());
        Files.writeString(src, source);
        Path out = Files.createDirectories(dir.resolve("classes"));
        JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
        assertNotNull(javac, "tests need a JDK");
        String kafkaApi = Path.of(RemoteStorageException.class.getProtectionDomain().getCodeSource().getLocation().toURI())
                .toString();
        StringWriter diagnostics = new StringWriter();
        boolean ok = javac.getTask(diagnostics, null, null,
                List.of("-classpath", kafkaApi, "-d", out.toString(), "--release", "17"), null,
                javac.getStandardFileManager(null, null, null).getJavaFileObjects(src.toFile())).call();
        assertTrue(ok, diagnostics.toString());
        return new URLClassLoader(new URL[] {out.toUri().toURL()}, RemoteStorageException.class.getClassLoader());
    }

    private ClassLoader kafka42Loader() throws Exception {
        return loaderWith(ErrorMapper.RETRIABLE_CLASS,
                "package org.apache.kafka.server.log.remote.storage;\n"
                        + "public class RetriableRemoteStorageException extends RemoteStorageException {\n"
                        + "  public RetriableRemoteStorageException(String m) { super(m); }\n"
                        + "  public RetriableRemoteStorageException(String m, Throwable c) { super(m, c); }\n"
                        + "}\n");
    }

    @Test
    void absentOnKafka36() {
        ErrorMapper mapper = new ErrorMapper(RemoteStorageException.class.getClassLoader(), ErrorMapper.RETRIABLE_CLASS);
        assertFalse(mapper.hasRetriableClass());
        RemoteStorageException e = mapper.map("op", Status.UNAVAILABLE, false);
        assertEquals(RemoteStorageException.class, e.getClass());
    }

    @Test
    void presentOnKafka42TransientCodesUseIt() throws Exception {
        ClassLoader loader = kafka42Loader();
        ErrorMapper mapper = new ErrorMapper(loader, ErrorMapper.RETRIABLE_CLASS);
        assertTrue(mapper.hasRetriableClass());
        Class<?> retriable = Class.forName(ErrorMapper.RETRIABLE_CLASS, false, loader);
        for (Status.Code code : Status.Code.values()) {
            if (code == Status.Code.OK) {
                continue;
            }
            Status status = Status.fromCode(code).withDescription("d-" + code);
            RemoteStorageException e = mapper.map("op", status, false);
            if (ErrorMapper.TRANSIENT.contains(code)) {
                assertEquals(retriable, e.getClass(), code.toString());
                assertTrue(e.getMessage().contains(code + ": d-" + code), e.getMessage());
                assertEquals(code, ((StatusException) e.getCause()).getStatus().getCode());
            } else if (code == Status.Code.NOT_FOUND) {
                assertEquals(RemoteResourceNotFoundException.class, e.getClass());
            } else {
                assertEquals(RemoteStorageException.class, e.getClass(), code.toString());
            }
        }
        assertEquals(List.of(Status.Code.UNAVAILABLE, Status.Code.DEADLINE_EXCEEDED, Status.Code.RESOURCE_EXHAUSTED,
                Status.Code.ABORTED).stream().sorted().toList(), ErrorMapper.TRANSIENT.stream().sorted().toList());
    }

    @Test
    void theShimThrowsItEndToEnd() throws Exception {
        ClassLoader loader = kafka42Loader();
        RemoteStorageGrpc.RemoteStorageImplBase busy = new RemoteStorageGrpc.RemoteStorageImplBase() {
            @Override
            public void deleteSegment(DeleteSegmentRequest request, StreamObserver<DeleteSegmentResponse> observer) {
                observer.onError(Status.RESOURCE_EXHAUSTED.withDescription("too many calls").asRuntimeException());
            }
        };
        try (Fixtures.Harness h = new Fixtures.Harness(busy, Fixtures.config(),
                new ErrorMapper(loader, ErrorMapper.RETRIABLE_CLASS))) {
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> h.rsm.deleteLogSegmentData(Fixtures.metadata()));
            assertEquals(ErrorMapper.RETRIABLE_CLASS, e.getClass().getName());
            assertTrue(e.getMessage().contains("RESOURCE_EXHAUSTED: too many calls"), e.getMessage());
        }
    }

    @Test
    void aClassOfThatNameThatIsNoRemoteStorageExceptionIsIgnored() throws Exception {
        ClassLoader loader = loaderWith("fake.NotAnRse", "package fake; public class NotAnRse extends Exception {"
                + " public NotAnRse(String m, Throwable c) { super(m, c); } }");
        ErrorMapper mapper = new ErrorMapper(loader, "fake.NotAnRse");
        assertFalse(mapper.hasRetriableClass());
        assertInstanceOf(RemoteStorageException.class, mapper.map("op", Status.ABORTED, false));
        assertTrue(new File(dir.toFile(), "classes").isDirectory());
    }
}
