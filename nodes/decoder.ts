// The decode stage: image embeddings → a schema-constrained generation, through the native
// llama.cpp binding. The prompt is [chat-templated system + user text, image, instruction], so the
// system prefix stays in the KV cache and is not prefilled again for each frame.
import { env } from 'node:process';
import { decodeBudget, type ActionSchema, type DecodeBudget } from './action-schema.ts';
import type { EncoderContract, Generation, ImageEmbedding } from './payloads.ts';
import { maxLanes, type DecoderConfig } from '../pipeline/config.ts';
import { DropFrame, StageAbort, type Stage, type StageContext } from '../pipeline/types.ts';
import {
  DRAFT_MAX,
  LlamaModel,
  type GenerateResult,
  type LlamaContext,
  type LlamaGrammar,
  type LoadModelOptions,
  type MemoryBreakdown,
  type ModelInfo,
  type PromptSegment,
  type SpeculatorOptions,
  type TimeAccount,
  defaultThreads,
} from '../native/llama.ts';

/** Physical batch: an image attended bidirectionally must fit one ubatch (Gemma 4's largest is 1120 tokens). */
const IMAGE_UBATCH = 1152;
/** Cameras admitted together: the largest ubatch their images are read in (the compute buffer grows with it). */
const GROUP_UBATCH_MAX = 8192;
/** n-gram length the ngram-simple drafter matches on. */
const NGRAM_N = 3;
/** Top-k / top-p applied when sampling with a temperature > 0. */
export const SAMPLING = { topK: 40, topP: 0.95 } as const;

export interface SpeculationFlags {
  /** Draft model GGUF path (same vocabulary) → draft-simple. */
  readonly draft?: string | null;
  /** Gemma 4 MTP assistant GGUF path → draft-mtp. */
  readonly draftMtp?: string | null;
  /** n-gram drafting (ngram-simple). */
  readonly ngram?: boolean;
  /** Longest draft (when absent, the binding's default). */
  readonly nDraft?: number;
}

/** Loads the draft (if any) and attaches the speculator the flags ask for; returns the draft model to dispose.
 * `placement` places the draft's per-layer embedding table as the target's (default: the binding's rule). */
export async function attachSpeculation(
  ctx: LlamaContext,
  flags: SpeculationFlags,
  gpuLayers: number,
  placement: Pick<LoadModelOptions, 'perLayerEmbeddingsOnGpu'> = {},
): Promise<LlamaModel | undefined> {
  const chosen = [flags.draft ? 'draft' : '', flags.draftMtp ? 'draftMtp' : '', flags.ngram ? 'ngram' : ''].filter(Boolean);
  if (chosen.length > 1) throw new TypeError(`choose one of --draft, --draft-mtp, --ngram (got ${chosen.join(', ')})`);
  const nMax = flags.nDraft !== undefined ? { nMax: flags.nDraft } : {};
  if (flags.ngram) {
    await ctx.attachSpeculator({ type: 'ngram-simple', ngramN: NGRAM_N, ...nMax });
    return undefined;
  }
  const spec = flags.draft ?? flags.draftMtp;
  if (!spec) return undefined;
  const draftModel = await LlamaModel.load(spec, { gpuLayers, ...placement });
  try {
    const options: SpeculatorOptions = flags.draft
      ? { type: 'draft-simple', draftModel, ...nMax }
      : { type: 'draft-mtp', draftModel, ...nMax };
    await ctx.attachSpeculator(options);
    return draftModel;
  } catch (err) {
    await draftModel.dispose();
    throw err;
  }
}

/** The decoder section of a defaulted config (model, draft and draftMtp resolved to files), and the
 * action schema whose JSON Schema becomes the decoding grammar. */
export interface DecoderStageConfig extends DecoderConfig {
  readonly actionSchema: ActionSchema;
}

