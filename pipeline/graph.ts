// The graph runtime: a source and an ordered list of stages become one RxJS pipeline with
// per-frame deadlines, bounded edges, a degradation ladder and one telemetry stream.
//
//   const graph = createGraph({ source, stages: [preprocess, encode, decode, actions, publish], clock, config });
//   graph.events.subscribe(...);          // TelemetryEvent: frame/span/drop/cancel/degrade/error/note/output/stats
//   graph.outputs.subscribe(...);         // Envelope<unknown>: what the last stage returned, per frame
//   const summary = await graph.run();    // resolves when the source ended and everything drained, or after stop()
//   await graph.stop('SIGINT');           // idempotent; resolves with the same summary as run()
//
// Subscribe to `events`/`outputs` before run(): they are hot and complete when the run ends.
//
// What the runtime adds around every Stage (each becomes an OperatorFunction<Envelope, Envelope>):
// - The envelope: frame id (0, 1, … in source order), source id, capture ns + wall ms, deadline =
//   capture + budgets.endToEndMs, the ladder level at admission, and one span per stage.
// - The edge in front of the stage (edges[stage] ?? edges.default): 'latest' keeps one waiting frame
//   (a newer one replaces it: drop 'conflated'); 'queue' keeps up to `capacity` in order (an arriving
//   frame that finds it full: drop 'queue_full'). One frame is in flight per stage; stages run
//   concurrently, so stage k works on frame n+1 while stage k+1 works on frame n.
// - At entry: drop 'stale' if the frame's deadline has passed, or (budgets.dropPredictedMiss) if
//   the fastest recent runs of the remaining stages (those measured at the frame's level), summed,
//   would still miss it.
// - ctx.signal: aborts with a StageAbort at the stage deadline = min(frame deadline, entry + stage
//   budget), reason 'deadline', or at stop(), reason 'shutdown'. A stage that gives up because of it
//   says so with ctx.report({ kind: 'cancel', reason }); if it throws after the abort without
//   reporting, the runtime records the cancel for it.
// - Error isolation: DropFrame → drop with its reason; a throw after an abort → drop 'stale'
//   (deadline) or 'shutdown'; any other throw → an 'error' event and drop 'error'. The graph runs on.
// - The ladder (pipeline/budget.ts) decides at each admission; frameSkip drops at the source edge
//   ('skipped'). Every frame that enters ends as exactly one output or one drop:
//   frames.in = frames.out + frames.dropped once a run has ended.
//
// Clocks. RealClock: stages run when they can, durations are measured. VirtualClock (replay,
// deterministic): the graph is a discrete-event simulation. Tasks (frame arrivals, stage starts,
// stage exits) run one at a time in (time, insertion) order and the graph clock is advanced to each
// task's time, so stages never run concurrently and the same input + config give the same events
// and outputs byte for byte. The source runs one frame ahead on its own VirtualClock (a copy of the
// graph clock at start: it may advance it to each capture time); a frame arrives at its captureNs.
// A stage call's virtual service time is (a) how far the stage advanced ctx.clock, a per-call
// VirtualClock starting at the entry time, plus (b) config.virtualServiceMs[stage] (one value, or
// one per ladder level). The stage exits at entry + service. The deadline signal fires when the
// call's virtual time (a + b) reaches its stage deadline: during a ctx.clock advance, or before the
// call when (b) alone reaches it. A stage that then gives up (reports a cancel or throws) is
// charged only up to the deadline; one that ignores the signal is charged its whole service time.
// So on a virtual clock the signal fires only through virtual time: a stage must not wait for it
// to make progress. Stats events come every telemetry.intervalMs of clock time on either clock.
//
// stop(reason): the source's signal fires, waiting frames are dropped 'shutdown', in-flight calls
// are aborted ('shutdown'); a frame a stage finishes after stop goes no further (drop 'shutdown')
// unless it was the last stage's. On a real clock, calls that have not returned within
// budgets.shutdownGraceMs are abandoned (their frames dropped 'shutdown'). Then source.close() and
// every stage's close() run in order, and run()/stop() resolve with the summary.
export { StageAbort } from './types.ts';
import { Observable, Subject, type OperatorFunction, type Subscriber } from 'rxjs';
import { VirtualClock, msToNs, nsToMs, type Clock } from './clock.ts';
import { CostModel, DegradeLadder } from './budget.ts';
import type { EdgePolicy, GraphConfig } from './config.ts';
import { TelemetryAggregator, type RunSummary, type TelemetryEvent } from './telemetry.ts';
import { DropFrame, StageAbort, type DropReason, type Envelope, type FrameMeta, type FrameSource, type Knobs, type SourceItem, type Stage, type StageContext, type StageEvent } from './types.ts';

