import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import sharp, { type SharpOptions } from 'sharp';
import { clampImageTokens, createPreprocessStage, gemma4TargetSize, GEMMA4_TOKEN_BUDGETS } from '../nodes/preprocess.ts';
import type { CameraFrame, PixelTensor } from '../nodes/payloads.ts';
import type { StageContext } from '../pipeline/types.ts';
import { standaloneContext } from '../pipeline/standalone.ts';

function ctx(imageTokens = 280): StageContext {
  return standaloneContext({ frame: { frameId: 1, sourceId: 'test' }, knobs: { imageTokens, maxNewTokens: 8 } });
}

/** A deterministic RGB scene: gradients, a checkerboard and noise, so resizing has detail to work on. */
function scene(width: number, height: number): Buffer {
  const raw = Buffer.alloc(width * height * 3);
  let s = 7;
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      s = (Math.imul(s, 1103515245) + 12345) >>> 0;
      const i = (y * width + x) * 3;
      raw[i] = ((x * 255) / width + (s >>> 28)) & 255;
      raw[i + 1] = ((y * 255) / height) & 255;
      raw[i + 2] = (((x >> 3) ^ (y >> 3)) & 1) * 200 + ((s >>> 24) & 31);
    }
  }
  return raw;
}

const rawRgb = (w: number, h: number) => ({ raw: { width: w, height: h, channels: 3 as const } });

/** The plain reference: sharp resizes, a naive loop normalizes into CHW. */
async function referenceGemma3(input: Buffer | Uint16Array, opts: SharpOptions, size = 896): Promise<Float32Array> {
  const { data, info } = await sharp(input, opts)
    .resize(size, size, { fit: 'fill', kernel: 'linear' })
    .removeAlpha()
    .raw()
    .toBuffer({ resolveWithObject: true });
  const out = new Float32Array(3 * size * size);
  for (let c = 0; c < 3; c++) {
    for (let y = 0; y < size; y++) {
      for (let x = 0; x < size; x++) {
        const v = data[(y * size + x) * info.channels + (info.channels >= 3 ? c : 0)]!;
        out[c * size * size + y * size + x] = (v / 255 - 0.5) / 0.5;
      }
    }
  }
  return out;
}

