import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { Subscriber } from 'zeromq';
import { createPublisher } from '../nodes/publisher.ts';
import type { PublisherStage, WireHeader } from '../nodes/publisher.ts';
import { loadActionSchema } from '../nodes/action-schema.ts';
import { benchPublish } from '../app/bench-publish.ts';
import { VirtualClock } from '../pipeline/clock.ts';
import type { ActionMessage } from '../nodes/payloads.ts';
import type { StageContext } from '../pipeline/types.ts';
import { standaloneContext } from '../pipeline/standalone.ts';
import { TelemetryAggregator } from '../pipeline/telemetry/aggregator.ts';
import { eventToJson, type StatsEvent, type TelemetryEvent } from '../pipeline/telemetry/events.ts';

const stats = (atNs: bigint): StatsEvent => ({ type: 'stats', atNs, summary: new TelemetryAggregator('virtual').snapshot() });

const root = new URL('..', import.meta.url).pathname;
const schema = loadActionSchema(join(root, 'configs/actions/robot-action.schema.json'));

function context(clock = new VirtualClock(5_000_000n, 1_700_000_000_000)): StageContext {
  return standaloneContext({
    clock,
    frame: { captureNs: 0n, captureWallMs: 0, sourceId: 'cam' },
    deadlineNs: 0n,
    knobs: { maxNewTokens: 64 },
  });
}

function message(frameId: number, action: unknown = { action: 'move', confidence: 0.5, speed: frameId % 2 }): ActionMessage {
  return { schemaId: schema.wireSchemaId, frameId, sourceId: 'cam/front', captureWallMs: 1_700_000_000_000 + frameId, action };
}

/** Subscribers time out (receiveTimeout) so a broken publisher fails the test instead of hanging it. */
function subscriber(): Subscriber {
  return new Subscriber({ linger: 0, receiveTimeout: 5000 });
}

async function receive(sub: Subscriber, what: string): Promise<Buffer[]> {
  try {
    return await sub.receive();
  } catch (err) {
    throw new Error(`no message while waiting for ${what}: ${(err as Error).message}`, { cause: err });
  }
}

/** Slow joiner: a SUB misses what PUB sends before its subscription has propagated. Sends probe
 * actions until one arrives, then drains the probes sent after it. */
async function probe(pub: PublisherStage, sub: Subscriber, ctx: StageContext): Promise<void> {
  let first: Buffer[] | undefined;
  const pending = sub.receive().then((m) => (first = m));
  for (let i = 0; i < 500 && !first; i++) {
    await pub.process(message(-1, { action: 'wait', confidence: 0 }), ctx);
    await new Promise((r) => setTimeout(r, 10));
  }
  await pending;
  let seq = (JSON.parse(first![1].toString()) as WireHeader).seq;
  while (seq < pub.sent - 1) seq = (JSON.parse((await receive(sub, 'remaining probes'))[1].toString()) as WireHeader).seq;
}

