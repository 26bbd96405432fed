// `percept bench encode`: preprocessing and vision-encoder latency, each timed on its own, per frame.
import { readFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import sharp from 'sharp';
import { createOnnxEncoderStage, type ExecutionProvider } from '../../nodes/encoder-onnx.ts';
import { createPreprocessStage } from '../../nodes/preprocess.ts';
import { isMmprojSpec, resolveModel } from '../../models/resolve.ts';
import { tokenCosines, type CameraFrame, type ImageEmbedding, type PixelTensor } from '../../nodes/payloads.ts';
import type { Stage, StageContext } from '../../pipeline/types.ts';
import type { MtmdEncoderConfig, MtmdEncoderStage } from '../../nodes/encoder-mtmd.ts';
import type { VisionFlashAttention, VisionPhases, VisionProfile } from '../../native/vision.ts';
import { loadConfig } from '../../pipeline/config.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';
import { quantile } from '../stats.ts';

export interface BenchEncodeOptions {
  /** .onnx path or synth:<preset> for onnxruntime. A .gguf mmproj or synth:<preset>-mmproj[@seed][?dtype=f16]
   * runs llama.cpp clip through the native addon. */
  readonly encoder: string;
  /** ORT execution provider; for an mmproj, 'cuda' runs clip on the GPU backend. */
  readonly ep: ExecutionProvider | string;
  /** JPEG or PNG file. Default: a generated 1280×720 JPEG at quality 85. */
  readonly image?: string;
  /** Gemma 4 image-token budget. */
  readonly imageTokens: number;
  readonly iterations: number;
  readonly warmup?: number;
  /** CPU threads for preprocessing with libvips, and for the encoder (ORT intra-op or clip threads). */
  readonly threads?: number;
  readonly allowSpinning?: boolean;
  /** mmproj only: report where each encode's time goes. 'phases' splits setup from compute. 'ops' gives
   * the time per op type, synchronized after every node, so it slows what it measures. */
  readonly profile?: 'phases' | 'ops';
  /** mmproj only: flash attention in the tower.
   *   'auto'     the default, percept's kernel on CUDA, else ggml's where the backend supports it;
   *   'padded'   ggml-cuda's with heads padded to a tensor-core size, to compare percept's kernel with;
   *   'percept'  percept's kernel, refused off CUDA. */
  readonly flashAttention?: VisionFlashAttention;
  /** mmproj only: also time N frames of one size in one encodeBatch call. */
  readonly batch?: number;
  /** mmproj only: 'percept', the default, runs percept's persistent graph over clip's weights. 'clip' runs
   * clip's own encode, which rebuilds its graph on every call. */
  readonly path?: 'percept' | 'clip';
  /** mmproj only: encode the last frame once more through the other path on the same weights and
   * report the worst per-token cosine between the two. */
  readonly check?: boolean;
  /** mmproj only: pixel arrays in the encoder's pinned host memory, true by default.
   * `--no-pinned-pixels` compares with pageable arrays. */
  readonly pinnedPixels?: boolean;
  /** 'auto', the config's default, decodes, resizes and lays out JPEG frames on the encoder's GPU where it
   * can. That takes an mmproj on CUDA, built with nvJPEG. 'host' has libvips decode them here. */
  readonly jpegDecode?: 'auto' | 'host';
}

/** p50/p99 of one phase of the timed encodes, ms. */
export interface BenchPhase {
  readonly p50: number;
  readonly p99: number;
}

/** What clip (or percept's graph) reported at load, and where the time of the timed encodes went. */
export interface BenchClipReport {
  /** The graph that encoded: percept's persistent one, or clip's. Clip's is asked for with --path clip,
   * or is the fallback, with the reason in graph_fallback. */
  readonly path: 'percept' | 'clip';
  readonly graph_fallback: string | null;
  readonly flash_attention: boolean | null;
  /** The head size flash attention ran at, above the tower's own when padded. Null without it. */
  readonly flash_attention_head: number | null;
  /** Whose flash-attention kernel ran, 'percept' or 'ggml'. Null without flash attention. */
  readonly attention_kernel: 'percept' | 'ggml' | null;
  /** The tower's own head size (hidden ÷ heads). */
  readonly head_size: number;
  readonly graph_splits: number;
  readonly graph_nodes: number;
  /** Weights percept's graph copied at load in another layout (see NativeVisionInfo.copiedWeightBytes). */
  readonly copied_weights_mib: number;
  /** The pixel arrays were in the device's pinned host memory (uploaded by DMA). */
  readonly pinned_pixels: boolean;
  /** JPEG frames were decoded, resized and laid out on the GPU with nvJPEG. Then preprocess_ms is the
   * header read alone, and encode_ms holds the rest (phases.jpeg_decode_ms, device_layout_ms). */
  readonly jpeg_on_gpu: boolean;
  readonly compute_buffers_mib: Readonly<Record<string, number>>;
  readonly unsupported_ops: readonly string[];
  readonly batchable: boolean;
  readonly profile?: {
    readonly mode: 'phases' | 'ops';
    /** Graph build, allocation and input upload, before the first node finished. */
    readonly setup_ms_p50: number;
    /** Graph compute and output read-back. */
    readonly compute_ms_p50: number;
    /** 'ops': the last encode's time per op type, largest first. */
    readonly ops?: readonly { op: string; ms: number; count: number; on_host: number }[];
  };
  /** percept's graph on every call, per phase: setup vs compute. Setup is build, layout and upload,
   * and compute includes the read-back. Build and layout run only when a shape is new or another shape
   * used the buffer last. The first encode's phases are what a shape's first frame pays. */
  readonly phases?: {
    readonly setup_ms: BenchPhase;
    readonly compute_ms: BenchPhase;
    readonly build_ms: BenchPhase;
    readonly alloc_ms: BenchPhase;
    readonly upload_ms: BenchPhase;
    readonly graph_compute_ms: BenchPhase;
    readonly read_ms: BenchPhase;
    /** With jpeg_on_gpu: nvJPEG's decode, and the kernel that resampled and laid it out within upload_ms. */
    readonly jpeg_decode_ms?: BenchPhase;
    readonly device_layout_ms?: BenchPhase;
    readonly first: { build_ms: number; alloc_ms: number; upload_ms: number; compute_ms: number; read_ms: number };
  };
  readonly batch?: {
    readonly images: number;
    readonly batched: boolean;
    readonly encode_ms_p50: number;
    readonly per_image_ms_p50: number;
  };
  /** --check with jpeg_on_gpu: the last frame's pixels and embeddings from the GPU path against the host
   * path's. Pixels differ by 8-bit levels: the two decoders match the JPEG standard's IDCT and chroma
   * upsampling only to about a level, and resize differently. */
  readonly jpeg_check?: {
    readonly max_level_diff: number;
    readonly mean_level_diff: number;
    readonly worst_token_cosine: number;
  };
  /** --check: the last frame through the other path on the same weights. The baseline to read it against
   * runs this path again with 1 input value in 97 moved by 1e-6. A randomly initialized tower amplifies
   * any difference far more than a trained one. */
  readonly check?: {
    readonly against: 'percept' | 'clip';
    readonly tokens: number;
    readonly worst_token_cosine: number;
    readonly nudged_worst_token_cosine: number;
  };
}

export type BenchEncodeResult = {
  readonly encoder: string;
  /** 'onnx' for onnxruntime-node or 'mtmd' for llama.cpp clip. */
  readonly runtime: 'onnx' | 'mtmd';
  readonly contract: 'gemma3' | 'gemma4';
  readonly ep: string;
  readonly image: string;
  readonly image_width: number;
  readonly image_height: number;
  readonly iterations: number;
  readonly image_tokens_budget: number | null;
  readonly tokens: number;
  readonly hidden: number;
  readonly load_ms: number;
  readonly first_encode_ms: number;
  /** libvips threads the preprocessing ran with. */
  readonly preprocess_threads: number;
  readonly preprocess_ms_p50: number;
  readonly preprocess_ms_p99: number;
  /** CPU time of the process during preprocessing, all threads together. Unlike wall time, it is not
   * stretched by other processes on a shared machine. */
  readonly preprocess_cpu_ms_p50: number;
  readonly encode_ms_p50: number;
  readonly encode_ms_p99: number;
  /** Time inside session.run() in the ORT worker, or inside clip_image_encode (encode_ms minus layout
   * conversion, transfer and messaging). */
  readonly run_ms_p50: number;
  readonly total_ms_p50: number;
  /** 1-minute load average at the end: how busy the machine was. */
  readonly load_average: number;
  /** mmproj only. */
  readonly clip?: BenchClipReport;
};

/** A deterministic 1280×720 test scene (gradients, edges, noise) as JPEG q85. */
async function syntheticJpeg(width = 1280, height = 720, quality = 85): Promise<Buffer> {
  const raw = Buffer.alloc(width * height * 3);
  let s = 12345;
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      s = (Math.imul(s, 1103515245) + 12345) >>> 0;
      const noise = (s >>> 24) & 15;
      const i = (y * width + x) * 3;
      raw[i] = ((x * 255) / width + noise) & 255;
      raw[i + 1] = ((y * 255) / height + noise) & 255;
      raw[i + 2] = (((x >> 5) ^ (y >> 5)) & 1) * 180 + noise;
    }
  }
  return sharp(raw, { raw: { width, height, channels: 3 } })
    .jpeg({ quality })
    .toBuffer();
}

