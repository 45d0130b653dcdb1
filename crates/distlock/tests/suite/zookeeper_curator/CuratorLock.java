import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.RetryNTimes;

/**
 * Apache Curator's lock recipes driven by lines on stdin, so that distlock's interop test
 * (crates/distlock/tests/suite/zookeeper_curator.rs) can play a real Curator client against its
 * ZooKeeper backend.
 *
 * <p>Usage: {@code java CuratorLock <connect string> [session timeout ms]}, the connect string
 * as ZooKeeper takes it ({@code 127.0.0.1:2181}).
 *
 * <p>Protocol: one command per line on stdin; each command is answered by exactly one line on
 * stdout, in order. Commands run one at a time on the main thread (Curator's
 * {@code InterProcessMutex} counts re-entries per thread, so every acquire and release must
 * come from the same one); a waiting {@code acquire} answers nothing else until it returns.
 *
 * <pre>
 *   (at start)                     ready                 the session is connected
 *   acquire PATH TIMEOUT_MS        acquired | timeout    InterProcessMutex(PATH).acquire;
 *                                                        TIMEOUT_MS &lt; 0 waits without limit
 *   release [PATH]                 released              PATH may be left out when exactly one
 *                                                        mutex is held
 *   participants PATH              participants N1 N2..  the lock's nodes in Curator's order
 *                                                        (the first holds), full paths
 *   read-acquire PATH TIMEOUT_MS   acquired | timeout    InterProcessReadWriteLock(PATH)'s
 *   write-acquire PATH TIMEOUT_MS  acquired | timeout    read or write lock, as acquire
 *   read-release PATH              released
 *   write-release PATH             released
 *   latch-start PATH ID            started               a LeaderLatch on PATH with
 *                                                        participant id ID, started
 *   latch-await PATH TIMEOUT_MS    leading | timeout     waits for that latch to lead
 *   latch-leader PATH              leader ID             the latch's view of the leader's id
 *   latch-close PATH               closed                closes the latch (leaves the race)
 *   exit                           bye                   closes the client (its nodes go) and
 *                                                        exits 0; so does the end of stdin
 *   anything that fails            error MESSAGE         and the program goes on
 * </pre>
 *
 * <p>Extending: each command is one entry of {@link #commands}; its recipe objects live in a
 * map by path, as the mutexes do.
 */
public final class CuratorLock {
    /** A command's handler: the words after the command's name in, the reply line out. */
    private interface Command {
        String run(String[] args) throws Exception;
    }

    private final CuratorFramework client;
    /** One mutex per path, made on first use and kept so that re-entries and releases find it. */
    private final Map<String, InterProcessMutex> mutexes = new HashMap<>();
    private final Map<String, InterProcessReadWriteLock> rwlocks = new HashMap<>();
    private final Map<String, LeaderLatch> latches = new HashMap<>();
    private final Map<String, Command> commands = new HashMap<>();

    private CuratorLock(CuratorFramework client) {
        this.client = client;
        commands.put("acquire", this::acquire);
        commands.put("release", this::release);
        commands.put("participants", this::participants);
        commands.put("read-acquire",
                args -> timed(rwlock(args, "read-acquire").readLock(), args));
        commands.put("write-acquire",
                args -> timed(rwlock(args, "write-acquire").writeLock(), args));
        commands.put("read-release",
                args -> released(rwlock(args, "read-release").readLock()));
        commands.put("write-release",
                args -> released(rwlock(args, "write-release").writeLock()));
        commands.put("latch-start", this::latchStart);
        commands.put("latch-await", this::latchAwait);
        commands.put("latch-leader",
                args -> "leader " + latch(args, 1, "latch-leader PATH").getLeader().getId());
        commands.put("latch-close", this::latchClose);
    }

    /** The read-write lock of {@code args[0]}, made on first use. */
    private InterProcessReadWriteLock rwlock(String[] args, String command) {
        arity(args, 1, 2, command + " PATH [TIMEOUT_MS]");
        return rwlocks.computeIfAbsent(args[0], p -> new InterProcessReadWriteLock(client, p));
    }

    /** Acquires {@code mutex} waiting {@code args[1]} ms (without limit when negative). */
    private static String timed(InterProcessMutex mutex, String[] args) throws Exception {
        arity(args, 2, 2, "PATH TIMEOUT_MS");
        long timeout = Long.parseLong(args[1]);
        if (timeout < 0) {
            mutex.acquire();
            return "acquired";
        }
        return mutex.acquire(timeout, TimeUnit.MILLISECONDS) ? "acquired" : "timeout";
    }

    private static String released(InterProcessMutex mutex) throws Exception {
        mutex.release();
        return "released";
    }

