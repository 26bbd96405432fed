// `percept bench frame`: camera frame → validated action through the real stages (preprocess,
// encoder, decoder with the action grammar, validation), the publisher left out. Frames come from
// the test pattern at a rate the pipeline can follow, so latencies are service times, not queueing.
import { RealClock } from '../pipeline/clock.ts';
import { loadConfig } from '../pipeline/config.ts';
import { createGraph } from '../pipeline/graph/graph.ts';
import { isMmprojSpec } from '../models/resolve.ts';
import { loadActionSchema } from '../nodes/action-schema.ts';
import { createSource, createStages } from './run.ts';

export interface BenchFrameOptions {
  /** Decoder GGUF or synth: preset. */
  readonly model: string;
  /** Vision encoder: an .onnx, an mmproj .gguf, or 'projection' (a stand-in with no model). */
  readonly encoder: string;
  readonly imageTokens: number;
  readonly frames: number;
  readonly fps: number;
  readonly gpuLayers: number;
  readonly maxNewTokens: number;
  readonly draftMtp?: string;
  readonly draft?: string;
  readonly ngram?: boolean;
}

export interface BenchFrameResult {
  readonly frames_in: number;
  readonly frames_out: number;
  readonly dropped: Readonly<Record<string, number>>;
  readonly frame_to_action_ms_p50: number | null;
  readonly frame_to_action_ms_p99: number | null;
  readonly stages_ms_p50: Readonly<Record<string, number | null>>;
  readonly stages_ms_p99: Readonly<Record<string, number | null>>;
  readonly image_tokens: number;
}

/** A config's encoder section for an encoder named on the command line: 'projection' (no model), an
 * mmproj (.gguf, synth:…-mmproj), else an ONNX model. */
export function encoderSection(spec: string, gpuLayers: number): object {
  if (spec === 'projection') return { kind: 'projection' };
  if (isMmprojSpec(spec)) return { kind: 'mtmd', mmproj: spec, gpuLayers };
  return { kind: 'onnx', model: spec };
}

export async function benchFrame(opts: BenchFrameOptions): Promise<BenchFrameResult> {
  const { imageTokens, maxNewTokens, gpuLayers } = opts;
  const config = loadConfig({
    source: { kind: 'pattern', fps: opts.fps, frames: opts.frames, width: 1280, height: 720 },
    encoder: encoderSection(opts.encoder, gpuLayers),
    decoder: {
      model: opts.model,
      gpuLayers,
      maxNewTokens,
      draft: opts.draft ?? null,
      draftMtp: opts.draftMtp ?? null,
      ngram: opts.ngram ?? false,
    },
    budgets: {
      endToEndMs: 60_000,
      stages: { preprocess: 10_000, encode: 30_000, decode: 30_000, actions: 1_000 },
      dropPredictedMiss: false,
    },
    edges: { default: { policy: 'queue', capacity: 64 } },
    ladder: { enabled: false, initial: { imageTokens, maxNewTokens, draft: true, frameSkip: 0 }, rungs: [] },
    telemetry: { liveTable: 'off' },
  });
  const source = await createSource(config.source);
  const stages = await createStages(config, loadActionSchema(config.actions.schema), { publish: false });
  const summary = await createGraph({ source, stages: stages.chain, clock: new RealClock(), config }).run();
  const pick = (q: 'p50Ms' | 'p99Ms') => Object.fromEntries(Object.entries(summary.stages).map(([name, s]) => [name, s[q]]));
  return {
    frames_in: summary.frames.in,
    frames_out: summary.frames.out,
    dropped: summary.drops.byReason as Record<string, number>,
    frame_to_action_ms_p50: summary.endToEnd.p50Ms,
    frame_to_action_ms_p99: summary.endToEnd.p99Ms,
    stages_ms_p50: pick('p50Ms'),
    stages_ms_p99: pick('p99Ms'),
    image_tokens: imageTokens,
  };
}
