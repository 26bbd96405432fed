// Writes bags/sample.mcap: a small synthetic indoor scene (a wall with a door, a floor, a box that
// slides right, a person who walks in from the left and comes closer), 640×360 JPEG q70 at 10 Hz on
// /camera/front/compressed as foxglove.CompressedImage (json encoding, jsonschema from
// @foxglove/schemas), zstd chunks; and next to it bags/sample.labels.jsonl, the expected action of
// each frame (the labels format of `percept eval`, see README). Each frame is also described as a
// tools/make-scenes.ts Scene (sampleSceneAt: the same door, box, person, colours and light as drawn),
// and its label is that scene's actionOf, the one rule table the generated scenes follow too: the
// person is in view in every frame, so the robot waits while they are far and stops once they are
// close. Everything is fixed (timestamps, pixels, encoder settings), so running it again gives the
// same bytes. The drawing and the bag writer are tools/scene-geometry.ts's, shared with
// tools/make-scenes.ts; this scene is none of its seeds.
//   node --import tsx tools/make-sample-bag.ts [out.mcap] [--frames N]
import { writeFile } from 'node:fs/promises';
import { fileURLToPath, pathToFileURL } from 'node:url';
import sharp from 'sharp';
import { DEFAULT_PAINT, actionOf, type NBox, type RobotAction, type Scene, type SceneObject } from './make-scenes.ts';
import {
  CAMERA_FRAME_ID,
  CAMERA_TOPIC,
  createCanvas,
  drawBox,
  drawDoor,
  drawPerson,
  labelsPathOf,
  paintRoom,
  personBox,
  sampleRoom,
  writeCameraBag,
  type Box,
} from './scene-geometry.ts';

export { labelsPathOf };

export interface SampleBagOptions {
  readonly frames?: number;
  readonly width?: number;
  readonly height?: number;
  readonly quality?: number;
  readonly hz?: number;
}

export const SAMPLE_TOPIC = CAMERA_TOPIC;
export const SAMPLE_FRAME_ID = CAMERA_FRAME_ID;
/** Log time of the first message: 2023-11-14T22:13:20Z, in ns. */
export const SAMPLE_START_NS = 1_700_000_000_000_000_000n;

export interface SampleBagSummary {
  readonly path: string;
  /** The labels file written next to the bag (`<name>.labels.jsonl`). */
  readonly labels: string;
  readonly frames: number;
  readonly bytes: number;
}

export async function makeSampleBag(path: string, options: SampleBagOptions = {}): Promise<SampleBagSummary> {
  const { frames = 40, width = 640, height = 360, quality = 70, hz = 10 } = options;
  if (!Number.isInteger(frames) || frames < 1)
    throw new RangeError(`makeSampleBag: expected integer >= 1 for frames but received ${frames}`);
  if (!Number.isInteger(width) || !Number.isInteger(height) || width < 64 || height < 64)
    throw new RangeError(`makeSampleBag: bad size ${width}x${height}`);
  const periodNs = BigInt(Math.round(1e9 / hz));
  const { bytes } = await writeCameraBag(path, {
    library: 'percept tools/make-sample-bag',
    metadata: {
      name: 'percept.sample',
      entries: [
        ['generator', 'tools/make-sample-bag.ts'],
        ['scene', 'wall with door, floor, sliding box, approaching person'],
        ['size', `${width}x${height}`],
        ['rate_hz', String(hz)],
      ],
    },
    frames: (async function* () {
      for (let i = 0; i < frames; i++) {
        const jpeg = await sharp(renderScene(i, frames, width, height), { raw: { width, height, channels: 3 } })
          .jpeg({ quality })
          .toBuffer();
        yield { jpeg, stampNs: SAMPLE_START_NS + BigInt(i) * periodNs };
      }
    })(),
  });
  const labels = labelsPathOf(path);
  const lines = Array.from({ length: frames }, (_, i) => {
    const stampNs = SAMPLE_START_NS + BigInt(i) * periodNs;
    return JSON.stringify({ log_time_ns: String(stampNs), action: sampleActionAt(i, frames, width, height, quality) });
  });
  await writeFile(labels, `${lines.join('\n')}\n`);
  return { path, labels, frames, bytes };
}

