// percept's trained demo model: a small Gemma 4 that maps a robot's camera frame to its action.
// The repository holds its trained weights compactly (a gzip-compressed GGUF); the decoder GGUF, the mmproj GGUF
// and the ONNX encoder are assembled from them on first use, checked by hash. Format and provenance: models/README.md#demo-model
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream, existsSync } from 'node:fs';
import { mkdir, rename, rm, stat } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { Transform, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { fileURLToPath } from 'node:url';
import { createGunzip, createGzip } from 'node:zlib';
import { readGGUF, readTensorData, type GGUFFile } from './gguf.ts';
import { transpose2d, writeGemma4Mmproj } from './mmproj-synth.ts';
import { CODEC_TYPES, GGMLType, dequantize, ggmlTypeName, type CodecType } from './quant.ts';
import { writeDemoAssistant, type DemoAssistantInfo } from './demo-assistant.ts';
import { writeTrainedGguf, type Gemma4Config } from './synth.ts';
import { TorchCpuGenerator, torchRandnAsync } from './torch-random.ts';
import { visionWeightSpecs, writeGemma4VisionOnnx, type Gemma4VisionSpec } from './vision-synth.ts';

export type { DemoAssistantInfo } from './demo-assistant.ts';

const HERE = dirname(fileURLToPath(import.meta.url));

/** The demo models the repository ships, by the name a `demo:` spec uses: gzip-compressed weights files. */
export const DEMO_MODELS: Readonly<Record<string, string>> = {
  'gemma4-robot': join(HERE, 'demo', 'gemma4-robot.weights.gguf.gz'),
  // Its draft, an MTP assistant: a decoder-part only, attached as decoder.draftMtp.
  'gemma4-robot-assistant': join(HERE, 'demo', 'gemma4-robot-assistant.weights.gguf'),
};

export type DemoPart = 'decoder' | 'vision' | 'mmproj';

/** What the weights file says about the model (KV `percept.demo.model`, JSON). */
export interface DemoModelInfo {
  readonly format: 'percept-demo-weights/1';
  readonly text: Gemma4Config;
  readonly vision: Gemma4VisionSpec;
  /** Rows of the two vocabulary tables that are not stored are torch.randn(…)·std from this seed. */
  readonly tables: { readonly seed: number; readonly std: number; readonly vocab: number };
  /** Soft tokens a frame gets: the budget the model was trained on. */
  readonly imageTokens: number;
  /** sha256 of each assembled file; a mismatch is an error, never a silent difference. */
  readonly sha256: Readonly<Partial<Record<DemoPart, string>>>;
  /** Where the weights came from: the training run, its steps and data. */
  readonly provenance: Readonly<Record<string, unknown>>;
}

const INFO_KEY = 'percept.demo.model';
/** The tables the weights store only the trained rows of, in the order the trainer drew them. */
const TABLES = ['language_model.embed_tokens.weight', 'language_model.embed_tokens_per_layer.weight'] as const;
const TABLE_IDS = 'tables.ids';
const tableRowsName = (torchName: string) => `tables.${torchName.split('.')[1]}.rows`;

/**
 * Streams a gzip file's decompressed content through `hash` into `out` (or nowhere): the sha256 of the content.
 * A damaged file is an error naming it.
 */
async function gunzipHashed(path: string, out?: Writable): Promise<string> {
  const hash = createHash('sha256');
  const tee = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      hash.update(chunk);
      done(null, chunk);
    },
  });
  const sink = out ?? new Writable({ write: (_chunk, _encoding, done) => done() });
  try {
    await pipeline(createReadStream(path), createGunzip(), tee, sink);
    return hash.digest('hex');
  } catch (err) {
    // zlib's errors (Z_DATA_ERROR, Z_BUF_ERROR: a bad header, a bad checksum, a truncated file) say the file is damaged.
    if (!String((err as NodeJS.ErrnoException).code).startsWith('Z_')) throw err;
    throw new Error(`demo weights ${path}: cannot be decompressed (${(err as Error).message}); the file is damaged`, { cause: err });
  }
}

