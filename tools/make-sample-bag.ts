// Writes bags/sample.mcap: a small synthetic indoor scene (a wall with a door, a floor, a box that
// slides right, a person who walks in from the left and comes closer), 640×360 JPEG q70 at 10 Hz on
// /camera/front/compressed as foxglove.CompressedImage (json encoding, jsonschema from
// @foxglove/schemas), zstd chunks; and next to it bags/sample.labels.jsonl, the expected action of
// each frame (the labels format of `percept eval`, see README), worked out from the same scene
// geometry: the robot heads for the door while the person is far, waits while the person walks
// across, and stops when the person is close. Everything is fixed (timestamps, pixels, encoder
// settings), so running it again gives the same bytes.
//   node --import tsx tools/make-sample-bag.ts [out.mcap] [--frames N]
import { open, rename, writeFile } from 'node:fs/promises';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { McapWriter } from '@mcap/core';
import { FileHandleWritable } from '@mcap/nodejs';
import * as zstd from '@foxglove/wasm-zstd';
import { CompressedImage } from '@foxglove/schemas/jsonschema.js';
import sharp from 'sharp';

export interface SampleBagOptions {
  readonly frames?: number;
  readonly width?: number;
  readonly height?: number;
  readonly quality?: number;
  readonly hz?: number;
}

export const SAMPLE_TOPIC = '/camera/front/compressed';
export const SAMPLE_FRAME_ID = 'camera_front';
/** Log time of the first message: 2023-11-14T22:13:20Z, in ns. */
export const SAMPLE_START_NS = 1_700_000_000_000_000_000n;

export interface SampleBagSummary {
  readonly path: string;
  /** The labels file written next to the bag (`<name>.labels.jsonl`). */
  readonly labels: string;
  readonly frames: number;
  readonly bytes: number;
}

/** The labels file of a bag: `x.mcap` → `x.labels.jsonl`. */
export const labelsPathOf = (bagPath: string): string => bagPath.replace(/\.mcap$/, '') + '.labels.jsonl';

export async function makeSampleBag(path: string, options: SampleBagOptions = {}): Promise<SampleBagSummary> {
  const { frames = 40, width = 640, height = 360, quality = 70, hz = 10 } = options;
  if (!Number.isInteger(frames) || frames < 1)
    throw new RangeError(`makeSampleBag: expected integer >= 1 for frames but received ${frames}`);
  if (!Number.isInteger(width) || !Number.isInteger(height) || width < 64 || height < 64)
    throw new RangeError(`makeSampleBag: bad size ${width}x${height}`);
  const periodNs = BigInt(Math.round(1e9 / hz));
  await zstd.isLoaded;

  // Written next to the target and renamed, so a failed run never leaves a half bag in place.
  const partial = `${path}.partial`;
  const handle = await open(partial, 'w');
  try {
    const writer = new McapWriter({
      writable: new FileHandleWritable(handle),
      chunkSize: 512 * 1024,
      compressChunk: (data) => ({ compression: 'zstd', compressedData: zstd.compress(data, 19) }),
    });
    await writer.start({ profile: '', library: 'percept tools/make-sample-bag' });
    const schemaId = await writer.registerSchema({
      name: CompressedImage.title,
      encoding: 'jsonschema',
      data: new TextEncoder().encode(JSON.stringify(CompressedImage)),
    });
    const channelId = await writer.registerChannel({ topic: SAMPLE_TOPIC, schemaId, messageEncoding: 'json', metadata: new Map() });
    await writer.addMetadata({
      name: 'percept.sample',
      metadata: new Map([
        ['generator', 'tools/make-sample-bag.ts'],
        ['scene', 'wall with door, floor, sliding box, approaching person'],
        ['size', `${width}x${height}`],
        ['rate_hz', String(hz)],
      ]),
    });
    for (let i = 0; i < frames; i++) {
      const jpeg = await sharp(renderScene(i, frames, width, height), { raw: { width, height, channels: 3 } })
        .jpeg({ quality })
        .toBuffer();
      const stampNs = SAMPLE_START_NS + BigInt(i) * periodNs;
      const message = {
        timestamp: { sec: Number(stampNs / 1_000_000_000n), nsec: Number(stampNs % 1_000_000_000n) },
        frame_id: SAMPLE_FRAME_ID,
        data: jpeg.toString('base64'),
        format: 'jpeg',
      };
      await writer.addMessage({
        channelId,
        sequence: i,
        logTime: stampNs,
        publishTime: stampNs,
        data: new TextEncoder().encode(JSON.stringify(message)),
      });
    }
    await writer.end();
  } finally {
    await handle.close();
  }
  await rename(partial, path);
  const labels = labelsPathOf(path);
  const lines = Array.from({ length: frames }, (_, i) => {
    const stampNs = SAMPLE_START_NS + BigInt(i) * periodNs;
    return JSON.stringify({ log_time_ns: String(stampNs), action: expectedAction(sceneAt(i, frames, width, height)) });
  });
  await writeFile(labels, `${lines.join('\n')}\n`);
  const stat = await open(path, 'r').then(async (h) => {
    try {
      return await h.stat();
    } finally {
      await h.close();
    }
  });
  return { path, labels, frames, bytes: stat.size };
}

