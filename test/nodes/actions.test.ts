import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createActionsStage, parseAction } from '../../nodes/actions.ts';
import { formatAjvErrors, loadActionSchema } from '../../nodes/action-schema.ts';
import { VirtualClock } from '../../pipeline/clock.ts';
import type { Generation, StopReason } from '../../nodes/payloads.ts';
import { DropFrame } from '../../pipeline/types.ts';
import type { StageContext } from '../../pipeline/types.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';

const root = new URL('../..', import.meta.url).pathname;
const schemaPath = join(root, 'configs/actions/robot-action.schema.json');
const cache = join(root, '.cache/test-actions');

function generation(text: string, stopReason: StopReason = 'eos'): Generation {
  return {
    text,
    tokens: [],
    stopReason,
    promptTokens: 0,
    reusedTokens: 0,
    drafted: 0,
    accepted: 0,
    forced: 0,
    timings: { prefillMs: 0, prefillTokens: 0, ttftMs: 0, decodeMs: 0, decodeTokens: 0, sampleMs: 0 },
  };
}

function context(frameId = 7): StageContext {
  return standaloneContext({
    clock: new VirtualClock(),
    frame: { frameId, sourceId: 'cam/front', captureNs: 5n, captureWallMs: 1_700_000_000_123 },
    deadlineNs: 10n,
    knobs: { maxNewTokens: 64 },
  });
}

async function dropOf(promise: Promise<unknown>): Promise<DropFrame> {
  const err = await promise.then(
    () => assert.fail('expected the frame to be dropped'),
    (e: unknown) => e,
  );
  assert.ok(err instanceof DropFrame, `expected DropFrame, got ${String(err)}`);
  return err;
}

describe('loadActionSchema', () => {
  test('derives id, validator, wire id and MCAP schema from the file', () => {
    const s = loadActionSchema(schemaPath);
    const fileText = readFileSync(schemaPath, 'utf8');
    const fileJson = JSON.parse(fileText);
    assert.equal(s.id, fileJson.$id);
    assert.equal(s.wireSchemaId, fileJson.$id);
    assert.deepEqual(s.schema, fileJson);
    assert.equal(s.mcapSchema.encoding, 'jsonschema');
    assert.equal(s.mcapSchema.name, fileJson.$id);
    assert.equal(Buffer.from(s.mcapSchema.data).toString('utf8'), fileText);
    assert.match(s.sha256, /^[0-9a-f]{64}$/);
    assert.equal(s.validate({ action: 'move', confidence: 0.5, speed: 1 }), true);
    assert.equal(s.validate({ action: 'fly', confidence: 0.5 }), false);
  });

  test('follows an edited schema file (nothing is hard-coded)', () => {
    mkdirSync(cache, { recursive: true });
    const edited = JSON.parse(readFileSync(schemaPath, 'utf8'));
    edited.$id = 'percept/robot-action/v2';
    edited.properties.action.enum.push('fly');
    const p = join(cache, 'edited.schema.json');
    writeFileSync(p, JSON.stringify(edited));
    const s = loadActionSchema(p);
    assert.equal(s.wireSchemaId, 'percept/robot-action/v2');
    assert.equal(s.validate({ action: 'fly', confidence: 0.5 }), true);
  });

  test('rejects bad files with the path in the message', () => {
    mkdirSync(cache, { recursive: true });
    const cases: Array<[string, string, RegExp]> = [
      ['not-json.json', '{ nope', /not-json\.json is not valid JSON/],
      ['array.json', '[1,2]', /array\.json must contain a JSON object/],
      ['no-id.json', '{"type":"object"}', /no-id\.json has no "\$id"/],
      [
        'strict.json',
        '{"$id":"x","type":"object","properties":{"a":{"type":"string","minimum":1}},"unknownKeyword":1}',
        /strict\.json is not a valid strict JSON Schema/,
      ],
    ];
    for (const [name, text, re] of cases) {
      const p = join(cache, name);
      writeFileSync(p, text);
      assert.throws(() => loadActionSchema(p), re, name);
    }
    assert.throws(() => loadActionSchema(join(cache, 'missing.json')), /cannot read .*missing\.json/);
    assert.throws(() => loadActionSchema(''), /non-empty path/);
  });

  test('formatAjvErrors names the JSON pointer and the keyword', () => {
    const s = loadActionSchema(schemaPath);
    assert.equal(s.validate({ action: 'move', confidence: 0.5, speed: 3 }), false);
    assert.match(formatAjvErrors(s.validate.errors), /^\/speed must be <= 2 /);
    assert.equal(formatAjvErrors(null), 'no error details');
  });
});