/** The weights hash: sha256 of a weights file's GGUF content, decompressed when the path ends in `.gz`. */
export async function demoWeightsSha256(path: string): Promise<string> {
  return path.endsWith('.gz') ? gunzipHashed(path) : sha256File(path);
}

/** This process's decompressed copies, by .gz path and cache: each is found again without inflating 8 MB. */
const decompressed = new Map<string, { readonly size: number; readonly mtimeMs: number; readonly out: string }>();

/**
 * A weights file as a plain GGUF path. A `.gz` one is decompressed into `cacheDir` once, named by the weights
 * hash (`demo-<name>-<sha12>.weights.gguf`), and reused after; a plain path is returned as is.
 */
export async function demoWeightsFile(path: string, cacheDir: string): Promise<string> {
  if (!path.endsWith('.gz')) return path;
  const key = `${path}\0${cacheDir}`;
  const { size, mtimeMs } = await stat(path);
  const known = decompressed.get(key);
  if (known && known.size === size && known.mtimeMs === mtimeMs && existsSync(known.out)) return known.out;
  const name = basename(path)
    .replace(/\.gz$/, '')
    .replace(/(\.weights)?\.gguf$/, '');
  // Hashed first, without writing: a copy already in the cache is the usual case.
  const sha = await demoWeightsSha256(path);
  const out = join(cacheDir, `demo-${name}-${sha.slice(0, 12)}.weights.gguf`);
  if (!existsSync(out)) {
    await mkdir(cacheDir, { recursive: true });
    const tmp = `${out}.tmp-${process.pid}`;
    try {
      if ((await gunzipHashed(path, createWriteStream(tmp))) !== sha)
        throw new Error(`demo weights ${path}: changed while it was decompressed`);
      await rename(tmp, out);
    } finally {
      await rm(tmp, { force: true });
    }
  }
  decompressed.set(key, { size, mtimeMs, out });
  return out;
}

/** Writes `src` gzip-compressed (zlib level 9, no name, no mtime: the same bytes every time) to `dst`, via a temp name. */
export async function gzipDemoWeights(src: string, dst: string): Promise<void> {
  const tmp = `${dst}.tmp-${process.pid}`;
  try {
    await pipeline(createReadStream(src), createGzip({ level: 9 }), createWriteStream(tmp));
    await rename(tmp, dst);
  } finally {
    await rm(tmp, { force: true });
  }
}

/** Reads a weights file: its model info and every tensor as f32, dequantized. */
export class DemoWeights {
  /** The plain GGUF read: the file given, or its decompressed copy in the cache. */
  readonly path: string;
  readonly info: DemoModelInfo | DemoAssistantInfo;
  readonly #file: GGUFFile;
  readonly #cache = new Map<string, Float32Array>();

  private constructor(path: string, file: GGUFFile, info: DemoModelInfo | DemoAssistantInfo) {
    this.path = path;
    this.#file = file;
    this.info = info;
  }

  /** Opens a weights file; a `.gz` one is first decompressed into `cacheDir` (demoWeightsFile). */
  static async open(source: string, cacheDir?: string): Promise<DemoWeights> {
    if (source.endsWith('.gz') && cacheDir === undefined)
      throw new Error(`${source}: a .gz weights file needs a cacheDir to decompress into`);
    const path = cacheDir === undefined ? source : await demoWeightsFile(source, cacheDir);
    const file = await readGGUF(path);
    const raw = file.get(INFO_KEY);
    if (typeof raw !== 'string') throw new Error(`${path}: not a percept demo weights file (no ${INFO_KEY} KV)`);
    const info = JSON.parse(raw) as DemoModelInfo | DemoAssistantInfo;
    if (info.format !== 'percept-demo-weights/1' && info.format !== 'percept-demo-assistant/1')
      throw new Error(`${path}: unknown demo weights format ${JSON.stringify((info as { format: unknown }).format)}`);
    return new DemoWeights(path, file, info);
  }

  /** The model's info: an error on an assistant's weights file. */
  get model(): DemoModelInfo {
    if (this.info.format !== 'percept-demo-weights/1') throw new Error(`${this.path}: an assistant's weights, not a model's`);
    return this.info;
  }

