// The metrics server: a real graph (fake stages on the virtual clock) feeds it, and it is scraped over loopback
// during and after the run. /metrics is parsed by a strict parser of the Prometheus text exposition format 0.0.4
// (parseExposition below, written from https://prometheus.io/docs/instrumenting/exposition_formats/) and checked
// against the run's own summary; /healthz is checked for running, stalled and ended. The config key
// metrics.endpoint starts the server in a run of the tiny models; --metrics overrides it.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Subject } from 'rxjs';
import { METRICS_CONTENT_TYPE, startMetricsServer, type Health, type MetricsServer } from '../../../app/run/metrics.ts';
import { executeRun, runConfig } from '../../../app/run/run.ts';
import { VirtualClock } from '../../../pipeline/clock.ts';
import { ConfigError, loadConfig, parseMetricsEndpoint } from '../../../pipeline/config.ts';
import { createGraph } from '../../../pipeline/graph/graph.ts';
import type { LatencyStats, RunSummary, TelemetryEvent } from '../../../pipeline/telemetry/events.ts';
import { freePort, tinyPatternRunConfig } from '../../support/fixtures.ts';
import { eventfulRun, fakeStage } from '../../support/pipeline-fakes.ts';

interface Sample {
  readonly name: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
}
interface Family {
  readonly type: string;
  readonly help: string;
  readonly samples: Sample[];
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const FLOAT = /^[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|Inf|NaN)$/;

function parseValue(text: string, where: string): number {
  assert.match(text, FLOAT, `${where}: not a float: ${text}`);
  if (text === 'NaN') return NaN;
  if (/^[+-]?Inf$/.test(text)) return text.startsWith('-') ? -Infinity : Infinity;
  return Number(text);
}

/** A strict parser of the text format: throws naming the line of the first thing the format does not allow. */
function parseExposition(text: string): Map<string, Family> {
  assert.ok(text.endsWith('\n'), 'the last line ends with a line feed');
  const families = new Map<string, Family>();
  const series = new Set<string>();
  const closed = new Set<string>(); // families whose samples are over (no interleaving)
  let current: string | undefined;
  const familyOf = (sample: string): string | undefined => {
    if (families.has(sample)) return sample;
    const base = sample.replace(/_(sum|count|bucket)$/, '');
    const f = families.get(base);
    return f && (f.type === 'summary' || f.type === 'histogram') && base !== sample ? base : undefined;
  };
  for (const [n, line] of text.slice(0, -1).split('\n').entries()) {
    const where = `line ${n + 1} "${line}"`;
    if (line === '') continue; // the format: "Empty lines are ignored" (prom-client puts one between families)
    assert.notEqual(line.trim(), '', `${where}: a blank line of spaces`);
    if (line.startsWith('#')) {
      const m = /^# (HELP|TYPE) (\S+) ?(.*)$/.exec(line);
      if (!m) continue; // a plain comment
      const [, kind, name, rest] = m as unknown as [string, string, string, string];
      assert.match(name, METRIC_NAME, `${where}: metric name`);
      if (current !== name && current !== undefined) closed.add(current);
      assert.ok(!closed.has(name), `${where}: ${name} comes back after other families`);
      const f = families.get(name) ?? { type: 'untyped', help: '', samples: [] };
      if (kind === 'TYPE') {
        assert.ok(['counter', 'gauge', 'summary', 'histogram', 'untyped'].includes(rest), `${where}: type`);
        assert.ok(!families.has(name) || families.get(name)!.type === 'untyped', `${where}: a second TYPE`);
        assert.equal(f.samples.length, 0, `${where}: TYPE after samples`);
        families.set(name, { ...f, type: rest });
      } else {
        assert.equal(f.help, '', `${where}: a second HELP`);
        assert.ok(!/\\[^\\n]/.test(rest.replace(/\\\\/g, '')), `${where}: HELP escapes only \\\\ and \\n`);
        families.set(name, { ...f, help: rest });
      }
      current = name;
      continue;
    }
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)(?: (-?\d+))?$/.exec(line);
    assert.ok(m, `${where}: not a sample`);
    const [, name, labelText, valueText] = m as unknown as [string, string, string | undefined, string];
    const labels: Record<string, string> = {};
    if (labelText) {
      let rest = labelText.slice(1, -1);
      while (rest.length > 0) {
        const lm = /^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,?)/.exec(rest);
        assert.ok(lm, `${where}: bad label at ${rest}`);
        const [all, key, raw, comma] = lm as unknown as [string, string, string, string];
        assert.match(key, LABEL_NAME);
        assert.ok(!key.startsWith('__'), `${where}: reserved label ${key}`);
        assert.ok(!(key in labels), `${where}: label ${key} twice`);
        labels[key] = raw.replace(/\\(.)/g, (_x, c: string) => (c === 'n' ? '\n' : c));
        rest = rest.slice(all.length);
        assert.ok(comma === ',' || rest.length === 0, `${where}: labels separated by commas`);
      }
    }
    const family = familyOf(name);
    assert.ok(family, `${where}: a sample before its TYPE`);
    assert.equal(family, current, `${where}: a sample outside its family's block`);
    const f = families.get(family)!;
    const value = parseValue(valueText, where);
    const key = `${name}${JSON.stringify(Object.entries(labels).sort())}`;
    assert.ok(!series.has(key), `${where}: the same series twice`);
    series.add(key);
    if (f.type === 'counter') assert.ok(value >= 0, `${where}: a counter is >= 0`);
    if (f.type === 'summary') {
      if (name === family) {
        assert.ok('quantile' in labels, `${where}: a summary's quantile sample has a quantile label`);
        const q = parseValue(labels.quantile!, where);
        assert.ok(q >= 0 && q <= 1, `${where}: quantile in [0, 1]`);
      } else {
        assert.ok(!('quantile' in labels), `${where}: _sum and _count have no quantile label`);
        if (name.endsWith('_count')) assert.ok(Number.isInteger(value) && value >= 0, `${where}: a count`);
      }
    }
    if (f.type === 'histogram') {
      assert.notEqual(name, family, `${where}: a histogram has only _bucket, _sum and _count samples`);
      assert.equal('le' in labels, name.endsWith('_bucket'), `${where}: le on each _bucket sample, and only there`);
      if (name.endsWith('_bucket') || name.endsWith('_count')) assert.ok(Number.isInteger(value) && value >= 0, `${where}: a count`);
    }
    f.samples.push({ name, labels, value });
  }
  return families;
}

