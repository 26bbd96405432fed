// The graph runtime: a source and a typed chain of stages become one RxJS pipeline with
// per-frame deadlines, bounded edges, a degradation ladder and one telemetry stream.
//
//   const graph = createGraph({ source, stages: chain(preprocess, encode, decode, actions, publish), clock, config });
//   const summary = await graph.run();
//
// Semantics (envelope, drops, deadlines, clocks, stop): pipeline/README.md.
import { Observable, Subject, type Subscriber } from 'rxjs';
import { CostModel, DegradeLadder } from '../budget.ts';
import { VirtualClock, msToNs, nsToMs, type Clock } from '../clock.ts';
import type { GraphConfig } from '../config.ts';
import { TelemetryAggregator } from '../telemetry/aggregator.ts';
import type { ControlEvent, RunSummary, TelemetryEvent } from '../telemetry/events.ts';
import {
  StageAbort,
  isRejection,
  type DropReason,
  type Envelope,
  type FrameSource,
  type SourceIncident,
  type SourceItem,
  type SourceRejection,
  type Stage,
} from '../types.ts';
import type { StageChain } from './chain.ts';
import type { GraphBudgets, GraphControl, GraphStatus } from './control.ts';
import { RealScheduler, VirtualScheduler, type Scheduler } from './scheduler.ts';
import { StageRunner, type RunnerHost } from './stage-runner.ts';

export interface Graph<O = unknown, I = unknown> {
  /** Every telemetry event of the run. Hot: subscribe before run(); it completes when the run ends. */
  readonly events: Observable<TelemetryEvent>;
  /** What the last stage returned, per frame. Hot, like `events`. */
  readonly outputs: Observable<Envelope<O>>;
  /** Each frame as it entered the graph, before frame skip, with its payload. Rejected inputs are left out. */
  readonly inputs: Observable<Envelope<I>>;
  /** Runs the graph once; resolves with the summary when the source has ended and every frame
   * has come out or been dropped, or after stop(). */
  run(): Promise<RunSummary>;
  /** Stops the run and resolves with the same summary as run(). Idempotent; before run(), run() ends at once. */
  stop(reason?: string): Promise<RunSummary>;
  /** Budgets, ladder pin, pause/resume and status of the running graph. */
  readonly control: GraphControl;
}

export interface GraphOptions<I, O> {
  readonly source: FrameSource<I>;
  /** In pipeline order (see chain()); names unique. */
  readonly stages: StageChain<I, O>;
  readonly clock: Clock;
  readonly config: GraphConfig;
  /** Frame ids are first, first + stride, … (default 0, 1, …). So the cameras' graphs of one run keep their ids apart. */
  readonly frameIds?: { readonly first: number; readonly stride: number };
}

export function createGraph<I, O>({ source, stages, clock, config, frameIds }: GraphOptions<I, O>): Graph<O, I> {
  // The chain's types end here: the runtime moves envelopes of unknown payloads between stages.
  return new GraphRuntime({ source, stages: stages?.stages, clock, config, frameIds }) as Graph<unknown> as Graph<O, I>;
}

interface RuntimeOptions {
  readonly source: FrameSource<unknown>;
  readonly stages: readonly Stage<never, unknown>[];
  readonly clock: Clock;
  readonly config: GraphConfig;
  readonly frameIds?: { readonly first: number; readonly stride: number } | undefined;
}

/** Calls graph.stop(signal) on the first of `signals`; returns a function that removes the handlers. */
/** The signals that stop a run cleanly: Ctrl-C, a supervisor's stop, and a closed terminal. */
export const STOP_SIGNALS: readonly NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];

export function stopOnSignals(graph: Graph, signals: readonly NodeJS.Signals[] = STOP_SIGNALS): () => void {
  const handler = (signal: NodeJS.Signals): void => void graph.stop(signal);
  for (const signal of signals) process.on(signal, handler);
  return () => {
    for (const signal of signals) process.off(signal, handler);
  };
}

