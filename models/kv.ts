// KV-cache memory of a Gemma decoder at any context, from its GGUF metadata alone.
// It sizes the cache the way llama.cpp does (llama-context.cpp, llama-kv-cache-iswa.cpp, llama-kv-cache.cpp).
// Sizing rules: models/README.md#kv-cache
import type { GGUFDecoded, GGUFFile } from './gguf.ts';
import { GGMLType, blockSize, ggmlTypeName, typeSize } from './quant.ts';

export const KV_TYPES = ['f32', 'f16', 'bf16', 'q8_0', 'q4_0'] as const;
export type KvType = (typeof KV_TYPES)[number];
const KV_GGML_TYPE: Record<KvType, number> = {
  f32: GGMLType.F32,
  f16: GGMLType.F16,
  bf16: GGMLType.BF16,
  q8_0: GGMLType.Q8_0,
  q4_0: GGMLType.Q4_0,
};
const isQuantized = (t: KvType) => t === 'q8_0' || t === 'q4_0';

/** llama.cpp pads the context and every cache size to this many cells. */
export const KV_PAD = 256;
const pad = (n: number) => Math.ceil(n / KV_PAD) * KV_PAD;

export type AttentionKind = 'full' | 'sliding';

export interface AttentionLayer {
  readonly index: number;
  readonly kind: AttentionKind;
  readonly kvHeads: number;
  readonly headDimK: number;
  readonly headDimV: number;
  /** Whose K/V this layer attends: its own index, an earlier layer (KV sharing), or 'target' (a drafter). */
  readonly kvFrom: number | 'target';
}

export interface AttentionLayout {
  readonly arch: string;
  readonly layers: readonly AttentionLayer[];
  /** Sliding-window length in tokens; 0 when no layer slides. */
  readonly window: number;
}

export const SUPPORTED_ARCHS = ['gemma3', 'gemma4', 'gemma4-assistant'] as const;

/** Reads the attention geometry llama.cpp would load from a GGUF's metadata (src/models/gemma*.cpp). */
export function attentionLayout(file: GGUFFile, label = 'model'): AttentionLayout {
  const arch = file.get('general.architecture');
  if (typeof arch !== 'string') throw new Error(`${label}: general.architecture is missing`);
  if (!(SUPPORTED_ARCHS as readonly string[]).includes(arch)) {
    throw new Error(`${label}: architecture '${arch}' is not supported (supported: ${SUPPORTED_ARCHS.join(', ')})`);
  }
  const key = (k: string) => `${arch}.${k}`;
  const fail = (msg: string): never => {
    throw new Error(`${label}: ${msg}`);
  };
  const uint = (k: string, fallback?: number): number => {
    const v = file.get(key(k));
    if (v === undefined) {
      if (fallback === undefined) fail(`metadata key ${key(k)} is missing`);
      return fallback!;
    }
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) fail(`${key(k)} must be a non-negative integer, got ${JSON.stringify(v)}`);
    return v as number;
  };
  const nLayer = uint('block_count');
  if (nLayer < 1) fail(`${key('block_count')} is 0`);
  /** u32, or an array of one value per layer (llama.cpp get_key_or_arr). */
  const perLayer = (k: string, fallback: readonly number[]): number[] => {
    const v = file.get(key(k));
    if (v === undefined) return [...fallback];
    if (Array.isArray(v)) {
      if (v.length !== nLayer) fail(`${key(k)} has ${v.length} entries for ${nLayer} layers`);
      return v.map((x, i) => {
        if (typeof x !== 'number' || !Number.isInteger(x) || x < 0) fail(`${key(k)}[${i}] must be a non-negative integer`);
        return x as number;
      });
    }
    return new Array<number>(nLayer).fill(uint(k));
  };
  const nEmbd = uint('embedding_length');
  const nHead = perLayer('attention.head_count', new Array<number>(nLayer).fill(0));
  const nHeadKv = perLayer('attention.head_count_kv', nHead);
  const defaultHeadDim = nHead[0]! > 0 ? Math.floor(nEmbd / nHead[0]!) : 0;
  const headK = uint('attention.key_length', defaultHeadDim);
  const headV = uint('attention.value_length', defaultHeadDim);
  const headKSwa = uint('attention.key_length_swa', headK);
  const headVSwa = uint('attention.value_length_swa', headV);

  let sliding: boolean[];
  let window: number;
  const boolPattern = (v: GGUFDecoded | undefined): boolean[] | undefined => {
    if (!Array.isArray(v)) return undefined;
    if (v.length !== nLayer) fail(`${key('attention.sliding_window_pattern')} has ${v.length} entries for ${nLayer} layers`);
    return v.map((x) => x === true || x === 1);
  };
  const patternValue = file.get(key('attention.sliding_window_pattern'));
  if (arch === 'gemma3') {
    window = uint('attention.sliding_window', 0);
    // gemma3.cpp load_swa_pattern(ml, 6): a bool array if present, else every n-th layer (default 6) is full.
    const every = typeof patternValue === 'number' ? patternValue : 6;
    sliding =
      window > 0
        ? (boolPattern(patternValue) ?? Array.from({ length: nLayer }, (_, il) => every === 0 || il % every < every - 1))
        : new Array<boolean>(nLayer).fill(false);
  } else {
    window = uint('attention.sliding_window');
    sliding = boolPattern(patternValue) ?? fail(`${key('attention.sliding_window_pattern')} (one bool per layer) is missing`);
  }

  // Gemma 4: layers from n_layer - shared_kv_layers on own no cache. They reuse the last non-shared layer of their kind.
  // See llama-model.cpp create_memory: n_layer_kv_from_start - (is_swa ? 2 : 1).
  const kvFromStart = arch === 'gemma4' ? nLayer - uint('attention.shared_kv_layers', 0) : nLayer;
  if (arch === 'gemma4' && kvFromStart < nLayer) {
    if (kvFromStart < 2)
      fail(`KV sharing needs at least 2 layers with their own cache, ${key('attention.shared_kv_layers')} leaves ${kvFromStart}`);
    if (!sliding[kvFromStart - 2] || sliding[kvFromStart - 1]) {
      fail(`KV sharing expects layer ${kvFromStart - 2} sliding and ${kvFromStart - 1} full (the layers shared layers reuse)`);
    }
  }
  const layers: AttentionLayer[] = Array.from({ length: nLayer }, (_, il) => {
    const swa = sliding[il]!;
    const kvFrom: number | 'target' = arch === 'gemma4-assistant' ? 'target' : il < kvFromStart ? il : kvFromStart - (swa ? 2 : 1);
    return {
      index: il,
      kind: swa ? 'sliding' : 'full',
      kvHeads: nHeadKv[il]!,
      headDimK: swa ? headKSwa : headK,
      headDimV: swa ? headVSwa : headV,
      kvFrom,
    };
  });
  if (window === 0 && layers.some((l) => l.kind === 'sliding')) fail(`sliding layers but ${key('attention.sliding_window')} is 0`);
  return { arch, layers, window };
}

