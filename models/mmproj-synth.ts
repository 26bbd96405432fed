// Synthetic llama.cpp mmproj GGUFs (tools/mtmd clip) from the same random weights as models/vision-synth.ts's ONNX encoders.
// One preset and seed give one set of weights, written twice, so onnxruntime and clip can be checked against each other.
// Tensor mapping, and one deliberate difference from real files: models/README.md#synthetic-mmproj
import { mkdirSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { GGUFWriter, arr, bool, f32, str, u32, type PlannedTensor } from './gguf.ts';
import { GGMLType, quantize } from './quant.ts';
import {
  listVisionPresets,
  visionPreset,
  visionWeightSpecs,
  weightValues,
  type Gemma4VisionSpec,
  type SiglipSpec,
  type VisionContract,
  type WeightSpec,
} from './vision-synth.ts';

/** Suffix that names the mmproj flavour of a vision preset (`siglip-tiny-mmproj`). */
const MMPROJ_SUFFIX = '-mmproj';

export type MmprojDtype = 'f32' | 'f16';

export interface MmprojPresetInfo {
  /** `<vision preset>-mmproj`. */
  readonly name: string;
  /** The vision preset whose weights it holds. */
  readonly visionPreset: string;
  readonly contract: VisionContract;
  readonly projectorType: 'gemma3' | 'gemma4v';
  readonly description: string;
  readonly params: number;
  readonly outHidden: number;
}

export function listMmprojPresets(): MmprojPresetInfo[] {
  return listVisionPresets().map((p) => ({
    name: `${p.name}${MMPROJ_SUFFIX}`,
    visionPreset: p.name,
    contract: p.contract,
    projectorType: p.contract === 'gemma3' ? 'gemma3' : 'gemma4v',
    description: `llama.cpp mmproj GGUF of ${p.name}: ${p.description}`,
    params: p.params,
    outHidden: p.outHidden,
  }));
}

/** Accepts a vision preset name with or without the `-mmproj` suffix. */
export function mmprojVisionPreset(name: string): string {
  if (typeof name !== 'string' || name.length === 0) throw new TypeError(`mmproj preset must be a non-empty string, got ${String(name)}`);
  const base = name.endsWith(MMPROJ_SUFFIX) ? name.slice(0, -MMPROJ_SUFFIX.length) : name;
  if (!listVisionPresets().some((p) => p.name === base)) {
    throw new Error(
      `unknown mmproj preset '${name}' (known: ${listMmprojPresets()
        .map((p) => p.name)
        .join(', ')})`,
    );
  }
  return base;
}

/** One GGUF tensor: its name, its ggml shape (ne0 first), and whether it may be stored as F16.
 * Also how to get its f32 values from the vision weights. Each source weight is generated on demand.
 * So a 400M-parameter preset never sits in memory at once. */
export interface MmprojTensorPlan {
  readonly name: string;
  readonly ne: readonly number[];
  /** Matrices may go to F16; norms, biases and embedding tables stay F32 (as the converter does). */
  readonly halfOk: boolean;
  readonly values: (get: (name: string) => Float32Array) => Float32Array;
}

/** Row-major [rows][cols] → [cols][rows]. */
export function transpose2d(src: Float32Array, rows: number, cols: number): Float32Array {
  if (src.length !== rows * cols) throw new RangeError(`transpose2d: ${src.length} values is not ${rows}×${cols}`);
  const out = new Float32Array(src.length);
  // Blocked so the 1152×4304 matrices of so400m stay cache-friendly.
  const B = 64;
  for (let r0 = 0; r0 < rows; r0 += B) {
    for (let c0 = 0; c0 < cols; c0 += B) {
      const r1 = Math.min(rows, r0 + B);
      const c1 = Math.min(cols, c0 + B);
      for (let r = r0; r < r1; r++) for (let c = c0; c < c1; c++) out[c * rows + r] = src[r * cols + c]!;
    }
  }
  return out;
}

/** Linear patch embedding on HWC patch vectors W[(ky·p+kx)·3+c][o] → conv kernel [o][c][ky][kx]. */
export function patchLinearToConv(w: Float32Array, patch: number, hidden: number): Float32Array {
  const dim = patch * patch * 3;
  if (w.length !== dim * hidden) throw new RangeError(`patchLinearToConv: ${w.length} values is not ${dim}×${hidden}`);
  const out = new Float32Array(w.length);
  for (let o = 0; o < hidden; o++) {
    for (let c = 0; c < 3; c++) {
      for (let ky = 0; ky < patch; ky++) {
        for (let kx = 0; kx < patch; kx++) out[((o * 3 + c) * patch + ky) * patch + kx] = w[((ky * patch + kx) * 3 + c) * hidden + o]!;
      }
    }
  }
  return out;
}

const same = (src: string) => (get: (n: string) => Float32Array) => get(src);
const transposed = (src: string, rows: number, cols: number) => (get: (n: string) => Float32Array) => transpose2d(get(src), rows, cols);

function siglipPlan(spec: SiglipSpec): MmprojTensorPlan[] {
  const h = spec.hidden;
  const p = spec.patchSize;
  const grid = spec.imageSize / p;
  const plan: MmprojTensorPlan[] = [
    // [h,3,p,p] OIHW is already ggml's conv kernel layout ne [p,p,3,h]. The converter forces ".embeddings." to F32.
    { name: 'v.patch_embd.weight', ne: [p, p, 3, h], halfOk: false, values: same('patch_embed.weight') },
    { name: 'v.patch_embd.bias', ne: [h], halfOk: false, values: same('patch_embed.bias') },
    { name: 'v.position_embd.weight', ne: [h, grid * grid], halfOk: false, values: same('pos_embed') },
  ];
  for (let i = 0; i < spec.layers; i++) {
    const l = `layers.${i}`;
    const b = `v.blk.${i}`;
    plan.push(
      { name: `${b}.ln1.weight`, ne: [h], halfOk: false, values: same(`${l}.ln1.weight`) },
      { name: `${b}.ln1.bias`, ne: [h], halfOk: false, values: same(`${l}.ln1.bias`) },
    );
    for (const [m, tn] of [
      ['q', 'attn_q'],
      ['k', 'attn_k'],
      ['v', 'attn_v'],
      ['o', 'attn_out'],
    ] as const) {
      plan.push(
        { name: `${b}.${tn}.weight`, ne: [h, h], halfOk: true, values: transposed(`${l}.attn.${m}.weight`, h, h) },
        { name: `${b}.${tn}.bias`, ne: [h], halfOk: false, values: same(`${l}.attn.${m}.bias`) },
      );
    }
    plan.push(
      { name: `${b}.ln2.weight`, ne: [h], halfOk: false, values: same(`${l}.ln2.weight`) },
      { name: `${b}.ln2.bias`, ne: [h], halfOk: false, values: same(`${l}.ln2.bias`) },
      { name: `${b}.ffn_up.weight`, ne: [h, spec.ffn], halfOk: true, values: transposed(`${l}.mlp.fc1.weight`, h, spec.ffn) },
      { name: `${b}.ffn_up.bias`, ne: [spec.ffn], halfOk: false, values: same(`${l}.mlp.fc1.bias`) },
      { name: `${b}.ffn_down.weight`, ne: [spec.ffn, h], halfOk: true, values: transposed(`${l}.mlp.fc2.weight`, spec.ffn, h) },
      { name: `${b}.ffn_down.bias`, ne: [h], halfOk: false, values: same(`${l}.mlp.fc2.bias`) },
    );
  }
  plan.push(
    { name: 'v.post_ln.weight', ne: [h], halfOk: false, values: same('post_ln.weight') },
    { name: 'v.post_ln.bias', ne: [h], halfOk: false, values: same('post_ln.bias') },
    { name: 'mm.soft_emb_norm.weight', ne: [h], halfOk: false, values: same('mm.soft_emb_norm.weight') },
    // siglip.cpp uses ggml_transpose(mm_input_proj_w): stored ne [out, h] = the ONNX [h][out] bytes as they are.
    { name: 'mm.input_projection.weight', ne: [spec.outHidden, h], halfOk: true, values: same('mm.input_projection.weight') },
  );
  return plan;
}

function gemma4Plan(spec: Gemma4VisionSpec): MmprojTensorPlan[] {
  const h = spec.hidden;
  const p = spec.patchSize;
  const hd = h / spec.heads;
  const n = spec.positionTableSize;
  const plan: MmprojTensorPlan[] = [
    {
      name: 'v.patch_embd.weight',
      ne: [p, p, 3, h],
      halfOk: true,
      values: (get) => patchLinearToConv(get('patch_embed.input_proj.weight'), p, h),
    },
    {
      name: 'v.position_embd.weight',
      ne: [h, n, 2],
      halfOk: false,
      values: (get) => {
        const out = new Float32Array(2 * n * h);
        out.set(get('patch_embed.pos_table_x'), 0);
        out.set(get('patch_embed.pos_table_y'), n * h);
        return out;
      },
    },
  ];
  for (let i = 0; i < spec.layers; i++) {
    const l = `layers.${i}`;
    const b = `v.blk.${i}`;
    plan.push({ name: `${b}.ln1.weight`, ne: [h], halfOk: false, values: same(`${l}.input_norm.weight`) });
    for (const [m, tn] of [
      ['q', 'attn_q'],
      ['k', 'attn_k'],
      ['v', 'attn_v'],
    ] as const) {
      plan.push({ name: `${b}.${tn}.weight`, ne: [h, h], halfOk: true, values: transposed(`${l}.attn.${m}.weight`, h, h) });
    }
    plan.push(
      { name: `${b}.attn_q_norm.weight`, ne: [hd], halfOk: false, values: same(`${l}.attn.q_norm.weight`) },
      { name: `${b}.attn_k_norm.weight`, ne: [hd], halfOk: false, values: same(`${l}.attn.k_norm.weight`) },
      { name: `${b}.attn_out.weight`, ne: [h, h], halfOk: true, values: transposed(`${l}.attn.o.weight`, h, h) },
      { name: `${b}.attn_post_norm.weight`, ne: [h], halfOk: false, values: same(`${l}.post_attention_norm.weight`) },
      { name: `${b}.ln2.weight`, ne: [h], halfOk: false, values: same(`${l}.pre_ffw_norm.weight`) },
      { name: `${b}.ffn_gate.weight`, ne: [h, spec.ffn], halfOk: true, values: transposed(`${l}.mlp.gate.weight`, h, spec.ffn) },
      { name: `${b}.ffn_up.weight`, ne: [h, spec.ffn], halfOk: true, values: transposed(`${l}.mlp.up.weight`, h, spec.ffn) },
      { name: `${b}.ffn_down.weight`, ne: [spec.ffn, h], halfOk: true, values: transposed(`${l}.mlp.down.weight`, spec.ffn, h) },
      { name: `${b}.ffn_post_norm.weight`, ne: [h], halfOk: false, values: same(`${l}.post_ffw_norm.weight`) },
    );
  }
  // gemma4v.cpp: ggml_mul_mat(mm_input_proj_w, x): a plain linear, ne [h, out].
  plan.push({
    name: 'mm.input_projection.weight',
    ne: [h, spec.outHidden],
    halfOk: true,
    values: transposed('mm.input_projection.weight', h, spec.outHidden),
  });
  return plan;
}

/** The GGUF tensors of a vision preset, in file order. */
export function mmprojTensorPlan(preset: string): MmprojTensorPlan[] {
  const { spec } = visionPreset(mmprojVisionPreset(preset));
  return spec.kind === 'siglip' ? siglipPlan(spec) : gemma4Plan(spec);
}

export interface SynthesizeMmprojOptions {
  /** A vision preset (`siglip-tiny`) or its mmproj name (`siglip-tiny-mmproj`). */
  readonly preset: string;
  /** Output path (by convention `*.mmproj.gguf`). */
  readonly out: string;
  readonly seed?: number;
  /** Matrices in F32 (default, exact parity with the fp32 ONNX model) or F16 (what converted files use). */
  readonly dtype?: MmprojDtype;
  readonly onProgress?: (doneBytes: number, totalBytes: number) => void;
}

export interface SynthesizeMmprojResult {
  readonly path: string;
  readonly preset: string;
  readonly visionPreset: string;
  readonly contract: VisionContract;
  readonly projectorType: 'gemma3' | 'gemma4v';
  readonly seed: number;
  readonly dtype: MmprojDtype;
  readonly tensors: number;
  readonly bytes: number;
  readonly outHidden: number;
  readonly ms: number;
}

/** A clip GGUF writer with the KVs llama.cpp's converter writes for this vision spec; tensors not yet added. */
function mmprojWriter(spec: SiglipSpec | Gemma4VisionSpec, meta: { name: string; description: string; dtype: MmprojDtype }): GGUFWriter {
  const g = new GGUFWriter();
  const projectorType = spec.kind === 'siglip' ? 'gemma3' : 'gemma4v';
  g.set('general.architecture', str('clip'));
  g.set('general.type', str('mmproj'));
  g.set('general.name', str(meta.name));
  g.set('general.description', str(meta.description));
  g.set('general.file_type', u32(meta.dtype === 'f16' ? 1 : 0));
  g.set('clip.has_vision_encoder', bool(true));
  // The Gemma 4 converter writes the mixed-modality key; the loader reads either.
  g.set(projectorType === 'gemma3' ? 'clip.projector_type' : 'clip.vision.projector_type', str(projectorType));
  g.set('clip.use_gelu', bool(true));
  // Gemma 3's real value is 896 (its only input size); Gemma 4's converter writes an unused 224.
  g.set('clip.vision.image_size', u32(spec.kind === 'siglip' ? spec.imageSize : 224));
  g.set('clip.vision.patch_size', u32(spec.patchSize));
  g.set('clip.vision.embedding_length', u32(spec.hidden));
  g.set('clip.vision.feed_forward_length', u32(spec.ffn));
  g.set('clip.vision.block_count', u32(spec.layers));
  g.set('clip.vision.attention.head_count', u32(spec.heads));
  g.set('clip.vision.projection_dim', u32(spec.outHidden));
  g.set('clip.vision.attention.layer_norm_epsilon', f32(spec.eps));
  // What mtmd's own preprocessing would apply; percept feeds already normalized pixels.
  g.set('clip.vision.image_mean', arr('f32', spec.kind === 'siglip' ? [0.5, 0.5, 0.5] : [0, 0, 0]));
  g.set('clip.vision.image_std', arr('f32', spec.kind === 'siglip' ? [0.5, 0.5, 0.5] : [1, 1, 1]));
  // clip.cpp's defaults are 4 (gemma3) and 3 (gemma4v); written only when different, like the converter.
  const defaultMerge = spec.kind === 'siglip' ? 4 : 3;
  if (spec.poolKernel !== defaultMerge) g.set('clip.vision.projector.scale_factor', u32(spec.poolKernel));
  return g;
}

/** Writes the mmproj GGUF of a vision preset with the weights `synthesizeVision` would put in the ONNX. */
export async function synthesizeMmproj(opts: SynthesizeMmprojOptions): Promise<SynthesizeMmprojResult> {
  if (typeof opts?.out !== 'string' || opts.out.length === 0) throw new TypeError('synthesizeMmproj: out must be a file path');
  const base = mmprojVisionPreset(opts.preset);
  const preset = visionPreset(base);
  const seed = opts.seed ?? 0;
  if (!Number.isInteger(seed) || seed < 0) throw new RangeError(`synthesizeMmproj: seed must be a non-negative integer, got ${seed}`);
  const dtype = opts.dtype ?? 'f32';
  if (dtype !== 'f32' && dtype !== 'f16') throw new RangeError(`synthesizeMmproj: dtype must be 'f32' or 'f16', got ${String(dtype)}`);
  const t0 = performance.now();
  const spec = preset.spec;
  const projectorType = preset.contract === 'gemma3' ? 'gemma3' : 'gemma4v';

  const g = mmprojWriter(spec, {
    name: `percept-synth-${preset.name}`,
    description: `synthetic ${preset.contract} vision encoder (${preset.description}), seed ${seed}; random weights`,
    dtype,
  });
  g.set('percept.preset', str(preset.name));
  g.set('percept.seed', u32(seed));

  const plan = mmprojTensorPlan(base);
  const typeOf = (t: MmprojTensorPlan): number => (dtype === 'f16' && t.halfOk ? GGMLType.F16 : GGMLType.F32);
  for (const t of plan) g.addTensor({ name: t.name, type: typeOf(t), shape: t.ne });

  const weightSpecs = new Map<string, WeightSpec>(visionWeightSpecs(spec).map((s) => [s.name, s]));
  const get = (name: string): Float32Array => {
    const s = weightSpecs.get(name);
    if (!s) throw new Error(`mmproj-synth: no vision weight '${name}' in preset ${preset.name}`);
    return weightValues(s, seed);
  };
  const byName = new Map(plan.map((t) => [t.name, t]));
  function* source(t: PlannedTensor): Iterable<Uint8Array> {
    const entry = byName.get(t.name)!;
    const values = entry.values(get);
    const count = entry.ne.reduce((a, b) => a * b, 1);
    if (values.length !== count) throw new Error(`mmproj-synth: tensor ${t.name} has ${values.length} values, shape needs ${count}`);
    yield t.type === GGMLType.F16 ? quantize(GGMLType.F16, values) : new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
  }

  mkdirSync(dirname(resolve(opts.out)), { recursive: true });
  const written = await g.write(opts.out, source, opts.onProgress ? { onProgress: opts.onProgress } : {});
  return {
    path: opts.out,
    preset: `${preset.name}${MMPROJ_SUFFIX}`,
    visionPreset: preset.name,
    contract: preset.contract,
    projectorType,
    seed,
    dtype,
    tensors: plan.length,
    bytes: written.bytes,
    outHidden: spec.outHidden,
    ms: performance.now() - t0,
  };
}

export interface WriteGemma4MmprojOptions {
  readonly spec: Gemma4VisionSpec;
  /** The vision weights by their vision-synth names (models/vision-synth.ts visionWeightSpecs). */
  readonly get: (name: string) => Float32Array;
  readonly out: string;
  readonly name: string;
  readonly description: string;
  /** Extra KVs that say what made the file. */
  readonly stamp: Readonly<Record<string, string>>;
}

/** Writes a gemma4v mmproj with given weights in F32, so clip computes with exactly the ONNX encoder's values. */
export async function writeGemma4Mmproj(opts: WriteGemma4MmprojOptions): Promise<{ path: string; bytes: number }> {
  const g = mmprojWriter(opts.spec, { name: opts.name, description: opts.description, dtype: 'f32' });
  for (const [k, v] of Object.entries(opts.stamp)) g.set(k, str(v));
  const plan = gemma4Plan(opts.spec);
  for (const t of plan) g.addTensor({ name: t.name, type: GGMLType.F32, shape: t.ne });
  const byName = new Map(plan.map((t) => [t.name, t]));
  mkdirSync(dirname(resolve(opts.out)), { recursive: true });
  const written = await g.write(opts.out, function* (t) {
    const values = byName.get(t.name)!.values(opts.get);
    yield new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
  });
  return { path: opts.out, bytes: written.bytes };
}