export interface DecoderStage extends Stage<ImageEmbedding, Generation> {
  /** New tokens per frame at most: the configured value, or the action grammar's worst case. */
  readonly maxNewTokens: number;
  /** llama_decode calls after the prompt that the slowest complete action takes, whatever the
   * logits: with jump-forward one per token the model picks after the first (the grammar's
   * maxChoices − 1: the opening forced run rides with the prompt), without it one per token. Null
   * where it has no bound (no token index, or forced runs padded to stepTokens, which may spill
   * into extra steps). */
  readonly worstCaseDecodeCalls: number | null;
  /** Width of the image rows this decoder takes (the encoder must produce it). */
  readonly nEmbd: number;
  /** The vision-encoder contract that matches this decoder's architecture. */
  readonly contract: EncoderContract;
  readonly modelInfo: ModelInfo;
  /** The decoder context's memory by buffer type as the stage closed (null before): its compute
   * buffers grow with the step shapes it ran, so this is what a run of frames needed. */
  memoryAtClose(): MemoryBreakdown | null;
  /** A decoder the cameras share: where its scheduler's time went so far, or until it closed (null: not shared).
   * With lanes, their accounts added (times in lane-ms). */
  schedulerTime(): TimeAccount | null;
  /** Contexts the cameras are spread over (batching.lanes; 1 for one camera). */
  readonly lanes: number;
}

const IMAGE_MARKER = '<__percept_image__>';

/** See DecoderStage.worstCaseDecodeCalls. */
export function decodeCallBound(
  grammar: Pick<LlamaGrammar, 'worstCaseTokens' | 'maxChoices'>,
  jumpForward: boolean,
  stepTokens: number,
  maxNewTokens: number,
): number | null {
  if (grammar.worstCaseTokens === null || grammar.maxChoices === null) return null;
  if (!jumpForward) return Math.min(maxNewTokens, grammar.worstCaseTokens);
  return stepTokens === 1 ? Math.max(0, grammar.maxChoices - 1) : null;
}

/** Several cameras on one decoder: a context with one sequence per camera, decoded together in one
 * batch per step (native/src/batch.h). */
export interface CameraBatching {
  readonly cameras: number;
  /** Cameras per step at most (null: all). */
  readonly maxActive: number | null;
  /** together: arrivals wait for the running group and go in together; rolling: together, and the group's tail takes them
   * in once they outnumber its members; adaptive: together, and the tail takes them in when predicted to pay; each: one at
   * a time. Default together. */
  readonly admit?: 'together' | 'rolling' | 'adaptive' | 'each';
  /** Admitting together: how long an idle decoder holds a group for frames still on their way (default 0). */
  readonly groupWaitMs?: number;
  /** Admitting rolling: the fewest waiting frames that go in beside a group's tail (default 1). */
  readonly rollingJoin?: number;
  /** Admitting together: a frame that would miss waiting for the running group joins it at once (default true). */
  readonly joinRunning?: boolean;
  readonly prefillChunk: number;
  readonly kvUnified: boolean;
  /** Contexts the cameras are spread over, each a batched decoder of its own on the one model (default 1).
   * Camera i decodes on lane i % lanes; on a GPU the lanes' decodes run side by side. */
  readonly lanes?: number;
  /** One KV buffer: every token decode has a row and an output per camera, rows padded to a multiple (default 0: off). */
  readonly stepRows?: number;
  /** A step's causal image rows and its token rows in one decode (default false). */
  readonly mixSteps?: boolean;
  /** The most image rows a frame brings (every ladder level's): with the prompt and maxNewTokens,
   * what each camera's KV room must hold, checked at load. */
  readonly imageTokens: number;
}

export async function createDecoderStage(config: DecoderStageConfig): Promise<DecoderStage> {
  const decoder = await openDecoder(config);
  return { ...decoder.handle(undefined), close: () => decoder.close() };
}

/**
 * One decoder for several cameras: one stage per camera, each a handle onto the same model and
 * context (camera i decodes on sequence i, so its prompt prefix stays in its own KV cells). The
 * handles' calls run together, batched; a camera's late or cancelled frame leaves the others'
 * decoding as it was. The model is freed when the last handle is closed.
 */
