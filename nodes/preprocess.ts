// Camera frame → encoder input tensor: sharp (libvips) decodes and resizes in one native call, one
// tight loop normalizes, orients and lays out the pixels (CHW for Gemma 3, 16×16 HWC patches for Gemma 4).
//
// Contracts (transformers.js vision_encoder inputs; models.md §5):
//   gemma3: resize to 896×896 (bilinear), ×1/255, (x−0.5)/0.5 → pixel_values f32 [1,3,896,896].
//   gemma4: aspect-preserving resize to multiples of 48 px within an image-token budget
//           (70/140/280/560/1120; tokens = (W/48)·(H/48)), bicubic, ×1/255, patchify 16×16 (HWC inside a
//           patch, patches row-major) → pixel_values f32 [1, budget·9, 768] zero-padded, and
//           pixel_position_ids i64 [1, budget·9, 2] = (col,row), −1 for padding.
// Speed (one libvips thread):
//   - sharp gets the target size, so a JPEG much larger than the target is decoded at 1/2, 1/4 or 1/8
//     scale by libjpeg's DCT scaling (shrink-on-load; libvips uses it from a 3× shrink on).
//   - EXIF orientation is applied by the layout loop (an index mapping), not by libvips: libvips would
//     rotate the full-size image before resizing and give up shrink-on-load.
//   - A raw frame that already has the target size skips sharp entirely.
//   - pixel_values comes from a small pool: the encoder hands the array back through
//     PixelTensor.recycle when it is done, so steady state allocates nothing (and a 7.7 MB array per
//     frame no longer feeds the GC). Values stay f32 here rather than going to the encoder as uint8:
//     both encoders' contracts take f32, and normalizing elsewhere would move, not remove, the pass.
import sharp, { type Metadata } from 'sharp';
import type { CameraFrame, EncoderContract, FrameEncoding, PixelTensor } from './payloads.ts';
import type { Stage, StageContext } from '../pipeline/types.ts';

/** Gemma 4 image-token budgets (HF `max_soft_tokens`, llama.cpp --image-{min,max}-tokens range). */
export const GEMMA4_TOKEN_BUDGETS = [70, 140, 280, 560, 1120] as const;
export type Gemma4TokenBudget = (typeof GEMMA4_TOKEN_BUDGETS)[number];
const GEMMA4_PATCH = 16;
const GEMMA4_POOL = 3;
const GEMMA4_SIDE = GEMMA4_PATCH * GEMMA4_POOL; // 48 px per soft token side
const GEMMA4_PATCH_DIM = GEMMA4_PATCH * GEMMA4_PATCH * 3;

export type ResizeKernel = 'nearest' | 'linear' | 'cubic' | 'mitchell' | 'lanczos2' | 'lanczos3';
/** 'hf': HF Gemma4ImageProcessor (scale up or down to fill the budget, floor to 48).
 *  'llama.cpp': mtmd dyn_size (round to 48; shrink only above the budget; grow only below 70 tokens). */
export type Gemma4Sizing = 'hf' | 'llama.cpp';

export interface PreprocessConfig {
  readonly contract: EncoderContract;
  /** Frames with more pixels are refused before decoding (default 4096×4096). */
  readonly maxPixels?: number;
  /** Resize kernel (default: 'linear' for gemma3 as HF's bilinear, 'cubic' for gemma4 as HF's bicubic). */
  readonly kernel?: ResizeKernel;
  /** gemma3 square input size (default 896). */
  readonly imageSize?: number;
  /** gemma4 sizing rule (default 'hf', the processor the ONNX encoders were exported with). */
  readonly gemma4Sizing?: Gemma4Sizing;
  /** gemma4: a fixed token budget; when absent the budget is ctx.knobs.imageTokens (the ladder's knob). */
  readonly imageTokens?: number;
  /** libvips threads per image (process-wide; default VIPS_CONCURRENCY, else 1). */
  readonly threads?: number;
}

const DEFAULT_MAX_PIXELS = 4096 * 4096;
const KERNELS: readonly ResizeKernel[] = ['nearest', 'linear', 'cubic', 'mitchell', 'lanczos2', 'lanczos3'];
const ENCODINGS: readonly FrameEncoding[] = ['jpeg', 'png', 'rgb8', 'bgr8', 'rgba8', 'bgra8', 'mono8', 'mono16'];

