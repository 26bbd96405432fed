// Exports a train.py checkpoint into the compact weights file the repository ships (models/demo/), then
// assembles the decoder, mmproj and ONNX encoder from it once and records their sha256 in the file.
// An --out ending in .gz (the default, the shipped file) is written gzip-compressed (gzipDemoWeights); others plain.
//
//   node --import tsx tools/demo-model/export.ts --ckpt .carry/demo-model-run3/ckpt
//   node --import tsx tools/demo-model/export.ts --rehash        # assembly code changed: record new hashes
//   node --import tsx tools/demo-model/export.ts --assistant .carry/demo-assistant/assistant   # its MTP draft
//   node --import tsx tools/demo-model/export.ts --name gemma4-robot-assistant --rehash
import { readFileSync, statSync } from 'node:fs';
import { mkdtemp, rename, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import {
  DEMO_MODELS,
  DemoWeights,
  assembleFrom,
  demoWeightsFile,
  gzipDemoWeights,
  sha256File,
  type DemoAssistantInfo,
  type DemoModelInfo,
  type DemoPart,
} from '../../models/demo-model.ts';
import { GGUFWriter, readGGUF, readTensorData, str } from '../../models/gguf.ts';
import { GGMLType, blockSize, f16BitsToF32, quantize, type CodecType } from '../../models/quant.ts';
import { VOCAB_SIZE, tensorDefs, type Gemma4AssistantConfig, type Gemma4Config } from '../../models/synth.ts';
import type { Gemma4VisionSpec } from '../../models/vision-synth.ts';

const PARTS: readonly DemoPart[] = ['decoder', 'vision', 'mmproj'];
const STORAGE: Record<string, CodecType> = { f16: GGMLType.F16, q8_0: GGMLType.Q8_0, q6_k: GGMLType.Q6_K };

interface SafeTensor {
  readonly dtype: string;
  readonly shape: number[];
  readonly values: Float32Array | BigInt64Array;
}

/** Reads a .safetensors file (8-byte header length, JSON header, raw little-endian data). */
function readSafetensors(path: string): Map<string, SafeTensor> {
  const buf = readFileSync(path);
  const headerLength = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + headerLength).toString('utf8')) as Record<
    string,
    { dtype: string; shape: number[]; data_offsets: [number, number] }
  >;
  const base = 8 + headerLength;
  const out = new Map<string, SafeTensor>();
  for (const [name, t] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const bytes = buf.subarray(base + t.data_offsets[0], base + t.data_offsets[1]);
    const copy = new Uint8Array(bytes).buffer;
    let values: Float32Array | BigInt64Array;
    if (t.dtype === 'F32') values = new Float32Array(copy);
    else if (t.dtype === 'F16') values = Float32Array.from(new Uint16Array(copy), f16BitsToF32);
    else if (t.dtype === 'I64') values = new BigInt64Array(copy);
    else throw new Error(`${path}: tensor ${name} has dtype ${t.dtype}, expected F32, F16 or I64`);
    out.set(name, { dtype: t.dtype, shape: t.shape, values });
  }
  return out;
}

interface CheckpointJson {
  seed: number;
  table_seed?: number;
  steps: number;
  init_steps?: number;
  image_tokens_budget: number;
  image_attention: string;
  weight_files: string[];
  table_rows_file: string;
  weights_dtype: string;
  model_config: { text: Record<string, unknown>; vision: Record<string, unknown> };
}

function textConfig(t: Record<string, unknown>): Gemma4Config {
  const num = (k: string) => t[k] as number;
  const types = t.layer_types as string[];
  return {
    arch: 'gemma4',
    layers: num('num_hidden_layers'),
    hidden: num('hidden_size'),
    heads: num('num_attention_heads'),
    kvHeads: { sliding: num('num_key_value_heads'), full: num('num_key_value_heads') },
    headDim: { sliding: num('head_dim'), full: num('global_head_dim') },
    ffn: num('intermediate_size'),
    doubleWideMlp: t.use_double_wide_mlp === true,
    sliding: types.map((x) => x === 'sliding_attention'),
    window: num('sliding_window'),
    sharedKvLayers: num('num_kv_shared_layers'),
    perLayerInput: num('hidden_size_per_layer_input'),
    context: num('max_position_embeddings'),
    rope: { base: 1_000_000, baseSwa: 10_000 },
    partialRotaryFull: 0.25,
    softcap: num('final_logit_softcapping'),
    eps: num('rms_norm_eps'),
  };
}