export async function createCameraDecoderStages(config: DecoderStageConfig, batching: CameraBatching): Promise<DecoderStage[]> {
  if (!(Number.isInteger(batching.cameras) && batching.cameras >= 1))
    throw new RangeError(`createCameraDecoderStages: cameras must be an integer ≥ 1, got ${batching.cameras}`);
  if (config.draft || config.draftMtp || config.ngram)
    throw new TypeError('decoder: cameras are decoded together in one batch, without drafts (draft, draftMtp and ngram must be off)');
  const decoder = await openDecoder(config, batching);
  let open = batching.cameras;
  const stages: DecoderStage[] = [];
  for (let seq = 0; seq < batching.cameras; seq++) {
    let closed = false;
    stages.push({
      ...decoder.handle(seq),
      async close() {
        if (closed) return;
        closed = true;
        open -= 1;
        if (open === 0) await decoder.close();
      },
    });
  }
  return stages;
}

/** Refuses a context where a camera's frame (its prompt, its image rows with their two markers, and
 * maxNewTokens) does not fit the KV positions each camera has: its stream, or its share of a unified
 * cache. Checked at load, where a too-small decoder.nCtx would otherwise fail every frame. */
function checkCameraRoom(
  model: LlamaModel,
  ctx: LlamaContext,
  template: readonly PromptSegment[],
  imageTokens: number,
  maxNewTokens: number,
): void {
  let text = 0;
  let images = 0;
  for (const seg of template) {
    if ('text' in seg) text += model.tokenize(seg.text, { addSpecial: seg.addSpecial ?? false }).length;
    else if ('tokens' in seg) text += seg.tokens.length;
    else images++;
  }
  const rows = images * (imageTokens + 2);
  const need = text + rows + maxNewTokens;
  const { nCtxSeq, nSeq, kvUnified } = ctx.info;
  if (need > nCtxSeq) {
    throw new RangeError(
      `decoder.nCtx is too small for ${nSeq} cameras: a frame needs ${need} KV positions (prompt ${text} tokens + ` +
        `${rows} image rows and markers + maxNewTokens ${maxNewTokens}) but each camera has ${nCtxSeq} ` +
        `(${kvUnified ? 'its share of the unified cache' : 'its own KV stream'}); raise decoder.nCtx to at least ${need}`,
    );
  }
}

interface OpenDecoder {
  /** The stage of one sequence (undefined: the context has one). */
  handle(seq: number | undefined): Omit<DecoderStage, 'close'>;
  close(): Promise<void>;
}

/** decoder.cudaGraphs resolved: null (not set) means on. Decode steps are captured and replayed one CUDA
 * graph per step shape (LlamaContext's shapeGraphs), so the alternating shapes of unpadded jump-forward
 * each replay their own graph. */
export function cudaGraphsWanted(config: Pick<DecoderConfig, 'cudaGraphs'>): boolean {
  return config.cudaGraphs ?? true;
}

/**
 * The ggml-cuda variable a local decoder on the GPU adds to the environment before its model loads:
 * GGML_CUDA_DISABLE_GRAPHS=1 where CUDA graphs are off. It is process-wide (the vision encoder's graphs
 * too) and read once, so it is set here, ahead of every load; a value `env` already has is kept.
 * Programmatic dependent launch (PDL) stays on with graphs too: on the H200 ggml-cuda's flash-attention
 * kernels launched with PDL gave other logits inside a captured CUDA graph than launched one by one, and
 * percept's build patches ggml-cuda to launch them without PDL while a graph is being captured
 * (native/patches/ggml-cuda-fattn-no-pdl.diff); every other kernel keeps it.
 */
export function cudaEnvironment(
  config: Pick<DecoderConfig, 'cudaGraphs' | 'gpuLayers'>,
  environment: Readonly<Record<string, string | undefined>>,
): Record<string, string> {
  if (config.gpuLayers <= 0 || environment.GGML_CUDA_DISABLE_GRAPHS !== undefined || cudaGraphsWanted(config)) return {};
  return { GGML_CUDA_DISABLE_GRAPHS: '1' };
}

/** Seeded walks through the decoding grammar that checkGrammarAdmitsSchema validates. */
const SCHEMA_WALKS = 24;

