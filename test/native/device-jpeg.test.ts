// JPEG frames decoded, resized and laid out on the encoder's GPU (nvJPEG, native/src/device-jpeg.cu):
// what the preprocess stage hands over, how every stage that cannot take such a frame refuses it, and,
// where this build has the GPU path (a CUDA build with nvJPEG, on a GPU), that its pixels are PIL's
// resampling of the decoded frame in every EXIF orientation and its embeddings the host path's.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import sharp, { type JpegOptions } from 'sharp';
import { resolveModel } from '../../models/resolve.ts';
import { LlamaVision } from '../../native/vision.ts';
import { createMtmdEncoderStage, type MtmdEncoderStage } from '../../nodes/encoder-mtmd.ts';
import { createOnnxEncoderStage } from '../../nodes/encoder-onnx.ts';
import { createProjectionEncoderStage } from '../../nodes/encoder-projection.ts';
import { createPreprocessStage } from '../../nodes/preprocess.ts';
import { tokenCosines, type CameraFrame, type ImageEmbedding, type PixelTensor } from '../../nodes/payloads.ts';
import { createPreprocessFor, type CreatedEncoder } from '../../app/run/stages.ts';
import { loadConfig } from '../../pipeline/config.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';
import type { StageContext } from '../../pipeline/types.ts';
import { MODEL_CACHE, PREPROCESS_DEFAULTS } from '../support/fixtures.ts';

const ctx = (imageTokens = 280): StageContext =>
  standaloneContext({ frame: { frameId: 1, sourceId: 'test' }, knobs: { imageTokens, maxNewTokens: 8 } });

/** Gradients, a checkerboard, noise and an off-centre bright block: asymmetric in both axes, so any
 * wrong flip or rotation shows. */
function scene(width: number, height: number, noise = 24): Buffer {
  const raw = Buffer.alloc(width * height * 3);
  let s = 99;
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      s = (Math.imul(s, 1103515245) + 12345) >>> 0;
      const n = (s >>> 24) % noise;
      const i = (y * width + x) * 3;
      const block = x > width * 0.6 && x < width * 0.8 && y < height * 0.3 ? 90 : 0;
      raw[i] = Math.min(255, ((x * 200) / width + n + block) | 0);
      raw[i + 1] = Math.min(255, ((y * 200) / height + n) | 0);
      raw[i + 2] = (((x >> 4) ^ (y >> 4)) & 1) * 150 + n;
    }
  }
  return raw;
}

const jpegOf = (raw: Buffer, width: number, height: number, options: JpegOptions = {}, orientation = 1): Promise<Buffer> =>
  sharp(raw, { raw: { width, height, channels: 3 } })
    .jpeg({ quality: 90, ...options })
    .withMetadata({ orientation })
    .toBuffer();

