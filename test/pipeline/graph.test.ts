// The graph runtime on a VirtualClock: every timing below follows from capture times and
// modelled service times, so the expected frame ids are worked out by hand in the comments.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as delay } from 'node:timers/promises';
import { RealClock, VirtualClock, msToNs } from '../../pipeline/clock.ts';
import { append, chain, chainOf, type StageChain } from '../../pipeline/graph/chain.ts';
import { createGraph } from '../../pipeline/graph/graph.ts';
import { DropFrame, StageAbort } from '../../pipeline/types.ts';
import type { Knobs, StageContext } from '../../pipeline/types.ts';
import type { ActionMessage, CameraFrame, Generation, ImageEmbedding, PixelTensor } from '../../nodes/payloads.ts';
import {
  assertConservation,
  dropsOf,
  fakeDecoder,
  fakeSource,
  fakeStage,
  framesOf,
  runGraph,
  testConfig,
  transcript,
} from '../support/pipeline-fakes.ts';

const ms = (n: number): bigint => msToNs(n);

describe('deadlines', () => {
  test('frames past their deadline at stage entry are dropped as stale, with exact counts', async () => {
    // Frames every 100 ms, one 260 ms stage, FIFO in front, deadline capture + 400 ms.
    // Stage runs: f0 0-260, f1 260-520 (late), f2 520-780 (late); f3 (dl 700) enters at 780: stale;
    // f4 780-1040 (late); f5 (dl 900), f6 (dl 1000) enter at 1040: stale; f7 1040-1300 (late);
    // f8 (dl 1200), f9 (dl 1300) enter at 1300: stale.
    const decode = fakeStage<number>('decode');
    const result = await runGraph({
      source: fakeSource({ frames: 10, periodMs: 100 }),
      stages: chain(decode),
      config: testConfig({
        budgets: { endToEndMs: 400, stages: {}, dropPredictedMiss: false },
        edges: { default: { policy: 'queue', capacity: 10 } },
        virtualServiceMs: { decode: 260 },
      }),
    });
    assert.deepEqual(framesOf(result.outputs), [0, 1, 2, 4, 7]);
    assert.deepEqual(
      dropsOf(result.events).map((d) => [d.frameId, d.stage, d.reason]),
      [3, 5, 6, 8, 9].map((f) => [f, 'decode', 'stale']),
    );
    assert.equal(result.summary.frames.late, 4);
    assert.equal(result.summary.deadlineMisses, 4 + 5);
    assert.deepEqual(
      result.outputs.map((o) => o.spans[0]!.exitNs - o.captureNs),
      [260, 420, 580, 640, 600].map(ms),
    );
    assert.equal(decode.calls, 5);
    assertConservation(result);
  });

  test('a frame the cost model says will certainly miss is dropped at entry instead of running late', async () => {
    // One 290 ms stage, deadline capture + 500 ms, minSamples 1. A frame entering at t is dropped
    // when t + 290 > deadline: f0 0-290, f1 290-580, f2 (dl 700) and f3 (dl 800) at 580: dropped;
    // f4 (dl 900) 580-870; f5, f6 at 870: dropped; f7 (dl 1200) 870-1160; f8, f9 at 1160: dropped.
    const run = (dropPredictedMiss: boolean) =>
      runGraph({
        source: fakeSource({ frames: 10, periodMs: 100 }),
        stages: chain(fakeStage<number>('decode')),
        config: testConfig({
          budgets: { endToEndMs: 500, stages: {}, dropPredictedMiss },
          edges: { default: { policy: 'queue', capacity: 10 } },
          ladder: { enabled: false, minSamples: 1 },
          virtualServiceMs: { decode: 290 },
        }),
      });
    const predicted = await run(true);
    assert.deepEqual(framesOf(predicted.outputs), [0, 1, 4, 7]);
    const drops = predicted.events.flatMap((e) => (e.type === 'drop' ? [e] : []));
    assert.deepEqual(
      drops.map((d) => d.frameId),
      [2, 3, 5, 6, 8, 9],
    );
    assert.ok(
      drops.every((d) => d.reason === 'stale' && d.detail.startsWith('predicted miss')),
      drops[0]?.detail,
    );
    assert.equal(predicted.summary.frames.late, 0);
    assertConservation(predicted);

    // Without the prediction the same frames run and come out late.
    const plain = await run(false);
    assert.ok(plain.summary.frames.late > 0);
    assert.ok(plain.summary.frames.out > predicted.summary.frames.out);
    assertConservation(plain);
  });

  test('a frame that would wait behind the previous one in a later stage and miss is dropped before the stages ahead', async () => {
    // Frames every 100 ms, deadline capture + 420 ms; preprocess 10 ms, decode 230 ms, 'latest'
    // edges, minSamples 1. f0: 0-10, decode 10-240. f1 and f2 enter preprocess before decode has a
    // timed run (they pass); f2 replaces f1 at decode and runs 240-470. f3 (dl 720) at 300: ready at
    // 310, decode free at 470, ends 700: passes; f4 (dl 820) replaces it, runs 470-700. f5 (dl 920)
    // at 500: ready at 510, decode free at 700, ends 930: dropped at preprocess entry, never run.
    // f6 (dl 1020) at 600: ends 930, runs 700-930. Without the rule f5 is preprocessed and then replaced.
    const run = async (dropPredictedMiss: boolean) => {
      const preprocess = fakeStage<number>('preprocess');
      const result = await runGraph({
        source: fakeSource({ frames: 7, periodMs: 100 }),
        stages: chain(preprocess, fakeStage<number>('decode')),
        config: testConfig({
          budgets: { endToEndMs: 420, stages: {}, dropPredictedMiss },
          edges: { default: { policy: 'latest' } },
          ladder: { enabled: false, minSamples: 1 },
          virtualServiceMs: { preprocess: 10, decode: 230 },
        }),
      });
      assertConservation(result);
      return { result, preprocessCalls: preprocess.calls };
    };
    const ruled = await run(true);
    assert.deepEqual(framesOf(ruled.result.outputs), [0, 2, 4, 6]);
    assert.deepEqual(dropsOf(ruled.result.events), [
      { frameId: 1, stage: 'decode', reason: 'conflated' },
      { frameId: 3, stage: 'decode', reason: 'conflated' },
      { frameId: 5, stage: 'preprocess', reason: 'stale' },
    ]);
    const detail = ruled.result.events.flatMap((e) => (e.type === 'drop' && e.frameId === 5 ? [e.detail] : []))[0];
    assert.equal(detail, 'predicted miss: the remaining stages take at least 430.000 ms (decode busy for 190.0 ms more), 420.000 ms left');
    assert.equal(ruled.preprocessCalls, 6);
    // A conflated drop counts under a cause in words, not its detail with the frame number blanked.
    assert.equal(ruled.result.summary.drops.causes['decode: replaced by a newer frame'], 2);
    assert.ok(!Object.keys(ruled.result.summary.drops.causes).some((c) => c.includes('frame #')), 'no frame-number placeholder in a cause');
    const plain = await run(false);
    assert.deepEqual(framesOf(plain.result.outputs), [0, 2, 4, 6], 'the same actions');
    assert.equal(plain.preprocessCalls, 7);
  });

  test('frames on their way to a stage that takes reservations count in its prediction for later frames (real clock only)', async () => {
    // The decode stage predicts 25 s for each frame due before the one asked about that holds a
    // reservation (frames past the early check, not yet at decode), against a one-minute budget: the
    // first three frames pass preprocess entry, the rest are dropped there while the three wait at a
    // gated encoder. Every reservation ends: at decode entry or at a drop.
    const realClock = new RealClock();
    const FRAMES = 6;
    const held = new Map<number, bigint>(); // reservation id → deadline
    let nextId = 0;
    let reserved = 0;
    let decoded = 0;
    const asked = new Set<bigint>();
    let openGate!: () => void;
    const gate = new Promise<void>((resolve) => (openGate = resolve));
    const ahead = (deadlineNs: bigint): number => [...held.values()].filter((d) => d < deadlineNs).length;
    const entries: boolean[] = []; // `entering` of each ask about a frame at decode's own entry or before
    const decode = Object.assign(fakeStage<number>('decode'), {
      predict: (deadlineNs: bigint, entering: boolean) => {
        entries.push(entering);
        // At its own entry the frame is past the stages ahead: frames still on their way do not count.
        if (entering) return { waitMs: 0, ownMs: 1 };
        asked.add(deadlineNs);
        // Each frame is asked about at preprocess entry first: once all have been, the encoder goes on.
        if (asked.size === FRAMES) openGate();
        return { waitMs: 0, ownMs: 1 + 25_000 * ahead(deadlineNs) };
      },
      reserve: (deadlineNs: bigint): (() => void) => {
        reserved += 1;
        const id = nextId++;
        held.set(id, deadlineNs);
        return () => held.delete(id);
      },
      process: async (input: number): Promise<number> => {
        // The frames reach decode in order, each having ended its reservation at entry: only those
        // after it may still hold theirs.
        const before = 2 - decoded++;
        assert.ok(held.size <= before, `${held.size} reservations held at decode entry, at most ${before} expected`);
        return input;
      },
    });
    const preprocess = fakeStage<number>('preprocess');
    const encode = fakeStage<number>('encode', { work: async (x: number) => (await gate, x) });
    const result = await runGraph({
      source: fakeSource({ frames: FRAMES, periodMs: 1 }),
      stages: chain(preprocess, encode, decode),
      clock: realClock,
      config: testConfig({
        clock: 'real',
        budgets: { endToEndMs: 60_000, stages: {}, dropPredictedMiss: true },
        edges: { default: { policy: 'queue', capacity: 8 } },
        ladder: { enabled: false, minSamples: 1 },
      }),
    });
    assertConservation(result);
    assert.deepEqual([preprocess.calls, encode.calls], [3, 3]);
    assert.equal(result.summary.frames.out, 3);
    const drops = result.events.flatMap((e) => (e.type === 'drop' ? [e] : []));
    assert.equal(drops.length, FRAMES - 3);
    for (const d of drops) {
      assert.equal(d.stage, 'preprocess');
      assert.match(d.detail, /^predicted miss: .*decode predicts 75001\.0 ms/);
    }
    assert.equal(reserved, 3, 'only the frames that passed reserved');
    assert.equal(held.size, 0, 'every reservation ended');
    // Asked at decode's own entry once per frame that got there (entering), else from the stages ahead.
    assert.equal(entries.filter((e) => e).length, 3);
    assert.ok(entries.filter((e) => !e).length >= FRAMES + 3, 'preprocess and encode entries ask too');
  });

  test("a stage's own prediction drops a frame before the stages ahead of it spend on it (real clock only)", async () => {
    // The decode stage predicts its time itself (a decoder shared by cameras: its queue and sharing);
    // its past runs say nothing of it. Ten minutes against a one-minute budget: every frame is
    // dropped at preprocess entry, before preprocess or encode run; a prediction that fits drops none.
    // The stage is asked about each frame with that frame's deadline (a shared decoder serves its
    // queue in deadline order).
    const asked: { deadlineNs: bigint; atNs: bigint }[] = [];
    const realClock = new RealClock();
    const run = async (predictedMs: number, clock: 'real' | 'virtual') => {
      const preprocess = fakeStage<number>('preprocess');
      const encode = fakeStage<number>('encode');
      const predict = (deadlineNs: bigint) => {
        asked.push({ deadlineNs, atNs: realClock.nowNs() });
        return { waitMs: 0, ownMs: predictedMs };
      };
      const decode = Object.assign(fakeStage<number>('decode'), { predict });
      const result = await runGraph({
        source: fakeSource({ frames: 4, periodMs: 5 }),
        stages: chain(preprocess, encode, decode),
        ...(clock === 'real' ? { clock: realClock } : {}),
        config: testConfig({
          clock,
          budgets: { endToEndMs: 60_000, stages: {}, dropPredictedMiss: true },
          edges: { default: { policy: 'queue', capacity: 4 } },
          ladder: { enabled: false, minSamples: 1 },
        }),
      });
      assertConservation(result);
      return { result, calls: [preprocess.calls, encode.calls, decode.calls] };
    };
    const doomed = await run(600_000, 'real');
    assert.deepEqual(doomed.calls, [0, 0, 0], 'no stage ran for a doomed frame');
    const drops = doomed.result.events.flatMap((e) => (e.type === 'drop' ? [e] : []));
    assert.equal(drops.length, 4);
    for (const d of drops) {
      assert.equal(d.stage, 'preprocess');
      assert.equal(d.reason, 'stale');
      assert.match(
        d.detail,
        /^predicted miss: the remaining stages take at least 600000\.000 ms \(decode predicts 600000\.0 ms\), [\d.]+ ms left$/,
      );
    }
    assert.equal(doomed.result.summary.drops.byReason.stale, 4);
    assert.equal(new Set(asked.map((a) => a.deadlineNs)).size, 4, 'each frame asked about with its own deadline');
    for (const { deadlineNs, atNs } of asked) {
      const leftMs = Number(deadlineNs - atNs) / 1e6;
      assert.ok(leftMs > 0 && leftMs <= 60_000, `a frame's deadline, ${leftMs} ms ahead`);
    }

    const fits = await run(5, 'real');
    assert.deepEqual(fits.calls, [4, 4, 4]);
    assert.equal(fits.result.summary.frames.out, 4);
    // A virtual graph's time is its own: a stage's monotonic-clock prediction does not apply.
    const virtual = await run(600_000, 'virtual');
    assert.deepEqual(virtual.calls, [4, 4, 4]);
  });

  test("a stage's predicted wait runs while the stages before it work, and only its own call adds to theirs (real clock)", async () => {
    // Decode predicts 1 ms of its own after a queue of `waitMs` from a frame's first ask, which drains from then on (a
    // shared decoder's running group); at its own entry the frame waits no more. Preprocess takes at least 100 ms, against a 1050 ms budget.
    // A wait of 1000 ms overlaps preprocess and passes; added to it (1101 ms), it would not.
    // A wait of 1100 ms misses whatever overlaps it.
    const realClock = new RealClock();
    const run = async (waitMs: number) => {
      const preprocess = fakeStage<number>('preprocess', { work: async (x: number) => (await delay(100), x) });
      const encode = fakeStage<number>('encode');
      const firstAskNs = new Map<bigint, bigint>(); // by deadline: one per frame
      const predict = (deadlineNs: bigint, entering: boolean) => {
        if (entering) return { waitMs: 0, ownMs: 1 };
        const nowNs = realClock.nowNs();
        const sinceMs = Number(nowNs - (firstAskNs.get(deadlineNs) ?? nowNs)) / 1e6;
        if (!firstAskNs.has(deadlineNs)) firstAskNs.set(deadlineNs, nowNs);
        return { waitMs: Math.max(0, waitMs - sinceMs), ownMs: 1 };
      };
      const decode = Object.assign(fakeStage<number>('decode'), { predict });
      const result = await runGraph({
        source: fakeSource({ frames: 3, periodMs: 150 }),
        stages: chain(preprocess, encode, decode),
        clock: realClock,
        config: testConfig({
          clock: 'real',
          budgets: { endToEndMs: 1050, stages: {}, dropPredictedMiss: true },
          edges: { default: { policy: 'queue', capacity: 4 } },
          ladder: { enabled: false, minSamples: 1 },
        }),
      });
      assertConservation(result);
      return { result, drops: result.events.flatMap((e) => (e.type === 'drop' ? [e] : [])) };
    };
    const overlapped = await run(1000);
    assert.deepEqual(overlapped.drops, [], 'the frames after the first, with preprocess timed, pass too');
    assert.equal(overlapped.result.summary.frames.out, 3);
    const doomed = await run(1100);
    assert.equal(doomed.result.summary.frames.out, 0);
    assert.equal(doomed.drops.length, 3);
    for (const d of doomed.drops) {
      assert.equal(d.stage, 'preprocess');
      assert.match(d.detail, /^predicted miss: .*decode predicts 1\.0 ms after 1100\.0 ms of its queue/);
    }
  });

  test("a frame its source's next frame would replace at a busy decode is dropped before preprocess and never encoded", async () => {
    // Frames every 100 ms; preprocess 10, encode 20, decode 430 ms; 'latest' edges; minSamples 1; the
    // deadline far away. f0: 0-10, 10-30, decode 30-460. f1, f2, f3 reach decode at 130, 230, 330 and
    // are replaced there (decode has no timed run before 460); f4 (430) is taken at 460: 460-890. From
    // f3 on the arrival interval is known (100 ms, the median of three), so the walk applies once
    // decode is timed: f5 enters at 500, would reach decode at 530 and wait until 890: 360 ms, more than
    // two intervals: dropped 'conflated' at preprocess entry. f6: 630 → 890, 260 ms: dropped. f7: 730,
    // 160 ms: runs, and f8 (830) replaces it at decode as the rule expected of f5 and f6; f8 runs
    // 890-1320. The same actions come out without the rule; it only saves preprocess and encode.
    const run = async (frames: number, dropPredictedConflation: boolean, decodeMs = 430) => {
      const preprocess = fakeStage<number>('preprocess');
      const encode = fakeStage<number>('encode');
      const result = await runGraph({
        source: fakeSource({ frames, periodMs: 100 }),
        stages: chain(preprocess, encode, fakeStage<number>('decode')),
        config: testConfig({
          budgets: { endToEndMs: 60_000, stages: {}, dropPredictedMiss: false, dropPredictedConflation },
          edges: { default: { policy: 'latest' } },
          ladder: { enabled: false, minSamples: 1 },
          virtualServiceMs: { preprocess: 10, encode: 20, decode: decodeMs },
        }),
      });
      assertConservation(result);
      return { result, calls: [preprocess.calls, encode.calls] };
    };
    const ruled = await run(9, true);
    assert.deepEqual(framesOf(ruled.result.outputs), [0, 4, 8]);
    assert.deepEqual(dropsOf(ruled.result.events), [
      { frameId: 1, stage: 'decode', reason: 'conflated' },
      { frameId: 2, stage: 'decode', reason: 'conflated' },
      { frameId: 3, stage: 'decode', reason: 'conflated' },
      { frameId: 5, stage: 'preprocess', reason: 'conflated' },
      { frameId: 6, stage: 'preprocess', reason: 'conflated' },
      { frameId: 7, stage: 'decode', reason: 'conflated' },
    ]);
    const details = ruled.result.events.flatMap((e) => (e.type === 'drop' && e.stage === 'preprocess' ? [e.detail] : []));
    assert.deepEqual(details, [
      'would be replaced at decode by frame 6: decode busy for 390.0 ms more, next frame there in ~130.0 ms',
      'would be replaced at decode by frame 7: decode busy for 290.0 ms more, next frame there in ~130.0 ms',
    ]);
    assert.deepEqual(ruled.calls, [7, 7], 'f5 and f6 were neither preprocessed nor encoded');
    assert.equal(ruled.result.summary.drops.byStage.preprocess?.conflated, 2);

    const plain = await run(9, false);
    assert.deepEqual(framesOf(plain.result.outputs), [0, 4, 8], 'the same actions without the rule');
    assert.deepEqual(plain.calls, [9, 9]);

    // The source's last frame is never dropped for a successor: with 7 frames f6 ends the source (the
    // virtual source's lookahead knows it at f6's entry), so it waits at decode and runs at 890.
    const last = await run(7, true);
    assert.deepEqual(framesOf(last.result.outputs), [0, 4, 6]);
    assert.deepEqual(
      dropsOf(last.result.events).filter((d) => d.stage === 'preprocess'),
      [{ frameId: 5, stage: 'preprocess', reason: 'conflated' }],
    );
    assert.deepEqual(last.calls, [6, 6]);
  });

  test('a stage that says when its call in flight ends lets the conflation check see a busy decode its fastest run hides (real clock)', async () => {
    // Frames every 50 ms. Decode takes 10 ms for frame 0, then 600 ms for frame 1 (a shared decoder's group:
    // its fastest run says nothing of it). Told when that call ends (busyMs), the frames that would wait
    // there more than two intervals are dropped 'conflated' before preprocess; counted at the fastest run,
    // none is, and each is preprocessed and encoded only to be replaced at decode.
    const realClock = new RealClock();
    const run = async (sayBusy: boolean) => {
      const encode = fakeStage<number>('encode');
      let endsNs: bigint | undefined;
      const decode = Object.assign(
        fakeStage<number>('decode', {
          work: async (x: number) => {
            const ms = x === 1 ? 600 : 10;
            endsNs = realClock.nowNs() + BigInt(ms) * 1_000_000n;
            await delay(ms);
            endsNs = undefined;
            return x;
          },
        }),
        {
          predict: () =>
            sayBusy && endsNs !== undefined
              ? { waitMs: 0, ownMs: 0, busyMs: Math.max(0, Number(endsNs - realClock.nowNs()) / 1e6) }
              : { waitMs: 0, ownMs: 0 },
        },
      );
      const result = await runGraph({
        source: fakeSource({ frames: 14, periodMs: 50 }),
        stages: chain(fakeStage<number>('preprocess'), encode, decode),
        clock: realClock,
        config: testConfig({
          clock: 'real',
          budgets: { endToEndMs: 60_000, stages: {}, dropPredictedMiss: false, dropPredictedConflation: true },
          edges: { default: { policy: 'latest' } },
          ladder: { enabled: false, minSamples: 1 },
        }),
      });
      assertConservation(result);
      const early = result.events.flatMap((e) => (e.type === 'drop' && e.stage === 'preprocess' ? [e] : []));
      return { result, early, encodeCalls: encode.calls };
    };
    const told = await run(true);
    assert.ok(told.early.length > 0, 'frames waiting behind the long call are dropped before preprocess');
    for (const d of told.early) {
      assert.equal(d.reason, 'conflated');
      assert.match(d.detail, /^would be replaced at decode by frame \d+: decode busy for [\d.]+ ms more/);
    }
    assert.equal(told.encodeCalls, 14 - told.early.length, 'a frame dropped early is never encoded');
    const untold = await run(false);
    assert.deepEqual(untold.early, [], 'at its fastest run decode looks free');
    assert.equal(untold.encodeCalls, 14);
    const atDecode = (r: typeof told): number => r.result.summary.drops.byStage.decode?.conflated ?? 0;
    assert.ok(atDecode(untold) > atDecode(told), `replaced at decode: ${atDecode(untold)} untold, ${atDecode(told)} told`);
  });

  test('a frame whose decode frees within the margin is not dropped early', async () => {
    // As above with decode 190 ms: a frame waits at decode at most 190 ms, less than two intervals,
    // though often more than one (a margin of one interval would drop some), and some frames are still
    // replaced there. None is dropped early: every frame is encoded, the outputs match a run without
    // the rule.
    const run = async (dropPredictedConflation: boolean) => {
      const encode = fakeStage<number>('encode');
      const result = await runGraph({
        source: fakeSource({ frames: 12, periodMs: 100 }),
        stages: chain(fakeStage<number>('preprocess'), encode, fakeStage<number>('decode')),
        config: testConfig({
          budgets: { endToEndMs: 60_000, stages: {}, dropPredictedMiss: false, dropPredictedConflation },
          edges: { default: { policy: 'latest' } },
          ladder: { enabled: false, minSamples: 1 },
          virtualServiceMs: { preprocess: 10, encode: 20, decode: 190 },
        }),
      });
      assertConservation(result);
      return { result, encodeCalls: encode.calls };
    };
    const ruled = await run(true);
    assert.equal(ruled.encodeCalls, 12);
    assert.ok(dropsOf(ruled.result.events).every((d) => d.stage === 'decode' && d.reason === 'conflated'));
    assert.ok(ruled.result.summary.drops.byReason.conflated! > 0, 'decode still conflates');
    const plain = await run(false);
    assert.deepEqual(framesOf(ruled.result.outputs), framesOf(plain.result.outputs));
  });

  test('a decoder-like stage is cancelled at its stage budget and says why', async () => {
    // 10 ms per token, up to 48 tokens, decode budget 100 ms: the signal fires after 10 tokens.
    const decode = fakeDecoder('decode', { tokens: 48, msPerToken: 10 });
    const result = await runGraph({
      source: fakeSource({ frames: 3, periodMs: 1000 }),
      stages: chain(decode),
      config: testConfig({ budgets: { endToEndMs: 2000, stages: { decode: 100 }, dropPredictedMiss: false } }),
    });
    assert.deepEqual(
      result.outputs.map((o) => o.payload),
      [0, 1, 2].map((frame) => ({ frame, tokens: 10, stop: 'deadline' })),
    );
    const cancels = result.events.flatMap((e) => (e.type === 'cancel' ? [[e.frameId, e.stage, e.reason, e.detail]] : []));
    assert.deepEqual(
      cancels,
      [0, 1, 2].map((f) => [f, 'decode', 'deadline', 'after 10 tokens']),
    );
    assert.deepEqual(result.summary.cancels, { decode: { deadline: 3 } });
    assert.deepEqual(
      result.outputs.map((o) => o.spans[0]!.exitNs - o.spans[0]!.enterNs),
      [ms(100), ms(100), ms(100)],
    );
    assertConservation(result);
  });

  test('the stage deadline is the frame deadline when that comes first', async () => {
    // Frame deadline capture + 50 ms, decode budget 1000 ms: cancelled at 50 ms (5 tokens).
    const result = await runGraph({
      source: fakeSource({ frames: 1, periodMs: 1 }),
      stages: chain(fakeDecoder('decode', { tokens: 48, msPerToken: 10 })),
      config: testConfig({ budgets: { endToEndMs: 50, stages: {}, dropPredictedMiss: false } }),
    });
    assert.deepEqual(
      result.outputs.map((o) => o.payload),
      [{ frame: 0, tokens: 5, stop: 'deadline' }],
    );
  });

  test('a modelled service time past the deadline fires the signal before the call; a throw then counts as a cancel', async () => {
    const seen: string[] = [];
    const encode = fakeStage<number>('encode', {
      work: (input, ctx) => {
        seen.push(`${input}:${ctx.signal.aborted}`);
        ctx.signal.throwIfAborted();
        return input;
      },
    });
    const result = await runGraph({
      source: fakeSource({ frames: 2, periodMs: 1000 }),
      stages: chain(encode),
      config: testConfig({
        budgets: { endToEndMs: 2000, stages: { encode: 300 }, dropPredictedMiss: false },
        virtualServiceMs: { encode: 500 },
      }),
    });
    assert.deepEqual(seen, ['0:true', '1:true']);
    assert.deepEqual(
      dropsOf(result.events),
      [0, 1].map((frameId) => ({ frameId, stage: 'encode', reason: 'stale' })),
    );
    assert.deepEqual(result.summary.cancels, { encode: { deadline: 2 } });
    const spans = result.events.flatMap((e) => (e.type === 'span' ? [e.exitNs - e.enterNs] : []));
    assert.deepEqual(spans, [ms(300), ms(300)], 'charged up to the deadline');
    assertConservation(result);
  });

  test('a StageAbort the stage throws itself (native code saw the deadline first) is a cancel, not an error', async () => {
    const decode = fakeStage<number>('decode', {
      work: () => {
        throw new StageAbort('deadline', 'decode');
      },
    });
    const result = await runGraph({ source: fakeSource({ frames: 2, periodMs: 1000 }), stages: chain(decode), config: testConfig() });
    assert.deepEqual(
      dropsOf(result.events),
      [0, 1].map((frameId) => ({ frameId, stage: 'decode', reason: 'stale' })),
    );
    assert.deepEqual(result.summary.cancels, { decode: { deadline: 2 } });
    assert.deepEqual(result.summary.errors, {});
    assertConservation(result);
  });

  test('on a real clock the signal fires at the stage budget', async () => {
    const decode = fakeStage<number>('decode', {
      work: (input, ctx) =>
        new Promise<number>((resolve) => {
          ctx.signal.addEventListener('abort', () => {
            ctx.report({ kind: 'cancel', reason: (ctx.signal.reason as { reason: 'deadline' }).reason });
            resolve(input);
          });
        }),
    });
    const clock = new RealClock();
    const result = await runGraph({
      clock,
      source: fakeSource({ frames: 2, periodMs: 1 }),
      stages: chain(decode),
      config: testConfig({
        clock: 'real',
        budgets: { endToEndMs: 3_600_000, stages: { decode: 20 }, dropPredictedMiss: false },
        edges: { default: { policy: 'queue', capacity: 2 } },
      }),
    });
    assert.deepEqual(framesOf(result.outputs), [0, 1]);
    assert.deepEqual(result.summary.cancels, { decode: { deadline: 2 } });
    for (const out of result.outputs) assert.ok(out.spans[0]!.exitNs - out.spans[0]!.enterNs >= ms(20), 'never before the budget');
    assertConservation(result);
  });
});

