// The benches' peer threads (a subscriber, a pusher) end by themselves.
import type { Worker } from 'node:worker_threads';

/** Lets the worker end by itself, its socket closed and its loop empty. Terminating a worker while
 * zeromq tears down its context can corrupt the heap. Terminates it only if it hangs. */
export async function exitOf(worker: Worker, timeoutMs = 5000): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const exited = new Promise<void>((resolve) => worker.once('exit', () => resolve()));
  const hung = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(true), timeoutMs)));
  if (await Promise.race([exited.then(() => false), hung])) await worker.terminate();
  clearTimeout(timer);
}
