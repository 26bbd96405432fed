// `percept bench frame`: camera frame → validated action through the real stages, without the publisher.
// With --decoder openai the frame goes to an OpenAI-compatible server instead.
// Test-pattern frames come at a rate the pipeline can follow, so latencies are service times, not queueing.
import { RealClock } from '../../pipeline/clock.ts';
import { loadConfig } from '../../pipeline/config.ts';
import { createGraph } from '../../pipeline/graph/graph.ts';
import { isMmprojSpec } from '../../models/resolve.ts';
import { loadActionSchema } from '../../nodes/action-schema.ts';
import { cudaMatmuls, type CudaMatmuls } from '../../native/binding.ts';
import type { MemoryBreakdown } from '../../native/llama.ts';
import { createStages } from '../run/run.ts';
import { createSource } from '../run/stages.ts';
import { median, quantile } from '../stats.ts';

export interface BenchFrameOptions {
  /** Decoder GGUF or `synth:` preset. With decoder 'openai', the model id the server serves. */
  readonly model: string;
  /** 'local' runs the in-process binding (the default), 'openai' the server at `endpoint`. */
  readonly decoder?: 'local' | 'openai';
  readonly endpoint?: string;
  /** With openai, the most requests in flight (default 1). */
  readonly concurrency?: number;
  /** Vision encoder: an .onnx, an mmproj .gguf, or 'projection', a stand-in with no model. */
  readonly encoder: string;
  readonly imageTokens: number;
  readonly frames: number;
  readonly fps: number;
  readonly gpuLayers: number;
  /** Absent, the action schema's worst case, as in the decoder's config default. */
  readonly maxNewTokens?: number;
  /** decoder.threads, llama.cpp's CPU threads. Default: the config's, every core. */
  readonly threads?: number;
  /** decoder.stepTokens, tokens per decode step, padded. Default: the config's, where 1 means no padding. */
  readonly stepTokens?: number;
  /** decoder.graphSlots, built decode graphs kept besides the current one. Default: the config's. */
  readonly graphSlots?: number;
  /** decoder.perLayerEmbeddingsOnGpu, 'on' or 'off'. Default: the config's, on when every layer is offloaded. */
  readonly perLayerEmbeddingsOnGpu?: 'on' | 'off';
  /** decoder.cudaGraphs, 'on' or 'off'. Default: the config's. */
  readonly cudaGraphs?: 'on' | 'off';
  /** decoder.mixedPrefill, 'on' or 'off'. Default: the config's. */
  readonly mixedPrefill?: 'on' | 'off';
  /** preprocess.jpegDecode. The default 'auto' decodes JPEG frames on the encoder's GPU where it can. */
  readonly jpegDecode?: 'auto' | 'host';
  readonly draftMtp?: string;
  readonly draft?: string;
  readonly ngram?: boolean;
  /** Warm the stages up at load (false shows what the first frame pays without it). */
  readonly warmup: boolean;
}