/** The most frames --batch takes in one encode call. */
const MAX_BATCH = 64;

/** Milliseconds as reported: three decimals. */
const round = (x: number): number => Math.round(x * 1000) / 1000;

const benchContext = (imageTokens: number): StageContext =>
  standaloneContext({ frame: { sourceId: 'bench' }, knobs: { imageTokens, maxNewTokens: 0 } });

/** What the bench needs of either encoder stage. */
interface BenchedEncoder extends Stage<PixelTensor, ImageEmbedding> {
  readonly contract: { readonly kind: 'gemma3' | 'gemma4'; readonly imageSize?: number };
  stats(): { readonly lastRunMs: number; readonly lastProfile?: VisionProfile; readonly lastPhases?: VisionPhases };
  close(): Promise<void>;
}

export async function benchEncode(opts: BenchEncodeOptions): Promise<BenchEncodeResult> {
  if (typeof opts.encoder !== 'string' || !opts.encoder) throw new TypeError('bench encode: --encoder is required');
  const runtime = isMmprojSpec(opts.encoder) ? 'mtmd' : 'onnx';
  const { iterations, imageTokens } = opts;
  if (!Number.isInteger(iterations) || iterations < 1)
    throw new RangeError(`bench encode: iterations must be a positive integer, got ${iterations}`);
  const warmup = opts.warmup ?? 1;
  const ep = opts.ep as ExecutionProvider; // checked by the encoder stage
  if (runtime === 'mtmd' && ep !== 'cpu' && ep !== 'cuda')
    throw new RangeError(`bench encode: an mmproj runs on 'cpu' or 'cuda', got ep '${ep}'`);
  if (
    runtime === 'onnx' &&
    (opts.profile !== undefined || opts.flashAttention !== undefined || opts.batch !== undefined || opts.path !== undefined || opts.check)
  ) {
    throw new RangeError(
      'bench encode: --profile, --flash-attention, --batch, --path and --check are for the llama.cpp clip encoder (an mmproj)',
    );
  }
  if (opts.path !== undefined && opts.path !== 'percept' && opts.path !== 'clip')
    throw new RangeError(`bench encode: --path must be 'percept' or 'clip', got '${String(opts.path)}'`);
  if (opts.profile !== undefined && opts.profile !== 'phases' && opts.profile !== 'ops')
    throw new RangeError(`bench encode: --profile must be 'phases' or 'ops', got '${String(opts.profile)}'`);
  if (opts.batch !== undefined && !(Number.isInteger(opts.batch) && opts.batch >= 1 && opts.batch <= MAX_BATCH))
    throw new RangeError(`bench encode: --batch must be an integer in 1..${MAX_BATCH}, got ${opts.batch}`);
  const modelPath = await resolveModel(opts.encoder, runtime === 'mtmd' ? 'mmproj' : 'vision');

  let frame: CameraFrame;
  let imageName: string;
  if (opts.image) {
    const data = readFileSync(opts.image);
    const format = (await sharp(data).metadata()).format;
    if (format !== 'jpeg' && format !== 'png') throw new Error(`bench encode: ${opts.image} is ${format ?? 'unknown'}; use a JPEG or PNG`);
    frame = { encoding: format, data };
    imageName = opts.image;
  } else {
    frame = { encoding: 'jpeg', data: await syntheticJpeg() };
    imageName = 'synthetic 1280x720 jpeg q85';
  }
  const meta = await sharp(frame.data).metadata();

  const mtmdConfig = (graph: 'percept' | 'clip'): MtmdEncoderConfig => ({
    mmproj: modelPath,
    useGpu: ep === 'cuda',
    graph,
    ...(opts.threads !== undefined ? { threads: opts.threads } : {}),
    ...(opts.flashAttention !== undefined ? { flashAttention: opts.flashAttention } : {}),
    ...(opts.profile !== undefined ? { profile: opts.profile } : {}),
    ...(opts.pinnedPixels !== undefined ? { pinnedPixels: opts.pinnedPixels } : {}),
  });
  const t0 = performance.now();
  let encoder: BenchedEncoder;
  let mtmd: MtmdEncoderStage | undefined;
  if (runtime === 'mtmd') {
    const { createMtmdEncoderStage } = await import('../../nodes/encoder-mtmd.ts');
    encoder = mtmd = await createMtmdEncoderStage(mtmdConfig(opts.path ?? 'percept'));
  } else {
    encoder = await createOnnxEncoderStage({
      model: modelPath,
      ep,
      ...(opts.threads !== undefined ? { threads: opts.threads } : {}),
      ...(opts.allowSpinning !== undefined ? { allowSpinning: opts.allowSpinning } : {}),
    });
  }
  const loadMs = performance.now() - t0;
  try {
    // The config's preprocess section (its defaults from the schema), with --threads for libvips.
    const { preprocess: preprocessConfig } = loadConfig({ preprocess: opts.threads !== undefined ? { threads: opts.threads } : {} });
    // gemma3: the encoder's one input side, 896 for real towers.
    const { imageSize } = encoder.contract;
    const jpegDecode = opts.jpegDecode ?? preprocessConfig.jpegDecode;
    if (jpegDecode !== 'auto' && jpegDecode !== 'host')
      throw new RangeError(`bench encode: --jpeg-decode must be 'auto' or 'host', got '${String(jpegDecode)}'`);
    const preprocessFor = (jpegToEncoder: boolean) =>
      createPreprocessStage({
        contract: encoder.contract.kind,
        ...preprocessConfig,
        ...(imageSize ? { imageSize } : {}),
        ...(mtmd ? { allocate: mtmd.allocatePixels } : {}),
        ...(jpegToEncoder ? { jpegToEncoder } : {}),
      });
    const preprocess = preprocessFor(jpegDecode === 'auto' && mtmd?.decodesJpeg === true);
    const ctx = benchContext(imageTokens);
    const pre: number[] = [];
    const preCpu: number[] = [];
    const enc: number[] = [];
    const run: number[] = [];
    const profiles: VisionProfile[] = [];
    const phases: VisionPhases[] = [];
    let firstPhases: VisionPhases | undefined;
    let lastTensor: PixelTensor | undefined;
    let firstEncodeMs = Number.NaN;
    let tokens = 0;
    let hidden = 0;
    for (let i = 0; i < warmup + iterations; i++) {
      const cpu0 = process.cpuUsage();
      const a = performance.now();
      const tensor = await preprocess.process(frame, ctx);
      const b = performance.now();
      const cpu = process.cpuUsage(cpu0);
      // --check encodes the last frame again: a copy, as the stage hands its pixels back for reuse.
      if (opts.check && i === warmup + iterations - 1) lastTensor = { ...tensor, pixelValues: tensor.pixelValues.slice() };
      const emb = await encoder.process(tensor, ctx);
      const c = performance.now();
      tokens = emb.nTokens;
      hidden = emb.nEmbd;
      if (i === 0) {
        firstEncodeMs = c - b;
        firstPhases = encoder.stats().lastPhases;
      }
      if (i >= warmup) {
        const ph = encoder.stats().lastPhases;
        if (ph) phases.push(ph);
        pre.push(b - a);
        preCpu.push((cpu.user + cpu.system) / 1000);
        enc.push(c - b);
        run.push(encoder.stats().lastRunMs);
        const profile = encoder.stats().lastProfile;
        if (profile) profiles.push(profile);
      }
    }
    const clip = mtmd
      ? await clipReport(mtmd, profiles, phases, firstPhases, opts, warmup, () => preprocess.process(frame, ctx))
      : undefined;
    // The other path takes host pixels: a JPEG tensor is checked against the host path first.
    const jpegCheck =
      mtmd && lastTensor?.jpeg ? await checkJpegOnGpu(mtmd, lastTensor, await preprocessFor(false).process(frame, ctx), ctx) : undefined;
    const hostTensor = jpegCheck ? jpegCheck.hostTensor : lastTensor;
    const check =
      mtmd && hostTensor
        ? await checkAgainstOtherPath(mtmd, hostTensor, ctx, async (graph) => {
            const { createMtmdEncoderStage } = await import('../../nodes/encoder-mtmd.ts');
            return createMtmdEncoderStage(mtmdConfig(graph));
          })
        : undefined;
    return {
      encoder: modelPath,
      runtime,
      contract: encoder.contract.kind,
      ep,
      image: imageName,
      image_width: meta.width ?? 0,
      image_height: meta.height ?? 0,
      iterations,
      image_tokens_budget: encoder.contract.kind === 'gemma4' ? imageTokens : null,
      tokens,
      hidden,
      load_ms: round(loadMs),
      first_encode_ms: round(firstEncodeMs),
      preprocess_threads: preprocess.threads,
      preprocess_ms_p50: round(quantile(pre, 0.5)),
      preprocess_ms_p99: round(quantile(pre, 0.99)),
      preprocess_cpu_ms_p50: round(quantile(preCpu, 0.5)),
      encode_ms_p50: round(quantile(enc, 0.5)),
      encode_ms_p99: round(quantile(enc, 0.99)),
      run_ms_p50: round(quantile(run, 0.5)),
      total_ms_p50: round(
        quantile(
          pre.map((p, i) => p + enc[i]!),
          0.5,
        ),
      ),
      load_average: round(loadavg()[0]!),
      ...(clip ? { clip: { ...clip, ...(check ? { check } : {}), ...(jpegCheck ? { jpeg_check: jpegCheck.report } : {}) } } : {}),
    };
  } finally {
    await encoder.close();
  }
}

