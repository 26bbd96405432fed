import assert from 'node:assert/strict';
import { mkdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';
import sharp from 'sharp';
import { GGUFWriter, bool, readGGUF, readTensorData, str, u32, i32, f32, arr } from '../../models/gguf.ts';
import { LlamaVision, type VisionEncodeResult, type VisionImage } from '../../native/vision.ts';
import { createOnnxEncoderStage, type OnnxEncoderStage } from '../../nodes/encoder-onnx.ts';
import { clipImageOf, createMtmdEncoderStage, type MtmdEncoderStage } from '../../nodes/encoder-mtmd.ts';
import { createPreprocessStage } from '../../nodes/preprocess.ts';
import { tokenCosines, type ImageEmbedding, type PixelTensor } from '../../nodes/payloads.ts';
import type { StageContext, StageEvent } from '../../pipeline/types.ts';
import { listMmprojPresets, mmprojTensorPlan, patchLinearToConv, synthesizeMmproj, transpose2d } from '../../models/mmproj-synth.ts';
import { isMmprojSpec, resolveModel } from '../../models/resolve.ts';
import { synthesizeVision, visionPreset, visionWeights } from '../../models/vision-synth.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';
import { PREPROCESS_DEFAULTS } from '../support/fixtures.ts';

const dir = join(import.meta.dirname, '../..', '.cache', 'test-encoder-mtmd');
rmSync(dir, { recursive: true, force: true });
mkdirSync(dir, { recursive: true });
const siglipOnnx = join(dir, 'siglip-tiny.onnx');
const siglipGguf = join(dir, 'siglip-tiny.mmproj.gguf');
const gemma4Onnx = join(dir, 'gemma4-vision-tiny.onnx');
const gemma4Gguf = join(dir, 'gemma4-vision-tiny.mmproj.gguf');
const SIGLIP_SEED = 1;
const GEMMA4_SEED = 2;

function ctx(opts: { imageTokens?: number; signal?: AbortSignal; events?: StageEvent[] } = {}): StageContext {
  return standaloneContext({
    frame: { frameId: 1, sourceId: 'test' },
    knobs: { imageTokens: opts.imageTokens ?? 280, maxNewTokens: 8 },
    signal: opts.signal,
    report: (e) => opts.events?.push(e),
  });
}

async function cameraJpeg(w = 640, h = 360): Promise<Buffer> {
  const raw = Buffer.alloc(w * h * 3);
  for (let i = 0; i < raw.length; i++) raw[i] = (i * 7 + (i >> 9) + ((i / (w * 3)) | 0)) & 255;
  return sharp(raw, { raw: { width: w, height: h, channels: 3 } })
    .jpeg()
    .toBuffer();
}

async function preprocessed(contract: 'gemma3' | 'gemma4', imageTokens = 280, w = 640, h = 360): Promise<PixelTensor> {
  return createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract }).process(
    { encoding: 'jpeg', data: await cameraJpeg(w, h) },
    ctx({ imageTokens }),
  );
}

/** A deep copy, so the same pixels can go to two encoders that each take ownership. */
function clonePixels(t: PixelTensor): PixelTensor {
  return { ...t, pixelValues: t.pixelValues.slice(), ...(t.positionIds ? { positionIds: t.positionIds.slice() } : {}) };
}

function cosinePerToken(a: ImageEmbedding, b: ImageEmbedding): number[] {
  assert.equal(a.nTokens, b.nTokens);
  assert.equal(a.nEmbd, b.nEmbd);
  return tokenCosines(a, b);
}

before(async () => {
  synthesizeVision({ preset: 'siglip-tiny', out: siglipOnnx, seed: SIGLIP_SEED });
  synthesizeVision({ preset: 'gemma4-vision-tiny', out: gemma4Onnx, seed: GEMMA4_SEED });
  await synthesizeMmproj({ preset: 'siglip-tiny', out: siglipGguf, seed: SIGLIP_SEED });
  await synthesizeMmproj({ preset: 'gemma4-vision-tiny-mmproj', out: gemma4Gguf, seed: GEMMA4_SEED });
});

