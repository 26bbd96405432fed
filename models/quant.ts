// ggml tensor types: block geometry, f16 conversion, reference quantizers and dequantizers, and random valid blocks.
// The quantizers cover the types the synthetic writer emits.
//
// Block layouts follow build/llama.cpp/ggml/src/ggml-common.h; the dequantizers mirror ggml-quants.c (dequantize_row_*).
// The quantizers are simple round-to-nearest ones, not ggml's weighted searches.
// They produce valid blocks from known floats for tests, and do not compete on quality.
import { createCipheriv, createHash } from 'node:crypto';

/** ggml_type ids as stored in GGUF tensor infos (ggml.h `enum ggml_type`). */
export const GGMLType = {
  F32: 0,
  F16: 1,
  Q4_0: 2,
  Q4_1: 3,
  Q5_0: 6,
  Q5_1: 7,
  Q8_0: 8,
  Q8_1: 9,
  Q2_K: 10,
  Q3_K: 11,
  Q4_K: 12,
  Q5_K: 13,
  Q6_K: 14,
  Q8_K: 15,
  IQ2_XXS: 16,
  IQ2_XS: 17,
  IQ3_XXS: 18,
  IQ1_S: 19,
  IQ4_NL: 20,
  IQ3_S: 21,
  IQ2_S: 22,
  IQ4_XS: 23,
  I8: 24,
  I16: 25,
  I32: 26,
  I64: 27,
  F64: 28,
  IQ1_M: 29,
  BF16: 30,
  TQ1_0: 34,
  TQ2_0: 35,
  MXFP4: 39,
  NVFP4: 40,
  Q1_0: 41,
  Q2_0: 42,
} as const;
export type GGMLType = (typeof GGMLType)[keyof typeof GGMLType];

/** [elements per block, bytes per block] for every type a GGUF file may contain (ggml.c type_traits). */
const TYPE_TRAITS: ReadonlyMap<number, readonly [blockSize: number, typeSize: number]> = new Map([
  [0, [1, 4]],
  [1, [1, 2]],
  [2, [32, 18]],
  [3, [32, 20]],
  [6, [32, 22]],
  [7, [32, 24]],
  [8, [32, 34]],
  [9, [32, 36]],
  [10, [256, 84]],
  [11, [256, 110]],
  [12, [256, 144]],
  [13, [256, 176]],
  [14, [256, 210]],
  [15, [256, 292]],
  [16, [256, 66]],
  [17, [256, 74]],
  [18, [256, 98]],
  [19, [256, 50]],
  [20, [32, 18]],
  [21, [256, 110]],
  [22, [256, 82]],
  [23, [256, 136]],
  [24, [1, 1]],
  [25, [1, 2]],
  [26, [1, 4]],
  [27, [1, 8]],
  [28, [1, 8]],
  [29, [256, 56]],
  [30, [1, 2]],
  [34, [256, 54]],
  [35, [256, 66]],
  [39, [32, 17]],
  [40, [64, 36]],
  [41, [128, 18]],
  [42, [64, 18]],
]);

const TYPE_NAMES: ReadonlyMap<number, string> = new Map(Object.entries(GGMLType).map(([name, id]) => [id, name]));

export function isKnownGgmlType(type: number): type is GGMLType {
  return TYPE_TRAITS.has(type);
}

export function ggmlTypeName(type: number): string {
  return TYPE_NAMES.get(type) ?? `type#${type}`;
}

export function blockSize(type: number): number {
  const t = TYPE_TRAITS.get(type);
  if (!t) throw new RangeError(`unknown ggml type ${type}`);
  return t[0];
}

export function typeSize(type: number): number {
  const t = TYPE_TRAITS.get(type);
  if (!t) throw new RangeError(`unknown ggml type ${type}`);
  return t[1];
}

