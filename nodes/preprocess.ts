// Preprocess stage: a camera frame becomes the encoder's input tensor.
// sharp (libvips) decodes and resizes in one native call. native/pixels.ts then normalizes, orients and lays out the pixels.
// Contracts and speed choices: nodes/README.md#preprocess
import sharp, { type Metadata } from 'sharp';
import type { CameraFrame, EncoderContract, FrameEncoding, PixelAllocator, PixelTensor } from './payloads.ts';
import type { Stage, StageContext } from '../pipeline/types.ts';
import { layoutPixels } from '../native/pixels.ts';

/** Gemma 4 image-token budgets (HF `max_soft_tokens`, llama.cpp --image-{min,max}-tokens range). */
export const GEMMA4_TOKEN_BUDGETS = [70, 140, 280, 560, 1120] as const;
export type Gemma4TokenBudget = (typeof GEMMA4_TOKEN_BUDGETS)[number];
const GEMMA4_PATCH = 16;
const GEMMA4_POOL = 3;
const GEMMA4_SIDE = GEMMA4_PATCH * GEMMA4_POOL; // 48 px per soft token side
const GEMMA4_PATCH_DIM = GEMMA4_PATCH * GEMMA4_PATCH * 3;

export type ResizeKernel = 'nearest' | 'linear' | 'cubic' | 'mitchell' | 'lanczos2' | 'lanczos3';
/** 'hf': HF Gemma4ImageProcessor, which scales up or down to fill the budget and floors to 48.
 *  'llama.cpp': mtmd dyn_size, which rounds to 48, shrinks only above the budget and grows only below 70 tokens. */
export type Gemma4Sizing = 'hf' | 'llama.cpp';

export interface PreprocessConfig {
  readonly contract: EncoderContract;
  /** Frames with more pixels are refused before decoding (the config's preprocess.maxPixels). */
  readonly maxPixels: number;
  /** Resize kernel (default: 'linear' for gemma3 as HF's bilinear, 'cubic' for gemma4 as HF's bicubic). */
  readonly kernel?: ResizeKernel;
  /** gemma3 square input size (default 896, the processor's). */
  readonly imageSize?: number;
  /** gemma4 sizing rule (default 'hf', the processor the ONNX encoders were exported with). */
  readonly gemma4Sizing?: Gemma4Sizing;
  /** gemma4: a fixed token budget; when absent the budget is ctx.knobs.imageTokens (the ladder's knob). */
  readonly imageTokens?: number;
  /** libvips threads per image, process-wide (the config's preprocess.threads). */
  readonly threads: number;
  /** Where pixel_values arrays come from: the encoder's, pinned host memory on CUDA.
   * An ordinary Float32Array where it gives undefined or is absent. */
  readonly allocate?: PixelAllocator;
  /** JPEG frames go to the encoder undecoded (PixelTensor.jpeg), for an encoder that decodes them on its GPU (decodesJpeg).
   * This stage then only reads their header and plans the tensor.
   * Frames the GPU path does not take stay here: other encodings, progressive, 12-bit or CMYK JPEGs,
   * and kernels other than linear and cubic. */
  readonly jpegToEncoder?: boolean;
}

const GEMMA3_IMAGE_SIZE = 896;
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

// ---------------------------------------------------------------------------------------------
// A JPEG frame's header, read in JavaScript for both paths (describeEncoded).
// It gives the stored size, the EXIF orientation and whether nvJPEG's path takes the frame.
// sharp's metadata() reads the same on the libuv pool, and was nearly all of this stage's time.
// This walks the marker segments up to the first scan instead (nodes/README.md#measurements).
// Anything it does not read plainly gives undefined, and sharp decides: a truncated header, an unusual EXIF, a second frame.

