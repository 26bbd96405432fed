import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import sharp, { type SharpOptions } from 'sharp';
import { clampImageTokens, createPreprocessStage, gemma4TargetSize, GEMMA4_TOKEN_BUDGETS } from '../../nodes/preprocess.ts';
import { layoutPixels } from '../../native/pixels.ts';
import type { CameraFrame, PixelTensor } from '../../nodes/payloads.ts';
import type { StageContext } from '../../pipeline/types.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';
import { PREPROCESS_DEFAULTS } from '../support/fixtures.ts';

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

/** PIL's resample filters, written out plainly (triangle; Catmull-Rom with a = −0.5). */
function pilFilter(kernel: 'linear' | 'cubic', x: number): number {
  x = Math.abs(x);
  if (kernel === 'linear') return x < 1 ? 1 - x : 0;
  const a = -0.5;
  return x < 1 ? ((a + 2) * x - (a + 3)) * x * x + 1 : x < 2 ? (((x - 5) * x + 8) * x - 4) * a : 0;
}

/** Naive vertical enlargement as PIL's vertical pass does it (weights normalized to sum 1), one output
 * byte at a time. */
function naiveEnlargeRows(src: Uint8Array, rowBytes: number, inRows: number, outRows: number, kernel: 'linear' | 'cubic'): Uint8Array {
  const support = kernel === 'linear' ? 1 : 2;
  const out = new Uint8Array(rowBytes * outRows);
  for (let y = 0; y < outRows; y++) {
    const centre = (y + 0.5) * (inRows / outRows); // PIL: center = (xx + 0.5) * scale
    const lo = Math.max(0, Math.trunc(centre - support + 0.5));
    const hi = Math.min(inRows, Math.trunc(centre + support + 0.5));
    let sum = 0;
    for (let i = lo; i < hi; i++) sum += pilFilter(kernel, i - centre + 0.5);
    for (let j = 0; j < rowBytes; j++) {
      let v = 0;
      for (let i = lo; i < hi; i++) v += (pilFilter(kernel, i - centre + 0.5) / sum) * src[i * rowBytes + j]!;
      out[y * rowBytes + j] = Math.min(255, Math.max(0, Math.floor(v + 0.5)));
    }
  }
  return out;
}

/** The plain reference resize: sharp for everything that shrinks, with the same options as the stage;
 * rows that grow are enlarged by the naive loop above. Returns interleaved 8-bit pixels. */
async function referencePixels(
  input: Buffer | Uint16Array,
  opts: SharpOptions,
  width: number,
  height: number,
  kernel: 'linear' | 'cubic',
): Promise<{ data: Uint8Array; channels: number }> {
  const meta = await sharp(input, opts).metadata();
  const srcHeight = opts.autoOrient ? meta.autoOrient.height : meta.height;
  const vipsHeight = Math.min(height, srcHeight);
  const { data, info } = await sharp(input, opts)
    .resize(width, vipsHeight, { fit: 'fill', kernel })
    .removeAlpha()
    .raw()
    .toBuffer({ resolveWithObject: true });
  return {
    data: vipsHeight === height ? data : naiveEnlargeRows(data, width * info.channels, vipsHeight, height, kernel),
    channels: info.channels,
  };
}

/** Gemma 3 reference: referencePixels, then a naive loop normalizes into CHW. */
async function referenceGemma3(input: Buffer | Uint16Array, opts: SharpOptions, size = 896): Promise<Float32Array> {
  const { data, channels } = await referencePixels(input, opts, size, size, 'linear');
  return naiveChw(data, channels, size, size);
}

function naiveChw(data: Uint8Array, channels: number, width: number, height: number): Float32Array {
  const out = new Float32Array(3 * width * height);
  for (let c = 0; c < 3; c++) {
    for (let y = 0; y < height; y++) {
      for (let x = 0; x < width; x++) {
        const v = data[(y * width + x) * channels + (channels >= 3 ? c : 0)]!;
        out[c * width * height + y * width + x] = (v / 255 - 0.5) / 0.5;
      }
    }
  }
  return out;
}

/** Gemma 4 reference: 16×16 HWC patches, row-major, from interleaved pixels (naive indexing). */
function naivePatches(data: Uint8Array, channels: number, width: number, height: number, capacity: number): Float32Array {
  const cols = width / 16;
  const out = new Float32Array(capacity * 768);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const p = Math.floor(y / 16) * cols + Math.floor(x / 16);
      for (let c = 0; c < 3; c++)
        out[p * 768 + ((y % 16) * 16 + (x % 16)) * 3 + c] = data[(y * width + x) * channels + (channels >= 3 ? c : 0)]! / 255;
    }
  }
  return out;
}

