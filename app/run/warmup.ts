// Warm-up at load: synthetic camera frames go through preprocess → encode → decode for every distinct
// image-token count of the degradation ladder (a few passes each), the largest image first, so the first-call
// work of each stage is done before the first real frame: onnxruntime's arena and per-shape plans,
// clip's graph and compute buffers, llama.cpp's graph reservations for the prefill and decode batches,
// the grammar's first use. Decoding is asked to stay short (a few tokens; llama.cpp reserves its compute
// buffers for the largest batch when the context is made, so other batch sizes, drafted or not, need
// no warm-up of their own), but the decoder never stops short of a complete action when its grammar
// has a worst case, so there a warm-up decode runs to the action's end. It stops before the actions
// stage: a warm-up output is never validated or published.
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

/** New tokens asked of a warm-up generation: enough for the decode batch and a speculative draft round
 * (the decoder raises it to a complete action under a bounded action grammar). */
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
 * take 2–4× the steady time on CPU), and ggml's CUDA backend captures a CUDA graph on the second run
 * of an unchanged graph; the other stages are steady after one. */
const PASSES = 2;

/** Passes in a row that end the warm-up at the setting where frames start. A setting's first pass fills the
 * prompt cache, so the prompt a frame decodes (the cached prefix reused, a new image) is first seen on the
 * second pass, and ggml-cuda captures a CUDA graph the second time it sees a shape: on the third pass.
 * Measured on the H200 (E4B, CUDA graphs per step shape): with two passes of one image (the later ones
 * reusing the whole prompt) the first frame took 1.4–1.6× the median, its prefill 58–83 ms against 42. */
const START_PASSES = 3;

/** Distinct frames a warm-up takes in turn, pass by pass: the decoder keeps the last prompt in its KV
 * cache, so a pass with the last pass's image would reuse the whole prompt, a prefill no camera frame
 * gets; with a new image each pass prefills what a frame does. */
export const WARMUP_FRAMES = START_PASSES;

/**
 * Runs `frames` through `stages` (pass n of a setting takes frames[n % frames.length]), PASSES times per
 * knob setting. Settings that give the encoder the same tensor (Gemma 3's fixed 256 tokens) run once. The
 * ladder's first level (where frames start) ends the warm-up: START_PASSES in a row when it was warmed
 * last, else PASSES more after the others. Throws what a stage throws: a stage that cannot process a
 * synthetic frame would fail on the first real one. Returns the time of each stage's first pass per
 * setting.
 */
export async function warmUpStages(stages: WarmupStages, frames: readonly CameraFrame[], knobs: readonly Knobs[]): Promise<WarmupStep[]> {
  if (frames.length === 0) throw new RangeError('warmUpStages: no warm-up frame');
  /** Pass `n` of `k` through the stages. With `skip`, a tensor already in it is not encoded (undefined
   * is returned); the tensor's key is added. */
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
    // After other settings their prompt's shapes were each seen once already: PASSES more suffice.
    const first = lastKey === startKey ? PASSES : 0;
    for (let p = first; p < (lastKey === startKey ? START_PASSES : PASSES); p++) await pass(knobs[0]!, p);
  }
  return steps;
}
