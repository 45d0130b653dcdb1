import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

/**
 * Apache Curator's lock recipes driven by lines on stdin, so that distlock's interop test
 * (crates/distlock/tests/zookeeper_curator.rs) can play a real Curator client against its
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
 *   lead PATH TIMEOUT_MS           leading | timeout     a LeaderSelector on PATH that keeps
 *                                                        leadership until resign; on timeout
 *                                                        the selector is closed (leaves)
 *   resign                         resigned              gives the leadership up
 *   exit                           bye                   closes the client (its nodes go) and
 *                                                        exits 0; so does the end of stdin
 *   anything that fails            error MESSAGE         and the program goes on
 * </pre>
 *
 * <p>Extending: each command is one entry of {@link #commands}; its recipe objects live in a
 * map by path, as the mutexes do. {@code InterProcessReadWriteLock} ({@code read-acquire},
 * {@code write-acquire}, {@code read-release}, {@code write-release}) and {@code LeaderLatch}
 * ({@code latch-start}, {@code latch-await}, {@code latch-close}) would be added the same way
 * once distlock has their node layouts.
 */
public final class CuratorLock {
    /** A command's handler: the words after the command's name in, the reply line out. */
    private interface Command {
        String run(String[] args) throws Exception;
    }

    private final CuratorFramework client;
    /** One mutex per path, made on first use and kept so that re-entries and releases find it. */
    private final Map<String, InterProcessMutex> mutexes = new HashMap<>();
    private final Map<String, Command> commands = new HashMap<>();
    /** The one LeaderSelector in use, and the latches its leadership waits on. */
    private LeaderSelector selector;
    private CountDownLatch resigned;

    private CuratorLock(CuratorFramework client) {
        this.client = client;
        commands.put("acquire", this::acquire);
        commands.put("release", this::release);
        commands.put("participants", this::participants);
        commands.put("lead", this::lead);
        commands.put("resign", this::resign);
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

    private String lead(String[] args) throws Exception {
        arity(args, 2, 2, "lead PATH TIMEOUT_MS");
        if (selector != null) {
            throw new IllegalStateException("already campaigning: resign first");
        }
        long timeout = Long.parseLong(args[1]);
        CountDownLatch leading = new CountDownLatch(1);
        CountDownLatch resign = new CountDownLatch(1);
        LeaderSelector candidate = new LeaderSelector(client, args[0],
                new LeaderSelectorListenerAdapter() {
                    @Override
                    public void takeLeadership(CuratorFramework framework) throws Exception {
                        leading.countDown();
                        resign.await();
                    }
                });
        candidate.start();
        if (leading.await(timeout, TimeUnit.MILLISECONDS)) {
            selector = candidate;
            resigned = resign;
            return "leading";
        }
        candidate.close();
        return "timeout";
    }

    private String resign(String[] args) throws Exception {
        arity(args, 0, 0, "resign");
        if (selector == null) {
            throw new IllegalStateException("not leading");
        }
        resigned.countDown();
        selector.close();
        selector = null;
        resigned = null;
        return "resigned";
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