describe('edges and pipelining', () => {
  test("a 'latest' edge keeps the newest waiting frame and counts the replaced ones", async () => {
    // One 230 ms stage, frames every 100 ms: f0 0-230; f1 is replaced by f2 (230-460); f3 by f4
    // (460-690); f5 by f6 (690-920); f7 by f8 and f8 by f9 (920-1150).
    const result = await runGraph({
      source: fakeSource({ frames: 10, periodMs: 100 }),
      stages: chain(fakeStage<number>('decode')),
      config: testConfig({ virtualServiceMs: { decode: 230 } }),
    });
    assert.deepEqual(framesOf(result.outputs), [0, 2, 4, 6, 9]);
    const conflated = result.events.flatMap((e) => (e.type === 'drop' ? [[e.frameId, e.reason, e.detail]] : []));
    assert.deepEqual(
      conflated,
      [1, 3, 5, 7, 8].map((f) => [f, 'conflated', `replaced by frame ${f + 1}`]),
    );
    assert.deepEqual(result.summary.drops.byStage, { decode: { conflated: 5 } });
    assert.deepEqual(
      result.outputs.map((o) => o.spans[0]!.enterNs),
      [0, 230, 460, 690, 920].map(ms),
    );
    assertConservation(result);
  });

  test("a 'queue' edge holds at most its capacity and counts overflow", async () => {
    // Capacity 2, one 230 ms stage (starts at 0, 230, 460, …), frames every 100 ms: the queue
    // holds [1,2] at 200, [2,3] at 300 (f4 rejected), [3,5] at 500 (f6 rejected), [5,7] at 700
    // (f8 rejected), still [5,7] at 900 (f9 rejected); then 5 and 7 run in order.
    const result = await runGraph({
      source: fakeSource({ frames: 10, periodMs: 100 }),
      stages: chain(fakeStage<number>('decode')),
      config: testConfig({
        edges: { default: { policy: 'latest' }, decode: { policy: 'queue', capacity: 2 } },
        virtualServiceMs: { decode: 230 },
      }),
    });
    assert.deepEqual(framesOf(result.outputs), [0, 1, 2, 3, 5, 7]);
    assert.deepEqual(
      dropsOf(result.events),
      [4, 6, 8, 9].map((frameId) => ({ frameId, stage: 'decode', reason: 'queue_full' })),
    );
    assert.deepEqual(
      result.outputs.map((o) => o.spans[0]!.enterNs),
      [0, 230, 460, 690, 920, 1150].map(ms),
    );
    assertConservation(result);
  });

  test('stages work on different frames at the same time, one frame each, with spans in order', async () => {
    // Three 100 ms stages, frames every 110 ms: frame i is in stage s during [110i + 100s, +100].
    const stages = ['preprocess', 'encode', 'decode'].map((name) => fakeStage<number>(name));
    const result = await runGraph({
      source: fakeSource({ frames: 4, periodMs: 110 }),
      stages: chainOf(stages),
      config: testConfig({ virtualServiceMs: { preprocess: 100, encode: 100, decode: 100 } }),
    });
    assert.deepEqual(framesOf(result.outputs), [0, 1, 2, 3]);
    for (const out of result.outputs) {
      const t0 = 110 * out.frameId;
      assert.deepEqual(
        out.spans,
        stages.map((s, i) => ({ stage: s.name, enterNs: ms(t0 + 100 * i), exitNs: ms(t0 + 100 * i + 100) })),
      );
    }
    // Frame 1 is in preprocess (110-210) while frame 0 is in encode (100-200).
    assert.ok(result.outputs[1]!.spans[0]!.enterNs < result.outputs[0]!.spans[1]!.exitNs);
    assert.ok(stages.every((s) => s.maxConcurrent === 1));
    assertConservation(result);
  });

  test('on a real clock a stage takes frame n+1 while the next stage still works on frame n', async () => {
    // decode holds frame 0 until preprocess has started frame 1: a runtime that ran one frame at a
    // time through the whole graph would never get there (the guard below fails the test instead).
    let preprocessStartedFrame1!: () => void;
    const frame1InPreprocess = new Promise<void>((resolve) => (preprocessStartedFrame1 = resolve));
    const preprocess = fakeStage<number>('preprocess', {
      work: (input) => {
        if (input === 1) preprocessStartedFrame1();
        return input;
      },
    });
    const decode = fakeStage<number>('decode', {
      work: async (input) => {
        if (input === 0) await frame1InPreprocess;
        return input;
      },
    });
    // A hang detector, not a timing assertion: without pipelining the graph deadlocks for good.
    const guard = AbortSignal.timeout(120_000);
    const run = runGraph({
      clock: new RealClock(),
      source: fakeSource({ frames: 3, periodMs: 5 }),
      stages: chain(preprocess, decode),
      config: testConfig({
        clock: 'real',
        budgets: { endToEndMs: 3_600_000, stages: {}, dropPredictedMiss: false },
        edges: { default: { policy: 'queue', capacity: 4 } },
      }),
    });
    const result = await Promise.race([
      run,
      new Promise<never>((_, reject) =>
        guard.addEventListener('abort', () => reject(new Error('no pipelining: decode never saw frame 1 enter preprocess'))),
      ),
    ]);
    assert.deepEqual(framesOf(result.outputs), [0, 1, 2]);
    assert.equal(preprocess.maxConcurrent, 1);
    assert.equal(decode.maxConcurrent, 1);
    assertConservation(result);
  });
});

