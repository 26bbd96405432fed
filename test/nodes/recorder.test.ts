import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createReadStream, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import { McapIndexedReader, McapStreamReader } from '@mcap/core';
import type { TypedMcapRecord } from '@mcap/core';
import { FileHandleReadable } from '@mcap/nodejs';
import { loadDecompressHandlers } from '@mcap/support';
import { CompressedImage, RawImage } from '@foxglove/schemas/jsonschema.js';
import { execFileSync } from 'node:child_process';
import { rmSync } from 'node:fs';
import { ACTIONS_TOPIC, EVENTS_TOPIC, FRAMES_TOPIC, STATS_TOPIC, checkRecordingPath, createRecorder } from '../../nodes/recorder.ts';
import { ChunkedMcapFile } from '../../nodes/mcap-write.ts';
import type { FileHandle } from 'node:fs/promises';
import { createBagSource } from '../../nodes/source-bag.ts';
import { loadActionSchema } from '../../nodes/action-schema.ts';
import { VirtualClock } from '../../pipeline/clock.ts';
import { isRejection } from '../../pipeline/types.ts';
import type { ActionMessage, CameraFrame } from '../../nodes/payloads.ts';

const root = new URL('../..', import.meta.url).pathname;
const cache = join(root, '.cache/test-recorder');
const schemaPath = join(root, 'configs/actions/robot-action.schema.json');
const schema = loadActionSchema(schemaPath);
mkdirSync(cache, { recursive: true });
const MS = 1_000_000n;
const T0 = 1_700_000_000_000_000_000n;

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
const jpeg = (i: number): CameraFrame => ({ encoding: 'jpeg', data: Buffer.from([0xff, 0xd8, 0xff, i & 0xff, 0xd9]) });

async function readIndexed(path: string) {
  const handle = await open(path, 'r');
  try {
    const reader = await McapIndexedReader.Initialize({
      readable: new FileHandleReadable(handle),
      decompressHandlers: await loadDecompressHandlers(),
    });
    const messages = [];
    for await (const m of reader.readMessages({ validateCrcs: true })) messages.push(m);
    const metadata = [];
    for await (const m of reader.readMetadata()) metadata.push(m);
    return { reader, messages, metadata };
  } finally {
    await handle.close();
  }
}

async function readStreaming(path: string): Promise<{ records: TypedMcapRecord[]; done: boolean }> {
  const reader = new McapStreamReader({ decompressHandlers: await loadDecompressHandlers(), validateCrcs: true, includeChunks: true });
  const records: TypedMcapRecord[] = [];
  for await (const chunk of createReadStream(path, { highWaterMark: 4096 })) {
    reader.append(chunk as Buffer);
    for (let r; (r = reader.nextRecord());) records.push(r);
  }
  return { records, done: reader.done() };
}

