import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createReadStream, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import { McapIndexedReader, McapStreamReader, McapWriter } from '@mcap/core';
import { FileHandleReadable, FileHandleWritable } from '@mcap/nodejs';
import { loadDecompressHandlers } from '@mcap/support';
import { CompressedImage, RawImage } from '@foxglove/schemas/jsonschema.js';
import sharp from 'sharp';
import { CdrReader, createBagSource, decoderFor } from '../nodes/source-bag.ts';
import { createFolderSource } from '../nodes/source-folder.ts';
import { createPatternSource, encodePatternFrame, readPatternCounter } from '../nodes/source-pattern.ts';
import { RealClock, VirtualClock } from '../pipeline/clock.ts';
import type { Clock } from '../pipeline/clock.ts';
import type { CameraFrame } from '../nodes/payloads.ts';
import type { FrameSource, SourceItem } from '../pipeline/types.ts';
import { SAMPLE_START_NS, SAMPLE_TOPIC, makeSampleBag } from '../tools/make-sample-bag.ts';

const root = new URL('..', import.meta.url).pathname;
const cache = join(root, '.cache/test-sources');
const sampleBag = join(root, 'bags/sample.mcap');
const MS = 1_000_000n;

async function take<T>(source: FrameSource<T>, clock: Clock, max: number, controller = new AbortController()): Promise<SourceItem<T>[]> {
  const out: SourceItem<T>[] = [];
  for await (const item of source.frames(clock, controller.signal)) {
    out.push(item);
    if (out.length >= max) break;
  }
  return out;
}

async function decodeRgb(frame: CameraFrame): Promise<{ data: Buffer; width: number; height: number }> {
  const { data, info } = await sharp(frame.data).removeAlpha().raw().toBuffer({ resolveWithObject: true });
  return { data, width: info.width, height: info.height };
}

