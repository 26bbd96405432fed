// Telemetry: histogram quantiles against a sorted reference, the summary fold, the live table.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { Subject } from 'rxjs';
import { MAX_DROP_CAUSES, MAX_SOURCE_DETAILS, TelemetryAggregator, dropCause } from '../../pipeline/telemetry/aggregator.ts';
import { eventToJson, type TelemetryEvent } from '../../pipeline/telemetry/events.ts';
import { LatencyHistogram } from '../../pipeline/telemetry/histogram.ts';
import { LiveTable, formatSummary, writeJsonSummary } from '../../pipeline/telemetry/report.ts';

/** mulberry32: a small seeded PRNG so the data sets are the same on every run. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Nearest-rank quantile of a sorted array. */
const reference = (sorted: readonly number[], q: number): number => sorted[Math.max(1, Math.ceil(q * sorted.length)) - 1]!;

describe('LatencyHistogram', () => {
  const random = prng(42);
  const datasets: [string, number[]][] = [
    ['uniform 0-10 ms', Array.from({ length: 10_000 }, () => Math.floor(random() * 10e6))],
    ['log-uniform 1 ns - 100 s', Array.from({ length: 10_000 }, () => Math.floor(Math.exp(random() * Math.log(1e11))))],
    [
      'bimodal with a tail',
      Array.from({ length: 5_000 }, (_, i) => (i % 50 === 0 ? 900e6 + Math.floor(random() * 100e6) : 20e6 + Math.floor(random() * 2e6))),
    ],
    ['small integers (exact range)', Array.from({ length: 1_000 }, () => Math.floor(random() * 256))],
    ['a handful', [7, 3_000_000, 12, 999_999_999, 450]],
  ];
  for (const [name, values] of datasets) {
    test(`quantiles of ${name} are within 1/128 above the sorted reference`, () => {
      const hist = new LatencyHistogram();
      for (const v of values) hist.record(v);
      const sorted = [...values].sort((a, b) => a - b);
      assert.equal(hist.count, values.length);
      assert.equal(hist.min, sorted[0]);
      assert.equal(hist.max, sorted[sorted.length - 1]);
      assert.ok(Math.abs(hist.mean - values.reduce((a, b) => a + b, 0) / values.length) < 1e-6 * hist.max);
      for (const q of [0.001, 0.1, 0.5, 0.9, 0.95, 0.99, 0.999, 1]) {
        const expected = reference(sorted, q);
        const got = hist.quantile(q);
        assert.ok(got >= expected && got <= expected + expected / 128, `q=${q}: got ${got}, reference ${expected}`);
        if (expected < 256) assert.equal(got, expected, `q=${q}: values below 256 are exact`);
      }
    });
  }

  test('accepts bigint ns, is NaN when empty, and rejects bad input', () => {
    const hist = new LatencyHistogram();
    assert.ok(Number.isNaN(hist.quantile(0.5)));
    hist.record(5_000_000n);
    assert.ok(hist.quantile(0.5) >= 5_000_000 && hist.quantile(0.5) <= 5_000_000 * (1 + 1 / 128));
    assert.throws(() => hist.record(-1), /expected a finite value ≥ 0 but received -1/);
    assert.throws(() => hist.record(NaN), /finite/);
    assert.throws(() => hist.quantile(0), /expected 0 < q ≤ 1 but received 0/);
  });
});

