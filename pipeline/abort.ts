// Giving up on uninterruptible work (a worker's ORT run, a native clip encode) when a stage's
// AbortSignal fires. The caller stops waiting at once and rethrows `signal.reason`.
// The work itself goes on, and its result is dropped.
// Semantics: pipeline/README.md#deadlines-and-cancel

/** Resolves/rejects with `p`, or rejects with `signal.reason` as soon as `signal` fires. */
export function abortable<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(e);
      },
    );
  });
}

/** One uninterruptible run at a time. `run(start, signal)` waits abortably for the previous run, then calls `start()`.
 * When `signal` fires it rejects at once with `signal.reason`. The run goes on in the background.
 * Its result is discarded and counted in `abandoned`.
 * The next call waits for that run to end, so the resource never has two runs. */
export class AbandonableSlot {
  #running: Promise<void> | undefined;
  #abandoned = 0;

  /** Runs whose caller gave up before they ended. */
  get abandoned(): number {
    return this.#abandoned;
  }

  /** True while a run (possibly abandoned) is in progress. */
  get busy(): boolean {
    return this.#running !== undefined;
  }

  async run<T>(start: () => Promise<T>, signal: AbortSignal): Promise<T> {
    signal.throwIfAborted();
    while (this.#running) await abortable(this.#running, signal);
    const work = start();
    const settled = work.then(
      () => undefined,
      () => undefined,
    );
    this.#running = settled;
    void settled.then(() => {
      if (this.#running === settled) this.#running = undefined;
    });
    try {
      return await abortable(work, signal);
    } catch (err) {
      if (!signal.aborted || err !== signal.reason) throw err;
      this.#abandoned += 1;
      throw err;
    }
  }

  /** Resolves once no run is in progress (close() waits here before freeing the resource). */
  async idle(): Promise<void> {
    while (this.#running) await this.#running;
  }
}
