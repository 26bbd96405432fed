// Warm-up at load: synthetic frames run preprocess → encode → decode at each distinct image-token count
// of the ladder, largest first. Each stage thus does its first-call work before the first real frame.
// Decodes stay short, since llama.cpp reserves buffers for the largest batch when the context is made.
// A warm-up stops before the actions stage, so its output is never validated or published.
import type { CameraFrame, ImageEmbedding, PixelTensor } from '../../nodes/payloads.ts';
import type { Knobs, Stage } from '../../pipeline/types.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';

/** The stages a warm-up frame goes through, in pipeline order. */
export interface WarmupStages {
  readonly preprocess: Stage<CameraFrame, PixelTensor>;
  readonly encode: Stage<PixelTensor, ImageEmbedding>;
  /** Absent: preprocess and encode only. */
  readonly decode?: Stage<ImageEmbedding, unknown>;
}

/** New tokens asked of a warm-up generation: enough for the decode batch and a speculative draft round.
 * Under a bounded action grammar the decoder raises it to a complete action. */
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

/** Passes per setting. An onnxruntime session settles its memory plan for a new input shape over two runs.
 * The ggml CUDA backend captures a graph on the second run of an unchanged graph. Other stages are steady after one. */
const PASSES = 2;

/** Passes at the starting setting. Pass 1 fills the prompt cache, pass 2 is the first real-shaped
 * prompt, pass 3 is the first that ggml-cuda replays from a captured graph. */
const START_PASSES = 3;

/** Distinct frames a warm-up takes in turn, one per pass. The decoder keeps the last prompt in its KV
 * cache, so a repeated image would reuse the whole prompt, as no camera frame does. */
export const WARMUP_FRAMES = START_PASSES;

/**
 * Runs `frames` through `stages` PASSES times per knob setting; pass n takes frames[n % frames.length].
 * Settings that give the encoder the same tensor run once (Gemma 3's fixed 256 tokens).
 * The ladder's first level, where frames start, ends the warm-up with START_PASSES passes in a row.
 * Throws what a stage throws, since a stage that fails on a synthetic frame would fail on a real one.
 * Returns the time of each stage's first pass per setting.
 */
export async function warmUpStages(stages: WarmupStages, frames: readonly CameraFrame[], knobs: readonly Knobs[]): Promise<WarmupStep[]> {
  if (frames.length === 0) throw new RangeError('warmUpStages: no warm-up frame');
  /** Pass `n` of `k` through the stages. With `skip`, a tensor already in it is not encoded and undefined
   * is returned. Otherwise the tensor's key is added. */
  const pass = async (k: Knobs, n: number, ms?: Record<string, number>, skip?: Set<string>): Promise<string | undefined> => {
    const ctx = standaloneContext({
      frame: { sourceId: 'warmup' },
      knobs: { ...k, maxNewTokens: Math.min(k.maxNewTokens, WARMUP_NEW_TOKENS) },
    });
    const timed = async <I, O>(stage: Stage<I, O>, input: I): Promise<O> => {
      const t0 = performance.now();
      const output = await stage.process(input, ctx);
      if (ms) ms[stage.name] = performance.now() - t0;
      return output;
    };
    const tensor = await timed(stages.preprocess, frames[n % frames.length]!);
    const key = `${tensor.pixelDims.join('x')}/${tensor.imageTokens}`;
    if (skip?.has(key)) {
      tensor.recycle?.(tensor.pixelValues);
      return undefined;
    }
    skip?.add(key);
    const embedding = await timed(stages.encode, tensor);
    if (stages.decode) await timed(stages.decode, embedding);
    return key;
  };
  const steps: WarmupStep[] = [];
  const warmed = new Set<string>();
  let startKey: string | undefined;
  let lastKey: string | undefined;
  for (const k of warmupKnobs(knobs)) {
    const ms: Record<string, number> = {};
    const key = await pass(k, 0, ms, warmed);
    if (key === undefined) continue;
    for (let p = 1; p < PASSES; p++) await pass(k, p);
    steps.push({ imageTokens: k.imageTokens, ms });
    if (k.imageTokens === knobs[0]?.imageTokens) startKey = key;
    lastKey = key;
  }
  if (startKey !== undefined) {
    // After other settings their prompt's shapes were each seen once already, so PASSES more suffice.
    const first = lastKey === startKey ? PASSES : 0;
    for (let p = first; p < (lastKey === startKey ? START_PASSES : PASSES); p++) await pass(knobs[0]!, p);
  }
  return steps;
}
