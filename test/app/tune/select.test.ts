// percept tune without models: the grid file and its points, the objective, the Pareto front, the
// chosen point and the degrade ladder, on measurements made up by hand (every answer worked out here).
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../../pipeline/config.ts';
import {
  GridError,
  baseKnobs,
  defaultGrid,
  gridPoints,
  loadGrid,
  pointConfig,
  sameDraft,
  type PointKnobs,
} from '../../../app/tune/grid.ts';
import { calibratedCost, readCalibration } from '../../../app/tune/costs.ts';
import { choose, formatTable, orderLadder, paretoFront, parseObjective, rungBetween, type PointResult } from '../../../app/tune/select.ts';

const root = new URL('../../..', import.meta.url).pathname;
const dir = join(root, '.cache/test-tune-select');
mkdirSync(dir, { recursive: true });
const base = loadConfig({ decoder: { model: 'synth:gemma4-tiny', draft: 'synth:gemma4-tiny-draft' } });

function gridError(grid: unknown): GridError {
  const path = join(dir, 'grid.json');
  writeFileSync(path, typeof grid === 'string' ? grid : JSON.stringify(grid));
  try {
    loadGrid(path, base);
  } catch (err) {
    assert.ok(err instanceof GridError, String(err));
    return err;
  }
  assert.fail('the grid was accepted');
}