describe('errors', () => {
  test('a throwing stage costs one frame, not the graph', async () => {
    const actions = fakeStage<number>('actions', {
      work: (input) => {
        if (input % 4 === 1) throw new Error(`bad frame ${input}`);
        if (input % 4 === 2) throw new DropFrame('invalid', `frame ${input} fails the action schema`);
        return input;
      },
    });
    const publish = fakeStage<number>('publish');
    const result = await runGraph({
      source: fakeSource({ frames: 8, periodMs: 100 }),
      stages: chain(actions, publish),
      config: testConfig({ virtualServiceMs: { actions: 10, publish: 1 } }),
    });
    assert.deepEqual(framesOf(result.outputs), [0, 3, 4, 7]);
    assert.deepEqual(result.summary.drops.byStage, { actions: { error: 2, invalid: 2 } });
    assert.deepEqual(
      result.events.flatMap((e) => (e.type === 'error' ? [[e.frameId, e.stage, e.message]] : [])),
      [
        [1, 'actions', 'bad frame 1'],
        [5, 'actions', 'bad frame 5'],
      ],
    );
    assert.deepEqual(result.summary.errors, { actions: 2 });
    assert.equal(result.summary.endReason, 'source_end');
    assert.ok(actions.closed && publish.closed);
    assertConservation(result);
  });

  test('a failing source ends the run with source_error after draining what it yielded', async () => {
    const source = {
      id: 'broken',
      async *frames(clock: VirtualClock) {
        yield { sourceId: 'broken', captureNs: clock.nowNs(), captureWallMs: 0, payload: 0 };
        throw new Error('disk unplugged');
      },
    };
    const result = await runGraph({ source, stages: chain(fakeStage<number>('decode')), config: testConfig() });
    assert.equal(result.summary.endReason, 'source_error');
    assert.deepEqual(framesOf(result.outputs), [0]);
    assert.deepEqual(
      result.events.flatMap((e) => (e.type === 'error' ? [[e.stage, e.message]] : [])),
      [['source', 'disk unplugged']],
    );
  });
});

