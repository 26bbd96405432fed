// `percept bench cameras`: N cameras at F frames per second each through the real stages, without the publisher.
// It reports per-camera latency, drops and deadline misses, and the aggregate actions and tokens per second.
// The cameras are test-pattern sources started together, like a synchronised rig whose frames arrive at once.
// That is the encoder's best case for batching and the decoder's worst case for bursts.
// Edges are 'latest' and the ladder is off. A frame that would miss its deadline is cancelled and counted.
// After the run, the engine's ceiling for the same shape is measured on the same model and device (ceiling.ts).
import { pbkdf2 } from 'node:crypto';
import { loadavg } from 'node:os';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { RealClock } from '../../pipeline/clock.ts';
import { cudaMatmuls, type CudaMatmuls } from '../../native/binding.ts';
import { defaultThreads, type TimeAccount } from '../../native/llama.ts';
import { loadConfig, type PerceptConfig } from '../../pipeline/config.ts';
import type { LatencyStats } from '../../pipeline/telemetry/events.ts';
import { loadActionSchema } from '../../nodes/action-schema.ts';
import type { CameraFrame } from '../../nodes/payloads.ts';
import type { FrameSource } from '../../pipeline/types.ts';
import { cudaGraphsWanted } from '../../nodes/decoder.ts';
import { resolveModel } from '../../models/resolve.ts';
import { ceilingShare, measureEngineCeiling, type EngineCeiling } from './ceiling.ts';
import { encoderSection } from './frame.ts';
import { asCamera, createCameraGroup, createCameraStages } from '../run/cameras.ts';
import { createSource } from '../run/stages.ts';
import { median, quantile } from '../stats.ts';

export interface BenchCamerasOptions {
  readonly cameras: number;
  readonly fps: number;
  /** Decoder GGUF or `synth:` preset. */
  readonly model: string;
  /** Vision encoder: an .onnx, an mmproj .gguf, or 'projection'. */
  readonly encoder: string;
  readonly gpuLayers: number;
  readonly seconds: number;
  readonly imageTokens: number;
  /** Each frame's deadline after capture (ms). */
  readonly budgetMs: number;
  /** One KV buffer for every camera. Default: the config's, true. */
  readonly kvUnified?: boolean;
  /** llama.cpp's CPU threads for the decoder (decoder.threads). Default: every core. */
  readonly threads?: number;
  /** decoder.perLayerEmbeddingsOnGpu, 'on' or 'off'. Default: the config's, on when every layer is offloaded. */
  readonly perLayerEmbeddingsOnGpu?: 'on' | 'off';
  /** Drop a frame before preprocess when the decoder predicts it misses (default true, the config's). */
  readonly dropPredictedMiss?: boolean;
  /** Drop a frame before preprocess when a newer one of its camera would replace it at decode anyway (default true, the config's). */
  readonly dropPredictedConflation?: boolean;
  readonly prefillChunk?: number;
  /** batching.admit: 'together' (the default), 'rolling', 'adaptive' or 'each'. */
  readonly admit?: 'together' | 'rolling' | 'adaptive' | 'each';
  readonly maxActive?: number;
  /** batching.lanes: contexts the cameras are spread over (default 1, the config's). */
  readonly lanes?: number;
  readonly encodeWaitMs?: number;
  /** batching.groupWaitMs: how long an idle decoder holds a group for frames on their way. */
  readonly groupWaitMs?: number;
  /** batching.rollingJoin: with admit rolling, the fewest waiting frames that join a group's tail. */
  readonly rollingJoin?: number;
  /** batching.joinRunning, 'on' or 'off': a frame that would miss waiting for the running group joins it at once. Default: the config's (on). */
  readonly joinRunning?: 'on' | 'off';
  /** batching.stepRows: every token decode has a row per camera, its rows padded to a multiple of this (0: off). */
  readonly stepRows?: number;
  /** batching.mixSteps, 'on' or 'off': a step's causal image rows and its token rows in one decode. Default: the config's (off). */
  readonly mixSteps?: 'on' | 'off';
  /** Decode the grammar's forced runs in the step that reaches them (default true, the config's). */
  readonly jumpForward?: boolean;
  /** decoder.stepTokens, tokens per camera and decode step, padded. Default: the config's, where 1 means no padding. */
  readonly stepTokens?: number;
  /** Measure the engine's ceiling for the run's shape after it (default true). */
  readonly ceiling?: boolean;
  /** Prefill ubatch of the ceiling at most (default CEILING_UBATCH). */
  readonly ceilingUbatch?: number;
  /** Also measure the ceiling with llama-batched-bench from the same llama.cpp build. */
  readonly peer?: boolean;
}