describe('grid file', () => {
  test('an unknown knob or a bad value is refused naming its JSON path; every problem at once', () => {
    const err = gridError({
      knobs: { colour: ['red'], imageTokens: [280, 100], kvType: ['q4_0'], draft: [{ kind: 'medusa' }, { kind: 'model' }], threads: [0] },
    });
    const paths = err.issues.map((i) => i.path);
    assert.ok(paths.includes('/knobs/colour'), paths.join(' '));
    assert.match(err.message, /\/knobs\/colour: is not a knob percept tune turns \(known: model, kvType/);
    assert.match(err.message, /\/knobs\/imageTokens\/1: must be one of 70, 140, 256, 280, 560, 1120/);
    assert.match(err.message, /\/knobs\/kvType\/0: must be one of "f16", "q8_0"/);
    assert.match(err.message, /\/knobs\/draft\/0\/kind: "medusa" is not one of the known kinds/);
    assert.match(err.message, /\/knobs\/draft\/1: must have required property 'model'/);
    assert.match(err.message, /\/knobs\/threads\/0: must be >= 1/);
  });

  test('edge policies are checked against the config schema; empty, unreadable and knob-less grids are refused', () => {
    assert.match(
      gridError({ knobs: { edges: [{ default: { policy: 'queue' } }] } }).message,
      /\/knobs\/edges\/0\/default: must have required property 'capacity'/,
    );
    assert.match(
      gridError({ knobs: { edges: [{ decoder: { policy: 'latest' } }] } }).message,
      /\/knobs\/edges\/0\/decoder: is not a known name here/,
    );
    assert.match(gridError({ knobs: {} }).message, /\/knobs: must NOT have fewer than 1 properties/);
    assert.match(gridError({ knobs: { imageTokens: [] } }).message, /\/knobs\/imageTokens: must NOT have fewer than 1 items/);
    assert.match(gridError({ knobs: { imageTokens: [70] }, extra: 1 }).message, /\/extra: is not a known property/);
    assert.match(gridError('{ nope').message, /cannot read it as JSON/);
  });

  test('every combination is a point, the first knob varying slowest; paths are relative to the grid file', () => {
    const path = join(dir, 'sub', 'grid.json');
    mkdirSync(join(dir, 'sub'), { recursive: true });
    writeFileSync(
      path,
      JSON.stringify({
        knobs: {
          imageTokens: [280, 70],
          draft: [{ kind: 'none' }, { kind: 'model', model: 'models/d.gguf', max: 2 }, { kind: 'ngram' }],
          model: ['synth:gemma4-tiny'],
          edges: [{ default: { policy: 'queue', capacity: 2 } }],
        },
      }),
    );
    const grid = loadGrid(path, base);
    assert.deepEqual(grid.listed, ['imageTokens', 'draft', 'model', 'edges']);
    const points = gridPoints(grid);
    assert.equal(points.length, 6);
    assert.deepEqual(
      points.map((p) => p.label),
      [
        'draft=none imageTokens=280',
        'draft=none imageTokens=70',
        'draft=model:d.gguf/2 imageTokens=280',
        'draft=model:d.gguf/2 imageTokens=70',
        'draft=ngram imageTokens=280',
        'draft=ngram imageTokens=70',
      ],
    );
    assert.deepEqual(points[2]!.knobs.draft, { kind: 'model', model: join(dir, 'sub/models/d.gguf'), max: 2 });
    assert.deepEqual(points[3]!.at, { model: 0, kvType: 0, threads: 0, gpuLayers: 0, draft: 1, imageTokens: 1, maxNewTokens: 0, edges: 0 });
    // What the grid leaves out is the base config's.
    assert.equal(points[0]!.knobs.kvType, 'f16');
    assert.deepEqual(points[0]!.knobs.edges, { default: { policy: 'queue', capacity: 2 } });
  });

  test('the default grid is the ladder knobs of the config: its image-token counts, drafting on and off', () => {
    const grid = defaultGrid(base);
    assert.deepEqual(grid.axes.imageTokens, [280, 140]);
    assert.deepEqual(grid.axes.draft, [{ kind: 'model', model: 'synth:gemma4-tiny-draft' }, { kind: 'none' }]);
    assert.equal(gridPoints(grid).length, 4);
    assert.deepEqual(defaultGrid(loadConfig({ ladder: { rungs: [{ maxNewTokens: 8 }] } })).listed, []);
  });

  test("a point's config: the point's knobs, the ladder held at them, the bag, the budget, the recorder without frames", () => {
    const knobs: PointKnobs = { ...baseKnobs(base), imageTokens: 70, draft: { kind: 'ngram', max: 3 }, kvType: 'q8_0', threads: 2 };
    const config = loadConfig(
      pointConfig(base, knobs, {
        bag: '/data/x.mcap',
        budgetMs: 300,
        replay: 'lockstep',
        serviceMs: { decode: 90 },
        maxNewTokensKnob: 113,
        recording: '/tmp/p.mcap',
      }),
    );
    assert.deepEqual(config.ladder.initial, { imageTokens: 70, maxNewTokens: 113, draft: true, frameSkip: 0 });
    assert.equal(config.ladder.enabled, false);
    assert.deepEqual(config.ladder.rungs, []);
    assert.equal(config.decoder.draft, null);
    assert.equal(config.decoder.ngram, true);
    assert.equal(config.decoder.draftMax, 3);
    assert.equal(config.decoder.kvType, 'q8_0');
    assert.equal(config.decoder.threads, 2);
    assert.equal(config.budgets.endToEndMs, 300);
    assert.equal(config.budgets.stages.decode, 300, 'a stage budget is at most the end-to-end one');
    assert.equal(config.source.kind === 'bag' && config.source.path, '/data/x.mcap');
    assert.deepEqual([config.clock, config.lockstep], ['virtual', true]);
    assert.deepEqual(config.virtualServiceMs, { decode: 90 });
    assert.deepEqual(config.recorder, { enabled: true, path: '/tmp/p.mcap', frames: false, chunkMs: 1000, profile: '', onError: 'stop' });
  });

  test('the decoder settings a tuned config holds: defaults, and refused with a remote decoder', () => {
    const { decoder } = loadConfig({});
    assert.deepEqual([decoder.draftMax, decoder.kvType, decoder.threads], [null, 'f16', null]);
    assert.throws(
      () => loadConfig({ decoder: { kind: 'openai', endpoint: 'http://x', model: 'm', kvType: 'q8_0', threads: 2, draftMax: 3 } }),
      (err: Error) =>
        ['/decoder/draftMax', '/decoder/kvType', '/decoder/threads'].every((p) =>
          err.message.includes(`${p}: applies to decoder.kind "local" only`),
        ),
    );
    assert.throws(() => loadConfig({ decoder: { draftMax: 65 } }), /\/decoder\/draftMax: must be <= 64/);
  });
});

describe('objective', () => {
  const all = { labels: true, reference: true };

  test('a quality alone means max it within the budget; the default is the best quality measurable', () => {
    assert.deepEqual(parseObjective('accuracy', all), {
      sense: 'max',
      metric: 'accuracy',
      constraints: [
        { metric: 'p99', op: '<=', value: 'budget' },
        { metric: 'drop', op: '<=', value: 0.05 },
      ],
      quality: 'accuracy',
      text: 'max accuracy s.t. p99<=budget, drop<=0.05',
    });
    assert.equal(parseObjective(undefined, all).text, 'max accuracy s.t. p99<=budget, drop<=0.05');
    assert.deepEqual(parseObjective('min p99 s.t. drop<=0.1', all).constraints, [{ metric: 'drop', op: '<=', value: 0.1 }]);
    assert.equal(parseObjective(undefined, all).metric, 'accuracy');
    assert.equal(parseObjective(undefined, { labels: false, reference: true }).metric, 'agreement');
    assert.equal(parseObjective(undefined, { labels: false, reference: false }).metric, 'valid');
    const o = parseObjective('min  p99 s.t. accuracy>=0.8, miss<=0.05', all);
    assert.deepEqual([o.sense, o.metric, o.quality], ['min', 'p99', 'accuracy']);
    assert.deepEqual(o.constraints, [
      { metric: 'accuracy', op: '>=', value: 0.8 },
      { metric: 'miss', op: '<=', value: 0.05 },
    ]);
    assert.deepEqual(parseObjective('max agreement s.t. p50 <= 40 and valid >= 0.99', all).constraints, [
      { metric: 'p50', op: '<=', value: 40 },
      { metric: 'valid', op: '>=', value: 0.99 },
    ]);
  });

  test('what cannot be measured or makes no sense is refused', () => {
    const none = { labels: false, reference: false };
    assert.throws(() => parseObjective('accuracy', none), /accuracy needs labels/);
    assert.throws(() => parseObjective('max valid s.t. iou>=0.5', none), /iou needs labels/);
    assert.throws(() => parseObjective('agreement', none), /agreement needs --reference/);
    assert.throws(() => parseObjective('max p99', all), /max is for a quality/);
    assert.throws(() => parseObjective('min accuracy', all), /min is for a cost/);
    assert.throws(() => parseObjective('max speed', all), /unknown metric 'speed'/);
    assert.throws(() => parseObjective('max accuracy s.t. miss<=budget', all), /'budget' bounds p50 or p99/);
    assert.throws(() => parseObjective('max accuracy s.t. valid>=2', all), /valid is a fraction/);
    assert.throws(() => parseObjective('max accuracy s.t. p99 < 5', all), /constraint 'p99 < 5' is not/);
    assert.throws(() => parseObjective('fastest', all), /expected 'max METRIC/);
  });
});

// ---- measurements made up by hand --------------------------------------------------------------------

const KNOBS = baseKnobs(base);
let next = 0;
function point(knobs: Partial<PointKnobs>, p99: number | null, accuracy: number | null, extra: Partial<PointResult> = {}): PointResult {
  const k = { ...KNOBS, ...knobs };
  return {
    index: next++,
    label: `${k.imageTokens}/${k.draft.kind}/${k.kvType}`,
    knobs: k,
    ladder: { imageTokens: k.imageTokens, maxNewTokens: k.maxNewTokens ?? 113, draft: k.draft.kind !== 'none', frameSkip: 0 },
    status: 'ok',
    error: null,
    frames: { in: 10, out: 10, dropped: 0 },
    dropsByReason: {},
    endToEnd: { p50Ms: p99 === null ? null : p99 - 5, p99Ms: p99 },
    stages: {},
    missRate: 0,
    validRate: 1,
    accuracy,
    iou: null,
    agreement: null,
    serviceMs: {},
    ...extra,
    dropRate: extra.frames ? (extra.frames.in - extra.frames.out) / extra.frames.in : 0,
  };
}
const ON = KNOBS.draft;
const OFF = { kind: 'none' } as const;

describe('choosing', () => {
  next = 0;
  const results = [
    point({ imageTokens: 280, draft: ON }, 200, 0.9), // 0
    point({ imageTokens: 280, draft: OFF }, 180, 0.9), // 1
    point({ imageTokens: 140, draft: ON }, 150, 0.85), // 2
    point({ imageTokens: 140, draft: OFF }, 120, 0.8), // 3
    point({ imageTokens: 70, draft: OFF }, 100, 0.5), // 4
    point({ imageTokens: 280, draft: ON, kvType: 'q8_0' }, 90, 0.6), // 5: another KV type
    point({ imageTokens: 70, draft: ON }, null, 0, { frames: { in: 10, out: 0, dropped: 10 } }), // 6: nothing came out
    point({ imageTokens: 140, draft: OFF, kvType: 'q8_0' }, 120, 0.8, { status: 'failed', error: 'boom' }), // 7
  ];

  test('the objective picks the best feasible point; ties go to the lower p99, then the earlier point', () => {
    const pick = (spec: string, budget: number) => choose(results, parseObjective(spec, { labels: true, reference: false }), budget)?.index;
    assert.equal(pick('accuracy', 250), 1, '0 and 1 tie on accuracy; 1 is faster');
    assert.equal(pick('accuracy', 160), 2);
    assert.equal(pick('accuracy', 119), 5);
    assert.equal(pick('max accuracy s.t. p99<=119, p99>=95', 1000), 4);
    assert.equal(pick('accuracy', 80), undefined, 'nothing is fast enough');
    assert.equal(pick('min p99 s.t. accuracy>=0.8', 1000), 3);
    assert.equal(pick('min p99', 1000), 5);
    const tie = [point({}, 50, 0.5), point({}, 50, 0.5)];
    assert.equal(choose(tie, parseObjective('accuracy', { labels: true, reference: false }), 100), tie[0]);
  });

  test('a point that drops most frames does not win by default: its published frames alone look best', () => {
    // Conflated: 2 of 10 frames published, both right and fast.
    const dropping = point({ imageTokens: 70, draft: OFF }, 60, 1, {
      frames: { in: 10, out: 2, dropped: 8 },
      dropsByReason: { conflated: 8 },
      missRate: 0,
    });
    const withIt = [...results, dropping];
    const pick = (spec: string | undefined) => choose(withIt, parseObjective(spec, { labels: true, reference: false }), 250)?.index;
    assert.equal(dropping.dropRate, 0.8);
    assert.equal(pick(undefined), 1);
    assert.equal(pick('accuracy'), 1);
    assert.equal(pick('max accuracy s.t. p99<=budget'), dropping.index, 'unbounded, it wins');
    assert.equal(pick('max accuracy s.t. p99<=budget, drop<=0.8'), dropping.index);
    assert.equal(pick('min p99 s.t. drop<=0.05'), 5);
  });

  test('the Pareto front: no other point is as good and faster, or better and as fast', () => {
    // 0 is as good as 1 but slower; 4 is worse than 5 and slower.
    assert.deepEqual([...paretoFront(results, 'accuracy')].sort(), [1, 2, 3, 5]);
  });

  test('the ladder below the chosen point: free steps first, then the most ms saved per quality lost, within reach of the ladder', () => {
    assert.deepEqual(rungBetween(results[0]!, results[3]!), { imageTokens: 140, draft: false });
    assert.equal(rungBetween(results[3]!, results[2]!), null, 'drafting cannot come back on');
    assert.equal(rungBetween(results[4]!, results[3]!), null, 'image tokens cannot go up');
    assert.equal(rungBetween(results[0]!, results[5]!), null, 'the KV type is not a ladder knob');
    assert.equal(rungBetween(results[0]!, results[0]!), null);
    const steps = orderLadder(results, results[0]!, 'accuracy');
    // From 0: 1 saves 20 ms for nothing (first); from 1: 3 saves 60 ms for 0.1 (600/unit) against 4's
    // 80 ms for 0.4 (200/unit); from 3: 4 saves 20 ms for 0.3.
    assert.deepEqual(
      steps.map((s) => [s.index, s.rung]),
      [
        [1, { draft: false }],
        [3, { imageTokens: 140 }],
        [4, { imageTokens: 70 }],
      ],
    );
    assert.deepEqual(
      steps.map((s) => [s.savedMs, Number(s.qualityLost.toFixed(6)), s.msPerUnit === null ? null : Math.round(s.msPerUnit * 10) / 10]),
      [
        [20, 0, null],
        [60, 0.1, 600],
        [20, 0.3, 66.7],
      ],
    );
    assert.deepEqual(orderLadder(results, results[4]!, 'accuracy'), [], 'nothing below the cheapest point');
    // Noise is no rung: 0.5 ms (under 1 ms) or 3 ms of 200 (under 2 %) saved for nothing lost.
    next = 100;
    const top = point({ imageTokens: 280, draft: ON }, 200, 0.9);
    const noise = [point({ imageTokens: 280, draft: OFF }, 199.5, 0.9), point({ imageTokens: 140, draft: ON }, 197, 0.9)];
    assert.deepEqual(orderLadder([top, ...noise], top, 'accuracy'), []);
    const real = point({ imageTokens: 70, draft: ON }, 196, 0.9);
    assert.deepEqual(
      orderLadder([top, ...noise, real], top, 'accuracy').map((s) => s.index),
      [real.index],
    );
  });

  test('the table lists every point by p99 with the front, the chosen point and why a point is out', () => {
    const objective = parseObjective('accuracy', { labels: true, reference: false });
    const table = formatTable({
      results,
      front: paretoFront(results, 'accuracy'),
      chosen: results[2],
      objective,
      budgetMs: 160,
      measurable: { labels: true, reference: false },
    });
    const lines = table.split('\n');
    assert.match(lines[0]!, /point +accuracy +e2e p50 +e2e p99 +miss +drop +valid +out\/in/);
    assert.equal(lines.length, 1 + results.length);
    assert.match(lines[1]!, /^ \* +280\/model\/q8_0 +60\.0% .* 90\.0 /);
    assert.match(table, /\n>\* +140\/model\/f16 +85\.0% /);
    assert.match(table, /\n +280\/model\/f16 .* 200\.0 .*infeasible/);
    assert.match(table, /\n +70\/model\/f16 .* - .* 100\.0% .* 0\/10 +infeasible/);
    assert.match(table, /FAILED: boom/);
  });
});

describe('calibrated costs (virtual mode)', () => {
  const write = (name: string, extra: object, levels: object[]) => {
    const path = join(dir, `${name}.json`);
    const serviceMs = { encode: levels.map((_, i) => 10 * (i + 1)), decode: levels.map((_, i) => 100 * (i + 1)) };
    writeFileSync(
      path,
      JSON.stringify({
        kind: 'percept.calibration',
        version: 1,
        virtualServiceMs: serviceMs,
        levels,
        models: { decoder: 'synth:gemma4-tiny' },
        ...extra,
      }),
    );
    return readCalibration(path);
  };
  const level = (imageTokens: number, draft: boolean, maxNewTokens = 64) => ({ imageTokens, maxNewTokens, draft, frameSkip: 0 });
  const KNOBS_PLAIN: PointKnobs = { ...baseKnobs(loadConfig({ decoder: { model: 'synth:gemma4-tiny' } })), draft: { kind: 'none' } };
  const models = { decoder: 'synth:gemma4-tiny', encoder: 'synth:gemma4-vision-tiny' };
  const drafted = write('drafted', { models: { ...models, draft: 'synth:gemma4-tiny-draft' } }, [
    level(280, true),
    level(140, true),
    level(140, false),
  ]);
  const q8 = write('q8', { models, decoder: { ngram: false, draftMax: null, kvType: 'q8_0', threads: null, gpuLayers: 0 } }, [
    level(280, false),
    level(70, false, 32),
  ]);
  const at = (knobs: Partial<PointKnobs>, bounded = true, knob = 64, encoder = 'synth:gemma4-vision-tiny') =>
    calibratedCost([drafted, q8], { ...KNOBS_PLAIN, ...knobs }, { knob, bounded }, encoder);
  const knobOf = (r: ReturnType<typeof at>) => ('knob' in r ? r.knob : 'measured');

  test('a point takes the level of the calibration made with its settings; else the first knob none measured', () => {
    assert.deepEqual(at({ imageTokens: 140, draft: { kind: 'model', model: 'synth:gemma4-tiny-draft' } }), {
      serviceMs: { encode: 20, decode: 200 },
    });
    // Drafting off with a calibration that has a draft: its draft-off level.
    assert.deepEqual(at({ imageTokens: 140 }), { serviceMs: { encode: 30, decode: 300 } });
    assert.deepEqual(at({ imageTokens: 70, kvType: 'q8_0' }), { serviceMs: { encode: 20, decode: 200 } });
    // An unbounded grammar: maxNewTokens changes the cost, so it must match a level's.
    assert.equal(knobOf(at({ imageTokens: 70, kvType: 'q8_0' }, false, 64)), null);
    assert.deepEqual(at({ imageTokens: 70, kvType: 'q8_0' }, false, 32), { serviceMs: { encode: 20, decode: 200 } });
    assert.equal(knobOf(at({ imageTokens: 280, draft: { kind: 'ngram' } })), 'draft');
    assert.equal(knobOf(at({ imageTokens: 140, draft: { kind: 'model', model: 'synth:gemma4-tiny-draft', max: 2 } })), 'draft');
    assert.equal(knobOf(at({ threads: 2 })), 'threads');
    assert.equal(knobOf(at({ imageTokens: 560 })), 'imageTokens');
    assert.equal(knobOf(at({ model: 'synth:gemma3-tiny' })), 'model');
    assert.equal(knobOf(at({}, true, 64, 'other.onnx')), 'encoder');
  });

  test("virtual mode's default grid is the ladder's own levels: each has a calibrated cost (no cross product)", () => {
    // 280 drafted, 140, 70, then drafting off: a calibration of this config measured these four levels.
    const config = loadConfig({
      decoder: { model: 'synth:gemma4-tiny', draft: 'synth:gemma4-tiny-draft' },
      encoder: { kind: 'mtmd', mmproj: 'synth:gemma4-vision-tiny' },
      ladder: {
        initial: { imageTokens: 280, maxNewTokens: 64, draft: true, frameSkip: 0 },
        rungs: [{ imageTokens: 140 }, { imageTokens: 70 }, { draft: false }],
      },
    });
    const calibration = write('ladder', { models: { ...models, draft: 'synth:gemma4-tiny-draft' } }, [
      level(280, true),
      level(140, true),
      level(70, true),
      level(70, false),
    ]);
    const points = gridPoints(defaultGrid(config, { levels: true }));
    assert.deepEqual(
      points.map((p) => p.label),
      [
        'draft=model:synth:gemma4-tiny-draft imageTokens=280',
        'draft=model:synth:gemma4-tiny-draft imageTokens=140',
        'draft=model:synth:gemma4-tiny-draft imageTokens=70',
        'draft=none imageTokens=70',
      ],
    );
    const costs = points.map((p) => calibratedCost([calibration], p.knobs, { knob: 64, bounded: true }, 'synth:gemma4-vision-tiny'));
    assert.deepEqual(
      costs.map((c) => ('serviceMs' in c ? c.serviceMs.decode : c.why)),
      [100, 200, 300, 400],
    );
    // Real mode may measure every combination.
    assert.equal(gridPoints(defaultGrid(config)).length, 6);
  });

  test("a draft length left out is the decoder's default (4): the same speculation as 4", () => {
    assert.ok(sameDraft({ kind: 'ngram' }, { kind: 'ngram', max: 4 }));
    assert.ok(sameDraft({ kind: 'model', model: 'd', max: 4 }, { kind: 'model', model: 'd' }));
    assert.ok(!sameDraft({ kind: 'ngram' }, { kind: 'ngram', max: 2 }));
    assert.ok(!sameDraft({ kind: 'model', model: 'd' }, { kind: 'model', model: 'e' }));
    // A calibration made with draftMax 4 measured the point whose draft names no length, and back.
    const ngram4 = write('ngram4', { models, decoder: { ngram: true, draftMax: 4, kvType: 'f16', threads: null, gpuLayers: 0 } }, [
      level(280, true),
    ]);
    const cost = (draft: PointKnobs['draft']) =>
      calibratedCost([ngram4], { ...KNOBS_PLAIN, imageTokens: 280, draft }, { knob: 64, bounded: true }, 'synth:gemma4-vision-tiny');
    assert.deepEqual(cost({ kind: 'ngram' }), { serviceMs: { encode: 10, decode: 100 } });
    assert.deepEqual(cost({ kind: 'ngram', max: 4 }), { serviceMs: { encode: 10, decode: 100 } });
    const three = cost({ kind: 'ngram', max: 3 });
    assert.equal('knob' in three ? three.knob : 'measured', 'draft');
  });

  test('a file that is not a calibration is refused', () => {
    writeFileSync(
      join(dir, 'bad-cal.json'),
      JSON.stringify({
        kind: 'percept.calibration',
        version: 1,
        levels: [level(70, false)],
        virtualServiceMs: { decode: [1, 2] },
        models: { decoder: 'x' },
      }),
    );
    assert.throws(() => readCalibration(join(dir, 'bad-cal.json')), /virtualServiceMs\.decode must hold one cost per level \(1\)/);
    const unsorted = { count: 2, quantilesMs: [9, 3] };
    writeFileSync(
      join(dir, 'bad-cal.json'),
      JSON.stringify({ kind: 'percept.calibration', version: 2, levels: [level(70, false)], virtualServiceMs: { decode: [unsorted] } }),
    );
    assert.throws(() => readCalibration(join(dir, 'bad-cal.json')), /\{count, quantilesMs\} ascending/);
    writeFileSync(join(dir, 'bad-cal.json'), JSON.stringify({ kind: 'percept.calibration', version: 3 }));
    assert.throws(() => readCalibration(join(dir, 'bad-cal.json')), /version 3, and this percept reads versions 1 and 2/);
    writeFileSync(join(dir, 'bad-cal.json'), JSON.stringify({ kind: 'percept.eval' }));
    assert.throws(() => readCalibration(join(dir, 'bad-cal.json')), /not a calibration file \(write one with percept calibrate\)/);
  });

  test('a version 2 file gives each point its distributions, which its config samples; a version 1 file its medians', () => {
    const decode = [
      { count: 3, quantilesMs: [90, 100, 300] },
      { count: 3, quantilesMs: [40, 50, 150] },
    ];
    const path = join(dir, 'cal-v2.json');
    writeFileSync(
      path,
      JSON.stringify({
        kind: 'percept.calibration',
        version: 2,
        virtualServiceMs: { decode, encode: [10, 5] },
        levels: [level(140, false), level(70, false)],
        models,
      }),
    );
    const v2 = readCalibration(path);
    assert.equal(v2.version, 2);
    const at70 = calibratedCost([v2], { ...KNOBS_PLAIN, imageTokens: 70 }, { knob: 64, bounded: true }, models.encoder);
    assert.deepEqual('serviceMs' in at70 ? at70.serviceMs : at70.why, { decode: decode[1], encode: 5 });
    assert.equal(drafted.version, 1);
  });
});
