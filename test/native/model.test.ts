// Native binding: model loading, info, tokenizer, chat template, the image attention rule, and
// every load/use error (each followed by proof that the process keeps working).
import assert from 'node:assert/strict';
import { mkdir, open, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { PER_LAYER_EMBEDDINGS, imageAttentionRule, LlamaModel, setLlamaLogger } from '../../native/llama.ts';
import { perLayerEmbeddingsArgs } from '../../native/peers.ts';
import { loadAddon } from '../../native/binding.ts';
import { jsonSchemaToGbnf } from '../../native/schema-grammar.ts';
import { ensureSynthModel, REPO_ROOT } from '../support/fixtures.ts';

const SCRATCH = join(REPO_ROOT, '.cache', 'native-test');

/** A GGUF header with only general.architecture = arch (no tensors). */
function headerOnlyGguf(arch: string): Buffer {
  const key = Buffer.from('general.architecture');
  const val = Buffer.from(arch);
  const b = Buffer.alloc(4 + 4 + 8 + 8 + 8 + key.length + 4 + 8 + val.length);
  let o = b.write('GGUF', 0, 'latin1');
  o = b.writeUInt32LE(3, o);
  o = b.writeBigUInt64LE(0n, o);
  o = b.writeBigUInt64LE(1n, o);
  o = b.writeBigUInt64LE(BigInt(key.length), o);
  o += key.copy(b, o);
  o = b.writeUInt32LE(8, o);
  o = b.writeBigUInt64LE(BigInt(val.length), o);
  val.copy(b, o);
  return b;
}

describe('native model', () => {
  let gemma4: string;
  let gemma3: string;
  let model: LlamaModel;

  before(async () => {
    gemma4 = await ensureSynthModel('gemma4-tiny');
    gemma3 = await ensureSynthModel('gemma3-tiny');
    model = await LlamaModel.load(gemma4);
    await mkdir(SCRATCH, { recursive: true });
  });
  after(async () => {
    await model.dispose();
  });

  test('info describes the gemma4 checkpoint', () => {
    const i = model.info;
    assert.equal(i.arch, 'gemma4');
    assert.equal(i.nEmbd, 64);
    assert.equal(i.nVocab, 262144);
    assert.equal(i.nLayer, 4);
    assert.ok(i.sizeBytes > 1_000_000);
    assert.equal(i.imageStartToken, 255999);
    assert.equal(i.imageEndToken, 258882);
    assert.equal(i.imageAttention, 'bidirectional-swa');
    assert.equal(typeof i.chatTemplate, 'string');
    assert.equal(i.bos, 2);
  });

  test('the per-layer embedding table: its name alone, and in host memory without a GPU whatever is asked', async () => {
    const table = new RegExp(PER_LAYER_EMBEDDINGS); // std::regex's ECMAScript grammar, as llama.cpp reads it
    const names = ['token_embd.weight', 'per_layer_token_embd.weight', 'per_layer_model_proj.weight', 'blk.0.per_layer_token_embd.weight'];
    assert.deepEqual(
      names.filter((n) => table.test(n)),
      ['per_layer_token_embd.weight'],
    );
    assert.deepEqual(perLayerEmbeddingsArgs(true), ['-ot', `${PER_LAYER_EMBEDDINGS}=CUDA0`], "the peers' -ot for the first CUDA device");
    assert.deepEqual(perLayerEmbeddingsArgs(false), []);
    assert.equal(model.info.perLayerEmbeddingsOnGpu, false, 'no layer offloaded: the table stays in host memory');
    if (loadAddon().gpuKernels.visionAttention) return; // a CUDA build: the next test
    const asked = await LlamaModel.load(gemma4, { gpuLayers: -1, perLayerEmbeddingsOnGpu: true });
    try {
      assert.equal(asked.info.perLayerEmbeddingsOnGpu, false, 'a CPU build has no GPU to put it on');
      assert.equal(asked.info.nLayer, 4, 'and the model loads as before');
    } finally {
      await asked.dispose();
    }
  });

  test(
    'on a GPU the table goes with every layer, or when asked, and only where the model has one',
    { skip: !loadAddon().gpuKernels.visionAttention && 'a CPU build' },
    async () => {
      // gemma4-tiny has 4 layers: 5 or -1 offloads every one (and the output); gemma3-tiny has no per-layer table.
      const cases: [string, { gpuLayers: number; perLayerEmbeddingsOnGpu?: boolean }, boolean][] = [
        ['gemma4', { gpuLayers: 4 }, false],
        ['gemma4', { gpuLayers: 5 }, true],
        ['gemma4', { gpuLayers: -1 }, true],
        ['gemma4', { gpuLayers: -1, perLayerEmbeddingsOnGpu: false }, false],
        ['gemma4', { gpuLayers: 1, perLayerEmbeddingsOnGpu: true }, true],
        ['gemma3', { gpuLayers: -1 }, false],
      ];
      for (const [arch, options, expected] of cases) {
        const m = await LlamaModel.load(arch === 'gemma4' ? gemma4 : gemma3, options);
        try {
          assert.equal(m.info.perLayerEmbeddingsOnGpu, expected, `${arch} ${JSON.stringify(options)}`);
        } finally {
          await m.dispose();
        }
      }
    },
  );

  test('gemma3 is bidirectional and finds its image tokens by text', async () => {
    const m3 = await LlamaModel.load(gemma3);
    try {
      assert.equal(m3.info.arch, 'gemma3');
      assert.equal(m3.info.imageAttention, 'bidirectional');
      assert.equal(typeof m3.info.imageStartToken, 'number');
      assert.equal(typeof m3.info.imageEndToken, 'number');
      assert.notEqual(m3.info.imageStartToken, m3.info.imageEndToken);
    } finally {
      await m3.dispose();
    }
  });

  test('the image attention rule mirrors mtmd_decode_use_non_causal', () => {
    assert.equal(imageAttentionRule('gemma3', 2560), 'bidirectional');
    assert.equal(imageAttentionRule('gemma4', 1536), 'causal'); // E2B
    assert.equal(imageAttentionRule('gemma4', 2560), 'causal'); // E4B
    assert.equal(imageAttentionRule('gemma4', 5376), 'bidirectional-swa'); // 31B
    assert.equal(imageAttentionRule('gemma4', 64), 'bidirectional-swa');
    assert.throws(() => imageAttentionRule('gemma4', 0), /nEmbd/);
  });

  test('tokenize / detokenize round-trip, special tokens parsed by text', () => {
    const toks = model.tokenize('Hello world', { addSpecial: true });
    assert.deepEqual([...toks], [2, 9259, 1902]);
    assert.equal(model.detokenize(toks), 'Hello world');
    assert.equal(model.detokenize(toks, { special: true }), '<bos>Hello world');
    assert.deepEqual([...model.tokenize('<|image>')], [255999]);
    assert.equal(model.tokenize('<|image>', { parseSpecial: false }).length > 1, true);
    assert.equal(model.tokenText(258882), '<image|>');
  });

  test('the chat template renders system and user turns with the generation prompt', () => {
    const text = model.renderChat([
      { role: 'system', content: 'SYS' },
      { role: 'user', content: 'hi' },
    ]);
    assert.match(text, /SYS/);
    assert.match(text, /hi/);
    assert.ok(text.indexOf('SYS') < text.indexOf('hi'));
    const segs = model.chatPrompt(
      [{ role: 'user', content: 'look <__percept_image__> now' }],
      [{ data: new Float32Array(3 * 64), nTokens: 3 }],
    );
    assert.equal(segs.length, 3);
    assert.ok('image' in segs[1]!);
    assert.throws(
      () => model.chatPrompt([{ role: 'user', content: 'no marker' }], [{ data: new Float32Array(64), nTokens: 1 }]),
      /1 image/,
    );
  });

  test('JSON Schema becomes GBNF', () => {
    const gbnf = jsonSchemaToGbnf({ type: 'object', properties: { a: { enum: ['x', 'y'] } }, required: ['a'] });
    assert.match(gbnf, /root ::=/);
    assert.throws(() => jsonSchemaToGbnf('{not json'), /not valid JSON/);
  });

  test('llama.cpp logs are quiet by default and can be forwarded', async () => {
    const lines: string[] = [];
    let gotLine!: () => void;
    const first = new Promise<void>((resolve) => (gotLine = resolve));
    setLlamaLogger((_level, text) => {
      lines.push(text);
      gotLine();
    });
    try {
      const v = await LlamaModel.load(gemma4, { vocabOnly: true });
      await v.dispose();
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([first, new Promise((_, reject) => (timer = setTimeout(() => reject(new Error('no log line forwarded')), 5000)))]);
      clearTimeout(timer);
      assert.ok(lines.join('').includes('llama_model_loader'), lines.slice(0, 3).join(''));
    } finally {
      setLlamaLogger(null);
    }
    assert.throws(() => setLlamaLogger(42 as never), /function or null/);
  });

  test('a vocab-only model tokenizes but refuses contexts', async () => {
    const v = await LlamaModel.load(gemma4, { vocabOnly: true });
    try {
      assert.equal(v.info.vocabOnly, true);
      assert.deepEqual([...v.tokenize('Hello world')], [9259, 1902]);
      await assert.rejects(v.createContext(), /vocabOnly/);
    } finally {
      await v.dispose();
    }
  });

  describe('errors, each followed by a working call', () => {
    const stillWorks = async () => {
      const ctx = await model.createContext({ nCtx: 64 });
      const r = await ctx.generate([{ tokens: [2, 9259] }], { maxTokens: 2, ignoreEos: true });
      assert.equal(r.tokens.length, 2);
      await ctx.dispose();
    };

    test('missing file', async () => {
      await assert.rejects(LlamaModel.load(join(SCRATCH, 'nope.gguf')), (e: Error & { code?: string }) => {
        assert.equal(e.code, 'ENOENT');
        assert.match(e.message, /not found/);
        return true;
      });
      await stillWorks();
    });

    test('not a GGUF (bad magic)', async () => {
      const p = join(SCRATCH, 'garbage.gguf');
      await writeFile(p, Buffer.from('this is not a gguf file at all, just text'));
      await assert.rejects(LlamaModel.load(p), /not a valid GGUF/);
      await stillWorks();
    });

    test('truncated GGUF (half the file)', async () => {
      const p = join(SCRATCH, 'truncated.gguf');
      const fh = await open(gemma4, 'r');
      const size = (await fh.stat()).size;
      const half = Buffer.alloc(Math.floor(size / 2));
      await fh.read(half, 0, half.length, 0);
      await fh.close();
      await writeFile(p, half);
      await assert.rejects(LlamaModel.load(p), (e: Error & { code?: string }) => {
        assert.equal(e.code, 'EMODEL');
        assert.match(e.message, /failed to load model|not a valid GGUF/);
        return true;
      });
      await stillWorks();
    });

    test('unsupported architecture', async () => {
      const p = join(SCRATCH, 'llama-arch.gguf');
      await writeFile(p, headerOnlyGguf('llama'));
      await assert.rejects(LlamaModel.load(p), /unsupported architecture 'llama'/);
      await stillWorks();
    });

    test('bad arguments are TypeErrors before crossing into C++', async () => {
      await assert.rejects(LlamaModel.load(''), TypeError);
      await assert.rejects(LlamaModel.load(gemma4, { gpuLayers: 1.5 }), /gpuLayers/);
      await assert.rejects(
        LlamaModel.load(gemma4, { bogus: 1 } as never),
        /Expected undefined \(options takes only gpuLayers, mmap, vocabOnly and perLayerEmbeddingsOnGpu\) for options.bogus/,
      );
      assert.throws(() => model.detokenize([1, 999_999_999]), /a token id of this model/);
      assert.throws(() => model.tokenText(-1), /token/);
      await assert.rejects(model.createContext({ nCtx: 8 }), /nCtx/);
      await stillWorks();
    });

    test('use after dispose', async () => {
      const m = await LlamaModel.load(gemma4, { vocabOnly: true });
      await m.dispose();
      await m.dispose(); // idempotent
      assert.throws(
        () => m.tokenize('x'),
        (e: Error & { code?: string }) => e.code === 'EDISPOSED',
      );
      const ctx = await model.createContext({ nCtx: 64 });
      await ctx.dispose();
      await assert.rejects(ctx.generate([{ text: 'x' }], { maxTokens: 1 }), (e: Error & { code?: string }) => e.code === 'EDISPOSED');
      await stillWorks();
    });
  });

  test('the fixture bytes are a real GGUF (sanity for the error tests above)', async () => {
    const head = (await readFile(gemma4)).subarray(0, 4).toString('latin1');
    assert.equal(head, 'GGUF');
  });
});