/** Bytes of a tensor of `type` with shape `ne` (ne0 first); ne0 must be a whole number of blocks. */
export function tensorBytes(type: number, ne: readonly (number | bigint)[]): bigint {
  const bs = BigInt(blockSize(type));
  const ne0 = BigInt(ne[0] ?? 1);
  if (ne0 % bs !== 0n) throw new RangeError(`row length ${ne0} is not a multiple of the ${ggmlTypeName(type)} block size ${bs}`);
  let rows = 1n;
  for (let i = 1; i < ne.length; i++) rows *= BigInt(ne[i]!);
  return (ne0 / bs) * BigInt(typeSize(type)) * rows;
}

// ---------------------------------------------------------------------------------------------------------
// IEEE half precision

const roundHalfEven = (x: number): number => {
  const r = Math.round(x);
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
};

/** float -> IEEE binary16 bits, round to nearest even (what ggml's GGML_FP32_TO_FP16 does). */
export function f32ToF16Bits(value: number): number {
  if (Number.isNaN(value)) return 0x7e00;
  const sign = value < 0 || Object.is(value, -0) ? 0x8000 : 0;
  const a = Math.abs(value);
  if (a === 0) return sign;
  if (a < 2 ** -14) return sign | roundHalfEven(a * 2 ** 24); // subnormal (rounds up into the normals at 1024)
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a)
    e -= 1; // log2 may be off by one ulp near powers of two
  else if (2 ** (e + 1) <= a) e += 1;
  let m = roundHalfEven((a / 2 ** e - 1) * 1024);
  if (m === 1024) {
    m = 0;
    e += 1;
  }
  if (e > 15) return sign | 0x7c00;
  return sign | ((e + 15) << 10) | m;
}

function halfToFloat(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return sign * m * 2 ** -24;
  if (e === 31) return m ? NaN : sign * Infinity;
  return sign * (1 + m / 1024) * 2 ** (e - 15);
}

/** All 65536 half values, so decoding is one lookup (a constant table, filled once at load). */
const HALF_TABLE: Float32Array = (() => {
  const t = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) t[h] = halfToFloat(h);
  return t;
})();

export function f16BitsToF32(bits: number): number {
  return HALF_TABLE[bits & 0xffff]!;
}

// ---------------------------------------------------------------------------------------------------------
// Reference quantizers (float -> blocks). Inputs must be a whole number of blocks.

/** Types this module can both quantize and dequantize. */
export const CODEC_TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q6_K] as const;
export type CodecType = (typeof CODEC_TYPES)[number];

function checkBlocks(type: number, n: number, what: string): number {
  const bs = blockSize(type);
  if (n % bs !== 0) throw new RangeError(`${what}: ${n} values is not a multiple of the ${ggmlTypeName(type)} block size ${bs}`);
  return n / bs;
}

