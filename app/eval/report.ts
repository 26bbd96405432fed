// report.html of `percept eval`: one self-contained file, with no script, CDN or fetch.
// Each number of metrics.json sits in an element with data-metric, its path, and data-value, the exact number.
// Every latency says whether it is measured or modelled (data-latency), so a modelled p99 never reads as measured.
// The plots are inline SVG: vega-lite specs compiled to vega and rendered in Node by vega's headless renderer.
import * as vega from 'vega';
import { compile, type TopLevelSpec } from 'vega-lite';
import type { EvalMetrics, EvalSeries } from './metrics.ts';

const esc = (s: string): string => s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

async function svgOf(spec: TopLevelSpec): Promise<string> {
  const view = new vega.View(vega.parse(compile(spec).spec), { renderer: 'none' });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}

const CONFIG = { view: { stroke: null }, font: 'Helvetica, Arial, sans-serif', axis: { labelFontSize: 11, titleFontSize: 12 } } as const;

function timelineSpec(series: EvalSeries, latency: string): TopLevelSpec {
  const points = series.timeline.filter((p) => p.latencyMs !== null).map((p) => ({ ...p, status: p.late ? 'late' : 'on time' }));
  const drops = series.timeline.filter((p) => p.drop !== null).map((p) => ({ t: p.t, drop: p.drop }));
  return {
    config: CONFIG,
    width: 720,
    height: 220,
    title: `End-to-end latency per frame, ${latency} (dropped frames as ticks at the bottom)`,
    layer: [
      {
        data: { values: points },
        mark: { type: 'line', point: true, strokeWidth: 1 },
        encoding: {
          x: { field: 't', type: 'quantitative', title: 'replay time (s)' },
          y: { field: 'latencyMs', type: 'quantitative', title: 'latency (ms)' },
          color: { field: 'status', type: 'nominal', scale: { domain: ['on time', 'late'], range: ['#3b6ea5', '#d1495b'] }, title: null },
        },
      },
      {
        data: { values: drops },
        mark: { type: 'tick', thickness: 2, color: '#999' },
        encoding: { x: { field: 't', type: 'quantitative' }, y: { value: 215 }, tooltip: { field: 'drop' } },
      },
    ],
  } as TopLevelSpec;
}

function histogramSpec(series: EvalSeries, metrics: EvalMetrics): TopLevelSpec {
  // One chart per stage, so each is binned over its own range.
  return {
    config: CONFIG,
    title: 'Service time per stage',
    vconcat: [...series.spans].map(([stage, ms]) => ({
      data: { values: ms.map((v) => ({ ms: v })) },
      width: 640,
      height: 70,
      title: { text: `${stage}, ${metrics.stages[stage]?.latency ?? metrics.timing.latency}`, fontSize: 12, anchor: 'start' },
      mark: { type: 'bar', color: '#3b6ea5' },
      encoding: {
        x: { field: 'ms', type: 'quantitative', bin: { maxbins: 40 }, title: 'ms' },
        y: { aggregate: 'count', type: 'quantitative', title: 'calls' },
      },
    })),
  } as TopLevelSpec;
}

function quantileSpec(metrics: EvalMetrics): TopLevelSpec {
  const values = Object.entries(metrics.stages).flatMap(([stage, q]) =>
    (['p50Ms', 'p95Ms', 'p99Ms'] as const).map((k) => ({ stage, quantile: k.slice(0, 3), ms: q[k] ?? 0 })),
  );
  return {
    config: CONFIG,
    title: `Per-stage p50 / p95 / p99, ${metrics.timing.latency}`,
    data: { values },
    width: 640,
    height: 200,
    mark: 'bar',
    encoding: {
      x: { field: 'stage', type: 'nominal', sort: Object.keys(metrics.stages), title: null },
      xOffset: { field: 'quantile' },
      y: { field: 'ms', type: 'quantitative', title: 'ms' },
      color: { field: 'quantile', type: 'nominal', scale: { range: ['#8fb3d9', '#3b6ea5', '#1d3557'] } },
    },
  } as TopLevelSpec;
}

