// `percept bench publish`: the publisher stage → a ZeroMQ SUB on loopback tcp, outside the sender's event loop.
// The subscriber is zeromq.js in a worker thread, or pyzmq in a Python process (tools/bench-sub.py).
// The pyzmq receive loop costs less per message, so its delivered rate measures the publisher more closely.
//   throughput  `messages` actions back to back: msgs_per_s delivered, send_msgs_per_s handed to ZeroMQ;
//   latency     `latencySamples` actions one at a time, from before process() to the subscriber's receive;
//   peer        a bare zeromq.js PUB sending the same bytes to the same subscriber, as the floor.
// Latency is one-way on the shared CLOCK_MONOTONIC, since a reply leg would not be the publisher's.
// Peer and stage latency samples alternate, so a noisy spell on a shared machine hits both alike.
// The sender sleeps while a message is in flight, since spinning would take a core from the sockets.
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { createInterface } from 'node:readline';
import { Worker } from 'node:worker_threads';
import { Publisher as PubSocket, Pull } from 'zeromq';
import { closeHeader } from '../../nodes/action-header.ts';
import { createPublisher } from '../../nodes/publisher.ts';
import { RealClock } from '../../pipeline/clock.ts';
import { TelemetryAggregator } from '../../pipeline/telemetry/aggregator.ts';
import type { ActionMessage } from '../../nodes/payloads.ts';
import type { StageContext } from '../../pipeline/types.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';
import { exitOf } from './worker.ts';
import { PYTHON } from './python.ts';
import { quantile } from '../stats.ts';

export const BENCH_SUBSCRIBERS = ['zeromq', 'pyzmq'] as const;
export type BenchSubscriberKind = (typeof BENCH_SUBSCRIBERS)[number];

export interface BenchPublishOptions {
  /** Messages in the throughput run (default 20000). */
  readonly messages?: number;
  /** Approximate bytes of the JSON body (default 128). */
  readonly size?: number;
  /** Ping-pong messages in the latency run, for the stage and for the peer each (default 2000). */
  readonly latencySamples?: number;
  readonly sendHighWaterMark?: number;
  /** The receiving peer: zeromq.js in a worker thread by default, or pyzmq in a Python process. */
  readonly subscriber?: BenchSubscriberKind;
}

// A type alias, not an interface, so it is assignable to Record<string, unknown> for CLI printing.
export type BenchPublishResult = {
  /** Delivered: received by the subscriber ÷ the time from the first send to its last receive. */
  readonly msgs_per_s: number;
  /** The publisher's own rate: accepted by the stage → handed to ZeroMQ, over the same run. */
  readonly send_msgs_per_s: number;
  /** One-at-a-time publish → receive latency. */
  readonly p50_us: number;
  readonly p99_us: number;
  readonly max_us: number;
  /** Latency of the throughput run's messages (includes queueing behind earlier ones). */
  readonly loaded_p50_us: number;
  readonly loaded_p99_us: number;
  /** The same measurements for a bare zeromq.js PUB socket sending the same bytes. */
  readonly peer_msgs_per_s: number;
  readonly peer_p50_us: number;
  readonly peer_p99_us: number;
  readonly peer_max_us: number;
  readonly messages: number;
  readonly received: number;
  readonly dropped: number;
  /** The peer's throughput run: received of `messages`. */
  readonly peer_received: number;
  readonly header_bytes: number;
  readonly body_bytes: number;
  readonly transport: string;
  /** Which subscriber received: `zeromq.js <version>` or `pyzmq <version> (libzmq <version>)`. */
  readonly subscriber: string;
};

/** A running subscriber, as the sender sees it. */
interface BenchSubscriber {
  /** What it is, with versions. */
  readonly name: string;
  /** [0] counts its reports, notified on each (per message, or per drain). [1] is the last seq
   * received from the stage + 1, [2] the same from the peer. */
  readonly counts: Int32Array;
  /** The first header the stage's messages carried. */
  readonly firstHeader: Promise<string>;
  /** Every message received, once it has received the end cue (a message on TELEMETRY_TOPIC). */
  readonly report: Promise<SubscriberReport>;
  /** Waits for it to end by itself, after the cue; stops it if it hangs. */
  closed(): Promise<void>;
}

interface SubscriberCommand {
  /** Resolved path of the zeromq package, for the worker's require. */
  readonly zeromq: string;
  readonly endpoints: readonly string[];
  readonly topics: readonly string[];
  /** Shared Int32Array: [0] messages received, notified on each, [1] the last seq received from
   * the stage + 1, [2] the same from the peer. */
  readonly counter: SharedArrayBuffer;
  /** Most messages the subscriber records. */
  readonly capacity: number;
}
interface SubscriberReport {
  readonly seqs: Int32Array;
  readonly receivedNs: BigInt64Array;
  /** 1 where the message came from the peer. */
  readonly fromPeer: Uint8Array;
}

