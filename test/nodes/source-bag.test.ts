import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createReadStream, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import { McapIndexedReader, McapStreamReader } from '@mcap/core';
import { FileHandleReadable } from '@mcap/nodejs';
import { loadDecompressHandlers } from '@mcap/support';
import { CompressedImage } from '@foxglove/schemas/jsonschema.js';
import sharp from 'sharp';
import { createBagSource, decoderFor } from '../../nodes/source-bag.ts';
import { encodePatternFrame } from '../../nodes/source-pattern.ts';
import { RealClock, VirtualClock } from '../../pipeline/clock.ts';
import type { CameraFrame } from '../../nodes/payloads.ts';
import { isRejection, type SourceIncident, type SourceRejection } from '../../pipeline/types.ts';
import { SAMPLE_START_NS, SAMPLE_TOPIC, makeSampleBag } from '../../tools/make-sample-bag.ts';
import {
  ROS_COMPRESSED_IMAGE,
  ROS_IMAGE,
  corruptChunk,
  json,
  readSummary,
  rosCompressedImage,
  rosImage,
  writeBag,
} from '../support/bag-fixtures.ts';
import { MS, decodeRgb, root, sampleBag, take, takeAll } from '../support/sources.ts';

const cache = join(root, '.cache/test-source-bag');

before(() => {
  rmSync(cache, { recursive: true, force: true });
  mkdirSync(cache, { recursive: true });
});

describe('sample bag', () => {
  test('make-sample-bag is deterministic and the committed bag is what it makes', async () => {
    const a = join(cache, 'sample-a.mcap');
    const b = join(cache, 'sample-b.mcap');
    await makeSampleBag(a);
    await makeSampleBag(b);
    const bytesA = readFileSync(a);
    assert.deepEqual(bytesA, readFileSync(b), 'two runs give the same bytes');
    const committed = readFileSync(sampleBag);
    assert.ok(committed.length < 3 * 1024 * 1024, `bags/sample.mcap is ${committed.length} bytes`);
    assert.ok(
      bytesA.equals(committed),
      'bags/sample.mcap is stale or was made by another encoder: run node --import tsx tools/make-sample-bag.ts',
    );
  });

  test('@mcap/core indexed and streaming readers agree on the committed bag', async () => {
    const decompressHandlers = await loadDecompressHandlers();
    const handle = await open(sampleBag, 'r');
    const indexed = [];
    let reader: McapIndexedReader;
    try {
      reader = await McapIndexedReader.Initialize({ readable: new FileHandleReadable(handle), decompressHandlers });
      for await (const m of reader.readMessages({ validateCrcs: true })) indexed.push(m);
    } finally {
      await handle.close();
    }
    const channels = [...reader.channelsById.values()];
    assert.equal(channels.length, 1);
    assert.equal(channels[0].topic, SAMPLE_TOPIC);
    assert.equal(channels[0].messageEncoding, 'json');
    const schema = reader.schemasById.get(channels[0].schemaId);
    assert.equal(schema?.name, 'foxglove.CompressedImage');
    assert.equal(schema?.encoding, 'jsonschema');
    assert.deepEqual(JSON.parse(new TextDecoder().decode(schema?.data)), CompressedImage);
    assert.ok(reader.chunkIndexes.length >= 1 && reader.chunkIndexes.every((c) => c.compression === 'zstd'));
    assert.ok(indexed.length >= 30 && indexed.length <= 60, `${indexed.length} frames`);
    indexed.forEach((m, i) => {
      assert.equal(m.logTime, SAMPLE_START_NS + BigInt(i) * 100n * MS);
      assert.equal(m.sequence, i);
      const body = JSON.parse(new TextDecoder().decode(m.data));
      assert.deepEqual(Object.keys(body), ['timestamp', 'frame_id', 'data', 'format']);
      assert.equal(body.format, 'jpeg');
      assert.equal(BigInt(body.timestamp.sec) * 1_000_000_000n + BigInt(body.timestamp.nsec), m.logTime);
    });

    const stream = new McapStreamReader({ decompressHandlers, validateCrcs: true });
    const streamed: Uint8Array[] = [];
    for await (const chunk of createReadStream(sampleBag, { highWaterMark: 8192 })) {
      stream.append(chunk as Buffer);
      for (let r; (r = stream.nextRecord());) if (r.type === 'Message') streamed.push(r.data);
    }
    assert.equal(stream.done(), true);
    assert.deepEqual(
      streamed.map((d) => Buffer.from(d).toString()),
      indexed.map((m) => Buffer.from(m.data).toString()),
    );
  });
});

