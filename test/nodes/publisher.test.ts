import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Ajv } from 'ajv';
import { Subscriber, curveKeyPair } from 'zeromq';
import { createPublisher, type Publisher, type PublisherOptions } from '../../nodes/publisher.ts';
import { loadActionSchema } from '../../nodes/action-schema.ts';
import { benchPublish } from '../../app/bench/publish.ts';
import { writeKeyPair } from '../../app/keys.ts';
import { PYTHON } from '../../app/bench/python.ts';
import { VirtualClock, type Clock } from '../../pipeline/clock.ts';
import type { ActionMessage } from '../../nodes/payloads.ts';
import type { StageContext } from '../../pipeline/types.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';
import { TelemetryAggregator } from '../../pipeline/telemetry/aggregator.ts';
import type { StatsEvent, TelemetryEvent } from '../../pipeline/telemetry/events.ts';
import type { ActionHeader, MessageHeader } from '../../client/wire-types.ts';

const root = new URL('../..', import.meta.url).pathname;
const schema = loadActionSchema(join(root, 'configs/actions/robot-action.schema.json'));
const wire = new Ajv({ strict: true, allErrors: true });
for (const file of ['header', 'messages']) wire.addSchema(JSON.parse(readFileSync(join(root, `configs/wire/${file}.schema.json`), 'utf8')));
const validateActionHeader = wire.getSchema('percept/wire/header/v1#/definitions/ActionHeader')!;
const validateMessageHeader = wire.getSchema('percept/wire/header/v1#/definitions/MessageHeader')!;
const validateEvent = wire.getSchema('percept/wire/messages/v1#/definitions/Event')!;
const validateTelemetry = wire.getSchema('percept/wire/messages/v1#/definitions/Telemetry')!;

const stats = (atNs: bigint): StatsEvent => ({ type: 'stats', atNs, summary: new TelemetryAggregator('virtual').snapshot() });

const diag = (text: string): void => void process.stdout.write(`${text}\n`);

const BUDGET_NS = 250_000_000n;
function context(frameId: number, clock: Clock = new VirtualClock(5_000_000n, 1_700_000_000_000)): StageContext {
  const captureNs = clock.nowNs();
  return standaloneContext({
    clock,
    frame: {
      frameId,
      sourceId: 'cam/front',
      captureNs,
      captureWallMs: clock.wallMs(),
      degradeLevel: frameId % 3,
      sourceStamp: { sec: 1_700_000_000 + frameId, nanosec: 5 },
    },
    deadlineNs: captureNs + BUDGET_NS,
  });
}

function message(
  frameId: number,
  ctx: StageContext,
  action: unknown = { action: 'move', confidence: 0.5, speed: frameId % 2 },
): ActionMessage {
  return { schemaId: schema.wireSchemaId, frameId, sourceId: 'cam/front', captureWallMs: ctx.frame.captureWallMs, action };
}

const base = { endpoint: 'tcp://127.0.0.1:*', topic: 'actions', sendHighWaterMark: 1000 } as const;
const parse = (frames: Buffer[]) => ({
  topic: frames[0]!.toString(),
  header: JSON.parse(frames[1]!.toString()),
  body: JSON.parse(frames[2]!.toString()),
});

/** Subscribers time out (receiveTimeout) so a broken publisher fails the test instead of hanging it.
 * Generously: on a 2-core machine running CI and two other test runs, a first message once took over
 * 10 s to reach a slow joiner. */
function subscriber(options: ConstructorParameters<typeof Subscriber>[0] = {}): Subscriber {
  return new Subscriber({ linger: 0, receiveTimeout: 60_000, ...options });
}

/** Slow joiner: a SUB misses what PUB sends before its subscription has propagated. Sends events
 * (drops of frame -1) until one arrives, then receives the probes sent after it. Returns how many
 * events were sent. */
async function probe(pub: Publisher, sub: Subscriber): Promise<number> {
  let first: Buffer[] | undefined;
  const arrival = sub.receive().then((m) => (first = m));
  let sent = 0;
  for (; sent < 500 && !first; sent++) {
    pub.sink.accept({ type: 'drop', atNs: 0n, frameId: -1, stage: 'probe', reason: 'stale', detail: 'probe' });
    await new Promise((r) => setTimeout(r, 10));
  }
  await arrival;
  for (let seq = parse(first!).header.seq; seq < sent - 1;) seq = parse(await sub.receive()).header.seq;
  return sent;
}

