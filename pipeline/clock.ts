// Every time read in percept goes through a Clock.
// So a replay on a VirtualClock is deterministic: same input and config, same events byte for byte.
// Semantics: pipeline/README.md#clocks-and-lockstep

export interface Clock {
  /** Monotonic time in nanoseconds. */
  nowNs(): bigint;
  /** Wall-clock time in milliseconds since the Unix epoch (for stamps humans read). */
  wallMs(): number;
  /** Unix time (ns since the epoch) of the instant `ns` on this clock: what recordings stamp. */
  unixNs(ns: bigint): bigint;
  /** True when time only moves when someone advances it (replay). */
  readonly virtual: boolean;
}

export class RealClock implements Clock {
  readonly virtual = false;
  // Fixed once, so that Unix stamps keep the monotonic clock's order and spacing.
  readonly #unixOffsetNs = BigInt(Date.now()) * 1_000_000n - process.hrtime.bigint();
  nowNs(): bigint {
    return process.hrtime.bigint();
  }
  wallMs(): number {
    return Date.now();
  }
  unixNs(ns: bigint): bigint {
    return ns + this.#unixOffsetNs;
  }
}

/** Time that moves only when advanced: by the replay source to each message's log time, and by
 * the runtime by each stage's modelled service time. */
export class VirtualClock implements Clock {
  readonly virtual = true;
  #ns: bigint;
  readonly #wallOriginMs: number;

  constructor(startNs = 0n, wallOriginMs = 0) {
    this.#ns = startNs;
    this.#wallOriginMs = wallOriginMs;
  }
  nowNs(): bigint {
    return this.#ns;
  }
  wallMs(): number {
    return this.#wallOriginMs + Number(this.#ns / 1_000_000n);
  }
  unixNs(ns: bigint): bigint {
    return BigInt(Math.round(this.#wallOriginMs)) * 1_000_000n + ns;
  }
  /** Moves time forward by `deltaNs` (never backwards). */
  advance(deltaNs: bigint): void {
    if (deltaNs < 0n) throw new RangeError(`VirtualClock.advance: negative delta ${deltaNs}`);
    this.#ns += deltaNs;
  }
  /** Moves time forward to `ns`; earlier values are ignored (time never goes back). */
  advanceTo(ns: bigint): void {
    if (ns > this.#ns) this.#ns = ns;
  }
}

export const msToNs = (ms: number): bigint => BigInt(Math.round(ms * 1e6));
export const nsToMs = (ns: bigint): number => Number(ns) / 1e6;
