// What names a run: a replay's id is derived from its config, input bytes, model bytes, seeds,
// action schema and percept version, so the same replay gets the same id and anything else another;
// where it records is no part of it.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { replayRunId, runIdentity, sha256File } from '../../../app/run/identity.ts';
import { loadActionSchema } from '../../../nodes/action-schema.ts';
import { loadConfig, type PerceptConfig } from '../../../pipeline/config.ts';

const root = new URL('../../..', import.meta.url).pathname;
const dir = join(root, '.cache', 'test-run-identity');
const schema = loadActionSchema(join(root, 'configs/actions/robot-action.schema.json'));
const bag = join(dir, 'replay.mcap');
const model = join(dir, 'decoder.gguf');
const folder = join(dir, 'frames');
const UUID_V8 = /^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

/** Bytes that differ from `base` in one byte only (the same size): only their content tells them apart. */
const oneByteOff = (base: Buffer): Buffer => Buffer.from(base.map((b, i) => (i === base.length >> 1 ? b ^ 1 : b)));
const bagBytes = Buffer.from('bag bytes: the identity reads them, it does not parse them');
const modelBytes = Buffer.from('model bytes');

/** A lockstep replay of `bag` on the `model` decoder (files are hashed, never loaded). */
const replay = (overrides: Record<string, unknown> = {}): PerceptConfig =>
  loadConfig({
    clock: 'virtual',
    lockstep: true,
    source: { kind: 'bag', path: bag },
    decoder: { model },
    encoder: { kind: 'projection', seed: 1, tokens: 16 },
    ...overrides,
  });
const idOf = async (config: PerceptConfig): Promise<string> => replayRunId(await runIdentity(config, schema));

before(() => {
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(folder, { recursive: true });
  writeFileSync(bag, bagBytes);
  writeFileSync(model, modelBytes);
  writeFileSync(join(folder, 'a.jpg'), 'frame a');
  writeFileSync(join(folder, 'b.jpg'), 'frame b');
});
after(() => rmSync(dir, { recursive: true, force: true }));

describe('run identity', () => {
  test('the same replay gets the same id, a UUID (version 8), whether and wherever it records or serves metrics', async () => {
    const id = await idOf(replay());
    assert.match(id, UUID_V8);
    assert.equal(await idOf(replay()), id);
    assert.equal(await idOf(replay({ recorder: { enabled: true, path: join(dir, 'one.mcap') } })), id);
    assert.equal(await idOf(replay({ recorder: { enabled: true, path: join(dir, 'two.mcap'), chunkMs: 250 } })), id);
    assert.equal(await idOf(replay({ metrics: { endpoint: '9464' } })), id, 'serving metrics is no part of the replay');
  });

  test("another input, model, seed, config or percept version gets another id, also when only the files' bytes differ", async () => {
    const id = await idOf(replay());
    const ids = new Set([id]);
    const add = async (what: string, other: string | Promise<string>) => {
      const value = await other;
      assert.ok(!ids.has(value), `${what}: the id of a replay made otherwise`);
      ids.add(value);
    };
    await add('decoder seed', idOf(replay({ decoder: { model, seed: 7 } })));
    await add('encoder seed', idOf(replay({ encoder: { kind: 'projection', seed: 2, tokens: 16 } })));
    await add('budget', idOf(replay({ budgets: { endToEndMs: 9000 } })));
    const identity = await runIdentity(replay(), schema);
    await add('percept version', replayRunId({ ...identity, percept_version: '0.0.0-other' }));
    try {
      writeFileSync(bag, oneByteOff(bagBytes));
      await add('bag bytes', idOf(replay()));
    } finally {
      writeFileSync(bag, bagBytes);
    }
    try {
      writeFileSync(model, oneByteOff(modelBytes));
      await add('model bytes', idOf(replay()));
    } finally {
      writeFileSync(model, modelBytes);
    }
    assert.equal(await idOf(replay()), id, 'the files as they were: the id as it was');
  });

  test('a file is hashed once per path, size and modification time; one modified just before is read again', async () => {
    const file = join(dir, 'hashed.bin');
    const hour = Date.now() / 1000 - 3600;
    writeFileSync(file, 'first');
    utimesSync(file, hour, hour);
    const first = await sha256File(file);
    // Other bytes of the same size with the same times: the hash read before (it was not read again).
    writeFileSync(file, 'other');
    utimesSync(file, hour, hour);
    assert.equal(await sha256File(file), first);
    utimesSync(file, hour + 1, hour + 1);
    const other = await sha256File(file);
    assert.notEqual(other, first);
    // Written just now: the same size rewritten within the file time's tick is still told apart.
    writeFileSync(file, 'third');
    const third = await sha256File(file);
    writeFileSync(file, 'fifth');
    assert.notEqual(await sha256File(file), third);
  });

  test("a folder is named by its files' names and bytes; a pattern by its config", async () => {
    const frames = replay({ source: { kind: 'folder', path: folder, fps: 10 } });
    const id = await idOf(frames);
    assert.equal(JSON.parse((await runIdentity(frames, schema)).source).files, 2);
    writeFileSync(join(folder, 'b.jpg'), 'frame c');
    const changed = await idOf(frames);
    assert.notEqual(changed, id);
    writeFileSync(join(folder, 'c.jpg'), 'frame c');
    assert.notEqual(await idOf(frames), changed);
    const pattern = (frameCount: number) => idOf(replay({ source: { kind: 'pattern', fps: 10, frames: frameCount } }));
    assert.equal(await pattern(5), await pattern(5));
    assert.notEqual(await pattern(5), await pattern(6));
  });
});