/**
 * Refuses an action schema that no output of its decoding grammar satisfies, naming the JSON path
 * ajv reports. Some schemas (a pattern with conflicting lengths, contradictory allOf consts) load,
 * yet the grammar cannot express them: every frame would then be dropped invalid. Seeded walks
 * through the grammar's token index stand in for its outputs; a grammar without an index is not
 * walked. A schema that some walks fail is logged, since the grammar is looser than the schema there.
 */
export async function checkGrammarAdmitsSchema(
  model: LlamaModel,
  grammar: LlamaGrammar,
  schema: ActionSchema,
  maxTokens: number,
  log: (msg: string) => void = (msg) => process.stderr.write(`percept: ${msg}\n`),
): Promise<void> {
  if (grammar.index === null) return;
  const steps = Math.min(Number.isFinite(maxTokens) ? maxTokens : 512, 512);
  const failures = new Map<string, number>();
  let valid = 0;
  for (let w = 0; w < SCHEMA_WALKS; w++) {
    let state = (0x9e3779b9 * (w + 1)) >>> 0;
    const next = (): number => (state = (Math.imul(state, 1664525) + 1013904223) >>> 0) / 2 ** 32;
    const path: number[] = [];
    let value: unknown = undefined;
    for (let i = 0; i < steps && value === undefined; i++) {
      // A random admitted token with text: end-of-generation tokens have none.
      const allowed = Array.from(await grammar.allowedTokens(path));
      let token = -1;
      while (allowed.length > 0 && token < 0) {
        const k = Math.floor(next() * allowed.length);
        if (model.detokenize([allowed[k]!]).length > 0) token = allowed[k]!;
        else allowed.splice(k, 1);
      }
      if (token < 0) break;
      path.push(token);
      try {
        value = JSON.parse(model.detokenize(path));
      } catch {
        value = undefined;
      }
    }
    if (value === undefined) continue;
    if (schema.validate(value)) valid += 1;
    else {
      const first = schema.validate.errors?.[0];
      const where = first ? `${first.instancePath || '/'}: ${first.message ?? 'invalid'}` : 'invalid';
      failures.set(where, (failures.get(where) ?? 0) + 1);
    }
  }
  const reasons = [...failures.entries()].sort((a, b) => b[1] - a[1]).map(([why, n]) => `${why} (${n})`);
  if (valid === 0 && reasons.length > 0) {
    throw new Error(
      `decoder: action schema ${schema.path} admits no action its decoding grammar can produce: ` +
        `${failures.size === 1 ? 'every' : 'each'} sampled action fails ${reasons.join('; ')}. ` +
        'The grammar cannot express these constraints together; change them so that some action satisfies both.',
    );
  }
  if (reasons.length > 0) log(`action schema ${schema.path}: the decoding grammar also admits actions it refuses: ${reasons.join('; ')}`);
}

/** The `decode` note of one generation: its token counts, and its measured times on a real clock only. */
function decodeNote(r: GenerateResult, virtual: boolean): Record<string, number | string | boolean> {
  return {
    promptTokens: r.promptTokens,
    reusedTokens: r.reusedTokens,
    tokens: r.tokens.length,
    // The generated token ids, so two decoder configs can be compared token by token (eval).
    tokenIds: r.tokens.join(' '),
    drafted: r.drafted,
    accepted: r.accepted,
    forced: r.forced,
    // A virtual run's outputs must not depend on this machine's speed.
    ...(virtual
      ? {}
      : {
          prefillMs: r.timings.prefillMs,
          decodeMs: r.timings.decodeMs,
          sampleMs: r.timings.sampleMs,
          // Where decode time goes: llama_decode calls, those of a single token, and graph reuse.
          decodeCalls: r.timings.decodeCalls,
          singleDecodeCalls: r.timings.singleDecodeCalls,
          singleDecodeMs: r.timings.singleDecodeMs,
          llamaDecodeMs: r.timings.llamaDecodeMs,
          graphReuses: r.batch ? r.batch.graphReuses : r.timings.graphReuses,
          paddedSteps: r.timings.paddedSteps,
          // A batched context's prefill shares its steps: no count of its own.
          ...(r.batch ? {} : { prefillDecodeCalls: r.timings.prefillDecodeCalls }),
        }),
    stopReason: r.stopReason,
    ...(r.batch
      ? {
          queueMs: r.batch.queueMs,
          steps: r.batch.steps,
          waitSteps: r.batch.waitSteps,
          peakSeqs: r.batch.peakSeqs,
          predictedMiss: r.batch.predictedMiss,
        }
      : {}),
  };
}

