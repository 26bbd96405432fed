// percept eval's parts without models: the labels format, the metrics measured from a recording
// written by the recorder (every number worked out by hand below), thresholds, and compare.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  checkThresholds,
  compare,
  evaluate,
  formatComparison,
  iou,
  measure,
  parseFailUnder,
  readRecording,
  timingOf,
  type Recording,
} from '../../../app/eval/eval.ts';
import type { EvalMetrics } from '../../../app/eval/metrics.ts';
import { loadLabels } from '../../../app/eval/labels.ts';
import { loadActionSchema } from '../../../nodes/action-schema.ts';
import { createRecorder } from '../../../nodes/recorder.ts';
import { TelemetryAggregator } from '../../../pipeline/telemetry/aggregator.ts';
import type { TelemetryEvent } from '../../../pipeline/telemetry/events.ts';
import { SAMPLE_START_NS, labelsPathOf, makeSampleBag, sampleActionAt } from '../../../tools/make-sample-bag.ts';

const root = new URL('../../..', import.meta.url).pathname;
const dir = join(root, '.cache/test-eval');
mkdirSync(dir, { recursive: true });
const schema = loadActionSchema(join(root, 'configs/actions/robot-action.schema.json'));
const MS = 1_000_000n;
const T0 = 1_700_000_000_000_000_000n;

describe('labels', () => {
  test('the sample bag ships with the labels of its scenes, in the documented format', async () => {
    const labels = loadLabels(join(root, 'bags/sample.labels.jsonl'), schema);
    assert.equal(labels.length, 40);
    assert.deepEqual(labels[0]!.key, { logTimeNs: SAMPLE_START_NS });
    // The person is in view throughout: the robot waits while they are far, stops once they are close.
    assert.deepEqual(
      labels.map((l) => l.action.action),
      Array.from({ length: 40 }, (_, i) => (i < 28 ? 'wait' : 'stop')),
    );
    assert.ok(labels.every((l) => (l.action.target as { label: string }).label === 'person'));
    // The person's box grows as they come closer: the feet come down the image, the height grows
    // (by 0.007 a frame; over 4 frames, more than the boxes' 2-decimal rounding can hide).
    const boxes = labels.map((l) => (l.action.target as { bbox: number[] }).bbox);
    const height = (b: number[]): number => b[3]! - b[1]!;
    assert.ok(boxes.every((b, k) => k === 0 || b[3]! >= boxes[k - 1]![3]!));
    assert.ok(boxes.every((b, k) => k < 4 || height(b) > height(boxes[k - 4]!)));
    assert.deepEqual(sampleActionAt(39, 40, 640, 360).hazards, ['person_close']);
    // What make-sample-bag writes is what is committed.
    const made = await makeSampleBag(join(dir, 'sample.mcap'));
    assert.equal(made.labels, labelsPathOf(join(dir, 'sample.mcap')));
    assert.equal(readFileSync(made.labels, 'utf8'), readFileSync(join(root, 'bags/sample.labels.jsonl'), 'utf8'));
  });

  test('a bad labels file is refused naming the line and what is wrong', () => {
    const cases: [string, RegExp][] = [
      ['{"frame_id": 1, "action": {"action": "stop", "confidence": 1}}\nnot json', /bad\.jsonl:2: not JSON/],
      ['{"action": {"action": "stop", "confidence": 1}}', /:1: expected exactly one of log_time_ns and frame_id/],
      ['{"frame_id": 1, "log_time_ns": "5", "action": {"action": "stop", "confidence": 1}}', /exactly one of/],
      ['{"log_time_ns": 1.5, "action": {"action": "stop", "confidence": 1}}', /log_time_ns must be a decimal string of ns/],
      ['{"frame_id": -1, "action": {"action": "stop", "confidence": 1}}', /frame_id must be an integer >= 0/],
      [
        '{"frame_id": 1, "action": {"action": "fly", "confidence": 1}}',
        /:1: action fails percept\/robot-action\/v1: \/action must be equal to one of the allowed values/,
      ],
      ['{"frame_id": 1, "action": {"action": "stop", "confidence": 1}, "why": 1}', /unknown key "why"/],
      [
        '{"frame_id": 1, "action": {"action": "stop", "confidence": 1}}\n{"frame_id": 1, "action": {"action": "stop", "confidence": 1}}',
        /:2: the same frame as line 1/,
      ],
      ['\n\n', /holds no labels/],
    ];
    for (const [text, expected] of cases) {
      writeFileSync(join(dir, 'bad.jsonl'), text);
      assert.throws(() => loadLabels(join(dir, 'bad.jsonl'), schema), expected);
    }
    assert.throws(() => loadLabels(join(dir, 'none.jsonl'), schema), /labels: cannot read .*none\.jsonl/);
  });

  test('percept eval checks the labels before it replays anything: a bad file fails at once, no recording made', async () => {
    writeFileSync(join(dir, 'unreadable.jsonl'), 'not json\n');
    const out = join(dir, 'eval-bad-labels');
    await assert.rejects(
      evaluate({ bag: join(root, 'bags/sample.mcap'), labels: join(dir, 'unreadable.jsonl'), out, progress: false }),
      /unreadable\.jsonl:1/,
    );
    assert.equal(existsSync(join(out, 'run.mcap')), false, 'no replay ran');
  });
});

