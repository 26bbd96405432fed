// The types every stage and the runtime share. A stage sees only its payload types and a
// StageContext; the Envelope around the payload belongs to the runtime.
import type { Clock } from './clock.ts';

/** A capture time as a source stated it (ROS builtin_interfaces/Time: no float rounding). */
export interface Stamp {
  readonly sec: number;
  readonly nanosec: number;
}

/** What the runtime knows about a frame, independent of its payload. */
export interface FrameMeta {
  readonly frameId: number;
  readonly sourceId: string;
  /** Capture time on the pipeline clock (monotonic ns). */
  readonly captureNs: bigint;
  /** Capture time as wall clock (ms since epoch), for humans and the wire. */
  readonly captureWallMs: number;
  /** The input's time in Unix ns, such as a bag message's log time. The graph sets it.
   * It is carried to every output made from the input, so recordings line outputs up with inputs.
   * Default: the capture time on the Unix time line. */
  readonly stampNs?: bigint;
  /** captureNs + end-to-end budget: after this the frame is worthless to the robot. */
  readonly deadlineNs: bigint;
  /** Degrade level of the ladder when the frame entered the graph (0 = full quality). */
  readonly degradeLevel: number;
  /** The capture time as the source stated it, unconverted, in its own time base.
   * Examples: a bag message's log time, a stream's pts, a pusher's stamp. It is the wire's source_stamp. */
  readonly sourceStamp?: Stamp | null;
}

export interface Span {
  readonly stage: string;
  readonly enterNs: bigint;
  readonly exitNs: bigint;
}

export interface Envelope<T> extends FrameMeta {
  readonly spans: readonly Span[];
  readonly payload: T;
}

/** The knobs the degradation ladder turns. A stage reads the ones it understands. */
export interface Knobs {
  /** Gemma 4 image-token budget: 70, 140, 280, 560 or 1120. Gemma 3 is fixed at 256. */
  readonly imageTokens: number;
  /** Upper bound on new tokens per frame. */
  readonly maxNewTokens: number;
  /** Whether speculative drafting is used. */
  readonly draft: boolean;
  /** Process one frame in (frameSkip + 1). */
  readonly frameSkip: number;
}

export type DropReason =
  | 'stale' // past its deadline (or predicted to miss it) at stage entry
  | 'conflated' // replaced by a newer frame on a latest-value edge
  | 'queue_full' // bounded queue full
  | 'skipped' // frame skip rung of the ladder
  | 'error' // the stage threw for this frame
  | 'invalid' // output failed validation (e.g. action schema)
  | 'rejected' // the source could not turn the input into a frame (corrupt message, not an image)
  | 'shutdown'; // in flight when the pipeline stopped

/** Stage-reported events (the runtime adds span/drop/degrade events itself). */
export type StageEvent =
  | { readonly kind: 'cancel'; readonly reason: 'deadline' | 'shutdown' | 'aborted'; readonly detail?: string }
  | { readonly kind: 'note'; readonly message: string; readonly data?: Readonly<Record<string, number | string | boolean>> };

export interface StageContext {
  readonly frame: FrameMeta;
  readonly clock: Clock;
  /** Fires at the stage's deadline (min of its own budget and the frame deadline) or on shutdown. */
  readonly signal: AbortSignal;
  /** The instant `signal` fires for the deadline, on `clock` (monotonic ns). */
  readonly stageDeadlineNs: bigint;
  readonly knobs: Knobs;
  report(event: StageEvent): void;
}

/** A stage's prediction for a frame (Stage.predict), in ms: the wait before its call could start, and the call. */
export interface StagePrediction {
  readonly waitMs: number;
  readonly ownMs: number;
  /** When this stage's call in flight (the frame ahead of this one here) ends, from now.
   * Absent: none in flight, or not known; the runtime then counts that call at the stage's fastest recent run. */
  readonly busyMs?: number;
}

/** One stage, one file in nodes/.
 * `process` may throw. The runtime then emits an error event and drops the frame as 'error'; the graph runs on. */
export interface Stage<I, O> {
  readonly name: string;
  // A property, not a method: function-typed properties are checked contravariantly in their input.
  // So a stage that takes another type cannot stand in for this one. chain() relies on it.
  readonly process: (input: I, ctx: StageContext) => Promise<O>;
  /** Calls the runtime lets run at once (default 1). Beyond it, frames wait on the stage's edge, under
   * its policy: a stage never queues work of its own. Outputs leave in the order calls finish. */
  readonly concurrency?: number;
  /** The least time a call entering now would take, for a frame with end-to-end deadline `deadlineNs`, in two parts:
   * `waitMs` before the call could start (work already queued on a shared engine, counted from now) and `ownMs`, the
   * call itself. The stage predicts them from state the runtime does not see. A shared decoder knows its load and recent steps.
   * 0 and 0: no prediction.
   * On a real clock, budgets.dropPredictedMiss uses the larger of ownMs and the stage's fastest recent run.
   * The stages before it run during waitMs, so a frame this stage would drop anyway is dropped before earlier stages spend on it.
   * `entering`: the frame is at this stage's own entry, not an earlier one.
   * Then frames still on their way (reserve) are not counted; each is checked at its own arrival.
   * See pipeline/README.md#deadlines-and-cancel. */
  predict?(deadlineNs: bigint, entering: boolean): StagePrediction;
  /** A frame that passed budgets.dropPredictedMiss at an earlier stage is on its way here (real clock).
   * Until the returned release is called, predict counts it for frames with later deadlines.
   * The runtime calls release once, when the frame enters this stage or is dropped.
   * So frames passing the early check together never exceed what this stage can serve in time. */
  reserve?(deadlineNs: bigint): () => void;
  /** Frees resources (models, sockets, workers); called once at shutdown. */
  close?(): Promise<void>;
}