function maxAbsDiff(a: Float32Array, b: Float32Array): number {
  assert.equal(a.length, b.length, 'lengths differ');
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

describe('preprocess gemma3', () => {
  const W = 320;
  const H = 180;
  const rgb = scene(W, H);

  test('JPEG → [1,3,896,896] CHW in [-1,1] equals the plain reference', async () => {
    const jpeg = await sharp(rgb, rawRgb(W, H)).jpeg({ quality: 90 }).toBuffer();
    const stage = createPreprocessStage({ contract: 'gemma3' });
    const t = await stage.process({ encoding: 'jpeg', data: jpeg }, ctx());
    assert.equal(t.contract, 'gemma3');
    assert.deepEqual(t.pixelDims, [1, 3, 896, 896]);
    assert.equal(t.imageTokens, 256);
    const ref = await referenceGemma3(jpeg, {});
    assert.ok(maxAbsDiff(t.pixelValues, ref) <= 1e-5);
    // the image has content: both ends of the range occur
    let min = Infinity;
    let max = -Infinity;
    for (const v of t.pixelValues) {
      min = Math.min(min, v);
      max = Math.max(max, v);
    }
    assert.ok(min < -0.5 && max > 0.5, `range ${min}..${max}`);
  });

  test('raw rgb8 / bgr8 with row padding / rgba8 / bgra8 all give the rgb8 result', async () => {
    const stage = createPreprocessStage({ contract: 'gemma3' });
    const ref = await referenceGemma3(rgb, rawRgb(W, H));
    const plain = await stage.process({ encoding: 'rgb8', data: rgb, width: W, height: H }, ctx());
    assert.ok(maxAbsDiff(plain.pixelValues, ref) <= 1e-5);
    for (const encoding of ['bgr8', 'rgba8', 'bgra8'] as const) {
      const bpp = encoding === 'bgr8' ? 3 : 4;
      const stride = W * bpp + 13; // padded rows
      const data = new Uint8Array(stride * H).fill(0xee);
      for (let y = 0; y < H; y++) {
        for (let x = 0; x < W; x++) {
          const s = (y * W + x) * 3;
          const d = y * stride + x * bpp;
          const [r, g, b] = [rgb[s]!, rgb[s + 1]!, rgb[s + 2]!];
          if (encoding === 'rgba8') data.set([r, g, b, 17], d);
          else data.set(encoding === 'bgr8' ? [b, g, r] : [b, g, r, 17], d);
        }
      }
      const t = await stage.process({ encoding, data, width: W, height: H, stride }, ctx());
      assert.ok(maxAbsDiff(t.pixelValues, ref) <= 1e-5, encoding);
    }
  });

  test('mono8, mono16 and gray/16-bit/RGBA PNGs match their references', async () => {
    const stage = createPreprocessStage({ contract: 'gemma3' });
    const gray = Buffer.alloc(W * H);
    for (let i = 0; i < gray.length; i++) gray[i] = rgb[i * 3]!;
    const mono8 = await stage.process({ encoding: 'mono8', data: gray, width: W, height: H }, ctx());
    assert.ok(maxAbsDiff(mono8.pixelValues, await referenceGemma3(gray, { raw: { width: W, height: H, channels: 1 } })) <= 1e-5, 'mono8');
    // the three planes of a gray image are equal
    const n = 896 * 896;
    assert.deepEqual(mono8.pixelValues.subarray(0, n), mono8.pixelValues.subarray(n, 2 * n));

    const g16 = new Uint16Array(W * H);
    for (let i = 0; i < g16.length; i++) g16[i] = gray[i]! * 257 + (i % 200);
    const mono16 = await stage.process({ encoding: 'mono16', data: new Uint8Array(g16.buffer), width: W, height: H }, ctx());
    assert.ok(maxAbsDiff(mono16.pixelValues, await referenceGemma3(g16, { raw: { width: W, height: H, channels: 1 } })) <= 1e-5, 'mono16');

    const pngs: Record<string, Buffer> = {
      gray8: await sharp(gray, { raw: { width: W, height: H, channels: 1 } })
        .toColourspace('b-w')
        .png()
        .toBuffer(),
      gray16: await sharp(g16, { raw: { width: W, height: H, channels: 1 } })
        .toColourspace('grey16')
        .png()
        .toBuffer(),
      rgba: await sharp(rgb, rawRgb(W, H)).ensureAlpha(1).png().toBuffer(),
    };
    for (const [name, png] of Object.entries(pngs)) {
      const t = await stage.process({ encoding: 'png', data: png }, ctx());
      assert.ok(maxAbsDiff(t.pixelValues, await referenceGemma3(png, {})) <= 1e-5, name);
    }
  });
});

describe('preprocess gemma4', () => {
  test('token budgets: known sizes from the HF rule (and llama.cpp rule where it differs)', () => {
    // Worked by hand from get_aspect_ratio_preserving_size: factor = √(budget·2304 / (W·H)), sides floored to 48.
    const cases: [number, number, number, number, number][] = [
      [1280, 720, 280, 1056, 576], // 22×12 = 264 tokens
      [720, 1280, 280, 576, 1056],
      [640, 640, 280, 768, 768], // 16×16 = 256
      [4000, 300, 280, 2928, 192], // 61×4 = 244
      [1280, 720, 70, 528, 288], // 11×6 = 66
      [1280, 720, 1120, 2112, 1200], // 44×25 = 1100
      [10000, 100, 70, 3360, 48], // height floors to 0 → one row, width capped at 70·48
    ];
    for (const [w, h, budget, tw, th] of cases) {
      const s = gemma4TargetSize(w, h, budget);
      assert.deepEqual([s.width, s.height], [tw, th], `${w}×${h} @${budget}`);
      assert.equal(s.tokens, (tw / 48) * (th / 48));
      assert.ok(s.tokens <= budget);
    }
    // llama.cpp keeps small images near their size (round to 48) instead of filling the budget.
    assert.deepEqual(gemma4TargetSize(640, 640, 1120, 'llama.cpp'), { width: 624, height: 624, cols: 39, rows: 39, tokens: 169 });
    assert.deepEqual(gemma4TargetSize(1280, 720, 280, 'llama.cpp'), gemma4TargetSize(1280, 720, 280, 'hf'));
    assert.equal(gemma4TargetSize(320, 240, 280, 'llama.cpp').tokens, 80); // grown to ≥ 70 tokens
  });

  test('budget invariants over many aspect ratios', () => {
    for (const budget of GEMMA4_TOKEN_BUDGETS) {
      for (const [w, h] of [
        [1280, 720],
        [720, 1280],
        [640, 640],
        [4000, 300],
        [300, 4000],
        [1920, 1080],
        [97, 1013],
        [3000, 2000],
      ] as const) {
        const s = gemma4TargetSize(w, h, budget);
        assert.ok(s.width % 48 === 0 && s.height % 48 === 0, `${w}×${h}@${budget}: ${s.width}×${s.height}`);
        assert.ok(s.tokens <= budget && s.tokens >= 1, `${w}×${h}@${budget}: ${s.tokens} tokens`);
        // within one 48-px step of the budget-filling size on each side → aspect is preserved
        const f = Math.sqrt((budget * 2304) / (w * h));
        assert.ok(s.width <= f * w + 1e-9 || s.height === 48 || s.width === 48);
        assert.ok(f * w - s.width < 48 || s.height === 48, `${w}×${h}@${budget} width ${s.width} vs ideal ${f * w}`);
      }
    }
  });

  test('clampImageTokens picks the largest allowed budget ≤ n', () => {
    assert.equal(clampImageTokens(280), 280);
    assert.equal(clampImageTokens(300), 280);
    assert.equal(clampImageTokens(1000), 560);
    assert.equal(clampImageTokens(5000), 1120);
    assert.equal(clampImageTokens(10), 70);
    assert.throws(() => clampImageTokens(Number.NaN), /finite/);
  });

  test('patch layout (16×16 HWC, row-major), position ids and padding match a naive reference', async () => {
    const W = 400;
    const H = 300;
    const rgb = scene(W, H);
    const stage = createPreprocessStage({ contract: 'gemma4' });
    const t = await stage.process({ encoding: 'rgb8', data: rgb, width: W, height: H }, ctx(70));
    const size = gemma4TargetSize(W, H, 70);
    assert.equal(t.imageTokens, size.tokens);
    assert.deepEqual(t.pixelDims, [1, 70 * 9, 768]);
    assert.deepEqual(t.positionDims, [1, 70 * 9, 2]);
    const { data } = await sharp(rgb, rawRgb(W, H))
      .resize(size.width, size.height, { fit: 'fill', kernel: 'cubic' })
      .raw()
      .toBuffer({ resolveWithObject: true });
    const nPatches = size.cols * size.rows;
    let maxDiff = 0;
    for (let p = 0; p < 70 * 9; p++) {
      const col = p % size.cols;
      const row = Math.floor(p / size.cols);
      const valid = p < nPatches;
      assert.equal(t.positionIds![2 * p], valid ? BigInt(col) : -1n, `patch ${p} col`);
      assert.equal(t.positionIds![2 * p + 1], valid ? BigInt(row) : -1n, `patch ${p} row`);
      for (let py = 0; py < 16; py++) {
        for (let px = 0; px < 16; px++) {
          for (let c = 0; c < 3; c++) {
            const expected = valid ? data[((row * 16 + py) * size.width + col * 16 + px) * 3 + c]! / 255 : 0;
            maxDiff = Math.max(maxDiff, Math.abs(t.pixelValues[p * 768 + (py * 16 + px) * 3 + c]! - expected));
          }
        }
      }
    }
    assert.ok(maxDiff <= 1e-5, `max diff ${maxDiff}`);
  });

  test('the ladder knob sets the budget: patch counts follow ctx.knobs.imageTokens for several aspect ratios', async () => {
    const stage = createPreprocessStage({ contract: 'gemma4' });
    const validPatches = (t: PixelTensor): number => {
      let n = 0;
      for (let p = 0; p < t.pixelDims[1]!; p++) if (t.positionIds![2 * p]! >= 0n) n++;
      return n;
    };
    for (const [w, h] of [
      [1280, 720],
      [720, 1280],
      [640, 640],
      [4000, 300],
    ] as const) {
      const frame: CameraFrame = { encoding: 'mono8', data: new Uint8Array(w * h).fill(90), width: w, height: h };
      for (const [knob, budget] of [
        [70, 70],
        [300, 280],
        [1120, 1120],
      ] as const) {
        const t = await stage.process(frame, ctx(knob));
        const s = gemma4TargetSize(w, h, budget);
        assert.equal(t.pixelDims[1], budget * 9, `${w}×${h} knob ${knob}: padded length`);
        assert.equal(validPatches(t), s.cols * s.rows, `${w}×${h} knob ${knob}: valid patches`);
        assert.equal(t.imageTokens, s.tokens);
      }
    }
    // a fixed budget in the config overrides the knob
    const fixed = createPreprocessStage({ contract: 'gemma4', imageTokens: 140 });
    const t = await fixed.process({ encoding: 'mono8', data: new Uint8Array(640 * 480), width: 640, height: 480 }, ctx(1120));
    assert.equal(t.pixelDims[1], 140 * 9);
  });
});

describe('preprocess rejects bad frames, one at a time', () => {
  test('each bad frame throws an error naming the problem, and the stage keeps working', async () => {
    const W = 64;
    const H = 48;
    const rgb = scene(W, H);
    const jpeg = await sharp(rgb, rawRgb(W, H)).jpeg().toBuffer();
    const png = await sharp(rgb, rawRgb(W, H)).png().toBuffer();
    const stage = createPreprocessStage({ contract: 'gemma3', maxPixels: 100_000 });
    const bad: [string, CameraFrame, RegExp][] = [
      ['truncated jpeg', { encoding: 'jpeg', data: jpeg.subarray(0, jpeg.length >> 1) }, /jpeg frame: .*(decode|premature|truncated)/i],
      ['garbage jpeg', { encoding: 'jpeg', data: new Uint8Array([0xff, 0xd8, 0xff, 1, 2, 3, 4]) }, /jpeg frame: cannot read header/],
      ['empty jpeg', { encoding: 'jpeg', data: new Uint8Array(0) }, /jpeg frame: empty data/],
      ['png declared as jpeg', { encoding: 'jpeg', data: png }, /jpeg frame: data is png, not jpeg/],
      ['zero width raw', { encoding: 'rgb8', data: new Uint8Array(10), width: 0, height: 4 }, /rgb8 frame: bad size 0×4/],
      ['missing size raw', { encoding: 'rgb8', data: new Uint8Array(10) }, /rgb8 frame: width and height are required/],
      [
        'stride too small',
        { encoding: 'rgb8', data: rgb, width: W, height: H, stride: W * 3 - 1 },
        /stride 191 is smaller than width × 3 = 192/,
      ],
      [
        'short raw data',
        { encoding: 'rgba8', data: new Uint8Array(W * 4 * H - 1), width: W, height: H },
        /rgba8 frame: 12287 bytes, need 12288/,
      ],
      [
        'unsupported encoding',
        { encoding: 'yuv422' as never, data: new Uint8Array(10), width: 2, height: 2 },
        /yuv422 frame: unsupported encoding/,
      ],
      [
        'too many pixels raw',
        { encoding: 'mono8', data: new Uint8Array(400 * 400), width: 400, height: 400 },
        /160000 pixels exceeds maxPixels 100000/,
      ],
    ];
    const bigJpeg = await sharp({ create: { width: 500, height: 400, channels: 3, background: '#808080' } })
      .jpeg()
      .toBuffer();
    bad.push([
      'too many pixels jpeg (header only)',
      { encoding: 'jpeg', data: bigJpeg },
      /jpeg frame: 500×400 = 200000 pixels exceeds maxPixels 100000/,
    ]);
    for (const [name, frame, pattern] of bad) {
      await assert.rejects(stage.process(frame, ctx()), pattern, name);
      const ok = await stage.process({ encoding: 'jpeg', data: jpeg }, ctx());
      assert.equal(ok.pixelValues.length, 3 * 896 * 896, `works again after: ${name}`);
    }
  });

  test('config is validated at creation', () => {
    assert.throws(() => createPreprocessStage({ contract: 'gemma5' as never }), /contract must be 'gemma3' or 'gemma4'/);
    assert.throws(() => createPreprocessStage({ contract: 'gemma3', maxPixels: 0 }), /maxPixels must be a positive integer/);
    assert.throws(() => createPreprocessStage({ contract: 'gemma3', kernel: 'box' as never }), /kernel must be one of/);
    assert.throws(() => createPreprocessStage({ contract: 'gemma4', gemma4Sizing: 'pil' as never }), /gemma4Sizing/);
  });
});