/** The allowed budget for a requested token count: the largest allowed value ≤ n (at least 70). */
export function clampImageTokens(n: number): Gemma4TokenBudget {
  if (!Number.isFinite(n)) throw new RangeError(`image token budget must be a finite number, got ${n}`);
  let best: Gemma4TokenBudget = GEMMA4_TOKEN_BUDGETS[0];
  for (const b of GEMMA4_TOKEN_BUDGETS) if (b <= n) best = b;
  return best;
}

export interface Gemma4Size {
  readonly width: number;
  readonly height: number;
  /** Patch grid. */
  readonly cols: number;
  readonly rows: number;
  /** Soft tokens = (cols/3)·(rows/3). */
  readonly tokens: number;
}

/** Target size of a width×height image for a Gemma 4 token budget. */
export function gemma4TargetSize(width: number, height: number, budget: number, sizing: Gemma4Sizing = 'hf'): Gemma4Size {
  if (!(Number.isInteger(width) && width > 0 && Number.isInteger(height) && height > 0)) {
    throw new RangeError(`gemma4TargetSize: bad image size ${width}×${height}`);
  }
  const side = GEMMA4_SIDE;
  const maxPixels = budget * side * side;
  let tw: number;
  let th: number;
  if (sizing === 'hf') {
    // transformers Gemma4ImageProcessor.get_aspect_ratio_preserving_size (max_patches = budget·9).
    const factor = Math.sqrt(maxPixels / (width * height));
    th = Math.floor((factor * height) / side) * side;
    tw = Math.floor((factor * width) / side) * side;
    const maxSide = budget * side; // (max_patches // 9) · 48
    if (th === 0 && tw === 0) throw new RangeError(`gemma4TargetSize: ${width}×${height} resizes to 0×0`);
    if (th === 0) {
      th = side;
      tw = Math.min(Math.floor(width / height) * side, maxSide);
    } else if (tw === 0) {
      tw = side;
      th = Math.min(Math.floor(height / width) * side, maxSide);
    }
  } else {
    // llama.cpp mtmd img_tool::calc_size_preserved_ratio with align 48, min 70 tokens, max = budget.
    const minPixels = GEMMA4_TOKEN_BUDGETS[0] * side * side;
    const fround = Math.fround;
    tw = Math.max(side, Math.round(fround(width / side)) * side);
    th = Math.max(side, Math.round(fround(height / side)) * side);
    if (tw * th > maxPixels) {
      const beta = fround(Math.sqrt(fround((height * width) / maxPixels)));
      th = Math.max(side, Math.floor(fround(fround(height / beta) / side)) * side);
      tw = Math.max(side, Math.floor(fround(fround(width / beta) / side)) * side);
    } else if (tw * th < minPixels) {
      const beta = fround(Math.sqrt(fround(minPixels / (height * width))));
      th = Math.ceil(fround(fround(height * beta) / side)) * side;
      tw = Math.ceil(fround(fround(width * beta) / side)) * side;
    }
  }
  const cols = tw / GEMMA4_PATCH;
  const rows = th / GEMMA4_PATCH;
  return { width: tw, height: th, cols, rows, tokens: (cols / GEMMA4_POOL) * (rows / GEMMA4_POOL) };
}

/** A frame as sharp can read it, with its stored size and EXIF orientation. */
interface SourceImage {
  readonly input: Uint8Array | Uint16Array;
  readonly raw?: { width: number; height: number; channels: 1 | 3 };
  /** Stored size (before orientation). */
  readonly width: number;
  readonly height: number;
  /** Bytes per row of `input` for raw frames (may be padded). */
  readonly stride?: number;
  /** EXIF orientation 1…8 (1: as stored). */
  readonly orientation: number;
  /** Channels are B,G,R in memory (swapped by the layout loop: resizing does not care). */
  readonly bgr: boolean;
  readonly hasAlpha: boolean;
  /** Raw 8-bit pixels the layout loop can read as they are, when no resize is needed. */
  readonly direct: boolean;
}

const bytesPerPixel: Record<Exclude<FrameEncoding, 'jpeg' | 'png'>, number> = {
  rgb8: 3,
  bgr8: 3,
  rgba8: 4,
  bgra8: 4,
  mono8: 1,
  mono16: 2,
};

function frameError(encoding: string, problem: string): Error {
  return new Error(`preprocess: ${encoding} frame: ${problem}`);
}