// ---------------------------------------------------------------------------------------------------------

export interface KvOptions {
  /** Context per sequence, in tokens. */
  readonly ctx: number;
  /** Sequences decoded in parallel (llama.cpp n_seq_max, `-np`). Default 1. */
  readonly batch?: number;
  /** Cache type of K and V. Default f16. */
  readonly kvType?: KvType;
  /** Physical batch (n_ubatch): the sliding cache keeps this many cells beyond the window. Default 512. */
  readonly ubatch?: number;
  /** Sliding layers keep the whole context (llama.cpp swa_full), as partial KV removal needs. Default false. */
  readonly swaFull?: boolean;
  /** Flash attention on (or 'auto', which sizes the cache as on). Off stores V transposed. Default true. */
  readonly flashAttention?: boolean;
  /** One cache shared by all sequences (llama.cpp kv_unified) instead of one stream per sequence. Default false. */
  readonly unified?: boolean;
}

export interface KvGroup {
  /** Layers that own a cache of this kind. */
  readonly layers: readonly number[];
  /** Cells per stream. */
  readonly cells: number;
  readonly streams: number;
  readonly kBytes: number;
  readonly vBytes: number;
  readonly bytes: number;
}

export interface KvEstimate {
  readonly totalBytes: number;
  readonly kBytes: number;
  readonly vBytes: number;
  /** llama.cpp's n_ctx (all sequences) and n_ctx_seq after padding. */
  readonly nCtx: number;
  readonly nCtxSeq: number;
  readonly full: KvGroup;
  readonly sliding: KvGroup;
  /** Layers that own no cache, with the layer (or 'target') whose cache each attends. */
  readonly shared: { readonly layers: readonly number[]; readonly reuses: Readonly<Record<number, number | 'target'>> };
  /** Bytes one more token of context adds per sequence once past the window (cells are allocated in 256s). */
  readonly bytesPerToken: number;
}

const positiveInt = (name: string, v: unknown): number => {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 1) throw new RangeError(`${name} must be an integer ≥ 1, got ${String(v)}`);
  return v;
};

