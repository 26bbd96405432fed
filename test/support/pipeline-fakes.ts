// Fakes for the graph runtime tests: a source of numbered frames and stages whose cost is
// controlled, plus helpers to run a graph and check that no frame was lost silently.
import assert from 'node:assert/strict';
import { VirtualClock, msToNs, type Clock } from '../../pipeline/clock.ts';
import { loadConfig, type PerceptConfig } from '../../pipeline/config.ts';
import { chain, type StageChain } from '../../pipeline/graph/chain.ts';
import { createGraph, type Graph } from '../../pipeline/graph/graph.ts';
import { eventToJson, type RunSummary, type TelemetryEvent } from '../../pipeline/telemetry/events.ts';
import type { Envelope, FrameSource, SourceItem, Stage, StageContext } from '../../pipeline/types.ts';

export interface FakeSourceOptions {
  /** How many frames; Infinity for endless. */
  readonly frames: number;
  readonly periodMs: number;
}

/** Frames 0, 1, 2, … (payload = index), one every periodMs. On a virtual clock it advances the
 * clock to each capture time; on a real clock it sleeps until then and stops when signal fires. */
export function fakeSource({ frames, periodMs }: FakeSourceOptions): FrameSource<number> & { closed: boolean } {
  const source = {
    id: 'fake',
    closed: false,
    async *frames(clock: Clock, signal: AbortSignal): AsyncGenerator<SourceItem<number>> {
      const startNs = clock.nowNs();
      for (let i = 0; i < frames && !signal.aborted; i++) {
        const dueNs = startNs + msToNs(i * periodMs);
        if (clock instanceof VirtualClock) clock.advanceTo(dueNs);
        else if (!(await sleepUntil(clock, dueNs, signal))) return;
        yield { sourceId: 'fake', captureNs: clock.virtual ? dueNs : clock.nowNs(), captureWallMs: clock.wallMs(), payload: i };
      }
    },
    async close(): Promise<void> {
      source.closed = true;
    },
  };
  return source;
}

