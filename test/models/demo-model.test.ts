// The shipped demo model: its gzip-compressed weights decompressed into the cache, its vocabulary tables redrawn as
// PyTorch drew them, its three files assembled and checked by hash, and damaged weights (GGUF or .gz) refused.
import assert from 'node:assert/strict';
import {
  closeSync,
  copyFileSync,
  existsSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { gunzipSync } from 'node:zlib';
import {
  DEMO_MODELS,
  DemoWeights,
  assembleFrom,
  decoderSourceNames,
  demoWeightsFile,
  demoWeightsSha256,
  sha256File,
  type DemoPart,
} from '../../models/demo-model.ts';
import { readGGUF, readTensorData } from '../../models/gguf.ts';
import { resolveModel } from '../../models/resolve.ts';
import { TorchCpuGenerator, torchRandn } from '../../models/torch-random.ts';
import { REPO_ROOT } from '../support/fixtures.ts';

const WEIGHTS = DEMO_MODELS['gemma4-robot']!;
const PARTS: readonly DemoPart[] = ['decoder', 'vision', 'mmproj'];
/** Rows of both tables from train.py's regen_tables(0), recorded with PyTorch (the file says which). */
const TORCH = JSON.parse(readFileSync(join(REPO_ROOT, 'test/fixtures/demo-model/torch-tables.json'), 'utf8')) as {
  ids: number[];
  embed_tokens: Record<string, string>;
  embed_tokens_per_layer: Record<string, string>;
};
const rowOf = (hex: string) => new Float32Array(new Uint8Array(Buffer.from(hex, 'hex')).buffer);
/** One float32 ulp near the tables' largest values (|x| < 0.25): the AVX2 kernel fuses a few operations differently. */
const ULP = 2 ** -26;

let dir: string;
let weights: DemoWeights;
const assembled = new Map<DemoPart, string>();
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'percept-demo-weights-'));
  weights = await DemoWeights.open(WEIGHTS, dir);
  for (const part of PARTS) assembled.set(part, await assembleFrom(WEIGHTS, 'gemma4-robot', part, { cacheDir: dir }));
});
after(() => rmSync(dir, { recursive: true, force: true }));

describe('demo model weights', () => {
  test('are at most 8 MiB, every file under models/demo/ counted, and say what they hold', () => {
    const demoDir = dirname(WEIGHTS);
    const files = readdirSync(demoDir, { recursive: true, encoding: 'utf8' }).filter((p) => statSync(join(demoDir, p)).isFile());
    const bytes = files.reduce((sum, p) => sum + statSync(join(demoDir, p)).size, 0);
    assert.ok(bytes <= 8 * 1024 * 1024, `${bytes} bytes in ${files.join(', ')}`);
    assert.equal(weights.model.imageTokens, 70);
    assert.deepEqual(Object.keys(weights.info.sha256).sort(), [...PARTS].sort());
  });

  test('torchRandn refuses the short, unvectorized path it does not model', () => {
    assert.throws(() => torchRandn(15, new TorchCpuGenerator(1)), /an integer ≥ 16/);
  });

  test('untrained table rows are what PyTorch drew from the seed; trained rows are the stored ones', async () => {
    const tables = await weights.tables();
    const trained = new Set(await weights.tableIds());
    const stored = {
      embed_tokens: await weights.get('tables.embed_tokens.rows'),
      embed_tokens_per_layer: await weights.get('tables.embed_tokens_per_layer.rows'),
    };
    const ids = [...trained];
    let exact = 0;
    let compared = 0;
    for (const key of ['embed_tokens', 'embed_tokens_per_layer'] as const) {
      const table = tables.get(`language_model.${key}.weight`)!;
      const width = table.length / 262144;
      for (const id of TORCH.ids) {
        const row = table.subarray(id * width, (id + 1) * width);
        if (trained.has(id)) {
          const k = ids.indexOf(id);
          assert.deepEqual(row, stored[key].subarray(k * width, (k + 1) * width), `${key} row ${id} (trained)`);
          continue;
        }
        const torch = rowOf(TORCH[key][String(id)]!);
        row.forEach((v, i) => {
          compared++;
          if (v === torch[i]) exact++;
          assert.ok(Math.abs(v - torch[i]!) <= ULP, `${key}[${id}][${i}]: ${v} vs PyTorch ${torch[i]}`);
        });
      }
    }
    assert.ok(compared >= 640 && exact / compared >= 0.99, `${exact} of ${compared} values bit-identical`);
  });
});

