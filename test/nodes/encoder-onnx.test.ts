import assert from 'node:assert/strict';
import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import ort from 'onnxruntime-node';
import sharp from 'sharp';
import { checkEncoderContract, checkExecutionProvider, createOnnxEncoderStage, type OnnxEncoderStage } from '../../nodes/encoder-onnx.ts';
import { createProjectionEncoderStage } from '../../nodes/encoder-projection.ts';
import { createPreprocessStage } from '../../nodes/preprocess.ts';
import type { PixelTensor } from '../../nodes/payloads.ts';
import { StageAbort, type StageContext, type StageEvent } from '../../pipeline/types.ts';
import { OnnxGraphBuilder } from '../../models/onnx-writer.ts';
import { synthesizeVision } from '../../models/vision-synth.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';
import { PREPROCESS_DEFAULTS } from '../support/fixtures.ts';

const dir = join(import.meta.dirname, '../..', '.cache', 'test-encoder-onnx');
rmSync(dir, { recursive: true, force: true });
mkdirSync(dir, { recursive: true });
const gemma3Path = join(dir, 'siglip-tiny.onnx');
const gemma4Path = join(dir, 'gemma4-vision-tiny.onnx');

function ctx(opts: { imageTokens?: number; signal?: AbortSignal; events?: StageEvent[]; deadlineNs?: bigint } = {}): StageContext {
  return standaloneContext({
    frame: { frameId: 1, sourceId: 'test' },
    deadlineNs: opts.deadlineNs,
    knobs: { imageTokens: opts.imageTokens ?? 280, maxNewTokens: 8 },
    signal: opts.signal,
    report: (e) => opts.events?.push(e),
  });
}

async function cameraJpeg(w = 640, h = 360): Promise<Buffer> {
  const raw = Buffer.alloc(w * h * 3);
  for (let i = 0; i < raw.length; i++) raw[i] = (i * 7 + (i >> 9)) & 255;
  return sharp(raw, { raw: { width: w, height: h, channels: 3 } })
    .jpeg()
    .toBuffer();
}

before(() => {
  synthesizeVision({ preset: 'siglip-tiny', out: gemma3Path, seed: 1 });
  synthesizeVision({ preset: 'gemma4-vision-tiny', out: gemma4Path, seed: 2 });
});

