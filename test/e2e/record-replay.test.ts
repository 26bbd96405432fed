// `percept run` as a user runs it (the bin in a child process, the real stages on the tiny synthetic
// decoder with the projection encoder): lockstep replays are byte-identical, a recording survives
// kill -9 and percept replays it, a recorder path that cannot be created fails at start, and a run
// that publishes nothing exits non-zero saying why.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Subscriber } from 'zeromq';
import { CompressedImage } from '@foxglove/schemas/jsonschema.js';
import { createBagSource } from '../../nodes/source-bag.ts';
import { isRejection, type SourceIncident } from '../../pipeline/types.ts';
import { VirtualClock } from '../../pipeline/clock.ts';
import { makeSampleBag } from '../../tools/make-sample-bag.ts';
import { readRecording } from '../../app/eval/eval.ts';
import { json, readSummary, writeBag } from '../support/bag-fixtures.ts';
import { freePort } from '../support/fixtures.ts';

const root = new URL('../..', import.meta.url).pathname;
const dir = join(root, '.cache', 'test-record-replay-cli');
const bin = join(root, 'tools/percept.mjs');

/** A config for the tiny decoder and the projection encoder; no deadline can expire on a loaded machine. */
function config(endpoint: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    encoder: { kind: 'projection', seed: 1, tokens: 16 },
    decoder: { model: 'synth:gemma4-tiny', nCtx: 2048 },
    actions: { schema: join(root, 'configs/actions/robot-action.schema.json') },
    publisher: { endpoint, topic: 'actions' },
    budgets: { endToEndMs: 3_600_000, stages: {}, dropPredictedMiss: false },
    edges: { default: { policy: 'latest' } },
    ladder: { enabled: false, initial: { imageTokens: 70, maxNewTokens: 128, draft: true, frameSkip: 0 }, rungs: [] },
    virtualServiceMs: { preprocess: 4, encode: 20, decode: 90, actions: 1, publish: 1 },
    telemetry: { liveTable: 'off', intervalMs: 200 },
    ...extra,
  };
}

interface Child {
  readonly child: ChildProcess;
  readonly exited: Promise<number | null>;
  output(): string;
}

function percept(args: string[], configObject: Record<string, unknown>, name: string): Child {
  const configPath = join(dir, `${name}.json`);
  writeFileSync(configPath, JSON.stringify(configObject));
  const child = spawn(process.execPath, [bin, 'run', '--config', configPath, ...args], { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout!.on('data', (d) => (output += d));
  child.stderr!.on('data', (d) => (output += d));
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code, signal) => resolve(code ?? (signal ? -1 : null))));
  return { child, exited, output: () => output };
}

/** Everything a subscriber receives on every topic, as [topic, header, body] byte strings. */
function subscribeAll(endpoint: string): { messages: Buffer[][]; close: () => Promise<void> } {
  const sub = new Subscriber({ linger: 0 });
  sub.connect(endpoint);
  sub.subscribe();
  const messages: Buffer[][] = [];
  const loop = (async () => {
    for await (const frames of sub) messages.push(frames);
  })().catch(() => undefined);
  return {
    messages,
    close: async () => {
      sub.close();
      await loop;
    },
  };
}

before(() => {
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
});
after(() => rmSync(join(dir, 'big'), { recursive: true, force: true }));

