// `percept bench graph`: what the runtime itself costs per hop, with no-op stages driven at `hz` on a RealClock.
// From each output's spans:
//   hop overhead    stage k's enter − stage k−1's exit: bookkeeping, operator hand-off, edge, entry checks
//   stage wrapper   a no-op stage's span: ctx, AbortController, deadline timer, one await
//   hop total       stage k's exit − stage k−1's exit, both together
// The first `warmupFrames` frames are left out for JIT warm-up. Goal: hop overhead p99 ≤ 50 µs.
import { RealClock, type Clock } from '../../pipeline/clock.ts';
import { loadConfig } from '../../pipeline/config.ts';
import { chainOf } from '../../pipeline/graph/chain.ts';
import { createGraph } from '../../pipeline/graph/graph.ts';
import type { Envelope, FrameSource, SourceItem, Stage } from '../../pipeline/types.ts';
import { quantile } from '../stats.ts';

export type BenchGraphOptions = {
  readonly hz?: number;
  readonly frames?: number;
  readonly stages?: number;
  readonly warmupFrames?: number;
};

export type BenchGraphResult = {
  hz: number;
  frames: number;
  stages: number;
  frames_out: number;
  frames_dropped: number;
  achieved_hz: number;
  measured_frames: number;
  hop_overhead_us_p50: number;
  hop_overhead_us_p99: number;
  hop_overhead_us_max: number;
  stage_wrapper_us_p50: number;
  stage_wrapper_us_p99: number;
  hop_total_us_p50: number;
  hop_total_us_p99: number;
  end_to_end_us_p50: number;
  end_to_end_us_p99: number;
  goal_hop_overhead_us_p99: number;
  meets_goal: boolean;
};

const GOAL_US = 50;

export async function benchGraph({
  hz = 1000,
  frames = 5000,
  stages = 5,
  warmupFrames,
}: BenchGraphOptions = {}): Promise<BenchGraphResult> {
  if (!(Number.isFinite(hz) && hz > 0 && hz <= 100_000)) throw new RangeError(`benchGraph: expected 0 < hz ≤ 100000 but received ${hz}`);
  if (!(Number.isInteger(frames) && frames >= 1)) throw new RangeError(`benchGraph: expected frames ≥ 1 but received ${frames}`);
  if (!(Number.isInteger(stages) && stages >= 2 && stages <= 64))
    throw new RangeError(`benchGraph: expected 2 ≤ stages ≤ 64 but received ${stages}`);
  const warmup = warmupFrames ?? Math.min(200, Math.floor(frames / 10));

  const config = loadConfig({
    budgets: { endToEndMs: 60_000, stages: {}, dropPredictedMiss: true },
    ladder: { enabled: true },
    telemetry: { liveTable: 'off' },
  });
  const noop: Stage<unknown, unknown>[] = Array.from({ length: stages }, (_, i) => ({
    name: `noop${i}`,
    process: async (input: unknown) => input,
  }));
  const clock = new RealClock();
  const graph = createGraph({ source: pacedSource(hz, frames), stages: chainOf(noop), clock, config });
  const outputs: Envelope<unknown>[] = [];
  graph.outputs.subscribe((env) => outputs.push(env));
  const startNs = clock.nowNs();
  const summary = await graph.run();
  const elapsedS = Number(clock.nowNs() - startNs) / 1e9;

  const hop: number[] = [];
  const wrapper: number[] = [];
  const total: number[] = [];
  const endToEnd: number[] = [];
  for (const env of outputs) {
    if (env.frameId < warmup) continue;
    const spans = env.spans;
    for (let k = 0; k < spans.length; k++) {
      wrapper.push(Number(spans[k]!.exitNs - spans[k]!.enterNs) / 1e3);
      if (k > 0) {
        hop.push(Number(spans[k]!.enterNs - spans[k - 1]!.exitNs) / 1e3);
        total.push(Number(spans[k]!.exitNs - spans[k - 1]!.exitNs) / 1e3);
      }
    }
    endToEnd.push(Number(spans[spans.length - 1]!.exitNs - env.captureNs) / 1e3);
  }
  const q = quantiles(hop);
  return {
    hz,
    frames,
    stages,
    frames_out: summary.frames.out,
    frames_dropped: summary.frames.dropped,
    achieved_hz: round(summary.frames.in / elapsedS),
    measured_frames: endToEnd.length,
    hop_overhead_us_p50: q(0.5),
    hop_overhead_us_p99: q(0.99),
    hop_overhead_us_max: q(1),
    stage_wrapper_us_p50: quantiles(wrapper)(0.5),
    stage_wrapper_us_p99: quantiles(wrapper)(0.99),
    hop_total_us_p50: quantiles(total)(0.5),
    hop_total_us_p99: quantiles(total)(0.99),
    end_to_end_us_p50: quantiles(endToEnd)(0.5),
    end_to_end_us_p99: quantiles(endToEnd)(0.99),
    goal_hop_overhead_us_p99: GOAL_US,
    meets_goal: q(0.99) <= GOAL_US,
  };
}

const round = (x: number): number => Math.round(x * 100) / 100;

/** Nearest-rank quantiles of `values`, rounded to 0.01. */
function quantiles(values: readonly number[]): (q: number) => number {
  return (q) => round(quantile(values, q));
}

/** `frames` empty frames at `hz`, each due at start + i/hz. Timers do the coarse wait, and setImmediate
 * turns, which let the graph run, do the last millisecond. Node's timers have 1 ms resolution. */
function pacedSource(hz: number, frames: number): FrameSource<number> {
  const periodNs = 1e9 / hz;
  return {
    id: 'bench',
    async *frames(clock: Clock, signal: AbortSignal): AsyncGenerator<SourceItem<number>> {
      const startNs = clock.nowNs();
      for (let i = 0; i < frames && !signal.aborted; i++) {
        const dueNs = startNs + BigInt(Math.round(i * periodNs));
        for (let left = Number(dueNs - clock.nowNs()) / 1e6; left > 0; left = Number(dueNs - clock.nowNs()) / 1e6) {
          await new Promise<void>((resolve) => (left > 1.5 ? setTimeout(resolve, left - 1) : setImmediate(resolve)));
        }
        yield { sourceId: 'bench', captureNs: clock.nowNs(), captureWallMs: clock.wallMs(), payload: i };
      }
    },
  };
}