describe('bag source', () => {
  test('replays the sample bag on a VirtualClock at recorded timing, each frame stamped with its log time', async () => {
    const source = await createBagSource({ path: sampleBag });
    assert.equal(source.topic, SAMPLE_TOPIC);
    assert.equal(source.id, SAMPLE_TOPIC);
    assert.equal(source.mode, 'indexed');
    assert.equal(source.startNs, SAMPLE_START_NS);
    const clock = new VirtualClock(5n);
    const items = await take(source, clock, 1000);
    await source.close();
    assert.equal(items.length, source.messageCount);
    items.forEach((it, i) => {
      assert.equal(it.captureNs, 5n + BigInt(i) * 100n * MS);
      assert.equal(it.stampNs, SAMPLE_START_NS + BigInt(i) * 100n * MS);
    });
    assert.equal(clock.nowNs(), items.at(-1)?.captureNs);
    const first = await decodeRgb(items[0].payload);
    assert.deepEqual([first.width, first.height], [640, 360]);
    assert.deepEqual(source.counters, { read: items.length, yielded: items.length, rejected: 0 });
    assert.match(source.description, /bag .*sample\.mcap, topic \/camera\/front\/compressed \(foxglove\.CompressedImage, json\), indexed/);
    assert.deepEqual(items[1]!.sourceStamp, { sec: Number(SAMPLE_START_NS / 1_000_000_000n), nanosec: 100_000_000 }, 'the log time');
  });

  test('rate scales the timing and loop continues it past the end', async () => {
    const source = await createBagSource({ path: sampleBag, rate: 2, loop: true });
    const n = source.messageCount;
    const items = await take(source, new VirtualClock(), n * 2 + 5);
    await source.close();
    assert.equal(items.length, n * 2 + 5);
    // 10 Hz at rate 2 = 50 ms apart, and the second pass starts one frame interval after the last.
    items.forEach((it, i) => assert.equal(it.captureNs, BigInt(i) * 50n * MS, `item ${i}`));
    assert.deepEqual(items[n].payload.data, items[0].payload.data);
  });

  test('on a RealClock it paces by log time / rate (never early); pace fast does not wait', async () => {
    const source = await createBagSource({ path: sampleBag, rate: 20 });
    const clock = new RealClock();
    const before = clock.nowNs();
    const items = await take(source, clock, 4);
    await source.close();
    items.forEach((it, i) => assert.ok(it.captureNs >= before + BigInt(i) * 5n * MS, `item ${i} early`));
    // fast: on a virtual clock nothing advances it, so every frame is captured at the start.
    const fast = await createBagSource({ path: sampleBag, pace: 'fast' });
    const all = await take(fast, new VirtualClock(7n), 1000);
    await fast.close();
    assert.equal(all.length, fast.messageCount);
    assert.ok(all.every((it) => it.captureNs === 7n));
  });

  test("ROS 2 CompressedImage and Image (rgb8, bgr8, mono8, mono16 both byte orders) decode with the bag's own schemas", async () => {
    const path = join(cache, 'ros2.mcap');
    const jpeg = await encodePatternFrame(3, 64, 64);
    const png = await sharp(Buffer.alloc(8 * 4 * 3, 200), { raw: { width: 8, height: 4, channels: 3 } })
      .png()
      .toBuffer();
    const rgb = Buffer.from(Array.from({ length: 2 * 16 }, (_, k) => k)); // 4×2 rgb8, step 16 (4 bytes of padding)
    const mono8 = Buffer.from([1, 2, 3, 4, 5, 6, 7, 8]);
    const mono16le = Buffer.from([0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08]); // 2×2
    const mono16be = Buffer.from(mono16le).swap16();
    const images: [string, Parameters<typeof rosImage>[1]][] = [
      ['rgb8', { width: 4, height: 2, encoding: 'rgb8', step: 16, data: rgb }],
      ['bgr8', { width: 4, height: 2, encoding: 'bgr8', step: 16, data: rgb }],
      ['mono8', { width: 4, height: 2, encoding: 'mono8', step: 4, data: mono8 }],
      ['mono16', { width: 2, height: 2, encoding: 'mono16', step: 4, data: mono16le }],
      ['mono16be', { width: 2, height: 2, encoding: 'mono16', step: 4, data: mono16be, bigEndian: true }],
    ];
    await writeBag(path, async (w) => {
      const compressed = await w.registerSchema({
        name: 'sensor_msgs/msg/CompressedImage',
        encoding: 'ros2msg',
        data: new TextEncoder().encode(ROS_COMPRESSED_IMAGE),
      });
      const image = await w.registerSchema({
        name: 'sensor_msgs/msg/Image',
        encoding: 'ros2msg',
        data: new TextEncoder().encode(ROS_IMAGE),
      });
      const c1 = await w.registerChannel({ topic: '/cam/compressed', schemaId: compressed, messageEncoding: 'cdr', metadata: new Map() });
      const c2 = await w.registerChannel({ topic: '/cam/raw', schemaId: image, messageEncoding: 'cdr', metadata: new Map() });
      await w.addMessage({ channelId: c1, sequence: 0, logTime: 10n, publishTime: 10n, data: rosCompressedImage(10n, 'jpeg', jpeg) });
      await w.addMessage({ channelId: c1, sequence: 1, logTime: 20n, publishTime: 20n, data: rosCompressedImage(20n, 'png', png) });
      for (const [k, [, fields]] of images.entries()) {
        const t = BigInt(100 + k);
        await w.addMessage({ channelId: c2, sequence: k, logTime: t, publishTime: t, data: rosImage(t, fields) });
      }
    });
    await assert.rejects(createBagSource({ path }), /has several \(\/cam\/compressed, \/cam\/raw\): pass topic/);

    const byType = await createBagSource({ path, type: 'sensor_msgs/msg/CompressedImage' });
    assert.equal(byType.topic, '/cam/compressed');
    const compressedItems = await take(byType, new VirtualClock(), 10);
    await byType.close();
    assert.deepEqual(
      compressedItems.map((it) => it.payload.encoding),
      ['jpeg', 'png'],
    );
    assert.deepEqual(Buffer.from(compressedItems[0].payload.data), jpeg);
    assert.deepEqual(Buffer.from(compressedItems[1].payload.data), png);
    assert.equal(compressedItems[1].captureNs - compressedItems[0].captureNs, 10n);

    const raw = await createBagSource({ path, topic: '/cam/raw' });
    const rawItems = await take(raw, new VirtualClock(), 10);
    await raw.close();
    assert.deepEqual(
      rawItems.map((it) => ({ ...it.payload, data: Buffer.from(it.payload.data) })),
      [
        { encoding: 'rgb8', width: 4, height: 2, stride: 16, data: rgb },
        { encoding: 'bgr8', width: 4, height: 2, stride: 16, data: rgb },
        { encoding: 'mono8', width: 4, height: 2, stride: 4, data: mono8 },
        { encoding: 'mono16', width: 2, height: 2, stride: 4, data: mono16le },
        { encoding: 'mono16', width: 2, height: 2, stride: 4, data: mono16le }, // big endian, swapped
      ],
    );
    await assert.rejects(createBagSource({ path, type: 'foxglove.RawImage' }), /has no topic of type foxglove\.RawImage \(channels: /);
  });

  test("a frame's source stamp is its header's capture stamp, not the log time; an unset stamp falls back to the log time", async () => {
    const path = join(cache, 'header-stamps.mcap');
    const jpeg = await encodePatternFrame(1, 32, 32);
    const captured = 1_700_000_000_123_456_789n;
    await writeBag(path, async (w) => {
      const schema = await w.registerSchema({
        name: 'sensor_msgs/msg/CompressedImage',
        encoding: 'ros2msg',
        data: new TextEncoder().encode(ROS_COMPRESSED_IMAGE),
      });
      const channel = await w.registerChannel({ topic: '/cam', schemaId: schema, messageEncoding: 'cdr', metadata: new Map() });
      // Logged 40 ms after capture, as a recorder on a busy robot would.
      await w.addMessage({
        channelId: channel,
        sequence: 0,
        logTime: captured + 40n * MS,
        publishTime: 0n,
        data: rosCompressedImage(captured, 'jpeg', jpeg),
      });
      await w.addMessage({
        channelId: channel,
        sequence: 1,
        logTime: captured + 90n * MS,
        publishTime: 0n,
        data: rosCompressedImage(0n, 'jpeg', jpeg),
      });
    });
    const source = await createBagSource({ path });
    const items = await take(source, new VirtualClock(), 10);
    await source.close();
    assert.deepEqual(
      items.map((it) => [it.sourceStamp, it.stampNs]),
      [
        [{ sec: 1_700_000_000, nanosec: 123_456_789 }, captured + 40n * MS],
        [{ sec: 1_700_000_000, nanosec: 213_456_789 }, captured + 90n * MS],
      ],
    );
  });

  test('CDR bytes laid out by hand from the spec decode as sensor_msgs/msg/CompressedImage', () => {
    // stamp {sec 1, nanosec 2}, frame_id "cam", format "jpeg", data [ff d8 ff d9]; little endian,
    // alignment relative to the end of the 4-byte encapsulation header.
    const hex =
      '00010000' + '01000000' + '02000000' + '04000000' + '63616d00' + '05000000' + '6a70656700' + '000000' + '04000000' + 'ffd8ffd9';
    const decode = decoderFor(
      { name: 'sensor_msgs/msg/CompressedImage', encoding: 'ros2msg', data: new TextEncoder().encode(ROS_COMPRESSED_IMAGE) },
      'cdr',
    );
    assert.equal(typeof decode, 'function');
    type Decode = (d: Uint8Array) => { frame: CameraFrame; stamp: unknown };
    const { frame, stamp } = (decode as Decode)(Buffer.from(hex, 'hex'));
    assert.deepEqual({ ...frame, data: Buffer.from(frame.data).toString('hex') }, { encoding: 'jpeg', data: 'ffd8ffd9' });
    assert.deepEqual(stamp, { sec: 1, nanosec: 2 }, "the header's stamp");
    assert.throws(() => (decode as Decode)(Buffer.from(hex, 'hex').subarray(0, 27)), /corrupt CDR payload: 27 bytes/);
  });

  test('a raw image whose data is not step × height, or in an unsupported encoding, is rejected with the reason', async () => {
    const path = join(cache, 'raw-sizes.mcap');
    const ok = { width: 4, height: 2, encoding: 'mono8', step: 4, data: Buffer.alloc(8, 9) };
    const cases = [
      ok,
      { ...ok, data: Buffer.alloc(9) }, // one byte too many
      { ...ok, data: Buffer.alloc(7) }, // one too few
      { ...ok, encoding: 'bayer_rggb8' },
      { ...ok, encoding: '32FC1', step: 16, data: Buffer.alloc(32) },
      { ...ok, step: 3 },
      ok,
    ];
    await writeBag(path, async (w) => {
      const s = await w.registerSchema({ name: 'sensor_msgs/msg/Image', encoding: 'ros2msg', data: new TextEncoder().encode(ROS_IMAGE) });
      const c = await w.registerChannel({ topic: '/cam', schemaId: s, messageEncoding: 'cdr', metadata: new Map() });
      for (const [k, fields] of cases.entries()) {
        await w.addMessage({ channelId: c, sequence: k, logTime: BigInt(k) * MS, publishTime: 0n, data: rosImage(BigInt(k) * MS, fields) });
      }
    });
    const source = await createBagSource({ path });
    const items = await takeAll(source, new VirtualClock(), 100);
    await source.close();
    assert.equal(items.length, cases.length, 'every message is a frame or a rejection');
    assert.deepEqual(
      items.map((it) => (isRejection(it) ? it.rejected : it.payload.encoding)),
      [
        'mono8',
        'data size is not step × height',
        'data size is not step × height',
        'unsupported pixel encoding',
        'unsupported pixel encoding',
        'step too small',
        'mono8',
      ],
    );
    const details = items.filter(isRejection).map((r) => r.detail);
    assert.match(details[0]!, /\/cam sequence 1 \(log time 1000000\): data size is not step × height: 9 bytes, expected 4 × 2 = 8/);
    assert.match(details[1]!, /7 bytes, expected 4 × 2 = 8/);
    assert.match(details[2]!, /"bayer_rggb8" \(supported: rgb8, bgr8, rgba8, bgra8, mono8, mono16\)/);
    items.forEach((it, k) => assert.equal(it.stampNs, BigInt(k) * MS, 'rejections keep their timing and stamp'));
    assert.deepEqual(source.counters, { read: 7, yielded: 2, rejected: 5 });
  });

  test('bad messages become rejections with their cause; channels percept cannot decode are skipped with a warning', async () => {
    const path = join(cache, 'bad.mcap');
    const jpeg = await encodePatternFrame(1, 64, 64);
    const good = (sec: number) => json({ timestamp: { sec, nsec: 0 }, frame_id: 'f', data: jpeg.toString('base64'), format: 'jpeg' });
    await writeBag(path, async (w) => {
      const s = await w.registerSchema({ name: 'foxglove.CompressedImage', encoding: 'jsonschema', data: json(CompressedImage) });
      const unknown = await w.registerSchema({ name: 'acme.Thermal', encoding: 'jsonschema', data: json({}) });
      const c = await w.registerChannel({ topic: '/cam', schemaId: s, messageEncoding: 'json', metadata: new Map() });
      const odd = await w.registerChannel({ topic: '/cam', schemaId: unknown, messageEncoding: 'json', metadata: new Map() });
      const proto = await w.registerChannel({ topic: '/cam', schemaId: s, messageEncoding: 'protobuf', metadata: new Map() });
      const add = (channelId: number, sequence: number, data: Uint8Array) =>
        w.addMessage({ channelId, sequence, logTime: BigInt(sequence) * 100n * MS, publishTime: 0n, data });
      await add(c, 0, good(0));
      await add(c, 1, new TextEncoder().encode('{"timestamp":')); // truncated JSON
      await add(c, 2, json({ timestamp: { sec: 2, nsec: 0 }, frame_id: 'f', data: 'not base64!', format: 'jpeg' }));
      await add(
        c,
        3,
        json({ timestamp: { sec: 3, nsec: 0 }, frame_id: 'f', data: Buffer.from('GIF89a....').toString('base64'), format: 'jpeg' }),
      );
      await add(odd, 4, json({ pixels: [] }));
      await add(proto, 5, new Uint8Array([1, 2, 3]));
      await add(proto, 6, new Uint8Array([1, 2, 3]));
      await add(c, 7, json({ timestamp: { sec: 5, nsec: 0 }, frame_id: 'f', data: jpeg.toString('base64'), format: 'png' }));
      await add(c, 8, good(6));
    });
    const incidents: SourceIncident[] = [];
    const source = await createBagSource({ path, topic: '/cam' });
    const items = await takeAll(source, new VirtualClock(), 100, new AbortController(), incidents);
    await source.close();
    assert.deepEqual(
      items.map((it) => (isRejection(it) ? it.rejected : 'frame')),
      ['frame', 'payload is not JSON', 'bad field', 'not a JPEG or PNG image', 'format does not match the data', 'frame'],
    );
    assert.deepEqual(
      items.map((it) => it.captureNs),
      [0n, 1n, 2n, 3n, 7n, 8n].map((k) => k * 100n * MS),
      'every message keeps its recorded timing',
    );
    assert.match((items[3] as SourceRejection).detail!, /starts 47494638/);
    assert.deepEqual(source.counters, { read: 6, yielded: 2, rejected: 4 });
    assert.deepEqual(
      incidents.map((i) => i.kind),
      ['skipped', 'skipped'],
    );
    assert.match(incidents[0]!.detail, /channel 1 of \/cam skipped \(1 messages\): acme\.Thermal is not an image type percept reads/);
    assert.match(
      incidents[1]!.detail,
      /channel 2 of \/cam skipped \(2 messages\): foxglove\.CompressedImage in message encoding protobuf is not supported \(json is\)/,
    );
  });

  /** 60 frames of 64×64 JPEG on /cam at 10 Hz, about 20 to a zstd chunk. */
  async function sixtyFrameBag(): Promise<string> {
    const path = join(cache, 'sixty.mcap');
    const jpeg = await encodePatternFrame(0, 64, 64);
    await writeBag(
      path,
      async (w) => {
        const s = await w.registerSchema({ name: 'foxglove.CompressedImage', encoding: 'jsonschema', data: json(CompressedImage) });
        const c = await w.registerChannel({ topic: '/cam', schemaId: s, messageEncoding: 'json', metadata: new Map() });
        for (let i = 0; i < 60; i++) {
          const data = json({ timestamp: { sec: i, nsec: 0 }, frame_id: 'f', data: jpeg.toString('base64'), format: 'jpeg' });
          await w.addMessage({ channelId: c, sequence: i, logTime: BigInt(i) * 100n * MS, publishTime: 0n, data });
        }
      },
      { chunkSize: Math.floor((20 * jpeg.length * 4) / 3), zstd: true },
    );
    const summary = await readSummary(path);
    assert.ok(summary.chunkIndexes.length >= 3, `${summary.chunkIndexes.length} chunks`);
    return path;
  }

  test('a chunk that fails its CRC is skipped with a warning; each message it held is a rejected frame and the rest replays', async () => {
    // The middle chunk is damaged. (This used to stop the replay after the first chunk, exit 0, without a word.)
    const corrupt = join(cache, 'sixty-corrupt.mcap');
    const damaged = await corruptChunk(await sixtyFrameBag(), corrupt, 1);
    assert.ok(damaged.logTimes.length > 0);
    const incidents: SourceIncident[] = [];
    const source = await createBagSource({ path: corrupt });
    const items = await takeAll(source, new VirtualClock(), 1000, new AbortController(), incidents);
    await source.close();
    assert.equal(items.length, 60, 'every message of the bag is accounted for');
    const rejected = items.filter(isRejection);
    assert.deepEqual(
      rejected.map((r) => r.stampNs),
      damaged.logTimes,
      'the damaged chunk’s messages, by log time',
    );
    assert.ok(
      rejected.every((r) => r.rejected === 'chunk failed its CRC check' || r.rejected === 'chunk unreadable'),
      rejected[0]?.rejected,
    );
    assert.deepEqual(
      items.map((it) => it.captureNs),
      Array.from({ length: 60 }, (_, i) => BigInt(i) * 100n * MS),
      'in order, at their recorded times',
    );
    assert.deepEqual(
      incidents.map((i) => i.kind),
      ['damaged'],
    );
    assert.match(
      incidents[0]!.detail,
      new RegExp(
        `the chunk at byte ${damaged.offset} \\(\\d+ bytes\\) was skipped: .*; ${damaged.logTimes.length} messages of /cam rejected`,
      ),
    );
    assert.deepEqual(source.counters, { read: 60, yielded: 60 - damaged.logTimes.length, rejected: damaged.logTimes.length });
  });

  test('a truncated bag is replayed by streaming up to where it is valid, saying where it ends', async () => {
    // (It used to fail at open, exit 1, although most of its frames are readable.)
    const path = await sixtyFrameBag();
    const truncated = join(cache, 'truncated.mcap');
    const summary = await readSummary(path);
    // Cut inside the last chunk: the summary, the footer and that chunk are gone.
    const last = summary.chunkIndexes.at(-1)!;
    const cut = Number(last.chunkStartOffset + last.chunkLength / 2n);
    writeFileSync(truncated, readFileSync(path).subarray(0, cut));
    const incidents: SourceIncident[] = [];
    const source = await createBagSource({ path: truncated });
    assert.equal(source.mode, 'streamed');
    const items = await take(source, new VirtualClock(), 1000, new AbortController(), incidents);
    await source.close();
    const before = summary.chunkIndexes.slice(0, -1);
    const expected = before.reduce((n, c) => n + Number(c.messageEndTime - c.messageStartTime) / 1e8 + 1, 0);
    assert.equal(items.length, expected, 'every message before the cut chunk');
    assert.ok(expected >= 40);
    assert.equal(source.messageCount, items.length, 'the scan counted what the replay then read');
    assert.deepEqual(
      incidents.map((i) => i.kind),
      ['damaged', 'damaged'],
    );
    assert.match(incidents[0]!.detail, /truncated\.mcap: no readable summary \(.*\); read by streaming up to where the file is valid/);
    assert.match(
      incidents[1]!.detail,
      new RegExp(`valid up to byte ${Number(last.chunkStartOffset)} of ${cut}: the file ends inside a record \\(opcode 6, `),
    );
    assert.deepEqual(source.counters, { read: items.length, yielded: items.length, rejected: 0 });
    assert.match(source.description, /streamed \(no summary\)/);
  });

  test('a file cut between records (a recorder that never closed) replays every whole chunk', async () => {
    const unfinished = join(cache, 'unfinished.mcap');
    const summary = await readSummary(sampleBag);
    const lastChunk = summary.chunkIndexes.at(-1)!;
    // Up to the end of the last chunk's message indexes: the data is all there, DataEnd and summary are not.
    writeFileSync(
      unfinished,
      readFileSync(sampleBag).subarray(0, Number(lastChunk.chunkStartOffset + lastChunk.chunkLength + lastChunk.messageIndexLength)),
    );
    const incidents: SourceIncident[] = [];
    const source = await createBagSource({ path: unfinished });
    const items = await take(source, new VirtualClock(), 1000, new AbortController(), incidents);
    await source.close();
    assert.equal(items.length, Number(summary.statistics!.messageCount));
    assert.match(incidents[1]!.detail, /the file ends without a footer \(not closed: a crashed recording\?\)/);
  });

  test('fatal file errors name the path', async () => {
    await assert.rejects(createBagSource({ path: join(cache, 'missing.mcap') }), /cannot open .*missing\.mcap/);
    const notMcap = join(cache, 'not.mcap');
    writeFileSync(notMcap, 'hello, not an mcap file at all');
    await assert.rejects(
      createBagSource({ path: notMcap }),
      /not\.mcap is not an MCAP file \(it does not start with the MCAP magic; 30 bytes\)/,
    );
    await assert.rejects(
      createBagSource({ path: sampleBag, topic: '/nope' }),
      /sample\.mcap has no topic \/nope \(topics: \/camera\/front\/compressed\)/,
    );
    const empty = join(cache, 'empty.mcap');
    await writeBag(empty, async () => undefined);
    await assert.rejects(createBagSource({ path: empty }), /empty\.mcap holds no messages \(an empty bag; channels: none\)/);
    const cutEmpty = join(cache, 'cut-empty.mcap');
    writeFileSync(cutEmpty, readFileSync(empty).subarray(0, 20));
    await assert.rejects(createBagSource({ path: cutEmpty }), /cut-empty\.mcap holds no messages/);
    const noImages = join(cache, 'no-images.mcap');
    await writeBag(noImages, async (w) => {
      const c = await w.registerChannel({ topic: '/actions', schemaId: 0, messageEncoding: 'json', metadata: new Map() });
      await w.addMessage({ channelId: c, sequence: 0, logTime: 1n, publishTime: 1n, data: json({}) });
    });
    await assert.rejects(
      createBagSource({ path: noImages }),
      /no-images\.mcap has no image topic percept can decode \(channels: \/actions: \(no schema\), json\)/,
    );
    await assert.rejects(
      createBagSource({ path: noImages, topic: '/actions' }),
      /topic \/actions has no channel percept can decode: \(no schema\) is not an image type/,
    );
  });

  test('decoderFor knows exactly the documented schemas and says why it refuses the others', () => {
    const foxglove = (name: string) => ({ name, encoding: 'jsonschema', data: new Uint8Array() });
    const ros = (name: string, text: string, encoding = 'ros2msg') => ({ name, encoding, data: new TextEncoder().encode(text) });
    assert.equal(typeof decoderFor(foxglove('foxglove.CompressedImage'), 'json'), 'function');
    assert.equal(typeof decoderFor(foxglove('foxglove.RawImage'), 'json'), 'function');
    assert.equal(typeof decoderFor(ros('sensor_msgs/msg/CompressedImage', ROS_COMPRESSED_IMAGE), 'cdr'), 'function');
    assert.equal(typeof decoderFor(ros('sensor_msgs/msg/Image', ROS_IMAGE), 'cdr'), 'function');
    assert.match(decoderFor(foxglove('foxglove.CompressedImage'), 'protobuf') as string, /message encoding protobuf is not supported/);
    assert.match(decoderFor(ros('sensor_msgs/msg/Image', ROS_IMAGE, 'ros2idl'), 'cdr') as string, /a ros2idl schema is not supported/);
    assert.match(decoderFor(ros('sensor_msgs/msg/Image', ''), 'cdr') as string, /holds no message definition/);
    assert.match(decoderFor(ros('sensor_msgs/msg/Image', 'uint32 [] broken'), 'cdr') as string, /ros2msg schema does not parse/);
    assert.match(decoderFor(foxglove('sensor_msgs/CompressedImage'), 'ros1') as string, /not an image type percept reads/);
    assert.match(decoderFor(undefined, 'json') as string, /\(no schema\) is not an image type/);
  });
});
