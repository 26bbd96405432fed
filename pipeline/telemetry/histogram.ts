// A log-linear histogram of latencies (ns) whose quantiles are within 1/128 of the true value.

const LINEAR_LIMIT = 256; // values below this are counted exactly
const SUB_BUCKETS = 128; // per power of two above it: relative bucket width ≤ 1/128
const MAX_EXPONENT = 52; // up to 2^53 ns (104 days); larger values land in the last bucket

/** A log-linear histogram of non-negative integer values (ns), in the manner of HdrHistogram.
 * Values below 256 are exact. Above, each power of two is split into 128 equal buckets.
 * So a reported quantile is at most 1/128 above the true order statistic, and within [min, max].
 * Quantiles are nearest-rank: the smallest recorded v such that at least ⌈q·n⌉ values are ≤ v. */
export class LatencyHistogram {
  readonly #counts = new Float64Array(LINEAR_LIMIT + (MAX_EXPONENT - 7) * SUB_BUCKETS);
  #count = 0;
  #sum = 0;
  #min = Infinity;
  #max = -Infinity;

  get count(): number {
    return this.#count;
  }
  get min(): number {
    return this.#count === 0 ? NaN : this.#min;
  }
  get max(): number {
    return this.#count === 0 ? NaN : this.#max;
  }
  get mean(): number {
    return this.#count === 0 ? NaN : this.#sum / this.#count;
  }

  record(value: number | bigint): void {
    const v = typeof value === 'bigint' ? Number(value) : Math.round(value);
    if (!Number.isFinite(v) || v < 0) throw new RangeError(`LatencyHistogram.record: expected a finite value ≥ 0 but received ${value}`);
    this.#counts[bucketOf(v)]! += 1;
    this.#count += 1;
    this.#sum += v;
    if (v < this.#min) this.#min = v;
    if (v > this.#max) this.#max = v;
  }

  /** The nearest-rank q-quantile (0 < q ≤ 1), NaN when empty. */
  quantile(q: number): number {
    if (!(q > 0 && q <= 1)) throw new RangeError(`LatencyHistogram.quantile: expected 0 < q ≤ 1 but received ${q}`);
    if (this.#count === 0) return NaN;
    const rank = Math.max(1, Math.ceil(q * this.#count));
    let seen = 0;
    for (let i = 0; i < this.#counts.length; i++) {
      seen += this.#counts[i]!;
      if (seen >= rank) return Math.min(this.#max, Math.max(this.#min, bucketHigh(i)));
    }
    return this.#max;
  }
}

function exponentOf(v: number): number {
  let e = Math.floor(Math.log2(v));
  if (2 ** e > v)
    e -= 1; // guard log2 rounding at powers of two
  else if (2 ** (e + 1) <= v) e += 1;
  return e;
}

function bucketOf(v: number): number {
  if (v < LINEAR_LIMIT) return v;
  const e = Math.min(exponentOf(v), MAX_EXPONENT);
  const mantissa = Math.min(Math.floor(v / 2 ** (e - 7)), 2 * SUB_BUCKETS - 1); // in [128, 255]
  return LINEAR_LIMIT + (e - 8) * SUB_BUCKETS + (mantissa - SUB_BUCKETS);
}

/** The largest value that falls into bucket i. */
function bucketHigh(i: number): number {
  if (i < LINEAR_LIMIT) return i;
  const e = 8 + Math.floor((i - LINEAR_LIMIT) / SUB_BUCKETS);
  const mantissa = SUB_BUCKETS + ((i - LINEAR_LIMIT) % SUB_BUCKETS);
  return (mantissa + 1) * 2 ** (e - 7) - 1;
}
