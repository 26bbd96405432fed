// The raw addon: typings of every class and function native/src exports, and the loader.
// Nothing here validates; native/llama.ts is the typed, validated API built on top.
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export type ImageAttention = 'causal' | 'bidirectional' | 'bidirectional-swa';

export interface NativeModelInfo {
  readonly arch: string;
  /** Row width of image embeddings (llama_model_n_embd_inp). */
  readonly nEmbd: number;
  readonly nEmbdText: number;
  readonly nEmbdOut: number;
  readonly nVocab: number;
  readonly nLayer: number;
  readonly nCtxTrain: number;
  readonly sizeBytes: number;
  readonly nParams: number;
  readonly chatTemplate: string | null;
  readonly imageStartToken: number | null;
  readonly imageEndToken: number | null;
  readonly imageAttention: ImageAttention;
  readonly bos: number;
  readonly eos: number;
  readonly vocabOnly: boolean;
  /** per_layer_token_embd was loaded on the GPU (LoadModelOptions.perLayerEmbeddingsOnGpu). */
  readonly perLayerEmbeddingsOnGpu: boolean;
}

export interface NativeLoadOptions {
  gpuLayers: number;
  mmap: boolean;
  vocabOnly: boolean;
  /** null: when every layer is offloaded. */
  perLayerEmbeddingsOnGpu: boolean | null;
  /** The table's tensor name, a regex (PER_LAYER_EMBEDDINGS). */
  perLayerEmbeddingsPattern: string;
}

export declare class NativeModel {
  private constructor();
  static load(path: string, options: NativeLoadOptions): Promise<NativeModel>;
  info(): NativeModelInfo;
  tokenize(text: string, addSpecial: boolean, parseSpecial: boolean): Int32Array;
  detokenize(tokens: Int32Array | readonly number[], special: boolean): string;
  tokenText(token: number): string;
  applyChatTemplate(messages: readonly { role: string; content: string }[], addGenerationPrompt: boolean): string;
  dispose(): void;
}

export interface NativeContextOptions {
  nCtx: number;
  nBatch: number;
  nUbatch: number;
  nSeq: number;
  /** One KV buffer for every sequence (else one stream per sequence). */
  kvUnified: boolean;
  /** nSeq > 1: sequences per batched step, and prompt positions per step. */
  maxActive: number;
  prefillChunk: number;
  /** nSeq > 1: arrivals wait for the running group and are admitted together as the next one. */
  admitTogether: boolean;
  /** Admitting together: the running group's tail takes the waiting requests in once they outnumber its members. */
  admitTail: boolean;
  /** Admitting the tail: the fewest waiting requests that go in beside it. */
  tailJoin: number;
  /** Admitting the tail: when that is predicted to end more requests in time, or as many sooner (not by count). */
  weighTail: boolean;
  /** Admitting together: one that would miss waiting for the group's end joins it at once (else it is dropped). */
  joinRunning: boolean;
  /** nSeq > 1: greedy requests without a grammar take their argmax in llama.cpp's graph. */
  backendSampling: boolean;
  /** Admitting together: how long an idle decoder holds its waiting requests for frames on their way (expect). */
  groupWaitMs: number;
  maxOutputs: number;
  /** Tokens per sequence and generation step, padded (1: no padding). */
  stepTokens: number;
  /** nSeq > 1, kvUnified: every token decode has a row and an output per sequence, rows padded to a multiple (0: off). */
  stepRows: number;
  /** CUDA: one ggml-cuda graph per step shape. */
  shapeGraphs: boolean;
  /** Built graphs kept besides the current one (0: only the last is reused). */
  graphSlots: number;
  /** A causal Gemma 4 image and the text after it in one decode. */
  mixedPrefill: boolean;
  /** nSeq > 1, kvUnified: a step's causal Gemma 4 image rows and its token rows in one decode. */
  mixSteps: boolean;
  flashAttention: boolean | 'auto';
  kvType: 'f16' | 'q8_0';
  threads: number;
}

