// What the synthetic scene tools (make-sample-bag.ts, make-scenes.ts) share. That is an RGB canvas of
// flat shapes, the room and its objects, bounding boxes, and the camera bag writer.
// A camera bag holds JPEG frames as foxglove.CompressedImage in MCAP.
// Everything here is pure and deterministic: the same calls give the same pixels and the same bytes.
import { open, rename } from 'node:fs/promises';
import { McapWriter } from '@mcap/core';
import { FileHandleWritable } from '@mcap/nodejs';
import * as zstd from '@foxglove/wasm-zstd';
import { CompressedImage } from '@foxglove/schemas/jsonschema.js';

export type RGB = readonly [number, number, number];

/** An axis-aligned box in pixels (x1, y1 exclusive edges). */
export interface Box {
  readonly x0: number;
  readonly y0: number;
  readonly x1: number;
  readonly y1: number;
}

export type Point = readonly [number, number];

/** An RGB image being drawn, and the shapes it draws (colours 0–255; out-of-range values are clamped). */
export interface Canvas {
  readonly width: number;
  readonly height: number;
  /** Packed RGB, row by row. */
  readonly px: Buffer;
  set(x: number, y: number, rgb: RGB): void;
  /** Pixels x in [round(x0), round(x1)), y in [round(y0), round(y1)). */
  rect(x0: number, y0: number, x1: number, y1: number, rgb: RGB): void;
  /** Pixels whose corner (x, y) lies within `radius` of the centre. */
  disc(cx: number, cy: number, radius: number, rgb: RGB): void;
  /** Like disc, with radii rx and ry. */
  ellipse(cx: number, cy: number, rx: number, ry: number, rgb: RGB): void;
  /** Pixels whose centre lies inside a convex polygon (either winding). */
  polygon(points: readonly Point[], rgb: RGB): void;
}

const clamp8 = (v: number): number => (v < 0 ? 0 : v > 255 ? 255 : v);