/** Where things are in frame `i` of `n` (pixels): what renderScene draws and the labels describe. */
export interface Scene {
  readonly width: number;
  readonly height: number;
  /** 0 at the first frame, 1 at the last. */
  readonly t: number;
  readonly horizon: number;
  readonly door: Box;
  readonly box: Box;
  /** The person's bounding box, head to feet. */
  readonly person: Box;
  /** The sizes the boxes were made from (drawing uses them as they are). */
  readonly doorW: number;
  readonly boxW: number;
  readonly bodyW: number;
  readonly bodyH: number;
}
type Box = { readonly x0: number; readonly y0: number; readonly x1: number; readonly y1: number };

export function sceneAt(i: number, n: number, width: number, height: number): Scene {
  const t = n > 1 ? i / (n - 1) : 0;
  const horizon = Math.round(height * 0.55);
  const doorX = width * 0.72;
  const doorW = width * 0.14;
  const boxW = width * 0.12;
  const boxX = width * (0.3 + 0.25 * t);
  const boxTop = horizon + height * 0.12;
  const personScale = 0.6 + 0.6 * t;
  const personX = width * (0.05 + 0.3 * t);
  const feetY = horizon + height * (0.1 + 0.3 * t);
  const bodyH = height * 0.35 * personScale;
  const bodyW = width * 0.06 * personScale;
  return {
    width,
    height,
    t,
    horizon,
    door: { x0: doorX, y0: horizon - height * 0.48, x1: doorX + doorW, y1: horizon },
    box: { x0: boxX, y0: boxTop, x1: boxX + boxW, y1: boxTop + boxW * 0.8 },
    person: { x0: personX, y0: feetY - bodyH - bodyW * 0.45 - bodyW * 0.42, x1: personX + bodyW, y1: feetY },
    doorW,
    boxW,
    bodyW,
    bodyH,
  };
}

/** The action a robot should take in a scene: head for the door while the person is far (in the
 * first third), wait while the person crosses, stop when the person is close (the last third, when
 * they fill more than a third of the image height). */
export function expectedAction(scene: Scene): Record<string, unknown> {
  const norm = (b: Box): number[] =>
    [b.x0 / scene.width, b.y0 / scene.height, b.x1 / scene.width, b.y1 / scene.height].map(
      (v) => Math.round(Math.min(1, Math.max(0, v)) * 1000) / 1000,
    );
  if (scene.t < 1 / 3) return { action: 'move', confidence: 1, target: { label: 'door', bbox: norm(scene.door) } };
  if ((scene.person.y1 - scene.person.y0) / scene.height <= 1 / 3 || scene.t < 2 / 3)
    return { action: 'wait', confidence: 1, target: { label: 'person', bbox: norm(scene.person) } };
  return { action: 'stop', confidence: 1, target: { label: 'person', bbox: norm(scene.person) }, hazards: ['person_close'] };
}

