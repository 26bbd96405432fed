// The trained demo model through the whole pipeline on the CPU (on a CUDA build, PERCEPT_TEST_GPU_LAYERS puts it on the GPU):
// it agrees with PyTorch on the sample bag, and the image path keeps meaning what the image shows (orientation, channel
// order, colour, resolution).
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { isDeepStrictEqual } from 'node:util';
import sharp from 'sharp';
import { evaluate, readRecording } from '../../app/eval/eval.ts';
import { DEMO_MODELS, demoWeightsSha256 } from '../../models/demo-model.ts';
import { resolveModel } from '../../models/resolve.ts';
import { LlamaModel } from '../../native/llama.ts';
import { loadActionSchema } from '../../nodes/action-schema.ts';
import { createMtmdEncoderStage } from '../../nodes/encoder-mtmd.ts';
import { createOnnxEncoderStage } from '../../nodes/encoder-onnx.ts';
import type { CameraFrame, ImageEmbedding, PixelTensor } from '../../nodes/payloads.ts';
import { createPreprocessStage } from '../../nodes/preprocess.ts';
import { createBagSource } from '../../nodes/source-bag.ts';
import { VirtualClock } from '../../pipeline/clock.ts';
import { loadConfig } from '../../pipeline/config.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';
import { pixelDigest } from '../../tools/demo-model/parity-frames.ts';
import { actionOf, encodeScene, makeScene } from '../../tools/make-scenes.ts';
import { ROS_COMPRESSED_IMAGE, ROS_IMAGE, rosCompressedImage, rosImage, writeBag } from '../support/bag-fixtures.ts';
import { REPO_ROOT } from '../support/fixtures.ts';
import { sampleBag, take } from '../support/sources.ts';

type Action = { action: string; target?: { label: string; bbox?: number[] }; hazards?: string[] };

/** fp32 PyTorch on the weights percept runs and on percept's pixels (tools/demo-model/record-parity.py, on the H200). */
interface ParityFrame {
  readonly index: number;
  readonly sha256: string;
  readonly encoder: { readonly rows: number; readonly width: number; readonly first: Record<string, number[]> };
  readonly text: string;
  readonly tokens: number[];
  readonly top: { readonly ids: number[]; readonly logits: number[] }[];
}
const PARITY = JSON.parse(readFileSync(join(REPO_ROOT, 'test/fixtures/demo-model/parity.json'), 'utf8')) as {
  readonly weightsSha256: string;
  readonly frames: ParityFrame[];
};
/** PyTorch's greedy actions on the sample bag's 40 frames. */
const TORCH = PARITY.frames.map((f) => JSON.parse(f.text) as Action);
/** Largest difference from PyTorch's soft tokens, per value: ONNX Runtime computes in fp32; llama.cpp's CPU flash attention keeps K and V in f16. */
const ENCODER_TOLERANCE = { onnx: 1e-4, mtmd: 5e-3 };
/** Largest difference from PyTorch's logits (softcapped at 30) at every step percept samples; the KV cache is f16. */
const LOGIT_TOLERANCE = 0.1;
/** With the mmproj encoder one sample frame's box lands 0.02 from PyTorch's: a near tie that the f16 attention tips. */
const MTMD_BOX_TOLERANCE = 0.02;
/** The least share of the trained draft's drafts accepted on the sample frames, greedy under the grammar. */
const MIN_ACCEPTANCE = 0.6;
/** Decoder layers and the mmproj encoder on the GPU, for a CUDA build (tools/device/); 0 here, on the CPU. */
const GPU_LAYERS = Number(process.env.PERCEPT_TEST_GPU_LAYERS ?? 0);
const WHERE = GPU_LAYERS > 0 ? 'the GPU' : 'the CPU';

const decision = (a: Action | undefined) => a && { action: a.action, label: a.target?.label, hazards: a.hazards ?? [] };

type ConfigJson = Record<string, Record<string, unknown>>;