describe('mmproj synthesis', () => {
  test('writes the keys and tensor shapes clip reads, with exact wire types', async () => {
    const f = await readGGUF(siglipGguf);
    assert.equal(f.get('general.architecture'), 'clip');
    assert.equal(f.get('clip.vision.projection_dim'), 64);
    assert.equal(f.get('clip.use_gelu'), true);
    const types = Object.fromEntries(f.kvs.map((x) => [x.key, x.type]));
    assert.equal(types['clip.vision.block_count'], 'u32');
    assert.equal(types['clip.vision.attention.layer_norm_epsilon'], 'f32');
    assert.equal(types['clip.has_vision_encoder'], 'bool');
    assert.equal(types['clip.projector_type'], 'string');
    assert.equal(f.tensors.length, mmprojTensorPlan('siglip-tiny').length);
    const shape = (n: string) => f.tensor(n)?.shape.map(Number);
    assert.deepEqual(shape('v.patch_embd.weight'), [14, 14, 3, 32]);
    assert.deepEqual(shape('v.position_embd.weight'), [32, 4096]);
    assert.deepEqual(shape('v.blk.1.ffn_down.weight'), [64, 32]);
    assert.deepEqual(shape('mm.input_projection.weight'), [64, 32]);
    const g4 = await readGGUF(gemma4Gguf);
    const shape4 = (n: string) => g4.tensor(n)?.shape.map(Number);
    assert.deepEqual(shape4('v.position_embd.weight'), [32, 10240, 2]);
    assert.deepEqual(shape4('v.blk.0.attn_q_norm.weight'), [16]);
    assert.deepEqual(shape4('mm.input_projection.weight'), [32, 64]);
    assert.equal(g4.kv('clip.vision.projector_type')?.type, 'string');
    assert.equal(g4.get('clip.vision.projector_type'), 'gemma4v');
  });

  test('tensor bytes are the ONNX weights, transposed/permuted where ggml wants another layout', async () => {
    const w = visionWeights(visionPreset('siglip-tiny').spec, SIGLIP_SEED);
    const f = await readGGUF(siglipGguf);
    const read = async (name: string) => {
      const b = await readTensorData(siglipGguf, f, name);
      return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
    };
    assert.deepEqual(await read('v.blk.0.attn_q.weight'), transpose2d(w.get('layers.0.attn.q.weight')!, 32, 32));
    assert.deepEqual(await read('mm.input_projection.weight'), w.get('mm.input_projection.weight'));
    assert.deepEqual(await read('v.patch_embd.weight'), w.get('patch_embed.weight'));
    const w4 = visionWeights(visionPreset('gemma4-vision-tiny').spec, GEMMA4_SEED);
    const g4 = await readGGUF(gemma4Gguf);
    const b = await readTensorData(gemma4Gguf, g4, 'v.patch_embd.weight');
    assert.deepEqual(
      new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)),
      patchLinearToConv(w4.get('patch_embed.input_proj.weight')!, 16, 32),
    );
  });

  test('layout helpers: transpose and patch-linear → conv kernel', () => {
    assert.deepEqual(transpose2d(Float32Array.of(1, 2, 3, 4, 5, 6), 2, 3), Float32Array.of(1, 4, 2, 5, 3, 6));
    // patch 1 (one pixel, 3 channels), hidden 2: W[c][o] → kernel [o][c]
    assert.deepEqual(patchLinearToConv(Float32Array.of(1, 2, 3, 4, 5, 6), 1, 2), Float32Array.of(1, 3, 5, 2, 4, 6));
    assert.throws(() => transpose2d(new Float32Array(5), 2, 3), /5 values is not 2×3/);
  });

  test('f16 halves the matrices; presets and specifiers are discoverable', async () => {
    const f16 = join(dir, 'siglip-tiny-f16.mmproj.gguf');
    const r = await synthesizeMmproj({ preset: 'siglip-tiny', out: f16, seed: SIGLIP_SEED, dtype: 'f16' });
    assert.equal(r.dtype, 'f16');
    assert.ok(statSync(f16).size < statSync(siglipGguf).size, 'f16 file is not smaller');
    assert.ok(listMmprojPresets().some((p) => p.name === 'gemma4-vision-e2b-mmproj' && p.projectorType === 'gemma4v'));
    assert.equal(isMmprojSpec('synth:siglip-tiny-mmproj@3'), true);
    assert.equal(isMmprojSpec('synth:siglip-tiny'), false);
    assert.equal(isMmprojSpec('x.mmproj.gguf'), true);
    const cached = await resolveModel('synth:siglip-tiny-mmproj@1', 'mmproj', { cacheDir: dir });
    assert.equal(statSync(cached).size, statSync(siglipGguf).size);
    await assert.rejects(synthesizeMmproj({ preset: 'nope', out: join(dir, 'x.gguf') }), /unknown mmproj preset 'nope'/);
    await assert.rejects(
      resolveModel('synth:siglip-tiny-mmproj?dtype=q4', 'mmproj', { cacheDir: dir }),
      /dtype must be one of f32, f16, got 'q4'/,
    );
  });
});

