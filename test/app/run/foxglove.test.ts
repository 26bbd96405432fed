// The live view (app/run/foxglove.ts): a real graph on the real clock served over the Foxglove WebSocket protocol
// to a real client. It checks the advertised schemas, that images are the frames' bytes, that annotations carry the
// bbox in pixels and the label with the frame's stamp, that actions and stats arrive, and that a client that never
// reads does not stall the run (its messages are dropped and counted).
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { test } from 'node:test';
import wsProtocol from '@foxglove/ws-protocol';
import type { Channel, IWebSocket, MessageData } from '@foxglove/ws-protocol';
import sharp from 'sharp';
import { annotate, jpegSize, parseFoxgloveUrl, startFoxgloveServer, FOXGLOVE_TOPICS } from '../../../app/run/foxglove.ts';
import { RealClock, type Clock } from '../../../pipeline/clock.ts';
import { chain } from '../../../pipeline/graph/chain.ts';
import { createGraph } from '../../../pipeline/graph/graph.ts';
import type { FrameSource, SourceItem } from '../../../pipeline/types.ts';
import { encodePatternFrame } from '../../../nodes/source-pattern.ts';
import type { ActionMessage, CameraFrame } from '../../../nodes/payloads.ts';
import { fakeStage, testConfig } from '../../support/pipeline-fakes.ts';

const require = createRequire(import.meta.url);
interface WsClient extends IWebSocket {
  pause(): void;
  terminate(): void;
}
const { WebSocket } = require('ws') as { WebSocket: new (url: string, protocols: string[]) => WsClient };
const { FoxgloveClient } = wsProtocol;

const STAMP0 = 1_700_000_000_123_456_789n;
const stampOf = (i: number): bigint => STAMP0 + BigInt(i) * 10_000_000n;
const BBOX = [0.25, 0.5, 0.75, 1];
const ACTION = { action: 'move', confidence: 0.9, speed: 0.5, target: { label: 'cup', bbox: BBOX } };

/** `jpegs.length` JPEG frames, one every periodMs of real time, each stamped stampOf(i). */
function jpegSource(jpegs: readonly Buffer[], width: number, height: number, periodMs: number): FrameSource<CameraFrame> {
  return {
    id: 'cam',
    expectedItems: jpegs.length,
    async *frames(clock: Clock, signal: AbortSignal): AsyncGenerator<SourceItem<CameraFrame>> {
      for (let i = 0; i < jpegs.length && !signal.aborted; i++) {
        if (i > 0) await new Promise((resolve) => setTimeout(resolve, periodMs));
        const payload: CameraFrame = { encoding: 'jpeg', data: jpegs[i]!, width, height };
        yield { sourceId: 'cam', captureNs: clock.nowNs(), captureWallMs: clock.wallMs(), stampNs: stampOf(i), payload };
      }
    },
  };
}

function graphOf(source: FrameSource<CameraFrame>, frames: number) {
  const decode = fakeStage<CameraFrame, ActionMessage>('decode', {
    work: async (_frame, ctx) => {
      await new Promise((resolve) => setTimeout(resolve, 2));
      const { frameId, sourceId, captureWallMs } = ctx.frame;
      return { schemaId: 'percept/robot-action/v1', frameId, sourceId, captureWallMs, action: ACTION };
    },
  });
  const config = testConfig({
    clock: 'real',
    edges: { default: { policy: 'queue', capacity: frames } },
    telemetry: { intervalMs: 50, liveTable: 'off' },
  });
  return createGraph({ source, stages: chain(decode), clock: new RealClock(), config });
}