describe('preprocess: JPEG frames left to the encoder (jpegToEncoder)', () => {
  test('the tensor the host path would make, planned: same dims, positions and tokens, the frame and how to lay it out', async () => {
    const data = await jpegOf(scene(1280, 720), 1280, 720, {}, 6);
    for (const contract of ['gemma4', 'gemma3'] as const) {
      const host = await createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract }).process({ encoding: 'jpeg', data }, ctx());
      const stage = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract, jpegToEncoder: true });
      const t = await stage.process({ encoding: 'jpeg', data }, ctx());
      assert.equal(t.pixelValues.length, 0, contract);
      assert.deepEqual(t.pixelDims, host.pixelDims, contract);
      assert.deepEqual(t.positionIds, host.positionIds, contract);
      assert.equal(t.imageTokens, host.imageTokens, contract);
      assert.equal(t.jpeg?.data, data);
      const target = contract === 'gemma4' ? { width: 576, height: 1056 } : { width: 896, height: 896 };
      assert.deepEqual(
        { ...t.jpeg, data: undefined },
        {
          data: undefined,
          storedWidth: 1280,
          storedHeight: 720,
          orientation: 6,
          ...target,
          ...(contract === 'gemma4' ? { kernel: 'cubic', scale: 1, offset: 0 } : { kernel: 'linear', scale: 0.5, offset: 0.5 }),
        },
      );
      assert.equal(stage.jpegsToEncoder(), 1);
      assert.equal(stage.allocatedArrays(), 0, 'no pixel array for a frame the encoder decodes');
    }
  });

  test('what the GPU path does not take stays on the host: PNG, raw frames, CMYK and progressive JPEG, other kernels, the option off', async () => {
    const raw = scene(320, 180);
    const frames: [string, CameraFrame][] = [
      [
        'png',
        {
          encoding: 'png',
          data: await sharp(raw, { raw: { width: 320, height: 180, channels: 3 } })
            .png()
            .toBuffer(),
        },
      ],
      ['rgb8', { encoding: 'rgb8', data: raw, width: 320, height: 180 }],
      [
        'cmyk jpeg',
        {
          encoding: 'jpeg',
          data: await sharp(raw, { raw: { width: 320, height: 180, channels: 3 } })
            .toColourspace('cmyk')
            .jpeg()
            .toBuffer(),
        },
      ],
      ['progressive jpeg', { encoding: 'jpeg', data: await jpegOf(raw, 320, 180, { progressive: true }) }],
    ];
    const stage = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4', jpegToEncoder: true });
    for (const [name, frame] of frames) {
      const t = await stage.process(frame, ctx());
      assert.equal(t.jpeg, undefined, name);
      assert.ok(t.pixelValues.length > 0, name);
    }
    assert.equal(stage.jpegsToEncoder(), 0);
    const jpeg: CameraFrame = { encoding: 'jpeg', data: await jpegOf(raw, 320, 180) };
    for (const stageOf of [
      () => createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4', jpegToEncoder: true, kernel: 'lanczos3' }),
      () => createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4', jpegToEncoder: false }),
    ]) {
      const s = stageOf();
      assert.equal((await s.process(jpeg, ctx())).jpeg, undefined);
      assert.equal(s.jpegsToEncoder(), 0);
    }
    assert.throws(
      () => createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4', jpegToEncoder: 'yes' as unknown as boolean }),
      /jpegToEncoder must be a boolean/,
    );
  });

  test('createPreprocessFor: JPEG to the encoder only where it decodes them and the config says auto', async () => {
    const data = await jpegOf(scene(320, 180), 320, 180);
    const encoder = (decodesJpeg: boolean): CreatedEncoder => ({
      contract: 'gemma4',
      stage: createProjectionEncoderStage({ nEmbd: 8, seed: 1, tokens: 16 }),
      source: 'test',
      decodesJpeg,
    });
    const cases: [boolean, 'auto' | 'host', boolean][] = [
      [true, 'auto', true],
      [true, 'host', false],
      [false, 'auto', false],
    ];
    for (const [decodesJpeg, jpegDecode, expected] of cases) {
      const config = loadConfig({ preprocess: { jpegDecode } });
      const stage = await createPreprocessFor(config, encoder(decodesJpeg));
      const t = await stage.process({ encoding: 'jpeg', data }, ctx());
      assert.equal(t.jpeg !== undefined, expected, JSON.stringify({ decodesJpeg, jpegDecode }));
    }
    assert.equal(loadConfig({}).preprocess.jpegDecode, 'auto');
    assert.throws(() => loadConfig({ preprocess: { jpegDecode: 'gpu' } }), /jpegDecode/);
  });
});

describe('encoders that cannot take an undecoded JPEG refuse it, naming why', () => {
  let mmproj: string;
  let stage: MtmdEncoderStage;
  let planned: PixelTensor;
  before(async () => {
    mmproj = await resolveModel('synth:gemma4-vision-tiny-mmproj', 'mmproj', { cacheDir: MODEL_CACHE });
    stage = await createMtmdEncoderStage({ mmproj, threads: 1, graph: 'clip' });
    const data = await jpegOf(scene(320, 180), 320, 180);
    planned = await createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4', jpegToEncoder: true }).process(
      { encoding: 'jpeg', data },
      ctx(),
    );
  });
  after(() => stage.close());

  test("clip's own encode (and any encoder off a CUDA GPU): decodesJpeg false, the frame refused, encodeJpeg ENOTSUP", async () => {
    assert.equal(stage.decodesJpeg, false);
    await assert.rejects(stage.process(planned, ctx()), /cannot \(a CUDA build with nvJPEG, on the GPU\)/);
    const vision = await LlamaVision.load(mmproj, { threads: 1, graph: 'clip' });
    try {
      const image = { layout: 'patches' as const, width: planned.jpeg!.width, height: planned.jpeg!.height };
      await assert.rejects(vision.encodeJpeg(planned.jpeg!, image), (err: NodeJS.ErrnoException) => {
        assert.equal(err.code, 'ENOTSUP');
        assert.match(err.message, /no GPU JPEG decoder|clip's own encode runs|not run on a CUDA device/);
        return true;
      });
      await assert.rejects(vision.jpegPixels(planned.jpeg!, image), (err: NodeJS.ErrnoException) => err.code === 'ENOTSUP');
      await assert.rejects(vision.encodeJpeg({ ...planned.jpeg!, orientation: 9 }, image), /orientation/);
      await assert.rejects(vision.encodeJpeg({ ...planned.jpeg!, kernel: 'lanczos3' as 'cubic' }, image), /kernel/);
    } finally {
      vision.dispose();
    }
  });

  test('the ONNX and projection encoders refuse it', async () => {
    const projection = createProjectionEncoderStage({ nEmbd: 8, seed: 1, tokens: 16 });
    await assert.rejects(projection.process(planned, ctx()), /encoder-projection: got an undecoded JPEG/);
    const onnx = await createOnnxEncoderStage({
      ep: 'cpu',
      model: await resolveModel('synth:gemma4-vision-tiny', 'vision', { cacheDir: MODEL_CACHE }),
      threads: 1,
    });
    try {
      await assert.rejects(onnx.process(planned, ctx()), /encoder-onnx: got an undecoded JPEG/);
    } finally {
      await onnx.close();
    }
  });
});

