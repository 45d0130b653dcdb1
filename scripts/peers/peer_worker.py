"""What every Python worker of `distlock bench --worker-command` shares: its arguments, the
stdio protocol (`ready`, `go`, one JSON report) and the contention loop. A worker supplies
how to connect, acquire and release.

The protocol: the command gets `--backend URL --name NAME --hold-ms H --duration-ms D`; it
connects, prints `ready`, waits for a `go` line on stdin, acquires / holds H ms / releases in
a loop until D ms have passed, and prints one line
{"intervals": [{"wait_start", "acquired", "release_start"}, ...]} of wall-clock nanoseconds.
Everything else goes to stderr; any failure exits non-zero (2 for bad usage).
"""

import argparse
import json
import logging
import sys
import time

# How long past the run an acquire may wait before the worker gives up.
GRACE_S = 10.0


class Worker:
    """One worker process: `prog` names it in messages."""

    def __init__(self, prog, description):
        self.prog = prog
        self.parser = argparse.ArgumentParser(prog=prog, description=description)
        self.parser.add_argument("--backend", required=True, help="the server's URL")
        self.parser.add_argument("--name", required=True, help="lock name, shared by all workers")
        self.parser.add_argument("--hold-ms", required=True, type=int, help="ms to hold each grant")
        self.parser.add_argument("--duration-ms", required=True, type=int, help="ms to contend for")
        self.out = sys.stdout

    def parse(self):
        """The arguments, checked; also keeps stdout for the protocol's lines alone."""
        args = self.parser.parse_args()
        if args.hold_ms < 0 or args.duration_ms < 0:
            self.parser.error("--hold-ms and --duration-ms must not be negative")
        if not args.name:
            self.parser.error("--name must not be empty")
        # Anything a library prints goes to stderr.
        self.out = sys.stdout
        sys.stdout = sys.stderr
        logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
        return args

    def fail(self, message, code=1):
        print(f"{self.prog}: {message}", file=sys.stderr, flush=True)
        sys.exit(code)

    @staticmethod
    def wait_limit_s(args):
        return args.duration_ms / 1000.0 + GRACE_S

    def run(self, args, acquire, release):
        """The handshake, then the loop: `acquire()` returns False when it gave up."""
        print("ready", file=self.out, flush=True)
        line = sys.stdin.readline()
        if line.strip() != "go":
            self.fail(f"expected 'go' on stdin, got {line!r}", code=2)
        hold_s = args.hold_ms / 1000.0
        deadline = time.monotonic() + args.duration_ms / 1000.0
        intervals = []
        try:
            while time.monotonic() < deadline:
                wait_start = time.time_ns()
                if not acquire():
                    self.fail(
                        f"lock {args.name!r} not acquired within {self.wait_limit_s(args):.1f} s"
                    )
                acquired = time.time_ns()
                if hold_s > 0:
                    time.sleep(hold_s)
                release_start = time.time_ns()
                release()
                intervals.append(
                    {"wait_start": wait_start, "acquired": acquired, "release_start": release_start}
                )
        except SystemExit:
            raise
        except Exception as error:  # noqa: BLE001 - any library error ends the run
            self.fail(f"{type(error).__name__}: {error}")
        self.out.write(json.dumps({"intervals": intervals}, separators=(",", ":")) + "\n")
        self.out.flush()