export interface CameraBenchRow {
  readonly frames_in: number;
  readonly frames_out: number;
  readonly dropped: Readonly<Record<string, number>>;
  readonly deadline_misses: number;
  readonly e2e_ms_p50: number | null;
  readonly e2e_ms_p99: number | null;
  readonly decode_ms_p50: number | null;
  readonly decode_ms_p99: number | null;
  /** Each stage's p50 for this camera, and where its frames were dropped. With many cameras, it shows
   * whether some cameras reach the shared encoder or decoder later than others. */
  readonly stages_ms_p50: Readonly<Record<string, number | null>>;
  readonly dropped_by_stage: Readonly<Record<string, Record<string, number>>>;
}

export interface BenchCamerasResult {
  readonly cameras: number;
  readonly fps: number;
  readonly seconds: number;
  readonly image_tokens: number;
  readonly budget_ms: number;
  readonly per_camera: Readonly<Record<string, CameraBenchRow>>;
  /** The worst camera's p99 (what the goal is stated on). */
  readonly per_camera_p99_ms_max: number | null;
  /** How evenly the actions went to the cameras, as Jain's index of their action counts (jainIndex).
   * It is 1 when every camera got as many and 1/n when one camera got them all. Null without actions. */
  readonly fairness: number | null;
  readonly e2e_ms_p50: number | null;
  readonly e2e_ms_p99: number | null;
  readonly frames_in: number;
  readonly frames_out: number;
  readonly actions_per_s: number;
  /** Tokens generated per second over all cameras (cancelled frames' tokens included). */
  readonly tokens_per_s: number;
  /** What the engine can serve of this shape: N / (prefill of N×P tokens + D steps of N sequences), at most
   * cameras × fps (ceiling.ts). Null when not measured, or when no frame completed to give P and D. */
  readonly ceiling_actions_per_s: number | null;
  /** The same, not capped by the offered rate. */
  readonly ceiling_actions_per_s_uncapped: number | null;
  /** actions_per_s / ceiling_actions_per_s. */
  readonly ceiling_share: number | null;
  /** The ceiling's shape and times (and llama-batched-bench's, with --peer). */
  readonly ceiling: EngineCeiling | null;
  /** Frames dropped at each stage's entry or in it, by reason. A predicted miss before preprocess
   * saves the encoder and decoder work, one in decode only the decode. */
  readonly dropped_by_stage: Readonly<Record<string, Readonly<Record<string, number>>>>;
  readonly stages_ms_p50: Readonly<Record<string, number | null>>;
  readonly stages_ms_p99: Readonly<Record<string, number | null>>;
  /** The share of decode steps, over every frame, that ran on llama.cpp's previous graph. An unchanged
   * ubatch shape needs no graph build, and on CUDA the captured graph replays. */
  readonly decode_graph_reuse: number | null;
  /** Sequences that shared a decode step, per frame: mean and most. */
  readonly decode_batch_mean: number | null;
  readonly decode_batch_max: number;
  /** How the frames that reached the decoder ended. They completed with an action or another natural stop,
   * or were dropped before their prefill as predicted misses. Otherwise they were cut at their deadline or
   * cancelled after admission, which wastes their prefills and generated tokens. */
  readonly decode_outcomes: { completed: number; predicted_miss: number; deadline: number; cancelled: number };
  readonly decode_wasted: { prefills: number; tokens: number };
  /** Stage runs cut short, per stage and reason. */
  readonly cancels: Readonly<Record<string, Readonly<Record<string, number>>>>;
  /** Where the shared decoder's time went over the run (ms; null: not measured). `wall` is the run's; `steps` its decode
   * steps, of which `image_decode` and `token_decode` (llama_decode to synchronize), `sample` after them, and
   * `other_in_step` (planning, grammar); `hold` its holds for frames on their way; `idle` the rest, with no request to run.
   * With lanes, every time but `wall` is summed over them (lane-ms), and `idle` is of `wall` × lanes. */
  readonly decoder_time_ms: DecoderTime | null;
  /** llama_decode calls after the prompt per completed action (the ceiling takes their mean). A group in lockstep
   * runs as long as its longest member. Null without a completed action. */
  readonly action_steps: { readonly p50: number; readonly p90: number; readonly max: number } | null;
  /** The time the shared encoder's calls took over the run (ms). On one GPU they compete with the decoder's steps. */
  readonly encoder_busy_ms: number;
  /** Encoder calls and the frames they took (warm-up included). */
  readonly encoder_calls: number;
  readonly encoder_frames: number;
  readonly encoder_batch_max: number;
  readonly kv_unified: boolean;
  /** llama.cpp's CPU threads for the decoder: decoder.threads, or every core. */
  readonly decoder_threads: number;
  /** Whether the decoder's per-layer embedding table is on the GPU (decoder.perLayerEmbeddingsOnGpu; null: a remote decoder). */
  readonly per_layer_embeddings_on_gpu: boolean | null;
  /** The decoder's quantized-matmul paths on a CUDA build (docs/gpu.md). */
  readonly cuda_matmuls: CudaMatmuls;
  readonly drop_predicted_miss: boolean;
  readonly drop_predicted_conflation: boolean;
  /** batching.admit: how arrivals joined the decoder. */
  readonly admit: 'together' | 'rolling' | 'adaptive' | 'each';
  /** batching.lanes: the contexts the cameras were spread over. */
  readonly lanes: number;
  readonly group_wait_ms: number;
  /** batching.rollingJoin (used with admit rolling). */
  readonly rolling_join: number;
  /** batching.joinRunning: whether a frame that would miss waiting for the running group joined it at once. */
  readonly join_running: boolean;
  /** batching.stepRows (0: token decodes unpadded). */
  readonly step_rows: number;
  /** batching.mixSteps: whether a step's causal image rows could carry its token rows (decoder_time_ms.mixed_decodes). */
  readonly mix_steps: boolean;
  readonly prefill_chunk: number;
  /** Where the host side waits: the JS thread's busy fraction and its worst delays. Also how long a
   * job on libuv's pool (sharp, the layout pass) took to come back, probed every 50 ms. */
  readonly host: HostLoad;
}

