// The typed, validated API over the native llama.cpp binding: LlamaModel, LlamaContext,
// LlamaGrammar, LlamaSpeculator. Arguments are checked here (errors name the argument), then
// cross into C++ once per call; every slow call runs off the JS thread and returns a promise.
import { stat } from 'node:fs/promises';
import { availableParallelism } from 'node:os';
import { bool, coded, graft, intIn, invalid, knownKeys, nonEmptyString, numIn, oneOf, plainObject } from './args.ts';
import { jsonSchemaToGbnf, type GbnfOptions } from './schema-grammar.ts';
import {
  loadAddon,
  type ImageAttention,
  type NativeContext,
  type NativeContextInfo,
  type NativeGenerateResult,
  type NativeGrammar,
  type NativeGrammarIndexInfo,
  type NativeMemoryBreakdown,
  type NativeModel,
  type NativeModelInfo,
  type NativeSegment,
  type NativeStopReason,
  type NativeTimings,
  type NativeBatchCounts,
  type NativeCeilingTimes,
  type NativePrediction,
  type NativeTimeAccount,
  type SpeculatorType,
} from './binding.ts';

export type {
  ImageAttention,
  NativeModelInfo as ModelInfo,
  NativeContextInfo as ContextInfo,
  NativeMemoryBreakdown as MemoryBreakdown,
  NativeGrammarIndexInfo as GrammarIndexInfo,
};
export type StopReason = NativeStopReason;
export type Timings = NativeTimings;
export type BatchCounts = NativeBatchCounts;

// ---------------------------------------------------------------------------------------------
// Binding defaults. This file owns them: C++ requires every field and checks only shape and range.

/** KV cache positions of a context. */
export const DEFAULT_N_CTX = 4096;
/** Logical and physical batch (tokens per llama_decode call). */
export const DEFAULT_N_BATCH = 512;
/** Longest draft per speculative step. */
export const DRAFT_MAX = 4;
/**
 * Logits rows of one decode. A verify batch reads the row of the last certain token (the one sampled,
 * or the end of a jump-forward run: the run's earlier tokens ride in the batch without rows) and one
 * row per draft; forced tokens inside a draft are drafts and count toward DRAFT_MAX. The generate loop
 * caps a draft at maxOutputs − 1, so a larger nDraft needs a context with more outputs.
 */
export const MAX_OUTPUTS = 1 + DRAFT_MAX;
/** Automaton states before a grammar is declared too big for a token index. */
export const GRAMMAR_MAX_STATES = 20000;
/** (token, state) entries before a grammar is declared too big for a token index (64 MiB). */
export const GRAMMAR_MAX_ENTRIES = 8 << 20;
/** Sequences of one context at most (one per camera). */
export const MAX_SEQUENCES = 256;
/** Context options only a context of several sequences takes (nSeq > 1). */
const SEQUENCE_OPTIONS = [
  'kvUnified',
  'maxActive',
  'prefillChunk',
  'admitTogether',
  'admitTail',
  'tailJoin',
  'weighTail',
  'joinRunning',
  'backendSampling',
  'groupWaitMs',
] as const;
/**
 * Built graphs a context keeps besides its current one (ContextOptions.graphSlots).
 * Jump-forward alternates step shapes, and each shape keeps its graph in a slot; more than 4 gained nothing.
 * 0: llama.cpp's own last-graph reuse. Figures: native/README.md#measurements.
 */
export const DEFAULT_GRAPH_SLOTS = 4;
export const MAX_GRAPH_SLOTS = 16;
/** n-gram length that n-gram speculators match. */
export const DEFAULT_NGRAM_N = 3;
/** CPU threads of a context: every core. */
export const defaultThreads = (): number => availableParallelism();

// ---------------------------------------------------------------------------------------------

/** The image attention rule of a model (mirrors mtmd_decode_use_non_causal()). */
export function imageAttentionRule(arch: string, nEmbd: number): ImageAttention {
  if (typeof arch !== 'string') throw invalid('arch', 'a string', arch);
  intIn('nEmbd', nEmbd, 1, 1 << 20);
  return loadAddon().imageAttentionRule(arch, nEmbd);
}

/** Forwards llama.cpp logs to `callback` (level: 1 debug, 2 info, 3 warn, 4 error), or quiets them (null). */
export function setLlamaLogger(callback: ((level: number, text: string) => void) | null): void {
  if (callback !== null && typeof callback !== 'function') throw invalid('callback', 'a function or null', callback);
  loadAddon().setLogger(callback);
}

// ---------------------------------------------------------------------------------------------

/** Gemma 4's per-layer embedding table, which LoadModelOptions.perLayerEmbeddingsOnGpu moves: a regex over tensor names (llama.cpp's `-ot`). */
export const PER_LAYER_EMBEDDINGS = '^per_layer_token_embd\\.weight$';

export interface LoadModelOptions {
  /** Layers offloaded to the GPU (-1: all). Default 0. */
  readonly gpuLayers?: number;
  readonly mmap?: boolean;
  /** Load only the tokenizer (no weights; no context can be created). */
  readonly vocabOnly?: boolean;
  /**
   * Gemma 4's per-layer embedding table (per_layer_token_embd) on the first GPU, with the layers. llama.cpp keeps it in
   * host memory and gathers each decode's rows on the CPU. Default: when every layer is offloaded (gpuLayers -1 or more
   * than the model's layers). No effect without a GPU or the table. `info.perLayerEmbeddingsOnGpu` says where it went.
   */
  readonly perLayerEmbeddingsOnGpu?: boolean;
}

export interface ChatMessage {
  readonly role: 'system' | 'user' | 'assistant';
  readonly content: string;
}