export interface JpegHeader {
  /** Stored size (the frame header's, before the EXIF orientation). */
  readonly width: number;
  readonly height: number;
  readonly components: number;
  /** Bits per sample (8; 12 for 12-bit JPEGs). */
  readonly precision: number;
  /** SOF0 or SOF1: sequential and Huffman-coded (not progressive, lossless, hierarchical or arithmetic). */
  readonly sequentialHuffman: boolean;
  /** Three components stored as RGB rather than YCbCr, as libjpeg decides it.
   * That is an Adobe marker with transform 0, or component ids 'R', 'G', 'B' without one. */
  readonly rgb: boolean;
  /** EXIF orientation 1–8; 1 without one. */
  readonly orientation: number;
}

/** The orientation in an APP1 Exif segment's first IFD. The TIFF header is at t; the segment ends at end.
 * Undefined where the segment is not plain enough to read; libvips's libexif then decides. */
function exifOrientation(d: Uint8Array, t: number, end: number): number | undefined {
  if (t + 8 > end) return undefined;
  const view = new DataView(d.buffer, d.byteOffset, d.byteLength);
  const little = d[t] === 0x49 && d[t + 1] === 0x49;
  if (!little && !(d[t] === 0x4d && d[t + 1] === 0x4d)) return undefined;
  const u16 = (at: number): number => view.getUint16(at, little);
  const u32 = (at: number): number => view.getUint32(at, little);
  if (u16(t + 2) !== 42) return undefined;
  const ifd = t + u32(t + 4);
  if (ifd + 2 > end) return undefined;
  const entries = u16(ifd);
  if (ifd + 2 + entries * 12 + 4 > end) return undefined;
  for (let e = 0; e < entries; e++) {
    const at = ifd + 2 + e * 12;
    if (u16(at) !== 0x0112) continue;
    // SHORT, one value, in the entry itself
    if (u16(at + 2) !== 3 || u32(at + 4) !== 1) return undefined;
    return u16(at + 8);
  }
  // None in the first IFD: libexif would look in the others (the thumbnail's); leave that to it.
  return u32(ifd + 2 + entries * 12) === 0 ? 1 : undefined;
}

/** The header of a JPEG up to its first scan, or undefined (see the comment above JpegHeader). */
export function readJpegHeader(d: Uint8Array): JpegHeader | undefined {
  if (d.length < 4 || d[0] !== 0xff || d[1] !== 0xd8) return undefined;
  let frame: Omit<JpegHeader, 'orientation' | 'rgb'> | undefined;
  let ids: number[] = [];
  let orientation: number | undefined = 1;
  let exifSeen = false;
  let jfif = false;
  let adobeTransform: number | undefined;
  let i = 2;
  while (i + 4 <= d.length) {
    if (d[i] !== 0xff) return undefined;
    while (d[i + 1] === 0xff && i + 2 < d.length) i++; // fill bytes
    const marker = d[i + 1]!;
    i += 2;
    if (marker === 0x01 || (marker >= 0xd0 && marker <= 0xd8)) continue; // no length: TEM, RSTn, SOI
    if (marker === 0xd9 || i + 2 > d.length) return undefined; // EOI before a scan
    if (marker === 0xda) {
      // the first scan: the header is complete
      if (frame === undefined || orientation === undefined) return undefined;
      const rgb = frame.components === 3 && (adobeTransform !== undefined ? adobeTransform === 0 : !jfif && ids.join() === '82,71,66');
      return { ...frame, rgb, orientation };
    }
    const length = (d[i]! << 8) | d[i + 1]!;
    const seg = i + 2;
    const end = i + length;
    if (length < 2 || end > d.length) return undefined;
    if (marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc) {
      if (frame !== undefined || length < 8) return undefined; // a second frame: hierarchical
      const components = d[seg + 5]!;
      if (length < 8 + 3 * components) return undefined;
      frame = {
        precision: d[seg]!,
        height: (d[seg + 1]! << 8) | d[seg + 2]!,
        width: (d[seg + 3]! << 8) | d[seg + 4]!,
        components,
        sequentialHuffman: marker === 0xc0 || marker === 0xc1,
      };
      ids = Array.from({ length: components }, (_, c) => d[seg + 6 + 3 * c]!);
    } else if (marker === 0xe0 && length >= 7 && String.fromCharCode(...d.subarray(seg, seg + 5)) === 'JFIF\0') {
      jfif = true;
    } else if (marker === 0xe1 && !exifSeen && length >= 8 && String.fromCharCode(...d.subarray(seg, seg + 6)) === 'Exif\0\0') {
      exifSeen = true;
      orientation = exifOrientation(d, seg + 6, end);
    } else if (marker === 0xee && length >= 14 && String.fromCharCode(...d.subarray(seg, seg + 5)) === 'Adobe') {
      adobeTransform = d[seg + 11];
    }
    i = end;
  }
  return undefined;
}

