// What a stage call costs on the virtual clock: a fixed figure, or a measured distribution sampled per call.
// The sample is a pure function of (seed, stage, frame id): a replay is deterministic whatever the call order.
// A frame draws the same quantile at every ladder level, so levels differ by their costs, not by luck.
// Semantics: pipeline/README.md#clocks-and-lockstep

/** Measured service times as a quantile table: the inverse CDF through evenly spaced probabilities. */
export interface ServiceDistribution {
  /** Calls the table was made from. */
  readonly count: number;
  /** Ascending ms at probabilities 0, 1/(n−1), …, 1: the sorted samples themselves when there are few. */
  readonly quantilesMs: readonly number[];
}

/** One ladder level's cost: fixed ms (a point distribution) or a distribution. */
export type ServiceCost = number | ServiceDistribution;

/** A stage's entry in `virtualServiceMs`: one cost, or one per ladder level (the last repeats). */
export type StageServiceCosts = ServiceCost | readonly ServiceCost[];

/** Quantile tables keep at most this many points: percentiles 0 to 100. */
export const MAX_QUANTILE_POINTS = 101;

export const isDistribution = (cost: ServiceCost): cost is ServiceDistribution => typeof cost !== 'number';

/** The table of `samples` (ms): sorted samples when they fit, else evenly spaced quantiles. Rounded to µs. */
export function serviceDistribution(samples: readonly number[], points = MAX_QUANTILE_POINTS): ServiceDistribution {
  if (samples.length === 0) throw new RangeError('serviceDistribution: no samples');
  const sorted = [...samples].sort((a, b) => a - b);
  const table = sorted.length <= points ? sorted : Array.from({ length: points }, (_, i) => inverseCdf(sorted, i / (points - 1)));
  return { count: samples.length, quantilesMs: table.map((ms) => Math.round(ms * 1000) / 1000) };
}

/** Linear interpolation through an ascending table at probability p in [0, 1]. */
function inverseCdf(table: readonly number[], p: number): number {
  const at = p * (table.length - 1);
  const lo = Math.floor(at);
  const hi = Math.min(lo + 1, table.length - 1);
  return table[lo]! + (table[hi]! - table[lo]!) * (at - lo);
}

/** The cost's ms at probability u in [0, 1): the figure itself, or the distribution's quantile u. */
export function sampleServiceMs(cost: ServiceCost, u: number): number {
  return isDistribution(cost) ? inverseCdf(cost.quantilesMs, u) : cost;
}

/** The cost's median: what one figure for it would be. */
export const medianServiceMs = (cost: ServiceCost): number => sampleServiceMs(cost, 0.5);

/** A stage's costs per level, a lone cost as one level. */
export const costsPerLevel = (costs: StageServiceCosts): readonly ServiceCost[] => (Array.isArray(costs) ? costs : [costs as ServiceCost]);

/** The uniform draw in [0, 1) for one stage call: a hash of seed, stage name and frame id (splitmix32 rounds). */
export function serviceDraw(seed: number, stage: string, frameId: number): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < stage.length; i++) h = Math.imul(h ^ stage.charCodeAt(i), 0x01000193);
  h = mix32(h ^ mix32(seed >>> 0));
  h = mix32(h ^ mix32(frameId >>> 0));
  return h / 2 ** 32;
}

function mix32(x: number): number {
  let z = (x + 0x9e3779b9) >>> 0;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
  return (z ^ (z >>> 16)) >>> 0;
}
