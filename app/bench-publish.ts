// percept bench publish: the publisher stage → a ZeroMQ SUB on loopback tcp, in a worker thread (so
// sender and receiver do not share an event loop, as with a real subscriber process).
//   throughput: `messages` actions given to the stage back to back (each process() awaited, as the
//               graph does); msgs_per_s = received / (last receive − first send), which a JS
//               subscriber bounds; send_msgs_per_s = the same messages handed to ZeroMQ / the time
//               that took (the publisher's own rate).
//   latency:    `latencySamples` actions sent one at a time, each after the previous one arrived;
//               latency = receive time in the worker − time before process() in the sender (both
//               process.hrtime, one monotonic clock), so it covers header building, JSON, the send,
//               loopback tcp and the receive.
//   peer:       a bare zeromq.js PUB socket sending the same bytes (the stage's header with its own
//               seq, the same body, prebuilt) to the same subscriber: the floor this machine and
//               zeromq.js set. Its latency samples alternate with the stage's, so a noisy spell on a
//               shared machine hits both alike; its throughput run follows the stage's.
// The sender sleeps (Atomics.waitAsync) while a message is in flight: a sender spinning on the event
// loop takes a core from the socket's I/O threads and the subscriber, and on a 2-core machine that
// showed up as p99 outliers of one scheduler time slice (~3 ms).
import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';
import { Publisher as PubSocket } from 'zeromq';
import { createPublisher } from '../nodes/publisher.ts';
import { RealClock } from '../pipeline/clock.ts';
import { TelemetryAggregator } from '../pipeline/telemetry/aggregator.ts';
import type { ActionMessage } from '../nodes/payloads.ts';
import type { StageContext } from '../pipeline/types.ts';
import { standaloneContext } from '../pipeline/standalone.ts';
import { exitOf } from './bench-worker.ts';
import { quantile } from './stats.ts';

export interface BenchPublishOptions {
  /** Messages in the throughput run (default 20000). */
  readonly messages?: number;
  /** Approximate bytes of the JSON body (default 128). */
  readonly size?: number;
  /** Ping-pong messages in the latency run, for the stage and for the peer each (default 2000). */
  readonly latencySamples?: number;
  readonly sendHighWaterMark?: number;
}

// A type alias (not an interface) so it is assignable to Record<string, unknown> (CLI printing).
export type BenchPublishResult = {
  /** Delivered: received by the subscriber / (its last receive − the first send). */
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
  readonly header_bytes: number;
  readonly body_bytes: number;
  readonly transport: string;
};