const phase = (xs: readonly number[]): BenchPhase => ({ p50: round(quantile(xs, 0.5)), p99: round(quantile(xs, 0.99)) });

/** The GPU path's pixels and embeddings for a JPEG tensor against the host path's for the same frame.
 * `host` is a copy kept for the next check. */
async function checkJpegOnGpu(
  stage: MtmdEncoderStage,
  tensor: PixelTensor,
  host: PixelTensor,
  ctx: StageContext,
): Promise<{ report: NonNullable<BenchClipReport['jpeg_check']>; hostTensor: PixelTensor }> {
  const devicePixels = await stage.jpegPixels(tensor);
  const hostPixels = host.pixelValues.subarray(0, devicePixels.length);
  // Both paths scale 8-bit values into floats by (v/255 − offset)/scale, so this scales back to levels.
  const perLevel = 1 / (255 * tensor.jpeg!.scale);
  let max = 0;
  let sum = 0;
  for (let i = 0; i < devicePixels.length; i++) {
    const d = Math.abs(devicePixels[i]! - hostPixels[i]!) / perLevel;
    max = Math.max(max, d);
    sum += d;
  }
  const hostTensor = { ...host, pixelValues: host.pixelValues.slice() };
  const gpu = await stage.process(tensor, ctx);
  const gpuCopy = { ...gpu, data: gpu.data.slice() };
  const viaHost = await stage.process(host, ctx);
  return {
    report: {
      max_level_diff: round(max),
      mean_level_diff: round(sum / devicePixels.length),
      worst_token_cosine: tokenCosines(gpuCopy, viaHost).reduce((m, v) => Math.min(m, v), 1),
    },
    hostTensor,
  };
}

