// Memory-bandwidth roofline of decode: bandwidth ÷ bytes per token bounds tok/s.
// A decode step streams the weights it touches and the KV cache it attends.
// What counts as read: models/README.md#roofline
import type { GGUFFile } from './gguf.ts';
import { attentionLayout, kvReadBytesPerToken, type KvType } from './kv.ts';
import { ggmlTypeName, tensorBytes } from './quant.ts';

/** Peak DRAM bandwidth of common targets, GB/s (10⁹ bytes/s), from the vendors' datasheets. */
export const DEVICE_PRESETS: Readonly<Record<string, { readonly bandwidthGBs: number; readonly description: string }>> = {
  'jetson-orin-nano-8gb': { bandwidthGBs: 68, description: 'Jetson Orin Nano 8 GB, LPDDR5 128-bit' },
  'jetson-agx-orin': { bandwidthGBs: 204.8, description: 'Jetson AGX Orin 64 GB, LPDDR5 256-bit' },
  'jetson-thor': { bandwidthGBs: 273, description: 'Jetson AGX Thor, LPDDR5X 256-bit' },
  h100: { bandwidthGBs: 3350, description: 'H100 SXM, HBM3' },
  h200: { bandwidthGBs: 4800, description: 'H200 SXM, HBM3e' },
};

export type ReadRule = 'full' | 'lookup' | 'experts';

export interface TensorRead {
  readonly name: string;
  readonly type: string;
  readonly bytes: number;
  readonly rule: ReadRule;
  /** Bytes read by one decode step of `batch` tokens. */
  readonly readBytes: number;
}

export interface WeightReads {
  readonly batch: number;
  /** All tensor data in the file. */
  readonly fileBytes: number;
  /** Weight bytes one decode step of `batch` tokens reads. */
  readonly readBytesPerStep: number;
  readonly byRule: Readonly<Record<ReadRule, number>>;
  readonly tensors: readonly TensorRead[];
}

const isEmbeddingTable = (name: string) => name === 'token_embd.weight' || name === 'per_layer_token_embd.weight';

/** Weight bytes a decode step touches, tensor by tensor. */
export function weightReads(file: GGUFFile, options: { batch?: number } = {}): WeightReads {
  const batch = options.batch ?? 1;
  if (!Number.isInteger(batch) || batch < 1) throw new RangeError(`batch must be an integer ≥ 1, got ${String(batch)}`);
  const arch = file.get('general.architecture');
  const expertCount = file.get(`${String(arch)}.expert_count`);
  const expertUsed = file.get(`${String(arch)}.expert_used_count`);
  const moe = typeof expertCount === 'number' && typeof expertUsed === 'number' && expertCount > 0;
  const expertFraction = moe ? Math.min(expertCount, batch * expertUsed) / expertCount : 1;
  const tiedOutput = file.tensor('output.weight') === undefined;
  const byRule: Record<ReadRule, number> = { full: 0, lookup: 0, experts: 0 };
  let fileBytes = 0;
  const tensors = file.tensors.map((t): TensorRead => {
    const bytes = t.byteLength;
    fileBytes += bytes;
    let rule: ReadRule = 'full';
    let readBytes = bytes;
    if (isEmbeddingTable(t.name)) {
      const row = Number(tensorBytes(t.type, [t.shape[0] ?? 1]));
      // The tied output projection reads the whole table; the lookup rows come on top.
      const asOutput = t.name === 'token_embd.weight' && tiedOutput ? bytes : 0;
      byRule.full += asOutput;
      byRule.lookup += batch * row;
      rule = asOutput > 0 ? 'full' : 'lookup';
      readBytes = asOutput + batch * row;
    } else if (moe && t.name.includes('_exps.')) {
      rule = 'experts';
      readBytes = bytes * expertFraction;
      byRule.experts += readBytes;
    } else {
      byRule.full += bytes;
    }
    return { name: t.name, type: ggmlTypeName(t.type), bytes, rule, readBytes };
  });
  return { batch, fileBytes, readBytesPerStep: byRule.full + byRule.lookup + byRule.experts, byRule, tensors };
}

export interface RooflineOptions {
  readonly bandwidthGBs: number;
  /** Context the decoded tokens attend (adds KV reads); 0 = weights only. */
  readonly ctx?: number;
  readonly batch?: number;
  readonly kvType?: KvType;
  /** A measured decode rate (aggregate over the batch) to place against the ceiling. */
  readonly measuredTokS?: number;
}

export interface Roofline {
  readonly bandwidthGBs: number;
  readonly batch: number;
  readonly ctx: number;
  readonly weights: WeightReads;
  /** Per token (a step's bytes ÷ batch). */
  readonly weightBytesPerToken: number;
  readonly kvBytesPerToken: number;
  readonly bytesPerToken: number;
  /** bandwidth ÷ bytes per token: the most tok/s (aggregate over the batch) the memory system allows. */
  readonly ceilingTokS: number;
  readonly measuredTokS: number | null;
  /** measured ÷ ceiling. */
  readonly fractionOfCeiling: number | null;
}

export function roofline(file: GGUFFile, options: RooflineOptions): Roofline {
  const { bandwidthGBs } = options;
  if (typeof bandwidthGBs !== 'number' || !Number.isFinite(bandwidthGBs) || bandwidthGBs <= 0)
    throw new RangeError(`bandwidth must be a number > 0 GB/s, got ${String(bandwidthGBs)}`);
  const ctx = options.ctx ?? 0;
  const batch = options.batch ?? 1;
  const measured = options.measuredTokS;
  if (measured !== undefined && (!Number.isFinite(measured) || measured <= 0))
    throw new RangeError(`measured tok/s must be > 0, got ${String(measured)}`);
  const weights = weightReads(file, { batch });
  const kvBytesPerToken = ctx > 0 ? kvReadBytesPerToken(attentionLayout(file), ctx, options.kvType ?? 'f16') : 0;
  const weightBytesPerToken = weights.readBytesPerStep / batch;
  const bytesPerToken = weightBytesPerToken + kvBytesPerToken;
  const ceilingTokS = (bandwidthGBs * 1e9) / bytesPerToken;
  return {
    bandwidthGBs,
    batch,
    ctx,
    weights,
    weightBytesPerToken,
    kvBytesPerToken,
    bytesPerToken,
    ceilingTokS,
    measuredTokS: measured ?? null,
    fractionOfCeiling: measured === undefined ? null : measured / ceilingTokS,
  };
}
