// `percept bench encode`: preprocessing and vision-encoder latency, each timed on its own, per frame.
import { readFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import sharp from 'sharp';
import { createOnnxEncoderStage, type ExecutionProvider } from '../nodes/encoder-onnx.ts';
import { createPreprocessStage } from '../nodes/preprocess.ts';
import { isMmprojSpec, resolveMmprojSpec } from '../models/mmproj-synth.ts';
import { resolveVisionSpec } from '../models/vision-synth.ts';
import type { CameraFrame, ImageEmbedding, PixelTensor } from '../nodes/payloads.ts';
import type { Stage, StageContext } from '../pipeline/types.ts';
import { standaloneContext } from '../pipeline/standalone.ts';

export interface BenchEncodeOptions {
  /** .onnx path or synth:<preset> (onnxruntime); .gguf mmproj or synth:<preset>-mmproj[@seed][?dtype=f16]
   * (llama.cpp clip through the native addon). */
  readonly encoder: string;
  /** ORT execution provider; for an mmproj, 'cuda' runs clip on the GPU backend. */
  readonly ep?: ExecutionProvider | string;
  /** JPEG or PNG file; default a generated 1280×720 JPEG (q85). */
  readonly image?: string;
  /** Gemma 4 image-token budget (default 280). */
  readonly imageTokens?: number;
  readonly iterations?: number;
  readonly warmup?: number;
  /** CPU threads for preprocessing (libvips) and for the encoder (ORT intra-op or clip threads). */
  readonly threads?: number;
  readonly allowSpinning?: boolean;
}

export type BenchEncodeResult = {
  readonly encoder: string;
  /** 'onnx' (onnxruntime-node) or 'mtmd' (llama.cpp clip). */
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
  /** CPU time of the process during preprocessing (all threads): what one core spends per frame,
   * unlike wall time, not stretched by other processes on a shared machine. */
  readonly preprocess_cpu_ms_p50: number;
  readonly encode_ms_p50: number;
  readonly encode_ms_p99: number;
  /** Time inside session.run() in the ORT worker, or inside clip_image_encode (encode_ms minus layout
   * conversion, transfer and messaging). */
  readonly run_ms_p50: number;
  readonly total_ms_p50: number;
  /** 1-minute load average at the end: how busy the machine was. */
  readonly load_average: number;
};

/** Nearest-rank quantile of a sample. */
export function quantile(values: readonly number[], q: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!;
}

/** A deterministic 1280×720 test scene (gradients, edges, noise) as JPEG q85. */
export async function syntheticJpeg(width = 1280, height = 720, quality = 85): Promise<Buffer> {
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
  return sharp(raw, { raw: { width, height, channels: 3 } }).jpeg({ quality }).toBuffer();
}

const benchContext = (imageTokens: number): StageContext => standaloneContext({ frame: { sourceId: 'bench' }, knobs: { imageTokens, maxNewTokens: 0 } });

/** What the bench needs of either encoder stage. */
interface BenchedEncoder extends Stage<PixelTensor, ImageEmbedding> {
  readonly contract: { readonly kind: 'gemma3' | 'gemma4' };
  stats(): { readonly lastRunMs: number };
  close(): Promise<void>;
}

export async function benchEncode(opts: BenchEncodeOptions): Promise<BenchEncodeResult> {
  if (typeof opts.encoder !== 'string' || !opts.encoder) throw new TypeError('bench encode: --encoder is required');
  const runtime = isMmprojSpec(opts.encoder) ? 'mtmd' : 'onnx';
  const iterations = opts.iterations ?? 20;
  if (!Number.isInteger(iterations) || iterations < 1) throw new RangeError(`bench encode: iterations must be a positive integer, got ${iterations}`);
  const warmup = opts.warmup ?? 1;
  const imageTokens = opts.imageTokens ?? 280;
  const ep = (opts.ep ?? 'cpu') as ExecutionProvider;
  if (runtime === 'mtmd' && ep !== 'cpu' && ep !== 'cuda') throw new RangeError(`bench encode: an mmproj runs on 'cpu' or 'cuda', got ep '${ep}'`);
  const modelPath = runtime === 'mtmd' ? await resolveMmprojSpec(opts.encoder) : resolveVisionSpec(opts.encoder);

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

  const t0 = performance.now();
  let encoder: BenchedEncoder;
  if (runtime === 'mtmd') {
    const { createMtmdEncoderStage } = await import('../nodes/encoder-mtmd.ts');
    encoder = await createMtmdEncoderStage({ mmproj: modelPath, useGpu: ep === 'cuda', ...(opts.threads !== undefined ? { threads: opts.threads } : {}) });
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
    const preprocess = createPreprocessStage({ contract: encoder.contract.kind, ...(opts.threads !== undefined ? { threads: opts.threads } : {}) });
    const ctx = benchContext(imageTokens);
    const pre: number[] = [];
    const preCpu: number[] = [];
    const enc: number[] = [];
    const run: number[] = [];
    let firstEncodeMs = Number.NaN;
    let tokens = 0;
    let hidden = 0;
    for (let i = 0; i < warmup + iterations; i++) {
      const cpu0 = process.cpuUsage();
      const a = performance.now();
      const tensor = await preprocess.process(frame, ctx);
      const b = performance.now();
      const cpu = process.cpuUsage(cpu0);
      const emb = await encoder.process(tensor, ctx);
      const c = performance.now();
      tokens = emb.nTokens;
      hidden = emb.nEmbd;
      if (i === 0) firstEncodeMs = c - b;
      if (i >= warmup) {
        pre.push(b - a);
        preCpu.push((cpu.user + cpu.system) / 1000);
        enc.push(c - b);
        run.push(encoder.stats().lastRunMs);
      }
    }
    const round = (x: number): number => Math.round(x * 1000) / 1000;
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
      total_ms_p50: round(quantile(pre.map((p, i) => p + enc[i]!), 0.5)),
      load_average: round(loadavg()[0]!),
    };
  } finally {
    await encoder.close();
  }
}