describe('LlamaVision (native clip)', () => {
  test('loads an mmproj and reports what clip read', async () => {
    const v = await LlamaVision.load(siglipGguf, { threads: 1 });
    try {
      assert.equal(v.info.projector, 'gemma3');
      assert.equal(v.nEmbd, 64);
      assert.deepEqual([v.info.hidden, v.info.layers, v.info.patchSize, v.info.imageSize, v.info.merge], [32, 2, 14, 896, 4]);
      assert.ok(v.info.devices.some((d) => d.name === 'CPU' && d.bytes > 0));
    } finally {
      v.dispose();
    }
    v.dispose(); // idempotent
    await assert.rejects(
      v.encode(new Float32Array(3 * 896 * 896), { layout: 'chw', width: 896, height: 896 }),
      (e: Error & { code?: string }) => e.code === 'EDISPOSED',
    );
  });

  test('refuses files that are not a gemma mmproj with a reason, instead of aborting in clip', async () => {
    await assert.rejects(LlamaVision.load(join(dir, 'missing.gguf')), (e: Error & { code?: string }) => e.code === 'ENOENT');
    const text = join(dir, 'not-a-gguf.gguf');
    writeFileSync(text, 'hello, not a gguf at all');
    await assert.rejects(LlamaVision.load(text), /not a valid GGUF file/);
    await assert.rejects(LlamaVision.load(siglipOnnx), /not a valid GGUF file/);
    const decoder = join(dir, 'decoder.gguf');
    await new GGUFWriter().set('general.architecture', str('gemma4')).write(decoder, () => []);
    await assert.rejects(LlamaVision.load(decoder), /general\.architecture is 'gemma4', not 'clip'/);
    // A wrong key type would trip a GGML_ASSERT inside clip (process abort); we refuse it first.
    const wrongType = join(dir, 'wrong-type.gguf');
    await new GGUFWriter()
      .set('general.architecture', str('clip'))
      .set('clip.has_vision_encoder', bool(true))
      .set('clip.projector_type', str('gemma3'))
      .set('clip.vision.embedding_length', u32(32))
      .set('clip.vision.feed_forward_length', u32(64))
      .set('clip.vision.block_count', i32(2))
      .write(wrongType, () => []);
    await assert.rejects(LlamaVision.load(wrongType), /key 'clip\.vision\.block_count' is i32, expected u32/);
    const otherProjector = join(dir, 'llava.gguf');
    await new GGUFWriter()
      .set('general.architecture', str('clip'))
      .set('clip.has_vision_encoder', bool(true))
      .set('clip.projector_type', str('mlp'))
      .set('clip.vision.attention.layer_norm_epsilon', f32(1e-6))
      .set('clip.vision.image_mean', arr('f32', [0.5, 0.5, 0.5]))
      .write(otherProjector, () => []);
    await assert.rejects(LlamaVision.load(otherProjector), /projector type 'mlp' is not supported/);
  });

  test('refuses images clip cannot encode, with the reason', async () => {
    const v = await LlamaVision.load(siglipGguf, { threads: 1 });
    try {
      await assert.rejects(v.encode(new Float32Array(3 * 448 * 448), { layout: 'chw', width: 448, height: 448 }), /must be 896x896/);
      await assert.rejects(
        v.encode(new Float32Array(10), { layout: 'chw', width: 896, height: 896 }),
        /pixels has 10 values, expected 2408448/,
      );
      await assert.rejects(v.encode(new Float32Array(10), { layout: 'rgb' as never, width: 896, height: 896 }), /image\.layout/);
    } finally {
      v.dispose();
    }
  });

  test('one encode at a time (EBUSY), and no dispose during it', async () => {
    const v = await LlamaVision.load(siglipGguf, { threads: 1 });
    const px = new Float32Array(3 * 896 * 896).fill(0.25);
    const first = v.encode(px, { layout: 'chw', width: 896, height: 896 });
    await assert.rejects(v.encode(px, { layout: 'chw', width: 896, height: 896 }), (e: Error & { code?: string }) => e.code === 'EBUSY');
    assert.throws(
      () => v.dispose(),
      (e: Error & { code?: string }) => e.code === 'EBUSY',
    );
    const r = await first;
    assert.deepEqual([r.nTokens, r.nEmbd, r.data.length], [256, 64, 256 * 64]);
    v.dispose();
  });
});