async function openDecoder(config: DecoderStageConfig, batching?: CameraBatching): Promise<OpenDecoder> {
  if (typeof config !== 'object' || config === null) throw new TypeError('createDecoderStage: config must be an object');
  if (typeof config.model !== 'string' || config.model.length === 0) throw new TypeError('decoder.model must be a GGUF path');
  if (typeof config.systemPrompt !== 'string') throw new TypeError('decoder.systemPrompt must be a string');
  if (typeof config.instruction !== 'string') throw new TypeError('decoder.instruction must be a string');
  if (!(config.temperature >= 0)) throw new RangeError(`decoder.temperature must be ≥ 0, got ${config.temperature}`);
  if (typeof config.actionSchema?.schema !== 'object')
    throw new TypeError('createDecoderStage: actionSchema must be the result of loadActionSchema()');
  const { temperature, seed, jumpForward, gpuLayers } = config;

  Object.assign(env, cudaEnvironment(config, env));
  // With graphs on, one per step shape: ggml-cuda alone keeps one per context (LlamaContext's shapeGraphs).
  const shapeGraphs = gpuLayers > 0 && cudaGraphsWanted(config);
  const graphSlots = config.graphSlots !== null ? { graphSlots: config.graphSlots } : {};
  const mixedPrefill = config.mixedPrefill !== null ? { mixedPrefill: config.mixedPrefill } : {};
  const cameras = batching && batching.cameras > 1 ? batching : undefined;
  const laneCount = cameras ? checkLanes(cameras) : 1;
  const placement = config.perLayerEmbeddingsOnGpu !== null ? { perLayerEmbeddingsOnGpu: config.perLayerEmbeddingsOnGpu } : {};
  const model = await LlamaModel.load(config.model, { gpuLayers, ...placement });
  let draft: LlamaModel | undefined;
  // One context, or with cameras one per lane (camera i on lane i % lanes, sequence floor(i / lanes) there).
  const lanes: LlamaContext[] = [];
  let grammar: LlamaGrammar;
  let budget: DecodeBudget;
  try {
    // Lanes on the CPU share its cores; on a GPU each lane's host work is small.
    const threads =
      config.threads !== null
        ? { threads: config.threads }
        : laneCount > 1 && gpuLayers === 0
          ? { threads: Math.max(1, Math.floor(defaultThreads() / laneCount)) }
          : {};
    const draftMax = config.draftMax ?? DRAFT_MAX;
    // A group's images are read in one decode: a ubatch for the largest image of every camera a step takes, within GROUP_UBATCH_MAX.
    const together = cameras !== undefined && (cameras.admit ?? 'together') !== 'each';
    for (let lane = 0; lane < laneCount; lane++) {
      const nSeq = cameras ? laneCameras(cameras.cameras, laneCount, lane) : 1;
      const maxActive = cameras ? Math.min(cameras.maxActive ?? nSeq, nSeq) : 1;
      const groupRows = together ? maxActive * cameras.imageTokens : 0;
      const ubatch = Math.min(GROUP_UBATCH_MAX, Math.max(IMAGE_UBATCH, groupRows));
      lanes.push(
        await model.createContext({
          nCtx: config.nCtx,
          nBatch: ubatch,
          nUbatch: ubatch,
          kvType: config.kvType,
          stepTokens: config.stepTokens,
          shapeGraphs,
          ...graphSlots,
          ...mixedPrefill,
          ...threads,
          // Several cameras: one sequence each, decoded in one batch. One camera: a verify batch reads
          // one row per draft position and one for the last certain token.
          ...(cameras
            ? {
                nSeq,
                maxActive,
                prefillChunk: cameras.prefillChunk,
                admitTogether: together,
                ...(together
                  ? { groupWaitMs: cameras.groupWaitMs ?? 0, admitTail: cameras.admit === 'rolling' || cameras.admit === 'adaptive' }
                  : {}),
                ...(cameras.admit === 'rolling' ? { tailJoin: Math.min(cameras.rollingJoin ?? 1, nSeq) } : {}),
                ...(cameras.admit === 'adaptive' ? { weighTail: true } : {}),
                ...((cameras.admit ?? 'together') === 'together' && cameras.joinRunning === false ? { joinRunning: false } : {}),
                kvUnified: cameras.kvUnified,
                // Cameras decode under the action grammar: none samples in the graph, and no chain changes their graphs.
                backendSampling: false,
                ...(cameras.stepRows ? { stepRows: cameras.stepRows } : {}),
                ...(cameras.mixSteps ? { mixSteps: true } : {}),
              }
            : { maxOutputs: 1 + draftMax }),
        }),
      );
    }
    if (!cameras) {
      const flags = { draft: config.draft, draftMtp: config.draftMtp, ngram: config.ngram, nDraft: draftMax };
      draft = await attachSpeculation(lanes[0]!, flags, gpuLayers, placement);
    }
    const schemaPath = config.actionSchema.path;
    try {
      grammar = await model.grammarFromJsonSchema(config.actionSchema.schema);
    } catch (err) {
      throw new Error(`decoder: action schema ${schemaPath}: ${(err as Error).message}`, { cause: err });
    }
    budget = decodeBudget(config.maxNewTokens, grammar, schemaPath);
    await checkGrammarAdmitsSchema(model, grammar, config.actionSchema, budget.maxNewTokens);
  } catch (err) {
    await model.dispose();
    await draft?.dispose();
    throw err;
  }

  const { maxNewTokens } = budget;
  const worstCaseDecodeCalls = decodeCallBound(grammar, config.jumpForward, config.stepTokens, maxNewTokens);
  const info = model.info;
  const messages = [
    { role: 'system' as const, content: config.systemPrompt },
    { role: 'user' as const, content: `${IMAGE_MARKER}\n${config.instruction}` },
  ];
  // The chat template is rendered once (milliseconds of JS-thread time); each frame puts its image
  // in the image segment.
  const promptTemplate = model.chatPrompt(messages, [{ data: new Float32Array(0), nTokens: 0 }], { imageMarker: IMAGE_MARKER });
  const contract: EncoderContract = info.arch === 'gemma3' ? 'gemma3' : 'gemma4';

  const batched = cameras !== undefined;
  if (batched) {
    try {
      // Gemma 3's encoder always gives 256 rows.
      for (const ctx of lanes) checkCameraRoom(model, ctx, promptTemplate, contract === 'gemma3' ? 256 : cameras.imageTokens, maxNewTokens);
    } catch (err) {
      await model.dispose();
      throw err;
    }
  }
  const process = async (ctx: LlamaContext, seq: number | undefined, input: ImageEmbedding, sc: StageContext): Promise<Generation> => {
    if (input.nEmbd !== info.nEmbd) {
      throw new RangeError(
        `decoder: image embedding is ${input.nEmbd} wide but ${config.model} takes ${info.nEmbd} (encoder/decoder mismatch)`,
      );
    }
    if (input.data.length !== input.nTokens * input.nEmbd) {
      throw new RangeError(
        `decoder: image embedding has ${input.data.length} floats, expected nTokens × nEmbd = ${input.nTokens} × ${input.nEmbd}`,
      );
    }
    const prompt: PromptSegment[] = promptTemplate.map((s) => ('image' in s ? { image: input.data, nTokens: input.nTokens } : s));
    const maxTokens = budget.atKnob(sc.knobs.maxNewTokens);
    const r = await ctx.generate(prompt, {
      maxTokens,
      grammar,
      jumpForward,
      temperature,
      ...(temperature > 0 ? SAMPLING : {}),
      seed: (seed + sc.frame.frameId) >>> 0,
      speculative: sc.knobs.draft,
      signal: sc.signal,
      ...(seq !== undefined ? { seq } : {}),
      // The stage deadline is on the pipeline clock; only a real clock is the monotonic clock
      // native code reads. On a virtual clock the AbortSignal still cancels.
      ...(sc.clock.virtual ? {} : { deadlineNs: sc.stageDeadlineNs }),
    });
    if (grammar.fallback !== null) sc.report({ kind: 'note', message: 'grammar-fallback', data: { reason: grammar.fallback } });
    sc.report({ kind: 'note', message: 'decode', data: decodeNote(r, sc.clock.virtual) });
    // Cut short: give the frame up as the runtime asked, or as native code saw the same deadline
    // first (its check runs between tokens; the runtime's timer may not have fired yet).
    if (r.batch?.predictedMiss) {
      const left = Number(sc.stageDeadlineNs - sc.clock.nowNs()) / 1e6;
      throw new DropFrame(
        'stale',
        `predicted miss: about ${r.batch.predictedMs.toFixed(1)} ms to its action at the current sharing (any wait for the running group included), ${left.toFixed(1)} ms left`,
      );
    }
    if (r.stopReason === 'cancelled') throw sc.signal.reason;
    if (r.stopReason === 'deadline') throw sc.signal.aborted ? sc.signal.reason : new StageAbort('deadline', 'decode');
    return r; // a GenerateResult is a Generation (payloads.ts) with more timings
  };

  let memoryAtClose: MemoryBreakdown | null = null;
  let timeAtClose: TimeAccount | null = null;
  let closed = false;
  // Admitting together, each lane's scheduler hears of its frames on their way too: an idle decoder holds a group for them.
  const reservations = lanes.map(
    (ctx) =>
      new Reservations(
        ctx.info.admitTogether
          ? (camera, delta) => {
              if (!closed) ctx.expect(camera, delta);
            }
          : undefined,
      ),
  );
  const timeAccount = (): TimeAccount | null => {
    const accounts = lanes.map((ctx) => ctx.timeAccount());
    return accounts.every((a): a is TimeAccount => a !== null) ? sumTimeAccounts(accounts) : null;
  };
  return {
    handle: (camera) => {
      // The camera's lane and its sequence there.
      const lane = batched ? (camera ?? 0) % laneCount : 0;
      const seq = batched ? Math.floor((camera ?? 0) / laneCount) : undefined;
      const ctx = lanes[lane]!;
      const held = reservations[lane]!;
      return {
        name: 'decode',
        maxNewTokens,
        worstCaseDecodeCalls,
        nEmbd: info.nEmbd,
        contract,
        modelInfo: info,
        lanes: laneCount,
        memoryAtClose: () => memoryAtClose,
        schedulerTime: () => (closed ? timeAtClose : timeAccount()),
        process: async (input, sc) => {
          const generation = await process(ctx, seq, input, sc);
          if (seq !== undefined) held.served(seq);
          return generation;
        },
        // The lane's cameras share one scheduler: what it predicts for a frame now lets the stages ahead
        // (preprocess, encode) drop a frame it would drop anyway (Stage.predict), counting the
        // frames of every camera already on their way here that it will serve first (Stage.reserve).
        // At the decoder's own entry the frame is encoded already: it is not dropped for frames still
        // on their way (those are checked when they arrive).
        ...(seq !== undefined
          ? {
              predict: (deadlineNs: bigint, entering: boolean) => {
                const p = ctx.prediction(deadlineNs, entering ? 0 : held.ahead(deadlineNs, seq));
                // This camera's frame ahead, as the scheduler knew it at its last step (none: the graph counts its fastest run).
                const busyMs = ctx.restMs(seq);
                return busyMs === undefined ? p : { ...p, busyMs };
              },
              reserve: (deadlineNs: bigint) => held.add(deadlineNs, seq),
            }
          : {}),
      };
    },
    async close() {
      closed = true;
      memoryAtClose = sumMemory(lanes.map((ctx) => ctx.memoryBreakdown()));
      timeAtClose = timeAccount();
      await model.dispose();
      await draft?.dispose();
    },
  };
}