export interface NativeContextInfo {
  readonly nCtx: number;
  readonly nBatch: number;
  readonly nUbatch: number;
  readonly nSeq: number;
  /** KV positions one sequence can hold. */
  readonly nCtxSeq: number;
  readonly kvUnified: boolean;
  readonly maxActive: number;
  readonly prefillChunk: number;
  readonly admitTogether: boolean;
  readonly admitTail: boolean;
  readonly tailJoin: number;
  readonly weighTail: boolean;
  readonly joinRunning: boolean;
  readonly backendSampling: boolean;
  readonly groupWaitMs: number;
  readonly maxOutputs: number;
  /** Tokens each sequence decodes per generation step, padded (1: no padding). */
  readonly stepTokens: number;
  /** Every token decode has a row and an output per sequence, its rows padded to a multiple of this (0: off). */
  readonly stepRows: number;
  /** Built graphs kept besides the current one, each with its scheduler (0: only the last is reused). */
  readonly graphSlots: number;
  /** A causal Gemma 4 image and the text after it share one decode. */
  readonly mixedPrefill: boolean;
  /** A step's causal image rows and its token rows share one decode (nSeq > 1). */
  readonly mixSteps: boolean;
  /** CUDA backends whose decode graphs ggml-cuda keeps one per step shape (0: none, or not asked). */
  readonly shapeGraphBackends: number;
  readonly threads: number;
  readonly flashAttention: boolean | 'auto';
  readonly kvType: 'f16' | 'q8_0';
}

export interface NativeMemoryBreakdown {
  readonly model: number;
  readonly context: number;
  readonly compute: number;
  readonly byBufferType: readonly { bufferType: string; model: number; context: number; compute: number }[];
}

export type NativeSegment =
  | { readonly text: string; readonly addSpecial: boolean }
  | { readonly tokens: Int32Array | readonly number[] }
  | { readonly image: Float32Array; readonly nTokens: number; readonly causal: boolean };

/** Every field but nDraft (absent: the speculator's nMax), deadlineNs and grammar is required. */
export interface NativeGenerateOptions {
  maxTokens: number;
  temperature: number;
  topK: number;
  topP: number;
  minP: number;
  seed: number;
  stopStrings: readonly string[];
  stopTokens: readonly number[];
  ignoreEos: boolean;
  jumpForward: boolean;
  recordSampleTimes: boolean;
  /** K (0..64): record the K largest raw logits of every sampled row; 0: none. Refused on a context of several sequences. */
  topLogits: number;
  speculative: boolean;
  /** A cancel() may come while llama.cpp computes: install its abort callback (else checked between tokens). */
  cancellable: boolean;
  nDraft?: number;
  /** Absolute, on the process.hrtime.bigint() clock. */
  deadlineNs?: bigint;
  grammar?: NativeGrammar;
  /** The sequence, on a context of several (required there, refused elsewhere). */
  seq?: number;
}

export type NativeStopReason = 'eos' | 'max_tokens' | 'stop' | 'cancelled' | 'deadline';

export interface NativeTimings {
  readonly prefillMs: number;
  readonly prefillTokens: number;
  /** llama_decode calls of the prefill (a single-sequence context; 0 in a batched one, whose steps are shared). */
  readonly prefillDecodeCalls: number;
  readonly ttftMs: number;
  readonly decodeMs: number;
  readonly decodeTokens: number;
  readonly decodeCalls: number;
  readonly sampleMs: number;
  readonly draftMs: number;
  /** Time inside llama_decode (+ synchronize) during generation; the rest is our loop. */
  readonly llamaDecodeMs: number;
  /** Generation decodes of exactly one real token (padding aside), and their time (the rest carry a forced run or drafts). */
  readonly singleDecodeCalls: number;
  readonly singleDecodeMs: number;
  /** Generation decodes where llama.cpp reused the previous graph (same ubatch shape). */
  readonly graphReuses: number;
  /** Generation decodes padded to the context's stepTokens. */
  readonly paddedSteps: number;
}

