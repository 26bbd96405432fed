// percept calibrate: the timing of each stage per ladder level (checked on fake stages whose cost is
// known, on a fake clock), the calibration file a config then names, and the command as a user runs it.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { distributionsPerLevel, perLevel, timeStages, type CalibrationFile } from '../../../app/eval/calibrate.ts';
import { median } from '../../../app/stats.ts';
import { loadConfig } from '../../../pipeline/config.ts';
import { DropFrame, type Knobs, type Stage, type StageContext } from '../../../pipeline/types.ts';
import type { CameraFrame } from '../../../nodes/payloads.ts';

const root = new URL('../../..', import.meta.url).pathname;
const dir = join(root, '.cache/test-calibrate');
mkdirSync(dir, { recursive: true });

describe('calibrate', () => {
  test('times each stage per level on the given clock; a frameSkip-only level reuses the level above; dropped frames stop there', async () => {
    let now = 0n;
    const stage = (name: string, cost: (knobs: Knobs, frame: number) => number): Stage<never, unknown> => ({
      name,
      process: async (input: unknown, ctx: StageContext) => {
        now += BigInt(cost(ctx.knobs, ctx.frame.frameId)) * 1_000_000n;
        if (name === 'actions' && ctx.frame.frameId === 3) throw new DropFrame('invalid', 'not an action');
        return input;
      },
    });
    const levels: Knobs[] = [
      { imageTokens: 280, maxNewTokens: 64, draft: true, frameSkip: 0 },
      { imageTokens: 140, maxNewTokens: 64, draft: true, frameSkip: 0 },
      { imageTokens: 140, maxNewTokens: 64, draft: true, frameSkip: 1 },
    ];
    const frames = Array.from({ length: 4 }, (): CameraFrame => ({ encoding: 'jpeg', data: new Uint8Array(1) }));
    const progress: string[] = [];
    const times = await timeStages({
      stages: [
        stage('encode', (k) => k.imageTokens / 10),
        stage('decode', (k, f) => k.maxNewTokens + f),
        stage('actions', () => 1),
        stage('publish', () => 2),
      ],
      frames,
      levels,
      now: () => now,
      onFrame: (level, frame) => progress.push(`${level}:${frame}`),
    });
    // Every level's frames count as done, the reused level's too, so progress reaches its total.
    assert.deepEqual(progress, ['0:0', '0:1', '0:2', '0:3', '1:0', '1:1', '1:2', '1:3', '2:0', '2:1', '2:2', '2:3']);
    // Frame ids 1..4 are timed (0 is the warm-up); frame 3 is dropped by actions, so publish never sees it.
    assert.deepEqual(times.samples.get('encode'), [
      [28, 28, 28, 28],
      [14, 14, 14, 14],
      [14, 14, 14, 14],
    ]);
    assert.deepEqual(times.samples.get('decode')![0], [65, 66, 67, 68]);
    assert.deepEqual(times.samples.get('publish')![0], [2, 2, 2]);
    assert.deepEqual(perLevel(times, median), { encode: [28, 14, 14], decode: [66.5, 66.5, 66.5], actions: [1, 1, 1], publish: [2, 2, 2] });
    // The file keeps each level's distribution, not one figure: here the sorted samples and their count.
    const distributions = distributionsPerLevel(times);
    assert.deepEqual(distributions.decode![0], { count: 4, quantilesMs: [65, 66, 67, 68] });
    assert.deepEqual(distributions.publish![2], { count: 3, quantilesMs: [2, 2, 2] });
  });

  test('a version 2 file gives the config its distributions; a version 1 file its medians as fixed costs; a newer one is refused', () => {
    const decode = [
      { count: 4, quantilesMs: [100, 120, 130, 400] },
      { count: 4, quantilesMs: [50, 60, 61, 90] },
    ];
    const v2 = { kind: 'percept.calibration', version: 2, virtualServiceMs: { decode }, medianMs: { decode: [125, 60.5] } };
    writeFileSync(join(dir, 'calibration-v2.json'), JSON.stringify(v2));
    writeFileSync(join(dir, 'config-v2.json'), JSON.stringify({ clock: 'virtual', virtualServiceMs: 'calibration-v2.json' }));
    assert.deepEqual(loadConfig(join(dir, 'config-v2.json')).virtualServiceMs, { decode });
    const v1 = { kind: 'percept.calibration', version: 1, virtualServiceMs: { decode: [125, 60.5] } };
    writeFileSync(join(dir, 'calibration-v1.json'), JSON.stringify(v1));
    writeFileSync(join(dir, 'config-v1.json'), JSON.stringify({ clock: 'virtual', virtualServiceMs: 'calibration-v1.json' }));
    assert.deepEqual(loadConfig(join(dir, 'config-v1.json')).virtualServiceMs, { decode: [125, 60.5] });
    writeFileSync(join(dir, 'calibration-v3.json'), JSON.stringify({ ...v2, version: 3 }));
    writeFileSync(join(dir, 'config-v3.json'), JSON.stringify({ clock: 'virtual', virtualServiceMs: 'calibration-v3.json' }));
    assert.throws(
      () => loadConfig(join(dir, 'config-v3.json')),
      /\/virtualServiceMs: .*calibration-v3\.json is a calibration file of version 3; this percept reads versions 1 and 2/,
    );
  });

  test('a config names a calibration file in virtualServiceMs (relative to the config); a wrong file is a config error', () => {
    const calibration = { kind: 'percept.calibration', version: 1, virtualServiceMs: { decode: [120, 90], encode: [30, 20] } };
    writeFileSync(join(dir, 'calibration.json'), JSON.stringify(calibration));
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ clock: 'virtual', virtualServiceMs: 'calibration.json' }));
    assert.deepEqual(loadConfig(join(dir, 'config.json')).virtualServiceMs, calibration.virtualServiceMs);
    // A config without rungs takes the ladder the calibration was measured with, whatever its length.
    const knobs = { imageTokens: 280, maxNewTokens: 64, draft: true, frameSkip: 0 };
    const levels = [knobs, { ...knobs, imageTokens: 140 }, { ...knobs, imageTokens: 140, frameSkip: 1 }];
    const six = { ...calibration, virtualServiceMs: { decode: [9, 8, 7] }, levels };
    writeFileSync(join(dir, 'calibration-3.json'), JSON.stringify(six));
    writeFileSync(join(dir, 'only-calibration.json'), JSON.stringify({ clock: 'virtual', virtualServiceMs: 'calibration-3.json' }));
    const adopted = loadConfig(join(dir, 'only-calibration.json')).ladder;
    assert.deepEqual(adopted.initial, knobs);
    assert.deepEqual(adopted.rungs, [{ imageTokens: 140 }, { frameSkip: 1 }]);
    // With rungs of its own, a config keeps them, and a mismatch says what to change.
    writeFileSync(
      join(dir, 'own-ladder.json'),
      JSON.stringify({ virtualServiceMs: 'calibration-3.json', ladder: { rungs: [{ draft: false }] } }),
    );
    assert.throws(() => loadConfig(join(dir, 'own-ladder.json')), /has 3 levels but the ladder has 2 .*leave ladder\.rungs out/);
    writeFileSync(join(dir, 'bad.json'), JSON.stringify({ virtualServiceMs: 'config.json' }));
    assert.throws(
      () => loadConfig(join(dir, 'bad.json')),
      /\/virtualServiceMs: .*config\.json is not a calibration file written by percept calibrate/,
    );
    writeFileSync(join(dir, 'missing.json'), JSON.stringify({ virtualServiceMs: 'nope.json' }));
    assert.throws(() => loadConfig(join(dir, 'missing.json')), /\/virtualServiceMs: cannot read the calibration file .*nope\.json/);
  });

  test(
    'percept calibrate measures the real stages on the tiny models and writes a file a lockstep replay uses',
    { timeout: 600_000 },
    async () => {
      const config = {
        source: { kind: 'pattern', fps: 10, frames: 3, width: 320, height: 240 },
        encoder: { kind: 'projection', seed: 1, tokens: 16 },
        decoder: { model: 'synth:gemma4-tiny', nCtx: 2048 },
        actions: { schema: join(root, 'configs/actions/robot-action.schema.json') },
        ladder: {
          enabled: true,
          initial: { imageTokens: 70, maxNewTokens: 16, draft: true, frameSkip: 0 },
          rungs: [{ maxNewTokens: 8 }, { frameSkip: 1 }],
        },
      };
      writeFileSync(join(dir, 'tiny.json'), JSON.stringify(config));
      const out = join(dir, 'tiny-calibration.json');
      const { stdout, stderr } = await promisify(execFile)(
        process.execPath,
        [join(root, 'tools/percept.mjs'), 'calibrate', '--config', join(dir, 'tiny.json'), '--frames', '2', '--out', out],
        { cwd: dir, timeout: 540_000 },
      );
      assert.match(stdout, /levels +3/);
      // stderr is a pipe here: whole lines, no carriage return, and the count reaches its total.
      assert.ok(!stderr.includes('\r'), `no carriage return in a pipe: ${JSON.stringify(stderr)}`);
      assert.match(stderr, /^percept: calibrate 6\/6 frames$/m);
      const file = JSON.parse(readFileSync(out, 'utf8')) as CalibrationFile;
      assert.equal(file.kind, 'percept.calibration');
      assert.equal(file.frames, 2);
      assert.equal(file.levels.length, 3);
      // The decoder settings it ran with, so a tune can tell which points it measured.
      assert.deepEqual(file.decoder, { ngram: false, draftMax: null, kvType: 'f16', threads: null, gpuLayers: 0 });
      assert.deepEqual(Object.keys(file.virtualServiceMs), ['preprocess', 'encode', 'decode', 'actions', 'publish']);
      assert.equal(file.version, 2);
      for (const [stage, levels] of Object.entries(file.virtualServiceMs)) {
        assert.equal(levels.length, 3, stage);
        for (const cost of levels) {
          assert.ok(typeof cost === 'object', `${stage}: a distribution per level`);
          assert.equal(cost.count, 2, stage);
          assert.equal(cost.quantilesMs.length, 2, stage);
          assert.ok(cost.quantilesMs[0]! >= 0 && cost.quantilesMs[0]! <= cost.quantilesMs[1]!, `${stage}: ${cost.quantilesMs}`);
        }
        assert.deepEqual(levels[2], levels[1], `${stage}: the frameSkip level costs what the level above does`);
        assert.equal(file.medianMs![stage]!.length, 3, stage);
      }
      assert.ok(file.medianMs!.decode![0]! > 0 && file.medianMs!.preprocess![0]! > 0);
      // The file plugs into a config as it is.
      writeFileSync(
        join(dir, 'calibrated.json'),
        JSON.stringify({ ...config, clock: 'virtual', lockstep: true, virtualServiceMs: 'tiny-calibration.json' }),
      );
      assert.deepEqual(loadConfig(join(dir, 'calibrated.json')).virtualServiceMs, file.virtualServiceMs);
    },
  );
});