describe('demo model weights, gzip-compressed', () => {
  test('are decompressed once into the cache, named by the sha256 of their content, and reused', async () => {
    const content = gunzipSync(readFileSync(WEIGHTS));
    const sha = await demoWeightsSha256(WEIGHTS);
    assert.equal(sha, await sha256File(weights.path));
    assert.equal(weights.path, join(dir, `demo-gemma4-robot-${sha.slice(0, 12)}.weights.gguf`));
    assert.ok(readFileSync(weights.path).equals(content), 'the decompressed copy differs from the .gz content');
    const mtime = statSync(weights.path).mtimeMs;
    assert.equal(await demoWeightsFile(WEIGHTS, dir), weights.path);
    assert.equal(statSync(weights.path).mtimeMs, mtime, 'the decompressed copy was written again');
    assert.equal(await demoWeightsFile(weights.path, join(dir, 'unused')), weights.path, 'a plain path is read as is');
    assert.equal(await demoWeightsSha256(weights.path), sha);
  });

  test('a damaged .gz is refused with an error that names it, and leaves nothing in the cache', async () => {
    const gz = readFileSync(WEIGHTS);
    const flipped = Buffer.from(gz);
    flipped[gz.length >> 1] ^= 0xff;
    for (const [what, bytes] of [
      ['truncated', gz.subarray(0, gz.length >> 1)],
      ['flipped', flipped],
      ['not gzip', Buffer.from('not a gzip file')],
    ] as const) {
      const damaged = join(dir, `${what.replace(' ', '-')}.weights.gguf.gz`);
      writeFileSync(damaged, bytes);
      const cache = join(dir, `${what.replace(' ', '-')}-cache`);
      const message = (err: Error) =>
        err.message.startsWith(`demo weights ${damaged}: cannot be decompressed (`) && err.message.endsWith('damaged');
      await assert.rejects(assembleFrom(damaged, 'gemma4-robot', 'vision', { cacheDir: cache }), message, what);
      await assert.rejects(demoWeightsSha256(damaged), message, what);
      assert.deepEqual(existsSync(cache) ? readdirSync(cache) : [], [], what);
    }
  });
});

describe('demo model assembly', () => {
  test('every part matches the sha256 the weights record', async () => {
    for (const part of PARTS) assert.equal(await sha256File(assembled.get(part)!), weights.info.sha256[part], part);
  });

  test('the decoder is a gemma4 GGUF with the real tokenizer and the trained weights as stored', async () => {
    const path = assembled.get('decoder')!;
    const f = await readGGUF(path);
    assert.equal(f.get('general.architecture'), 'gemma4');
    assert.equal(f.get('gemma4.embedding_length'), 256);
    assert.equal((f.get('tokenizer.ggml.tokens') as string[]).length, 262144);
    const sources = decoderSourceNames(4);
    for (const name of ['blk.0.attn_q.weight', 'blk.3.ffn_down.weight', 'per_layer_model_proj.weight']) {
      const bytes = await readTensorData(path, f, name);
      const got = new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
      assert.deepEqual(got, await weights.get(sources.get(name)!), name);
    }
  });

  test('resolveModel names it demo:gemma4-robot, and an unknown name is refused with the known ones', async () => {
    assert.equal(await resolveModel('demo:gemma4-robot', 'vision', { cacheDir: dir }), assembled.get('vision'));
    await assert.rejects(
      resolveModel('demo:nope', 'decoder', { cacheDir: dir }),
      /unknown demo model "nope"; expected one of: gemma4-robot/,
    );
  });

  test('damaged weights are refused by hash and leave nothing in the cache', async () => {
    // A plain GGUF, as export.ts and record-parity.py read it too.
    const damaged = join(dir, 'damaged.weights.gguf');
    copyFileSync(weights.path, damaged);
    const f = await readGGUF(damaged);
    const t = f.tensor('vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight')!;
    const fd = openSync(damaged, 'r+');
    writeSync(fd, Buffer.from([0x7f]), 0, 1, f.dataOffset + t.offset + 100);
    closeSync(fd);
    const cache = join(dir, 'damaged-cache');
    await assert.rejects(
      assembleFrom(damaged, 'gemma4-robot', 'vision', { cacheDir: cache }),
      /assembled vision has sha256 [0-9a-f]{64}, the weights file records/,
    );
    assert.deepEqual(existsSync(cache) ? readdirSync(cache) : [], []);
  });
});