/** A recording of a made-up run of 5 frames, written by percept's recorder as a run writes it. */
async function writeRun(path: string, decoded: { action: string; bbox?: number[]; tokens: number[] }[], dropLast = true): Promise<void> {
  const rec = await createRecorder({ path, actionSchema: schema, flushAfterMs: null });
  const aggregator = new TelemetryAggregator('virtual', ['decode', 'actions']);
  const event = async (e: TelemetryEvent, stampNs?: bigint) => {
    aggregator.add(e);
    await rec.recordEvent(e, e.atNs, stampNs);
  };
  for (let i = 0; i < 5; i++) {
    const stampNs = T0 + BigInt(i) * 100n * MS;
    const captureNs = stampNs + BigInt(i) * 10n * MS; // lockstep moved the later ones back
    await event({ type: 'frame', atNs: captureNs, frameId: i, sourceId: '/cam', captureNs, stampNs, degradeLevel: 0 }, stampNs);
    if (i === 4 && dropLast) {
      await event(
        { type: 'drop', atNs: captureNs, frameId: i, stage: 'source', reason: 'rejected', detail: 'x', cause: 'not a JPEG or PNG image' },
        stampNs,
      );
      continue;
    }
    const decodeMs = BigInt(50 + 10 * i);
    await event({
      type: 'span',
      atNs: captureNs + decodeMs * MS,
      frameId: i,
      stage: 'decode',
      enterNs: captureNs,
      exitNs: captureNs + decodeMs * MS,
      degradeLevel: 0,
    });
    await event({
      type: 'note',
      atNs: captureNs + decodeMs * MS,
      frameId: i,
      stage: 'decode',
      message: 'decode',
      data: { tokenIds: decoded[i]!.tokens.join(' ') },
    });
    const exitNs = captureNs + (decodeMs + 2n) * MS;
    await event({ type: 'span', atNs: exitNs, frameId: i, stage: 'actions', enterNs: captureNs + decodeMs * MS, exitNs, degradeLevel: 0 });
    if (decoded[i]!.action === 'invalid') {
      await event({ type: 'drop', atNs: exitNs, frameId: i, stage: 'actions', reason: 'invalid', detail: 'not JSON' }, stampNs);
      continue;
    }
    const late = i === 3;
    await event({ type: 'output', atNs: exitNs, frameId: i, latencyNs: exitNs - captureNs, late }, stampNs);
    const target = decoded[i]!.bbox ? { label: 'person', bbox: decoded[i]!.bbox } : undefined;
    await rec.recordAction(
      {
        schemaId: schema.wireSchemaId,
        frameId: i,
        sourceId: '/cam',
        captureWallMs: 0,
        action: { action: decoded[i]!.action, confidence: 0.5, ...(target ? { target } : {}) },
      },
      stampNs,
      exitNs,
    );
  }
  aggregator.end(T0 + 1000n * MS, 'source_end', null);
  await rec.recordStats(aggregator.snapshot(), T0 + 1000n * MS);
  await rec.close();
}

