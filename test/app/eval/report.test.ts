// `percept eval` as a user runs it (the bin, the tiny decoder in Q8_0 with its F16 twin as the
// reference), and its report opened in a real browser: headless Chromium (Debian's chromium, which
// .ci/run installs) driven by playwright-core. The plots must render (every figure an SVG with
// marks, one timeline point per frame out), every number on the page must be the one in
// metrics.json, the page must fetch nothing, and a screenshot is saved next to the report.
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { promisify } from 'node:util';
import { chromium } from 'playwright-core';
import type { EvalMetrics } from '../../../app/eval/metrics.ts';
import { makeSampleBag } from '../../../tools/make-sample-bag.ts';

const root = new URL('../../..', import.meta.url).pathname;
const dir = join(root, '.cache/test-eval-report');
const out = join(dir, 'out');
const CHROMIUM = '/usr/bin/chromium';
// The flags that work in a container without a GPU or a network.
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-background-networking',
  '--disable-quic',
  '--no-first-run',
  '--disable-component-update',
  '--disable-sync',
];

const config = (wtype: string) => ({
  encoder: { kind: 'projection', seed: 1, tokens: 16 },
  decoder: { model: `synth:gemma4-tiny?wtype=${wtype}`, nCtx: 2048 },
  actions: { schema: join(root, 'configs/actions/robot-action.schema.json') },
  budgets: { endToEndMs: 400, stages: {}, dropPredictedMiss: false },
  ladder: { enabled: false, initial: { imageTokens: 70, maxNewTokens: 128, draft: true, frameSkip: 0 }, rungs: [] },
  virtualServiceMs: { preprocess: 4, encode: 20, decode: 90, actions: 1 },
  telemetry: { liveTable: 'off' },
});

let result: { code: number; stdout: string; stderr: string };

