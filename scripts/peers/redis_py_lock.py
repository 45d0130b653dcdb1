#!/usr/bin/env python3
"""Benchmark worker for redis-py's lock (`redis.lock.Lock`, made by `Redis.lock`).

Measures: how a pool of processes, each running this worker against one lock
name, shares redis-py's lock: per acquisition the wall-clock times (ns) when the
wait began, when the lock was granted and when its release began.

Library: redis-py 8.1.0 (pinned in requirements.txt beside this file). Options:
blocking acquire, lease (`timeout`) 30 s, poll interval `sleep=0.001` (1 ms, or
`--poll-ms P`; the library's default is 0.1 s, which would make every contended hand-off cost up to
100 ms), `blocking_timeout` = duration + 10 s, token kept thread-local (default).
The Redis key is the lock name unchanged. redis-py's lock has no queue or
notification: a waiter retries SET NX PX every `sleep` seconds.

Run by `distlock bench --backend redis://127.0.0.1:6379 --worker-command
"python3 scripts/peers/redis_py_lock.py"`, or by hand:

    python3 redis_py_lock.py --backend redis://127.0.0.1:6379[/DB] \
        --name NAME --hold-ms H --duration-ms D

Protocol: after connecting it prints `ready`, waits for a `go` line on stdin,
contends until D ms have passed, then prints one JSON line
{"intervals": [{"wait_start", "acquired", "release_start"}, ...]}.
Everything else goes to stderr; any failure exits non-zero.
"""

import argparse
import json
import logging
import sys
import time

LEASE_S = 30.0
POLL_S = 0.001
GRACE_S = 10.0


def fail(message, code=1):
    print(f"redis_py_lock: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def parse_args():
    parser = argparse.ArgumentParser(description="redis-py lock benchmark worker")
    parser.add_argument("--backend", required=True, help="redis://HOST:PORT[/DB]")
    parser.add_argument("--name", required=True, help="lock name, shared by all workers")
    parser.add_argument("--hold-ms", required=True, type=int, help="ms to hold each grant")
    parser.add_argument("--duration-ms", required=True, type=int, help="ms to contend for")
    parser.add_argument(
        "--poll-ms", type=float, default=POLL_S * 1000, help="ms between tries (default 1)"
    )
    args = parser.parse_args()
    if args.hold_ms < 0 or args.duration_ms < 0:
        parser.error("--hold-ms and --duration-ms must not be negative")
    if not args.poll_ms > 0:
        parser.error("--poll-ms must be positive")
    if not args.backend.startswith(("redis://", "rediss://")):
        parser.error(f"--backend must be a redis:// URL, got {args.backend!r}")
    return args


def main():
    args = parse_args()
    # Only this script's protocol lines may reach stdout: keep a handle on the real
    # stdout and point sys.stdout at stderr for anything a library might print.
    out = sys.stdout
    sys.stdout = sys.stderr
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)

    try:
        import redis
    except ImportError as error:
        fail(f"redis-py is not installed ({error}); pip install -r requirements.txt")

    try:
        client = redis.Redis.from_url(
            args.backend, socket_connect_timeout=10, socket_timeout=30
        )
        client.ping()
    except Exception as error:  # noqa: BLE001 - report any connection failure
        fail(f"cannot connect to {args.backend}: {error}")

    wait_limit_s = args.duration_ms / 1000.0 + GRACE_S
    lock = client.lock(
        args.name,
        timeout=LEASE_S,
        sleep=args.poll_ms / 1000.0,
        blocking=True,
        blocking_timeout=wait_limit_s,
    )
    hold_s = args.hold_ms / 1000.0

    print("ready", file=out, flush=True)
    line = sys.stdin.readline()
    if line.strip() != "go":
        fail(f"expected 'go' on stdin, got {line!r}", code=2)

    deadline = time.monotonic() + args.duration_ms / 1000.0
    intervals = []
    try:
        while time.monotonic() < deadline:
            wait_start = time.time_ns()
            if not lock.acquire():
                fail(f"lock {args.name!r} not acquired within {wait_limit_s:.1f} s")
            acquired = time.time_ns()
            if hold_s > 0:
                time.sleep(hold_s)
            release_start = time.time_ns()
            lock.release()
            intervals.append(
                {
                    "wait_start": wait_start,
                    "acquired": acquired,
                    "release_start": release_start,
                }
            )
    except Exception as error:  # noqa: BLE001 - any library error ends the run
        fail(f"{type(error).__name__}: {error}")
    finally:
        client.close()

    out.write(json.dumps({"intervals": intervals}, separators=(",", ":")) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