/** The source's frame interval is the median of its last ARRIVAL_INTERVALS arrival intervals.
 * It counts as known from ARRIVAL_INTERVALS_MIN intervals on. */
const ARRIVAL_INTERVALS = 15;
const ARRIVAL_INTERVALS_MIN = 3;

const wallOriginOf = (clock: Clock): number => clock.wallMs() - Number(clock.nowNs() / 1_000_000n);

class GraphRuntime implements Graph, RunnerHost, GraphControl {
  readonly events: Observable<TelemetryEvent>;
  readonly outputs: Observable<Envelope<unknown>>;
  readonly inputs: Observable<Envelope<unknown>>;
  readonly clock: Clock;
  readonly virtual: boolean;
  readonly wallOriginMs: number;
  readonly scheduler: Scheduler;
  readonly costModel: CostModel;
  readonly ladder: DegradeLadder;
  readonly dropPredictedMiss: boolean;
  readonly dropPredictedConflation: boolean;

  earliestEnd(
    level: number,
    from: number,
    enterNs: bigint,
    deadlineNs: bigint,
  ): { readonly endNs: bigint; readonly notes: readonly string[] } {
    const notes: string[] = [];
    let t = enterNs;
    for (let i = from; i < this.#stages.length; i++) {
      const { waitMs, ownMs, busyUntilNs, fastestNs } = this.#fastestRun(i, level, deadlineNs, i === from, enterNs);
      const runner = this.#runners[i]!;
      if (ownMs > 0)
        notes.push(`${runner.name} predicts ${ownMs.toFixed(1)} ms${waitMs > 0 ? ` after ${waitMs.toFixed(1)} ms of its queue` : ''}`);
      if (i > from) {
        const free = runner.freeAtNs(t, fastestNs, busyUntilNs);
        if (free > t) notes.push(`${runner.name} busy for ${nsToMs(free - t).toFixed(1)} ms more`);
        t = free;
      }
      // The stage's queue drains from now, while the stages before it run.
      const startNs = enterNs + msToNs(waitMs);
      if (startNs > t) t = startNs;
      t += fastestNs;
    }
    return { endNs: t, notes };
  }

  predictConflation(env: Envelope<unknown>, from: number, enterNs: bigint): string | undefined {
    // The source's last frame has no successor to replace it (a looping replay's pass ends there too).
    if (this.#sourceEnded || this.#arrivals === this.#source.expectedItems) return undefined;
    const intervalNs = this.#arrivalIntervalNs;
    if (intervalNs === undefined) return undefined;
    const { frameSkip } = this.ladder.knobsAt(env.degradeLevel);
    const everyNs = intervalNs * BigInt(frameSkip + 1);
    let t = enterNs;
    for (let i = from; i < this.#stages.length; i++) {
      const { busyUntilNs, fastestNs } = this.#fastestRun(i, env.degradeLevel, env.deadlineNs, i === from, enterNs);
      if (fastestNs === 0n) return undefined; // a stage not timed yet: nothing is known
      if (i > from) {
        const runner = this.#runners[i]!;
        const freeNs = runner.freeAtNs(t, fastestNs, busyUntilNs);
        // The next frame gets here about one interval after this one. It is no later, since it waits less behind busy stages.
        // One more interval of margin covers a late next frame, or upstream runs slower than their fastest.
        if (runner.conflates && freeNs - t > 2n * everyNs) {
          const next = env.frameId + this.#frameIdStride * (frameSkip + 1);
          const { name } = runner;
          return `would be replaced at ${name} by frame ${next}: ${name} busy for ${nsToMs(freeNs - enterNs).toFixed(1)} ms more, next frame there in ~${nsToMs(t + everyNs - enterNs).toFixed(1)} ms`;
        }
        t = freeNs;
      }
      t += fastestNs;
    }
    return undefined;
  }

  /** Stage i's time for a frame at `level` with deadline `deadlineNs`: the larger of its fastest recent run and ownMs,
   * the wait the stage predicts before it (waitMs), and when its call in flight ends, asked at `nowNs` (where it says).
   * Its prediction is on the monotonic clock, so a virtual graph does not ask. `entering`: the frame is at stage i's own entry. */
  #fastestRun(
    i: number,
    level: number,
    deadlineNs: bigint,
    entering: boolean,
    nowNs: bigint,
  ): { readonly waitMs: number; readonly ownMs: number; readonly busyUntilNs: bigint | undefined; readonly fastestNs: bigint } {
    const stage = this.#stages[i]!;
    const predicted = this.virtual ? undefined : stage.predict?.(deadlineNs, entering);
    const waitMs = Math.max(0, predicted?.waitMs ?? 0);
    const ownMs = Math.max(0, predicted?.ownMs ?? 0);
    const busyUntilNs = predicted?.busyMs === undefined ? undefined : nowNs + msToNs(Math.max(0, predicted.busyMs));
    return { waitMs, ownMs, busyUntilNs, fastestNs: msToNs(Math.max(ownMs, this.costModel.fastestMs(stage.name, level))) };
  }

