// The scene generator (tools/make-scenes.ts): determinism, the seed splits, and actionOf's rules.
// The rules are checked on hand-built scenes and on generated ones: schema-valid, every rule reached.
// The wet-floor rule hangs on the sign's colour, and the labels match the drawn pixels.
// Both CLI commands run, and the sample bag is still made byte for byte from the shared geometry.
// The sample bag's labels are actionOf of its frames' scenes, scenes that describe what is drawn.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdir, open, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Ajv } from 'ajv';
import { McapIndexedReader } from '@mcap/core';
import { FileHandleReadable } from '@mcap/nodejs';
import { loadDecompressHandlers } from '@mcap/support';
import sharp from 'sharp';
import {
  LOW_LIGHT,
  NEAR_PERSON,
  SLOW_SPEED,
  SPLITS,
  SPLIT_NAMES,
  actionOf,
  encodeScene,
  makeScene,
  renderScene,
  seedOf,
  splitOf,
  writeDataset,
  type RobotAction,
  type Scene,
  type SceneObject,
} from '../../tools/make-scenes.ts';
import { CAMERA_TOPIC, labelsPathOf } from '../../tools/scene-geometry.ts';
import { SAMPLE_START_NS, geometryAt, makeSampleBag, renderScene as renderSample, sampleSceneAt } from '../../tools/make-sample-bag.ts';

const root = new URL('../..', import.meta.url).pathname;
const dir = join(root, '.cache', 'test-scenes');
const run = promisify(execFile);
const schema = JSON.parse(await readFile(join(root, 'configs/actions/robot-action.schema.json'), 'utf8')) as object;
const validate = new Ajv({ strict: true, allErrors: true }).compile(schema);

before(async () => mkdir(dir, { recursive: true }));
after(async () => rm(dir, { recursive: true, force: true }));

/** A scene of the given objects in seed 0's room, fully lit unless told. */
const sceneOf = (objects: SceneObject[], light = 1, horizon = 0.5): Scene => ({ ...makeScene(0), objects, light, horizon });
const person = (x0: number, y0: number, x1: number, y1: number): SceneObject => ({ kind: 'person', box: [x0, y0, x1, y1] });
const door: SceneObject = { kind: 'door', box: [0.8, 0.1, 0.9, 0.5] };
const cup: SceneObject = { kind: 'cup', box: [0.2, 0.4, 0.24, 0.47] };
const sign = (colour: SceneObject['colour'], x0 = 0.1): SceneObject => ({ kind: 'sign', box: [x0, 0.7, x0 + 0.06, 0.88], colour });

describe('seeds', () => {
  test('the splits are disjoint and every seed has one split', () => {
    const ranges = SPLIT_NAMES.map((s) => SPLITS[s]);
    for (const [i, a] of ranges.entries()) {
      assert.ok(a.start < a.end);
      for (const b of ranges.slice(i + 1))
        assert.ok(a.end <= b.start || b.end <= a.start, `${JSON.stringify(a)} overlaps ${JSON.stringify(b)}`);
    }
    assert.equal(splitOf(0), 'train');
    assert.equal(splitOf(999_999), 'train');
    assert.equal(splitOf(1_000_000), 'val');
    assert.equal(splitOf(1_099_999), 'val');
    assert.equal(splitOf(1_100_000), undefined);
    assert.equal(splitOf(2_000_000), 'test');
    assert.equal(seedOf('test', 5), 2_000_005);
    assert.throws(() => seedOf('val', 100_000), /outside split val/);
    assert.throws(() => seedOf('train', -1), /outside split train/);
  });

  test('the same seed gives the same scene and the same bytes; other seeds differ', async () => {
    assert.deepEqual(makeScene(1234), makeScene(1234));
    const a = await encodeScene(makeScene(1234), 320, 180);
    const b = await encodeScene(makeScene(1234), 320, 180);
    assert.ok(a.equals(b));
    const others = await Promise.all([1, 2, 3, 1_000_000, 2_000_000].map((s) => encodeScene(makeScene(s), 320, 180)));
    const all = [a, ...others].map((j) => j.toString('base64'));
    assert.equal(new Set(all).size, all.length);
    assert.notDeepEqual(makeScene(1), makeScene(2));
  });
});

