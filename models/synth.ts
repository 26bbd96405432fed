// Synthetic Gemma checkpoints: real architecture, real shapes, real Gemma 4 tokenizer, random weights.
// No weights can be downloaded, so speed and memory are measured on these.
// Shapes, keys, weights and determinism: models/README.md#synthetic-checkpoints
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, rename, rm } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import {
  GGUFWriter,
  arr,
  f32,
  readGGUF,
  str,
  u32,
  type GGUFFile,
  type GGUFValue,
  type GGUFWriteOptions,
  type PlannedTensor,
} from './gguf.ts';
import { GGMLType, KeystreamRng, blockSize, ggmlTypeName, randomBlocks, tensorBytes, typeSize, type RandomType } from './quant.ts';

/** Bump when the bytes a preset produces change, so stale cached files are regenerated. */
const GENERATOR_VERSION = 1;
export const VOCAB_SIZE = 262144;

const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');

export const WEIGHT_TYPES = ['f32', 'f16', 'q8_0', 'q4_0', 'q4_k'] as const;
/** q4_k mimics llama-quantize's Q4_K_M tensor mix; the others are uniform for 2-D weights. */
export type WeightType = (typeof WEIGHT_TYPES)[number];

/** general.file_type (llama_ftype) per wtype. */
const FILE_TYPE: Record<WeightType, number> = { f32: 0, f16: 1, q4_0: 2, q8_0: 7, q4_k: 15 };

// ---------------------------------------------------------------------------------------------------------
// Shapes

interface RopeConfig {
  /** θ of full-attention layers. */
  base: number;
  /** θ of sliding-window layers. */
  baseSwa: number;
}

export interface Gemma4Config {
  readonly arch: 'gemma4';
  readonly layers: number;
  readonly hidden: number;
  readonly heads: number;
  readonly kvHeads: { readonly sliding: number; readonly full: number };
  readonly headDim: { readonly sliding: number; readonly full: number };
  /** intermediate_size; doubled in KV-shared layers when doubleWideMlp (E2B's use_double_wide_mlp). */
  readonly ffn: number;
  readonly doubleWideMlp: boolean;
  /** true = sliding-window layer; a gemma4 model's last layer must be full. */
  readonly sliding: readonly boolean[];
  readonly window: number;
  readonly sharedKvLayers: number;
  /** hidden_size_per_layer_input (PLE width); 0 = no per-layer embeddings. */
  readonly perLayerInput: number;
  readonly context: number;
  readonly rope: RopeConfig;
  /** Fraction of the full-attention head that is rotated ("proportional" RoPE). */
  readonly partialRotaryFull: number;
  readonly softcap: number;
  readonly eps: number;
}

export interface Gemma4AssistantConfig {
  readonly arch: 'gemma4-assistant';
  /** Preset of the target model this drafter reads hidden states and KV from. */
  readonly target: string;
  readonly layers: number;
  readonly hidden: number;
  /** backbone_hidden_size = the target's hidden size. */
  readonly backboneHidden: number;
  readonly heads: number;
  readonly kvHeads: { readonly sliding: number; readonly full: number };
  readonly headDim: { readonly sliding: number; readonly full: number };
  readonly ffn: number;
  readonly sliding: readonly boolean[];
  readonly window: number;
  readonly context: number;
  readonly rope: RopeConfig;
  readonly partialRotaryFull: number;
  readonly eps: number;
}

export interface Gemma3Config {
  readonly arch: 'gemma3';
  readonly layers: number;
  readonly hidden: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly ffn: number;
  /** Sliding window; layer pattern is llama.cpp's default for gemma3: 5 local, 1 global. */
  readonly window: number;
  readonly context: number;
  readonly rope: RopeConfig;
  readonly ropeScaling?: { readonly type: 'linear'; readonly factor: number };
  readonly eps: number;
}

export type ModelConfig = Gemma4Config | Gemma4AssistantConfig | Gemma3Config;

interface Preset {
  readonly description: string;
  readonly config: ModelConfig;
}

const pattern = (period: number, repeats: number): boolean[] =>
  Array.from({ length: period * repeats }, (_, i) => i % period !== period - 1);

const GEMMA4_ROPE: RopeConfig = { base: 1_000_000, baseSwa: 10_000 };