// ------------------------------------------------------------------------------------------------
// The GPU path itself: only where this build has it (CUDA with nvJPEG, run on the device machine).

/** PIL's filters (Imaging/Resample.c): triangle, Catmull-Rom with a = −0.5. */
function pilFilter(kernel: 'linear' | 'cubic', x: number): number {
  x = Math.abs(x);
  if (kernel === 'linear') return x < 1 ? 1 - x : 0;
  const a = -0.5;
  return x < 1 ? ((a + 2) * x - (a + 3)) * x * x + 1 : x < 2 ? (((x - 5) * x + 8) * x - 4) * a : 0;
}

/** Normalized weights of PIL's antialiased resampling, one list per output sample. */
function pilWeights(inSize: number, outSize: number, kernel: 'linear' | 'cubic'): { lo: number; w: number[] }[] {
  const scale = inSize / outSize;
  const widen = Math.max(scale, 1);
  const reach = (kernel === 'linear' ? 1 : 2) * widen;
  return Array.from({ length: outSize }, (_, i) => {
    const centre = (i + 0.5) * scale;
    const lo = Math.max(0, Math.trunc(centre - reach + 0.5));
    const hi = Math.min(inSize, Math.trunc(centre + reach + 0.5));
    const w = Array.from({ length: hi - lo }, (_, k) => pilFilter(kernel, (lo + k - centre + 0.5) / widen));
    const sum = w.reduce((a, b) => a + b, 0);
    return { lo, w: w.map((v) => v / sum) };
  });
}

/** The encoder input from upright interleaved RGB, plainly: a 2-D PIL resample rounded to 8 bits, then
 * (v/255 − offset)/scale in CHW or 16×16 HWC patches. */
function referenceInput(
  rgb: Uint8Array,
  inW: number,
  inH: number,
  plan: { width: number; height: number; kernel: 'linear' | 'cubic'; scale: number; offset: number },
  layout: 'chw' | 'patches',
): Float32Array {
  const wx = pilWeights(inW, plan.width, plan.kernel);
  const wy = pilWeights(inH, plan.height, plan.kernel);
  const out = new Float32Array(plan.width * plan.height * 3);
  const cols = plan.width / 16;
  for (let y = 0; y < plan.height; y++) {
    for (let x = 0; x < plan.width; x++) {
      for (let c = 0; c < 3; c++) {
        let v = 0;
        wy[y]!.w.forEach((a, j) => {
          const row = (wy[y]!.lo + j) * inW;
          wx[x]!.w.forEach((b, i) => (v += a * b * rgb[(row + wx[x]!.lo + i) * 3 + c]!));
        });
        const value = (Math.min(255, Math.max(0, Math.round(v))) / 255 - plan.offset) / plan.scale;
        const at =
          layout === 'chw'
            ? c * plan.width * plan.height + y * plan.width + x
            : ((Math.floor(y / 16) * cols + Math.floor(x / 16)) * 256 + (y % 16) * 16 + (x % 16)) * 3 + c;
        out[at] = value;
      }
    }
  }
  return out;
}

/** |a − b| in 8-bit levels: max, mean, and the share above `over`. */
function levelDiff(a: Float32Array, b: Float32Array, scale: number, over = 2): { max: number; mean: number; above: number } {
  assert.equal(a.length, b.length, 'lengths differ');
  const perLevel = 1 / (255 * scale);
  let max = 0;
  let sum = 0;
  let above = 0;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i]! - b[i]!) / perLevel;
    max = Math.max(max, d);
    sum += d;
    if (d > over + 1e-3) above++;
  }
  return { max, mean: sum / a.length, above: above / a.length };
}