const STAGE_TOPIC = 'actions';
const PEER_TOPIC = 'peer';
const TELEMETRY_TOPIC = 'telemetry';

export async function benchPublish(options: BenchPublishOptions = {}): Promise<BenchPublishResult> {
  const { messages = 20_000, size = 128, latencySamples = 2000, sendHighWaterMark = 100_000, subscriber = 'zeromq' } = options;
  if (!BENCH_SUBSCRIBERS.includes(subscriber))
    throw new RangeError(`benchPublish: expected subscriber ${BENCH_SUBSCRIBERS.join(' or ')} but received ${subscriber}`);
  for (const [name, v] of [
    ['messages', messages],
    ['size', size],
    ['latencySamples', latencySamples],
  ] as const) {
    if (!Number.isInteger(v) || v < 1) throw new RangeError(`benchPublish: expected integer >= 1 for ${name} but received ${v}`);
  }
  const topic = STAGE_TOPIC;
  const pub = await createPublisher({
    endpoint: 'tcp://127.0.0.1:*',
    topic,
    telemetryTopic: TELEMETRY_TOPIC,
    sendHighWaterMark,
    highWaterMarks: { actions: messages + latencySamples + 2000 },
  });
  const peer = new PubSocket({ sendHighWaterMark, noDrop: true, sendTimeout: 0, linger: 0 });
  const { stage: publisher, sink } = pub;
  /** Actions given to the stage so far: the seq the next one gets. */
  let accepted = 0;
  /** Resolves once the stage's message `seq` (or the peer's, `peer`) has reached the subscriber. */
  const arrived = (seq: number, timeoutMs: number, peer = false): Promise<void> =>
    untilCounted(sub!.counts, () => Atomics.load(sub!.counts, peer ? 2 : 1) > seq, timeoutMs);
  const capacity = 2 * (messages + latencySamples) + 8000;
  let sub: BenchSubscriber | undefined;
  try {
    await peer.bind('tcp://127.0.0.1:*');
    const endpoints = [pub.endpoint, peer.lastEndpoint!];
    sub = subscriber === 'pyzmq' ? await startPyzmqSubscriber(endpoints) : startWorkerSubscriber(endpoints, capacity);
    const counts = sub.counts;
    const ctx = benchContext(new RealClock());
    const action = { action: 'move', confidence: 0.5, speed: 1, pad: '' };
    action.pad = 'x'.repeat(Math.max(0, size - JSON.stringify(action).length));
    const body = JSON.stringify(action);
    const message = (frameId: number): ActionMessage => ({
      schemaId: 'percept/robot-action/v1',
      frameId,
      sourceId: 'bench',
      captureWallMs: 0,
      action,
    });
    const sentNs = new BigInt64Array(capacity);
    const peerSentNs = new BigInt64Array(capacity);
    const sendStage = (frameId: number): Promise<unknown> => {
      sentNs[accepted++] = process.hrtime.bigint();
      return publisher.process(message(frameId), ctx);
    };

    // Slow joiner: probe until the subscription has reached the publisher. Probes before that are
    // lost, and from the first that arrives on, all arrive.
    for (let i = 0; Atomics.load(counts, 1) === 0; i++) {
      if (i > 2000) throw new Error(`bench: subscriber on ${pub.endpoint} never received a probe`);
      await sendStage(-1);
      await sleep(5);
    }
    await arrived(accepted - 1, 2000);
    // The peer sends the stage's header (its seq and publish time its own) and the same body.
    const header = await sub.firstHeader;
    const peerHead = header.slice(0, header.indexOf(',"seq":'));
    const peerFrame = Buffer.from(PEER_TOPIC);
    let peerSeq = 0;
    const sendPeer = async (): Promise<void> => {
      const seq = peerSeq++;
      peerSentNs[seq] = process.hrtime.bigint();
      for (let waitMs = 1; ; waitMs = Math.min(16, waitMs * 2)) {
        try {
          await peer.send([peerFrame, closeHeader(peerHead, seq), body]);
          return;
        } catch (err) {
          if ((err as { code?: string }).code !== 'EAGAIN') throw err;
          await sleep(waitMs);
        }
      }
    };
    for (let i = 0; Atomics.load(counts, 2) === 0; i++) {
      if (i > 2000) throw new Error(`bench: subscriber on ${peer.lastEndpoint} never received a peer probe`);
      await sendPeer();
      await sleep(5);
    }
    await arrived(peerSeq - 1, 2000, true);

    // Latency, one message in flight at a time, the stage's and the peer's alternating.
    const latencyStart = accepted;
    const peerLatencyStart = peerSeq;
    for (let i = 0; i < latencySamples; i++) {
      await sendStage(i);
      await arrived(accepted - 1, 2000);
      await sendPeer();
      await arrived(peerSeq - 1, 2000, true);
    }
    const latencyEnd = accepted;
    const peerLatencyEnd = peerSeq;

    // Throughput, back to back: the stage, then the peer.
    const throughputStart = accepted;
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < messages; i++) await sendStage(i);
    const throughputEnd = accepted;
    if (pub.stats()[topic]!.accepted !== accepted) throw new Error('bench: the stage did not take every action');
    // Woken by the subscriber's counts, or every 1 ms. The pyzmq subscriber reports once per drain,
    // maybe after its last receive, so its counts alone would place the end of sending late.
    await untilCounted(counts, () => pub.stats()[topic]!.sent >= throughputEnd, 60_000, 1);
    const sentAllNs = process.hrtime.bigint();
    await arrived(throughputEnd - 1, 60_000);
    const peerThroughputStart = peerSeq;
    const peerT0 = process.hrtime.bigint();
    for (let i = 0; i < messages; i++) await sendPeer();
    const peerThroughputEnd = peerSeq;
    await arrived(peerThroughputEnd - 1, 60_000, true);
    // The subscriber's cue that the bench is over.
    sink.accept({ type: 'stats', atNs: process.hrtime.bigint(), summary: new TelemetryAggregator('real').snapshot() });
    const { seqs, receivedNs, fromPeer } = await sub.report;

    const at = new Map<number, bigint>();
    const peerAt = new Map<number, bigint>();
    seqs.forEach((s, k) => (fromPeer[k] ? peerAt : at).set(s, receivedNs[k]!));
    /** Latencies of seqs [from, to), sorted, and the last receive time among them. */
    const latencies = (arrived: Map<number, bigint>, sent: BigInt64Array, from: number, to: number) => {
      const out: number[] = [];
      let lastNs = 0n;
      for (let s = from; s < to; s++) {
        const r = arrived.get(s);
        if (r === undefined) continue;
        out.push(Number(r - sent[s]!) / 1000);
        if (r > lastNs) lastNs = r;
      }
      return { sorted: out.sort((a, b) => a - b), lastNs };
    };
    const idle = latencies(at, sentNs, latencyStart, latencyEnd).sorted;
    const peerIdle = latencies(peerAt, peerSentNs, peerLatencyStart, peerLatencyEnd).sorted;
    const loaded = latencies(at, sentNs, throughputStart, throughputEnd);
    const peerLoaded = latencies(peerAt, peerSentNs, peerThroughputStart, peerThroughputEnd);
    const perSecond = (n: number, fromNs: bigint, toNs: bigint): number => Math.round(n / (Number(toNs - fromNs) / 1e9));
    return {
      msgs_per_s: perSecond(loaded.sorted.length, t0, loaded.lastNs),
      send_msgs_per_s: perSecond(messages, t0, sentAllNs),
      p50_us: round(quantile(idle, 0.5)),
      p99_us: round(quantile(idle, 0.99)),
      max_us: round(idle.at(-1) ?? NaN),
      loaded_p50_us: round(quantile(loaded.sorted, 0.5)),
      loaded_p99_us: round(quantile(loaded.sorted, 0.99)),
      peer_msgs_per_s: perSecond(peerLoaded.sorted.length, peerT0, peerLoaded.lastNs),
      peer_p50_us: round(quantile(peerIdle, 0.5)),
      peer_p99_us: round(quantile(peerIdle, 0.99)),
      peer_max_us: round(peerIdle.at(-1) ?? NaN),
      messages,
      received: loaded.sorted.length,
      dropped: messages - loaded.sorted.length,
      peer_received: peerLoaded.sorted.length,
      header_bytes: Buffer.byteLength(header),
      body_bytes: Buffer.byteLength(body),
      transport: pub.endpoint,
      subscriber: sub.name,
    };
  } finally {
    // On an error the subscriber is still waiting, so cue it to close its socket and exit.
    // A worker terminated with its socket open aborts the process.
    if (sub) await peer.send([TELEMETRY_TOPIC, '', '']).catch(() => undefined);
    await pub.close();
    peer.close();
    if (sub) await sub.closed();
  }
}