const PRESETS: Readonly<Record<string, Preset>> = {
  'gemma4-tiny': {
    description: 'unit-test Gemma 4: 4 layers [S,F,S,F], hidden 64, PLE 8, 2 KV-shared layers (double-wide MLP)',
    config: {
      arch: 'gemma4',
      layers: 4,
      hidden: 64,
      heads: 2,
      kvHeads: { sliding: 1, full: 1 },
      headDim: { sliding: 64, full: 128 },
      ffn: 256,
      doubleWideMlp: true,
      sliding: [true, false, true, false],
      window: 128,
      sharedKvLayers: 2,
      perLayerInput: 8,
      context: 8192,
      rope: GEMMA4_ROPE,
      partialRotaryFull: 0.25,
      softcap: 30,
      eps: 1e-6,
    },
  },
  'gemma4-tiny-draft': {
    description: 'smaller Gemma 4 with the same vocab, for draft-model speculation against gemma4-tiny: 2 layers [S,F], hidden 32, no PLE',
    config: {
      arch: 'gemma4',
      layers: 2,
      hidden: 32,
      heads: 2,
      kvHeads: { sliding: 1, full: 1 },
      headDim: { sliding: 64, full: 128 },
      ffn: 128,
      doubleWideMlp: false,
      sliding: [true, false],
      window: 128,
      sharedKvLayers: 0,
      perLayerInput: 0,
      context: 8192,
      rope: GEMMA4_ROPE,
      partialRotaryFull: 0.25,
      softcap: 30,
      eps: 1e-6,
    },
  },
  'gemma4-tiny-assistant': {
    description: 'gemma4-assistant (MTP drafter) for gemma4-tiny: 4 Q-only layers [S,S,S,F], hidden 32, backbone 64',
    config: {
      arch: 'gemma4-assistant',
      target: 'gemma4-tiny',
      layers: 4,
      hidden: 32,
      backboneHidden: 64,
      heads: 2,
      kvHeads: { sliding: 1, full: 1 },
      headDim: { sliding: 64, full: 128 },
      ffn: 128,
      sliding: [true, true, true, false],
      window: 128,
      context: 8192,
      rope: GEMMA4_ROPE,
      partialRotaryFull: 0.25,
      eps: 1e-6,
    },
  },
  'gemma3-tiny': {
    description: 'unit-test Gemma 3: 6 layers (5 local : 1 global), hidden 64',
    config: {
      arch: 'gemma3',
      layers: 6,
      hidden: 64,
      heads: 2,
      kvHeads: 1,
      headDim: 64,
      ffn: 256,
      window: 128,
      context: 8192,
      rope: GEMMA4_ROPE,
      eps: 1e-6,
    },
  },
  'gemma4-e2b': {
    description: 'Gemma 4 E2B shapes: 35 layers [S,S,S,S,F]x7, hidden 1536, PLE 256, 20 KV-shared layers',
    config: {
      arch: 'gemma4',
      layers: 35,
      hidden: 1536,
      heads: 8,
      kvHeads: { sliding: 1, full: 1 },
      headDim: { sliding: 256, full: 512 },
      ffn: 6144,
      doubleWideMlp: true,
      sliding: pattern(5, 7),
      window: 512,
      sharedKvLayers: 20,
      perLayerInput: 256,
      context: 131072,
      rope: GEMMA4_ROPE,
      partialRotaryFull: 0.25,
      softcap: 30,
      eps: 1e-6,
    },
  },
  'gemma4-e4b': {
    description: 'Gemma 4 E4B shapes: 42 layers [Sx5,F]x7, hidden 2560, PLE 256, 18 KV-shared layers',
    config: {
      arch: 'gemma4',
      layers: 42,
      hidden: 2560,
      heads: 8,
      kvHeads: { sliding: 2, full: 2 },
      headDim: { sliding: 256, full: 512 },
      ffn: 10240,
      doubleWideMlp: false,
      sliding: pattern(6, 7),
      window: 512,
      sharedKvLayers: 18,
      perLayerInput: 256,
      context: 131072,
      rope: GEMMA4_ROPE,
      partialRotaryFull: 0.25,
      softcap: 30,
      eps: 1e-6,
    },
  },
  'gemma4-e2b-assistant': {
    description: 'Gemma 4 E2B assistant (MTP drafter) shapes: 4 layers [S,S,S,F], hidden 256, backbone 1536',
    config: {
      arch: 'gemma4-assistant',
      target: 'gemma4-e2b',
      layers: 4,
      hidden: 256,
      backboneHidden: 1536,
      heads: 4,
      kvHeads: { sliding: 1, full: 1 },
      headDim: { sliding: 256, full: 512 },
      ffn: 2048,
      sliding: [true, true, true, false],
      window: 512,
      context: 131072,
      rope: GEMMA4_ROPE,
      partialRotaryFull: 0.25,
      eps: 1e-6,
    },
  },
  'gemma4-e4b-assistant': {
    description: 'Gemma 4 E4B assistant (MTP drafter) shapes: 4 layers [S,S,S,F], hidden 256, backbone 2560',
    config: {
      arch: 'gemma4-assistant',
      target: 'gemma4-e4b',
      layers: 4,
      hidden: 256,
      backboneHidden: 2560,
      heads: 4,
      kvHeads: { sliding: 2, full: 2 },
      headDim: { sliding: 256, full: 512 },
      ffn: 2048,
      sliding: [true, true, true, false],
      window: 512,
      context: 131072,
      rope: GEMMA4_ROPE,
      partialRotaryFull: 0.25,
      eps: 1e-6,
    },
  },
  'gemma3-1b': {
    description: 'Gemma 3 1B shapes: 26 layers, hidden 1152, 4 heads / 1 KV head, window 512',
    config: {
      arch: 'gemma3',
      layers: 26,
      hidden: 1152,
      heads: 4,
      kvHeads: 1,
      headDim: 256,
      ffn: 6912,
      window: 512,
      context: 32768,
      rope: GEMMA4_ROPE,
      eps: 1e-6,
    },
  },
  'gemma3-4b': {
    description: 'Gemma 3 4B text shapes: 34 layers, hidden 2560, 8 heads / 4 KV heads, window 1024, linear RoPE x8',
    config: {
      arch: 'gemma3',
      layers: 34,
      hidden: 2560,
      heads: 8,
      kvHeads: 4,
      headDim: 256,
      ffn: 10240,
      window: 1024,
      context: 131072,
      rope: GEMMA4_ROPE,
      ropeScaling: { type: 'linear', factor: 8 },
      eps: 1e-6,
    },
  },
};