export function quantize(type: CodecType, x: Float32Array): Uint8Array {
  const nb = checkBlocks(type, x.length, 'quantize');
  const out = new Uint8Array(nb * typeSize(type));
  const view = new DataView(out.buffer);
  switch (type) {
    case GGMLType.F32:
      for (let i = 0; i < x.length; i++) view.setFloat32(i * 4, x[i]!, true);
      break;
    case GGMLType.F16:
      for (let i = 0; i < x.length; i++) view.setUint16(i * 2, f32ToF16Bits(x[i]!), true);
      break;
    case GGMLType.Q8_0:
      for (let b = 0; b < nb; b++) {
        const o = b * 34;
        let amax = 0;
        for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(x[b * 32 + j]!));
        const dBits = f32ToF16Bits(amax / 127);
        const d = f16BitsToF32(dBits);
        view.setUint16(o, dBits, true);
        for (let j = 0; j < 32; j++) view.setInt8(o + 2 + j, d ? Math.max(-127, Math.min(127, Math.round(x[b * 32 + j]! / d))) : 0);
      }
      break;
    case GGMLType.Q4_0:
      for (let b = 0; b < nb; b++) {
        const o = b * 18;
        // ggml: the signed value of largest magnitude maps to -8, so the grid spans [-8, 7]·d exactly.
        let max = 0;
        for (let j = 0; j < 32; j++) {
          const v = x[b * 32 + j]!;
          if (Math.abs(v) > Math.abs(max)) max = v;
        }
        const dBits = f32ToF16Bits(max / -8);
        const d = f16BitsToF32(dBits);
        view.setUint16(o, dBits, true);
        const q = (v: number) => (d ? Math.max(0, Math.min(15, Math.round(v / d + 8))) : 8);
        for (let j = 0; j < 16; j++) out[o + 2 + j] = q(x[b * 32 + j]!) | (q(x[b * 32 + j + 16]!) << 4);
      }
      break;
    case GGMLType.Q5_0:
      for (let b = 0; b < nb; b++) {
        const o = b * 22;
        let max = 0;
        for (let j = 0; j < 32; j++) {
          const v = x[b * 32 + j]!;
          if (Math.abs(v) > Math.abs(max)) max = v;
        }
        const dBits = f32ToF16Bits(max / -16);
        const d = f16BitsToF32(dBits);
        view.setUint16(o, dBits, true);
        const q = (v: number) => (d ? Math.max(0, Math.min(31, Math.round(v / d + 16))) : 16);
        let qh = 0;
        for (let j = 0; j < 16; j++) {
          const lo = q(x[b * 32 + j]!);
          const hi = q(x[b * 32 + j + 16]!);
          out[o + 6 + j] = (lo & 0xf) | ((hi & 0xf) << 4);
          qh |= ((lo >> 4) << j) | ((hi >> 4) << (j + 16));
        }
        view.setUint32(o + 2, qh >>> 0, true);
      }
      break;
    case GGMLType.Q4_K:
      for (let b = 0; b < nb; b++) quantizeQ4KBlock(x.subarray(b * 256, b * 256 + 256), out, b * 144);
      break;
    case GGMLType.Q6_K:
      for (let b = 0; b < nb; b++) quantizeQ6KBlock(x.subarray(b * 256, b * 256 + 256), out, b * 210);
      break;
    default:
      throw new RangeError(`quantize: unsupported type ${ggmlTypeName(type)}`);
  }
  return out;
}

/** Packs 8 (scale, min) 6-bit pairs the way get_scale_min_k4() unpacks them. */
function packQ4KScales(sc: ArrayLike<number>, m: ArrayLike<number>, out: Uint8Array, offset: number): void {
  for (let j = 0; j < 4; j++) {
    out[offset + j] = (sc[j]! & 63) | ((sc[j + 4]! >> 4) << 6);
    out[offset + j + 4] = (m[j]! & 63) | ((m[j + 4]! >> 4) << 6);
    out[offset + j + 8] = (sc[j + 4]! & 0xf) | ((m[j + 4]! & 0xf) << 4);
  }
}

function quantizeQ4KBlock(x: Float32Array, out: Uint8Array, o: number): void {
  // x = d·sc·q − dmin·m with q ∈ [0,15], 8 sub-blocks of 32 sharing 6-bit (sc, m).
  const scales = new Float64Array(8);
  const mins = new Float64Array(8);
  for (let j = 0; j < 8; j++) {
    let lo = 0; // ggml clamps the minimum to ≤ 0 so m stays non-negative
    let hi = -Infinity;
    for (let l = 0; l < 32; l++) {
      const v = x[j * 32 + l]!;
      lo = Math.min(lo, v);
      hi = Math.max(hi, v);
    }
    scales[j] = (hi - lo) / 15;
    mins[j] = -lo;
  }
  const dBits = f32ToF16Bits(Math.max(...scales) / 63);
  const dminBits = f32ToF16Bits(Math.max(...mins) / 63);
  const d = f16BitsToF32(dBits);
  const dmin = f16BitsToF32(dminBits);
  const sc = new Uint8Array(8);
  const m = new Uint8Array(8);
  for (let j = 0; j < 8; j++) {
    sc[j] = d ? Math.min(63, Math.round(scales[j]! / d)) : 0;
    m[j] = dmin ? Math.min(63, Math.round(mins[j]! / dmin)) : 0;
  }
  const view = new DataView(out.buffer, out.byteOffset);
  view.setUint16(o, dBits, true);
  view.setUint16(o + 2, dminBits, true);
  packQ4KScales(sc, m, out, o + 4);
  const q = (e: number) => {
    const j = e >> 5;
    const step = d * sc[j]!;
    return step ? Math.max(0, Math.min(15, Math.round((x[e]! + dmin * m[j]!) / step))) : 0;
  };
  for (let c = 0; c < 4; c++) {
    for (let l = 0; l < 32; l++) out[o + 16 + c * 32 + l] = q(c * 64 + l) | (q(c * 64 + 32 + l) << 4);
  }
}