describe('the demo model draft (an MTP assistant)', () => {
  const ASSISTANT = DEMO_MODELS['gemma4-robot-assistant']!;
  /** Rows of train-assistant.py's regen_assistant_table(0), recorded with PyTorch. */
  const TORCH_ROWS = JSON.parse(readFileSync(join(REPO_ROOT, 'test/fixtures/demo-model/torch-assistant-table.json'), 'utf8')) as {
    ids: number[];
    token_embd: Record<string, string>;
  };

  test('assembles to the gemma4-assistant GGUF it records, with the weights and table rows as stored', async () => {
    const w = await DemoWeights.open(ASSISTANT, dir);
    assert.equal(w.info.format, 'percept-demo-assistant/1');
    assert.throws(() => w.model, /an assistant's weights/);
    const path = await assembleFrom(ASSISTANT, 'gemma4-robot-assistant', 'decoder', { cacheDir: dir });
    assert.equal(await resolveModel('demo:gemma4-robot-assistant', 'decoder', { cacheDir: dir }), path);
    assert.equal(await sha256File(path), w.info.sha256.decoder);
    const f = await readGGUF(path);
    assert.equal(f.get('general.architecture'), 'gemma4-assistant');
    assert.equal(f.get('gemma4-assistant.embedding_length_out'), 256);
    assert.equal((f.get('tokenizer.ggml.tokens') as string[]).length, 262144);
    const tensor = async (name: string) => {
      const bytes = await readTensorData(path, f, name);
      return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
    };
    for (const name of ['nextn.pre_projection.weight', 'blk.0.attn_q.weight', 'blk.0.ffn_down.weight'])
      assert.deepEqual(await tensor(name), await w.get(name), name);
    const table = await tensor('token_embd.weight');
    const width = table.length / 262144;
    const ids = [...(await w.tableIds())];
    const rows = await w.get('tables.token_embd.rows');
    for (const [k, id] of ids.entries())
      assert.deepEqual(table.subarray(id * width, (id + 1) * width), rows.subarray(k * width, (k + 1) * width), `row ${id} (trained)`);
    let compared = 0;
    for (const id of TORCH_ROWS.ids) {
      if (ids.includes(id)) continue;
      const torch = rowOf(TORCH_ROWS.token_embd[String(id)]!);
      table.subarray(id * width, (id + 1) * width).forEach((v, i) => {
        compared++;
        assert.ok(Math.abs(v - torch[i]!) <= ULP, `token_embd[${id}][${i}]: ${v} vs PyTorch ${torch[i]}`);
      });
    }
    assert.ok(compared >= 3 * width, `${compared} untrained values compared`);
  });

  test('has no vision part', async () => {
    await assert.rejects(
      assembleFrom(ASSISTANT, 'gemma4-robot-assistant', 'vision', { cacheDir: dir, trustUnhashed: true }),
      /an MTP assistant has a decoder part only, not vision/,
    );
  });
});