// ---------------------------------------------------------------------------------------------------------
// Tensor plan

/** A tensor before a storage type is chosen. `values` = fixed F32 contents (norms, scales, rope_freqs). */
export interface TensorDef {
  readonly name: string;
  readonly shape: readonly number[];
  readonly values?: (i: number) => number;
}

const ones = () => 1;

function gemma4Tensors(c: Gemma4Config): TensorDef[] {
  const t: TensorDef[] = [];
  const P = c.perLayerInput;
  const L = c.layers;
  t.push(ropeFreqs(c.headDim.full, c.partialRotaryFull));
  t.push({ name: 'token_embd.weight', shape: [c.hidden, VOCAB_SIZE] });
  if (P > 0) {
    t.push({ name: 'per_layer_token_embd.weight', shape: [P * L, VOCAB_SIZE] });
    t.push({ name: 'per_layer_model_proj.weight', shape: [c.hidden, P * L] });
    t.push({ name: 'per_layer_proj_norm.weight', shape: [P], values: ones });
  }
  t.push({ name: 'output_norm.weight', shape: [c.hidden], values: ones });
  const firstShared = L - c.sharedKvLayers;
  for (let i = 0; i < L; i++) {
    const swa = c.sliding[i]!;
    const hd = swa ? c.headDim.sliding : c.headDim.full;
    const kv = swa ? c.kvHeads.sliding : c.kvHeads.full;
    const hasKv = i < firstShared;
    const nff = c.doubleWideMlp && !hasKv ? 2 * c.ffn : c.ffn;
    const b = `blk.${i}.`;
    t.push({ name: `${b}attn_norm.weight`, shape: [c.hidden], values: ones });
    t.push({ name: `${b}attn_q.weight`, shape: [c.hidden, c.heads * hd] });
    if (hasKv) {
      t.push({ name: `${b}attn_k.weight`, shape: [c.hidden, kv * hd] });
      t.push({ name: `${b}attn_v.weight`, shape: [c.hidden, kv * hd] });
    }
    t.push({ name: `${b}attn_output.weight`, shape: [c.heads * hd, c.hidden] });
    t.push({ name: `${b}attn_q_norm.weight`, shape: [hd], values: ones });
    if (hasKv) t.push({ name: `${b}attn_k_norm.weight`, shape: [hd], values: ones });
    t.push({ name: `${b}post_attention_norm.weight`, shape: [c.hidden], values: ones });
    t.push({ name: `${b}layer_output_scale.weight`, shape: [1], values: ones });
    t.push(...ffnTensors(b, c.hidden, nff));
    if (P > 0) {
      t.push({ name: `${b}inp_gate.weight`, shape: [c.hidden, P] });
      t.push({ name: `${b}proj.weight`, shape: [P, c.hidden] });
      t.push({ name: `${b}post_norm.weight`, shape: [c.hidden], values: ones });
    }
  }
  return t;
}

function gemma4AssistantTensors(c: Gemma4AssistantConfig): TensorDef[] {
  const t: TensorDef[] = [];
  // llama.cpp creates rope_freqs only for a full-attention layer: an all-sliding assistant has none.
  if (c.sliding.some((s) => !s)) t.push(ropeFreqs(c.headDim.full, c.partialRotaryFull));
  t.push({ name: 'token_embd.weight', shape: [c.hidden, VOCAB_SIZE] });
  t.push({ name: 'output_norm.weight', shape: [c.hidden], values: ones });
  t.push({ name: 'nextn.pre_projection.weight', shape: [2 * c.backboneHidden, c.hidden] });
  t.push({ name: 'nextn.post_projection.weight', shape: [c.hidden, c.backboneHidden] });
  for (let i = 0; i < c.layers; i++) {
    const hd = c.sliding[i] ? c.headDim.sliding : c.headDim.full;
    const b = `blk.${i}.`;
    t.push({ name: `${b}attn_norm.weight`, shape: [c.hidden], values: ones });
    t.push({ name: `${b}attn_q.weight`, shape: [c.hidden, c.heads * hd] });
    t.push({ name: `${b}attn_output.weight`, shape: [c.heads * hd, c.hidden] });
    t.push({ name: `${b}attn_q_norm.weight`, shape: [hd], values: ones });
    t.push({ name: `${b}post_attention_norm.weight`, shape: [c.hidden], values: ones });
    t.push({ name: `${b}layer_output_scale.weight`, shape: [1], values: ones });
    t.push(...ffnTensors(b, c.hidden, c.ffn));
  }
  return t;
}

