// Camera frame → encoder input tensor, with sharp (libvips) doing decode + resize in one native call
// and one tight loop doing normalization and layout (CHW for Gemma 3, 16×16 HWC patches for Gemma 4).
//
// Contracts (transformers.js vision_encoder inputs; models.md §5):
//   gemma3: resize to 896×896 (bilinear), ×1/255, (x−0.5)/0.5 → pixel_values f32 [1,3,896,896].
//   gemma4: aspect-preserving resize to multiples of 48 px within an image-token budget
//           (70/140/280/560/1120; tokens = (W/48)·(H/48)), bicubic, ×1/255, patchify 16×16 (HWC inside a
//           patch, patches row-major) → pixel_values f32 [1, budget·9, 768] zero-padded, and
//           pixel_position_ids i64 [1, budget·9, 2] = (col,row), −1 for padding.
// Each output tensor is freshly allocated: the encoder stage takes ownership (it transfers the buffers
// to its worker thread), so a pool here would be emptied by every frame anyway.
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

/** A decodable input for sharp plus how to read its channels afterwards. */
interface SourceImage {
  readonly input: Buffer | Uint16Array;
  readonly raw?: { width: number; height: number; channels: 1 | 3 };
  readonly width: number;
  readonly height: number;
  /** Channels are B,G,R in memory (swapped while normalizing: resizing does not care). */
  readonly bgr: boolean;
  readonly hasAlpha: boolean;
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
  if (width * height > maxPixels)
    throw frameError(frame.encoding, `${width}×${height} = ${width * height} pixels exceeds maxPixels ${maxPixels}`);
  return { input: buffer, width, height, bgr: false, hasAlpha: meta.hasAlpha === true };
}

/** Validates a raw frame and returns tightly packed pixels (rows copied only when stride has padding
 * or alpha has to go: sharp wants packed rows, and HF's convert('RGB') drops alpha). */
function describeRaw(frame: CameraFrame, maxPixels: number): SourceImage {
  const enc = frame.encoding as keyof typeof bytesPerPixel;
  const { width, height } = frame;
  if (width === undefined || height === undefined) throw frameError(enc, 'width and height are required for raw frames');
  if (!Number.isInteger(width) || !Number.isInteger(height) || width <= 0 || height <= 0)
    throw frameError(enc, `bad size ${width}×${height}`);
  if (width * height > maxPixels) throw frameError(enc, `${width}×${height} = ${width * height} pixels exceeds maxPixels ${maxPixels}`);
  const bpp = bytesPerPixel[enc];
  const rowBytes = width * bpp;
  const stride = frame.stride ?? rowBytes;
  if (!Number.isInteger(stride) || stride < rowBytes)
    throw frameError(enc, `stride ${stride} is smaller than width × ${bpp} = ${rowBytes}`);
  const need = stride * (height - 1) + rowBytes;
  const data = frame.data;
  if (!(data instanceof Uint8Array)) throw frameError(enc, 'data must be a Uint8Array');
  if (data.byteLength < need) throw frameError(enc, `${data.byteLength} bytes, need ${need} for ${width}×${height} stride ${stride}`);
  const bgr = enc === 'bgr8' || enc === 'bgra8';
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
    return { input: packed, raw: { width, height, channels: 3 }, width, height, bgr, hasAlpha: false };
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
    return {
      input: new Uint16Array(aligned.buffer, aligned.byteOffset, width * height),
      raw: { width, height, channels: 1 },
      width,
      height,
      bgr: false,
      hasAlpha: false,
    };
  }
  return {
    input: Buffer.from(packed.buffer, packed.byteOffset, packed.byteLength),
    raw: { width, height, channels },
    width,
    height,
    bgr,
    hasAlpha: false,
  };
}

function firstLine(err: unknown): string {
  return (err instanceof Error ? err.message : String(err)).split('\n')[0]!.trim();
}

interface ResizedPixels {
  readonly data: Buffer;
  readonly width: number;
  readonly height: number;
  readonly channels: number;
}

