// GraphControl: the few things a running graph lets an operator change, for the control socket (or
// any other caller). Each call applies at once or throws (RangeError, TypeError) and changes nothing.
//   setBudgets   new end-to-end and/or stage budgets: frames admitted from now on get the new
//                deadline, stage calls started from now on the new stage budget
//   pinLevel     hold the degradation ladder at a level (the step happens at the next admission,
//                as a degrade event with reason 'pinned'); releaseLevel lets it decide again
//   pause        the graph stops taking frames from the source (frames inside finish); resume
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
  /** Stage budgets replace those named; null removes one (the stage is then bound by the frame deadline only). */
  setBudgets(budgets: { readonly endToEndMs?: number; readonly stages?: Readonly<Record<string, number | null>> }): void;
  pinLevel(level: number): void;
  releaseLevel(): void;
  pause(): void;
  resume(): void;
}