export interface NativeGenerateResult {
  readonly tokens: Int32Array;
  readonly text: string;
  readonly stopReason: NativeStopReason;
  readonly promptTokens: number;
  readonly reusedTokens: number;
  readonly drafted: number;
  readonly accepted: number;
  readonly forced: number;
  readonly draftsCut: number;
  readonly timings: NativeTimings;
  /** Microseconds of each sampling step (with recordSampleTimes). */
  readonly sampleUs?: Float32Array;
  /** The K largest raw logits of each sampled row, highest first (with topLogits > 0). */
  readonly topLogits?: readonly NativeTopLogits[];
  /** On a context of several sequences: where the request stood in the batch schedule. */
  readonly batch?: NativeBatchCounts;
}

/** One sampled row's largest raw logits: `step` indexes the token it sampled in the result's tokens. */
export interface NativeTopLogits {
  readonly step: number;
  readonly ids: Int32Array;
  readonly logits: Float32Array;
}

export interface NativeBatchCounts {
  readonly seq: number;
  /** Submit → admission into the batch. */
  readonly queueMs: number;
  /** Batched steps run while it waited for admission. */
  readonly waitSteps: number;
  /** Batched steps from its admission to its end (each one llama_decode over every active sequence). */
  readonly steps: number;
  /** Most sequences that shared one of its steps (itself included). */
  readonly peakSeqs: number;
  /** Its steps whose token decode ran on llama.cpp's previous graph (an unchanged ubatch shape). */
  readonly graphReuses: number;
  /** At admission (or when it ended waiting), the time predicted for its prefill and generation at the
   * sharing it would join: the median recent prefill time + recent requests' generation steps (median)
   * × recent step time (mean), plus a margin of two standard deviations of that sum; an idle decoder
   * drops by its fastest recent prefill and step, with no margin (0: nothing to predict from). */
  readonly predictedMs: number;
  /** Dropped at admission, before any prefill: predictedMs would pass its deadline (stopReason 'deadline', no tokens). */
  readonly predictedMiss: boolean;
  /** Its tokens were taken in llama.cpp's graph (greedy, no grammar, ContextOptions.backendSampling). */
  readonly backendSampled: boolean;
}

/** A batched context's prediction for a request submitted now (ms): the wait before its own run, and that run. */
export interface NativePrediction {
  readonly waitMs: number;
  readonly ownMs: number;
}

/** Where a batched context's scheduler spent its time (ms), as of its last step: its steps, and within them the image
 * decodes, the token decodes (llama_decode to synchronize) and the sampling after them; its holds for frames on their way. */
export interface NativeTimeAccount {
  /** Admissions into an idle decoder: admitting together, the groups. */
  readonly groups: number;
  /** Admissions beside a running group, by any rule (a frame that would miss waiting, the tail). */
  readonly joins: number;
  readonly steps: number;
  readonly stepMs: number;
  readonly imageMs: number;
  readonly tokenMs: number;
  readonly sampleMs: number;
  readonly holdMs: number;
  /** Image decodes and their rows. */
  readonly imageDecodes: number;
  readonly imageRows: number;
  /** Token decodes, their rows (padding included) and the sequences each covered, summed. */
  readonly tokenDecodes: number;
  readonly tokenRows: number;
  readonly tokenSeqs: number;
  /** Token decodes that reused llama.cpp's graph, and their time (within tokenMs). */
  readonly reusedDecodes: number;
  readonly reusedMs: number;
  /** Image decodes that carried the step's token rows too (mixSteps), and those rows; within imageDecodes and imageMs. */
  readonly mixedDecodes: number;
  readonly mixedTokenRows: number;
  /** Weighing the tail: admissions beside a running group, and steps that held waiting requests for its end. */
  readonly tailJoins: number;
  readonly tailHolds: number;
}