/** Resolves when `check` holds, polling; rejects after `ms`. */
async function until(what: string, check: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

const decode = (data: ArrayBufferView): Record<string, unknown> =>
  JSON.parse(Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString('utf8')) as Record<string, unknown>;
const timeOf = (ns: bigint) => ({ sec: Number(ns / 1_000_000_000n), nsec: Number(ns % 1_000_000_000n) });

test('parseFoxgloveUrl: ws://HOST:PORT, HOST:PORT, PORT; loopback by default', () => {
  assert.deepEqual(parseFoxgloveUrl('ws://127.0.0.1:8765'), { host: '127.0.0.1', port: 8765 });
  assert.deepEqual(parseFoxgloveUrl('0.0.0.0:9000'), { host: '0.0.0.0', port: 9000 });
  assert.deepEqual(parseFoxgloveUrl('8766'), { host: '127.0.0.1', port: 8766 });
  assert.deepEqual(parseFoxgloveUrl('ws://[::1]:8765/'), { host: '::1', port: 8765 });
  assert.throws(() => parseFoxgloveUrl('wss://host:1'), /expected ws:\/\/HOST:PORT/);
  assert.throws(() => parseFoxgloveUrl('ws://host'), /expected ws:\/\/HOST:PORT/);
});

test('annotate: the bbox scaled to pixels as a LINE_LOOP and the label, or nothing without a target or size', async () => {
  const jpeg = await encodePatternFrame(1, 320, 240);
  assert.deepEqual(jpegSize(jpeg), { width: 320, height: 240 });
  const out = annotate(ACTION, { width: 320, height: 240 }, STAMP0) as {
    points: { type: number; points: { x: number; y: number }[] }[];
    texts: { text: string; timestamp: unknown }[];
  };
  assert.equal(out.points[0]!.type, 2);
  assert.deepEqual(out.points[0]!.points, [
    { x: 80, y: 120 },
    { x: 240, y: 120 },
    { x: 240, y: 240 },
    { x: 80, y: 240 },
  ]);
  assert.match(out.texts[0]!.text, /cup/);
  assert.deepEqual(out.texts[0]!.timestamp, timeOf(STAMP0));
  assert.equal(annotate({ action: 'stop', confidence: 1 }, { width: 320, height: 240 }, STAMP0), undefined);
  assert.equal(annotate(ACTION, undefined, STAMP0), undefined);
  // A target without a bbox: a text only.
  const label = annotate({ action: 'wait', confidence: 1, target: { label: 'person' } }, { width: 320, height: 240 }, STAMP0) as {
    points: unknown[];
    texts: { text: string }[];
  };
  assert.deepEqual(label.points, []);
  assert.match(label.texts[0]!.text, /person · wait/);
});

test(
  'a Foxglove client sees the frames, their annotations, the actions, stats and events of a running graph',
  { timeout: 60_000 },
  async () => {
    const frames = 12;
    const [width, height] = [320, 240];
    const jpegs = await Promise.all(Array.from({ length: frames }, (_, i) => encodePatternFrame(i, width, height)));
    const graph = graphOf(jpegSource(jpegs, width, height, 20), frames);
    const server = await startFoxgloveServer({ port: 0, graphs: [graph], events: graph.events, clock: new RealClock() });
    assert.match(server.url, /^ws:\/\/127\.0\.0\.1:\d+$/);
    const client = new FoxgloveClient({ ws: new WebSocket(server.url, [FoxgloveClient.SUPPORTED_SUBPROTOCOL]) });
    try {
      const channels = new Map<number, Channel>();
      const byTopic = new Map<string, MessageData[]>();
      const topicOfSub = new Map<number, string>();
      client.on('advertise', (list) => {
        for (const channel of list) {
          channels.set(channel.id, channel);
          topicOfSub.set(client.subscribe(channel.id), channel.topic);
        }
      });
      client.on('message', (message) => {
        const topic = topicOfSub.get(message.subscriptionId)!;
        byTopic.set(topic, [...(byTopic.get(topic) ?? []), message]);
      });
      await until('every channel subscribed', () => server.stats().subscribedChannels === 5);

      const topics = [...channels.values()].map((c) => c.topic).sort();
      assert.deepEqual(topics, Object.values(FOXGLOVE_TOPICS).sort());
      const channelOf = (topic: string) => [...channels.values()].find((c) => c.topic === topic)!;
      for (const [topic, name] of [
        [FOXGLOVE_TOPICS.image, 'foxglove.CompressedImage'],
        [FOXGLOVE_TOPICS.annotations, 'foxglove.ImageAnnotations'],
      ] as const) {
        const channel = channelOf(topic);
        assert.equal(channel.encoding, 'json');
        assert.equal(channel.schemaName, name);
        assert.equal(channel.schemaEncoding, 'jsonschema');
        assert.equal((JSON.parse(channel.schema) as { title: string }).title, name);
      }

      const summary = await graph.run();
      assert.equal(summary.frames.out, frames);
      const got = (topic: string) => byTopic.get(topic) ?? [];
      await until('every image, annotation and action', () =>
        [FOXGLOVE_TOPICS.image, FOXGLOVE_TOPICS.annotations, FOXGLOVE_TOPICS.actions].every((t) => got(t).length === frames),
      );
      await until('stats and events', () => got(FOXGLOVE_TOPICS.stats).length > 0 && got(FOXGLOVE_TOPICS.events).length > 0);

      for (const message of got(FOXGLOVE_TOPICS.image)) {
        const image = decode(message.data) as { timestamp: unknown; format: string; data: string; frame_id: string };
        const i = Number((message.timestamp - STAMP0) / 10_000_000n);
        assert.equal(message.timestamp, stampOf(i));
        assert.deepEqual(image.timestamp, timeOf(stampOf(i)));
        assert.equal(image.format, 'jpeg');
        assert.equal(image.frame_id, 'cam');
        assert.ok(Buffer.from(image.data, 'base64').equals(jpegs[i]!), `image ${i} is the frame's bytes`);
      }
      const imageStamps = got(FOXGLOVE_TOPICS.image).map((m) => m.timestamp);
      for (const message of got(FOXGLOVE_TOPICS.annotations)) {
        const boxes = decode(message.data) as {
          points: { timestamp: unknown; type: number; points: { x: number; y: number }[] }[];
          texts: { timestamp: unknown; text: string }[];
        };
        assert.ok(imageStamps.includes(message.timestamp), 'an annotation has the stamp of an image');
        assert.deepEqual(boxes.points[0]!.timestamp, timeOf(message.timestamp));
        assert.deepEqual(boxes.texts[0]!.timestamp, timeOf(message.timestamp));
        assert.equal(boxes.points[0]!.type, 2);
        assert.deepEqual(boxes.points[0]!.points, [
          { x: 80, y: 120 },
          { x: 240, y: 120 },
          { x: 240, y: 240 },
          { x: 80, y: 240 },
        ]);
        assert.match(boxes.texts[0]!.text, /^cup · move/);
      }
      const actions = got(FOXGLOVE_TOPICS.actions).map((m) => decode(m.data) as { frame_id: number; action: unknown; timestamp: unknown });
      assert.deepEqual(
        actions.map((a) => a.frame_id).sort((a, b) => a - b),
        Array.from({ length: frames }, (_, i) => i),
      );
      for (const action of actions) assert.deepEqual(action.action, ACTION);
      const stats = decode(got(FOXGLOVE_TOPICS.stats).at(-1)!.data) as { stages: Record<string, { count: number }> };
      assert.ok(stats.stages.decode!.count > 0, 'stats carry the decode stage latency');
      const kinds = new Set(got(FOXGLOVE_TOPICS.events).map((m) => decode(m.data).type));
      assert.ok(kinds.has('frame') && kinds.has('output'), `events: ${[...kinds].join(', ')}`);
      assert.equal(server.stats().dropped, 0);
    } finally {
      client.close();
      await server.close();
    }
  },
);

test('a client that never reads does not stall the run: its messages are dropped and counted', { timeout: 60_000 }, async () => {
  const frames = 40;
  const [width, height] = [1280, 720];
  // Noise compresses badly: each frame is about a megabyte, so the unread socket fills quickly.
  const noise = Buffer.alloc(width * height * 3);
  for (let i = 0; i < noise.length; i++) noise[i] = (i * 2654435761) >>> 24;
  const jpeg = await sharp(noise, { raw: { width, height, channels: 3 } })
    .jpeg({ quality: 100 })
    .toBuffer();
  const graph = graphOf(
    jpegSource(
      Array.from({ length: frames }, () => jpeg),
      width,
      height,
      5,
    ),
    frames,
  );
  const server = await startFoxgloveServer({
    port: 0,
    graphs: [graph],
    events: graph.events,
    clock: new RealClock(),
    maxBufferedBytes: 256 * 1024,
  });
  const socket = new WebSocket(server.url, [FoxgloveClient.SUPPORTED_SUBPROTOCOL]);
  try {
    socket.onmessage = (event: { data: unknown }) => {
      if (typeof event.data !== 'string') return;
      const message = JSON.parse(event.data) as { op: string; channels?: Channel[] };
      if (message.op !== 'advertise') return;
      const subscriptions = message.channels!.map((channel, id) => ({ id, channelId: channel.id }));
      socket.send(JSON.stringify({ op: 'subscribe', subscriptions }));
    };
    await until('every channel subscribed', () => server.stats().subscribedChannels === 5);
    socket.pause(); // never reads again
    let timer: NodeJS.Timeout | undefined;
    const summary = await Promise.race([
      graph.run(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error('the run stalled')), 30_000);
      }),
    ]).finally(() => clearTimeout(timer));
    assert.equal(summary.frames.in, frames);
    assert.equal(summary.frames.out, frames);
    const stats = server.stats();
    assert.ok(stats.dropped > 0, `drops counted: ${JSON.stringify(stats)}`);
    assert.equal(stats.clients, 1);
  } finally {
    socket.terminate();
    await server.close();
  }
});
