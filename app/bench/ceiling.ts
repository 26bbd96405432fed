// The engine's ceiling for `bench cameras`' own shape, measured in the same run, on the same model, settings and device.
// N cameras whose frames are P prompt positions (text and image rows) and whose actions take D decode steps:
// N prompts of P tokens are prefilled in large ubatches, then D decode steps of one token per camera,
// timed as llama-batched-bench times them (LlamaContext.measureCeiling: raw llama_decode, no sampling).
//   ceiling = N / (prefill(N×P) + D × step(N)), reported raw and capped by the offered rate (cameras × fps).
// With `peer`, llama-batched-bench from the same llama.cpp build measures the same shape too.
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { LlamaModel, defaultThreads } from '../../native/llama.ts';
import { ensurePeerProgram, perLayerEmbeddingsArgs } from '../../native/peers.ts';
import { median } from '../stats.ts';

const execFileAsync = promisify(execFile);

/** Tokens per ubatch of the ceiling's prefill at most: llama-bench's `-ub 4096`, at which the figures were taken. */
export const CEILING_UBATCH = 4096;

export interface CeilingShape {
  /** Decoder GGUF path (resolved). */
  readonly model: string;
  readonly gpuLayers: number;
  /** decoder.perLayerEmbeddingsOnGpu (null: when every layer is offloaded). */
  readonly perLayerEmbeddingsOnGpu: boolean | null;
  /** N: cameras, one sequence each. */
  readonly cameras: number;
  /** P: prompt positions of one frame, its image rows included. */
  readonly promptTokens: number;
  /** D: decode steps of one action after its prompt (a sampled token with its forced run is one). */
  readonly actionSteps: number;
  /** Tokens of one action, forced ones included: reported, not timed. */
  readonly actionTokens: number;
  /** cameras × fps: more actions than frames offered cannot be served. */
  readonly offeredPerS: number;
  /** The decoder's own context settings. */
  readonly nCtx: number;
  readonly kvType: 'f16' | 'q8_0';
  readonly kvUnified: boolean;
  readonly threads: number | null;
  readonly graphSlots: number | null;
  readonly shapeGraphs: boolean;
  /** Prefill ubatch at most (default CEILING_UBATCH); the context's is min(this, N×P). */
  readonly ubatch?: number;
  /** Timed runs, after one warm-up (default 3). */
  readonly repeats?: number;
  /** Also run llama-batched-bench on the same shape. */
  readonly peer?: boolean;
}

/** One measurement of the ceiling: its times and the actions per second they allow. */
export interface CeilingFigures {
  /** Median time to prefill every camera's prompt, N×P tokens. */
  readonly prefill_ms: number;
  /** Median time of one decode step of N sequences. */
  readonly step_ms: number;
  readonly prefill_tok_per_s: number;
  /** N / (prefill_ms + D × step_ms), per second. */
  readonly actions_per_s_uncapped: number;
  /** actions_per_s_uncapped, at most the offered rate. */
  readonly actions_per_s: number;
}

export interface EngineCeiling extends CeilingFigures {
  readonly cameras: number;
  readonly prompt_tokens: number;
  readonly action_steps: number;
  readonly action_tokens: number;
  readonly offered_per_s: number;
  readonly ubatch: number;
  readonly repeats: number;
  /** Whether the per-layer embedding table went to the GPU (LlamaModel info); the peer's `-ot` puts it there too. */
  readonly per_layer_embeddings_on_gpu: boolean;
  /** llama-batched-bench on the same shape (`--peer`). */
  readonly peer?: CeilingFigures & { readonly program: 'llama-batched-bench' };
}

/** The formula: N actions per prefill of N×P tokens and D steps of N sequences. */
export function ceilingActionsPerS(cameras: number, prefillMs: number, stepMs: number, actionSteps: number): number {
  return (cameras * 1000) / (prefillMs + actionSteps * stepMs);
}

/** actions/s as a share of the capped ceiling; null without a ceiling. */
export function ceilingShare(actionsPerS: number, ceiling: number | null): number | null {
  return ceiling !== null && ceiling > 0 ? round(actionsPerS / ceiling) : null;
}

function figures(shape: CeilingShape, prefillMs: number, stepMs: number): CeilingFigures {
  const raw = ceilingActionsPerS(shape.cameras, prefillMs, stepMs, shape.actionSteps);
  return {
    prefill_ms: round(prefillMs),
    step_ms: round(stepMs),
    prefill_tok_per_s: round((shape.cameras * shape.promptTokens * 1000) / prefillMs),
    actions_per_s_uncapped: round(raw),
    actions_per_s: round(Math.min(raw, shape.offeredPerS)),
  };
}