function gemma3Tensors(c: Gemma3Config): TensorDef[] {
  const t: TensorDef[] = [];
  t.push({ name: 'token_embd.weight', shape: [c.hidden, VOCAB_SIZE] });
  t.push({ name: 'output_norm.weight', shape: [c.hidden], values: ones });
  for (let i = 0; i < c.layers; i++) {
    const b = `blk.${i}.`;
    t.push({ name: `${b}attn_norm.weight`, shape: [c.hidden], values: ones });
    t.push({ name: `${b}attn_q.weight`, shape: [c.hidden, c.heads * c.headDim] });
    t.push({ name: `${b}attn_k.weight`, shape: [c.hidden, c.kvHeads * c.headDim] });
    t.push({ name: `${b}attn_v.weight`, shape: [c.hidden, c.kvHeads * c.headDim] });
    t.push({ name: `${b}attn_output.weight`, shape: [c.heads * c.headDim, c.hidden] });
    t.push({ name: `${b}attn_q_norm.weight`, shape: [c.headDim], values: ones });
    t.push({ name: `${b}attn_k_norm.weight`, shape: [c.headDim], values: ones });
    t.push({ name: `${b}post_attention_norm.weight`, shape: [c.hidden], values: ones });
    t.push(...ffnTensors(b, c.hidden, c.ffn));
  }
  return t;
}

function ffnTensors(b: string, hidden: number, nff: number): TensorDef[] {
  return [
    { name: `${b}ffn_norm.weight`, shape: [hidden], values: ones },
    { name: `${b}ffn_gate.weight`, shape: [hidden, nff] },
    { name: `${b}ffn_up.weight`, shape: [hidden, nff] },
    { name: `${b}ffn_down.weight`, shape: [nff, hidden] },
    { name: `${b}post_ffw_norm.weight`, shape: [hidden], values: ones },
  ];
}

/**
 * Proportional RoPE for full-attention layers (conversion/gemma.py generate_extra_tensors): frequency
 * factor 1 for the rotated pairs, 1e30 (i.e. no rotation) for the rest.
 */
function ropeFreqs(headDimFull: number, partial: number): TensorDef {
  const rotated = Math.floor((headDimFull * partial) / 2);
  return { name: 'rope_freqs.weight', shape: [headDimFull / 2], values: (i) => (i < rotated ? 1 : 1e30) };
}

