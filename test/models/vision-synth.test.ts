import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import ort from 'onnxruntime-node';
import {
  listVisionPresets,
  synthesizeVision,
  visionPreset,
  visionWeights,
  type Gemma4VisionSpec,
  type SiglipSpec,
} from '../../models/vision-synth.ts';
import { resolveModel } from '../../models/resolve.ts';

const dir = join(import.meta.dirname, '../..', '.cache', 'test-vision-synth');
rmSync(dir, { recursive: true, force: true });
mkdirSync(dir, { recursive: true });

// ---------------------------------------------------------------- a plain JS reference forward pass

type Mat = Float64Array; // row-major [rows, cols]

function matmul(x: Mat, rows: number, inner: number, w: Float32Array, cols: number): Mat {
  const out = new Float64Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    for (let k = 0; k < inner; k++) {
      const v = x[r * inner + k]!;
      for (let c = 0; c < cols; c++) out[r * cols + c]! += v * w[k * cols + c]!;
    }
  }
  return out;
}
const addBias = (x: Mat, b: Float32Array): Mat => x.map((v, i) => v + b[i % b.length]!);
function rms(x: Mat, width: number, weight: Float32Array | undefined, eps: number): Mat {
  const out = new Float64Array(x.length);
  for (let r = 0; r < x.length / width; r++) {
    let s = 0;
    for (let i = 0; i < width; i++) s += x[r * width + i]! ** 2;
    const inv = 1 / Math.sqrt(s / width + eps);
    for (let i = 0; i < width; i++) out[r * width + i] = x[r * width + i]! * inv * (weight ? weight[i]! : 1);
  }
  return out;
}
function layerNorm(x: Mat, width: number, g: Float32Array, b: Float32Array, eps: number): Mat {
  const out = new Float64Array(x.length);
  for (let r = 0; r < x.length / width; r++) {
    let mean = 0;
    for (let i = 0; i < width; i++) mean += x[r * width + i]!;
    mean /= width;
    let v = 0;
    for (let i = 0; i < width; i++) v += (x[r * width + i]! - mean) ** 2;
    const inv = 1 / Math.sqrt(v / width + eps);
    for (let i = 0; i < width; i++) out[r * width + i] = (x[r * width + i]! - mean) * inv * g[i]! + b[i]!;
  }
  return out;
}
const gelu = (x: number): number => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));
/** Softmax attention per head; q/k/v [n, heads·hd] head-major inside each row. */
function attention(q: Mat, k: Mat, v: Mat, n: number, heads: number, hd: number, scale: number): Mat {
  const h = heads * hd;
  const out = new Float64Array(n * h);
  const scores = new Float64Array(n);
  const acc = new Float64Array(hd);
  const headOf = (m: Mat, o: number): Float64Array => {
    const t = new Float64Array(n * hd);
    for (let i = 0; i < n; i++) for (let d = 0; d < hd; d++) t[i * hd + d] = m[i * h + o + d]!;
    return t;
  };
  for (let head = 0; head < heads; head++) {
    const o = head * hd;
    const [qh, kh, vh] = [headOf(q, o), headOf(k, o), headOf(v, o)];
    for (let i = 0; i < n; i++) {
      let max = -Infinity;
      for (let j = 0; j < n; j++) {
        let s = 0;
        for (let d = 0, a = i * hd, b = j * hd; d < hd; d++) s += qh[a + d]! * kh[b + d]!;
        s *= scale;
        scores[j] = s;
        if (s > max) max = s;
      }
      let sum = 0;
      acc.fill(0);
      for (let j = 0; j < n; j++) {
        const p = Math.exp(scores[j]! - max);
        sum += p;
        for (let d = 0, b = j * hd; d < hd; d++) acc[d]! += p * vh[b + d]!;
      }
      for (let d = 0; d < hd; d++) out[i * h + o + d] = acc[d]! / sum;
    }
  }
  return out;
}

