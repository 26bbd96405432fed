// percept bench publish: the publisher stage → a ZeroMQ SUB on loopback tcp, in a worker thread (so
// sender and receiver do not share an event loop, as with a real subscriber process).
//   throughput: `messages` actions sent back to back (each send awaited, as the stage does); rate =
//               received / (last receive − first send).
//   latency:    `latencySamples` actions sent one at a time, each after the previous one arrived;
//               latency = receive time in the worker − time before process() in the sender (both
//               process.hrtime, one monotonic clock), so it covers header building, JSON, the send,
//               loopback tcp and the receive.
import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';
import { createPublisher } from '../nodes/publisher.ts';
import { RealClock } from '../pipeline/clock.ts';
import { TelemetryAggregator } from '../pipeline/telemetry/aggregator.ts';
import type { ActionMessage } from '../nodes/payloads.ts';
import type { StageContext } from '../pipeline/types.ts';
import { standaloneContext } from '../pipeline/standalone.ts';
import { quantile } from './stats.ts';

export interface BenchPublishOptions {
  /** Messages in the throughput run (default 20000). */
  readonly messages?: number;
  /** Approximate bytes of the JSON body (default 128). */
  readonly size?: number;
  /** Ping-pong messages in the latency run (default 2000). */
  readonly latencySamples?: number;
  readonly sendHighWaterMark?: number;
}

// A type alias (not an interface) so it is assignable to Record<string, unknown> (CLI printing).
export type BenchPublishResult = {
  readonly msgs_per_s: number;
  /** One-at-a-time publish → receive latency. */
  readonly p50_us: number;
  readonly p99_us: number;
  readonly max_us: number;
  /** Latency of the throughput run's messages (includes queueing behind earlier ones). */
  readonly loaded_p50_us: number;
  readonly loaded_p99_us: number;
  readonly messages: number;
  readonly received: number;
  readonly dropped: number;
  readonly body_bytes: number;
  readonly transport: string;
};

