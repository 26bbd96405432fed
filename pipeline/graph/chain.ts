// A typed chain of stages, in the shape of rxjs's `pipe` overloads.
// Each stage's input type is the previous stage's output type, so a chain in the wrong order does not compile.
// The stages' types are erased only inside the runtime, which reads `stages`.
//
//   createGraph({ source, stages: chain(preprocess, encode, decode, actions, publish), clock, config });
import type { Stage } from '../types.ts';

declare const chainTypes: unique symbol;

/** Stages in pipeline order whose types line up; `I` is what the first takes, `O` what the last returns. */
export interface StageChain<I, O> {
  readonly stages: readonly Stage<never, unknown>[];
  /** Carries I (contravariant) and O (covariant) for the type checker; never set. */
  readonly [chainTypes]?: (input: I) => O;
}

export function chain<A, B>(s1: Stage<A, B>): StageChain<A, B>;
export function chain<A, B, C>(s1: Stage<A, B>, s2: Stage<B, C>): StageChain<A, C>;
export function chain<A, B, C, D>(s1: Stage<A, B>, s2: Stage<B, C>, s3: Stage<C, D>): StageChain<A, D>;
export function chain<A, B, C, D, E>(s1: Stage<A, B>, s2: Stage<B, C>, s3: Stage<C, D>, s4: Stage<D, E>): StageChain<A, E>;
export function chain<A, B, C, D, E, F>(
  s1: Stage<A, B>,
  s2: Stage<B, C>,
  s3: Stage<C, D>,
  s4: Stage<D, E>,
  s5: Stage<E, F>,
): StageChain<A, F>;
export function chain<A, B, C, D, E, F, G>(
  s1: Stage<A, B>,
  s2: Stage<B, C>,
  s3: Stage<C, D>,
  s4: Stage<D, E>,
  s5: Stage<E, F>,
  s6: Stage<F, G>,
): StageChain<A, G>;
export function chain<A, B, C, D, E, F, G, H>(
  s1: Stage<A, B>,
  s2: Stage<B, C>,
  s3: Stage<C, D>,
  s4: Stage<D, E>,
  s5: Stage<E, F>,
  s6: Stage<F, G>,
  s7: Stage<G, H>,
): StageChain<A, H>;
export function chain(...stages: readonly Stage<never, unknown>[]): StageChain<unknown, unknown> {
  return { stages };
}

/** A chain of any length whose stages all take and return T (benchmarks, pass-through taps). */
export function chainOf<T>(stages: readonly Stage<T, T>[]): StageChain<T, T> {
  return { stages };
}

/** The chain extended by one stage: a chain built in steps (optional stages) keeps its types. */
export function append<I, O, P>(head: StageChain<I, O>, stage: Stage<O, P>): StageChain<I, P> {
  return { stages: [...head.stages, stage] };
}
