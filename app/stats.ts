// Order statistics of the benches' samples.

/** The nearest-rank q-quantile for 0 < q ≤ 1: the smallest value with at least ⌈q·n⌉ values ≤ it. NaN when empty. */
export function quantile(values: readonly number[], q: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = Float64Array.from(values).sort();
  return sorted[Math.min(sorted.length, Math.max(1, Math.ceil(q * sorted.length))) - 1]!;
}

/** The middle value, or the mean of the two middle ones for an even count. NaN when empty. */
export function median(values: readonly number[]): number {
  const s = Float64Array.from(values).sort();
  return s.length === 0 ? Number.NaN : s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}