describe('the degradation ladder', () => {
  // decode costs imageTokens × 3 + maxNewTokens × 12 (+100 with drafting) ms, × 1.5 for frames 0-11
  // and × 0.5 after: levels cost 2274 / 1644 / 1356 / 1206 (heavy) and 758 / 548 / 452 / 402 (light).
  // Deadline 1500 ms, headroom 0.9 → step down above 1350; upBelow 0.75 → comfortable ≤ 1012.5.
  // minSamples 2, window 4 (quantile 0.9 of 4 = the max), upAfter 3. Frames every 2500 ms, so
  // each frame's durations are known before the next is admitted.
  const cost = (k: Knobs): number => k.imageTokens * 3 + k.maxNewTokens * 12 + (k.draft ? 100 : 0);
  const ladderRun = () =>
    runGraph({
      source: fakeSource({ frames: 30, periodMs: 2500 }),
      stages: chain(
        fakeStage<number>('decode', { costMs: (frame: number, ctx: StageContext) => cost(ctx.knobs) * (frame < 12 ? 1.5 : 0.5) }),
      ),
      config: testConfig({
        budgets: { endToEndMs: 1500, stages: {}, dropPredictedMiss: false },
        ladder: { enabled: true, minSamples: 2, window: 4, upAfter: 3, quantile: 0.9, headroom: 0.9, upBelow: 0.75 },
      }),
    });

  test('steps down on predicted misses and back up after consecutive comfortable frames', async () => {
    const result = await ladderRun();
    const steps = result.events.flatMap((e) => (e.type === 'degrade' ? [[e.frameId, e.from, e.to, e.reason, e.predictedMs]] : []));
    // Down: at frame 2 (level 0 measured 2274 twice), 4 (1644), 6 (1356); level 3 (1206) holds.
    // Up: level 3 needs 4 light frames (12-15) to push 1206 out of its window, then 3 comfortable
    // admissions (16, 17, 18) → up at 18; each higher level then needs 2 samples + 3 comfortable
    // admissions: up at 22 and 26.
    assert.deepEqual(steps, [
      [2, 0, 1, 'predicted_miss', 2274],
      [4, 1, 2, 'predicted_miss', 1644],
      [6, 2, 3, 'predicted_miss', 1356],
      [18, 3, 2, 'comfortable', 402],
      [22, 2, 1, 'comfortable', 452],
      [26, 1, 0, 'comfortable', 548],
    ]);
    const levels = result.outputs.map((o) => o.degradeLevel);
    assert.deepEqual(levels, [0, 0, 1, 1, 2, 2, ...Array(12).fill(3), 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0]);
    assert.deepEqual(result.summary.degrade, { down: 3, up: 3, level: 0, maxLevel: 3 });
    assertConservation(result);
  });

  test('the frameSkip rung drops frames at the source edge as skipped', async () => {
    const result = await runGraph({
      source: fakeSource({ frames: 12, periodMs: 1000 }),
      stages: chain(fakeStage<number>('decode')),
      config: testConfig({
        budgets: { endToEndMs: 500, stages: {}, dropPredictedMiss: false },
        ladder: { enabled: true, minSamples: 2, rungs: [{ frameSkip: 2 }] },
        virtualServiceMs: { decode: 600 },
      }),
    });
    // Level 1 from frame 2 on: admit one frame, skip two.
    assert.deepEqual(framesOf(result.outputs), [0, 1, 2, 5, 8, 11]);
    assert.deepEqual(
      dropsOf(result.events),
      [3, 4, 6, 7, 9, 10].map((frameId) => ({ frameId, stage: 'source', reason: 'skipped' })),
    );
    assertConservation(result);
  });
});

