// The encoder several cameras share: frames that arrive together go in one encodeBatch call, frames
// that arrive while it runs go in the next one, an idle encoder never holds a frame past what its
// deadline allows, a frame whose signal fires leaves at once, an encoder that cannot batch sees one
// frame at a time, and the encoder closes with the last camera's handle. Fake encoders; no timing is
// asserted beyond a frame's own deadline.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createCameraEncoderStages, type BatchableEncoder } from '../../nodes/encoder-batch.ts';
import type { ImageEmbedding, PixelTensor } from '../../nodes/payloads.ts';
import { RealClock } from '../../pipeline/clock.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';

const clock = new RealClock();
const tensor = (value: number, tokens = 4): PixelTensor => ({
  contract: 'gemma3',
  pixelValues: new Float32Array([value]),
  pixelDims: [1, 1, 1, 1],
  imageTokens: tokens,
});
const embeddingOf = (t: PixelTensor): ImageEmbedding => ({
  data: new Float32Array([t.pixelValues[0]! * 10]),
  nTokens: t.imageTokens,
  nEmbd: 1,
});

/** An encoder that records its calls; each call waits for `gate` (when given) before it returns. */
function fakeEncoder({ batch = true, gate }: { batch?: boolean; gate?: () => Promise<void> } = {}) {
  const calls: { kind: 'one' | 'batch'; values: number[]; atNs: bigint }[] = [];
  let running = 0;
  let maxConcurrent = 0;
  let closed = false;
  const enter = async <T>(fn: () => T): Promise<T> => {
    running += 1;
    maxConcurrent = Math.max(maxConcurrent, running);
    try {
      await gate?.();
      return fn();
    } finally {
      running -= 1;
    }
  };
  const encoder: BatchableEncoder = {
    name: 'encode',
    process: (input) => {
      calls.push({ kind: 'one', values: [input.pixelValues[0]!], atNs: clock.nowNs() });
      return enter(() => embeddingOf(input));
    },
    ...(batch
      ? {
          encodeBatch: (inputs: readonly PixelTensor[]) => {
            calls.push({ kind: 'batch', values: inputs.map((t) => t.pixelValues[0]!), atNs: clock.nowNs() });
            return enter(() => inputs.map(embeddingOf));
          },
        }
      : {}),
    async close() {
      closed = true;
    },
  };
  return { encoder, calls, maxConcurrent: () => maxConcurrent, closed: () => closed };
}

/** One call of the test tensors' size, so the encoder has timed one (it holds nothing before). */
async function warm(stage: { process: (t: PixelTensor, ctx: ReturnType<typeof ctxWith>) => Promise<ImageEmbedding> }, calls: unknown[]) {
  await stage.process(tensor(0), ctxWith());
  assert.equal(calls.length, 1);
}

const ctxWith = (deadlineMs = 60_000, signal?: AbortSignal) =>
  standaloneContext({ clock, deadlineNs: clock.nowNs() + BigInt(deadlineMs) * 1_000_000n, ...(signal ? { signal } : {}) });

test('frames of every camera that arrive together are encoded in one call, in camera order of arrival', async () => {
  const fake = fakeEncoder();
  const stages = createCameraEncoderStages(fake.encoder, { cameras: 3, waitMs: 60_000 });
  await warm(stages[0]!, fake.calls);
  const out = await Promise.all(stages.map((s, i) => s.process(tensor(i + 1), ctxWith())));
  assert.deepEqual(
    out.map((e) => e.data[0]),
    [10, 20, 30],
  );
  assert.deepEqual(
    fake.calls.map((c) => [c.kind, c.values]),
    [
      ['one', [0]],
      ['batch', [1, 2, 3]],
    ],
  );
  const { busyMs, ...counts } = stages[0]!.stats();
  assert.deepEqual(counts, { calls: 2, frames: 4, maxBatch: 3, discarded: 0 });
  assert.ok(busyMs >= 0, `busy ${busyMs} ms`);
});