export interface BenchFrameResult {
  readonly frames_in: number;
  readonly frames_out: number;
  readonly dropped: Readonly<Record<string, number>>;
  /** The drops by what their stages said (the run summary's causes): why, and where. */
  readonly drop_causes: Readonly<Record<string, number>>;
  readonly frame_to_action_ms_p50: number | null;
  readonly frame_to_action_ms_p99: number | null;
  readonly stages_ms_p50: Readonly<Record<string, number | null>>;
  readonly stages_ms_p99: Readonly<Record<string, number | null>>;
  /** The first frame apart from the rest: its time through the stages and per stage, and each ÷ the
   * median of the frames after it. A warm-up that works keeps these ratios near 1. */
  readonly first_frame_ms: number | null;
  readonly first_over_median: number | null;
  readonly stages_first_ms: Readonly<Record<string, number>>;
  readonly stages_first_over_median: Readonly<Record<string, number | null>>;
  /** The first frame's decode note, set against the *_median figures below. It tells whether a slow first
   * decode is a slower prefill or token, or a longer action. Null where the decoder did not say. */
  readonly first_frame_decode: FrameDecode | null;
  /** The slowest frame, the tail the p99 reads: its time through the stages and per stage, and its
   * decode note. The note tells a longer action (more calls and tokens) from slower calls. Null
   * with no frame out. */
  readonly slowest_frame: SlowestFrame | null;
  readonly warmup: boolean;
  readonly image_tokens: number;
  readonly decoder: 'local' | 'openai';
  /** The local decoder's quantized-matmul paths on a CUDA build (docs/gpu.md); null for a remote decoder. */
  readonly cuda_matmuls: CudaMatmuls | null;
  /** Whether the decoder's per-layer embedding table is on the GPU (decoder.perLayerEmbeddingsOnGpu; null: a remote decoder). */
  readonly per_layer_embeddings_on_gpu: boolean | null;
  /** Medians over the frames' decode notes: prompt tokens with the image, tokens reused from the cache,
   * new tokens, and the decoder's own time per new token. */
  readonly prompt_tokens_median: number | null;
  readonly reused_tokens_median: number | null;
  readonly new_tokens_median: number | null;
  /** The decoder's prefill (a server's includes its image encoding, the binding's does not). */
  readonly prefill_ms_median: number | null;
  readonly decode_ms_per_token_median: number | null;
  /** The decode stage's time outside prefill and token generation: the request's setup and the thread
   * hand-offs. Setup is the prompt plan, sampler and grammar state. */
  readonly decode_other_ms_median: number | null;
  /** Where the decode time goes, binding only: llama_decode calls per frame, and the mean time of a
   * one-token call and of a longer one. A longer call decodes a sampled token with its forced run, or drafts.
   * `graph_reuse_share` is the share of calls where llama.cpp reused the previous step's graph. */
  readonly decode_calls_median: number | null;
  /** llama_decode calls of a frame's prefill past the cached prefix: 1 where its image and the text after it mix
   * (decoder.mixedPrefill), 2 where the image is decoded alone. */
  readonly prefill_decode_calls_median: number | null;
  readonly single_decode_ms_mean: number | null;
  readonly multi_decode_ms_mean: number | null;
  readonly graph_reuse_share: number | null;
  /** Share of those calls padded to decoder.stepTokens, one shape from step to step. */
  readonly padded_step_share: number | null;
  /** With a draft (--draft, --draft-mtp, --ngram), summed over the frames: draft tokens verified and accepted,
   * and accepted ÷ drafted. Null where the decoder did not say. */
  readonly drafted: number | null;
  readonly accepted: number | null;
  readonly acceptance: number | null;
  /** New tokens per decode that yields them, summed over the frames: the prompt's last decode counts as one.
   * It gives the first token and the opening forced run; each later step its token, forced run and accepted drafts. */
  readonly tokens_per_decode: number | null;
  /** The slowest action the schema allows, whatever the logits, for the binding only. Its llama_decode
   * calls after the prompt are DecoderStage.worstCaseDecodeCalls. `worst_case_decode_ms` prices them at
   * this run's mean call time, an estimate of the decode time a budget must leave for it. */
  readonly worst_case_decode_calls: number | null;
  readonly worst_case_decode_ms: number | null;
  /** The binding only: the decoder context's compute buffers as the run ended, in MiB by buffer type.
   * They grow with the step shapes it ran, and each graph slot keeps a scheduler's buffers. */
  readonly decoder_compute_mib: Record<string, number> | null;
  /** openai, where the server reports its timings (llama-server). The HTTP path's own cost per request is
   * the round trip less the server's prefill and decode. It covers transport, JSON, base64, image
   * decoding, templating, grammar setup and any wait for a free slot. */
  readonly http_ms_p50: number | null;
  readonly http_ms_p99: number | null;
}

export interface SlowestFrame {
  /** Its index among the frames, 0 for the first. */
  readonly index: number;
  readonly ms: number;
  readonly stages_ms: Readonly<Record<string, number>>;
  readonly decode: FrameDecode | null;
}

/** What a frame's decode note said (null where it did not say it). */
export interface FrameDecode {
  readonly prompt_tokens: number | null;
  readonly reused_tokens: number | null;
  readonly new_tokens: number | null;
  readonly prefill_ms: number | null;
  readonly decode_ms_per_token: number | null;
  readonly other_ms: number | null;
  /** llama_decode calls, and those where llama.cpp reused the previous step's graph. */
  readonly decode_calls: number | null;
  readonly graph_reuses: number | null;
}

/** One frame's figures, for benches that pool frames over several runs. They are its time and what its
 * decode note said (null where the decoder did not say it). */
export interface FrameSample {
  /** Entering the first stage → leaving the last one it reached. */
  readonly totalMs: number;
  readonly promptTokens: number | null;
  readonly reusedTokens: number | null;
  readonly newTokens: number | null;
  readonly prefillMs: number | null;
  readonly decodeMs: number | null;
  readonly decodeCalls: number | null;
  readonly prefillDecodeCalls: number | null;
  readonly singleDecodeCalls: number | null;
  readonly singleDecodeMs: number | null;
  readonly llamaDecodeMs: number | null;
  readonly graphReuses: number | null;
  readonly paddedSteps: number | null;
  readonly drafted: number | null;
  readonly accepted: number | null;
  readonly httpMs: number | null;
  /** The decode stage's own time. */
  readonly decodeStageMs: number | null;
}