export interface Graph {
  readonly events: Observable<TelemetryEvent>;
  readonly outputs: Observable<Envelope<unknown>>;
  /** Runs the graph once; resolves with the summary when the source has ended and every frame
   * has come out or been dropped, or after stop(). */
  run(): Promise<RunSummary>;
  /** Stops the run (idempotent; before run() it makes run() end at once). */
  stop(reason?: string): Promise<RunSummary>;
}

export interface GraphOptions {
  readonly source: FrameSource<unknown>;
  /** In pipeline order; names unique. Stage k's output type is stage k+1's input type. */
  readonly stages: readonly Stage<never, unknown>[];
  readonly clock: Clock;
  readonly config: GraphConfig;
}

export function createGraph(options: GraphOptions): Graph {
  return new GraphRuntime(options);
}

/** Calls graph.stop(signal) on the first of `signals`; returns a function that removes the handlers. */
export function stopOnSignals(graph: Graph, signals: readonly NodeJS.Signals[] = ['SIGINT', 'SIGTERM']): () => void {
  const handler = (signal: NodeJS.Signals): void => void graph.stop(signal);
  for (const signal of signals) process.on(signal, handler);
  return () => {
    for (const signal of signals) process.off(signal, handler);
  };
}

// ---------------------------------------------------------------------------------------------
// Scheduling: the one place real and virtual time differ.

type Task = () => void | Promise<void>;

interface Scheduler {
  /** Runs `task` at `atNs` on the graph clock (a real clock only ever asks for "now"). */
  at(atNs: bigint, task: Task): void;
}

class RealScheduler implements Scheduler {
  readonly #onError: (error: unknown) => void;
  constructor(onError: (error: unknown) => void) {
    this.#onError = onError;
  }
  at(_atNs: bigint, task: Task): void {
    try {
      const done = task();
      if (done) done.catch(this.#onError);
    } catch (error) {
      this.#onError(error);
    }
  }
}

interface TimedTask {
  readonly atNs: bigint;
  readonly seq: number;
  readonly task: Task;
}

const before = (a: TimedTask, b: TimedTask): boolean => a.atNs < b.atNs || (a.atNs === b.atNs && a.seq < b.seq);

/** Runs tasks one at a time in (time, insertion) order, awaiting each, advancing the clock to each. */
class VirtualScheduler implements Scheduler {
  readonly #clock: VirtualClock;
  readonly #beforeTask: (atNs: bigint) => void;
  readonly #onError: (error: unknown) => void;
  readonly #heap: TimedTask[] = [];
  #seq = 0;
  #running = false;

  constructor(clock: VirtualClock, beforeTask: (atNs: bigint) => void, onError: (error: unknown) => void) {
    this.#clock = clock;
    this.#beforeTask = beforeTask;
    this.#onError = onError;
  }

  at(atNs: bigint, task: Task): void {
    const now = this.#clock.nowNs();
    this.#push({ atNs: atNs < now ? now : atNs, seq: this.#seq++, task });
    if (!this.#running) void this.#loop();
  }

  async #loop(): Promise<void> {
    this.#running = true;
    await undefined; // never run a task inside the at() call that scheduled it
    try {
      for (let next = this.#pop(); next; next = this.#pop()) {
        this.#beforeTask(next.atNs);
        this.#clock.advanceTo(next.atNs);
        try {
          await next.task();
        } catch (error) {
          this.#onError(error);
        }
      }
    } finally {
      this.#running = false;
    }
  }

  #push(item: TimedTask): void {
    const heap = this.#heap;
    heap.push(item);
    for (let i = heap.length - 1; i > 0; ) {
      const parent = (i - 1) >> 1;
      if (!before(heap[i]!, heap[parent]!)) break;
      [heap[i], heap[parent]] = [heap[parent]!, heap[i]!];
      i = parent;
    }
  }