const value = (families: Map<string, Family>, name: string, labels: Record<string, string> = {}): number | undefined =>
  [...families.values()]
    .flatMap((f) => f.samples)
    .find((s) => s.name === name && JSON.stringify(Object.entries(s.labels).sort()) === JSON.stringify(Object.entries(labels).sort()))
    ?.value;

/** A histogram series' buckets, checked: cumulative, ending in +Inf, which equals _count. */
function buckets(families: Map<string, Family>, name: string, labels: Record<string, string> = {}): { le: number; n: number }[] {
  const same = (s: Sample) => Object.entries(labels).every(([k, v]) => s.labels[k] === v);
  const rows = families
    .get(name)!
    .samples.filter((s) => s.name === `${name}_bucket` && same(s))
    .map((s) => ({ le: parseValue(s.labels.le!, name), n: s.value }));
  assert.ok(rows.length > 1, `${name}: buckets`);
  rows.forEach((row, i) => i > 0 && assert.ok(row.le > rows[i - 1]!.le && row.n >= rows[i - 1]!.n, `${name}: cumulative`));
  assert.equal(rows.at(-1)!.le, Infinity);
  assert.equal(rows.at(-1)!.n, value(families, `${name}_count`, labels));
  return rows;
}

/** A latency histogram agrees with the graph's own stats (rounded to the µs): count, sum, no sample below min or above max. */
function assertHistogramMatches(families: Map<string, Family>, name: string, labels: Record<string, string>, stats: LatencyStats): void {
  const where = `${name} ${JSON.stringify(labels)}`;
  const us = 1e-6;
  assert.equal(value(families, `${name}_count`, labels), stats.count, where);
  const sum = value(families, `${name}_sum`, labels)!;
  const statsSum = (stats.meanMs! * stats.count) / 1000;
  assert.ok(Math.abs(sum - statsSum) <= (us / 2) * stats.count + 1e-9, `${where}: _sum ${sum}, from the stats ${statsSum}`);
  for (const { le, n } of buckets(families, name, labels)) {
    if (le < stats.minMs! / 1000 - us) assert.equal(n, 0, `${where}: nothing at or below ${le}`);
    if (le >= stats.maxMs! / 1000 + us) assert.equal(n, stats.count, `${where}: everything at or below ${le}`);
  }
}

