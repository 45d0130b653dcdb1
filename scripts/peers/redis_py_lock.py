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

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_worker import Worker  # noqa: E402

LEASE_S = 30.0
POLL_S = 0.001


def main():
    worker = Worker("redis_py_lock", "redis-py lock benchmark worker")
    worker.parser.add_argument(
        "--poll-ms", type=float, default=POLL_S * 1000, help="ms between tries (default 1)"
    )
    args = worker.parse()
    if not args.poll_ms > 0:
        worker.parser.error("--poll-ms must be positive")
    if not args.backend.startswith(("redis://", "rediss://")):
        worker.parser.error(f"--backend must be a redis:// URL, got {args.backend!r}")
    try:
        import redis
    except ImportError as error:
        worker.fail(f"redis-py is not installed ({error}); pip install -r requirements.txt")
    try:
        client = redis.Redis.from_url(args.backend, socket_connect_timeout=10, socket_timeout=30)
        client.ping()
    except Exception as error:  # noqa: BLE001 - report any connection failure
        worker.fail(f"cannot connect to {args.backend}: {error}")
    lock = client.lock(
        args.name,
        timeout=LEASE_S,
        sleep=args.poll_ms / 1000.0,
        blocking=True,
        blocking_timeout=worker.wait_limit_s(args),
    )
    try:
        worker.run(args, lock.acquire, lock.release)
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