/** Where things are in frame `i` of `n` (pixels): what renderScene draws and sampleSceneAt describes. */
export interface SampleGeometry {
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

export function geometryAt(i: number, n: number, width: number, height: number): SampleGeometry {
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
    person: personBox(personX, feetY, bodyW, bodyH),
    doorW,
    boxW,
    bodyW,
    bodyH,
  };
}

/** The sample scene's colours as drawn: make-scenes' defaults (door: frame, panel, knob; box: body, tape; person: legs, torso, skin). */
export const SAMPLE_PAINT = { door: DEFAULT_PAINT.door, box: DEFAULT_PAINT.box, person: DEFAULT_PAINT.person };

/** The sample scene is no seed of make-scenes' splits; its Scene says so with this seed. */
export const SAMPLE_SEED = -1;

/**
 * Frame `i` of `n` as a tools/make-scenes.ts Scene: the door, the box and the person where
 * renderScene draws them (boxes normalised to the image), fully lit, the person standing (the
 * sample draws straight legs), in the sample's room. At 640×360 make-scenes' renderScene (plain)
 * draws it as this file does but for a few pixels of the door knob, which sits a little higher
 * here; at other sizes the door frame's width differs too.
 */
export function sampleSceneAt(i: number, n: number, width: number, height: number, quality = 70): Scene {
  const g = geometryAt(i, n, width, height);
  const norm = (b: Box): NBox => [b.x0 / width, b.y0 / height, b.x1 / width, b.y1 / height];
  const room = sampleRoom(g.horizon);
  const door: SceneObject = { kind: 'door', box: norm(g.door), paint: SAMPLE_PAINT.door };
  const box: SceneObject = { kind: 'box', box: norm(g.box), paint: SAMPLE_PAINT.box };
  const person: SceneObject = { kind: 'person', box: norm(g.person), stride: 0, paint: SAMPLE_PAINT.person };
  return {
    seed: SAMPLE_SEED,
    horizon: g.horizon / height,
    light: 1,
    // The door on the wall first, then far to near (the box and the person never overlap).
    objects: [door, ...[box, person].sort((a, b) => a.box[3] - b.box[3])],
    look: {
      wall: room.wall,
      wallFade: room.wallFade,
      floor: room.floor,
      floorTint: room.floorTint,
      floorFade: room.floorFade,
      tile: [room.tileW / width, room.tileH / room.tileW, room.tileDelta, room.tileShift / room.tileW],
      gradient: 0,
      tint: [1, 1, 1],
      noise: 0,
      quality,
    },
  };
}

/** The expected action of frame `i` of `n`: actionOf its scene (make-scenes' rule table, the only one). */
export const sampleActionAt = (i: number, n: number, width: number, height: number, quality = 70): RobotAction =>
  actionOf(sampleSceneAt(i, n, width, height, quality));

/** RGB pixels of frame `i` of `n` (pure). */
export function renderScene(i: number, n: number, width: number, height: number): Buffer {
  const c = createCanvas(width, height);
  const { horizon, door, box, person, doorW, boxW, bodyW, bodyH } = geometryAt(i, n, width, height);
  paintRoom(c, sampleRoom(horizon));
  // Door on the right: frame, panel, knob.
  const knob = { x: door.x0 + doorW * 0.85, y: horizon - height * 0.22, r: Math.max(2, height * 0.012) };
  drawDoor(
    c,
    door.x0,
    door.y0,
    doorW,
    horizon,
    { frame: SAMPLE_PAINT.door[0], panel: SAMPLE_PAINT.door[1], knob: SAMPLE_PAINT.door[2], frameW: 6 },
    knob,
  );
  // A cardboard box sliding right along the floor.
  drawBox(c, box.x0, box.y0, boxW, boxW * 0.8, { body: SAMPLE_PAINT.box[0], tape: SAMPLE_PAINT.box[1] });
  // A person walking in from the left and getting closer (bigger).
  drawPerson(c, person.x0, person.y1, bodyW, bodyH, {
    legs: SAMPLE_PAINT.person[0],
    torso: SAMPLE_PAINT.person[1],
    skin: SAMPLE_PAINT.person[2],
  });
  return c.px;
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
