// Vision encoder stage on llama.cpp's clip (tools/mtmd), through the percept addon.
// An mmproj GGUF encodes the preprocessor's PixelTensor into image embeddings, off the JS thread, on CPU or GPU.
// It runs percept's persistent graph over clip's weights, or clip's own encode (`graph`).
// Contract, normalization, JPEG input and cancel: nodes/README.md#mtmd-encoder
import { existsSync } from 'node:fs';
import type { ImageEmbedding, PixelAllocator, PixelTensor } from './payloads.ts';
import type { Stage, StageContext } from '../pipeline/types.ts';
import {
  LlamaVision,
  type VisionBatchResult,
  type VisionEncodeResult,
  type VisionFlashAttention,
  type VisionImage,
  type VisionInfo,
  type VisionPhases,
  type VisionProfile,
  type VisionProfileMode,
} from '../native/vision.ts';
import { AbandonableSlot } from '../pipeline/abort.ts';

export interface MtmdEncoderConfig {
  /** Path of the mmproj GGUF (resolve `synth:<preset>-mmproj` specifiers before, with models/mmproj-synth.ts). */
  readonly mmproj: string;
  /** Run clip on the GPU backend (CUDA builds). */
  readonly useGpu?: boolean;
  /** Config-file form of useGpu: clip offloads all or nothing, so any value ≠ 0 means the GPU. */
  readonly gpuLayers?: number;
  /** The decoder's n_embd: the projector's output width must equal it. */
  readonly expectedHidden?: number;
  /** CPU threads for clip (default: all cores). */
  readonly threads?: number;
  readonly flashAttention?: VisionFlashAttention;
  /** Report where each encode's time goes in stats().lastProfile (default 'off').
   * 'ops' synchronizes after every graph node, so it slows the encode it measures. */
  readonly profile?: VisionProfileMode;
  /** 'percept' (default): percept's persistent graph over clip's weights, where it mirrors the tower.
   * info.graphFallback says why not. 'clip': clip's own encode. */
  readonly graph?: 'percept' | 'clip';
  /** Pixel arrays in pinned host memory from allocatePixels (default true).
   * Where the device has none, allocatePixels gives undefined anyway. false: the preprocessor's own arrays, to compare. */
  readonly pinnedPixels?: boolean;
}

export interface MtmdContractInfo {
  readonly kind: 'gemma3' | 'gemma4';
  readonly projector: 'gemma3' | 'gemma4v';
  /** Output width (the decoder's n_embd). */
  readonly hidden: number;
  /** gemma3: the square input side (896). */
  readonly imageSize?: number;
  /** gemma4: values per patch (768). */
  readonly patchDim?: number;
  readonly patchSize: number;
  /** Pooling over the patch grid (4 for gemma3, 3 for gemma4v). */
  readonly merge: number;
}

export interface MtmdEncoderStats {
  readonly runs: number;
  /** Runs whose result arrived after the frame was abandoned (signal fired). */
  readonly discarded: number;
  /** clip's encode time of the last run. */
  readonly lastRunMs: number;
  /** Where the last run's time went, when profiling. */
  readonly lastProfile?: VisionProfile;
  /** percept's graph: the last run's phases (build, layout, upload, compute, read-back). */
  readonly lastPhases?: VisionPhases;
}

export interface MtmdEncoderStage extends Stage<PixelTensor, ImageEmbedding> {
  readonly contract: MtmdContractInfo;
  readonly info: VisionInfo;
  stats(): MtmdEncoderStats;
  /** Several frames of one size in one clip call (cameras of a rig), embeddings in order. Not
   * abortable: for benchmarks and callers outside the graph. */
  encodeBatch(inputs: readonly PixelTensor[]): Promise<ImageEmbedding[]>;
  /** JPEG tensors (PixelTensor.jpeg) are decoded and laid out on this encoder's GPU with nvJPEG.
   * That needs a CUDA build running percept's graph on the GPU. Others are refused. */
  readonly decodesJpeg: boolean;
  /** The pixel values this encoder makes on its GPU from a JPEG tensor (PixelTensor.jpeg), read back:
   * the GPU path checked against the host one. */
  jpegPixels(input: PixelTensor): Promise<Float32Array>;
  /** The preprocessor's PixelAllocator: pinned host memory on CUDA, which encodes upload by DMA.
   * Undefined on the CPU. Pageable memory is slower: nodes/README.md#measurements. */
  readonly allocatePixels: PixelAllocator;
  close(): Promise<void>;
}

