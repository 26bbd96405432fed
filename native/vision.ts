// The typed, validated API over the addon's clip (tools/mtmd) vision encoder.
// LlamaVision loads an mmproj GGUF and turns preprocessed pixels into image embeddings in the decoder's width.
// Loading and encoding run off the JS thread; one encode at a time per instance.
import { stat } from 'node:fs/promises';
import { availableParallelism } from 'node:os';
import { bool, coded, graft, intIn, invalid, knownKeys, nonEmptyString, oneOf, plainObject } from './args.ts';
import {
  loadAddon,
  type NativeVision,
  type NativeVisionBatchResult,
  type NativeVisionEncodeResult,
  type NativeVisionInfo,
  type NativeJpegFrame,
  type NativeVisionJpegOptions,
  type NativeVisionPhases,
  type NativeVisionProfile,
  type VisionFlashAttention,
} from './binding.ts';

export type VisionInfo = NativeVisionInfo;
export type VisionEncodeResult = NativeVisionEncodeResult;
export type VisionBatchResult = NativeVisionBatchResult;
export type VisionProfile = NativeVisionProfile;
export type VisionPhases = NativeVisionPhases;
export type VisionProfileMode = 'off' | 'phases' | 'ops';
export type { VisionFlashAttention };

export interface LoadVisionOptions {
  /** Run on the first GPU/iGPU backend when the addon was built with one (default false: CPU). */
  readonly useGpu?: boolean;
  /** CPU threads for encode (default: all cores). */
  readonly threads?: number;
  /** Flash attention in the ViT.
   * 'auto' (default): on CUDA, percept's graph runs percept's own kernel (vision-attention.cu, head sizes up to 128).
   *   Elsewhere ggml's runs where the backend has it. On CUDA, clip's own graph turns it off for a head size
   *   without a tensor-core kernel, such as SigLIP so400m's 72 and 40.
   * 'padded': ggml's with zero-padded heads on any backend (percept's graph); clip runs it as 'on'.
   * 'percept': percept's kernel, in percept's graph on a CUDA build. Else clip encodes, with the reason in info().graphFallback. */
  readonly flashAttention?: VisionFlashAttention;
  /** Allocate compute buffers at load so the first encode is not slower (default true). */
  readonly warmup?: boolean;
  /** Let encodes report where their time goes ({ profile } in encode options).
   * Default false: no callback in clip's graph evaluation. */
  readonly profile?: boolean;
  /** 'percept' (default): percept's persistent graph over clip's weights, built once per image shape and reused.
   * It runs where it mirrors the tower; otherwise clip encodes, and info.graphFallback says why.
   * 'clip': clip's own encode, which rebuilds and re-allocates its graph on every call. */
  readonly graph?: 'percept' | 'clip';
}

/** A JPEG for encodeJpeg: its header's stored size and EXIF orientation.
 * Also how to resample it (PIL's antialiased filter) and normalize it: value = (v/255 − offset)/scale. */
export interface VisionJpeg {
  readonly data: Uint8Array;
  readonly storedWidth: number;
  readonly storedHeight: number;
  readonly orientation: number;
  readonly kernel: 'linear' | 'cubic';
  readonly scale: number;
  readonly offset: number;
}

export interface VisionImage {
  /** 'chw': planar [3,H,W] floats; 'patches': row-major patch×patch×3 (HWC) patches, extra values ignored. */
  readonly layout: 'chw' | 'patches';
  readonly width: number;
  readonly height: number;
}

const LOAD_KEYS = ['useGpu', 'threads', 'flashAttention', 'warmup', 'profile', 'graph'] as const;
const PROFILE_MODES: readonly VisionProfileMode[] = ['off', 'phases', 'ops'];

/** One clip vision context (llama.cpp tools/mtmd) loaded from an mmproj GGUF. */
export class LlamaVision {
  readonly #native: NativeVision;
  readonly info: VisionInfo;
  readonly path: string;
  #disposed = false;

  private constructor(native: NativeVision, path: string) {
    this.#native = native;
    this.info = native.info();
    this.path = path;
  }

