// Peer worker for distlock's lock benchmark: measures redis-semaphore's `Mutex` (the simple,
// single-server one: SET NX PX to take, a compare-and-delete Lua script to give back) so that
// its wait and hand-off times can be set beside distlock's.
//
// Versions (pinned exactly in package.json / package-lock.json): redis-semaphore 5.8.0 over
// ioredis 6.0.0, on Node >= 20.
// Mutex options: lockTimeout 30000 ms; retryInterval 1 ms unless `--retry-ms R` says otherwise
// (the library's default is 10 ms, and a waiter only polls, so this is the knob that sets its
// hand-off latency); acquireTimeout
// D + 10000 ms; refreshInterval left at its default (0.8 * lockTimeout = 24000 ms, so it never
// fires within a hold of the benchmark).
//
// Run (after `npm ci` in this directory), one process per contender, all with the same NAME:
//   node worker.mjs --backend redis://127.0.0.1:6379 --name NAME --hold-ms H --duration-ms D
// Protocol: connect, print `ready`, read a `go` line from stdin, then acquire / hold H ms /
// release in a loop for D ms, and print one line
//   {"intervals":[{"wait_start":N,"acquired":N,"release_start":N},...]}
// with wall-clock nanoseconds since the Unix epoch. Usage errors exit 2, other failures 1;
// diagnostics go to stderr only.

import { createInterface } from 'node:readline';
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { Mutex } from 'redis-semaphore';

const USAGE =
  'usage: node worker.mjs --backend redis://HOST:PORT --name NAME --hold-ms H --duration-ms D [--retry-ms R]';

function usageError(message) {
  process.stderr.write(`redis-semaphore worker: ${message}\n${USAGE}\n`);
  process.exit(2);
}

function protocolError(message) {
  process.stderr.write(`redis-semaphore worker: ${message}\n`);
  process.exit(2);
}

function fail(message) {
  process.stderr.write(`redis-semaphore worker: ${message}\n`);
  process.exit(1);
}

function parseArgs(argv) {
  const wanted = ['--backend', '--name', '--hold-ms', '--duration-ms'];
  const values = new Map([['--retry-ms', '1']]);
  const given = new Set();
  for (let i = 0; i < argv.length; i += 2) {
    const flag = argv[i];
    if (!wanted.includes(flag) && flag !== '--retry-ms') usageError(`unknown argument ${JSON.stringify(flag)}`);
    if (given.has(flag)) usageError(`${flag} given twice`);
    given.add(flag);
    if (i + 1 >= argv.length) usageError(`${flag} needs a value`);
    values.set(flag, argv[i + 1]);
  }
  for (const flag of wanted) {
    if (!values.has(flag)) usageError(`${flag} is required`);
  }
  const millis = (flag) => {
    const text = values.get(flag);
    if (!/^\d+$/.test(text)) usageError(`${flag} must be a whole number of milliseconds, not ${JSON.stringify(text)}`);
    const n = Number(text);
    if (!Number.isSafeInteger(n)) usageError(`${flag} is too large`);
    return n;
  };
  const backend = values.get('--backend');
  if (!/^rediss?:\/\//.test(backend)) usageError(`--backend must be a redis:// URL, not ${JSON.stringify(backend)}`);
  const name = values.get('--name');
  if (name === '') usageError('--name must not be empty');
  return {
    backend,
    name,
    holdMs: millis('--hold-ms'),
    durationMs: millis('--duration-ms'),
    retryMs: Math.max(1, millis('--retry-ms')),
  };
}

// Wall clock in integer nanoseconds since the Unix epoch. performance.timeOrigin is a
// microsecond wall-clock reading taken at process start, and performance.now() a monotonic
// offset from it; keeping the two apart until they are integers avoids the double's rounding
// at ~1.7e18.
const ORIGIN_NS = BigInt(Math.round(performance.timeOrigin * 1e3)) * 1000n;
function wallNs() {
  return ORIGIN_NS + BigInt(Math.round(performance.now() * 1e6));
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Resolves with the first line of stdin, or null when stdin ends without one.
function readLine() {
  return new Promise((resolve) => {
    const lines = createInterface({ input: process.stdin, terminal: false });
    let done = false;
    lines.once('line', (line) => {
      done = true;
      lines.close();
      process.stdin.pause();
      resolve(line);
    });
    lines.once('close', () => {
      if (!done) resolve(null);
    });
  });
}

async function main() {
  const { backend, name, holdMs, durationMs, retryMs } = parseArgs(process.argv.slice(2));

  const redis = new Redis(backend, {
    lazyConnect: true,
    // Fail rather than reconnect behind the benchmark's back: a dropped connection ends the run.
    retryStrategy: () => null,
    maxRetriesPerRequest: 0,
  });
  redis.on('error', (err) => process.stderr.write(`redis-semaphore worker: redis: ${err.message}\n`));
  try {
    await redis.connect();
    await redis.ping();
  } catch (err) {
    fail(`cannot connect to ${backend}: ${err.message}`);
  }

  const mutex = new Mutex(redis, name, {
    lockTimeout: 30000,
    acquireTimeout: durationMs + 10000,
    retryInterval: retryMs,
    onLockLost: (err) => fail(`lost the lock while holding it: ${err.message}`),
  });

  process.stdout.write('ready\n');
  const line = await readLine();
  if (line === null) protocolError('stdin ended before `go`');
  if (line.trim() !== 'go') protocolError(`expected \`go\` on stdin, got ${JSON.stringify(line)}`);

  const deadline = wallNs() + BigInt(durationMs) * 1000000n;
  const intervals = [];
  while (wallNs() < deadline) {
    const waitStart = wallNs();
    await mutex.acquire(); // throws TimeoutError after acquireTimeout
    const acquired = wallNs();
    if (holdMs > 0) await sleep(holdMs);
    const releaseStart = wallNs();
    await mutex.release();
    intervals.push(`{"wait_start":${waitStart},"acquired":${acquired},"release_start":${releaseStart}}`);
  }

  try {
    await redis.quit();
  } catch {
    redis.disconnect();
  }
  process.stdout.write(`{"intervals":[${intervals.join(',')}]}\n`, () => process.exit(0));
}

main().catch((err) => fail(err && err.stack ? err.stack : String(err)));