export interface NativeCeilingOptions {
  readonly sequences: number;
  readonly promptTokens: number;
  readonly steps: number;
  readonly repeats: number;
}

/** Per repeat: the ms of every prompt's prefill, and of every decode step together. */
export interface NativeCeilingTimes {
  readonly prefillMs: number[];
  readonly decodeMs: number[];
}

export declare class NativeContext {
  private constructor();
  static create(model: NativeModel, options: NativeContextOptions): Promise<NativeContext>;
  info(): NativeContextInfo;
  memoryBreakdown(): NativeMemoryBreakdown;
  generate(
    prompt: readonly NativeSegment[],
    options: NativeGenerateOptions,
    onTokens?: (tokens: Int32Array) => void,
  ): Promise<NativeGenerateResult>;
  /** Several sequences: cancel(seq) cancels that sequence's generation, cancel() every one. */
  cancel(seq?: number): void;
  /** Several sequences: the sequence is required. */
  clearCache(seq?: number): void;
  cachedPositions(seq?: number): number;
  /** Several sequences: frames on their way to `seq`, +1 when one is reserved, -1 when it is submitted or dropped. */
  expect(seq: number, delta: 1 | -1): void;
  /** Step shapes given their own CUDA graph key so far (0 without shape graphs). */
  shapeGraphShapes(): number;
  /** Several sequences: the ms admission would predict for a request with this deadline submitted now, as the wait
   * before its own run and that run (both 0: none). */
  prediction(deadlineNs?: bigint, reservedAhead?: number): NativePrediction;
  /** Several sequences: when the request of `seq` ends, predicted from now (ms); -1: none known. */
  restMs(seq: number): number;
  /** Several sequences: where the scheduler's time went so far (ms); null with one sequence. */
  timeAccount(): NativeTimeAccount | null;
  /** Times raw decodes of one shape, as llama-batched-bench does (native/src/batch.h timeCeiling). */
  measureCeiling(options: NativeCeilingOptions): Promise<NativeCeilingTimes>;
  /** Creates the speculator's state off the JS thread (the KV cache starts empty afterwards). */
  attachSpeculator(draftModel: NativeModel | null, options: NativeSpeculatorOptions): Promise<{ type: SpeculatorType; nMax: number }>;
  detachSpeculator(): void;
  dispose(): void;
}

export interface NativeGrammarIndexInfo {
  /** Byte-automaton states, and those met at token boundaries. */
  readonly states: number;
  readonly tokenStates: number;
  /** (token, next state) pairs over all states. */
  readonly entries: number;
  /** Most tokens one state admits. */
  readonly maxAllowed: number;
  /** Token-boundary states with a forced run (jump-forward). */
  readonly forcedStates: number;
  /** Admissible tokens dropped because no completion follows them. */
  readonly prunedEntries: number;
  /** Worst-case tokens of a complete output; null when a cycle makes it unbounded. */
  readonly worstCaseTokens: number | null;
  /** Worst-case tokens the model picks in a complete output (end of generation included where the
   * grammar may end): with jump-forward, llama_decode calls after the prompt ≤ this − 1. Null when unbounded. */
  readonly maxChoices: number | null;
  readonly buildMs: number;
  /** Time spent building the model's vocabulary trie in this call (0 when it existed). */
  readonly trieMs: number;
}

export type NativeGrammarIndexResult =
  { readonly index: NativeGrammarIndexInfo; readonly fallback: null } | { readonly index: null; readonly fallback: string };

