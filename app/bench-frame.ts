// `percept bench frame`: camera frame → validated action through the real stages (preprocess,
// encoder, decoder with the action grammar, validation), the publisher left out. Frames come from
// the test pattern at a rate the pipeline can follow, so latencies are service times, not queueing.
import { RealClock } from '../pipeline/clock.ts';
import { loadConfig } from '../pipeline/config.ts';
import { createGraph } from '../pipeline/graph.ts';
import { createSource, createStages } from './run.ts';

export interface BenchFrameOptions {
  /** Decoder GGUF or synth: preset. */
  readonly model: string;
  /** Vision encoder: an .onnx, an mmproj .gguf, or 'projection' (a stand-in with no model). */
  readonly encoder: string;
  readonly imageTokens?: number;
  readonly frames?: number;
  readonly fps?: number;
  readonly gpuLayers?: number;
  readonly maxNewTokens?: number;
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

export async function benchFrame(opts: BenchFrameOptions): Promise<BenchFrameResult> {
  const imageTokens = opts.imageTokens ?? 280;
  const encoder = opts.encoder === 'projection'
    ? { kind: 'projection' }
    : opts.encoder.endsWith('.gguf') || opts.encoder.startsWith('synth:') && opts.encoder.includes('mmproj')
      ? { kind: 'mtmd', mmproj: opts.encoder, gpuLayers: opts.gpuLayers ?? 0 }
      : { kind: 'onnx', model: opts.encoder };
  const maxNewTokens = opts.maxNewTokens ?? null;
  const config = loadConfig({
    source: { kind: 'pattern', fps: opts.fps ?? 2, frames: opts.frames ?? 20, width: 1280, height: 720 },
    encoder,
    decoder: { model: opts.model, gpuLayers: opts.gpuLayers ?? 0, maxNewTokens, draft: opts.draft ?? null, draftMtp: opts.draftMtp ?? null, ngram: opts.ngram ?? false },
    budgets: { endToEndMs: 60_000, stages: { preprocess: 10_000, encode: 30_000, decode: 30_000, actions: 1_000 }, dropPredictedMiss: false },
    edges: { default: { policy: 'queue', capacity: 64 } },
    ladder: { enabled: false, initial: { imageTokens, maxNewTokens: maxNewTokens ?? 65536, draft: true, frameSkip: 0 }, rungs: [] },
    telemetry: { liveTable: 'off' },
  });
  const source = await createSource(config.source);
  const stages = await createStages(config, { publish: false });
  const summary = await createGraph({ source, stages, clock: new RealClock(), config }).run();
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