function events(): TelemetryEvent[] {
  const knobs = { imageTokens: 140, maxNewTokens: 48, draft: true, frameSkip: 0 };
  return [
    { type: 'frame', atNs: 0n, frameId: 0, sourceId: 's', captureNs: 0n, degradeLevel: 0 },
    { type: 'span', atNs: 10_000_000n, frameId: 0, stage: 'encode', enterNs: 0n, exitNs: 10_000_000n, degradeLevel: 0 },
    { type: 'span', atNs: 30_000_000n, frameId: 0, stage: 'decode', enterNs: 10_000_000n, exitNs: 30_000_000n, degradeLevel: 0 },
    { type: 'output', atNs: 30_000_000n, frameId: 0, latencyNs: 30_000_000n, late: false },
    {
      type: 'degrade',
      atNs: 40_000_000n,
      frameId: 1,
      from: 0,
      to: 1,
      direction: 'down',
      reason: 'predicted_miss',
      predictedMs: 30,
      limitMs: 27,
      knobs,
    },
    { type: 'frame', atNs: 40_000_000n, frameId: 1, sourceId: 's', captureNs: 40_000_000n, degradeLevel: 1 },
    { type: 'span', atNs: 50_000_000n, frameId: 1, stage: 'encode', enterNs: 40_000_000n, exitNs: 50_000_000n, degradeLevel: 1 },
    { type: 'cancel', atNs: 70_000_000n, frameId: 1, stage: 'decode', reason: 'deadline', detail: '' },
    { type: 'span', atNs: 70_000_000n, frameId: 1, stage: 'decode', enterNs: 50_000_000n, exitNs: 70_000_000n, degradeLevel: 1 },
    { type: 'drop', atNs: 70_000_000n, frameId: 1, stage: 'decode', reason: 'stale', detail: 'cancelled' },
    { type: 'frame', atNs: 80_000_000n, frameId: 2, sourceId: 's', captureNs: 80_000_000n, degradeLevel: 1 },
    { type: 'error', atNs: 85_000_000n, frameId: 2, stage: 'encode', message: 'boom' },
    { type: 'drop', atNs: 85_000_000n, frameId: 2, stage: 'encode', reason: 'error', detail: 'boom' },
    { type: 'frame', atNs: 90_000_000n, frameId: 3, sourceId: 's', captureNs: 90_000_000n, degradeLevel: 1 },
    { type: 'output', atNs: 150_000_000n, frameId: 3, latencyNs: 60_000_000n, late: true },
  ];
}