export declare class NativeGrammar {
  constructor(model: NativeModel, gbnf: string, root?: string);
  source(): string;
  buildIndex(limits: { maxStates: number; maxEntries: number }): Promise<NativeGrammarIndexResult>;
  indexInfo(): NativeGrammarIndexResult | undefined;
  allowedTokens(prefix: Int32Array | readonly number[], via: 'index' | 'llama'): Promise<Int32Array>;
  forcedTokens(prefix: Int32Array | readonly number[]): Int32Array;
  admits(text: string): boolean;
}

export type SpeculatorType = 'draft-simple' | 'draft-mtp' | 'ngram-simple' | 'ngram-map-k' | 'ngram-map-k4v' | 'ngram-mod';

export interface NativeSpeculatorOptions {
  type: SpeculatorType;
  nMax: number;
  nMin: number;
  pMin: number;
  ngramN: number;
}

export interface NativeAddon {
  readonly Model: typeof NativeModel;
  readonly Context: typeof NativeContext;
  readonly Grammar: typeof NativeGrammar;
  readonly Vision: typeof NativeVision;
  jsonSchemaToGrammar(schemaJson: string): string;
  setLogger(callback: ((level: number, text: string) => void) | null): void;
  systemInfo(): string;
  /** Preprocessing's layout pass (native/src/pixels.cc). */
  layoutPixels(src: Uint8Array, out: Float32Array, options: NativeLayoutOptions): Promise<number>;
  /** mtmd_decode_use_non_causal() for a text model of this architecture and input width. */
  imageAttentionRule(arch: string, nEmbd: number): ImageAttention;
  readonly llamaVersion: string;
  /** percept's own GPU code in this build: the vision graph's attention kernel (CUDA builds) and the
   * JPEG decoder (CUDA builds whose toolkit has nvJPEG). Whether they run depends on the device too. */
  readonly gpuKernels: { readonly visionAttention: boolean; readonly jpegDecoder: boolean };
}

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
/** Where tools/build-native.mjs puts the addon; PERCEPT_NATIVE overrides (a prebuilt elsewhere). */
export const ADDON_PATH = process.env.PERCEPT_NATIVE ?? join(ROOT, 'build', 'native', 'Release', 'percept.node');

/**
 * Spins at each OpenMP barrier before a thread sleeps; llama.cpp's CPU backend ends every graph node in one.
 * libgomp's default, 300,000, collapses 2-thread decoding when another process shares the cores:
 * a spinning thread holds the core its partner needs. Set before the addon loads libgomp.
 * GOMP_SPINCOUNT or OMP_WAIT_POLICY in the environment win. Children (llama-bench) inherit it.
 */
export const OPENMP_SPIN_COUNT = 100;

/**
 * The widest quantized matmul (tokens) that takes llama.cpp's own kernels (MMQ) on NVIDIA tensor cores; wider ones
 * (prefills) take cuBLAS on F16 weights (native/patches/ggml-cuda-mmq-max-batch.diff, docs/gpu.md). Decode steps of up
 * to this many tokens keep MMQ, which is faster there. Set before the addon loads; PERCEPT_CUDA_MMQ_MAX_BATCH wins.
 * Children (llama-bench) inherit it.
 */
export const CUDA_MMQ_MAX_BATCH = 128;

/**
 * Whether ggml-cuda keeps an F16 copy of each quantized weight for those wide matmuls instead of dequantizing it at
 * every one (native/patches/ggml-cuda-f16-weights.diff, docs/gpu.md): 2 bytes a weight of GPU memory, never past an
 * eighth of the device left free. Set before the addon loads; PERCEPT_CUDA_F16_WEIGHTS wins (0: off).
 */
export const CUDA_F16_WEIGHTS = true;

/**
 * Whether cuBLAS's F16 matmuls on Hopper accumulate and write F32, so no kernel converts each output
 * (native/patches/ggml-cuda-cublas-f32-out.diff, docs/gpu.md). Other GPUs are unaffected. Set before the addon loads;
 * PERCEPT_CUDA_CUBLAS_F32_OUT wins (0: off).
 */
export const CUDA_CUBLAS_F32_OUT = true;