/** zeromq.js's Subscriber in a worker thread, which runs SUBSCRIBER_SOURCE. */
function startWorkerSubscriber(endpoints: readonly string[], capacity: number): BenchSubscriber {
  const counter = new SharedArrayBuffer(3 * 4);
  const require = createRequire(import.meta.url);
  const workerData: SubscriberCommand = {
    zeromq: require.resolve('zeromq'),
    endpoints,
    topics: [STAGE_TOPIC, PEER_TOPIC, TELEMETRY_TOPIC],
    counter,
    capacity,
  };
  const worker = new Worker(SUBSCRIBER_SOURCE, { eval: true, workerData });
  let firstHeader!: (header: string) => void;
  const header = new Promise<string>((resolve) => (firstHeader = resolve));
  const report = new Promise<SubscriberReport>((resolve, reject) => {
    worker.on('message', (m: SubscriberReport | { header: string }) => ('seqs' in m ? resolve(m) : firstHeader(m.header)));
    worker.once('error', reject);
    worker.once('exit', (code) => reject(new Error(`bench subscriber exited with code ${code} before reporting`)));
  });
  const { version } = require('zeromq/package.json') as { version: string };
  return { name: `zeromq.js ${version}`, counts: new Int32Array(counter), firstHeader: header, report, closed: () => exitOf(worker) };
}

