import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createReadStream, mkdirSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import { McapIndexedReader, McapStreamReader } from '@mcap/core';
import type { TypedMcapRecord } from '@mcap/core';
import { FileHandleReadable } from '@mcap/nodejs';
import { loadDecompressHandlers } from '@mcap/support';
import { ACTIONS_TOPIC, EVENTS_TOPIC, createRecorder, createRecorderTap } from '../nodes/recorder.ts';
import { loadActionSchema } from '../nodes/action-schema.ts';
import { VirtualClock } from '../pipeline/clock.ts';
import type { ActionMessage } from '../nodes/payloads.ts';
import type { StageContext } from '../pipeline/types.ts';

const root = new URL('..', import.meta.url).pathname;
const cache = join(root, '.cache/test-recorder');
const schemaPath = join(root, 'configs/actions/robot-action.schema.json');
const schema = loadActionSchema(schemaPath);
mkdirSync(cache, { recursive: true });

const actions = ['stop', 'move', 'turn', 'grasp', 'release', 'wait'];
function action(i: number, sourceId = 'cam/front'): ActionMessage {
  return {
    schemaId: schema.wireSchemaId,
    frameId: i,
    sourceId,
    captureWallMs: 1_700_000_000_000 + i * 100,
    action: { action: actions[i % actions.length], confidence: (i % 10) / 10, hazards: i % 3 === 0 ? ['edge'] : [] },
  };
}

async function readIndexed(path: string) {
  const handle = await open(path, 'r');
  try {
    const reader = await McapIndexedReader.Initialize({
      readable: new FileHandleReadable(handle),
      decompressHandlers: await loadDecompressHandlers(),
    });
    const messages = [];
    for await (const m of reader.readMessages({ validateCrcs: true })) messages.push(m);
    return { reader, messages };
  } finally {
    await handle.close();
  }
}

async function readStreaming(path: string): Promise<{ records: TypedMcapRecord[]; done: boolean }> {
  const reader = new McapStreamReader({ decompressHandlers: await loadDecompressHandlers(), validateCrcs: true });
  const records: TypedMcapRecord[] = [];
  for await (const chunk of createReadStream(path, { highWaterMark: 4096 })) {
    reader.append(chunk as Buffer);
    for (let r; (r = reader.nextRecord());) records.push(r);
  }
  return { records, done: reader.done() };
}

