// source-pattern: a generated, JPEG-encoded test pattern of colour bars, a moving box, and the frame index as 16 blocks.
// A consumer can read the index back from the decoded image. Frame i is the same bytes every run.
// Pacing and encode-ahead: nodes/README.md#pattern-source
import sharp from 'sharp';
import type { Clock } from '../pipeline/clock.ts';
import type { CameraFrame } from './payloads.ts';
import type { FrameSource, SourceItem } from '../pipeline/types.ts';
import { waitUntilDue, wallMsAt } from '../pipeline/pacing.ts';

export interface PatternSourceOptions {
  readonly fps: number;
  /** Frames to produce (a positive integer, or Infinity to run until aborted). */
  readonly frames: number;
  readonly width: number;
  readonly height: number;
  readonly id?: string;
  /** JPEG quality 1..100 (default 80). */
  readonly quality?: number;
}

export interface PatternSourceCounters {
  readonly yielded: number;
  /** Frames yielded more than one period after their due time (RealClock only). */
  readonly late: number;
}

export interface PatternSource extends FrameSource<CameraFrame> {
  readonly counters: PatternSourceCounters;
  /** A generated pattern never rejects a frame. */
  frames(clock: Clock, signal: AbortSignal): AsyncIterable<SourceItem<CameraFrame>>;
}

/** Bits of the frame counter drawn along the bottom edge. */
const PATTERN_COUNTER_BITS = 16;
const BARS: ReadonlyArray<readonly [number, number, number]> = [
  [235, 235, 235],
  [235, 235, 16],
  [16, 235, 235],
  [16, 235, 16],
  [235, 16, 235],
  [235, 16, 16],
  [16, 16, 235],
  [16, 16, 16],
];

/** Renders and JPEG-encodes frame `index` (encodePatternFrame; a test may watch the calls). */
export type PatternEncoder = (index: number, width: number, height: number, quality: number) => Promise<Buffer>;

export function createPatternSource(options: PatternSourceOptions, encode: PatternEncoder = encodePatternFrame): PatternSource {
  if (options === null || typeof options !== 'object')
    throw new TypeError('createPatternSource: expected an options object { fps, frames, width, height }');
  const { fps, frames, width, height, id = 'pattern', quality = 80 } = options;
  if (typeof fps !== 'number' || !Number.isFinite(fps) || fps <= 0)
    throw new RangeError(`createPatternSource: expected finite number > 0 for fps but received ${fps}`);
  if (!(frames === Infinity || (Number.isInteger(frames) && frames > 0))) {
    throw new RangeError(`createPatternSource: expected positive integer or Infinity for frames but received ${frames}`);
  }
  for (const [name, v] of [
    ['width', width],
    ['height', height],
  ] as const) {
    if (!Number.isInteger(v) || v < 64 || v > 8192)
      throw new RangeError(`createPatternSource: expected integer between 64 and 8192 for ${name} but received ${v}`);
  }
  if (!Number.isInteger(quality) || quality < 1 || quality > 100)
    throw new RangeError(`createPatternSource: expected integer between 1 and 100 for quality but received ${quality}`);
  if (typeof id !== 'string' || id.length === 0)
    throw new TypeError(`createPatternSource: expected a non-empty string for id but received ${JSON.stringify(id)}`);

  const periodNs = BigInt(Math.round(1e9 / fps));
  const counters = { yielded: 0, late: 0 };

  async function* generate(clock: Clock, signal: AbortSignal): AsyncGenerator<SourceItem<CameraFrame>> {
    let ahead: Promise<Buffer> | null = encode(0, width, height, quality);
    try {
      await ahead; // the schedule starts once the first frame exists
      const startNs = clock.nowNs();
      for (let i = 0; i < frames && !signal.aborted; i++) {
        const data = await ahead!;
        ahead = null;
        const dueNs = startNs + BigInt(i) * periodNs;
        const captureNs = await waitUntilDue(clock, dueNs, signal);
        if (captureNs === null) return;
        if (captureNs - dueNs > periodNs) counters.late += 1;
        const captureWallMs = wallMsAt(clock, captureNs);
        counters.yielded += 1;
        yield { sourceId: id, captureNs, captureWallMs, payload: { encoding: 'jpeg', data, width, height } };
        // Once the frame is on its way (rendering is JS-thread work).
        if (i + 1 < frames) ahead = encode(i + 1, width, height, quality);
      }
    } finally {
      // Stopped early: the frame encoded ahead settles here, its result unused.
      await ahead?.catch(() => undefined);
    }
  }

  return {
    id,
    ...(frames === Infinity ? {} : { expectedItems: frames }),
    get counters(): PatternSourceCounters {
      return { ...counters };
    },
    frames: generate,
  };
}