async function decodeResized(
  src: SourceImage,
  encoding: string,
  width: number,
  height: number,
  kernel: ResizeKernel,
  maxPixels: number,
): Promise<ResizedPixels> {
  let pipeline = sharp(src.input, {
    ...(src.raw ? { raw: src.raw } : {}),
    limitInputPixels: maxPixels,
    sequentialRead: true,
  });
  if (width !== src.width || height !== src.height) pipeline = pipeline.resize(width, height, { fit: 'fill', kernel });
  if (src.hasAlpha) pipeline = pipeline.removeAlpha();
  try {
    const { data, info } = await pipeline.raw().toBuffer({ resolveWithObject: true });
    if (info.width !== width || info.height !== height)
      throw new Error(`sharp returned ${info.width}×${info.height}, wanted ${width}×${height}`);
    if (data.length !== width * height * info.channels)
      throw new Error(`sharp returned ${data.length} bytes for ${width}×${height}×${info.channels}`);
    return { data, width, height, channels: info.channels };
  } catch (err) {
    throw frameError(encoding, `decode/resize failed (${firstLine(err)})`);
  }
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

/** Interleaved 8-bit pixels → planar CHW floats through `table`. */
export function toChw(
  pixels: ResizedPixels,
  bgr: boolean,
  table: Float32Array,
  out = new Float32Array(3 * pixels.width * pixels.height),
): Float32Array {
  const n = pixels.width * pixels.height;
  const ch = pixels.channels;
  const [oR, oG, oB] = channelOffsets(ch, bgr);
  const src = pixels.data;
  for (let i = 0, j = 0; i < n; i++, j += ch) {
    out[i] = table[src[j + oR]!]!;
    out[n + i] = table[src[j + oG]!]!;
    out[2 * n + i] = table[src[j + oB]!]!;
  }
  return out;
}

/** Interleaved 8-bit pixels → 16×16 HWC patches, row-major patch order, padded to `patchCapacity`. */
export function toGemma4Patches(
  pixels: ResizedPixels,
  bgr: boolean,
  table: Float32Array,
  patchCapacity: number,
): { values: Float32Array; positions: BigInt64Array } {
  const { width, height, channels: ch, data: src } = pixels;
  const cols = width / GEMMA4_PATCH;
  const rows = height / GEMMA4_PATCH;
  if (!Number.isInteger(cols) || !Number.isInteger(rows))
    throw new RangeError(`toGemma4Patches: ${width}×${height} is not a multiple of ${GEMMA4_PATCH}`);
  const nPatches = cols * rows;
  if (nPatches > patchCapacity) throw new RangeError(`toGemma4Patches: ${nPatches} patches exceed capacity ${patchCapacity}`);
  const values = new Float32Array(patchCapacity * GEMMA4_PATCH_DIM);
  const [oR, oG, oB] = channelOffsets(ch, bgr);
  for (let y = 0; y < height; y++) {
    const rowBase = (y >> 4) * cols;
    const inPatchRow = (y & 15) * GEMMA4_PATCH;
    let j = y * width * ch;
    for (let x = 0; x < width; x++, j += ch) {
      const d = ((rowBase + (x >> 4)) * 256 + inPatchRow + (x & 15)) * 3;
      values[d] = table[src[j + oR]!]!;
      values[d + 1] = table[src[j + oG]!]!;
      values[d + 2] = table[src[j + oB]!]!;
    }
  }
  // (col,row) as int64 written through an int32 view: low word = value, high word = sign.
  const positions = new BigInt64Array(patchCapacity * 2);
  const words = new Int32Array(positions.buffer);
  for (let p = 0; p < nPatches; p++) {
    words[4 * p] = p % cols;
    words[4 * p + 2] = Math.floor(p / cols);
  }
  words.fill(-1, 4 * nPatches);
  return { values, positions };
}

export interface PreprocessStage extends Stage<CameraFrame, PixelTensor> {
  readonly contract: EncoderContract;
}

export function createPreprocessStage(cfg: PreprocessConfig): PreprocessStage {
  if (cfg.contract !== 'gemma3' && cfg.contract !== 'gemma4')
    throw new TypeError(`preprocess: contract must be 'gemma3' or 'gemma4', got ${String(cfg.contract)}`);
  const maxPixels = cfg.maxPixels ?? DEFAULT_MAX_PIXELS;
  if (!Number.isInteger(maxPixels) || maxPixels <= 0)
    throw new RangeError(`preprocess: maxPixels must be a positive integer, got ${maxPixels}`);
  const kernel = cfg.kernel ?? (cfg.contract === 'gemma3' ? 'linear' : 'cubic');
  if (!KERNELS.includes(kernel)) throw new RangeError(`preprocess: kernel must be one of ${KERNELS.join(', ')}, got ${kernel}`);
  const imageSize = cfg.imageSize ?? 896;
  if (!Number.isInteger(imageSize) || imageSize <= 0 || imageSize > 8192)
    throw new RangeError(`preprocess: imageSize must be an integer in 1..8192, got ${imageSize}`);
  const sizing = cfg.gemma4Sizing ?? 'hf';
  if (sizing !== 'hf' && sizing !== 'llama.cpp')
    throw new RangeError(`preprocess: gemma4Sizing must be 'hf' or 'llama.cpp', got ${String(sizing)}`);
  if (cfg.imageTokens !== undefined) clampImageTokens(cfg.imageTokens);
  const gemma3Table = lut(0.5, 0.5);
  const unitTable = lut(1, 0);

  const describe = (frame: CameraFrame): Promise<SourceImage> | SourceImage => {
    if (frame === null || typeof frame !== 'object') throw new TypeError('preprocess: frame must be a CameraFrame object');
    if (!ENCODINGS.includes(frame.encoding))
      throw frameError(String(frame.encoding), `unsupported encoding (supported: ${ENCODINGS.join(', ')})`);
    return frame.encoding === 'jpeg' || frame.encoding === 'png' ? describeEncoded(frame, maxPixels) : describeRaw(frame, maxPixels);
  };

  return {
    name: 'preprocess',
    contract: cfg.contract,
    async process(frame: CameraFrame, ctx: StageContext): Promise<PixelTensor> {
      const src = await describe(frame);
      if (cfg.contract === 'gemma3') {
        const pixels = await decodeResized(src, frame.encoding, imageSize, imageSize, kernel, maxPixels);
        return {
          contract: 'gemma3',
          pixelValues: toChw(pixels, src.bgr, gemma3Table),
          pixelDims: [1, 3, imageSize, imageSize],
          imageTokens: Math.floor(imageSize / 56) ** 2,
        };
      }
      const budget = clampImageTokens(cfg.imageTokens ?? ctx.knobs.imageTokens);
      const size = gemma4TargetSize(src.width, src.height, budget, sizing);
      const pixels = await decodeResized(src, frame.encoding, size.width, size.height, kernel, maxPixels);
      // llama.cpp sizing can exceed the budget's patch capacity only through its 70-token floor.
      const capacity = Math.max(budget, size.tokens) * GEMMA4_POOL * GEMMA4_POOL;
      const { values, positions } = toGemma4Patches(pixels, src.bgr, unitTable, capacity);
      return {
        contract: 'gemma4',
        pixelValues: values,
        pixelDims: [1, capacity, GEMMA4_PATCH_DIM],
        positionIds: positions,
        positionDims: [1, capacity, 2],
        imageTokens: size.tokens,
      };
    },
  };
}