describe('recorder', () => {
  test('writes actions and events; both @mcap/core readers read back exact counts and contents', async () => {
    const path = join(cache, 'roundtrip.mcap');
    // A small chunk size forces several zstd chunks.
    const rec = await createRecorder({ path, actionSchema: schema, chunkSize: 4096 });
    const n = 300;
    for (let i = 0; i < n; i++) {
      await rec.recordAction(action(i, i % 5 === 0 ? 'cam/rear' : 'cam/front'), 1_000_000n * BigInt(i));
      if (i % 10 === 0)
        await rec.recordEvent(
          { kind: 'span', stage: 'decode', frame: i, enterNs: 123456789012345678n + BigInt(i) },
          1_000_000n * BigInt(i) + 1n,
        );
    }
    assert.deepEqual(rec.counts, { actions: n, events: n / 10 });
    await rec.close();
    await rec.close(); // idempotent

    const { reader, messages } = await readIndexed(path);
    assert.equal(reader.header.library, 'percept recorder');
    assert.equal(reader.statistics?.messageCount, BigInt(n + n / 10));
    assert.ok(reader.chunkIndexes.length > 1, `expected several chunks, got ${reader.chunkIndexes.length}`);
    assert.ok(reader.chunkIndexes.every((c) => c.compression === 'zstd'));

    const [actionSchemaRecord] = [...reader.schemasById.values()];
    assert.equal(reader.schemasById.size, 1);
    assert.equal(actionSchemaRecord.name, 'percept/robot-action/v1');
    assert.equal(actionSchemaRecord.encoding, 'jsonschema');
    assert.deepEqual(Buffer.from(actionSchemaRecord.data), Buffer.from(schema.mcapSchema.data));

    const channels = [...reader.channelsById.values()];
    const actionChannels = channels.filter((c) => c.topic === ACTIONS_TOPIC);
    assert.deepEqual(actionChannels.map((c) => c.metadata.get('source_id')).sort(), ['cam/front', 'cam/rear']);
    for (const c of actionChannels) {
      assert.equal(c.schemaId, actionSchemaRecord.id);
      assert.equal(c.messageEncoding, 'json');
      assert.equal(c.metadata.get('schema_id'), schema.wireSchemaId);
      assert.equal(c.metadata.get('schema_sha256'), schema.sha256);
    }
    const eventsChannel = channels.find((c) => c.topic === EVENTS_TOPIC);
    assert.ok(eventsChannel);
    assert.equal(eventsChannel.schemaId, 0);

    const decoder = new TextDecoder();
    const gotActions = messages.filter((m) => m.channelId !== eventsChannel.id);
    const gotEvents = messages.filter((m) => m.channelId === eventsChannel.id);
    assert.equal(gotActions.length, n);
    assert.equal(gotEvents.length, n / 10);
    gotActions.forEach((m, i) => {
      const expected = action(i, i % 5 === 0 ? 'cam/rear' : 'cam/front');
      const body = JSON.parse(decoder.decode(m.data));
      assert.deepEqual(body, expected.action);
      assert.ok(schema.validate(body));
      assert.equal(m.sequence, i);
      assert.equal(m.logTime, 1_000_000n * BigInt(i));
      assert.equal(m.publishTime, BigInt(expected.captureWallMs) * 1_000_000n);
      assert.equal(reader.channelsById.get(m.channelId)?.metadata.get('source_id'), expected.sourceId);
    });
    gotEvents.forEach((m, k) => {
      const i = k * 10;
      assert.deepEqual(JSON.parse(decoder.decode(m.data)), {
        kind: 'span',
        stage: 'decode',
        frame: i,
        enterNs: String(123456789012345678n + BigInt(i)),
      });
      assert.equal(m.logTime, 1_000_000n * BigInt(i) + 1n);
    });

    const streamed = await readStreaming(path);
    assert.equal(streamed.done, true, 'stream reader reached a valid footer');
    const streamedMessages = streamed.records.filter((r) => r.type === 'Message');
    assert.equal(streamedMessages.length, n + n / 10);
    assert.equal(streamed.records.filter((r) => r.type === 'Schema').length >= 1, true);
    // Same bytes through both readers, in the same (log time) order.
    assert.deepEqual(
      streamedMessages.map((m) => (m.type === 'Message' ? decoder.decode(m.data) : '')),
      messages.map((m) => decoder.decode(m.data)),
    );
  });

  test('concurrent calls without await are serialised into a valid file', async () => {
    const path = join(cache, 'concurrent.mcap');
    const rec = await createRecorder({ path, actionSchema: schema, compression: 'none' });
    const pending: Promise<void>[] = [];
    for (let i = 0; i < 100; i++) {
      pending.push(rec.recordAction(action(i), BigInt(i) * 10n));
      pending.push(rec.recordEvent({ i }, BigInt(i) * 10n + 5n));
    }
    await Promise.all(pending);
    await rec.close();
    const { reader, messages } = await readIndexed(path);
    assert.equal(messages.length, 200);
    assert.ok(reader.chunkIndexes.every((c) => c.compression === ''));
    assert.deepEqual(
      messages.map((m) => m.logTime),
      Array.from({ length: 200 }, (_, k) => BigInt(Math.floor(k / 2)) * 10n + (k % 2 === 0 ? 0n : 5n)),
    );
  });

  test('an empty recording is a valid MCAP that declares the action schema', async () => {
    const path = join(cache, 'empty.mcap');
    const rec = await createRecorder({ path, actionSchema: schema });
    await rec.close();
    const { reader, messages } = await readIndexed(path);
    assert.equal(messages.length, 0);
    assert.equal([...reader.schemasById.values()][0]?.name, 'percept/robot-action/v1');
    const streamed = await readStreaming(path);
    assert.equal(streamed.done, true);
  });

  test('the tap stage records with the pipeline clock and passes the message through', async () => {
    const path = join(cache, 'tap.mcap');
    const rec = await createRecorder({ path, actionSchema: schema });
    const tap = createRecorderTap(rec);
    const clock = new VirtualClock(777n);
    const ctx = { clock } as unknown as StageContext;
    const msg = action(3);
    assert.equal(await tap.process(msg, ctx), msg);
    await rec.close();
    const { messages } = await readIndexed(path);
    assert.equal(messages.length, 1);
    assert.equal(messages[0].logTime, 777n);
  });

  test('validates arguments and rejects calls after close', async () => {
    await assert.rejects(createRecorder({ path: '', actionSchema: schema }), /non-empty path/);
    const path = join(cache, 'x.mcap');
    // @ts-expect-error: wrong value on purpose
    await assert.rejects(createRecorder({ path, actionSchema: schema, compression: 'lz4' }), /compression 'zstd' or 'none'/);
    await assert.rejects(
      createRecorder({ path: join(cache, 'no-such-dir/x.mcap'), actionSchema: schema }),
      /cannot create .*no-such-dir\/x\.mcap/,
    );
    // @ts-expect-error: missing on purpose (there is no default schema: the run loads one and shares it)
    await assert.rejects(createRecorder({ path: join(cache, 'x.mcap') }), /actionSchema to be the result of loadActionSchema/);
    const rec = await createRecorder({ path: join(cache, 'closed.mcap'), actionSchema: schema });
    // @ts-expect-error: number instead of bigint on purpose
    await assert.rejects(rec.recordAction(action(0), 5), /bigint logTimeNs/);
    await assert.rejects(rec.recordEvent({}, -1n), /bigint logTimeNs >= 0/);
    await rec.close();
    await assert.rejects(rec.recordAction(action(0), 0n), /recordAction after close/);
  });
});