function quantizeQ6KBlock(x: Float32Array, out: Uint8Array, o: number): void {
  // x = d·sc·(q − 32) with q ∈ [0,63], 16 sub-blocks of 16 with signed 8-bit scales.
  const scales = new Float64Array(16);
  for (let j = 0; j < 16; j++) {
    let amax = 0;
    for (let l = 0; l < 16; l++) amax = Math.max(amax, Math.abs(x[j * 16 + l]!));
    scales[j] = amax / 31;
  }
  const dBits = f32ToF16Bits(Math.max(...scales) / 127);
  const d = f16BitsToF32(dBits);
  const sc = new Int8Array(16);
  for (let j = 0; j < 16; j++) sc[j] = d ? Math.min(127, Math.round(scales[j]! / d)) : 0;
  const q = new Uint8Array(256);
  for (let e = 0; e < 256; e++) {
    const step = d * sc[e >> 4]!;
    q[e] = step ? Math.max(0, Math.min(63, Math.round(x[e]! / step) + 32)) : 32;
  }
  packQ6K(q, sc, dBits, out, o);
}

/** Packs 256 6-bit quants (0..63), 16 scales and d into one block_q6_K (ql[128], qh[64], scales[16], d). */
function packQ6K(q: Uint8Array, sc: Int8Array, dBits: number, out: Uint8Array, o: number): void {
  for (let n = 0; n < 2; n++) {
    const qo = n * 128;
    for (let l = 0; l < 32; l++) {
      const q1 = q[qo + l]!,
        q2 = q[qo + l + 32]!,
        q3 = q[qo + l + 64]!,
        q4 = q[qo + l + 96]!;
      out[o + n * 64 + l] = (q1 & 0xf) | ((q3 & 0xf) << 4);
      out[o + n * 64 + l + 32] = (q2 & 0xf) | ((q4 & 0xf) << 4);
      out[o + 128 + n * 32 + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
    }
  }
  for (let j = 0; j < 16; j++) out[o + 192 + j] = sc[j]! & 0xff;
  out[o + 208] = dBits & 0xff;
  out[o + 209] = dBits >> 8;
}

// ---------------------------------------------------------------------------------------------------------
// Dequantizers (blocks -> float), mirroring ggml-quants.c.

export function dequantize(type: CodecType, data: Uint8Array, n: number): Float32Array {
  const nb = checkBlocks(type, n, 'dequantize');
  const need = nb * typeSize(type);
  if (data.length < need) throw new RangeError(`dequantize: ${ggmlTypeName(type)} × ${n} needs ${need} bytes, got ${data.length}`);
  const y = new Float32Array(n);
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const half = (o: number) => f16BitsToF32(view.getUint16(o, true));
  switch (type) {
    case GGMLType.F32:
      for (let i = 0; i < n; i++) y[i] = view.getFloat32(i * 4, true);
      break;
    case GGMLType.F16:
      for (let i = 0; i < n; i++) y[i] = half(i * 2);
      break;
    case GGMLType.Q8_0:
      for (let b = 0; b < nb; b++) {
        const d = half(b * 34);
        for (let j = 0; j < 32; j++) y[b * 32 + j] = view.getInt8(b * 34 + 2 + j) * d;
      }
      break;
    case GGMLType.Q4_0:
      for (let b = 0; b < nb; b++) {
        const d = half(b * 18);
        for (let j = 0; j < 16; j++) {
          const v = data[b * 18 + 2 + j]!;
          y[b * 32 + j] = ((v & 0xf) - 8) * d;
          y[b * 32 + j + 16] = ((v >> 4) - 8) * d;
        }
      }
      break;
    case GGMLType.Q5_0:
      for (let b = 0; b < nb; b++) {
        const d = half(b * 22);
        const qh = view.getUint32(b * 22 + 2, true);
        for (let j = 0; j < 16; j++) {
          const v = data[b * 22 + 6 + j]!;
          const h0 = ((qh >>> j) << 4) & 0x10;
          const h1 = (qh >>> (j + 12)) & 0x10;
          y[b * 32 + j] = (((v & 0xf) | h0) - 16) * d;
          y[b * 32 + j + 16] = (((v >> 4) | h1) - 16) * d;
        }
      }
      break;
    case GGMLType.Q4_K:
      for (let b = 0; b < nb; b++) {
        const o = b * 144;
        const d = half(o);
        const dmin = half(o + 2);
        for (let c = 0; c < 4; c++) {
          const [sc1, m1] = scaleMinK4(2 * c, data, o + 4);
          const [sc2, m2] = scaleMinK4(2 * c + 1, data, o + 4);
          for (let l = 0; l < 32; l++) {
            const v = data[o + 16 + c * 32 + l]!;
            y[b * 256 + c * 64 + l] = d * sc1 * (v & 0xf) - dmin * m1;
            y[b * 256 + c * 64 + 32 + l] = d * sc2 * (v >> 4) - dmin * m2;
          }
        }
      }
      break;
    case GGMLType.Q6_K:
      for (let b = 0; b < nb; b++) {
        const o = b * 210;
        const d = half(o + 208);
        for (let n2 = 0; n2 < 2; n2++) {
          const ql = o + n2 * 64,
            qh = o + 128 + n2 * 32,
            sc = o + 192 + n2 * 8,
            yo = b * 256 + n2 * 128;
          for (let l = 0; l < 32; l++) {
            const is = l >> 4;
            const h = data[qh + l]!;
            const q1 = ((data[ql + l]! & 0xf) | ((h & 3) << 4)) - 32;
            const q2 = ((data[ql + l + 32]! & 0xf) | (((h >> 2) & 3) << 4)) - 32;
            const q3 = ((data[ql + l]! >> 4) | (((h >> 4) & 3) << 4)) - 32;
            const q4 = ((data[ql + l + 32]! >> 4) | (((h >> 6) & 3) << 4)) - 32;
            y[yo + l] = d * view.getInt8(sc + is) * q1;
            y[yo + l + 32] = d * view.getInt8(sc + is + 2) * q2;
            y[yo + l + 64] = d * view.getInt8(sc + is + 4) * q3;
            y[yo + l + 96] = d * view.getInt8(sc + is + 6) * q4;
          }
        }
      }
      break;
    default:
      throw new RangeError(`dequantize: unsupported type ${ggmlTypeName(type)}`);
  }
  return y;
}

function scaleMinK4(j: number, q: Uint8Array, o: number): [number, number] {
  if (j < 4) return [q[o + j]! & 63, q[o + j + 4]! & 63];
  return [(q[o + j + 4]! & 0xf) | ((q[o + j - 4]! >> 6) << 4), (q[o + j + 4]! >> 4) | ((q[o + j]! >> 6) << 4)];
}

// ---------------------------------------------------------------------------------------------------------
// Random tensor data

/**
 * A deterministic byte stream: the AES-256-CTR keystream under key sha256(label). Same label, same bytes,
 * regardless of how the stream is cut into reads. Chosen over a JS xoshiro because OpenSSL's AES-NI path
 * runs at disk speed, and multi-GB synthetic checkpoints are written through it.
 */
export class KeystreamRng {
  readonly #cipher;

  constructor(label: string) {
    const key = createHash('sha256').update(label).digest();
    this.#cipher = createCipheriv('aes-256-ctr', key, Buffer.alloc(16));
  }

  bytes(n: number): Buffer {
    return this.#cipher.update(Buffer.alloc(n));
  }

  /** Uniform float in [0, 1). */
  uniform(): number {
    return this.bytes(4).readUInt32LE(0) / 2 ** 32;
  }
}

/** Inverse standard normal CDF (Acklam's rational approximation, |rel err| < 1.2e-9). */
function normalQuantile(p: number): number {
  const a = [-39.69683028665376, 220.9460984245205, -275.9285104469687, 138.357751867269, -30.66479806614716, 2.506628277459239];
  const b = [-54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972, -13.28068155288572];
  const c = [-0.007784894002430293, -0.3223964580411365, -2.400758277161838, -2.549732539343734, 4.374664141464968, 2.938163982698783];
  const d = [0.007784695709041462, 0.3224671290700398, 2.445134137142996, 3.754408661907416];
  const poly = (k: number[], x: number) => k.reduce((acc, v) => acc * x + v, 0);
  if (p < 0.02425) {
    const q = Math.sqrt(-2 * Math.log(p));
    return poly(c, q) / (poly(d, q) * q + 1);
  }
  if (p > 1 - 0.02425) {
    const q = Math.sqrt(-2 * Math.log(1 - p));
    return -poly(c, q) / (poly(d, q) * q + 1);
  }
  const q = p - 0.5;
  const r = q * q;
  return (poly(a, r) * q) / (poly(b, r) * r + 1);
}

/** Target standard deviation of synthetic weights (typical of trained transformer matrices). */
export const WEIGHT_STD = 0.02;

/** 65536 equiprobable N(0, WEIGHT_STD²) values: a random u16 indexes one, so sampling is one lookup. */
const NORMAL_F32: Float32Array = (() => {
  const t = new Float32Array(65536);
  for (let i = 0; i < 65536; i++) t[i] = WEIGHT_STD * normalQuantile((i + 0.5) / 65536);
  return t;
})();
const NORMAL_F16: Uint16Array = Uint16Array.from(NORMAL_F32, (v) => f32ToF16Bits(v));

/** Half bits near `target` minus half the jitter, so base + (rand & 63) averages to target. */
function jitterBase(target: number): number {
  const bits = f32ToF16Bits(target);
  return Math.max(1, bits - 32);
}

// Std of the centred quant grids: uniform integers over n levels have variance (n² − 1)/12.
const GRID_STD = (levels: number) => Math.sqrt((levels * levels - 1) / 12);

/**
 * Q4_K scale patterns: 6-bit sub-block scales sc ∈ [32, 63] with m = sc and dmin = 7.5·d, so every
 * sub-block is x = d·sc·(q − 7.5), zero-mean. 256 patterns, chosen per block by a random byte.
 */
const Q4K_PATTERNS: { bytes: Uint8Array; rms: number } = (() => {
  const bytes = new Uint8Array(256 * 12);
  const rng = new KeystreamRng('percept.q4k-patterns');
  const raw = rng.bytes(256 * 8);
  let sumSq = 0;
  for (let p = 0; p < 256; p++) {
    const sc = Array.from({ length: 8 }, (_, j) => 32 + (raw[p * 8 + j]! & 31));
    for (const s of sc) sumSq += s * s;
    packQ4KScales(sc, sc, bytes, p * 12);
  }
  return { bytes, rms: Math.sqrt(sumSq / (256 * 8)) };
})();

/** Q6_K scales ∈ [64, 127] (the quantizer maps the largest sub-block scale to ±127). */
const Q6K_SCALE_RMS = Math.sqrt(Array.from({ length: 64 }, (_, i) => (64 + i) ** 2).reduce((a, b) => a + b) / 64);

/** Types the random generator can fill. */
export const RANDOM_TYPES = [
  GGMLType.F32,
  GGMLType.F16,
  GGMLType.Q8_0,
  GGMLType.Q4_0,
  GGMLType.Q5_0,
  GGMLType.Q4_K,
  GGMLType.Q6_K,
] as const;
export type RandomType = (typeof RANDOM_TYPES)[number];

/**
 * Fills `nBlocks` blocks of `type` with random valid data of std ≈ WEIGHT_STD, mean ≈ 0. Every f16 scale is finite and nonzero.
 * It consumes exactly nBlocks·typeSize bytes of `rng` (F16/F32: 2 bytes per element).
 * So the output depends only on the rng label and the total length, not on how callers chunk it.
 */
export function randomBlocks(type: RandomType, nBlocks: number, rng: KeystreamRng): Buffer {
  switch (type) {
    case GGMLType.F32: {
      const idx = rng.bytes(nBlocks * 2);
      const out = Buffer.allocUnsafe(nBlocks * 4);
      const o32 = new Float32Array(out.buffer, out.byteOffset, nBlocks);
      for (let i = 0; i < nBlocks; i++) o32[i] = NORMAL_F32[idx[2 * i]! | (idx[2 * i + 1]! << 8)]!;
      return out;
    }
    case GGMLType.F16: {
      const idx = rng.bytes(nBlocks * 2);
      const out = Buffer.allocUnsafe(nBlocks * 2);
      for (let i = 0; i < nBlocks; i++) {
        const h = NORMAL_F16[idx[2 * i]! | (idx[2 * i + 1]! << 8)]!;
        out[2 * i] = h & 0xff;
        out[2 * i + 1] = h >> 8;
      }
      return out;
    }
    case GGMLType.Q8_0:
      return scaleOnly(rng.bytes(nBlocks * 34), 34, jitterBase(WEIGHT_STD / GRID_STD(256)), false);
    case GGMLType.Q4_0:
      return scaleOnly(rng.bytes(nBlocks * 18), 18, jitterBase(WEIGHT_STD / GRID_STD(16)), true);
    case GGMLType.Q5_0:
      return scaleOnly(rng.bytes(nBlocks * 22), 22, jitterBase(WEIGHT_STD / GRID_STD(32)), true);
    case GGMLType.Q6_K: {
      const out = rng.bytes(nBlocks * 210);
      const base = jitterBase(WEIGHT_STD / (GRID_STD(64) * Q6K_SCALE_RMS));
      for (let b = 0; b < nBlocks; b++) {
        const o = b * 210;
        for (let j = 0; j < 16; j++) out[o + 192 + j] = 64 | (out[o + 192 + j]! & 63);
        const d = base + (out[o + 208]! & 63);
        out[o + 208] = d & 0xff;
        out[o + 209] = d >> 8;
      }
      return out;
    }
    case GGMLType.Q4_K: {
      const out = rng.bytes(nBlocks * 144);
      const d = f32ToF16Bits(WEIGHT_STD / (GRID_STD(16) * Q4K_PATTERNS.rms));
      const dmin = f32ToF16Bits(7.5 * f16BitsToF32(d));
      for (let b = 0; b < nBlocks; b++) {
        const o = b * 144;
        const p = out[o]!; // random byte, about to be overwritten by d
        out[o] = d & 0xff;
        out[o + 1] = d >> 8;
        out[o + 2] = dmin & 0xff;
        out[o + 3] = dmin >> 8;
        out.set(Q4K_PATTERNS.bytes.subarray(p * 12, p * 12 + 12), o + 4);
      }
      return out;
    }
    default:
      throw new RangeError(`randomBlocks: unsupported type ${ggmlTypeName(type)}`);
  }
}

/**
 * Overwrites the leading f16 `d` of each block with base + (random low 6 bits): finite, nonzero, ±3 %.
 * With `signed`, bit 6 of the same random byte picks d's sign.
 * The grids of Q4_0/Q5_0 are asymmetric ([-8, 7], [-16, 15]). ggml's quantizer yields negative d about half the time, which centres them.
 */
function scaleOnly(out: Buffer, stride: number, base: number, signed: boolean): Buffer {
  for (let o = 0; o < out.length; o += stride) {
    const r = out[o]!;
    const d = (base + (r & 63)) | (signed && r & 64 ? 0x8000 : 0);
    out[o] = d & 0xff;
    out[o + 1] = d >> 8;
  }
  return out;
}
