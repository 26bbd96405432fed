// The cost model and the degradation ladder on their own, fed synthetic durations.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { CostModel, DegradeLadder } from '../../pipeline/budget.ts';
import { loadConfig } from '../../pipeline/config.ts';

const ladderConfig = (overrides: object = {}) => loadConfig({ ladder: { minSamples: 2, window: 4, upAfter: 2, ...overrides } }).ladder;
const model = (stages = ['encode', 'decode'], levels = 5) =>
  new CostModel({ stages, levels, window: 4, quantile: 0.9, ewmaAlpha: 0.5, minSamples: 2 });

describe('CostModel', () => {
  test('keeps a window per stage and level: quantile, minimum and EWMA', () => {
    const costs = model();
    for (const ms of [10, 50, 20, 30, 40]) costs.record('decode', 0, ms); // window of 4 keeps 50, 20, 30, 40
    const estimate = costs.estimate('decode', 0);
    assert.equal(estimate.count, 4);
    assert.equal(estimate.quantileMs, 50); // nearest rank ⌈0.9 × 4⌉ = 4th of 20, 30, 40, 50
    assert.equal(estimate.minMs, 20);
    assert.equal(costs.estimate('decode', 1).count, 0, 'levels are separate');
  });

  test('EWMA follows the formula', () => {
    const costs = model();
    for (const ms of [10, 50, 20, 30, 40]) costs.record('encode', 0, ms);
    assert.equal(costs.estimate('encode', 0).ewmaMs, 33.75);
  });

  test('predict sums the stages it has enough durations for and says whether that is all of them', () => {
    const costs = model();
    assert.deepEqual(costs.predict(0, 'quantile'), { ms: 0, complete: false });
    costs.record('encode', 0, 100);
    costs.record('encode', 0, 120);
    costs.record('decode', 0, 300);
    assert.deepEqual(costs.predict(0, 'quantile'), { ms: 120, complete: false }, 'decode has 1 < minSamples');
    costs.record('decode', 0, 200);
    assert.deepEqual(costs.predict(0, 'quantile'), { ms: 420, complete: true });
    assert.deepEqual(costs.predict(0, 'min'), { ms: 300, complete: true });
    assert.deepEqual(costs.predict(0, 'min', 1), { ms: 200, complete: true }, 'from decode on');
    costs.forgetLevel(0);
    assert.deepEqual(costs.predict(0, 'quantile'), { ms: 0, complete: false });
  });

  test('rejects unknown stages, levels and bad options', () => {
    const costs = model();
    assert.throws(() => costs.record('publish', 0, 1), /unknown stage 'publish' \(known: encode, decode\)/);
    assert.throws(() => costs.record('decode', 5, 1), /level 5 is outside 0..4/);
    assert.throws(
      () => new CostModel({ stages: ['a'], levels: 1, window: 4, quantile: 1, ewmaAlpha: 0.5, minSamples: 1 }),
      /0 < quantile < 1/,
    );
    assert.throws(
      () => new CostModel({ stages: ['a'], levels: 1, window: 4, quantile: 0.5, ewmaAlpha: 0.5, minSamples: 5 }),
      /minSamples ≤ window \(4\)/,
    );
  });
});