function siglipReference(spec: SiglipSpec, W: Map<string, Float32Array>, pixels: Float32Array): Float64Array {
  const { hidden: h, patchSize: p, imageSize: S } = spec;
  const g = S / p;
  const n = g * g;
  const cw = W.get('patch_embed.weight')!;
  let x: Mat = new Float64Array(n * h);
  for (let gy = 0; gy < g; gy++) {
    for (let gx = 0; gx < g; gx++) {
      const t = gy * g + gx;
      for (let o = 0; o < h; o++) {
        let s = W.get('patch_embed.bias')![o]! + W.get('pos_embed')![t * h + o]!;
        for (let c = 0; c < 3; c++) {
          for (let ky = 0; ky < p; ky++) {
            for (let kx = 0; kx < p; kx++) s += cw[((o * 3 + c) * p + ky) * p + kx]! * pixels[c * S * S + (gy * p + ky) * S + gx * p + kx]!;
          }
        }
        x[t * h + o] = s;
      }
    }
  }
  const hd = h / spec.heads;
  for (let i = 0; i < spec.layers; i++) {
    const l = `layers.${i}`;
    const lin = (inp: Mat, name: string, fi: number, fo: number) =>
      addBias(matmul(inp, n, fi, W.get(`${name}.weight`)!, fo), W.get(`${name}.bias`)!);
    const n1 = layerNorm(x, h, W.get(`${l}.ln1.weight`)!, W.get(`${l}.ln1.bias`)!, spec.eps);
    const a = attention(
      lin(n1, `${l}.attn.q`, h, h),
      lin(n1, `${l}.attn.k`, h, h),
      lin(n1, `${l}.attn.v`, h, h),
      n,
      spec.heads,
      hd,
      1 / Math.sqrt(hd),
    );
    const o = lin(a, `${l}.attn.o`, h, h);
    x = x.map((v, j) => v + o[j]!);
    const n2 = layerNorm(x, h, W.get(`${l}.ln2.weight`)!, W.get(`${l}.ln2.bias`)!, spec.eps);
    const f = lin(lin(n2, `${l}.mlp.fc1`, h, spec.ffn).map(gelu), `${l}.mlp.fc2`, spec.ffn, h);
    x = x.map((v, j) => v + f[j]!);
  }
  x = layerNorm(x, h, W.get('post_ln.weight')!, W.get('post_ln.bias')!, spec.eps);
  const k = spec.poolKernel;
  const go = g / k;
  const pooled = new Float64Array(go * go * h);
  for (let gy = 0; gy < g; gy++)
    for (let gx = 0; gx < g; gx++)
      for (let c = 0; c < h; c++) pooled[(Math.floor(gy / k) * go + Math.floor(gx / k)) * h + c]! += x[(gy * g + gx) * h + c]! / (k * k);
  return matmul(
    rms(pooled, h, W.get('mm.soft_emb_norm.weight')!, spec.eps),
    go * go,
    h,
    W.get('mm.input_projection.weight')!,
    spec.outHidden,
  );
}