/** Orientations 5–8 swap width and height. */
const transposes = (orientation: number): boolean => orientation >= 5;

async function describeEncoded(frame: CameraFrame, maxPixels: number): Promise<SourceImage> {
  const data = frame.data;
  if (!(data instanceof Uint8Array) || data.byteLength === 0) throw frameError(frame.encoding, 'empty data');
  const buffer = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  let meta: Metadata;
  try {
    meta = await sharp(buffer).metadata();
  } catch (err) {
    throw frameError(frame.encoding, `cannot read header (${firstLine(err)})`);
  }
  if (meta.format !== frame.encoding) throw frameError(frame.encoding, `data is ${meta.format ?? 'unknown'}, not ${frame.encoding}`);
  const width = meta.width ?? 0;
  const height = meta.height ?? 0;
  if (width <= 0 || height <= 0) throw frameError(frame.encoding, `zero size ${width}×${height}`);
  if (width * height > maxPixels) throw frameError(frame.encoding, `${width}×${height} = ${width * height} pixels exceeds maxPixels ${maxPixels}`);
  const o = meta.orientation ?? 1;
  const orientation = Number.isInteger(o) && o >= 1 && o <= 8 ? o : 1;
  return { input: buffer, width, height, orientation, bgr: false, hasAlpha: meta.hasAlpha === true, direct: false };
}

/** Validates a raw frame. Rows are repacked only where sharp has to read them (it wants packed rows,
 * and HF's convert('RGB') drops alpha); a frame read directly keeps its stride. */
function describeRaw(frame: CameraFrame, maxPixels: number, canReadDirect: (width: number, height: number) => boolean): SourceImage {
  const enc = frame.encoding as keyof typeof bytesPerPixel;
  const { width, height } = frame;
  if (width === undefined || height === undefined) throw frameError(enc, 'width and height are required for raw frames');
  if (!Number.isInteger(width) || !Number.isInteger(height) || width <= 0 || height <= 0) throw frameError(enc, `bad size ${width}×${height}`);
  if (width * height > maxPixels) throw frameError(enc, `${width}×${height} = ${width * height} pixels exceeds maxPixels ${maxPixels}`);
  const bpp = bytesPerPixel[enc];
  const rowBytes = width * bpp;
  const stride = frame.stride ?? rowBytes;
  if (!Number.isInteger(stride) || stride < rowBytes) throw frameError(enc, `stride ${stride} is smaller than width × ${bpp} = ${rowBytes}`);
  const need = stride * (height - 1) + rowBytes;
  const data = frame.data;
  if (!(data instanceof Uint8Array)) throw frameError(enc, 'data must be a Uint8Array');
  if (data.byteLength < need) throw frameError(enc, `${data.byteLength} bytes, need ${need} for ${width}×${height} stride ${stride}`);
  const bgr = enc === 'bgr8' || enc === 'bgra8';
  const common = { width, height, orientation: 1, bgr, hasAlpha: false };
  if (enc !== 'mono16' && canReadDirect(width, height)) return { ...common, input: data, stride, direct: true };
  if (enc === 'rgba8' || enc === 'bgra8') {
    const packed = Buffer.allocUnsafe(width * height * 3);
    for (let y = 0, o = 0; y < height; y++) {
      let s = y * stride;
      for (let x = 0; x < width; x++, s += 4, o += 3) {
        packed[o] = data[s]!;
        packed[o + 1] = data[s + 1]!;
        packed[o + 2] = data[s + 2]!;
      }
    }
    return { ...common, input: packed, raw: { width, height, channels: 3 }, direct: false };
  }
  const channels = enc === 'mono8' || enc === 'mono16' ? 1 : 3;
  let packed: Uint8Array = data;
  if (stride !== rowBytes) {
    packed = new Uint8Array(rowBytes * height);
    for (let y = 0; y < height; y++) packed.set(data.subarray(y * stride, y * stride + rowBytes), y * rowBytes);
  } else if (data.byteLength !== rowBytes * height) {
    packed = data.subarray(0, rowBytes * height);
  }
  if (enc === 'mono16') {
    // Host (little-endian) byte order; sharp reads a Uint16Array as 16-bit samples.
    const aligned = packed.byteOffset % 2 === 0 ? packed : packed.slice();
    return { ...common, input: new Uint16Array(aligned.buffer, aligned.byteOffset, width * height), raw: { width, height, channels: 1 }, direct: false };
  }
  return { ...common, input: packed, raw: { width, height, channels }, direct: false };
}

