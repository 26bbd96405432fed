// How a source waits for a frame's due time, on either clock. Shared by every source so that
// pacing (never early, no drift, virtual time jumps) is written once.
import type { Clock } from './clock.ts';

/** Waits until `dueNs` on `clock` and returns the capture time, or null if `signal` fired first.
 * A virtual clock jumps to `dueNs`, so replays are deterministic.
 * A real clock sleeps until it reads at least `dueNs`; setTimeout may fire early, so it loops.
 * There the capture time is the clock reading when the frame was taken. */
export async function waitUntilDue(clock: Clock, dueNs: bigint, signal: AbortSignal): Promise<bigint | null> {
  if (clock.virtual) {
    const advanceTo = (clock as { advanceTo?: (ns: bigint) => void }).advanceTo;
    if (typeof advanceTo !== 'function') throw new TypeError('a virtual clock must have advanceTo(ns)');
    advanceTo.call(clock, dueNs);
    return signal.aborted ? null : dueNs;
  }
  return (await sleepUntil(clock, dueNs, signal)) ? clock.nowNs() : null;
}

/** Wall-clock ms of an instant on `clock` (for captures stamped after the fact). */
export function wallMsAt(clock: Clock, captureNs: bigint): number {
  return clock.wallMs() - Number(clock.nowNs() - captureNs) / 1e6;
}

function sleepUntil(clock: Clock, targetNs: bigint, signal: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(false);
    let timer: NodeJS.Timeout | undefined;
    const onAbort = (): void => {
      clearTimeout(timer);
      resolve(false);
    };
    const check = (): void => {
      const left = targetNs - clock.nowNs();
      if (left <= 0n) {
        signal.removeEventListener('abort', onAbort);
        resolve(true);
      } else {
        timer = setTimeout(check, Math.min(Math.ceil(Number(left) / 1e6), 2_147_483_647));
      }
    };
    signal.addEventListener('abort', onAbort, { once: true });
    check();
  });
}