/** A header the GPU path takes: sequential Huffman, 8-bit, grey or YCbCr, a size. */
export function gpuTakes(h: JpegHeader): boolean {
  return h.sequentialHuffman && h.precision === 8 && (h.components === 1 || (h.components === 3 && !h.rgb)) && h.width > 0 && h.height > 0;
}

/** A frame as sharp can read it, with its stored size and EXIF orientation. */
interface SourceImage {
  readonly input: Uint8Array | Uint16Array;
  readonly raw?: { width: number; height: number; channels: 1 | 3 };
  /** Stored size (before orientation). */
  readonly width: number;
  readonly height: number;
  /** EXIF orientation 1…8 (1: as stored). */
  readonly orientation: number;
  /** Channels are B,G,R in memory (swapped by the layout pass: resizing does not care). */
  readonly bgr: boolean;
  readonly hasAlpha: boolean;
  /** A baseline 8-bit JPEG of 1 or 3 channels: what the GPU path takes. */
  readonly gpuDecodable?: boolean;
  /** A raw frame of the target size: the pixels the layout pass reads as they are (sharp is skipped). */
  readonly direct?: StoredPixels;
}

const bytesPerPixel: Record<Exclude<FrameEncoding, 'jpeg' | 'png'>, 1 | 2 | 3 | 4> = {
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

function checkSize(encoding: string, width: number, height: number, maxPixels: number): void {
  if (width <= 0 || height <= 0) throw frameError(encoding, `zero size ${width}×${height}`);
  if (width * height > maxPixels)
    throw frameError(encoding, `${width}×${height} = ${width * height} pixels exceeds maxPixels ${maxPixels}`);
}

/** A JPEG the GPU path takes, the usual camera frame, is described from its header alone (readJpegHeader).
 * On the GPU route it is not decoded here at all.
 * On the host, sharp's metadata() would cost a header parse and a thread-pool round trip more per frame.
 * Other frames ask sharp. */
async function describeEncoded(frame: CameraFrame, maxPixels: number): Promise<SourceImage> {
  const data = frame.data;
  if (!(data instanceof Uint8Array) || data.byteLength === 0) throw frameError(frame.encoding, 'empty data');
  const buffer = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  const header = frame.encoding === 'jpeg' ? readJpegHeader(buffer) : undefined;
  if (header !== undefined && gpuTakes(header)) {
    checkSize(frame.encoding, header.width, header.height, maxPixels);
    const orientation = header.orientation >= 1 && header.orientation <= 8 ? header.orientation : 1;
    return { input: buffer, width: header.width, height: header.height, orientation, bgr: false, hasAlpha: false, gpuDecodable: true };
  }
  let meta: Metadata;
  try {
    meta = await sharp(buffer).metadata();
  } catch (err) {
    throw frameError(frame.encoding, `cannot read header (${firstLine(err)})`);
  }
  if (meta.format !== frame.encoding) throw frameError(frame.encoding, `data is ${meta.format ?? 'unknown'}, not ${frame.encoding}`);
  const width = meta.width ?? 0;
  const height = meta.height ?? 0;
  checkSize(frame.encoding, width, height, maxPixels);
  const o = meta.orientation ?? 1;
  const orientation = Number.isInteger(o) && o >= 1 && o <= 8 ? o : 1;
  // The GPU path is checked on sequential 8-bit YCbCr JPEGs of 1 or 3 channels.
  // Progressive, arithmetic, 12-bit, CMYK and RGB-stored ones stay on the host.
  const gpuDecodable =
    meta.format === 'jpeg' &&
    (meta.channels === 1 || meta.channels === 3) &&
    meta.space !== 'cmyk' &&
    meta.isProgressive !== true &&
    (meta.depth === undefined || meta.depth === 'uchar') &&
    (header === undefined || gpuTakes(header));
  return { input: buffer, width, height, orientation, bgr: false, hasAlpha: meta.hasAlpha === true, gpuDecodable };
}

/** Validates a raw frame. Rows are repacked only where sharp has to read them.
 * sharp wants packed rows, and HF's convert('RGB') drops alpha. A frame read directly keeps its stride. */
function describeRaw(frame: CameraFrame, maxPixels: number, canReadDirect: (width: number, height: number) => boolean): SourceImage {
  const enc = frame.encoding as keyof typeof bytesPerPixel;
  const { width, height } = frame;
  if (width === undefined || height === undefined) throw frameError(enc, 'width and height are required for raw frames');
  if (!Number.isInteger(width) || !Number.isInteger(height) || width <= 0 || height <= 0)
    throw frameError(enc, `bad size ${width}×${height}`);
  checkSize(enc, width, height, maxPixels);
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
  const common = { width, height, orientation: 1, bgr, hasAlpha: false };
  if (enc !== 'mono16' && canReadDirect(width, height))
    return { ...common, input: data, direct: { data, width, height, channels: bpp, stride, rows: height } };
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
    return { ...common, input: packed, raw: { width, height, channels: 3 } };
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
      ...common,
      input: new Uint16Array(aligned.buffer, aligned.byteOffset, width * height),
      raw: { width, height, channels: 1 },
    };
  }
  return { ...common, input: packed, raw: { width, height, channels } };
}

