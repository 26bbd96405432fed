// End to end: `percept run` as a user runs it (the `percept` bin in a child process, started from
// another directory than the repository, the real stages on the tiny synthetic models) publishes
// schema-valid actions that a ZeroMQ subscriber receives, and its JSON summary accounts for every frame.
// The Python subscriber (client/python) is a second, non-JS peer: it validates every action with the
// same schemas and gets the run's final summary as the last event.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Subscriber } from 'zeromq';
import { loadActionSchema } from '../../nodes/action-schema.ts';
import { startPythonSubscriber } from '../support/python-peer.ts';
import { freePort } from '../support/fixtures.ts';

const root = new URL('../..', import.meta.url).pathname;
const dir = join(root, '.cache', 'e2e');

/** A loopback port that was free a moment ago. */
test('percept run on the tiny models publishes schema-valid actions and accounts for every frame', { timeout: 600_000 }, async () => {
  mkdirSync(dir, { recursive: true });
  const port = await freePort();
  const endpoint = `tcp://127.0.0.1:${port}`;
  const frames = 3;
  const config = {
    source: { kind: 'pattern', fps: 2, frames, width: 640, height: 360 },
    encoder: { kind: 'onnx', model: 'synth:gemma4-vision-tiny' },
    decoder: { model: 'synth:gemma4-tiny', maxNewTokens: 128, nCtx: 2048 },
    // Relative to this config file, wherever the run starts.
    actions: { schema: '../../configs/actions/robot-action.schema.json' },
    publisher: { endpoint, topic: 'actions' },
    // No stage budgets and the longest frame budget the schema allows (longer than the test's own
    // timeout), with a queue edge: this test is about wiring, not about this machine's speed or load.
    budgets: { endToEndMs: 3_600_000, stages: {}, dropPredictedMiss: false },
    edges: { default: { policy: 'queue', capacity: frames } },
    ladder: { enabled: false, initial: { imageTokens: 70, maxNewTokens: 128, draft: true, frameSkip: 0 }, rungs: [] },
    telemetry: { liveTable: 'off' },
  };
  const configPath = join(dir, 'config.json');
  const summaryPath = join(dir, 'summary.json');
  writeFileSync(configPath, JSON.stringify(config));

  const schema = loadActionSchema(join(root, 'configs/actions/robot-action.schema.json'));
  const sub = new Subscriber({ linger: 0, receiveTimeout: 300_000 });
  sub.connect(endpoint);
  sub.subscribe('actions');
  const received: Array<{ header: { schema_id: string; frame_id: number; seq: number }; body: unknown }> = [];
  const python = await startPythonSubscriber(['--connect', endpoint, '--topic', 'actions', '--topic', 'events', '--until-end']);

  const child = spawn(
    process.execPath,
    [join(root, 'tools/percept.mjs'), 'run', '--config', 'config.json', '--json-summary', 'summary.json'],
    {
      cwd: dir,
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let output = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
  const exited = new Promise<number | null>((resolve) => child.on('exit', resolve));

  const receiving = (async () => {
    for (;;) {
      const [topic, header, body] = await sub.receive();
      assert.equal(topic!.toString(), 'actions');
      received.push({ header: JSON.parse(header!.toString()), body: JSON.parse(body!.toString()) });
    }
  })().catch(() => undefined); // ends when the socket closes

  const code = await exited;
  assert.equal(code, 0, `percept run failed:\n${output}`);
  const summary = JSON.parse(readFileSync(summaryPath, 'utf8'));
  // The publisher lingers on close, so every published action reaches us; wait for them (bounded),
  // then close the socket, which ends the receive loop.
  for (let waited = 0; received.length < summary.frames.out && waited < 10_000; waited += 20) await new Promise((r) => setTimeout(r, 20));
  sub.close();
  await receiving;

  assert.equal(summary.frames.in, frames, output);
  assert.equal(summary.frames.in, summary.frames.out + summary.frames.dropped, 'every frame is an output or a counted drop');
  const invalid = summary.drops.byReason.invalid ?? 0;
  assert.equal(summary.frames.out + invalid, frames, `only schema failures may drop frames here: ${JSON.stringify(summary.drops)}`);
  assert.ok(summary.frames.out >= 1, `no action came out: ${JSON.stringify(summary.drops)}\n${output}`);
  assert.equal(received.length, summary.frames.out, 'the subscriber received every published action');
  for (const { header, body } of received) {
    assert.equal(header.schema_id, schema.wireSchemaId);
    assert.ok(schema.validate(body), `received action fails the schema: ${JSON.stringify(body)}`);
  }
  assert.deepEqual(
    received.map((m) => m.header.seq),
    received.map((_, i) => i),
    'sequence numbers have no gaps',
  );

  // The Python peer: every action, valid, no gap; the events end with the summary of this run.
  const fromPython: Record<string, unknown>[] = [];
  for (let m = await python.next(); !('counts' in m); m = await python.next()) fromPython.push(m);
  for (const m of fromPython) assert.equal(m.valid, true, `python: ${m.topic} #${m.seq}: ${m.error}`);
  const pyActions = fromPython.filter((m) => m.topic === 'actions');
  assert.deepEqual(
    pyActions.map((m) => [m.seq, m.lost]),
    received.map((_, i) => [i, 0]),
    'python received every action',
  );
  assert.deepEqual(
    pyActions.map((m) => m.body),
    received.map((m) => m.body),
  );
  const end = fromPython.at(-1)!.body as {
    type: string;
    summary: { frames: unknown };
    publisher: Record<string, { sent: number; dropped: number }>;
  };
  assert.equal(end.type, 'end');
  assert.deepEqual(end.summary.frames, summary.frames);
  assert.deepEqual([end.publisher.actions!.sent, end.publisher.actions!.dropped], [summary.frames.out, 0]);
});