describe('contract checks at load', () => {
  test('detects gemma3 and gemma4 models and their output width', async () => {
    const e3 = await createOnnxEncoderStage({ ep: 'cpu', model: gemma3Path, threads: 1, expectedHidden: 64 });
    const e4 = await createOnnxEncoderStage({ ep: 'cpu', model: gemma4Path, threads: 1 });
    try {
      assert.deepEqual([e3.contract.kind, e3.contract.hidden, e3.contract.imageSize, e3.contract.tokens], ['gemma3', 64, 896, 256]);
      assert.deepEqual([e4.contract.kind, e4.contract.hidden, e4.contract.patchDim], ['gemma4', 64, 768]);
      assert.equal(e3.name, 'encode');
    } finally {
      await Promise.all([e3.close(), e4.close()]);
    }
  });

  test("the decoder's n_embd must match the encoder's output width", async () => {
    await assert.rejects(
      createOnnxEncoderStage({ ep: 'cpu', model: gemma4Path, threads: 1, expectedHidden: 1536 }),
      /image_features width is 64, but the decoder's n_embd is 1536/,
    );
  });

  test('a model with the wrong contract is rejected with a message naming each mismatch', async () => {
    // input named 'pixels', int64 dtype, non-square → every problem is listed
    const g = new OnnxGraphBuilder({ name: 'wrong' });
    const x = g.input('pixels', 'float', [1, 3, 224, 224]);
    g.output('features', 'float', [1, 3, 224, 224], g.node('Relu', [x]));
    const wrongNames = join(dir, 'wrong-names.onnx');
    g.write(wrongNames);
    await assert.rejects(
      createOnnxEncoderStage({ ep: 'cpu', model: wrongNames, threads: 1 }),
      (err: Error) =>
        /missing input 'pixel_values' \(inputs: pixels:float32\[1,3,224,224\]\)/.test(err.message) &&
        /missing output 'image_features'/.test(err.message) &&
        /unexpected input\(s\) 'pixels'/.test(err.message),
    );

    const g2 = new OnnxGraphBuilder({ name: 'wrong-shape' });
    const px = g2.input('pixel_values', 'float', [1, 4, 896, 800]);
    const flat = g2.node('Reshape', [px, g2.constI64([1, -1, 64])]);
    g2.output('image_features', 'float', [1, 'n', 64], flat);
    const wrongShape = join(dir, 'wrong-shape.onnx');
    g2.write(wrongShape);
    await assert.rejects(
      createOnnxEncoderStage({ ep: 'cpu', model: wrongShape, threads: 1 }),
      /not a gemma3 vision_encoder: pixel_values dim 1 is 4, expected 3 .*; pixel_values is 896×800, expected a square image/,
    );
  });

  test('checkEncoderContract on metadata: dtypes and ranks', () => {
    const pv = { name: 'pixel_values', isTensor: true, type: 'float32', shape: ['batch', 'num_patches', 768] };
    const out = { name: 'image_features', isTensor: true, type: 'float32', shape: ['batch', 'num_tokens', 2560] };
    const ok = checkEncoderContract(
      [pv, { name: 'pixel_position_ids', isTensor: true, type: 'int64', shape: ['batch', 'num_patches', 2] }],
      [out],
      2560,
    );
    assert.equal(ok.kind, 'gemma4');
    // HF returns the valid tokens flattened: rank 2 output is accepted
    assert.equal(
      checkEncoderContract(
        [pv, { name: 'pixel_position_ids', isTensor: true, type: 'int64', shape: ['n', 'p', 2] }],
        [{ ...out, shape: ['t', 1536] }],
      ).hidden,
      1536,
    );
    assert.throws(
      () => checkEncoderContract([pv, { name: 'pixel_position_ids', isTensor: true, type: 'int32', shape: ['b', 'p', 3] }], [out]),
      /pixel_position_ids has dtype int32, expected int64; pixel_position_ids dim 2 is 3, expected 2/,
    );
    assert.throws(
      () => checkEncoderContract([{ ...pv, shape: [1, 3, 896, 896] }], [{ ...out, type: 'float16' }]),
      /image_features has dtype float16, expected float32/,
    );
    assert.throws(
      () => checkEncoderContract([{ ...pv, shape: [1, 3, 896, 896] }], [{ ...out, shape: [1, 256, 'hidden'] }]),
      /width is symbolic/,
    );
  });

  test('execution providers: GPU providers missing here give a clear error; unknown ones are refused', async () => {
    assert.doesNotThrow(() => checkExecutionProvider('cpu'));
    await assert.rejects(
      createOnnxEncoderStage({ model: gemma4Path, ep: 'cuda' }),
      /execution provider 'cuda' is not available: .*libonnxruntime_providers_cuda\.so not found/,
    );
    await assert.rejects(createOnnxEncoderStage({ model: gemma4Path, ep: 'tensorrt' }), /execution provider 'tensorrt' is not available/);
    await assert.rejects(
      createOnnxEncoderStage({ model: gemma4Path, ep: 'tpu' as never }),
      /execution provider must be one of cpu, cuda, tensorrt, got tpu/,
    );
    await assert.rejects(createOnnxEncoderStage({ ep: 'cpu', model: join(dir, 'nope.onnx') }), /does not exist/);
    await assert.rejects(
      createOnnxEncoderStage({ ep: 'cpu', model: 'x.mmproj.gguf' }),
      /GGUF \(mmproj\): that needs the llama\.cpp mtmd encoder/,
    );
  });
});

