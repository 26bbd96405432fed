// The budget policy: a per-stage cost model learned online and the degradation ladder it drives.
// Semantics: pipeline/README.md#cost-model-and-ladder
import type { LadderConfig } from './config.ts';
import type { Knobs } from './types.ts';

/** What the model knows about one stage at one level (ms). */
export interface CostEstimate {
  readonly count: number;
  readonly ewmaMs: number;
  readonly quantileMs: number;
  readonly minMs: number;
}

/** Recent durations of one stage at one level. */
class CostWindow {
  readonly #values: Float64Array;
  #next = 0;
  #count = 0;
  #ewma = 0;
  #sorted: Float64Array | undefined; // cache, invalidated by record()

  constructor(size: number) {
    this.#values = new Float64Array(size);
  }

  record(ms: number, alpha: number): void {
    this.#ewma = this.#count === 0 ? ms : this.#ewma + alpha * (ms - this.#ewma);
    this.#values[this.#next] = ms;
    this.#next = (this.#next + 1) % this.#values.length;
    this.#count = Math.min(this.#count + 1, this.#values.length);
    this.#sorted = undefined;
  }

  clear(): void {
    this.#next = 0;
    this.#count = 0;
    this.#ewma = 0;
    this.#sorted = undefined;
  }

  get count(): number {
    return this.#count;
  }

  estimate(quantile: number): CostEstimate {
    this.#sorted ??= this.#values.slice(0, this.#count).sort();
    const sorted = this.#sorted;
    return {
      count: this.#count,
      ewmaMs: this.#ewma,
      // nearest rank, as LatencyHistogram
      quantileMs: sorted[Math.max(0, Math.ceil(quantile * sorted.length) - 1)] ?? NaN,
      minMs: sorted[0] ?? NaN,
    };
  }
}

export interface CostModelOptions {
  readonly stages: readonly string[];
  /** Number of ladder levels (rungs + 1). */
  readonly levels: number;
  readonly window: number;
  readonly quantile: number;
  readonly ewmaAlpha: number;
  readonly minSamples: number;
}

export class CostModel {
  readonly #stages: readonly string[];
  readonly #windows: Map<string, CostWindow[]>;
  readonly #quantile: number;
  readonly #alpha: number;
  readonly #minSamples: number;

  constructor({ stages, levels, window, quantile, ewmaAlpha, minSamples }: CostModelOptions) {
    if (!(Number.isInteger(levels) && levels >= 1)) throw new RangeError(`CostModel: expected levels ≥ 1 but received ${levels}`);
    if (!(Number.isInteger(window) && window >= 1)) throw new RangeError(`CostModel: expected window ≥ 1 but received ${window}`);
    if (!(quantile > 0 && quantile < 1)) throw new RangeError(`CostModel: expected 0 < quantile < 1 but received ${quantile}`);
    if (!(ewmaAlpha > 0 && ewmaAlpha <= 1)) throw new RangeError(`CostModel: expected 0 < ewmaAlpha ≤ 1 but received ${ewmaAlpha}`);
    if (!(Number.isInteger(minSamples) && minSamples >= 1 && minSamples <= window)) {
      throw new RangeError(`CostModel: expected 1 ≤ minSamples ≤ window (${window}) but received ${minSamples}`);
    }
    this.#stages = stages;
    this.#windows = new Map(stages.map((s) => [s, Array.from({ length: levels }, () => new CostWindow(window))]));
    this.#quantile = quantile;
    this.#alpha = ewmaAlpha;
    this.#minSamples = minSamples;
  }

  record(stage: string, level: number, durationMs: number): void {
    this.#window(stage, level).record(durationMs, this.#alpha);
  }

