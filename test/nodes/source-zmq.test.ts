// The ZeroMQ frame input: a pusher's frames come out with their stamps and camera ids; malformed
// messages are rejected frames with their cause while the source goes on; in a graph they are
// counted in frames in and dropped as 'rejected' (summary drops by cause), the frames reach the stages.
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import sharp from 'sharp';
import { Publisher, Push } from 'zeromq';
import { createZmqSource, type ZmqSource } from '../../nodes/source-zmq.ts';
import { chain } from '../../pipeline/graph/chain.ts';
import { RealClock } from '../../pipeline/clock.ts';
import { isRejection, type SourceItem, type SourceRejection } from '../../pipeline/types.ts';
import type { CameraFrame } from '../../nodes/payloads.ts';
import { fakeStage, runGraph, testConfig } from '../support/pipeline-fakes.ts';
import { benchFrameInput } from '../../app/bench/frame-input.ts';

const jpeg = await sharp(Buffer.alloc(16 * 8 * 3, 120), { raw: { width: 16, height: 8, channels: 3 } })
  .jpeg()
  .toBuffer();
const header = (h: Record<string, unknown>): string => JSON.stringify(h);

/** Takes `count` frames from a source on a real clock, collecting rejections; then stops it. */
async function take(source: ZmqSource, count: number, rejections: SourceRejection[] = []): Promise<SourceItem<CameraFrame>[]> {
  const abort = new AbortController();
  const items: SourceItem<CameraFrame>[] = [];
  for await (const item of source.frames(new RealClock(), abort.signal)) {
    if (isRejection(item)) {
      rejections.push(item);
      continue;
    }
    items.push(item);
    if (items.length === count) abort.abort();
  }
  return items;
}