function visionSpec(v: Record<string, unknown>, outHidden: number): Gemma4VisionSpec {
  const num = (k: string) => v[k] as number;
  return {
    kind: 'gemma4',
    patchSize: num('patch_size'),
    hidden: num('hidden_size'),
    layers: num('num_hidden_layers'),
    heads: num('num_attention_heads'),
    ffn: num('intermediate_size'),
    poolKernel: num('pooling_kernel_size'),
    positionTableSize: num('position_embedding_size'),
    ropeTheta: 100,
    outHidden,
    eps: num('rms_norm_eps'),
  };
}

/** Storage type of one tensor: matrices and tables in the chosen type where rows fit its blocks, else f16; vectors f32. */
function storageOf(name: string, shape: number[], text: CodecType, vision: CodecType): CodecType {
  if (shape.length === 1) return GGMLType.F32;
  const type = name.startsWith('vision_tower.') ? vision : text;
  return shape.at(-1)! % blockSize(type) === 0 ? type : GGMLType.F16;
}

async function exportCheckpoint(ckptDir: string, out: string, text: CodecType, vision: CodecType): Promise<void> {
  const ckpt = JSON.parse(readFileSync(join(ckptDir, 'checkpoint.json'), 'utf8')) as CheckpointJson;
  if (!ckpt.image_attention.startsWith('bidirectional-swa'))
    throw new Error(
      `${ckptDir}: trained with '${ckpt.image_attention}' image attention; percept decodes gemma4 of this width bidirectional-swa`,
    );
  const tensors = new Map<string, SafeTensor>();
  for (const f of ckpt.weight_files) for (const [k, v] of readSafetensors(join(ckptDir, f))) tensors.set(k, v);
  const rows = readSafetensors(join(ckptDir, ckpt.table_rows_file));
  const tc = textConfig(ckpt.model_config.text);
  const info: DemoModelInfo = {
    format: 'percept-demo-weights/1',
    text: tc,
    vision: visionSpec(ckpt.model_config.vision, tc.hidden),
    tables: { seed: ckpt.table_seed ?? ckpt.seed, std: 0.02, vocab: VOCAB_SIZE },
    imageTokens: ckpt.image_tokens_budget,
    sha256: {},
    provenance: {
      trainer: 'tools/demo-model/train.py',
      steps: ckpt.steps + (ckpt.init_steps ?? 0),
      seed: ckpt.seed,
      checkpointDtype: ckpt.weights_dtype,
      imageAttention: ckpt.image_attention,
      storage: {
        text: Object.keys(STORAGE).find((k) => STORAGE[k] === text),
        vision: Object.keys(STORAGE).find((k) => STORAGE[k] === vision),
      },
    },
  };
  const g = new GGUFWriter();
  g.set('general.architecture', str('percept-demo-weights'));
  g.set('general.name', str('gemma4-robot'));
  g.set('percept.demo.model', str(JSON.stringify(info)));
  const plan: { name: string; type: number; shape: number[]; bytes: () => Uint8Array }[] = [];
  for (const [full, t] of tensors) {
    const name = full.replace(/^model\./, '');
    const type = storageOf(name, t.shape, text, vision);
    plan.push({ name, type, shape: [...t.shape].reverse(), bytes: () => quantize(type, t.values as Float32Array) });
  }
  const ids = rows.get('ids')!.values as BigInt64Array;
  plan.push({
    name: 'tables.ids',
    type: GGMLType.I32,
    shape: [ids.length],
    bytes: () => new Uint8Array(Int32Array.from(ids, Number).buffer),
  });
  for (const [key, torchName] of [
    ['embed_rows', 'embed_tokens'],
    ['ple_rows', 'embed_tokens_per_layer'],
  ] as const) {
    const r = rows.get(key)!;
    plan.push({
      name: `tables.${torchName}.rows`,
      type: GGMLType.F32,
      shape: [...r.shape].reverse(),
      bytes: () => quantize(GGMLType.F32, r.values as Float32Array),
    });
  }
  for (const p of plan) g.addTensor({ name: p.name, type: p.type, shape: p.shape });
  await g.write(out, function* (_t, i) {
    yield plan[i]!.bytes();
  });
  console.log(`wrote ${out}: ${plan.length} tensors, ${statSync(out).size} bytes`);
}

/** train-assistant.py's state-dict names → llama.cpp's (per layer after `layers.i.`). */
const LAYER_NAMES: Readonly<Record<string, string>> = {
  attn_norm: 'attn_norm.weight',
  'q.weight': 'attn_q.weight',
  q_norm: 'attn_q_norm.weight',
  'o.weight': 'attn_output.weight',
  attn_post_norm: 'post_attention_norm.weight',
  out_scale: 'layer_output_scale.weight',
  ffn_norm: 'ffn_norm.weight',
  'gate.weight': 'ffn_gate.weight',
  'up.weight': 'ffn_up.weight',
  'down.weight': 'ffn_down.weight',
  ffn_post_norm: 'post_ffw_norm.weight',
};