/** Checks batching.lanes against the cameras (each lane decodes two cameras at least) and returns it. */
function checkLanes(cameras: CameraBatching): number {
  const lanes = cameras.lanes ?? 1;
  if (!Number.isInteger(lanes) || lanes < 1 || lanes > maxLanes(cameras.cameras)) {
    throw new RangeError(
      `decoder: lanes must be an integer from 1 to ${maxLanes(cameras.cameras)} (two cameras a lane at least, ${cameras.cameras} cameras), got ${lanes}`,
    );
  }
  return lanes;
}

/** Cameras on `lane` of `lanes`: camera i decodes on lane i % lanes. */
export function laneCameras(cameras: number, lanes: number, lane: number): number {
  return Math.floor((cameras - lane + lanes - 1) / lanes);
}

/** The lanes' accounts added field by field. */
export function sumTimeAccounts(accounts: readonly TimeAccount[]): TimeAccount {
  const sum: Record<string, number> = {};
  for (const a of accounts) for (const [k, v] of Object.entries(a)) sum[k] = (sum[k] ?? 0) + v;
  return sum as unknown as TimeAccount;
}

/** The lanes' memory: the model once, their contexts and compute buffers added. */
function sumMemory(parts: readonly MemoryBreakdown[]): MemoryBreakdown {
  const byType = new Map<string, { bufferType: string; model: number; context: number; compute: number }>();
  for (const [i, part] of parts.entries()) {
    for (const b of part.byBufferType) {
      const t = byType.get(b.bufferType) ?? { bufferType: b.bufferType, model: 0, context: 0, compute: 0 };
      if (i === 0) t.model += b.model;
      t.context += b.context;
      t.compute += b.compute;
      byType.set(b.bufferType, t);
    }
  }
  return {
    model: parts[0]?.model ?? 0,
    context: parts.reduce((n, p) => n + p.context, 0),
    compute: parts.reduce((n, p) => n + p.compute, 0),
    byBufferType: [...byType.values()],
  };
}