function firstLine(err: unknown): string {
  return (err instanceof Error ? err.message : String(err)).split('\n')[0]!.trim();
}

/** Interleaved 8-bit pixels read through an orientation: the display pixel (x, y) is the byte at
 * `base + y·dy + x·dx` (plus the channel offset). dx and dy may be negative. */
export interface PixelView {
  readonly data: Uint8Array;
  readonly channels: number;
  readonly bgr: boolean;
  readonly base: number;
  readonly dx: number;
  readonly dy: number;
  /** Display size (after orientation). */
  readonly width: number;
  readonly height: number;
}

/** The view that shows `data` (stored width×height, `stride` bytes per row) in EXIF `orientation`. */
export function orientedView(data: Uint8Array, width: number, height: number, channels: number, stride: number, orientation: number, bgr = false): PixelView {
  const right = (width - 1) * channels;
  const bottom = (height - 1) * stride;
  // [base, dx, dy] per orientation: the stored pixel shown at display (x, y).
  const maps: Record<number, [number, number, number]> = {
    1: [0, channels, stride], // as stored
    2: [right, -channels, stride], // mirrored left↔right
    3: [bottom + right, -channels, -stride], // rotated 180°
    4: [bottom, channels, -stride], // mirrored top↔bottom
    5: [0, stride, channels], // transposed
    6: [bottom, -stride, channels], // rotated 90° clockwise
    7: [bottom + right, -stride, -channels], // transversed
    8: [right, stride, -channels], // rotated 90° counter-clockwise
  };
  const m = maps[orientation];
  if (!m) throw new RangeError(`orientedView: orientation must be 1…8, got ${orientation}`);
  const [w, h] = transposes(orientation) ? [height, width] : [width, height];
  return { data, channels, bgr, base: m[0], dx: m[1], dy: m[2], width: w, height: h };
}

/** PIL's filters (ImagingResample): triangle for bilinear, Catmull-Rom (a = −0.5) for bicubic. */
const FILTERS = {
  linear: { support: 1, weight: (x: number): number => (x < 1 ? 1 - x : 0) },
  cubic: { support: 2, weight: (x: number): number => (x < 1 ? (1.5 * x - 2.5) * x * x + 1 : x < 2 ? ((-0.5 * x + 2.5) * x - 4) * x + 2 : 0) },
} as const;

/** Enlarges an image vertically (inRows → outRows, outRows ≥ inRows) as PIL's resample does its
 * vertical pass: centre-aligned taps, clipped at the edges and renormalized, rounded to 8 bits. `rowBytes`
 * is the width × channels of a row. */
export function enlargeRows<T extends Uint8Array>(src: Uint8Array, rowBytes: number, inRows: number, outRows: number, kernel: keyof typeof FILTERS, out: T): T {
  if (outRows < inRows) throw new RangeError(`enlargeRows: ${inRows} → ${outRows} rows is not an enlargement`);
  if (src.length < rowBytes * inRows || out.length < rowBytes * outRows) throw new RangeError('enlargeRows: buffer too small');
  const { support, weight } = FILTERS[kernel];
  const scale = inRows / outRows;
  const taps = new Float64Array(2 * support + 1);
  for (let y = 0; y < outRows; y++) {
    const centre = (y + 0.5) * scale;
    const first = Math.max(0, Math.trunc(centre - support + 0.5));
    const last = Math.min(inRows, Math.trunc(centre + support + 0.5));
    let sum = 0;
    for (let i = first; i < last; i++) sum += taps[i - first] = weight(Math.abs(i - centre + 0.5));
    const o = y * rowBytes;
    if (kernel === 'linear' && last - first === 2) {
      // The common bilinear case: two non-negative weights, no clamping.
      const a = first * rowBytes;
      const b = a + rowBytes;
      const wa = taps[0]! / sum;
      const wb = taps[1]! / sum;
      for (let j = 0; j < rowBytes; j++) out[o + j] = (wa * src[a + j]! + wb * src[b + j]! + 0.5) | 0;
      continue;
    }
    for (let j = 0; j < rowBytes; j++) {
      let v = 0;
      for (let i = first, s = first * rowBytes + j; i < last; i++, s += rowBytes) v += taps[i - first]! * src[s]!;
      v = v / sum + 0.5;
      out[o + j] = v <= 0 ? 0 : v >= 255 ? 255 : v | 0;
    }
  }
  return out;
}

