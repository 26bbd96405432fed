// GraphControl: the few things an operator may change in a running graph, such as over the control socket.
// Each call applies at once, or throws a RangeError or TypeError and changes nothing.
//   setBudgets   new budgets, for frames admitted and stage calls started from now on
//   pinLevel     hold the ladder at a level from the next admission; releaseLevel lets it decide again
//   pause        stop taking frames from the source, while frames inside finish; resume takes them again
// Semantics: pipeline/README.md#control
import type { RunSummary } from '../telemetry/events.ts';
import type { Knobs } from '../types.ts';

export interface GraphBudgets {
  readonly endToEndMs: number;
  readonly stages: Readonly<Record<string, number>>;
}

export interface GraphStatus {
  readonly state: 'idle' | 'running' | 'paused' | 'stopping' | 'ended';
  readonly level: number;
  readonly levels: number;
  readonly pinnedLevel: number | null;
  readonly knobs: Knobs;
  readonly budgets: GraphBudgets;
  readonly summary: RunSummary;
}

export interface GraphControl {
  status(): GraphStatus;
  /** Stage budgets replace those named. null removes one, so the frame deadline alone bounds that stage. */
  setBudgets(budgets: { readonly endToEndMs?: number; readonly stages?: Readonly<Record<string, number | null>> }): void;
  pinLevel(level: number): void;
  releaseLevel(): void;
  pause(): void;
  resume(): void;
}