export type DecodeFigures = Pick<
  BenchFrameResult,
  | 'prompt_tokens_median'
  | 'reused_tokens_median'
  | 'new_tokens_median'
  | 'prefill_ms_median'
  | 'decode_ms_per_token_median'
  | 'decode_other_ms_median'
  | 'decode_calls_median'
  | 'prefill_decode_calls_median'
  | 'single_decode_ms_mean'
  | 'multi_decode_ms_mean'
  | 'graph_reuse_share'
  | 'padded_step_share'
  | 'drafted'
  | 'accepted'
  | 'acceptance'
  | 'tokens_per_decode'
  | 'http_ms_p50'
  | 'http_ms_p99'
>;

const round = (x: number): number => Math.round(x * 1000) / 1000;
const roundEach = (ms: Readonly<Record<string, number>>): Record<string, number> =>
  Object.fromEntries(Object.entries(ms).map(([name, v]) => [name, round(v)]));
const msPerToken = (s: FrameSample): number | null => (s.decodeMs !== null && s.newTokens ? s.decodeMs / s.newTokens : null);
const decodeOtherMs = (s: FrameSample): number | null =>
  s.decodeStageMs !== null && s.prefillMs !== null && s.decodeMs !== null ? s.decodeStageMs - s.prefillMs - s.decodeMs : null;

/** A frame's decode note as the result reports it. */
function decodeNote(s: FrameSample): FrameDecode {
  const orNull = (x: number | null): number | null => (x === null ? null : round(x));
  return {
    prompt_tokens: s.promptTokens,
    reused_tokens: s.reusedTokens,
    new_tokens: s.newTokens,
    prefill_ms: orNull(s.prefillMs),
    decode_ms_per_token: orNull(msPerToken(s)),
    other_ms: orNull(decodeOtherMs(s)),
    decode_calls: s.decodeCalls,
    graph_reuses: s.graphReuses,
  };
}

/** The frame that took longest through the stages, with its decode note where it has one. */
export function slowest(
  frames: readonly { readonly total: number; readonly stages: Readonly<Record<string, number>>; readonly note?: unknown }[],
  samples: readonly FrameSample[],
): SlowestFrame | null {
  let index = -1;
  for (const [i, f] of frames.entries()) if (index < 0 || f.total > frames[index]!.total) index = i;
  if (index < 0) return null;
  const f = frames[index]!;
  return {
    index,
    ms: round(f.total),
    stages_ms: roundEach(f.stages),
    decode: f.note && samples[index] ? decodeNote(samples[index]) : null,
  };
}

/** The decode figures of a set of frames (see BenchFrameResult). */
export function decodeFigures(frames: readonly FrameSample[]): DecodeFigures {
  const values = (f: (s: FrameSample) => number | null): number[] => frames.flatMap((s) => (f(s) === null ? [] : [f(s)!]));
  const stat = (v: number[], q?: number): number | null => (v.length ? round(q === undefined ? median(v) : quantile(v, q)) : null);
  const http = values((s) => s.httpMs);
  const sum = (f: (s: FrameSample) => number | null): number => values(f).reduce((a, b) => a + b, 0);
  const calls = sum((s) => s.decodeCalls);
  const single = sum((s) => s.singleDecodeCalls);
  const singleMs = sum((s) => s.singleDecodeMs);
  const allMs = sum((s) => s.llamaDecodeMs);
  const ratioOf = (a: number, b: number): number | null => (b > 0 ? round(a / b) : null);
  return {
    prompt_tokens_median: stat(values((s) => s.promptTokens)),
    reused_tokens_median: stat(values((s) => s.reusedTokens)),
    new_tokens_median: stat(values((s) => s.newTokens)),
    prefill_ms_median: stat(values((s) => s.prefillMs)),
    decode_ms_per_token_median: stat(values(msPerToken)),
    decode_other_ms_median: stat(values(decodeOtherMs)),
    decode_calls_median: stat(values((s) => s.decodeCalls)),
    prefill_decode_calls_median: stat(values((s) => s.prefillDecodeCalls)),
    single_decode_ms_mean: ratioOf(singleMs, single),
    multi_decode_ms_mean: ratioOf(allMs - singleMs, calls - single),
    graph_reuse_share: ratioOf(
      sum((s) => s.graphReuses),
      calls,
    ),
    padded_step_share: ratioOf(
      sum((s) => s.paddedSteps),
      calls,
    ),
    drafted: values((s) => s.drafted).length ? sum((s) => s.drafted) : null,
    accepted: values((s) => s.accepted).length ? sum((s) => s.accepted) : null,
    acceptance: ratioOf(
      sum((s) => s.accepted),
      sum((s) => s.drafted),
    ),
    tokens_per_decode: ratioOf(
      sum((s) => (s.decodeCalls !== null ? s.newTokens : null)),
      sum((s) => (s.newTokens !== null && s.decodeCalls !== null ? s.decodeCalls + 1 : null)),
    ),
    http_ms_p50: stat(http, 0.5),
    http_ms_p99: stat(http, 0.99),
  };
}