describe('TelemetryAggregator', () => {
  test('folds events into the summary', () => {
    const aggregator = new TelemetryAggregator('virtual', ['encode', 'decode']);
    for (const event of events()) aggregator.add(event);
    aggregator.end(150_000_000n, 'source_end', null);
    const summary = aggregator.snapshot();
    assert.deepEqual(summary.frames, { in: 4, out: 2, dropped: 2, inFlight: 0, late: 1 });
    assert.equal(summary.deadlineMisses, 2);
    assert.deepEqual(summary.drops.byReason, { stale: 1, error: 1 });
    assert.deepEqual(summary.drops.byStage, { decode: { stale: 1 }, encode: { error: 1 } });
    assert.equal(
      Object.values(summary.drops.causes).reduce((a, b) => a + b, 0),
      2,
    );
    assert.deepEqual(summary.cancels, { decode: { deadline: 1 } });
    assert.deepEqual(summary.errors, { encode: 1 });
    assert.deepEqual(summary.degrade, { down: 1, up: 0, level: 1, maxLevel: 1 });
    assert.deepEqual(Object.keys(summary.stages), ['encode', 'decode']);
    assert.deepEqual(summary.stages.encode, { count: 2, minMs: 10, meanMs: 10, p50Ms: 10, p95Ms: 10, p99Ms: 10, maxMs: 10 });
    assert.equal(summary.endToEnd.count, 2);
    assert.equal(summary.endToEnd.maxMs, 60);
    assert.equal(summary.durationMs, 150);
    assert.equal(summary.endReason, 'source_end');

    const text = formatSummary(summary);
    assert.match(text, /^percept run source_end\n/);
    assert.match(text, /frames in 4 {2}out 2 {2}dropped 2 \(stale 1, error 1\)/);
    assert.match(text, /\ndecode +2 .* stale 1 +deadline 1 +0\n/);
  });

  test("drops are counted by cause (numbers blanked out, the source's own cause when it gives one), most frequent first; source events are counted by kind with their details", () => {
    const aggregator = new TelemetryAggregator('virtual');
    const drop = (
      frameId: number,
      stage: string,
      reason: 'stale' | 'rejected' | 'error',
      detail: string,
      cause?: string,
    ): TelemetryEvent => ({
      type: 'drop',
      atNs: BigInt(frameId),
      frameId,
      stage,
      reason,
      detail,
      ...(cause ? { cause } : {}),
    });
    let id = 0;
    for (let k = 0; k < 3; k++)
      aggregator.add(drop(id++, 'source', 'rejected', `chunk at byte ${k}: Incorrect chunk CRC ${k}`, 'chunk failed its CRC check'));
    for (const ms of ['1.5', '22.125']) aggregator.add(drop(id++, 'decode', 'stale', `deadline passed ${ms} ms before entry`));
    aggregator.add(drop(id, 'preprocess', 'error', 'preprocess: cannot decode "frame 7.jpg" (corrupt JPEG at 0x1f3)'));
    const damaged = 'b.mcap: the chunk at byte 9 (40 bytes) was skipped: CRC mismatch; 3 messages of /cam rejected';
    aggregator.add({ type: 'source', atNs: 9n, sourceId: '/cam', kind: 'damaged', detail: damaged });
    aggregator.add({ type: 'source', atNs: 9n, sourceId: '/cam', kind: 'skipped', detail: 'b.mcap: channel 2 of /cam skipped' });
    aggregator.end(10n, 'source_end', null);
    const summary = aggregator.snapshot();
    assert.deepEqual(summary.drops.causes, {
      'source: chunk failed its CRC check': 3,
      'decode: deadline passed # ms before entry': 2,
      'preprocess: preprocess: cannot decode "…" (corrupt JPEG at #)': 1,
    });
    assert.deepEqual(Object.keys(summary.drops.causes), [
      'source: chunk failed its CRC check',
      'decode: deadline passed # ms before entry',
      'preprocess: preprocess: cannot decode "…" (corrupt JPEG at #)',
    ]);
    assert.deepEqual(summary.source, {
      counts: { damaged: 1, skipped: 1 },
      details: [`damaged: ${damaged}`, 'skipped: b.mcap: channel 2 of /cam skipped'],
    });
    const text = formatSummary(summary);
    assert.match(
      text,
      /\nsource incidents: damaged 1, skipped 1\n {2}damaged: b\.mcap: the chunk at byte 9 .*; 3 messages of \/cam rejected\n {2}skipped: b\.mcap: channel 2 of \/cam skipped\n/,
    );
    assert.match(
      text,
      /\ndrops by cause:\n {2}3 {2}source: chunk failed its CRC check\n {2}2 {2}decode: deadline passed # ms before entry\n/,
    );
    assert.equal(dropCause({ type: 'drop', atNs: 0n, frameId: 0, stage: 's', reason: 'error', detail: '' }), 's: error');

    // A bounded table: causes past MAX_DROP_CAUSES are counted together.
    const many = new TelemetryAggregator('virtual');
    for (let k = 0; k < MAX_DROP_CAUSES + 5; k++)
      many.add(drop(k, 'x', 'error', 'e', `cause ${String.fromCharCode(65 + (k % 26))}${Math.floor(k / 26)}`));
    const causes = many.snapshot().drops.causes;
    assert.equal(Object.keys(causes).length, MAX_DROP_CAUSES + 1);
    assert.equal(causes['(other causes)'], 5);

    // Source details are kept up to MAX_SOURCE_DETAILS; the counts go on, and the text says how many more.
    const restarts = new TelemetryAggregator('real');
    for (let k = 0; k < MAX_SOURCE_DETAILS + 3; k++) {
      restarts.add({ type: 'source', atNs: BigInt(k), sourceId: 'ffmpeg:x', kind: 'restart', detail: `restart ${k + 1}` });
    }
    const { source } = restarts.snapshot();
    assert.equal(source.counts.restart, MAX_SOURCE_DETAILS + 3);
    assert.equal(source.details.length, MAX_SOURCE_DETAILS);
    assert.equal(source.details.at(-1), `restart: restart ${MAX_SOURCE_DETAILS}`);
    assert.match(formatSummary(restarts.snapshot()), /\n {2}… 3 more in the events stream\n/);
  });

  test('the JSON summary round-trips through a file', () => {
    const aggregator = new TelemetryAggregator('real');
    for (const event of events()) aggregator.add(event);
    const file = new URL('../../.cache/pipeline-telemetry/summary.json', import.meta.url).pathname;
    writeJsonSummary(file, aggregator.snapshot());
    assert.deepEqual(JSON.parse(readFileSync(file, 'utf8')), JSON.parse(JSON.stringify(aggregator.snapshot())));
  });

  test('eventToJson keeps ns exact', () => {
    const line = eventToJson({ type: 'output', atNs: 2n ** 62n + 1n, frameId: 1, latencyNs: 5n, late: false });
    assert.equal(line, '{"type":"output","atNs":"4611686018427387905","frameId":1,"latencyNs":"5","late":false}');
  });
});