export interface ContextOptions {
  /** KV positions per sequence. */
  readonly nCtx?: number;
  readonly nBatch?: number;
  /** Physical batch; an image with bidirectional attention must fit in one ubatch. */
  readonly nUbatch?: number;
  /** Most outputs in one batch (sizes the compute buffer). Default MAX_OUTPUTS (at most nBatch). */
  readonly maxOutputs?: number;
  readonly flashAttention?: boolean | 'auto';
  readonly kvType?: 'f16' | 'q8_0';
  /** CPU threads (default: every core). */
  readonly threads?: number;
  /**
   * Sequences (default 1). With more than one, generate() takes `seq` and the calls on different
   * sequences run together, batched: one llama_decode per step over every running sequence (see
   * native/src/batch.h for the admission and prefill policies). No speculator on such a context.
   */
  readonly nSeq?: number;
  /** Several sequences: one KV buffer shared by all (true) or one stream per sequence (default false). */
  readonly kvUnified?: boolean;
  /** Several sequences: how many take part in one step at most (default nSeq); the rest wait in arrival order. */
  readonly maxActive?: number;
  /** Several sequences: prompt positions decoded per step at most, shared among joining prompts (default nUbatch). */
  readonly prefillChunk?: number;
  /**
   * Several sequences (default false): requests that arrive while others generate wait for them to end, unless they
   * would then miss their deadline, and are admitted together. Their prompts are read in as few decodes as nBatch and
   * nUbatch take, not prefillChunk at a time (native/README.md#admitting-together).
   */
  readonly admitTogether?: boolean;
  /**
   * Admitting together (default false): the running group's tail takes the waiting requests in once no more of its
   * members run than requests wait, so their prefill rides with its last steps instead of waiting for its longest member
   * (native/README.md#admitting-together).
   */
  readonly admitTail?: boolean;
  /** With admitTail (default 1): the fewest waiting requests that go in beside the tail, so that their image decode
   * reads several frames at once; fewer wait for the group's end. */
  readonly tailJoin?: number;
  /**
   * With admitTail (default false): the tail takes the waiting requests in when that is predicted to end more requests
   * by their deadlines, or as many sooner in all, instead of by count (native/README.md#the-tail-by-weight).
   */
  readonly weighTail?: boolean;
  /**
   * Admitting together without admitTail (default true): a waiting request that would miss its deadline by waiting for
   * the running group's end joins it at once. False: it is dropped as a predicted miss instead, so groups stay whole and
   * its sequence's next request can go in the next group (native/README.md#admitting-together).
   */
  readonly joinRunning?: boolean;
  /**
   * Several sequences (default true): a greedy request without a grammar takes its argmax in llama.cpp's graph, through
   * a backend sampler on its sequence, so a step whose outputs are all such requests copies no logits to the host.
   * `result.batch.backendSampled` says which requests did (native/README.md#backend-sampling).
   */
  readonly backendSampling?: boolean;
  /**
   * Admitting together (default 0): how long (ms) an idle decoder holds its waiting requests for the requests on their way
   * to other sequences (`expect`), so frames triggered together form one group. Only while each waiting request could
   * still make its deadline after the hold.
   */
  readonly groupWaitMs?: number;
  /**
   * Tokens each sequence decodes per generation step (default 1): the sampled token and any forced
   * run, then padding that is dropped from the KV cache, so the steps keep one shape: llama.cpp
   * reuses its graph and ggml-cuda replays its CUDA graph from step to step (and with a KV stream
   * per sequence, a batched step stays one ubatch). A forced run longer than the step goes on in
   * the next. On a fast GPU the padded rows cost about what the replay saves;
   * `percept bench frame --step-tokens N` measures it on another machine.
   * One sequence: no padding while a speculator is attached (it reads the target's batches).
   */
  readonly stepTokens?: number;
  /**
   * Several sequences in one KV buffer (default 0: off). Every token decode gets a row and an output for every
   * sequence (a padding row at the next position of one that has none) and padding rows up to a multiple of
   * stepRows, so its rows, outputs and sequences repeat from step to step and llama.cpp reuses its graph. The
   * padding's KV cells (nSeq + stepRows − 1 besides the sequences') are dropped after each decode. On an H100 the
   * padded rows cost more than the reuse saved (docs/cameras.md), so it is off unless asked for.
   */
  readonly stepRows?: number;
  /**
   * CUDA (default false): ggml-cuda keeps one CUDA graph per step shape instead of one per context.
   * It keys its graphs by the first node's address, which every graph of a llama_context shares,
   * so steps that alternate between a token and a token with its forced run never replay; with
   * this each shape captures and replays its own graph, by ggml-cuda's own rules (see ShapeGraphs
   * in native/src/llama-internal.h). Nothing happens without a CUDA backend or where
   * GGML_CUDA_DISABLE_GRAPHS is set (process-wide). `info.shapeGraphBackends` says where it took.
   */
  readonly shapeGraphs?: boolean;
  /**
   * Built graphs kept besides the current one (default DEFAULT_GRAPH_SLOTS, 0..MAX_GRAPH_SLOTS), each
   * with the llama.cpp scheduler that allocated it. llama.cpp reuses only the last step's graph, so
   * steps that alternate between shapes rebuilt and re-allocated it every time; a kept graph is
   * reused through llama.cpp's own check (native/patches/llama-graph-slots.diff). Each slot costs a
   * compute buffer of its own (LlamaContext.memoryBreakdown counts them); 0 is llama.cpp's behaviour.
   */
  readonly graphSlots?: number;
  /**
   * A Gemma 4 image read causally (E2B, E4B) shares one llama_decode with the prompt text after it, one decode
   * fewer a prefill (default true; native/patches/llama-mixed-batch-gemma4.diff). Other models, images read both
   * ways and contexts with a speculator decode the image on its own either way.
   */
  readonly mixedPrefill?: boolean;
  /**
   * nSeq > 1, kvUnified, no stepRows: a step's causal Gemma 4 image rows share one llama_decode with its token rows
   * (the other sequences' tokens, and the text after an image the step completes). Default false: on an H100 it did
   * not raise bench cameras' actions/s (native/README.md#mixed-steps).
   */
  readonly mixSteps?: boolean;
}

export class LlamaModel {
  readonly path: string;
  readonly info: NativeModelInfo;
  readonly #native: NativeModel;
  readonly #contexts = new Set<LlamaContext>();
  #disposed = false;

  private constructor(path: string, native: NativeModel) {
    this.path = path;
    this.#native = native;
    this.info = native.info();
  }