const BENCH_SUB_PY = new URL('../../tools/bench-sub.py', import.meta.url).pathname;

/** tools/bench-sub.py under pyzmq. It PUSHes the last seq it got of each topic after each drain.
 * A receive loop here turns those into the same counts the worker keeps. */
async function startPyzmqSubscriber(endpoints: readonly string[]): Promise<BenchSubscriber> {
  const replies = new Pull({ linger: 0 });
  await replies.bind('tcp://127.0.0.1:*');
  const args = [BENCH_SUB_PY, '--reply', replies.lastEndpoint!, '--end-topic', TELEMETRY_TOPIC];
  for (const e of endpoints) args.push('--connect', e);
  for (const t of [STAGE_TOPIC, PEER_TOPIC]) args.push('--topic', t);
  const child = spawn(PYTHON, args, { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  child.stdin.on('error', () => undefined); // a child that died early: `exited` says so
  const exited = new Promise<number | null>((resolve) => {
    child.once('close', (code) => resolve(code));
    child.once('error', (err) => {
      stderr += String(err);
      resolve(null);
    });
  });
  const failed = (what: string) => new Error(`bench: ${PYTHON} ${BENCH_SUB_PY} ${what}: ${stderr.trim() || '(no stderr)'}`);
  const lines = new Map<string, (v: Record<string, unknown>) => void>();
  const line = <T>(key: string): Promise<T> => {
    const p = new Promise<T>((resolve, reject) => {
      lines.set(key, (v) => resolve(v as T));
      void exited.then((code) => reject(failed(`exited with code ${code} before printing "${key}"`)));
    });
    p.catch(() => undefined); // awaited later, or never when the bench fails first
    return p;
  };
  const ready = line<{ pyzmq: string; libzmq: string }>('ready');
  const clock = line<{ clock_ns: string }>('clock_ns');
  const header = line<{ header: string }>('header').then((m) => m.header);
  header.catch(() => undefined);
  const end = line<{ base_ns: string; seqs: number[]; received_ns: number[]; topics: number[] }>('seqs');
  createInterface({ input: child.stdout }).on('line', (text) => {
    const m = JSON.parse(text) as Record<string, unknown>;
    for (const [key, resolve] of lines) if (key in m) resolve(m);
  });
  const counts = new Int32Array(new SharedArrayBuffer(3 * 4));
  void (async () => {
    for await (const [m] of replies) {
      const [topic, seq] = m!.toString().split(' ').map(Number) as [number, number];
      Atomics.store(counts, topic === 0 ? 1 : 2, seq + 1);
      Atomics.add(counts, 0, 1);
      Atomics.notify(counts, 0);
    }
  })().catch(() => undefined); // ends when `replies` closes
  try {
    const { pyzmq, libzmq } = await ready;
    // Receive times are compared with send times. Check once, within the bracket of one round trip,
    // that Python's monotonic_ns reads the clock process.hrtime does (CLOCK_MONOTONIC on Linux).
    const beforeNs = process.hrtime.bigint();
    child.stdin.write('clock\n');
    const pythonNs = BigInt((await clock).clock_ns);
    const afterNs = process.hrtime.bigint();
    if (pythonNs < beforeNs || pythonNs > afterNs)
      throw new Error(`bench: Python's time.monotonic_ns (${pythonNs}) is not process.hrtime's clock ([${beforeNs}, ${afterNs}])`);
    const report = end.then(({ base_ns, seqs, received_ns, topics }) => ({
      seqs: Int32Array.from(seqs),
      receivedNs: BigInt64Array.from(received_ns, (t) => BigInt(base_ns) + BigInt(t)),
      fromPeer: Uint8Array.from(topics),
    }));
    report.catch(() => undefined);
    const closed = async () => {
      const hung = setTimeout(() => child.kill(), 5000);
      await exited;
      clearTimeout(hung);
      replies.close();
    };
    return { name: `pyzmq ${pyzmq} (libzmq ${libzmq})`, counts, firstHeader: header, report, closed };
  } catch (err) {
    child.kill();
    await exited;
    replies.close();
    throw err;
  }
}

const benchContext = (clock: RealClock): StageContext =>
  standaloneContext({
    clock,
    frame: { captureNs: 0n, captureWallMs: 0, sourceId: 'bench' },
    deadlineNs: 0n,
    knobs: { imageTokens: 0, maxNewTokens: 0 },
  });

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

// Atomics.waitAsync is in Node 20 but not in the ES2023 lib's types.
type WaitAsync = (
  array: Int32Array,
  index: number,
  value: number,
  timeoutMs: number,
) => { async: false; value: string } | { async: true; value: Promise<string> };
const waitAsync = (Atomics as unknown as { waitAsync: WaitAsync }).waitAsync;

/** Resolves once `done()` holds, sleeping until the subscriber counts more messages (it notifies
 * counts[0]) or `recheckMs` passed, rather than polling. */
async function untilCounted(counts: Int32Array, done: () => boolean, timeoutMs: number, recheckMs = 100): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!done()) {
    const left = deadline - Date.now();
    if (left <= 0) throw new Error(`bench: no message after ${timeoutMs} ms`);
    const r = waitAsync(counts, 0, Atomics.load(counts, 0), Math.min(left, recheckMs));
    if (r.async) await r.value;
  }
}

