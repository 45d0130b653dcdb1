#!/usr/bin/env python3
"""distlock next to other libraries' locks on the same server, in one sitting.

Runs `distlock bench` once per lock and scenario, with distlock's own worker processes and
with the workers beside this file (redis-py and redis-semaphore on Redis; kazoo and Apache
Curator on ZooKeeper), in rounds that rotate the order, and prints the medians as Markdown
tables with each figure's ratio to the best other library. Scenarios, as in issue #19:

* uncontended: one worker process, no hold: acquire+release pairs per second;
* contended: 8 worker processes on one lock, 1 ms hold: grants per second, grants per second
  that went to another process than the releaser (a lock that hands the lock back to its
  releaser runs fast and starves the others), the handoff to another process (p50), the
  longest wait, and the fewest and most grants of one process.

Needs a release build (`cargo build --release -p distlock-cli`), the Python packages of
requirements.txt (`pip install -r scripts/peers/requirements.txt`), `npm ci` in
scripts/peers/redis-semaphore, and javac with Debian's Curator jars (scripts/test installs
those). Usage:

    python3 scripts/peers/compare.py [--backend redis|zookeeper ...] [--rounds 3]
        [--duration-s 3] [--redis URL] [--zk URL]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DISTLOCK = os.path.join(ROOT, "target", "release", "distlock")

# The locks compared on each server: a label and the worker command (None: distlock's own).
LOCKS = {
    "redis": [
        ("distlock", None),
        ("redis-py 8.1.0, 1 ms poll", f"python3 {HERE}/redis_py_lock.py"),
        ("redis-py 8.1.0, its default 100 ms poll", f"python3 {HERE}/redis_py_lock.py --poll-ms 100"),
        ("redis-semaphore 5.8.0, 1 ms retry", f"node {HERE}/redis-semaphore/worker.mjs"),
        ("redis-semaphore 5.8.0, its default 10 ms retry",
         f"node {HERE}/redis-semaphore/worker.mjs --retry-ms 10"),
    ],
    "zookeeper": [
        ("distlock", None),
        ("kazoo 2.11.0", f"python3 {HERE}/kazoo_lock.py"),
        ("Curator 5.4.0", f"{HERE}/curator-worker"),
    ],
}

SCENARIOS = {
    "uncontended": ["--workers", "1", "--hold-ms", "0"],
    "contended": ["--workers", "8", "--hold-ms", "1"],
}


def bench(url, command, scenario, duration_s):
    args = [
        DISTLOCK, "bench", "--backend", url, "--duration-s", str(duration_s),
        "--pairs", "200", "--rtt-samples", "300", "--json",
    ] + SCENARIOS[scenario]
    if command:
        args += ["--worker-command", command]
    done = subprocess.run(args, capture_output=True, text=True, timeout=duration_s + 300)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{done.stderr[-2000:]}")
    row = json.loads(done.stdout)["results"][0]
    c = row["contention"]
    per_worker = c["acquisitions_per_worker"]
    return {
        "rtt_ms": row["rtt"]["mean_ms"],
        "per_s": c["throughput_per_s"],
        "to_other_per_s": c["throughput_per_s"] * (1.0 - c["same_worker_share"]),
        "handoff_p50_ms": c["handoff_gap_to_other"]["p50_ms"],
        "max_wait_ms": c["wait"]["max_ms"],
        "fewest": min(per_worker),
        "most": max(per_worker),
    }


def median(runs, key):
    return statistics.median(run[key] for run in runs)


def table(backend, results, rounds):
    print(f"\n### {backend} ({rounds} rounds, medians; RTT = distlock's ping in the same runs)\n")
    rtt = statistics.median(r["rtt_ms"] for runs in results.values() for r in runs)
    print(f"RTT {rtt:.3f} ms\n")
    print("| lock | uncontended pairs/s | contended grants/s | to another process/s "
          "| handoff to another p50 ms | max wait ms | grants per process |")
    print("|---|---|---|---|---|---|---|")
    labels = [label for label, _ in LOCKS[backend]]
    others = labels[1:]

    def best(scenario, key, low=False):
        values = [median(results[(o, scenario)], key) for o in others]
        return min(values) if low else max(values)

    for label in labels:
        un = results[(label, "uncontended")]
        co = results[(label, "contended")]
        cells = [label]
        for runs, key, low in [
            (un, "per_s", False), (co, "per_s", False), (co, "to_other_per_s", False),
            (co, "handoff_p50_ms", True), (co, "max_wait_ms", True),
        ]:
            value = median(runs, key)
            text = f"{value:,.0f}" if value >= 10 else f"{value:.2f}"
            if label == "distlock":
                scenario = "uncontended" if runs is un else "contended"
                reference = best(scenario, key, low)
                text += f" ({value / reference:.2f}x best other)" if reference else ""
            cells.append(text)
        cells.append(f"{median(co, 'fewest'):.0f}–{median(co, 'most'):.0f}")
        print("| " + " | ".join(cells) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", choices=sorted(LOCKS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration-s", type=int, default=3)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--zk", default="zk://127.0.0.1:2181/distlock-peers")
    args = parser.parse_args()
    if not os.access(DISTLOCK, os.X_OK):
        sys.exit(f"{DISTLOCK} missing: cargo build --release -p distlock-cli")
    urls = {"redis": args.redis, "zookeeper": args.zk}
    for backend in args.backend or sorted(LOCKS):
        locks = LOCKS[backend]
        results = {}
        for round_number in range(args.rounds):
            # Rotate the order, so that no lock always runs first (or last) in a round.
            shift = round_number % len(locks)
            for label, command in locks[shift:] + locks[:shift]:
                for scenario in SCENARIOS:
                    run = bench(urls[backend], command, scenario, args.duration_s)
                    results.setdefault((label, scenario), []).append(run)
                    print(f"{backend} round {round_number + 1}: {label}, {scenario}: "
                          f"{run['per_s']:,.0f}/s", file=sys.stderr, flush=True)
        table(backend, results, args.rounds)


if __name__ == "__main__":
    main()