/** Checks what clip reports about an mmproj against the pipeline's contract. Pure. */
function checkMtmdContract(info: VisionInfo, expectedHidden: number | undefined, source: string): MtmdContractInfo {
  const problems: string[] = [];
  if (info.projector !== 'gemma3' && info.projector !== 'gemma4v')
    problems.push(`projector '${String(info.projector)}' is neither gemma3 nor gemma4v`);
  if (expectedHidden !== undefined && info.nEmbd !== expectedHidden)
    problems.push(`its output width is ${info.nEmbd}, but the decoder's n_embd is ${expectedHidden}`);
  if (info.projector === 'gemma4v' && info.patchSize * info.patchSize * 3 !== 768)
    problems.push(`gemma4v patch size ${info.patchSize} does not give 768 values per patch`);
  if (problems.length) throw new Error(`encoder-mtmd: ${source}: ${problems.join('; ')}`);
  return info.projector === 'gemma3'
    ? { kind: 'gemma3', projector: 'gemma3', hidden: info.nEmbd, imageSize: info.imageSize, patchSize: info.patchSize, merge: info.merge }
    : {
        kind: 'gemma4',
        projector: 'gemma4v',
        hidden: info.nEmbd,
        patchDim: info.patchSize * info.patchSize * 3,
        patchSize: info.patchSize,
        merge: info.merge,
      };
}

/** The image clip should see for a PixelTensor, or an error naming what does not fit. Pure. */
export function clipImageOf(input: PixelTensor, contract: MtmdContractInfo): VisionImage {
  if (input === null || typeof input !== 'object') throw new TypeError('encoder-mtmd: input must be a PixelTensor');
  if (input.contract !== contract.kind)
    throw new Error(`encoder-mtmd: got a ${String(input.contract)} tensor, the mmproj is ${contract.kind} (${contract.projector})`);
  const dims = input.pixelDims;
  if (input.jpeg !== undefined) {
    if (!Array.isArray(dims)) throw new TypeError('encoder-mtmd: pixelDims must be an array');
    const image = imageOfDims(input, contract);
    if (input.jpeg.width !== image.width || input.jpeg.height !== image.height) {
      throw new RangeError(
        `encoder-mtmd: the JPEG is planned at ${input.jpeg.width}×${input.jpeg.height}, its tensor describes ${image.width}×${image.height}`,
      );
    }
    return image;
  }
  if (!(input.pixelValues instanceof Float32Array)) throw new TypeError('encoder-mtmd: pixelValues must be a Float32Array');
  if (input.pixelValues.buffer.byteLength === 0)
    throw new Error('encoder-mtmd: pixelValues is detached (its buffer was handed to another stage)');
  const count = (d: readonly number[]): number => d.reduce((a, b) => a * b, 1);
  if (!Array.isArray(dims) || count(dims) !== input.pixelValues.length) {
    throw new RangeError(
      `encoder-mtmd: pixelDims [${String(dims)}] need ${Array.isArray(dims) ? count(dims) : '?'} values, got ${input.pixelValues.length}`,
    );
  }
  return imageOfDims(input, contract);
}