  /** Loads a GGUF (gemma3, gemma4 or gemma4-assistant) off the JS thread. */
  static async load(path: string, options: LoadModelOptions = {}): Promise<LlamaModel> {
    nonEmptyString('path', path);
    const o = plainObject('options', options);
    knownKeys('options', o, ['gpuLayers', 'mmap', 'vocabOnly', 'perLayerEmbeddingsOnGpu']);
    const gpuLayers = options.gpuLayers === undefined ? 0 : intIn('options.gpuLayers', options.gpuLayers, -1, 100000);
    const mmap = options.mmap === undefined ? true : bool('options.mmap', options.mmap);
    const vocabOnly = options.vocabOnly === undefined ? false : bool('options.vocabOnly', options.vocabOnly);
    const perLayerEmbeddingsOnGpu =
      options.perLayerEmbeddingsOnGpu === undefined ? null : bool('options.perLayerEmbeddingsOnGpu', options.perLayerEmbeddingsOnGpu);
    const stack = new Error();
    try {
      const s = await stat(path);
      if (!s.isFile()) throw coded('EISDIR', `model path is not a file: ${path}`);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw coded('ENOENT', `model file not found: ${path}`);
      throw err;
    }
    try {
      const native = await loadAddon().Model.load(path, {
        gpuLayers,
        mmap,
        vocabOnly,
        perLayerEmbeddingsOnGpu,
        perLayerEmbeddingsPattern: PER_LAYER_EMBEDDINGS,
      });
      return new LlamaModel(path, native);
    } catch (err) {
      throw graft(err, stack);
    }
  }

