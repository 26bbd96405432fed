// Runs one stage outside the graph, for benchmarks, tests and tools.
// It builds the StageContext the graph would give a frame, with the caller's overrides.
// Without a deadline the frame never goes stale.
import { RealClock, type Clock } from './clock.ts';
import type { FrameMeta, Knobs, StageContext, StageEvent } from './types.ts';

export interface StandaloneContextOptions {
  readonly clock?: Clock;
  readonly frame?: Partial<FrameMeta>;
  /** Frame and stage deadline on `clock` (default: far in the future). */
  readonly deadlineNs?: bigint;
  readonly knobs?: Partial<Knobs>;
  readonly signal?: AbortSignal;
  readonly report?: (event: StageEvent) => void;
}

const NEVER = 1n << 62n;
const DEFAULT_KNOBS: Knobs = { imageTokens: 280, maxNewTokens: 48, draft: false, frameSkip: 0 };

export function standaloneContext(options: StandaloneContextOptions = {}): StageContext {
  const clock = options.clock ?? new RealClock();
  const deadlineNs = options.deadlineNs ?? options.frame?.deadlineNs ?? NEVER;
  return {
    frame: {
      frameId: 0,
      sourceId: 'standalone',
      captureNs: clock.nowNs(),
      captureWallMs: clock.wallMs(),
      degradeLevel: 0,
      ...options.frame,
      deadlineNs,
    },
    clock,
    signal: options.signal ?? new AbortController().signal,
    stageDeadlineNs: deadlineNs,
    knobs: { ...DEFAULT_KNOBS, ...options.knobs },
    report: options.report ?? (() => {}),
  };
}