interface SubscriberCommand {
  /** Resolved path of the zeromq package, for the worker's require. */
  readonly zeromq: string;
  readonly endpoints: readonly string[];
  readonly topics: readonly string[];
  /** Shared Int32Array: [0] messages received (notified on each), [1] the last seq received from
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

const PEER_TOPIC = 'peer';
const TELEMETRY_TOPIC = 'telemetry';

export async function benchPublish(options: BenchPublishOptions = {}): Promise<BenchPublishResult> {
  const { messages = 20_000, size = 128, latencySamples = 2000, sendHighWaterMark = 100_000 } = options;
  for (const [name, v] of [
    ['messages', messages],
    ['size', size],
    ['latencySamples', latencySamples],
  ] as const) {
    if (!Number.isInteger(v) || v < 1) throw new RangeError(`benchPublish: expected integer >= 1 for ${name} but received ${v}`);
  }
  const topic = 'actions';
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
  const counter = new SharedArrayBuffer(3 * 4);
  const counts = new Int32Array(counter);
  /** Resolves once the stage's message `seq` (or the peer's, `peer`) has reached the subscriber. */
  const arrived = (seq: number, timeoutMs: number, peer = false): Promise<void> =>
    untilCounted(counts, () => Atomics.load(counts, peer ? 2 : 1) > seq, timeoutMs);
  const capacity = 2 * (messages + latencySamples) + 8000;
  let worker: Worker | undefined;
  try {
    await peer.bind('tcp://127.0.0.1:*');
    const workerData: SubscriberCommand = {
      zeromq: createRequire(import.meta.url).resolve('zeromq'),
      endpoints: [pub.endpoint, peer.lastEndpoint!],
      topics: [topic, PEER_TOPIC, TELEMETRY_TOPIC],
      counter,
      capacity,
    };
    worker = new Worker(SUBSCRIBER_SOURCE, { eval: true, workerData });
    let firstHeader: (header: string) => void;
    const stageHeader = new Promise<string>((resolve) => (firstHeader = resolve));
    const report = new Promise<SubscriberReport>((resolve, reject) => {
      worker!.on('message', (m: SubscriberReport | { header: string }) => ('seqs' in m ? resolve(m) : firstHeader(m.header)));
      worker!.once('error', reject);
      worker!.once('exit', (code) => reject(new Error(`bench subscriber exited with code ${code} before reporting`)));
    });
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

    // Slow joiner: probe until the subscription has reached the publisher (the probes before that
    // are lost; from the first that arrives on, all do).
    for (let i = 0; Atomics.load(counts, 1) === 0; i++) {
      if (i > 2000) throw new Error(`bench: subscriber on ${pub.endpoint} never received a probe`);
      await sendStage(-1);
      await sleep(5);
    }
    await arrived(accepted - 1, 2000);
    // The peer sends the stage's header (its seq and publish time its own) and the same body.
    const header = await stageHeader;
    const peerHead = header.slice(0, header.indexOf('"seq":') + '"seq":'.length);
    const peerFrame = Buffer.from(PEER_TOPIC);
    let peerSeq = 0;
    const sendPeer = async (): Promise<void> => {
      const seq = peerSeq++;
      peerSentNs[seq] = process.hrtime.bigint();
      for (let waitMs = 1; ; waitMs = Math.min(16, waitMs * 2)) {
        try {
          await peer.send([peerFrame, `${peerHead}${seq},"publish_wall_ms":${Date.now()},"virtual_publish_ms":null}`, body]);
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
    await untilCounted(counts, () => pub.stats()[topic]!.sent >= throughputEnd, 60_000);
    const sentAllNs = process.hrtime.bigint();
    await arrived(throughputEnd - 1, 60_000);
    const peerThroughputStart = peerSeq;
    const peerT0 = process.hrtime.bigint();
    for (let i = 0; i < messages; i++) await sendPeer();
    const peerThroughputEnd = peerSeq;
    await arrived(peerThroughputEnd - 1, 60_000, true);
    // The subscriber's cue that the bench is over.
    sink.accept({ type: 'stats', atNs: process.hrtime.bigint(), summary: new TelemetryAggregator('real').snapshot() });
    const { seqs, receivedNs, fromPeer } = await report;

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
      header_bytes: Buffer.byteLength(header),
      body_bytes: Buffer.byteLength(body),
      transport: pub.endpoint,
    };
  } finally {
    // On an error the subscriber is still waiting: its cue to close its socket and exit (a worker
    // terminated with its socket open aborts the process).
    if (worker) await peer.send([TELEMETRY_TOPIC, '', '']).catch(() => undefined);
    await pub.close();
    peer.close();
    if (worker) await exitOf(worker);
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

/** Resolves once `done()` holds, sleeping until the subscriber counts another message (it notifies
 * counts[0] on each) rather than polling. */
async function untilCounted(counts: Int32Array, done: () => boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!done()) {
    const left = deadline - Date.now();
    if (left <= 0) throw new Error(`bench: no message after ${timeoutMs} ms`);
    const r = waitAsync(counts, 0, Atomics.load(counts, 0), Math.min(left, 100));
    if (r.async) await r.value;
  }
}

const round = (v: number): number => Math.round(v * 10) / 10;

// The subscriber runs as plain JavaScript (eval): under Node 20 a worker's entry point is loaded
// before tsx's hooks, so it cannot be this .ts file.
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