function confusionSpec(metrics: EvalMetrics): TopLevelSpec | undefined {
  const c = metrics.accuracy?.confusion;
  if (!c || c.labels.length === 0) return undefined;
  const values = c.labels.flatMap((expected, i) => c.labels.map((predicted, j) => ({ expected, predicted, n: c.matrix[i]![j]! })));
  return {
    config: CONFIG,
    title: 'Confusion matrix (expected action × predicted action)',
    data: { values },
    width: 40 * c.labels.length,
    height: 40 * c.labels.length,
    encoding: {
      x: { field: 'predicted', type: 'nominal', sort: c.labels, title: 'predicted' },
      y: { field: 'expected', type: 'nominal', sort: c.labels, title: 'expected' },
    },
    layer: [
      { mark: 'rect', encoding: { color: { field: 'n', type: 'quantitative', scale: { scheme: 'blues' }, legend: null } } },
      { mark: { type: 'text', fontSize: 12 }, encoding: { text: { field: 'n', type: 'quantitative' } } },
    ],
  } as TopLevelSpec;
}

function dropsSpec(metrics: EvalMetrics): TopLevelSpec | undefined {
  const values = Object.entries(metrics.drops.byReason).map(([reason, n]) => ({ reason, n }));
  if (values.length === 0) return undefined;
  return {
    config: CONFIG,
    title: 'Drops by reason',
    data: { values },
    width: 400,
    height: { step: 22 },
    mark: { type: 'bar', color: '#d1495b' },
    encoding: { y: { field: 'reason', type: 'nominal', title: null }, x: { field: 'n', type: 'quantitative', title: 'frames' } },
  } as TopLevelSpec;
}

type Format = 'int' | 'pct' | 'ms' | 'ratio';
const formatValue = (v: number | null | undefined, f: Format): string =>
  v === null || v === undefined
    ? '–'
    : f === 'int'
      ? String(v)
      : f === 'pct'
        ? `${(v * 100).toFixed(2)} %`
        : f === 'ms'
          ? `${v.toFixed(2)} ms`
          : v.toFixed(3);

/** A number with its metrics.json path, so a reader (or a test) can check it against the file. */
function metric(path: string, value: number | null | undefined, format: Format): string {
  const data = value === null || value === undefined ? 'null' : String(value);
  return `<span class="metric" data-metric="${esc(path)}" data-value="${data}">${formatValue(value, format)}</span>`;
}

function latencyText(latency: string, cost: string | null): string {
  return latency === 'measured' ? 'measured' : `modelled${cost ? ` (${cost})` : ''}`;
}