test('busyMs adds up the time the calls took', async () => {
  const fake = fakeEncoder({ gate: () => new Promise((r) => setTimeout(r, 30)) });
  const stages = createCameraEncoderStages(fake.encoder, { cameras: 2, waitMs: 0 });
  await stages[0]!.process(tensor(1), ctxWith());
  await stages[1]!.process(tensor(2), ctxWith());
  const { calls, busyMs } = stages[0]!.stats();
  assert.equal(calls, 2);
  assert.ok(busyMs >= 2 * 29, `two calls of at least 30 ms each: ${busyMs} ms`);
});

test('frames that arrive while the encoder runs go together in the next call', async () => {
  let release!: () => void;
  let first = true;
  const fake = fakeEncoder({
    gate: () => {
      if (!first) return Promise.resolve();
      first = false;
      return new Promise<void>((r) => (release = r));
    },
  });
  const stages = createCameraEncoderStages(fake.encoder, { cameras: 3, waitMs: 0 });
  const a = stages[0]!.process(tensor(1), ctxWith()); // idle, no wait: runs alone
  const b = stages[1]!.process(tensor(2), ctxWith());
  const c = stages[2]!.process(tensor(3), ctxWith());
  release();
  await Promise.all([a, b, c]);
  assert.deepEqual(
    fake.calls.map((call) => call.values),
    [[1], [2, 3]],
  );
});

test('an idle encoder holds a frame for the others, at most half of what its deadline leaves', async () => {
  const fake = fakeEncoder();
  const stages = createCameraEncoderStages(fake.encoder, { cameras: 2, waitMs: 60_000 });
  const deadlineMs = 300;
  const ctx = ctxWith(deadlineMs);
  // No call of this size timed yet: nothing is held. Then, timed, a frame is held for camera 1 (which
  // never sends) for half of what its deadline leaves, not for the 60 s.
  await stages[0]!.process(tensor(6), ctxWith());
  const out = await stages[0]!.process(tensor(7), ctx);
  assert.equal(out.data[0], 70);
  assert.equal(fake.calls.length, 2);
  assert.ok(fake.calls[1]!.atNs < ctx.stageDeadlineNs, 'the call started before the frame deadline (not after the 60 s wait)');
  // Frames of different sizes never share a call.
  const [x, y] = await Promise.all([stages[0]!.process(tensor(1, 4), ctxWith(200)), stages[1]!.process(tensor(2, 8), ctxWith(200))]);
  assert.deepEqual([x.nTokens, y.nTokens], [4, 8]);
  assert.ok(fake.calls.slice(2).every((c) => c.values.length === 1));
});

test('a frame whose signal fires leaves at once: waiting, it is never encoded; in a running batch, its result is discarded', async () => {
  let release!: () => void;
  const fake = fakeEncoder({ gate: () => new Promise<void>((r) => (release = r)) });
  const stages = createCameraEncoderStages(fake.encoder, { cameras: 3, waitMs: 60_000 });
  const warming = warm(stages[0]!, fake.calls);
  release();
  await warming;
  const waiting = new AbortController();
  const held = stages[0]!.process(tensor(1), ctxWith(60_000, waiting.signal));
  waiting.abort(new Error('deadline'));
  await assert.rejects(held, /deadline/);
  assert.equal(fake.calls.length, 1, 'a frame that left while waiting is not encoded');

  const inBatch = new AbortController();
  const running = [
    stages[0]!.process(tensor(1), ctxWith(60_000, inBatch.signal)),
    stages[1]!.process(tensor(2), ctxWith()),
    stages[2]!.process(tensor(3), ctxWith()),
  ];
  await new Promise((r) => setImmediate(r));
  assert.equal(fake.calls.length, 2);
  inBatch.abort(new Error('shutdown'));
  await assert.rejects(running[0]!, /shutdown/);
  release();
  const [b, c] = await Promise.all(running.slice(1));
  assert.deepEqual([b!.data[0], c!.data[0]], [20, 30]);
  assert.equal(stages[0]!.stats().discarded, 1);
});