describe('rules', () => {
  test('hand-built scenes get the actions of the rule table', () => {
    const cases: [string, Scene, RobotAction][] = [
      [
        'a close person: stop',
        sceneOf([door, person(0.4, 0.3, 0.47, 0.95)]),
        { action: 'stop', confidence: 1, target: { label: 'person', bbox: [0.4, 0.3, 0.47, 0.95] }, hazards: ['person_close'] },
      ],
      [
        'a far person: wait',
        sceneOf([door, cup, person(0.1234, 0.4, 0.15, 0.62)]),
        { action: 'wait', confidence: 1, target: { label: 'person', bbox: [0.12, 0.4, 0.15, 0.62] } },
      ],
      [
        'every hazard at once, in order',
        sceneOf([sign('orange'), person(0.4, 0.3, 0.47, 0.95)], LOW_LIGHT - 0.1),
        {
          action: 'stop',
          confidence: 1,
          target: { label: 'person', bbox: [0.4, 0.3, 0.47, 0.95] },
          hazards: ['person_close', 'wet_floor', 'low_light'],
        },
      ],
      [
        'a box in the path left of centre: turn right',
        sceneOf([door, cup, { kind: 'box', box: [0.36, 0.7, 0.48, 0.85] }]),
        { action: 'turn', confidence: 1, heading_deg: -45, target: { label: 'box', bbox: [0.36, 0.7, 0.48, 0.85] } },
      ],
      [
        'an obstacle in the path right of centre: turn left',
        sceneOf([{ kind: 'obstacle', box: [0.52, 0.6, 0.6, 0.9] }]),
        { action: 'turn', confidence: 1, heading_deg: 45, target: { label: 'obstacle', bbox: [0.52, 0.6, 0.6, 0.9] } },
      ],
      [
        'a box in the path but far away does not block',
        sceneOf([door, { kind: 'box', box: [0.45, 0.55, 0.55, 0.7] }]),
        { action: 'move', confidence: 1, speed: 1, heading_deg: -30, target: { label: 'door', bbox: [0.8, 0.1, 0.9, 0.5] } },
      ],
      [
        'a near box beside the path does not block',
        sceneOf([cup, { kind: 'box', box: [0.1, 0.8, 0.3, 0.95] }]),
        { action: 'grasp', confidence: 1, target: { label: 'cup', bbox: [0.2, 0.4, 0.24, 0.47] } },
      ],
      [
        'a cup before a door',
        sceneOf([door, cup]),
        { action: 'grasp', confidence: 1, target: { label: 'cup', bbox: [0.2, 0.4, 0.24, 0.47] } },
      ],
      [
        'a cup in low light: no grasp, the door slowly',
        sceneOf([door, cup], 0.3),
        {
          action: 'move',
          confidence: 1,
          speed: SLOW_SPEED,
          heading_deg: -30,
          target: { label: 'door', bbox: [0.8, 0.1, 0.9, 0.5] },
          hazards: ['low_light'],
        },
      ],
      [
        'a cup in low light without a door: wait',
        sceneOf([cup], 0.3),
        { action: 'wait', confidence: 1, target: { label: 'none' }, hazards: ['low_light'] },
      ],
      [
        'a wet-floor sign without a door: turn away from it',
        sceneOf([cup, sign('red', 0.7)]),
        { action: 'turn', confidence: 1, heading_deg: 45, target: { label: 'none' }, hazards: ['wet_floor'] },
      ],
      [
        'a wet-floor sign and a door: the door slowly',
        sceneOf([{ kind: 'door', box: [0.1, 0.1, 0.2, 0.5] }, sign('red')]),
        {
          action: 'move',
          confidence: 1,
          speed: SLOW_SPEED,
          heading_deg: 30,
          target: { label: 'door', bbox: [0.1, 0.1, 0.2, 0.5] },
          hazards: ['wet_floor'],
        },
      ],
      [
        'a door straight ahead',
        sceneOf([{ kind: 'door', box: [0.45, 0.1, 0.55, 0.5] }]),
        { action: 'move', confidence: 1, speed: 1, heading_deg: 0, target: { label: 'door', bbox: [0.45, 0.1, 0.55, 0.5] } },
      ],
      ['nothing: wait', sceneOf([]), { action: 'wait', confidence: 1, target: { label: 'none' } }],
    ];
    for (const [what, scene, expected] of cases) {
      assert.deepEqual(actionOf(scene), expected, what);
      assert.ok(validate(actionOf(scene)), what);
    }
    // The threshold of a close person is the share of the image height.
    assert.equal(actionOf(sceneOf([person(0.4, 0.5 - NEAR_PERSON, 0.45, 0.5)])).action, 'stop');
    assert.equal(actionOf(sceneOf([person(0.4, 0.51 - NEAR_PERSON, 0.45, 0.5)])).action, 'wait');
  });

  test('the wet-floor rule depends on the sign colour alone', async () => {
    for (const colour of ['red', 'orange'] as const) {
      const action = actionOf(sceneOf([cup, sign(colour)]));
      assert.equal(action.action, 'turn');
      assert.deepEqual(action.hazards, ['wet_floor']);
    }
    for (const colour of ['blue', 'green', 'grey', 'purple'] as const)
      assert.deepEqual(actionOf(sceneOf([cup, sign(colour)])), actionOf(sceneOf([cup])));
    // In generated scenes: recolouring the wet-floor signs removes the hazard, and the sign's pixels carry the colour.
    let flipped = 0;
    for (let seed = 0; seed < 300; seed++) {
      const scene = makeScene(seed);
      if (!scene.objects.some((o) => o.kind === 'sign' && (o.colour === 'red' || o.colour === 'orange'))) continue;
      assert.ok(actionOf(scene).hazards?.includes('wet_floor'), `seed ${seed}`);
      const recoloured = { ...scene, objects: scene.objects.map((o) => (o.kind === 'sign' ? { ...o, colour: 'blue' as const } : o)) };
      assert.ok(!actionOf(recoloured).hazards?.includes('wet_floor'), `seed ${seed}`);
      assert.notDeepEqual(actionOf(recoloured), actionOf(scene));
      flipped++;
    }
    assert.ok(flipped >= 20, `only ${flipped} scenes with a wet-floor sign`);
    const red = sceneOf([sign('red', 0.4)]);
    const blue = sceneOf([{ ...sign('blue', 0.4), paint: [[40, 90, 200]] }]);
    const mean = (px: Buffer, ch: number): number => {
      let sum = 0;
      let n = 0;
      for (let y = Math.round(0.82 * 180); y < Math.round(0.86 * 180); y++) {
        for (let x = Math.round(0.41 * 320); x < Math.round(0.45 * 320); x++, n++) sum += px[(y * 320 + x) * 3 + ch]!;
      }
      return sum / n;
    };
    const redPx = renderScene(red, 320, 180, { plain: true });
    const bluePx = renderScene(blue, 320, 180, { plain: true });
    assert.ok(mean(redPx, 0) > 2 * mean(redPx, 2), 'the red sign is red');
    assert.ok(mean(bluePx, 2) > 2 * mean(bluePx, 0), 'the blue sign is blue');
  });

  test('generated actions are valid, and every rule and hazard is reached', () => {
    const kinds = new Map<string, number>();
    const count = (k: string): void => void kinds.set(k, (kinds.get(k) ?? 0) + 1);
    const n = 600;
    for (const split of SPLIT_NAMES) {
      for (let k = 0; k < n / 3; k++) {
        const seed = seedOf(split, k);
        const action = actionOf(makeScene(seed));
        assert.ok(validate(action), `seed ${seed}: ${JSON.stringify(validate.errors)}`);
        if (action.target?.bbox)
          assert.ok(
            action.target.bbox.every((v) => Math.abs(v * 100 - Math.round(v * 100)) < 1e-9),
            `seed ${seed}: 2 decimals`,
          );
        if (action.heading_deg !== undefined) assert.equal(Math.abs(action.heading_deg) % 5, 0);
        count(action.action);
        count(`target:${action.target?.label}`);
        for (const h of action.hazards ?? []) count(`hazard:${h}`);
        if (action.speed !== undefined) count(`speed:${action.speed}`);
        if (action.action === 'turn') count(`turn:${action.heading_deg! > 0 ? 'left' : 'right'}`);
      }
    }
    const share = (k: string): number => (kinds.get(k) ?? 0) / n;
    for (const action of ['stop', 'wait', 'turn', 'grasp', 'move']) assert.ok(share(action) >= 0.08, `${action}: ${share(action)}`);
    for (const k of ['person', 'cup', 'box', 'door', 'obstacle', 'none'])
      assert.ok(share(`target:${k}`) >= 0.03, `target ${k}: ${share(`target:${k}`)}`);
    for (const k of [
      'hazard:person_close',
      'hazard:wet_floor',
      'hazard:low_light',
      'speed:1',
      `speed:${SLOW_SPEED}`,
      'turn:left',
      'turn:right',
    ])
      assert.ok(share(k) >= 0.03, `${k}: ${share(k)}`);
  });

  test('persons come at every height, crowded about NEAR_PERSON, and their boxes stay in the frame', () => {
    const heights: number[] = [];
    for (let k = 0; k < 3000 && heights.length < 600; k++) {
      const scene = makeScene(seedOf('train', k));
      for (const o of scene.objects.filter((o) => o.kind === 'person')) {
        const [, y0, , y1] = o.box;
        assert.ok(y0 >= 0 && y1 <= 1, `seed ${scene.seed}: person box ${o.box.join(', ')} leaves the frame`);
        heights.push(y1 - y0);
      }
    }
    const within = (lo: number, hi: number): number => heights.filter((h) => h >= lo && h < hi).length / heights.length;
    // Every tenth of the range between far and near holds persons; the band on either side of the threshold most.
    for (let lo = 0.15; lo < 0.75; lo += 0.1)
      assert.ok(within(lo, lo + 0.1) >= 0.03, `heights ${lo.toFixed(2)}–${(lo + 0.1).toFixed(2)}: ${within(lo, lo + 0.1)}`);
    assert.ok(within(NEAR_PERSON - 0.08, NEAR_PERSON) >= 0.15, `just below NEAR_PERSON: ${within(NEAR_PERSON - 0.08, NEAR_PERSON)}`);
    assert.ok(within(NEAR_PERSON, NEAR_PERSON + 0.08) >= 0.15, `just above NEAR_PERSON: ${within(NEAR_PERSON, NEAR_PERSON + 0.08)}`);
  });

  test('the labels are where the objects are drawn', () => {
    const W = 320;
    const H = 180;
    let checked = 0;
    for (let seed = 0; seed < 40; seed++) {
      const scene = makeScene(seed);
      const full = renderScene(scene, W, H, { plain: true });
      scene.objects.forEach((o, i) => {
        if (o.kind === 'door') return; // the frame is drawn around the labelled panel
        const without = renderScene({ ...scene, objects: scene.objects.filter((_, j) => j !== i) }, W, H, { plain: true });
        let [x0, y0, x1, y1] = [W, H, -1, -1];
        for (let y = 0; y < H; y++) {
          for (let x = 0; x < W; x++) {
            const p = (y * W + x) * 3;
            if (full[p] !== without[p] || full[p + 1] !== without[p + 1] || full[p + 2] !== without[p + 2]) {
              x0 = Math.min(x0, x);
              y0 = Math.min(y0, y);
              x1 = Math.max(x1, x + 1);
              y1 = Math.max(y1, y + 1);
            }
          }
        }
        const got = [x0 / W, y0 / H, x1 / W, y1 / H];
        const tolerance = [2 / W, 2 / H, 2 / W, 2 / H];
        got.forEach((v, k) =>
          assert.ok(Math.abs(v - o.box[k]!) <= tolerance[k]!, `seed ${seed} ${o.kind}: drawn ${got} labelled ${o.box}`),
        );
        checked++;
      });
    }
    assert.ok(checked >= 60, `only ${checked} objects checked`);
  });
});