// ---- hand-written CDR (little endian) for test bags: an independent writer, checked below against
// bytes assembled by hand from the spec.
class CdrWriter {
  #bytes: number[] = [0x00, 0x01, 0x00, 0x00];
  #align(n: number): void {
    while ((this.#bytes.length - 4) % n !== 0) this.#bytes.push(0);
  }
  uint8(v: number): this {
    this.#bytes.push(v & 0xff);
    return this;
  }
  uint32(v: number): this {
    this.#align(4);
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v >>> 0);
    this.#bytes.push(...b);
    return this;
  }
  int32(v: number): this {
    this.#align(4);
    const b = Buffer.alloc(4);
    b.writeInt32LE(v);
    this.#bytes.push(...b);
    return this;
  }
  string(s: string): this {
    const utf8 = Buffer.from(s, 'utf8');
    this.uint32(utf8.length + 1);
    this.#bytes.push(...utf8, 0);
    return this;
  }
  bytes(data: Uint8Array): this {
    this.uint32(data.length);
    for (const b of data) this.#bytes.push(b);
    return this;
  }
  header(sec: number, nsec: number, frameId: string): this {
    return this.int32(sec).uint32(nsec).string(frameId);
  }
  done(): Uint8Array {
    return Uint8Array.from(this.#bytes);
  }
}

async function writeBag(path: string, build: (w: McapWriter) => Promise<void>): Promise<void> {
  const handle = await open(path, 'w');
  try {
    const w = new McapWriter({ writable: new FileHandleWritable(handle), chunkSize: 64 * 1024 });
    await w.start({ profile: '', library: 'percept test' });
    await build(w);
    await w.end();
  } finally {
    await handle.close();
  }
}

const json = (v: unknown): Uint8Array => new TextEncoder().encode(JSON.stringify(v));

before(() => {
  rmSync(cache, { recursive: true, force: true });
  mkdirSync(cache, { recursive: true });
});

describe('pattern source', () => {
  test('on a VirtualClock: frames at i/fps, clock advanced, counter readable, JPEG decodes at size', async () => {
    const clock = new VirtualClock(1_000n, 1_700_000_000_000);
    const source = createPatternSource({ fps: 10, frames: 5, width: 320, height: 180, id: 'pat' });
    const seen: bigint[] = [];
    const items: SourceItem<CameraFrame>[] = [];
    for await (const item of source.frames(clock, new AbortController().signal)) {
      seen.push(clock.nowNs());
      items.push(item);
    }
    assert.equal(items.length, 5, 'stops at `frames`');
    assert.deepEqual(
      items.map((it) => it.captureNs),
      [0n, 100n, 200n, 300n, 400n].map((ms) => 1_000n + ms * MS),
    );
    assert.deepEqual(
      seen,
      items.map((it) => it.captureNs),
      'the clock is at the capture time when the item is yielded',
    );
    assert.deepEqual(
      items.map((it) => it.captureWallMs),
      [0, 100, 200, 300, 400].map((ms) => 1_700_000_000_000 + ms),
    );
    for (const [i, item] of items.entries()) {
      assert.equal(item.sourceId, 'pat');
      assert.equal(item.payload.encoding, 'jpeg');
      const rgb = await decodeRgb(item.payload);
      assert.deepEqual([rgb.width, rgb.height], [320, 180]);
      assert.equal(readPatternCounter(rgb.data, rgb.width, rgb.height), i);
    }
    assert.deepEqual(source.counters, { yielded: 5, late: 0 });
  });

  test('on a VirtualClock that a slow consumer moved past the due time, capture stamps stay at the due time', async () => {
    const clock = new VirtualClock(0n, 1_000);
    const items: SourceItem<CameraFrame>[] = [];
    for await (const item of createPatternSource({ fps: 10, frames: 3, width: 64, height: 64 }).frames(
      clock,
      new AbortController().signal,
    )) {
      items.push(item);
      clock.advance(250n * MS); // the consumer spends 250 ms of virtual time per frame
    }
    assert.deepEqual(
      items.map((it) => it.captureNs),
      [0n, 100n * MS, 200n * MS],
    );
    assert.deepEqual(
      items.map((it) => it.captureWallMs),
      [1_000, 1_100, 1_200],
    );
  });

  test('frame i is deterministic, and consecutive frames differ (the box moves)', async () => {
    const a = await encodePatternFrame(7, 320, 180);
    const b = await encodePatternFrame(7, 320, 180);
    const c = await encodePatternFrame(8, 320, 180);
    assert.deepEqual(a, b);
    assert.notDeepEqual(a, c);
    const rgb = await decodeRgb({ encoding: 'jpeg', data: await encodePatternFrame(40_000, 640, 360) });
    assert.equal(readPatternCounter(rgb.data, 640, 360), 40_000);
  });

  test('on a RealClock: paced from the start time, never early', async () => {
    const clock = new RealClock();
    const fps = 100;
    const period = 10n * MS;
    const startNs = clock.nowNs();
    const items = await take(createPatternSource({ fps, frames: 8, width: 64, height: 64 }), clock, 100);
    assert.equal(items.length, 8);
    items.forEach((it, i) => {
      // The schedule starts at the first pull (>= startNs), so each frame is due no earlier than this.
      assert.ok(
        it.captureNs >= startNs + BigInt(i) * period,
        `frame ${i} captured ${it.captureNs - startNs - BigInt(i) * period} ns early`,
      );
    });
  });

  test('stops when the signal fires', async () => {
    const controller = new AbortController();
    const source = createPatternSource({ fps: 1000, frames: Infinity, width: 64, height: 64 });
    const items: SourceItem<CameraFrame>[] = [];
    for await (const item of source.frames(new RealClock(), controller.signal)) {
      items.push(item);
      if (items.length === 3) controller.abort();
    }
    assert.equal(items.length, 3);
  });

  test('validates its options', () => {
    const ok = { fps: 10, frames: 5, width: 320, height: 180 };
    const cases: Array<[object, RegExp]> = [
      [{ ...ok, fps: 0 }, /finite number > 0 for fps/],
      [{ ...ok, frames: 1.5 }, /positive integer or Infinity for frames/],
      [{ ...ok, width: 10 }, /between 64 and 8192 for width/],
      [{ ...ok, quality: 101 }, /between 1 and 100 for quality/],
      [{ ...ok, id: '' }, /non-empty string for id/],
    ];
    for (const [options, re] of cases) assert.throws(() => createPatternSource(options as never), re);
  });
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
  test('replays the sample bag on a VirtualClock at recorded timing', async () => {
    const source = await createBagSource({ path: sampleBag });
    assert.equal(source.topic, SAMPLE_TOPIC);
    assert.equal(source.id, SAMPLE_TOPIC);
    const clock = new VirtualClock(5n);
    const items = await take(source, clock, 1000);
    await source.close();
    assert.equal(items.length, source.messageCount);
    items.forEach((it, i) => assert.equal(it.captureNs, 5n + BigInt(i) * 100n * MS));
    assert.equal(clock.nowNs(), items.at(-1)?.captureNs);
    const first = await decodeRgb(items[0].payload);
    assert.deepEqual([first.width, first.height], [640, 360]);
    assert.deepEqual(source.counters, { read: items.length, yielded: items.length, bad: 0 });
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

  test('on a RealClock it paces by log time / rate (never early)', async () => {
    const source = await createBagSource({ path: sampleBag, rate: 20 });
    const clock = new RealClock();
    const before = clock.nowNs();
    const items = await take(source, clock, 4);
    await source.close();
    items.forEach((it, i) => assert.ok(it.captureNs >= before + BigInt(i) * 5n * MS, `item ${i} early`));
  });

  test('decodes foxglove RawImage json, sensor_msgs CompressedImage and Image cdr', async () => {
    const path = join(cache, 'kinds.mcap');
    const jpeg = await encodePatternFrame(3, 64, 64);
    const png = await sharp(Buffer.alloc(8 * 4 * 3, 200), { raw: { width: 8, height: 4, channels: 3 } })
      .png()
      .toBuffer();
    const raw = Buffer.from(Array.from({ length: 4 * 2 * 3 + 2 * 4 }, (_, k) => k)); // 4×2 rgb8 with step 16
    await writeBag(path, async (w) => {
      const rawSchema = await w.registerSchema({ name: 'foxglove.RawImage', encoding: 'jsonschema', data: json(RawImage) });
      const rosCompressed = await w.registerSchema({
        name: 'sensor_msgs/msg/CompressedImage',
        encoding: 'ros2msg',
        data: new Uint8Array(),
      });
      const rosImage = await w.registerSchema({ name: 'sensor_msgs/msg/Image', encoding: 'ros2msg', data: new Uint8Array() });
      const c1 = await w.registerChannel({ topic: '/raw', schemaId: rawSchema, messageEncoding: 'json', metadata: new Map() });
      const c2 = await w.registerChannel({
        topic: '/ros/compressed',
        schemaId: rosCompressed,
        messageEncoding: 'cdr',
        metadata: new Map(),
      });
      const c3 = await w.registerChannel({ topic: '/ros/image', schemaId: rosImage, messageEncoding: 'cdr', metadata: new Map() });
      await w.addMessage({
        channelId: c1,
        sequence: 0,
        logTime: 10n,
        publishTime: 10n,
        data: json({
          timestamp: { sec: 0, nsec: 10 },
          frame_id: 'f',
          width: 4,
          height: 2,
          encoding: 'rgb8',
          step: 16,
          data: raw.toString('base64'),
        }),
      });
      await w.addMessage({
        channelId: c2,
        sequence: 0,
        logTime: 10n,
        publishTime: 10n,
        data: new CdrWriter().header(0, 10, 'cam').string('jpeg').bytes(jpeg).done(),
      });
      await w.addMessage({
        channelId: c2,
        sequence: 1,
        logTime: 20n,
        publishTime: 20n,
        data: new CdrWriter().header(0, 20, 'cam').string('png').bytes(png).done(),
      });
      await w.addMessage({
        channelId: c3,
        sequence: 0,
        logTime: 10n,
        publishTime: 10n,
        data: new CdrWriter().header(0, 10, 'cam').uint32(2).uint32(4).string('rgb8').uint8(0).uint32(16).bytes(raw).done(),
      });
    });
    await assert.rejects(createBagSource({ path }), /several image topics \(\/raw, \/ros\/compressed, \/ros\/image\): pass topic/);

    const rawSource = await createBagSource({ path, topic: '/raw' });
    const [rawItem] = await take(rawSource, new VirtualClock(), 10);
    await rawSource.close();
    assert.deepEqual(
      { ...rawItem.payload, data: Buffer.from(rawItem.payload.data) },
      { encoding: 'rgb8', width: 4, height: 2, stride: 16, data: raw },
    );

    const rosSource = await createBagSource({ path, topic: '/ros/compressed' });
    const rosItems = await take(rosSource, new VirtualClock(), 10);
    await rosSource.close();
    assert.deepEqual(
      rosItems.map((it) => it.payload.encoding),
      ['jpeg', 'png'],
    );
    assert.deepEqual(Buffer.from(rosItems[0].payload.data), jpeg);
    assert.deepEqual(Buffer.from(rosItems[1].payload.data), png);
    assert.equal(rosItems[1].captureNs - rosItems[0].captureNs, 10n);

    const imageSource = await createBagSource({ path, topic: '/ros/image' });
    const [imageItem] = await take(imageSource, new VirtualClock(), 10);
    await imageSource.close();
    assert.deepEqual(
      { ...imageItem.payload, data: Buffer.from(imageItem.payload.data) },
      { encoding: 'rgb8', width: 4, height: 2, stride: 16, data: raw },
    );
  });

  test('CdrReader reads bytes laid out by hand from the CDR spec', () => {
    // sensor_msgs/msg/CompressedImage, little endian: stamp {sec 1, nanosec 2}, frame_id "cam",
    // format "jpeg", data [ff d8 ff d9]; alignment is relative to the end of the 4-byte header.
    const hex =
      '00010000' + '01000000' + '02000000' + '04000000' + '63616d00' + '05000000' + '6a70656700' + '000000' + '04000000' + 'ffd8ffd9';
    const bytes = Buffer.from(hex, 'hex');
    assert.deepEqual(
      Buffer.from(new CdrWriter().header(1, 2, 'cam').string('jpeg').bytes(Buffer.from('ffd8ffd9', 'hex')).done()),
      bytes,
      'the test writer matches the spec',
    );
    const cdr = new CdrReader(bytes);
    assert.deepEqual(
      [cdr.int32(), cdr.uint32(), cdr.string(), cdr.string(), Buffer.from(cdr.uint8Sequence()).toString('hex')],
      [1, 2, 'cam', 'jpeg', 'ffd8ffd9'],
    );
    // Big endian encapsulation.
    const be = new CdrReader(Buffer.from('00000000' + '00000007' + '00000002' + '6100', 'hex'));
    assert.deepEqual([be.uint32(), be.string()], [7, 'a']);
    const short = new CdrReader(bytes.subarray(0, 27));
    short.int32();
    short.uint32();
    short.string();
    assert.throws(() => short.string(), /CDR payload truncated: string of 5 bytes at offset 24 runs past 27/);
    assert.throws(() => new CdrReader(Buffer.from('0007', 'hex')), /no encapsulation header/);
    assert.throws(() => new CdrReader(Buffer.from('00070000', 'hex')), /unsupported CDR encapsulation 00070000/);
  });

  test('bad messages are counted and reported with topic and sequence; good ones still flow', async () => {
    const path = join(cache, 'bad.mcap');
    const jpeg = await encodePatternFrame(1, 64, 64);
    const good = (sec: number) => json({ timestamp: { sec, nsec: 0 }, frame_id: 'f', data: jpeg.toString('base64'), format: 'jpeg' });
    await writeBag(path, async (w) => {
      const s = await w.registerSchema({ name: 'foxglove.CompressedImage', encoding: 'jsonschema', data: json(CompressedImage) });
      const unknown = await w.registerSchema({ name: 'acme.Thermal', encoding: 'jsonschema', data: json({}) });
      const c = await w.registerChannel({ topic: '/cam', schemaId: s, messageEncoding: 'json', metadata: new Map() });
      const odd = await w.registerChannel({ topic: '/cam', schemaId: unknown, messageEncoding: 'json', metadata: new Map() });
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
      await add(c, 5, json({ timestamp: { sec: 5, nsec: 0 }, frame_id: 'f', data: jpeg.toString('base64'), format: 'png' }));
      await add(c, 6, good(6));
    });
    const reported: string[] = [];
    const source = await createBagSource({ path, topic: '/cam', onIssue: (i) => reported.push(`${i.topic}#${i.sequence}`) });
    const items = await take(source, new VirtualClock(), 100);
    await source.close();
    assert.equal(items.length, 2);
    assert.deepEqual(
      items.map((it) => it.captureNs),
      [0n, 600n * MS],
      'good messages keep their recorded timing',
    );
    assert.deepEqual(source.counters, { read: 7, yielded: 2, bad: 5 });
    assert.deepEqual(reported, ['/cam#1', '/cam#2', '/cam#3', '/cam#4', '/cam#5']);
    const reasons = source.issues.map((i) => i.reason);
    assert.match(reasons[0], /payload is not JSON/);
    assert.match(reasons[1], /field data is not valid base64/);
    assert.match(reasons[2], /not a JPEG or PNG image .*starts 47494638/);
    assert.match(reasons[3], /unsupported schema acme\.Thermal \(jsonschema\/json\)/);
    assert.match(reasons[4], /format "png" but the data is jpeg/);
    assert.deepEqual(
      source.issues.map((i) => i.index),
      [1, 2, 3, 4, 5],
    );
  });

  test('fatal file errors name the path', async () => {
    await assert.rejects(createBagSource({ path: join(cache, 'missing.mcap') }), /cannot open .*missing\.mcap/);
    const notMcap = join(cache, 'not.mcap');
    writeFileSync(notMcap, 'hello, not an mcap file at all');
    await assert.rejects(createBagSource({ path: notMcap }), /not\.mcap is not a readable indexed MCAP file/);
    await assert.rejects(
      createBagSource({ path: sampleBag, topic: '/nope' }),
      /sample\.mcap has no topic \/nope \(topics: \/camera\/front\/compressed\)/,
    );
    const noImages = join(cache, 'no-images.mcap');
    await writeBag(noImages, async (w) => {
      await w.registerChannel({ topic: '/actions', schemaId: 0, messageEncoding: 'json', metadata: new Map() });
    });
    await assert.rejects(
      createBagSource({ path: noImages }),
      /no-images\.mcap has no topic with a supported image schema \(channels: \/actions: \(no schema\) \(json\)\)/,
    );
    await assert.rejects(createBagSource({ path: noImages, topic: '/actions' }), /topic \/actions has no supported image schema/);
    // A bag whose chunk is corrupted after the index was read: reading fails naming the path.
    const corrupt = join(cache, 'corrupt.mcap');
    const bytes = readFileSync(sampleBag);
    const reader = await (async () => {
      const h = await open(sampleBag, 'r');
      try {
        return await McapIndexedReader.Initialize({
          readable: new FileHandleReadable(h),
          decompressHandlers: await loadDecompressHandlers(),
        });
      } finally {
        await h.close();
      }
    })();
    const chunk = reader.chunkIndexes[0];
    const mid = Number(chunk.chunkStartOffset + chunk.chunkLength / 2n);
    for (let k = 0; k < 64; k++) bytes[mid + k] ^= 0x5a;
    writeFileSync(corrupt, bytes);
    const source = await createBagSource({ path: corrupt });
    await assert.rejects(take(source, new VirtualClock(), 1000), /bag source: reading .*corrupt\.mcap failed/);
    await source.close();
  });

  test('decoderFor knows exactly the documented schemas', () => {
    assert.equal(typeof decoderFor('foxglove.CompressedImage', 'json'), 'function');
    assert.equal(typeof decoderFor('foxglove.RawImage', 'json'), 'function');
    assert.equal(typeof decoderFor('sensor_msgs/msg/CompressedImage', 'cdr'), 'function');
    assert.equal(typeof decoderFor('sensor_msgs/msg/Image', 'cdr'), 'function');
    assert.equal(decoderFor('foxglove.CompressedImage', 'protobuf'), undefined);
    assert.equal(decoderFor('sensor_msgs/CompressedImage', 'ros1'), undefined);
  });
});

describe('folder source', () => {
  test('JPEG and PNG files in numeric name order, typed by content, bad files reported', async () => {
    const dir = join(cache, 'frames');
    mkdirSync(dir, { recursive: true });
    const jpeg = await encodePatternFrame(2, 64, 64);
    const png = await sharp(Buffer.alloc(64 * 64 * 3, 90), { raw: { width: 64, height: 64, channels: 3 } })
      .png()
      .toBuffer();
    writeFileSync(join(dir, 'frame10.jpg'), jpeg);
    writeFileSync(join(dir, 'frame2.png'), png);
    writeFileSync(join(dir, 'frame1.JPEG'), jpeg);
    writeFileSync(join(dir, 'frame3.jpg'), 'not really a jpeg');
    writeFileSync(join(dir, 'notes.txt'), 'ignored');
    const issues: string[] = [];
    const source = await createFolderSource({ path: dir, fps: 5, onIssue: (i) => issues.push(i.file) });
    assert.deepEqual(source.files, ['frame1.JPEG', 'frame2.png', 'frame3.jpg', 'frame10.jpg']);
    const clock = new VirtualClock();
    const items = await take(source, clock, 100);
    assert.deepEqual(
      items.map((it) => it.payload.encoding),
      ['jpeg', 'png', 'jpeg'],
    );
    assert.deepEqual(
      items.map((it) => it.captureNs),
      [0n, 200n * MS, 400n * MS],
    );
    assert.deepEqual(Buffer.from(items[1].payload.data), png);
    assert.deepEqual(issues, ['frame3.jpg']);
    assert.match(source.issues[0].reason, /not a JPEG or PNG file/);
    assert.deepEqual(source.counters, { read: 4, yielded: 3, bad: 1 });
    assert.equal(items[0].sourceId, `folder:${dir}`);
  });

  test('loops, and stops on the signal', async () => {
    const dir = join(cache, 'loop');
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'a.jpg'), await encodePatternFrame(0, 64, 64));
    writeFileSync(join(dir, 'b.jpg'), await encodePatternFrame(1, 64, 64));
    const source = await createFolderSource({ path: dir, fps: 10, loop: true, id: 'loop' });
    const controller = new AbortController();
    const items: SourceItem<CameraFrame>[] = [];
    for await (const item of source.frames(new VirtualClock(), controller.signal)) {
      items.push(item);
      if (items.length === 5) controller.abort();
    }
    assert.equal(items.length, 5);
    assert.deepEqual(
      items.map((it) => it.captureNs),
      [0n, 100n, 200n, 300n, 400n].map((ms) => ms * MS),
    );
    assert.deepEqual(items[2].payload.data, items[0].payload.data);
  });

  test('fatal folder errors name the path', async () => {
    await assert.rejects(createFolderSource({ path: join(cache, 'nope'), fps: 1 }), /cannot list .*nope/);
    const empty = join(cache, 'empty');
    mkdirSync(empty, { recursive: true });
    await assert.rejects(createFolderSource({ path: empty, fps: 1 }), /empty has no \.jpg, \.jpeg or \.png files/);
    await assert.rejects(createFolderSource({ path: empty, fps: -1 }), /finite number > 0 for fps/);
  });
});
