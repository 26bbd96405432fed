// percept bench frame-input: a robot stack's pusher → percept's ZeroMQ frame input (the zmq source),
// on loopback tcp. The pusher runs in a worker thread (its own event loop, as a separate process
// would) and sends one JPEG every 1/fps s on a drift-free schedule, with a PUSH socket that never
// waits (sendTimeout 0): a frame the input cannot take at once counts as dropped. The added latency
// of a frame is the time from just before the pusher's send to the source yielding the parsed,
// checked frame (both process.hrtime: one monotonic clock for the two threads).
import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';
import sharp from 'sharp';
import { createZmqSource } from '../nodes/source-zmq.ts';
import { RealClock } from '../pipeline/clock.ts';
import { exitOf } from './bench-worker.ts';
import { quantile } from './stats.ts';

export interface BenchFrameInputOptions {
  readonly fps?: number;
  readonly seconds?: number;
  readonly width?: number;
  readonly height?: number;
}

export type BenchFrameInputResult = {
  readonly frames_pushed: number;
  readonly frames_received: number;
  /** Sends that would have had to wait (the input did not keep up), plus frames lost after the send. */
  readonly dropped: number;
  readonly malformed: number;
  readonly fps: number;
  readonly jpeg_bytes: number;
  readonly resolution: string;
  /** Pusher send → frame out of the zmq source. */
  readonly p50_us: number;
  readonly p99_us: number;
  readonly max_us: number;
  readonly transport: string;
};

interface PusherData {
  readonly zeromq: string;
  readonly endpoint: string;
  readonly jpeg: Uint8Array;
  readonly frames: number;
  readonly fps: number;
  /** BigInt64Array: [i] = hrtime ns just before frame i was sent. */
  readonly sent: SharedArrayBuffer;
}

export async function benchFrameInput(options: BenchFrameInputOptions = {}): Promise<BenchFrameInputResult> {
  const { fps = 30, seconds = 10, width = 1280, height = 720 } = options;
  if (!(fps > 0 && fps <= 1000)) throw new RangeError(`benchFrameInput: expected 0 < fps <= 1000 but received ${fps}`);
  if (!(seconds > 0)) throw new RangeError(`benchFrameInput: expected seconds > 0 but received ${seconds}`);
  const frames = Math.max(1, Math.round(fps * seconds));
  const jpeg = await testImage(width, height);
  const source = await createZmqSource({ endpoint: 'tcp://127.0.0.1:*', bind: true, socket: 'pull', topic: '', receiveHighWaterMark: 10 });
  const sent = new SharedArrayBuffer(8 * frames);
  const sentNs = new BigInt64Array(sent);
  const workerData: PusherData = {
    zeromq: createRequire(import.meta.url).resolve('zeromq'),
    endpoint: source.endpoint,
    jpeg,
    frames,
    fps,
    sent,
  };
  const worker = new Worker(PUSHER_SOURCE, { eval: true, workerData });
  const pushed = new Promise<{ pushed: number; refused: number }>((resolve, reject) => {
    worker.once('message', resolve);
    worker.once('error', reject);
    worker.once('exit', (code) => reject(new Error(`bench pusher exited with code ${code} before reporting`)));
  });
  const abort = new AbortController();
  const latencies: number[] = [];
  let received = 0;
  try {
    const consuming = (async () => {
      for await (const item of source.frames(new RealClock(), abort.signal)) {
        const now = process.hrtime.bigint();
        const i = Number(item.sourceId);
        latencies.push(Number(now - Atomics.load(sentNs, i)) / 1000);
        received += 1;
      }
    })();
    const report = await pushed;
    // Whatever was sent arrives within moments on loopback; then stop.
    for (let waited = 0; received < report.pushed && waited < 5000; waited += 10) await new Promise((r) => setTimeout(r, 10));
    abort.abort();
    await consuming;
    latencies.sort((a, b) => a - b);
    return {
      frames_pushed: frames,
      frames_received: received,
      dropped: frames - received,
      malformed: source.counters.malformed,
      fps,
      jpeg_bytes: jpeg.length,
      resolution: `${width}x${height}`,
      p50_us: round(quantile(latencies, 0.5)),
      p99_us: round(quantile(latencies, 0.99)),
      max_us: round(latencies.at(-1) ?? NaN),
      transport: source.endpoint,
    };
  } finally {
    abort.abort();
    await source.close();
    await exitOf(worker);
  }
}

/** A camera-like test image encoded as a quality-85 JPEG: gradients and a checkerboard under
 * sensor-like noise, so it compresses about as a real 720p frame does (~150 KB), not to a few KB. */
async function testImage(width: number, height: number): Promise<Buffer> {
  const raw = Buffer.alloc(width * height * 3);
  let seed = 1;
  const noise = (): number => ((seed = (seed * 1103515245 + 12345) >>> 0) >>> 24) / 16 - 8;
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const o = (y * width + x) * 3;
      raw[o] = (x * 255) / width + noise();
      raw[o + 1] = (y * 255) / height + noise();
      raw[o + 2] = (((x >> 5) + (y >> 5)) % 2 ? 200 : 40) + noise();
    }
  }
  return sharp(raw, { raw: { width, height, channels: 3 } })
    .jpeg({ quality: 85 })
    .toBuffer();
}

const round = (v: number): number => Math.round(v * 10) / 10;

// Plain JavaScript (eval): under Node 20 a worker's entry point is loaded before tsx's hooks.
const PUSHER_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads');
const { Push } = require(workerData.zeromq);
(async () => {
  const { endpoint, jpeg, frames, fps } = workerData;
  const sent = new BigInt64Array(workerData.sent);
  const push = new Push({ sendHighWaterMark: 10, sendTimeout: 0, linger: 2000 });
  push.connect(endpoint);
  await new Promise((r) => setTimeout(r, 200)); // the connection is up before the clock starts
  const periodNs = BigInt(Math.round(1e9 / fps));
  const start = process.hrtime.bigint();
  let pushed = 0;
  let refused = 0;
  for (let i = 0; i < frames; i++) {
    const due = start + BigInt(i) * periodNs;
    for (let left = due - process.hrtime.bigint(); left > 0n; left = due - process.hrtime.bigint()) {
      await new Promise((r) => setTimeout(r, Math.ceil(Number(left) / 1e6)));
    }
    const header = JSON.stringify({ stamp: { sec: Math.floor(Date.now() / 1000), nanosec: 0 }, frame_id: String(i), encoding: 'jpeg' });
    Atomics.store(sent, i, process.hrtime.bigint());
    try {
      await push.send([header, jpeg]);
      pushed += 1;
    } catch {
      refused += 1;
    }
  }
  parentPort.postMessage({ pushed, refused });
  push.close();
})();
`;