/** llama.cpp's name of a train-assistant.py tensor. */
function ggufName(torchName: string): string {
  if (torchName === 'pre.weight') return 'nextn.pre_projection.weight';
  if (torchName === 'post.weight') return 'nextn.post_projection.weight';
  if (torchName === 'output_norm') return 'output_norm.weight';
  if (torchName === 'rows') return 'tables.token_embd.rows';
  if (torchName === 'ids') return 'tables.ids';
  const m = /^layers\.(\d+)\.(.+)$/.exec(torchName);
  const mapped = m ? LAYER_NAMES[m[2]!] : undefined;
  if (!m || !mapped) throw new RangeError(`assistant export: no llama.cpp name for '${torchName}'`);
  return `blk.${m[1]}.${mapped}`;
}

interface AssistantJson {
  format: string;
  config: {
    layers: number;
    hidden: number;
    backbone_hidden: number;
    heads: number;
    kv_heads: number;
    head_dim_sliding: number;
    head_dim_full: number;
    ffn: number;
    sliding: boolean[];
    window: number;
    context: number;
    rope_theta_sliding: number;
    eps: number;
    vocab: number;
    table_seed: number;
    table_std: number;
  };
  target_steps: number;
  steps: number;
  train_seconds: number;
  seed: number;
  steps_ahead: number;
  final: Record<string, unknown>;
}

async function exportAssistant(dir: string, out: string, target: string, type: CodecType): Promise<void> {
  const meta = JSON.parse(readFileSync(join(dir, 'assistant.json'), 'utf8')) as AssistantJson;
  if (meta.format !== 'percept-demo-assistant/1') throw new Error(`${dir}/assistant.json: not a percept-demo-assistant/1 file`);
  const c = meta.config;
  if (c.vocab !== VOCAB_SIZE) throw new Error(`${dir}: vocabulary ${c.vocab}, percept's Gemma 4 has ${VOCAB_SIZE}`);
  if (c.hidden === c.backbone_hidden)
    throw new Error(`${dir}: hidden ${c.hidden} equals the model's; llama.cpp's assistant needs them to differ`);
  if (c.sliding.some((s) => !s)) throw new Error(`${dir}: a full-attention layer; this export writes sliding layers only`);
  const assistant: Gemma4AssistantConfig = {
    arch: 'gemma4-assistant',
    target: `demo:${target}`,
    layers: c.layers,
    hidden: c.hidden,
    backboneHidden: c.backbone_hidden,
    heads: c.heads,
    kvHeads: { sliding: c.kv_heads, full: c.kv_heads },
    headDim: { sliding: c.head_dim_sliding, full: c.head_dim_full },
    ffn: c.ffn,
    sliding: c.sliding,
    window: c.window,
    context: c.context,
    rope: { base: 1_000_000, baseSwa: c.rope_theta_sliding },
    partialRotaryFull: 0.25,
    eps: c.eps,
  };
  const info: DemoAssistantInfo = {
    format: 'percept-demo-assistant/1',
    assistant,
    target,
    tables: { seed: c.table_seed, std: c.table_std, vocab: c.vocab },
    sha256: {},
    provenance: {
      trainer: 'tools/demo-model/train-assistant.py',
      steps: meta.steps,
      trainSeconds: meta.train_seconds,
      seed: meta.seed,
      stepsAhead: meta.steps_ahead,
      targetSteps: meta.target_steps,
      val: meta.final,
      storage: Object.keys(STORAGE).find((k) => STORAGE[k] === type),
    },
  };
  const tensors = readSafetensors(join(dir, 'assistant.safetensors'));
  // Every stored matrix in the shape llama.cpp loads (a transposed one would pass a count check).
  const shapes = new Map(tensorDefs(assistant).map((d) => [d.name, d.shape.join('×')]));
  const g = new GGUFWriter();
  g.set('general.architecture', str('percept-demo-weights'));
  g.set('general.name', str(`${target} assistant`));
  g.set('percept.demo.model', str(JSON.stringify(info)));
  const plan: { name: string; type: number; shape: number[]; bytes: () => Uint8Array }[] = [];
  for (const [torchName, t] of [...tensors].sort(([a], [b]) => a.localeCompare(b))) {
    const name = ggufName(torchName);
    const shape = [...t.shape].reverse();
    if (t.values instanceof BigInt64Array) {
      const ids = t.values;
      plan.push({ name, type: GGMLType.I32, shape, bytes: () => new Uint8Array(Int32Array.from(ids, Number).buffer) });
      continue;
    }
    const values = t.values;
    const want = shapes.get(name);
    if (want !== undefined && want !== shape.join('×'))
      throw new Error(`${dir}/assistant.safetensors: ${torchName} is ${shape.join('×')} as llama.cpp's ${name}, which is ${want}`);
    const matrix = shape.length === 2 && name !== 'tables.token_embd.rows';
    const st = !matrix ? GGMLType.F32 : shape[0]! % blockSize(type) === 0 ? type : GGMLType.F16;
    plan.push({ name, type: st, shape, bytes: () => quantize(st, values) });
  }
  for (const p of plan) g.addTensor({ name: p.name, type: p.type, shape: p.shape });
  await g.write(out, function* (_t, i) {
    yield plan[i]!.bytes();
  });
  console.log(`wrote ${out}: ${plan.length} tensors, ${statSync(out).size} bytes`);
}