const round = (v: number): number => Math.round(v * 10) / 10;

// The subscriber runs as plain JavaScript through eval. Under Node 20 a worker's entry point is
// loaded before tsx's hooks, so it cannot be this .ts file.
const SUBSCRIBER_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads');
const { Subscriber } = require(workerData.zeromq);
const SEQ = Buffer.from('"seq":');
const PEER = ${JSON.stringify(PEER_TOPIC)}.charCodeAt(0);
const TELEMETRY = ${JSON.stringify(TELEMETRY_TOPIC)}.charCodeAt(0);
(async () => {
  const counts = new Int32Array(workerData.counter);
  const sub = new Subscriber({ linger: 0, receiveHighWaterMark: 100000 });
  for (const endpoint of workerData.endpoints) sub.connect(endpoint);
  for (const topic of workerData.topics) sub.subscribe(topic);
  // Preallocated and parsed by hand: this measures the publisher, not the subscriber's JSON.parse
  // or BigInt formatting.
  const seqs = new Int32Array(workerData.capacity);
  const receivedNs = new BigInt64Array(workerData.capacity);
  const fromPeer = new Uint8Array(workerData.capacity);
  let header;
  let n = 0;
  for (;;) {
    // Wait for a message, then take what has arrived with receives that resolve at once (timeout
    // 0), without a poll per message.
    let frames = await sub.receive();
    sub.receiveTimeout = 0;
    for (;;) {
      const now = process.hrtime.bigint();
      const kind = frames[0][0];
      if (kind === TELEMETRY) {
        sub.close();
        parentPort.postMessage({ seqs: seqs.subarray(0, n), receivedNs: receivedNs.subarray(0, n), fromPeer: fromPeer.subarray(0, n) });
        return;
      }
      const h = frames[1];
      let at = h.indexOf(SEQ) + SEQ.length;
      let seq = 0;
      for (let c = h[at]; c >= 48 && c <= 57; c = h[++at]) seq = seq * 10 + (c - 48);
      if (n < seqs.length) {
        seqs[n] = seq;
        fromPeer[n] = kind === PEER ? 1 : 0;
        receivedNs[n++] = now;
      }
      if (kind === PEER) Atomics.store(counts, 2, seq + 1);
      else {
        if (header === undefined) {
          header = h.toString();
          parentPort.postMessage({ header });
        }
        Atomics.store(counts, 1, seq + 1);
      }
      Atomics.add(counts, 0, 1);
      Atomics.notify(counts, 0);
      if (!sub.readable) break;
      frames = await sub.receive();
    }
    sub.receiveTimeout = -1;
  }
})();
`;