function firstLine(err: unknown): string {
  return (err instanceof Error ? err.message : String(err)).split('\n')[0]!.trim();
}

/** 8-bit interleaved pixels in their stored orientation, for the layout pass. */
interface StoredPixels {
  readonly data: Uint8Array;
  readonly width: number;
  readonly height: number;
  readonly channels: 1 | 2 | 3 | 4;
  readonly stride: number;
  /** Rows after enlargement (libvips enlarges through its slow affine path; the layout pass does it). */
  readonly rows: number;
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
class PixelPool {
  readonly #keep: number;
  readonly #allocate: PixelAllocator | undefined;
  #length = 0;
  #free: Float32Array[] = [];
  #allocated = 0;

  constructor(allocate: PixelAllocator | undefined, keep = 2) {
    this.#allocate = allocate;
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
    const array = this.#allocate?.(length);
    if (array !== undefined && !(array instanceof Float32Array && array.length === length))
      throw new TypeError(`preprocess: the pixel allocator returned ${String(array)} for ${length} values`);
    return array ?? new Float32Array(length);
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

export interface PreprocessStage extends Stage<CameraFrame, PixelTensor> {
  readonly contract: EncoderContract;
  /** The libvips threads this stage set. */
  readonly threads: number;
  /** pixel_values arrays allocated so far (steady state: 2, when the encoder recycles them). */
  allocatedArrays(): number;
  /** JPEG frames handed to the encoder undecoded (jpegToEncoder). */
  jpegsToEncoder(): number;
}

/** PreprocessConfig with the defaults filled in, as checkPreprocessOptions returns it. */
export interface CheckedPreprocessOptions {
  readonly contract: EncoderContract;
  readonly maxPixels: number;
  readonly kernel: ResizeKernel;
  readonly imageSize: number;
  readonly gemma4Sizing: Gemma4Sizing;
  readonly imageTokens: number | undefined;
  readonly threads: number;
  readonly allocate: PixelAllocator | undefined;
  /** The kernel the encoder resizes JPEG frames with on its GPU; undefined when they stay here.
   * Set where `jpegToEncoder` is and the kernel is linear or cubic, the two the GPU path has. */
  readonly jpegKernel: 'linear' | 'cubic' | undefined;
}

/** Checks `cfg` and fills in the defaults; throws naming the first bad option. */
export function checkPreprocessOptions(cfg: PreprocessConfig): CheckedPreprocessOptions {
  const { contract, maxPixels, threads, allocate } = cfg;
  if (contract !== 'gemma3' && contract !== 'gemma4')
    throw new TypeError(`preprocess: contract must be 'gemma3' or 'gemma4', got ${String(contract)}`);
  if (!Number.isInteger(maxPixels) || maxPixels <= 0)
    throw new RangeError(`preprocess: maxPixels must be a positive integer, got ${maxPixels}`);
  const kernel = cfg.kernel ?? (contract === 'gemma3' ? 'linear' : 'cubic');
  if (!KERNELS.includes(kernel)) throw new RangeError(`preprocess: kernel must be one of ${KERNELS.join(', ')}, got ${kernel}`);
  const imageSize = cfg.imageSize ?? GEMMA3_IMAGE_SIZE;
  if (!Number.isInteger(imageSize) || imageSize <= 0 || imageSize > 8192)
    throw new RangeError(`preprocess: imageSize must be an integer in 1..8192, got ${imageSize}`);
  const gemma4Sizing = cfg.gemma4Sizing ?? 'hf';
  if (gemma4Sizing !== 'hf' && gemma4Sizing !== 'llama.cpp')
    throw new RangeError(`preprocess: gemma4Sizing must be 'hf' or 'llama.cpp', got ${String(gemma4Sizing)}`);
  if (cfg.imageTokens !== undefined) clampImageTokens(cfg.imageTokens);
  if (allocate !== undefined && typeof allocate !== 'function')
    throw new TypeError(`preprocess: allocate must be a function, got ${typeof allocate}`);
  if (cfg.jpegToEncoder !== undefined && typeof cfg.jpegToEncoder !== 'boolean')
    throw new TypeError(`preprocess: jpegToEncoder must be a boolean, got ${String(cfg.jpegToEncoder)}`);
  if (!Number.isInteger(threads) || threads < 1 || threads > 1024)
    throw new RangeError(`preprocess: threads must be an integer in 1..1024, got ${threads}`);
  const gpuKernel = kernel === 'linear' || kernel === 'cubic' ? kernel : undefined;
  const jpegKernel = cfg.jpegToEncoder === true ? gpuKernel : undefined;
  return { contract, maxPixels, kernel, imageSize, gemma4Sizing, imageTokens: cfg.imageTokens, threads, allocate, jpegKernel };
}

/** Sets the libvips threads for every sharp call in this process (sharp.concurrency is process-wide). */
export function createPreprocessStage(cfg: PreprocessConfig): PreprocessStage {
  return new Preprocessor(checkPreprocessOptions(cfg));
}

class Preprocessor implements PreprocessStage {
  readonly name = 'preprocess';
  readonly contract: EncoderContract;
  readonly threads: number;
  readonly #options: CheckedPreprocessOptions;
  readonly #pool: PixelPool;
  readonly #recycle = (values: Float32Array): void => this.#pool.give(values);
  readonly #gemma3Tokens: number;
  #jpegsToEncoder = 0;

  constructor(options: CheckedPreprocessOptions) {
    this.#options = options;
    this.contract = options.contract;
    this.threads = options.threads;
    // The operation cache is turned off: frames never repeat, and cached decodes would only hold memory.
    sharp.concurrency(options.threads);
    sharp.cache(false);
    this.#pool = new PixelPool(options.allocate);
    this.#gemma3Tokens = Math.floor(options.imageSize / 56) ** 2;
  }

  allocatedArrays(): number {
    return this.#pool.allocated;
  }

  jpegsToEncoder(): number {
    return this.#jpegsToEncoder;
  }

  async process(frame: CameraFrame, ctx: StageContext): Promise<PixelTensor> {
    const { imageSize, jpegKernel } = this.#options;
    const src = await this.#describe(frame, ctx);
    const target = this.#targetOf(src.width, src.height, src.orientation, ctx);
    if (jpegKernel !== undefined && src.gpuDecodable === true) {
      this.#jpegsToEncoder++;
      return this.#planOnEncoder(frame.data, src, target, jpegKernel);
    }
    const px = await this.#pixelsOf(src, frame.encoding, target);
    if (this.contract === 'gemma3') {
      const values = this.#pool.take(3 * imageSize * imageSize);
      await this.#lay(px, src, values, 'chw');
      return {
        contract: 'gemma3',
        pixelValues: values,
        pixelDims: [1, 3, imageSize, imageSize],
        imageTokens: this.#gemma3Tokens,
        recycle: this.#recycle,
      };
    }
    const { cols, tokens, capacity } = gemma4Grid(target);
    const values = this.#pool.take(capacity * GEMMA4_PATCH_DIM);
    const nPatches = await this.#lay(px, src, values, 'patches');
    return {
      contract: 'gemma4',
      pixelValues: values,
      pixelDims: [1, capacity, GEMMA4_PATCH_DIM],
      positionIds: gemma4Positions(cols, nPatches, capacity),
      positionDims: [1, capacity, 2],
      imageTokens: tokens,
      recycle: this.#recycle,
    };
  }

  /** Display-oriented target size for a stored width×height. */
  #targetOf(width: number, height: number, orientation: number, ctx: StageContext): Target {
    const { imageSize, imageTokens, gemma4Sizing } = this.#options;
    if (this.contract === 'gemma3') return { width: imageSize, height: imageSize, budget: 0 };
    const [w, h] = transposes(orientation) ? [height, width] : [width, height];
    const budget = clampImageTokens(imageTokens ?? ctx.knobs.imageTokens);
    const size = gemma4TargetSize(w, h, budget, gemma4Sizing);
    return { width: size.width, height: size.height, budget };
  }

  #describe(frame: CameraFrame, ctx: StageContext): Promise<SourceImage> | SourceImage {
    const { maxPixels } = this.#options;
    if (frame === null || typeof frame !== 'object') throw new TypeError('preprocess: frame must be a CameraFrame object');
    if (!ENCODINGS.includes(frame.encoding))
      throw frameError(String(frame.encoding), `unsupported encoding (supported: ${ENCODINGS.join(', ')})`);
    if (frame.encoding === 'jpeg' || frame.encoding === 'png') return describeEncoded(frame, maxPixels);
    return describeRaw(frame, maxPixels, (w, h) => {
      const t = this.#targetOf(w, h, 1, ctx);
      return t.width === w && t.height === h;
    });
  }