describe('CLI', () => {
  const cli = join(root, 'tools/make-scenes.ts');

  test('dataset writes the images and the lines it says, the same bytes with any number of jobs', async () => {
    const out = join(dir, 'dataset');
    const { stdout } = await run(process.execPath, [
      '--import',
      'tsx',
      cli,
      'dataset',
      '--split',
      'val',
      '--count',
      '5',
      '--start',
      '3',
      '--out',
      out,
      '--jobs',
      '2',
      '--width',
      '192',
      '--height',
      '108',
    ]);
    assert.match(stdout, /wrote 5 frames to .*dataset/);
    const lines = (await readFile(join(out, 'scenes.jsonl'), 'utf8')).trimEnd().split('\n');
    assert.equal(lines.length, 5);
    for (const [k, text] of lines.entries()) {
      const line = JSON.parse(text) as Record<string, unknown>;
      const seed = 1_000_003 + k;
      assert.equal(line.seed, seed);
      assert.equal(line.split, 'val');
      assert.equal(line.image, `images/${seed}.jpg`);
      assert.equal(line.width, 192);
      assert.equal(line.height, 108);
      assert.deepEqual(line.action, actionOf(makeScene(seed)));
      assert.ok(Array.isArray((line.scene as { objects: unknown }).objects));
      const jpeg = await readFile(join(out, line.image as string));
      const meta = await sharp(jpeg).metadata();
      assert.deepEqual([meta.format, meta.width, meta.height], ['jpeg', 192, 108]);
      assert.ok(jpeg.equals(await encodeScene(makeScene(seed), 192, 108)), `seed ${seed}: the worker's bytes differ`);
    }
    // In this thread too, and a count past the split's end is refused.
    await writeDataset({ split: 'val', count: 2, start: 3, out: join(dir, 'dataset1'), width: 192, height: 108, jobs: 1 });
    assert.equal((await readFile(join(dir, 'dataset1/scenes.jsonl'), 'utf8')).split('\n')[0], lines[0]);
    await assert.rejects(writeDataset({ split: 'val', count: 2, start: 99_999, out: join(dir, 'dataset2') }), /outside split val/);
    // A worker that cannot write its image fails the whole run.
    await mkdir(join(dir, 'dataset3/images/1000001.jpg'), { recursive: true });
    await assert.rejects(
      writeDataset({ split: 'val', count: 4, out: join(dir, 'dataset3'), width: 64, height: 64, jobs: 2 }),
      /EISDIR.*1000001\.jpg/,
    );
  });

  test('bag writes a camera bag with one label per frame', async () => {
    const path = join(dir, 'scenes.mcap');
    const { stdout } = await run(process.execPath, ['--import', 'tsx', cli, 'bag', '--split', 'test', '--count', '4', '--out', path]);
    assert.match(stdout, /wrote .*scenes\.mcap: 4 frames/);
    const labels = (await readFile(labelsPathOf(path), 'utf8'))
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l) as { log_time_ns: string; action: RobotAction; note: string });
    const handle = await open(path, 'r');
    try {
      const reader = await McapIndexedReader.Initialize({
        readable: new FileHandleReadable(handle),
        decompressHandlers: await loadDecompressHandlers(),
      });
      const channels = [...reader.channelsById.values()];
      assert.deepEqual(
        channels.map((c) => c.topic),
        [CAMERA_TOPIC],
      );
      assert.equal(reader.schemasById.get(channels[0]!.schemaId)?.name, 'foxglove.CompressedImage');
      let i = 0;
      for await (const m of reader.readMessages()) {
        const seed = 2_000_000 + i;
        const body = JSON.parse(new TextDecoder().decode(m.data)) as { format: string; data: string };
        assert.equal(body.format, 'jpeg');
        assert.ok(Buffer.from(body.data, 'base64').equals(await encodeScene(makeScene(seed), 640, 360)));
        assert.equal(labels[i]!.log_time_ns, String(m.logTime));
        assert.deepEqual(labels[i]!.action, actionOf(makeScene(seed)));
        assert.equal(labels[i]!.note, `seed ${seed}`);
        assert.ok(validate(labels[i]!.action));
        i++;
      }
      assert.equal(i, 4);
      assert.equal(labels.length, 4);
    } finally {
      await handle.close();
    }
  });

  test('make-sample-bag still makes the committed sample bag byte for byte', async () => {
    const made = await makeSampleBag(join(dir, 'sample.mcap'));
    assert.ok((await readFile(made.path)).equals(await readFile(join(root, 'bags/sample.mcap'))), 'bags/sample.mcap differs');
    assert.equal(await readFile(made.labels, 'utf8'), await readFile(join(root, 'bags/sample.labels.jsonl'), 'utf8'));
  });
});