test('an encoder that cannot batch sees one frame at a time, in arrival order; it closes with the last handle', async () => {
  const fake = fakeEncoder({ batch: false, gate: () => new Promise((r) => setTimeout(r, 1)) });
  const stages = createCameraEncoderStages(fake.encoder, { cameras: 3, waitMs: 60_000 });
  await Promise.all(stages.map((s, i) => s.process(tensor(i + 1), ctxWith())));
  assert.deepEqual(
    fake.calls.map((c) => [c.kind, c.values]),
    [
      ['one', [1]],
      ['one', [2]],
      ['one', [3]],
    ],
  );
  assert.equal(fake.maxConcurrent(), 1);
  await stages[0]!.close!();
  await stages[1]!.close!();
  assert.equal(fake.closed(), false);
  await stages[2]!.close!();
  assert.equal(fake.closed(), true);
});

/** A stand-in preprocess stage whose frames finish when the test says. */
function gatedPreprocess() {
  const pending: (() => void)[] = [];
  const stage = {
    name: 'preprocess',
    process: (value: number) =>
      new Promise<PixelTensor>((resolve) => {
        pending.push(() => resolve(tensor(value)));
      }),
  };
  return { stage, finish: () => pending.shift()!() };
}

const nextTurn = (): Promise<void> => new Promise((r) => setImmediate(r));

test('announced frames: the encoder waits for the cameras still preprocessing, and for no one else', async () => {
  const fake = fakeEncoder();
  // A long hold: only what is announced decides when the call starts.
  const stages = createCameraEncoderStages(fake.encoder, { cameras: 4, waitMs: 60_000 });
  await warm(stages[0]!, fake.calls);
  const pre = [0, 1, 2].map(() => gatedPreprocess());
  const wrapped = pre.map((p, i) => stages[i]!.announcing(p.stage));
  // Cameras 0, 1 and 2 take a frame into preprocess; camera 3 sends none (dropped before preprocess).
  const runs = wrapped.map((w, i) => w.process(i + 1, ctxWith()).then((t) => stages[i]!.process(t, ctxWith())));
  pre[0]!.finish();
  pre[1]!.finish();
  await nextTurn();
  await nextTurn();
  assert.equal(fake.calls.length, 1, 'cameras 0 and 1 wait for camera 2, still in preprocess');
  pre[2]!.finish();
  await Promise.all(runs);
  assert.deepEqual(
    fake.calls.map((c) => c.values),
    [[0], [1, 2, 3]],
    'one call for the three, without waiting the 60 s for camera 3',
  );
});

test('announced frames: a frame dropped after preprocess (never submitted) does not hold the others', async () => {
  const fake = fakeEncoder();
  const stages = createCameraEncoderStages(fake.encoder, { cameras: 2, waitMs: 60_000 });
  await warm(stages[0]!, fake.calls);
  const pre = [gatedPreprocess(), gatedPreprocess()];
  const w0 = stages[0]!.announcing(pre[0]!.stage);
  const w1 = stages[1]!.announcing(pre[1]!.stage);
  const a = w0.process(1, ctxWith()).then((t) => stages[0]!.process(t, ctxWith()));
  const dropped = w1.process(2, ctxWith()); // its output goes nowhere (e.g. conflated at the edge)
  pre[0]!.finish();
  await nextTurn();
  await nextTurn();
  assert.equal(fake.calls.length, 1, 'camera 0 waits while camera 1 preprocesses');
  pre[1]!.finish();
  await dropped;
  const out = await a;
  assert.equal(out.data[0], 10);
  assert.deepEqual(
    fake.calls.map((c) => c.values),
    [[0], [1]],
  );
});

