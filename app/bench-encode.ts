// `percept bench encode`: preprocessing and vision-encoder latency, each timed on its own, per frame.
import { readFileSync } from 'node:fs';
import sharp from 'sharp';
import { createOnnxEncoderStage, type ExecutionProvider } from '../nodes/encoder-onnx.ts';
import { createPreprocessStage } from '../nodes/preprocess.ts';
import { isMmprojSpec, resolveModel } from '../models/resolve.ts';
import type { CameraFrame, ImageEmbedding, PixelTensor } from '../nodes/payloads.ts';
import type { Stage, StageContext } from '../pipeline/types.ts';
import { standaloneContext } from '../pipeline/standalone.ts';
import { quantile } from './stats.ts';

export interface BenchEncodeOptions {
  /** .onnx path or synth:<preset> (onnxruntime); .gguf mmproj or synth:<preset>-mmproj[@seed][?dtype=f16]
   * (llama.cpp clip through the native addon). */
  readonly encoder: string;
  /** ORT execution provider; for an mmproj, 'cuda' runs clip on the GPU backend. */
  readonly ep: ExecutionProvider | string;
  /** JPEG or PNG file; default a generated 1280×720 JPEG (q85). */
  readonly image?: string;
  /** Gemma 4 image-token budget. */
  readonly imageTokens: number;
  readonly iterations: number;
  readonly warmup?: number;
  /** ORT intra-op threads, or clip's CPU threads. */
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
  readonly preprocess_ms_p50: number;
  readonly preprocess_ms_p99: number;
  readonly encode_ms_p50: number;
  readonly encode_ms_p99: number;
  /** Time inside session.run() in the ORT worker, or inside clip_image_encode (encode_ms minus layout
   * conversion, transfer and messaging). */
  readonly run_ms_p50: number;
  readonly total_ms_p50: number;
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

const benchContext = (imageTokens: number): StageContext =>
  standaloneContext({ frame: { sourceId: 'bench' }, knobs: { imageTokens, maxNewTokens: 0 } });

/** What the bench needs of either encoder stage. */
interface BenchedEncoder extends Stage<PixelTensor, ImageEmbedding> {
  readonly contract: { readonly kind: 'gemma3' | 'gemma4' };
  stats(): { readonly lastRunMs: number };
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

  const t0 = performance.now();
  let encoder: BenchedEncoder;
  if (runtime === 'mtmd') {
    const { createMtmdEncoderStage } = await import('../nodes/encoder-mtmd.ts');
    encoder = await createMtmdEncoderStage({
      mmproj: modelPath,
      useGpu: ep === 'cuda',
      ...(opts.threads !== undefined ? { threads: opts.threads } : {}),
    });
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
    const preprocess = createPreprocessStage({ contract: encoder.contract.kind });
    const ctx = benchContext(imageTokens);
    const pre: number[] = [];
    const enc: number[] = [];
    const run: number[] = [];
    let firstEncodeMs = Number.NaN;
    let tokens = 0;
    let hidden = 0;
    for (let i = 0; i < warmup + iterations; i++) {
      const a = performance.now();
      const tensor = await preprocess.process(frame, ctx);
      const b = performance.now();
      const emb = await encoder.process(tensor, ctx);
      const c = performance.now();
      tokens = emb.nTokens;
      hidden = emb.nEmbd;
      if (i === 0) firstEncodeMs = c - b;
      if (i >= warmup) {
        pre.push(b - a);
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
      preprocess_ms_p50: round(quantile(pre, 0.5)),
      preprocess_ms_p99: round(quantile(pre, 0.99)),
      encode_ms_p50: round(quantile(enc, 0.5)),
      encode_ms_p99: round(quantile(enc, 0.99)),
      run_ms_p50: round(quantile(run, 0.5)),
      total_ms_p50: round(
        quantile(
          pre.map((p, i) => p + enc[i]!),
          0.5,
        ),
      ),
    };
  } finally {
    await encoder.close();
  }
}