before(async () => {
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  await makeSampleBag(join(dir, 'six.mcap'), { frames: 6 }); // and six.labels.jsonl next to it
  writeFileSync(join(dir, 'q8.json'), JSON.stringify(config('q8_0')));
  writeFileSync(join(dir, 'f16.json'), JSON.stringify(config('f16')));
  const args = [
    'eval',
    '--bag',
    'six.mcap',
    '--config',
    'q8.json',
    '--reference',
    'f16.json',
    '--out',
    'out',
    '--fail-under',
    'valid=0,accuracy=1',
  ];
  try {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, [join(root, 'tools/percept.mjs'), ...args], {
      cwd: dir,
      timeout: 540_000,
    });
    result = { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    result = { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
});

describe('percept eval', { timeout: 600_000 }, () => {
  test('writes metrics.json and report.html, shows progress, and exits 2 with the reason when a threshold is not met', () => {
    assert.equal(result.code, 2, result.stderr);
    assert.match(result.stderr, /percept: fail-under accuracy: the action accuracy [\d.]+ is below 1\n/);
    assert.doesNotMatch(result.stderr, /fail-under valid/);
    assert.match(result.stderr, /percept eval \(run\) \|.*\| 6\/6 frames/);
    assert.match(result.stderr, /percept eval \(reference\) \|/);
    const metrics = JSON.parse(readFileSync(join(out, 'metrics.json'), 'utf8')) as EvalMetrics;
    assert.equal(metrics.frames.in, 6);
    assert.equal(metrics.accuracy?.labeled, 6);
    assert.equal(metrics.accuracy?.matched, 6, 'every label found its frame');
    assert.equal(metrics.tokens?.frames !== undefined && metrics.tokens.frames > 0, true, JSON.stringify(metrics.tokens));
    assert.ok(metrics.tokens!.tokenAgreement! > 0 && metrics.tokens!.tokenAgreement! <= 1);
    assert.match(result.stdout, /valid +[\d.]+ %/);
    // No calibration: the config's fixed figures, labelled as modelled, each stage without spread.
    assert.equal(metrics.timing.latency, 'modelled');
    assert.deepEqual(
      Object.values(metrics.timing.stages),
      Object.values(metrics.stages).map(() => ({ latency: 'modelled', cost: 'fixed' })),
    );
    for (const q of Object.values(metrics.stages)) assert.equal(q.p99Ms, q.p50Ms);
    assert.match(
      result.stdout,
      /latencies +modelled on the virtual clock, not measured; preprocess, encode, decode, actions: fixed figures \(no spread\)\n/,
    );
    assert.ok(existsSync(join(out, 'run.mcap')) && existsSync(join(out, 'reference.mcap')));
  });

  test('the report renders in Chromium: plots drawn, numbers equal to metrics.json, nothing fetched; screenshot saved', async (t) => {
    assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium; .ci/run does)`);
    const metrics = JSON.parse(readFileSync(join(out, 'metrics.json'), 'utf8')) as Record<string, unknown>;
    const browser = await chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS });
    t.after(() => browser.close());
    const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
    const report = pathToFileURL(join(out, 'report.html')).href;
    const requests: string[] = [];
    await page.route('**/*', (route) => {
      requests.push(route.request().url());
      return route.request().url() === report ? route.continue() : route.abort();
    });
    await page.goto(report);
    assert.deepEqual(requests, [report], 'the report is one self-contained file');

    // Every plot is an SVG that drew marks.
    const plots = await page.$$eval('figure[data-plot]', (figures) =>
      figures.map((f) => {
        const svg = f.querySelector('svg');
        const box = svg?.getBoundingClientRect();
        return {
          name: f.getAttribute('data-plot'),
          width: box?.width ?? 0,
          height: box?.height ?? 0,
          marks: svg?.querySelectorAll('g[class*="mark-"] path, g[class*="mark-"] rect, g[class*="mark-"] line').length ?? 0,
          symbols: svg?.querySelectorAll('g.mark-symbol.role-mark path').length ?? 0,
          texts: svg?.querySelectorAll('text').length ?? 0,
        };
      }),
    );
    assert.deepEqual(
      plots.map((p) => p.name),
      ['timeline', 'quantiles', 'histograms', 'confusion', ...((metrics.frames as { dropped: number }).dropped > 0 ? ['drops'] : [])],
    );
    for (const plot of plots) {
      assert.ok(plot.width > 100 && plot.height > 50, `${plot.name} is ${plot.width}×${plot.height}`);
      assert.ok(plot.marks > 0 && plot.texts > 0, `${plot.name}: ${plot.marks} marks, ${plot.texts} texts`);
    }
    assert.equal(plots[0]!.symbols, (metrics.frames as { out: number }).out, 'one timeline point per frame out');

    // Every number shown is the number in metrics.json, formatted.
    const shown = await page.$$eval('[data-metric]', (els) =>
      els.map((e) => ({ path: e.getAttribute('data-metric')!, value: e.getAttribute('data-value')!, text: e.textContent! })),
    );
    assert.ok(shown.length >= 20, `${shown.length} numbers`);
    const at = (path: string): unknown =>
      path.split('.').reduce<unknown>((v, k) => (v as Record<string, unknown> | undefined)?.[k], metrics);
    for (const { path, value, text } of shown) {
      const expected = at(path);
      assert.equal(value, expected === null || expected === undefined ? 'null' : String(expected), path);
      if (typeof expected !== 'number') continue;
      const n = Number.parseFloat(text);
      const scaled = text.endsWith('%') ? expected * 100 : expected;
      assert.ok(Math.abs(n - scaled) <= 0.005 + 1e-9, `${path}: shows '${text}', metrics.json has ${expected}`);
    }
    for (const path of [
      'validRate',
      'deadlineMissRate',
      'accuracy.action',
      'tokens.tokenAgreement',
      'endToEnd.p95Ms',
      'stages.decode.p99Ms',
    ]) {
      assert.ok(
        shown.some((s) => s.path === path),
        `${path} is shown`,
      );
    }

    // The page says the latencies are modelled: the note above the stage table and each stage's row.
    const latencies = await page.$$eval('[data-latency]', (els) => els.map((e) => e.getAttribute('data-latency')));
    assert.deepEqual(latencies, ['modelled', ...Object.keys(metrics.stages as object).map(() => 'modelled')]);

    const png = join(out, 'report.png');
    await page.screenshot({ path: png, fullPage: true });
    assert.ok(statSync(png).size > 20_000, `screenshot of ${statSync(png).size} bytes`);
  });
});
