// `percept bench frame-input`: a robot stack's pusher → the zmq source, percept's ZeroMQ frame input, on loopback tcp.
// The pusher is a separate process that sends one JPEG every 1/fps s on a drift-free schedule.
// Its PUSH socket never waits (sendTimeout 0), so a frame the input cannot take at once counts as dropped.
// It stamps each frame with CLOCK_MONOTONIC just before sending, the clock process.hrtime reads in every process.
// A frame's added latency runs from that stamp to the source yielding the parsed, checked frame.
// The frame's source stamp is that stamp, unconverted.
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import sharp from 'sharp';
import { createZmqSource } from '../../nodes/source-zmq.ts';
import { RealClock } from '../../pipeline/clock.ts';
import { isRejection } from '../../pipeline/types.ts';
import { quantile } from '../stats.ts';

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
  /** Messages the source rejected (they did not fit the frame header schema). */
  readonly rejected: number;
  readonly fps: number;
  readonly jpeg_bytes: number;
  readonly resolution: string;
  /** Pusher send → frame out of the zmq source. */
  readonly p50_us: number;
  readonly p99_us: number;
  readonly max_us: number;
  readonly transport: string;
};

export async function benchFrameInput(options: BenchFrameInputOptions = {}): Promise<BenchFrameInputResult> {
  const { fps = 30, seconds = 10, width = 1280, height = 720 } = options;
  if (!(fps > 0 && fps <= 1000)) throw new RangeError(`benchFrameInput: expected 0 < fps <= 1000 but received ${fps}`);
  if (!(seconds > 0)) throw new RangeError(`benchFrameInput: expected seconds > 0 but received ${seconds}`);
  const frames = Math.max(1, Math.round(fps * seconds));
  const jpeg = await testImage(width, height);
  const source = await createZmqSource({ endpoint: 'tcp://127.0.0.1:*', bind: true, socket: 'pull', topic: '', receiveHighWaterMark: 10 });
  const settings = JSON.stringify({ zeromq: createRequire(import.meta.url).resolve('zeromq'), endpoint: source.endpoint, frames, fps });
  const pusher = spawn(process.execPath, ['-e', PUSHER_SOURCE, settings], { stdio: ['pipe', 'pipe', 'inherit'] });
  pusher.stdin.end(jpeg);
  let output = '';
  pusher.stdout.on('data', (d) => (output += d));
  const pushed = new Promise<{ pushed: number; refused: number }>((resolve, reject) => {
    pusher.once('error', reject);
    pusher.once('exit', (code) => (code === 0 ? resolve(JSON.parse(output)) : reject(new Error(`bench pusher exited with code ${code}`))));
  });
  const abort = new AbortController();
  const latencies: number[] = [];
  let received = 0;
  try {
    const consuming = (async () => {
      for await (const item of source.frames(new RealClock(), abort.signal)) {
        const now = process.hrtime.bigint();
        if (isRejection(item)) continue;
        const { sec, nanosec } = item.sourceStamp!;
        latencies.push(Number(now - (BigInt(sec) * 1_000_000_000n + BigInt(nanosec))) / 1000);
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
      rejected: source.counters.rejected,
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
    pusher.kill();
  }
}

/** A camera-like test image as a quality-85 JPEG: gradients and a checkerboard under sensor-like noise.
 * The noise makes it compress about as a real 720p frame does, not to a few KB. */
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

// The pusher is plain JavaScript run by `node -e`. The JPEG comes on stdin, the settings as argv.
const PUSHER_SOURCE = `
const { zeromq, endpoint, frames, fps } = JSON.parse(process.argv[1]);
const { Push } = require(zeromq);
const chunks = [];
process.stdin.on('data', (c) => chunks.push(c));
process.stdin.on('end', async () => {
  const jpeg = Buffer.concat(chunks);
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
    const now = process.hrtime.bigint();
    const stamp = { sec: Number(now / 1000000000n), nanosec: Number(now % 1000000000n) };
    try {
      await push.send([JSON.stringify({ stamp, frame_id: 'bench', encoding: 'jpeg' }), jpeg]);
      pushed += 1;
    } catch {
      refused += 1;
    }
  }
  push.close();
  process.stdout.write(JSON.stringify({ pushed, refused }));
});
`;