/** The variables those patches read, each with the default the loader sets where the environment names none. */
export const CUDA_PATCH_DEFAULTS: Readonly<Record<string, string>> = {
  PERCEPT_CUDA_MMQ_MAX_BATCH: String(CUDA_MMQ_MAX_BATCH),
  PERCEPT_CUDA_F16_WEIGHTS: CUDA_F16_WEIGHTS ? '1' : '0',
  PERCEPT_CUDA_CUBLAS_F32_OUT: CUDA_CUBLAS_F32_OUT ? '1' : '0',
};

/** The paths of ggml-cuda's matmuls that the three variables above pick, as a bench's JSON reports them: the widest
 * matmul kept on MMQ (null: every width), whether F16 copies of the weights are kept, whether cuBLAS writes F32 on Hopper. */
export interface CudaMatmuls {
  readonly mmq_max_batch: number | null;
  readonly f16_weights: boolean;
  readonly cublas_f32_out: boolean;
}

/** Reads CudaMatmuls as the patches do; after loadAddon, process.env holds the defaults it set. */
export function cudaMatmuls(env: NodeJS.ProcessEnv = process.env): CudaMatmuls {
  const mmq = env.PERCEPT_CUDA_MMQ_MAX_BATCH;
  const on = (value: string | undefined) => value !== undefined && value !== '' && value !== '0';
  return {
    mmq_max_batch: mmq === undefined || !/^\d+$/.test(mmq) ? null : Number(mmq),
    f16_weights: on(env.PERCEPT_CUDA_F16_WEIGHTS),
    cublas_f32_out: on(env.PERCEPT_CUDA_CUBLAS_F32_OUT),
  };
}

/** Loads the addon (Node's module cache makes repeated calls free) with a clear error when missing. */
export function loadAddon(): NativeAddon {
  if (!existsSync(ADDON_PATH)) {
    throw new Error(`percept native addon not found at ${ADDON_PATH}: run \`node tools/build-native.mjs\``);
  }
  if (process.env.GOMP_SPINCOUNT === undefined && process.env.OMP_WAIT_POLICY === undefined) {
    process.env.GOMP_SPINCOUNT = String(OPENMP_SPIN_COUNT);
  }
  for (const [name, value] of Object.entries(CUDA_PATCH_DEFAULTS)) process.env[name] ??= value;
  const require = createRequire(import.meta.url);
  const addon = require(ADDON_PATH) as NativeAddon;
  if (typeof addon.Model !== 'function') {
    throw new Error(`${ADDON_PATH} is not the percept addon (no Model export): rebuild with \`node tools/build-native.mjs\``);
  }
  return addon;
}

/** layoutPixels' options, every field given (native/pixels.ts documents them and owns the defaults). */
export interface NativeLayoutOptions {
  readonly width: number;
  readonly height: number;
  readonly channels: number;
  readonly stride: number;
  readonly rows: number;
  readonly kernel: 'linear' | 'cubic';
  readonly orientation: number;
  readonly bgr: boolean;
  readonly layout: 'chw' | 'patches';
  readonly patch: number;
  readonly scale: number;
  readonly offset: number;
}

/** Flash attention in the vision tower. 'auto': percept's own kernel on CUDA (native/src/vision-attention.cu,
 * head sizes up to 128), else ggml's where the backend runs it; 'percept': percept's kernel (percept's graph
 * on a CUDA build only); 'on': ggml's at the tower's head size; 'padded': ggml's with each head zero-padded to
 * a size ggml-cuda has tensor-core kernels for (72 → 80, 40 → 64; percept's graph only, clip runs it as 'on'). */
export type VisionFlashAttention = 'auto' | 'on' | 'off' | 'padded' | 'percept';