/** Assembles every part from the plain weights file `src` into a scratch folder; writes `dst` with their sha256. */
async function rehash(src: string, dst: string, name: string): Promise<void> {
  const scratch = await mkdtemp(join(tmpdir(), 'percept-demo-'));
  try {
    const w = await DemoWeights.open(src);
    const unhashed = `${dst}.unhashed-${process.pid}`;
    await rewriteInfo(src, unhashed, { ...w.info, sha256: {} });
    const sha256: Partial<Record<DemoPart, string>> = {};
    for (const part of w.info.format === 'percept-demo-assistant/1' ? (['decoder'] as const) : PARTS) {
      const t0 = performance.now();
      const file = await assembleFrom(unhashed, name, part, { cacheDir: scratch, trustUnhashed: true });
      sha256[part] = await sha256File(file);
      console.log(`${part}: ${statSync(file).size} bytes, sha256 ${sha256[part]} (${((performance.now() - t0) / 1000).toFixed(1)} s)`);
    }
    await rewriteInfo(unhashed, dst, { ...w.info, sha256 });
    await rm(unhashed, { force: true });
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}

/** Copies a weights file with a new info KV (tensors byte for byte). */
async function rewriteInfo(src: string, dst: string, info: DemoModelInfo | DemoAssistantInfo): Promise<void> {
  const f = await readGGUF(src);
  const g = new GGUFWriter({ alignment: f.alignment });
  for (const kv of f.kvs) if (kv.key !== 'percept.demo.model' && kv.key !== 'general.alignment') g.set(kv.key, kv.asValue());
  g.set('percept.demo.model', str(JSON.stringify(info)));
  for (const t of f.tensors) g.addTensor({ name: t.name, type: t.type, shape: t.shape.map(Number) });
  const tmp = `${dst}.tmp-${process.pid}`;
  await g.write(tmp, async function* (t) {
    yield await readTensorData(src, f, t.name);
  });
  await rename(tmp, dst);
}

const { values } = parseArgs({
  options: {
    ckpt: { type: 'string' },
    assistant: { type: 'string' },
    out: { type: 'string' },
    name: { type: 'string' },
    target: { type: 'string', default: 'gemma4-robot' },
    text: { type: 'string', default: 'q8_0' },
    vision: { type: 'string', default: 'q6_k' },
    rehash: { type: 'boolean', default: false },
  },
});
const text = STORAGE[values.text!];
const vision = STORAGE[values.vision!];
if (text === undefined || vision === undefined) throw new Error(`--text and --vision take one of ${Object.keys(STORAGE).join(', ')}`);
if (values.ckpt && values.assistant) throw new Error('give --ckpt or --assistant, not both: each writes its own weights file');
if (!values.ckpt && !values.assistant && !values.rehash)
  throw new Error('give --ckpt DIR (a train.py checkpoint), --assistant DIR (a train-assistant.py output) or --rehash');
const name = values.name ?? (values.assistant ? `${values.target}-assistant` : values.target!);
const out = values.out ?? DEMO_MODELS[name];
if (!out) throw new Error(`--name ${name} is not a demo model (models/demo-model.ts DEMO_MODELS); give --out`);
/** Writes the weights file from --ckpt or --assistant, if given. */
async function exportTo(path: string): Promise<boolean> {
  if (values.ckpt) await exportCheckpoint(values.ckpt, path, text!, vision!);
  else if (values.assistant) await exportAssistant(values.assistant, path, values.target!, text!);
  return Boolean(values.ckpt ?? values.assistant);
}
if (!out.endsWith('.gz')) {
  await exportTo(out);
  await rehash(out, out, name);
} else {
  // The plain GGUF is made and rehashed in a scratch folder, then compressed into `out`.
  const work = await mkdtemp(join(tmpdir(), 'percept-demo-export-'));
  try {
    const plain = join(work, 'weights.gguf');
    const exported = await exportTo(plain);
    await rehash(exported ? plain : await demoWeightsFile(out, work), plain, name);
    await gzipDemoWeights(plain, out);
    console.log(`wrote ${out}: ${statSync(out).size} bytes (gzip of ${statSync(plain).size})`);
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}