export interface BenchPreprocessOptions {
  readonly contract: 'gemma3' | 'gemma4';
  readonly image?: string;
  readonly imageTokens?: number;
  readonly iterations?: number;
  readonly kernel?: 'nearest' | 'linear' | 'cubic';
}

/** Preprocessing alone (no encoder): p50/p99 over `iterations` frames after 3 warm-ups. */
export async function benchPreprocess(opts: BenchPreprocessOptions): Promise<{ contract: string; kernel: string; image: string; tokens: number; ms_p50: number; ms_p99: number; ms_min: number; iterations: number }> {
  const iterations = opts.iterations ?? 50;
  const data = opts.image ? readFileSync(opts.image) : await syntheticJpeg();
  const format = (await sharp(data).metadata()).format;
  if (format !== 'jpeg' && format !== 'png') throw new Error(`bench preprocess: image is ${format ?? 'unknown'}; use a JPEG or PNG`);
  const stage = createPreprocessStage({ contract: opts.contract, ...(opts.kernel ? { kernel: opts.kernel } : {}) });
  const ctx = benchContext(opts.imageTokens ?? 280);
  const times: number[] = [];
  let tokens = 0;
  for (let i = 0; i < iterations + 3; i++) {
    const t0 = performance.now();
    const t = await stage.process({ encoding: format, data }, ctx);
    if (i >= 3) times.push(performance.now() - t0);
    tokens = t.imageTokens;
  }
  const round = (x: number): number => Math.round(x * 1000) / 1000;
  return {
    contract: opts.contract,
    kernel: opts.kernel ?? (opts.contract === 'gemma3' ? 'linear' : 'cubic'),
    image: opts.image ?? 'synthetic 1280x720 jpeg q85',
    tokens,
    ms_p50: round(quantile(times, 0.5)),
    ms_p99: round(quantile(times, 0.99)),
    ms_min: round(Math.min(...times)),
    iterations,
  };
}