test("what the shared encoder predicts for a frame: the running call's rest, then one call of every frame ahead of it", async () => {
  // Calls take 200 ms a frame (at least), except the one the test holds open. Predictions are in those units.
  // The timer waits 201 ms: it may fire up to a millisecond early by the monotonic clock the encoder times with.
  let hold: Promise<void> | undefined;
  const fake = fakeEncoder({ gate: () => hold ?? new Promise((r) => setTimeout(r, 201)) });
  const stages = createCameraEncoderStages(fake.encoder, { cameras: 4, waitMs: 0 });
  assert.deepEqual(stages[3]!.predict!(0n, false), { waitMs: 0, ownMs: 0 }, 'no call timed yet: no prediction');
  await warm(stages[0]!, fake.calls);
  const one = stages[3]!.predict!(0n, false);
  assert.equal(one.waitMs, 0, 'idle, nothing waiting');
  assert.ok(one.ownMs >= 200, `one frame at the warm call's pace (${one.ownMs} ms)`);

  let release!: () => void;
  hold = new Promise<void>((r) => (release = r));
  const running = stages[0]!.process(tensor(1), ctxWith()); // idle, no hold: runs alone, held open
  hold = undefined;
  const waiting = stages[1]!.process(tensor(2), ctxWith()); // waits for the next call
  const pre = gatedPreprocess();
  const announced = stages[2]!.announcing(pre.stage).process(3, ctxWith()); // camera 2 in preprocess
  const before = stages[3]!.predict!(0n, false); // camera 3 at its preprocess entry
  assert.ok(before.waitMs > 0 && before.waitMs <= one.ownMs, `the running call's rest (${before.waitMs} ms)`);
  assert.equal(before.ownMs, 3 * one.ownMs, 'camera 1 waiting, camera 2 announced, and this frame: one call of three');
  // At its encode entry, camera 1's waiting frame goes with it; camera 2's, still in preprocess, comes after.
  assert.equal(stages[3]!.predict!(0n, true).ownMs, 2 * one.ownMs);
  release();
  pre.finish();
  await Promise.all([running, waiting, announced.then((t) => stages[2]!.process(t, ctxWith()))]);

  // An encoder that cannot batch takes the frames ahead one call each, in the wait.
  let holdOne: Promise<void> | undefined;
  const single = fakeEncoder({ batch: false, gate: () => holdOne ?? new Promise((r) => setTimeout(r, 200)) });
  const solo = createCameraEncoderStages(single.encoder, { cameras: 3, waitMs: 0 });
  await warm(solo[0]!, single.calls);
  const each = solo[2]!.predict!(0n, false).ownMs;
  let releaseOne!: () => void;
  holdOne = new Promise<void>((r) => (releaseOne = r));
  const first = solo[0]!.process(tensor(1), ctxWith());
  holdOne = undefined;
  const second = solo[1]!.process(tensor(2), ctxWith());
  const behind = solo[2]!.predict!(0n, false);
  assert.ok(behind.waitMs >= each && behind.waitMs <= 2 * each, `the running call's rest and camera 1's call (${behind.waitMs} ms)`);
  assert.equal(behind.ownMs, each);
  // A frame in preprocess is ahead of one entering preprocess, not of one entering encode.
  const soloPre = gatedPreprocess();
  const soloAnnounced = solo[2]!.announcing(soloPre.stage).process(3, ctxWith());
  const atPreprocess = solo[0]!.predict!(0n, false);
  const atEncode = solo[0]!.predict!(0n, true);
  assert.ok(
    atPreprocess.waitMs - atEncode.waitMs >= each - 1e-6,
    `camera 2's call counts at preprocess entry only (${JSON.stringify([atPreprocess, atEncode])})`,
  );
  assert.ok(atEncode.waitMs <= behind.waitMs, 'at encode entry, camera 1 alone is ahead');
  soloPre.finish();
  await soloAnnounced;
  releaseOne();
  await Promise.all([first, second]);
});