    private LeaderLatch latch(String[] args, int arity, String usage) {
        arity(args, arity, arity, usage);
        LeaderLatch latch = latches.get(args[0]);
        if (latch == null) {
            throw new IllegalStateException("no latch started on " + args[0]);
        }
        return latch;
    }

    private String latchStart(String[] args) throws Exception {
        arity(args, 2, 2, "latch-start PATH ID");
        if (latches.containsKey(args[0])) {
            throw new IllegalStateException("a latch runs on " + args[0] + ": close it first");
        }
        LeaderLatch latch = new LeaderLatch(client, args[0], args[1]);
        latch.start();
        latches.put(args[0], latch);
        return "started";
    }

    private String latchAwait(String[] args) throws Exception {
        LeaderLatch latch = latch(args, 2, "latch-await PATH TIMEOUT_MS");
        long timeout = Long.parseLong(args[1]);
        return latch.await(timeout, TimeUnit.MILLISECONDS) ? "leading" : "timeout";
    }

    private String latchClose(String[] args) throws Exception {
        latch(args, 1, "latch-close PATH").close();
        latches.remove(args[0]);
        return "closed";
    }

    private InterProcessMutex mutex(String path) {
        return mutexes.computeIfAbsent(path, p -> new InterProcessMutex(client, p));
    }

    private static void arity(String[] args, int min, int max, String usage) {
        if (args.length < min || args.length > max) {
            throw new IllegalArgumentException("usage: " + usage);
        }
    }

    private String acquire(String[] args) throws Exception {
        arity(args, 2, 2, "acquire PATH TIMEOUT_MS");
        InterProcessMutex mutex = mutex(args[0]);
        long timeout = Long.parseLong(args[1]);
        if (timeout < 0) {
            mutex.acquire();
            return "acquired";
        }
        return mutex.acquire(timeout, TimeUnit.MILLISECONDS) ? "acquired" : "timeout";
    }

    private String release(String[] args) throws Exception {
        arity(args, 0, 1, "release [PATH]");
        InterProcessMutex mutex;
        if (args.length == 1) {
            mutex = mutexes.get(args[0]);
            if (mutex == null) {
                throw new IllegalStateException("no mutex for " + args[0]);
            }
        } else {
            mutex = null;
            for (InterProcessMutex candidate : mutexes.values()) {
                if (candidate.isOwnedByCurrentThread()) {
                    if (mutex != null) {
                        throw new IllegalStateException("several mutexes held: name the path");
                    }
                    mutex = candidate;
                }
            }
            if (mutex == null) {
                throw new IllegalStateException("no mutex held");
            }
        }
        mutex.release();
        return "released";
    }

    private String participants(String[] args) throws Exception {
        arity(args, 1, 1, "participants PATH");
        StringBuilder line = new StringBuilder("participants");
        for (String node : mutex(args[0]).getParticipantNodes()) {
            line.append(' ').append(node);
        }
        return line.toString();
    }

    /** Answers each line of {@code in} on {@code out} until {@code exit} or the end of input. */
    private void serve(BufferedReader in, PrintStream out) throws Exception {
        String line;
        while ((line = in.readLine()) != null) {
            String[] words = line.trim().split("\\s+");
            if (words.length == 0 || words[0].isEmpty()) {
                continue;
            }
            if (words[0].equals("exit")) {
                break;
            }
            String[] args = new String[words.length - 1];
            System.arraycopy(words, 1, args, 0, args.length);
            Command command = commands.get(words[0]);
            String reply;
            if (command == null) {
                reply = "error unknown command " + words[0];
            } else {
                try {
                    reply = command.run(args);
                } catch (Exception e) {
                    reply = "error " + e.getClass().getSimpleName() + ": "
                            + String.valueOf(e.getMessage()).replace('\n', ' ');
                }
            }
            out.println(reply);
        }
    }

    public static void main(String[] argv) throws Exception {
        if (argv.length < 1 || argv.length > 2) {
            System.err.println("usage: java CuratorLock CONNECT_STRING [SESSION_TIMEOUT_MS]");
            System.exit(2);
        }
        int sessionTimeout = argv.length == 2 ? Integer.parseInt(argv[1]) : 10_000;
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        CuratorFramework client = CuratorFrameworkFactory.newClient(
                argv[0], sessionTimeout, 10_000, new RetryNTimes(3, 200));
        client.start();
        try {
            if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
                out.println("error not connected to " + argv[0]);
                System.exit(1);
            }
            out.println("ready");
            BufferedReader in = new BufferedReader(
                    new InputStreamReader(System.in, StandardCharsets.UTF_8));
            new CuratorLock(client).serve(in, out);
        } finally {
            client.close();
        }
        out.println("bye");
    }
}
