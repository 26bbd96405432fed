// percept tune on the real stages (the tiny synthetic decoder, the projection encoder) and a short bag:
// on modelled stage costs (a calibration file written by hand, the virtual clock) it finds the point
// known to be best and writes a config that loads and runs; a tune stopped by a real signal resumes
// with only the missing points; a grid it cannot run is refused before anything runs; real mode runs
// the knobs only real runs can measure. No timing thresholds: virtual runs charge the modelled costs.
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { appendFileSync, copyFileSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { evaluate, readRecording } from '../../../app/eval/eval.ts';
import { GridError, baseKnobs } from '../../../app/tune/grid.ts';
import { formatTune, measurementEnvironment, tune, tunedConfig, type TuneOptions, type TuneResult } from '../../../app/tune/tune.ts';
import { loadConfig } from '../../../pipeline/config.ts';
import type { RunSummary } from '../../../pipeline/telemetry/events.ts';
import { makeSampleBag } from '../../../tools/make-sample-bag.ts';

const root = new URL('../../..', import.meta.url).pathname;
const dir = join(root, '.cache/test-tune');
const bin = join(root, 'tools/percept.mjs');
const bag = join(dir, 'short.mcap');
const basePath = join(dir, 'base.json');
const calibrationPath = join(dir, 'calibration.json');
const FRAMES = 6;

const baseConfig = {
  encoder: { kind: 'projection', seed: 1, tokens: 16 },
  decoder: { model: 'synth:gemma4-tiny', nCtx: 2048 },
  actions: { schema: join(root, 'configs/actions/robot-action.schema.json') },
  publisher: { endpoint: 'tcp://127.0.0.1:*' },
  ladder: {
    initial: { imageTokens: 280, maxNewTokens: 128, draft: false, frameSkip: 0 },
    rungs: [{ imageTokens: 140 }, { imageTokens: 70 }],
  },
  telemetry: { liveTable: 'off' },
};

// The modelled costs (ms) per level: 280, 140 and 70 image tokens. With a 200 ms budget the 280-token
// point misses every deadline (45 ms before decode + 300 ms of decode); 140 tokens take 146 ms, 70 take 76.
const calibration = {
  kind: 'percept.calibration',
  version: 1,
  virtualServiceMs: { preprocess: [5, 5, 5], encode: [40, 20, 10], decode: [300, 120, 60], actions: [1, 1, 1], publish: [1, 1, 1] },
  p90Ms: {},
  levels: [280, 140, 70].map((imageTokens) => ({ imageTokens, maxNewTokens: 128, draft: false, frameSkip: 0 })),
  frames: 0,
  machine: {},
  config: 'written by hand',
  models: { decoder: 'synth:gemma4-tiny' },
};

const options = (extra: Partial<TuneOptions> & { out: string }): TuneOptions => ({
  bag,
  budgetMs: 200,
  config: basePath,
  calibration: [calibrationPath],
  progress: false,
  ...extra,
});

const byTokens = (result: TuneResult) => Object.fromEntries(result.points.map((p) => [p.knobs.imageTokens, p]));

/** `percept ARGS` in a child; resolves with its exit code and output. */
function percept(args: string[], onStart?: (child: ReturnType<typeof spawn>) => void, env: NodeJS.ProcessEnv = {}) {
  const child = spawn(process.execPath, [bin, ...args], { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  onStart?.(child);
  // 'close': the exit code and every byte of output.
  return new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) =>
    child.on('close', (code) => resolve({ code, stdout, stderr })),
  );
}

const statePoints = (path: string): Record<string, unknown> =>
  (JSON.parse(readFileSync(path, 'utf8')) as { points: Record<string, unknown> }).points;

describe('percept tune', () => {
  before(async () => {
    mkdirSync(dir, { recursive: true });
    await makeSampleBag(bag, { frames: FRAMES, width: 320, height: 180 });
    writeFileSync(basePath, JSON.stringify(baseConfig));
    writeFileSync(calibrationPath, JSON.stringify(calibration));
  });

  test(
    'on modelled stage costs it finds the known best point, writes a config that loads and runs, and reuses its measurements',
    { timeout: 600_000 },
    async () => {
      // Labels: what the 140-token point decodes, so that point is right on every frame by construction.
      const at140 = join(dir, 'at140.json');
      writeFileSync(
        at140,
        JSON.stringify({
          ...baseConfig,
          ladder: { ...baseConfig.ladder, initial: { ...baseConfig.ladder.initial, imageTokens: 140 }, rungs: [] },
        }),
      );
      await evaluate({ bag, config: at140, out: join(dir, 'eval140'), progress: false });
      const recorded = [...(await readRecording(join(dir, 'eval140/run.mcap'))).frames.values()];
      assert.equal(recorded.length, FRAMES);
      const labels = join(dir, 'at140.labels.jsonl');
      writeFileSync(labels, recorded.map((f) => JSON.stringify({ frame_id: f.frameId, action: f.action })).join('\n'));

      const out = join(dir, 'best/tuned.json');
      rmSync(join(dir, 'best'), { recursive: true, force: true });
      const result = await tune(options({ labels, out }));
      assert.equal(result.mode, 'virtual');
      // A version 1 calibration holds medians: fixed costs, and the output says so.
      assert.match(
        formatTune(result),
        /\nlatencies +modelled, not measured: fixed medians from version 1 calibrations \(\S+calibration\.json; p99 = p50 per stage\)\n/,
      );
      assert.equal(result.objective, 'max accuracy s.t. p99<=budget, drop<=0.05');
      assert.deepEqual([result.ran, result.resumed], [3, 0]);
      const p = byTokens(result);
      assert.equal(p[140]!.accuracy, 1);
      assert.ok(p[70]!.accuracy! < 1, 'the 70-token point decodes some frame differently (else this case shows nothing)');
      // 280 tokens: every frame misses at decode; the others are charged exactly their modelled costs.
      assert.deepEqual([p[280]!.frames.out, p[280]!.dropsByReason, p[280]!.feasible], [0, { stale: FRAMES }, false]);
      assert.deepEqual([p[140]!.endToEnd.p99Ms, p[70]!.endToEnd.p99Ms], [146, 76]);
      assert.deepEqual(p[140]!.stages.decode, { p50Ms: 120, p99Ms: 120 });
      assert.equal(result.chosen?.label, 'imageTokens=140');
      assert.deepEqual(
        result.points.filter((x) => x.pareto).map((x) => x.label),
        ['imageTokens=140', 'imageTokens=70'],
      );
      // The ladder below it: 70 tokens, 70 ms saved for what accuracy it loses.
      assert.deepEqual(
        result.ladder.map((s) => [s.rung, s.savedMs, s.qualityLost]),
        [[{ imageTokens: 70 }, 70, 1 - p[70]!.accuracy!]],
      );

      const written = loadConfig(out);
      assert.equal(written.budgets.endToEndMs, 200);
      assert.deepEqual(written.ladder.initial, { ...p[140]!.ladder });
      assert.deepEqual(written.ladder.rungs, [{ imageTokens: 70 }]);
      assert.equal(written.ladder.enabled, true);
      assert.deepEqual(written.virtualServiceMs, {
        preprocess: [5, 5],
        encode: [20, 10],
        decode: [120, 60],
        actions: [1, 1],
        publish: [1, 1],
      });
      assert.equal(JSON.parse(readFileSync(out, 'utf8')).actions.schema, '../../../configs/actions/robot-action.schema.json');

      // The written config runs: the bag in lockstep, charged the tuned level's costs.
      const summaryPath = join(dir, 'best/summary.json');
      const run = await percept(['run', '--config', out, '--source', `bag:${bag}`, '--lockstep', '--json-summary', summaryPath]);
      assert.equal(run.code, 0, run.stderr);
      const summary = JSON.parse(readFileSync(summaryPath, 'utf8')) as RunSummary;
      assert.deepEqual([summary.frames.in, summary.frames.out], [FRAMES, FRAMES]);
      assert.equal(summary.stages.decode!.p50Ms, 120);
      assert.equal(summary.endToEnd.p99Ms, 147, 'the 146 ms measured by the tune and 1 ms of publish');

      // Another objective on the same measurements: nothing runs again; with 100 ms only 70 tokens fit.
      const tight = await tune(options({ labels, out, objective: 'max accuracy s.t. p99<=100' }));
      assert.deepEqual([tight.ran, tight.resumed], [0, 3]);
      assert.equal(tight.chosen?.label, 'imageTokens=70');
      assert.deepEqual(loadConfig(out).ladder.rungs, []);
      // Nothing fits 50 ms: the config an earlier tune wrote is removed, not left to read as this one's.
      const none = await tune(options({ labels, out, objective: 'max accuracy s.t. p99<=50' }));
      assert.deepEqual([none.ran, none.chosen, none.out, none.removed], [0, null, null, out]);
      assert.equal(existsSync(out), false);
      assert.equal(existsSync(join(dir, 'best/.tuned.partial.json')), false);
      assert.match(formatTune(none), /removed +\S+tuned\.json \(an earlier tune's choice, not this one's\)/);
    },
  );

  test(
    'on a version 2 calibration each point samples its distributions: p99 above p50, the same for a seed, another for another',
    { timeout: 600_000 },
    async () => {
      const spread = (ms: number) => ({ count: 4, quantilesMs: [ms, ms * 1.1, ms * 1.5, ms * 4] });
      const sampledPath = join(dir, 'calibration-v2.json');
      writeFileSync(
        sampledPath,
        JSON.stringify({
          ...calibration,
          version: 2,
          virtualServiceMs: { ...calibration.virtualServiceMs, decode: [300, 120, 60].map(spread) },
        }),
      );
      const grid = join(dir, 'grid-140.json');
      writeFileSync(grid, JSON.stringify({ knobs: { imageTokens: [140] } }));
      const at = async (name: string, seed: number) => {
        rmSync(join(dir, name), { recursive: true, force: true });
        const objective = 'max valid s.t. p99<=budget';
        const result = await tune(
          options({ calibration: [sampledPath], grid, seed, objective, budgetMs: 5000, out: join(dir, name, 'tuned.json') }),
        );
        assert.equal(result.points.length, 1);
        return result;
      };
      const a = await at('seed-1', 1);
      const point = a.points[0]!;
      assert.equal(point.frames.out, FRAMES);
      assert.ok(point.stages.decode!.p99Ms! > point.stages.decode!.p50Ms!, JSON.stringify(point.stages.decode));
      assert.ok(point.endToEnd.p99Ms! > point.endToEnd.p50Ms!, JSON.stringify(point.endToEnd));
      assert.deepEqual(point.serviceMs.decode, spread(120));
      assert.equal(a.seed, 1);
      assert.match(
        formatTune(a),
        /\nlatencies +modelled, not measured: stage costs sampled from the calibrated distributions \(seed 1\)\n/,
      );
      // The written config samples the same distributions with the same seed.
      const written = loadConfig(join(dir, 'seed-1', 'tuned.json'));
      assert.deepEqual([written.virtualServiceMs.decode, written.virtualServiceSeed], [[spread(120)], 1]);
      const again = await at('seed-1-again', 1);
      assert.deepEqual([again.ran, again.points[0]!.endToEnd, again.points[0]!.stages], [1, point.endToEnd, point.stages]);
      const other = await at('seed-2', 2);
      assert.notDeepEqual(other.points[0]!.stages.decode, point.stages.decode);
    },
  );

  test(
    'an interrupted tune (a real SIGTERM, then a SIGINT, to the child) keeps what it measured; the rerun measures only the rest',
    { timeout: 600_000 },
    async () => {
      rmSync(join(dir, 'resume'), { recursive: true, force: true });
      mkdirSync(join(dir, 'resume'), { recursive: true });
      const out = join(dir, 'resume/tuned.json');
      const state = join(dir, 'resume/tuned.tune-state.json');
      // Six points, so that a signal sent once one (or one more) is kept lands with points left to run.
      const grid = join(dir, 'resume/grid.json');
      writeFileSync(grid, JSON.stringify({ knobs: { imageTokens: [280, 140, 70], maxNewTokens: [null, 256] } }));
      const args = ['tune', '--bag', bag, '--budget-ms', '200', '--config', basePath, '--calibration', calibrationPath, '--grid', grid];
      args.push('--out', out, '--no-progress', '--json');
      const kept = () => (existsSync(state) ? Object.keys(statePoints(state)).length : 0);
      const stopAfter = (points: number, signal: NodeJS.Signals) =>
        percept(args, (child) => {
          const poll = setInterval(() => {
            if (kept() >= points) {
              clearInterval(poll);
              child.kill(signal);
            }
          }, 50);
          child.on('exit', () => clearInterval(poll));
        });
      const first = await stopAfter(1, 'SIGTERM');
      assert.equal(first.code, 143, first.stderr);
      assert.match(first.stderr, /tune interrupted by SIGTERM after \d of 6 points .*run the same command again/);
      assert.equal(existsSync(out), false, 'no config is written by an interrupted tune');
      const k1 = kept();
      assert.ok(k1 >= 1 && k1 < 6, `${k1} points kept`);
      const second = await stopAfter(k1 + 1, 'SIGINT');
      assert.equal(second.code, 130, second.stderr);
      assert.match(second.stderr, /tune interrupted by SIGINT after \d of 6 points/);
      const snapshot = statePoints(state);
      const k = Object.keys(snapshot).length;
      assert.ok(k > k1 && k < 6, `${k} points kept`);

      const third = await percept(args);
      assert.equal(third.code, 0, third.stderr);
      const result = JSON.parse(third.stdout) as TuneResult;
      assert.deepEqual([result.ran, result.resumed], [6 - k, k]);
      // The points kept are taken as they were measured, not run again.
      assert.equal((third.stderr.match(/replaying bag/g) ?? []).length, 6 - k);
      for (const point of result.points.filter((x) => x.resumed)) {
        const { pareto: _p, feasible: _f, resumed: _r, ...measured } = point;
        assert.ok(
          Object.values(snapshot).some((x) => JSON.stringify(x) === JSON.stringify(measured)),
          point.label,
        );
      }
      assert.equal(Object.keys(statePoints(state)).length, 6);
      assert.ok(result.chosen && existsSync(out));
    },
  );

  test('resume measures every point again when the budget, the calibration or the native addon changed', { timeout: 600_000 }, async () => {
    rmSync(join(dir, 'stale'), { recursive: true, force: true });
    mkdirSync(join(dir, 'stale'), { recursive: true });
    const out = join(dir, 'stale/tuned.json');
    const grid = join(dir, 'stale/grid.json');
    writeFileSync(grid, JSON.stringify({ knobs: { imageTokens: [140, 70] } }));
    const counts = (r: TuneResult) => [r.ran, r.resumed];
    assert.deepEqual(counts(await tune(options({ grid, out }))), [2, 0]);
    assert.deepEqual(counts(await tune(options({ grid, out }))), [0, 2]);
    // Another budget: other deadlines.
    assert.deepEqual(counts(await tune(options({ grid, out, budgetMs: 210 }))), [2, 0]);
    // Another calibration: other stage costs.
    const recalibrated = join(dir, 'stale/calibration.json');
    writeFileSync(
      recalibrated,
      JSON.stringify({ ...calibration, virtualServiceMs: { ...calibration.virtualServiceMs, decode: [300, 121, 61] } }),
    );
    assert.deepEqual(counts(await tune(options({ grid, out, budgetMs: 210, calibration: [recalibrated] }))), [2, 0]);
    // Another build of the native addon (the same code with a byte more; percept's version is the same).
    const args = ['tune', '--bag', bag, '--budget-ms', '210', '--config', basePath, '--calibration', recalibrated];
    const cli = (env: NodeJS.ProcessEnv = {}) =>
      percept([...args, '--grid', grid, '--out', out, '--no-progress', '--json'], undefined, env);
    const same = await cli();
    assert.equal(same.code, 0, same.stderr);
    assert.deepEqual(counts(JSON.parse(same.stdout) as TuneResult), [0, 2]);
    const addon = join(dir, 'stale/percept.node');
    copyFileSync(join(root, 'build/native/Release/percept.node'), addon);
    appendFileSync(addon, '\n');
    const rebuilt = await cli({ PERCEPT_NATIVE: addon });
    assert.equal(rebuilt.code, 0, rebuilt.stderr);
    assert.deepEqual(counts(JSON.parse(rebuilt.stdout) as TuneResult), [2, 0]);
    rmSync(addon);
  });

  test('a point that fails makes the tune exit 1, naming it and why; the others are still measured', { timeout: 600_000 }, async () => {
    rmSync(join(dir, 'failing'), { recursive: true, force: true });
    mkdirSync(join(dir, 'failing'), { recursive: true });
    // A draft "model" that exists (so the plan takes it) but is no GGUF: that point fails when it loads.
    const broken = join(dir, 'failing/broken-draft.gguf');
    writeFileSync(broken, 'not a gguf file\n');
    const drafted = join(dir, 'failing/calibration-draft.json');
    writeFileSync(
      drafted,
      JSON.stringify({
        ...calibration,
        levels: calibration.levels.map((l) => ({ ...l, draft: true })),
        models: { decoder: 'synth:gemma4-tiny', draft: broken },
      }),
    );
    const grid = join(dir, 'failing/grid.json');
    const run = (knobs: object, budget: string) => {
      writeFileSync(grid, JSON.stringify({ knobs }));
      const out = join(dir, 'failing/tuned.json');
      return percept([
        'tune',
        '--bag',
        bag,
        '--budget-ms',
        budget,
        '--config',
        basePath,
        '--calibration',
        calibrationPath,
        drafted,
        '--grid',
        grid,
        '--out',
        out,
        '--no-progress',
      ]);
    };
    const draft = [{ kind: 'none' }, { kind: 'model', model: broken }];
    const some = await run({ imageTokens: [140], draft }, '200');
    assert.equal(some.code, 1, some.stderr);
    assert.match(some.stderr, /tune point failed: draft=model:broken-draft\.gguf: .+/);
    assert.match(some.stderr, /1 of 2 points failed/);
    assert.match(some.stdout, /failed +1 of 2 points \(FAILED above\): chosen among the 1 measured/);
    assert.match(some.stdout, /chosen +model=synth:gemma4-tiny .*draft=none imageTokens=140 /);
    // Nothing to choose because of failures: said so, not "no point meets the constraints".
    const all = await run({ imageTokens: [140], draft: [draft[1]] }, '200');
    assert.equal(all.code, 1, all.stderr);
    assert.match(all.stdout, /chosen +none: every point failed \(FAILED above\); nothing written/);
    assert.doesNotMatch(all.stdout, /no point meets the constraints/);
    const mixed = await run({ imageTokens: [140], draft }, '100');
    assert.equal(mixed.code, 1, mixed.stderr);
    assert.match(mixed.stdout, /chosen +none: 1 of 2 points failed \(FAILED above\), and none of the 1 measured meets the constraints/);
  });

  test('--real with --calibration is refused (not ignored)', async () => {
    await assert.rejects(
      tune(options({ mode: 'real', out: join(dir, 'refused-real/tuned.json') })),
      /--calibration is for --virtual: --real measures every stage/,
    );
    assert.equal(existsSync(join(dir, 'refused-real')), false);
  });

  test("the written config keeps the base ladder's frame-skip rungs below the tuned ones", () => {
    const base = loadConfig({
      ...baseConfig,
      ladder: { ...baseConfig.ladder, rungs: [{ imageTokens: 140 }, { imageTokens: 70, frameSkip: 1 }, { frameSkip: 3 }] },
    });
    type Level = Parameters<typeof tunedConfig>[2][number];
    const level = (index: number, imageTokens: number, decode: number): Level =>
      ({
        index,
        label: `imageTokens=${imageTokens}`,
        knobs: { ...baseKnobs(base), imageTokens },
        ladder: { imageTokens, maxNewTokens: 113, draft: false, frameSkip: 0 },
        serviceMs: { decode },
      }) as unknown as Level;
    const out = join(dir, 'skips/tuned.json');
    const step = { rung: { imageTokens: 70 } } as Parameters<typeof tunedConfig>[3][number];
    const config = tunedConfig(out, base, [level(0, 140, 120), level(1, 70, 60)], [step], 200);
    mkdirSync(join(dir, 'skips'), { recursive: true });
    writeFileSync(out, JSON.stringify(config));
    const written = loadConfig(out);
    assert.deepEqual(written.ladder.rungs, [{ imageTokens: 70 }, { frameSkip: 1 }, { frameSkip: 3 }]);
    assert.deepEqual(written.virtualServiceMs, { decode: [120, 60, 60, 60] });
    // Sampled costs go in as the distributions they are, one per level, and the config samples them.
    const spread = (ms: number) => ({ count: 3, quantilesMs: [ms, ms + 10, ms * 3] });
    const sampled = (index: number, imageTokens: number, ms: number): Level =>
      ({ ...level(index, imageTokens, 0), serviceMs: { decode: spread(ms) } }) as unknown as Level;
    writeFileSync(out, JSON.stringify(tunedConfig(out, base, [sampled(0, 140, 120), sampled(1, 70, 60)], [step], 200)));
    assert.deepEqual(loadConfig(out).virtualServiceMs, { decode: [spread(120), spread(60), spread(60), spread(60)] });
  });

  test('a grid it cannot run is refused before anything runs, naming the JSON path', { timeout: 600_000 }, async () => {
    const grid = (name: string, knobs: object): string => {
      const path = join(dir, `${name}.grid.json`);
      writeFileSync(path, JSON.stringify({ knobs }));
      return path;
    };
    rmSync(join(dir, 'refused'), { recursive: true, force: true });
    const out = join(dir, 'refused/tuned.json');
    // As a user runs it: a bad knob and a bad value; the command exits 1 and nothing ran.
    const cli = await percept([
      'tune',
      '--bag',
      bag,
      '--budget-ms',
      '200',
      '--config',
      basePath,
      '--grid',
      grid('bad', { colour: ['red'], imageTokens: [280, 99] }),
      '--out',
      out,
    ]);
    assert.equal(cli.code, 1);
    assert.match(cli.stderr, /invalid tune grid .*bad\.grid\.json:\n {2}\/knobs\/colour: is not a knob percept tune turns/);
    assert.match(cli.stderr, /\/knobs\/imageTokens\/1: must be one of 70, 140, 256, 280, 560, 1120/);
    assert.doesNotMatch(cli.stderr, /replaying|decoder:/);
    // What the virtual mode cannot model, a budget below the grammar's worst case, edges in lockstep.
    const refused: [object, RegExp][] = [
      [
        { kvType: ['q8_0'] },
        /\/knobs\/kvType\/0: no calibration measured kvType q8_0 \(calibrated: f16\); it needs a calibration made with it, or --real/,
      ],
      [{ imageTokens: [140, 560] }, /\/knobs\/imageTokens\/1: no calibration measured imageTokens 560 \(calibrated: 280, 140, 70\)/],
      [{ model: ['synth:gemma4-tiny?wtype=f16'] }, /\/knobs\/model\/0: no calibration measured decoder synth:gemma4-tiny\?wtype=f16/],
      [{ maxNewTokens: [null, 8] }, /\/knobs\/maxNewTokens\/1: decoder\.maxNewTokens 8 is below the \d+ tokens a complete action/],
      [
        { edges: [{ default: { policy: 'latest' } }, { default: { policy: 'queue', capacity: 2 } }] },
        /\/knobs\/edges: edge policies change nothing in a lockstep replay/,
      ],
    ];
    for (const [knobs, expected] of refused) {
      await assert.rejects(tune(options({ grid: grid('refused', knobs), out })), (err: Error) => {
        assert.ok(err instanceof GridError, err.message);
        assert.match(err.message, expected);
        return true;
      });
    }
    assert.equal(existsSync(join(dir, 'refused')), false, 'no state file, no config: nothing ran');
  });

  test('virtual at the recorded pace: frames wait on edges, so the edge policies are measured', { timeout: 600_000 }, async () => {
    rmSync(join(dir, 'paced'), { recursive: true, force: true });
    const grid = join(dir, 'paced.grid.json');
    const edges = [{ default: { policy: 'latest' } }, { default: { policy: 'queue', capacity: FRAMES } }];
    writeFileSync(grid, JSON.stringify({ knobs: { imageTokens: [280], edges } }));
    // 300 ms of decode per frame against a frame every 100 ms.
    // The valid rate (of the actions published), as the default objective bounds it: at most 5 % dropped.
    const result = await tune(options({ grid, budgetMs: 5000, pace: 'recorded', objective: 'valid', out: join(dir, 'paced/tuned.json') }));
    assert.equal(result.objective, 'max valid s.t. p99<=budget, drop<=0.05');
    assert.equal(result.replay, 'virtual-recorded');
    const [latest, queue] = result.points;
    assert.ok((latest!.dropsByReason.conflated ?? 0) > 0, JSON.stringify(latest!.dropsByReason));
    assert.equal(latest!.frames.out + latest!.frames.dropped, FRAMES);
    assert.deepEqual([queue!.frames.out, queue!.dropsByReason], [FRAMES, {}]);
    // Queued, frame k leaves decode at 345 + 300 k ms and actions 1 ms later, 100 k ms after it came.
    assert.equal(queue!.endToEnd.p99Ms, 346 + (FRAMES - 1) * 200);
    assert.ok(latest!.endToEnd.p99Ms! < queue!.endToEnd.p99Ms!);
    // Faster and as valid on what it publishes, but it drops frames: the objective bounds that.
    assert.equal(latest!.dropRate, latest!.frames.dropped / FRAMES);
    assert.ok(latest!.dropRate! > 0.05 && !latest!.feasible);
    assert.deepEqual([queue!.dropRate, result.chosen?.index], [0, queue!.index]);
  });

  test(
    'real mode: the KV type and the draft length run on the real stages; every frame is accounted for',
    { timeout: 600_000 },
    async () => {
      rmSync(join(dir, 'real'), { recursive: true, force: true });
      const grid = join(dir, 'real.grid.json');
      writeFileSync(grid, JSON.stringify({ knobs: { kvType: ['f16', 'q8_0'], draft: [{ kind: 'ngram', max: 2 }] } }));
      const out = join(dir, 'real/tuned.json');
      // A budget no loaded machine misses: this test is about what runs, not how fast.
      // No bound on drops either: how many frames a loaded machine conflates is no part of it.
      const objective = 'max accuracy s.t. p99<=budget';
      const result = await tune({ bag, budgetMs: 3_600_000, config: basePath, grid, mode: 'real', objective, out, progress: false });
      assert.deepEqual([result.mode, result.replay, result.objective], ['real', 'real', objective]);
      assert.deepEqual(
        result.points.map((x) => x.label),
        ['kvType=f16', 'kvType=q8_0'],
      );
      for (const point of result.points) {
        assert.equal(point.status, 'ok', point.error ?? '');
        assert.equal(point.frames.in, FRAMES);
        assert.equal(point.frames.out + point.frames.dropped, FRAMES, JSON.stringify(point.dropsByReason));
        assert.ok(point.frames.out > 0);
        // Real mode keeps each stage's measured distribution, for the written ladder's virtualServiceMs.
        const decode = point.serviceMs.decode!;
        assert.ok(typeof decode === 'object', 'a distribution');
        const p50 = point.stages.decode!.p50Ms!;
        assert.ok(
          decode.count > 0 && decode.quantilesMs[0]! - 0.001 <= p50 && p50 <= decode.quantilesMs.at(-1)! + 0.001,
          JSON.stringify(decode),
        );
      }
      // Real measurements are this machine's: it is part of their key (virtual ones are the addon's alone).
      const real = (await measurementEnvironment('real')) as { machine?: { cores: number; cpu: string } };
      assert.deepEqual([real.machine?.cores, real.machine?.cpu], [cpus().length, cpus()[0]!.model]);
      assert.equal('machine' in (await measurementEnvironment('virtual')), false);
      const written = loadConfig(out);
      assert.deepEqual([written.decoder.ngram, written.decoder.draftMax, written.decoder.kvType], [true, 2, result.chosen!.knobs.kvType]);
      assert.equal(written.ladder.initial.draft, true);
    },
  );
});