/** The image a tensor's dims (and gemma4 position ids) describe. */
function imageOfDims(input: PixelTensor, contract: MtmdContractInfo): VisionImage {
  const dims = input.pixelDims;
  if (dims[0] !== 1) throw new RangeError(`encoder-mtmd: batch ${dims[0]} is not supported (one image per frame)`);
  if (contract.kind === 'gemma3') {
    const s = contract.imageSize!;
    if (dims.length !== 4 || dims[1] !== 3 || dims[2] !== s || dims[3] !== s) {
      throw new RangeError(`encoder-mtmd: gemma3 pixelDims must be [1,3,${s},${s}] (the mmproj's image size), got [${dims.join(',')}]`);
    }
    return { layout: 'chw', width: s, height: s };
  }
  const patchDim = contract.patchDim!;
  if (dims.length !== 3 || dims[2] !== patchDim)
    throw new RangeError(`encoder-mtmd: gemma4 pixelDims must be [1,P,${patchDim}], got [${dims.join(',')}]`);
  const ids = input.positionIds;
  const pd = input.positionDims;
  if (!(ids instanceof BigInt64Array) || !pd)
    throw new TypeError('encoder-mtmd: gemma4 tensors need positionIds (BigInt64Array) and positionDims');
  const capacity = dims[1]!;
  if (pd.length !== 3 || pd[0] !== 1 || pd[1] !== capacity || pd[2] !== 2 || ids.length !== capacity * 2) {
    throw new RangeError(`encoder-mtmd: positionDims [${pd.join(',')}] do not match pixelDims [${dims.join(',')}] / ${ids.length} ids`);
  }
  let valid = 0;
  let cols = 0;
  while (valid < capacity && ids[2 * valid]! >= 0n) {
    cols = Math.max(cols, Number(ids[2 * valid]!) + 1);
    valid++;
  }
  if (valid === 0) throw new RangeError('encoder-mtmd: gemma4 tensor has no valid patch (all position ids are -1)');
  const rows = valid / cols;
  const layoutError = (p: number, why: string): RangeError =>
    new RangeError(
      `encoder-mtmd: gemma4 position ids are not the processor's row-major grid (clip derives positions from the grid): patch ${p} ${why}`,
    );
  if (!Number.isInteger(rows)) throw layoutError(valid - 1, `ends a ${valid}-patch run that is not a whole number of ${cols}-patch rows`);
  for (let p = 0; p < valid; p++) {
    const col = Number(ids[2 * p]!);
    const row = Number(ids[2 * p + 1]!);
    if (col !== p % cols || row !== Math.floor(p / cols))
      throw layoutError(p, `is at (col ${col}, row ${row}), expected (${p % cols}, ${Math.floor(p / cols)})`);
  }
  for (let p = valid; p < capacity; p++) {
    if (ids[2 * p] !== -1n || ids[2 * p + 1] !== -1n) throw layoutError(p, 'is a valid position after the first padding patch');
  }
  if (cols % contract.merge !== 0 || rows % contract.merge !== 0) {
    throw new RangeError(
      `encoder-mtmd: gemma4 patch grid ${cols}×${rows} is not divisible by the ${contract.merge}×${contract.merge} pooling`,
    );
  }
  return { layout: 'patches', width: cols * contract.patchSize, height: rows * contract.patchSize };
}

/** Loads the mmproj, checks its contract, and returns the stage. */
export async function createMtmdEncoderStage(cfg: MtmdEncoderConfig): Promise<MtmdEncoderStage> {
  if (typeof cfg?.mmproj !== 'string' || cfg.mmproj.length === 0)
    throw new TypeError('encoder-mtmd: cfg.mmproj must be the path of an mmproj .gguf');
  if (cfg.mmproj.endsWith('.onnx')) throw new Error(`encoder-mtmd: ${cfg.mmproj} is an ONNX model: that needs encoder kind 'onnx'`);
  if (!existsSync(cfg.mmproj)) throw new Error(`encoder-mtmd: mmproj ${cfg.mmproj} does not exist`);
  if (cfg.expectedHidden !== undefined && !(Number.isInteger(cfg.expectedHidden) && cfg.expectedHidden > 0)) {
    throw new RangeError(`encoder-mtmd: expectedHidden must be a positive integer, got ${cfg.expectedHidden}`);
  }
  if (cfg.gpuLayers !== undefined && !(Number.isInteger(cfg.gpuLayers) && cfg.gpuLayers >= -1)) {
    throw new RangeError(`encoder-mtmd: gpuLayers must be an integer ≥ -1, got ${cfg.gpuLayers}`);
  }
  if (cfg.useGpu !== undefined && typeof cfg.useGpu !== 'boolean')
    throw new TypeError(`encoder-mtmd: useGpu must be a boolean, got ${String(cfg.useGpu)}`);
  const useGpu = cfg.useGpu ?? (cfg.gpuLayers !== undefined && cfg.gpuLayers !== 0);
  const profile = cfg.profile ?? 'off';
  let vision: LlamaVision;
  try {
    vision = await LlamaVision.load(cfg.mmproj, {
      useGpu,
      ...(cfg.threads !== undefined ? { threads: cfg.threads } : {}),
      ...(cfg.flashAttention !== undefined ? { flashAttention: cfg.flashAttention } : {}),
      profile: profile !== 'off',
      ...(cfg.graph !== undefined ? { graph: cfg.graph } : {}),
    });
  } catch (err) {
    throw Object.assign(new Error(`encoder-mtmd: cannot load ${cfg.mmproj}: ${(err as Error).message}`), {
      code: (err as { code?: string }).code,
    });
  }
  let contract: MtmdContractInfo;
  try {
    contract = checkMtmdContract(vision.info, cfg.expectedHidden, cfg.mmproj);
  } catch (err) {
    vision.dispose();
    throw err;
  }
  if (cfg.pinnedPixels !== undefined && typeof cfg.pinnedPixels !== 'boolean')
    throw new TypeError(`encoder-mtmd: pinnedPixels must be a boolean, got ${String(cfg.pinnedPixels)}`);
  return new MtmdEncoder(vision, contract, profile, cfg.pinnedPixels ?? true);
}