describe('recorder', () => {
  test('frames, actions, events, stats and metadata: both @mcap/core readers read back exact contents, times and CRCs', async () => {
    const path = join(cache, 'roundtrip.mcap');
    const rec = await createRecorder({ path, actionSchema: schema, chunkMs: 500 });
    const n = 30;
    const raw: CameraFrame = { encoding: 'mono8', data: Buffer.from([1, 2, 3, 4, 5, 6, 7, 8]), width: 4, height: 2, stride: 4 };
    await rec.writeMetadata('percept.run', { percept_version: '9.9.9', config: '{"clock":"virtual"}' });
    for (let i = 0; i < n; i++) {
      const sourceId = i % 5 === 0 ? 'cam/rear' : 'cam/front';
      const stampNs = T0 + BigInt(i) * 100n * MS;
      await rec.recordFrame(i === 7 ? raw : jpeg(i), { frameId: i, sourceId, stampNs }, stampNs + 1n);
      await rec.recordAction(action(i, sourceId), stampNs, stampNs + 50n * MS);
      await rec.recordEvent({ type: 'span', frameId: i, enterNs: 123456789012345678n + BigInt(i) }, stampNs + 2n, stampNs);
    }
    await rec.recordStats({ frames: { in: n } }, T0 + 3_000n * MS);
    assert.deepEqual(rec.counts, { frames: n, actions: n, events: n, stats: 1, framesNotRecorded: 0, chunks: rec.counts.chunks });
    await rec.close();
    await rec.close(); // idempotent

    const { reader, messages, metadata } = await readIndexed(path);
    assert.equal(reader.header.library, 'percept recorder');
    assert.equal(reader.statistics?.messageCount, BigInt(3 * n + 1));
    assert.ok(reader.chunkIndexes.length >= 6, `chunks of at most 500 ms over 3 s: ${reader.chunkIndexes.length}`);
    for (const chunk of reader.chunkIndexes) {
      assert.equal(chunk.compression, 'zstd');
      assert.ok(chunk.messageEndTime - chunk.messageStartTime < 600n * MS, 'a chunk spans at most chunkMs (+ one frame period)');
    }
    assert.deepEqual(
      metadata.map((m) => [m.name, Object.fromEntries(m.metadata)]),
      [['percept.run', { percept_version: '9.9.9', config: '{"clock":"virtual"}' }]],
    );

    const schemas = [...reader.schemasById.values()];
    const schemaNamed = (name: string) => schemas.find((s) => s.name === name)!;
    assert.deepEqual(Buffer.from(schemaNamed('percept/robot-action/v1').data), Buffer.from(schema.mcapSchema.data));
    assert.deepEqual(JSON.parse(new TextDecoder().decode(schemaNamed('foxglove.CompressedImage').data)), CompressedImage);
    assert.deepEqual(JSON.parse(new TextDecoder().decode(schemaNamed('foxglove.RawImage').data)), RawImage);
    const channels = [...reader.channelsById.values()];
    const topicOf = (id: number) => reader.channelsById.get(id)!.topic;
    const actionChannels = channels.filter((c) => c.topic === ACTIONS_TOPIC);
    assert.deepEqual(actionChannels.map((c) => c.metadata.get('source_id')).sort(), ['cam/front', 'cam/rear']);
    for (const c of actionChannels) {
      assert.equal(c.schemaId, schemaNamed('percept/robot-action/v1').id);
      assert.equal(c.metadata.get('schema_id'), schema.wireSchemaId);
      assert.equal(c.metadata.get('schema_sha256'), schema.sha256);
    }

    const decoder = new TextDecoder();
    const body = (m: { data: Uint8Array }) => JSON.parse(decoder.decode(m.data));
    const frames = messages.filter((m) => topicOf(m.channelId) === FRAMES_TOPIC);
    const gotActions = messages.filter((m) => topicOf(m.channelId) === ACTIONS_TOPIC);
    const events = messages.filter((m) => topicOf(m.channelId) === EVENTS_TOPIC);
    const stats = messages.filter((m) => topicOf(m.channelId) === STATS_TOPIC);
    assert.deepEqual([frames.length, gotActions.length, events.length, stats.length], [n, n, n, 1]);
    frames.forEach((m, i) => {
      const stampNs = T0 + BigInt(i) * 100n * MS;
      assert.deepEqual([m.sequence, m.logTime, m.publishTime], [i, stampNs + 1n, stampNs], 'sequence = frame id, publish time = stamp');
      const image = body(m);
      assert.deepEqual(image.timestamp, { sec: Number(stampNs / 1_000_000_000n), nsec: Number(stampNs % 1_000_000_000n) });
      if (i === 7) {
        assert.deepEqual(image, {
          timestamp: image.timestamp,
          frame_id: 'cam/front',
          width: 4,
          height: 2,
          encoding: 'mono8',
          step: 4,
          data: 'AQIDBAUGBwg=',
        });
      } else {
        assert.equal(image.format, 'jpeg');
        assert.deepEqual(Buffer.from(image.data, 'base64'), Buffer.from(jpeg(i).data));
      }
    });
    gotActions.forEach((m, i) => {
      const expected = action(i, i % 5 === 0 ? 'cam/rear' : 'cam/front');
      assert.deepEqual(body(m), expected.action);
      assert.ok(schema.validate(body(m)));
      assert.deepEqual([m.sequence, m.publishTime, m.logTime], [i, T0 + BigInt(i) * 100n * MS, T0 + BigInt(i) * 100n * MS + 50n * MS]);
      assert.equal(reader.channelsById.get(m.channelId)?.metadata.get('source_id'), expected.sourceId);
    });
    events.forEach((m, i) => {
      assert.deepEqual(body(m), { type: 'span', frameId: i, enterNs: String(123456789012345678n + BigInt(i)) });
      assert.equal(m.publishTime, T0 + BigInt(i) * 100n * MS);
    });

    const streamed = await readStreaming(path);
    assert.equal(streamed.done, true, 'stream reader reached a valid footer');
    assert.equal(streamed.records.filter((r) => r.type === 'Message').length, 3 * n + 1);
    // Every chunk carries its CRC, and DataEnd the CRC of the whole data section.
    const chunks = streamed.records.filter((r) => r.type === 'Chunk');
    assert.equal(chunks.length, reader.chunkIndexes.length);
    assert.ok(chunks.every((c) => c.type === 'Chunk' && c.uncompressedCrc !== 0));
    const dataEnd = streamed.records.find((r) => r.type === 'DataEnd');
    assert.ok(dataEnd?.type === 'DataEnd');
    assert.equal(dataEnd.dataSectionCrc, crc32(readFileSync(path).subarray(0, Number(reader.dataEndOffset))));
  });

  test('on a real clock an open chunk reaches the disk flushAfterMs after its first message, and the unclosed file replays', async () => {
    const path = join(cache, 'flushed.mcap');
    const rec = await createRecorder({ path, actionSchema: schema, chunkMs: 60_000, flushAfterMs: 30 });
    const headerBytes = statSync(path).size;
    for (let i = 0; i < 3; i++)
      await rec.recordFrame(jpeg(i), { frameId: i, sourceId: '/cam', stampNs: T0 + BigInt(i) * MS }, T0 + BigInt(i) * MS);
    assert.equal(statSync(path).size, headerBytes, 'nothing written yet: the chunk is open');
    // Relative to this machine: wait for the timer, however late it fires.
    while (rec.counts.chunks === 0) await new Promise((r) => setTimeout(r, 10));
    assert.ok(statSync(path).size > headerBytes);
    // A copy of the file as it is now (as a crash would leave it) replays through percept's own bag source.
    const crashed = join(cache, 'flushed-crashed.mcap');
    writeFileSync(crashed, readFileSync(path));
    const source = await createBagSource({ path: crashed });
    const items = [];
    for await (const item of source.frames(new VirtualClock(), new AbortController().signal)) items.push(item);
    await source.close();
    assert.equal(items.filter((it) => !isRejection(it)).length, 3);
    assert.equal(source.mode, 'streamed');
    await rec.close();
  });

  test('without the wall-time flush the file depends only on what was recorded: two recordings are byte-identical', async () => {
    const write = async (path: string, pauseMs: number) => {
      const rec = await createRecorder({ path, actionSchema: schema, chunkMs: 200, flushAfterMs: null });
      for (let i = 0; i < 20; i++) {
        await rec.recordFrame(jpeg(i), { frameId: i, sourceId: '/cam', stampNs: T0 + BigInt(i) * 50n * MS }, T0 + BigInt(i) * 50n * MS);
        await rec.recordAction(action(i), T0 + BigInt(i) * 50n * MS, T0 + BigInt(i) * 50n * MS + 7n);
        if (i === 10) await new Promise((r) => setTimeout(r, pauseMs));
      }
      await rec.close();
      return readFileSync(path);
    };
    const a = await write(join(cache, 'same-a.mcap'), 0);
    const b = await write(join(cache, 'same-b.mcap'), 120);
    assert.ok(a.equals(b));
    assert.ok((await readIndexed(join(cache, 'same-a.mcap'))).reader.chunkIndexes.length >= 4);
  });

  test('frames beyond maxPendingBytes are not recorded, and counted; actions always are', async () => {
    const path = join(cache, 'backlog.mcap');
    const rec = await createRecorder({ path, actionSchema: schema, maxPendingBytes: 12 });
    const pending: Promise<unknown>[] = [];
    for (let i = 0; i < 5; i++) {
      pending.push(rec.recordFrame(jpeg(i), { frameId: i, sourceId: '/cam', stampNs: BigInt(i) }, BigInt(i)));
      pending.push(rec.recordAction(action(i), BigInt(i), BigInt(i)));
    }
    const results = await Promise.all(pending);
    await rec.close();
    // 5-byte frames, 12 bytes allowed to wait: the first two wait, the others are refused.
    assert.deepEqual(
      results.filter((_, k) => k % 2 === 0),
      [true, true, false, false, false],
    );
    assert.equal(rec.counts.framesNotRecorded, 3);
    const { messages } = await readIndexed(path);
    assert.equal(messages.length, 2 + 5);
  });

  test('concurrent calls without await are serialised into a valid file', async () => {
    const path = join(cache, 'concurrent.mcap');
    const rec = await createRecorder({ path, actionSchema: schema, compression: 'none' });
    const pending: Promise<void>[] = [];
    for (let i = 0; i < 100; i++) {
      pending.push(rec.recordAction(action(i), BigInt(i) * 10n, BigInt(i) * 10n));
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

  test('an empty recording is a valid MCAP that declares the schemas', async () => {
    const path = join(cache, 'empty.mcap');
    const rec = await createRecorder({ path, actionSchema: schema });
    await rec.close();
    const { reader, messages } = await readIndexed(path);
    assert.equal(messages.length, 0);
    assert.ok([...reader.schemasById.values()].some((s) => s.name === 'percept/robot-action/v1'));
    const streamed = await readStreaming(path);
    assert.equal(streamed.done, true);
  });

  test('validates arguments and rejects calls after close', async () => {
    await assert.rejects(createRecorder({ path: '', actionSchema: schema }), /non-empty path/);
    const path = join(cache, 'x.mcap');
    // @ts-expect-error: wrong value on purpose
    await assert.rejects(createRecorder({ path, actionSchema: schema, compression: 'lz4' }), /compression 'zstd' or 'none'/);
    await assert.rejects(createRecorder({ path, actionSchema: schema, chunkMs: 0 }), /integer >= 1 for chunkMs/);
    await assert.rejects(
      createRecorder({ path: join(cache, 'no-such-dir/x.mcap'), actionSchema: schema }),
      /cannot create .*no-such-dir\/x\.mcap/,
    );
    await assert.rejects(
      createRecorder({ path: cache, actionSchema: schema }),
      /recorder: cannot create .*test-recorder: it is a directory, not a regular file/,
    );
    // @ts-expect-error: missing on purpose (there is no default schema: the run loads one and shares it)
    await assert.rejects(createRecorder({ path: join(cache, 'x.mcap') }), /actionSchema to be the result of loadActionSchema/);
    const rec = await createRecorder({ path: join(cache, 'closed.mcap'), actionSchema: schema });
    // @ts-expect-error: number instead of bigint on purpose
    await assert.rejects(rec.recordAction(action(0), 0n, 5), /bigint logTimeNs/);
    await assert.rejects(rec.recordEvent({}, -1n), /bigint logTimeNs >= 0/);
    await rec.close();
    await assert.rejects(rec.recordAction(action(0), 0n, 0n), /recordAction after close/);
  });

  test('a full filesystem (a 64 KiB tmpfs): the first failed write is reported once, with the bytes written and lost', async (t) => {
    const mnt = join(cache, 'tiny-fs');
    mkdirSync(mnt, { recursive: true });
    try {
      execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', mnt], { stdio: 'pipe' });
    } catch (err) {
      t.skip(`mount -t tmpfs is not permitted here (needs root or CAP_SYS_ADMIN): ${(err as Error).message.split('\n')[0]}`);
      return;
    }
    try {
      const failures: Error[] = [];
      const rec = await createRecorder({
        path: join(mnt, 'run.mcap'),
        actionSchema: schema,
        compression: 'none',
        chunkBytes: 4096,
        flushAfterMs: null,
        onFailure: (err) => failures.push(err),
      });
      // 8 KiB frames of noise, one chunk each: a few fill 64 KiB.
      const frame = (i: number): CameraFrame => ({ encoding: 'jpeg', data: Buffer.alloc(8192, i & 0xff) });
      let recorded = 0;
      let rejected = 0;
      for (let i = 0; i < 40; i++) {
        const meta = { frameId: i, sourceId: 'cam', stampNs: T0 + BigInt(i) * MS };
        await rec.recordFrame(frame(i), meta, T0 + BigInt(i) * MS).then(
          () => (recorded += 1),
          (err: Error) => {
            rejected += 1;
            assert.match(err.message, /ENOSPC/);
          },
        );
      }
      assert.equal(failures.length, 1, 'reported once, at the first failed write');
      assert.match(failures[0]!.message, /recorder .*run\.mcap: recordFrame\(frame \d+\) failed: ENOSPC/);
      assert.ok(recorded > 0 && rejected > 0, `recorded ${recorded}, rejected ${rejected}`);
      assert.equal(rec.failure, failures[0]);
      assert.ok(rec.bytesWritten > 0 && rec.bytesWritten <= 64 * 1024, `bytesWritten ${rec.bytesWritten}`);
      // Every frame after the failure is lost, and the failed write's bytes too.
      assert.ok(rec.bytesLost >= (rejected - 1) * 8192, `bytesLost ${rec.bytesLost} for ${rejected} rejected frames`);
      await assert.rejects(rec.close(), /ENOSPC/);
    } finally {
      execFileSync('umount', [mnt]);
    }
  });

  test('refuses kernel filesystems and files that are not regular, naming why, without creating anything', async () => {
    for (const [path, why] of [
      ['/proc/self/comm', /\/proc\/ is a kernel filesystem/],
      ['/proc/x.mcap', /\/proc\/ is a kernel filesystem/],
      ['/sys/kernel/x.mcap', /\/sys\/ is a kernel filesystem/],
      ['/dev/null', /\/dev\/ is a kernel filesystem/],
      [cache, /it is a directory, not a regular file/],
    ] as const) {
      await assert.rejects(createRecorder({ path, actionSchema: schema }), (err: Error) => {
        assert.match(err.message, new RegExp(`^recorder: cannot create ${path}: `));
        assert.match(err.message, why);
        return true;
      });
    }
    const fifo = join(cache, 'a-fifo');
    rmSync(fifo, { force: true });
    execFileSync('mkfifo', [fifo]);
    // Opening a FIFO for writing would wait for a reader for ever: refused before that.
    await assert.rejects(checkRecordingPath(fifo), /cannot create .*a-fifo: it is a FIFO, not a regular file/);
    rmSync(fifo);
  });

  test('a file that takes no bytes fails the write instead of spinning', async () => {
    const handle = { write: async () => ({ bytesWritten: 0, buffer: Buffer.alloc(0) }) } as unknown as FileHandle;
    const file = new ChunkedMcapFile(handle, { chunkMs: 1000n * MS, chunkBytes: 1024, compress: undefined });
    await assert.rejects(file.start({ profile: '', library: 'x' }), /the file took none of \d+ bytes \(write returned 0\)/);
    assert.equal(file.bytesWritten, 0);
    assert.ok(file.bytesUnwritten > 0);
  });
});