export interface DecoderTime {
  readonly wall: number;
  readonly steps: number;
  readonly step_count: number;
  /** Admissions into an idle decoder: admitting together, the groups. */
  readonly groups: number;
  /** Frames admitted beside a running group, by any rule: with admit together, those that would miss waiting. */
  readonly joins: number;
  readonly image_decode: number;
  readonly token_decode: number;
  readonly sample: number;
  readonly other_in_step: number;
  readonly hold: number;
  readonly idle: number;
  /** Image decodes, and their mean time (ms) and rows. */
  readonly image_decodes: number;
  readonly image_decode_mean: number | null;
  readonly image_rows_mean: number | null;
  /** Token decodes, their mean rows and the sequences each covered. */
  readonly token_decodes: number;
  readonly token_rows_mean: number | null;
  readonly token_seqs_mean: number | null;
  /** Token decodes on llama.cpp's previous graph, and the mean time (ms) of those and of the ones built anew. */
  readonly token_reused: number;
  readonly token_reused_mean: number | null;
  readonly token_built_mean: number | null;
  /** Image decodes that carried the step's token rows too (mix_steps; counted in image_decodes), and their mean token rows. */
  readonly mixed_decodes: number;
  readonly mixed_token_rows_mean: number | null;
  /** admit adaptive: admissions beside a running group's tail, and steps that held waiting frames for its end. */
  readonly tail_joins: number;
  readonly tail_holds: number;
}