async function scrape(server: MetricsServer): Promise<Map<string, Family>> {
  const res = await fetch(`${server.url}/metrics`);
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('content-type'), METRICS_CONTENT_TYPE);
  return parseExposition(await res.text());
}

async function healthz(server: MetricsServer): Promise<{ status: number; body: Health }> {
  const res = await fetch(`${server.url}/healthz`);
  return { status: res.status, body: (await res.json()) as Health };
}

describe('metrics server', () => {
  test('a run scraped over loopback: counters, gauges and latency histograms agree with its summary; healthz 200, then 503', async () => {
    const clock = new VirtualClock(0n, 1_700_000_000_000);
    const during: { families?: Map<string, Family>; health?: { status: number; body: Health } } = {};
    const graph = createGraph({
      clock,
      ...eventfulRun(
        fakeStage<{ frame: number }>('publish', {
          // Scraped once mid-run, from inside the run.
          work: async (g) => {
            if (g.frame >= 30 && !during.families) {
              during.families = await scrape(server);
              during.health = await healthz(server);
            }
            return g;
          },
        }),
      ),
    });
    const server = await startMetricsServer({ port: 0, events: graph.events });
    try {
      assert.match(server.url, /^http:\/\/127\.0\.0\.1:\d+$/, 'loopback by default');
      const events: TelemetryEvent[] = [];
      graph.events.subscribe((e) => events.push(e));
      const summary: RunSummary = await graph.run();

      // Mid-run: running, and the counters so far.
      assert.ok(during.families && during.health);
      assert.equal(during.health.status, 200);
      assert.equal(during.health.body.status, 'running');
      assert.ok(value(during.families, 'percept_frames_in_total')! > 30);
      assert.ok(value(during.families, 'percept_frames_in_total')! < summary.frames.in);
      assert.equal(value(during.families, 'percept_running'), 1);

      // After: every number from the run's summary.
      const f = await scrape(server);
      for (const name of ['percept_frames_in_total', 'percept_frames_out_total', 'percept_frames_dropped_total', 'percept_cancels_total'])
        assert.equal(f.get(name)?.type, 'counter', name);
      assert.equal(f.get('percept_ladder_level')?.type, 'gauge');
      assert.equal(f.get('percept_end_to_end_latency_seconds')?.type, 'histogram');
      assert.equal(f.get('percept_stage_latency_seconds')?.type, 'histogram');
      assert.equal(value(f, 'percept_frames_in_total'), summary.frames.in);
      assert.equal(value(f, 'percept_frames_out_total'), summary.frames.out);
      assert.equal(value(f, 'percept_frames_late_total'), summary.frames.late);
      assert.equal(value(f, 'percept_frames_in_flight'), 0);
      assert.ok(summary.frames.dropped > 0 && Object.keys(summary.cancels).length > 0 && summary.degrade.down > 0, 'the run covers them');
      for (const [stage, reasons] of Object.entries(summary.drops.byStage))
        for (const [reason, n] of Object.entries(reasons)) assert.equal(value(f, 'percept_frames_dropped_total', { stage, reason }), n);
      assert.equal(
        f.get('percept_frames_dropped_total')!.samples.reduce((a, s) => a + s.value, 0),
        summary.frames.dropped,
      );
      for (const [stage, reasons] of Object.entries(summary.cancels))
        for (const [reason, n] of Object.entries(reasons)) assert.equal(value(f, 'percept_cancels_total', { stage, reason }), n);
      assert.equal(value(f, 'percept_degrade_steps_total', { direction: 'down' }), summary.degrade.down);
      assert.equal(value(f, 'percept_degrade_steps_total', { direction: 'up' }), summary.degrade.up);
      for (const [stage, n] of Object.entries(summary.errors)) assert.equal(value(f, 'percept_errors_total', { stage }), n);
      const lastFrame = events.filter((e) => e.type === 'frame').at(-1)!;
      assert.equal(value(f, 'percept_ladder_level', { source: 'fake' }), lastFrame.degradeLevel);
      assertHistogramMatches(f, 'percept_end_to_end_latency_seconds', {}, summary.endToEnd);
      assert.ok(Object.keys(summary.stages).length > 0);
      for (const [stage, stats] of Object.entries(summary.stages))
        assertHistogramMatches(f, 'percept_stage_latency_seconds', { stage }, stats);
      assert.deepEqual(
        new Set(f.get('percept_stage_latency_seconds')!.samples.map((s) => s.labels.stage)),
        new Set(Object.keys(summary.stages)),
        'a series for each stage that ran, and no other',
      );
      // Ended: 503, with how.
      const after = await healthz(server);
      assert.equal(after.status, 503);
      assert.deepEqual([after.body.status, after.body.endReason, after.body.ok], ['ended', 'source_end', false]);
      assert.equal(value(f, 'percept_running'), 0);

      // Only GET and HEAD, only the two paths.
      assert.equal((await fetch(`${server.url}/other`)).status, 404);
      assert.equal((await fetch(`${server.url}/metrics`, { method: 'POST' })).status, 405);
      const head = await fetch(`${server.url}/healthz`, { method: 'HEAD' });
      assert.equal(head.status, 503);
      assert.equal(await head.text(), '');
    } finally {
      await server.close();
    }
    await assert.rejects(fetch(`${server.url}/metrics`), 'closed');
  });

  test('healthz: starting, running while frames flow, 503 stalled when none came for staleAfterMs; readyz only while running', async () => {
    let nowMs = 1000;
    const events = new Subject<TelemetryEvent>();
    const server = await startMetricsServer({ port: 0, events, staleAfterMs: 2000, now: () => nowMs });
    const readyz = async () => (await fetch(`${server.url}/readyz`)).status;
    try {
      let h = await healthz(server);
      assert.deepEqual([h.status, h.body.status, h.body.lastFrameAgeS], [200, 'starting', null]);
      assert.equal(await readyz(), 503, 'alive but not ready before the first frame');
      const f0 = await scrape(server);
      assert.equal(value(f0, 'percept_end_to_end_latency_seconds_count'), 0, 'no frame out yet');
      assert.equal(f0.get('percept_stage_latency_seconds')!.samples.length, 0, 'no stage call yet: no series');
      assert.equal(f0.get('percept_last_frame_age_seconds')!.samples.length, 0);
      nowMs = 3500;
      h = await healthz(server);
      assert.deepEqual([h.status, h.body.status], [503, 'stalled'], 'no first frame within staleAfterMs');
      events.next({ type: 'frame', atNs: 0n, frameId: 0, sourceId: 'cam "a"\\b', captureNs: 0n, degradeLevel: 2 });
      h = await healthz(server);
      assert.deepEqual([h.status, h.body.status, h.body.lastFrameAgeS, h.body.frames.inFlight], [200, 'running', 0, 1]);
      assert.equal(await readyz(), 200);
      nowMs = 5400;
      assert.equal((await healthz(server)).body.lastFrameAgeS, 1.9);
      assert.equal((await healthz(server)).status, 200);
      nowMs = 5500;
      h = await healthz(server);
      assert.deepEqual([h.status, h.body.status], [503, 'stalled']);
      assert.equal(await readyz(), 503);
      // Label values are escaped (the parser unescapes them).
      const f = await scrape(server);
      assert.equal(value(f, 'percept_ladder_level', { source: 'cam "a"\\b' }), 2);
      assert.equal(value(f, 'percept_last_frame_age_seconds'), 2);
      events.complete();
      h = await healthz(server);
      assert.deepEqual([h.status, h.body.status, h.body.endReason], [503, 'ended', null]);
    } finally {
      await server.close();
    }
  });

  test('the parser is strict: it refuses what the format does not allow', () => {
    const ok = '# HELP a_total A.\n# TYPE a_total counter\na_total{x="1"} 2\n\n# TYPE b gauge\nb 1\n';
    assert.equal(value(parseExposition(ok), 'a_total', { x: '1' }), 2);
    const bad: [string, RegExp][] = [
      ['a_total 1\n', /before its TYPE/],
      ['# TYPE a counter\na 1', /line feed/],
      ['# TYPE a counter\n \na 1\n', /blank line of spaces/],
      ['# TYPE a histogram\na 1\n', /only _bucket, _sum and _count/],
      ['# TYPE a histogram\na_bucket 1\n', /le on each _bucket/],
      ['# TYPE a counter\na{x=1} 1\n', /bad label/],
      ['# TYPE a counter\na{x="1"} one\n', /not a float/],
      ['# TYPE a counter\na -1\n', /counter is >= 0/],
      ['# TYPE a counter\na 1\na 2\n', /same series twice/],
      ['# TYPE a counter\n# TYPE b gauge\nb 1\na 1\n', /outside its family/],
      ['# TYPE a summary\na 1\n', /quantile label/],
      ['# TYPE a gauge\na{__x="1"} 1\n', /reserved label/],
      ['# TYPE a gauge\na 1\n# TYPE a gauge\n', /a second TYPE/],
    ];
    for (const [text, why] of bad) assert.throws(() => parseExposition(text), why, JSON.stringify(text));
  });

  test('refuses a bad port, and a port in use, naming it', async () => {
    const events = new Subject<TelemetryEvent>();
    await assert.rejects(startMetricsServer({ port: 70000, events }), /metrics: expected a port 0–65535/);
    const first = await startMetricsServer({ port: 0, events });
    try {
      await assert.rejects(
        startMetricsServer({ port: first.port, events }),
        new RegExp(`metrics: cannot listen on 127\\.0\\.0\\.1:${first.port}: .*EADDRINUSE`),
      );
    } finally {
      await first.close();
    }
  });

  test('each server has its own registry: two in one process count apart, and the global registry stays empty', async () => {
    const { register } = await import('prom-client');
    const a = new Subject<TelemetryEvent>();
    const b = new Subject<TelemetryEvent>();
    const first = await startMetricsServer({ port: 0, events: a });
    const second = await startMetricsServer({ port: 0, events: b });
    try {
      a.next({ type: 'frame', atNs: 0n, frameId: 0, sourceId: 'a', captureNs: 0n, degradeLevel: 0 });
      assert.equal(value(await scrape(first), 'percept_frames_in_total'), 1);
      assert.equal(value(await scrape(second), 'percept_frames_in_total'), 0);
      assert.equal(register.getMetricsAsArray().length, 0, 'no metric in the default registry, no default metrics');
    } finally {
      await first.close();
      await second.close();
    }
  });

  test("publisher queue depths: each topic's waiting messages as the publisher reports them when scraped", async () => {
    let queued: Record<string, number> = { actions: 0, events: 0 };
    const server = await startMetricsServer({ port: 0, events: new Subject<TelemetryEvent>(), queuedMessages: () => queued });
    try {
      assert.equal(value(await scrape(server), 'percept_publisher_queued_messages', { topic: 'actions' }), 0);
      queued = { actions: 3, events: 1 };
      const f = await scrape(server);
      assert.deepEqual(
        [
          value(f, 'percept_publisher_queued_messages', { topic: 'actions' }),
          value(f, 'percept_publisher_queued_messages', { topic: 'events' }),
        ],
        [3, 1],
      );
    } finally {
      await server.close();
    }
    const without = await startMetricsServer({ port: 0, events: new Subject<TelemetryEvent>() });
    try {
      assert.equal((await scrape(without)).has('percept_publisher_queued_messages'), false, 'no publisher, no family');
    } finally {
      await without.close();
    }
  });
});