describe('percept run: replay and record', { timeout: 600_000 }, () => {
  test('two lockstep replays of a bag publish the same stream and write the same MCAP, byte for byte', async () => {
    const bag = join(dir, 'six.mcap');
    await makeSampleBag(bag, { frames: 6 });
    // The same config for both (the endpoint is part of the config the recording holds).
    const endpoint = `tcp://127.0.0.1:${await freePort()}`;
    const runOnce = async (name: string) => {
      const sub = subscribeAll(endpoint);
      const out = join(dir, `${name}.mcap`);
      try {
        const run = percept(['--source', `bag:${bag}`, '--lockstep', '--record', out], config(endpoint), name);
        const code = await run.exited;
        assert.equal(code, 0, run.output());
        // The publisher lingers on close, so what it sent arrives; wait until the stream stops growing.
        for (let seen = -1; sub.messages.length !== seen;) {
          seen = sub.messages.length;
          await new Promise((r) => setTimeout(r, 300));
        }
        return { published: sub.messages, mcap: readFileSync(out), output: run.output() };
      } finally {
        await sub.close();
      }
    };
    const a = await runOnce('lockstep-a');
    const b = await runOnce('lockstep-b');
    // Every frame of every message, each with its length, in the order received.
    const stream = (messages: Buffer[][]) => {
      const hash = createHash('sha256');
      for (const frames of messages) for (const frame of frames) hash.update(`${frame.length}:`).update(frame);
      return hash.digest('hex');
    };
    const hash = (data: Buffer) => createHash('sha256').update(data).digest('hex');
    assert.ok(a.published.length >= 6, `published ${a.published.length} messages:\n${a.output}`);
    assert.ok(a.output.includes(`recorded the run to ${join(dir, 'lockstep-a.mcap')}`), `where the recording went:\n${a.output}`);
    assert.equal(stream(a.published), stream(b.published), 'the published stream');
    assert.equal(hash(a.mcap), hash(b.mcap), 'the recorded MCAP');
    // What makes that possible: nothing measured in it. One run id, derived from the replay (the
    // recording holds the same); virtual times only; no counter of the socket's pace.
    const headers = a.published.map(([, header]) => JSON.parse(header!.toString()) as Record<string, unknown>);
    const runIds = new Set(headers.map((h) => h.run_id));
    assert.equal(runIds.size, 1);
    const [runId] = runIds;
    assert.match(String(runId), /^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    for (const h of headers) {
      assert.equal(h.clock, 'virtual');
      assert.equal(h.publish_wall_ms, null);
      assert.equal(typeof h.virtual_publish_ms, 'number');
    }
    const end = JSON.parse(a.published.at(-1)![2]!.toString()) as { type: string; publisher: Record<string, { sent: unknown }> };
    assert.equal(end.type, 'end', 'the end summary comes last');
    assert.deepEqual(
      Object.values(end.publisher).map((c) => c.sent),
      [null, null, null],
    );
    assert.equal((await readRecording(join(dir, 'lockstep-a.mcap'))).metadata.run_id, runId, "the recording names the stream's run");
    // The recording holds the frames, the actions and the run's metadata, on the bag's time line.
    const summary = await readSummary(join(dir, 'lockstep-a.mcap'));
    const topics = new Map([...summary.channelsById.values()].map((c) => [c.id, c.topic]));
    const counts: Record<string, number> = {};
    for (const [id, n] of summary.statistics!.channelMessageCounts) counts[topics.get(id)!] = (counts[topics.get(id)!] ?? 0) + Number(n);
    assert.equal(counts['/frames'], 6);
    assert.ok((counts['/actions'] ?? 0) + 0 >= 1, JSON.stringify(counts));
    assert.ok(summary.statistics!.messageStartTime >= 1_700_000_000_000_000_000n, 'log times are Unix ns (the bag’s)');
    assert.deepEqual(
      summary.metadataIndexes.map((m) => m.name),
      ['percept.run'],
    );
  });

  test('kill -9 of a recording run loses at most about a second, and percept replays its own crashed recording', async () => {
    const endpoint = `tcp://127.0.0.1:${await freePort()}`;
    const out = join(dir, 'killed.mcap');
    const fps = 10;
    // Stats come on the telemetry topic ([topic, header, body]) every 200 ms: they say how many frames the run has taken in.
    const sub = new Subscriber({ linger: 0 });
    sub.connect(endpoint);
    sub.subscribe('telemetry');
    const run = percept(
      ['--record', out],
      config(endpoint, { source: { kind: 'pattern', fps, frames: 0, width: 320, height: 240 }, clock: 'real' }),
      'killed',
    );
    let framesIn = 0;
    let killed = false;
    // A run that ends by itself (it should not) ends the wait too.
    void run.exited.then(() => killed || sub.close());
    try {
      for await (const [, , body] of sub) {
        framesIn = (JSON.parse(body!.toString()) as { summary: { frames: { in: number } } }).summary.frames.in;
        if (framesIn >= 25) break;
      }
    } catch (err) {
      assert.fail(`the run ended before it was killed (${(err as Error).message}):\n${run.output()}`);
    } finally {
      killed = run.child.kill('SIGKILL');
      if (!sub.closed) sub.close();
    }
    assert.equal(await run.exited, -1, 'killed');

    const incidents: SourceIncident[] = [];
    const source = await createBagSource({ path: out, topic: '/frames' });
    const items = [];
    for await (const item of source.frames(new VirtualClock(), new AbortController().signal, (i) => incidents.push(i))) items.push(item);
    await source.close();
    assert.equal(source.mode, 'streamed');
    assert.ok(items.every((it) => !isRejection(it)));
    // Frames that were in more than a second (+ one frame) before the stats we saw are on disk.
    assert.ok(items.length >= framesIn - fps - 1, `recorded ${items.length} of the ${framesIn} frames taken in before the kill`);
    assert.ok(
      incidents.some((i) => i.kind === 'damaged' && /the file ends/.test(i.detail)),
      incidents.map((i) => i.detail).join('\n'),
    );
  });

  test('a recorder path that cannot be created fails at start, before any model loads, and exits non-zero', async () => {
    writeFileSync(join(dir, 'a-file'), 'x');
    for (const [name, path] of [
      ['record-dir', dir],
      ['record-under-file', join(dir, 'a-file', 'run.mcap')],
    ]) {
      const run = percept(['--record', path!, '--source', 'pattern:10:3'], config('tcp://127.0.0.1:*'), name!);
      const code = await run.exited;
      assert.equal(code, 1, run.output());
      assert.match(run.output(), /percept: recorder: cannot create/);
      assert.doesNotMatch(run.output(), /decoder:|publishing/, 'nothing was loaded or bound');
    }
  });

  test('a run that publishes nothing exits 1 with the reason', async () => {
    const bag = join(dir, 'all-bad.mcap');
    await writeBag(bag, async (w) => {
      const s = await w.registerSchema({ name: 'foxglove.CompressedImage', encoding: 'jsonschema', data: json(CompressedImage) });
      const c = await w.registerChannel({ topic: '/cam', schemaId: s, messageEncoding: 'json', metadata: new Map() });
      for (let i = 0; i < 3; i++) {
        const data = json({
          timestamp: { sec: i, nsec: 0 },
          frame_id: 'f',
          format: 'jpeg',
          data: Buffer.from('not an image').toString('base64'),
        });
        await w.addMessage({ channelId: c, sequence: i, logTime: BigInt(i) * 100_000_000n, publishTime: 0n, data });
      }
    });
    const run = percept(['--source', `bag:${bag}`, '--lockstep', '--json-summary', 'all-bad.json'], config('tcp://127.0.0.1:*'), 'all-bad');
    assert.equal(await run.exited, 1, run.output());
    assert.match(run.output(), /percept: nothing was published: all 3 frames were dropped \(rejected 3\)/);
    assert.match(run.output(), /drops by cause:\n +3 +source: not a JPEG or PNG image/);
    const summary = JSON.parse(readFileSync(join(dir, 'all-bad.json'), 'utf8'));
    assert.deepEqual(summary.drops.causes, { 'source: not a JPEG or PNG image': 3 });
    assert.deepEqual(summary.drops.byReason, { rejected: 3 });
  });
});
