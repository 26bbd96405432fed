// Virtual service times drawn from distributions: the quantile table, the seeded draw, and a lockstep
// graph whose charged times spread as the distribution does, the same for a seed and not for another.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { quantile } from '../../app/stats.ts';
import { chain } from '../../pipeline/graph/chain.ts';
import {
  MAX_QUANTILE_POINTS,
  medianServiceMs,
  sampleServiceMs,
  serviceDistribution,
  serviceDraw,
  type StageServiceCosts,
} from '../../pipeline/service-time.ts';
import { assertConservation, fakeSource, fakeStage, runGraph, testConfig, transcript } from '../support/pipeline-fakes.ts';

describe('service-time distributions', () => {
  test('a few samples are kept sorted; many become percentiles from min to max', () => {
    assert.deepEqual(serviceDistribution([30, 10, 20.00049]), { count: 3, quantilesMs: [10, 20, 30] });
    const many = Array.from({ length: 1000 }, (_, i) => (i * 7919) % 1000); // 0..999, shuffled
    const table = serviceDistribution(many);
    assert.equal(table.count, 1000);
    assert.equal(table.quantilesMs.length, MAX_QUANTILE_POINTS);
    assert.deepEqual([table.quantilesMs[0], table.quantilesMs[50], table.quantilesMs[100]], [0, 499.5, 999]);
    assert.throws(() => serviceDistribution([]), /no samples/);
  });

  test('a draw u reads the table at quantile u, linearly between points; a fixed cost is itself', () => {
    const cost = { count: 3, quantilesMs: [10, 20, 40] };
    assert.deepEqual(
      [0, 0.25, 0.5, 0.75, 0.999].map((u) => sampleServiceMs(cost, u)),
      [10, 15, 20, 30, 40 - 20 * 0.002],
    );
    assert.equal(sampleServiceMs(12, 0.99), 12);
    assert.equal(medianServiceMs(cost), 20);
  });

  test('the draw is a function of seed, stage and frame: in [0, 1), spread evenly, another for each', () => {
    const draws = Array.from({ length: 10_000 }, (_, frame) => serviceDraw(1, 'decode', frame));
    assert.ok(draws.every((u) => u >= 0 && u < 1));
    for (const p of [0.1, 0.5, 0.9]) assert.ok(Math.abs(quantile(draws, p) - p) < 0.02, `quantile ${p}: ${quantile(draws, p)}`);
    assert.equal(serviceDraw(1, 'decode', 7), draws[7]);
    assert.notEqual(serviceDraw(2, 'decode', 7), draws[7]);
    assert.notEqual(serviceDraw(1, 'encode', 7), draws[7]);
    assert.notEqual(serviceDraw(1, 'decode', 8), draws[7]);
  });

  test('a config refuses a table that is not ascending, naming the level', () => {
    assert.throws(
      () => testConfig({ virtualServiceMs: { decode: [5, { count: 2, quantilesMs: [9, 3] }] }, ladder: { rungs: [{ draft: false }] } }),
      /\/virtualServiceMs\/decode\/1\/quantilesMs: must be ascending/,
    );
    assert.throws(() => testConfig({ virtualServiceSeed: -1 }), /\/virtualServiceSeed: must be >= 0/);
  });
});

describe('a lockstep graph charging sampled costs', () => {
  const DECODE = { count: 5, quantilesMs: [100, 110, 120, 200, 400] };
  const run = async (decode: StageServiceCosts, seed?: number) => {
    const result = await runGraph({
      source: fakeSource({ frames: 200, periodMs: 50 }),
      stages: chain(fakeStage<number>('preprocess'), fakeStage<number>('decode')),
      config: testConfig({
        lockstep: true,
        virtualServiceMs: { preprocess: 5, decode },
        ...(seed === undefined ? {} : { virtualServiceSeed: seed }),
      }),
    });
    assertConservation(result);
    const spans = (stage: string) =>
      result.events.flatMap((e) => (e.type === 'span' && e.stage === stage ? [Number(e.exitNs - e.enterNs) / 1e6] : []));
    return { result, decode: spans('decode'), preprocess: spans('preprocess') };
  };

  test('each call draws its own time: p99 above p50, every time within the table, a fixed cost every time', async () => {
    const { decode, preprocess } = await run(DECODE);
    assert.equal(decode.length, 200);
    assert.ok(decode.every((ms) => ms >= 100 && ms <= 400));
    assert.ok(quantile(decode, 0.99) > 300, `p99 ${quantile(decode, 0.99)}`);
    assert.ok(Math.abs(quantile(decode, 0.5) - 120) < 10, `p50 ${quantile(decode, 0.5)}`);
    assert.deepEqual(new Set(preprocess), new Set([5]));
    const fixed = await run(120);
    assert.deepEqual(new Set(fixed.decode), new Set([120]));
  });

  test('the same seed gives the same run byte for byte; another seed another', async () => {
    const a = await run(DECODE, 7);
    const b = await run(DECODE, 7);
    const c = await run(DECODE, 8);
    assert.equal(transcript(a.result), transcript(b.result));
    assert.deepEqual(a.decode, b.decode);
    assert.notDeepEqual(a.decode, c.decode);
    // The default seed is the schema's, 1.
    assert.deepEqual((await run(DECODE)).decode, (await run(DECODE, 1)).decode);
  });
});
