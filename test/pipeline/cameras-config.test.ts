// Config with several cameras: each camera's budgets, edges and ladder are the top-level sections
// with its own fields on top, validated and defaulted by the same schema; what one graph per camera
// cannot do is refused with the path that says why; the one-source config is unchanged.
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { ConfigError, cameraGraphConfig, loadConfig } from '../../pipeline/config.ts';

const pattern = { kind: 'pattern', fps: 5, frames: 3 };
const issuesOf = (input: object): string[] => {
  try {
    loadConfig(input);
  } catch (err) {
    assert.ok(err instanceof ConfigError, String(err));
    return err.issues.map((i) => `${i.path}: ${i.message}`);
  }
  assert.fail('the config was accepted');
};

test('a camera takes the top-level budgets, edges and ladder with its own fields on top', () => {
  const config = loadConfig({
    budgets: { endToEndMs: 1800, stages: { decode: 1500 } },
    edges: { default: { policy: 'queue', capacity: 2 } },
    ladder: { rungs: [{ imageTokens: 140 }] },
    cameras: [
      { id: 'front', source: pattern },
      {
        id: 'rear',
        source: { kind: 'pattern', fps: 2 },
        budgets: { endToEndMs: 1600 },
        edges: { default: { policy: 'latest' }, decode: { policy: 'queue', capacity: 3 } },
        ladder: { enabled: false, rungs: [] },
      },
    ],
  });
  const [front, rear] = config.cameras!;
  assert.equal(front!.budgets.endToEndMs, 1800);
  assert.deepEqual(front!.budgets.stages, { decode: 1500 });
  assert.equal(front!.budgets.dropPredictedMiss, true, 'schema defaults fill what neither level gives');
  assert.deepEqual(front!.ladder.rungs, [{ imageTokens: 140 }]);
  assert.equal(rear!.budgets.endToEndMs, 1600);
  assert.deepEqual(rear!.budgets.stages, { decode: 1500 }, 'the stage budgets come from the top level');
  assert.deepEqual(
    rear!.edges,
    { default: { policy: 'latest' }, decode: { policy: 'queue', capacity: 3 } },
    'a policy replaces the one above whole',
  );
  assert.deepEqual(front!.edges, { default: { policy: 'queue', capacity: 2 } });
  assert.equal(rear!.ladder.enabled, false);
  assert.deepEqual(rear!.ladder.rungs, [], 'an array replaces the top-level one');
  assert.equal(rear!.ladder.initial.imageTokens, 280);
  assert.equal(rear!.source.kind === 'pattern' && rear!.source.frames, 20, 'the source is defaulted by the source schema');
  assert.deepEqual(config.batching, {
    encodeWaitMs: 2,
    decodeMaxActive: null,
    admit: 'together',
    groupWaitMs: 50,
    joinRunning: true,
    rollingJoin: 1,
    prefillChunk: 512,
    lanes: 1,
    stepRows: 0,
    kvUnified: true,
    mixSteps: false,
  });
  const graph = cameraGraphConfig(config, rear!);
  assert.equal(graph.budgets.endToEndMs, 1600);
  assert.equal(graph.clock, 'real');
});

test('the one-source config has no cameras and is unchanged', () => {
  const config = loadConfig({ source: pattern });
  assert.equal(config.cameras, undefined);
  assert.equal(config.source.kind, 'pattern');
});

test('camera source paths are relative to the config file', () => {
  const dir = mkdtempSync(join(tmpdir(), 'percept-cameras-'));
  const file = join(dir, 'rig.json');
  writeFileSync(file, JSON.stringify({ cameras: [{ id: 'a', source: { kind: 'folder', path: 'frames/a' } }] }));
  const source = loadConfig(file).cameras![0]!.source;
  assert.equal(source.kind === 'folder' && source.path, join(dir, 'frames/a'));
});

test('what cameras cannot have is refused, naming the path', () => {
  assert.deepEqual(issuesOf({ source: pattern, cameras: [{ id: 'a', source: pattern }] }), [
    '/source: give either source (one camera) or cameras, not both',
  ]);
  const issues = issuesOf({
    clock: 'virtual',
    decoder: { ngram: true },
    control: { enabled: true },
    batching: { decodeMaxActive: 3, lanes: 2, stepRows: 8, kvUnified: false, mixSteps: true, admit: 'rolling', joinRunning: false },
    cameras: [
      { id: 'a', source: pattern },
      { id: 'a', source: pattern, budgets: { endToEndMs: 100, stages: { decode: 150 } } },
    ],
  });
  for (const expected of [
    '/cameras/1/id: "a" names two cameras',
    '/cameras/1/budgets/stages/decode: must be at most /budgets/endToEndMs (100) but is 150',
    '/clock: must be "real" with cameras: the shared engines batch frames as they arrive in real time',
    '/decoder/ngram: cameras are decoded together in one batch, without drafts',
    '/control/enabled: is not supported with cameras yet (it serves one graph)',
    '/batching/decodeMaxActive: must be at most the number of cameras (2)',
    '/batching/lanes: must leave two cameras a lane at least: at most 1 with 2 cameras',
    '/batching/stepRows: pads steps in one KV buffer: needs kvUnified',
    '/batching/mixSteps: mixes steps in one KV buffer without padding: needs kvUnified and stepRows 0',
    '/batching/joinRunning: false is for admit "together" (a group without a tail), not "rolling"',
  ]) {
    assert.ok(issues.includes(expected), `missing: ${expected}\nin:\n${issues.join('\n')}`);
  }
  const two = [
    { id: 'a', source: pattern },
    { id: 'b', source: pattern },
  ];
  assert.equal(loadConfig({ batching: { joinRunning: false }, cameras: two }).batching.joinRunning, false, 'with admit together');
  assert.ok(
    issuesOf({ cameras: [{ id: 'a', source: { kind: 'bag' } }] }).some((i) => i.startsWith('/cameras/0/source')),
    'a camera source is checked by the source schema',
  );
  assert.ok(issuesOf({ cameras: [{ id: 'a b', source: pattern }] }).some((i) => i.startsWith('/cameras/0/id')));
  assert.ok(issuesOf({ cameras: [] }).some((i) => i.startsWith('/cameras')));
  assert.ok(
    issuesOf({ cameras: [{ id: 'a', source: pattern, ladder: { rungs: [{ imageTokens: 560 }] } }] }).some((i) =>
      i.startsWith('/cameras/0/ladder/rungs/0/imageTokens'),
    ),
    "a camera's ladder is checked like the top-level one",
  );
});
