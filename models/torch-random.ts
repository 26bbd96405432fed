// PyTorch's CPU random numbers, so tables a training run drew from a seed can be redrawn here without Python.
// torch.Generator(device="cpu").manual_seed(s) then torch.randn(n, generator=g, dtype=float32), on an AVX2 build.
// Sources: aten/src/ATen/core/MT19937RNGEngine.h, ATen/core/TransformationHelper.h (uniform_real),
// ATen/native/cpu/DistributionTemplates.h (normal_fill, normal_fill_AVX2) and ATen/native/cpu/avx_mathfun.h.
// The AVX2 kernel is compiled with fused multiply-adds, so the polynomials below fuse where it does.

const f = Math.fround;

/** The Mersenne Twister PyTorch's CPUGeneratorImpl runs, seeded as manual_seed does (low 32 bits). */
export class TorchCpuGenerator {
  readonly #state = new Uint32Array(624);
  #next = 624;

  constructor(seed: number | bigint) {
    const s = this.#state;
    s[0] = Number(BigInt(seed) & 0xffffffffn);
    for (let j = 1; j < 624; j++) s[j] = (Math.imul(1812433253, s[j - 1]! ^ (s[j - 1]! >>> 30)) + j) >>> 0;
  }

  /** The next 32-bit output (CPUGeneratorImpl::random). */
  random(): number {
    const s = this.#state;
    if (this.#next >= 624) {
      for (let k = 0; k < 624; k++) {
        const y = (s[k]! & 0x80000000) | (s[(k + 1) % 624]! & 0x7fffffff);
        s[k] = s[(k + 397) % 624]! ^ (y >>> 1) ^ (y & 1 ? 0x9908b0df : 0);
      }
      this.#next = 0;
    }
    let y = s[this.#next++]!;
    y ^= y >>> 11;
    y ^= (y << 7) & 0x9d2c5680;
    y ^= (y << 15) & 0xefc60000;
    y ^= y >>> 18;
    return y >>> 0;
  }

  /** uniform_real_distribution<float>(0, 1): the low 24 bits as a fraction. */
  uniform(): number {
    return (this.random() & 0xffffff) * 2 ** -24;
  }
}

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);
const bitsOf = (x: number): number => ((F32[0] = x), U32[0]!);
const fromBits = (u: number): number => ((U32[0] = u >>> 0), F32[0]!);

const LOG_P = [
  7.0376836292e-2, -1.151461031e-1, 1.167699874e-1, -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
  3.3333331174e-1,
].map(f);

/** avx_mathfun's log256_ps for one lane: Cephes' logf polynomial. */
function logLane(v: number): number {
  let x = Math.max(v, 1.17549435e-38);
  let e = f((bitsOf(x) >>> 23) - 127 + 1);
  x = fromBits((bitsOf(x) & ~0x7f800000) | bitsOf(0.5));
  const below = x < f(Math.SQRT1_2);
  const extra = below ? x : 0;
  x = f(x - 1);
  if (below) e = f(e - 1);
  x = f(x + extra);
  const z = f(x * x);
  let y = LOG_P[0]!;
  for (let i = 1; i < LOG_P.length; i++) y = f(y * x + LOG_P[i]!);
  y = f(y * x);
  y = f(y * z + e * f(-2.1219444e-4));
  y = f(y - z * 0.5);
  x = f(x + y);
  return f(x + e * f(0.693359375));
}

/** avx_mathfun's sincos256_ps for one lane: Cephes' range reduction by π/4 and two polynomials. */
function sinCosLane(v: number): [sin: number, cos: number] {
  let sinNegative = v < 0;
  let x = Math.abs(v);
  let j = Math.trunc(f(x * f(4 / Math.PI)));
  j = (j + 1) & ~1;
  const y = j;
  const swapSin = (j & 4) !== 0;
  const sinPoly = (j & 2) === 0;
  const cosNegative = (~(j - 2) & 4) !== 0;
  sinNegative = sinNegative !== swapSin;
  x = f(x + y * f(-0.78515625));
  x = f(x + y * f(-2.4187564849853515625e-4));
  x = f(x + y * f(-3.774894977445941e-8));
  const z = f(x * x);
  let c = f(2.443315711809948e-5);
  c = f(c * z + f(-1.388731625493765e-3));
  c = f(c * z + f(4.166664568298827e-2));
  c = f(c * z);
  c = f(c * z - z * 0.5);
  c = f(c + 1);
  let s = f(-1.9515295891e-4);
  s = f(s * z + f(8.3321608736e-3));
  s = f(s * z + f(-1.6666654611e-1));
  s = f(s * z);
  s = f(s * x + x);
  const sin = sinPoly ? s : c;
  const cos = sinPoly ? c : s;
  return [sinNegative ? -sin : sin, cosNegative ? -cos : cos];
}

/** Box-Muller over 16 uniforms in place: lanes 0–7 give the cosines, 8–15 the sines. */
function normal16(d: Float32Array, o: number): void {
  for (let j = 0; j < 8; j++) {
    const radius = f(Math.sqrt(f(-2 * logLane(f(1 - d[o + j]!)))));
    const [sin, cos] = sinCosLane(f(f(2 * Math.PI) * d[o + j + 8]!));
    d[o + j] = f(radius * cos);
    d[o + j + 8] = f(radius * sin);
  }
}

const CHUNK = 1 << 20;

/** Fills `d` as torch.randn does, pausing (yielding) after each chunk of about a million values. */
function* fill(d: Float32Array, g: TorchCpuGenerator): Generator<void> {
  const n = d.length;
  for (let i = 0; i < n; i++) {
    d[i] = g.uniform();
    if (i % CHUNK === CHUNK - 1) yield;
  }
  for (let i = 0; i + 16 <= n; i += 16) {
    normal16(d, i);
    if (i % CHUNK === 0) yield;
  }
  if (n % 16 !== 0) {
    // The tail: 16 fresh uniforms overwrite the last 16 values, as normal_fill does.
    for (let j = 0; j < 16; j++) d[n - 16 + j] = g.uniform();
    normal16(d, n - 16);
  }
}

function checkLength(n: number): void {
  if (!Number.isInteger(n) || n < 16) throw new RangeError(`torchRandn: n must be an integer ≥ 16 (the vectorized path), got ${n}`);
}

/** torch.randn(n, generator=g) for n ≥ 16, float32, as the AVX2 kernel fills it. */
export function torchRandn(n: number, g: TorchCpuGenerator): Float32Array {
  checkLength(n);
  const d = new Float32Array(n);
  for (const _ of fill(d, g));
  return d;
}

/** torchRandn without holding the event loop: it yields to it between chunks. */
export async function torchRandnAsync(n: number, g: TorchCpuGenerator): Promise<Float32Array> {
  checkLength(n);
  const d = new Float32Array(n);
  for (const _ of fill(d, g)) await new Promise<void>((resolve) => setImmediate(resolve));
  return d;
}