describe('determinism', () => {
  test('a virtual-clock run gives the same events and outputs byte for byte', async () => {
    // A bit of everything: conflation, a queue, the ladder, cancels, errors, and stages that await
    // real timers of random length (real time must not leak into the result).
    const scenario = () =>
      runGraph({
        source: fakeSource({ frames: 60, periodMs: 70 }),
        stages: chain(
          fakeStage<number>('preprocess', { work: async (x) => (await delay(Math.random() * 2), x) }),
          fakeStage<number>('encode', { costMs: (_x, ctx) => ctx.knobs.imageTokens }),
          fakeDecoder('decode', { tokens: 40, msPerToken: 4 }),
          fakeStage<{ frame: number }>('actions', {
            work: async (g) => {
              await delay(Math.random() * 2);
              if (g.frame % 7 === 3) throw new Error(`unparseable ${g.frame}`);
              return g;
            },
          }),
          fakeStage('publish'),
        ),
        config: testConfig({
          budgets: { endToEndMs: 400, stages: { decode: 120 }, dropPredictedMiss: true },
          edges: { default: { policy: 'latest' }, publish: { policy: 'queue', capacity: 4 } },
          ladder: { enabled: true, minSamples: 2, window: 8, upAfter: 4 },
          virtualServiceMs: { preprocess: 15, actions: [5, 4, 3], publish: 1 },
          telemetry: { intervalMs: 500 },
        }),
      });
    const first = await scenario();
    const second = await scenario();
    const a = transcript(first);
    assert.equal(a, transcript(second));
    const kinds = new Set(first.events.map((e) => e.type));
    for (const kind of ['frame', 'span', 'drop', 'cancel', 'degrade', 'error', 'output', 'stats'])
      assert.ok(kinds.has(kind as never), `scenario covers ${kind}`);
    assertConservation(first);
  });
});