  /** Decodes and resizes in the stored orientation (target sides swapped for orientations 5–8). */
  async #pixelsOf(src: SourceImage, encoding: string, target: { width: number; height: number }): Promise<StoredPixels> {
    const { kernel, maxPixels } = this.#options;
    if (src.direct) return src.direct;
    const [width, height] = transposes(src.orientation) ? [target.height, target.width] : [target.width, target.height];
    const rowsHere = height > src.height && (kernel === 'linear' || kernel === 'cubic');
    const vipsHeight = rowsHere ? src.height : height;
    let pipeline = sharp(src.input, { ...(src.raw ? { raw: src.raw } : {}), limitInputPixels: maxPixels, sequentialRead: true });
    if (width !== src.width || vipsHeight !== src.height)
      pipeline = pipeline.resize(width, vipsHeight, { fit: 'fill', kernel, fastShrinkOnLoad: true });
    if (src.hasAlpha) pipeline = pipeline.removeAlpha();
    try {
      const { data, info } = await pipeline.raw().toBuffer({ resolveWithObject: true });
      if (info.width !== width || info.height !== vipsHeight)
        throw new Error(`sharp returned ${info.width}×${info.height}, wanted ${width}×${vipsHeight}`);
      if (data.length !== width * vipsHeight * info.channels)
        throw new Error(`sharp returned ${data.length} bytes for ${width}×${vipsHeight}×${info.channels}`);
      return { data, width, height: vipsHeight, channels: info.channels, stride: width * info.channels, rows: height };
    } catch (err) {
      throw frameError(encoding, `decode/resize failed (${firstLine(err)})`);
    }
  }