describe('encoding in the worker', () => {
  let e3: OnnxEncoderStage;
  let e4: OnnxEncoderStage;
  before(async () => {
    e3 = await createOnnxEncoderStage({ ep: 'cpu', model: gemma3Path, threads: 1 });
    e4 = await createOnnxEncoderStage({ ep: 'cpu', model: gemma4Path, threads: 1, expectedHidden: 64 });
  });
  after(async () => {
    await Promise.all([e3.close(), e4.close()]);
  });

  test('preprocess → encode gives what onnxruntime gives on the main thread, for both contracts', async () => {
    const jpeg = await cameraJpeg();
    for (const [stage, path] of [
      [e3, gemma3Path],
      [e4, gemma4Path],
    ] as const) {
      const pre = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: stage.contract.kind });
      const tensor = await pre.process({ encoding: 'jpeg', data: jpeg }, ctx({ imageTokens: 140 }));
      const feeds: Record<string, ort.Tensor> = {
        pixel_values: new ort.Tensor('float32', tensor.pixelValues.slice(), [...tensor.pixelDims]),
      };
      if (tensor.positionIds) feeds.pixel_position_ids = new ort.Tensor('int64', tensor.positionIds.slice(), [...tensor.positionDims!]);
      const session = await ort.InferenceSession.create(path, { intraOpNumThreads: 1 });
      const direct = (await session.run(feeds)).image_features!;
      await session.release();
      const emb = await stage.process(tensor, ctx({ imageTokens: 140 }));
      assert.equal(emb.nTokens, tensor.imageTokens);
      assert.equal(emb.nEmbd, 64);
      assert.equal(emb.data.length, emb.nTokens * 64);
      assert.deepEqual(Array.from(emb.data), Array.from(direct.data as Float32Array), stage.contract.kind);
    }
  });

  test('inputs are transferred (detached afterwards, pixel_values recycled) unless copyInputs is set', async () => {
    const pre = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4' });
    const jpeg = await cameraJpeg(320, 240);
    const t1 = await pre.process({ encoding: 'jpeg', data: jpeg }, ctx({ imageTokens: 70 }));
    await e4.process(t1, ctx());
    assert.equal(t1.pixelValues.byteLength, 0);
    assert.equal(t1.positionIds!.byteLength, 0);
    await assert.rejects(e4.process(t1, ctx()), /pixelValues is detached/);
    const copying = await createOnnxEncoderStage({ ep: 'cpu', model: gemma4Path, threads: 1, copyInputs: true });
    try {
      const t2 = await pre.process({ encoding: 'jpeg', data: jpeg }, ctx({ imageTokens: 70 }));
      assert.equal(pre.allocatedArrays(), 1, "the worker handed t1's pixel_values back and t2 reuses them");
      const a = await copying.process(t2, ctx());
      const b = await copying.process(t2, ctx());
      assert.equal(t2.pixelValues.length, 70 * 9 * 768);
      assert.deepEqual(a.data, b.data);
    } finally {
      await copying.close();
    }
  });

  test('mismatched tensors are rejected before the run', async () => {
    const pre = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4' });
    const t = await pre.process({ encoding: 'mono8', data: new Uint8Array(96 * 96), width: 96, height: 96 }, ctx({ imageTokens: 70 }));
    await assert.rejects(e3.process(t, ctx()), /got a gemma4 tensor, the model is gemma3/);
    await assert.rejects(e4.process({ ...t, imageTokens: 3 }, ctx()), /the encoder produced \d+ tokens but the preprocessor announced 3/);
    const bad: PixelTensor = { contract: 'gemma4', pixelValues: new Float32Array(10), pixelDims: [1, 1, 768], imageTokens: 1 };
    await assert.rejects(e4.process(bad, ctx()), /pixelDims \[1,1,768\] need 768 values, got 10/);
  });

  test('the event loop stays idle during an encode (the run is on the worker thread)', async () => {
    const pre = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma3' });
    const tensor = await pre.process({ encoding: 'jpeg', data: await cameraJpeg() }, ctx());
    const h = monitorEventLoopDelay({ resolution: 5 });
    h.enable();
    const elu0 = performance.eventLoopUtilization();
    await e3.process(tensor, ctx());
    const elu = performance.eventLoopUtilization(elu0);
    h.disable();
    console.log(
      `encode ${(elu.idle + elu.active).toFixed(0)} ms; event loop busy ${(100 * elu.utilization).toFixed(1)} %, delay max ${(h.max / 1e6).toFixed(1)} ms`,
    );
    // Event loop utilization is the share of the encode's time the loop spent running (not waiting
    // for events): about 1 if the encode ran on this thread, however fast or loaded the machine is;
    // near 0 when it runs on the worker and the loop only posts the request and takes the reply.
    assert.ok(
      elu.utilization < 0.5,
      `the event loop was busy ${(100 * elu.utilization).toFixed(1)} % of the encode (${elu.active.toFixed(1)} of ${(elu.active + elu.idle).toFixed(1)} ms)`,
    );
  });
});