  readonly #source: FrameSource<unknown>;
  readonly #stages: readonly Stage<unknown, unknown>[];
  readonly #runners: readonly StageRunner[];
  /** Frames on their way to stages that take reservations: frame id → stage index → release. */
  readonly #reservations = new Map<number, Map<number, () => void>>();
  readonly #config: GraphConfig;
  #endToEndNs: bigint;
  #budgets: GraphBudgets;
  #paused: { promise: Promise<void>; resume: () => void } | undefined;
  readonly #statsIntervalNs: bigint;
  readonly #events = new Subject<TelemetryEvent>();
  readonly #outputs = new Subject<Envelope<unknown>>();
  readonly #inputs = new Subject<Envelope<unknown>>();
  readonly #lockstep: boolean;
  /** Lockstep: how far the source's timeline has been moved back by waits (ns). */
  #lockstepShiftNs = 0n;
  /** Lockstep: the frame whose end lets the source be pulled again, and the pull. */
  #lockstepWait: { readonly frameId: number; readonly pull: () => Promise<void> } | undefined;
  readonly #aggregator: TelemetryAggregator;
  readonly #shutdown = new AbortController();
  #nextFrameId = 0;
  readonly #frameIdStride: number = 1;
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
  /** The source has ended (no frame comes after the last one admitted). */
  #sourceEnded = false;
  /** Source items that arrived (rejected ones included), the last one's arrival, and the last
   * ARRIVAL_INTERVALS intervals between arrivals (ns), oldest first. */
  #arrivals = 0;
  #lastArrivalNs: bigint | undefined;
  readonly #intervals: bigint[] = [];
  /** Their median, once ARRIVAL_INTERVALS_MIN are known: the source's frame interval. */
  #arrivalIntervalNs: bigint | undefined;