function gemma4Reference(
  spec: Gemma4VisionSpec,
  W: Map<string, Float32Array>,
  patches: Float32Array,
  cols: number,
  rows: number,
): Float64Array {
  const h = spec.hidden;
  const n = cols * rows;
  const hd = h / spec.heads;
  const scaled = new Float64Array(n * 768);
  for (let i = 0; i < n * 768; i++) scaled[i] = patches[i]! * 2 - 1;
  let x = matmul(scaled, n, 768, W.get('patch_embed.input_proj.weight')!, h);
  const tx = W.get('patch_embed.pos_table_x')!;
  const ty = W.get('patch_embed.pos_table_y')!;
  for (let p = 0; p < n; p++) for (let c = 0; c < h; c++) x[p * h + c]! += tx[(p % cols) * h + c]! + ty[Math.floor(p / cols) * h + c]!;
  const q4 = hd / 4;
  const rope = (t: Mat): Mat => {
    const out = Float64Array.from(t);
    for (let p = 0; p < n; p++) {
      for (let head = 0; head < spec.heads; head++) {
        for (let half = 0; half < 2; half++) {
          const pos = half === 0 ? p % cols : Math.floor(p / cols);
          const base = p * h + head * hd + half * (hd / 2);
          for (let i = 0; i < q4; i++) {
            const th = pos * Math.pow(spec.ropeTheta, (-2 * i) / (hd / 2));
            const a = t[base + i]!;
            const b = t[base + i + q4]!;
            out[base + i] = a * Math.cos(th) - b * Math.sin(th);
            out[base + i + q4] = b * Math.cos(th) + a * Math.sin(th);
          }
        }
      }
    }
    return out;
  };
  for (let i = 0; i < spec.layers; i++) {
    const l = `layers.${i}`;
    const n1 = rms(x, h, W.get(`${l}.input_norm.weight`)!, spec.eps);
    const proj = (m: string) => matmul(n1, n, h, W.get(`${l}.attn.${m}.weight`)!, h);
    const q = rope(rms(proj('q'), hd, W.get(`${l}.attn.q_norm.weight`)!, spec.eps));
    const k = rope(rms(proj('k'), hd, W.get(`${l}.attn.k_norm.weight`)!, spec.eps));
    const v = rms(proj('v'), hd, undefined, spec.eps);
    const a = rms(
      matmul(attention(q, k, v, n, spec.heads, hd, 1), n, h, W.get(`${l}.attn.o.weight`)!, h),
      h,
      W.get(`${l}.post_attention_norm.weight`)!,
      spec.eps,
    );
    x = x.map((val, j) => val + a[j]!);
    const n2 = rms(x, h, W.get(`${l}.pre_ffw_norm.weight`)!, spec.eps);
    const gate = matmul(n2, n, h, W.get(`${l}.mlp.gate.weight`)!, spec.ffn).map(gelu);
    const up = matmul(n2, n, h, W.get(`${l}.mlp.up.weight`)!, spec.ffn);
    const f = rms(
      matmul(
        gate.map((gv, j) => gv * up[j]!),
        n,
        spec.ffn,
        W.get(`${l}.mlp.down.weight`)!,
        h,
      ),
      h,
      W.get(`${l}.post_ffw_norm.weight`)!,
      spec.eps,
    );
    x = x.map((val, j) => val + f[j]!);
  }
  const k = spec.poolKernel;
  const tc = cols / k;
  const T = tc * (rows / k);
  const pooled = new Float64Array(T * h);
  for (let p = 0; p < n; p++) {
    const t = Math.floor(Math.floor(p / cols) / k) * tc + Math.floor((p % cols) / k);
    for (let c = 0; c < h; c++) pooled[t * h + c]! += (x[p * h + c]! / (k * k)) * Math.sqrt(h);
  }
  return matmul(rms(pooled, h, undefined, spec.eps), T, h, W.get('mm.input_projection.weight')!, spec.outHidden);
}

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  assert.equal(a.length, b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

function rmsOf(a: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i]! ** 2;
  return Math.sqrt(s / a.length);
}

/** Deterministic pseudo-random values in [lo, hi). */
function noise(n: number, seed: number, lo: number, hi: number): Float32Array {
  const out = new Float32Array(n);
  let s = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    out[i] = lo + ((s >>> 0) / 4294967296) * (hi - lo);
  }
  return out;
}

/** Gemma 4 inputs for a cols×rows patch grid padded to `capacity` patches. */
function gemma4Inputs(cols: number, rows: number, capacity: number, padValue = 0): { pv: Float32Array; pos: BigInt64Array } {
  const n = cols * rows;
  const pv = new Float32Array(capacity * 768).fill(padValue);
  pv.set(noise(n * 768, 99, 0, 1));
  const pos = new BigInt64Array(capacity * 2).fill(-1n);
  for (let p = 0; p < n; p++) {
    pos[2 * p] = BigInt(p % cols);
    pos[2 * p + 1] = BigInt(Math.floor(p / cols));
  }
  return { pv, pos };
}

