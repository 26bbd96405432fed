// TelemetryAggregator: folds telemetry events into counters and histograms; snapshot() → RunSummary.
import type { Observable, Subscription } from 'rxjs';
import type { DropReason, SourceIncident } from '../types.ts';
import type { CancelReason, Counts, DropEvent, LatencyStats, RunSummary, TelemetryEvent } from './events.ts';
import { LatencyHistogram } from './histogram.ts';

/** Folds telemetry events into counters and histograms. Subscribe it before the graph runs. */
export class TelemetryAggregator {
  readonly #clock: 'real' | 'virtual';
  readonly #stageHist = new Map<string, LatencyHistogram>();
  readonly #endToEnd = new LatencyHistogram();
  readonly #dropsByStage = new Map<string, Map<DropReason, number>>();
  readonly #dropsByReason = new Map<DropReason, number>();
  readonly #cancels = new Map<string, Map<CancelReason, number>>();
  readonly #errors = new Map<string, number>();
  readonly #causes = new Map<string, number>();
  readonly #sourceCounts = new Map<SourceIncident['kind'], number>();
  readonly #sourceDetails: string[] = [];
  #framesIn = 0;
  #framesOut = 0;
  #dropped = 0;
  #late = 0;
  #down = 0;
  #up = 0;
  #level = 0;
  #maxLevel = 0;
  #startNs: bigint | undefined;
  #lastNs: bigint | undefined;
  #endReason: RunSummary['endReason'] = null;
  #stopReason: string | null = null;

  /** `stageNames` fixes the order of the per-stage rows (others follow in order of appearance). */
  constructor(clock: 'real' | 'virtual', stageNames: readonly string[] = []) {
    this.#clock = clock;
    for (const name of stageNames) this.#stageHist.set(name, new LatencyHistogram());
  }

  /** Folds every event of `events` until it completes or the subscription is ended. */
  subscribeTo(events: Observable<TelemetryEvent>): Subscription {
    return events.subscribe({ next: (event) => this.add(event) });
  }

  /** Marks the start of the run (for durationMs). */
  start(atNs: bigint): void {
    this.#startNs ??= atNs;
    this.#lastNs ??= atNs;
  }

  end(atNs: bigint, endReason: NonNullable<RunSummary['endReason']>, stopReason: string | null): void {
    this.#touch(atNs);
    this.#endReason = endReason;
    this.#stopReason = stopReason;
  }