/** Runs the default config (the demo model), changed by `edit`, over a bag in lockstep; the actions in frame order. */
async function actionsOf(bag: string, out: string, edit: (config: ConfigJson) => void = () => {}): Promise<(Action | undefined)[]> {
  const json = JSON.parse(readFileSync(join(REPO_ROOT, 'configs/default.json'), 'utf8')) as ConfigJson;
  delete json.$schema;
  json.actions = { schema: join(REPO_ROOT, 'configs/actions/robot-action.schema.json') };
  json.decoder = { ...json.decoder, gpuLayers: GPU_LAYERS };
  edit(json);
  const config = join(dir, `${out.split('/').at(-1)}.json`);
  writeFileSync(config, JSON.stringify(json));
  const { code } = await evaluate({ bag, out, config, progress: false });
  assert.equal(code, 0);
  const frames = [...(await readRecording(join(out, 'run.mcap'))).frames.values()].sort((a, b) => a.frameId - b.frameId);
  return frames.map((f) => f.action as Action | undefined);
}

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'percept-demo-model-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

describe('the demo model against PyTorch', () => {
  test(`percept on ${WHERE}, the ONNX encoder: PyTorch's greedy action on every sample-bag frame, boxes included`, async () => {
    const got = await actionsOf(sampleBag, join(dir, 'sample-onnx'), (c) => (c.encoder = { kind: 'onnx', model: 'demo:gemma4-robot' }));
    assert.equal(got.length, TORCH.length);
    got.forEach((a, i) => assert.deepEqual(a, TORCH[i], `frame ${i}`));
  });

  test(`percept on ${WHERE}, the mmproj encoder (llama.cpp's clip): PyTorch's decision on every frame, boxes within ${MTMD_BOX_TOLERANCE}`, async (t) => {
    const got = await actionsOf(
      sampleBag,
      join(dir, 'sample-mtmd'),
      (c) => (c.encoder = { kind: 'mtmd', mmproj: 'demo:gemma4-robot', gpuLayers: GPU_LAYERS }),
    );
    assert.equal(got.length, TORCH.length);
    const same = got.filter((a, i) => isDeepStrictEqual(a, TORCH[i])).length;
    t.diagnostic(`mtmd: ${same} of ${got.length} actions identical to PyTorch's`);
    got.forEach((a, i) => {
      assert.deepEqual(decision(a), decision(TORCH[i]), `frame ${i}`);
      const [p, q] = [a?.target?.bbox ?? [], TORCH[i]!.target?.bbox ?? []];
      assert.equal(p.length, q.length, `frame ${i}: bbox presence`);
      p.forEach((v, k) => assert.ok(Math.abs(v - q[k]!) <= MTMD_BOX_TOLERANCE + 1e-9, `frame ${i}: bbox[${k}] ${v} vs PyTorch ${q[k]}`));
    });
  });
});

