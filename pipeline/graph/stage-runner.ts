// One stage as an RxJS operator: its edge, entry checks, each call's StageContext, the span,
// and the classification of what the call returned or threw. The graph (graph.ts) is its RunnerHost.
// Semantics: pipeline/README.md#edges-and-drops
import { Observable, type OperatorFunction, type Subscriber } from 'rxjs';
import type { CostModel, DegradeLadder } from '../budget.ts';
import { VirtualClock, msToNs, nsToMs, type Clock } from '../clock.ts';
import type { GraphConfig } from '../config.ts';
import { costsPerLevel, sampleServiceMs, serviceDraw, type ServiceCost } from '../service-time.ts';
import type { TelemetryEvent } from '../telemetry/events.ts';
import {
  DropFrame,
  StageAbort,
  type DropReason,
  type Envelope,
  type FrameMeta,
  type Knobs,
  type Stage,
  type StageContext,
  type StageEvent,
} from '../types.ts';
import { createEdge, type Edge } from './edges.ts';
import type { Scheduler } from './scheduler.ts';

/** A stage call's own clock on a virtual graph, starting at the entry time.
 * Advancing it is the stage spending virtual time. Crossing the stage deadline fires the call's signal. */
class CallClock extends VirtualClock {
  readonly #onAdvance: () => void;
  constructor(startNs: bigint, wallOriginMs: number, onAdvance: () => void) {
    super(startNs, wallOriginMs);
    this.#onAdvance = onAdvance;
  }
  override advance(deltaNs: bigint): void {
    super.advance(deltaNs);
    this.#onAdvance();
  }
  override advanceTo(ns: bigint): void {
    super.advanceTo(ns);
    this.#onAdvance();
  }
}

const min = (a: bigint, b: bigint): bigint => (a < b ? a : b);
const max = (a: bigint, b: bigint): bigint => (a > b ? a : b);
const fmtMs = (ns: bigint): string => nsToMs(ns).toFixed(3);

/** What a StageRunner needs from the graph. */
export interface RunnerHost {
  readonly clock: Clock;
  readonly virtual: boolean;
  readonly wallOriginMs: number;
  readonly scheduler: Scheduler;
  readonly shutdown: AbortSignal;
  readonly costModel: CostModel;
  readonly ladder: DegradeLadder;
  readonly dropPredictedMiss: boolean;
  readonly dropPredictedConflation: boolean;
  /** The earliest a frame entering stage `from` at `enterNs` would leave the last stage.
   * The notes say what made it later than the stages' fastest runs. */
  earliestEnd(
    level: number,
    from: number,
    enterNs: bigint,
    deadlineNs: bigint,
  ): { readonly endNs: bigint; readonly notes: readonly string[] };
  /** Why a frame entering stage `from` at `enterNs` would be replaced at a later 'latest' edge by its source's next frame.
   * Undefined when it would not, or when that cannot be known. */
  predictConflation(env: Envelope<unknown>, from: number, enterNs: bigint): string | undefined;
  /** A frame passed stage `from`'s entry checks. It reserves its place at the later stages that take reservations (Stage.reserve). */
  reserveAhead(env: Envelope<unknown>, from: number): void;
  /** The frame entered stage `index`: its reservation there ends. */
  releaseAt(frameId: number, index: number): void;
  emit(event: TelemetryEvent): void;
  drop(frameId: number, stage: string, reason: DropReason, detail: string, cause?: string): void;
}

type Outcome = { readonly ok: true; readonly value: unknown } | { readonly ok: false; readonly error: unknown };

interface InFlight {
  readonly env: Envelope<unknown>;
  readonly startNs: bigint;
  readonly call: CallContext;
  abandoned: boolean;
}

/** The StageContext of one call. Its AbortController and real-clock deadline timer are made when the stage first reads `signal`.
 * So a stage that never looks pays for neither. An earlier abort is already set on the signal it gets. */
class CallContext implements StageContext {
  readonly frame: FrameMeta;
  readonly clock: Clock;
  readonly stageDeadlineNs: bigint;
  readonly knobs: Knobs;
  cancelReported = false;
  readonly #stage: string;
  readonly #armTimer: boolean;
  readonly #onReport: (event: StageEvent, atNs: bigint) => void;
  #abortedBy: StageAbort | undefined;
  #controller: AbortController | undefined;
  #timer: NodeJS.Timeout | undefined;

  constructor(
    stage: string,
    frame: FrameMeta,
    clock: Clock,
    stageDeadlineNs: bigint,
    knobs: Knobs,
    armTimer: boolean,
    onReport: (event: StageEvent, atNs: bigint) => void,
  ) {
    this.#stage = stage;
    this.frame = frame;
    this.clock = clock;
    this.stageDeadlineNs = stageDeadlineNs;
    this.knobs = knobs;
    this.#armTimer = armTimer;
    this.#onReport = onReport;
  }

