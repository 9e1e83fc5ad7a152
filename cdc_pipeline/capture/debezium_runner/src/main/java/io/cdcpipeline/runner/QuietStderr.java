package io.cdcpipeline.runner;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.Charset;
import java.util.regex.Pattern;

/**
 * Takes known third-party noise out of the JVM's standard error: ANTLR's warning that Debezium's DDL parser was
 * generated with another ANTLR version than the runtime Spark ships (Spark's must win; the parser works with it).
 * Every other line passes unchanged. Installed by the driver unless the run is verbose.
 */
public final class QuietStderr extends OutputStream {
    private static final Pattern NOISE = Pattern.compile("^ANTLR (Tool|Runtime) version .* does not match .*");

    private final PrintStream target;
    private final Charset charset;
    private final ByteArrayOutputStream line = new ByteArrayOutputStream(256);

    private QuietStderr(PrintStream target) {
        this.target = target;
        this.charset = Charset.defaultCharset();
    }

    /** Wraps System.err once (a second call changes nothing). */
    public static synchronized void install() {
        if (System.err instanceof Filtered) {
            return;
        }
        System.setErr(new Filtered(new QuietStderr(System.err)));
    }

    @Override
    public synchronized void write(int b) {
        line.write(b);
        if (b == '\n') {
            String text = line.toString(charset);
            if (!NOISE.matcher(text.strip()).matches()) {
                target.write(line.toByteArray(), 0, line.size());
                target.flush();
            }
            line.reset();
        }
    }

    @Override
    public synchronized void write(byte[] bytes, int offset, int length) {
        for (int i = offset; i < offset + length; i++) {
            write(bytes[i]);
        }
    }

    @Override
    public synchronized void flush() throws IOException {
        target.flush();  // a line is passed on once it is whole
    }

    /** The filtered stream as System.err, recognisable so that it is installed once. */
    private static final class Filtered extends PrintStream {
        Filtered(OutputStream out) {
            super(out, true);
        }
    }
}