describe('publisher', () => {
  const closers: Array<() => unknown> = [];
  after(async () => {
    for (const c of closers) await c();
  });

  test('multipart [topic, header, body] in seq order, topic filter respected, bodies valid', async () => {
    const { stage: pub, sink } = await createPublisher({ endpoint: 'tcp://127.0.0.1:*', topic: 'actions/front', sendHighWaterMark: 1000 });
    closers.push(() => pub.close());
    assert.match(pub.endpoint, /^tcp:\/\/127\.0\.0\.1:\d+$/);
    const actionsSub = subscriber();
    const telemetrySub = subscriber();
    closers.push(
      () => actionsSub.close(),
      () => telemetrySub.close(),
    );
    actionsSub.connect(pub.endpoint);
    telemetrySub.connect(pub.endpoint);
    actionsSub.subscribe('actions/front');
    telemetrySub.subscribe('telemetry');

    const clock = new VirtualClock(5_000_000n, 1_700_000_000_000);
    const ctx = context(clock);
    await probe(pub, actionsSub, ctx);
    // Telemetry subscription may still be propagating: probe it too with telemetry messages.
    let telemetryArrived = false;
    const firstTelemetry = telemetrySub.receive().then((m) => ((telemetryArrived = true), m));
    for (let i = 0; i < 500 && !telemetryArrived; i++) {
      await sink.publish(stats(BigInt(i)));
      await new Promise((r) => setTimeout(r, 10));
    }
    await firstTelemetry;
    const probeEnd = 1_000_000n;
    await sink.publish(stats(probeEnd));
    for (;;) {
      const m = await receive(telemetrySub, 'probe-end');
      if (JSON.parse(m[1].toString()).atNs === String(probeEnd)) break;
    }

    const startSeq = pub.sent;
    const n = 200;
    for (let i = 0; i < n; i++) {
      clock.advance(1_000_000n);
      const sent = message(i);
      const returned = await pub.process(sent, ctx);
      assert.equal(returned, sent, 'the stage passes its input through');
    }
    await sink.publish(stats(123n));
    assert.equal(pub.sent, startSeq + n);

    for (let i = 0; i < n; i++) {
      const frames = await receive(actionsSub, `action ${i}`);
      assert.equal(frames.length, 3);
      assert.equal(frames[0].toString(), 'actions/front');
      const header = JSON.parse(frames[1].toString()) as WireHeader;
      assert.deepEqual(header, {
        schema_id: 'percept/robot-action/v1',
        seq: startSeq + i,
        frame_id: i,
        source_id: 'cam/front',
        capture_wall_ms: 1_700_000_000_000 + i,
        publish_wall_ms: clock.wallMs() - (n - 1 - i),
      });
      const body = JSON.parse(frames[2].toString());
      assert.ok(schema.validate(body), `body ${i} fails the schema`);
      assert.deepEqual(body, message(i).action);
    }
    // The telemetry subscriber is connected to the same PUB, and PUB keeps per-peer order: the
    // stats message arrives after the 200 actions were sent, so if the filter let actions through
    // they would show up here first.
    const last = await receive(telemetrySub, 'stats');
    assert.equal(last.length, 2);
    assert.equal(last[0].toString(), 'telemetry');
    assert.deepEqual(JSON.parse(last[1].toString()), JSON.parse(eventToJson(stats(123n))));
  });

  test('concurrent process calls are serialised, never EBUSY', async () => {
    const { stage: pub, sink } = await createPublisher({ endpoint: 'tcp://127.0.0.1:*', topic: 'actions', sendHighWaterMark: 1000 });
    closers.push(() => pub.close());
    const sub = subscriber();
    closers.push(() => sub.close());
    sub.connect(pub.endpoint);
    sub.subscribe('actions');
    const ctx = context();
    await probe(pub, sub, ctx);
    const startSeq = pub.sent;
    const sends = Array.from({ length: 50 }, (_, i) => pub.process(message(i), ctx));
    sends.push(
      sink.publish({ type: 'drop', atNs: 0n, frameId: 7, stage: 'decode', reason: 'stale', detail: 'between' }).then(() => message(-2)),
    );
    await Promise.all(sends);
    assert.equal(pub.sent, startSeq + 50);
    for (let i = 0; i < 50; i++) {
      const header = JSON.parse((await receive(sub, `action ${i}`))[1].toString()) as WireHeader;
      assert.equal(header.seq, startSeq + i);
      assert.equal(header.frame_id, i);
    }
  });

  test('bind failure names the endpoint', async () => {
    const { stage: first } = await createPublisher({ endpoint: 'tcp://127.0.0.1:*', topic: 'actions', sendHighWaterMark: 1000 });
    closers.push(() => first.close());
    await assert.rejects(
      createPublisher({ endpoint: first.endpoint, topic: 'actions', sendHighWaterMark: 1000 }),
      (err: Error) => err.message.startsWith(`publisher: cannot bind ${first.endpoint}`) && /in use/i.test(err.message),
    );
  });

  test('validates its options', async () => {
    await assert.rejects(
      createPublisher({ endpoint: 'localhost:5555', topic: 'actions', sendHighWaterMark: 1000 }),
      /expected endpoint like tcp:\/\/host:port/,
    );
    await assert.rejects(
      createPublisher({ endpoint: 'tcp://127.0.0.1:*', topic: '', sendHighWaterMark: 1000 }),
      /non-empty string for topic/,
    );
    await assert.rejects(
      createPublisher({ endpoint: 'tcp://127.0.0.1:*', topic: 'actions', sendHighWaterMark: -1 }),
      /integer >= 0 for sendHighWaterMark/,
    );
  });

  test('send after close rejects; close is idempotent; the sink counts what it could not deliver', async () => {
    const { stage: pub, sink } = await createPublisher({
      endpoint: 'inproc://percept-test-close',
      topic: 'actions',
      sendHighWaterMark: 1000,
    });
    await pub.close();
    await pub.close();
    await assert.rejects(pub.process(message(0), context()), /send after close/);
    await assert.rejects(sink.publish(stats(1n)), /send after close/);
    sink.accept(stats(2n));
    sink.accept({ type: 'drop', atNs: 3n, frameId: 1, stage: 'decode', reason: 'stale', detail: '' });
    sink.accept({ type: 'span', atNs: 4n, frameId: 1, stage: 'decode', enterNs: 0n, exitNs: 4n, degradeLevel: 0 }); // not published
    await new Promise((r) => setImmediate(r));
    assert.equal(sink.undelivered, 2);
    // The endpoint is free again.
    const again = await createPublisher({ endpoint: 'inproc://percept-test-close', topic: 'actions', sendHighWaterMark: 1000 });
    await again.stage.close();
  });

  test('the sink publishes decisions on the events topic and stats on the telemetry topic, nothing else', async () => {
    const { stage: pub, sink } = await createPublisher({
      endpoint: 'tcp://127.0.0.1:*',
      topic: 'actions',
      sendHighWaterMark: 1000,
      eventsTopic: 'ev',
      telemetryTopic: 'tm',
    });
    closers.push(() => pub.close());
    const sub = subscriber();
    closers.push(() => sub.close());
    sub.connect(pub.endpoint);
    sub.subscribe('');
    await probe(pub, sub, context());
    const events: TelemetryEvent[] = [
      { type: 'frame', atNs: 1n, frameId: 1, sourceId: 'cam', captureNs: 0n, degradeLevel: 0 },
      { type: 'span', atNs: 2n, frameId: 1, stage: 'decode', enterNs: 1n, exitNs: 2n, degradeLevel: 0 },
      { type: 'note', atNs: 3n, frameId: 1, stage: 'decode', message: 'decode' },
      { type: 'output', atNs: 4n, frameId: 1, latencyNs: 4n, late: false },
      { type: 'drop', atNs: 5n, frameId: 2, stage: 'encode', reason: 'conflated', detail: 'replaced by frame 3' },
      { type: 'cancel', atNs: 6n, frameId: 3, stage: 'decode', reason: 'deadline', detail: '' },
      {
        type: 'degrade',
        atNs: 7n,
        frameId: 4,
        direction: 'down',
        from: 0,
        to: 1,
        reason: 'predicted_miss',
        predictedMs: 9,
        limitMs: 8,
        knobs: { imageTokens: 140, maxNewTokens: 48, draft: true, frameSkip: 0 },
      },
      { type: 'error', atNs: 8n, frameId: 5, stage: 'decode', message: 'boom' },
      stats(9n),
    ];
    for (const event of events) sink.accept(event);
    const got: string[] = [];
    while (got.length < 5) {
      const [topic, body] = await receive(sub, `event ${got.length}`);
      got.push(`${topic!.toString()} ${JSON.parse(body!.toString()).type}`);
    }
    assert.deepEqual(got, ['ev drop', 'ev cancel', 'ev degrade', 'ev error', 'tm stats']);
    assert.equal(sink.undelivered, 0);
  });

  test('benchPublish runs end to end and accounts for every message (numbers are not asserted)', async () => {
    const r = await benchPublish({ messages: 300, latencySamples: 20, size: 200 });
    assert.equal(r.messages, 300);
    assert.equal(r.received + r.dropped, 300);
    assert.equal(r.dropped, 0, 'the bench HWM is large enough for nothing to drop');
    assert.ok(r.body_bytes >= 200 && r.body_bytes < 210, `body ${r.body_bytes} B`);
    assert.ok(r.msgs_per_s > 0 && Number.isFinite(r.msgs_per_s));
    assert.ok(r.p50_us > 0 && r.p50_us <= r.p99_us && r.p99_us <= r.max_us);
    assert.match(r.transport, /^tcp:\/\/127\.0\.0\.1:\d+$/);
  });
});