function sleepUntil(clock: Clock, dueNs: bigint, signal: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(false);
    const onAbort = (): void => {
      clearTimeout(timer);
      resolve(false);
    };
    const timer = setTimeout(
      () => {
        signal.removeEventListener('abort', onAbort);
        resolve(true);
      },
      Math.max(0, Number(dueNs - clock.nowNs()) / 1e6),
    );
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

export interface FakeStageOptions<I, O> {
  /** Virtual ms the call spends (advances ctx.clock by it in one step). */
  readonly costMs?: (input: I, ctx: StageContext) => number;
  readonly work?: (input: I, ctx: StageContext) => O | Promise<O>;
}

export type FakeStage<I, O> = Stage<I, O> & { closed: boolean; calls: number; maxConcurrent: number };

export function fakeStage<I, O = I>(name: string, { costMs, work }: FakeStageOptions<I, O> = {}): FakeStage<I, O> {
  let running = 0;
  const stage: FakeStage<I, O> = {
    name,
    closed: false,
    calls: 0,
    maxConcurrent: 0,
    async process(input: I, ctx: StageContext): Promise<O> {
      stage.calls += 1;
      running += 1;
      stage.maxConcurrent = Math.max(stage.maxConcurrent, running);
      try {
        const ms = costMs?.(input, ctx) ?? 0;
        if (ms > 0) (ctx.clock as VirtualClock).advance(msToNs(ms));
        return work ? await work(input, ctx) : (input as unknown as O);
      } finally {
        running -= 1;
      }
    },
    async close(): Promise<void> {
      stage.closed = true;
    },
  };
  return stage;
}

/** A decoder-like stage: `tokens` steps of `msPerToken` virtual ms (bounded by knobs.maxNewTokens),
 * checking ctx.signal between steps; on abort it reports the cancel and returns what it has. */
export function fakeDecoder(
  name: string,
  { tokens, msPerToken }: { tokens: number; msPerToken: number },
): FakeStage<number, { frame: number; tokens: number; stop: string }> {
  return fakeStage(name, {
    work: (frame, ctx) => {
      const limit = Math.min(tokens, ctx.knobs.maxNewTokens);
      let n = 0;
      for (; n < limit; n++) {
        if (ctx.signal.aborted) {
          const reason = (ctx.signal.reason as { reason?: 'deadline' | 'shutdown' }).reason ?? 'aborted';
          ctx.report({ kind: 'cancel', reason, detail: `after ${n} tokens` });
          return { frame, tokens: n, stop: reason };
        }
        (ctx.clock as VirtualClock).advance(msToNs(msPerToken));
      }
      return { frame, tokens: n, stop: n === tokens ? 'eos' : 'max_tokens' };
    },
  });
}

/** A config for tests: defaults from the schema, then `overrides` (deep-merged one level). */
export function testConfig(overrides: Record<string, unknown> = {}): PerceptConfig {
  return loadConfig({
    clock: 'virtual',
    budgets: { endToEndMs: 2000, stages: {}, dropPredictedMiss: false },
    ladder: { enabled: false },
    ...overrides,
  });
}

export interface RunResult {
  readonly summary: RunSummary;
  readonly events: TelemetryEvent[];
  readonly outputs: Envelope<unknown>[];
  readonly graph: Graph;
}

/** Runs a graph to the end, collecting every event and output. */
export async function runGraph<I>(options: {
  source: FrameSource<I>;
  stages: StageChain<I, unknown>;
  config: PerceptConfig;
  clock?: Clock;
  onOutput?: (env: Envelope<unknown>, graph: Graph) => void;
  onEvent?: (event: TelemetryEvent, graph: Graph) => void;
  /** Called with the graph before it runs (to subscribe to more of it). */
  onStart?: (graph: Graph) => void;
}): Promise<RunResult> {
  const clock = options.clock ?? (options.config.clock === 'virtual' ? new VirtualClock(0n, 1_700_000_000_000) : undefined);
  assert.ok(clock, 'runGraph: a real-clock config needs an explicit clock');
  const graph = createGraph({ source: options.source, stages: options.stages, clock, config: options.config });
  const events: TelemetryEvent[] = [];
  const outputs: Envelope<unknown>[] = [];
  graph.events.subscribe((event) => {
    events.push(event);
    options.onEvent?.(event, graph);
  });
  graph.outputs.subscribe((env) => {
    outputs.push(env);
    options.onOutput?.(env, graph);
  });
  options.onStart?.(graph);
  const summary = await graph.run();
  return { summary, events, outputs, graph };
}

/** No silent loss: every frame that entered ended as exactly one output or one drop. */
export function assertConservation({ summary, events }: Pick<RunResult, 'summary' | 'events'>): void {
  const entered = events.filter((e) => e.type === 'frame').map((e) => e.frameId);
  const ended = events.flatMap((e) => (e.type === 'output' || e.type === 'drop' ? [e.frameId] : []));
  assert.deepEqual(
    [...ended].sort((a, b) => a - b),
    [...entered].sort((a, b) => a - b),
    'each frame ends exactly once',
  );
  assert.equal(summary.frames.in, summary.frames.out + summary.frames.dropped, 'frames in = out + dropped');
  assert.equal(summary.frames.inFlight, 0);
  const dropSum = Object.values(summary.drops.byReason).reduce((a, b) => a + (b ?? 0), 0);
  assert.equal(dropSum, summary.frames.dropped);
}

export const framesOf = (outputs: readonly Envelope<unknown>[]): number[] => outputs.map((o) => o.frameId);
export const dropsOf = (events: readonly TelemetryEvent[], reason?: string): { frameId: number; stage: string; reason: string }[] =>
  events.flatMap((e) =>
    e.type === 'drop' && (reason === undefined || e.reason === reason) ? [{ frameId: e.frameId, stage: e.stage, reason: e.reason }] : [],
  );

/** Events and outputs as text, for byte-for-byte comparison of two runs. */
export function transcript({ events, outputs }: Pick<RunResult, 'events' | 'outputs'>): string {
  const bigints = (_k: string, v: unknown): unknown => (typeof v === 'bigint' ? v.toString() : v);
  return [...events.map(eventToJson), ...outputs.map((o) => JSON.stringify(o, bigints))].join('\n');
}

/** A run with something of everything: 60 frames through five stages, with conflation, predicted misses, errors
 * every seventh frame and ladder steps. `publish` replaces the last stage (a probe inside the run, say). */
export function eventfulRun(publish: Stage<{ frame: number }, unknown> = fakeStage('publish')) {
  return {
    source: fakeSource({ frames: 60, periodMs: 70 }),
    stages: chain(
      fakeStage<number>('preprocess'),
      fakeStage<number>('encode', { costMs: (_x, ctx) => ctx.knobs.imageTokens }),
      fakeDecoder('decode', { tokens: 40, msPerToken: 4 }),
      fakeStage<{ frame: number }>('actions', {
        work: (g) => {
          if (g.frame % 7 === 3) throw new Error(`unparseable ${g.frame}`);
          return g;
        },
      }),
      publish,
    ),
    config: testConfig({
      budgets: { endToEndMs: 400, stages: { decode: 120 }, dropPredictedMiss: true },
      edges: { default: { policy: 'latest' }, publish: { policy: 'queue', capacity: 4 } },
      ladder: { enabled: true, minSamples: 2, window: 8, upAfter: 4 },
      virtualServiceMs: { preprocess: 15, actions: [5, 4, 3], publish: 1 },
      telemetry: { intervalMs: 500 },
    }),
  };
}