/** The decoder's time over a run from its scheduler's accounts at the start and the end, and the run's wall time. */
function decoderTimeOver(start: TimeAccount | null, end: TimeAccount | null, wallMs: number, lanes: number): DecoderTime | null {
  if (!start || !end) return null;
  const r = (x: number): number => Math.round(x * 10) / 10;
  const d = (k: keyof TimeAccount): number => end[k] - start[k];
  const steps = d('stepMs');
  const per = (total: number, count: number): number | null => (count > 0 ? r(total / count) : null);
  return {
    wall: r(wallMs),
    steps: r(steps),
    step_count: d('steps'),
    groups: d('groups'),
    joins: d('joins'),
    image_decode: r(d('imageMs')),
    token_decode: r(d('tokenMs')),
    sample: r(d('sampleMs')),
    other_in_step: r(steps - d('imageMs') - d('tokenMs') - d('sampleMs')),
    hold: r(d('holdMs')),
    idle: r(Math.max(0, wallMs * lanes - steps - d('holdMs'))),
    image_decodes: d('imageDecodes'),
    image_decode_mean: per(d('imageMs'), d('imageDecodes')),
    image_rows_mean: per(d('imageRows'), d('imageDecodes')),
    token_decodes: d('tokenDecodes'),
    token_rows_mean: per(d('tokenRows'), d('tokenDecodes')),
    token_seqs_mean: per(d('tokenSeqs'), d('tokenDecodes')),
    token_reused: d('reusedDecodes'),
    token_reused_mean: per(d('reusedMs'), d('reusedDecodes')),
    token_built_mean: per(d('tokenMs') - d('reusedMs'), d('tokenDecodes') - d('reusedDecodes')),
    mixed_decodes: d('mixedDecodes'),
    mixed_token_rows_mean: per(d('mixedTokenRows'), d('mixedDecodes')),
    tail_joins: d('tailJoins'),
    tail_holds: d('tailHolds'),
  };
}

function actionSteps(actions: readonly { steps: number }[]): BenchCamerasResult['action_steps'] {
  if (actions.length === 0) return null;
  const steps = actions.map((a) => a.steps);
  return { p50: quantile(steps, 0.5), p90: quantile(steps, 0.9), max: Math.max(...steps) };
}

/** Jain's fairness index of `shares`, `(Σx)² / (n·Σx²)`. Null when every share is 0 or there is none. */
export function jainIndex(shares: readonly number[]): number | null {
  const sum = shares.reduce((a, b) => a + b, 0);
  const squares = shares.reduce((a, b) => a + b * b, 0);
  return squares > 0 ? Math.round(((sum * sum) / (shares.length * squares)) * 1000) / 1000 : null;
}

export interface HostLoad {
  readonly event_loop_utilization: number;
  readonly event_loop_delay_ms_p99: number;
  readonly pool_job_ms_p50: number | null;
  readonly pool_job_ms_p99: number | null;
  readonly loadavg: { readonly start: number[]; readonly end: number[] };
}

/** Measures the host load from now until the returned function is called. */
function watchHost(everyMs = 50): () => HostLoad {
  const start = loadavg();
  const elu = performance.eventLoopUtilization();
  const delay = monitorEventLoopDelay({ resolution: 10 });
  delay.enable();
  const poolMs: number[] = [];
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  const probe = (): void => {
    const t0 = performance.now();
    // One PBKDF2 iteration is almost no work on a pool thread, so the time is the wait for one.
    pbkdf2('p', 's', 1, 8, 'sha256', () => {
      poolMs.push(performance.now() - t0);
      if (!stopped) timer = setTimeout(probe, everyMs);
    });
  };
  probe();
  return () => {
    stopped = true;
    clearTimeout(timer);
    delay.disable();
    const r = (x: number): number => Math.round(x * 1000) / 1000;
    return {
      event_loop_utilization: r(performance.eventLoopUtilization(elu).utilization),
      event_loop_delay_ms_p99: r(delay.percentile(99) / 1e6),
      pool_job_ms_p50: poolMs.length ? r(quantile(poolMs, 0.5)) : null,
      pool_job_ms_p99: poolMs.length ? r(quantile(poolMs, 0.99)) : null,
      loadavg: { start, end: loadavg() },
    };
  };
}