describe('LlamaVision: batches, reused buffers, what clip reports, profiling', () => {
  /** A patch-layout image for the gemma4 tiny mmproj: w×h pixels as 16×16 patches (seeded values). */
  function patches(w: number, h: number, seed: number): Float32Array {
    const a = new Float32Array(w * h * 3);
    for (let i = 0; i < a.length; i++) a[i] = (Math.sin(seed * 12.9898 + i * 0.731) + 1) / 2;
    return a;
  }
  const grid = { layout: 'patches', width: 96, height: 144 } as const;

  test("encodeBatch equals one encode per image (percept's graph and clip's gemma4v: one graph; clip's gemma3: one after the other)", async () => {
    const v4 = await LlamaVision.load(gemma4Gguf, { threads: 1 });
    const v3 = await LlamaVision.load(siglipGguf, { threads: 1, graph: 'clip' });
    const v3p = await LlamaVision.load(siglipGguf, { threads: 1 });
    try {
      assert.equal(v4.info.batchable, true);
      assert.equal(v3.info.batchable, false);
      assert.equal(v3p.info.batchable, true);
      const images = [patches(96, 144, 1), patches(96, 144, 2), patches(96, 144, 3)];
      const singles: VisionEncodeResult[] = [];
      for (const px of images) singles.push(await v4.encode(px, grid));
      const batch = await v4.encodeBatch(images, grid);
      assert.equal(batch.batched, true);
      assert.equal(batch.data.length, 3);
      batch.data.forEach((data, i) => {
        const worst = Math.min(
          ...cosinePerToken(
            { data, nTokens: batch.nTokens, nEmbd: batch.nEmbd },
            { data: singles[i]!.data, nTokens: singles[i]!.nTokens, nEmbd: singles[i]!.nEmbd },
          ),
        );
        assert.ok(worst >= 0.99999, `image ${i}: worst per-token cosine ${worst} between batch and single`);
      });
      // distinct images give distinct embeddings: the batch is not one image repeated
      assert.notDeepEqual(batch.data[0], batch.data[1]);
      const chw = [new Float32Array(3 * 896 * 896).fill(0.1), new Float32Array(3 * 896 * 896).fill(-0.3)];
      const loop = await v3.encodeBatch(chw, { layout: 'chw', width: 896, height: 896 });
      assert.equal(loop.batched, false);
      for (let i = 0; i < 2; i++)
        assert.deepEqual(loop.data[i], (await v3.encode(chw[i]!, { layout: 'chw', width: 896, height: 896 })).data);
      const one = await v3p.encodeBatch(chw, { layout: 'chw', width: 896, height: 896 });
      assert.equal(one.batched, true);
      for (let i = 0; i < 2; i++) {
        const single = await v3p.encode(chw[i]!, { layout: 'chw', width: 896, height: 896 });
        const worst = Math.min(
          ...cosinePerToken({ data: one.data[i]!, nTokens: 256, nEmbd: 64 }, { data: single.data, nTokens: 256, nEmbd: 64 }),
        );
        assert.ok(worst >= 0.99999, `gemma3 image ${i}: worst per-token cosine ${worst} between batch and single`);
      }
      await assert.rejects(
        v4.encodeBatch([patches(96, 144, 1), new Float32Array(10)], grid),
        /images\[1\] has 10 values, need at least 41472/,
      );
      await assert.rejects(v4.encodeBatch([], grid), /non-empty array/);
    } finally {
      v4.dispose();
      v3.dispose();
      v3p.dispose();
    }
  });

  test('buffers reused from call to call carry nothing over: A, B, A again gives A', async () => {
    const v = await LlamaVision.load(gemma4Gguf, { threads: 1 });
    try {
      const a = await v.encode(patches(96, 144, 7), grid);
      const b = await v.encode(patches(144, 96, 8), { ...grid, width: 144, height: 96 });
      const again = await v.encode(patches(96, 144, 7), grid);
      assert.notDeepEqual(a.data, b.data);
      assert.deepEqual(again.data, a.data);
      assert.equal(a.data.byteLength, a.nTokens * a.nEmbd * 4);
    } finally {
      v.dispose();
    }
  });

  for (const graph of ['percept', 'clip'] as const) {
    test(`info says what ${graph}'s graph resolved at load: flash attention, one graph split on the CPU, its compute buffer`, async () => {
      const on = await LlamaVision.load(gemma4Gguf, { threads: 1, graph });
      const off = await LlamaVision.load(gemma4Gguf, { threads: 1, flashAttention: 'off', graph });
      try {
        assert.deepEqual([on.info.graph, on.info.graphFallback, off.info.graph], [graph, null, graph]);
        assert.equal(on.info.flashAttention, true);
        assert.equal(off.info.flashAttention, false);
        assert.equal(on.info.graphSplits, 1);
        assert.ok(on.info.graphNodes > 50, `graph nodes ${on.info.graphNodes}`);
        assert.deepEqual(on.info.unsupportedOps, []);
        assert.equal(on.info.computeBuffers[0]?.name, 'CPU');
        // without flash attention the attention matrix is materialized: a larger compute buffer
        assert.ok(off.info.computeBuffers[0]!.bytes > on.info.computeBuffers[0]!.bytes);
        assert.equal(on.info.profile, false);
        await assert.rejects(on.encode(patches(96, 144, 1), grid, 'phases'), /profiling needs Vision\.load\(path, \{ profile: true \}\)/);
      } finally {
        on.dispose();
        off.dispose();
      }
    });
  }

  for (const graph of ['percept', 'clip'] as const) {
    test(`profile (${graph}'s graph): 'phases' splits the encode into setup and compute, 'ops' counts every node; results unchanged`, async () => {
      const plain = await LlamaVision.load(gemma4Gguf, { threads: 1, graph });
      const v = await LlamaVision.load(gemma4Gguf, { threads: 1, profile: true, graph });
      try {
        const px = patches(96, 144, 5);
        const reference = await plain.encode(px, grid);
        const phases = await v.encode(px, grid, 'phases');
        assert.ok(phases.profile, 'no profile in the result');
        assert.ok(phases.profile.setupMs > 0 && phases.profile.computeMs > 0);
        // Both phases are timed inside the encode: their sum may pass it by rounding only.
        assert.ok(phases.profile.setupMs + phases.profile.computeMs <= phases.encodeMs * 1.01, 'phases exceed the encode');
        assert.equal(phases.profile.ops, undefined);
        const ops = await v.encode(px, grid, 'ops');
        const list = ops.profile!.ops!;
        const names = list.map((o) => o.op);
        for (const op of ['MUL_MAT', 'FLASH_ATTN_EXT', 'RMS_NORM', 'POOL_2D'])
          assert.ok(names.includes(op), `no ${op} in ${names.join(', ')}`);
        // Every node counted once, all on the CPU here; clip's callback leaves out the first (it ends
        // the setup phase), percept's graph computes node by node.
        assert.equal(
          list.reduce((n, o) => n + o.count, 0),
          v.info.graphNodes - (graph === 'clip' ? 1 : 0),
        );
        assert.ok(list.every((o) => o.onHost === o.count));
        const off = await v.encode(px, grid);
        assert.equal(off.profile, undefined);
        for (const r of [phases, ops, off]) assert.deepEqual(r.data, reference.data);
        for (const r of [phases, ops, off]) assert.equal(r.path, graph);
      } finally {
        plain.dispose();
        v.dispose();
      }
    });
  }
});