  /** A tensor's values (row-major, torch's shape), dequantized to f32. */
  async get(name: string): Promise<Float32Array> {
    const cached = this.#cache.get(name);
    if (cached) return cached;
    const t = this.#file.tensor(name);
    if (!t) throw new RangeError(`${this.path}: no tensor '${name}'`);
    if (!(CODEC_TYPES as readonly number[]).includes(t.type))
      throw new Error(`${this.path}: tensor '${name}' has type ${ggmlTypeName(t.type)}, which cannot be read`);
    const n = t.shape.reduce((a, b) => a * Number(b), 1);
    const bytes = await readTensorData(this.path, this.#file, name);
    const values = dequantize(t.type as CodecType, bytes, n);
    this.#cache.set(name, values);
    return values;
  }

  /** The ids whose table rows were trained and stored. */
  async tableIds(): Promise<Int32Array> {
    const t = this.#file.tensor(TABLE_IDS);
    if (!t || t.type !== GGMLType.I32) throw new Error(`${this.path}: no I32 tensor '${TABLE_IDS}'`);
    const bytes = await readTensorData(this.path, this.#file, TABLE_IDS);
    return new Int32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
  }

  /**
   * Both vocabulary tables in full: torch.randn from the seed, as the trainer drew them, with the trained rows put back.
   */
  async tables(): Promise<Map<string, Float32Array>> {
    const { seed, std, vocab } = this.model.tables;
    // train.py's regen_tables seeds its generator so.
    const g = new TorchCpuGenerator(seed * 1_000_003 + 17);
    const ids = await this.tableIds();
    const out = new Map<string, Float32Array>();
    const { text } = this.model;
    const widths = [text.hidden, text.layers * text.perLayerInput];
    for (const [i, torchName] of TABLES.entries()) {
      const width = widths[i]!;
      const table = await torchRandnAsync(vocab * width, g);
      // torch multiplies in float32 by the scalar cast to float32.
      const scale = Math.fround(std);
      for (let k = 0; k < table.length; k++) {
        table[k] = Math.fround(table[k]! * scale);
        if (k % (1 << 22) === 0) await new Promise<void>((resolve) => setImmediate(resolve));
      }
      const rows = await this.get(tableRowsName(torchName));
      if (rows.length !== ids.length * width)
        throw new Error(`${this.path}: ${tableRowsName(torchName)} holds ${rows.length} values, not ${ids.length}×${width}`);
      ids.forEach((id, r) => table.set(rows.subarray(r * width, (r + 1) * width), id * width));
      out.set(torchName, table);
    }
    return out;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Name maps: transformers → llama.cpp (decoder) and → percept's vision graph (models/vision-synth.ts)

const TEXT_LAYER_NAMES: readonly (readonly [string, string])[] = [
  ['input_layernorm.weight', 'attn_norm.weight'],
  ['post_attention_layernorm.weight', 'post_attention_norm.weight'],
  ['self_attn.q_proj.weight', 'attn_q.weight'],
  ['self_attn.k_proj.weight', 'attn_k.weight'],
  ['self_attn.v_proj.weight', 'attn_v.weight'],
  ['self_attn.o_proj.weight', 'attn_output.weight'],
  ['self_attn.q_norm.weight', 'attn_q_norm.weight'],
  ['self_attn.k_norm.weight', 'attn_k_norm.weight'],
  ['pre_feedforward_layernorm.weight', 'ffn_norm.weight'],
  ['post_feedforward_layernorm.weight', 'post_ffw_norm.weight'],
  ['mlp.gate_proj.weight', 'ffn_gate.weight'],
  ['mlp.up_proj.weight', 'ffn_up.weight'],
  ['mlp.down_proj.weight', 'ffn_down.weight'],
  ['per_layer_input_gate.weight', 'inp_gate.weight'],
  ['per_layer_projection.weight', 'proj.weight'],
  ['post_per_layer_input_norm.weight', 'post_norm.weight'],
  ['layer_scalar', 'layer_output_scale.weight'],
];

/** llama.cpp tensor name → transformers name (without `model.`), for every decoder tensor but rope_freqs. */
export function decoderSourceNames(layers: number): Map<string, string> {
  const m = new Map<string, string>([
    ['token_embd.weight', 'language_model.embed_tokens.weight'],
    ['per_layer_token_embd.weight', 'language_model.embed_tokens_per_layer.weight'],
    ['per_layer_model_proj.weight', 'language_model.per_layer_model_projection.weight'],
    ['per_layer_proj_norm.weight', 'language_model.per_layer_projection_norm.weight'],
    ['output_norm.weight', 'language_model.norm.weight'],
  ]);
  for (let i = 0; i < layers; i++) {
    for (const [hf, gguf] of TEXT_LAYER_NAMES) m.set(`blk.${i}.${gguf}`, `language_model.layers.${i}.${hf}`);
  }
  return m;
}

/** A vision-graph weight from the transformers tensors: linears transposed to [in, out], the position table split. */
async function visionWeight(w: DemoWeights, spec: Gemma4VisionSpec, name: string): Promise<Float32Array> {
  const h = spec.hidden;
  const vt = 'vision_tower.';
  if (name === 'patch_embed.input_proj.weight')
    return transpose2d(await w.get(`${vt}patch_embedder.input_proj.weight`), h, spec.patchSize ** 2 * 3);
  if (name === 'patch_embed.pos_table_x' || name === 'patch_embed.pos_table_y') {
    const table = await w.get(`${vt}patch_embedder.position_embedding_table`);
    const n = spec.positionTableSize * h;
    return name.endsWith('_x') ? table.slice(0, n) : table.slice(n, 2 * n);
  }
  if (name === 'mm.input_projection.weight') return transpose2d(await w.get('embed_vision.embedding_projection.weight'), spec.outHidden, h);
  const m = /^layers\.(\d+)\.(.+)$/.exec(name);
  if (!m) throw new RangeError(`demo model: no source for vision weight '${name}'`);
  const l = `${vt}encoder.layers.${m[1]}.`;
  const linear = async (hf: string, out: number, inp: number) => transpose2d(await w.get(`${l}${hf}.linear.weight`), out, inp);
  switch (m[2]) {
    case 'input_norm.weight':
      return w.get(`${l}input_layernorm.weight`);
    case 'attn.q.weight':
    case 'attn.k.weight':
    case 'attn.v.weight':
    case 'attn.o.weight':
      return linear(`self_attn.${m[2][5]}_proj`, h, h);
    case 'attn.q_norm.weight':
      return w.get(`${l}self_attn.q_norm.weight`);
    case 'attn.k_norm.weight':
      return w.get(`${l}self_attn.k_norm.weight`);
    case 'post_attention_norm.weight':
      return w.get(`${l}post_attention_layernorm.weight`);
    case 'pre_ffw_norm.weight':
      return w.get(`${l}pre_feedforward_layernorm.weight`);
    case 'post_ffw_norm.weight':
      return w.get(`${l}post_feedforward_layernorm.weight`);
    case 'mlp.gate.weight':
      return linear('mlp.gate_proj', spec.ffn, h);
    case 'mlp.up.weight':
      return linear('mlp.up_proj', spec.ffn, h);
    case 'mlp.down.weight':
      return linear('mlp.down_proj', h, spec.ffn);
    default:
      throw new RangeError(`demo model: no source for vision weight '${name}'`);
  }
}

/** Every vision weight the graph names, resolved up front (the ONNX and GGUF writers take sync getters). */
async function visionWeights(w: DemoWeights, spec: Gemma4VisionSpec): Promise<Map<string, Float32Array>> {
  const out = new Map<string, Float32Array>();
  for (const s of visionWeightSpecs(spec)) out.set(s.name, await visionWeight(w, spec, s.name));
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// Assembly

const ASSEMBLED_NAME: Record<DemoPart, (name: string, tag: string) => string> = {
  decoder: (name, tag) => `demo-${name}-${tag}.gguf`,
  vision: (name, tag) => `demo-${name}-${tag}.onnx`,
  mmproj: (name, tag) => `demo-${name}-${tag}.mmproj.gguf`,
};

/** sha256 of a file, streamed. */
export async function sha256File(path: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

/** The decoder GGUF: llama.cpp's tensor order and KVs for the text config, F32 weights, the real tokenizer. */
async function writeDecoder(w: DemoWeights, name: string, out: string): Promise<void> {
  const c = w.model.text;
  const sources = decoderSourceNames(c.layers);
  const tables = await w.tables();
  await writeTrainedGguf(c, name, out, async (def) => {
    const src = sources.get(def.name);
    if (!src) throw new Error(`demo model: no source tensor for ${def.name}`);
    return tables.get(src) ?? (await w.get(src));
  });
}

export interface AssembleDemoOptions {
  /** Where assembled files go, and a `.gz` weights file's decompressed copy. */
  readonly cacheDir: string;
  /** Skip the hash check (the export tool, which computes the hashes). */
  readonly trustUnhashed?: boolean;
}

/** The path of one part of a demo model, assembled into the cache on first use and checked by hash. */
export async function assembleDemoModel(name: string, part: DemoPart, options: AssembleDemoOptions): Promise<string> {
  const weightsPath = DEMO_MODELS[name];
  if (!weightsPath)
    throw new RangeError(`unknown demo model ${JSON.stringify(name)}; expected one of: ${Object.keys(DEMO_MODELS).join(', ')}`);
  return assembleFrom(weightsPath, name, part, options);
}

/** As assembleDemoModel, from any weights file. */
export async function assembleFrom(weightsPath: string, name: string, part: DemoPart, options: AssembleDemoOptions): Promise<string> {
  if (!existsSync(weightsPath)) throw new Error(`demo model ${name}: weights file ${weightsPath} is missing`);
  const w = await DemoWeights.open(weightsPath, options.cacheDir);
  const expected = w.info.sha256[part];
  if (!expected && !options.trustUnhashed) throw new Error(`demo model ${name}: ${weightsPath} records no sha256 for its ${part}`);
  const tag = (expected ?? (await sha256File(w.path))).slice(0, 12);
  const out = join(options.cacheDir, ASSEMBLED_NAME[part](name, tag));
  if (existsSync(out)) return out;
  await mkdir(options.cacheDir, { recursive: true });
  const tmp = `${out}.tmp-${process.pid}`;
  try {
    if (w.info.format === 'percept-demo-assistant/1') {
      if (part !== 'decoder') throw new Error(`demo model ${name}: an MTP assistant has a decoder part only, not ${part}`);
      await writeDemoAssistant(w, w.info, name, tmp);
    } else if (part === 'decoder') await writeDecoder(w, name, tmp);
    else if (part === 'mmproj') {
      const weights = await visionWeights(w, w.model.vision);
      await writeGemma4Mmproj({
        spec: w.model.vision,
        get: (n) => weights.get(n)!,
        out: tmp,
        name: `percept demo ${name} vision`,
        description: `percept's trained demo model ${name}: the Gemma 4 vision tower and projector`,
        stamp: { 'percept.demo.name': name },
      });
    } else {
      const weights = await visionWeights(w, w.model.vision);
      writeGemma4VisionOnnx({
        spec: w.model.vision,
        weightOf: (s) => weights.get(s.name)!,
        out: tmp,
        name: `percept-demo-${name}`,
        docString: `percept's trained demo model ${name}: the Gemma 4 vision tower and projector`,
        metadata: { 'percept.demo.name': name, 'percept.contract': 'gemma4' },
      });
    }
    const got = await sha256File(tmp);
    if (expected && got !== expected) {
      throw new Error(
        `demo model ${name}: the assembled ${part} has sha256 ${got}, the weights file records ${expected}; ` +
          `${weightsPath} is damaged, or the writers changed without re-recording the hashes (node --import tsx tools/demo-model/export.ts --rehash)`,
      );
    }
    await rename(tmp, out);
    return out;
  } finally {
    await rm(tmp, { force: true });
    await rm(`${tmp}.data`, { force: true });
  }
}
