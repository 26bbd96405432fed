// Telemetry events: the one stream the graph emits, the RunSummary a stats event carries,
// and eventToJson() for JSON lines. Kinds: frame, span, drop, cancel, degrade, error, note, output, source, control, stats.
//
// The other telemetry files are consumers of this stream:
//   histogram.ts   LatencyHistogram: log-linear (HDR-style) histogram of ns durations
//   aggregator.ts  TelemetryAggregator: folds events into counters + histograms; snapshot() → RunSummary
//   report.ts      formatSummary(), writeJsonSummary() (--json-summary) and the LiveTable
//
// The summary is a pure fold over the events, so a recorded event stream rebuilds it exactly.
import type { LadderDecision } from '../budget.ts';
import type { DropReason, SourceIncident, StageEvent } from '../types.ts';

export type CancelReason = Extract<StageEvent, { kind: 'cancel' }>['reason'];

/** A frame entered the graph and is counted in `frames.in`. It ends as exactly one output or drop. */
export interface FrameEvent {
  readonly type: 'frame';
  readonly atNs: bigint;
  readonly frameId: number;
  readonly sourceId: string;
  readonly captureNs: bigint;
  /** The input's stamp, Unix ns (a bag message's log time), to line the frame up with its input. */
  readonly stampNs?: bigint;
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
/** A frame was dropped. `stage` is where: at its entry or edge, or inside it.
 * 'source' is the source edge, for frame skip and shutdown before admission. */
export interface DropEvent {
  readonly type: 'drop';
  readonly atNs: bigint;
  readonly frameId: number;
  readonly stage: string;
  readonly reason: DropReason;
  readonly detail: string;
  /** Short and stable, for counting in the summary's drops.causes.
   * When absent, the detail with its numbers blanked out stands for it. */
  readonly cause?: string;
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
/** Something the source reported that is not a frame: a SourceIncident.
 * The summary's `source` counts them by kind. */
export interface SourceEvent extends SourceIncident {
  readonly type: 'source';
  readonly atNs: bigint;
  readonly sourceId: string;
}
/** A control request that changed the running graph (GraphControl). */
export interface ControlEvent {
  readonly type: 'control';
  readonly atNs: bigint;
  readonly command: 'set_budgets' | 'pin_level' | 'release_level' | 'pause' | 'resume';
  readonly detail: string;
}
/** Periodic snapshot (every telemetry.intervalMs of clock time). */
export interface StatsEvent {
  readonly type: 'stats';
  readonly atNs: bigint;
  readonly summary: RunSummary;
}
export type TelemetryEvent =
  | FrameEvent
  | SpanEvent
  | DropEvent
  | CancelEvent
  | DegradeEvent
  | ErrorEvent
  | NoteEvent
  | OutputEvent
  | SourceEvent
  | ControlEvent
  | StatsEvent;

/** One event as one line of JSON; bigints become decimal strings so nothing is rounded. */
export function eventToJson(event: TelemetryEvent): string {
  return JSON.stringify(event, (_key, value: unknown) => (typeof value === 'bigint' ? value.toString() : value));
}

export interface LatencyStats {
  readonly count: number;
  readonly minMs: number | null;
  readonly meanMs: number | null;
  readonly p50Ms: number | null;
  readonly p95Ms: number | null;
  readonly p99Ms: number | null;
  readonly maxMs: number | null;
}

export type Counts<K extends string> = Partial<Record<K, number>>;

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
  readonly drops: {
    readonly byReason: Counts<DropReason>;
    readonly byStage: Readonly<Record<string, Counts<DropReason>>>;
    /** `stage: cause` → count, most frequent first. Past MAX_DROP_CAUSES, the rest count as '(other causes)'. */
    readonly causes: Readonly<Record<string, number>>;
  };
  readonly cancels: Readonly<Record<string, Counts<CancelReason>>>;
  readonly errors: Readonly<Record<string, number>>;
  /** What the source reported besides frames: incidents by kind, and the first MAX_SOURCE_DETAILS details in order.
   * The events stream has them all. */
  readonly source: { readonly counts: Counts<SourceIncident['kind']>; readonly details: readonly string[] };
  readonly degrade: { readonly down: number; readonly up: number; readonly level: number; readonly maxLevel: number };
  /** Per stage: durations of its process() calls (span enter → exit), in stage order. */
  readonly stages: Readonly<Record<string, LatencyStats>>;
  /** Capture → last stage exit, over frames that came out. */
  readonly endToEnd: LatencyStats;
  /** A run of several cameras: each camera's own summary by camera id.
   * The fields above cover all cameras together. */
  readonly cameras?: Readonly<Record<string, RunSummary>>;
}

/** A run's final summary as `percept run` reports it (the end event, --json-summary, the printed summary): with
 * `recorder` when the run had a recording, set once the recorder has closed. Not in RunSummary itself, whose keys
 * are the wire schema's (configs/wire/messages.schema.json), which allows more fields in a summary. */
export type FinalRunSummary = RunSummary & { readonly recorder?: RecorderSummary };

/** How a run's recording went. */
export interface RecorderSummary {
  // Without its path: two replays into two files publish the same bytes (the path is in the config).
  /** Every write reached the file and it was closed with its summary. */
  readonly ok: boolean;
  /** The first failure ("recorder PATH: recordFrame(frame 7) failed: ENOSPC: …"), or null. */
  readonly error: string | null;
  /** When it failed: clock time from the start of run() (ms), as durationMs; null when it did not. */
  readonly failedAtMs: number | null;
  /** Bytes handed to the file. */
  readonly bytesWritten: number;
  /** Bytes recorded after the failure or in its failed write, which never reached the file. */
  readonly bytesLost: number;
  /** What the run did on the failure (recorder.onError). */
  readonly onError: 'stop' | 'continue';
}

/** A consumer of the graph's telemetry besides the summary, such as a publisher's event topics or a log.
 *   graph.events.subscribe(sink.accept); */
export interface TelemetrySink {
  /** Takes one event of the run, in order; never throws (delivery failures are counted). */
  readonly accept: (event: TelemetryEvent) => void;
  /** Events it took but could not deliver (e.g. those after it closed). */
  readonly undelivered: number;
}