const p = (s: LatencyStats | undefined, q: 'p50Ms' | 'p99Ms'): number | null => s?.[q] ?? null;

export async function benchCameras(opts: BenchCamerasOptions): Promise<BenchCamerasResult> {
  const { cameras: n, fps, seconds, imageTokens, budgetMs, gpuLayers } = opts;
  if (!(Number.isInteger(n) && n >= 1 && n <= 256)) throw new RangeError(`--cameras must be an integer in [1, 256], got ${n}`);
  if (opts.ceilingUbatch !== undefined && !(Number.isInteger(opts.ceilingUbatch) && opts.ceilingUbatch >= 1))
    throw new RangeError(`--ceiling-ubatch must be an integer ≥ 1, got ${opts.ceilingUbatch}`);
  const frames = Math.max(1, Math.round(fps * seconds));
  const config = loadConfig({
    cameras: Array.from({ length: n }, (_, i) => ({
      id: `cam${i}`,
      source: { kind: 'pattern', fps, frames, width: 1280, height: 720 },
    })),
    encoder: encoderSection(opts.encoder, gpuLayers),
    decoder: {
      model: opts.model,
      gpuLayers,
      ...(opts.threads !== undefined ? { threads: opts.threads } : {}),
      ...(opts.perLayerEmbeddingsOnGpu !== undefined ? { perLayerEmbeddingsOnGpu: opts.perLayerEmbeddingsOnGpu === 'on' } : {}),
      ...(opts.jumpForward !== undefined ? { jumpForward: opts.jumpForward } : {}),
      ...(opts.stepTokens !== undefined ? { stepTokens: opts.stepTokens } : {}),
    },
    budgets: {
      endToEndMs: budgetMs,
      stages: {},
      ...(opts.dropPredictedMiss !== undefined ? { dropPredictedMiss: opts.dropPredictedMiss } : {}),
      ...(opts.dropPredictedConflation !== undefined ? { dropPredictedConflation: opts.dropPredictedConflation } : {}),
    },
    edges: { default: { policy: 'latest' } },
    ladder: { enabled: false, initial: { imageTokens }, rungs: [] },
    batching: {
      ...(opts.kvUnified !== undefined ? { kvUnified: opts.kvUnified } : {}),
      ...(opts.prefillChunk !== undefined ? { prefillChunk: opts.prefillChunk } : {}),
      ...(opts.admit !== undefined ? { admit: opts.admit } : {}),
      ...(opts.maxActive !== undefined ? { decodeMaxActive: opts.maxActive } : {}),
      ...(opts.lanes !== undefined ? { lanes: opts.lanes } : {}),
      ...(opts.encodeWaitMs !== undefined ? { encodeWaitMs: opts.encodeWaitMs } : {}),
      ...(opts.groupWaitMs !== undefined ? { groupWaitMs: opts.groupWaitMs } : {}),
      ...(opts.rollingJoin !== undefined ? { rollingJoin: opts.rollingJoin } : {}),
      ...(opts.joinRunning !== undefined ? { joinRunning: opts.joinRunning === 'on' } : {}),
      ...(opts.stepRows !== undefined ? { stepRows: opts.stepRows } : {}),
      ...(opts.mixSteps !== undefined ? { mixSteps: opts.mixSteps === 'on' } : {}),
    },
    telemetry: { liveTable: 'off' },
  });
  const sources: FrameSource<CameraFrame>[] = [];
  for (const camera of config.cameras!) sources.push(asCamera(await createSource(camera.source, config.preprocess.maxPixels), camera.id));
  const stages = await createCameraStages(config, loadActionSchema(config.actions.schema), { publish: false });
  const group = createCameraGroup(config, sources, stages, new RealClock());
  let tokens = 0;
  let steps = 0;
  let graphReuses = 0;
  const batchSizes: number[] = [];
  const outcomes = { completed: 0, predicted_miss: 0, deadline: 0, cancelled: 0 };
  let wastedTokens = 0;
  let wastedPrefills = 0;
  // The ceiling's shape: positions each decoded frame prefilled, and each completed action's steps and tokens.
  const prefilledPositions: number[] = [];
  const actions: { steps: number; tokens: number }[] = [];
  group.events.subscribe((event) => {
    if (event.type !== 'note' || event.message !== 'decode' || !event.data) return;
    const stop = event.data.stopReason;
    if (event.data.predictedMiss === true) outcomes.predicted_miss += 1;
    else if (stop === 'deadline' || stop === 'cancelled') {
      outcomes[stop] += 1;
      wastedTokens += Number(event.data.tokens ?? 0);
      if (Number(event.data.prefillMs ?? 0) > 0) wastedPrefills += 1;
    } else {
      outcomes.completed += 1;
      // Its llama_decode calls after the prompt: a sampled token with its forced run is one.
      if (typeof event.data.decodeCalls !== 'number')
        throw new Error(`bench cameras: a completed decode note has no decodeCalls (frame ${event.frameId})`);
      actions.push({ steps: event.data.decodeCalls, tokens: Number(event.data.tokens ?? 0) });
    }
    const prefilled = Number(event.data.promptTokens ?? 0) - Number(event.data.reusedTokens ?? 0);
    if (event.data.predictedMiss !== true && prefilled > 0) prefilledPositions.push(prefilled);
    tokens += Number(event.data.tokens ?? 0);
    steps += Number(event.data.steps ?? 0);
    graphReuses += Number(event.data.graphReuses ?? 0);
    if (typeof event.data.peakSeqs === 'number') batchSizes.push(event.data.peakSeqs);
  });
  const stopWatching = watchHost();
  const timeAtStart = stages.decoderTime();
  const encoderAtStart = stages.encoderStats().busyMs;
  const summary = await group.run();
  const timeAtEnd = stages.decoderTime();
  const host = stopWatching();
  const durationS = summary.durationMs / 1000;
  const perCamera: Record<string, CameraBenchRow> = {};
  for (const [id, s] of Object.entries(summary.cameras ?? {})) {
    perCamera[id] = {
      frames_in: s.frames.in,
      frames_out: s.frames.out,
      dropped: s.drops.byReason as Record<string, number>,
      deadline_misses: s.deadlineMisses,
      e2e_ms_p50: p(s.endToEnd, 'p50Ms'),
      e2e_ms_p99: p(s.endToEnd, 'p99Ms'),
      decode_ms_p50: p(s.stages.decode, 'p50Ms'),
      decode_ms_p99: p(s.stages.decode, 'p99Ms'),
      stages_ms_p50: Object.fromEntries(Object.entries(s.stages).map(([name, stage]) => [name, stage.p50Ms])),
      dropped_by_stage: s.drops.byStage as Record<string, Record<string, number>>,
    };
  }
  const p99s = Object.values(perCamera)
    .map((r) => r.e2e_ms_p99)
    .filter((x): x is number => x !== null);
  const pick = (q: 'p50Ms' | 'p99Ms') => Object.fromEntries(Object.entries(summary.stages).map(([name, s]) => [name, s[q]]));
  const enc = stages.encoderStats();
  const round = (x: number): number => Math.round(x * 1000) / 1000;
  const actionsPerS = durationS > 0 ? round(summary.frames.out / durationS) : 0;
  // The offered rate: cameras × fps, or what the sources sent over the run's duration where that is more.
  const offeredPerS = Math.max(n * fps, durationS > 0 ? summary.frames.in / durationS : 0);
  const ceiling = opts.ceiling === false ? null : await measureCeilingOf(config, n, offeredPerS, opts, prefilledPositions, actions);
  return {
    cameras: n,
    fps,
    seconds,
    image_tokens: imageTokens,
    budget_ms: budgetMs,
    per_camera: perCamera,
    per_camera_p99_ms_max: p99s.length === n ? Math.max(...p99s) : null,
    fairness: jainIndex(Object.values(perCamera).map((c) => c.frames_out)),
    e2e_ms_p50: p(summary.endToEnd, 'p50Ms'),
    e2e_ms_p99: p(summary.endToEnd, 'p99Ms'),
    frames_in: summary.frames.in,
    frames_out: summary.frames.out,
    actions_per_s: actionsPerS,
    tokens_per_s: durationS > 0 ? round(tokens / durationS) : 0,
    ceiling_actions_per_s: ceiling?.actions_per_s ?? null,
    ceiling_actions_per_s_uncapped: ceiling?.actions_per_s_uncapped ?? null,
    ceiling_share: ceilingShare(actionsPerS, ceiling?.actions_per_s ?? null),
    ceiling,
    dropped_by_stage: summary.drops.byStage as Record<string, Record<string, number>>,
    stages_ms_p50: pick('p50Ms'),
    stages_ms_p99: pick('p99Ms'),
    decode_graph_reuse: steps > 0 ? round(graphReuses / steps) : null,
    decode_batch_mean: batchSizes.length ? round(batchSizes.reduce((a, b) => a + b, 0) / batchSizes.length) : null,
    decode_batch_max: batchSizes.length ? Math.max(...batchSizes) : 0,
    decode_outcomes: outcomes,
    decode_wasted: { prefills: wastedPrefills, tokens: wastedTokens },
    cancels: summary.cancels as Record<string, Record<string, number>>,
    decoder_time_ms: decoderTimeOver(timeAtStart, timeAtEnd, summary.durationMs, config.batching.lanes),
    action_steps: actionSteps(actions),
    encoder_busy_ms: round(enc.busyMs - encoderAtStart),
    encoder_calls: enc.calls,
    encoder_frames: enc.frames,
    encoder_batch_max: enc.maxBatch,
    kv_unified: config.batching.kvUnified,
    decoder_threads: config.decoder.threads ?? defaultThreads(),
    per_layer_embeddings_on_gpu: stages.decoderModel?.perLayerEmbeddingsOnGpu ?? null,
    cuda_matmuls: cudaMatmuls(),
    drop_predicted_miss: config.cameras![0]!.budgets.dropPredictedMiss,
    drop_predicted_conflation: config.cameras![0]!.budgets.dropPredictedConflation,
    admit: config.batching.admit,
    lanes: config.batching.lanes,
    group_wait_ms: config.batching.groupWaitMs,
    rolling_join: config.batching.rollingJoin,
    join_running: config.batching.joinRunning,
    step_rows: config.batching.stepRows,
    mix_steps: config.batching.mixSteps,
    prefill_chunk: config.batching.prefillChunk,
    host,
  };
}