/** Compute buffers by buffer type, MiB; null without a breakdown. */
export function computeMib(memory: MemoryBreakdown | null): Record<string, number> | null {
  if (!memory) return null;
  return Object.fromEntries(memory.byBufferType.map((b) => [b.bufferType, round(b.compute / 2 ** 20)]));
}

/** The schema's slowest action: its decode calls, and their time at the frames' mean call time. */
export function worstCase(
  calls: number | null,
  frames: readonly FrameSample[],
): Pick<BenchFrameResult, 'worst_case_decode_calls' | 'worst_case_decode_ms'> {
  let ms = 0;
  let n = 0;
  for (const s of frames) {
    if (s.llamaDecodeMs === null || !s.decodeCalls) continue;
    ms += s.llamaDecodeMs;
    n += s.decodeCalls;
  }
  return { worst_case_decode_calls: calls, worst_case_decode_ms: calls !== null && n > 0 ? round((calls * ms) / n) : null };
}

/** A config's encoder section for an encoder named on the command line. It is 'projection' with no model,
 * an mmproj (.gguf, synth:…-mmproj), else an ONNX model. */
export function encoderSection(spec: string, gpuLayers: number): object {
  if (spec === 'projection') return { kind: 'projection' };
  if (isMmprojSpec(spec)) return { kind: 'mtmd', mmproj: spec, gpuLayers };
  return { kind: 'onnx', model: spec };
}

export async function benchFrame(opts: BenchFrameOptions): Promise<BenchFrameResult> {
  return (await benchFrameSamples(opts)).result;
}