/** RGB pixels of frame `i` of `n` (pure). */
export function renderScene(i: number, n: number, width: number, height: number): Buffer {
  const px = Buffer.alloc(width * height * 3);
  const { horizon, door, box, person, doorW, boxW, bodyW, bodyH } = sceneAt(i, n, width, height);
  const set = (x: number, y: number, r: number, g: number, b: number): void => {
    const o = (y * width + x) * 3;
    px[o] = r;
    px[o + 1] = g;
    px[o + 2] = b;
  };
  const rect = (x0: number, y0: number, x1: number, y1: number, r: number, g: number, b: number): void => {
    for (let y = Math.max(0, Math.round(y0)); y < Math.min(height, Math.round(y1)); y++) {
      for (let x = Math.max(0, Math.round(x0)); x < Math.min(width, Math.round(x1)); x++) set(x, y, r, g, b);
    }
  };
  const disc = (cx: number, cy: number, radius: number, r: number, g: number, b: number): void => {
    for (let y = Math.max(0, Math.floor(cy - radius)); y < Math.min(height, Math.ceil(cy + radius)); y++) {
      for (let x = Math.max(0, Math.floor(cx - radius)); x < Math.min(width, Math.ceil(cx + radius)); x++) {
        if ((x - cx) ** 2 + (y - cy) ** 2 <= radius ** 2) set(x, y, r, g, b);
      }
    }
  };
  // Wall (warm, lighter towards the top) and floor (grey, darker towards the camera).
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      if (y < horizon) {
        const k = 1 - (0.15 * y) / horizon;
        set(x, y, Math.round(225 * k), Math.round(215 * k), Math.round(190 * k));
      } else {
        const k = 1 - (0.35 * (y - horizon)) / (height - horizon);
        const tile = ((Math.floor(x / 40) + Math.floor((y - horizon) / 20)) & 1) === 0 ? 8 : 0;
        const g = Math.round(150 * k) + tile;
        set(x, y, g, g, g + 6);
      }
    }
  }
  rect(0, horizon - 3, width, horizon + 2, 90, 80, 70); // skirting board
  // Door on the right: frame, panel, knob.
  rect(door.x0 - 6, door.y0 - 6, door.x1 + 6, horizon, 70, 50, 35);
  rect(door.x0, door.y0, door.x1, horizon, 140, 95, 55);
  disc(door.x0 + doorW * 0.85, horizon - height * 0.22, Math.max(2, height * 0.012), 220, 200, 90);
  // A cardboard box sliding right along the floor.
  rect(box.x0, box.y0, box.x1, box.y1, 180, 130, 70);
  rect(box.x0, box.y0 + boxW * 0.35, box.x1, box.y0 + boxW * 0.42, 150, 105, 55); // tape
  // A person walking in from the left and getting closer (bigger).
  const feetY = person.y1;
  const personX = person.x0;
  rect(personX, feetY - bodyH * 0.45, personX + bodyW * 0.45, feetY, 40, 40, 60); // legs
  rect(personX + bodyW * 0.55, feetY - bodyH * 0.45, personX + bodyW, feetY, 40, 40, 60);
  rect(personX, feetY - bodyH, personX + bodyW, feetY - bodyH * 0.45, 40, 90, 160); // torso
  disc(personX + bodyW / 2, feetY - bodyH - bodyW * 0.45, bodyW * 0.42, 225, 185, 150); // head
  return px;
}

async function main(argv: string[]): Promise<void> {
  const args = argv.slice(2);
  const framesAt = args.indexOf('--frames');
  const frames = framesAt >= 0 ? Number(args.splice(framesAt, 2)[1]) : undefined;
  const out = args[0] ?? fileURLToPath(new URL('../bags/sample.mcap', import.meta.url));
  const summary = await makeSampleBag(out, { frames });
  console.log(`wrote ${summary.path}: ${summary.frames} frames, ${summary.bytes} bytes; labels ${summary.labels}`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv).catch((err: unknown) => {
    console.error(err);
    process.exitCode = 1;
  });
}