/** The engine's ceiling for the run's shape: P is the median positions a decoded frame prefilled (image rows
 * included; a prefix cached from the camera's previous frame is not prefilled again), D the mean decode
 * steps of a completed action, rounded up (at least 1). Null without a completed action. */
async function measureCeilingOf(
  config: PerceptConfig,
  cameras: number,
  offeredPerS: number,
  opts: BenchCamerasOptions,
  prefilledPositions: readonly number[],
  actions: readonly { steps: number; tokens: number }[],
): Promise<EngineCeiling | null> {
  const completed = actions.filter((a) => a.tokens > 0);
  if (prefilledPositions.length === 0 || completed.length === 0) return null;
  const mean = (pick: (a: { steps: number; tokens: number }) => number): number =>
    completed.reduce((sum, a) => sum + pick(a), 0) / completed.length;
  const { decoder } = config;
  return measureEngineCeiling({
    model: await resolveModel(decoder.model, 'decoder'),
    gpuLayers: decoder.gpuLayers,
    perLayerEmbeddingsOnGpu: decoder.perLayerEmbeddingsOnGpu,
    cameras,
    promptTokens: Math.round(median(prefilledPositions)),
    actionSteps: Math.max(1, Math.ceil(mean((a) => a.steps))),
    actionTokens: mean((a) => a.tokens),
    offeredPerS,
    nCtx: decoder.nCtx,
    kvType: decoder.kvType,
    kvUnified: config.batching.kvUnified,
    threads: decoder.threads,
    graphSlots: decoder.graphSlots,
    shapeGraphs: decoder.gpuLayers > 0 && cudaGraphsWanted(decoder),
    ...(opts.ceilingUbatch !== undefined ? { ubatch: opts.ceilingUbatch } : {}),
    ...(opts.peer ? { peer: true } : {}),
  });
}