/** Every tensor of a decoder config in file order, with llama.cpp's names and shapes. */
export function tensorDefs(c: ModelConfig): TensorDef[] {
  switch (c.arch) {
    case 'gemma4':
      return gemma4Tensors(c);
    case 'gemma4-assistant':
      return gemma4AssistantTensors(c);
    case 'gemma3':
      return gemma3Tensors(c);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Storage types (mimicking llama-quantize, src/llama-quant.cpp)

/** llama-quant.cpp use_more_bits: the layers Q4_K_M promotes to Q6_K. */
const useMoreBits = (i: number, n: number) => i < Math.floor(n / 8) || i >= Math.floor((7 * n) / 8) || (i - Math.floor(n / 8)) % 3 === 2;

const isTokenEmbd = (name: string) => name === 'token_embd.weight' || name === 'per_layer_token_embd.weight';

/** Falls back like tensor_type_fallback when the row length does not fit the block size. */
function fit(type: RandomType, ne0: number): RandomType {
  if (ne0 % blockSize(type) === 0) return type;
  const next: RandomType = type === GGMLType.Q4_K ? GGMLType.Q5_0 : type === GGMLType.Q6_K ? GGMLType.Q8_0 : GGMLType.F16;
  return fit(next, ne0);
}

/**
 * Storage type of each tensor for `wtype`, as llama-quantize picks them for Gemma 3/4 (q4_k: its Q4_K_M mix).
 * Works on any tensor table with Gemma's tensor names, a synthetic plan or a real checkpoint's header.
 */
export function chooseTypes(
  defs: readonly { readonly name: string; readonly shape: readonly number[] }[],
  wtype: WeightType,
  layers: number,
): RandomType[] {
  const nAttnV = defs.filter((d) => d.name.endsWith('.attn_v.weight')).length;
  let iAttnV = 0;
  let iFfnDown = 0;
  return defs.map((d) => {
    if (d.shape.length === 1 || wtype === 'f32') return GGMLType.F32;
    if (wtype === 'f16') return GGMLType.F16;
    const ne0 = d.shape[0]!;
    // llama-quantize leaves per_layer_model_proj unquantized ("not too big"): F16 in every quantized mix.
    if (d.name === 'per_layer_model_proj.weight') return GGMLType.F16;
    if (wtype === 'q8_0') return fit(GGMLType.Q8_0, ne0);
    // Tied embeddings are quantized as the output tensor: Q6_K (Q8_0 when rows are not 256-multiples).
    if (isTokenEmbd(d.name)) return ne0 % 256 === 0 ? GGMLType.Q6_K : GGMLType.Q8_0;
    if (wtype === 'q4_0') return fit(GGMLType.Q4_0, ne0);
    if (d.name.endsWith('.attn_v.weight')) return fit(useMoreBits(iAttnV++, nAttnV) ? GGMLType.Q6_K : GGMLType.Q4_K, ne0);
    if (d.name.endsWith('.ffn_down.weight')) return fit(useMoreBits(iFfnDown++, layers) ? GGMLType.Q6_K : GGMLType.Q4_K, ne0);
    return fit(GGMLType.Q4_K, ne0);
  });
}

// ---------------------------------------------------------------------------------------------------------
// Metadata

/** The architecture KVs llama.cpp's loader reads for a decoder config, strictly typed. */
export function archKVs(c: ModelConfig): [string, GGUFValue][] {
  switch (c.arch) {
    case 'gemma4': {
      const p = 'gemma4.';
      const firstShared = c.layers - c.sharedKvLayers;
      const ffn: GGUFValue = c.doubleWideMlp
        ? arr(
            'i32',
            Array.from({ length: c.layers }, (_, i) => (i < firstShared ? c.ffn : 2 * c.ffn)),
          )
        : u32(c.ffn);
      const kvHeads: GGUFValue =
        c.kvHeads.sliding === c.kvHeads.full
          ? u32(c.kvHeads.full)
          : arr(
              'i32',
              c.sliding.map((s) => (s ? c.kvHeads.sliding : c.kvHeads.full)),
            );
      return [
        [`${p}block_count`, u32(c.layers)],
        [`${p}context_length`, u32(c.context)],
        [`${p}embedding_length`, u32(c.hidden)],
        [`${p}feed_forward_length`, ffn],
        [`${p}attention.head_count`, u32(c.heads)],
        [`${p}attention.head_count_kv`, kvHeads],
        [`${p}rope.freq_base`, f32(c.rope.base)],
        [`${p}rope.freq_base_swa`, f32(c.rope.baseSwa)],
        [`${p}attention.layer_norm_rms_epsilon`, f32(c.eps)],
        [`${p}attention.key_length`, u32(c.headDim.full)],
        [`${p}attention.value_length`, u32(c.headDim.full)],
        [`${p}final_logit_softcapping`, f32(c.softcap)],
        [`${p}attention.sliding_window`, u32(c.window)],
        [`${p}attention.shared_kv_layers`, u32(c.sharedKvLayers)],
        [`${p}embedding_length_per_layer_input`, u32(c.perLayerInput)],
        [`${p}attention.sliding_window_pattern`, arr('bool', c.sliding)],
        [`${p}attention.key_length_swa`, u32(c.headDim.sliding)],
        [`${p}attention.value_length_swa`, u32(c.headDim.sliding)],
        [`${p}rope.dimension_count`, u32(c.headDim.full)],
        [`${p}rope.dimension_count_swa`, u32(c.headDim.sliding)],
      ];
    }
    case 'gemma4-assistant': {
      const p = 'gemma4-assistant.';
      const kvHeads: GGUFValue =
        c.kvHeads.sliding === c.kvHeads.full
          ? u32(c.kvHeads.full)
          : arr(
              'i32',
              c.sliding.map((s) => (s ? c.kvHeads.sliding : c.kvHeads.full)),
            );
      return [
        [`${p}block_count`, u32(c.layers)],
        [`${p}context_length`, u32(c.context)],
        [`${p}embedding_length`, u32(c.hidden)],
        [`${p}feed_forward_length`, u32(c.ffn)],
        [`${p}attention.head_count`, u32(c.heads)],
        [`${p}attention.head_count_kv`, kvHeads],
        [`${p}rope.freq_base`, f32(c.rope.base)],
        [`${p}rope.freq_base_swa`, f32(c.rope.baseSwa)],
        [`${p}attention.layer_norm_rms_epsilon`, f32(c.eps)],
        [`${p}attention.key_length`, u32(c.headDim.full)],
        [`${p}attention.value_length`, u32(c.headDim.full)],
        [`${p}attention.sliding_window`, u32(c.window)],
        [`${p}attention.shared_kv_layers`, u32(c.layers)],
        [`${p}embedding_length_per_layer_input`, u32(0)],
        [`${p}attention.sliding_window_pattern`, arr('bool', c.sliding)],
        [`${p}attention.key_length_swa`, u32(c.headDim.sliding)],
        [`${p}attention.value_length_swa`, u32(c.headDim.sliding)],
        [`${p}rope.dimension_count`, u32(c.headDim.full)],
        [`${p}rope.dimension_count_swa`, u32(c.headDim.sliding)],
        [`${p}embedding_length_out`, u32(c.backboneHidden)],
        [`${p}nextn_predict_layers`, u32(c.layers)],
      ];
    }
    case 'gemma3': {
      const p = 'gemma3.';
      const kvs: [string, GGUFValue][] = [
        [`${p}block_count`, u32(c.layers)],
        [`${p}context_length`, u32(c.context)],
        [`${p}embedding_length`, u32(c.hidden)],
        [`${p}feed_forward_length`, u32(c.ffn)],
        [`${p}attention.head_count`, u32(c.heads)],
        [`${p}attention.head_count_kv`, u32(c.kvHeads)],
        [`${p}rope.freq_base`, f32(c.rope.base)],
        [`${p}rope.freq_base_swa`, f32(c.rope.baseSwa)],
        [`${p}attention.layer_norm_rms_epsilon`, f32(c.eps)],
        [`${p}attention.key_length`, u32(c.headDim)],
        [`${p}attention.value_length`, u32(c.headDim)],
        [`${p}attention.sliding_window`, u32(c.window)],
      ];
      if (c.ropeScaling) {
        kvs.push([`${p}rope.scaling.type`, str(c.ropeScaling.type)], [`${p}rope.scaling.factor`, f32(c.ropeScaling.factor)]);
      }
      return kvs;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Tokenizer: the real Gemma 4 vocab GGUF from the llama.cpp tree node-llama-cpp ships.

const VOCAB_FILE = 'ggml-vocab-gemma-4.gguf';

/**
 * Path of ggml-vocab-gemma-4.gguf: $PERCEPT_GEMMA_VOCAB, else the extracted llama.cpp tree
 * (build/llama.cpp/models), else extracted once from node-llama-cpp's git bundle into .cache/vocab.
 */
export async function findGemmaVocab(): Promise<string> {
  const env = process.env.PERCEPT_GEMMA_VOCAB;
  if (env) {
    if (!existsSync(env)) throw new Error(`PERCEPT_GEMMA_VOCAB points at ${env}, which does not exist`);
    return env;
  }
  const inTree = join(REPO_ROOT, 'build', 'llama.cpp', 'models', VOCAB_FILE);
  if (existsSync(inTree)) return inTree;
  const cached = join(REPO_ROOT, '.cache', 'vocab', VOCAB_FILE);
  if (existsSync(cached)) return cached;
  return extractVocabFromBundle(cached);
}

async function extractVocabFromBundle(dest: string): Promise<string> {
  const require = createRequire(join(REPO_ROOT, 'package.json'));
  const pkgDir = (require.resolve.paths('node-llama-cpp') ?? [])
    .map((d) => join(d, 'node-llama-cpp'))
    .find((d) => existsSync(join(d, 'package.json')));
  const bundle = pkgDir && join(pkgDir, 'llama', 'gitRelease.bundle');
  if (!bundle || !existsSync(bundle)) {
    throw new Error(
      `cannot find ${VOCAB_FILE}: not in build/llama.cpp/models and node-llama-cpp's gitRelease.bundle is missing (set PERCEPT_GEMMA_VOCAB)`,
    );
  }
  const run = promisify(execFile);
  const gitDir = `${dest}.git-${process.pid}`;
  await mkdir(dirname(dest), { recursive: true });
  try {
    await run('git', ['init', '-q', '--bare', gitDir]);
    await run('git', ['-C', gitDir, 'fetch', '-q', bundle, 'HEAD']);
    const tmp = `${dest}.tmp-${process.pid}`;
    await run('sh', ['-c', 'git -C "$1" cat-file blob "FETCH_HEAD:models/$2" > "$3"', 'sh', gitDir, VOCAB_FILE, tmp]);
    await rename(tmp, dest);
  } finally {
    await rm(gitDir, { recursive: true, force: true });
  }
  return dest;
}

// ---------------------------------------------------------------------------------------------------------
// Public API

export interface PresetSummary {
  readonly name: string;
  readonly arch: ModelConfig['arch'];
  readonly description: string;
  readonly config: ModelConfig;
  /** Parameter count (elements of all tensors, tied output counted once). */
  readonly params: number;
  readonly tensors: number;
}

export function listPresets(): PresetSummary[] {
  return Object.entries(PRESETS).map(([name, p]) => {
    const defs = tensorDefs(p.config);
    return { name, arch: p.config.arch, description: p.description, config: p.config, params: countParams(defs), tensors: defs.length };
  });
}

export interface PlannedCheckpoint {
  readonly preset: string;
  readonly wtype: WeightType;
  readonly config: ModelConfig;
  /** Tensors in file order with the storage type this wtype gives them. */
  readonly tensors: readonly { readonly name: string; readonly shape: readonly number[]; readonly type: number }[];
  readonly params: number;
  /** Tensor data bytes, each tensor padded to 32: the file size minus the header. */
  readonly dataBytes: number;
}

/** What synthesize() would write, without writing (or reading the vocab): shapes, types, sizes. */
export function planCheckpoint(options: { preset: string; wtype?: WeightType }): PlannedCheckpoint {
  const wtype = parseWeightType(options.wtype ?? 'q8_0');
  const { config, defs, types } = tensorPlan(options.preset, wtype);
  const tensors = defs.map((d, i) => ({ name: d.name, shape: d.shape, type: types[i]! }));
  const dataBytes = tensors.reduce((sum, t) => sum + Math.ceil(Number(tensorBytes(t.type, t.shape)) / 32) * 32, 0);
  return { preset: options.preset, wtype, config, tensors, params: countParams(defs), dataBytes };
}

interface TensorPlan {
  readonly config: ModelConfig;
  readonly defs: TensorDef[];
  /** Storage type of each of `defs` for the wtype. */
  readonly types: RandomType[];
}

/** A preset's validated config, its tensors and their storage types. */
function tensorPlan(presetName: string, wtype: WeightType): TensorPlan {
  const { config } = presetOf(presetName);
  validateConfig(presetName, config);
  const defs = tensorDefs(config);
  return { config, defs, types: chooseTypes(defs, wtype, config.layers) };
}

export interface SynthesizeOptions {
  readonly preset: string;
  readonly wtype?: WeightType;
  readonly out: string;
  readonly seed?: number;
  /** Rewrite even if `out` already carries the same stamp. */
  readonly force?: boolean;
  readonly onProgress?: (bytesWritten: number, totalBytes: number) => void;
}

export interface SynthesizeResult {
  readonly path: string;
  readonly bytes: number;
  readonly params: number;
  readonly tensors: number;
  /** True when `out` already held this exact checkpoint and nothing was written. */
  readonly skipped: boolean;
}

const STAMP = {
  preset: 'percept.synth.preset',
  wtype: 'percept.synth.wtype',
  seed: 'percept.synth.seed',
  version: 'percept.synth.version',
} as const;

function presetOf(name: unknown): Preset {
  if (typeof name !== 'string' || !Object.hasOwn(PRESETS, name)) {
    throw new RangeError(`unknown synthetic preset ${JSON.stringify(name)}; expected one of: ${Object.keys(PRESETS).join(', ')}`);
  }
  return PRESETS[name]!;
}

/** `wtype` as a WeightType, or a RangeError naming the allowed ones. */
export function parseWeightType(wtype: unknown): WeightType {
  if (typeof wtype !== 'string' || !(WEIGHT_TYPES as readonly string[]).includes(wtype)) {
    throw new RangeError(`invalid wtype ${JSON.stringify(wtype)}; expected one of: ${WEIGHT_TYPES.join(', ')}`);
  }
  return wtype as WeightType;
}

function checkSeed(seed: unknown): number {
  if (typeof seed !== 'number' || !Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) {
    throw new RangeError(`invalid seed ${String(seed)}; expected an integer in [0, 2^32)`);
  }
  return seed;
}

/**
 * Writes a synthetic checkpoint for `preset` to `out` (streaming; multi-GB presets never sit in memory).
 * Idempotent: if `out` exists with the same preset/wtype/seed/generator stamp and the expected size, it is
 * left alone and `skipped` is true.
 */
export async function synthesize(options: SynthesizeOptions): Promise<SynthesizeResult> {
  if (typeof options !== 'object' || options === null) throw new TypeError('synthesize: options object required');
  presetOf(options.preset);
  const wtype = parseWeightType(options.wtype ?? 'q8_0');
  const seed = checkSeed(options.seed ?? 1);
  if (typeof options.out !== 'string' || options.out.length === 0) throw new TypeError('synthesize: `out` must be a file path');
  const out = resolve(options.out);

  const plan = tensorPlan(options.preset, wtype);
  const { defs } = plan;
  const params = countParams(defs);
  if (!options.force) {
    const existing = await stampedSize(out, options.preset, wtype, seed);
    if (existing !== undefined) return { path: out, bytes: existing, params, tensors: defs.length, skipped: true };
  }

  const writer = await checkpointWriter(options.preset, plan, wtype, seed);
  await mkdir(dirname(out), { recursive: true });
  const progress: GGUFWriteOptions = options.onProgress ? { onProgress: options.onProgress } : {};
  const { bytes } = await writer.write(
    out,
    (t, i) => tensorChunks(t, defs[i]!, `${GENERATOR_VERSION}/${options.preset}/${seed}`),
    progress,
  );
  return { path: out, bytes, params, tensors: defs.length, skipped: false };
}

/** The writer of a synthetic checkpoint, KVs and tensor infos set (the vocab file is read for the tokenizer). */
async function checkpointWriter(presetName: string, plan: TensorPlan, wtype: WeightType, seed: number): Promise<GGUFWriter> {
  const { config: c, defs, types } = plan;
  const vocab = await readGGUF(await findGemmaVocab());
  const w = new GGUFWriter();
  w.set('general.architecture', str(c.arch));
  w.set('general.type', str('model'));
  w.set('general.name', str(`percept synthetic ${presetName}`));
  w.set('general.file_type', u32(FILE_TYPE[wtype]));
  w.set('general.quantization_version', u32(2));
  w.set(STAMP.preset, str(presetName));
  w.set(STAMP.wtype, str(wtype));
  w.set(STAMP.seed, u32(seed));
  w.set(STAMP.version, u32(GENERATOR_VERSION));
  for (const [k, v] of archKVs(c)) w.set(k, v);
  setTokenizer(w, vocab);
  defs.forEach((d, i) => w.addTensor({ name: d.name, type: types[i]!, shape: d.shape }));
  return w;
}

/**
 * A trained model's GGUF (the demo model and its draft): llama.cpp's tensor order and KVs for `c`, F32 weights,
 * the real tokenizer. `valueOf` gives each tensor but rope_freqs, which the config fixes.
 */
export async function writeTrainedGguf(
  c: ModelConfig,
  name: string,
  out: string,
  valueOf: (def: TensorDef) => Promise<Float32Array>,
): Promise<void> {
  const defs = tensorDefs(c);
  const vocab = await readGGUF(await findGemmaVocab());
  const g = new GGUFWriter();
  g.set('general.architecture', str(c.arch));
  g.set('general.type', str('model'));
  g.set('general.name', str(`percept demo ${name}`));
  g.set('general.file_type', u32(0));
  for (const [k, v] of archKVs(c)) g.set(k, v);
  setTokenizer(g, vocab);
  g.set('percept.demo.name', str(name));
  for (const d of defs) g.addTensor({ name: d.name, type: GGMLType.F32, shape: d.shape });
  await g.write(out, async function* (_t, i) {
    const def = defs[i]!;
    const values =
      def.name === 'rope_freqs.weight' ? Float32Array.from({ length: def.shape[0]! }, (_, k) => def.values!(k)) : await valueOf(def);
    const n = def.shape.reduce((a, b) => a * b, 1);
    if (values.length !== n) throw new Error(`demo model ${name}: ${def.name} needs ${n} values, the weights hold ${values.length}`);
    yield new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
  });
}

/** Copies the Gemma 4 tokenizer's KVs verbatim from the vocab file into a writer. */
export function setTokenizer(w: GGUFWriter, vocab: GGUFFile): void {
  const tokenizerKvs = vocab.kvs.filter((kv) => kv.key.startsWith('tokenizer.'));
  if (tokenizerKvs.length === 0) throw new Error(`vocab file has no tokenizer.* keys`);
  for (const kv of tokenizerKvs) w.set(kv.key, kv.asValue());
}

/**
 * The parsed header of the checkpoint synthesize() would write for these options, built in memory (GGUFWriter.skeleton).
 * It gives a multi-GB preset's metadata and tensor table without generating or writing it.
 */
export async function describeSynthetic(options: { preset: string; wtype?: WeightType; seed?: number }): Promise<GGUFFile> {
  const wtype = parseWeightType(options.wtype ?? 'q8_0');
  const seed = checkSeed(options.seed ?? 1);
  const writer = await checkpointWriter(options.preset, tensorPlan(options.preset, wtype), wtype, seed);
  return readGGUF(writer.skeleton());
}

/**
 * Size of `path` if it is a complete checkpoint with this stamp, else undefined.
 * Files are only ever renamed into place when complete, and readGGUF checks every tensor lies inside the file.
 * So a matching stamp on a parseable file means the same bytes.
 */
async function stampedSize(path: string, preset: string, wtype: WeightType, seed: number): Promise<number | undefined> {
  try {
    const f = await readGGUF(path);
    const same =
      f.get(STAMP.preset) === preset &&
      f.get(STAMP.wtype) === wtype &&
      f.get(STAMP.seed) === seed &&
      f.get(STAMP.version) === GENERATOR_VERSION;
    return same ? f.fileSize : undefined;
  } catch {
    return undefined; // missing or unreadable: regenerate
  }
}

const CHUNK_BYTES = 4 << 20;

function* tensorChunks(t: PlannedTensor, def: TensorDef, label: string): Generator<Uint8Array> {
  const nBlocks = Math.ceil(t.byteLength / typeSize(t.type));
  if (def.values) {
    if (t.type !== GGMLType.F32) throw new Error(`internal: fixed-value tensor ${t.name} must be F32, planned ${ggmlTypeName(t.type)}`);
    const out = Buffer.allocUnsafe(nBlocks * 4);
    for (let i = 0; i < nBlocks; i++) out.writeFloatLE(def.values(i), i * 4);
    yield out;
    return;
  }
  const rng = new KeystreamRng(`percept.synth/${label}/${t.name}`);
  const perChunk = Math.max(1, Math.floor(CHUNK_BYTES / typeSize(t.type)));
  for (let done = 0; done < nBlocks; done += perChunk) {
    yield randomBlocks(t.type as RandomType, Math.min(perChunk, nBlocks - done), rng);
  }
}

function countParams(defs: readonly TensorDef[]): number {
  return defs.reduce((sum, d) => sum + d.shape.reduce((a, b) => a * b, 1), 0);
}

/** Checks the invariants llama.cpp's loaders assert, so a bad preset fails here with a sentence. */
function validateConfig(name: string, c: ModelConfig): void {
  const fail = (msg: string): never => {
    throw new Error(`preset ${name}: ${msg}`);
  };
  if (c.arch === 'gemma3') return;
  if (c.sliding.length !== c.layers) fail(`sliding pattern has ${c.sliding.length} entries for ${c.layers} layers`);
  // gemma4's loader wants a full last layer; an assistant may be all sliding (it reads the target's layers).
  if (c.arch === 'gemma4' && c.sliding[c.layers - 1]) fail('the last layer must be full attention');
  if (c.arch === 'gemma4' && c.sharedKvLayers > 0) {
    const kvFrom = c.layers - c.sharedKvLayers;
    if (kvFrom < 2) fail('KV sharing needs at least 2 non-shared layers');
    if (c.sliding[kvFrom - 1] || !c.sliding[kvFrom - 2]) fail(`layer ${kvFrom - 1} must be full and ${kvFrom - 2} sliding for KV reuse`);
  }
  if (c.arch === 'gemma4-assistant' && c.hidden === c.backboneHidden) fail('embedding_length_out must differ from embedding_length');
}