/** Byte → value tables: the normalization of every pixel is one table read. */
function lut(scale: number, offset: number): Float32Array {
  const t = new Float32Array(256);
  for (let v = 0; v < 256; v++) t[v] = (v / 255 - offset) / scale;
  return t;
}

/** Source channel offsets of R, G, B in an interleaved pixel. */
function channelOffsets(channels: number, bgr: boolean): [number, number, number] {
  if (channels < 3) return [0, 0, 0];
  return bgr ? [2, 1, 0] : [0, 1, 2];
}

/** Pixels → planar CHW floats through `table`, in one pass. */
export function toChw<T extends Float32Array>(view: PixelView, table: Float32Array, out: T): T {
  const { width, height, data: src, base, dx, dy } = view;
  const n = width * height;
  if (out.length < 3 * n) throw new RangeError(`toChw: output has ${out.length} values, need ${3 * n}`);
  const [oR, oG, oB] = channelOffsets(view.channels, view.bgr);
  for (let y = 0, i = 0; y < height; y++) {
    let j = base + y * dy;
    for (let x = 0; x < width; x++, i++, j += dx) {
      out[i] = table[src[j + oR]!]!;
      out[n + i] = table[src[j + oG]!]!;
      out[2 * n + i] = table[src[j + oB]!]!;
    }
  }
  return out;
}

/** Pixels → 16×16 HWC patches in row-major patch order, in one pass; the rest of `values` (the
 * padding up to its capacity) is zeroed. Returns the number of patches written. */
export function toGemma4Patches(view: PixelView, table: Float32Array, values: Float32Array): number {
  const { width, height, data: src, base, dx, dy } = view;
  const cols = width / GEMMA4_PATCH;
  const rows = height / GEMMA4_PATCH;
  if (!Number.isInteger(cols) || !Number.isInteger(rows)) throw new RangeError(`toGemma4Patches: ${width}×${height} is not a multiple of ${GEMMA4_PATCH}`);
  const nPatches = cols * rows;
  if (nPatches * GEMMA4_PATCH_DIM > values.length) throw new RangeError(`toGemma4Patches: ${nPatches} patches exceed the capacity ${values.length / GEMMA4_PATCH_DIM}`);
  const [oR, oG, oB] = channelOffsets(view.channels, view.bgr);
  const patchDx = GEMMA4_PATCH * dx;
  for (let y = 0; y < height; y++) {
    // Each display row is `cols` runs of 16 pixels, one run per patch of this patch row.
    let d0 = ((y >> 4) * cols * GEMMA4_PATCH * GEMMA4_PATCH + (y & 15) * GEMMA4_PATCH) * 3;
    let j0 = base + y * dy;
    for (let pc = 0; pc < cols; pc++, d0 += GEMMA4_PATCH_DIM, j0 += patchDx) {
      for (let k = 0, d = d0, j = j0; k < GEMMA4_PATCH; k++, d += 3, j += dx) {
        values[d] = table[src[j + oR]!]!;
        values[d + 1] = table[src[j + oG]!]!;
        values[d + 2] = table[src[j + oB]!]!;
      }
    }
  }
  values.fill(0, nPatches * GEMMA4_PATCH_DIM);
  return nPatches;
}

/** (col,row) per patch as int64, −1 for padding. */
function gemma4Positions(cols: number, nPatches: number, capacity: number): BigInt64Array {
  const positions = new BigInt64Array(capacity * 2);
  // Written through an int32 view: low word = value, high word = sign.
  const words = new Int32Array(positions.buffer);
  for (let p = 0; p < nPatches; p++) {
    words[4 * p] = p % cols;
    words[4 * p + 2] = Math.floor(p / cols);
  }
  words.fill(-1, 4 * nPatches);
  return positions;
}

/** pixel_values arrays for reuse: the arrays of the size in use now, at most `keep` of them. A size
 * change (the ladder's image-token knob) lets go of the old ones. */
export class PixelPool {
  readonly #keep: number;
  #length = 0;
  #free: Float32Array[] = [];
  #allocated = 0;

  constructor(keep = 2) {
    this.#keep = keep;
  }

  /** An array of `length` values with arbitrary contents. */
  take(length: number): Float32Array {
    if (length !== this.#length) {
      this.#length = length;
      this.#free = [];
    }
    const reused = this.#free.pop();
    if (reused) return reused;
    this.#allocated++;
    return new Float32Array(length);
  }