/** Bytes of one cache row of `n` elements in `type` (llama.cpp needs whole blocks). */
function rowBytes(type: KvType, n: number, what: string): number {
  const t = KV_GGML_TYPE[type];
  if (n % blockSize(t) !== 0)
    throw new RangeError(`${what}: a row of ${n} elements is not a whole number of ${ggmlTypeName(t)} blocks (${blockSize(t)})`);
  return (n / blockSize(t)) * typeSize(t);
}

export function checkKvType(v: unknown): KvType {
  if (typeof v !== 'string' || !(KV_TYPES as readonly string[]).includes(v))
    throw new RangeError(`invalid KV cache type ${JSON.stringify(v)}; expected one of: ${KV_TYPES.join(', ')}`);
  return v as KvType;
}

/** KV-cache bytes llama.cpp allocates for `layout` with these context parameters. */
export function kvCacheBytes(layout: AttentionLayout, options: KvOptions): KvEstimate {
  const ctx = positiveInt('ctx', options.ctx);
  const nSeq = positiveInt('batch', options.batch ?? 1);
  const ubatch = positiveInt('ubatch', options.ubatch ?? 512);
  const kvType = checkKvType(options.kvType ?? 'f16');
  const flash = options.flashAttention ?? true;
  const unified = options.unified ?? false;
  if (isQuantized(kvType) && !flash)
    throw new RangeError(`a ${kvType} V cache needs flash attention (llama.cpp refuses a quantized V cache without it)`);

  // llama-context.cpp: n_ctx = pad(n_ctx); split caches get pad(n_ctx / n_seq) cells per sequence.
  let nCtx = pad(ctx * nSeq);
  const nCtxSeq = unified ? nCtx : pad(Math.floor(nCtx / nSeq));
  if (!unified) nCtx = nCtxSeq * nSeq;
  const streams = unified ? 1 : nSeq;
  const nUbatch = Math.min(ubatch, nCtx);
  const swaCells = options.swaFull ? nCtxSeq : pad(Math.min(nCtxSeq, layout.window * (unified ? nSeq : 1) + nUbatch));

  // Without flash attention V is stored transposed, every layer's row widened to the widest (TAG_V_CACHE_VARIABLE).
  const vMax = Math.max(...layout.layers.map((l) => l.kvHeads * l.headDimV));
  const group = (kind: AttentionKind, cells: number): KvGroup => {
    const owners = layout.layers.filter((l) => l.kind === kind && l.kvFrom === l.index);
    let k = 0;
    let v = 0;
    for (const l of owners) {
      k += rowBytes(kvType, l.kvHeads * l.headDimK, `layer ${l.index} K`) * cells * streams;
      v += rowBytes(kvType, flash ? l.kvHeads * l.headDimV : vMax, `layer ${l.index} V`) * cells * streams;
    }
    return { layers: owners.map((l) => l.index), cells, streams, kBytes: k, vBytes: v, bytes: k + v };
  };
  const full = group('full', nCtxSeq);
  const sliding = group('sliding', swaCells);
  const sharedLayers = layout.layers.filter((l) => l.kvFrom !== l.index);
  const perCell = (g: KvGroup) => (g.cells > 0 ? g.bytes / (g.cells * g.streams) : 0);
  return {
    totalBytes: full.bytes + sliding.bytes,
    kBytes: full.kBytes + sliding.kBytes,
    vBytes: full.vBytes + sliding.vBytes,
    nCtx,
    nCtxSeq,
    full,
    sliding,
    shared: { layers: sharedLayers.map((l) => l.index), reuses: Object.fromEntries(sharedLayers.map((l) => [l.index, l.kvFrom])) },
    bytesPerToken: perCell(full) + (options.swaFull ? perCell(sliding) : 0),
  };
}

/**
 * Bytes of K and V one decoded token reads at context `ctx`.
 * Every attention layer reads the positions it attends, the window for sliding layers.
 * KV-shared layers count too: they read their source's cache again.
 */
export function kvReadBytesPerToken(layout: AttentionLayout, ctx: number, kvType: KvType = 'f16'): number {
  if (!Number.isInteger(ctx) || ctx < 0) throw new RangeError(`ctx must be an integer ≥ 0, got ${String(ctx)}`);
  checkKvType(kvType);
  let bytes = 0;
  for (const l of layout.layers) {
    const attended = l.kind === 'sliding' ? Math.min(ctx, layout.window) : ctx;
    bytes +=
      attended *
      (rowBytes(kvType, l.kvHeads * l.headDimK, `layer ${l.index} K`) + rowBytes(kvType, l.kvHeads * l.headDimV, `layer ${l.index} V`));
  }
  return bytes;
}