  get signal(): AbortSignal {
    if (!this.#controller) {
      this.#controller = new AbortController();
      if (this.#abortedBy) {
        this.#controller.abort(this.#abortedBy);
      } else if (this.#armTimer) {
        this.#armDeadline();
      }
    }
    return this.#controller.signal;
  }

  /** Node's timers count from the event loop's cached time, which can lag the clock.
   * So a timer may fire early: check, and wait again for what is left. */
  #armDeadline(): void {
    const leftMs = nsToMs(this.stageDeadlineNs - this.clock.nowNs());
    if (leftMs <= 0) this.abort('deadline');
    else this.#timer = setTimeout(() => this.#armDeadline(), Math.ceil(leftMs));
  }

  /** The abort that happened, if any. On a virtual clock the deadline always counts.
   * On a real clock it counts only for a stage that read the signal, since nothing else arms the timer. */
  get abortedBy(): StageAbort | undefined {
    return this.#abortedBy;
  }

  readonly report = (event: StageEvent): void => {
    if (event.kind === 'cancel') this.cancelReported = true;
    this.#onReport(event, this.clock.nowNs());
  };

  abort(reason: 'deadline' | 'shutdown'): void {
    if (this.#abortedBy) return;
    this.#abortedBy = new StageAbort(reason, this.#stage);
    this.dispose();
    this.#controller?.abort(this.#abortedBy);
  }

  dispose(): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
  }
}

export class StageRunner {
  readonly name: string;
  readonly #stage: Stage<unknown, unknown>;
  readonly #index: number;
  readonly #isLast: boolean;
  readonly #host: RunnerHost;
  readonly #edge: Edge;
  #budgetNs: bigint | undefined;
  readonly #serviceMs: readonly ServiceCost[];
  readonly #serviceSeed: number;
  readonly #concurrency: number;
  #subscriber: Subscriber<Envelope<unknown>> | undefined;
  /** Calls started and not yet finished (or skipped): at most #concurrency. */
  #running = 0;
  #upstreamDone = false;
  #completed = false;
  readonly #inFlight = new Set<InFlight>();

  constructor(stage: Stage<unknown, unknown>, index: number, isLast: boolean, host: RunnerHost, config: GraphConfig) {
    this.name = stage.name;
    this.#stage = stage;
    this.#index = index;
    this.#isLast = isLast;
    this.#host = host;
    this.#edge = createEdge(config.edges[stage.name] ?? config.edges.default, `edges.${config.edges[stage.name] ? stage.name : 'default'}`);
    const budgetMs = config.budgets.stages[stage.name];
    this.#budgetNs = budgetMs === undefined ? undefined : msToNs(budgetMs);
    this.#serviceMs = costsPerLevel(config.virtualServiceMs[stage.name] ?? 0);
    this.#serviceSeed = config.virtualServiceSeed;
    const concurrency = stage.concurrency ?? 1;
    if (!Number.isInteger(concurrency) || concurrency < 1)
      throw new TypeError(`createGraph: stage '${stage.name}': concurrency must be an integer ≥ 1 but is ${concurrency}`);
    this.#concurrency = concurrency;
  }