describe('metrics.endpoint', () => {
  test('[HOST:]PORT: loopback when the host is left out; off by default; a bad value is refused naming it', () => {
    assert.equal(loadConfig({}).metrics.endpoint, null, 'off by default');
    assert.deepEqual(parseMetricsEndpoint('9464'), { host: '127.0.0.1', port: 9464 });
    assert.deepEqual(parseMetricsEndpoint('0.0.0.0:9464'), { host: '0.0.0.0', port: 9464 });
    assert.deepEqual(parseMetricsEndpoint('[::1]:9464'), { host: '::1', port: 9464 });
    assert.equal(loadConfig({ metrics: { endpoint: 'localhost:9464' } }).metrics.endpoint, 'localhost:9464');
    for (const bad of ['nine', '70000', ':9464', 'host:', '']) {
      assert.throws(
        () => loadConfig({ metrics: { endpoint: bad } }),
        (err: unknown) =>
          err instanceof ConfigError &&
          err.issues.some(
            (i) =>
              i.path === '/metrics/endpoint' &&
              i.message === `${JSON.stringify(bad)} is not [HOST:]PORT with a port 0–65535 (e.g. 9464 or 127.0.0.1:9464)`,
          ),
        bad,
      );
    }
    assert.throws(() => loadConfig({ metrics: { endpoint: 9464 } }), /\/metrics\/endpoint: must be string,null/);
    assert.throws(() => loadConfig({ metrics: { port: 9464 } }), /\/metrics\/port: is not a known property/);
  });

  test('percept run: --metrics overrides the config file, and a bad one is refused before anything starts', () => {
    const dir = mkdtempSync(join(tmpdir(), 'percept-metrics-'));
    try {
      const file = join(dir, 'config.json');
      writeFileSync(file, JSON.stringify({ metrics: { endpoint: '127.0.0.1:9464' } }));
      assert.equal(runConfig({ config: file }).metrics.endpoint, '127.0.0.1:9464', 'the file');
      assert.equal(runConfig({ config: file, metrics: '9465' }).metrics.endpoint, '9465', 'the flag wins');
      assert.equal(runConfig({ metrics: '0.0.0.0:9466' }).metrics.endpoint, '0.0.0.0:9466', 'over the default config');
      assert.throws(() => runConfig({ config: file, metrics: 'nine' }), /^Error: --metrics nine: expected PORT or HOST:PORT/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test(
    'a run of the tiny models with metrics.endpoint serves /metrics and /readyz while it runs, and closes with it',
    { timeout: 600_000 },
    async () => {
      const frames = 4;
      const port = await freePort();
      const config = loadConfig(tinyPatternRunConfig(frames, { metrics: { endpoint: `127.0.0.1:${port}` } }));
      const url = `http://127.0.0.1:${port}`;
      let during: Promise<{ ready: number; families: Map<string, Family> } | Error> | undefined;
      const { summary, failure } = await executeRun(config, {
        publish: false,
        // Scraped once the first action is out: the run is still going (three frames to go).
        onStart: (graph) => {
          graph.outputs.subscribe(() => {
            during ??= (async () => {
              const ready = (await fetch(`${url}/readyz`)).status;
              const res = await fetch(`${url}/metrics`);
              assert.equal(res.headers.get('content-type'), METRICS_CONTENT_TYPE);
              return { ready, families: parseExposition(await res.text()) };
            })().catch((err: unknown) => err as Error);
          });
        },
      });
      assert.equal(failure, undefined);
      assert.equal(summary.frames.out, frames);
      assert.ok(during, 'an action came out');
      const scraped = await during;
      if (scraped instanceof Error) throw scraped;
      assert.equal(scraped.ready, 200);
      assert.ok(value(scraped.families, 'percept_frames_in_total')! >= 1);
      assert.ok(value(scraped.families, 'percept_frames_out_total')! >= 1);
      assert.equal(scraped.families.get('percept_stage_latency_seconds')?.type, 'histogram');
      await assert.rejects(fetch(`${url}/metrics`), 'the server closed with the run');
    },
  );
});