describe('metrics from a recording', () => {
  const decoded = [
    { action: 'stop', bbox: [0, 0, 0.5, 0.5], tokens: [1, 2, 3] },
    { action: 'move', bbox: [0.25, 0.25, 0.75, 0.75], tokens: [1, 2, 4] },
    { action: 'invalid', tokens: [9] },
    { action: 'stop', tokens: [5, 6] },
  ];

  test('valid rate, misses, drops, stage quantiles, and accuracy against labels keyed by log time and by frame id', async () => {
    const path = join(dir, 'run.mcap');
    await writeRun(path, decoded);
    const labelsPath = join(dir, 'labels.jsonl');
    const label = (key: string, action: string, bbox?: number[]) =>
      `{${key}, "action": {"action": "${action}", "confidence": 1${bbox ? `, "target": {"label": "person", "bbox": ${JSON.stringify(bbox)}}` : ''}}}`;
    writeFileSync(
      labelsPath,
      [
        label(`"log_time_ns": "${T0}"`, 'stop', [0, 0, 0.5, 0.5]), // right, IoU 1
        label(`"frame_id": 1`, 'stop', [0, 0, 0.5, 0.5]), // wrong action, IoU 1/7
        label(`"log_time_ns": "${T0 + 200n * MS}"`, 'wait'), // no action (invalid)
        label(`"frame_id": 3`, 'stop', [0.5, 0.5, 1, 1]), // right, no predicted box: IoU 0
        label(`"frame_id": 4`, 'move'), // rejected at the source
      ].join('\n'),
    );
    const recording = await readRecording(path);
    const { metrics, series } = measure(recording, loadLabels(labelsPath, schema), {
      bag: 'b.mcap',
      config: null,
      labels: labelsPath,
      recording: 'run.mcap',
    });
    assert.deepEqual(metrics.frames, { in: 5, out: 3, dropped: 2, rejected: 1 });
    assert.equal(metrics.validRate, 0.75); // 3 of the 4 checked
    assert.equal(metrics.deadlineMissRate, 0.2); // frame 3 came out late
    assert.deepEqual(metrics.drops.byReason, { rejected: 1, invalid: 1 });
    assert.deepEqual(metrics.drops.causes, { 'source: not a JPEG or PNG image': 1, 'actions: not JSON': 1 });
    // A recording that does not say how it was charged (no config) is on the virtual clock: modelled, never measured.
    assert.deepEqual(metrics.stages.decode, { latency: 'modelled', count: 4, p50Ms: 60, p95Ms: 80, p99Ms: 80, maxMs: 80 });
    assert.deepEqual(metrics.endToEnd, { latency: 'modelled', count: 3, p50Ms: 62, p95Ms: 82, p99Ms: 82, maxMs: 82 });
    assert.deepEqual(metrics.timing.stages.decode, { latency: 'modelled', cost: null });
    const a = metrics.accuracy!;
    assert.deepEqual([a.labeled, a.matched, a.covered], [5, 5, 3]);
    assert.equal(a.action, 0.4);
    assert.equal(a.label, Math.round((2 / 3) * 1e6) / 1e6); // of the 3 labels with a target, frames 0 and 1 name the person
    assert.equal(a.meanIoU, Math.round(((1 + 1 / 7 + 0) / 3) * 1e6) / 1e6);
    assert.equal(a.iou50, Math.round((1 / 3) * 1e6) / 1e6);
    assert.deepEqual(a.confusion, {
      labels: ['move', 'stop', 'wait', '(no action)'],
      matrix: [
        [0, 0, 0, 1],
        [1, 2, 0, 0],
        [0, 0, 0, 1],
        [0, 0, 0, 0],
      ],
    });
    assert.deepEqual(
      series.timeline.map((p) => [p.frameId, p.t, p.latencyMs, p.drop]),
      [
        [0, 0, 52, null],
        [1, 0.11, 62, null],
        [2, 0.22, null, 'invalid'],
        [3, 0.33, 82, null],
        [4, 0.44, null, 'rejected'],
      ],
    );
  });

  test('timing: measured on a real clock; modelled on a virtual one, each stage as charged (sampled, fixed, none)', () => {
    const recording = (metadata: Record<string, string>): Recording => ({
      frames: new Map(),
      spans: new Map(['preprocess', 'encode', 'decode', 'actions'].map((stage) => [stage, [1]])),
      summary: undefined,
      metadata,
      warnings: [],
    });
    const sampled = { count: 3, quantilesMs: [80, 100, 300] };
    const config = {
      clock: 'virtual',
      virtualServiceSeed: 3,
      virtualServiceMs: { preprocess: 4, encode: [20, sampled], decode: [sampled] },
    };
    const modelled = timingOf(recording({ clock: 'virtual', config: JSON.stringify(config) }), '/cal.json');
    assert.equal(modelled.latency, 'modelled');
    assert.deepEqual(modelled.stages, {
      preprocess: { latency: 'modelled', cost: 'fixed' },
      encode: { latency: 'modelled', cost: 'sampled' },
      decode: { latency: 'modelled', cost: 'sampled' },
      actions: { latency: 'modelled', cost: 'none' },
    });
    assert.deepEqual([modelled.seed, modelled.calibration], [3, '/cal.json']);
    assert.equal(
      modelled.summary,
      'modelled on the virtual clock, not measured (calibration /cal.json); preprocess: fixed figures (no spread); ' +
        'encode, decode: sampled from measured distributions (seed 3); actions: no cost given (0 ms)',
    );
    const measured = timingOf(recording({ clock: 'real', config: JSON.stringify({ ...config, clock: 'real' }) }), null);
    assert.deepEqual([measured.latency, measured.seed, measured.summary], ['measured', null, 'measured on the real clock']);
    assert.deepEqual(measured.stages.decode, { latency: 'measured', cost: null });
  });

  test('token agreement between two recordings of the same bag', async () => {
    const a = join(dir, 'a.mcap');
    const b = join(dir, 'b.mcap');
    await writeRun(a, decoded);
    await writeRun(b, [
      { action: 'stop', bbox: [0, 0, 0.5, 0.5], tokens: [1, 2, 3] }, // identical
      { action: 'stop', tokens: [1, 2, 3, 7] }, // alike for 2 of 4
      { action: 'invalid', tokens: [9] }, // identical
      { action: 'stop', tokens: [6, 6] }, // differ at once (0 of 2, although the second tokens match)
    ]);
    const { metrics } = measure(
      await readRecording(a),
      undefined,
      { bag: 'b', config: null, labels: null, recording: 'a.mcap' },
      { recording: await readRecording(b), name: 'f16.json' },
    );
    assert.deepEqual(metrics.tokens, {
      reference: 'f16.json',
      frames: 4,
      exactMatchRate: 0.5,
      tokenAgreement: 0.6,
      actionAgreement: Math.round((2 / 3) * 1e6) / 1e6,
    });
    assert.equal(metrics.accuracy, null);
  });

  test('a crashed recording is measured as far as it is valid, with a warning', async () => {
    const path = join(dir, 'full.mcap');
    await writeRun(path, decoded);
    const bytes = readFileSync(path);
    const cut = join(dir, 'cut.mcap');
    writeFileSync(cut, bytes.subarray(0, bytes.length - 200));
    const recording = await readRecording(cut);
    assert.equal(recording.frames.size, 5);
    assert.ok(recording.warnings.some((w) => /no readable summary/.test(w)));
  });

  test('--fail-under: minimums and the miss maximum, with the reason', () => {
    const metrics = {
      validRate: 0.75,
      deadlineMissRate: 0.2,
      accuracy: { action: 0.4, meanIoU: 0.38 },
      tokens: null,
    } as unknown as EvalMetrics;
    assert.deepEqual(checkThresholds(metrics, parseFailUnder('valid=0.7,accuracy=0.4,miss=0.2')), []);
    assert.deepEqual(checkThresholds(metrics, parseFailUnder('valid=0.99,miss=0.1,agreement=0.9')), [
      'valid: the schema-valid rate 0.7500 is below 0.99',
      'miss: the deadline-miss rate 0.2000 is above 0.1',
      'agreement: the token agreement is not available (no --reference)',
    ]);
    assert.throws(() => parseFailUnder('speed=1'), /unknown metric 'speed' \(known: valid, accuracy, iou, agreement, miss\)/);
    assert.throws(() => parseFailUnder('valid=high'), /valid needs a number in \[0, 1\], got 'high'/);
  });

  test('iou of boxes [x0, y0, x1, y1]', () => {
    assert.equal(iou([0, 0, 1, 1], [0, 0, 1, 1]), 1);
    assert.equal(iou([0, 0, 0.5, 1], [0.5, 0, 1, 1]), 0);
    assert.equal(iou([0, 0, 1, 1], [0, 0, 0.5, 0.5]), 0.25);
    assert.equal(iou([0, 0, 1, 1], undefined), 0);
  });

  test('compare: two eval outputs side by side with B − A', () => {
    const base = {
      kind: 'percept.eval',
      version: 1,
      frames: { in: 10, out: 8, dropped: 2, rejected: 0 },
      drops: { byReason: { stale: 2 }, causes: {} },
      endToEnd: { p50Ms: 100, p95Ms: 150, p99Ms: 160 },
      stages: { decode: { p95Ms: 90 } },
    };
    mkdirSync(join(dir, 'A'), { recursive: true });
    writeFileSync(
      join(dir, 'A', 'metrics.json'),
      JSON.stringify({ ...base, validRate: 0.8, deadlineMissRate: 0.2, accuracy: { action: 0.5 } }),
    );
    writeFileSync(
      join(dir, 'B.json'),
      JSON.stringify({
        ...base,
        validRate: 0.9,
        deadlineMissRate: 0.1,
        accuracy: { action: 0.75 },
        drops: { byReason: { invalid: 1 }, causes: {} },
      }),
    );
    const c = compare(join(dir, 'A'), join(dir, 'B.json'));
    const row = (metric: string) => c.rows.find((r) => r.metric === metric);
    assert.deepEqual(row('schema-valid rate'), { metric: 'schema-valid rate', a: 0.8, b: 0.9, delta: 0.1 });
    assert.deepEqual(row('action accuracy'), { metric: 'action accuracy', a: 0.5, b: 0.75, delta: 0.25 });
    assert.deepEqual(row('drops: stale'), { metric: 'drops: stale', a: 2, b: 0, delta: -2 });
    assert.deepEqual(row('decode p95 ms'), { metric: 'decode p95 ms', a: 90, b: 90, delta: 0 });
    assert.match(formatComparison(c), /schema-valid rate +0\.8000 +0\.9000 +\+0\.1000\n/);
    assert.match(formatComparison(c), /A: .*\n +latencies: not said \(an older metrics\.json\)\n/);
    writeFileSync(join(dir, 'D.json'), JSON.stringify({ ...base, timing: { summary: 'measured on the real clock' } }));
    assert.match(formatComparison(compare(join(dir, 'A'), join(dir, 'D.json'))), /B: .*D\.json\n +latencies measured on the real clock\n/);
    writeFileSync(join(dir, 'C.json'), '{"kind":"other"}');
    assert.throws(() => compare(join(dir, 'A'), join(dir, 'C.json')), /C\.json is not the metrics\.json of percept eval/);
  });
});