describe("percept's persistent graph over clip's weights", () => {
  function pixels(n: number, seed: number, lo: number): Float32Array {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = lo + ((1 - lo) * (Math.sin(seed * 78.233 + i * 0.917) + 1)) / 2;
    return a;
  }

  for (const flashAttention of ['on', 'off'] as const) {
    test(`the same embeddings as clip's own graph on the same weights (gemma3 bit for bit), flash attention ${flashAttention}`, async () => {
      const cases = [
        {
          file: gemma4Gguf,
          lo: 0,
          sizes: [
            [96, 144],
            [144, 96],
            [48, 48],
            [240, 96],
            [480, 288],
          ],
        },
        { file: siglipGguf, lo: -1, sizes: [[896, 896]] },
      ];
      // Without flash attention gemma3's 4096-patch attention is slow on the CPU: one layout there.
      const layouts = (file: string) =>
        flashAttention === 'off' && file === siglipGguf ? (['chw'] as const) : (['chw', 'patches'] as const);
      for (const { file, lo, sizes } of cases) {
        const ours = await LlamaVision.load(file, { threads: 1, flashAttention });
        const clip = await LlamaVision.load(file, { threads: 1, flashAttention, graph: 'clip' });
        try {
          assert.deepEqual([ours.info.graph, clip.info.graph, ours.info.flashAttention], ['percept', 'clip', flashAttention === 'on']);
          for (const [width, height] of sizes) {
            for (const layout of layouts(file)) {
              const px = pixels(width! * height! * 3, width! + height!, lo);
              const got = await ours.encode(px, { layout, width: width!, height: height! });
              const want = await clip.encode(px, { layout, width: width!, height: height! });
              assert.deepEqual([got.path, want.path, got.nTokens, got.nEmbd], ['percept', 'clip', want.nTokens, want.nEmbd]);
              const worst = Math.min(...cosinePerToken(got, want));
              assert.ok(worst >= 0.9999, `${ours.info.projector} ${width}×${height} ${layout}: worst per-token cosine ${worst}`);
              if (ours.info.projector === 'gemma3') {
                // The same ops with the same roundings in the same order: the same bits. A random tower
                // amplifies the smallest difference (an input moved by f16 rounding moves the E4B-shaped
                // tower's output to a cosine of 0.988), so only this makes the check hold at real shapes.
                assert.deepEqual(got.data, want.data, `${ours.info.projector} ${width}×${height} ${layout}: not bit for bit clip's`);
              } else {
                // gemma4v's q and k come with each head's dimensions reordered for one rope op (see
                // RopeOrderedHeads): the per-head norms sum in another order, so the last bits may
                // differ, and where K rounds to f16 for flash attention a bit more (`bench encode
                // --check` measures the E4B tower on a GPU).
                let diff = 0;
                let scale = 0;
                for (let j = 0; j < want.data.length; j++) {
                  diff = Math.max(diff, Math.abs(got.data[j]! - want.data[j]!));
                  scale = Math.max(scale, Math.abs(want.data[j]!));
                }
                assert.ok(worst >= 0.999999, `${width}×${height} ${layout}: worst per-token cosine ${worst}`);
                assert.ok(diff <= 1e-3 * scale, `${width}×${height} ${layout}: max abs diff ${diff} of values up to ${scale}`);
              }
            }
          }
        } finally {
          ours.dispose();
          clip.dispose();
        }
      }
    });
  }

  test('flash attention with heads zero-padded to a tensor-core size (72 → 80, 40 → 64) gives the unpadded embeddings', async () => {
    const cases = [
      { preset: 'siglip-tiny-h72', head: 72, padded: 80, lo: -1, image: { layout: 'chw', width: 224, height: 224 } },
      { preset: 'gemma4-vision-tiny-h40', head: 40, padded: 64, lo: 0, image: { layout: 'patches', width: 96, height: 144 } },
    ] as const;
    for (const { preset, head, padded, lo, image } of cases) {
      const file = join(dir, `${preset}.mmproj.gguf`);
      await synthesizeMmproj({ preset, out: file, seed: 3 });
      const plain = await LlamaVision.load(file, { threads: 1, flashAttention: 'on' });
      const pad = await LlamaVision.load(file, { threads: 1, flashAttention: 'padded' });
      const auto = await LlamaVision.load(file, { threads: 1 });
      const clip = await LlamaVision.load(file, { threads: 1, flashAttention: 'padded', graph: 'clip' });
      try {
        assert.deepEqual(
          [plain.info.flashAttentionHead, pad.info.flashAttentionHead, auto.info.flashAttentionHead, clip.info.flashAttentionHead],
          [head, padded, head, head],
          `${preset}: on, padded, auto (the CPU has no tensor-core kernel to pad for), clip (it cannot pad)`,
        );
        if (preset === 'siglip-tiny-h72') {
          // No per-head norm or RoPE: the q/k/v/o weights are padded once at load (every head 72 → 80
          // columns each for q, k, v, their biases and o's inputs), so the graph is the plain one.
          assert.equal(pad.info.graphNodes, plain.info.graphNodes, `${preset}: padded graph nodes`);
          const { hidden, heads, layers } = plain.info;
          const bytesPerValue = 4; // the tiny presets are f32
          const perLayer = (3 * (hidden * heads * padded) + 3 * heads * padded + heads * padded * hidden) * bytesPerValue;
          const added = pad.info.copiedWeightBytes - plain.info.copiedWeightBytes;
          // (plain: the transposed input projection alone; alignment adds a little per tensor)
          assert.ok(added >= layers * perLayer && added < layers * perLayer * 1.05, `${preset}: padded weights ${added} B`);
        } else {
          // gemma4v normalizes and rotates each head's real columns: per layer three pads in the
          // graph, and a view of the kept columns made contiguous where a reshape was.
          assert.equal(pad.info.graphNodes, plain.info.graphNodes + 4 * plain.info.layers, `${preset}: padded graph nodes`);
          assert.equal(pad.info.copiedWeightBytes, plain.info.copiedWeightBytes, `${preset}: weights padded in the graph, not copied`);
        }
        // Two images in one graph: the kept columns of each image's heads.
        const images = [pixels(image.width * image.height * 3, 5, lo), pixels(image.width * image.height * 3, 9, lo)];
        const want = await plain.encodeBatch(images, image);
        const got = await pad.encodeBatch(images, image);
        assert.equal(got.batched, true);
        for (let i = 0; i < images.length; i++) {
          const a = { data: got.data[i]!, nTokens: got.nTokens, nEmbd: got.nEmbd };
          const b = { data: want.data[i]!, nTokens: want.nTokens, nEmbd: want.nEmbd };
          const worst = Math.min(...cosinePerToken(a, b));
          assert.ok(worst >= 0.9999, `${preset} image ${i}: worst per-token cosine ${worst}`);
          let diff = 0;
          let scale = 0;
          for (let j = 0; j < b.data.length; j++) {
            diff = Math.max(diff, Math.abs(a.data[j]! - b.data[j]!));
            scale = Math.max(scale, Math.abs(b.data[j]!));
          }
          // Zero columns change no product; only the f16 dot products' summation order may differ.
          assert.ok(diff <= 1e-3 * scale, `${preset} image ${i}: max abs diff ${diff} of values up to ${scale}`);
        }
      } finally {
        for (const v of [plain, pad, auto, clip]) v.dispose();
      }
    }
  });

  test('a shape is built and laid out once: later encodes only upload, compute and read back', async () => {
    const v = await LlamaVision.load(gemma4Gguf, { threads: 1, warmup: false });
    try {
      assert.deepEqual(v.info.computeBuffers, [], 'nothing laid out before the first encode without warm-up');
      const a: VisionImage = { layout: 'patches', width: 96, height: 144 };
      const b: VisionImage = { layout: 'patches', width: 144, height: 96 };
      const px = pixels(96 * 144 * 3, 1, 0);
      const phases = async (image: VisionImage) => (await v.encode(px, image)).phases!;
      const first = await phases(a);
      assert.ok(first.buildMs > 0 && first.allocMs > 0, 'the first encode of a shape builds and lays out its graph');
      const second = await phases(a);
      assert.deepEqual([second.buildMs, second.allocMs], [0, 0], 'the second encode of a shape rebuilt something');
      assert.ok(second.uploadMs > 0 && second.computeMs > 0 && second.readMs > 0);
      const other = await phases(b);
      assert.ok(other.buildMs > 0 && other.allocMs > 0);
      const back = await phases(a);
      assert.equal(back.buildMs, 0, 'a shape seen before is not built again');
      assert.ok(back.allocMs > 0, 'the compute buffer is laid out again for the shape that did not use it last');
    } finally {
      v.dispose();
    }
  });

  test('a tower with a part the graph does not build falls back to clip, visibly, and still encodes', async () => {
    const src = await readGGUF(gemma4Gguf);
    const withClassToken = join(dir, 'gemma4-class-token.mmproj.gguf');
    const g = new GGUFWriter();
    for (const kv of src.kvs) g.set(kv.key, kv.asValue());
    for (const t of src.tensors) g.addTensor({ name: t.name, type: t.type, shape: t.shape.map(Number) });
    g.addTensor({ name: 'v.class_embd', type: 0, shape: [32] }); // F32: clip loads it, its gemma4v graph ignores it
    await g.write(withClassToken, async function* (t) {
      yield t.name === 'v.class_embd' ? new Uint8Array(32 * 4) : await readTensorData(gemma4Gguf, src, t.name);
    });
    const fallback = await LlamaVision.load(withClassToken, { threads: 1 });
    const clip = await LlamaVision.load(gemma4Gguf, { threads: 1, graph: 'clip' });
    try {
      assert.equal(fallback.info.graph, 'clip');
      assert.match(fallback.info.graphFallback ?? '', /class token/);
      assert.equal(fallback.info.flashAttention, true, 'the fallback loads clip warmed up, as clip alone would');
      const px = pixels(96 * 144 * 3, 3, 0);
      const got = await fallback.encode(px, { layout: 'patches', width: 96, height: 144 });
      assert.equal(got.path, 'clip');
      assert.deepEqual(got.data, (await clip.encode(px, { layout: 'patches', width: 96, height: 144 })).data);
    } finally {
      fallback.dispose();
      clip.dispose();
    }
  });
});