describe('the image path keeps its meaning', () => {
  // Two frames of the sample bag (a person far, then close) and one unseen test scene with a red wet-floor sign.
  const SIGN_SEED = 2_000_008;
  const T = (k: number) => BigInt(k) * 100_000_000n;
  let bases: { name: string; jpeg: Buffer }[];
  let variants: {
    name: string;
    base: number;
    jpeg?: Buffer;
    format?: 'png';
    raw?: { encoding: string; data: Buffer; width: number; height: number };
  }[];

  before(async () => {
    const source = await createBagSource({ path: sampleBag });
    const frames = await take(source, new VirtualClock(), 40);
    await source.close();
    const sign = makeScene(SIGN_SEED);
    bases = [
      { name: 'sample frame 5', jpeg: Buffer.from(frames[5]!.payload.data) },
      { name: 'sample frame 35', jpeg: Buffer.from(frames[35]!.payload.data) },
      { name: `scene ${SIGN_SEED}`, jpeg: await encodeScene(sign, 640, 360) },
    ];
    assert.deepEqual(actionOf(sign).hazards, ['wet_floor'], 'the sign scene has a red wet-floor sign');
    variants = [];
    for (const [b, { jpeg }] of bases.entries()) {
      const { data: rgb, info } = await sharp(jpeg).removeAlpha().raw().toBuffer({ resolveWithObject: true });
      const { width, height } = info;
      const bgr = Buffer.from(rgb);
      for (let i = 0; i < bgr.length; i += 3) [bgr[i], bgr[i + 2]] = [rgb[i + 2]!, rgb[i]!];
      const swapped = await sharp(bgr, { raw: { width, height, channels: 3 } })
        .jpeg({ quality: 95 })
        .toBuffer();
      // EXIF orientation 6: the stored pixels are turned 90° anticlockwise; a viewer turns them back.
      const rotated = await sharp(jpeg).rotate(270).withMetadata({ orientation: 6 }).jpeg({ quality: 95 }).toBuffer();
      variants.push(
        { name: 'jpeg', base: b, jpeg },
        { name: 'exif-rotated', base: b, jpeg: rotated },
        { name: '1280x720', base: b, jpeg: await sharp(jpeg).resize(1280, 720, { kernel: 'cubic' }).jpeg({ quality: 95 }).toBuffer() },
        { name: '960x540', base: b, jpeg: await sharp(jpeg).resize(960, 540, { kernel: 'cubic' }).jpeg({ quality: 95 }).toBuffer() },
        { name: 'red-blue-swapped', base: b, jpeg: swapped },
        { name: 'rgb8', base: b, raw: { encoding: 'rgb8', data: rgb, width, height } },
        { name: 'bgr8', base: b, raw: { encoding: 'bgr8', data: bgr, width, height } },
      );
      if (b < 2) {
        // The model never saw a grey frame, so mono8 is checked against the same grey pixels as a 3-channel PNG.
        const mono = await sharp(jpeg).greyscale().raw().toBuffer();
        const greyPng = await sharp(mono, { raw: { width, height, channels: 1 } })
          .toColourspace('srgb')
          .png()
          .toBuffer();
        variants.push(
          { name: 'mono8', base: b, raw: { encoding: 'mono8', data: mono, width, height } },
          { name: 'grey-png', base: b, jpeg: greyPng, format: 'png' },
        );
      }
    }
  });

  test('a frame decides the same as its EXIF-rotated, BGR, RGB and resized copies, mono8 as its grey PNG; swapping red and blue removes the wet-floor hazard', async () => {
    const compressed = variants.filter((v) => v.jpeg);
    const raw = variants.filter((v) => v.raw);
    const enc = new TextEncoder();
    await writeBag(join(dir, 'jpeg.mcap'), async (w) => {
      const schemaId = await w.registerSchema({
        name: 'sensor_msgs/msg/CompressedImage',
        encoding: 'ros2msg',
        data: enc.encode(ROS_COMPRESSED_IMAGE),
      });
      const channelId = await w.registerChannel({
        topic: '/camera/front/compressed',
        schemaId,
        messageEncoding: 'cdr',
        metadata: new Map(),
      });
      for (const [k, v] of compressed.entries()) {
        await w.addMessage({
          channelId,
          sequence: k,
          logTime: T(k + 1),
          publishTime: T(k + 1),
          data: rosCompressedImage(T(k + 1), v.format ?? 'jpeg', v.jpeg!),
        });
      }
    });
    await writeBag(join(dir, 'raw.mcap'), async (w) => {
      const schemaId = await w.registerSchema({ name: 'sensor_msgs/msg/Image', encoding: 'ros2msg', data: enc.encode(ROS_IMAGE) });
      const channelId = await w.registerChannel({
        topic: '/camera/front/image_raw',
        schemaId,
        messageEncoding: 'cdr',
        metadata: new Map(),
      });
      for (const [k, v] of raw.entries()) {
        const { encoding, data, width, height } = v.raw!;
        const step = width * (encoding === 'mono8' ? 1 : 3);
        await w.addMessage({
          channelId,
          sequence: k,
          logTime: T(k + 1),
          publishTime: T(k + 1),
          data: rosImage(T(k + 1), { encoding, data, width, height, step }),
        });
      }
    });
    const results = [
      ...(await actionsOf(join(dir, 'jpeg.mcap'), join(dir, 'eval-jpeg'))).map((a, k) => ({ ...compressed[k]!, action: a })),
      ...(
        await actionsOf(join(dir, 'raw.mcap'), join(dir, 'eval-raw'), (c) => (c.source = { ...c.source, topic: '/camera/front/image_raw' }))
      ).map((a, k) => ({
        ...raw[k]!,
        action: a,
      })),
    ];
    const table = results.map((r) => `${bases[r.base]!.name} ${r.name}: ${JSON.stringify(r.action)}`).join('\n');
    for (const [b, base] of bases.entries()) {
      const reference = results.find((r) => r.base === b && r.name === 'jpeg')!.action;
      assert.ok(reference, `${base.name}: an action`);
      for (const r of results.filter((x) => x.base === b && !['red-blue-swapped', 'mono8', 'grey-png'].includes(x.name))) {
        assert.deepEqual(decision(r.action), decision(reference), `${base.name} ${r.name} decides otherwise than the JPEG:\n${table}`);
      }
    }
    for (const b of [0, 1]) {
      const [mono, grey] = ['mono8', 'grey-png'].map((name) => results.find((r) => r.base === b && r.name === name)!.action);
      assert.deepEqual(decision(mono), decision(grey), `${bases[b]!.name}: mono8 decides otherwise than its grey PNG:\n${table}`);
    }
    const sign = results.filter((r) => r.base === 2);
    assert.deepEqual(
      decision(sign.find((r) => r.name === 'jpeg')!.action),
      { action: 'turn', label: 'none', hazards: ['wet_floor'] },
      table,
    );
    const swapped = sign.find((r) => r.name === 'red-blue-swapped')!.action;
    assert.ok(!(swapped?.hazards ?? []).includes('wet_floor'), `a blue sign is no wet-floor sign:\n${table}`);
  });
});

