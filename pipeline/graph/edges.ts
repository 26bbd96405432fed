// Edges: what waits in front of a stage while it is busy. Never unbounded.
import type { EdgePolicy } from '../config.ts';
import type { DropReason, Envelope } from '../types.ts';

export interface Edge {
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

export function createEdge(policy: EdgePolicy, where: string): Edge {
  if (policy.policy === 'latest') return new LatestEdge();
  if (policy.policy === 'queue' && Number.isInteger(policy.capacity) && policy.capacity >= 1) return new QueueEdge(policy.capacity);
  throw new TypeError(
    `createGraph: ${where}: expected {policy:'latest'} or {policy:'queue', capacity ≥ 1} but received ${JSON.stringify(policy)}`,
  );
}