  #pop(): TimedTask | undefined {
    const heap = this.#heap;
    const top = heap[0];
    const last = heap.pop();
    if (heap.length > 0 && last) {
      heap[0] = last;
      for (let i = 0; ; ) {
        const l = 2 * i + 1;
        const r = l + 1;
        let min = i;
        if (l < heap.length && before(heap[l]!, heap[min]!)) min = l;
        if (r < heap.length && before(heap[r]!, heap[min]!)) min = r;
        if (min === i) break;
        [heap[i], heap[min]] = [heap[min]!, heap[i]!];
        i = min;
      }
    }
    return top;
  }
}

/** A stage call's own clock on a virtual graph: starts at the entry time; advancing it is the
 * stage spending virtual time, and crossing the stage deadline fires the call's signal. */
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
const wallOriginOf = (clock: Clock): number => clock.wallMs() - Number(clock.nowNs() / 1_000_000n);
const fmtMs = (ns: bigint): string => nsToMs(ns).toFixed(3);

// ---------------------------------------------------------------------------------------------
// Edges: what waits in front of a stage while it is busy. Never unbounded.

interface Edge {
  readonly size: number;
  /** Takes `env`; returns a frame that has to be dropped for it (the replaced or the rejected one). */
  offer(env: Envelope<unknown>): Envelope<unknown> | undefined;
  take(): Envelope<unknown> | undefined;
  /** Empties the edge, returning what waited, oldest first. */
  drain(): Envelope<unknown>[];
  readonly dropReason: DropReason;
}

class LatestEdge implements Edge {
  readonly dropReason = 'conflated';
  #waiting: Envelope<unknown> | undefined;
  get size(): number {
    return this.#waiting ? 1 : 0;
  }
  offer(env: Envelope<unknown>): Envelope<unknown> | undefined {
    const replaced = this.#waiting;
    this.#waiting = env;
    return replaced;
  }
  take(): Envelope<unknown> | undefined {
    const env = this.#waiting;
    this.#waiting = undefined;
    return env;
  }
  drain(): Envelope<unknown>[] {
    const env = this.take();
    return env ? [env] : [];
  }
}