  /** Takes an array back (ignored when detached, of another size, already here, or the pool is full). */
  give(array: Float32Array): void {
    if (!(array instanceof Float32Array) || array.length !== this.#length || array.buffer.byteLength === 0) return;
    if (this.#free.length >= this.#keep || this.#free.some((a) => a.buffer === array.buffer)) return;
    this.#free.push(array);
  }

  /** Arrays allocated so far (the rest of the takes were reuses). */
  get allocated(): number {
    return this.#allocated;
  }
}

/** libvips threads for every sharp call in this process (sharp.concurrency is process-wide). The
 * operation cache is turned off: frames never repeat, and cached decodes would only hold memory. */
export function configureLibvips(threads: number): void {
  if (!Number.isInteger(threads) || threads < 1 || threads > 1024) throw new RangeError(`preprocess: threads must be an integer in 1..1024, got ${threads}`);
  sharp.concurrency(threads);
  sharp.cache(false);
}

/** libvips threads when the config does not say: VIPS_CONCURRENCY (libvips's own variable, which sharp
 * otherwise overrides with 1 on glibc), else 1, leaving the other cores to the encoder and decoder. */
export function defaultLibvipsThreads(env: NodeJS.ProcessEnv = process.env): number {
  const text = env.VIPS_CONCURRENCY;
  if (text === undefined || text === '') return 1;
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`VIPS_CONCURRENCY must be a positive integer, got '${text}'`);
  return n;
}

export interface PreprocessStage extends Stage<CameraFrame, PixelTensor> {
  readonly contract: EncoderContract;
  /** The libvips threads this stage set. */
  readonly threads: number;
  /** pixel_values arrays allocated so far (steady state: 2, when the encoder recycles them). */
  allocatedArrays(): number;
}

export function createPreprocessStage(cfg: PreprocessConfig): PreprocessStage {
  if (cfg.contract !== 'gemma3' && cfg.contract !== 'gemma4') throw new TypeError(`preprocess: contract must be 'gemma3' or 'gemma4', got ${String(cfg.contract)}`);
  const maxPixels = cfg.maxPixels ?? DEFAULT_MAX_PIXELS;
  if (!Number.isInteger(maxPixels) || maxPixels <= 0) throw new RangeError(`preprocess: maxPixels must be a positive integer, got ${maxPixels}`);
  const kernel = cfg.kernel ?? (cfg.contract === 'gemma3' ? 'linear' : 'cubic');
  if (!KERNELS.includes(kernel)) throw new RangeError(`preprocess: kernel must be one of ${KERNELS.join(', ')}, got ${kernel}`);
  const imageSize = cfg.imageSize ?? 896;
  if (!Number.isInteger(imageSize) || imageSize <= 0 || imageSize > 8192) throw new RangeError(`preprocess: imageSize must be an integer in 1..8192, got ${imageSize}`);
  const sizing = cfg.gemma4Sizing ?? 'hf';
  if (sizing !== 'hf' && sizing !== 'llama.cpp') throw new RangeError(`preprocess: gemma4Sizing must be 'hf' or 'llama.cpp', got ${String(sizing)}`);
  if (cfg.imageTokens !== undefined) clampImageTokens(cfg.imageTokens);
  const threads = cfg.threads ?? defaultLibvipsThreads();
  configureLibvips(threads);
  const gemma3Table = lut(0.5, 0.5);
  const unitTable = lut(1, 0);
  const pool = new PixelPool();
  let rows = new Uint8Array(0);
  const rowBuffer = (length: number): Uint8Array => (rows.length === length ? rows : (rows = new Uint8Array(length)));
  const recycle = (values: Float32Array): void => pool.give(values);

  /** Display-oriented target size for a stored width×height. */
  const targetOf = (width: number, height: number, orientation: number, ctx: StageContext): { width: number; height: number; budget: number } => {
    if (cfg.contract === 'gemma3') return { width: imageSize, height: imageSize, budget: 0 };
    const [w, h] = transposes(orientation) ? [height, width] : [width, height];
    const budget = clampImageTokens(cfg.imageTokens ?? ctx.knobs.imageTokens);
    const size = gemma4TargetSize(w, h, budget, sizing);
    return { width: size.width, height: size.height, budget };
  };

  const describe = (frame: CameraFrame, ctx: StageContext): Promise<SourceImage> | SourceImage => {
    if (frame === null || typeof frame !== 'object') throw new TypeError('preprocess: frame must be a CameraFrame object');
    if (!ENCODINGS.includes(frame.encoding)) throw frameError(String(frame.encoding), `unsupported encoding (supported: ${ENCODINGS.join(', ')})`);
    if (frame.encoding === 'jpeg' || frame.encoding === 'png') return describeEncoded(frame, maxPixels);
    return describeRaw(frame, maxPixels, (w, h) => {
      const t = targetOf(w, h, 1, ctx);
      return t.width === w && t.height === h;
    });
  };

  /** Decodes and resizes in the stored orientation (target sides swapped for orientations 5–8). */
  const pixelsOf = async (src: SourceImage, encoding: string, target: { width: number; height: number }): Promise<PixelView> => {
    if (src.direct) {
      const channels = bytesPerPixel[encoding as keyof typeof bytesPerPixel];
      return orientedView(src.input as Uint8Array, src.width, src.height, channels, src.stride!, 1, src.bgr);
    }
    const [width, height] = transposes(src.orientation) ? [target.height, target.width] : [target.width, target.height];
    // libvips enlarges through its affine path, 10+ ms for 720 → 896 rows; rows are enlarged below instead.
    const rowsHere = height > src.height && (kernel === 'linear' || kernel === 'cubic');
    const vipsHeight = rowsHere ? src.height : height;
    let pipeline = sharp(src.input, { ...(src.raw ? { raw: src.raw } : {}), limitInputPixels: maxPixels, sequentialRead: true });
    if (width !== src.width || vipsHeight !== src.height) pipeline = pipeline.resize(width, vipsHeight, { fit: 'fill', kernel, fastShrinkOnLoad: true });
    if (src.hasAlpha) pipeline = pipeline.removeAlpha();
    let data: Uint8Array;
    let channels: number;
    try {
      const out = await pipeline.raw().toBuffer({ resolveWithObject: true });
      ({ data, info: { channels } } = out);
      if (out.info.width !== width || out.info.height !== vipsHeight) throw new Error(`sharp returned ${out.info.width}×${out.info.height}, wanted ${width}×${vipsHeight}`);
      if (data.length !== width * vipsHeight * channels) throw new Error(`sharp returned ${data.length} bytes for ${width}×${vipsHeight}×${channels}`);
    } catch (err) {
      throw frameError(encoding, `decode/resize failed (${firstLine(err)})`);
    }
    if (rowsHere) data = enlargeRows(data, width * channels, vipsHeight, height, kernel as 'linear' | 'cubic', rowBuffer(width * channels * height));
    return orientedView(data, width, height, channels, width * channels, src.orientation, src.bgr);
  };

  return {
    name: 'preprocess',
    contract: cfg.contract,
    threads,
    allocatedArrays: () => pool.allocated,
    async process(frame: CameraFrame, ctx: StageContext): Promise<PixelTensor> {
      const src = await describe(frame, ctx);
      const target = targetOf(src.width, src.height, src.orientation, ctx);
      const view = await pixelsOf(src, frame.encoding, target);
      if (cfg.contract === 'gemma3') {
        return {
          contract: 'gemma3',
          pixelValues: toChw(view, gemma3Table, pool.take(3 * imageSize * imageSize)),
          pixelDims: [1, 3, imageSize, imageSize],
          imageTokens: Math.floor(imageSize / 56) ** 2,
          recycle,
        };
      }
      const cols = view.width / GEMMA4_PATCH;
      const rows = view.height / GEMMA4_PATCH;
      const tokens = (cols / GEMMA4_POOL) * (rows / GEMMA4_POOL);
      // llama.cpp sizing can exceed the budget's patch capacity only through its 70-token floor.
      const capacity = Math.max(target.budget, tokens) * GEMMA4_POOL * GEMMA4_POOL;
      const values = pool.take(capacity * GEMMA4_PATCH_DIM);
      const nPatches = toGemma4Patches(view, unitTable, values);
      return {
        contract: 'gemma4',
        pixelValues: values,
        pixelDims: [1, capacity, GEMMA4_PATCH_DIM],
        positionIds: gemma4Positions(cols, nPatches, capacity),
        positionDims: [1, capacity, 2],
        imageTokens: tokens,
        recycle,
      };
    },
  };
}