/** The worst per-token cosine between `tensor`'s embeddings through the other path and the stage's own,
 * on the same weights. Also the stage's own on a nudged input, the tower's sensitivity. */
async function checkAgainstOtherPath(
  stage: MtmdEncoderStage,
  tensor: PixelTensor,
  ctx: StageContext,
  createOther: (graph: 'percept' | 'clip') => Promise<MtmdEncoderStage>,
): Promise<NonNullable<BenchClipReport['check']>> {
  const against = stage.info.graph === 'percept' ? 'clip' : 'percept';
  const other = await createOther(against);
  try {
    const copy = { ...tensor, pixelValues: tensor.pixelValues.slice() };
    const nudged = { ...tensor, pixelValues: tensor.pixelValues.map((v, i) => (i % 97 === 0 ? v + 1e-6 : v)) };
    const a = await stage.process(tensor, ctx);
    const own = { ...a, data: a.data.slice() };
    const b = await other.process(copy, ctx);
    const c = await stage.process(nudged, ctx);
    const worst = (x: ImageEmbedding, y: ImageEmbedding) => tokenCosines(x, y).reduce((m, v) => Math.min(m, v), 1);
    return { against, tokens: a.nTokens, worst_token_cosine: worst(own, b), nudged_worst_token_cosine: worst(own, c) };
  } finally {
    await other.close();
  }
}

