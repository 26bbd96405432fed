// `percept bench remote`: what the HTTP path adds over the in-process binding.
// llama-server, built from the same llama.cpp tree, serves the same decoder and mmproj on loopback.
// Rounds of `bench frame` alternate between the arms in ABBA order, so load drift falls on both alike.
//
// Two measures: the end-to-end difference, remote − local, and the HTTP path's own cost.
// The first also holds the engines' differences, such as llama.cpp's grammar sampler against percept's token index.
// The second is the round trip less the server's own prefill and decode.
import { availableParallelism, loadavg } from 'node:os';
import { resolveModel } from '../../models/resolve.ts';
import { benchFrameSamples, decodeFigures, type DecodeFigures, type FrameSample } from './frame.ts';
import { startLlamaServer, type LlamaServer } from './llama-server.ts';
import { quantile } from '../stats.ts';

export interface BenchRemoteOptions {
  /** Decoder GGUF or `synth:` preset. */
  readonly model: string;
  /** The vision projector (mmproj GGUF or synth:…-mmproj), for both arms. */
  readonly encoder: string;
  readonly imageTokens: number;
  /** Frames per round and arm. */
  readonly frames: number;
  readonly rounds: number;
  readonly fps: number;
  readonly gpuLayers: number;
  /** llama-server threads. Default: all cores, as the binding uses. */
  readonly threads?: number;
  readonly maxNewTokens?: number;
}

type ArmSummary = DecodeFigures & {
  /** Pooled steady frames (each run's first left out). */
  readonly frames: number;
  readonly frame_to_action_ms_p50: number;
  readonly frame_to_action_ms_p99: number;
  /** Over all runs of the arm. Random weights often give invalid actions, dropped as 'invalid'. */
  readonly dropped: Readonly<Record<string, number>>;
  /** The drops by what their stages said, over all runs of the arm. */
  readonly drop_causes: Readonly<Record<string, number>>;
};

export interface BenchRemoteResult {
  readonly local: ArmSummary;
  readonly remote: ArmSummary;
  /** remote − local, frame → action (pooled frames). */
  readonly added_ms_p50: number;
  readonly added_ms_p99: number;
  /** The HTTP path alone, from llama-server's timings: round trip − server prefill − server decode. */
  readonly http_ms_p50: number | null;
  readonly http_ms_p99: number | null;
  readonly rounds: number;
  readonly frames_per_round: number;
  readonly image_tokens: number;
  readonly server_threads: number;
  readonly load_avg: readonly [number, number];
}

const SERVED_MODEL = 'percept-bench';
const round = (x: number): number => Math.round(x * 1000) / 1000;

export async function benchRemote(opts: BenchRemoteOptions): Promise<BenchRemoteResult> {
  if (!Number.isInteger(opts.rounds) || opts.rounds < 1) throw new RangeError(`--rounds must be an integer ≥ 1, got ${opts.rounds}`);
  const load0 = loadavg()[0]!;
  const threads = opts.threads ?? availableParallelism();
  // The server starts after the first local run, so its per-layer embedding table goes where the local decoder's went.
  let server: LlamaServer | undefined;
  let localPlacement = false;
  const startServer = async (): Promise<LlamaServer> =>
    startLlamaServer({
      model: await resolveModel(opts.model, 'decoder'),
      mmproj: await resolveModel(opts.encoder, 'mmproj'),
      alias: SERVED_MODEL,
      threads,
      gpuLayers: opts.gpuLayers,
      imageTokens: opts.imageTokens,
      perLayerEmbeddingsOnGpu: localPlacement,
    });
  const arms = { local: [] as FrameSample[], remote: [] as FrameSample[] };
  const dropped = { local: {} as Record<string, number>, remote: {} as Record<string, number> };
  const dropCauses = { local: {} as Record<string, number>, remote: {} as Record<string, number> };
  try {
    const common = { frames: opts.frames, fps: opts.fps, imageTokens: opts.imageTokens, gpuLayers: opts.gpuLayers, warmup: true };
    const max = opts.maxNewTokens !== undefined ? { maxNewTokens: opts.maxNewTokens } : {};
    const run = async (arm: 'local' | 'remote') => {
      if (arm === 'remote') server ??= await startServer();
      const { result, frames } = await benchFrameSamples(
        arm === 'local'
          ? { ...common, ...max, model: opts.model, encoder: opts.encoder }
          : { ...common, ...max, model: SERVED_MODEL, encoder: opts.encoder, decoder: 'openai', endpoint: server!.url },
      );
      if (arm === 'local') localPlacement = result.per_layer_embeddings_on_gpu ?? false;
      // The first frame of a run pays what the warm-up did not reach; the steady frames are compared.
      arms[arm].push(...frames.slice(1));
      for (const [reason, n] of Object.entries(result.dropped)) dropped[arm][reason] = (dropped[arm][reason] ?? 0) + n;
      for (const [cause, n] of Object.entries(result.drop_causes)) dropCauses[arm][cause] = (dropCauses[arm][cause] ?? 0) + n;
    };
    for (let r = 0; r < opts.rounds; r++) {
      const order: ('local' | 'remote')[] = r % 2 === 0 ? ['local', 'remote'] : ['remote', 'local'];
      for (const arm of order) await run(arm);
    }
  } finally {
    await server?.close();
  }
  const summarize = (arm: 'local' | 'remote'): ArmSummary => {
    const totals = arms[arm].map((f) => f.totalMs);
    return {
      frames: totals.length,
      frame_to_action_ms_p50: round(quantile(totals, 0.5)),
      frame_to_action_ms_p99: round(quantile(totals, 0.99)),
      ...decodeFigures(arms[arm]),
      dropped: dropped[arm],
      drop_causes: dropCauses[arm],
    };
  };
  const local = summarize('local');
  const remote = summarize('remote');
  return {
    local,
    remote,
    added_ms_p50: round(remote.frame_to_action_ms_p50 - local.frame_to_action_ms_p50),
    added_ms_p99: round(remote.frame_to_action_ms_p99 - local.frame_to_action_ms_p99),
    http_ms_p50: remote.http_ms_p50,
    http_ms_p99: remote.http_ms_p99,
    rounds: opts.rounds,
    frames_per_round: opts.frames,
    image_tokens: opts.imageTokens,
    server_threads: threads,
    load_avg: [round(load0), round(loadavg()[0]!)],
  };
}