/** As probe(), but sends exactly `total` probes (the rest at once once one has arrived), so that two
 * publishers probed this way have taken in the same messages, and receives them all. */
async function probeExactly(pub: Publisher, sub: Subscriber, total: number): Promise<void> {
  let seq = -1;
  const arrival = sub.receive().then((m) => (seq = parse(m).header.seq));
  for (let sent = 0; sent < total; sent++) {
    pub.sink.accept({ type: 'drop', atNs: 0n, frameId: -1, stage: 'probe', reason: 'stale', detail: 'probe' });
    if (seq < 0) await new Promise((r) => setTimeout(r, 10));
  }
  await arrival;
  while (seq < total - 1) seq = parse(await sub.receive()).header.seq;
}

/** Receives until `count` messages of topic `topic` (others are skipped). */
async function receiveTopic(sub: Subscriber, topic: string, count: number) {
  const got = [];
  while (got.length < count) {
    const m = parse(await sub.receive());
    if (m.topic === topic) got.push(m);
  }
  return got;
}

describe('publisher', () => {
  const closers: Array<() => unknown> = [];
  after(async () => {
    for (const c of closers) await c();
  });
  const open = async (options: Partial<PublisherOptions> = {}) => {
    const pub = await createPublisher({ ...base, ...options });
    closers.push(() => pub.close());
    return pub;
  };
  const connect = (pub: Publisher, topics: string[] = [''], options: ConstructorParameters<typeof Subscriber>[0] = {}) => {
    const sub = subscriber(options);
    closers.push(() => sub.close());
    sub.connect(pub.endpoint);
    for (const t of topics) sub.subscribe(t);
    return sub;
  };

  test('actions go out as [topic, ActionHeader, body]: header v1 fields, gap-free seq, bodies as validated', async () => {
    const pub = await open({ runId: 'run-1', models: { decoder: 'synth:gemma4-tiny', encoder: 'vision.onnx' } });
    const sub = connect(pub);
    await probe(pub, sub);
    const clock = new VirtualClock(5_000_000n, 1_700_000_000_000);
    const before = Date.now();
    for (let i = 0; i < 50; i++) {
      clock.advance(1_000_000n);
      const ctx = context(i, clock);
      const sent = message(i, ctx);
      assert.equal(await pub.stage.process(sent, ctx), sent, 'the stage passes its input through');
    }
    const got = await receiveTopic(sub, 'actions', 50);
    got.forEach(({ header, body }, i) => {
      assert.ok(validateActionHeader(header), JSON.stringify(validateActionHeader.errors));
      const h = header as ActionHeader;
      const captureWallMs = 1_700_000_000_000 + 5 + (i + 1);
      assert.deepEqual(
        { ...h, publish_wall_ms: 0 },
        {
          header_version: 1,
          schema_id: 'percept/robot-action/v1',
          run_id: 'run-1',
          seq: i,
          clock: 'real',
          publish_wall_ms: 0,
          virtual_publish_ms: null,
          frame_id: i,
          source_id: 'cam/front',
          source_stamp: { sec: 1_700_000_000 + i, nanosec: 5 },
          capture_wall_ms: captureWallMs,
          valid_until_wall_ms: captureWallMs + 250,
          virtual_capture_ms: null,
          virtual_valid_until_ms: null,
          degrade_level: i % 3,
          models: { decoder: 'synth:gemma4-tiny', encoder: 'vision.onnx' },
        },
      );
      assert.ok(h.publish_wall_ms! >= before && h.publish_wall_ms! <= Date.now(), 'publish time is the wall clock');
      assert.ok(schema.validate(body));
      assert.deepEqual(body, { action: 'move', confidence: 0.5, speed: i % 2 });
    });
  });

  test('on a virtual clock every time is virtual_*, never a wall time; the run id is the caller', async () => {
    await assert.rejects(createPublisher({ ...base, clock: new VirtualClock() }), /a virtual clock needs runId/);
    // The run's clock: its time line starts 1 s after the epoch (replay time, not wall time).
    const pub = await open({ clock: new VirtualClock(0n, 1000), runId: 'replay-1' });
    const sub = connect(pub, ['actions', 'events', 'telemetry']);
    await probe(pub, sub);
    // The publish stage's call: its frame was captured at 500 ms; it takes the action in at 600 ms.
    const ctx = context(0, new VirtualClock(500_000_000n, 0));
    (ctx.clock as VirtualClock).advance(100_000_000n);
    await pub.stage.process(message(0, ctx), ctx);
    pub.sink.accept({ type: 'error', atNs: 250_500_000n, frameId: 0, stage: 'decode', message: 'late' });
    pub.sink.accept(stats(600_000_001n));
    const [{ header }] = await receiveTopic(sub, 'actions', 1);
    assert.ok(validateActionHeader(header), JSON.stringify(validateActionHeader.errors));
    assert.equal(header.clock, 'virtual');
    assert.equal(header.run_id, 'replay-1');
    assert.equal(header.capture_wall_ms, null);
    assert.equal(header.valid_until_wall_ms, null);
    assert.equal(header.publish_wall_ms, null);
    assert.equal(header.virtual_capture_ms, 500);
    assert.equal(header.virtual_valid_until_ms, 750);
    assert.equal(header.virtual_publish_ms, 600, "an action's publish time is when the stage took it in, on its call's clock");
    const [error] = await receiveTopic(sub, 'events', 1);
    assert.ok(validateMessageHeader(error.header), JSON.stringify(validateMessageHeader.errors));
    assert.deepEqual([error.header.publish_wall_ms, error.header.virtual_publish_ms], [null, 1250.5], "an event's is its atNs");
    const [telemetry] = await receiveTopic(sub, 'telemetry', 1);
    assert.deepEqual([telemetry.header.publish_wall_ms, telemetry.header.virtual_publish_ms], [null, 1600.000001]);
    assert.ok(validateTelemetry(telemetry.body), JSON.stringify(validateTelemetry.errors));
    assert.deepEqual(
      telemetry.body.publisher.telemetry,
      { accepted: 0, sent: null, dropped: 0, queued: null, highWaterMark: 16 },
      'no counter that measures the socket',
    );
  });

  test('on a virtual clock the same messages taken in at any pace publish the same bytes, in the order taken in, the end last', async () => {
    const PROBES = 1000;
    /** One run: PROBES probes, then 30 frames' actions, events and stats, then the end; `stall`
     * keeps the subscriber from reading until the run has closed (the socket backs up: ZeroMQ and
     * the topic queues hold what waits), else it reads as it comes and the feed yields to it. */
    const replay = async (stall: boolean) => {
      const clock = new VirtualClock(1_000_000_000n, 0);
      // Closing waits for the queues to drain (lingerMs): the stalled subscriber reads only from then
      // on, one message per round trip, so on a loaded machine the default 2 s could cut the run short.
      // stallTimeoutMs null: the late reader is a slow subscriber, waited for however long it takes.
      const pub = await open({ clock, runId: 'replay-1', sendHighWaterMark: stall ? 2 : 1000, lingerMs: 60_000, stallTimeoutMs: null });
      const sub = connect(pub, [''], stall ? { receiveHighWaterMark: 2, receiveBufferSize: 4096 } : {});
      await probeExactly(pub, sub, PROBES);
      const fed: string[] = [];
      for (let i = 0; i < 30; i++) {
        const ctx = context(i, clock);
        clock.advance(40_000_000n);
        await pub.stage.process(message(i, ctx), ctx);
        fed.push('actions');
        if (i % 3 === 0) {
          pub.sink.accept({ type: 'drop', atNs: clock.nowNs(), frameId: i, stage: 'decode', reason: 'stale', detail: `frame ${i}` });
          fed.push('events');
        }
        if (i % 5 === 4) {
          pub.sink.accept(stats(clock.nowNs()));
          fed.push('telemetry');
        }
        if (!stall) await new Promise((r) => setImmediate(r));
      }
      const summary = new TelemetryAggregator('virtual').snapshot();
      const closed = pub.close(summary);
      fed.push('events');
      const frames: Buffer[][] = [];
      while (frames.length < fed.length) frames.push(await sub.receive());
      const counters = await closed;
      return { fed, frames, counters };
    };
    const [calm, stalled] = [await replay(false), await replay(true)];
    const bytes = (frames: Buffer[][]) => Buffer.concat(frames.flatMap((f) => [...f, Buffer.from('\n')]));
    assert.ok(stalled.counters.actions!.sent === 30 && stalled.counters.telemetry!.dropped === 0, JSON.stringify(stalled.counters));
    assert.deepEqual(
      calm.frames.map((f) => f[0]!.toString()),
      calm.fed,
      'in the order taken in',
    );
    const end = parse(calm.frames.at(-1)!);
    assert.equal(end.body.type, 'end');
    assert.ok(validateEvent(end.body), JSON.stringify(validateEvent.errors));
    assert.deepEqual(end.body.publisher.actions, { accepted: 30, sent: null, dropped: 0, queued: null, highWaterMark: 1000 });
    assert.equal(end.header.virtual_publish_ms, 1000 + 30 * 40, 'the end goes out at the clock when the run closed');
    assert.equal(bytes(stalled.frames).toString(), bytes(calm.frames).toString(), 'the same bytes');
  });

  test('events and telemetry carry MessageHeaders and schema-valid bodies; only decisions, incidents and stats go out', async () => {
    const pub = await open({ eventsTopic: 'ev', telemetryTopic: 'tm' });
    const sub = connect(pub, ['ev', 'tm']);
    const probes = await probe(pub, sub);
    const events: TelemetryEvent[] = [
      { type: 'frame', atNs: 1n, frameId: 1, sourceId: 'cam', captureNs: 0n, degradeLevel: 0 },
      { type: 'span', atNs: 2n, frameId: 1, stage: 'decode', enterNs: 1n, exitNs: 2n, degradeLevel: 0 },
      { type: 'note', atNs: 3n, frameId: 1, stage: 'decode', message: 'decode' },
      { type: 'output', atNs: 4n, frameId: 1, latencyNs: 4n, late: false },
      {
        type: 'drop',
        atNs: 5n,
        frameId: 2,
        stage: 'source',
        reason: 'rejected',
        detail: 'a.mcap seq 4: corrupt',
        cause: 'corrupt CDR payload',
      },
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
      { type: 'source', atNs: 9n, sourceId: '/cam', kind: 'damaged', detail: 'a.mcap: the chunk at byte 9 was skipped' },
      { type: 'control', atNs: 10n, command: 'pause', detail: '' },
      stats(11n),
    ];
    for (const event of events) pub.sink.accept(event);
    const got = [];
    while (got.length < 7) got.push(parse(await sub.receive()));
    assert.deepEqual(
      got.map((m) => `${m.topic} ${m.body.type}`),
      ['ev drop', 'ev cancel', 'ev degrade', 'ev error', 'ev source', 'ev control', 'tm stats'],
    );
    for (const { topic, header, body } of got) {
      assert.ok(validateMessageHeader(header), JSON.stringify(validateMessageHeader.errors));
      const validate = topic === 'tm' ? validateTelemetry : validateEvent;
      assert.ok(validate(body), `${body.type}: ${JSON.stringify(validate.errors)}`);
      assert.equal((header as MessageHeader).schema_id, `percept/wire/messages/v1#/definitions/${topic === 'tm' ? 'Telemetry' : 'Event'}`);
    }
    // The counters as they were when the stats were taken.
    assert.deepEqual(got.at(-1)!.body.publisher.tm, { accepted: 0, sent: 0, dropped: 0, queued: 0, highWaterMark: 16 });
    assert.deepEqual(
      got.filter((m) => m.topic === 'ev').map((m) => m.header.seq),
      [0, 1, 2, 3, 4, 5].map((i) => probes + i),
      'seq counts per topic',
    );
    assert.equal(got.at(-1)!.header.seq, 0);
  });

  test(
    'a subscriber that stops reading does not cut off one that reads: it gets every action, the stall error and the end',
    { timeout: 120_000 },
    async () => {
      // Without the bound on a stall, the reader receives nothing once the stalled path is full: this test then times out.
      // Small buffers everywhere, so the stalled subscriber's path fills after a few dozen messages:
      // ZeroMQ queues of 5 (publisher) and 1 (subscriber) messages and kernel buffers of 4 KiB
      // (Linux doubles them and enforces a floor; measured below as what went out before the stall).
      const pub = await open({ sendHighWaterMark: 5, sendBufferSize: 4096, stallTimeoutMs: 200, lingerMs: 60_000 });
      const stalled = connect(pub, [''], { receiveHighWaterMark: 1, receiveBufferSize: 4096 });
      const reader = connect(pub, ['']);
      const got: { topic: string; seq: number; body: { type?: string; stage?: string; message?: string } }[] = [];
      let readerDone = false;
      const reading = (async () => {
        while (!readerDone) {
          const m = parse(await reader.receive());
          got.push({ topic: m.topic, seq: m.header.seq, body: m.body });
          if (m.body.type === 'end') readerDone = true;
        }
      })();
      // Both subscribers are joined once a probe has reached each (the stalled one takes exactly one).
      let stalledGot = 0;
      void stalled.receive().then(() => (stalledGot += 1));
      for (let i = 0; i < 500 && (stalledGot === 0 || got.length === 0); i++) {
        pub.sink.accept({ type: 'drop', atNs: 0n, frameId: -1, stage: 'probe', reason: 'stale', detail: 'probe' });
        await new Promise((r) => setTimeout(r, 10));
      }
      assert.ok(stalledGot === 1 && got.length > 0, 'both subscribers joined');
      const actionsGot = () => got.filter((m) => m.topic === 'actions').length;
      // Actions of ~2 KiB, each sent once the reader has the one before the last: the reader is never
      // behind by more than 2 (its own queue never fills), so whatever it misses is the publisher's doing.
      const clock = new VirtualClock(0n, 1_700_000_000_000);
      const padding = 'x'.repeat(2048);
      const AFTER_STALL = 100;
      let sent = 0;
      let sentBeforeStall = -1;
      for (; sent < 20_000; sent++) {
        if (pub.stalls > 0 && sentBeforeStall < 0) sentBeforeStall = sent;
        if (sentBeforeStall >= 0 && sent >= sentBeforeStall + AFTER_STALL) break;
        const ctx = context(sent, clock);
        await pub.stage.process(message(sent, ctx, { action: 'move', confidence: 0.5, padding }), ctx);
        while (actionsGot() < sent - 1) await new Promise((r) => setTimeout(r, 1));
      }
      assert.ok(sentBeforeStall > 0, `the stalled subscriber's buffers never filled in ${sent} actions`);
      // What the stalled path held (ZeroMQ queues and kernel buffers), measured: about this many actions.
      diag(`the stalled subscriber's path filled after ${sentBeforeStall} actions of ~2.5 KiB`);
      const counters = await pub.close(new TelemetryAggregator('real').snapshot());
      await reading;
      const actionSeqs = got.filter((m) => m.topic === 'actions').map((m) => m.seq);
      assert.deepEqual(actionSeqs, [...Array(sent).keys()], `every action, in order, no gap (stall after ${sentBeforeStall} actions)`);
      assert.equal(counters.actions!.sent, sent);
      assert.equal(counters.actions!.dropped, 0);
      const events = got.filter((m) => m.topic === 'events');
      const stall = events.find((m) => m.body.type === 'error' && m.body.stage === 'publish');
      assert.ok(stall, 'the reader is told at once that a subscriber stopped reading');
      assert.ok(validateEvent(stall.body), JSON.stringify(validateEvent.errors));
      assert.match(stall.body.message!, /took nothing for \d+ ms/);
      assert.ok(got.indexOf(stall) < got.length - 1, 'before the end');
      assert.equal(got.at(-1)!.body.type, 'end', 'the end reaches the reader, last');
      assert.equal(pub.stalls, 1, 'one stall: the subscriber never read again');
      // Events seq without a gap either: the probes, the stall error and the end all reached the reader.
      const eventSeqs = events.map((m) => m.seq);
      eventSeqs.forEach((seq, i) => i > 0 && assert.equal(seq, eventSeqs[i - 1]! + 1, 'events without a gap'));
    },
  );

  test('a subscriber that stalls gets every action and sees telemetry losses as seq gaps, counted by the publisher; the graph never waits', async () => {
    // Small ZeroMQ queues so the stalled subscriber backs up quickly; 16 telemetry messages may wait.
    // It reads again only once the run closes: room to drain then, whatever the machine's load.
    // stallTimeoutMs null: a slow subscriber, however long it stalls, is waited for (no-drop).
    const pub = await open({
      sendHighWaterMark: 4,
      highWaterMarks: { actions: 1000, events: 1000, telemetry: 16 },
      lingerMs: 60_000,
      stallTimeoutMs: null,
    });
    const sub = connect(pub, [''], { receiveHighWaterMark: 4, receiveBufferSize: 4096 });
    await probe(pub, sub);
    // The stall: the subscriber reads nothing while the run produces 26 actions among 6,000 stats
    // (one action every ~230 stats, the mix of the run that lost all of its actions before).
    const clock = new VirtualClock(0n, 1_700_000_000_000);
    const actions = 26;
    const statsMessages = 6000;
    let processed = 0;
    for (let i = 0; i < statsMessages; i++) {
      pub.sink.accept(stats(BigInt(i)));
      if (i % Math.floor(statsMessages / actions) === 0 && processed < actions) {
        const ctx = context(processed, clock);
        await pub.stage.process(message(processed, ctx), ctx);
        processed += 1;
      }
      if (i % 50 === 0) await new Promise((r) => setImmediate(r)); // time passes; the socket sends what it can
    }
    assert.equal(processed, actions, 'every process() call returned while the subscriber read nothing');
    const during = pub.stats();
    assert.ok(during.telemetry!.dropped > 0, `the stalled subscriber should have forced telemetry drops: ${JSON.stringify(during)}`);
    assert.equal(during.actions!.dropped, 0);

    // The subscriber reads again; the run ends with its summary.
    const final = pub.close(new TelemetryAggregator('real').snapshot());
    const seen: Record<string, number[]> = { actions: [], telemetry: [], events: [] };
    const errors: string[] = [];
    let end;
    while (!end) {
      const m = parse(await sub.receive());
      seen[m.topic]!.push(m.header.seq);
      if (m.body.type === 'error') errors.push(m.body.message);
      if (m.body.type === 'end') end = m;
    }
    const published = await final;
    assert.deepEqual(seen.actions, [...Array(actions).keys()], 'every action, in order, no gap');
    // The telemetry queue's overflow was said on the events topic when it began, not only in the end's counters.
    assert.ok(
      errors.some((e) => /^the telemetry queue is full \(16 messages\): its oldest are dropped/.test(e)),
      `an overflow error event: ${JSON.stringify(errors)}`,
    );
    const telemetry = seen.telemetry!;
    let gaps = 0;
    telemetry.forEach((seq, i) => {
      const expected = i === 0 ? 0 : telemetry[i - 1]! + 1;
      assert.ok(seq >= expected, 'seq never goes back');
      gaps += seq - expected;
    });
    gaps += statsMessages - 1 - telemetry.at(-1)!; // lost at the end
    assert.equal(gaps, published.telemetry!.dropped, 'the gaps the subscriber sees are what the publisher counted');
    assert.equal(telemetry.length + published.telemetry!.dropped, statsMessages);
    assert.deepEqual(end.body.publisher.actions, { accepted: actions, sent: actions, dropped: 0, queued: 0, highWaterMark: 1000 });
    assert.ok(validateEvent(end.body), JSON.stringify(validateEvent.errors));
  });

  test('the end event is the last message; events after close are counted, not sent; close is idempotent', async () => {
    const pub = await open();
    const sub = connect(pub, ['events']);
    const probes = await probe(pub, sub);
    const summary = new TelemetryAggregator('real').snapshot();
    pub.sink.accept({ type: 'error', atNs: 1n, frameId: -1, stage: 'source', message: 'last words' });
    const closing = pub.close(summary);
    assert.equal(pub.close(), closing, 'one close');
    pub.sink.accept({ type: 'error', atNs: 2n, frameId: -1, stage: 'graph', message: 'too late' });
    pub.sink.accept(stats(3n));
    await assert.rejects(pub.stage.process(message(0, context(0)), context(0)), /publish after close/);
    const got = await receiveTopic(sub, 'events', 2);
    assert.deepEqual(
      got.slice(-2).map((m) => m.body.type),
      ['error', 'end'],
    );
    assert.deepEqual(got.at(-1)!.body.summary, summary);
    assert.equal(pub.sink.undelivered, 2);
    const stats1 = await closing;
    assert.equal(stats1.events!.sent, probes + 2);
  });

  test('what close() has handed to ZeroMQ reaches a subscriber that reads only after it resolves; the address binds again at once', async () => {
    let endpoint = 'tcp://127.0.0.1:*';
    for (let round = 0; round < 10; round++) {
      // Rounds after the first bind the address the last one closed.
      const pub = await open({ endpoint, lingerMs: 30_000 });
      endpoint = pub.endpoint;
      const sub = connect(pub, ['actions', 'events']);
      await probe(pub, sub);
      // Large bodies: what close() hands over fills the socket buffers and waits in ZeroMQ's queues.
      const note = 'x'.repeat(2000);
      for (let i = 0; i < 100; i++) await pub.stage.process(message(i, context(i), { action: 'move', confidence: 0.5, note }), context(i));
      const counters = await pub.close(new TelemetryAggregator('real').snapshot());
      assert.equal(counters.actions!.sent, 100, JSON.stringify(counters));
      const actions: number[] = [];
      for (let m = parse(await sub.receive()); m.body.type !== 'end'; m = parse(await sub.receive())) {
        if (m.topic === 'actions') actions.push(m.header.seq);
      }
      assert.deepEqual(
        actions,
        Array.from({ length: 100 }, (_, i) => i),
        `round ${round}: every action, in order, before the end`,
      );
    }
  });

  test('CURVE: a subscriber with the server key receives, one with a wrong key gets nothing', async () => {
    const dir = join(root, '.cache', 'publisher-test');
    mkdirSync(dir, { recursive: true });
    const { secretKeyFile, publicKeyFile } = writeKeyPair({ out: dir, force: true });
    const server = { publicKey: readFileSync(publicKeyFile, 'utf8').trim() };
    const pub = await open({ curve: { secretKeyFile } });
    const client = curveKeyPair();
    const good = connect(pub, ['events'], {
      curveServerKey: server.publicKey,
      curvePublicKey: client.publicKey,
      curveSecretKey: client.secretKey,
    });
    const wrong = curveKeyPair();
    const bad = connect(pub, ['events'], {
      curveServerKey: wrong.publicKey,
      curvePublicKey: client.publicKey,
      curveSecretKey: client.secretKey,
      receiveTimeout: 500,
    });
    const plain = connect(pub, ['events'], { receiveTimeout: 500 });
    await probe(pub, good);
    await assert.rejects(bad.receive(), (err: Error & { code?: string }) => err.code === 'EAGAIN');
    await assert.rejects(plain.receive(), (err: Error & { code?: string }) => err.code === 'EAGAIN');
  });

  test('refuses a bind other hosts can reach without CURVE, a bad port, a key file that holds no key', async () => {
    await assert.rejects(createPublisher({ ...base, endpoint: 'tcp://*:5556' }), /binds every network interface without encryption/);
    await assert.rejects(createPublisher({ ...base, endpoint: 'tcp://127.0.0.1:99999' }), /port 99999 is out of range/);
    const dir = join(root, '.cache', 'publisher-test');
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'not-a.key'), 'hello');
    await assert.rejects(createPublisher({ ...base, curve: { secretKeyFile: join(dir, 'not-a.key') } }), /not-a\.key is not a CURVE key/);
  });

  test('bind failure names the endpoint; options are validated', async () => {
    const first = await open();
    await assert.rejects(
      createPublisher({ ...base, endpoint: first.endpoint }),
      (err: Error) => err.message.startsWith(`publisher: cannot bind ${first.endpoint}`) && /in use/i.test(err.message),
    );
    await assert.rejects(createPublisher({ ...base, endpoint: 'localhost:5555' }), /is not an endpoint percept accepts/);
    await assert.rejects(createPublisher({ ...base, topic: '' }), /non-empty string for topic/);
    await assert.rejects(createPublisher({ ...base, sendHighWaterMark: 0 }), /integer >= 1 for sendHighWaterMark/);
    await assert.rejects(createPublisher({ ...base, highWaterMarks: { telemetry: 0 } }), /integer >= 1 for highWaterMarks.telemetry/);
  });

  test('10,000 random schema-valid actions round-trip byte-exact', async () => {
    const pub = await open({ highWaterMarks: { actions: 10_000 } });
    const sub = connect(pub, ['actions', 'events'], { receiveHighWaterMark: 0 });
    await probe(pub, sub);
    const random = seeded(7);
    const sent = Array.from({ length: 10_000 }, () => randomAction(random));
    const ctx = context(0);
    for (const [i, action] of sent.entries()) {
      assert.ok(schema.validate(action), JSON.stringify(schema.validate.errors));
      await pub.stage.process(message(i, ctx, action), ctx);
    }
    for (let i = 0; i < sent.length; i++) {
      const frames = await sub.receive();
      assert.equal(frames[0]!.toString(), 'actions');
      assert.equal(JSON.parse(frames[1]!.toString()).seq, i);
      assert.equal(frames[2]!.toString(), JSON.stringify(sent[i]), `action ${i}`);
      assert.deepEqual(JSON.parse(frames[2]!.toString()), sent[i]);
    }
  });

  test('benchPublish runs end to end and accounts for every message (numbers are not asserted)', async () => {
    const r = await benchPublish({ messages: 300, latencySamples: 20, size: 200 });
    assert.equal(r.messages, 300);
    assert.equal(r.received + r.dropped, 300);
    assert.equal(r.dropped, 0, 'the bench HWM is large enough for nothing to drop');
    assert.equal(r.peer_received, 300);
    assert.ok(r.body_bytes >= 200 && r.body_bytes < 210, `body ${r.body_bytes} B`);
    assert.ok(r.msgs_per_s > 0 && Number.isFinite(r.msgs_per_s));
    assert.ok(r.p50_us > 0 && r.p50_us <= r.p99_us && r.p99_us <= r.max_us);
    // The bare zeromq peer went through the same harness, with a header the size of the stage's.
    assert.ok(r.peer_msgs_per_s > 0 && Number.isFinite(r.peer_msgs_per_s));
    assert.ok(r.peer_p50_us > 0 && r.peer_p50_us <= r.peer_p99_us && r.peer_p99_us <= r.peer_max_us);
    assert.ok(r.header_bytes > 200 && r.header_bytes < 1000, `header ${r.header_bytes} B`);
    assert.match(r.transport, /^tcp:\/\/127\.0\.0\.1:\d+$/);
    assert.match(r.subscriber, /^zeromq\.js \d+\.\d+\.\d+$/);
  });

  test(
    'benchPublish with pyzmq as the subscriber: every message of the stage and of the peer arrives',
    { skip: pyzmqMissing() },
    async () => {
      const r = await benchPublish({ messages: 300, latencySamples: 20, size: 200, subscriber: 'pyzmq' });
      assert.match(r.subscriber, /^pyzmq \d+(\.\d+)* \(libzmq \d+\.\d+\.\d+\)$/);
      assert.equal(r.messages, 300);
      assert.equal(r.received, 300);
      assert.equal(r.dropped, 0);
      assert.ok(r.msgs_per_s > 0 && Number.isFinite(r.msgs_per_s));
      assert.ok(r.send_msgs_per_s > 0 && Number.isFinite(r.send_msgs_per_s));
      assert.ok(r.p50_us > 0 && r.p50_us <= r.p99_us && r.p99_us <= r.max_us);
      assert.ok(r.loaded_p50_us > 0 && r.loaded_p50_us <= r.loaded_p99_us);
      assert.ok(r.peer_msgs_per_s > 0 && Number.isFinite(r.peer_msgs_per_s));
      assert.ok(r.peer_p50_us > 0 && r.peer_p50_us <= r.peer_p99_us && r.peer_p99_us <= r.peer_max_us);
      assert.ok(r.body_bytes >= 200 && r.body_bytes < 210, `body ${r.body_bytes} B`);
    },
  );

  test('benchPublish refuses an unknown subscriber', async () => {
    await assert.rejects(
      benchPublish({ messages: 1, subscriber: 'zmqpp' as 'pyzmq' }),
      /expected subscriber zeromq or pyzmq but received zmqpp/,
    );
  });
});