function meanAbsDiff(a: Float32Array, b: Float32Array): number {
  assert.equal(a.length, b.length, 'lengths differ');
  let sum = 0;
  for (let i = 0; i < a.length; i++) sum += Math.abs(a[i]! - b[i]!);
  return sum / a.length;
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
    const stage = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma3' });
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
    const stage = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma3' });
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
    const stage = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma3' });
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
    const stage = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4' });
    const t = await stage.process({ encoding: 'rgb8', data: rgb, width: W, height: H }, ctx(70));
    const size = gemma4TargetSize(W, H, 70);
    assert.equal(t.imageTokens, size.tokens);
    assert.deepEqual(t.pixelDims, [1, 70 * 9, 768]);
    assert.deepEqual(t.positionDims, [1, 70 * 9, 2]);
    // 400×300 → 432×336: both sides grow (libvips widens the rows, the stage adds rows).
    const { data } = await referencePixels(rgb, rawRgb(W, H), size.width, size.height, 'cubic');
    const nPatches = size.cols * size.rows;
    for (let p = 0; p < 70 * 9; p++) {
      const valid = p < nPatches;
      assert.equal(t.positionIds![2 * p], valid ? BigInt(p % size.cols) : -1n, `patch ${p} col`);
      assert.equal(t.positionIds![2 * p + 1], valid ? BigInt(Math.floor(p / size.cols)) : -1n, `patch ${p} row`);
    }
    const maxDiff = maxAbsDiff(t.pixelValues, naivePatches(data, 3, size.width, size.height, 70 * 9));
    assert.ok(maxDiff <= 1e-5, `max diff ${maxDiff}`);
  });

  test('the ladder knob sets the budget: patch counts follow ctx.knobs.imageTokens for several aspect ratios', async () => {
    const stage = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4' });
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
    const fixed = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4', imageTokens: 140 });
    const t = await fixed.process({ encoding: 'mono8', data: new Uint8Array(640 * 480), width: 640, height: 480 }, ctx(1120));
    assert.equal(t.pixelDims[1], 140 * 9);
  });
});

