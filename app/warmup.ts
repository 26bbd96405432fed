// Warm-up at load: a synthetic camera frame goes through preprocess → encode → decode once for every
// distinct image-token count of the degradation ladder, the largest image first,
// so the first-call work of each stage is done before the first real frame: onnxruntime's arena and
// per-shape plans, clip's graph and compute buffers, llama.cpp's graph reservations for the prefill
// and decode batches, the grammar's first use, V8's compilation of the layout loops. Decoding is kept
// short (a few tokens; llama.cpp reserves its compute buffers for the largest batch when the context
// is made, so other batch sizes, drafted or not, need no warm-up of their own). It stops before the
// actions stage: a warm-up output is never validated or published.
import type { CameraFrame, PixelTensor } from '../nodes/payloads.ts';
import type { Knobs, Stage } from '../pipeline/types.ts';
import { standaloneContext } from '../pipeline/standalone.ts';

/** The stages a warm-up frame goes through, in pipeline order. */
const WARMED = ['preprocess', 'encode', 'decode'];
/** New tokens per warm-up generation: enough for the decode batch and a speculative draft round. */
const WARMUP_NEW_TOKENS = 8;

export interface WarmupStep {
  readonly imageTokens: number;
  /** Stage name → the time of its warm-up call (ms). */
  readonly ms: Readonly<Record<string, number>>;
}

/** The knob settings to warm: the first level of each distinct image-token count, largest first. */
export function warmupKnobs(levels: readonly Knobs[]): Knobs[] {
  const seen = new Set<number>();
  const distinct = levels.filter((k) => !seen.has(k.imageTokens) && seen.add(k.imageTokens));
  return distinct.sort((a, b) => b.imageTokens - a.imageTokens);
}

/** Passes per setting: onnxruntime settles its memory plan for a new input shape over two runs (both
 * take 2–4× the steady time on CPU); the other stages are steady after one. */
const PASSES = 2;

/**
 * Runs `frame` through the leading preprocess/encode/decode stages of `stages`, PASSES times per knob
 * setting. Settings that give the encoder the same tensor (Gemma 3's fixed 256 tokens) run once.
 * Throws what a stage throws: a stage that cannot process a synthetic frame would fail on the first
 * real one. Returns the time of each stage's first pass per setting.
 */
export async function warmUpStages(stages: readonly Stage<never, unknown>[], frame: CameraFrame, knobs: readonly Knobs[]): Promise<WarmupStep[]> {
  const chain = [] as Stage<never, unknown>[];
  for (const s of stages) {
    if (!WARMED.includes(s.name)) break;
    chain.push(s);
  }
  const steps: WarmupStep[] = [];
  const seen = new Set<string>();
  settings: for (const k of warmupKnobs(knobs)) {
    const ctx = standaloneContext({ frame: { sourceId: 'warmup' }, knobs: { ...k, maxNewTokens: Math.min(k.maxNewTokens, WARMUP_NEW_TOKENS) } });
    const ms: Record<string, number> = {};
    for (let pass = 0; pass < PASSES; pass++) {
      let value: unknown = frame;
      for (const stage of chain) {
        const t0 = performance.now();
        value = await stage.process(value as never, ctx);
        if (pass === 0) ms[stage.name] = performance.now() - t0;
        if (pass === 0 && stage.name === 'preprocess') {
          const t = value as PixelTensor;
          const key = `${t.pixelDims.join('x')}/${t.imageTokens}`;
          if (seen.has(key)) {
            t.recycle?.(t.pixelValues);
            continue settings;
          }
          seen.add(key);
        }
      }
    }
    steps.push({ imageTokens: k.imageTokens, ms });
  }
  return steps;
}
