// Peer worker for distlock's lock benchmark: measures Apache Curator's InterProcessMutex (the
// ZooKeeper lock recipe: an ephemeral-sequential node per waiter, each watching the one before
// it) so that its wait and hand-off times can be set beside distlock's zk:// backend.
//
// Versions: Debian's Curator 5.4.0 (curator-recipes/-framework/-client) with the ZooKeeper 3.8.0
// client, run on the JDK that javac comes with (17 on Debian 12). Options: session timeout
// 10 s (distlock's default), connection timeout 10 s, RetryNTimes(3, 100 ms); one
// InterProcessMutex per process, acquired with acquire(D + 10 s); slf4j-simple logs warnings
// and worse to stderr (set in main, so it holds however the program is started).
//
// Run it through the wrapper beside this file, which compiles it when needed:
//   scripts/peers/curator-worker --backend zk://127.0.0.1:2181/distlock-bench \
//       --name NAME --hold-ms H --duration-ms D
// The URL is zk://HOST:PORT[,HOST:PORT...][/BASE/PATH]; a ?query is accepted and ignored. The
// lock's znode is BASE + "/" + NAME with every "/" in NAME replaced by "_".
// Protocol: connect, print `ready`, read a `go` line from stdin, then acquire / hold H ms /
// release in a loop for D ms, and print one line
//   {"intervals":[{"wait_start":N,"acquired":N,"release_start":N},...]}
// with wall-clock nanoseconds since the Unix epoch. Usage errors exit 2, other failures 1;
// diagnostics go to stderr only.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public final class CuratorWorker {
    private static final String USAGE = "usage: curator-worker --backend zk://HOST:PORT[/BASE] "
            + "--name NAME --hold-ms H --duration-ms D";
    private static final int SESSION_TIMEOUT_MS = 10_000;
    private static final int CONNECT_TIMEOUT_MS = 10_000;

    /** A failure that ends the program with a given exit code and a message on stderr. */
    private static final class Exit extends RuntimeException {
        final int code;

        Exit(int code, String message) {
            super(message);
            this.code = code;
        }
    }

    private static Exit usage(String message) {
        return new Exit(2, message + "\n" + USAGE);
    }

    private static long wallNs() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000_000L + now.getNano();
    }

    private static long millis(Map<String, String> args, String flag) {
        String text = args.get(flag);
        if (!text.matches("\\d{1,15}")) {
            throw usage(flag + " must be a whole number of milliseconds, not \"" + text + "\"");
        }
        return Long.parseLong(text);
    }

    public static void main(String[] argv) {
        // Keep stdout for the protocol alone: anything a library prints goes to stderr.
        PrintStream out = new PrintStream(
                new java.io.FileOutputStream(java.io.FileDescriptor.out), false,
                StandardCharsets.UTF_8);
        System.setOut(System.err);
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
        // ZooKeeper 3.8 warns, with a stack trace, when the server drops the socket after a
        // normal session close; that is the end of every run here, so only its errors show.
        System.setProperty("org.slf4j.simpleLogger.log.org.apache.zookeeper.ClientCnxn", "error");
        int code;
        try {
            run(argv, out);
            code = 0;
        } catch (Exit e) {
            System.err.println("curator worker: " + e.getMessage());
            code = e.code;
        } catch (Throwable e) {
            System.err.print("curator worker: ");
            e.printStackTrace(System.err);
            code = 1;
        }
        out.flush();
        System.err.flush();
        // ZooKeeper's and Curator's threads need not all be daemons; do not wait for them.
        System.exit(code);
    }

    private static void run(String[] argv, PrintStream out) throws Exception {
        String[] flags = {"--backend", "--name", "--hold-ms", "--duration-ms"};
        Map<String, String> args = new HashMap<>();
        for (int i = 0; i < argv.length; i += 2) {
            String flag = argv[i];
            if (!java.util.Arrays.asList(flags).contains(flag)) {
                throw usage("unknown argument \"" + flag + "\"");
            }
            if (args.containsKey(flag)) {
                throw usage(flag + " given twice");
            }
            if (i + 1 >= argv.length) {
                throw usage(flag + " needs a value");
            }
            args.put(flag, argv[i + 1]);
        }
        for (String flag : flags) {
            if (!args.containsKey(flag)) {
                throw usage(flag + " is required");
            }
        }
        String backend = args.get("--backend");
        String name = args.get("--name");
        if (name.isEmpty()) {
            throw usage("--name must not be empty");
        }
        long holdMs = millis(args, "--hold-ms");
        long durationMs = millis(args, "--duration-ms");

        if (!backend.startsWith("zk://")) {
            throw usage("--backend must be a zk:// URL, not \"" + backend + "\"");
        }
        String rest = backend.substring("zk://".length());
        int query = rest.indexOf('?');
        if (query >= 0) {
            rest = rest.substring(0, query);
        }
        int slash = rest.indexOf('/');
        String hosts = slash >= 0 ? rest.substring(0, slash) : rest;
        String base = slash >= 0 ? rest.substring(slash) : "";
        while (base.endsWith("/")) {
            base = base.substring(0, base.length() - 1);
        }
        if (hosts.isEmpty()) {
            throw usage("--backend names no host: \"" + backend + "\"");
        }
        String lockPath = base + "/" + name.replace('/', '_');

        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(hosts)
                .sessionTimeoutMs(SESSION_TIMEOUT_MS)
                .connectionTimeoutMs(CONNECT_TIMEOUT_MS)
                .retryPolicy(new RetryNTimes(3, 100))
                .build();
        client.start();
        try {
            if (!client.blockUntilConnected(CONNECT_TIMEOUT_MS, TimeUnit.MILLISECONDS)) {
                throw new Exit(1, "cannot connect to " + hosts + " within "
                        + CONNECT_TIMEOUT_MS + " ms");
            }
            InterProcessMutex mutex = new InterProcessMutex(client, lockPath);

            out.println("ready");
            out.flush();
            BufferedReader stdin = new BufferedReader(
                    new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line = stdin.readLine();
            if (line == null) {
                throw new Exit(2, "stdin ended before `go`");
            }
            if (!line.trim().equals("go")) {
                throw new Exit(2, "expected `go` on stdin, got \"" + line + "\"");
            }

            long deadline = wallNs() + durationMs * 1_000_000L;
            StringBuilder json = new StringBuilder("{\"intervals\":[");
            boolean first = true;
            while (wallNs() < deadline) {
                long waitStart = wallNs();
                if (!mutex.acquire(durationMs + 10_000, TimeUnit.MILLISECONDS)) {
                    throw new Exit(1, "could not acquire " + lockPath + " within "
                            + (durationMs + 10_000) + " ms");
                }
                long acquired = wallNs();
                if (holdMs > 0) {
                    Thread.sleep(holdMs);
                }
                long releaseStart = wallNs();
                mutex.release();
                json.append(first ? "" : ",")
                        .append("{\"wait_start\":").append(waitStart)
                        .append(",\"acquired\":").append(acquired)
                        .append(",\"release_start\":").append(releaseStart)
                        .append('}');
                first = false;
            }
            json.append("]}");
            client.close();
            out.println(json);
            out.flush();
        } finally {
            client.close(); // a second close is a no-op
        }
    }
}