describe('preprocess speed paths keep the output exact', () => {
  test('EXIF orientations 1–8: the layout pass orients as libvips autoOrient does (JPEG and PNG, no resize)', async () => {
    // Stored 1056×576 (orientations 1–4) or 576×1056 (5–8): displayed 1056×576, which is exactly the
    // 280-token target, so no resize happens and the comparison is exact.
    const stage = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4' });
    const wide = scene(1056, 576);
    const tall = scene(576, 1056);
    for (let orientation = 1; orientation <= 8; orientation++) {
      const [data, w, h] = orientation >= 5 ? [tall, 576, 1056] : [wide, 1056, 576];
      const encoded = {
        jpeg: await sharp(data, rawRgb(w, h)).jpeg({ quality: 90 }).withMetadata({ orientation }).toBuffer(),
        png:
          orientation % 3 === 0
            ? await sharp(data, rawRgb(w, h)).png({ compressionLevel: 1 }).withMetadata({ orientation }).toBuffer()
            : undefined,
      };
      for (const [encoding, bytes] of Object.entries(encoded) as ['jpeg' | 'png', Buffer | undefined][]) {
        if (!bytes) continue;
        const t = await stage.process({ encoding, data: bytes }, ctx(280));
        assert.equal(t.imageTokens, 264, `${encoding} orientation ${orientation}`);
        const upright = await sharp(bytes, { autoOrient: true }).raw().toBuffer({ resolveWithObject: true });
        assert.deepEqual([upright.info.width, upright.info.height], [1056, 576]);
        const diff = maxAbsDiff(t.pixelValues, naivePatches(upright.data, 3, 1056, 576, 280 * 9));
        assert.ok(diff <= 1e-5, `${encoding} orientation ${orientation}: max diff ${diff}`);
      }
    }
  });

  test('EXIF rotation with a resize: the target follows the displayed shape; values within one 8-bit level of rotate-then-resize', async () => {
    // Stored 1920×1080 shown rotated (orientation 6) as 1080×1920. The stage resizes in the stored
    // orientation and rotates while laying out; libvips autoOrient rotates first. Both reduce in two
    // 8-bit passes (rows, then columns), so the two orders differ by one level at most.
    const jpeg = await sharp(scene(1920, 1080), rawRgb(1920, 1080)).jpeg({ quality: 90 }).withMetadata({ orientation: 6 }).toBuffer();
    const t = await createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4' }).process(
      { encoding: 'jpeg', data: jpeg },
      ctx(280),
    );
    const size = gemma4TargetSize(1080, 1920, 280);
    assert.deepEqual([size.width, size.height], [576, 1056]);
    assert.equal(t.imageTokens, size.tokens);
    const upright = await referencePixels(jpeg, { autoOrient: true }, size.width, size.height, 'cubic');
    const diff = maxAbsDiff(t.pixelValues, naivePatches(upright.data, 3, size.width, size.height, 280 * 9));
    assert.ok(diff <= 1 / 255 + 1e-5, `gemma4: max diff ${diff}`);
    const g3 = await createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma3' }).process({ encoding: 'jpeg', data: jpeg }, ctx());
    const square = await referencePixels(jpeg, { autoOrient: true }, 896, 896, 'linear');
    const diff3 = maxAbsDiff(g3.pixelValues, naiveChw(square.data, 3, 896, 896));
    assert.ok(diff3 <= 2 / 255 + 1e-5, `gemma3: max diff ${diff3}`);
  });

  test('JPEG shrink-on-load: a large frame is decoded at reduced scale (equal to sharp with the same shrink, close to a full decode)', async () => {
    // 2880×1620 → 70 tokens (528×288) is a 5.5× shrink: libjpeg decodes at 1/4 scale (DCT scaling), then
    // libvips resizes. The full-decode reference resizes the full-size pixels instead: a different
    // low-pass filter, so the two differ a little on fine detail and nowhere by much.
    const jpeg = await sharp(scene(2880, 1620), rawRgb(2880, 1620)).jpeg({ quality: 90 }).toBuffer();
    const t = await createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4' }).process(
      { encoding: 'jpeg', data: jpeg },
      ctx(70),
    );
    const size = gemma4TargetSize(2880, 1620, 70);
    assert.deepEqual([size.width, size.height], [528, 288]);
    const sameShrink = await referencePixels(jpeg, {}, 528, 288, 'cubic');
    assert.ok(
      maxAbsDiff(t.pixelValues, naivePatches(sameShrink.data, 3, 528, 288, 70 * 9)) <= 1e-5,
      'differs from sharp with shrink-on-load',
    );
    const full = await sharp(jpeg).raw().toBuffer();
    const fromFull = await sharp(full, rawRgb(2880, 1620)).resize(528, 288, { fit: 'fill', kernel: 'cubic' }).raw().toBuffer();
    const reference = naivePatches(fromFull, 3, 528, 288, 70 * 9);
    const max = maxAbsDiff(t.pixelValues, reference);
    const mean = meanAbsDiff(t.pixelValues, reference);
    assert.ok(max > 1e-3, 'identical to a full decode: shrink-on-load was not used');
    assert.ok(mean < 0.02 && max < 0.35, `DCT-scaled decode too far from the full decode: mean ${mean}, max ${max}`);
  });

  test("rows that grow are enlarged on PIL's sample grid (HF's processors resize with PIL)", async () => {
    // A ramp of 20 per row, 10 → 25 rows: output row y samples source row (y + 0.5)·0.4 − 0.5, so
    // rows are 20·(0.4·y − 0.3) where every tap is inside the image; the edges clamp. (libvips's own
    // enlargement samples y·0.4 − 0.5, half an output row off this grid.)
    const enlarged = async (
      src: Uint8Array,
      width: number,
      height: number,
      rows: number,
      kernel: 'linear' | 'cubic',
    ): Promise<Uint8Array> => {
      const out = new Float32Array(3 * width * rows);
      await layoutPixels(src, out, { width, height, channels: 1, rows, kernel, layout: 'chw' });
      return Uint8Array.from(out.subarray(0, width * rows), (v) => Math.round(v * 255));
    };
    const src = new Uint8Array(10 * 2);
    for (let y = 0; y < 10; y++) src.fill(y * 20, y * 2, y * 2 + 2);
    for (const kernel of ['linear', 'cubic'] as const) {
      const out = await enlarged(src, 2, 10, 25, kernel);
      // Interior rows (all taps inside the image) reproduce the ramp exactly with either filter.
      const [from, to] = kernel === 'linear' ? [2, 22] : [4, 21];
      for (let y = from; y < to; y++) assert.equal(out[2 * y], Math.round(20 * (0.4 * y - 0.3)), `${kernel} row ${y}`);
      if (kernel === 'linear') assert.deepEqual([out[0], out[48]], [0, 180], 'edge rows are the edge source rows');
      assert.deepEqual(out, naiveEnlargeRows(src, 2, 10, 25, kernel));
    }
    // Cubic overshoot at a step is clamped to 0…255, not wrapped.
    const step = Uint8Array.of(0, 0, 255, 255);
    const up = await enlarged(step, 1, 4, 9, 'cubic');
    assert.deepEqual(up, naiveEnlargeRows(step, 1, 4, 9, 'cubic'));
    assert.ok(up.includes(0) && up.includes(255) && up.every((v, i) => i === 0 || v >= up[i - 1]!), `not monotone: ${up}`);
  });

  test('enlargement is byte-exact for random pixels at many ratios, in every orientation and channel order', async () => {
    // The layout pass enlarges row by row as it lays out (orientations 1–4), or the whole image first
    // (5–8, which read stored columns as rows), and blends bilinear runs in float, falling back to
    // double near a rounding boundary: every path must give the naive double-precision bytes.
    let seed = 99;
    const random = (): number => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) >>> 24) & 255;
    const chw = async (
      src: Uint8Array,
      w: number,
      h: number,
      rows: number,
      kernel: 'linear' | 'cubic',
      orientation: number,
      bgr: boolean,
    ) => {
      const out = new Float32Array(3 * w * rows);
      await layoutPixels(src, out, { width: w, height: h, channels: 3, rows, kernel, orientation, bgr, layout: 'chw' });
      return out;
    };
    for (const [w, h, rows] of [
      [37, 11, 29],
      [64, 180, 896],
      [5, 720, 896],
      [16, 8, 16],
      [9, 3, 1000],
    ] as const) {
      const src = Uint8Array.from({ length: w * h * 3 }, random);
      for (const kernel of ['linear', 'cubic'] as const) {
        const enlarged = naiveEnlargeRows(src, w * 3, h, rows, kernel);
        for (let orientation = 1; orientation <= 8; orientation++) {
          const bgr = orientation % 2 === 0;
          const got = await chw(src, w, h, rows, kernel, orientation, bgr);
          const want = await chw(enlarged, w, rows, rows, kernel, orientation, bgr);
          assert.equal(maxAbsDiff(got, want), 0, `${w}×${h} → ${rows} rows, ${kernel}, orientation ${orientation}`);
        }
      }
    }
  });

  test('the layout pass refuses what does not fit, with the reason', async () => {
    const src = new Uint8Array(32 * 32 * 3);
    await assert.rejects(
      layoutPixels(src, new Float32Array(10), { width: 32, height: 32, channels: 3, layout: 'patches' }),
      /out has 10 values, need at least 3072/,
    );
    await assert.rejects(
      layoutPixels(src, new Float32Array(3 * 30 * 32), { width: 30, height: 32, channels: 3, layout: 'patches' }),
      /30x32 is not a multiple of the patch size 16/,
    );
    await assert.rejects(
      layoutPixels(src.subarray(1), new Float32Array(3 * 32 * 32), { width: 32, height: 32, channels: 3, layout: 'chw' }),
      /src has 3071 bytes, need 3072/,
    );
    await assert.rejects(
      layoutPixels(src, new Float32Array(3 * 32 * 32), { width: 32, height: 32, channels: 3, rows: 20, layout: 'chw' }),
      /rows/,
    );
  });

  test('raw frames of the target size skip sharp: padded rgb8/bgr8/rgba8/mono8 rows read in place', async () => {
    const W = 1056;
    const H = 576;
    const rgb = scene(W, H);
    const stage = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4' });
    const expected = naivePatches(rgb, 3, W, H, 280 * 9);
    for (const [encoding, bpp] of [
      ['rgb8', 3],
      ['bgr8', 3],
      ['rgba8', 4],
      ['mono8', 1],
    ] as const) {
      const stride = W * bpp + 5;
      const data = new Uint8Array(stride * H).fill(0xee);
      for (let y = 0; y < H; y++) {
        for (let x = 0; x < W; x++) {
          const s = (y * W + x) * 3;
          const d = y * stride + x * bpp;
          if (bpp === 1) data[d] = rgb[s]!;
          else if (encoding === 'bgr8') data.set([rgb[s + 2]!, rgb[s + 1]!, rgb[s]!], d);
          else data.set([rgb[s]!, rgb[s + 1]!, rgb[s + 2]!, 9].slice(0, bpp), d);
        }
      }
      const t = await stage.process({ encoding, data, width: W, height: H, stride }, ctx(280));
      const want =
        bpp === 1 ? naivePatches(Buffer.from(Array.from({ length: W * H * 3 }, (_, i) => rgb[i - (i % 3)]!)), 3, W, H, 280 * 9) : expected;
      assert.ok(maxAbsDiff(t.pixelValues, want) <= 1e-5, encoding);
    }
  });

  test('pixel_values arrays are reused once recycled; a reused array is fully rewritten (padding zeroed)', async () => {
    const stage = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4' });
    const frame: CameraFrame = { encoding: 'rgb8', data: scene(400, 300), width: 400, height: 300 };
    const first = await stage.process(frame, ctx(280));
    const expected = first.pixelValues.slice();
    first.pixelValues.fill(Number.NaN); // what a consumer may leave behind
    first.recycle!(first.pixelValues);
    first.recycle!(first.pixelValues); // a second hand-back of the same array is ignored
    const second = await stage.process(frame, ctx(280));
    assert.equal(second.pixelValues.buffer, first.pixelValues.buffer, 'the recycled array was not reused');
    assert.deepEqual(second.pixelValues, expected);
    const third = await stage.process(frame, ctx(280)); // second is still out: a new array
    assert.notEqual(third.pixelValues.buffer, second.pixelValues.buffer);
    assert.equal(stage.allocatedArrays(), 2);
    // arrays of another size (the ladder moved) or detached ones are not taken back
    second.recycle!(new Float32Array(10));
    const detached = third.pixelValues;
    structuredClone(detached.buffer, { transfer: [detached.buffer as ArrayBuffer] });
    third.recycle!(detached);
    const fourth = await stage.process(frame, ctx(140));
    assert.equal(fourth.pixelDims[1], 140 * 9);
    assert.equal(stage.allocatedArrays(), 3);
  });

  test("pixel_values arrays come from the encoder's allocator where it gives one (pinned memory), else are ordinary", async () => {
    const frame: CameraFrame = { encoding: 'rgb8', data: scene(400, 300), width: 400, height: 300 };
    const reference = await createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4' }).process(frame, ctx(280));
    const given: Float32Array[] = [];
    const asked: number[] = [];
    const allocate = (length: number): Float32Array => {
      asked.push(length);
      const array = new Float32Array(length).fill(Number.NaN); // memory with old contents
      given.push(array);
      return array;
    };
    const stage = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4', allocate });
    const first = await stage.process(frame, ctx(280));
    assert.equal(first.pixelValues, given[0], "the allocator's array carries the pixels");
    assert.deepEqual(first.pixelValues, reference.pixelValues, 'fully written, padding zeroed');
    first.recycle!(first.pixelValues);
    const second = await stage.process(frame, ctx(280));
    assert.equal(second.pixelValues, given[0], 'recycled, not allocated again');
    assert.deepEqual(asked, [280 * 9 * 768]);
    // No memory of its own (a CPU encoder): an ordinary array.
    const none = await createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4', allocate: () => undefined }).process(
      frame,
      ctx(280),
    );
    assert.deepEqual(none.pixelValues, reference.pixelValues);
    // An allocator that hands back the wrong thing is refused, naming what it returned.
    const wrong = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4', allocate: () => new Float32Array(3) });
    await assert.rejects(wrong.process(frame, ctx(280)), /the pixel allocator returned .* for 1935360 values/);
    assert.throws(
      () => createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4', allocate: 'pinned' as never }),
      /allocate must be a function, got string/,
    );
  });

  test('libvips threads: from the config (the schema default is 1); the operation cache is off', () => {
    const before = sharp.concurrency();
    try {
      assert.equal(createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma3', threads: 2 }).threads, 2);
      assert.equal(sharp.concurrency(), 2);
      const cache = sharp.cache();
      assert.deepEqual([cache.memory.max, cache.files.max, cache.items.max], [0, 0, 0]);
      assert.equal(createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4' }).threads, 1);
      assert.equal(sharp.concurrency(), 1);
      assert.throws(
        () => createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma3', threads: 0 }),
        /threads must be an integer in 1..1024, got 0/,
      );
    } finally {
      sharp.concurrency(before);
    }
  });
});

describe('preprocess rejects bad frames, one at a time', () => {
  test('each bad frame throws an error naming the problem, and the stage keeps working', async () => {
    const W = 64;
    const H = 48;
    const rgb = scene(W, H);
    const jpeg = await sharp(rgb, rawRgb(W, H)).jpeg().toBuffer();
    const png = await sharp(rgb, rawRgb(W, H)).png().toBuffer();
    const stage = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma3', maxPixels: 100_000 });
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
    assert.throws(
      () => createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma5' as never }),
      /contract must be 'gemma3' or 'gemma4'/,
    );
    assert.throws(
      () => createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma3', maxPixels: 0 }),
      /maxPixels must be a positive integer/,
    );
    assert.throws(
      () => createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma3', kernel: 'box' as never }),
      /kernel must be one of/,
    );
    assert.throws(
      () => createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4', gemma4Sizing: 'pil' as never }),
      /gemma4Sizing/,
    );
  });
});