  /** Forgets everything measured at `level` (all stages). */
  forgetLevel(level: number): void {
    for (const stage of this.#stages) this.#window(stage, level).clear();
  }

  estimate(stage: string, level: number): CostEstimate {
    return this.#window(stage, level).estimate(this.#quantile);
  }

  /** Predicted time (ms) of the stages from index `from` on, at `level`.
   * It sums their quantiles ('quantile') or their fastest recent runs ('min').
   * A stage with fewer than minSamples durations counts as 0, so `ms` is a lower bound unless `complete`. */
  predict(level: number, kind: 'quantile' | 'min', from = 0): { readonly ms: number; readonly complete: boolean } {
    let ms = 0;
    let complete = true;
    for (let i = from; i < this.#stages.length; i++) {
      const window = this.#window(this.#stages[i]!, level);
      if (window.count < this.#minSamples) {
        complete = false;
        continue;
      }
      const estimate = window.estimate(this.#quantile);
      ms += kind === 'quantile' ? estimate.quantileMs : estimate.minMs;
    }
    return { ms, complete };
  }

  /** The fastest recent run (ms) of `stage` at `level`; 0 with fewer than minSamples durations. */
  fastestMs(stage: string, level: number): number {
    const window = this.#window(stage, level);
    return window.count < this.#minSamples ? 0 : window.estimate(this.#quantile).minMs;
  }

  #window(stage: string, level: number): CostWindow {
    const windows = this.#windows.get(stage);
    if (!windows) throw new RangeError(`CostModel: unknown stage '${stage}' (known: ${this.#stages.join(', ')})`);
    const window = windows[level];
    if (!window) throw new RangeError(`CostModel: level ${level} is outside 0..${windows.length - 1}`);
    return window;
  }
}

export interface LadderDecision {
  readonly from: number;
  readonly to: number;
  readonly direction: 'down' | 'up';
  /** 'pinned': held at a level by GraphControl.pinLevel. */
  readonly reason: 'predicted_miss' | 'comfortable' | 'pinned';
  readonly predictedMs: number;
  readonly limitMs: number;
  readonly knobs: Knobs;
}

export class DegradeLadder {
  readonly #config: LadderConfig;
  readonly #levels: readonly Knobs[];
  #limitMs: number;
  #pinned: number | null = null;
  #level = 0;
  #comfortable = 0;

  constructor(config: LadderConfig, endToEndMs: number) {
    if (!(Number.isFinite(endToEndMs) && endToEndMs > 0))
      throw new RangeError(`DegradeLadder: expected endToEndMs > 0 but received ${endToEndMs}`);
    this.#config = config;
    const levels: Knobs[] = [config.initial];
    for (const rung of config.rungs) levels.push({ ...levels[levels.length - 1]!, ...rung });
    this.#levels = levels;
    this.#limitMs = endToEndMs * config.headroom;
  }

  /** Number of levels (rungs + 1). */
  get levels(): number {
    return this.#levels.length;
  }

  get level(): number {
    return this.#level;
  }

  get pinned(): number | null {
    return this.#pinned;
  }

  /** Holds the ladder at `level` from the next decision on (null: the cost model decides again). */
  pin(level: number | null): void {
    if (level !== null && !(Number.isInteger(level) && level >= 0 && level < this.#levels.length)) {
      throw new RangeError(`DegradeLadder: level ${level} is outside 0..${this.#levels.length - 1}`);
    }
    this.#pinned = level;
  }

  /** The end-to-end budget the ladder keeps under (GraphControl.setBudgets). */
  setEndToEnd(endToEndMs: number): void {
    if (!(Number.isFinite(endToEndMs) && endToEndMs > 0))
      throw new RangeError(`DegradeLadder: expected endToEndMs > 0 but received ${endToEndMs}`);
    this.#limitMs = endToEndMs * this.#config.headroom;
  }

  knobsAt(level: number): Knobs {
    const knobs = this.#levels[level];
    if (!knobs) throw new RangeError(`DegradeLadder: level ${level} is outside 0..${this.#levels.length - 1}`);
    return knobs;
  }

  /** One decision, taken when a frame is admitted. Returns the step taken, if any; the model
   * forgets the level entered. */
  decide(model: CostModel): LadderDecision | undefined {
    if (this.#pinned !== null) {
      if (this.#pinned === this.#level) return undefined;
      return this.#step(model, this.#pinned, 'pinned', model.predict(this.#level, 'quantile').ms, this.#limitMs);
    }
    if (!this.#config.enabled) return undefined;
    // A miss is certain enough when even the stages measured so far exceed the limit; comfort
    // needs every stage measured.
    const { ms: predictedMs, complete } = model.predict(this.#level, 'quantile');
    if (predictedMs > this.#limitMs) {
      this.#comfortable = 0;
      if (this.#level + 1 >= this.#levels.length) return undefined;
      return this.#step(model, this.#level + 1, 'predicted_miss', predictedMs, this.#limitMs);
    }
    const comfortableMs = this.#limitMs * this.#config.upBelow;
    if (!complete) return undefined;
    if (predictedMs > comfortableMs) {
      this.#comfortable = 0;
      return undefined;
    }
    this.#comfortable += 1;
    if (this.#comfortable < this.#config.upAfter || this.#level === 0) return undefined;
    return this.#step(model, this.#level - 1, 'comfortable', predictedMs, comfortableMs);
  }

  /** `limitMs` is the threshold the prediction crossed (down) or stayed under (up). */
  #step(model: CostModel, to: number, reason: LadderDecision['reason'], predictedMs: number, limitMs: number): LadderDecision {
    const from = this.#level;
    this.#level = to;
    this.#comfortable = 0;
    model.forgetLevel(to);
    return { from, to, direction: to > from ? 'down' : 'up', reason, predictedMs, limitMs, knobs: this.#levels[to]! };
  }
}