  constructor({ source, stages, clock, config, frameIds }: RuntimeOptions) {
    if (!source || typeof source.frames !== 'function')
      throw new TypeError('createGraph: expected source to be a FrameSource with a frames() method');
    if (!Array.isArray(stages) || stages.length === 0)
      throw new TypeError('createGraph: expected stages to be a non-empty chain of stages (chain(...))');
    const names = new Set<string>();
    stages.forEach((stage: Stage<never, unknown>, i) => {
      if (!stage || typeof stage.name !== 'string' || stage.name === '' || stage.name === 'source') {
        throw new TypeError(
          `createGraph: stages[${i}]: expected a non-empty name other than 'source' but received ${JSON.stringify(stage?.name)}`,
        );
      }
      if (typeof stage.process !== 'function') throw new TypeError(`createGraph: stage '${stage.name}': expected a process() method`);
      if (names.has(stage.name)) throw new TypeError(`createGraph: stage name '${stage.name}' is used twice`);
      names.add(stage.name);
    });
    if (!clock || typeof clock.nowNs !== 'function') throw new TypeError('createGraph: expected clock to be a Clock');
    if ((config.clock === 'virtual') !== clock.virtual) {
      throw new TypeError(`createGraph: config.clock is '${config.clock}' but the clock given is ${clock.virtual ? 'virtual' : 'real'}`);
    }
    if (clock.virtual && !(clock instanceof VirtualClock))
      throw new TypeError('createGraph: a virtual clock must be a VirtualClock (the graph advances it)');
    const { endToEndMs } = config.budgets;
    if (!(Number.isFinite(endToEndMs) && endToEndMs > 0))
      throw new RangeError(`createGraph: expected config.budgets.endToEndMs > 0 but received ${endToEndMs}`);

    if (frameIds) {
      const { first, stride } = frameIds;
      if (!(Number.isSafeInteger(first) && first >= 0 && Number.isSafeInteger(stride) && stride >= 1))
        throw new RangeError(
          `createGraph: expected frameIds { first ≥ 0, stride ≥ 1 } (integers) but received ${JSON.stringify(frameIds)}`,
        );
      this.#nextFrameId = first;
      this.#frameIdStride = stride;
    }
    this.#source = source;
    this.#stages = stages as readonly Stage<unknown, unknown>[];
    this.#config = config;
    this.clock = clock;
    this.virtual = clock.virtual;
    this.wallOriginMs = wallOriginOf(clock);
    if (config.lockstep && !clock.virtual) throw new TypeError('createGraph: lockstep needs a virtual clock (config.clock "virtual")');
    this.#lockstep = config.lockstep === true;
    this.#endToEndNs = msToNs(endToEndMs);
    this.#budgets = { endToEndMs, stages: { ...config.budgets.stages } };
    this.#statsIntervalNs = msToNs(config.telemetry.intervalMs);
    this.dropPredictedMiss = config.budgets.dropPredictedMiss;
    // Lockstep processes every frame: no frame is ever replaced, so none is dropped for it.
    this.dropPredictedConflation = config.budgets.dropPredictedConflation && !this.#lockstep;
    this.ladder = new DegradeLadder(config.ladder, endToEndMs);
    const { window, quantile, ewmaAlpha, minSamples } = config.ladder;
    this.costModel = new CostModel({ stages: [...names], levels: this.ladder.levels, window, quantile, ewmaAlpha, minSamples });
    const onError = (error: unknown): void => this.#internalError(error);
    this.scheduler =
      clock instanceof VirtualClock && clock.virtual
        ? new VirtualScheduler(clock, (atNs) => this.#statsUpTo(atNs), onError)
        : new RealScheduler(onError);
    this.#runners = this.#stages.map((stage, i) => new StageRunner(stage, i, i === stages.length - 1, this, config));
    this.#aggregator = new TelemetryAggregator(clock.virtual ? 'virtual' : 'real', [...names]);
    this.#aggregator.subscribeTo(this.#events);
    this.events = this.#events.asObservable();
    this.outputs = this.#outputs.asObservable();
    this.inputs = this.#inputs.asObservable();
  }

  get control(): GraphControl {
    return this;
  }

  // --- control ---------------------------------------------------------------------------------

  status(): GraphStatus {
    const state =
      this.#resolveRun === undefined
        ? 'idle'
        : this.#finalizing
          ? 'ended'
          : this.#stopReason !== undefined
            ? 'stopping'
            : this.#paused
              ? 'paused'
              : 'running';
    return {
      state,
      level: this.ladder.level,
      levels: this.ladder.levels,
      pinnedLevel: this.ladder.pinned,
      knobs: this.ladder.knobsAt(this.ladder.level),
      budgets: { endToEndMs: this.#budgets.endToEndMs, stages: { ...this.#budgets.stages } },
      summary: this.#aggregator.snapshot(),
    };
  }

  setBudgets(budgets: { readonly endToEndMs?: number; readonly stages?: Readonly<Record<string, number | null>> }): void {
    const endToEndMs = budgets.endToEndMs ?? this.#budgets.endToEndMs;
    if (!(typeof endToEndMs === 'number' && Number.isFinite(endToEndMs) && endToEndMs > 0 && endToEndMs <= 3_600_000)) {
      throw new RangeError(`setBudgets: endToEndMs must be a number in (0, 3600000] but is ${JSON.stringify(budgets.endToEndMs)}`);
    }
    const stages: Record<string, number> = { ...this.#budgets.stages };
    for (const [name, ms] of Object.entries(budgets.stages ?? {})) {
      if (!this.#runners.some((r) => r.name === name)) {
        throw new RangeError(`setBudgets: no stage '${name}' in this graph (${this.#runners.map((r) => r.name).join(', ')})`);
      }
      if (ms === null) delete stages[name];
      else if (typeof ms === 'number' && Number.isFinite(ms) && ms > 0) stages[name] = ms;
      else throw new RangeError(`setBudgets: the budget of '${name}' must be a number > 0 or null but is ${JSON.stringify(ms)}`);
    }
    for (const [name, ms] of Object.entries(stages)) {
      if (ms > endToEndMs) throw new RangeError(`setBudgets: the budget of '${name}' (${ms} ms) is above endToEndMs (${endToEndMs} ms)`);
    }
    this.ladder.setEndToEnd(endToEndMs);
    this.#endToEndNs = msToNs(endToEndMs);
    this.#budgets = { endToEndMs, stages };
    for (const runner of this.#runners) runner.setBudget(stages[runner.name]);
    this.#control('set_budgets', JSON.stringify(this.#budgets));
  }

  pinLevel(level: number): void {
    this.ladder.pin(level);
    this.#control('pin_level', `level ${level}`);
  }

  releaseLevel(): void {
    this.ladder.pin(null);
    this.#control('release_level', `at level ${this.ladder.level}`);
  }

  pause(): void {
    if (this.#paused) return;
    let resume!: () => void;
    const promise = new Promise<void>((resolve) => (resume = resolve));
    this.#paused = { promise, resume };
    this.#control('pause', '');
  }

  resume(): void {
    const paused = this.#paused;
    if (!paused) return;
    this.#paused = undefined;
    paused.resume();
    this.#control('resume', '');
  }

  #control(command: ControlEvent['command'], detail: string): void {
    this.emit({ type: 'control', atNs: this.clock.nowNs(), command, detail });
  }

  /** While paused: resolves on resume or shutdown (true if the graph should go on). */
  async #whilePaused(): Promise<boolean> {
    const signal = this.#shutdown.signal;
    while (this.#paused && !signal.aborted) {
      // The listener goes once the pause ends, so pauses never pile listeners on the signal.
      let onAbort = (): void => undefined;
      const shutdown = new Promise<void>((resolve) => signal.addEventListener('abort', (onAbort = () => resolve()), { once: true }));
      try {
        await Promise.race([this.#paused.promise, shutdown]);
      } finally {
        signal.removeEventListener('abort', onAbort);
      }
    }
    return !this.#shutdown.signal.aborted;
  }

  get shutdown(): AbortSignal {
    return this.#shutdown.signal;
  }

  emit(event: TelemetryEvent): void {
    this.#events.next(event);
    const wait = this.#lockstepWait;
    if (wait && (event.type === 'output' || event.type === 'drop') && event.frameId === wait.frameId) {
      this.#lockstepWait = undefined;
      this.scheduler.at(this.clock.nowNs(), wait.pull);
    }
  }

  reserveAhead(env: Envelope<unknown>, from: number): void {
    // A prediction on the monotonic clock: a virtual graph does not ask (see #fastestRun).
    if (this.virtual) return;
    for (let i = from + 1; i < this.#stages.length; i++) {
      const stage = this.#stages[i]!;
      if (!stage.reserve) continue;
      let held = this.#reservations.get(env.frameId);
      if (!held) this.#reservations.set(env.frameId, (held = new Map()));
      if (!held.has(i)) held.set(i, stage.reserve(env.deadlineNs));
    }
  }

  releaseAt(frameId: number, index: number): void {
    const held = this.#reservations.get(frameId);
    const release = held?.get(index);
    if (!held || !release) return;
    held.delete(index);
    if (held.size === 0) this.#reservations.delete(frameId);
    release();
  }

  /** The frame left the graph (dropped, or out of the last stage): every reservation it holds ends. */
  #releaseAll(frameId: number): void {
    const held = this.#reservations.get(frameId);
    if (!held) return;
    this.#reservations.delete(frameId);
    for (const release of held.values()) release();
  }

  drop(frameId: number, stage: string, reason: DropReason, detail: string, cause?: string): void {
    this.#releaseAll(frameId);
    this.emit({ type: 'drop', atNs: this.clock.nowNs(), frameId, stage, reason, detail, ...(cause ? { cause } : {}) });
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
        const iterator = this.#source.frames(sourceClock, this.#shutdown.signal, this.#reportSource)[Symbol.asyncIterator]();
        this.scheduler.at(this.clock.nowNs(), () => this.#pullVirtual(iterator, subscriber));
      } else {
        void this.#pumpReal(subscriber);
      }
    });
  }

  async #pumpReal(subscriber: Subscriber<Envelope<unknown>>): Promise<void> {
    try {
      for await (const item of this.#source.frames(this.clock, this.#shutdown.signal, this.#reportSource)) {
        // Paused: the frame that arrived waits with the source until resume (its deadline runs on).
        if (this.#paused && !(await this.#whilePaused())) break;
        if (this.#shutdown.signal.aborted) break; // yielded after stop: never entered the graph
        this.#admit(item, subscriber);
      }
    } catch (error) {
      this.#sourceError(error);
    } finally {
      this.#sourceEnded = true;
      subscriber.complete();
    }
  }

  async #pullVirtual(
    iterator: AsyncIterator<SourceItem<unknown> | SourceRejection>,
    subscriber: Subscriber<Envelope<unknown>>,
  ): Promise<void> {
    let result: IteratorResult<SourceItem<unknown> | SourceRejection>;
    try {
      result = await iterator.next();
    } catch (error) {
      this.#sourceError(error);
      subscriber.complete();
      return;
    }
    if (result.done) {
      this.#sourceEnded = true;
      subscriber.complete();
      return;
    }
    let item = result.value;
    if (this.#lockstep) {
      // Enter no earlier than now: the source's timeline moves back by the time the pipeline took.
      const atNs = item.captureNs + this.#lockstepShiftNs;
      const enterNs = atNs > this.clock.nowNs() ? atNs : this.clock.nowNs();
      this.#lockstepShiftNs = enterNs - item.captureNs;
      const stampNs = item.stampNs ?? this.clock.unixNs(item.captureNs);
      item = { ...item, captureNs: enterNs, captureWallMs: this.wallOriginMs + Number(enterNs) / 1e6, stampNs };
    }
    const entering = item;
    this.scheduler.at(entering.captureNs, async () => {
      // Paused: virtual time stands still until resume (the frame pulled ahead waits here).
      if (this.#paused) await this.#whilePaused();
      if (this.#shutdown.signal.aborted) {
        await iterator.return?.();
        subscriber.complete();
        return;
      }
      const pull = (): Promise<void> => this.#pullVirtual(iterator, subscriber);
      // Set before admission: a frame dropped on entry ends inside #admit.
      if (this.#lockstep) this.#lockstepWait = { frameId: this.#nextFrameId, pull };
      this.#admit(entering, subscriber);
      if (!this.#lockstep) await pull();
    });
  }

  readonly #reportSource = (incident: SourceIncident): void => {
    this.emit({ type: 'source', atNs: this.clock.nowNs(), sourceId: this.#source.id, kind: incident.kind, detail: incident.detail });
  };

  #sourceError(error: unknown): void {
    if (this.#shutdown.signal.aborted) return; // a source that throws on its abort signal
    this.#sourceFailed = true;
    this.emit({
      type: 'error',
      atNs: this.clock.nowNs(),
      frameId: -1,
      stage: 'source',
      message: error instanceof Error ? error.message : String(error),
    });
  }

  /** A source item enters the graph: ladder decision, frame id, deadline, frame skip. A rejected
   * input enters as a frame and is dropped at once. */
  #admit(item: SourceItem<unknown> | SourceRejection, subscriber: Subscriber<Envelope<unknown>>): void {
    const frameId = this.#nextFrameId;
    this.#nextFrameId += this.#frameIdStride;
    const atNs = this.clock.nowNs();
    this.#recordArrival(atNs);
    const stampNs = item.stampNs ?? this.clock.unixNs(item.captureNs);
    const { sourceId, captureNs } = item;
    if (isRejection(item)) {
      this.emit({ type: 'frame', atNs, frameId, sourceId, captureNs, stampNs, degradeLevel: this.ladder.level });
      const detail = item.detail ? `${item.rejected}: ${item.detail}` : item.rejected;
      this.emit({ type: 'drop', atNs, frameId, stage: 'source', reason: 'rejected', detail, cause: item.rejected });
      return;
    }
    const decision = this.ladder.decide(this.costModel);
    if (decision) this.emit({ type: 'degrade', atNs, frameId, ...decision });
    const level = this.ladder.level;
    this.emit({ type: 'frame', atNs, frameId, sourceId, captureNs, stampNs, degradeLevel: level });
    const env: Envelope<unknown> = {
      frameId,
      sourceId,
      captureNs,
      captureWallMs: item.captureWallMs,
      stampNs,
      sourceStamp: item.sourceStamp ?? null,
      deadlineNs: captureNs + this.#endToEndNs,
      degradeLevel: level,
      spans: [],
      payload: item.payload,
    };
    this.#inputs.next(env);
    const { frameSkip } = this.ladder.knobsAt(level);
    if (this.#toSkip > frameSkip) this.#toSkip = frameSkip;
    if (this.#toSkip > 0) {
      this.#toSkip -= 1;
      this.drop(frameId, 'source', 'skipped', `frameSkip ${frameSkip} at level ${level}`);
      return;
    }
    this.#toSkip = frameSkip;
    subscriber.next(env);
  }

  #recordArrival(atNs: bigint): void {
    this.#arrivals += 1;
    if (this.#lastArrivalNs !== undefined) {
      this.#intervals.push(atNs - this.#lastArrivalNs);
      if (this.#intervals.length > ARRIVAL_INTERVALS) this.#intervals.shift();
      if (this.#intervals.length >= ARRIVAL_INTERVALS_MIN) {
        const sorted = [...this.#intervals].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
        this.#arrivalIntervalNs = sorted[sorted.length >> 1];
      }
    }
    this.#lastArrivalNs = atNs;
  }

  // --- the end ---------------------------------------------------------------------------------

  #output(env: Envelope<unknown>): void {
    this.#releaseAll(env.frameId); // (none left: each ended at its stage's entry)
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
        this.emit({
          type: 'error',
          atNs: this.clock.nowNs(),
          frameId: -1,
          stage: name,
          message: `close() failed: ${error instanceof Error ? error.message : String(error)}`,
        });
      }
    }
    const endReason = this.#stopReason !== undefined ? 'stopped' : this.#sourceFailed ? 'source_error' : 'source_end';
    const endNs = this.clock.nowNs();
    this.#aggregator.end(endNs, endReason, this.#stopReason ?? null);
    const summary = this.#aggregator.snapshot();
    this.#emitStats(endNs);
    this.#events.complete();
    this.#outputs.complete();
    this.#inputs.complete();
    this.#resolveRun?.(summary);
  }
}