export interface NativeVisionLoadOptions {
  useGpu: boolean;
  /** CPU threads for encode. */
  threads: number;
  flashAttention: VisionFlashAttention;
  /** Allocate the compute buffers at load with a full-size dummy image (first encode is not slower). */
  warmup: boolean;
  /** Install clip's graph-evaluation callback so encodes can report where their time goes. */
  profile: boolean;
  /** 'percept': percept's persistent graph over clip's weights, where it mirrors the tower (else
   * clip's encode, with the reason in info().graphFallback); 'clip': clip's own encode. */
  graph: 'percept' | 'clip';
}

export interface NativeVisionInfo {
  readonly projector: 'gemma3' | 'gemma4v';
  readonly contract: 'gemma3' | 'gemma4';
  /** Output width: clip_n_mmproj_embd, the decoder's n_embd. */
  readonly nEmbd: number;
  /** Vision tower width, layers, heads, FFN. */
  readonly hidden: number;
  readonly layers: number;
  readonly heads: number;
  readonly ffn: number;
  readonly patchSize: number;
  /** gemma3: the only accepted input side (896); gemma4v: unused. */
  readonly imageSize: number;
  /** Average-pool kernel over the patch grid. */
  readonly merge: number;
  /** gemma4v: entries in each (x, y) position table; 0 for gemma3. */
  readonly positionTable: number;
  readonly threads: number;
  readonly useGpu: boolean;
  /** Weights + compute buffers per backend device. */
  readonly devices: readonly { name: string; bytes: number }[];
  /** Which graph encodes: percept's persistent one, or clip's (asked for, or the fallback). */
  readonly graph: 'percept' | 'clip';
  /** Why clip encodes although percept's graph was asked for (a part of the tower it does not
   * mirror, or an op the backend cannot run); null otherwise. */
  readonly graphFallback: string | null;
  /** percept's graph: flash attention as resolved, one split, its nodes for one image, its compute
   * buffer as laid out at load. clip: what it reported when it reserved its graph at load (flash
   * attention null when it did not say), graph splits across backends (1: all on one), compute
   * buffers, and the ops the GPU backend cannot run (they run on the CPU, with copies both ways). */
  readonly flashAttention: boolean | null;
  /** The head size flash attention runs at: the tower's, or above it when padded; null without it
   * (or when clip did not say). */
  readonly flashAttentionHead: number | null;
  /** Whose kernel runs the tower's flash attention: 'percept' (percept's graph on CUDA) or 'ggml';
   * null without flash attention (or when clip did not say). */
  readonly attentionKernel: 'percept' | 'ggml' | null;
  readonly graphSplits: number;
  readonly graphNodes: number;
  /** percept's graph: bytes of weights it copied at load in another layout, on the weights' device
   * (gemma3's transposed input projection; SigLIP's q/k/v/o with heads zero-padded for a padded flash
   * attention; gemma4v's q/k with each head reordered for one RoPE op); 0 for clip's graph. */
  readonly copiedWeightBytes: number;
  readonly computeBuffers: readonly { name: string; bytes: number }[];
  readonly unsupportedOps: readonly string[];
  /** Several same-size images go through one graph (percept's graph, clip's gemma4v); otherwise
   * encodeBatch loops. */
  readonly batchable: boolean;
  /** Loaded with profile: encodes can report where their time goes. */
  readonly profile: boolean;
  /** encodeJpeg runs: percept's graph on a CUDA device, in a build with nvJPEG. */
  readonly decodesJpeg: boolean;
}

/** Where one encode through percept's graph spent its time (ms), reported on every call. */
export interface NativeVisionPhases {
  /** Building this shape's graph (its first encode only). */
  readonly buildMs: number;
  /** Laying out the compute buffer for it (when another shape used the buffer last). */
  readonly allocMs: number;
  /** Pixels into the graph's input (host → device on a GPU). */
  readonly uploadMs: number;
  readonly computeMs: number;
  /** Embeddings back to the host. */
  readonly readMs: number;
  /** encodeJpeg: nvJPEG's decode, and the kernel that resampled and laid out the pixels (uploadMs
   * covers both). */
  readonly jpegDecodeMs?: number;
  readonly deviceLayoutMs?: number;
}