export async function renderReport(metrics: EvalMetrics, series: EvalSeries): Promise<string> {
  const plots: [string, TopLevelSpec | undefined][] = [
    ['timeline', timelineSpec(series, metrics.endToEnd.latency)],
    ['quantiles', quantileSpec(metrics)],
    ['histograms', histogramSpec(series, metrics)],
    ['confusion', confusionSpec(metrics)],
    ['drops', dropsSpec(metrics)],
  ];
  const figures: string[] = [];
  for (const [name, spec] of plots) if (spec) figures.push(`<figure data-plot="${name}">${await svgOf(spec)}</figure>`);

  const a = metrics.accuracy;
  const t = metrics.tokens;
  const e2e = metrics.endToEnd.latency;
  const headline: [string, string][] = [
    ['frames in', metric('frames.in', metrics.frames.in, 'int')],
    ['frames out', metric('frames.out', metrics.frames.out, 'int')],
    ['rejected by the source', metric('frames.rejected', metrics.frames.rejected, 'int')],
    ['schema-valid rate', metric('validRate', metrics.validRate, 'pct')],
    ['deadline-miss rate', metric('deadlineMissRate', metrics.deadlineMissRate, 'pct')],
    [`end-to-end p50, ${e2e}`, metric('endToEnd.p50Ms', metrics.endToEnd.p50Ms, 'ms')],
    [`end-to-end p95, ${e2e}`, metric('endToEnd.p95Ms', metrics.endToEnd.p95Ms, 'ms')],
    [`end-to-end p99, ${e2e}`, metric('endToEnd.p99Ms', metrics.endToEnd.p99Ms, 'ms')],
  ];
  if (a) {
    headline.push(
      ['labeled frames', metric('accuracy.labeled', a.labeled, 'int')],
      ['action accuracy', metric('accuracy.action', a.action, 'pct')],
      ['target label accuracy', metric('accuracy.label', a.label, 'pct')],
      ['mean bbox IoU', metric('accuracy.meanIoU', a.meanIoU, 'ratio')],
      ['bbox IoU ≥ 0.5', metric('accuracy.iou50', a.iou50, 'pct')],
    );
  }
  if (t) {
    headline.push(
      ['token agreement', metric('tokens.tokenAgreement', t.tokenAgreement, 'pct')],
      ['identical token sequences', metric('tokens.exactMatchRate', t.exactMatchRate, 'pct')],
      ['same action', metric('tokens.actionAgreement', t.actionAgreement, 'pct')],
    );
  }
  const stageRows = Object.entries(metrics.stages).map(
    ([stage, q]) =>
      `<tr><th>${esc(stage)}</th>` +
      `<td data-latency="${q.latency}">${latencyText(q.latency, metrics.timing.stages[stage]?.cost ?? null)}</td>` +
      `<td>${metric(`stages.${stage}.count`, q.count, 'int')}</td>` +
      (['p50Ms', 'p95Ms', 'p99Ms', 'maxMs'] as const).map((k) => `<td>${metric(`stages.${stage}.${k}`, q[k], 'ms')}</td>`).join('') +
      '</tr>',
  );
  const drops = Object.entries(metrics.drops.byReason).map(
    ([r, n]) => `<tr><th>${esc(r)}</th><td>${metric(`drops.byReason.${r}`, n, 'int')}</td></tr>`,
  );
  const causes = Object.entries(metrics.drops.causes).map(([c, n]) => `<tr><th>${esc(c)}</th><td>${n}</td></tr>`);
  const about: [string, string | null][] = [
    ['bag', metrics.bag],
    ['config', metrics.config ?? '(the embedded default)'],
    ['labels', metrics.labels ?? '(none)'],
    ['recording', metrics.recording],
    ['latencies', metrics.timing.summary],
    ...(t ? ([['reference', t.reference]] as [string, string][]) : []),
  ];
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>percept eval — ${esc(metrics.bag)}</title>
<style>
body { font: 14px/1.4 Helvetica, Arial, sans-serif; margin: 24px auto; max-width: 1000px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; } th, td { padding: 3px 10px; border-bottom: 1px solid #ddd; text-align: left; }
td { text-align: right; font-variant-numeric: tabular-nums; }
.headline { display: grid; grid-template-columns: repeat(4, 1fr); gap: 8px; }
.headline div { background: #f4f6f9; padding: 8px; border-radius: 4px; } .headline .metric { display: block; font-size: 18px; font-weight: bold; }
.warning { color: #a33; } figure { margin: 16px 0; } p.modelled { background: #fff4d6; padding: 6px; }
</style>
</head>
<body>
<h1>percept eval</h1>
<table>${about.map(([k, v]) => `<tr><th>${k}</th><td style="text-align:left">${esc(v ?? '')}</td></tr>`).join('')}</table>
${metrics.warnings.length ? `<ul>${metrics.warnings.map((w) => `<li class="warning">${esc(w)}</li>`).join('')}</ul>` : ''}
<h2>Summary</h2>
<div class="headline">${headline.map(([label, value]) => `<div>${label}${value}</div>`).join('')}</div>
<h2>Stages</h2>
<p class="${e2e}" data-latency="${e2e}">Latencies are <b>${e2e}</b>: ${esc(metrics.timing.summary)}.</p>
<table><tr><th>stage</th><th>latency</th><th>calls</th><th>p50</th><th>p95</th><th>p99</th><th>max</th></tr>${stageRows.join('')}</table>
<h2>Drops</h2>
${drops.length ? `<table>${drops.join('')}</table><table><tr><th>cause</th><th>frames</th></tr>${causes.join('')}</table>` : '<p>None.</p>'}
<h2>Plots</h2>
${figures.join('\n')}
</body>
</html>
`;
}