  /** Loads an mmproj GGUF (gemma3 or gemma4v projector). Rejects with `code` ENOENT or EMODEL. */
  static async load(path: string, options: LoadVisionOptions = {}): Promise<LlamaVision> {
    nonEmptyString('path', path);
    knownKeys('options', plainObject('options', options), LOAD_KEYS);
    const useGpu = bool('options.useGpu', options.useGpu ?? false);
    const threads = intIn('options.threads', options.threads ?? availableParallelism(), 1, 1024);
    const flashAttention = oneOf('options.flashAttention', options.flashAttention ?? 'auto', ['auto', 'on', 'off', 'padded', 'percept']);
    const warmup = bool('options.warmup', options.warmup ?? true);
    const profile = bool('options.profile', options.profile ?? false);
    const graph = oneOf('options.graph', options.graph ?? 'percept', ['percept', 'clip']);
    const st = await stat(path).catch(() => undefined);
    if (!st?.isFile()) throw coded('ENOENT', `mmproj file not found: ${path}`);
    const stack = new Error();
    try {
      const native = await loadAddon().Vision.load(path, { useGpu, threads, flashAttention, warmup, profile, graph });
      return new LlamaVision(native, path);
    } catch (err) {
      throw graft(err, stack);
    }
  }

  /** The decoder width this projector outputs. */
  get nEmbd(): number {
    return this.info.nEmbd;
  }

  get disposed(): boolean {
    return this.#disposed;
  }

  /**
   * Encodes one image. `pixels` is read on a worker thread until the promise settles: do not modify or
   * transfer its buffer before. `profile` ('phases' or 'ops') needs a context loaded with profile.
   * Rejects with `code` EBUSY (another encode running), EDISPOSED or EENCODE.
   */
  async encode(pixels: Float32Array, image: VisionImage, profile: VisionProfileMode = 'off'): Promise<VisionEncodeResult> {
    if (!(pixels instanceof Float32Array)) throw invalid('pixels', 'a Float32Array', pixels);
    if (pixels.buffer.byteLength === 0) throw new TypeError('pixels is detached (its buffer was transferred)');
    const options = this.#encodeOptions(image, profile);
    const stack = new Error();
    try {
      return await this.#native.encode(pixels, options);
    } catch (err) {
      throw graft(err, stack);
    }
  }

  /**
   * Encodes several images of one size and layout in one call, such as the cameras of one rig.
   * A projector that batches (info.batchable: gemma4v) runs one graph; others encode one after the other on one worker thread.
   * Returns one embedding array per image, in order. Same rules as encode() for the arrays.
   */
  async encodeBatch(images: readonly Float32Array[], image: VisionImage, profile: VisionProfileMode = 'off'): Promise<VisionBatchResult> {
    if (!Array.isArray(images) || images.length === 0) throw invalid('images', 'a non-empty array of Float32Array', images);
    images.forEach((px, i) => {
      if (!(px instanceof Float32Array)) throw invalid(`images[${i}]`, 'a Float32Array', px);
      if (px.buffer.byteLength === 0) throw new TypeError(`images[${i}] is detached (its buffer was transferred)`);
    });
    const options = this.#encodeOptions(image, profile);
    const stack = new Error();
    try {
      return await this.#native.encodeBatch([...images], options);
    } catch (err) {
      throw graft(err, stack);
    }
  }

  /**
   * Encodes one JPEG frame without its pixels touching the host. nvJPEG decodes it on the encoder's GPU.
   * One kernel then resamples it to `image` (display-oriented), applies the EXIF orientation,
   * normalizes it and writes the graph's input in place.
   * Needs info.decodesJpeg: a CUDA build with nvJPEG, and percept's graph on the GPU.
   * Rejects with `code` ENOTSUP otherwise, and with EENCODE when nvJPEG cannot decode the data.
   * Same one-at-a-time rule as encode().
   */
  async encodeJpeg(jpeg: VisionJpeg, image: VisionImage, profile: VisionProfileMode = 'off'): Promise<VisionEncodeResult> {
    const [frames, options] = this.#jpegRequest([jpeg], image, profile);
    const stack = new Error();
    try {
      return await this.#native.encodeJpeg(frames as [NativeJpegFrame], options);
    } catch (err) {
      throw graft(err, stack);
    }
  }

