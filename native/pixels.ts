// The layout pass of preprocessing in native code (native/src/pixels.cc), on a libuv worker thread.
// It turns 8-bit interleaved pixels into an encoder's float tensor.
// The loops are simple, but in JavaScript they took most of a preprocessing budget.
import { bool, intIn, invalid, knownKeys, oneOf, plainObject } from './args.ts';
import { loadAddon } from './binding.ts';

export interface LayoutOptions {
  readonly width: number;
  readonly height: number;
  readonly channels: 1 | 2 | 3 | 4;
  /** Bytes per row (default width × channels). */
  readonly stride?: number;
  /** Rows after enlarging on PIL's grid (default height: none), with this filter (default 'linear'). */
  readonly rows?: number;
  readonly kernel?: 'linear' | 'cubic';
  /** EXIF orientation 1…8 (default 1). */
  readonly orientation?: number;
  readonly bgr?: boolean;
  readonly layout: 'chw' | 'patches';
  /** Patch side for 'patches' (default 16). */
  readonly patch?: number;
  /** value = (v/255 − offset) / scale (defaults 1 and 0). */
  readonly scale?: number;
  readonly offset?: number;
}

const KEYS = ['width', 'height', 'channels', 'stride', 'rows', 'kernel', 'orientation', 'bgr', 'layout', 'patch', 'scale', 'offset'];
/** Largest side (and enlarged row count) the layout pass takes. */
const MAX_SIDE = 1 << 16;
/** Patch side of Gemma's vision towers. */
const DEFAULT_PATCH = 16;

function finite(name: string, v: unknown, nonZero: boolean): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || (nonZero && v === 0))
    throw invalid(name, nonZero ? 'a finite non-zero number' : 'a finite number', v);
  return v;
}

/**
 * Writes the pixels of `src` into `out`. `src` is stored `width`×`height`, `channels` bytes a pixel, `stride` bytes a row.
 * Rows are enlarged to `rows` on PIL's sample grid (`kernel`), and shown in EXIF `orientation`.
 * B and R are swapped when `bgr`, and each value becomes (v/255 − offset)/scale.
 * The layout is planar CHW, or `patch`×`patch` HWC patches in row-major patch order with zeros after the last.
 * Both arrays are used until the promise settles. Resolves to the pixels (chw) or patches written.
 * Rejects with a TypeError or RangeError, with the reason, when the arrays or options do not fit.
 */
export async function layoutPixels(src: Uint8Array, out: Float32Array, options: LayoutOptions): Promise<number> {
  if (!(src instanceof Uint8Array)) throw invalid('src', 'a Uint8Array', src);
  if (!(out instanceof Float32Array)) throw invalid('out', 'a Float32Array', out);
  knownKeys('options', plainObject('options', options), KEYS);
  const width = intIn('options.width', options.width, 1, MAX_SIDE);
  const height = intIn('options.height', options.height, 1, MAX_SIDE);
  const channels = intIn('options.channels', options.channels, 1, 4);
  return loadAddon().layoutPixels(src, out, {
    width,
    height,
    channels,
    stride: options.stride === undefined ? width * channels : intIn('options.stride', options.stride, width * channels, 2 ** 40),
    rows: options.rows === undefined ? height : intIn('options.rows', options.rows, height, MAX_SIDE),
    kernel: oneOf('options.kernel', options.kernel ?? 'linear', ['linear', 'cubic']),
    orientation: options.orientation === undefined ? 1 : intIn('options.orientation', options.orientation, 1, 8),
    bgr: bool('options.bgr', options.bgr ?? false),
    layout: oneOf('options.layout', options.layout, ['chw', 'patches']),
    patch: options.patch === undefined ? DEFAULT_PATCH : intIn('options.patch', options.patch, 1, 1024),
    scale: finite('options.scale', options.scale ?? 1, true),
    offset: finite('options.offset', options.offset ?? 0, false),
  });
}