/** The raw RGB pixels of frame `index` (pure, deterministic).
 * Rectangles are painted one row and copied down, at memcpy speed.
 * It must stay cheap: every camera of a rig shares the JS thread with the pipeline. */
function renderPattern(index: number, width: number, height: number): Buffer {
  const stride = width * 3;
  const px = Buffer.alloc(stride * height);
  const fill = (x0: number, y0: number, x1: number, y1: number, [r, g, b]: readonly [number, number, number]): void => {
    const xa = Math.max(0, x0);
    const xb = Math.min(width, x1);
    const ya = Math.max(0, y0);
    const yb = Math.min(height, y1);
    if (xa >= xb || ya >= yb) return;
    const first = ya * stride;
    for (let x = xa; x < xb; x++) {
      const o = first + x * 3;
      px[o] = r;
      px[o + 1] = g;
      px[o + 2] = b;
    }
    for (let y = ya + 1; y < yb; y++) px.copyWithin(y * stride + xa * 3, first + xa * 3, first + xb * 3);
  };
  const counterTop = height - Math.max(8, Math.floor(height / 8));
  const barWidth = width / BARS.length;
  BARS.forEach((colour, k) => fill(Math.round(k * barWidth), 0, Math.round((k + 1) * barWidth), counterTop, colour));
  // The box bounces between the edges: a triangle wave over the free width, one step per frame.
  const box = Math.max(8, Math.floor(height / 5));
  const travel = width - box;
  const step = Math.max(1, Math.floor(width / 64));
  const phase = (index * step) % (2 * travel);
  const x = phase <= travel ? phase : 2 * travel - phase;
  const y = Math.floor((counterTop - box) / 2);
  fill(x, y, x + box, y + box, [128, 128, 128]);
  fill(x + 2, y + 2, x + box - 2, y + box - 2, [255, 128, 0]);
  const cell = width / PATTERN_COUNTER_BITS;
  for (let bit = 0; bit < PATTERN_COUNTER_BITS; bit++) {
    const on = (index >>> (PATTERN_COUNTER_BITS - 1 - bit)) & 1;
    fill(Math.round(bit * cell), counterTop, Math.round((bit + 1) * cell), height, on ? [255, 255, 255] : [0, 0, 0]);
  }
  return px;
}

/** Reads the frame counter back from decoded RGB pixels of a pattern frame (for tests and checks). */
export function readPatternCounter(rgb: Uint8Array, width: number, height: number, channels = 3): number {
  const counterTop = height - Math.max(8, Math.floor(height / 8));
  const y = Math.floor((counterTop + height) / 2);
  const cell = width / PATTERN_COUNTER_BITS;
  let value = 0;
  for (let bit = 0; bit < PATTERN_COUNTER_BITS; bit++) {
    const x = Math.floor((bit + 0.5) * cell);
    const o = (y * width + x) * channels;
    const luma = (rgb[o] + rgb[o + 1] + rgb[o + 2]) / 3;
    value = (value << 1) | (luma > 128 ? 1 : 0);
  }
  return value;
}

export async function encodePatternFrame(index: number, width: number, height: number, quality = 80): Promise<Buffer> {
  return sharp(renderPattern(index, width, height), { raw: { width, height, channels: 3 } })
    .jpeg({ quality })
    .toBuffer();
}