export async function measureEngineCeiling(shape: CeilingShape): Promise<EngineCeiling> {
  const { cameras: n, promptTokens: p, actionSteps: d } = shape;
  if (!(Number.isInteger(p) && p >= 1 && Number.isInteger(d) && d >= 1))
    throw new RangeError(`ceiling: prompt tokens and action steps must be integers ≥ 1, got ${p} and ${d}`);
  if (shape.ubatch !== undefined && !(Number.isInteger(shape.ubatch) && shape.ubatch >= 1))
    throw new RangeError(`--ceiling-ubatch must be an integer ≥ 1, got ${shape.ubatch}`);
  const ubatch = Math.max(n, Math.min(shape.ubatch ?? CEILING_UBATCH, n * p));
  const repeats = shape.repeats ?? 3;
  const nCtx = Math.max(shape.nCtx, p + d);
  const model = await LlamaModel.load(shape.model, {
    gpuLayers: shape.gpuLayers,
    ...(shape.perLayerEmbeddingsOnGpu !== null ? { perLayerEmbeddingsOnGpu: shape.perLayerEmbeddingsOnGpu } : {}),
  });
  const perLayerEmbeddingsOnGpu = model.info.perLayerEmbeddingsOnGpu;
  let ours: CeilingFigures;
  try {
    const ctx = await model.createContext({
      nCtx,
      nBatch: ubatch,
      nUbatch: ubatch,
      kvType: shape.kvType,
      shapeGraphs: shape.shapeGraphs,
      ...(shape.graphSlots !== null ? { graphSlots: shape.graphSlots } : {}),
      ...(shape.threads !== null ? { threads: shape.threads } : {}),
      ...(n > 1 ? { nSeq: n, kvUnified: shape.kvUnified } : {}),
    });
    const times = await ctx.measureCeiling({ sequences: n, promptTokens: p, steps: d, repeats });
    await ctx.dispose();
    ours = figures(shape, median(times.prefillMs), median(times.decodeMs) / d);
  } finally {
    await model.dispose();
  }
  const peer = shape.peer ? await peerCeiling(shape, { nCtx, ubatch, repeats, perLayerEmbeddingsOnGpu }) : undefined;
  return {
    cameras: n,
    prompt_tokens: p,
    action_steps: d,
    action_tokens: round(shape.actionTokens),
    offered_per_s: round(shape.offeredPerS),
    ubatch,
    repeats,
    per_layer_embeddings_on_gpu: perLayerEmbeddingsOnGpu,
    ...ours,
    ...(peer ? { peer: { program: 'llama-batched-bench' as const, ...peer } } : {}),
  };
}

/** llama-batched-bench's jsonl row: seconds for N×P prefill tokens and for D steps of N sequences. */
interface PeerRow {
  readonly t_pp: number;
  readonly t_tg: number;
}

async function peerCeiling(
  shape: CeilingShape,
  { nCtx, ubatch, repeats, perLayerEmbeddingsOnGpu }: { nCtx: number; ubatch: number; repeats: number; perLayerEmbeddingsOnGpu: boolean },
): Promise<CeilingFigures> {
  const program = await ensurePeerProgram('llama-batched-bench', (msg) => process.stderr.write(`percept: ${msg}\n`));
  const n = shape.cameras;
  // The same shape `repeats` times: one row each.
  const args = ['-m', shape.model, '-c', String(nCtx * n), '-b', String(ubatch), '-ub', String(ubatch)];
  args.push('-npp', String(shape.promptTokens), '-ntg', String(shape.actionSteps), '-npl', Array(repeats).fill(n).join(','));
  args.push('-ngl', String(shape.gpuLayers), '-ctk', shape.kvType, '-ctv', shape.kvType, '--output-format', 'jsonl');
  if (shape.kvUnified) args.push('-kvu');
  args.push(...perLayerEmbeddingsArgs(perLayerEmbeddingsOnGpu));
  args.push('-t', String(shape.threads ?? defaultThreads())); // the binding's default, not llama.cpp's
  const { stdout, stderr } = await execFileAsync(program, args, { maxBuffer: 16 << 20 });
  const rows = `${stdout}\n${stderr}`
    .split('\n')
    .filter((l) => l.startsWith('{') && l.includes('"t_pp"'))
    .map((l) => JSON.parse(l) as PeerRow);
  if (rows.length === 0) throw new Error(`llama-batched-bench printed no result row: ${stderr.slice(-400)}`);
  return figures(shape, median(rows.map((r) => r.t_pp * 1000)), median(rows.map((r) => r.t_tg * 1000)) / shape.actionSteps);
}

const round = (x: number): number => Math.round(x * 1000) / 1000;