/** Thrown by a stage to drop the current frame with a specific reason (e.g. 'invalid' for an
 * action that fails its schema). Any other error is counted as reason 'error'. */
export class DropFrame extends Error {
  readonly reason: DropReason;
  constructor(reason: DropReason, message: string) {
    super(message);
    this.name = 'DropFrame';
    this.reason = reason;
  }
}

/** One item a source yields: the payload and when it was captured. */
export interface SourceItem<T> {
  readonly sourceId: string;
  /** Capture time on the pipeline clock. Replay sources advance a VirtualClock to it first. */
  readonly captureNs: bigint;
  readonly captureWallMs: number;
  /** The input's own stamp, Unix ns (a bag message's log time); default: the capture time. */
  readonly stampNs?: bigint;
  /** The capture time in the source's own time base, unconverted (see FrameMeta.sourceStamp). */
  readonly sourceStamp?: Stamp | null;
  readonly payload: T;
}

/** An input the source read but could not turn into a payload, such as a corrupt bag message or a non-image file.
 * It enters the graph as a frame and is dropped 'rejected'.
 * So frames in = out + drops counts it, and the summaries show why. */
export interface SourceRejection {
  readonly sourceId: string;
  readonly captureNs: bigint;
  readonly captureWallMs: number;
  readonly stampNs?: bigint;
  /** Short and stable (the summaries count drops by it), e.g. 'chunk failed its CRC check'. */
  readonly rejected: string;
  /** This input's particulars: where it was and what was wrong with it. */
  readonly detail?: string;
}

export const isRejection = <T>(item: SourceItem<T> | SourceRejection): item is SourceRejection => 'rejected' in item;

/** A rejection from an error whose message is 'reason: particulars…'; `where` (which message) leads the detail. */
export function rejectionOf(
  err: unknown,
  at: Pick<SourceRejection, 'sourceId' | 'captureNs' | 'captureWallMs'>,
  where: string,
): SourceRejection {
  const [rejected, ...particulars] = (err instanceof Error ? err.message : String(err)).split(': ');
  return { ...at, rejected: rejected!, detail: [where, ...particulars].join(': ') };
}

/** What a source reports besides its frames, when it happens, through FrameSource.frames' `report`.
 * The graph makes it a 'source' event; the summary counts it by kind and keeps its detail.
 *   skipped  input passed over without becoming frames (a bag channel whose schema percept cannot decode)
 *   damaged  damage read around (a file without a readable summary or ending early, a chunk that failed its CRC)
 *   restart  the input process died and was started again
 *   exit     the input process ended
 * An input that was read but could not become a frame is no incident.
 * The source yields a SourceRejection for it, so that it is counted as a frame. */
export interface SourceIncident {
  readonly kind: 'skipped' | 'damaged' | 'restart' | 'exit';
  /** What and where, e.g. `/data/run.mcap: the chunk at byte 9120 (5 MB) was skipped: CRC mismatch`. */
  readonly detail: string;
}

/** A frame source: pattern, bag, folder, ffmpeg or zmq. Sources pace themselves, by fps or recorded timing.
 * They stop when `signal` fires or their input ends. An input they cannot use is yielded as a SourceRejection.
 * Anything else they have to say goes to `report` as it happens. */
export interface FrameSource<T> {
  readonly id: string;
  /** Replay sources: the Unix time (ns) their input starts at.
   * A virtual clock replaying it starts there, so a replay's times are the recording's. */
  readonly startNs?: bigint;
  /** Finite sources: how many inputs they hold, when known. It is a progress bar's total.
   * The graph also uses it to never drop the last input early for a successor. */
  readonly expectedItems?: number;
  frames(clock: Clock, signal: AbortSignal, report?: (incident: SourceIncident) => void): AsyncIterable<SourceItem<T> | SourceRejection>;
  close?(): Promise<void>;
}

/** What an aborted ctx.signal carries as its reason: why the stage must stop now. */
export class StageAbort extends Error {
  override readonly name = 'AbortError';
  readonly reason: 'deadline' | 'shutdown';
  readonly stage: string;
  constructor(reason: 'deadline' | 'shutdown', stage: string) {
    super(reason === 'deadline' ? `stage '${stage}' reached its deadline` : `stage '${stage}' stopped: the graph is shutting down`);
    this.reason = reason;
    this.stage = stage;
  }
}
