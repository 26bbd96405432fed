// Scheduling: the one place real and virtual time differ. A RealScheduler runs a task at once.
// A VirtualScheduler runs tasks one at a time in (time, insertion) order, advancing the clock to each.
// Semantics: pipeline/README.md#clocks-and-lockstep
import type { VirtualClock } from '../clock.ts';

type Task = () => void | Promise<void>;

export interface Scheduler {
  /** Runs `task` at `atNs` on the graph clock (a real clock only ever asks for "now"). */
  at(atNs: bigint, task: Task): void;
}

export class RealScheduler implements Scheduler {
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
export class VirtualScheduler implements Scheduler {
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
    for (let i = heap.length - 1; i > 0;) {
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
      for (let i = 0; ;) {
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

/** A stage call's own clock on a virtual graph, starting at the entry time.
 * Advancing it is the stage spending virtual time. Crossing the stage deadline fires the call's signal. */