describe('zmq frame input', () => {
  const closers: Array<() => unknown> = [];
  after(async () => {
    for (const c of closers) await c();
  });

  test('PULL: good frames come out in order with stamp and camera; malformed ones are rejected frames with their cause', async () => {
    const source = await createZmqSource({
      endpoint: 'tcp://127.0.0.1:*',
      bind: true,
      socket: 'pull',
      topic: '',
      receiveHighWaterMark: 100,
    });
    closers.push(() => source.close());
    const push = new Push({ linger: 1000 });
    closers.push(() => push.close());
    push.connect(source.endpoint);
    const rgb = Buffer.alloc(4 * 2 * 3, 7);
    const messages: (string | Buffer)[][] = [
      [header({ stamp: { sec: 10, nanosec: 5 }, frame_id: 'cam_front', encoding: 'jpeg' }), jpeg],
      [jpeg], // one frame
      ['{"encoding": "jpeg"', jpeg], // header not JSON
      [header({ frame_id: 'cam_front' }), jpeg], // no encoding
      [header({ encoding: 'rgb8' }), rgb], // raw without width/height
      [header({ encoding: 'rgb8', width: 4, height: 3 }), rgb], // too short for 4×3
      [header({ encoding: 'rgb8', width: 4, height: 1 }), rgb], // twice 4×1: another layout, not rgb8
      [header({ encoding: 'jpeg' }), Buffer.from('not a jpeg')],
      [header({ encoding: 'png' }), Buffer.alloc(0)], // empty image
      [header({ stamp: 12.25, encoding: 'rgb8', width: 4, height: 2, extra: 'ignored' }), rgb],
      ['frames/rear', header({ frame_id: 'cam_rear', encoding: 'jpeg' }), jpeg], // a topic frame is allowed
    ];
    for (const m of messages) await push.send(m);
    const rejections: SourceRejection[] = [];
    const items = await take(source, 3, rejections);
    assert.deepEqual(
      items.map((i) => [i.sourceId, i.sourceStamp, i.payload.encoding, i.payload.width ?? null]),
      [
        ['cam_front', { sec: 10, nanosec: 5 }, 'jpeg', null],
        [source.id, { sec: 12, nanosec: 250_000_000 }, 'rgb8', 4],
        ['cam_rear', null, 'jpeg', null],
      ],
    );
    assert.ok(Buffer.from(items[0]!.payload.data).equals(jpeg));
    assert.deepEqual(source.counters, { received: 11, yielded: 3, rejected: 8, disconnects: 0 });
    assert.deepEqual(
      rejections.map((r) => r.rejected),
      [
        'wrong number of message frames',
        'the header is not JSON',
        'the header does not fit the frame header schema',
        'the header does not fit the frame header schema',
        'the image has the wrong size',
        'the image has the wrong size',
        'the image is not its encoding',
        'the image is empty',
      ],
    );
    assert.ok(rejections.every((r) => r.sourceId === source.id && r.captureNs > 0n));
    const details = rejections.map((r) => r.detail).join('\n');
    for (const what of [
      /^message 2: expected \[header, image\] or \[topic, header, image\] but got 1$/m,
      /^message 4: .*must have required property 'encoding'/m,
      /must have required property 'width'/,
      /need step × height = 36 for 4×3/,
      /24 bytes of rgb8, need step × height = 12 for 4×1/,
      /not jpeg \(starts/,
    ]) {
      assert.match(details, what);
    }
  });

  test('a message over maxMessageBytes is never kept: its connection is dropped and reported, and frames after it come through', async () => {
    const source = await createZmqSource({
      endpoint: 'tcp://127.0.0.1:*',
      bind: true,
      socket: 'pull',
      topic: '',
      receiveHighWaterMark: 100,
      maxMessageBytes: 4096,
    });
    closers.push(() => source.close());
    const incidents: string[] = [];
    const abort = new AbortController();
    const items: SourceItem<CameraFrame>[] = [];
    const reading = (async () => {
      for await (const item of source.frames(new RealClock(), abort.signal, (i) => incidents.push(`${i.kind}: ${i.detail}`))) {
        if (!isRejection(item)) items.push(item);
        if (items.length === 1) abort.abort();
      }
    })();
    // A raw frame of 64 KiB against a 4 KiB limit: ZeroMQ ends that connection.
    const big = new Push({ linger: 1000 });
    big.connect(source.endpoint);
    await big.send([header({ encoding: 'rgb8', width: 128, height: 128 }), Buffer.alloc(128 * 128 * 3 + 16)]);
    for (let i = 0; i < 200 && incidents.length === 0; i++) await new Promise((r) => setTimeout(r, 10));
    big.close();
    // A sender within the limit on a connection of its own gets through.
    const small = new Push({ linger: 1000 });
    closers.push(() => small.close());
    small.connect(source.endpoint);
    await small.send([header({ encoding: 'jpeg', frame_id: 'after' }), jpeg]);
    await reading;
    assert.deepEqual(
      items.map((i) => i.sourceId),
      ['after'],
    );
    assert.equal(source.counters.received, 1, 'the large message never reached percept');
    assert.ok(source.counters.disconnects >= 1);
    assert.match(
      incidents[0] ?? '',
      /^skipped: connection from .* ended: a message over maxMessageBytes 4096 was dropped, or the sender left$/,
    );
  });

  test('SUB: subscribes to its topic prefix', async () => {
    const pub = new Publisher({ linger: 0 });
    closers.push(() => pub.close());
    await pub.bind('tcp://127.0.0.1:*');
    const source = await createZmqSource({
      endpoint: pub.lastEndpoint!,
      socket: 'sub',
      bind: false,
      topic: 'cam/front',
      receiveHighWaterMark: 100,
    });
    closers.push(() => source.close());
    const rejections: SourceRejection[] = [];
    const taking = take(source, 2, rejections);
    // Slow joiner: publish until the subscription is there; the rear camera never gets through.
    for (let i = 0; source.counters.yielded < 2 && i < 500; i++) {
      await pub.send(['cam/rear', header({ encoding: 'jpeg', frame_id: 'rear' }), jpeg]);
      await pub.send(['cam/front', header({ encoding: 'jpeg', frame_id: 'front' }), jpeg]);
      await new Promise((r) => setTimeout(r, 10));
    }
    const items = await taking;
    assert.deepEqual(
      items.map((i) => i.sourceId),
      ['front', 'front'],
    );
    assert.deepEqual(rejections, []);
  });

  test('in a graph: malformed inputs are frames dropped as rejected, with their cause; good frames reach the stages', async () => {
    const source = await createZmqSource({
      endpoint: 'tcp://127.0.0.1:*',
      bind: true,
      socket: 'pull',
      topic: '',
      receiveHighWaterMark: 100,
    });
    const push = new Push({ linger: 1000 });
    closers.push(() => push.close());
    push.connect(source.endpoint);
    for (let i = 0; i < 3; i++) {
      await push.send([header({ encoding: 'jpeg', stamp: { sec: i, nanosec: 0 } }), jpeg]);
      await push.send(['garbage', jpeg]);
    }
    const sink = fakeStage<CameraFrame>('sink');
    const config = testConfig({ clock: 'real', edges: { default: { policy: 'queue', capacity: 10 } } });
    let seen = 0;
    const result = await runGraph({
      source,
      stages: chain(sink),
      config,
      clock: new RealClock(),
      onOutput: (_env, graph) => void (++seen === 3 && graph.stop('test')),
    });
    const { frames, drops } = result.summary;
    assert.equal(frames.out, 3);
    // The graph stops at the third output: the third malformed message may not have come in yet.
    const rejected = drops.byReason.rejected ?? 0;
    assert.ok(rejected === 2 || rejected === 3, `rejected ${rejected}`);
    assert.deepEqual([frames.in, frames.dropped, frames.inFlight], [3 + rejected, rejected, 0], 'frames in = out + dropped');
    assert.deepEqual(drops.causes, { 'source: the header is not JSON': rejected });
    assert.deepEqual(result.summary.source, { counts: {}, details: [] });
    assert.deepEqual(
      result.outputs.map((o) => o.sourceStamp),
      [0, 1, 2].map((sec) => ({ sec, nanosec: 0 })),
    );
    const drop = result.events.find((e) => e.type === 'drop');
    assert.ok(
      drop?.type === 'drop' && drop.stage === 'source' && drop.reason === 'rejected',
      `first drop: ${drop?.type} ${drop && 'reason' in drop ? drop.reason : ''}`,
    );
    assert.match(drop.detail, /^the header is not JSON: message 2: 7 bytes, starts "garbage"$/);
  });

  test('bench frame-input accounts for every pushed frame (numbers are not asserted)', async () => {
    const r = await benchFrameInput({ fps: 20, seconds: 0.5, width: 320, height: 240 });
    assert.equal(r.frames_pushed, 10);
    assert.equal(r.frames_received + r.dropped, r.frames_pushed);
    assert.equal(r.rejected, 0);
    assert.ok(r.jpeg_bytes > 1000);
    assert.ok(r.frames_received === 0 || (r.p50_us > 0 && r.p50_us <= r.p99_us && r.p99_us <= r.max_us));
  });

  test('refuses an endpoint other hosts can reach without CURVE, and a connect to any port', async () => {
    await assert.rejects(
      createZmqSource({ endpoint: 'tcp://10.0.0.1:6000', socket: 'pull', bind: false, topic: '', receiveHighWaterMark: 10 }),
      /connects to another host without encryption/,
    );
    await assert.rejects(
      createZmqSource({ endpoint: 'tcp://127.0.0.1:*', socket: 'pull', bind: false, topic: '', receiveHighWaterMark: 10 }),
      /a connect needs a port number/,
    );
  });
});
