// percept/client: the package export resolves; actions arrive typed and validated, with seq gaps
// counted, stale ones flagged (and virtual-clock ones never judged by wall time); what fails its
// schema is yielded as invalid; `percept echo` prints the same; the generated types match the schemas.
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { cpSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Publisher as PubSocket } from 'zeromq';
import { subscribe, type Message, type RobotAction, type Subscription } from 'percept/client';
import { createPublisher, type Publisher } from '../../nodes/publisher.ts';
import { VirtualClock, type Clock } from '../../pipeline/clock.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';
import type { DropReason, StageContext } from '../../pipeline/types.ts';
import type { CancelEvent, ControlEvent, DegradeEvent, RunSummary, SourceEvent } from '../../pipeline/telemetry/events.ts';
import type * as Wire from '../../client/wire-types.ts';

const root = new URL('../..', import.meta.url).pathname;

// Compile-time: the action type is the schema's (an action outside its enum does not type-check).
const typed: RobotAction = { action: 'move', confidence: 0.9, target: { label: 'door', bbox: [0, 0, 1, 1] } };
// @ts-expect-error 'fly' is not an action of configs/actions/robot-action.schema.json
const wrong: RobotAction = { action: 'fly', confidence: 1 };
void wrong;

// Compile-time: the runtime's event vocabularies are the wire schema's (a drop reason, cancel
// reason, source incident or control command added on one side only fails the type check here:
// add it to configs/wire/messages.schema.json and run `npm run gen:types`).
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
const vocabularies: [
  Same<DropReason, Wire.DropReason>,
  Same<CancelEvent['reason'], Wire.CancelEvent['reason']>,
  Same<SourceEvent['kind'], Wire.SourceEvent['kind']>,
  Same<ControlEvent['command'], Wire.ControlEvent['command']>,
  Same<DegradeEvent['reason'], Wire.DegradeEvent['reason']>,
  Same<keyof RunSummary, keyof Wire.RunSummary>,
] = [true, true, true, true, true, true];
void vocabularies;

function context(frameId: number, clock: Clock, budgetMs = 250): StageContext {
  const captureNs = clock.nowNs();
  return standaloneContext({
    clock,
    frame: { frameId, sourceId: 'cam', captureNs, captureWallMs: clock.wallMs(), degradeLevel: 0 },
    deadlineNs: captureNs + BigInt(budgetMs * 1e6),
  });
}

async function publish(pub: Publisher, frameId: number, clock: Clock, action: unknown = typed, budgetMs = 250): Promise<void> {
  const ctx = context(frameId, clock, budgetMs);
  await pub.stage.process(
    { schemaId: 'percept/robot-action/v1', frameId, sourceId: 'cam', captureWallMs: ctx.frame.captureWallMs, action },
    ctx,
  );
}

/** The next message, failing the test instead of hanging. */
async function nextOf(it: AsyncIterator<Message>): Promise<Message> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error('no message within 10 s')), 10_000)));
  try {
    const r = await Promise.race([it.next(), timeout]);
    assert.ok(!r.done, 'the subscription ended');
    return r.value;
  } finally {
    clearTimeout(timer);
  }
}

/** Slow joiner: publishes `send()` until a message arrives; returns it. */
async function firstOf(it: AsyncIterator<Message>, send: () => Promise<void>): Promise<Message> {
  const arrival = nextOf(it);
  let arrived = false;
  void arrival.then(() => (arrived = true)).catch(() => undefined);
  for (let i = 0; i < 500 && !arrived; i++) {
    await send();
    await new Promise((r) => setTimeout(r, 10));
  }
  return arrival;
}

/** Real-clock wall time that is `agoMs` in the past, as a clock for one frame. */
const realClockAt = (agoMs: number): Clock => ({
  virtual: false,
  nowNs: () => process.hrtime.bigint(),
  wallMs: () => Date.now() - agoMs,
  unixNs: (ns) => BigInt(Date.now() - agoMs) * 1_000_000n + ns - process.hrtime.bigint(),
});