describe('stop()', () => {
  test('on a virtual clock: stops the source, drops what waits, closes every stage', async () => {
    const stages = [fakeStage<number>('preprocess'), fakeStage<number>('decode')];
    const source = fakeSource({ frames: 1000, periodMs: 10 });
    let stopped: Promise<unknown> | undefined;
    const result = await runGraph({
      source,
      stages: chainOf(stages),
      config: testConfig({ edges: { default: { policy: 'queue', capacity: 3 } }, virtualServiceMs: { preprocess: 5, decode: 25 } }),
      onOutput: (env, graph) => {
        if (env.frameId === 4) stopped = graph.stop('test');
      },
    });
    assert.ok(stopped);
    assert.equal(await stopped, result.summary, 'stop() resolves with the run summary');
    assert.equal(result.summary.endReason, 'stopped');
    assert.equal(result.summary.stopReason, 'test');
    // preprocess takes 5 ms, decode 25 ms, frames every 10 ms: decode runs f0 5-30, f1 30-55, f2 55-80,
    // f3 80-105, f4 105-130; its queue (3) is full from 65 ms, so f6, f7, f9, f11, f12 are rejected.
    // Stopping when f4 comes out (130 ms) drops the queued f5, f8, f10; f13 (due at 130) never enters.
    assert.deepEqual(framesOf(result.outputs), [0, 1, 2, 3, 4]);
    assert.deepEqual(
      dropsOf(result.events, 'queue_full').map((d) => d.frameId),
      [6, 7, 9, 11, 12],
    );
    assert.deepEqual(
      dropsOf(result.events, 'shutdown'),
      [5, 8, 10].map((frameId) => ({ frameId, stage: 'decode', reason: 'shutdown' })),
    );
    assert.equal(result.summary.frames.in, 13);
    assert.ok(source.closed && stages.every((s) => s.closed));
    assertConservation(result);
  });

  test('on a real clock: in-flight calls see a shutdown abort, queued frames are dropped, stages close', async () => {
    // decode passes frames 0-2 and then blocks on frame 3 until its signal fires; the test stops the
    // graph once decode's queue (capacity 4) has overflowed, so it is full at the stop.
    const decode = fakeStage<number>('decode', {
      work: (input, ctx) =>
        input < 3
          ? input
          : new Promise<number>((_, reject) => {
              ctx.signal.addEventListener('abort', () => {
                ctx.report({ kind: 'cancel', reason: (ctx.signal.reason as { reason: 'shutdown' }).reason });
                reject(ctx.signal.reason);
              });
            }),
    });
    const preprocess = fakeStage<number>('preprocess');
    const source = fakeSource({ frames: Infinity, periodMs: 2 });
    const result = await runGraph({
      clock: new RealClock(),
      source,
      stages: chain(preprocess, decode),
      config: testConfig({
        clock: 'real',
        budgets: { endToEndMs: 600_000, stages: {}, dropPredictedMiss: false },
        edges: { default: { policy: 'latest' }, decode: { policy: 'queue', capacity: 4 } },
      }),
      onEvent: (event, graph) => {
        if (event.type === 'drop' && event.reason === 'queue_full') void graph.stop('test');
      },
    });
    assert.equal(result.summary.endReason, 'stopped');
    assert.deepEqual(framesOf(result.outputs), [0, 1, 2]);
    assert.deepEqual(result.summary.cancels, { decode: { shutdown: 1 } });
    // 4 queued + frame 3 in flight, all at decode.
    assert.equal(result.summary.drops.byStage.decode?.shutdown, 5);
    assert.ok(source.closed && preprocess.closed && decode.closed);
    assertConservation(result);
  });

  test('on a real clock: a call that ignores the shutdown signal is abandoned after the grace period', async () => {
    let entered!: () => void;
    const decodeEntered = new Promise<void>((resolve) => (entered = resolve));
    const decode = fakeStage<number>('decode', {
      work: () => {
        entered();
        return new Promise<number>(() => {}); // never returns, never looks at its signal
      },
    });
    const graph = createGraph({
      source: fakeSource({ frames: Infinity, periodMs: 5 }),
      stages: chain(decode),
      clock: new RealClock(),
      config: testConfig({ clock: 'real', budgets: { endToEndMs: 600_000, stages: {}, dropPredictedMiss: false, shutdownGraceMs: 50 } }),
    });
    const drops: string[] = [];
    graph.events.subscribe((e) => e.type === 'drop' && e.reason === 'shutdown' && drops.push(`${e.frameId}:${e.detail}`));
    const run = graph.run();
    await decodeEntered;
    const summary = await graph.stop('test');
    assert.equal(summary, await run);
    assert.ok(drops.includes('0:abandoned: the stage did not return within budgets.shutdownGraceMs'), drops.join('; '));
    assert.equal(summary.frames.in, summary.frames.out + summary.frames.dropped);
    assert.ok(decode.closed);
  });

  test('stop() before run() ends the run at once; stop() twice is harmless', async () => {
    const graph = createGraph({
      source: fakeSource({ frames: 5, periodMs: 10 }),
      stages: chain(fakeStage('decode')),
      clock: new VirtualClock(),
      config: testConfig(),
    });
    const [a, b] = await Promise.all([graph.stop('early'), graph.stop('again')]);
    assert.equal(a, b);
    assert.equal(a.endReason, 'stopped');
    assert.equal(a.stopReason, 'early');
    assert.equal(a.frames.in, 0);
    await assert.rejects(graph.run(), /already run/);
  });
});