  /** @internal the raw handle, for LlamaContext and LlamaGrammar. */
  get native(): NativeModel {
    if (this.#disposed) throw coded('EDISPOSED', 'LlamaModel is disposed');
    return this.#native;
  }

  get disposed(): boolean {
    return this.#disposed;
  }

  tokenize(text: string, options: { addSpecial?: boolean; parseSpecial?: boolean } = {}): Int32Array {
    if (typeof text !== 'string') throw invalid('text', 'a string', text);
    return this.native.tokenize(text, options.addSpecial ?? false, options.parseSpecial ?? true);
  }

  detokenize(tokens: Int32Array | readonly number[], options: { special?: boolean } = {}): string {
    return this.native.detokenize(checkTokens('tokens', tokens, this.info.nVocab), options.special ?? false);
  }

  tokenText(token: number): string {
    return this.native.tokenText(intIn('token', token, 0, this.info.nVocab - 1));
  }

  /** Renders messages with the model's own chat template (jinja, through llama.cpp common/chat). */
  renderChat(messages: readonly ChatMessage[], options: { addGenerationPrompt?: boolean } = {}): string {
    if (!Array.isArray(messages) || messages.length === 0) throw invalid('messages', 'a non-empty array of {role, content}', messages);
    messages.forEach((m, i) => {
      plainObject(`messages[${i}]`, m);
      oneOf(`messages[${i}].role`, m.role, ['system', 'user', 'assistant']);
      if (typeof m.content !== 'string') throw invalid(`messages[${i}].content`, 'a string', m.content);
    });
    return this.native.applyChatTemplate(messages, options.addGenerationPrompt ?? true);
  }

  /**
   * A chat prompt with images: renders `messages` where each `imageMarker` in a content string
   * stands for the next entry of `images`, and splits at the markers into prompt segments.
   */
  chatPrompt(
    messages: readonly ChatMessage[],
    images: readonly ImageInput[] = [],
    options: { imageMarker?: string; addGenerationPrompt?: boolean } = {},
  ): PromptSegment[] {
    const marker = options.imageMarker ?? '<__percept_image__>';
    const rendered = this.renderChat(messages, { addGenerationPrompt: options.addGenerationPrompt ?? true });
    const parts = rendered.split(marker);
    if (parts.length - 1 !== images.length) {
      throw new RangeError(`chatPrompt: the messages hold ${parts.length - 1} image marker(s) but ${images.length} image(s) were given`);
    }
    const segments: PromptSegment[] = [];
    // The template writes BOS as text when it wants one; otherwise let the tokenizer add it.
    const addSpecial = !rendered.startsWith(this.info.bos >= 0 ? this.native.tokenText(this.info.bos) : '\u0000');
    parts.forEach((text, i) => {
      if (text.length > 0) segments.push({ text, ...(i === 0 && addSpecial ? { addSpecial: true } : {}) });
      const img = images[i];
      if (img) segments.push({ image: img.data, nTokens: img.nTokens });
    });
    return segments;
  }

  async createContext(options: ContextOptions = {}): Promise<LlamaContext> {
    const o = plainObject('options', options);
    knownKeys('options', o, [
      'nCtx',
      'nBatch',
      'nUbatch',
      'maxOutputs',
      'flashAttention',
      'kvType',
      'threads',
      'nSeq',
      ...SEQUENCE_OPTIONS,
      'stepTokens',
      'stepRows',
      'shapeGraphs',
      'graphSlots',
      'mixedPrefill',
      'mixSteps',
    ]);
    const nCtx = options.nCtx === undefined ? DEFAULT_N_CTX : intIn('options.nCtx', options.nCtx, 16, 1 << 24);
    const nBatch = options.nBatch === undefined ? DEFAULT_N_BATCH : intIn('options.nBatch', options.nBatch, 1, 1 << 20);
    const nUbatch =
      options.nUbatch === undefined ? Math.min(nBatch, DEFAULT_N_BATCH) : intIn('options.nUbatch', options.nUbatch, 1, nBatch);
    const nSeq = options.nSeq === undefined ? 1 : intIn('options.nSeq', options.nSeq, 1, Math.min(MAX_SEQUENCES, nBatch));
    if (nSeq === 1) {
      for (const key of SEQUENCE_OPTIONS) {
        if (options[key] !== undefined) throw new TypeError(`options.${key} is for a context of several sequences (nSeq > 1)`);
      }
    }
    const kvUnified = options.kvUnified === undefined ? false : bool('options.kvUnified', options.kvUnified);
    const maxActive = options.maxActive === undefined ? nSeq : intIn('options.maxActive', options.maxActive, 1, nSeq);
    const prefillChunk = options.prefillChunk === undefined ? nUbatch : intIn('options.prefillChunk', options.prefillChunk, 1, nBatch);
    const admitTogether = options.admitTogether === undefined ? false : bool('options.admitTogether', options.admitTogether);
    const admitTail = options.admitTail === undefined ? false : bool('options.admitTail', options.admitTail);
    if (admitTail && !admitTogether) throw new TypeError('options.admitTail is for a context that admits together (admitTogether)');
    const tailJoin = options.tailJoin === undefined ? 1 : intIn('options.tailJoin', options.tailJoin, 1, nSeq);
    if (tailJoin > 1 && !admitTail) throw new TypeError('options.tailJoin is for a context that admits the tail (admitTail)');
    const weighTail = options.weighTail === undefined ? false : bool('options.weighTail', options.weighTail);
    if (weighTail && !admitTail) throw new TypeError('options.weighTail is for a context that admits the tail (admitTail)');
    if (weighTail && tailJoin > 1) throw new TypeError('options.weighTail weighs each admission; it takes no tailJoin');
    const joinRunning = options.joinRunning === undefined ? true : bool('options.joinRunning', options.joinRunning);
    if (!joinRunning && (!admitTogether || admitTail))
      throw new TypeError('options.joinRunning is for a context that admits together without a tail (admitTogether, no admitTail)');
    const backendSampling = options.backendSampling === undefined ? true : bool('options.backendSampling', options.backendSampling);
    const groupWaitMs = options.groupWaitMs === undefined ? 0 : numIn('options.groupWaitMs', options.groupWaitMs, 0, 1000);
    // A batched step reads one logits row per sequence; a single sequence one per draft position.
    const outputs = nSeq > 1 ? nSeq : Math.min(MAX_OUTPUTS, nBatch);
    const maxOutputs = options.maxOutputs === undefined ? outputs : intIn('options.maxOutputs', options.maxOutputs, 1, nBatch);
    if (nSeq > 1 && maxOutputs < nSeq) throw new RangeError(`options.maxOutputs must be at least nSeq (${nSeq}): one row per sequence`);
    const stepTokens =
      options.stepTokens === undefined
        ? 1
        : intIn('options.stepTokens', options.stepTokens, 1, Math.max(1, Math.min(nUbatch, Math.floor(nBatch / maxActive))));
    const stepRows = options.stepRows === undefined ? 0 : intIn('options.stepRows', options.stepRows, 0, 256);
    if (stepRows > 0 && !(nSeq > 1 && kvUnified))
      throw new TypeError('options.stepRows is for a context of several sequences in one KV buffer (nSeq > 1, kvUnified)');
    const shapeGraphs = options.shapeGraphs === undefined ? false : bool('options.shapeGraphs', options.shapeGraphs);
    const graphSlots =
      options.graphSlots === undefined ? DEFAULT_GRAPH_SLOTS : intIn('options.graphSlots', options.graphSlots, 0, MAX_GRAPH_SLOTS);
    const mixedPrefill = options.mixedPrefill === undefined ? true : bool('options.mixedPrefill', options.mixedPrefill);
    const mixSteps = options.mixSteps === undefined ? false : bool('options.mixSteps', options.mixSteps);
    if (mixSteps && !(nSeq > 1 && kvUnified && stepRows === 0))
      throw new TypeError('options.mixSteps is for a context of several sequences in one KV buffer without stepRows (nSeq > 1, kvUnified)');
    const fa = oneOf('options.flashAttention', options.flashAttention ?? 'auto', [true, false, 'auto']);
    const kvType = oneOf('options.kvType', options.kvType ?? 'f16', ['f16', 'q8_0']);
    if (kvType === 'q8_0' && fa === false) throw new TypeError("options.kvType 'q8_0' needs flashAttention (true or 'auto')");
    const threads = options.threads === undefined ? defaultThreads() : intIn('options.threads', options.threads, 1, 1024);
    const stack = new Error();
    try {
      const native = await loadAddon().Context.create(this.native, {
        // nCtx positions for every sequence at once, whether they share one buffer or not.
        nCtx: nCtx * nSeq,
        nBatch,
        nUbatch,
        nSeq,
        kvUnified,
        maxActive,
        prefillChunk,
        admitTogether,
        admitTail,
        tailJoin,
        weighTail,
        joinRunning,
        backendSampling,
        groupWaitMs,
        maxOutputs,
        stepTokens,
        stepRows,
        shapeGraphs,
        graphSlots,
        mixedPrefill,
        mixSteps,
        flashAttention: fa,
        kvType,
        threads,
      });
      const ctx = new LlamaContext(this, native, () => this.#contexts.delete(ctx));
      this.#contexts.add(ctx);
      return ctx;
    } catch (err) {
      throw graft(err, stack);
    }
  }

  /**
   * A grammar from GBNF text: parsed at once (a syntax error rejects), then its token index is
   * built off the JS thread (or taken from this model's cache). A grammar without a finite
   * automaton (recursion) or beyond `limits` has no index: `fallback` says why, and decoding with
   * it checks llama.cpp's grammar over the vocabulary instead.
   */
  async grammar(gbnf: string, root = 'root', limits: GrammarIndexLimits = {}): Promise<LlamaGrammar> {
    nonEmptyString('gbnf', gbnf);
    nonEmptyString('root', root);
    knownKeys('limits', plainObject('limits', limits), ['maxStates', 'maxEntries']);
    const checked = {
      maxStates: limits.maxStates === undefined ? GRAMMAR_MAX_STATES : intIn('limits.maxStates', limits.maxStates, 1, 1 << 24),
      maxEntries: limits.maxEntries === undefined ? GRAMMAR_MAX_ENTRIES : intIn('limits.maxEntries', limits.maxEntries, 1, 2 ** 32),
    };
    const stack = new Error();
    try {
      const native = new (loadAddon().Grammar)(this.native, gbnf, root);
      const built = await native.buildIndex(checked);
      return new LlamaGrammar(this, native, gbnf, built.index, built.fallback);
    } catch (err) {
      throw graft(err, stack);
    }
  }

  /** A grammar that admits only JSON documents `schema` accepts (see native/schema-grammar.ts). */
  async grammarFromJsonSchema(schema: object | string, options: GbnfOptions = {}): Promise<LlamaGrammar> {
    return this.grammar(jsonSchemaToGbnf(schema, options));
  }

  /** Disposes every context of this model, then the model. Idempotent. */
  async dispose(): Promise<void> {
    if (this.#disposed) return;
    await Promise.all([...this.#contexts].map((c) => c.dispose()));
    this.#native.dispose();
    this.#disposed = true;
  }
}

export interface GrammarIndexLimits {
  /** Automaton states before giving up on an index (default GRAMMAR_MAX_STATES). */
  readonly maxStates?: number;
  /** (token, state) entries before giving up (default GRAMMAR_MAX_ENTRIES). */
  readonly maxEntries?: number;
}

export class LlamaGrammar {
  readonly model: LlamaModel;
  readonly gbnf: string;
  /** The token index, or null (see `fallback`). */
  readonly index: NativeGrammarIndexInfo | null;
  /** Why the grammar has no index, or null. */
  readonly fallback: string | null;
  /** @internal */
  readonly native: NativeGrammar;
  /** @internal use LlamaModel.grammar */
  constructor(model: LlamaModel, native: NativeGrammar, gbnf: string, index: NativeGrammarIndexInfo | null, fallback: string | null) {
    this.model = model;
    this.native = native;
    this.gbnf = gbnf;
    this.index = index;
    this.fallback = fallback;
  }

  /**
   * Worst-case number of tokens of a complete output (forced runs as the decoder takes them); a
   * generation with at least this many max tokens always ends with the grammar complete. Null
   * when the grammar has no index or admits unbounded outputs.
   */
  get worstCaseTokens(): number | null {
    return this.index?.worstCaseTokens ?? null;
  }

  /**
   * Worst-case number of tokens the model picks in a complete output, the end-of-generation token
   * included where the grammar may end but need not. With jump-forward every other token is forced,
   * so a generation makes at most this − 1 llama_decode calls after its prompt: the count that sets
   * the slowest action's decode time, whatever the logits. Null as worstCaseTokens.
   */
  get maxChoices(): number | null {
    return this.index?.maxChoices ?? null;
  }

  /** Tokens admitted after `prefix`, sorted: by the index, or by llama.cpp's own check over the whole vocabulary. */
  async allowedTokens(prefix: Int32Array | readonly number[], via: 'index' | 'llama' = 'index'): Promise<Int32Array> {
    if (via !== 'index' && via !== 'llama') throw invalid('via', "'index' or 'llama'", via);
    return this.native.allowedTokens(checkTokens('prefix', prefix, this.model.info.nVocab), via);
  }

  /** Whether the grammar admits exactly `text` (llama.cpp's grammar, character by character). */
  admits(text: string): boolean {
    if (typeof text !== 'string') throw invalid('text', 'a string', text);
    return this.native.admits(text);
  }

  /** The tokens the grammar alone decides after `prefix` (what jump-forward appends); empty when the model chooses. */
  forcedTokens(prefix: Int32Array | readonly number[]): Int32Array {
    return this.native.forcedTokens(checkTokens('prefix', prefix, this.model.info.nVocab));
  }
}

export interface ImageInput {
  /** nTokens × nEmbd floats, row-major (the projected vision-encoder output). */
  readonly data: Float32Array;
  readonly nTokens: number;
}

export type PromptSegment =
  | { readonly text: string; readonly addSpecial?: boolean }
  | { readonly tokens: Int32Array | readonly number[] }
  /** `causal: true` decodes the image causally whatever the model's rule (for experiments). */
  | { readonly image: Float32Array; readonly nTokens: number; readonly causal?: boolean };

export interface GenerateOptions {
  /** New tokens at most (0: only evaluate the prompt). */
  readonly maxTokens: number;
  /** 0 (default): greedy. */
  readonly temperature?: number;
  readonly topK?: number;
  readonly topP?: number;
  readonly minP?: number;
  readonly seed?: number;
  readonly stop?: readonly string[];
  readonly stopTokens?: readonly number[];
  /** Keep going past end-of-generation tokens (benchmarks, parity tests). */
  readonly ignoreEos?: boolean;
  readonly grammar?: LlamaGrammar;
  /**
   * Decode the tokens the grammar alone decides (its forced runs) in one batch with the last
   * sampled token, instead of one decode each. The tokens are the same either way.
   */
  readonly jumpForward?: boolean;
  /** Return the duration of every sampling step (`sampleUs`; benchmarks). */
  readonly recordSampleTimes?: boolean;
  /**
   * K (integer 0..64): record the K largest raw logits of every sampled row (before samplers and
   * grammar) in `topLogits`, for parity tests. 0 (default): nothing recorded. Single-sequence contexts only.
   */
  readonly topLogits?: number;
  /** Use the context's speculator (default true when one is attached). */
  readonly speculative?: boolean;
  /** Longest draft per step (default: the speculator's nMax). */
  readonly nDraft?: number;
  /** Cancels at the next token boundary (or inside the running decode). */
  readonly signal?: AbortSignal;
  /** Stop at this instant, process.hrtime.bigint() clock (monotonic ns). */
  readonly deadlineNs?: bigint;
  /** Streams token ids as they are accepted (best effort; the result holds them all). Not on a context of several sequences. */
  readonly onTokens?: (tokens: Int32Array) => void;
  /** The sequence, on a context of several (default 0): calls on different sequences run batched. */
  readonly seq?: number;
}

export interface CeilingOptions {
  readonly sequences: number;
  readonly promptTokens: number;
  /** Decode steps of one token per sequence after the prompts. */
  readonly steps: number;
  /** Timed runs (default 3). */
  readonly repeats?: number;
}

export type CeilingTimes = NativeCeilingTimes;
export type Prediction = NativePrediction;
export type TimeAccount = NativeTimeAccount;

export interface GenerateResult {
  readonly text: string;
  readonly tokens: readonly number[];
  readonly stopReason: StopReason;
  readonly promptTokens: number;
  readonly reusedTokens: number;
  readonly drafted: number;
  readonly accepted: number;
  /** Tokens appended by jump-forward (decode steps saved). */
  readonly forced: number;
  /** Draft tokens the grammar refused, cut before verification. */
  readonly draftsCut: number;
  readonly timings: Timings;
  /** Microseconds of each sampling step, with `recordSampleTimes`. */
  readonly sampleUs?: Float32Array;
  /**
   * With `topLogits` K > 0: per sampled row, its K largest raw logits, highest first (ties: lower id
   * first). `step` is the index in `tokens` of the token that row sampled; tokens forced by jump-forward
   * are not sampled, so steps skip them. With a speculator several rows are sampled per decode, each
   * recorded with its own step. A row whose token was not kept (EOS, a stop token, or sampled past
   * the stop) has step >= `tokens.length`.
   */
  readonly topLogits?: readonly { readonly step: number; readonly ids: Int32Array; readonly logits: Float32Array }[];
  /** On a context of several sequences: where the request stood in the batch schedule. */
  readonly batch?: BatchCounts;
}

export type SpeculatorOptions =
  | { readonly type: 'draft-simple'; readonly draftModel: LlamaModel; readonly nMax?: number; readonly pMin?: number }
  | { readonly type: 'draft-mtp'; readonly draftModel: LlamaModel; readonly nMax?: number; readonly pMin?: number }
  | { readonly type: 'ngram-simple' | 'ngram-map-k' | 'ngram-map-k4v' | 'ngram-mod'; readonly nMax?: number; readonly ngramN?: number };

const GENERATE_KEYS = [
  'maxTokens',
  'temperature',
  'topK',
  'topP',
  'minP',
  'seed',
  'stop',
  'stopTokens',
  'ignoreEos',
  'grammar',
  'jumpForward',
  'recordSampleTimes',
  'topLogits',
  'speculative',
  'nDraft',
  'signal',
  'deadlineNs',
  'onTokens',
  'seq',
];

function checkTokens(name: string, tokens: unknown, nVocab: number): Int32Array | readonly number[] {
  if (!(tokens instanceof Int32Array) && !Array.isArray(tokens)) throw invalid(name, 'an Int32Array or an array of token ids', tokens);
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i] as unknown;
    if (typeof t !== 'number' || !Number.isInteger(t) || t < 0 || t >= nVocab) {
      throw invalid(`${name}[${i}]`, `a token id of this model (an integer between 0 and ${nVocab - 1})`, t);
    }
  }
  return tokens as Int32Array | readonly number[];
}

export class LlamaContext {
  readonly model: LlamaModel;
  readonly info: NativeContextInfo;
  readonly #native: NativeContext;
  readonly #onDispose: () => void;
  #running: Promise<unknown> | undefined;
  /** Several sequences: the generation running on each. */
  readonly #sequences = new Map<number, Promise<unknown>>();
  #measuring: Promise<unknown> | undefined;
  #speculator: LlamaSpeculator | undefined;
  #disposed = false;

  /** @internal use LlamaModel.createContext */
  constructor(model: LlamaModel, native: NativeContext, onDispose: () => void) {
    this.model = model;
    this.#native = native;
    this.#onDispose = onDispose;
    this.info = native.info();
  }

  get speculator(): LlamaSpeculator | undefined {
    return this.#speculator;
  }

  /** Bytes per buffer type: model weights, KV cache ("context") and compute buffers. */
  memoryBreakdown(): NativeMemoryBreakdown {
    return this.#live().memoryBreakdown();
  }

  /** Positions the KV cache currently holds (prompt prefix + generated tokens); of sequence `seq` on a context of several. */
  cachedPositions(seq = 0): number {
    const native = this.#live();
    if (this.info.nSeq === 1) return native.cachedPositions();
    return native.cachedPositions(intIn('seq', seq, 0, this.info.nSeq - 1));
  }

  /** Step shapes given their own CUDA graph so far (0 without shape graphs: `info.shapeGraphBackends`). */
  get shapeGraphShapes(): number {
    return this.#live().shapeGraphShapes();
  }

  /**
   * A context of several sequences: the time (ms) its admission predicts for a request with deadline
   * `deadlineNs` (process.hrtime.bigint() clock; none: after every waiting request) submitted now, at
   * today's sharing and from its recent steps, with its wait behind the waiting requests admitted
   * before it (the rule that drops a request before its prefill when now + this passes the
   * deadline; native/src/batch.h). 0: no prediction (no history yet, an idle decoder that would
   * admit anything to refresh its history, or one sequence). `reservedAhead`: requests not submitted
   * yet that will be admitted before it (frames on their way to the decoder with earlier deadlines),
   * each counted as one more waiting request.
   */
  /**
   * A context of several sequences: a request for `seq` is on its way (+1: a frame reserved before its preprocess) or
   * no longer (-1: submitted or dropped). Admitting together, an idle decoder holds for such requests (groupWaitMs).
   */
  expect(seq: number, delta: 1 | -1): void {
    this.#live().expect(seq, delta);
  }

  predictedMs(deadlineNs?: bigint, reservedAhead = 0): number {
    const { waitMs, ownMs } = this.prediction(deadlineNs, reservedAhead);
    return waitMs + ownMs;
  }

  /**
   * predictedMs() in its two parts: `waitMs`, until the request's own run would start (the running group's rest and
   * the requests admitted before it), and `ownMs`, its own run. Work a caller does before it submits overlaps the wait.
   */
  prediction(deadlineNs?: bigint, reservedAhead = 0): Prediction {
    if (deadlineNs !== undefined && typeof deadlineNs !== 'bigint')
      throw new TypeError(`prediction: deadlineNs must be a bigint (process.hrtime.bigint() clock), got ${typeof deadlineNs}`);
    intIn('prediction: reservedAhead', reservedAhead, 0, 1e6);
    return this.#live().prediction(deadlineNs, reservedAhead);
  }

  /**
   * A context of several sequences: when the request of sequence `seq` ends, predicted from now (ms), as of the
   * scheduler's last step: running, its own rest; waiting, the running group's rest and its own run. undefined: none
   * known (none in flight, one submitted since that step, or one sequence).
   */
  restMs(seq: number): number | undefined {
    if (this.info.nSeq === 1) return undefined;
    const ms = this.#live().restMs(intIn('seq', seq, 0, this.info.nSeq - 1));
    return ms < 0 ? undefined : ms;
  }

  /** A context of several sequences: where its scheduler's time went since it was created (ms); null with one sequence. */
  timeAccount(): TimeAccount | null {
    return this.#live().timeAccount();
  }

  #live(): NativeContext {
    if (this.#disposed) throw coded('EDISPOSED', 'LlamaContext is disposed');
    return this.#native;
  }

  #checkPrompt(prompt: readonly PromptSegment[]): NativeSegment[] {
    if (!Array.isArray(prompt) || prompt.length === 0) throw invalid('prompt', 'a non-empty array of segments', prompt);
    const { nVocab, nEmbd } = this.model.info;
    return prompt.map((seg, i) => {
      const s = plainObject(`prompt[${i}]`, seg);
      if ('text' in s) {
        if (typeof s.text !== 'string') throw invalid(`prompt[${i}].text`, 'a string', s.text);
        return { text: s.text, addSpecial: s.addSpecial === undefined ? false : bool(`prompt[${i}].addSpecial`, s.addSpecial) };
      }
      if ('tokens' in s) return { tokens: checkTokens(`prompt[${i}].tokens`, s.tokens, nVocab) };
      if ('image' in s) {
        if (!(s.image instanceof Float32Array)) throw invalid(`prompt[${i}].image`, 'a Float32Array', s.image);
        const nTokens = intIn(`prompt[${i}].nTokens`, s.nTokens, 1, 1 << 20);
        if (s.image.length !== nTokens * nEmbd) {
          throw new RangeError(
            `prompt[${i}].image has ${s.image.length} floats; this model needs nTokens × nEmbd = ${nTokens} × ${nEmbd} = ${nTokens * nEmbd}` +
              (s.image.length % nTokens === 0 ? ` (rows are ${s.image.length / nTokens} wide: wrong embedding width)` : ''),
          );
        }
        if (this.model.info.imageStartToken === null)
          throw new TypeError(`prompt[${i}]: this model's vocabulary has no image start/end tokens`);
        return { image: s.image, nTokens, causal: s.causal === undefined ? false : bool(`prompt[${i}].causal`, s.causal) };
      }
      throw invalid(`prompt[${i}]`, 'a segment with text, tokens or image', seg);
    });
  }

  /**
   * Evaluates `prompt` (reusing the KV of its longest unchanged prefix) and generates.
   * One operation at a time per context: a second concurrent call rejects with EBUSY.
   */
  async generate(prompt: readonly PromptSegment[], options: GenerateOptions): Promise<GenerateResult> {
    const native = this.#live();
    const segments = this.#checkPrompt(prompt);
    const o = plainObject('options', options);
    knownKeys('options', o, GENERATE_KEYS);
    const { nVocab } = this.model.info;
    const maxTokens = intIn('options.maxTokens', options.maxTokens, 0, this.info.nCtx);
    const temperature = options.temperature === undefined ? 0 : numIn('options.temperature', options.temperature, 0, 100);
    const topK = options.topK === undefined ? 0 : intIn('options.topK', options.topK, 0, nVocab);
    const topP = options.topP === undefined ? 1 : numIn('options.topP', options.topP, Number.MIN_VALUE, 1);
    const minP = options.minP === undefined ? 0 : numIn('options.minP', options.minP, 0, 1);
    const seed = options.seed === undefined ? 0 : intIn('options.seed', options.seed, 0, 0xffffffff);
    const stopStrings = options.stop ?? [];
    if (!Array.isArray(stopStrings) || stopStrings.some((s) => typeof s !== 'string' || s.length === 0)) {
      throw invalid('options.stop', 'an array of non-empty strings', options.stop);
    }
    const stopTokens = options.stopTokens === undefined ? [] : [...checkTokens('options.stopTokens', options.stopTokens, nVocab)];
    if (options.grammar !== undefined && !(options.grammar instanceof LlamaGrammar))
      throw invalid('options.grammar', 'a LlamaGrammar', options.grammar);
    if (options.grammar && options.grammar.model !== this.model) throw new TypeError('options.grammar was built for another model');
    if (options.signal !== undefined && !(options.signal instanceof AbortSignal))
      throw invalid('options.signal', 'an AbortSignal', options.signal);
    if (options.deadlineNs !== undefined && typeof options.deadlineNs !== 'bigint')
      throw invalid('options.deadlineNs', 'a bigint (monotonic ns)', options.deadlineNs);
    if (options.onTokens !== undefined && typeof options.onTokens !== 'function')
      throw invalid('options.onTokens', 'a function', options.onTokens);
    const nDraft = options.nDraft === undefined ? undefined : intIn('options.nDraft', options.nDraft, 0, 256);
    const topLogits = options.topLogits === undefined ? 0 : intIn('options.topLogits', options.topLogits, 0, 64);
    const batched = this.info.nSeq > 1;
    const seq = options.seq === undefined ? 0 : intIn('options.seq', options.seq, 0, this.info.nSeq - 1);
    if (batched && options.onTokens !== undefined)
      throw new TypeError('options.onTokens: a context of several sequences does not stream tokens');
    if (batched && topLogits > 0) throw new TypeError('options.topLogits: a context of several sequences does not record logits');
    if (batched ? this.#sequences.has(seq) : this.#running) {
      throw coded(
        'EBUSY',
        batched
          ? `sequence ${seq} is busy: one generation at a time per sequence`
          : 'LlamaContext is busy: only one operation may run at a time on a context',
      );
    }

    const signal = options.signal;
    const onAbort = batched ? () => native.cancel(seq) : () => native.cancel();
    const stack = new Error();
    const run = (async () => {
      const pending = native.generate(
        segments,
        {
          maxTokens,
          temperature,
          topK,
          topP,
          minP,
          seed,
          stopStrings,
          stopTokens,
          ignoreEos: options.ignoreEos ?? false,
          jumpForward: options.jumpForward ?? false,
          recordSampleTimes: options.recordSampleTimes ?? false,
          topLogits,
          speculative: options.speculative ?? true,
          cancellable: signal !== undefined,
          ...(nDraft !== undefined ? { nDraft } : {}),
          ...(options.deadlineNs !== undefined ? { deadlineNs: options.deadlineNs } : {}),
          ...(options.grammar ? { grammar: options.grammar.native } : {}),
          ...(batched ? { seq } : {}),
        },
        options.onTokens,
      );
      // After the native call reset the flags: an already-aborted signal cancels at once.
      if (signal?.aborted) onAbort();
      else signal?.addEventListener('abort', onAbort, { once: true });
      try {
        return toResult(await pending);
      } finally {
        signal?.removeEventListener('abort', onAbort);
      }
    })();
    if (batched) this.#sequences.set(seq, run);
    else this.#running = run;
    try {
      return await run;
    } catch (err) {
      throw graft(err, stack);
    } finally {
      if (batched) this.#sequences.delete(seq);
      else this.#running = undefined;
    }
  }

  /**
   * Times raw decodes of one shape on this context, as llama-batched-bench times them, without sampling.
   * Per repeat: `sequences` prompts of `promptTokens` random tokens, decoded in nBatch chunks, then
   * `steps` steps of one token per sequence; one unrecorded run goes first. It needs no generation in
   * flight, and leaves every sequence's KV cache empty.
   */
  async measureCeiling(options: CeilingOptions): Promise<CeilingTimes> {
    const native = this.#live();
    const o = plainObject('options', options);
    knownKeys('options', o, ['sequences', 'promptTokens', 'steps', 'repeats']);
    const sequences = intIn('options.sequences', options.sequences, 1, this.info.nSeq);
    const promptTokens = intIn('options.promptTokens', options.promptTokens, 1, this.info.nCtxSeq);
    const steps = intIn('options.steps', options.steps, 0, this.info.nCtxSeq - promptTokens);
    const repeats = options.repeats === undefined ? 3 : intIn('options.repeats', options.repeats, 1, 1000);
    if (this.#running || this.#sequences.size > 0 || this.#measuring) throw coded('EBUSY', 'LlamaContext is busy');
    const stack = new Error();
    const measuring = native.measureCeiling({ sequences, promptTokens, steps, repeats });
    this.#measuring = measuring;
    try {
      return await measuring;
    } catch (err) {
      throw graft(err, stack);
    } finally {
      this.#measuring = undefined;
    }
  }

  /** Evaluates the prompt only (fills the KV cache; later calls reuse it). */
  async evaluate(prompt: readonly PromptSegment[], options: Pick<GenerateOptions, 'signal' | 'deadlineNs'> = {}): Promise<GenerateResult> {
    return this.generate(prompt, { maxTokens: 0, ...options });
  }

  /** Drops the KV cache (the next prompt is evaluated from scratch); of sequence `seq` on a context of several. */
  clearCache(seq = 0): void {
    const native = this.#live();
    if (this.info.nSeq === 1) {
      if (this.#running) throw coded('EBUSY', 'LlamaContext is busy');
      native.clearCache();
      return;
    }
    intIn('seq', seq, 0, this.info.nSeq - 1);
    if (this.#sequences.has(seq)) throw coded('EBUSY', `sequence ${seq} is busy`);
    native.clearCache(seq);
  }

  /** Attaches speculative decoding (one speculator per context; it clears the KV cache). */
  async attachSpeculator(options: SpeculatorOptions): Promise<LlamaSpeculator> {
    const native = this.#live();
    const o = plainObject('options', options);
    oneOf<SpeculatorType>('options.type', o.type, [
      'draft-simple',
      'draft-mtp',
      'ngram-simple',
      'ngram-map-k',
      'ngram-map-k4v',
      'ngram-mod',
    ]);
    const nMax = o.nMax === undefined ? DRAFT_MAX : intIn('options.nMax', o.nMax, 1, Math.min(64, this.info.maxOutputs - 1));
    let draftModel: NativeModel | null = null;
    let pMin = 0;
    let ngramN = DEFAULT_NGRAM_N;
    if (options.type === 'draft-simple' || options.type === 'draft-mtp') {
      knownKeys('options', o, ['type', 'draftModel', 'nMax', 'pMin']);
      if (!(options.draftModel instanceof LlamaModel)) throw invalid('options.draftModel', 'a LlamaModel', options.draftModel);
      draftModel = options.draftModel.native;
      if (options.pMin !== undefined) pMin = numIn('options.pMin', options.pMin, 0, 1);
    } else {
      knownKeys('options', o, ['type', 'nMax', 'ngramN']);
      if (options.ngramN !== undefined) ngramN = intIn('options.ngramN', options.ngramN, 1, 64);
    }
    if (this.#speculator) throw coded('EBUSY', 'this context already has a speculator; dispose it first');
    if (this.#running) throw coded('EBUSY', 'LlamaContext is busy');
    const stack = new Error();
    try {
      const info = await native.attachSpeculator(draftModel, { type: options.type, nMax, nMin: 0, pMin, ngramN });
      const spec = new LlamaSpeculator(info.type, info.nMax, () => {
        if (this.#running) throw coded('EBUSY', 'LlamaContext is busy: await the running generation before detaching its speculator');
        if (this.#speculator !== spec) return;
        native.detachSpeculator();
        this.#speculator = undefined;
      });
      this.#speculator = spec;
      return spec;
    } catch (err) {
      throw graft(err, stack);
    }
  }

  /** Cancels a running generation (if any), waits for it, then frees the context. Idempotent. */
  async dispose(): Promise<void> {
    if (this.#disposed) return;
    if (this.#running) {
      this.#native.cancel();
      await this.#running.catch(() => undefined);
    }
    if (this.#sequences.size > 0) {
      this.#native.cancel();
      await Promise.all([...this.#sequences.values()].map((p) => p.catch(() => undefined)));
    }
    await this.#measuring?.catch(() => undefined);
    this.#speculator = undefined;
    this.#native.dispose();
    this.#disposed = true;
    this.#onDispose();
  }
}

/** The speculator attached to a context: a handle that says what drafts and detaches it. */
export class LlamaSpeculator {
  readonly type: SpeculatorType;
  /** Longest draft per step. */
  readonly nMax: number;
  readonly #detach: () => void;
  /** @internal use LlamaContext.attachSpeculator */
  constructor(type: SpeculatorType, nMax: number, detach: () => void) {
    this.type = type;
    this.nMax = nMax;
    this.#detach = detach;
  }
  /** Detaches from the context (EBUSY while it generates); the next prompt is evaluated from scratch. Idempotent. */
  dispose(): void {
    this.#detach();
  }
}

function toResult(r: NativeGenerateResult): GenerateResult {
  return {
    text: r.text,
    tokens: Array.from(r.tokens),
    stopReason: r.stopReason,
    promptTokens: r.promptTokens,
    reusedTokens: r.reusedTokens,
    drafted: r.drafted,
    accepted: r.accepted,
    forced: r.forced,
    draftsCut: r.draftsCut,
    timings: r.timings,
    ...(r.sampleUs ? { sampleUs: r.sampleUs } : {}),
    ...(r.topLogits ? { topLogits: r.topLogits } : {}),
    ...(r.batch ? { batch: r.batch } : {}),
  };
}