describe('percept/client', () => {
  const closers: Array<() => unknown> = [];
  after(async () => {
    for (const c of closers) await c();
  });

  test('actions arrive typed and validated; seq gaps are counted; stale ones flagged', async () => {
    const pub = await createPublisher({
      endpoint: 'tcp://127.0.0.1:*',
      topic: 'actions',
      sendHighWaterMark: 1000,
      highWaterMarks: { actions: 3 },
    });
    closers.push(() => pub.close());
    const sub: Subscription = subscribe({ connect: pub.endpoint, topics: ['actions'] });
    closers.push(() => sub.close());
    const it = sub[Symbol.asyncIterator]();
    const fresh = realClockAt(0);
    const first = await firstOf(it, () => publish(pub, 0, fresh));
    assert.equal(first.type, 'action');
    // Drain the probes.
    let seq = first.type === 'action' ? first.header.seq : -1;
    const probes = pub.stats().actions!.accepted;
    while (seq < probes - 1) {
      const m = await nextOf(it);
      seq = m.type === 'action' ? m.header.seq : seq;
    }
    // A burst of 10 into a queue of 3: the first goes straight to the socket, of the other 9 the
    // 6 oldest are dropped; the subscriber sees the gap.
    for (let i = 1; i <= 10; i++) void publish(pub, i, fresh);
    const burst = [await nextOf(it), await nextOf(it), await nextOf(it), await nextOf(it)];
    assert.deepEqual(
      burst.map((m) => (m.type === 'action' ? [m.header.frame_id, m.lost] : m.type)),
      [
        [1, 0],
        [8, 6],
        [9, 0],
        [10, 0],
      ],
    );
    assert.equal(pub.stats().actions!.dropped, 6);
    assert.equal(sub.counts.actions!.lost, 6);
    // A frame captured 1 s ago with a 250 ms budget is stale on arrival; its action is still delivered.
    await publish(pub, 11, realClockAt(1000));
    await publish(pub, 12, fresh, typed, 60_000);
    const [old, young] = [await nextOf(it), await nextOf(it)];
    assert.ok(old.type === 'action' && young.type === 'action');
    assert.equal(old.stale, true);
    assert.ok(old.ageMs! >= 1000);
    assert.equal(young.stale, false);
    const action: RobotAction = young.action; // typed from the schema
    assert.deepEqual(action, typed);
    assert.equal(sub.counts.actions!.stale, 1);
  });

  test('a virtual-clock action is never judged by wall time', async () => {
    const pub = await createPublisher({
      endpoint: 'tcp://127.0.0.1:*',
      topic: 'actions',
      sendHighWaterMark: 1000,
      clock: new VirtualClock(),
      runId: 'replay-1',
    });
    closers.push(() => pub.close());
    const sub = subscribe({ connect: pub.endpoint });
    closers.push(() => sub.close());
    const m = await firstOf(sub[Symbol.asyncIterator](), () => publish(pub, 0, new VirtualClock(500_000_000n, 0)));
    assert.ok(m.type === 'action');
    assert.equal(m.stale, null);
    assert.equal(m.ageMs, null);
    assert.equal(m.header.virtual_capture_ms, 500);
  });

  test('messages that fail the schemas are yielded as invalid and counted, never as actions', async () => {
    const raw = new PubSocket({ linger: 0 });
    closers.push(() => raw.close());
    await raw.bind('tcp://127.0.0.1:*');
    const sub = subscribe({ connect: raw.lastEndpoint!, topics: ['actions'] });
    closers.push(() => sub.close());
    const header = {
      header_version: 1,
      schema_id: 'percept/robot-action/v1',
      run_id: 'r',
      seq: 0,
      clock: 'real',
      publish_wall_ms: 1,
      virtual_publish_ms: null,
      frame_id: 0,
      source_id: 'cam',
      source_stamp: null,
      capture_wall_ms: 1,
      valid_until_wall_ms: 2,
      virtual_capture_ms: null,
      virtual_valid_until_ms: null,
      degrade_level: 0,
      models: {},
    };
    const it = sub[Symbol.asyncIterator]();
    const first = await firstOf(it, () => raw.send(['actions', JSON.stringify(header), JSON.stringify({ action: 'fly', confidence: 1 })]));
    assert.ok(first.type === 'invalid');
    assert.match(first.reason, /^action: \/action must be equal to one of the allowed values/);
    await raw.send(['actions', JSON.stringify({ ...header, header_version: 2 }), JSON.stringify(typed)]);
    const second = await nextOf(it);
    assert.ok(
      second.type === 'invalid' && /^header: \/header_version must be equal to constant/.test(second.reason),
      JSON.stringify(second),
    );
    await raw.send(['actions', JSON.stringify({ ...header, schema_id: 'other/v1' }), JSON.stringify(typed)]);
    const third = await nextOf(it);
    assert.ok(
      third.type === 'invalid' && /schema_id other\/v1 is not the action schema's \$id percept\/robot-action\/v1/.test(third.reason),
    );
    assert.ok(sub.counts.actions!.invalid >= 3);
  });

  test('percept echo --json prints {header, body} per message; text mode shows age and staleness', async () => {
    const pub = await createPublisher({ endpoint: 'tcp://127.0.0.1:*', topic: 'actions', sendHighWaterMark: 1000 });
    closers.push(() => pub.close());
    const run = (args: string[]) => {
      const child = spawn(process.execPath, [join(root, 'tools/percept.mjs'), 'echo', '--connect', pub.endpoint, ...args], {
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d) => (stdout += d));
      child.stderr.on('data', (d) => (stderr += d));
      const done = new Promise<number | null>((resolve) => child.on('exit', resolve));
      return { done, output: () => ({ stdout, stderr }) };
    };
    const json = run(['--json', '--count', '3']);
    const text = run(['--count', '3']);
    let code: (number | null)[] | undefined;
    void Promise.all([json.done, text.done]).then((c) => (code = c));
    const fresh = realClockAt(0);
    for (let i = 0; i < 1000 && !code; i++) {
      await publish(pub, i, i % 2 ? realClockAt(1000) : fresh);
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.deepEqual(code, [0, 0], JSON.stringify([json.output(), text.output()]));
    const lines = json.output().stdout.trim().split('\n');
    assert.equal(lines.length, 3);
    for (const line of lines) {
      const { header, body } = JSON.parse(line);
      assert.equal(header.schema_id, 'percept/robot-action/v1');
      assert.deepEqual(body, typed);
    }
    const textLines = text.output().stdout.trim().split('\n');
    assert.equal(textLines.length, 3);
    assert.match(textLines.join('\n'), /^actions #\d+ run [0-9a-f]{8} frame \d+ cam level 0 age \d+\.\d ms( STALE)? \{"action":"move"/m);
    assert.ok(textLines.some((l) => l.includes(' STALE ')) && textLines.some((l) => !l.includes(' STALE ')), textLines.join('\n'));
    assert.match(text.output().stderr, /percept echo: actions 3 \(lost 0, invalid 0, stale \d\)/);
  });

  test('client/wire-types.ts is what the schemas give, and the check fails when a schema drifts', () => {
    const check = spawnSync(process.execPath, [join(root, 'tools/gen-wire-types.mjs'), '--check'], { encoding: 'utf8' });
    assert.equal(check.status, 0, check.stderr);
    const copy = join(root, '.cache', 'client-drift');
    rmSync(copy, { recursive: true, force: true });
    for (const path of ['configs/wire', 'configs/actions', 'client/wire-types.ts', '.prettierrc.json'])
      cpSync(join(root, path), join(copy, path), { recursive: true });
    const file = join(copy, 'configs/actions/robot-action.schema.json');
    writeFileSync(file, readFileSync(file, 'utf8').replace('"grasp", ', '"grasp", "push", '));
    const drifted = spawnSync(process.execPath, [join(root, 'tools/gen-wire-types.mjs'), '--check', '--root', copy], { encoding: 'utf8' });
    assert.equal(drifted.status, 1);
    assert.match(drifted.stderr, /client\/wire-types\.ts does not match the wire schemas: run `npm run gen:types`/);
  });
});