  /** Several JPEG frames of one target size (cameras of a rig) decoded on the GPU into one graph call,
   * as encodeBatch does with pixel arrays. The frames share the kernel and normalization. */
  async encodeJpegBatch(jpegs: readonly VisionJpeg[], image: VisionImage, profile: VisionProfileMode = 'off'): Promise<VisionBatchResult> {
    if (!Array.isArray(jpegs) || jpegs.length === 0) throw invalid('jpegs', 'a non-empty array of VisionJpeg', jpegs);
    const [frames, options] = this.#jpegRequest(jpegs, image, profile);
    const stack = new Error();
    try {
      return await this.#native.encodeJpegBatch(frames, options);
    } catch (err) {
      throw graft(err, stack);
    }
  }

  /** The input encodeJpeg would hand the graph for `jpeg`, read back to the host: width × height × 3 floats in the image's layout.
   * It checks the GPU path against the host one. Same rules. */
  async jpegPixels(jpeg: VisionJpeg, image: VisionImage): Promise<Float32Array> {
    const [frames, options] = this.#jpegRequest([jpeg], image, 'off');
    const stack = new Error();
    try {
      return await this.#native.jpegPixels(frames as [NativeJpegFrame], options);
    } catch (err) {
      throw graft(err, stack);
    }
  }

  #jpegRequest(jpegs: readonly VisionJpeg[], image: VisionImage, profile: VisionProfileMode): [NativeJpegFrame[], NativeVisionJpegOptions] {
    const frames = jpegs.map((jpeg, i) => {
      const name = jpegs.length === 1 ? 'jpeg' : `jpegs[${i}]`;
      plainObject(name, jpeg);
      if (!(jpeg.data instanceof Uint8Array) || jpeg.data.byteLength === 0)
        throw invalid(`${name}.data`, 'a non-empty Uint8Array', jpeg.data);
      return {
        data: jpeg.data,
        storedWidth: intIn(`${name}.storedWidth`, jpeg.storedWidth, 1, 65535),
        storedHeight: intIn(`${name}.storedHeight`, jpeg.storedHeight, 1, 65535),
        orientation: intIn(`${name}.orientation`, jpeg.orientation, 1, 8),
      };
    });
    const first = jpegs[0]!;
    const kernel = oneOf('jpeg.kernel', first.kernel, ['linear', 'cubic']);
    if (!(Number.isFinite(first.scale) && first.scale !== 0)) throw invalid('jpeg.scale', 'a finite non-zero number', first.scale);
    if (!Number.isFinite(first.offset)) throw invalid('jpeg.offset', 'a finite number', first.offset);
    const odd = jpegs.findIndex((j) => j.kernel !== first.kernel || j.scale !== first.scale || j.offset !== first.offset);
    if (odd >= 0) throw new RangeError(`jpegs[${odd}] has another kernel or normalization than jpegs[0]: one batch, one of each`);
    return [frames, { ...this.#encodeOptions(image, profile), kernel, scale: first.scale, offset: first.offset }];
  }

  /**
   * An array of `length` floats for pixels, in the encoder device's pinned host memory (CUDA).
   * encode() uploads it by DMA rather than through CUDA's pageable staging.
   * Undefined where the device has none (the CPU) or clip's own encode runs: use an ordinary Float32Array there.
   * The memory is freed when the array is collected, whether or not this instance is disposed by then.
   */
  allocatePixels(length: number): Float32Array | undefined {
    intIn('length', length, 1, 2 ** 31);
    if (this.#disposed) throw coded('EDISPOSED', 'LlamaVision is disposed');
    return this.#native.allocatePixels(length);
  }

  #encodeOptions(
    image: VisionImage,
    profile: VisionProfileMode,
  ): { layout: 'chw' | 'patches'; width: number; height: number; profile: VisionProfileMode } {
    plainObject('image', image);
    const layout = oneOf('image.layout', image.layout, ['chw', 'patches']);
    const width = intIn('image.width', image.width, 1, 46000);
    const height = intIn('image.height', image.height, 1, 46000);
    oneOf('profile', profile, PROFILE_MODES);
    if (this.#disposed) throw coded('EDISPOSED', 'LlamaVision is disposed');
    return { layout, width, height, profile };
  }

  /** Frees the clip context (idempotent). Throws EBUSY while an encode runs: await it first. */
  dispose(): void {
    if (this.#disposed) return;
    this.#native.dispose();
    this.#disposed = true;
  }
}