describe('abort and close', () => {
  test('ctx.signal aborts the wait; the late result is discarded and counted; the next frame works', async () => {
    const stage = await createOnnxEncoderStage({ ep: 'cpu', model: gemma3Path, threads: 1 });
    try {
      const pre = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma3' });
      const jpeg = await cameraJpeg();
      const events: StageEvent[] = [];
      // already aborted: no run at all; the stage gives up with the signal's reason
      const pre1 = await pre.process({ encoding: 'jpeg', data: jpeg }, ctx());
      const aborted = AbortSignal.abort();
      await assert.rejects(stage.process(pre1, ctx({ signal: aborted, events })), (e: unknown) => e === aborted.reason);
      assert.equal(stage.stats().runs, 0);

      // aborted during the run: process() hands the run to the worker before it returns its promise,
      // so the abort comes after the request was posted. The stage gives up at once: its promise
      // settles before the worker's reply can even be read (that takes a later event-loop turn).
      const controller = new AbortController();
      const tensor = await pre.process({ encoding: 'jpeg', data: jpeg }, ctx());
      const pending = stage.process(tensor, ctx({ signal: controller.signal, events }));
      controller.abort();
      await assert.rejects(pending, (e: unknown) => e === controller.signal.reason);
      assert.equal(stage.stats().runs, 0, 'gave up without waiting for the run');
      assert.equal(tensor.pixelValues.buffer.byteLength, 0, 'the run had been handed to the worker (its input transferred)');
      assert.deepEqual(events, [], 'the stage reports nothing itself: the runtime classifies the abort');
      // the next frame waits for the abandoned run, then runs normally
      const next = await stage.process(await pre.process({ encoding: 'jpeg', data: jpeg }, ctx()), ctx());
      assert.equal(next.nTokens, 256);
      assert.deepEqual(stage.stats().discarded, 1);
      assert.equal(stage.stats().runs, 2);
    } finally {
      await stage.close();
    }
  });

  test("whatever the abort's reason, the stage rethrows it unchanged", async () => {
    const stage = await createOnnxEncoderStage({ ep: 'cpu', model: gemma4Path, threads: 1 });
    try {
      const pre = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4' });
      const t = await pre.process({ encoding: 'mono8', data: new Uint8Array(96 * 96), width: 96, height: 96 }, ctx({ imageTokens: 70 }));
      for (const reason of [new StageAbort('deadline', 'encode'), new StageAbort('shutdown', 'graph'), 'a plain string']) {
        await assert.rejects(stage.process(t, ctx({ signal: AbortSignal.abort(reason) })), (e: unknown) => e === reason);
      }
      assert.equal(stage.stats().runs, 0);
    } finally {
      await stage.close();
    }
  });

  test('close() ends the worker thread; later calls are refused', async () => {
    const before = process.getActiveResourcesInfo().filter((r) => r === 'MessagePort').length;
    const stage = await createOnnxEncoderStage({ ep: 'cpu', model: gemma4Path, threads: 1 });
    assert.equal(process.getActiveResourcesInfo().filter((r) => r === 'MessagePort').length, before + 1);
    await stage.close();
    await stage.close(); // idempotent
    assert.equal(process.getActiveResourcesInfo().filter((r) => r === 'MessagePort').length, before);
    const t: PixelTensor = {
      contract: 'gemma4',
      pixelValues: new Float32Array(768),
      pixelDims: [1, 1, 768],
      positionIds: new BigInt64Array(2),
      positionDims: [1, 1, 2],
      imageTokens: 0,
    };
    await assert.rejects(stage.process(t, ctx()), /stage is closed/);
  });
});

describe('projection stand-in encoder', () => {
  test('deterministic, image-dependent, decoder width, token counts from the tensor', async () => {
    const stage = createProjectionEncoderStage({ nEmbd: 48, seed: 5, tokens: 256 });
    const again = createProjectionEncoderStage({ nEmbd: 48, seed: 5, tokens: 256 });
    const other = createProjectionEncoderStage({ nEmbd: 48, seed: 6, tokens: 256 });
    const pre3 = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma3' });
    const pre4 = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4' });
    const a = await cameraJpeg(320, 240);
    const b = await sharp({ create: { width: 320, height: 240, channels: 3, background: '#204080' } })
      .jpeg()
      .toBuffer();
    const ea = await stage.process(await pre3.process({ encoding: 'jpeg', data: a }, ctx()), ctx());
    assert.deepEqual([ea.nTokens, ea.nEmbd, ea.data.length], [256, 48, 256 * 48]);
    assert.deepEqual(ea.data, (await again.process(await pre3.process({ encoding: 'jpeg', data: a }, ctx()), ctx())).data);
    assert.notDeepEqual(ea.data, (await other.process(await pre3.process({ encoding: 'jpeg', data: a }, ctx()), ctx())).data);
    assert.notDeepEqual(ea.data, (await stage.process(await pre3.process({ encoding: 'jpeg', data: b }, ctx()), ctx())).data);
    const t4 = await pre4.process({ encoding: 'jpeg', data: a }, ctx({ imageTokens: 140 }));
    const e4 = await stage.process(t4, ctx());
    assert.equal(e4.nTokens, t4.imageTokens);
    assert.ok(e4.data.some((v) => v !== 0));
    assert.throws(() => createProjectionEncoderStage({ nEmbd: 0, seed: 1, tokens: 256 }), /nEmbd must be a positive integer/);
    assert.throws(() => createProjectionEncoderStage({ nEmbd: 8, seed: 1, tokens: 250 }), /square number/);
  });
});
