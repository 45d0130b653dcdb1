#!/usr/bin/env python3
"""Benchmark worker for kazoo's ZooKeeper lock recipe (`kazoo.recipe.lock.Lock`).

Measures: how a pool of processes, each running this worker against one lock
name, shares kazoo's lock: per acquisition the wall-clock times (ns) when the
wait began, when the lock was granted and when its release began.

Library: kazoo 2.11.0 (pinned in requirements.txt beside this file), default
threading handler, session timeout 10 s (kazoo's default, and distlock's).
Options: one Lock object per process, reused for every acquisition; blocking
acquire with `timeout` = duration + 10 s; ephemeral contender nodes (default).
The recipe queues: each acquire creates an ephemeral sequential znode under the
lock path and watches only its predecessor, so there is no polling. Note that a
reused Lock does one extra get_children per acquire after its first (it looks
for a node it may have created before a lost reply).

Lock path: BASE + "/" + the name with every byte outside A-Z a-z 0-9 - _ .
written as %XX (so "bench/x" becomes "bench%2Fx"), the same mapping distlock
uses; BASE is the URL's path, or /distlock/locks when the URL has none. BASE is
created if missing.

Run by `distlock bench --backend zk://127.0.0.1:2181/distlock-bench
--worker-command "python3 scripts/peers/kazoo_lock.py"`, or by hand:

    python3 kazoo_lock.py --backend zk://HOST:PORT[,HOST:PORT...][/BASE] \
        --name NAME --hold-ms H --duration-ms D

Protocol: after connecting it prints `ready`, waits for a `go` line on stdin,
contends until D ms have passed, then prints one JSON line
{"intervals": [{"wait_start", "acquired", "release_start"}, ...]}.
Everything else goes to stderr; any failure exits non-zero.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_worker import Worker  # noqa: E402

DEFAULT_BASE = "/distlock/locks"
SESSION_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 15.0


def parse_backend(url):
    """Split zk://hosts[/base][?session_timeout=10s] into (hosts, base, session timeout s)."""
    if not url.startswith("zk://"):
        raise ValueError("the scheme must be zk://")
    rest = url[len("zk://"):]
    rest, _, query = rest.partition("?")
    slash = rest.find("/")
    hosts, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    servers = []
    for server in hosts.split(","):
        name, colon, port = server.rpartition(":")
        if not colon:
            name, port = server, "2181"
        if not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad server {server!r}")
        servers.append(f"{name}:{port}")
    base = path.rstrip("/") or DEFAULT_BASE
    for part in base[1:].split("/"):
        if part in ("", ".", ".."):
            raise ValueError(f"the base path {base!r} has an empty, . or .. part")
    if base == "/zookeeper" or base.startswith("/zookeeper/"):
        raise ValueError("/zookeeper is ZooKeeper's own tree")
    session_timeout = SESSION_TIMEOUT_S
    for pair in filter(None, query.split("&")):
        key, _, value = pair.partition("=")
        if key != "session_timeout":
            raise ValueError(f"unknown query parameter {key!r}")
        match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s)?", value)
        if not match:
            raise ValueError(f"bad session_timeout {value!r} (write e.g. 10s or 500ms)")
        session_timeout = float(match.group(1)) / (1000.0 if match.group(2) == "ms" else 1.0)
    return ",".join(servers), base, session_timeout


def lock_path(base, name):
    """One znode under base for the lock name (same mapping as distlock's)."""
    if name in (".", ".."):
        return base + "/" + "%2E" * len(name)
    encoded = "".join(
        chr(b) if (chr(b).isascii() and chr(b).isalnum()) or chr(b) in "-_." else f"%{b:02X}"
        for b in name.encode("utf-8")
    )
    return base + "/" + encoded


def main():
    worker = Worker("kazoo_lock", "kazoo lock benchmark worker")
    args = worker.parse()
    try:
        hosts, base, session_timeout = parse_backend(args.backend)
    except ValueError as error:
        worker.parser.error(f"--backend {args.backend!r}: {error}")
    try:
        from kazoo.client import KazooClient
        from kazoo.exceptions import LockTimeout
        from kazoo.recipe.lock import Lock
    except ImportError as error:
        worker.fail(f"kazoo is not installed ({error}); pip install -r requirements.txt")

    client = KazooClient(hosts=hosts, timeout=session_timeout)
    try:
        client.start(timeout=CONNECT_TIMEOUT_S)
        client.ensure_path(base)
    except Exception as error:  # noqa: BLE001 - report any connection failure
        client.close()
        worker.fail(f"cannot connect to {args.backend}: {type(error).__name__}: {error}")
    lock = Lock(client, lock_path(base, args.name))

    def acquire():
        try:
            return lock.acquire(blocking=True, timeout=worker.wait_limit_s(args))
        except LockTimeout:
            return False

    try:
        worker.run(args, acquire, lock.release)
    finally:
        try:
            client.stop()
            client.close()
        except Exception:  # noqa: BLE001 - the session ends with the process anyway
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
