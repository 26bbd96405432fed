// Telemetry: the one event stream the graph emits, and the small consumers built on it.
//
//   TelemetryEvent      frame | span | drop | cancel | degrade | error | note | output | stats
//   LatencyHistogram    log-linear (HDR-style) histogram of ns durations; quantiles within 1/128
//   TelemetryAggregator folds events into counters + histograms; snapshot() → RunSummary
//   formatSummary()     the summary as text; writeJsonSummary() as a JSON file (--json-summary)
//   LiveTable           redraws a per-stage table in place on a TTY, nothing otherwise
//   eventToJson()       one event as a JSON line (bigints as decimal strings)
//
// The summary is a pure fold over the events, so a recorded event stream rebuilds it exactly.
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import type { Observable, Subscription } from 'rxjs';
import type { LadderDecision } from './budget.ts';
import type { DropReason, StageEvent } from './types.ts';

export type CancelReason = Extract<StageEvent, { kind: 'cancel' }>['reason'];

/** A frame entered the graph (counted in `frames.in`; it ends as exactly one output or drop). */
export interface FrameEvent {
  readonly type: 'frame';
  readonly atNs: bigint;
  readonly frameId: number;
  readonly sourceId: string;
  readonly captureNs: bigint;
  readonly degradeLevel: number;
}
/** A stage ran for a frame (whatever the outcome). */
export interface SpanEvent {
  readonly type: 'span';
  readonly atNs: bigint;
  readonly frameId: number;
  readonly stage: string;
  readonly enterNs: bigint;
  readonly exitNs: bigint;
  readonly degradeLevel: number;
}
/** A frame was dropped. `stage` is the stage at whose entry/edge (or inside which) it was dropped,
 * or 'source' for the source edge (frame skip, shutdown before admission). */
export interface DropEvent {
  readonly type: 'drop';
  readonly atNs: bigint;
  readonly frameId: number;
  readonly stage: string;
  readonly reason: DropReason;
  readonly detail: string;
}
export interface CancelEvent {
  readonly type: 'cancel';
  readonly atNs: bigint;
  readonly frameId: number;
  readonly stage: string;
  readonly reason: CancelReason;
  readonly detail: string;
}
/** A ladder step (pipeline/budget.ts decides it), stamped with when and for which frame. */
export interface DegradeEvent extends LadderDecision {
  readonly type: 'degrade';
  readonly atNs: bigint;
  /** The frame whose admission triggered the decision (it runs at the new level). */
  readonly frameId: number;
}
export interface ErrorEvent {
  readonly type: 'error';
  readonly atNs: bigint;
  /** -1 when no frame is involved (source failure, close()). */
  readonly frameId: number;
  readonly stage: string;
  readonly message: string;
}
export interface NoteEvent {
  readonly type: 'note';
  readonly atNs: bigint;
  readonly frameId: number;
  readonly stage: string;
  readonly message: string;
  readonly data?: Readonly<Record<string, number | string | boolean>>;
}
/** The last stage finished a frame. */
export interface OutputEvent {
  readonly type: 'output';
  readonly atNs: bigint;
  readonly frameId: number;
  /** Last stage exit − capture. */
  readonly latencyNs: bigint;
  /** Finished after its deadline (a deadline miss that still came out). */
  readonly late: boolean;
}
/** Periodic snapshot (every telemetry.intervalMs of clock time). */
export interface StatsEvent {
  readonly type: 'stats';
  readonly atNs: bigint;
  readonly summary: RunSummary;
}
export type TelemetryEvent = FrameEvent | SpanEvent | DropEvent | CancelEvent | DegradeEvent | ErrorEvent | NoteEvent | OutputEvent | StatsEvent;

/** One event as one line of JSON; bigints become decimal strings so nothing is rounded. */
export function eventToJson(event: TelemetryEvent): string {
  return JSON.stringify(event, (_key, value: unknown) => (typeof value === 'bigint' ? value.toString() : value));
}

// ---------------------------------------------------------------------------------------------

const LINEAR_LIMIT = 256; // values below this are counted exactly
const SUB_BUCKETS = 128; // per power of two above it: relative bucket width ≤ 1/128
const MAX_EXPONENT = 52; // up to 2^53 ns (104 days); larger values land in the last bucket