/** The reason to skip when no Python with pyzmq is there (.ci/run installs Debian's python3-zmq). */
function pyzmqMissing(): string | false {
  try {
    execFileSync(PYTHON, ['-c', 'import zmq'], { stdio: 'ignore' });
    return false;
  } catch {
    return `${PYTHON} cannot import zmq`;
  }
}

/** mulberry32: a small seeded generator, so a failure can be reproduced. */
function seeded(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A random action within configs/actions/robot-action.schema.json: every optional field sometimes. */
function randomAction(random: () => number): Record<string, unknown> {
  const pick = <T>(values: readonly T[]): T => values[Math.floor(random() * values.length)]!;
  const action: Record<string, unknown> = { action: pick(['stop', 'move', 'turn', 'grasp', 'release', 'wait']), confidence: random() };
  if (random() < 0.5) action.speed = random() * 2;
  if (random() < 0.5) action.heading_deg = Math.floor(random() * 361) - 180;
  if (random() < 0.5) {
    const target: Record<string, unknown> = { label: pick(['person', 'cup', 'box', 'door', 'obstacle', 'none']) };
    if (random() < 0.5) target.bbox = [random(), random(), random(), random()];
    action.target = target;
  }
  if (random() < 0.5)
    action.hazards = Array.from({ length: Math.floor(random() * 4) }, () => pick(['person_close', 'edge', 'wet_floor', 'low_light']));
  return action;
}
