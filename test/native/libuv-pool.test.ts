// Native work that runs on a thread the addon owns (a context's llama.cpp calls, a vision encode)
// leaves libuv's thread pool free: no pool thread waits for it, so sharp, the layout pass and fs
// calls queued behind it run at once. Proven by order, never by time: with more calls in flight than
// the pool has threads, a pool job queued after them completes before any of them does. (Were each
// call holding a pool thread, the job could only start once one of them had finished.)
import assert from 'node:assert/strict';
import { pbkdf2 } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import { LlamaModel } from '../../native/llama.ts';
import { LlamaVision } from '../../native/vision.ts';
import { resolveModel } from '../../models/resolve.ts';
import { MODEL_CACHE, ensureSynthModel } from '../support/fixtures.ts';

/** libuv's pool size in this process (UV_THREADPOOL_SIZE, default 4). */
const POOL = Number(process.env.UV_THREADPOOL_SIZE) || 4;
/** More calls in flight than the pool has threads. */
const IN_FLIGHT = POOL + 1;

/** A job on libuv's pool (one PBKDF2 iteration: microseconds of work). */
const poolJob = (): Promise<void> =>
  new Promise((resolve, reject) => pbkdf2('p', 's', 1, 8, 'sha256', (err) => (err ? reject(err) : resolve())));

/** Starts `calls`, then a pool job; how many calls had settled when the job completed. `done` runs
 * then (to cancel the calls), and the calls are awaited. */
async function settledBeforePoolJob(calls: readonly (() => Promise<unknown>)[], done = (): void => undefined): Promise<number> {
  let settled = 0;
  const running = calls.map((call) => call().finally(() => (settled += 1)));
  await poolJob();
  const before = settled;
  done();
  await Promise.all(running);
  return before;
}

describe('libuv pool stays free while native calls run', () => {
  let model: LlamaModel;
  before(async () => {
    model = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'));
  });
  after(async () => {
    await model.dispose();
  });

  test(`${IN_FLIGHT} generations on as many contexts hold no pool thread`, async () => {
    const contexts = await Promise.all(
      Array.from({ length: IN_FLIGHT }, () => model.createContext({ nCtx: 1024, nBatch: 64, threads: 1 })),
    );
    const stop = new AbortController();
    try {
      // Long generations, cancelled once the pool job is done, so the test costs little CPU.
      const calls = contexts.map(
        (ctx, i) => () =>
          ctx.generate([{ text: `Camera ${i}:`, addSpecial: true }], { maxTokens: 900, ignoreEos: true, signal: stop.signal }),
      );
      assert.equal(await settledBeforePoolJob(calls, () => stop.abort()), 0, 'a generation settled before a pool job queued after it');
    } finally {
      stop.abort();
      for (const ctx of contexts) await ctx.dispose();
    }
  });

  test(`${IN_FLIGHT} generations on one context of several sequences hold no pool thread`, async () => {
    const ctx = await model.createContext({ nCtx: 1024, nSeq: IN_FLIGHT, threads: 1 });
    const stop = new AbortController();
    try {
      const calls = Array.from(
        { length: IN_FLIGHT },
        (_, seq) => () =>
          ctx.generate([{ text: `Camera ${seq}:`, addSpecial: true }], { maxTokens: 900, ignoreEos: true, seq, signal: stop.signal }),
      );
      assert.equal(await settledBeforePoolJob(calls, () => stop.abort()), 0, 'a generation settled before a pool job queued after it');
    } finally {
      stop.abort();
      await ctx.dispose();
    }
  });

  test(`${IN_FLIGHT} vision encodes hold no pool thread`, async () => {
    const path = await resolveModel('synth:gemma4-vision-tiny-mmproj', 'mmproj', { cacheDir: MODEL_CACHE });
    const visions = await Promise.all(Array.from({ length: IN_FLIGHT }, () => LlamaVision.load(path, { threads: 1 })));
    try {
      // 140 image tokens (a 42 × 30 patch grid): far more work than one PBKDF2 iteration.
      const width = 672;
      const height = 480;
      const pixels = new Float32Array(width * height * 3).fill(0.5);
      const calls = visions.map((v) => () => v.encode(pixels, { layout: 'chw', width, height }));
      assert.equal(await settledBeforePoolJob(calls), 0, 'an encode settled before a pool job queued after it');
    } finally {
      for (const v of visions) await v.dispose();
    }
  });
});