class MtmdEncoder implements MtmdEncoderStage {
  readonly name = 'encode';
  readonly contract: MtmdContractInfo;
  readonly #vision: LlamaVision;
  readonly #slot = new AbandonableSlot();
  #closing: Promise<void> | undefined;
  readonly #profile: VisionProfileMode;
  #runs = 0;
  #lastRunMs = 0;
  #lastProfile: VisionProfile | undefined;
  #lastPhases: VisionPhases | undefined;

  readonly allocatePixels: PixelAllocator;

  constructor(vision: LlamaVision, contract: MtmdContractInfo, profile: VisionProfileMode, pinnedPixels: boolean) {
    this.#vision = vision;
    this.contract = contract;
    this.#profile = profile;
    // After close the preprocessor falls back to its own arrays.
    this.allocatePixels = (length) => (pinnedPixels && !this.#vision.disposed ? this.#vision.allocatePixels(length) : undefined);
  }

  get info(): VisionInfo {
    return this.#vision.info;
  }

  get decodesJpeg(): boolean {
    return this.#vision.info.decodesJpeg;
  }

  stats(): MtmdEncoderStats {
    return {
      runs: this.#runs,
      discarded: this.#slot.abandoned,
      lastRunMs: this.#lastRunMs,
      ...(this.#lastProfile ? { lastProfile: this.#lastProfile } : {}),
      ...(this.#lastPhases ? { lastPhases: this.#lastPhases } : {}),
    };
  }

  process(input: PixelTensor, ctx: StageContext): Promise<ImageEmbedding> {
    return this.#encodeOne(input, ctx.signal);
  }

  async jpegPixels(input: PixelTensor): Promise<Float32Array> {
    if (this.#closing) throw new Error('encoder-mtmd: stage is closed');
    if (!input?.jpeg) throw new TypeError('encoder-mtmd: jpegPixels needs a tensor with a jpeg (preprocess jpegToEncoder)');
    const image = clipImageOf(input, this.contract);
    const jpeg = input.jpeg;
    return this.#slot.run(() => this.#vision.jpegPixels(jpeg, image), new AbortController().signal);
  }

  async #encodeOne(input: PixelTensor, signal: AbortSignal): Promise<ImageEmbedding> {
    if (this.#closing) throw new Error('encoder-mtmd: stage is closed');
    const image = clipImageOf(input, this.contract);
    if (input.jpeg) this.#checkDecodesJpeg();
    const result = await this.#slot.run(() => this.#encode(input, image), signal);
    if (result.nEmbd !== this.contract.hidden)
      throw new Error(`encoder-mtmd: clip returned width ${result.nEmbd}, expected ${this.contract.hidden}`);
    if (result.nTokens !== input.imageTokens) {
      throw new Error(
        `encoder-mtmd: the encoder produced ${result.nTokens} tokens but the preprocessor announced ${input.imageTokens} (image ${image.width}×${image.height})`,
      );
    }
    return { data: result.data, nTokens: result.nTokens, nEmbd: result.nEmbd };
  }

  async encodeBatch(inputs: readonly PixelTensor[]): Promise<ImageEmbedding[]> {
    if (this.#closing) throw new Error('encoder-mtmd: stage is closed');
    if (!Array.isArray(inputs) || inputs.length === 0)
      throw new TypeError('encoder-mtmd: encodeBatch needs a non-empty array of PixelTensors');
    const images = inputs.map((t) => clipImageOf(t, this.contract));
    const first = images[0]!;
    const odd = images.findIndex((im) => im.width !== first.width || im.height !== first.height);
    if (odd >= 0) {
      throw new RangeError(
        `encoder-mtmd: a batch is one image size: input ${odd} is ${images[odd]!.width}×${images[odd]!.height}, input 0 is ${first.width}×${first.height}`,
      );
    }
    const never = new AbortController().signal;
    const jpegs = inputs.filter((t) => t.jpeg).length;
    if (jpegs > 0) this.#checkDecodesJpeg();
    if (jpegs > 0 && jpegs < inputs.length) {
      // JPEGs and host pixels in one batch: one at a time.
      const out: ImageEmbedding[] = [];
      for (const [i, t] of inputs.entries()) {
        out.push(
          await this.#encodeOne(t, never).catch((err: unknown) => {
            throw new Error(`encoder-mtmd: batch input ${i}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
          }),
        );
      }
      return out;
    }
    // Nothing gives up on a batch: it takes the slot (after any run in progress) and ends with clip.
    const r = await this.#slot.run(() => this.#encodeBatch(inputs, first), never);
    const announced = inputs.find((t) => t.imageTokens !== r.nTokens);
    if (announced) {
      throw new Error(
        `encoder-mtmd: the encoder produced ${r.nTokens} tokens per image but the preprocessor announced ${announced.imageTokens}`,
      );
    }
    return r.data.map((data) => ({ data, nTokens: r.nTokens, nEmbd: r.nEmbd }));
  }

  /** Refuses a JPEG tensor where this encoder cannot decode it. */
  #checkDecodesJpeg(): void {
    if (!this.decodesJpeg)
      throw new Error('encoder-mtmd: got a JPEG to decode on the GPU, but this encoder cannot (a CUDA build with nvJPEG, on the GPU)');
  }

  async #encode(input: PixelTensor, image: VisionImage): Promise<VisionEncodeResult> {
    let result: VisionEncodeResult;
    try {
      result = input.jpeg
        ? await this.#vision.encodeJpeg(input.jpeg, image, this.#profile)
        : await this.#vision.encode(input.pixelValues, image, this.#profile);
    } catch (err) {
      throw new Error(`encoder-mtmd: encode failed: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    } finally {
      // clip is done reading the pixels (even for a frame whose caller gave up): they can be reused.
      input.recycle?.(input.pixelValues);
    }
    this.#recordRun(result);
    return result;
  }

  async #encodeBatch(inputs: readonly PixelTensor[], image: VisionImage): Promise<VisionBatchResult> {
    let result: VisionBatchResult;
    try {
      result = inputs[0]!.jpeg
        ? await this.#vision.encodeJpegBatch(
            inputs.map((t) => t.jpeg!),
            image,
            this.#profile,
          )
        : await this.#vision.encodeBatch(
            inputs.map((t) => t.pixelValues),
            image,
            this.#profile,
          );
    } catch (err) {
      throw new Error(`encoder-mtmd: batch encode failed: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    } finally {
      for (const t of inputs) t.recycle?.(t.pixelValues);
    }
    this.#recordRun(result);
    return result;
  }

  #recordRun(result: { readonly encodeMs: number; readonly profile?: VisionProfile; readonly phases?: VisionPhases }): void {
    this.#runs++;
    this.#lastRunMs = result.encodeMs;
    this.#lastProfile = result.profile;
    this.#lastPhases = result.phases;
  }

  /** Waits for a running clip encode (it cannot be interrupted), then frees the context. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      await this.#slot.idle();
      this.#vision.dispose();
    })();
    return this.#closing;
  }
}
