package io.github.rsmsidecar.shim;

/** The shim's version, from the jar manifest (unknown when run from classes, e.g. in unit tests). */
final class Version {

    private Version() {
    }

    static String get() {
        String v = Version.class.getPackage().getImplementationVersion();
        return v == null ? "dev" : v;
    }
}