interface SubscriberCommand {
  /** Resolved path of the zeromq package, for the worker's require. */
  readonly zeromq: string;
  readonly endpoint: string;
  readonly topic: string;
  /** Shared Int32Array: [0] = messages received (for ping-pong). */
  readonly counter: SharedArrayBuffer;
}
interface SubscriberReport {
  readonly seqs: number[];
  readonly receivedNs: string[];
}

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
  const { stage: publisher, sink } = await createPublisher({ endpoint: 'tcp://127.0.0.1:*', topic, sendHighWaterMark });
  const counter = new SharedArrayBuffer(4);
  const received = new Int32Array(counter);
  const workerData: SubscriberCommand = {
    zeromq: createRequire(import.meta.url).resolve('zeromq'),
    endpoint: publisher.endpoint,
    topic,
    counter,
  };
  const worker = new Worker(SUBSCRIBER_SOURCE, { eval: true, workerData });
  const report = new Promise<SubscriberReport>((resolve, reject) => {
    worker.once('message', resolve);
    worker.once('error', reject);
    worker.once('exit', (code) => reject(new Error(`bench subscriber exited with code ${code} before reporting`)));
  });
  const clock = new RealClock();
  const ctx = benchContext(clock);
  const action = { action: 'move', confidence: 0.5, speed: 1, pad: '' };
  action.pad = 'x'.repeat(Math.max(0, size - JSON.stringify(action).length));
  const bodyBytes = JSON.stringify(action).length;
  const message = (frameId: number): ActionMessage => ({
    schemaId: 'percept/robot-action/v1',
    frameId,
    sourceId: 'bench',
    captureWallMs: 0,
    action,
  });
  const sentNs: bigint[] = [];

  try {
    // Slow joiner: probe until the subscription has reached the publisher.
    for (let i = 0; Atomics.load(received, 0) === 0; i++) {
      if (i > 2000) throw new Error(`bench: subscriber on ${publisher.endpoint} never received a probe`);
      sentNs[publisher.sent] = process.hrtime.bigint();
      await publisher.process(message(-1), ctx);
      await new Promise((r) => setTimeout(r, 5));
    }
    // Let the probes still in flight arrive before timing anything.
    const probes = publisher.sent;
    await waitFor(() => Atomics.load(received, 0) >= probes, 2000).catch(() => undefined);

    // Latency, one message in flight at a time.
    const latencyStart = publisher.sent;
    for (let i = 0; i < latencySamples; i++) {
      const before = Atomics.load(received, 0);
      sentNs[publisher.sent] = process.hrtime.bigint();
      await publisher.process(message(i), ctx);
      await waitFor(() => Atomics.load(received, 0) > before, 2000);
    }
    const latencyEnd = publisher.sent;

    // Throughput, back to back.
    const throughputStart = publisher.sent;
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < messages; i++) {
      sentNs[publisher.sent] = process.hrtime.bigint();
      await publisher.process(message(i), ctx);
    }
    const throughputEnd = publisher.sent;
    // A run ends with a stats message on the telemetry topic; so does the bench (the subscriber's cue).
    await sink.publish({ type: 'stats', atNs: process.hrtime.bigint(), summary: new TelemetryAggregator('real').snapshot() });
    const { seqs, receivedNs } = await report;

    const at = new Map<number, bigint>();
    seqs.forEach((s, k) => at.set(s, BigInt(receivedNs[k])));
    const latencies = (from: number, to: number): number[] => {
      const out: number[] = [];
      for (let s = from; s < to; s++) {
        const r = at.get(s);
        if (r !== undefined) out.push(Number(r - sentNs[s]) / 1000);
      }
      return out.sort((a, b) => a - b);
    };
    const idle = latencies(latencyStart, latencyEnd);
    const loaded = latencies(throughputStart, throughputEnd);
    let lastNs = t0;
    for (let s = throughputStart; s < throughputEnd; s++) {
      const r = at.get(s);
      if (r !== undefined && r > lastNs) lastNs = r;
    }
    return {
      msgs_per_s: Math.round(loaded.length / (Number(lastNs - t0) / 1e9)),
      p50_us: round(quantile(idle, 0.5)),
      p99_us: round(quantile(idle, 0.99)),
      max_us: round(idle.at(-1) ?? NaN),
      loaded_p50_us: round(quantile(loaded, 0.5)),
      loaded_p99_us: round(quantile(loaded, 0.99)),
      messages,
      received: loaded.length,
      dropped: messages - loaded.length,
      body_bytes: bodyBytes,
      transport: publisher.endpoint,
    };
  } finally {
    await publisher.close();
    await worker.terminate();
  }
}

const benchContext = (clock: RealClock): StageContext =>
  standaloneContext({
    clock,
    frame: { captureNs: 0n, captureWallMs: 0, sourceId: 'bench' },
    deadlineNs: 0n,
    knobs: { imageTokens: 0, maxNewTokens: 0 },
  });

/** Polls `done` on every event-loop turn (setImmediate: no timer granularity in the measurement). */
function waitFor(done: () => boolean, timeoutMs = 10_000): Promise<void> {
  const start = Date.now();
  return new Promise((resolve, reject) => {
    const check = (): void => {
      if (done()) resolve();
      else if (Date.now() - start > timeoutMs) reject(new Error(`bench: no message after ${timeoutMs} ms`));
      else setImmediate(check);
    };
    check();
  });
}

const round = (v: number): number => Math.round(v * 10) / 10;

// The subscriber runs as plain JavaScript (eval): under Node 20 a worker's entry point is loaded
// before tsx's hooks, so it cannot be this .ts file.
const SUBSCRIBER_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads');
const { Subscriber } = require(workerData.zeromq);
(async () => {
  const received = new Int32Array(workerData.counter);
  const sub = new Subscriber({ linger: 0, receiveHighWaterMark: 100000 });
  sub.connect(workerData.endpoint);
  sub.subscribe(workerData.topic);
  sub.subscribe('telemetry');
  const seqs = [];
  const receivedNs = [];
  for await (const frames of sub) {
    const now = process.hrtime.bigint();
    if (frames[0].toString() === 'telemetry') break;
    seqs.push(JSON.parse(frames[1].toString()).seq);
    receivedNs.push(now.toString());
    Atomics.add(received, 0, 1);
  }
  sub.close();
  parentPort.postMessage({ seqs, receivedNs });
})();
`;