  add(event: TelemetryEvent): void {
    this.#touch(event.atNs);
    switch (event.type) {
      case 'frame':
        this.#framesIn += 1;
        break;
      case 'span':
        this.#histogramFor(event.stage).record(event.exitNs - event.enterNs);
        break;
      case 'drop':
        this.#dropped += 1;
        increment(this.#dropsByReason, event.reason);
        increment(mapFor(this.#dropsByStage, event.stage), event.reason);
        this.#countCause(dropCause(event));
        break;
      case 'cancel':
        increment(mapFor(this.#cancels, event.stage), event.reason);
        break;
      case 'error':
        increment(this.#errors, event.stage);
        break;
      case 'degrade':
        if (event.direction === 'down') this.#down += 1;
        else this.#up += 1;
        this.#level = event.to;
        this.#maxLevel = Math.max(this.#maxLevel, event.to);
        break;
      case 'output':
        this.#framesOut += 1;
        this.#endToEnd.record(event.latencyNs);
        if (event.late) this.#late += 1;
        break;
      case 'source':
        increment(this.#sourceCounts, event.kind);
        if (this.#sourceDetails.length < MAX_SOURCE_DETAILS) this.#sourceDetails.push(`${event.kind}: ${event.detail}`);
        break;
      case 'note':
      case 'control':
      case 'stats':
        break;
    }
  }

  snapshot(): RunSummary {
    const stages: Record<string, LatencyStats> = {};
    for (const [name, hist] of this.#stageHist) stages[name] = latencyStats(hist);
    const byStage: Record<string, Counts<DropReason>> = {};
    for (const [stage, counts] of this.#dropsByStage) byStage[stage] = Object.fromEntries(counts);
    const cancels: Record<string, Counts<CancelReason>> = {};
    for (const [stage, counts] of this.#cancels) cancels[stage] = Object.fromEntries(counts);
    const duration = this.#startNs === undefined || this.#lastNs === undefined ? 0n : this.#lastNs - this.#startNs;
    return {
      clock: this.#clock,
      durationMs: Number(duration) / 1e6,
      endReason: this.#endReason,
      stopReason: this.#stopReason,
      frames: {
        in: this.#framesIn,
        out: this.#framesOut,
        dropped: this.#dropped,
        inFlight: this.#framesIn - this.#framesOut - this.#dropped,
        late: this.#late,
      },
      deadlineMisses: this.#late + (this.#dropsByReason.get('stale') ?? 0),
      drops: {
        byReason: Object.fromEntries(this.#dropsByReason),
        byStage,
        causes: Object.fromEntries([...this.#causes].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))),
      },
      cancels,
      errors: Object.fromEntries(this.#errors),
      source: { counts: Object.fromEntries(this.#sourceCounts), details: [...this.#sourceDetails] },
      degrade: { down: this.#down, up: this.#up, level: this.#level, maxLevel: this.#maxLevel },
      stages,
      endToEnd: latencyStats(this.#endToEnd),
    };
  }

  #countCause(cause: string): void {
    // A bounded table: past MAX_DROP_CAUSES distinct causes, the rest are counted together.
    const key = this.#causes.has(cause) || this.#causes.size < MAX_DROP_CAUSES ? cause : OTHER_CAUSES;
    increment(this.#causes, key);
  }

  #touch(atNs: bigint): void {
    this.#startNs ??= atNs;
    if (this.#lastNs === undefined || atNs > this.#lastNs) this.#lastNs = atNs;
  }

  #histogramFor(stage: string): LatencyHistogram {
    let hist = this.#stageHist.get(stage);
    if (!hist) this.#stageHist.set(stage, (hist = new LatencyHistogram()));
    return hist;
  }
}

/** Distinct drop causes the summary keeps; more are counted as OTHER_CAUSES. */
export const MAX_DROP_CAUSES = 50;
/** Source incident details the summary keeps (its counts have them all). */
export const MAX_SOURCE_DETAILS = 50;
const OTHER_CAUSES = '(other causes)';

/** `stage: cause` of a drop: its own cause, or else its detail with numbers, hex and quoted text blanked out.
 * So drops for the same reason count together, e.g. 'deadline passed # ms before entry'. */
export function dropCause(event: DropEvent): string {
  const cause =
    event.cause ??
    event.detail
      .replace(/"(?:[^"\\]|\\.)*"/g, '"…"')
      .replace(/\b(?:0x[0-9a-f]+|[0-9a-f]*\d[0-9a-f]*(?:\.\d+)?)\b/gi, '#')
      .slice(0, 120);
  return `${event.stage}: ${cause || event.reason}`;
}

function increment<K>(map: Map<K, number>, key: K): void {
  map.set(key, (map.get(key) ?? 0) + 1);
}

function mapFor<K, V>(map: Map<string, Map<K, V>>, key: string): Map<K, V> {
  let inner = map.get(key);
  if (!inner) map.set(key, (inner = new Map()));
  return inner;
}

const nsToMsOrNull = (ns: number): number | null => (Number.isNaN(ns) ? null : Math.round(ns / 1e3) / 1e3);

function latencyStats(hist: LatencyHistogram): LatencyStats {
  const empty = hist.count === 0;
  return {
    count: hist.count,
    minMs: nsToMsOrNull(hist.min),
    meanMs: nsToMsOrNull(hist.mean),
    p50Ms: empty ? null : nsToMsOrNull(hist.quantile(0.5)),
    p95Ms: empty ? null : nsToMsOrNull(hist.quantile(0.95)),
    p99Ms: empty ? null : nsToMsOrNull(hist.quantile(0.99)),
    maxMs: nsToMsOrNull(hist.max),
  };
}