export function createCanvas(width: number, height: number): Canvas {
  const px = Buffer.alloc(width * height * 3);
  const set = (x: number, y: number, rgb: RGB): void => {
    const o = (y * width + x) * 3;
    px[o] = clamp8(rgb[0]);
    px[o + 1] = clamp8(rgb[1]);
    px[o + 2] = clamp8(rgb[2]);
  };
  const rect = (x0: number, y0: number, x1: number, y1: number, rgb: RGB): void => {
    const xa = Math.max(0, Math.round(x0));
    const xb = Math.min(width, Math.round(x1));
    if (xb <= xa) return;
    // One row's span filled with the colour repeated: the same pixels as setting them one by one.
    const colour = Buffer.from([clamp8(rgb[0]), clamp8(rgb[1]), clamp8(rgb[2])]);
    for (let y = Math.max(0, Math.round(y0)); y < Math.min(height, Math.round(y1)); y++) {
      px.fill(colour, (y * width + xa) * 3, (y * width + xb) * 3);
    }
  };
  const ellipse = (cx: number, cy: number, rx: number, ry: number, rgb: RGB): void => {
    for (let y = Math.max(0, Math.floor(cy - ry)); y < Math.min(height, Math.ceil(cy + ry)); y++) {
      for (let x = Math.max(0, Math.floor(cx - rx)); x < Math.min(width, Math.ceil(cx + rx)); x++) {
        if (((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2 <= 1) set(x, y, rgb);
      }
    }
  };
  // The sample bag's disc test, kept exactly as it was so the committed bag stays byte for byte.
  const disc = (cx: number, cy: number, radius: number, rgb: RGB): void => {
    for (let y = Math.max(0, Math.floor(cy - radius)); y < Math.min(height, Math.ceil(cy + radius)); y++) {
      for (let x = Math.max(0, Math.floor(cx - radius)); x < Math.min(width, Math.ceil(cx + radius)); x++) {
        if ((x - cx) ** 2 + (y - cy) ** 2 <= radius ** 2) set(x, y, rgb);
      }
    }
  };
  const polygon = (points: readonly Point[], rgb: RGB): void => {
    const xs = points.map((p) => p[0]);
    const ys = points.map((p) => p[1]);
    // Area sign, so the inside test works for either winding.
    let area = 0;
    for (let i = 0; i < points.length; i++) {
      const [ax, ay] = points[i]!;
      const [bx, by] = points[(i + 1) % points.length]!;
      area += ax * by - bx * ay;
    }
    const s = area < 0 ? -1 : 1;
    for (let y = Math.max(0, Math.floor(Math.min(...ys))); y < Math.min(height, Math.ceil(Math.max(...ys))); y++) {
      for (let x = Math.max(0, Math.floor(Math.min(...xs))); x < Math.min(width, Math.ceil(Math.max(...xs))); x++) {
        const qx = x + 0.5;
        const qy = y + 0.5;
        let inside = true;
        for (let i = 0; i < points.length && inside; i++) {
          const [ax, ay] = points[i]!;
          const [bx, by] = points[(i + 1) % points.length]!;
          inside = s * ((bx - ax) * (qy - ay) - (by - ay) * (qx - ax)) >= 0;
        }
        if (inside) set(x, y, rgb);
      }
    }
  };
  return { width, height, px, set, rect, disc, ellipse, polygon };
}

/** How the room looks: a wall above the horizon, lighter at the top; a tiled floor below, darker towards the camera. */
export interface RoomLook {
  /** Image row of the horizon (where wall meets floor), pixels. */
  readonly horizon: number;
  readonly wall: RGB;
  /** How much darker the wall is at the horizon than at the top (0–1). */
  readonly wallFade: number;
  /** Grey level of the floor at the horizon, plus a tint added to each channel. */
  readonly floor: number;
  readonly floorTint: RGB;
  /** How much darker the floor is at the bottom edge than at the horizon (0–1). */
  readonly floorFade: number;
  readonly tileW: number;
  readonly tileH: number;
  /** Added to every other tile's grey level. */
  readonly tileDelta: number;
  /** Horizontal phase of the tiles, pixels (the camera's sideways offset). */
  readonly tileShift: number;
  readonly skirting: RGB;
}

/** The sample bag's room at a given horizon. */
export const sampleRoom = (horizon: number): RoomLook => ({
  horizon,
  wall: [225, 215, 190],
  wallFade: 0.15,
  floor: 150,
  floorTint: [0, 0, 6],
  floorFade: 0.35,
  tileW: 40,
  tileH: 20,
  tileDelta: 8,
  tileShift: 0,
  skirting: [90, 80, 70],
});

export function paintRoom(c: Canvas, look: RoomLook): void {
  const { width, height, px } = c;
  const { horizon, wall, wallFade, floor, floorTint, floorFade, tileW, tileH, tileDelta, tileShift } = look;
  // Each wall row is one colour; each floor row two (a tile's parity is its column's plus its row's).
  const column = new Uint8Array(width);
  for (let x = 0; x < width; x++) column[x] = Math.floor((x + tileShift) / tileW) & 1;
  const light = Buffer.alloc(3);
  const dark = Buffer.alloc(3);
  for (let y = 0; y < height; y++) {
    const row = y * width * 3;
    if (y < horizon) {
      const k = 1 - (wallFade * y) / horizon;
      for (let ch = 0; ch < 3; ch++) light[ch] = clamp8(Math.round(wall[ch]! * k));
      px.fill(light, row, row + width * 3);
    } else {
      const k = 1 - (floorFade * (y - horizon)) / (height - horizon);
      const g = Math.round(floor * k);
      const rowParity = Math.floor((y - horizon) / tileH) & 1;
      for (let ch = 0; ch < 3; ch++) {
        light[ch] = clamp8(g + tileDelta + floorTint[ch]!);
        dark[ch] = clamp8(g + floorTint[ch]!);
      }
      for (let x = 0; x < width; x++) {
        const from = ((column[x]! + rowParity) & 1) === 0 ? light : dark;
        const o = row + x * 3;
        px[o] = from[0]!;
        px[o + 1] = from[1]!;
        px[o + 2] = from[2]!;
      }
    }
  }
  c.rect(0, horizon - 3, width, horizon + 2, look.skirting);
}

export interface DoorLook {
  readonly frame: RGB;
  readonly panel: RGB;
  readonly knob: RGB;
  /** Width of the frame around the panel, pixels. */
  readonly frameW: number;
}

/** A door standing on the floor line `bottom`: frame, panel, and a knob at (knobX, knobY). */
export function drawDoor(
  c: Canvas,
  x0: number,
  y0: number,
  w: number,
  bottom: number,
  look: DoorLook,
  knob: { x: number; y: number; r: number },
): void {
  c.rect(x0 - look.frameW, y0 - look.frameW, x0 + w + look.frameW, bottom, look.frame);
  c.rect(x0, y0, x0 + w, bottom, look.panel);
  c.disc(knob.x, knob.y, knob.r, look.knob);
}

/** A cardboard box with a band of tape a third of its width below its top. */
export function drawBox(c: Canvas, x0: number, y0: number, w: number, h: number, look: { body: RGB; tape: RGB }): void {
  c.rect(x0, y0, x0 + w, y0 + h, look.body);
  c.rect(x0, y0 + w * 0.35, x0 + w, y0 + w * 0.42, look.tape);
}

export interface PersonLook {
  readonly legs: RGB;
  readonly torso: RGB;
  readonly skin: RGB;
  /** Walking stride: 0 stands (straight legs), up to 1 (legs apart); the sign is the walking direction. */
  readonly stride?: number;
}

/** The bounding box of drawPerson's figure, head to feet. */
export const personBox = (x0: number, feetY: number, bodyW: number, bodyH: number): Box => ({
  x0,
  y0: feetY - bodyH - bodyW * 0.45 - bodyW * 0.42,
  x1: x0 + bodyW,
  y1: feetY,
});

/** A person: legs, torso and head, `bodyW` wide, feet at `feetY`, head on top of the `bodyH` tall body. */
export function drawPerson(c: Canvas, x0: number, feetY: number, bodyW: number, bodyH: number, look: PersonLook): void {
  const stride = look.stride ?? 0;
  const hip = feetY - bodyH * 0.45;
  if (stride === 0) {
    c.rect(x0, hip, x0 + bodyW * 0.45, feetY, look.legs);
    c.rect(x0 + bodyW * 0.55, hip, x0 + bodyW, feetY, look.legs);
  } else {
    // Legs apart: the feet at the box's sides, the hips together; the front leg is drawn last.
    const legW = bodyW * 0.4;
    const spread = Math.abs(stride) * (bodyW - legW) * 0.5;
    const mid = x0 + (bodyW - legW) / 2;
    const back: Point[] = [
      [mid, hip],
      [mid + legW, hip],
      [mid + legW - spread, feetY],
      [mid - spread, feetY],
    ];
    const front: Point[] = back.map(([x, y]) => [y === hip ? x : x + 2 * spread, y]);
    c.polygon(stride > 0 ? back : front, look.legs);
    c.polygon(stride > 0 ? front : back, look.legs);
  }
  c.rect(x0, feetY - bodyH, x0 + bodyW, feetY - bodyH * 0.45, look.torso);
  c.disc(x0 + bodyW / 2, feetY - bodyH - bodyW * 0.45, bodyW * 0.42, look.skin);
}

/** A cup standing on `bottom`: a slightly tapered body and a handle ring on the right; `w` includes the handle. */
export function drawCup(c: Canvas, x0: number, bottom: number, w: number, h: number, look: { body: RGB; inside: RGB }): void {
  const bodyW = w * 0.72;
  const handleR = w * 0.2;
  const cy = bottom - h * 0.55;
  c.disc(x0 + bodyW + handleR * 0.3, cy, handleR, look.body);
  c.disc(x0 + bodyW + handleR * 0.3, cy, handleR * 0.45, look.inside);
  c.polygon(
    [
      [x0, bottom - h],
      [x0 + bodyW, bottom - h],
      [x0 + bodyW * 0.88, bottom],
      [x0 + bodyW * 0.12, bottom],
    ],
    look.body,
  );
  c.rect(x0 + bodyW * 0.06, bottom - h, x0 + bodyW * 0.94, bottom - h + Math.max(1, h * 0.12), look.inside);
}

/** A small table against the wall: a top `w` wide at `topY` and two legs down to `bottom`. */
export function drawTable(c: Canvas, x0: number, topY: number, w: number, bottom: number, look: { wood: RGB; legs: RGB }): void {
  const t = Math.max(2, (bottom - topY) * 0.12);
  c.rect(x0 + w * 0.06, topY, x0 + w * 0.14, bottom, look.legs);
  c.rect(x0 + w * 0.86, topY, x0 + w * 0.94, bottom, look.legs);
  c.rect(x0, topY, x0 + w, topY + t, look.wood);
}

/** An A-frame floor sign (the wet-floor sign's shape): a tall trapezoid with a white band and a dark mark on it. */
export function drawSign(c: Canvas, x0: number, bottom: number, w: number, h: number, look: { body: RGB; mark: RGB }): void {
  const top = bottom - h;
  c.polygon(
    [
      [x0 + w * 0.3, top],
      [x0 + w * 0.7, top],
      [x0 + w, bottom],
      [x0, bottom],
    ],
    look.body,
  );
  const at = (y: number): [number, number] => {
    const k = (y - top) / h;
    return [x0 + w * 0.3 * (1 - k) + w * 0.1, x0 + w * (0.7 + 0.3 * k) - w * 0.1];
  };
  const b0 = top + h * 0.3;
  const b1 = top + h * 0.62;
  const [l0, r0] = at(b0);
  const [l1, r1] = at(b1);
  c.polygon(
    [
      [l0, b0],
      [r0, b0],
      [r1, b1],
      [l1, b1],
    ],
    [250, 250, 245],
  );
  // A stick figure slipping: a head and a slanted body.
  const cx = x0 + w / 2;
  c.disc(cx - w * 0.06, b0 + h * 0.07, Math.max(1, h * 0.045), look.mark);
  c.polygon(
    [
      [cx - w * 0.08, b0 + h * 0.12],
      [cx + w * 0.0, b0 + h * 0.12],
      [cx + w * 0.12, b1 - h * 0.03],
      [cx + w * 0.04, b1 - h * 0.03],
    ],
    look.mark,
  );
}

/** A bin-like floor obstacle: a body with an elliptic lid and two darker bands. */
export function drawObstacle(c: Canvas, x0: number, bottom: number, w: number, h: number, look: { body: RGB; band: RGB; lid: RGB }): void {
  const ry = Math.max(1, w * 0.12);
  c.rect(x0, bottom - h + ry, x0 + w, bottom, look.body);
  c.rect(x0, bottom - h * 0.7, x0 + w, bottom - h * 0.62, look.band);
  c.rect(x0, bottom - h * 0.3, x0 + w, bottom - h * 0.22, look.band);
  c.ellipse(x0 + w / 2, bottom - h + ry, w / 2, ry, look.lid);
}

/** A box as [x0, y0, x1, y1] normalised to the image, clamped to [0, 1] and rounded to `decimals`. */
export function normBox(b: Box, width: number, height: number, decimals: number): number[] {
  const k = 10 ** decimals;
  return [b.x0 / width, b.y0 / height, b.x1 / width, b.y1 / height].map((v) => Math.round(Math.min(1, Math.max(0, v)) * k) / k);
}

/** The labels file of a bag: `x.mcap` → `x.labels.jsonl`. */
export const labelsPathOf = (bagPath: string): string => bagPath.replace(/\.mcap$/, '') + '.labels.jsonl';

/** Where the camera bags' frames are: the topic `percept` reads by default. */
export const CAMERA_TOPIC = '/camera/front/compressed';
export const CAMERA_FRAME_ID = 'camera_front';

export interface CameraBagOptions {
  /** The header's library string. */
  readonly library: string;
  /** One metadata record: its name and entries, in order. */
  readonly metadata: { readonly name: string; readonly entries: readonly (readonly [string, string])[] };
  /** The frames, in log-time order. */
  readonly frames: AsyncIterable<{ readonly jpeg: Buffer; readonly stampNs: bigint }>;
}

/**
 * Writes JPEG frames to an MCAP bag: CAMERA_TOPIC as foxglove.CompressedImage (json encoding,
 * jsonschema from @foxglove/schemas), zstd chunks, log and publish time the stamp, sequence the index.
 * Written to `<path>.partial` and renamed, so a failed run never leaves a half bag in place.
 */
export async function writeCameraBag(path: string, options: CameraBagOptions): Promise<{ frames: number; bytes: number }> {
  await zstd.isLoaded;
  const partial = `${path}.partial`;
  const handle = await open(partial, 'w');
  let frames = 0;
  try {
    const writer = new McapWriter({
      writable: new FileHandleWritable(handle),
      chunkSize: 512 * 1024,
      compressChunk: (data) => ({ compression: 'zstd', compressedData: zstd.compress(data, 19) }),
    });
    await writer.start({ profile: '', library: options.library });
    const schemaId = await writer.registerSchema({
      name: CompressedImage.title,
      encoding: 'jsonschema',
      data: new TextEncoder().encode(JSON.stringify(CompressedImage)),
    });
    const channelId = await writer.registerChannel({ topic: CAMERA_TOPIC, schemaId, messageEncoding: 'json', metadata: new Map() });
    await writer.addMetadata({ name: options.metadata.name, metadata: new Map(options.metadata.entries) });
    for await (const { jpeg, stampNs } of options.frames) {
      const message = {
        timestamp: { sec: Number(stampNs / 1_000_000_000n), nsec: Number(stampNs % 1_000_000_000n) },
        frame_id: CAMERA_FRAME_ID,
        data: jpeg.toString('base64'),
        format: 'jpeg',
      };
      await writer.addMessage({
        channelId,
        sequence: frames,
        logTime: stampNs,
        publishTime: stampNs,
        data: new TextEncoder().encode(JSON.stringify(message)),
      });
      frames++;
    }
    await writer.end();
  } finally {
    await handle.close();
  }
  await rename(partial, path);
  const bytes = await open(path, 'r').then(async (h) => {
    try {
      return (await h.stat()).size;
    } finally {
      await h.close();
    }
  });
  return { frames, bytes };
}