/** benchFrame, and each frame's figures. */
export async function benchFrameSamples(opts: BenchFrameOptions): Promise<{ result: BenchFrameResult; frames: FrameSample[] }> {
  const { imageTokens, gpuLayers } = opts;
  const kind = opts.decoder ?? 'local';
  // Absent, the config's defaults apply: the decoder's budget follows the action grammar's worst case.
  const maxNewTokens = opts.maxNewTokens !== undefined ? { maxNewTokens: opts.maxNewTokens } : {};
  if (kind === 'openai' && !opts.endpoint) throw new Error('bench frame: --decoder openai needs --endpoint URL');
  const decoder =
    kind === 'openai'
      ? { kind, endpoint: opts.endpoint, model: opts.model, concurrency: opts.concurrency ?? 1, ...maxNewTokens }
      : {
          model: opts.model,
          gpuLayers,
          ...maxNewTokens,
          ...(opts.threads !== undefined ? { threads: opts.threads } : {}),
          ...(opts.stepTokens !== undefined ? { stepTokens: opts.stepTokens } : {}),
          ...(opts.graphSlots !== undefined ? { graphSlots: opts.graphSlots } : {}),
          ...(opts.cudaGraphs !== undefined ? { cudaGraphs: opts.cudaGraphs === 'on' } : {}),
          ...(opts.perLayerEmbeddingsOnGpu !== undefined ? { perLayerEmbeddingsOnGpu: opts.perLayerEmbeddingsOnGpu === 'on' } : {}),
          ...(opts.mixedPrefill !== undefined ? { mixedPrefill: opts.mixedPrefill === 'on' } : {}),
          draft: opts.draft ?? null,
          draftMtp: opts.draftMtp ?? null,
          ngram: opts.ngram ?? false,
        };
  const config = loadConfig({
    source: { kind: 'pattern', fps: opts.fps, frames: opts.frames, width: 1280, height: 720 },
    ...(kind === 'local' ? { encoder: encoderSection(opts.encoder, gpuLayers) } : {}),
    ...(opts.jpegDecode !== undefined ? { preprocess: { jpegDecode: opts.jpegDecode } } : {}),
    decoder,
    budgets: {
      endToEndMs: 60_000,
      stages: { preprocess: 10_000, encode: 30_000, decode: 30_000, actions: 1_000 },
      dropPredictedMiss: false,
    },
    edges: { default: { policy: 'queue', capacity: 64 } },
    ladder: { enabled: false, initial: { imageTokens, draft: true, frameSkip: 0, ...maxNewTokens }, rungs: [] },
    telemetry: { liveTable: 'off' },
  });
  const source = await createSource(config.source, config.preprocess.maxPixels);
  const stages = await createStages(config, loadActionSchema(config.actions.schema), { publish: false, warmup: opts.warmup });
  const graph = createGraph({ source, stages: stages.chain, clock: new RealClock(), config });
  // Per frame, dropped ones too: each stage's time, and the time from entering the first stage to
  // leaving the last one it reached. Random weights often give an invalid action.
  const spans = new Map<number, { enter: bigint; exit: bigint; stages: Record<string, number> }>();
  const notes = new Map<number, Readonly<Record<string, number | string | boolean>>>();
  graph.events.subscribe((event) => {
    if (event.type === 'note' && event.message === 'decode' && event.data) notes.set(event.frameId, event.data);
    if (event.type !== 'span') return;
    const f = spans.get(event.frameId) ?? { enter: event.enterNs, exit: event.exitNs, stages: {} };
    if (event.enterNs < f.enter) f.enter = event.enterNs;
    if (event.exitNs > f.exit) f.exit = event.exitNs;
    f.stages[event.stage] = Number(event.exitNs - event.enterNs) / 1e6;
    spans.set(event.frameId, f);
  });
  const summary = await graph.run();
  const frames = [...spans.entries()]
    .sort(([a], [b]) => a - b)
    .map(([id, f]) => ({ total: Number(f.exit - f.enter) / 1e6, stages: f.stages, note: notes.get(id) }));
  const samples: FrameSample[] = frames.map(({ total, stages, note }) => {
    const n = (key: string): number | null => (typeof note?.[key] === 'number' ? note[key] : null);
    return {
      totalMs: total,
      promptTokens: n('promptTokens'),
      reusedTokens: n('reusedTokens'),
      newTokens: n('tokens'),
      prefillMs: n('prefillMs'),
      decodeMs: n('decodeMs'),
      decodeCalls: n('decodeCalls'),
      prefillDecodeCalls: n('prefillDecodeCalls'),
      singleDecodeCalls: n('singleDecodeCalls'),
      singleDecodeMs: n('singleDecodeMs'),
      llamaDecodeMs: n('llamaDecodeMs'),
      graphReuses: n('graphReuses'),
      paddedSteps: n('paddedSteps'),
      drafted: n('drafted'),
      accepted: n('accepted'),
      httpMs: n('httpMs'),
      decodeStageMs: stages.decode ?? null,
    };
  });
  const pick = (q: 'p50Ms' | 'p99Ms') => Object.fromEntries(Object.entries(summary.stages).map(([name, s]) => [name, s[q]]));
  const ratio = (first: number | undefined, rest: (number | undefined)[]): number | null => {
    const m = median(rest.filter((x): x is number => x !== undefined));
    return first === undefined || !(m > 0) ? null : round(first / m);
  };
  const [first, ...rest] = frames;
  const firstSample = samples[0];
  const result: BenchFrameResult = {
    frames_in: summary.frames.in,
    frames_out: summary.frames.out,
    dropped: summary.drops.byReason as Record<string, number>,
    drop_causes: summary.drops.causes,
    frame_to_action_ms_p50: summary.endToEnd.p50Ms,
    frame_to_action_ms_p99: summary.endToEnd.p99Ms,
    stages_ms_p50: pick('p50Ms'),
    stages_ms_p99: pick('p99Ms'),
    first_frame_ms: first ? round(first.total) : null,
    first_over_median: ratio(
      first?.total,
      rest.map((f) => f.total),
    ),
    stages_first_ms: first ? roundEach(first.stages) : {},
    stages_first_over_median: first
      ? Object.fromEntries(
          Object.keys(first.stages).map((name) => [
            name,
            ratio(
              first.stages[name],
              rest.map((f) => f.stages[name]),
            ),
          ]),
        )
      : {},
    first_frame_decode: first?.note && firstSample ? decodeNote(firstSample) : null,
    slowest_frame: slowest(frames, samples),
    warmup: opts.warmup,
    image_tokens: imageTokens,
    decoder: kind,
    cuda_matmuls: kind === 'local' ? cudaMatmuls() : null,
    per_layer_embeddings_on_gpu: stages.decoder?.modelInfo.perLayerEmbeddingsOnGpu ?? null,
    ...decodeFigures(samples),
    ...worstCase(stages.decoder?.worstCaseDecodeCalls ?? null, samples),
    decoder_compute_mib: computeMib(stages.decoder?.memoryAtClose() ?? null),
  };
  return { result, frames: samples };
}