/** Deadlines this close count as one in admission's order: native/src/batch.cc kFairWindowNs. */
export const FAIR_WINDOW_NS = 50_000_000n;

interface Reservation {
  readonly deadlineNs: bigint;
  readonly camera: number;
}

/** Frames on their way to a shared decoder (Stage.reserve), counted in the order its admission
 * serves them: the earlier deadline first, and among deadlines within FAIR_WINDOW_NS of each other
 * (cameras triggered together) the camera served (decoded) least recently first. Without the turns, the
 * cameras whose frames carry the later stamps of each trigger would always be counted behind the
 * others and dropped first under overload. */
export class Reservations {
  readonly #held = new Set<Reservation>();
  /** camera → the turn its last frame got its decode (a counter: only the order matters) */
  readonly #servedAt = new Map<number, number>();
  #turn = 0;
  readonly #onChange: ((camera: number, delta: 1 | -1) => void) | undefined;

  /** `onChange(camera, ±1)` hears each reservation added and each removed, once. */
  constructor(onChange?: (camera: number, delta: 1 | -1) => void) {
    this.#onChange = onChange;
  }

  get size(): number {
    return this.#held.size;
  }

  /** A frame of `camera` got its decode: its camera's later frames go after the others'. */
  served(camera: number): void {
    this.#servedAt.set(camera, ++this.#turn);
  }

  /** Reserved frames that admission would serve before a frame of `camera` due at `deadlineNs` (a
   * frame's own reservation is never counted). */
  ahead(deadlineNs: bigint, camera: number): number {
    const mine = this.#servedAt.get(camera) ?? 0;
    let n = 0;
    for (const r of this.#held) {
      const gap = r.deadlineNs - deadlineNs;
      if (gap < -FAIR_WINDOW_NS) n += 1;
      else if (gap <= FAIR_WINDOW_NS) {
        const theirs = this.#servedAt.get(r.camera) ?? 0;
        if (theirs < mine || (theirs === mine && gap < 0n)) n += 1;
      }
    }
    return n;
  }

  /** Adds one; the returned release removes it (once, however often it is called). */
  add(deadlineNs: bigint, camera: number): () => void {
    const r: Reservation = { deadlineNs, camera };
    this.#held.add(r);
    this.#onChange?.(camera, 1);
    return () => {
      if (this.#held.delete(r)) this.#onChange?.(camera, -1);
    };
  }
}