  /** The layout pass into `out`: resolves to the patches (or pixels) written. */
  #lay(px: StoredPixels, src: SourceImage, out: Float32Array, layout: 'chw' | 'patches'): Promise<number> {
    return layoutPixels(px.data, out, {
      width: px.width,
      height: px.height,
      channels: px.channels,
      stride: px.stride,
      rows: px.rows,
      kernel: this.#options.kernel === 'cubic' ? 'cubic' : 'linear',
      orientation: src.orientation,
      bgr: src.bgr,
      layout,
      // gemma3: (v/255 − 0.5)/0.5 → [−1, 1]; gemma4: v/255 (its graph applies ×2 − 1).
      ...(layout === 'chw' ? { scale: 0.5, offset: 0.5 } : {}),
    });
  }

  /** The tensor the encoder will make from this JPEG on its GPU.
   * It has the host path's dims, position ids and token count, with the frame in place of pixel values. */
  #planOnEncoder(data: Uint8Array, src: SourceImage, target: Target, filter: 'linear' | 'cubic'): PixelTensor {
    const { imageSize } = this.#options;
    const gemma3 = this.contract === 'gemma3';
    const jpeg = {
      data,
      storedWidth: src.width,
      storedHeight: src.height,
      orientation: src.orientation,
      kernel: filter,
      // As the host layout pass: gemma3 (v/255 − 0.5)/0.5, gemma4 v/255.
      ...(gemma3 ? { scale: 0.5, offset: 0.5 } : { scale: 1, offset: 0 }),
      width: target.width,
      height: target.height,
    };
    if (gemma3) {
      return {
        contract: 'gemma3',
        pixelValues: new Float32Array(0),
        pixelDims: [1, 3, imageSize, imageSize],
        imageTokens: this.#gemma3Tokens,
        jpeg,
      };
    }
    const { cols, rows, tokens, capacity } = gemma4Grid(target);
    return {
      contract: 'gemma4',
      pixelValues: new Float32Array(0),
      pixelDims: [1, capacity, GEMMA4_PATCH_DIM],
      positionIds: gemma4Positions(cols, cols * rows, capacity),
      positionDims: [1, capacity, 2],
      imageTokens: tokens,
      jpeg,
    };
  }
}

/** A frame's display-oriented target size, and the gemma4 token budget it was sized for (0 for gemma3). */
interface Target {
  readonly width: number;
  readonly height: number;
  readonly budget: number;
}

/** A gemma4 target's patch grid, its soft tokens, and the tensor's patch capacity.
 * The capacity is the budget's, or more where llama.cpp's sizing exceeds it through its 70-token floor. */
function gemma4Grid(target: Target): { cols: number; rows: number; tokens: number; capacity: number } {
  const cols = target.width / GEMMA4_PATCH;
  const rows = target.height / GEMMA4_PATCH;
  const tokens = (cols / GEMMA4_POOL) * (rows / GEMMA4_POOL);
  return { cols, rows, tokens, capacity: Math.max(target.budget, tokens) * GEMMA4_POOL * GEMMA4_POOL };
}