async function clipReport(
  stage: MtmdEncoderStage,
  profiles: readonly VisionProfile[],
  phases: readonly VisionPhases[],
  first: VisionPhases | undefined,
  opts: BenchEncodeOptions,
  warmup: number,
  nextTensor: () => Promise<PixelTensor>,
): Promise<BenchClipReport> {
  const info = stage.info;
  const last = profiles.at(-1);
  let batch: BenchClipReport['batch'];
  if (opts.batch !== undefined) {
    const times: number[] = [];
    for (let i = 0; i < warmup + opts.iterations; i++) {
      const inputs = await Promise.all(Array.from({ length: opts.batch }, nextTensor));
      const t0 = performance.now();
      await stage.encodeBatch(inputs);
      if (i >= warmup) times.push(performance.now() - t0);
    }
    const p50 = quantile(times, 0.5);
    batch = {
      images: opts.batch,
      batched: info.batchable && opts.batch > 1,
      encode_ms_p50: round(p50),
      per_image_ms_p50: round(p50 / opts.batch),
    };
  }
  return {
    path: info.graph,
    graph_fallback: info.graphFallback,
    flash_attention: info.flashAttention,
    flash_attention_head: info.flashAttentionHead,
    attention_kernel: info.attentionKernel,
    head_size: info.hidden / info.heads,
    graph_splits: info.graphSplits,
    graph_nodes: info.graphNodes,
    copied_weights_mib: round(info.copiedWeightBytes / 2 ** 20),
    pinned_pixels: stage.allocatePixels(1) !== undefined,
    jpeg_on_gpu: phases.some((p) => p.jpegDecodeMs !== undefined),
    compute_buffers_mib: Object.fromEntries(info.computeBuffers.map((b) => [b.name, round(b.bytes / 2 ** 20)])),
    unsupported_ops: info.unsupportedOps,
    batchable: info.batchable,
    ...(opts.profile && profiles.length
      ? {
          profile: {
            mode: opts.profile,
            setup_ms_p50: round(
              quantile(
                profiles.map(({ setupMs }) => setupMs),
                0.5,
              ),
            ),
            compute_ms_p50: round(
              quantile(
                profiles.map(({ computeMs }) => computeMs),
                0.5,
              ),
            ),
            ...(last?.ops
              ? {
                  ops: [...last.ops]
                    .sort((a, b) => b.ms - a.ms)
                    .map((o) => ({ op: o.op, ms: round(o.ms), count: o.count, on_host: o.onHost })),
                }
              : {}),
          },
        }
      : {}),
    ...(phases.length
      ? {
          phases: {
            setup_ms: phase(phases.map((p) => p.buildMs + p.allocMs + p.uploadMs)),
            compute_ms: phase(phases.map((p) => p.computeMs + p.readMs)),
            build_ms: phase(phases.map((p) => p.buildMs)),
            alloc_ms: phase(phases.map((p) => p.allocMs)),
            upload_ms: phase(phases.map((p) => p.uploadMs)),
            graph_compute_ms: phase(phases.map((p) => p.computeMs)),
            read_ms: phase(phases.map((p) => p.readMs)),
            ...(phases.every((p) => p.jpegDecodeMs !== undefined)
              ? {
                  jpeg_decode_ms: phase(phases.map((p) => p.jpegDecodeMs ?? 0)),
                  device_layout_ms: phase(phases.map((p) => p.deviceLayoutMs ?? 0)),
                }
              : {}),
            first: {
              build_ms: round(first?.buildMs ?? 0),
              alloc_ms: round(first?.allocMs ?? 0),
              upload_ms: round(first?.uploadMs ?? 0),
              compute_ms: round(first?.computeMs ?? 0),
              read_ms: round(first?.readMs ?? 0),
            },
          },
        }
      : {}),
    ...(batch ? { batch } : {}),
  };
}