describe('the demo model against fp32 PyTorch, same weights and pixels', () => {
  const config = loadConfig(join(REPO_ROOT, 'configs/default.json'));
  let frames: CameraFrame[];
  const pixels = async (): Promise<PixelTensor[]> => {
    const stage = createPreprocessStage({ ...config.preprocess, contract: 'gemma4' });
    const out: PixelTensor[] = [];
    for (const [i, frame] of frames.entries()) {
      const knobs = { imageTokens: config.ladder.initial.imageTokens, maxNewTokens: 1 };
      out.push(await stage.process(frame, standaloneContext({ frame: { frameId: i, sourceId: 'parity' }, knobs })));
    }
    return out;
  };
  const embeddings = new Map<string, ImageEmbedding[]>();
  /** Each frame's prompt as percept builds it, its soft tokens in the image slot, and the action grammar. */
  const parityPrompts = async (model: LlamaModel, frames: readonly ImageEmbedding[]) => {
    const marker = '<__parity_image__>';
    const messages = [
      { role: 'system' as const, content: config.decoder.systemPrompt },
      { role: 'user' as const, content: `${marker}\n${config.decoder.instruction}` },
    ];
    return {
      grammar: await model.grammarFromJsonSchema(loadActionSchema(config.actions.schema).schema),
      prompts: frames.map((e) => model.chatPrompt(messages, [{ data: e.data, nTokens: e.nTokens }], { imageMarker: marker })),
    };
  };

  before(async () => {
    const source = await createBagSource({ path: sampleBag });
    frames = (await take(source, new VirtualClock(), 40)).map((f) => f.payload);
    await source.close();
    assert.equal(frames.length, PARITY.frames.length);
  });

  test('the fixture was recorded from the shipped weights file, on the pixels percept makes', async () => {
    assert.equal(await demoWeightsSha256(DEMO_MODELS['gemma4-robot']), PARITY.weightsSha256, 'weights changed: run record-parity.py again');
    (await pixels()).forEach((t, i) => assert.equal(pixelDigest(t), PARITY.frames[i]!.sha256, `frame ${i}: preprocessing changed`));
  });

  const ENCODERS = {
    onnx: async () => {
      const stage = await createOnnxEncoderStage({ model: await resolveModel('demo:gemma4-robot', 'vision'), ep: 'cpu', copyInputs: true });
      return { stage, close: () => stage.close() };
    },
    mtmd: async () => {
      const stage = await createMtmdEncoderStage({ mmproj: await resolveModel('demo:gemma4-robot', 'mmproj') });
      return { stage, close: () => stage.close() };
    },
  };
  for (const [name, open] of Object.entries(ENCODERS)) {
    test(`the ${name} encoder gives PyTorch's soft tokens within ${ENCODER_TOLERANCE[name as 'onnx' | 'mtmd']}`, async () => {
      const { stage, close } = await open();
      try {
        const out: ImageEmbedding[] = [];
        let worst = { diff: 0, at: '' };
        for (const [i, t] of (await pixels()).entries()) {
          const e = await stage.process(t, standaloneContext({ frame: { frameId: i, sourceId: 'parity' } }));
          const want = PARITY.frames[i]!.encoder;
          assert.deepEqual([e.nTokens, e.nEmbd], [want.rows, want.width], `frame ${i}: shape`);
          for (const [row, values] of Object.entries(want.first)) {
            values.forEach((v, k) => {
              const diff = Math.abs(e.data[Number(row) * e.nEmbd + k]! - v);
              if (diff > worst.diff) worst = { diff, at: `frame ${i} row ${row} value ${k}` };
            });
          }
          out.push(e);
        }
        console.log(`# ${name}: largest soft-token difference from PyTorch ${worst.diff.toExponential(2)} (${worst.at})`);
        assert.ok(worst.diff <= ENCODER_TOLERANCE[name as 'onnx' | 'mtmd'], `${worst.at}: ${worst.diff} from PyTorch`);
        embeddings.set(name, out);
      } finally {
        await close();
      }
    });
  }

  test(`greedy decoding: PyTorch's text on every frame, logits within ${LOGIT_TOLERANCE} at every sampled step`, async () => {
    const onnx = embeddings.get('onnx');
    assert.ok(onnx, 'the ONNX encoder test ran first');
    const model = await LlamaModel.load(await resolveModel('demo:gemma4-robot', 'decoder'));
    try {
      const ctx = await model.createContext({ nCtx: 1024, nBatch: 512, nUbatch: 512 });
      try {
        const { grammar, prompts } = await parityPrompts(model, onnx);
        let worst = { diff: 0, at: '' };
        for (const [i, prompt] of prompts.entries()) {
          const want = PARITY.frames[i]!;
          ctx.clearCache();
          const r = await ctx.generate(prompt, { maxTokens: 96, grammar, jumpForward: true, topLogits: 5 });
          assert.equal(r.text, want.text, `frame ${i}: text`);
          assert.ok(r.topLogits && r.topLogits.length > 0, `frame ${i}: top logits recorded`);
          for (const { step, ids, logits } of r.topLogits) {
            assert.ok(step < want.top.length, `frame ${i}: step ${step} past PyTorch's ${want.top.length} recorded steps`);
            const torch = want.top[step]!;
            assert.equal(ids[0], torch.ids[0], `frame ${i} step ${step}: argmax`);
            ids.forEach((id, k) => {
              const j = torch.ids.indexOf(id);
              if (j < 0) return; // below PyTorch's recorded top 8
              const diff = Math.abs(logits[k]! - torch.logits[j]!);
              if (diff > worst.diff) worst = { diff, at: `frame ${i} step ${step} token ${id}` };
            });
          }
        }
        console.log(`# largest logit difference from PyTorch ${worst.diff.toFixed(4)} (${worst.at})`);
        assert.ok(worst.diff <= LOGIT_TOLERANCE, `${worst.at}: ${worst.diff} from PyTorch`);
      } finally {
        await ctx.dispose();
      }
    } finally {
      await model.dispose();
    }
  });

  test(`the trained MTP assistant drafts without changing one greedy text, accepting ≥ ${MIN_ACCEPTANCE} of its drafts`, async () => {
    const onnx = embeddings.get('onnx');
    assert.ok(onnx, 'the ONNX encoder test ran first');
    const model = await LlamaModel.load(await resolveModel('demo:gemma4-robot', 'decoder'));
    const assistant = await LlamaModel.load(await resolveModel('demo:gemma4-robot-assistant', 'decoder'));
    try {
      const ctx = await model.createContext({ nCtx: 1024, nBatch: 512, nUbatch: 512 });
      try {
        await ctx.attachSpeculator({ type: 'draft-mtp', draftModel: assistant, nMax: 3 });
        const { grammar, prompts } = await parityPrompts(model, onnx);
        let drafted = 0;
        let accepted = 0;
        for (const [i, prompt] of prompts.entries()) {
          ctx.clearCache();
          const r = await ctx.generate(prompt, { maxTokens: 96, grammar, jumpForward: true });
          assert.equal(r.text, PARITY.frames[i]!.text, `frame ${i}: text with the draft`);
          drafted += r.drafted;
          accepted += r.accepted;
        }
        console.log(`# MTP assistant: ${accepted} of ${drafted} drafts accepted (${(accepted / drafted).toFixed(3)})`);
        assert.ok(drafted >= onnx.length, `${drafted} drafts over ${onnx.length} frames`);
        assert.ok(accepted / drafted >= MIN_ACCEPTANCE, `${accepted} of ${drafted} drafts accepted`);
      } finally {
        await ctx.dispose();
      }
    } finally {
      await assistant.dispose();
      await model.dispose();
    }
  });
});