class QueueEdge implements Edge {
  readonly dropReason = 'queue_full';
  readonly #ring: (Envelope<unknown> | undefined)[];
  #head = 0;
  #size = 0;
  constructor(capacity: number) {
    this.#ring = new Array<Envelope<unknown> | undefined>(capacity);
  }
  get size(): number {
    return this.#size;
  }
  offer(env: Envelope<unknown>): Envelope<unknown> | undefined {
    if (this.#size === this.#ring.length) return env;
    this.#ring[(this.#head + this.#size) % this.#ring.length] = env;
    this.#size += 1;
    return undefined;
  }
  take(): Envelope<unknown> | undefined {
    if (this.#size === 0) return undefined;
    const env = this.#ring[this.#head];
    this.#ring[this.#head] = undefined;
    this.#head = (this.#head + 1) % this.#ring.length;
    this.#size -= 1;
    return env;
  }
  drain(): Envelope<unknown>[] {
    const all: Envelope<unknown>[] = [];
    for (let env = this.take(); env; env = this.take()) all.push(env);
    return all;
  }
}

function createEdge(policy: EdgePolicy, where: string): Edge {
  if (policy.policy === 'latest') return new LatestEdge();
  if (policy.policy === 'queue' && Number.isInteger(policy.capacity) && policy.capacity >= 1) return new QueueEdge(policy.capacity);
  throw new TypeError(`createGraph: ${where}: expected {policy:'latest'} or {policy:'queue', capacity ≥ 1} but received ${JSON.stringify(policy)}`);
}

// ---------------------------------------------------------------------------------------------
// One stage as an operator.

/** What a StageRunner needs from the graph. */
interface RunnerHost {
  readonly clock: Clock;
  readonly virtual: boolean;
  readonly wallOriginMs: number;
  readonly scheduler: Scheduler;
  readonly shutdown: AbortSignal;
  readonly costModel: CostModel;
  readonly ladder: DegradeLadder;
  readonly dropPredictedMiss: boolean;
  emit(event: TelemetryEvent): void;
  drop(frameId: number, stage: string, reason: DropReason, detail: string): void;
}

type Outcome = { readonly ok: true; readonly value: unknown } | { readonly ok: false; readonly error: unknown };

interface InFlight {
  readonly env: Envelope<unknown>;
  readonly call: CallContext;
  abandoned: boolean;
}

/** The StageContext of one call. Its AbortController (and on a real clock the deadline timer) is
 * made when the stage first reads `signal`, so a stage that never looks pays for neither; an abort
 * that came earlier is already set on the signal it gets. */
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

  constructor(stage: string, frame: FrameMeta, clock: Clock, stageDeadlineNs: bigint, knobs: Knobs, armTimer: boolean, onReport: (event: StageEvent, atNs: bigint) => void) {
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

  /** Node's timers count from the event loop's cached time, which can lag the clock, so a timer
   * may fire early: check, and wait again for what is left. */
  #armDeadline(): void {
    const leftMs = nsToMs(this.stageDeadlineNs - this.clock.nowNs());
    if (leftMs <= 0) this.abort('deadline');
    else this.#timer = setTimeout(() => this.#armDeadline(), Math.ceil(leftMs));
  }

  /** The abort that happened, if any. On a real clock the deadline counts only for a stage that
   * read the signal (nothing else arms the timer); on a virtual clock it always counts. */
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

class StageRunner {
  readonly name: string;
  readonly #stage: Stage<unknown, unknown>;
  readonly #index: number;
  readonly #isLast: boolean;
  readonly #host: RunnerHost;
  readonly #edge: Edge;
  readonly #budgetNs: bigint | undefined;
  readonly #serviceMs: readonly number[];
  #subscriber: Subscriber<Envelope<unknown>> | undefined;
  #busy = false;
  #upstreamDone = false;
  #completed = false;
  #inFlight: InFlight | undefined;

  constructor(stage: Stage<unknown, unknown>, index: number, isLast: boolean, host: RunnerHost, config: GraphConfig) {
    this.name = stage.name;
    this.#stage = stage;
    this.#index = index;
    this.#isLast = isLast;
    this.#host = host;
    this.#edge = createEdge(config.edges[stage.name] ?? config.edges.default, `edges.${config.edges[stage.name] ? stage.name : 'default'}`);
    const budgetMs = config.budgets.stages[stage.name];
    this.#budgetNs = budgetMs === undefined ? undefined : msToNs(budgetMs);
    const service = config.virtualServiceMs[stage.name] ?? 0;
    this.#serviceMs = typeof service === 'number' ? [service] : service;
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

  /** Gives up on the call in flight (it ignored the shutdown signal past the grace period). */
  abandon(): void {
    const inFlight = this.#inFlight;
    if (!inFlight) return;
    inFlight.abandoned = true;
    this.#inFlight = undefined;
    this.#host.drop(inFlight.env.frameId, this.name, 'shutdown', 'abandoned: the stage did not return within budgets.shutdownGraceMs');
    this.#busy = false;
    this.#startNext();
  }

  #offer(env: Envelope<unknown>): void {
    if (this.#host.shutdown.aborted) {
      this.#host.drop(env.frameId, this.name, 'shutdown', 'arrived after stop');
      return;
    }
    const dropped = this.#edge.offer(env);
    if (dropped) {
      const detail = this.#edge.dropReason === 'conflated' ? `replaced by frame ${env.frameId}` : `queue full (${this.#edge.size})`;
      this.#host.drop(dropped.frameId, this.name, this.#edge.dropReason, detail);
    }
    this.#startNext();
  }

  #onShutdown(): void {
    for (const env of this.#edge.drain()) this.#host.drop(env.frameId, this.name, 'shutdown', 'waiting at stop');
    this.#inFlight?.call.abort('shutdown');
    this.#maybeComplete();
  }

  #startNext(): void {
    if (this.#busy) return;
    const env = this.#edge.take();
    if (!env) {
      this.#maybeComplete();
      return;
    }
    this.#busy = true;
    this.#host.scheduler.at(this.#host.clock.nowNs(), () => this.#run(env));
  }

  #maybeComplete(): void {
    if (this.#completed || !this.#upstreamDone || this.#busy || this.#edge.size > 0) return;
    this.#completed = true;
    this.#subscriber?.complete();
  }

  #skip(env: Envelope<unknown>, reason: DropReason, detail: string): void {
    this.#host.drop(env.frameId, this.name, reason, detail);
    this.#busy = false;
    this.#startNext();
  }

  async #run(env: Envelope<unknown>): Promise<void> {
    const host = this.#host;
    const enterNs = host.clock.nowNs();
    if (host.shutdown.aborted) return this.#skip(env, 'shutdown', 'graph stopping');
    if (enterNs >= env.deadlineNs) return this.#skip(env, 'stale', `deadline passed ${fmtMs(enterNs - env.deadlineNs)} ms before entry`);
    if (host.dropPredictedMiss) {
      const fastestMs = host.costModel.predict(env.degradeLevel, 'min', this.#index).ms;
      if (fastestMs > 0 && enterNs + msToNs(fastestMs) > env.deadlineNs) {
        return this.#skip(env, 'stale', `predicted miss: the remaining stages take at least ${fastestMs.toFixed(3)} ms, ${fmtMs(env.deadlineNs - enterNs)} ms left`);
      }
    }

    const stageDeadlineNs = this.#budgetNs === undefined ? env.deadlineNs : min(env.deadlineNs, enterNs + this.#budgetNs);
    const knobs = host.ladder.knobsAt(env.degradeLevel);
    const onReport = (event: StageEvent, atNs: bigint): void => this.#report(env.frameId, atNs, event);
    let call: CallContext;
    let modelledNs = 0n;
    if (host.virtual) {
      modelledNs = msToNs(this.#serviceMs[Math.min(env.degradeLevel, this.#serviceMs.length - 1)]!);
      const clock: CallClock = new CallClock(enterNs, host.wallOriginMs, () => {
        if (clock.nowNs() + modelledNs >= stageDeadlineNs) call.abort('deadline');
      });
      call = new CallContext(this.name, env, clock, stageDeadlineNs, knobs, false, onReport);
      if (enterNs + modelledNs >= stageDeadlineNs) call.abort('deadline');
    } else {
      call = new CallContext(this.name, env, host.clock, stageDeadlineNs, knobs, true, onReport);
    }
    const inFlight: InFlight = { env, call, abandoned: false };
    this.#inFlight = inFlight;

    let outcome: Outcome;
    try {
      outcome = { ok: true, value: await this.#stage.process(env.payload, call) };
    } catch (error) {
      outcome = { ok: false, error };
    }
    call.dispose();
    if (inFlight.abandoned) return; // already counted as dropped 'shutdown'
    if (host.virtual) {
      // A stage that gave up at the deadline (reported a cancel, or threw) is charged its modelled
      // time only up to the deadline; one that ignored the signal is charged all of it.
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
    this.#inFlight = undefined;
    host.emit({ type: 'span', atNs: exitNs, frameId: env.frameId, stage: this.name, enterNs, exitNs, degradeLevel: env.degradeLevel });
    host.costModel.record(this.name, env.degradeLevel, nsToMs(exitNs - enterNs));

    if (outcome.ok) {
      const out: Envelope<unknown> = {
        frameId: env.frameId,
        sourceId: env.sourceId,
        captureNs: env.captureNs,
        captureWallMs: env.captureWallMs,
        deadlineNs: env.deadlineNs,
        degradeLevel: env.degradeLevel,
        spans: [...env.spans, { stage: this.name, enterNs, exitNs }],
        payload: outcome.value,
      };
      if (host.shutdown.aborted && !this.#isLast) host.drop(env.frameId, this.name, 'shutdown', 'finished after stop; downstream is closed');
      else this.#subscriber?.next(out);
    } else {
      const { error } = outcome;
      const message = error instanceof Error ? error.message : String(error);
      if (error instanceof DropFrame) {
        host.drop(env.frameId, this.name, error.reason, message);
      } else if (call.abortedBy) {
        const { reason } = call.abortedBy;
        if (!call.cancelReported) host.emit({ type: 'cancel', atNs: exitNs, frameId: env.frameId, stage: this.name, reason, detail: `threw after its signal fired: ${message}` });
        host.drop(env.frameId, this.name, reason === 'shutdown' ? 'shutdown' : 'stale', `cancelled (${reason}): ${message}`);
      } else {
        host.emit({ type: 'error', atNs: exitNs, frameId: env.frameId, stage: this.name, message });
        host.drop(env.frameId, this.name, 'error', message);
      }
    }
    this.#busy = false;
    this.#startNext();
  }

  #report(frameId: number, atNs: bigint, event: StageEvent): void {
    if (event.kind === 'cancel') {
      this.#host.emit({ type: 'cancel', atNs, frameId, stage: this.name, reason: event.reason, detail: event.detail ?? '' });
    } else if (event.kind === 'note') {
      this.#host.emit({ type: 'note', atNs, frameId, stage: this.name, message: event.message, ...(event.data ? { data: event.data } : {}) });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The graph.

class GraphRuntime implements Graph, RunnerHost {
  readonly events: Observable<TelemetryEvent>;
  readonly outputs: Observable<Envelope<unknown>>;
  readonly clock: Clock;
  readonly virtual: boolean;
  readonly wallOriginMs: number;
  readonly scheduler: Scheduler;
  readonly costModel: CostModel;
  readonly ladder: DegradeLadder;
  readonly dropPredictedMiss: boolean;

  readonly #source: FrameSource<unknown>;
  readonly #stages: readonly Stage<unknown, unknown>[];
  readonly #runners: readonly StageRunner[];
  readonly #config: GraphConfig;
  readonly #endToEndNs: bigint;
  readonly #statsIntervalNs: bigint;
  readonly #events = new Subject<TelemetryEvent>();
  readonly #outputs = new Subject<Envelope<unknown>>();
  readonly #aggregator: TelemetryAggregator;
  readonly #shutdown = new AbortController();
  #nextFrameId = 0;
  #toSkip = 0;
  #nextStatsNs = 0n;
  #statsTimer: NodeJS.Timeout | undefined;
  #graceTimer: NodeJS.Timeout | undefined;
  #sourceSubscriber: Subscriber<Envelope<unknown>> | undefined;
  #sourceFailed = false;
  #stopReason: string | undefined;
  #run: Promise<RunSummary> | undefined;
  #resolveRun: ((summary: RunSummary) => void) | undefined;
  #finalizing = false;

  constructor({ source, stages, clock, config }: GraphOptions) {
    if (!source || typeof source.frames !== 'function') throw new TypeError('createGraph: expected source to be a FrameSource with a frames() method');
    if (!Array.isArray(stages) || stages.length === 0) throw new TypeError('createGraph: expected stages to be a non-empty array');
    const names = new Set<string>();
    stages.forEach((stage: Stage<never, unknown>, i) => {
      if (!stage || typeof stage.name !== 'string' || stage.name === '' || stage.name === 'source') {
        throw new TypeError(`createGraph: stages[${i}]: expected a non-empty name other than 'source' but received ${JSON.stringify(stage?.name)}`);
      }
      if (typeof stage.process !== 'function') throw new TypeError(`createGraph: stage '${stage.name}': expected a process() method`);
      if (names.has(stage.name)) throw new TypeError(`createGraph: stage name '${stage.name}' is used twice`);
      names.add(stage.name);
    });
    if (!clock || typeof clock.nowNs !== 'function') throw new TypeError('createGraph: expected clock to be a Clock');
    if ((config.clock === 'virtual') !== clock.virtual) {
      throw new TypeError(`createGraph: config.clock is '${config.clock}' but the clock given is ${clock.virtual ? 'virtual' : 'real'}`);
    }
    if (clock.virtual && !(clock instanceof VirtualClock)) throw new TypeError('createGraph: a virtual clock must be a VirtualClock (the graph advances it)');
    const { endToEndMs } = config.budgets;
    if (!(Number.isFinite(endToEndMs) && endToEndMs > 0)) throw new RangeError(`createGraph: expected config.budgets.endToEndMs > 0 but received ${endToEndMs}`);

    this.#source = source;
    this.#stages = stages as readonly Stage<unknown, unknown>[];
    this.#config = config;
    this.clock = clock;
    this.virtual = clock.virtual;
    this.wallOriginMs = wallOriginOf(clock);
    this.#endToEndNs = msToNs(endToEndMs);
    this.#statsIntervalNs = msToNs(config.telemetry.intervalMs);
    this.dropPredictedMiss = config.budgets.dropPredictedMiss;
    this.ladder = new DegradeLadder(config.ladder, endToEndMs);
    const { window, quantile, ewmaAlpha, minSamples } = config.ladder;
    this.costModel = new CostModel({ stages: [...names], levels: this.ladder.levels, window, quantile, ewmaAlpha, minSamples });
    const onError = (error: unknown): void => this.#internalError(error);
    this.scheduler = clock instanceof VirtualClock && clock.virtual ? new VirtualScheduler(clock, (atNs) => this.#statsUpTo(atNs), onError) : new RealScheduler(onError);
    this.#runners = this.#stages.map((stage, i) => new StageRunner(stage, i, i === stages.length - 1, this, config));
    this.#aggregator = new TelemetryAggregator(clock.virtual ? 'virtual' : 'real', [...names]);
    this.#aggregator.subscribeTo(this.#events);
    this.events = this.#events.asObservable();
    this.outputs = this.#outputs.asObservable();
  }

  get shutdown(): AbortSignal {
    return this.#shutdown.signal;
  }

  emit(event: TelemetryEvent): void {
    this.#events.next(event);
  }

  drop(frameId: number, stage: string, reason: DropReason, detail: string): void {
    this.emit({ type: 'drop', atNs: this.clock.nowNs(), frameId, stage, reason, detail });
  }

  run(): Promise<RunSummary> {
    if (this.#run) return Promise.reject(new Error('Graph.run: this graph has already run (a graph runs once)'));
    this.#run = new Promise((resolve) => (this.#resolveRun = resolve));
    const startNs = this.clock.nowNs();
    this.#aggregator.start(startNs);
    this.#nextStatsNs = startNs + this.#statsIntervalNs;
    if (!this.virtual) {
      this.#statsTimer = setInterval(() => this.#emitStats(this.clock.nowNs()), this.#config.telemetry.intervalMs);
      this.#statsTimer.unref();
    }
    let stream = this.#sourceFrames();
    for (const runner of this.#runners) stream = stream.pipe(runner.operator());
    stream.subscribe({
      next: (env) => this.#output(env),
      complete: () => void this.#finalize(),
      error: (error: unknown) => {
        this.#internalError(error);
        void this.#finalize();
      },
    });
    return this.#run;
  }

  stop(reason = 'stop'): Promise<RunSummary> {
    if (this.#stopReason === undefined) {
      this.#stopReason = reason;
      if (!this.virtual && this.#run) {
        this.#graceTimer = setTimeout(() => this.#abandonAll(), this.#config.budgets.shutdownGraceMs);
      }
      this.#shutdown.abort(new StageAbort('shutdown', 'graph'));
    }
    return this.#run ?? this.run();
  }

  // --- source ----------------------------------------------------------------------------------

  #sourceFrames(): Observable<Envelope<unknown>> {
    return new Observable<Envelope<unknown>>((subscriber) => {
      this.#sourceSubscriber = subscriber;
      if (this.#shutdown.signal.aborted) {
        subscriber.complete();
      } else if (this.clock instanceof VirtualClock && this.virtual) {
        // One frame of lookahead on the source's own clock, so the graph clock moves only in task order.
        const sourceClock = new VirtualClock(this.clock.nowNs(), this.wallOriginMs);
        const iterator = this.#source.frames(sourceClock, this.#shutdown.signal)[Symbol.asyncIterator]();
        this.scheduler.at(this.clock.nowNs(), () => this.#pullVirtual(iterator, subscriber));
      } else {
        void this.#pumpReal(subscriber);
      }
    });
  }

  async #pumpReal(subscriber: Subscriber<Envelope<unknown>>): Promise<void> {
    try {
      for await (const item of this.#source.frames(this.clock, this.#shutdown.signal)) {
        if (this.#shutdown.signal.aborted) break; // yielded after stop: never entered the graph
        this.#admit(item, subscriber);
      }
    } catch (error) {
      this.#sourceError(error);
    } finally {
      subscriber.complete();
    }
  }

  async #pullVirtual(iterator: AsyncIterator<SourceItem<unknown>>, subscriber: Subscriber<Envelope<unknown>>): Promise<void> {
    let result: IteratorResult<SourceItem<unknown>>;
    try {
      result = await iterator.next();
    } catch (error) {
      this.#sourceError(error);
      subscriber.complete();
      return;
    }
    if (result.done) {
      subscriber.complete();
      return;
    }
    const item = result.value;
    this.scheduler.at(item.captureNs, async () => {
      if (this.#shutdown.signal.aborted) {
        await iterator.return?.();
        subscriber.complete();
        return;
      }
      this.#admit(item, subscriber);
      await this.#pullVirtual(iterator, subscriber);
    });
  }

  #sourceError(error: unknown): void {
    if (this.#shutdown.signal.aborted) return; // a source that throws on its abort signal
    this.#sourceFailed = true;
    this.emit({ type: 'error', atNs: this.clock.nowNs(), frameId: -1, stage: 'source', message: error instanceof Error ? error.message : String(error) });
  }

  /** A source item enters the graph: ladder decision, frame id, deadline, frame skip. */
  #admit(item: SourceItem<unknown>, subscriber: Subscriber<Envelope<unknown>>): void {
    const frameId = this.#nextFrameId++;
    const atNs = this.clock.nowNs();
    const decision = this.ladder.decide(this.costModel);
    if (decision) this.emit({ type: 'degrade', atNs, frameId, ...decision });
    const level = this.ladder.level;
    this.emit({ type: 'frame', atNs, frameId, sourceId: item.sourceId, captureNs: item.captureNs, degradeLevel: level });
    const { frameSkip } = this.ladder.knobsAt(level);
    if (this.#toSkip > frameSkip) this.#toSkip = frameSkip;
    if (this.#toSkip > 0) {
      this.#toSkip -= 1;
      this.drop(frameId, 'source', 'skipped', `frameSkip ${frameSkip} at level ${level}`);
      return;
    }
    this.#toSkip = frameSkip;
    subscriber.next({
      frameId,
      sourceId: item.sourceId,
      captureNs: item.captureNs,
      captureWallMs: item.captureWallMs,
      deadlineNs: item.captureNs + this.#endToEndNs,
      degradeLevel: level,
      spans: [],
      payload: item.payload,
    });
  }

  // --- the end ---------------------------------------------------------------------------------

  #output(env: Envelope<unknown>): void {
    const exitNs = env.spans[env.spans.length - 1]?.exitNs ?? this.clock.nowNs();
    this.emit({ type: 'output', atNs: exitNs, frameId: env.frameId, latencyNs: exitNs - env.captureNs, late: exitNs > env.deadlineNs });
    this.#outputs.next(env);
  }

  #emitStats(atNs: bigint): void {
    this.emit({ type: 'stats', atNs, summary: this.#aggregator.snapshot() });
  }

  /** Virtual clock: a stats event at every interval boundary the next task moves past. */
  #statsUpTo(atNs: bigint): void {
    while (this.#nextStatsNs <= atNs && !this.#finalizing) {
      this.#emitStats(this.#nextStatsNs);
      this.#nextStatsNs += this.#statsIntervalNs;
    }
  }

  #abandonAll(): void {
    for (const runner of this.#runners) runner.abandon();
    this.#sourceSubscriber?.complete();
  }

  #internalError(error: unknown): void {
    const message = error instanceof Error ? (error.stack ?? error.message) : String(error);
    this.emit({ type: 'error', atNs: this.clock.nowNs(), frameId: -1, stage: 'graph', message });
  }

  async #finalize(): Promise<void> {
    if (this.#finalizing) return;
    this.#finalizing = true;
    if (this.#statsTimer) clearInterval(this.#statsTimer);
    if (this.#graceTimer) clearTimeout(this.#graceTimer);
    const closers: [string, (() => Promise<void>) | undefined][] = [
      ['source', this.#source.close?.bind(this.#source)],
      ...this.#stages.map((stage): [string, (() => Promise<void>) | undefined] => [stage.name, stage.close?.bind(stage)]),
    ];
    for (const [name, close] of closers) {
      try {
        await close?.();
      } catch (error) {
        this.emit({ type: 'error', atNs: this.clock.nowNs(), frameId: -1, stage: name, message: `close() failed: ${error instanceof Error ? error.message : String(error)}` });
      }
    }
    const endReason = this.#stopReason !== undefined ? 'stopped' : this.#sourceFailed ? 'source_error' : 'source_end';
    const endNs = this.clock.nowNs();
    this.#aggregator.end(endNs, endReason, this.#stopReason ?? null);
    const summary = this.#aggregator.snapshot();
    this.#emitStats(endNs);
    this.#events.complete();
    this.#outputs.complete();
    this.#resolveRun?.(summary);
  }
}
