// The layout pass of preprocessing in native code (native/src/pixels.cc): 8-bit interleaved pixels →
// an encoder's float tensor, on a libuv worker thread. The loops are simple; in JavaScript they took
// 3–5 ms a frame, most of a preprocessing budget.
import { loadAddon, type NativeLayoutOptions } from './binding.ts';

export type LayoutOptions = NativeLayoutOptions;

/**
 * Writes the pixels of `src` (stored `width`×`height`, `channels` bytes a pixel, `stride` bytes a row)
 * into `out`: rows enlarged to `rows` on PIL's sample grid (`kernel`), shown in EXIF `orientation`,
 * B and R swapped when `bgr`, each value (v/255 − offset)/scale, as planar CHW or as `patch`×`patch`
 * HWC patches in row-major patch order with zeros after the last. Both arrays are used until the
 * promise settles. Resolves to the pixels (chw) or patches written; rejects (TypeError, RangeError)
 * with the reason when the arrays or options do not fit.
 */
export async function layoutPixels(src: Uint8Array, out: Float32Array, options: LayoutOptions): Promise<number> {
  return loadAddon().layoutPixels(src, out, options);
}
