// Replays through the graph: frames the source rejects are counted (frames in = out + drops, with
// their causes in the summaries), the source's report reaches the summary, every frame carries its
// input's stamp, and lockstep processes every frame on the virtual clock, the same way every time.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CompressedImage } from '@foxglove/schemas/jsonschema.js';
import { createBagSource } from '../../nodes/source-bag.ts';
import { createFolderSource } from '../../nodes/source-folder.ts';
import { encodePatternFrame } from '../../nodes/source-pattern.ts';
import type { CameraFrame } from '../../nodes/payloads.ts';
import { msToNs } from '../../pipeline/clock.ts';
import { chain } from '../../pipeline/graph/chain.ts';
import { formatSummary } from '../../pipeline/telemetry/report.ts';
import type { Envelope } from '../../pipeline/types.ts';
import { json, writeBag } from '../support/bag-fixtures.ts';
import {
  assertConservation,
  dropsOf,
  fakeSource,
  fakeStage,
  framesOf,
  runGraph,
  testConfig,
  transcript,
} from '../support/pipeline-fakes.ts';

const root = new URL('../..', import.meta.url).pathname;
const cache = join(root, '.cache/test-replay');
mkdirSync(cache, { recursive: true });
const MS = 1_000_000n;
const T0 = 1_700_000_000_000_000_000n;

describe('source rejections through the graph', () => {
  test('a bag with bad messages: frames in = out + drops counts them, with causes in the console and JSON summaries', async () => {
    const path = join(cache, 'bad-messages.mcap');
    const jpeg = await encodePatternFrame(1, 64, 64);
    await writeBag(path, async (w) => {
      const s = await w.registerSchema({ name: 'foxglove.CompressedImage', encoding: 'jsonschema', data: json(CompressedImage) });
      const c = await w.registerChannel({ topic: '/cam', schemaId: s, messageEncoding: 'json', metadata: new Map() });
      const bodies = [
        { format: 'jpeg', data: jpeg.toString('base64') },
        { format: 'jpeg', data: Buffer.from('GIF89a').toString('base64') },
        { format: 'jpeg', data: jpeg.toString('base64') },
        { format: 'jpeg', data: 'not base64!' },
        { format: 'jpeg', data: Buffer.from('GIF89a..').toString('base64') },
        { format: 'jpeg', data: jpeg.toString('base64') },
      ];
      for (const [i, body] of bodies.entries()) {
        const t = T0 + BigInt(i) * 100n * MS;
        await w.addMessage({
          channelId: c,
          sequence: i,
          logTime: t,
          publishTime: t,
          data: json({ timestamp: { sec: 0, nsec: 0 }, frame_id: 'f', ...body }),
        });
      }
    });
    const source = await createBagSource({ path });
    const seen: CameraFrame[] = [];
    const result = await runGraph({
      source,
      stages: chain(fakeStage<CameraFrame>('preprocess', { work: (frame) => (seen.push(frame), frame) })),
      config: testConfig({ edges: { default: { policy: 'queue', capacity: 8 } } }),
    });
    const { summary, events } = result;
    assertConservation(result);
    assert.deepEqual(summary.frames, { in: 6, out: 3, dropped: 3, inFlight: 0, late: 0 });
    assert.deepEqual(summary.drops.byReason, { rejected: 3 });
    assert.deepEqual(summary.drops.causes, { 'source: not a JPEG or PNG image': 2, 'source: bad field': 1 });
    assert.deepEqual(
      dropsOf(events, 'rejected').map((d) => d.frameId),
      [1, 3, 4],
    );
    assert.equal(seen.length, 3);
    // Every frame, rejected or not, carries its message's log time.
    assert.deepEqual(
      events.flatMap((e) => (e.type === 'frame' ? [e.stampNs] : [])),
      [0, 1, 2, 3, 4, 5].map((i) => T0 + BigInt(i) * 100n * MS),
    );
    assert.deepEqual(summary.source, { counts: {}, details: [] }, 'bad messages are rejected frames, not source events');
    const text = formatSummary(summary);
    assert.match(text, /frames in 6 {2}out 3 {2}dropped 3 \(rejected 3\)/);
    assert.match(text, /drops by cause:\n {2}2 {2}source: not a JPEG or PNG image\n {2}1 {2}source: bad field\n/);
    assert.doesNotMatch(text, /source incidents/);
  });

  test('a folder with a file that is not an image: the file is a rejected frame', async () => {
    const dir = join(cache, 'folder');
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'a.jpg'), await encodePatternFrame(0, 64, 64));
    writeFileSync(join(dir, 'b.jpg'), 'a text file named .jpg');
    writeFileSync(join(dir, 'c.png'), await encodePatternFrame(2, 64, 64));
    const result = await runGraph({
      source: await createFolderSource({ path: dir, fps: 10 }),
      stages: chain(fakeStage<CameraFrame>('preprocess')),
      config: testConfig(),
    });
    assertConservation(result);
    assert.deepEqual(result.summary.frames, { in: 3, out: 2, dropped: 1, inFlight: 0, late: 0 });
    assert.deepEqual(result.summary.drops.causes, { 'source: not a JPEG or PNG file': 1 });
    assert.deepEqual(result.summary.drops.byReason, { rejected: 1 });
  });
});