describe('actions stage', () => {
  const stage = createActionsStage({ schema: loadActionSchema(schemaPath) });

  test('turns valid decoder text into an ActionMessage with the frame info', async () => {
    // Keys in schema order, as the decoder writes them: the target first.
    const action = {
      target: { label: 'door', bbox: [0.1, 0.2, 0.3, 0.4] },
      action: 'turn',
      confidence: 0.9,
      heading_deg: -45,
      hazards: ['edge'],
    };
    const msg = await stage.process(generation(JSON.stringify(action)), context(42));
    assert.deepEqual(msg, {
      schemaId: 'percept/robot-action/v1',
      frameId: 42,
      sourceId: 'cam/front',
      captureWallMs: 1_700_000_000_123,
      action,
    });
    // Validation ignores key order: the action first gives the same action.
    const { target, ...rest } = action;
    const actionFirst = await stage.process(generation(JSON.stringify({ ...rest, target })), context(42));
    assert.deepEqual(actionFirst.action, action);
  });

  test('accepts surrounding whitespace and one Markdown json fence', async () => {
    const a = await stage.process(generation('  {"action":"stop","confidence":1}\n'), context());
    assert.deepEqual(a.action, { action: 'stop', confidence: 1 });
    const b = await stage.process(generation('```json\n{"action":"wait","confidence":0.2}\n```'), context());
    assert.deepEqual(b.action, { action: 'wait', confidence: 0.2 });
  });

  test('drops schema violations as invalid, naming the ajv path and quoting the text', async () => {
    const cases: Array<[string, RegExp]> = [
      ['{"action":"move","confidence":0.5,"speed":9}', /\/speed must be <= 2/],
      ['{"action":"fly","confidence":0.5}', /\/action must be equal to one of the allowed values/],
      ['{"action":"move"}', /\(root\) must have required property 'confidence'/],
      ['{"action":"move","confidence":0.5,"extra":1}', /must NOT have additional properties .*"additionalProperty":"extra"/],
      ['{"action":"grasp","confidence":0.5,"target":{"label":"cup","bbox":[0,0,1]}}', /\/target\/bbox must NOT have fewer than 4 items/],
      ['{"action":"turn","confidence":0.5,"heading_deg":12.5}', /\/heading_deg must be integer/],
    ];
    for (const [text, re] of cases) {
      const drop = await dropOf(stage.process(generation(text), context()));
      assert.equal(drop.reason, 'invalid', text);
      assert.match(drop.message, re, text);
      assert.match(drop.message, /fails percept\/robot-action\/v1/);
      assert.ok(drop.message.includes(JSON.stringify(text)), `message quotes the text: ${drop.message}`);
    }
  });

  test('drops unparseable text as invalid and says when max_tokens cut it', async () => {
    const garbage = await dropOf(stage.process(generation('I think the robot should stop.'), context()));
    assert.equal(garbage.reason, 'invalid');
    assert.match(garbage.message, /not JSON: .*"I think the robot should stop\."/);
    const cut = await dropOf(stage.process(generation('{"action":"move","conf', 'max_tokens'), context()));
    assert.equal(cut.reason, 'invalid');
    assert.match(cut.message, /stopped at max_tokens/);
  });

  test('long texts are quoted only up to snippetChars', async () => {
    const small = createActionsStage({ schema: stage.schema, snippetChars: 10 });
    const drop = await dropOf(small.process(generation('x'.repeat(500)), context()));
    assert.match(drop.message, /"xxxxxxxxxx…\(500 chars\)"/);
  });

  test('an incomplete generation cut by deadline or cancel is dropped with that reason', async () => {
    const late = await dropOf(stage.process(generation('{"action":"mo', 'deadline'), context()));
    assert.equal(late.reason, 'stale');
    assert.match(late.message, /stopped by deadline before the JSON was complete/);
    const cancelled = await dropOf(stage.process(generation('{"act', 'cancelled'), context()));
    assert.equal(cancelled.reason, 'shutdown');
    assert.match(cancelled.message, /stopped by cancelled/);
  });

  test('a cancelled generation that is nonetheless a complete valid action is kept', async () => {
    const msg = await stage.process(generation('{"action":"stop","confidence":0.4}', 'cancelled'), context());
    assert.deepEqual(msg.action, { action: 'stop', confidence: 0.4 });
  });

  test('a cut generation whose JSON is complete but invalid is invalid, not stale', async () => {
    const drop = await dropOf(stage.process(generation('{"action":"stop"}', 'deadline'), context()));
    assert.equal(drop.reason, 'invalid');
  });

  test('parseAction is usable outside a graph', () => {
    assert.deepEqual(parseAction(generation('{"action":"release","confidence":0}'), stage.schema), { action: 'release', confidence: 0 });
    assert.throws(() => parseAction(generation('{}'), stage.schema), DropFrame);
  });

  test('validates its options', () => {
    assert.throws(() => createActionsStage({ schema: stage.schema, snippetChars: 2 }), /integer >= 8 for snippetChars/);
    // @ts-expect-error: wrong type on purpose
    assert.throws(() => createActionsStage({ schema: 42 }), /must be the result of loadActionSchema/);
  });
});
