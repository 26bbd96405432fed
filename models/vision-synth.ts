// Synthetic vision encoders in ONNX with the transformers.js `vision_encoder` contracts.
// Weights are random but deterministic: the same preset and seed give byte-identical files.
// They stand in for real checkpoints, which cannot be downloaded here. Shapes, contracts and compute are faithful.
// Outputs are meaningless. Graphs and deliberate simplifications: models/README.md#synthetic-vision-encoders
import { mkdirSync, renameSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { OnnxGraphBuilder, SeededRandom, tensorSeed, type OnnxModelInfo } from './onnx-writer.ts';

export type VisionContract = 'gemma3' | 'gemma4';

export interface SiglipSpec {
  readonly kind: 'siglip';
  readonly imageSize: number;
  readonly patchSize: number;
  readonly hidden: number;
  readonly layers: number;
  readonly heads: number;
  readonly ffn: number;
  /** Average-pool kernel over the patch grid (64/4 = 16 → 256 tokens). */
  readonly poolKernel: number;
  /** Text hidden size the projector maps to (the decoder's n_embd). */
  readonly outHidden: number;
  readonly eps: number;
}

export interface Gemma4VisionSpec {
  readonly kind: 'gemma4';
  readonly patchSize: number;
  readonly hidden: number;
  readonly layers: number;
  readonly heads: number;
  readonly ffn: number;
  readonly poolKernel: number;
  readonly positionTableSize: number;
  readonly ropeTheta: number;
  readonly outHidden: number;
  readonly eps: number;
}

export type VisionSpec = SiglipSpec | Gemma4VisionSpec;

export interface VisionPreset {
  readonly name: string;
  readonly contract: VisionContract;
  readonly description: string;
  readonly spec: VisionSpec;
}

const siglip = (p: Partial<SiglipSpec> & Pick<SiglipSpec, 'hidden' | 'layers' | 'heads' | 'ffn' | 'outHidden'>): SiglipSpec => ({
  kind: 'siglip',
  imageSize: 896,
  patchSize: 14,
  poolKernel: 4,
  eps: 1e-6,
  ...p,
});
const gemma4 = (p: Pick<Gemma4VisionSpec, 'hidden' | 'layers' | 'heads' | 'ffn' | 'outHidden'>): Gemma4VisionSpec => ({
  kind: 'gemma4',
  patchSize: 16,
  poolKernel: 3,
  positionTableSize: 10240,
  ropeTheta: 100,
  eps: 1e-6,
  ...p,
});

const PRESETS: readonly VisionPreset[] = [
  {
    name: 'siglip-tiny',
    contract: 'gemma3',
    description: 'Gemma 3 contract, 2 layers × 32 hidden, output 64 (gemma3-tiny decoder n_embd)',
    spec: siglip({ hidden: 32, layers: 2, heads: 2, ffn: 64, outHidden: 64 }),
  },
  {
    name: 'siglip-so400m-896',
    contract: 'gemma3',
    description: 'Gemma 3 4B shapes: SigLIP so400m/14 @ 896 (27 L, 1152 h, 16 heads, ffn 4304) + projector → 2560',
    spec: siglip({ hidden: 1152, layers: 27, heads: 16, ffn: 4304, outHidden: 2560 }),
  },
  {
    name: 'gemma4-vision-tiny',
    contract: 'gemma4',
    description: 'Gemma 4 contract, 2 layers × 32 hidden, output 64 (gemma4-tiny decoder n_embd)',
    spec: gemma4({ hidden: 32, layers: 2, heads: 2, ffn: 64, outHidden: 64 }),
  },
  {
    // Head sizes ggml-cuda has no tensor-core flash-attention kernel for, at tiny scale.
    // On them the CPU checks the graph that pads heads for that kernel against the plain one.
    name: 'siglip-tiny-h72',
    contract: 'gemma3',
    description: "Gemma 3 contract at so400m's head size: 2 layers × 144 hidden (2 heads × 72), 224² input, output 64",
    spec: siglip({ hidden: 144, layers: 2, heads: 2, ffn: 64, outHidden: 64, imageSize: 224 }),
  },
  {
    name: 'gemma4-vision-tiny-h40',
    contract: 'gemma4',
    description: 'Gemma 4 contract, 2 layers × 80 hidden (2 heads × 40), output 64',
    spec: gemma4({ hidden: 80, layers: 2, heads: 2, ffn: 64, outHidden: 64 }),
  },
  {
    name: 'gemma4-vision-e2b',
    contract: 'gemma4',
    description: 'Gemma 4 E2B vision tower shapes (16 L, 768 h, 12 heads, ffn 3072) → 1536',
    spec: gemma4({ hidden: 768, layers: 16, heads: 12, ffn: 3072, outHidden: 1536 }),
  },
  {
    name: 'gemma4-vision-e4b',
    contract: 'gemma4',
    description: 'Gemma 4 E4B vision tower shapes (16 L, 768 h, 12 heads, ffn 3072) → 2560',
    spec: gemma4({ hidden: 768, layers: 16, heads: 12, ffn: 3072, outHidden: 2560 }),
  },
];

export interface VisionPresetInfo {
  readonly name: string;
  readonly contract: VisionContract;
  readonly description: string;
  readonly params: number;
  readonly outHidden: number;
}

export function listVisionPresets(): VisionPresetInfo[] {
  return PRESETS.map((p) => ({
    name: p.name,
    contract: p.contract,
    description: p.description,
    params: visionWeightSpecs(p.spec).reduce((a, w) => a + w.dims.reduce((x, y) => x * y, 1), 0),
    outHidden: p.spec.outHidden,
  }));
}

export function visionPreset(name: string): VisionPreset {
  const preset = PRESETS.find((p) => p.name === name);
  if (!preset) throw new Error(`unknown vision preset '${name}' (known: ${PRESETS.map((p) => p.name).join(', ')})`);
  return preset;
}

/** One weight tensor: its name, dims, and the distribution its values are drawn from. */
export interface WeightSpec {
  readonly name: string;
  readonly dims: readonly number[];
  readonly std: number;
  readonly mean: number;
}

const w = (name: string, dims: readonly number[], std: number, mean = 0): WeightSpec => ({ name, dims, std, mean });
/** Norm weights near 1, biases near 0, linears with std 1/√fan_in (keeps activations near unit scale). */
const linear = (name: string, fanIn: number, fanOut: number): WeightSpec => w(name, [fanIn, fanOut], 1 / Math.sqrt(fanIn));
const norm = (name: string, n: number): WeightSpec => w(name, [n], 0.05, 1);
const bias = (name: string, n: number): WeightSpec => w(name, [n], 0.02);

/** Every weight of a spec, in graph order. MatMul weights are [in, out] (y = x·W). */
export function visionWeightSpecs(spec: VisionSpec): WeightSpec[] {
  const out: WeightSpec[] = [];
  const h = spec.hidden;
  if (spec.kind === 'siglip') {
    const p = spec.patchSize;
    const grid = spec.imageSize / p;
    out.push(w('patch_embed.weight', [h, 3, p, p], 1 / Math.sqrt(3 * p * p)), bias('patch_embed.bias', h));
    out.push(w('pos_embed', [grid * grid, h], 0.02));
    for (let i = 0; i < spec.layers; i++) {
      const l = `layers.${i}`;
      out.push(norm(`${l}.ln1.weight`, h), bias(`${l}.ln1.bias`, h));
      for (const m of ['q', 'k', 'v']) out.push(linear(`${l}.attn.${m}.weight`, h, h), bias(`${l}.attn.${m}.bias`, h));
      out.push(linear(`${l}.attn.o.weight`, h, h), bias(`${l}.attn.o.bias`, h));
      out.push(norm(`${l}.ln2.weight`, h), bias(`${l}.ln2.bias`, h));
      out.push(linear(`${l}.mlp.fc1.weight`, h, spec.ffn), bias(`${l}.mlp.fc1.bias`, spec.ffn));
      out.push(linear(`${l}.mlp.fc2.weight`, spec.ffn, h), bias(`${l}.mlp.fc2.bias`, h));
    }
    out.push(norm('post_ln.weight', h), bias('post_ln.bias', h));
    // Stored as (1 + w) already, the way Gemma3RMSNorm applies it.
    out.push(norm('mm.soft_emb_norm.weight', h));
    out.push(linear('mm.input_projection.weight', h, spec.outHidden));
    return out;
  }
  const hd = h / spec.heads;
  const patchDim = spec.patchSize * spec.patchSize * 3;
  out.push(linear('patch_embed.input_proj.weight', patchDim, h));
  out.push(w('patch_embed.pos_table_x', [spec.positionTableSize, h], 0.02));
  out.push(w('patch_embed.pos_table_y', [spec.positionTableSize, h], 0.02));
  for (let i = 0; i < spec.layers; i++) {
    const l = `layers.${i}`;
    out.push(norm(`${l}.input_norm.weight`, h));
    for (const m of ['q', 'k', 'v']) out.push(linear(`${l}.attn.${m}.weight`, h, h));
    out.push(norm(`${l}.attn.q_norm.weight`, hd), norm(`${l}.attn.k_norm.weight`, hd));
    out.push(linear(`${l}.attn.o.weight`, h, h));
    out.push(norm(`${l}.post_attention_norm.weight`, h), norm(`${l}.pre_ffw_norm.weight`, h));
    out.push(linear(`${l}.mlp.gate.weight`, h, spec.ffn), linear(`${l}.mlp.up.weight`, h, spec.ffn));
    out.push(linear(`${l}.mlp.down.weight`, spec.ffn, h));
    out.push(norm(`${l}.post_ffw_norm.weight`, h));
  }
  out.push(linear('mm.input_projection.weight', h, spec.outHidden));
  return out;
}

/** The values of one weight for a seed (each tensor has its own stream, so any one can be rebuilt). */
export function weightValues(ws: WeightSpec, seed: number): Float32Array {
  const n = ws.dims.reduce((a, b) => a * b, 1);
  return new SeededRandom(tensorSeed(seed, ws.name)).fill(n, ws.std, ws.mean);
}

/** All weights of a (small) spec in memory, for reference computations in tests. */
export function visionWeights(spec: VisionSpec, seed: number): Map<string, Float32Array> {
  const specs = visionWeightSpecs(spec);
  const total = specs.reduce((a, s) => a + s.dims.reduce((x, y) => x * y, 1), 0);
  if (total > 64e6) throw new RangeError(`visionWeights: ${total} params is too many to hold for a reference; use a tiny preset`);
  return new Map(specs.map((s) => [s.name, weightValues(s, seed)]));
}

// ---------------------------------------------------------------- graph construction

function rmsNorm(g: OnnxGraphBuilder, x: string, weight: string | undefined, eps: string, axesLast: string): string {
  const ms = g.node('ReduceMean', [g.node('Mul', [x, x]), axesLast], { keepdims: 1 });
  const y = g.node('Div', [x, g.node('Sqrt', [g.node('Add', [ms, eps])])]);
  return weight ? g.node('Mul', [y, weight]) : y;
}

function buildSiglip(g: OnnxGraphBuilder, spec: SiglipSpec, seed: number): void {
  const h = spec.hidden;
  const hd = h / spec.heads;
  const grid = spec.imageSize / spec.patchSize;
  const tokens = (grid / spec.poolKernel) ** 2;
  const W = new Map(visionWeightSpecs(spec).map((s) => [s.name, g.weight(s.name, s.dims, () => weightValues(s, seed))]));
  const get = (name: string): string => {
    const v = W.get(name);
    if (!v) throw new Error(`vision-synth: no weight ${name}`);
    return v;
  };
  const pixels = g.input('pixel_values', 'float', ['batch', 3, spec.imageSize, spec.imageSize]);
  const eps = { float: spec.eps };
  let x = g.node('Conv', [pixels, get('patch_embed.weight'), get('patch_embed.bias')], {
    kernel_shape: [spec.patchSize, spec.patchSize],
    strides: [spec.patchSize, spec.patchSize],
  });
  x = g.node('Reshape', [x, g.constI64([0, h, grid * grid])]);
  x = g.node('Transpose', [x], { perm: [0, 2, 1] });
  x = g.node('Add', [x, get('pos_embed')]);
  const headShape = g.constI64([0, -1, spec.heads, hd]);
  const mergeShape = g.constI64([0, -1, h]);
  const scale = g.scalar(1 / Math.sqrt(hd));
  const lin = (inp: string, name: string): string => g.node('Add', [g.node('MatMul', [inp, get(`${name}.weight`)]), get(`${name}.bias`)]);
  for (let i = 0; i < spec.layers; i++) {
    const l = `layers.${i}`;
    const n1 = g.node('LayerNormalization', [x, get(`${l}.ln1.weight`), get(`${l}.ln1.bias`)], { axis: -1, epsilon: eps });
    const split = (name: string, perm: number[]): string => g.node('Transpose', [g.node('Reshape', [lin(n1, name), headShape])], { perm });
    const q = split(`${l}.attn.q`, [0, 2, 1, 3]);
    const kT = split(`${l}.attn.k`, [0, 2, 3, 1]);
    const v = split(`${l}.attn.v`, [0, 2, 1, 3]);
    const probs = g.node('Softmax', [g.node('Mul', [g.node('MatMul', [q, kT]), scale])], { axis: -1 });
    const ctx = g.node('Reshape', [g.node('Transpose', [g.node('MatMul', [probs, v])], { perm: [0, 2, 1, 3] }), mergeShape]);
    x = g.node('Add', [x, lin(ctx, `${l}.attn.o`)]);
    const n2 = g.node('LayerNormalization', [x, get(`${l}.ln2.weight`), get(`${l}.ln2.bias`)], { axis: -1, epsilon: eps });
    const act = g.node('Gelu', [lin(n2, `${l}.mlp.fc1`)], { approximate: 'tanh' });
    x = g.node('Add', [x, lin(act, `${l}.mlp.fc2`)]);
  }
  x = g.node('LayerNormalization', [x, get('post_ln.weight'), get('post_ln.bias')], { axis: -1, epsilon: eps });
  // [N, S, h] → [N, h, grid, grid] → avg-pool k×k → [N, tokens, h]
  x = g.node('Reshape', [g.node('Transpose', [x], { perm: [0, 2, 1] }), g.constI64([0, h, grid, grid])]);
  x = g.node('AveragePool', [x], { kernel_shape: [spec.poolKernel, spec.poolKernel], strides: [spec.poolKernel, spec.poolKernel] });
  x = g.node('Transpose', [g.node('Reshape', [x, g.constI64([0, h, tokens])])], { perm: [0, 2, 1] });
  x = rmsNorm(g, x, get('mm.soft_emb_norm.weight'), g.scalar(spec.eps), g.constI64([-1]));
  x = g.node('MatMul', [x, get('mm.input_projection.weight')]);
  g.output('image_features', 'float', ['batch', tokens, spec.outHidden], x);
}

/** The values of each weight: seeded random ones, or a trained checkpoint's. */
export type VisionWeightSource = (ws: WeightSpec) => Float32Array;

function buildGemma4(g: OnnxGraphBuilder, spec: Gemma4VisionSpec, weightOf: VisionWeightSource): void {
  const h = spec.hidden;
  const hd = h / spec.heads;
  if (hd % 4 !== 0) throw new RangeError(`gemma4 vision: head dim ${hd} must be divisible by 4 (2-D RoPE halves)`);
  const patchDim = spec.patchSize * spec.patchSize * 3;
  const W = new Map(visionWeightSpecs(spec).map((s) => [s.name, g.weight(s.name, s.dims, () => weightOf(s))]));
  const get = (name: string): string => {
    const v = W.get(name);
    if (!v) throw new Error(`vision-synth: no weight ${name}`);
    return v;
  };
  const pixels = g.input('pixel_values', 'float', ['batch', 'num_patches', patchDim]);
  const positions = g.input('pixel_position_ids', 'int64', ['batch', 'num_patches', 2]);
  const eps = g.scalar(spec.eps);
  const axesLast = g.constI64([-1]);
  const one = g.initializer('one_i64', 'int64', [], BigInt64Array.of(1n));

  // Valid patches: position id >= 0. They come first (processor layout), so slice the rest away.
  const colAll = g.node('Gather', [positions, g.initializer('idx_col', 'int64', [], BigInt64Array.of(0n))], { axis: 2 });
  const rowAll = g.node('Gather', [positions, g.initializer('idx_row', 'int64', [], BigInt64Array.of(1n))], { axis: 2 });
  const valid = g.node('GreaterOrEqual', [colAll, g.initializer('zero_i64', 'int64', [], BigInt64Array.of(0n))]);
  const nValid = g.node('ReduceSum', [g.node('Cast', [valid], { to: 7 })], { keepdims: 0 });
  const nValid1 = g.node('Reshape', [nValid, g.constI64([1])]);
  const cols = g.node('Add', [g.node('ReduceMax', [colAll], { keepdims: 0 }), one]);
  const rows = g.node('Div', [nValid, cols]);
  const start = g.constI64([0]);
  const axis1 = g.constI64([1]);
  const pv = g.node('Slice', [pixels, start, nValid1, axis1]);
  const col = g.node('Slice', [colAll, start, nValid1, axis1]);
  const row = g.node('Slice', [rowAll, start, nValid1, axis1]);

  // Patch embedding on 2x − 1, plus learned x/y position tables.
  const scaled = g.node('Sub', [g.node('Mul', [pv, g.scalar(2)]), g.scalar(1)]);
  let x = g.node('MatMul', [scaled, get('patch_embed.input_proj.weight')]);
  x = g.node('Add', [x, g.node('Gather', [get('patch_embed.pos_table_x'), col], { axis: 0 })]);
  x = g.node('Add', [x, g.node('Gather', [get('patch_embed.pos_table_y'), row], { axis: 0 })]);

  // 2-D NeoX RoPE tables. Per head, dims [0,hd/2) rotate with col and [hd/2,hd) with row.
  // Within each half the pairs are (i, i + hd/4), with inv_freq θ^(−2i/(hd/2)).
  const quarter = hd / 4;
  const invFreq = Float32Array.from({ length: quarter }, (_, i) => Math.pow(spec.ropeTheta, (-2 * i) / (hd / 2)));
  const invFreqName = g.initializer('rope_inv_freq', 'float', [quarter], invFreq);
  const angles = (pos: string): string => g.node('Mul', [g.node('Unsqueeze', [g.node('Cast', [pos], { to: 1 }), axesLast]), invFreqName]);
  const angX = angles(col);
  const angY = angles(row);
  const headAxis = g.constI64([1]);
  const cos = g.node('Unsqueeze', [
    g.node('Concat', [g.node('Cos', [angX]), g.node('Cos', [angX]), g.node('Cos', [angY]), g.node('Cos', [angY])], { axis: -1 }),
    headAxis,
  ]);
  const sin = g.node('Unsqueeze', [
    g.node('Concat', [g.node('Sin', [angX]), g.node('Sin', [angX]), g.node('Sin', [angY]), g.node('Sin', [angY])], { axis: -1 }),
    headAxis,
  ]);
  const quarters = g.constI64([quarter, quarter, quarter, quarter]);
  const rope = (t: string): string => {
    const [a1, b1, a2, b2] = g.nodeN('Split', [t, quarters], 4, { axis: -1 }) as [string, string, string, string];
    const rotated = g.node('Concat', [g.node('Neg', [b1]), a1, g.node('Neg', [b2]), a2], { axis: -1 });
    return g.node('Add', [g.node('Mul', [t, cos]), g.node('Mul', [rotated, sin])]);
  };

  const headShape = g.constI64([0, -1, spec.heads, hd]);
  const mergeShape = g.constI64([0, -1, h]);
  for (let i = 0; i < spec.layers; i++) {
    const l = `layers.${i}`;
    const n1 = rmsNorm(g, x, get(`${l}.input_norm.weight`), eps, axesLast);
    // [1, n, heads, hd], per-head norm, → [1, heads, n, hd]
    const heads = (m: string, normWeight: string | undefined): string => {
      const t = g.node('Reshape', [g.node('MatMul', [n1, get(`${l}.attn.${m}.weight`)]), headShape]);
      return g.node('Transpose', [rmsNorm(g, t, normWeight, eps, axesLast)], { perm: [0, 2, 1, 3] });
    };
    const q = rope(heads('q', get(`${l}.attn.q_norm.weight`)));
    const k = rope(heads('k', get(`${l}.attn.k_norm.weight`)));
    const v = heads('v', undefined);
    const probs = g.node('Softmax', [g.node('MatMul', [q, g.node('Transpose', [k], { perm: [0, 1, 3, 2] })])], { axis: -1 });
    const ctx = g.node('Reshape', [g.node('Transpose', [g.node('MatMul', [probs, v])], { perm: [0, 2, 1, 3] }), mergeShape]);
    const attn = rmsNorm(g, g.node('MatMul', [ctx, get(`${l}.attn.o.weight`)]), get(`${l}.post_attention_norm.weight`), eps, axesLast);
    x = g.node('Add', [x, attn]);
    const n2 = rmsNorm(g, x, get(`${l}.pre_ffw_norm.weight`), eps, axesLast);
    const gate = g.node('Gelu', [g.node('MatMul', [n2, get(`${l}.mlp.gate.weight`)])], { approximate: 'tanh' });
    const mlp = g.node('MatMul', [g.node('Mul', [gate, g.node('MatMul', [n2, get(`${l}.mlp.up.weight`)])]), get(`${l}.mlp.down.weight`)]);
    x = g.node('Add', [x, rmsNorm(g, mlp, get(`${l}.post_ffw_norm.weight`), eps, axesLast)]);
  }

  // Pool k×k over the (rows × cols) grid: [1,n,h] → [1,rows,cols,h] → [1,h,rows,cols] → avg → [1,T,h].
  const gridShape = g.node(
    'Concat',
    [g.constI64([1]), g.node('Reshape', [rows, g.constI64([1])]), g.node('Reshape', [cols, g.constI64([1])]), g.constI64([h])],
    { axis: 0 },
  );
  x = g.node('Transpose', [g.node('Reshape', [x, gridShape])], { perm: [0, 3, 1, 2] });
  x = g.node('AveragePool', [x], { kernel_shape: [spec.poolKernel, spec.poolKernel], strides: [spec.poolKernel, spec.poolKernel] });
  x = g.node('Transpose', [g.node('Reshape', [x, g.constI64([1, h, -1])])], { perm: [0, 2, 1] });
  x = g.node('Mul', [x, g.scalar(Math.sqrt(h))]);
  x = rmsNorm(g, x, undefined, eps, axesLast);
  x = g.node('MatMul', [x, get('mm.input_projection.weight')]);
  g.output('image_features', 'float', ['batch', 'num_tokens', spec.outHidden], x);
}

export interface SynthesizeVisionOptions {
  readonly preset: string;
  /** Output .onnx path. */
  readonly out: string;
  readonly seed?: number;
  readonly dtype?: 'fp32';
  /** Weights above this size go to `<out>.data` (default 512 MiB; so400m-896 always ends up external). */
  readonly externalDataThreshold?: number;
  /** Progress while weights are written: bytes done, bytes total. */
  readonly onProgress?: (doneBytes: number, totalBytes: number) => void;
}

export interface SynthesizeVisionResult extends OnnxModelInfo {
  readonly preset: string;
  readonly contract: VisionContract;
  readonly seed: number;
  readonly outHidden: number;
  readonly ms: number;
}

export function synthesizeVision(opts: SynthesizeVisionOptions): SynthesizeVisionResult {
  const preset = visionPreset(opts.preset);
  const seed = opts.seed ?? 0;
  if (!Number.isInteger(seed) || seed < 0) throw new RangeError(`synthesizeVision: seed must be a non-negative integer, got ${seed}`);
  if (opts.dtype !== undefined && opts.dtype !== 'fp32')
    throw new RangeError(`synthesizeVision: dtype '${String(opts.dtype)}' is not supported (fp32 only)`);
  const t0 = performance.now();
  const g = new OnnxGraphBuilder({
    name: `percept-synth-${preset.name}`,
    docString: `synthetic ${preset.contract} vision encoder (${preset.description}), seed ${seed}; random weights`,
  });
  if (preset.spec.kind === 'siglip') buildSiglip(g, preset.spec, seed);
  else buildGemma4(g, preset.spec, (ws) => weightValues(ws, seed));
  mkdirSync(dirname(resolve(opts.out)), { recursive: true });
  // Write the .onnx under a temporary name first, so a crash never leaves a model that looks complete.
  // The data file gets its final name at once, since the model refers to it by base name.
  const tmp = `${opts.out}.tmp-${process.pid}`;
  const info = g.write(tmp, {
    externalDataThreshold: opts.externalDataThreshold ?? 512 * 1024 * 1024,
    dataPath: `${opts.out}.data`,
    ...(opts.onProgress ? { onProgress: opts.onProgress } : {}),
    metadata: { 'percept.preset': preset.name, 'percept.contract': preset.contract, 'percept.seed': String(seed) },
  });
  renameSync(tmp, opts.out);
  return {
    ...info,
    path: opts.out,
    preset: preset.name,
    contract: preset.contract,
    seed,
    outHidden: preset.spec.outHidden,
    ms: performance.now() - t0,
  };
}

export interface WriteGemma4VisionOptions {
  readonly spec: Gemma4VisionSpec;
  readonly weightOf: VisionWeightSource;
  /** Output .onnx path; written under a temporary name and renamed when complete. */
  readonly out: string;
  readonly name: string;
  readonly docString: string;
  readonly metadata: Readonly<Record<string, string>>;
}

/** Writes a Gemma 4 vision encoder (the same graph as the synthetic ones) with given weights. */
export function writeGemma4VisionOnnx(opts: WriteGemma4VisionOptions): OnnxModelInfo {
  const g = new OnnxGraphBuilder({ name: opts.name, docString: opts.docString });
  buildGemma4(g, opts.spec, opts.weightOf);
  mkdirSync(dirname(resolve(opts.out)), { recursive: true });
  const tmp = `${opts.out}.tmp-${process.pid}`;
  const info = g.write(tmp, { externalDataThreshold: 512 * 1024 * 1024, dataPath: `${opts.out}.data`, metadata: { ...opts.metadata } });
  renameSync(tmp, opts.out);
  return { ...info, path: opts.out };
}