describe('lockstep', () => {
  // Frames every 100 ms; one stage of 250 ms; a 'latest' edge drops whatever waits behind it.
  const config = (lockstep: boolean) =>
    testConfig({
      lockstep,
      edges: { default: { policy: 'latest' } },
      virtualServiceMs: { decode: 250 },
      budgets: { endToEndMs: 1000, stages: {}, dropPredictedMiss: false },
    });

  test('without it, a slow stage conflates frames; with it, every frame is processed, entering when the previous one ends', async () => {
    const free = await runGraph({
      source: fakeSource({ frames: 6, periodMs: 100 }),
      stages: chain(fakeStage<number>('decode')),
      config: config(false),
    });
    assert.ok(dropsOf(free.events, 'conflated').length > 0);

    const inputs: Envelope<unknown>[] = [];
    const result = await runGraph({
      source: fakeSource({ frames: 6, periodMs: 100 }),
      stages: chain(fakeStage<number>('decode')),
      config: config(true),
      onStart: (graph) => graph.inputs.subscribe((env) => inputs.push(env)),
    });
    assertConservation(result);
    assert.deepEqual(framesOf(result.outputs), [0, 1, 2, 3, 4, 5]);
    assert.deepEqual(result.summary.frames, { in: 6, out: 6, dropped: 0, inFlight: 0, late: 0 });
    // f0 enters at 0 and leaves at 250; f1 (due at 100) enters at 250, and so on: 250 ms apart.
    assert.deepEqual(
      result.outputs.map((o) => o.captureNs),
      [0, 250, 500, 750, 1000, 1250].map((n) => msToNs(n)),
    );
    assert.ok(
      result.outputs.every((o) => o.spans[0]!.exitNs - o.captureNs === msToNs(250)),
      'no frame waits behind another',
    );
    // The stamp stays the input's own time (its due time), whatever time it entered.
    assert.deepEqual(
      result.outputs.map((o) => o.stampNs),
      [0, 100, 200, 300, 400, 500].map((n) => 1_700_000_000_000n * MS + msToNs(n)),
    );
    assert.deepEqual(
      inputs.map((env) => env.payload),
      [0, 1, 2, 3, 4, 5],
      'graph.inputs gives each frame with its payload',
    );
  });

  test('a pipeline faster than the recording keeps the recorded spacing', async () => {
    const result = await runGraph({
      source: fakeSource({ frames: 4, periodMs: 100 }),
      stages: chain(fakeStage<number>('decode')),
      config: testConfig({ lockstep: true, virtualServiceMs: { decode: 30 } }),
    });
    assert.deepEqual(
      result.outputs.map((o) => o.captureNs),
      [0, 100, 200, 300].map((n) => msToNs(n)),
    );
  });

  test('two lockstep replays give the same events and outputs, byte for byte', async () => {
    const run = () =>
      runGraph({
        source: fakeSource({ frames: 20, periodMs: 33 }),
        stages: chain(
          fakeStage<number>('preprocess', { costMs: (i) => 5 + (i % 3) }),
          fakeStage<number>('decode', { costMs: (i) => (i % 4 === 0 ? 120 : 40) }),
        ),
        config: testConfig({ lockstep: true, budgets: { endToEndMs: 100, stages: {}, dropPredictedMiss: false } }),
      });
    const a = await run();
    const b = await run();
    assert.ok(dropsOf(a.events, 'stale').length + a.summary.frames.late > 0, 'the run has deadline misses to reproduce');
    assert.equal(transcript(a), transcript(b));
  });

  test('lockstep needs the virtual clock', () => {
    assert.throws(() => testConfig({ clock: 'real', lockstep: true }), /\/lockstep: needs \/clock "virtual"/);
  });
});
