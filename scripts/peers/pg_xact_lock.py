#!/usr/bin/env python3
"""Benchmark worker for a hand-written transaction-scoped PostgreSQL advisory lock, made to
run through a transaction pooler (PgBouncer, `pool_mode = transaction`).

Measures: whether a fleet larger than the server's `max_connections` can share one lock when
its waiters hold no server connection of their own. A grant is `BEGIN;
SELECT pg_advisory_xact_lock(key), nextval(seq)` (the sequence gives a fencing token, as
distlock's advisory lock does), a release is `COMMIT`. The pooler lends a server connection
for the transaction only: a waiter queued in the pooler (beyond its pool) holds none, a
waiter in `pg_advisory_xact_lock` holds one. It is a measurement of that design, not a lock
to use: it has no lease, no lost-lock detection and no cancellation.

Library: psycopg 3.2 (with the machine's libpq), `prepare_threshold=None` (PgBouncer 1.18
cannot keep named prepared statements in transaction mode). The advisory key is the
lock name's 64-bit hash, computed by the server (`hashtextextended(name, 0)`).

Run by `distlock bench --backend postgres://postgres@127.0.0.1:5432/test --worker-command
"python3 scripts/peers/pg_xact_lock.py --connect postgres://postgres@127.0.0.1:6433/test"`
with a PgBouncer on 6433 in front of that server (see docs/performance.md); without
`--connect`, straight to the benchmark's server. Protocol: see peer_worker.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_worker import Worker  # noqa: E402

SEQUENCE = "distlock_peer_xact_token_seq"


def main():
    worker = Worker("pg_xact_lock", "transaction-scoped advisory lock benchmark worker")
    worker.parser.add_argument(
        "--connect",
        help="connect here instead of --backend: a pooler in front of the benchmark's server",
    )
    args = worker.parse()
    url = args.connect or args.backend
    if not url.startswith(("postgres://", "postgresql://")):
        worker.parser.error(f"the server must be a postgres:// URL, got {url!r}")
    try:
        import psycopg
    except ImportError as error:
        worker.fail(f"psycopg is not installed ({error}); pip install -r requirements.txt")
    try:
        conn = psycopg.connect(url, prepare_threshold=None, connect_timeout=30)
    except Exception as error:  # noqa: BLE001 - report any connection failure
        worker.fail(f"cannot connect to {url}: {error}")
    try:
        with conn.transaction():
            conn.execute(f"CREATE SEQUENCE IF NOT EXISTS {SEQUENCE}")
    except psycopg.errors.UniqueViolation:
        pass  # another worker made it at the same moment
    tokens = []

    def acquire():
        # psycopg opens the transaction with the first statement; the pooler lends a server
        # connection from there until the COMMIT.
        row = conn.execute(
            f"SELECT pg_advisory_xact_lock(hashtextextended(%s, 0)), nextval('{SEQUENCE}')",
            (args.name,),
        ).fetchone()
        tokens.append(row[1])
        return True

    def release():
        conn.commit()

    try:
        worker.run(args, acquire, release)
    finally:
        conn.close()
    if any(b <= a for a, b in zip(tokens, tokens[1:])):
        print("pg_xact_lock: fencing tokens did not grow", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
