// `percept calc kv` and `percept calc roofline`: memory and bandwidth calculators over a GGUF's metadata.
// Nothing is loaded but the header; a `synth:PRESET` spec is described in memory, never written.
import { attentionLayout, checkKvType, kvCacheBytes, type KvGroup } from '../models/kv.ts';
import { DEVICE_PRESETS, roofline } from '../models/roofline.ts';
import { describeModel } from '../models/resolve.ts';

const MiB = 1024 * 1024;
const round = (x: number, digits = 3) => Number(x.toFixed(digits));

// ---------------------------------------------------------------------------------------------

export interface CalcKvOptions {
  readonly model: string;
  readonly ctx: number;
  readonly batch?: number;
  readonly kvType?: string;
  readonly ubatch?: number;
  readonly swaFull?: boolean;
  readonly flashAttn?: boolean;
  readonly unified?: boolean;
}

interface KvGroupJson {
  readonly layers: number;
  readonly cells_per_seq: number;
  readonly streams: number;
  readonly k_bytes: number;
  readonly v_bytes: number;
  readonly bytes: number;
}

export interface CalcKvResult {
  readonly model: string;
  readonly arch: string;
  readonly ctx: number;
  readonly batch: number;
  readonly kv_type: string;
  readonly ubatch: number;
  readonly swa_full: boolean;
  readonly flash_attn: boolean;
  readonly unified: boolean;
  /** llama.cpp's n_ctx over all sequences, padded, and n_ctx_seq. `-c n_ctx -np batch` reproduces this cache. */
  readonly n_ctx: number;
  readonly n_ctx_seq: number;
  readonly total_bytes: number;
  readonly total_mib: number;
  readonly full: KvGroupJson;
  readonly sliding: KvGroupJson & { readonly window: number };
  readonly kv_shared: { readonly layers: number; readonly bytes: 0; readonly reuses: Readonly<Record<string, number | 'target'>> };
  readonly bytes_per_token: number;
}

const groupJson = (g: KvGroup): KvGroupJson => ({
  layers: g.layers.length,
  cells_per_seq: g.cells,
  streams: g.streams,
  k_bytes: g.kBytes,
  v_bytes: g.vBytes,
  bytes: g.bytes,
});

export async function calcKv(opts: CalcKvOptions): Promise<CalcKvResult> {
  const file = await describeModel(opts.model);
  const layout = attentionLayout(file, opts.model);
  const kvType = checkKvType(opts.kvType ?? 'f16');
  const options = {
    ctx: opts.ctx,
    batch: opts.batch ?? 1,
    kvType,
    ubatch: opts.ubatch ?? 512,
    swaFull: opts.swaFull ?? false,
    flashAttention: opts.flashAttn ?? true,
    unified: opts.unified ?? false,
  };
  const e = kvCacheBytes(layout, options);
  return {
    model: opts.model,
    arch: layout.arch,
    ctx: options.ctx,
    batch: options.batch,
    kv_type: kvType,
    ubatch: options.ubatch,
    swa_full: options.swaFull,
    flash_attn: options.flashAttention,
    unified: options.unified,
    n_ctx: e.nCtx,
    n_ctx_seq: e.nCtxSeq,
    total_bytes: e.totalBytes,
    total_mib: round(e.totalBytes / MiB),
    full: groupJson(e.full),
    sliding: { ...groupJson(e.sliding), window: layout.window },
    kv_shared: { layers: e.shared.layers.length, bytes: 0, reuses: e.shared.reuses },
    bytes_per_token: e.bytesPerToken,
  };
}

// ---------------------------------------------------------------------------------------------

export interface CalcRooflineOptions {
  readonly model: string;
  readonly bandwidthGbs?: number;
  readonly device?: string;
  readonly measuredTokS?: number;
  readonly ctx?: number;
  readonly batch?: number;
  readonly kvType?: string;
}

export interface CalcRooflineResult {
  readonly model: string;
  readonly arch: string;
  readonly device: string | null;
  readonly bandwidth_gbs: number;
  readonly batch: number;
  readonly ctx: number;
  readonly kv_type: string;
  readonly file_weight_bytes: number;
  /** Per token: weights read in full, embedding rows looked up, routed experts. */
  readonly weight_bytes_per_token: number;
  readonly weight_reads: { readonly full: number; readonly lookup_rows: number; readonly experts: number };
  /** Embedding-table bytes a token does not read (looked up, not streamed). */
  readonly lookup_bytes_not_read: number;
  readonly kv_bytes_per_token: number;
  readonly bytes_per_token: number;
  readonly ceiling_tok_s: number;
  readonly measured_tok_s: number | null;
  readonly percent_of_ceiling: number | null;
}

export async function calcRoofline(opts: CalcRooflineOptions): Promise<CalcRooflineResult> {
  if ((opts.bandwidthGbs === undefined) === (opts.device === undefined)) {
    throw new Error(`give one of --bandwidth-gbs or --device (${Object.keys(DEVICE_PRESETS).join(', ')})`);
  }
  let bandwidth = opts.bandwidthGbs;
  if (opts.device !== undefined) {
    if (!Object.hasOwn(DEVICE_PRESETS, opts.device)) {
      throw new Error(`unknown --device '${opts.device}'; expected one of: ${Object.keys(DEVICE_PRESETS).join(', ')}`);
    }
    bandwidth = DEVICE_PRESETS[opts.device]!.bandwidthGBs;
  }
  const file = await describeModel(opts.model);
  const kvType = checkKvType(opts.kvType ?? 'f16');
  const r = roofline(file, {
    bandwidthGBs: bandwidth!,
    ctx: opts.ctx ?? 0,
    batch: opts.batch ?? 1,
    kvType,
    ...(opts.measuredTokS !== undefined ? { measuredTokS: opts.measuredTokS } : {}),
  });
  const perToken = (x: number) => x / r.batch;
  return {
    model: opts.model,
    arch: String(file.get('general.architecture')),
    device: opts.device ?? null,
    bandwidth_gbs: r.bandwidthGBs,
    batch: r.batch,
    ctx: r.ctx,
    kv_type: kvType,
    file_weight_bytes: r.weights.fileBytes,
    weight_bytes_per_token: Math.round(r.weightBytesPerToken),
    weight_reads: {
      full: Math.round(perToken(r.weights.byRule.full)),
      lookup_rows: Math.round(perToken(r.weights.byRule.lookup)),
      experts: Math.round(perToken(r.weights.byRule.experts)),
    },
    lookup_bytes_not_read: r.weights.tensors.filter((t) => t.rule === 'lookup').reduce((sum, t) => sum + t.bytes - t.readBytes, 0),
    kv_bytes_per_token: r.kvBytesPerToken,
    bytes_per_token: Math.round(r.bytesPerToken),
    ceiling_tok_s: round(r.ceilingTokS, 1),
    measured_tok_s: r.measuredTokS,
    percent_of_ceiling: r.fractionOfCeiling === null ? null : round(100 * r.fractionOfCeiling, 2),
  };
}
