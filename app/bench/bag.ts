// `percept bench bag`: how fast bags are read and recorded.
//   replay  percept's bag source reads `frames` 1080p JPEG frames at pace 'fast', decoding each message
//   peer    @mcap/core's McapIndexedReader reads the same messages without decoding them
//   record  percept's recorder takes frames, actions and events at `fps`, as `percept run --record` feeds it
// The frames are camera-sized sensor_msgs/msg/CompressedImage messages in cdr, as rosbag2 writes them.
// A paced recording must record every frame. The same frames fed back to back give the sustained rate.
import { mkdirSync, rmSync, statSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import { McapIndexedReader, McapWriter } from '@mcap/core';
import { FileHandleReadable, FileHandleWritable } from '@mcap/nodejs';
import { loadDecompressHandlers } from '@mcap/support';
import { parse as parseRosMsg } from '@foxglove/rosmsg';
import { MessageWriter } from '@foxglove/rosmsg2-serialization';
import sharp from 'sharp';
import { loadActionSchema } from '../../nodes/action-schema.ts';
import type { CameraFrame } from '../../nodes/payloads.ts';
import { createRecorder, ROS2_DEFINITIONS } from '../../nodes/recorder.ts';
import { createBagSource } from '../../nodes/source-bag.ts';
import { VirtualClock } from '../../pipeline/clock.ts';
import { isRejection } from '../../pipeline/types.ts';
import { median } from '../stats.ts';
import { DEFAULT_CONFIG } from '../run/run.ts';
import { loadConfig } from '../../pipeline/config.ts';

export interface BenchBagOptions {
  /** Frames in the replay bag. Default 300, which is 10 s at 30 fps. */
  readonly frames?: number;
  readonly width?: number;
  readonly height?: number;
  /** Recording rate and duration (default 30 fps for 5 s). */
  readonly fps?: number;
  readonly seconds?: number;
  /** Replay passes, 3 by default. The median is reported. */
  readonly reps?: number;
  /** Working folder (default .cache/bench-bag). */
  readonly dir?: string;
}

export type BenchBagResult = {
  readonly width: number;
  readonly height: number;
  readonly jpeg_kb: number;
  readonly replay_frames: number;
  readonly replay_fps: number;
  readonly replay_mb_s: number;
  /** @mcap/core's indexed reader over the same messages, no decoding. */
  readonly peer_fps: number;
  readonly peer_mb_s: number;
  readonly replay_vs_peer: number;
  readonly record_fps_target: number;
  readonly record_frames: number;
  readonly record_frames_not_recorded: number;
  /** CPU time the paced recording took, as a share of one core. */
  readonly record_cpu_core_share: number;
  readonly record_chunks: number;
  readonly record_max_fps: number;
  readonly record_max_mb_s: number;
};

/** sensor_msgs/msg/CompressedImage as rosbag2 stores it in a ros2msg schema (the recorder's ros2 profile's own). */
export const ROS_COMPRESSED_IMAGE = ROS2_DEFINITIONS['sensor_msgs/msg/CompressedImage'];
const START_NS = 1_700_000_000_000_000_000n;

/** Eight camera-like JPEGs, grey with sensor noise, so their sizes are like a real 1080p camera's. */
async function cameraJpegs(width: number, height: number): Promise<Buffer[]> {
  return Promise.all(
    Array.from({ length: 8 }, (_, k) =>
      sharp({
        create: {
          width,
          height,
          channels: 3,
          background: { r: 90 + 10 * k, g: 110, b: 130 },
          noise: { type: 'gaussian', mean: 110 + 5 * k, sigma: 6 },
        },
      })
        .jpeg({ quality: 85 })
        .toBuffer(),
    ),
  );
}

async function writeRosBag(path: string, jpegs: readonly Buffer[], frames: number, fps: number): Promise<void> {
  const handle = await open(path, 'w');
  try {
    const writer = new McapWriter({ writable: new FileHandleWritable(handle), chunkSize: 4 * 1024 * 1024 });
    await writer.start({ profile: 'ros2', library: 'percept bench bag' });
    const schemaId = await writer.registerSchema({
      name: 'sensor_msgs/msg/CompressedImage',
      encoding: 'ros2msg',
      data: new TextEncoder().encode(ROS_COMPRESSED_IMAGE),
    });
    const channelId = await writer.registerChannel({
      topic: '/camera/image/compressed',
      schemaId,
      messageEncoding: 'cdr',
      metadata: new Map(),
    });
    const cdr = new MessageWriter(parseRosMsg(ROS_COMPRESSED_IMAGE, { ros2: true }));
    const periodNs = BigInt(Math.round(1e9 / fps));
    for (let i = 0; i < frames; i++) {
      const t = START_NS + BigInt(i) * periodNs;
      const data = cdr.writeMessage({
        header: { stamp: { sec: Number(t / 1_000_000_000n), nanosec: Number(t % 1_000_000_000n) }, frame_id: 'camera' },
        format: 'jpeg',
        data: jpegs[i % jpegs.length],
      });
      await writer.addMessage({ channelId, sequence: i, logTime: t, publishTime: t, data });
    }
    await writer.end();
  } finally {
    await handle.close();
  }
}

export async function benchBag(options: BenchBagOptions = {}): Promise<BenchBagResult> {
  const { frames = 300, width = 1920, height = 1080, fps = 30, seconds = 5, reps = 3 } = options;
  for (const [name, v] of Object.entries({ frames, width, height, reps })) {
    if (!Number.isInteger(v) || v < 1) throw new RangeError(`bench bag: expected an integer >= 1 for ${name} but received ${v}`);
  }
  if (!(fps > 0 && seconds > 0)) throw new RangeError(`bench bag: expected fps > 0 and seconds > 0 but received ${fps}, ${seconds}`);
  const dir = options.dir ?? join(new URL('../..', import.meta.url).pathname, '.cache', 'bench-bag');
  mkdirSync(dir, { recursive: true });
  const jpegs = await cameraJpegs(width, height);
  const bag = join(dir, `ros2-${width}x${height}-${frames}.mcap`);
  await writeRosBag(bag, jpegs, frames, fps);
  const bagBytes = statSync(bag).size;

  // Replay: percept's source, each message decoded into a frame.
  const replaySeconds: number[] = [];
  let replayed = 0;
  for (let r = 0; r < reps; r++) {
    const start = process.hrtime.bigint();
    const source = await createBagSource({ path: bag, pace: 'fast' });
    replayed = 0;
    for await (const item of source.frames(new VirtualClock(), new AbortController().signal)) {
      if (isRejection(item)) throw new Error(`bench bag: a frame was rejected: ${item.rejected}`);
      replayed += 1;
    }
    await source.close();
    replaySeconds.push(Number(process.hrtime.bigint() - start) / 1e9);
  }
  // The peer: @mcap/core's indexed reader, the messages' bytes only.
  const peerSeconds: number[] = [];
  for (let r = 0; r < reps; r++) {
    const start = process.hrtime.bigint();
    const handle = await open(bag, 'r');
    let n = 0;
    try {
      const reader = await McapIndexedReader.Initialize({
        readable: new FileHandleReadable(handle),
        decompressHandlers: await loadDecompressHandlers(),
      });
      for await (const message of reader.readMessages()) n += message.data.length > 0 ? 1 : 0;
    } finally {
      await handle.close();
    }
    if (n !== frames) throw new Error(`bench bag: the peer read ${n} of ${frames} messages`);
    peerSeconds.push(Number(process.hrtime.bigint() - start) / 1e9);
  }
  const replayS = median(replaySeconds);
  const peerS = median(peerSeconds);

  // Recording at fps in real time, fed as a run feeds it.
  const schema = loadActionSchema(loadConfig(DEFAULT_CONFIG).actions.schema);
  const frameOf = (i: number): CameraFrame => ({ encoding: 'jpeg', data: jpegs[i % jpegs.length]!, width, height });
  const action = (i: number) => ({
    schemaId: schema.wireSchemaId,
    frameId: i,
    sourceId: '/camera',
    captureWallMs: 0,
    action: { action: 'move', confidence: 0.5 },
  });
  const recordPath = join(dir, 'record.mcap');
  const paced = await createRecorder({ path: recordPath, actionSchema: schema });
  const total = Math.round(fps * seconds);
  const periodMs = 1000 / fps;
  const pending: Promise<unknown>[] = [];
  const cpuBefore = process.cpuUsage();
  const t0 = performance.now();
  for (let i = 0; i < total; i++) {
    const wait = t0 + i * periodMs - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    const ns = START_NS + BigInt(Math.round(i * periodMs * 1e6));
    pending.push(paced.recordFrame(frameOf(i), { frameId: i, sourceId: '/camera', stampNs: ns }, ns));
    pending.push(paced.recordEvent({ type: 'frame', frameId: i }, ns, ns));
    pending.push(paced.recordEvent({ type: 'span', frameId: i, stage: 'decode' }, ns + 1n, ns));
    pending.push(paced.recordAction(action(i), ns, ns + 2n));
  }
  await Promise.all(pending);
  await paced.close();
  const cpu = process.cpuUsage(cpuBefore);
  const pacedWallS = (performance.now() - t0) / 1000;
  const { frames: recorded, framesNotRecorded, chunks } = paced.counts;

  // Recording back to back: the sustained rate.
  const fast = await createRecorder({ path: recordPath, actionSchema: schema });
  const fastStart = process.hrtime.bigint();
  for (let i = 0; i < total; i++) {
    const ns = START_NS + BigInt(i) * 1_000_000n;
    await fast.recordFrame(frameOf(i), { frameId: i, sourceId: '/camera', stampNs: ns }, ns);
    await fast.recordAction(action(i), ns, ns + 1n);
  }
  await fast.close();
  const fastS = Number(process.hrtime.bigint() - fastStart) / 1e9;
  const fastBytes = statSync(recordPath).size;
  rmSync(recordPath, { force: true });

  const r2 = (x: number) => Math.round(x * 100) / 100;
  return {
    width,
    height,
    jpeg_kb: r2(jpegs.reduce((n, j) => n + j.length, 0) / jpegs.length / 1024),
    replay_frames: replayed,
    replay_fps: r2(replayed / replayS),
    replay_mb_s: r2(bagBytes / 1e6 / replayS),
    peer_fps: r2(frames / peerS),
    peer_mb_s: r2(bagBytes / 1e6 / peerS),
    replay_vs_peer: r2(peerS / replayS),
    record_fps_target: fps,
    record_frames: recorded,
    record_frames_not_recorded: framesNotRecorded,
    record_cpu_core_share: r2((cpu.user + cpu.system) / 1e6 / pacedWallS),
    record_chunks: chunks,
    record_max_fps: r2(total / fastS),
    record_max_mb_s: r2(fastBytes / 1e6 / fastS),
  };
}