describe('encoder-mtmd stage', () => {
  let onnx3: OnnxEncoderStage;
  let onnx4: OnnxEncoderStage;
  let mtmd3: MtmdEncoderStage;
  let mtmd4: MtmdEncoderStage;
  /** The same mmprojs through clip's own encode. */
  let clip3: MtmdEncoderStage;
  let clip4: MtmdEncoderStage;
  before(async () => {
    onnx3 = await createOnnxEncoderStage({ ep: 'cpu', model: siglipOnnx, threads: 1 });
    onnx4 = await createOnnxEncoderStage({ ep: 'cpu', model: gemma4Onnx, threads: 1 });
    mtmd3 = await createMtmdEncoderStage({ mmproj: siglipGguf, threads: 1, expectedHidden: 64 });
    mtmd4 = await createMtmdEncoderStage({ mmproj: gemma4Gguf, threads: 1, expectedHidden: 64 });
    clip3 = await createMtmdEncoderStage({ mmproj: siglipGguf, threads: 1, expectedHidden: 64, graph: 'clip' });
    clip4 = await createMtmdEncoderStage({ mmproj: gemma4Gguf, threads: 1, expectedHidden: 64, graph: 'clip' });
  });
  after(async () => {
    await Promise.all([onnx3.close(), onnx4.close(), mtmd3.close(), mtmd4.close(), clip3.close(), clip4.close()]);
  });

  test("percept's graph runs unless clip is asked for", () => {
    assert.deepEqual(
      [mtmd3, mtmd4, clip3, clip4].map((s) => s.info.graph),
      ['percept', 'percept', 'clip', 'clip'],
    );
  });

  test('pixel arrays: the CPU backend has no pinned host memory, so the preprocessor allocates its own', () => {
    for (const stage of [mtmd3, mtmd4, clip3, clip4]) assert.equal(stage.allocatePixels(16), undefined, stage.info.graph);
    assert.throws(() => mtmd3.allocatePixels(0), /length/);
  });

  test('contract from the mmproj', () => {
    assert.deepEqual([mtmd3.contract.kind, mtmd3.contract.hidden, mtmd3.contract.imageSize, mtmd3.name], ['gemma3', 64, 896, 'encode']);
    assert.deepEqual([mtmd4.contract.kind, mtmd4.contract.hidden, mtmd4.contract.patchDim, mtmd4.contract.merge], ['gemma4', 64, 768, 3]);
  });

  test('pixel_values go back to the preprocessor once clip has read them', async () => {
    const pre = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma3' });
    const frame = { encoding: 'jpeg' as const, data: await cameraJpeg() };
    const first = await pre.process(frame, ctx());
    await mtmd3.process(first, ctx());
    const second = await pre.process(frame, ctx());
    assert.equal(second.pixelValues, first.pixelValues, 'the array clip read is reused for the next frame');
    assert.equal(pre.allocatedArrays(), 1);
  });

  for (const graph of ['percept', 'clip'] as const) {
    const stage3 = (): MtmdEncoderStage => (graph === 'percept' ? mtmd3 : clip3);
    const stage4 = (): MtmdEncoderStage => (graph === 'percept' ? mtmd4 : clip4);
    test(`gemma3 (${graph}'s graph): same weights, two runtimes: per-token cosine ≥ 0.9999 against ONNX`, async () => {
      const px = await preprocessed('gemma3');
      const ref = await onnx3.process(clonePixels(px), ctx());
      const got = await stage3().process(px, ctx());
      assert.deepEqual([got.nTokens, got.nEmbd, got.data.length], [256, 64, 256 * 64]);
      const cos = cosinePerToken(got, ref);
      const worst = Math.min(...cos);
      console.log(`gemma3 (${graph}) worst per-token cosine ${worst.toFixed(7)}`);
      assert.ok(worst >= 0.9999, `worst per-token cosine ${worst}`);
    });

    for (const [budget, w, h] of [
      [280, 640, 360],
      [70, 300, 500],
    ] as const) {
      test(`gemma4 (${graph}'s graph): per-token cosine ≥ 0.9999 against ONNX (budget ${budget}, ${w}×${h})`, async () => {
        const px = await preprocessed('gemma4', budget, w, h);
        const ref = await onnx4.process(clonePixels(px), ctx({ imageTokens: budget }));
        const got = await stage4().process(px, ctx({ imageTokens: budget }));
        assert.equal(got.nTokens, px.imageTokens);
        const worst = Math.min(...cosinePerToken(got, ref));
        console.log(`gemma4 (${graph}) ${w}×${h} budget ${budget}: ${got.nTokens} tokens, worst per-token cosine ${worst.toFixed(7)}`);
        assert.ok(worst >= 0.9999, `worst per-token cosine ${worst}`);
      });
    }
  }

  test('encodeBatch: frames of one size in one call give what process() gives for each; other sizes are refused', async () => {
    const a = await preprocessed('gemma4', 280, 640, 360);
    const b = await preprocessed('gemma4', 280, 640, 360);
    b.pixelValues.reverse(); // another picture, same grid
    const singles = [await mtmd4.process(clonePixels(a), ctx()), await mtmd4.process(clonePixels(b), ctx())];
    const batch = await mtmd4.encodeBatch([a, b]);
    assert.equal(batch.length, 2);
    batch.forEach((emb, i) => assert.ok(Math.min(...cosinePerToken(emb, singles[i]!)) >= 0.99999, `frame ${i}`));
    const other = await preprocessed('gemma4', 70, 300, 500);
    await assert.rejects(
      mtmd4.encodeBatch([await preprocessed('gemma4', 280, 640, 360), other]),
      /a batch is one image size: input 1 is \d+×\d+, input 0 is 1056×576/,
    );
  });

  test("the decoder's n_embd must match the projector's output width", async () => {
    await assert.rejects(
      createMtmdEncoderStage({ mmproj: gemma4Gguf, threads: 1, expectedHidden: 1536 }),
      /output width is 64, but the decoder's n_embd is 1536/,
    );
    await assert.rejects(createMtmdEncoderStage({ mmproj: siglipOnnx }), /is an ONNX model/);
    await assert.rejects(createMtmdEncoderStage({ mmproj: join(dir, 'nope.gguf') }), /does not exist/);
  });

  test('tensors of the other contract or with a foreign position layout are refused', async () => {
    const g3 = await preprocessed('gemma3');
    const g4 = await preprocessed('gemma4', 70);
    await assert.rejects(mtmd4.process(g3, ctx()), /got a gemma3 tensor, the mmproj is gemma4/);
    await assert.rejects(mtmd3.process({ ...g3, pixelDims: [1, 3, 448, 1792] }, ctx()), /gemma3 pixelDims must be \[1,3,896,896\]/);
    const swapped = g4.positionIds!.slice();
    swapped[0] = 1n; // patch 0 claims column 1
    assert.throws(() => clipImageOf({ ...g4, positionIds: swapped }, mtmd4.contract), /patch 0 is at \(col 1, row 0\), expected \(0, 0\)/);
    const image = clipImageOf(g4, mtmd4.contract);
    assert.equal(image.layout, 'patches');
    assert.equal((image.width / 48) * (image.height / 48), g4.imageTokens);
  });

  test('the event loop stays idle during an encode (clip runs on a worker thread)', async () => {
    const px = await preprocessed('gemma3');
    const h = monitorEventLoopDelay({ resolution: 5 });
    h.enable();
    const elu0 = performance.eventLoopUtilization();
    await mtmd3.process(px, ctx());
    const elu = performance.eventLoopUtilization(elu0);
    h.disable();
    console.log(
      `mtmd encode ${(elu.idle + elu.active).toFixed(0)} ms; event loop busy ${(100 * elu.utilization).toFixed(1)} %, delay max ${(h.max / 1e6).toFixed(1)} ms`,
    );
    // The share of the encode's time the loop spent running: about 1 if clip ran on this thread,
    // however fast or loaded the machine; near 0 when it runs on an AsyncWorker.
    assert.ok(
      elu.utilization < 0.5,
      `the event loop was busy ${(100 * elu.utilization).toFixed(1)} % of the encode (${elu.active.toFixed(1)} of ${(elu.active + elu.idle).toFixed(1)} ms)`,
    );
  });

  test('ctx.signal aborts the wait; the late result is discarded and counted; the next frame works', async () => {
    const events: StageEvent[] = [];
    const before0 = mtmd3.stats();
    const aborted = AbortSignal.abort();
    await assert.rejects(
      mtmd3.process(await preprocessed('gemma3'), ctx({ signal: aborted, events })),
      (e: unknown) => e === aborted.reason,
    );
    assert.equal(mtmd3.stats().runs, before0.runs);
    // process() starts the native encode before it returns its promise; the abort comes after.
    const controller = new AbortController();
    const pending = mtmd3.process(await preprocessed('gemma3'), ctx({ signal: controller.signal, events }));
    controller.abort();
    await assert.rejects(pending, (e: unknown) => e === controller.signal.reason);
    assert.equal(mtmd3.stats().runs, before0.runs, 'gave up without waiting for the run');
    assert.deepEqual(events, [], 'the stage reports nothing itself: the runtime classifies the abort');
    const next = await mtmd3.process(await preprocessed('gemma3'), ctx());
    assert.equal(next.nTokens, 256);
    const s = mtmd3.stats();
    assert.equal(s.runs, before0.runs + 2);
    assert.equal(s.discarded, before0.discarded + 1);
  });
});