describe('sample bag', () => {
  test('its labels are actionOf of its frames: the one rule table', async () => {
    const lines = (await readFile(join(root, 'bags/sample.labels.jsonl'), 'utf8')).trimEnd().split('\n');
    assert.equal(lines.length, 40);
    for (const [i, text] of lines.entries()) {
      const label = JSON.parse(text) as { log_time_ns: string; action: RobotAction };
      assert.deepEqual(Object.keys(label), ['log_time_ns', 'action']);
      assert.equal(label.log_time_ns, String(SAMPLE_START_NS + BigInt(i) * 100_000_000n));
      assert.deepEqual(label.action, actionOf(sampleSceneAt(i, 40, 640, 360)), `frame ${i}`);
      assert.ok(validate(label.action), `frame ${i}`);
    }
    // Other lengths and sizes too: a short bag's labels are its own frames' actions.
    const made = await makeSampleBag(join(dir, 'sample-short.mcap'), { frames: 6, width: 320, height: 180 });
    const short = (await readFile(made.labels, 'utf8')).trimEnd().split('\n');
    assert.deepEqual(
      short.map((l) => (JSON.parse(l) as { action: RobotAction }).action),
      Array.from({ length: 6 }, (_, i) => actionOf(sampleSceneAt(i, 6, 320, 180))),
    );
  });

  test("its scenes describe what it draws: make-scenes draws them alike but for the door's knob", () => {
    const [W, H] = [640, 360];
    for (const i of [0, 13, 27, 28, 39]) {
      const scene = sampleSceneAt(i, 40, W, H);
      assert.equal(scene.light, 1);
      assert.deepEqual(scene.objects.map((o) => o.kind).sort(), ['box', 'door', 'person']);
      assert.equal(scene.objects[0]!.kind, 'door', `frame ${i}: the door first`);
      assert.ok(scene.objects[1]!.box[3] <= scene.objects[2]!.box[3], `frame ${i}: then far to near`);
      const drawn = renderSample(i, 40, W, H);
      const described = renderScene(scene, W, H, { plain: true });
      const { door } = geometryAt(i, 40, W, H);
      let differ = 0;
      for (let y = 0; y < H; y++) {
        for (let x = 0; x < W; x++) {
          const p = (y * W + x) * 3;
          if (drawn[p] === described[p] && drawn[p + 1] === described[p + 1] && drawn[p + 2] === described[p + 2]) continue;
          differ++;
          assert.ok(x >= door.x0 && x < door.x1 && y >= door.y0 && y < door.y1, `frame ${i}: pixel ${x},${y} differs outside the door`);
        }
      }
      assert.ok(differ <= 20, `frame ${i}: ${differ} pixels differ`);
    }
  });
});