/** A stand-in for process.stdout that records writes and resolves `next` on each. */
function fakeStream(isTTY: boolean) {
  const writes: string[] = [];
  let onWrite: (() => void) | undefined;
  const stream = {
    isTTY,
    write(chunk: string): boolean {
      writes.push(chunk);
      onWrite?.();
      return true;
    },
  };
  const nextWrite = () => new Promise<void>((resolve) => (onWrite = resolve));
  return { stream: stream as unknown as NodeJS.WriteStream, writes, nextWrite };
}

describe('LiveTable', () => {
  const stats = (framesIn: number): TelemetryEvent => {
    const aggregator = new TelemetryAggregator('real', ['decode']);
    for (let i = 0; i < framesIn; i++)
      aggregator.add({ type: 'frame', atNs: BigInt(i), frameId: i, sourceId: 's', captureNs: 0n, degradeLevel: 0 });
    return { type: 'stats', atNs: 0n, summary: aggregator.snapshot() };
  };

  test('on a TTY it redraws the latest stats in place', async () => {
    // The table's timer is unref'd (it must never keep a CLI alive); this one keeps the test's
    // event loop alive, and fails the test if no redraw ever comes.
    const guard = setTimeout(() => assert.fail('the live table never redrew'), 10_000);
    const { stream, writes, nextWrite } = fakeStream(true);
    const events = new Subject<TelemetryEvent>();
    const table = new LiveTable({ stream, intervalMs: 20 }).attach(events);
    assert.equal(table.enabled, true);
    let written = nextWrite();
    events.next(stats(3));
    await written;
    // eslint-disable-next-line no-control-regex -- the table is drawn with ANSI escape sequences
    assert.match(writes[0]!, /^\x1b\[2Kframes in 3 /);
    const lines = writes[0]!.split('\n').length - 1;
    written = nextWrite();
    events.next(stats(7));
    await written;
    assert.ok(writes[1]!.startsWith(`\x1b[${lines}F`), 'moves up over the previous table');
    assert.match(writes[1]!, /frames in 7 /);
    events.complete(); // detaches and erases
    assert.equal(writes[2], `\x1b[${lines}F\x1b[0J`);
    clearTimeout(guard);
  });

  test('draws nothing when stdout is not a TTY (auto) or when off', () => {
    for (const [isTTY, mode] of [
      [false, 'auto'],
      [true, 'off'],
    ] as const) {
      const { stream, writes } = fakeStream(isTTY);
      const events = new Subject<TelemetryEvent>();
      const table = new LiveTable({ stream, mode, intervalMs: 1 }).attach(events);
      assert.equal(table.enabled, false);
      events.next(stats(1));
      assert.equal(events.observed, false, 'does not even subscribe');
      table.detach();
      assert.deepEqual(writes, []);
    }
  });
});