async function runGemma4(path: string, cols: number, rows: number, capacity: number, padValue = 0): Promise<ort.Tensor> {
  const session = await ort.InferenceSession.create(path, { intraOpNumThreads: 1 });
  const { pv, pos } = gemma4Inputs(cols, rows, capacity, padValue);
  const out = await session.run({
    pixel_values: new ort.Tensor('float32', pv, [1, capacity, 768]),
    pixel_position_ids: new ort.Tensor('int64', pos, [1, capacity, 2]),
  });
  await session.release();
  return out.image_features!;
}

// ---------------------------------------------------------------- tests

describe('vision presets', () => {
  test('list the seven presets with their contracts and output widths', () => {
    const presets = listVisionPresets();
    assert.deepEqual(
      presets.map((p) => [p.name, p.contract, p.outHidden]),
      [
        ['siglip-tiny', 'gemma3', 64],
        ['siglip-so400m-896', 'gemma3', 2560],
        ['gemma4-vision-tiny', 'gemma4', 64],
        ['siglip-tiny-h72', 'gemma3', 64],
        ['gemma4-vision-tiny-h40', 'gemma4', 64],
        ['gemma4-vision-e2b', 'gemma4', 1536],
        ['gemma4-vision-e4b', 'gemma4', 2560],
      ],
    );
    // The gemma3-4b-shaped SigLIP + projector is 419.8 M parameters (HF's count for the released vision tower).
    const so400m = presets.find((p) => p.name === 'siglip-so400m-896')!;
    assert.ok(Math.abs(so400m.params / 1e6 - 419.8) < 0.5, `${so400m.params}`);
    assert.throws(() => visionPreset('siglip-huge'), /unknown vision preset 'siglip-huge' \(known: siglip-tiny, /);
  });
});

describe('synthetic encoders match a JS reference forward pass', () => {
  test('siglip-tiny (Gemma 3 contract): image_features [1,256,64] ≈ reference', async () => {
    const out = join(dir, 'siglip-tiny.onnx');
    const info = synthesizeVision({ preset: 'siglip-tiny', out, seed: 3 });
    assert.equal(info.contract, 'gemma3');
    const spec = visionPreset('siglip-tiny').spec as SiglipSpec;
    const pixels = noise(3 * 896 * 896, 5, -1, 1);
    const session = await ort.InferenceSession.create(out, { intraOpNumThreads: 1 });
    const result = (await session.run({ pixel_values: new ort.Tensor('float32', pixels, [1, 3, 896, 896]) })).image_features!;
    await session.release();
    assert.deepEqual(result.dims, [1, 256, 64]);
    const ref = siglipReference(spec, visionWeights(spec, 3), pixels);
    const diff = maxAbsDiff(result.data as Float32Array, ref);
    assert.ok(rmsOf(ref) > 0.1, 'reference output is not degenerate');
    assert.ok(diff < 1e-3, `max |diff| ${diff}`);
    console.log(`siglip-tiny: ORT vs JS reference max |diff| ${diff.toExponential(2)} (output rms ${rmsOf(ref).toFixed(3)})`);
  });

  test('gemma4-vision-tiny: image_features [1,T,64] ≈ reference; padding content is ignored', async () => {
    const out = join(dir, 'gemma4-vision-tiny.onnx');
    synthesizeVision({ preset: 'gemma4-vision-tiny', out, seed: 4 });
    const spec = visionPreset('gemma4-vision-tiny').spec as Gemma4VisionSpec;
    const [cols, rows, capacity] = [12, 9, 140 * 9]; // 4×3 = 12 tokens, padded to a 140-token budget
    const result = await runGemma4(out, cols, rows, capacity);
    assert.deepEqual(result.dims, [1, 12, 64]);
    const { pv } = gemma4Inputs(cols, rows, capacity);
    const ref = gemma4Reference(spec, visionWeights(spec, 4), pv, cols, rows);
    const diff = maxAbsDiff(result.data as Float32Array, ref);
    assert.ok(rmsOf(ref) > 0.1, 'reference output is not degenerate');
    assert.ok(diff < 1e-3, `max |diff| ${diff}`);
    console.log(`gemma4-vision-tiny: ORT vs JS reference max |diff| ${diff.toExponential(2)} (output rms ${rmsOf(ref).toFixed(3)})`);
    const withJunkPadding = await runGemma4(out, cols, rows, capacity, 0.77);
    assert.ok(maxAbsDiff(withJunkPadding.data as Float32Array, result.data as Float32Array) === 0);
    // a non-square grid and another padding length
    const wide = await runGemma4(out, 18, 6, 70 * 9);
    assert.deepEqual(wide.dims, [1, 12, 64]);
    const { pv: pv2 } = gemma4Inputs(18, 6, 70 * 9);
    assert.ok(maxAbsDiff(wide.data as Float32Array, gemma4Reference(spec, visionWeights(spec, 4), pv2, 18, 6)) < 1e-3);
  });
});

describe('files', () => {
  test('same seed → identical bytes; another seed → different weights', () => {
    const a = synthesizeVision({ preset: 'gemma4-vision-tiny', out: join(dir, 'a.onnx'), seed: 11 });
    const b = synthesizeVision({ preset: 'gemma4-vision-tiny', out: join(dir, 'b.onnx'), seed: 11 });
    const c = synthesizeVision({ preset: 'gemma4-vision-tiny', out: join(dir, 'c.onnx'), seed: 12 });
    assert.ok(readFileSync(a.path).equals(readFileSync(b.path)));
    assert.ok(!readFileSync(a.path).equals(readFileSync(c.path)));
    assert.equal(a.params, listVisionPresets().find((p) => p.name === 'gemma4-vision-tiny')!.params);
    assert.throws(
      () => synthesizeVision({ preset: 'gemma4-vision-tiny', out: join(dir, 'd.onnx'), seed: -1 }),
      /seed must be a non-negative integer/,
    );
  });

  test('external weights (.onnx.data) load and compute the same as inline weights', async () => {
    const inline = synthesizeVision({ preset: 'gemma4-vision-tiny', out: join(dir, 'inline.onnx'), seed: 21 });
    const ext = synthesizeVision({ preset: 'gemma4-vision-tiny', out: join(dir, 'ext.onnx'), seed: 21, externalDataThreshold: 0 });
    assert.equal(inline.dataPath, undefined);
    assert.equal(ext.dataPath, join(dir, 'ext.onnx.data'));
    assert.ok(statSync(ext.dataPath!).size > 2_000_000 && statSync(ext.path).size < 100_000);
    const r1 = await runGemma4(inline.path, 6, 6, 70 * 9);
    const r2 = await runGemma4(ext.path, 6, 6, 70 * 9);
    assert.deepEqual(r2.data, r1.data);
  });

  test("resolveModel(spec, 'vision') makes a synth: model once and reuses it", async () => {
    const cacheDir = join(dir, 'cache');
    const p1 = await resolveModel('synth:gemma4-vision-tiny', 'vision', { cacheDir });
    const m1 = statSync(p1).mtimeMs;
    const p2 = await resolveModel('synth:gemma4-vision-tiny', 'vision', { cacheDir });
    assert.equal(p2, p1);
    assert.equal(statSync(p2).mtimeMs, m1);
    assert.notEqual(await resolveModel('synth:gemma4-vision-tiny@7', 'vision', { cacheDir }), p1);
    await assert.rejects(resolveModel('synth:nope', 'vision', { cacheDir }), /unknown vision preset 'nope'/);
    await assert.rejects(resolveModel('synth:Bad Name', 'vision', { cacheDir }), /bad synthetic model spec/);
    await assert.rejects(
      resolveModel('synth:gemma4-vision-tiny?wtype=f16', 'vision', { cacheDir }),
      /unknown parameter 'wtype' for a vision \(expected seed\)/,
    );
    await assert.rejects(resolveModel('synth:gemma4-vision-tiny@1?seed=2', 'vision', { cacheDir }), /the seed is given twice/);
    await assert.rejects(resolveModel(join(dir, 'missing.onnx'), 'vision'), /vision model file not found: .*missing\.onnx/);
  });
});