/** Where one encode's time went: clip's graph-evaluation callback, or percept's phases. */
export interface NativeVisionProfile {
  /** Before the first graph node finished: graph build, allocation, input upload. */
  readonly setupMs: number;
  /** The rest: graph compute and the output read-back. */
  readonly computeMs: number;
  /** 'ops' only: per op type, synchronized after every node (totals exceed an unprofiled run). */
  readonly ops?: readonly { op: string; ms: number; count: number; onHost: number }[];
}

export interface NativeVisionEncodeOptions {
  /** 'chw': planar [3,H,W]; 'patches': row-major patches of patch×patch×3 HWC values (padding after). */
  layout: 'chw' | 'patches';
  width: number;
  height: number;
  /** 'phases' or 'ops' need a context loaded with profile. */
  profile: 'off' | 'phases' | 'ops';
}

/** A JPEG frame for the GPU path: its bytes, its size as stored and its EXIF orientation (1–8), read
 * from its header. */
export interface NativeJpegFrame {
  data: Uint8Array;
  storedWidth: number;
  storedHeight: number;
  orientation: number;
}

export interface NativeVisionJpegOptions extends NativeVisionEncodeOptions {
  /** PIL's antialiased resampling filter. */
  kernel: 'linear' | 'cubic';
  /** value = (v/255 − offset)/scale. */
  scale: number;
  offset: number;
}

export interface NativeVisionEncodeResult {
  /** nTokens × nEmbd floats. */
  readonly data: Float32Array;
  readonly nTokens: number;
  readonly nEmbd: number;
  /** The graph that encoded. */
  readonly path: 'percept' | 'clip';
  /** Layout conversion into clip's image buffer (percept: the output allocation), and the encode itself. */
  readonly prepareMs: number;
  readonly encodeMs: number;
  /** percept's graph only. */
  readonly phases?: NativeVisionPhases;
  readonly profile?: NativeVisionProfile;
}

export interface NativeVisionBatchResult extends Omit<NativeVisionEncodeResult, 'data'> {
  /** One nTokens × nEmbd array per image (views of one buffer). */
  readonly data: Float32Array[];
  /** The images went through one graph (else one after the other). */
  readonly batched: boolean;
}

export declare class NativeVision {
  private constructor();
  static load(path: string, options: NativeVisionLoadOptions): Promise<NativeVision>;
  info(): NativeVisionInfo;
  /** Reads `pixels` on a worker thread until the promise settles: do not modify or transfer it before. */
  encode(pixels: Float32Array, options: NativeVisionEncodeOptions): Promise<NativeVisionEncodeResult>;
  /** Same-size images in one call; each array is read until the promise settles. */
  encodeBatch(images: Float32Array[], options: NativeVisionEncodeOptions): Promise<NativeVisionBatchResult>;
  /** One JPEG decoded (nvJPEG) and laid out on the graph's GPU; rejects with ENOTSUP where info().decodesJpeg is false. */
  encodeJpeg(frames: [NativeJpegFrame], options: NativeVisionJpegOptions): Promise<NativeVisionEncodeResult>;
  /** 1 to 64 JPEG frames of one target size in one graph. */
  encodeJpegBatch(frames: NativeJpegFrame[], options: NativeVisionJpegOptions): Promise<NativeVisionBatchResult>;
  /** The input encodeJpeg would make from the frame (width × height × 3 floats in the layout), read back. */
  jpegPixels(frames: [NativeJpegFrame], options: NativeVisionJpegOptions): Promise<Float32Array>;
  /** `length` floats in the device's pinned host memory; undefined where there is none (CPU, clip's own encode). */
  allocatePixels(length: number): Float32Array | undefined;
  dispose(): void;
}