/** A log-linear histogram of non-negative integer values (ns), in the manner of HdrHistogram:
 * values below 256 are exact; above, each power of two is split into 128 equal buckets, so a
 * reported quantile is never more than 1/128 (0.8 %) above the true order statistic and never
 * outside [min, max]. Quantiles use the nearest-rank definition: the smallest recorded value v
 * such that at least ⌈q·n⌉ values are ≤ v. */
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
  if (2 ** e > v) e -= 1; // guard log2 rounding at powers of two
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

// ---------------------------------------------------------------------------------------------

export interface LatencyStats {
  readonly count: number;
  readonly minMs: number | null;
  readonly meanMs: number | null;
  readonly p50Ms: number | null;
  readonly p95Ms: number | null;
  readonly p99Ms: number | null;
  readonly maxMs: number | null;
}

type Counts<K extends string> = Partial<Record<K, number>>;

/** Everything a run produced, in plain JSON-safe numbers (ms). */
export interface RunSummary {
  readonly clock: 'real' | 'virtual';
  /** Clock time from the start of run() to the last event folded in. */
  readonly durationMs: number;
  /** How the run ended; null while it is still running (stats snapshots). */
  readonly endReason: 'source_end' | 'stopped' | 'source_error' | null;
  readonly stopReason: string | null;
  readonly frames: {
    readonly in: number;
    readonly out: number;
    readonly dropped: number;
    /** in − out − dropped: frames still inside the graph (0 once a run has ended). */
    readonly inFlight: number;
    /** Outputs that came out after their deadline. */
    readonly late: number;
  };
  /** Late outputs plus frames dropped as 'stale'. */
  readonly deadlineMisses: number;
  readonly drops: { readonly byReason: Counts<DropReason>; readonly byStage: Readonly<Record<string, Counts<DropReason>>> };
  readonly cancels: Readonly<Record<string, Counts<CancelReason>>>;
  readonly errors: Readonly<Record<string, number>>;
  readonly degrade: { readonly down: number; readonly up: number; readonly level: number; readonly maxLevel: number };
  /** Per stage: durations of its process() calls (span enter → exit), in stage order. */
  readonly stages: Readonly<Record<string, LatencyStats>>;
  /** Capture → last stage exit, over frames that came out. */
  readonly endToEnd: LatencyStats;
}

/** Folds telemetry events into counters and histograms. Subscribe it before the graph runs. */
export class TelemetryAggregator {
  readonly #clock: 'real' | 'virtual';
  readonly #stageHist = new Map<string, LatencyHistogram>();
  readonly #endToEnd = new LatencyHistogram();
  readonly #dropsByStage = new Map<string, Map<DropReason, number>>();
  readonly #dropsByReason = new Map<DropReason, number>();
  readonly #cancels = new Map<string, Map<CancelReason, number>>();
  readonly #errors = new Map<string, number>();
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
      case 'note':
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
      drops: { byReason: Object.fromEntries(this.#dropsByReason), byStage },
      cancels,
      errors: Object.fromEntries(this.#errors),
      degrade: { down: this.#down, up: this.#up, level: this.#level, maxLevel: this.#maxLevel },
      stages,
      endToEnd: latencyStats(this.#endToEnd),
    };
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

// ---------------------------------------------------------------------------------------------

const fmtMs = (ms: number | null): string => (ms === null ? '-' : ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toFixed(2));
const fmtCounts = (counts: Readonly<Record<string, number | undefined>> | undefined): string => {
  const parts = Object.entries(counts ?? {}).map(([k, n]) => `${k} ${n}`);
  return parts.length === 0 ? '-' : parts.join(', ');
};

function table(rows: readonly (readonly string[])[]): string[] {
  const widths = rows[0]!.map((_, c) => Math.max(...rows.map((r) => r[c]!.length)));
  return rows.map((r) => r.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!))).join('  ').trimEnd());
}

/** The per-stage table both the live view and the summary print. */
export function formatStageTable(summary: RunSummary): string[] {
  const rows: string[][] = [['stage', 'runs', 'p50 ms', 'p95 ms', 'p99 ms', 'max ms', 'drops', 'cancels', 'errors']];
  const add = (name: string, s: LatencyStats | undefined): void => {
    rows.push([
      name,
      String(s?.count ?? 0),
      fmtMs(s?.p50Ms ?? null),
      fmtMs(s?.p95Ms ?? null),
      fmtMs(s?.p99Ms ?? null),
      fmtMs(s?.maxMs ?? null),
      fmtCounts(summary.drops.byStage[name]),
      fmtCounts(summary.cancels[name]),
      String(summary.errors[name] ?? 0),
    ]);
  };
  if (summary.drops.byStage.source || summary.errors.source) add('source', undefined);
  for (const [name, stats] of Object.entries(summary.stages)) add(name, stats);
  add('end-to-end', summary.endToEnd);
  return table(rows);
}

export function formatHeadline(summary: RunSummary): string {
  const f = summary.frames;
  return (
    `frames in ${f.in}  out ${f.out}  dropped ${f.dropped} (${fmtCounts(summary.drops.byReason)})` +
    `  in flight ${f.inFlight}  late ${f.late}  level ${summary.degrade.level}` +
    `  [${summary.clock} ${fmtMs(summary.durationMs)} ms]`
  );
}

/** The end-of-run summary as text. */
export function formatSummary(summary: RunSummary): string {
  const lines = [
    `percept run ${summary.endReason === 'stopped' ? `stopped (${summary.stopReason ?? 'stop'})` : (summary.endReason ?? 'running')}`,
    formatHeadline(summary),
    `deadline misses ${summary.deadlineMisses}  degrade steps down ${summary.degrade.down} up ${summary.degrade.up} (max level ${summary.degrade.maxLevel})`,
    ...formatStageTable(summary),
  ];
  return lines.join('\n') + '\n';
}

/** Writes the summary as pretty JSON (creating the folder), for `--json-summary FILE`. */
export function writeJsonSummary(path: string, summary: RunSummary): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, JSON.stringify(summary, null, 2) + '\n');
}