describe('DegradeLadder', () => {
  test('levels apply the rungs cumulatively', () => {
    const ladder = new DegradeLadder(ladderConfig(), 1000);
    assert.equal(ladder.levels, 5);
    assert.deepEqual(ladder.knobsAt(0), { imageTokens: 280, maxNewTokens: 48, draft: true, frameSkip: 0 });
    assert.deepEqual(ladder.knobsAt(2), { imageTokens: 140, maxNewTokens: 32, draft: true, frameSkip: 0 });
    assert.deepEqual(ladder.knobsAt(4), { imageTokens: 140, maxNewTokens: 32, draft: false, frameSkip: 1 });
    assert.throws(() => ladder.knobsAt(5), /level 5 is outside 0..4/);
  });

  test('holds until it has data, steps down past the limit, up after upAfter comfortable decisions', () => {
    // Deadline 1000 ms, headroom 0.9: down above 900; upBelow 0.75: comfortable at ≤ 675.
    const ladder = new DegradeLadder(ladderConfig(), 1000);
    const costs = model(['decode']);
    const feed = (level: number, ...ms: number[]) => ms.forEach((m) => costs.record('decode', level, m));
    assert.equal(ladder.decide(costs), undefined, 'no data');
    feed(0, 950);
    assert.equal(ladder.decide(costs), undefined, 'one sample < minSamples');
    feed(0, 940);
    assert.deepEqual(ladder.decide(costs), {
      from: 0,
      to: 1,
      direction: 'down',
      reason: 'predicted_miss',
      predictedMs: 950,
      limitMs: 900,
      knobs: { imageTokens: 140, maxNewTokens: 48, draft: true, frameSkip: 0 },
    });
    assert.equal(ladder.level, 1);
    feed(1, 800, 800);
    assert.equal(ladder.decide(costs), undefined, 'between the thresholds: hold');
    feed(1, 600, 600, 600, 600);
    assert.equal(ladder.decide(costs), undefined, 'first comfortable decision');
    assert.deepEqual(ladder.decide(costs)?.to, 0, 'second: up');
    assert.equal(costs.estimate('decode', 0).count, 0, 'entering a level forgets it');
    feed(0, 700, 700);
    assert.equal(ladder.decide(costs), undefined);
    feed(0, 600, 600, 600, 600);
    assert.equal(ladder.decide(costs), undefined, 'comfortable, but level 0 is the top');
    assert.equal(ladder.decide(costs), undefined);
    assert.equal(ladder.level, 0);
  });

  test('a comfortable streak is broken by one uncomfortable decision', () => {
    const ladder = new DegradeLadder(ladderConfig({ upAfter: 3 }), 1000);
    const costs = model(['decode']);
    costs.record('decode', 0, 1000);
    costs.record('decode', 0, 1000);
    assert.equal(ladder.decide(costs)?.to, 1);
    const feed = (...ms: number[]) => ms.forEach((m) => costs.record('decode', 1, m));
    feed(100, 100);
    assert.equal(ladder.decide(costs), undefined); // 1
    assert.equal(ladder.decide(costs), undefined); // 2
    feed(800); // quantile of [100, 100, 800] = 800: not comfortable
    assert.equal(ladder.decide(costs), undefined);
    feed(100, 100, 100, 100); // the 800 leaves the window of 4
    assert.equal(ladder.decide(costs), undefined); // 1
    assert.equal(ladder.decide(costs), undefined); // 2
    assert.equal(ladder.decide(costs)?.direction, 'up'); // 3
  });

  test('a step down needs only the measured stages over the limit; a step up needs every stage', () => {
    const ladder = new DegradeLadder(ladderConfig(), 1000);
    const costs = model(['encode', 'decode']);
    costs.record('encode', 0, 950);
    costs.record('encode', 0, 950);
    assert.equal(ladder.decide(costs)?.direction, 'down', 'encode alone exceeds 900');
    costs.record('encode', 1, 10);
    costs.record('encode', 1, 10);
    for (let i = 0; i < 5; i++) assert.equal(ladder.decide(costs), undefined, 'decode unmeasured: no step up');
  });

  test('stays put when disabled or at the bottom', () => {
    const disabled = new DegradeLadder(ladderConfig({ enabled: false }), 1000);
    const costs = model(['decode']);
    for (let level = 0; level < 5; level++) {
      costs.record('decode', level, 5000);
      costs.record('decode', level, 5000);
    }
    assert.equal(disabled.decide(costs), undefined);
    const ladder = new DegradeLadder(ladderConfig(), 1000);
    const steps = [];
    for (let i = 0; i < 10; i++) {
      steps.push(ladder.decide(costs)?.to);
      costs.record('decode', ladder.level, 5000);
      costs.record('decode', ladder.level, 5000);
    }
    assert.deepEqual(steps, [1, 2, 3, 4, undefined, undefined, undefined, undefined, undefined, undefined]);
  });
});