describe('createGraph validation', () => {
  const source = fakeSource({ frames: 1, periodMs: 1 });
  test('rejects bad stage lists and clock mismatches, naming the problem', () => {
    const config = testConfig();
    const clock = new VirtualClock();
    assert.throws(() => createGraph({ source, stages: chainOf([]), clock, config }), /stages to be a non-empty chain of stages/);
    assert.throws(
      () => createGraph({ source, stages: chain(fakeStage('a'), fakeStage('a')), clock, config }),
      /stage name 'a' is used twice/,
    );
    assert.throws(() => createGraph({ source, stages: chain(fakeStage('source')), clock, config }), /other than 'source'/);
    assert.throws(
      () => createGraph({ source, stages: chain(fakeStage('a')), clock: new RealClock(), config }),
      /config.clock is 'virtual' but the clock given is real/,
    );
  });
});

describe('chain()', () => {
  // The @ts-expect-error lines are the test: `npm run typecheck` (tsc) fails if any of them compiles.
  test('keeps the stages in order, and a chain in the wrong order does not compile', () => {
    const pre = fakeStage<CameraFrame, PixelTensor>('preprocess');
    const enc = fakeStage<PixelTensor, ImageEmbedding>('encode');
    const dec = fakeStage<ImageEmbedding, Generation>('decode');
    const act = fakeStage<Generation, ActionMessage>('actions');
    const pub = fakeStage<ActionMessage, ActionMessage>('publish');
    const full: StageChain<CameraFrame, ActionMessage> = chain(pre, enc, dec, act, pub);
    assert.deepEqual(
      full.stages.map((s) => s.name),
      ['preprocess', 'encode', 'decode', 'actions', 'publish'],
    );
    const extended: StageChain<CameraFrame, ActionMessage> = append(chain(pre, enc, dec, act), pub);
    assert.deepEqual(extended.stages, full.stages);

    // Never called: these only have to fail to compile.
    const wrong = (): unknown[] => [
      // @ts-expect-error the decoder placed before the encoder
      chain(pre, dec, enc, act, pub),
      // @ts-expect-error a stage left out (preprocess output straight into the decoder)
      chain(pre, dec, act),
      // @ts-expect-error appending a stage that does not take the chain's output
      append(chain(pre, enc), act),
      // @ts-expect-error a source whose frames (numbers) the first stage does not take
      createGraph({ source: fakeSource({ frames: 1, periodMs: 1 }), stages: full, clock: new VirtualClock(), config: testConfig() }),
    ];
    // @ts-expect-error a chain that ends before the action
    const short: StageChain<CameraFrame, ActionMessage> = chain(pre, enc, dec);
    assert.equal(typeof wrong, 'function');
    assert.equal(short.stages.length, 3);
  });
});