describe('percept eval on calibrated distributions', { timeout: 600_000 }, () => {
  // The tiny models, the stages real; the latencies are what the virtual clock draws from the calibration.
  const config = {
    encoder: { kind: 'projection', seed: 1, tokens: 16 },
    decoder: { model: 'synth:gemma4-tiny', nCtx: 2048 },
    actions: { schema: join(root, 'configs/actions/robot-action.schema.json') },
    budgets: { endToEndMs: 5000, stages: {}, dropPredictedMiss: false },
    ladder: { enabled: false, initial: { imageTokens: 70, maxNewTokens: 32, draft: false, frameSkip: 0 }, rungs: [] },
    virtualServiceMs: { preprocess: 4, encode: 20, decode: 90, actions: 1 },
    telemetry: { liveTable: 'off' },
  };
  const calibration = {
    kind: 'percept.calibration',
    version: 2,
    virtualServiceMs: {
      preprocess: [{ count: 3, quantilesMs: [3, 4, 9] }],
      encode: [{ count: 3, quantilesMs: [15, 20, 40] }],
      decode: [{ count: 5, quantilesMs: [80, 90, 100, 150, 400] }],
      actions: [1],
    },
  };
  const metricsOf = (out: string) => JSON.parse(readFileSync(join(out, 'metrics.json'), 'utf8')) as EvalMetrics;

  test('modelled p99 above p50, labelled modelled; the same seed gives the same report, another seed another', async () => {
    const bag = join(dir, 'twelve.mcap');
    await makeSampleBag(bag, { frames: 12, width: 320, height: 180 });
    writeFileSync(join(dir, 'tiny.json'), JSON.stringify(config));
    writeFileSync(join(dir, 'cal-v2.json'), JSON.stringify(calibration));
    const run = async (name: string, seed: number) => {
      const out = join(dir, name);
      await evaluate({ bag, config: join(dir, 'tiny.json'), calibration: join(dir, 'cal-v2.json'), seed, out, progress: false });
      return { out, metrics: metricsOf(out) };
    };
    const a = await run('seed-1', 1);
    const { timing, endToEnd, stages } = a.metrics;
    assert.equal(a.metrics.frames.out, 12);
    assert.deepEqual([timing.clock, timing.latency, timing.seed, timing.calibration], ['virtual', 'modelled', 1, join(dir, 'cal-v2.json')]);
    assert.deepEqual([timing.stages.decode?.cost, timing.stages.actions?.cost], ['sampled', 'fixed']);
    assert.deepEqual([endToEnd.latency, stages.decode?.latency], ['modelled', 'modelled']);
    assert.ok(endToEnd.p99Ms! > endToEnd.p50Ms!, JSON.stringify(endToEnd));
    assert.ok(stages.decode!.p99Ms! > stages.decode!.p50Ms!, JSON.stringify(stages.decode));
    assert.equal(stages.actions!.p99Ms, stages.actions!.p50Ms, 'a fixed cost has no spread');
    const report = readFileSync(join(a.out, 'report.html'), 'utf8');
    assert.match(
      report,
      /<p class="modelled" data-latency="modelled">Latencies are <b>modelled<\/b>: modelled on the virtual clock, not measured/,
    );
    assert.match(report, /<th>decode<\/th><td data-latency="modelled">modelled \(sampled\)<\/td>/);

    const again = await run('seed-1-again', 1);
    assert.equal(readFileSync(join(again.out, 'metrics.json'), 'utf8'), readFileSync(join(a.out, 'metrics.json'), 'utf8'));
    assert.equal(readFileSync(join(again.out, 'report.html'), 'utf8'), report);
    const other = await run('seed-2', 2);
    assert.equal(other.metrics.timing.seed, 2);
    assert.notDeepEqual(other.metrics.stages.decode, stages.decode);
    assert.notDeepEqual(other.metrics.endToEnd, endToEnd);
  });

  test('a calibration measured on another ladder is refused, naming the level and the knob', async () => {
    const bag = join(dir, 'twelve.mcap');
    if (!existsSync(bag)) await makeSampleBag(bag, { frames: 12, width: 320, height: 180 });
    writeFileSync(join(dir, 'tiny.json'), JSON.stringify(config));
    const level = config.ladder.initial;
    const refused = async (levels: object[], message: RegExp) => {
      const path = join(dir, 'cal-ladder.json');
      writeFileSync(path, JSON.stringify({ ...calibration, levels }));
      await assert.rejects(
        evaluate({ bag, config: join(dir, 'tiny.json'), calibration: path, out: join(dir, 'refused'), progress: false }),
        message,
      );
    };
    await refused([level, { ...level, imageTokens: 140 }], /measured 2 ladder levels, the config has 1; calibrate with this config/);
    await refused([{ ...level, imageTokens: 280 }], /level 0 was measured at imageTokens=280, the config's is 70/);
  });
});