  operator(): OperatorFunction<Envelope<unknown>, Envelope<unknown>> {
    return (upstream) =>
      new Observable<Envelope<unknown>>((subscriber) => {
        if (this.#subscriber) throw new Error(`stage '${this.name}': its operator can be subscribed once`);
        this.#subscriber = subscriber;
        const onShutdown = (): void => this.#onShutdown();
        this.#host.shutdown.addEventListener('abort', onShutdown);
        const subscription = upstream.subscribe({
          next: (env) => this.#offer(env),
          complete: () => {
            this.#upstreamDone = true;
            this.#maybeComplete();
          },
          error: (error: unknown) => subscriber.error(error),
        });
        return () => {
          subscription.unsubscribe();
          this.#host.shutdown.removeEventListener('abort', onShutdown);
        };
      });
  }

  /** A frame that waits in front of this stage is replaced by a newer one ('latest' edge). */
  get conflates(): boolean {
    return this.#edge.dropReason === 'conflated';
  }

  /** The earliest a frame arriving at `arriveNs` could start here, if every call takes `fastestNs`.
   * That is its arrival while a slot is free, else when the first call in flight ends: no earlier than `busyUntilNs`
   * where the stage predicts it. On a 'queue' edge, add a turn per `concurrency` frames queued ahead.
   * On a 'latest' edge it replaces the waiting frame. */
  freeAtNs(arriveNs: bigint, fastestNs: bigint, busyUntilNs?: bigint): bigint {
    if (this.#inFlight.size < this.#concurrency) return arriveNs;
    let firstEnd: bigint | undefined;
    for (const f of this.#inFlight) if (firstEnd === undefined || f.startNs + fastestNs < firstEnd) firstEnd = f.startNs + fastestNs;
    if (busyUntilNs !== undefined && busyUntilNs > firstEnd!) firstEnd = busyUntilNs;
    const ahead = this.#edge.dropReason === 'queue_full' ? BigInt(Math.floor(this.#edge.size / this.#concurrency)) : 0n;
    return max(arriveNs, firstEnd!) + ahead * fastestNs;
  }

  /** The stage budget for calls started from now on (undefined: the frame deadline only). */
  setBudget(ms: number | undefined): void {
    this.#budgetNs = ms === undefined ? undefined : msToNs(ms);
  }

  /** Gives up on the calls in flight (they ignored the shutdown signal past the grace period). */
  abandon(): void {
    if (this.#inFlight.size === 0) return;
    for (const inFlight of this.#inFlight) {
      inFlight.abandoned = true;
      this.#host.drop(inFlight.env.frameId, this.name, 'shutdown', 'abandoned: the stage did not return within budgets.shutdownGraceMs');
      this.#running -= 1;
    }
    this.#inFlight.clear();
    this.#startNext();
  }

  #offer(env: Envelope<unknown>): void {
    if (this.#host.shutdown.aborted) {
      this.#host.drop(env.frameId, this.name, 'shutdown', 'arrived after stop');
      return;
    }
    const dropped = this.#edge.offer(env);
    if (dropped) {
      const conflated = this.#edge.dropReason === 'conflated';
      const detail = conflated ? `replaced by frame ${env.frameId}` : `queue full (${this.#edge.size})`;
      this.#host.drop(dropped.frameId, this.name, this.#edge.dropReason, detail, conflated ? 'replaced by a newer frame' : 'queue full');
    }
    this.#startNext();
  }

  #onShutdown(): void {
    for (const env of this.#edge.drain()) this.#host.drop(env.frameId, this.name, 'shutdown', 'waiting at stop');
    for (const inFlight of this.#inFlight) inFlight.call.abort('shutdown');
    this.#maybeComplete();
  }

  #startNext(): void {
    while (this.#running < this.#concurrency) {
      const env = this.#edge.take();
      if (!env) break;
      this.#running += 1;
      this.#host.scheduler.at(this.#host.clock.nowNs(), () => this.#run(env));
    }
    this.#maybeComplete();
  }

  #maybeComplete(): void {
    if (this.#completed || !this.#upstreamDone || this.#running > 0 || this.#edge.size > 0) return;
    this.#completed = true;
    this.#subscriber?.complete();
  }

  #skip(env: Envelope<unknown>, reason: DropReason, detail: string): void {
    this.#host.drop(env.frameId, this.name, reason, detail);
    this.#running -= 1;
    this.#startNext();
  }

  async #run(env: Envelope<unknown>): Promise<void> {
    const host = this.#host;
    const enterNs = host.clock.nowNs();
    host.releaseAt(env.frameId, this.#index);
    if (host.shutdown.aborted) return this.#skip(env, 'shutdown', 'graph stopping');
    if (enterNs >= env.deadlineNs) return this.#skip(env, 'stale', `deadline passed ${fmtMs(enterNs - env.deadlineNs)} ms before entry`);
    if (host.dropPredictedMiss) {
      const { endNs, notes } = host.earliestEnd(env.degradeLevel, this.#index, enterNs, env.deadlineNs);
      if (endNs > env.deadlineNs) {
        return this.#skip(
          env,
          'stale',
          `predicted miss: the remaining stages take at least ${fmtMs(endNs - enterNs)} ms${notes.length ? ` (${notes.join(', ')})` : ''}, ${fmtMs(env.deadlineNs - enterNs)} ms left`,
        );
      }
    }
    if (host.dropPredictedConflation) {
      const replaced = host.predictConflation(env, this.#index, enterNs);
      if (replaced) return this.#skip(env, 'conflated', replaced);
    }
    if (host.dropPredictedMiss) host.reserveAhead(env, this.#index);

    const stageDeadlineNs = this.#budgetNs === undefined ? env.deadlineNs : min(env.deadlineNs, enterNs + this.#budgetNs);
    const knobs = host.ladder.knobsAt(env.degradeLevel);
    const onReport = (event: StageEvent, atNs: bigint): void => this.#report(env.frameId, atNs, event);
    let call: CallContext;
    let modelledNs = 0n;
    if (host.virtual) {
      const cost = this.#serviceMs[Math.min(env.degradeLevel, this.#serviceMs.length - 1)]!;
      modelledNs = msToNs(sampleServiceMs(cost, serviceDraw(this.#serviceSeed, this.name, env.frameId)));
      const clock: CallClock = new CallClock(enterNs, host.wallOriginMs, () => {
        if (clock.nowNs() + modelledNs >= stageDeadlineNs) call.abort('deadline');
      });
      call = new CallContext(this.name, env, clock, stageDeadlineNs, knobs, false, onReport);
      if (enterNs + modelledNs >= stageDeadlineNs) call.abort('deadline');
    } else {
      call = new CallContext(this.name, env, host.clock, stageDeadlineNs, knobs, true, onReport);
    }
    const inFlight: InFlight = { env, startNs: enterNs, call, abandoned: false };
    this.#inFlight.add(inFlight);

    let outcome: Outcome;
    try {
      outcome = { ok: true, value: await this.#stage.process(env.payload, call) };
    } catch (error) {
      outcome = { ok: false, error };
    }
    call.dispose();
    if (inFlight.abandoned) return; // already counted as dropped 'shutdown'
    if (host.virtual) {
      // A stage that gave up at the deadline (reported a cancel, or threw) is charged only up to the deadline.
      // One that ignored the signal is charged its whole modelled time.
      const spentNs = call.clock.nowNs();
      const gaveUp = call.abortedBy?.reason === 'deadline' && (call.cancelReported || !outcome.ok);
      const exitNs = gaveUp ? max(spentNs, min(spentNs + modelledNs, stageDeadlineNs)) : spentNs + modelledNs;
      host.scheduler.at(exitNs, () => this.#finish(inFlight, enterNs, exitNs, outcome));
    } else {
      this.#finish(inFlight, enterNs, host.clock.nowNs(), outcome);
    }
  }

  #finish(inFlight: InFlight, enterNs: bigint, exitNs: bigint, outcome: Outcome): void {
    const host = this.#host;
    const { env, call } = inFlight;
    this.#inFlight.delete(inFlight);
    host.emit({ type: 'span', atNs: exitNs, frameId: env.frameId, stage: this.name, enterNs, exitNs, degradeLevel: env.degradeLevel });
    host.costModel.record(this.name, env.degradeLevel, nsToMs(exitNs - enterNs));

    if (outcome.ok) {
      const out: Envelope<unknown> = {
        frameId: env.frameId,
        sourceId: env.sourceId,
        captureNs: env.captureNs,
        captureWallMs: env.captureWallMs,
        stampNs: env.stampNs,
        sourceStamp: env.sourceStamp,
        deadlineNs: env.deadlineNs,
        degradeLevel: env.degradeLevel,
        spans: [...env.spans, { stage: this.name, enterNs, exitNs }],
        payload: outcome.value,
      };
      if (host.shutdown.aborted && !this.#isLast)
        host.drop(env.frameId, this.name, 'shutdown', 'finished after stop; downstream is closed');
      else this.#subscriber?.next(out);
    } else {
      const { error } = outcome;
      const message = error instanceof Error ? error.message : String(error);
      if (error instanceof DropFrame) {
        host.drop(env.frameId, this.name, error.reason, message);
      } else if (call.abortedBy || error instanceof StageAbort) {
        // Aborted by the runtime, or by the stage itself at the same deadline (native code checks it too).
        const { reason } = call.abortedBy ?? (error as StageAbort);
        if (!call.cancelReported)
          host.emit({ type: 'cancel', atNs: exitNs, frameId: env.frameId, stage: this.name, reason, detail: `gave up: ${message}` });
        host.drop(env.frameId, this.name, reason === 'shutdown' ? 'shutdown' : 'stale', `cancelled (${reason}): ${message}`);
      } else {
        host.emit({ type: 'error', atNs: exitNs, frameId: env.frameId, stage: this.name, message });
        host.drop(env.frameId, this.name, 'error', message);
      }
    }
    this.#running -= 1;
    this.#startNext();
  }

  #report(frameId: number, atNs: bigint, event: StageEvent): void {
    if (event.kind === 'cancel') {
      this.#host.emit({ type: 'cancel', atNs, frameId, stage: this.name, reason: event.reason, detail: event.detail ?? '' });
    } else if (event.kind === 'note') {
      this.#host.emit({
        type: 'note',
        atNs,
        frameId,
        stage: this.name,
        message: event.message,
        ...(event.data ? { data: event.data } : {}),
      });
    }
  }
}