const gpu = await (async () => {
  const mmproj = await resolveModel('synth:gemma4-vision-tiny-mmproj', 'mmproj', { cacheDir: MODEL_CACHE });
  const probe = await createMtmdEncoderStage({ mmproj, useGpu: true, threads: 1 }).catch(() => undefined);
  const decodes = probe?.decodesJpeg === true;
  await probe?.close();
  return decodes;
})();

describe(
  'the GPU path (nvJPEG + the resampling kernel)',
  { skip: gpu ? false : 'this build or machine has no GPU JPEG path (CUDA with nvJPEG)' },
  () => {
    const stages: Partial<Record<'gemma3' | 'gemma4', MtmdEncoderStage>> = {};
    before(async () => {
      const paths = {
        gemma4: await resolveModel('synth:gemma4-vision-tiny-mmproj', 'mmproj', { cacheDir: MODEL_CACHE }),
        gemma3: await resolveModel('synth:siglip-tiny-mmproj', 'mmproj', { cacheDir: MODEL_CACHE }),
      };
      for (const contract of ['gemma4', 'gemma3'] as const)
        stages[contract] = await createMtmdEncoderStage({ mmproj: paths[contract], useGpu: true, threads: 1 });
    });
    after(async () => {
      for (const s of Object.values(stages)) await s.close();
    });

    test("its pixels are PIL's resampling of libjpeg's decode, in every EXIF orientation (gemma4 cubic patches, gemma3 linear CHW)", async () => {
      // Stored 1280×720: gemma4 shrinks both sides (280 tokens: 1056×576 upright), gemma3 shrinks
      // columns and enlarges rows (896²). q100 4:4:4 in every orientation, where decoders differ only by
      // IDCT and colour-conversion rounding; q90 4:2:0 (a camera's) in two, where the chroma is
      // upsampled as libjpeg does it (the reference is sharp's libjpeg-turbo decode).
      const raw = scene(1280, 720);
      const encodings: [string, JpegOptions, number[]][] = [
        ['q100 4:4:4', { quality: 100, chromaSubsampling: '4:4:4' }, [1, 2, 3, 4, 5, 6, 7, 8]],
        ['q90 4:2:0', { quality: 90, chromaSubsampling: '4:2:0' }, [1, 6]],
      ];
      for (const contract of ['gemma4', 'gemma3'] as const) {
        const pre = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract, jpegToEncoder: true });
        for (const [name, options, orientations] of encodings) {
          for (const orientation of orientations) {
            const data = await jpegOf(raw, 1280, 720, options, orientation);
            const t = await pre.process({ encoding: 'jpeg', data }, ctx());
            const plan = t.jpeg!;
            const got = await stages[contract]!.jpegPixels(t);
            const upright = await sharp(data, { autoOrient: true }).raw().toBuffer({ resolveWithObject: true });
            const layout = contract === 'gemma3' ? 'chw' : 'patches';
            const want = referenceInput(upright.data, upright.info.width, upright.info.height, plan, layout);
            const d = levelDiff(got, want, plan.scale);
            const where = `${contract} ${name} orientation ${orientation} (${plan.width}×${plan.height})`;
            console.log(`${where}: max ${d.max.toFixed(2)} mean ${d.mean.toFixed(4)} levels, ${(d.above * 100).toFixed(3)} % over 2`);
            assert.ok(d.mean <= 0.25 && d.max <= 4 && d.above <= 0.001, `${where}: ${JSON.stringify(d)}`);
            if (orientation === 6) {
              // The comparison can fail: the same frame read as the mirrored orientation (7) is far off.
              const mirrored = await pre.process({ encoding: 'jpeg', data: await jpegOf(raw, 1280, 720, options, 7) }, ctx());
              const wrong = levelDiff(await stages[contract]!.jpegPixels(mirrored), want, plan.scale);
              assert.ok(wrong.mean > 10, `${where}: a mirrored frame differs by only ${wrong.mean} levels on average`);
            }
          }
        }
      }
    });

    test('a camera frame (720p, q85 4:2:0): pixels within a level of the host path, and the graph encodes exactly those pixels', async () => {
      const data = await jpegOf(scene(1280, 720), 1280, 720, { quality: 85 });
      for (const contract of ['gemma4', 'gemma3'] as const) {
        const stage = stages[contract]!;
        const onGpu = await createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract, jpegToEncoder: true }).process(
          { encoding: 'jpeg', data },
          ctx(),
        );
        const host = await createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract }).process({ encoding: 'jpeg', data }, ctx());
        const pixels = await stage.jpegPixels(onGpu);
        const d = levelDiff(pixels, host.pixelValues.subarray(0, pixels.length), onGpu.jpeg!.scale);
        console.log(`${contract}: pixels vs the host path max ${d.max.toFixed(2)} mean ${d.mean.toFixed(4)} levels`);
        // The host path resizes with libvips's fixed-point filters, rounding after each pass.
        assert.ok(d.mean <= 0.5, `${contract}: mean ${d.mean} levels from the host path`);
        const a = await stage.process(onGpu, ctx());
        const viaGpu = { ...a, data: a.data.slice() };
        assert.equal(viaGpu.nTokens, onGpu.imageTokens);
        const phases = stage.stats().lastPhases;
        assert.ok(phases?.jpegDecodeMs !== undefined && phases.jpegDecodeMs > 0 && phases.deviceLayoutMs! > 0, JSON.stringify(phases));
        const values = new Float32Array(host.pixelValues.length);
        values.set(pixels);
        const b = await stage.process({ ...host, pixelValues: values }, ctx());
        const worst = tokenCosines(viaGpu, b).reduce((m, v) => Math.min(m, v), 1);
        assert.ok(worst >= 0.999999, `${contract}: encodeJpeg and encode of its own pixels differ (worst token cosine ${worst})`);
      }
    });

    test("several cameras' JPEGs in one graph call (encodeBatch) give what each gives alone", async () => {
      // Three frames with one 280-token target: stored upright, rotated (orientation 6, stored tall)
      // and another picture; the third is mixed with a host tensor to take the one-at-a-time path.
      const pre = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4', jpegToEncoder: true });
      const host = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4' });
      const wide = scene(1280, 720);
      const frames = [
        await jpegOf(wide, 1280, 720),
        await jpegOf(scene(720, 1280, 40), 720, 1280, {}, 6),
        await jpegOf(Buffer.from(wide).reverse(), 1280, 720),
      ];
      const tensors = await Promise.all(frames.map((data) => pre.process({ encoding: 'jpeg', data }, ctx())));
      assert.ok(tensors.every((t) => t.jpeg !== undefined && t.jpeg.width === 1056 && t.jpeg.height === 576));
      assert.deepEqual(
        tensors.map((t) => t.jpeg!.orientation),
        [1, 6, 1],
      );
      const stage = stages.gemma4!;
      const singles: ImageEmbedding[] = [];
      for (const t of tensors) {
        const e = await stage.process(t, ctx());
        singles.push({ ...e, data: e.data.slice() });
      }
      const batch = await stage.encodeBatch(tensors);
      assert.equal(batch.length, 3);
      batch.forEach((e, i) => {
        const worst = tokenCosines(e, singles[i]!).reduce((m, v) => Math.min(m, v), 1);
        assert.ok(worst >= 0.99999, `frame ${i}: worst token cosine ${worst}`);
      });
      assert.ok(tokenCosines(batch[0]!, batch[2]!).reduce((m, v) => Math.min(m, v), 1) < 0.999, 'different pictures, different embeddings');
      const mixed = await stage.encodeBatch([tensors[0]!, await host.process({ encoding: 'jpeg', data: frames[2]! }, ctx())]);
      assert.equal(mixed.length, 2);
      assert.ok(tokenCosines(mixed[0]!, singles[0]!).reduce((m, v) => Math.min(m, v), 1) >= 0.99999);
    });

    test('a corrupt JPEG is refused with nvJPEG’s reason, and the encoder goes on', async () => {
      const data = await jpegOf(scene(640, 360), 640, 360);
      const pre = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4', jpegToEncoder: true });
      const good = await pre.process({ encoding: 'jpeg', data }, ctx());
      const broken: PixelTensor = { ...good, jpeg: { ...good.jpeg!, data: Uint8Array.from(data.subarray(0, 600)) } };
      await assert.rejects(stages.gemma4!.process(broken, ctx()), /nvJPEG|JPEG/);
      const lying: PixelTensor = { ...good, jpeg: { ...good.jpeg!, storedWidth: 641 } };
      await assert.rejects(stages.gemma4!.process(lying, ctx()), /its header was read as 641x360/);
      const ok = await stages.gemma4!.process(good, ctx());
      assert.equal(ok.nTokens, good.imageTokens);
    });
  },
);