// ---------------------------------------------------------------------------------------------

export interface LiveTableOptions {
  readonly stream?: NodeJS.WriteStream;
  /** auto: only when `stream` is a TTY; on: always; off: never. */
  readonly mode?: 'auto' | 'on' | 'off';
  /** Real-time redraw period (ms). */
  readonly intervalMs?: number;
}

/** Shows the latest stats snapshot as a table redrawn in place, at most once per interval of
 * real time (a virtual-clock replay may emit stats far faster). Draws nothing when disabled. */
export class LiveTable {
  readonly #stream: NodeJS.WriteStream;
  readonly #enabled: boolean;
  readonly #intervalMs: number;
  #latest: RunSummary | undefined;
  #dirty = false;
  #linesDrawn = 0;
  #timer: NodeJS.Timeout | undefined;
  #subscription: Subscription | undefined;

  constructor({ stream = process.stdout, mode = 'auto', intervalMs = 1000 }: LiveTableOptions = {}) {
    if (!(Number.isFinite(intervalMs) && intervalMs > 0)) throw new RangeError(`LiveTable: expected intervalMs > 0 but received ${intervalMs}`);
    this.#stream = stream;
    this.#enabled = mode === 'on' || (mode === 'auto' && stream.isTTY === true);
    this.#intervalMs = intervalMs;
  }

  get enabled(): boolean {
    return this.#enabled;
  }

  /** Starts following `events`; a no-op when the table is disabled. */
  attach(events: Observable<TelemetryEvent>): this {
    if (!this.#enabled || this.#subscription) return this;
    this.#subscription = events.subscribe({
      next: (event) => {
        if (event.type !== 'stats') return;
        this.#latest = event.summary;
        this.#dirty = true;
      },
      complete: () => this.detach(),
    });
    this.#timer = setInterval(() => this.#draw(), this.#intervalMs);
    this.#timer.unref();
    return this;
  }

  /** Stops redrawing and erases the table, so the final summary prints where it stood. */
  detach(): void {
    this.#subscription?.unsubscribe();
    this.#subscription = undefined;
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = undefined;
    if (this.#linesDrawn > 0) this.#stream.write(`\x1b[${this.#linesDrawn}F\x1b[0J`);
    this.#linesDrawn = 0;
  }

  #draw(): void {
    if (!this.#dirty || !this.#latest) return;
    this.#dirty = false;
    const lines = [formatHeadline(this.#latest), ...formatStageTable(this.#latest)];
    const up = this.#linesDrawn > 0 ? `\x1b[${this.#linesDrawn}F` : '';
    this.#stream.write(up + lines.map((l) => `\x1b[2K${l}\n`).join('') + '\x1b[0J');
    this.#linesDrawn = lines.length;
  }
}
