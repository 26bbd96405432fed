// What `percept tune` makes of its measurements: the objective that picks a point, the Pareto front
// of quality against p99, the degrade ladder and the printed table.
//
// Objective: `max METRIC [s.t. CONSTRAINT, …]` for a quality, or `min METRIC [s.t. …]` for a cost.
//   quality      accuracy, iou, agreement, valid
//   cost         p50 and p99 in ms, miss and drop as fractions
//   constraint   `METRIC<=X` or `METRIC>=X`, where X is a number or `budget` (--budget-ms)
// p99, valid, miss and the qualities see only the published frames. Drop, every frame not published, bounds the rest.
// A bare quality metric, like the default, means `max METRIC s.t. p99<=budget, drop<=0.05`.
// Ties go to the lower p99, then to the earlier grid point.
//
// Ladder: from the chosen point, each rung steps to the reachable measured point that saves the most p99
// per unit of quality lost. A step that loses nothing comes first. Reachable means the same model, KV type,
// threads, GPU layers and edges, with fewer image or new tokens, or drafting off. A rung must save at least
// MIN_RUNG_SAVING_MS and MIN_RUNG_SAVING_SHARE of the p99 above it, since less is noise.
// The next rung starts from there, until no such point is faster.
import type { ServiceCost } from '../../pipeline/service-time.ts';
import type { Knobs } from '../../pipeline/types.ts';
import { KNOB_NAMES, knobText, sameDraft, type PointKnobs } from './grid.ts';

export const QUALITY_METRICS = ['accuracy', 'iou', 'agreement', 'valid'] as const;
export const COST_METRICS = ['p50', 'p99', 'miss', 'drop'] as const;
/** The default objective's bound on the frames not published. */
export const DEFAULT_MAX_DROP = 0.05;
export type Metric = (typeof QUALITY_METRICS)[number] | (typeof COST_METRICS)[number];

export interface Constraint {
  readonly metric: Metric;
  readonly op: '<=' | '>=';
  readonly value: number | 'budget';
}

export interface Objective {
  readonly sense: 'max' | 'min';
  readonly metric: Metric;
  readonly constraints: readonly Constraint[];
  /** The quality of the Pareto table: the objective's metric, else the first quality constraint's. */
  readonly quality: (typeof QUALITY_METRICS)[number];
  readonly text: string;
}

const isQuality = (m: string): m is (typeof QUALITY_METRICS)[number] => (QUALITY_METRICS as readonly string[]).includes(m);
const isMetric = (m: string): m is Metric => isQuality(m) || (COST_METRICS as readonly string[]).includes(m);

/** What the inputs make measurable: accuracy and iou need labels, agreement a reference. */
export interface Measurable {
  readonly labels: boolean;
  readonly reference: boolean;
}

function checkAvailable(metric: Metric, have: Measurable, spec: string): void {
  if ((metric === 'accuracy' || metric === 'iou') && !have.labels)
    throw new Error(`--objective '${spec}': ${metric} needs labels (--labels, or BAG.labels.jsonl next to the bag)`);
  if (metric === 'agreement' && !have.reference) throw new Error(`--objective '${spec}': agreement needs --reference CONFIG`);
}

/** The default quality: accuracy with labels, else agreement with a reference, else the valid rate. */
export function defaultQuality(have: Measurable): (typeof QUALITY_METRICS)[number] {
  return have.labels ? 'accuracy' : have.reference ? 'agreement' : 'valid';
}

/** Parses --objective. Absent, it is `max <default quality> s.t. p99<=budget, drop<=0.05`. */
export function parseObjective(spec: string | undefined, have: Measurable): Objective {
  const text = (spec ?? defaultQuality(have)).trim().replace(/\s+/g, ' ');
  const bare = isQuality(text);
  const m = bare ? null : /^(max|min) (\w+)(?: (?:s\.t\.|st|subject to) (.+))?$/.exec(text);
  if (!bare && !m)
    throw new Error(
      `--objective '${text}': expected 'max METRIC [s.t. CONSTRAINT, …]', 'min METRIC [s.t. …]' or a quality metric (${QUALITY_METRICS.join(', ')})`,
    );
  const sense = bare ? 'max' : (m![1] as 'max' | 'min');
  const metric = bare ? text : m![2]!;
  if (!isMetric(metric))
    throw new Error(`--objective '${text}': unknown metric '${metric}' (known: ${[...QUALITY_METRICS, ...COST_METRICS].join(', ')})`);
  if (sense === 'max' && !isQuality(metric))
    throw new Error(`--objective '${text}': max is for a quality (${QUALITY_METRICS.join(', ')}); use min ${metric}`);
  if (sense === 'min' && isQuality(metric))
    throw new Error(`--objective '${text}': min is for a cost (${COST_METRICS.join(', ')}); use max ${metric}`);
  checkAvailable(metric, have, text);
  const constraintText = bare ? `p99<=budget, drop<=${DEFAULT_MAX_DROP}` : (m![3] ?? '');
  const constraints = constraintText
    .split(/,| and /)
    .map((c) => c.trim())
    .filter(Boolean)
    .map((c): Constraint => {
      const cm = /^(\w+) ?(<=|>=) ?(budget|\d+(?:\.\d+)?)$/.exec(c);
      if (!cm) throw new Error(`--objective '${text}': constraint '${c}' is not METRIC<=X or METRIC>=X`);
      const [, name, op, raw] = cm as unknown as [string, string, '<=' | '>=', string];
      if (!isMetric(name)) throw new Error(`--objective '${text}': unknown metric '${name}' in '${c}'`);
      checkAvailable(name, have, text);
      if (raw === 'budget' && name !== 'p50' && name !== 'p99')
        throw new Error(`--objective '${text}': 'budget' bounds p50 or p99, not ${name}`);
      const value = raw === 'budget' ? 'budget' : Number(raw);
      if (value !== 'budget' && name !== 'p50' && name !== 'p99' && value > 1)
        throw new Error(`--objective '${text}': ${name} is a fraction in [0, 1], got ${raw}`);
      return { metric: name, op, value };
    });
  const quality = isQuality(metric) ? metric : (constraints.map((c) => c.metric).find(isQuality) ?? defaultQuality(have));
  return { sense, metric, constraints, quality, text: bare ? `max ${text} s.t. ${constraintText}` : text };
}

// ---- results ---------------------------------------------------------------------------------------

export interface Quantiles {
  readonly p50Ms: number | null;
  readonly p99Ms: number | null;
}

/** What one grid point measured. Every rate is in [0, 1], and null where not measurable. */
export interface PointResult {
  readonly index: number;
  readonly label: string;
  readonly knobs: PointKnobs;
  /** The ladder's knobs at this point. */
  readonly ladder: Knobs;
  readonly status: 'ok' | 'failed';
  /** Why the point could not be measured. */
  readonly error: string | null;
  readonly frames: { readonly in: number; readonly out: number; readonly dropped: number };
  readonly dropsByReason: Readonly<Record<string, number>>;
  readonly endToEnd: Quantiles;
  readonly stages: Readonly<Record<string, Quantiles>>;
  readonly missRate: number | null;
  /** Frames not published ÷ frames in, whatever dropped them. Null when no frame came in. */
  readonly dropRate: number | null;
  readonly validRate: number | null;
  readonly accuracy: number | null;
  readonly iou: number | null;
  readonly agreement: number | null;
  /** Each stage's cost at this point: what the virtual clock charged, or the distribution of its measured calls. */
  readonly serviceMs: Readonly<Record<string, ServiceCost>>;
}

export function metricOf(r: PointResult, metric: Metric): number | null {
  switch (metric) {
    case 'accuracy':
      return r.accuracy;
    case 'iou':
      return r.iou;
    case 'agreement':
      return r.agreement;
    case 'valid':
      return r.validRate;
    case 'miss':
      return r.missRate;
    case 'drop':
      return r.dropRate;
    case 'p50':
      return r.endToEnd.p50Ms;
    case 'p99':
      return r.endToEnd.p99Ms;
  }
}

/** Whether a point meets every constraint (a metric it could not measure meets none). */
export function feasible(r: PointResult, objective: Objective, budgetMs: number): boolean {
  if (r.status !== 'ok') return false;
  return objective.constraints.every(({ metric, op, value }) => {
    const v = metricOf(r, metric);
    const limit = value === 'budget' ? budgetMs : value;
    return v !== null && (op === '<=' ? v <= limit : v >= limit);
  });
}

const byP99 = (a: PointResult, b: PointResult): number =>
  (a.endToEnd.p99Ms ?? Infinity) - (b.endToEnd.p99Ms ?? Infinity) || a.index - b.index;

/** The point the objective picks, or undefined when none is feasible. */
export function choose(results: readonly PointResult[], objective: Objective, budgetMs: number): PointResult | undefined {
  const sign = objective.sense === 'max' ? 1 : -1;
  let best: PointResult | undefined;
  for (const r of results) {
    const v = metricOf(r, objective.metric);
    if (v === null || !feasible(r, objective, budgetMs)) continue;
    const b = best ? metricOf(best, objective.metric)! : undefined;
    if (!best || sign * (v - b!) > 0 || (v === b && byP99(r, best) < 0)) best = r;
  }
  return best;
}

/** The indices of the points no other point beats on both higher quality and lower p99. */
export function paretoFront(results: readonly PointResult[], quality: Metric): Set<number> {
  const measured = results.filter((r) => r.status === 'ok' && r.endToEnd.p99Ms !== null && metricOf(r, quality) !== null);
  const front = new Set<number>();
  for (const r of measured) {
    const [q, p] = [metricOf(r, quality)!, r.endToEnd.p99Ms!];
    const dominated = measured.some((o) => {
      const [oq, op] = [metricOf(o, quality)!, o.endToEnd.p99Ms!];
      return oq >= q && op <= p && (oq > q || op < p);
    });
    if (!dominated) front.add(r.index);
  }
  return front;
}

/** The rung that turns point `from` into point `to`, or null when the ladder cannot (see the top). */
export function rungBetween(from: PointResult, to: PointResult): Partial<Knobs> | null {
  const fixed = (k: PointKnobs) => JSON.stringify([k.model, k.kvType, k.threads, k.gpuLayers, k.edges]);
  if (fixed(from.knobs) !== fixed(to.knobs)) return null;
  const [a, b] = [from.ladder, to.ladder];
  if (b.imageTokens > a.imageTokens || b.maxNewTokens > a.maxNewTokens || (b.draft && !a.draft)) return null;
  // Drafting stays on with the same speculator, since a rung cannot change it.
  if (a.draft && b.draft && !sameDraft(from.knobs.draft, to.knobs.draft)) return null;
  const rung: { -readonly [K in keyof Knobs]?: Knobs[K] } = {};
  if (b.imageTokens < a.imageTokens) rung.imageTokens = b.imageTokens;
  if (b.maxNewTokens < a.maxNewTokens) rung.maxNewTokens = b.maxNewTokens;
  if (a.draft && !b.draft) rung.draft = false;
  return Object.keys(rung).length > 0 ? rung : null;
}

/** The least p99 a rung must save: 1 ms, and 2 % of the p99 of the level above. */
export const MIN_RUNG_SAVING_MS = 1;
export const MIN_RUNG_SAVING_SHARE = 0.02;

export interface LadderStep {
  readonly rung: Partial<Knobs>;
  /** The grid point this level runs as. */
  readonly index: number;
  readonly label: string;
  /** p99 saved against the level above (ms). */
  readonly savedMs: number;
  /** Quality lost against the level above. Negative means gained. */
  readonly qualityLost: number;
  /** savedMs / qualityLost; null when nothing was lost. */
  readonly msPerUnit: number | null;
}

/** The degrade ladder below `chosen` (see the top of this file). */
export function orderLadder(results: readonly PointResult[], chosen: PointResult, quality: Metric): LadderStep[] {
  const usable = results.filter((r) => r.status === 'ok' && r.endToEnd.p99Ms !== null && metricOf(r, quality) !== null);
  const steps: LadderStep[] = [];
  let at = chosen;
  for (;;) {
    let best: { step: LadderStep; ratio: number } | undefined;
    for (const r of usable) {
      const rung = rungBetween(at, r);
      if (!rung) continue;
      const savedMs = at.endToEnd.p99Ms! - r.endToEnd.p99Ms!;
      // Less is noise, and a free "saving" of almost nothing would become the first rung.
      if (!(savedMs >= Math.max(MIN_RUNG_SAVING_MS, MIN_RUNG_SAVING_SHARE * at.endToEnd.p99Ms!))) continue;
      const qualityLost = metricOf(at, quality)! - metricOf(r, quality)!;
      const ratio = qualityLost > 0 ? savedMs / qualityLost : Infinity;
      const better = !best || ratio > best.ratio || (ratio === best.ratio && savedMs > best.step.savedMs);
      if (better)
        best = { step: { rung, index: r.index, label: r.label, savedMs, qualityLost, msPerUnit: qualityLost > 0 ? ratio : null }, ratio };
    }
    if (!best) return steps;
    steps.push(best.step);
    at = results.find((r) => r.index === best.step.index)!;
  }
}

// ---- the printed table -----------------------------------------------------------------------------

const ms = (v: number | null): string => (v === null ? '-' : v.toFixed(1));
const pct = (v: number | null): string => (v === null ? '-' : `${(v * 100).toFixed(1)}%`);

export interface TableInput {
  readonly results: readonly PointResult[];
  readonly front: ReadonlySet<number>;
  readonly chosen: PointResult | undefined;
  readonly objective: Objective;
  readonly budgetMs: number;
  readonly measurable: Measurable;
}

/** The Pareto table: every point by p99, the front marked '*', the chosen point '>'. */
export function formatTable(t: TableInput): string {
  const stages = [...new Set(t.results.flatMap((r) => Object.keys(r.stages)))];
  const columns: [string, (r: PointResult) => string][] = [
    ['', (r) => `${t.chosen?.index === r.index ? '>' : ' '}${t.front.has(r.index) ? '*' : ' '}`],
    ['point', (r) => r.label],
    [`${t.objective.quality}`, (r) => pct(metricOf(r, t.objective.quality))],
    ['e2e p50', (r) => ms(r.endToEnd.p50Ms)],
    ['e2e p99', (r) => ms(r.endToEnd.p99Ms)],
    ...stages.map((s): [string, (r: PointResult) => string] => [
      `${s} p50/p99`,
      (r) => (r.stages[s] ? `${ms(r.stages[s].p50Ms)}/${ms(r.stages[s].p99Ms)}` : '-'),
    ]),
    ['miss', (r) => pct(r.missRate)],
    ['drop', (r) => pct(r.dropRate)],
    ['valid', (r) => pct(r.validRate)],
    ...(t.measurable.labels && t.objective.quality !== 'accuracy'
      ? [['accuracy', (r: PointResult) => pct(r.accuracy)] as [string, (r: PointResult) => string]]
      : []),
    ...(t.measurable.reference && t.objective.quality !== 'agreement'
      ? [['agreement', (r: PointResult) => pct(r.agreement)] as [string, (r: PointResult) => string]]
      : []),
    ['out/in', (r) => `${r.frames.out}/${r.frames.in}`],
    [
      '',
      (r) =>
        r.status === 'failed' ? `FAILED: ${r.error?.replace(/\s*\n\s*/g, ' ')}` : feasible(r, t.objective, t.budgetMs) ? '' : 'infeasible',
    ],
  ];
  const sorted = [...t.results].sort(byP99);
  const cells = [columns.map(([h]) => h), ...sorted.map((r) => columns.map(([, f]) => f(r)))];
  const widths = columns.map((_, i) => Math.max(...cells.map((row) => row[i]!.length)));
  return cells
    .map((row) =>
      row
        .map((c, i) => (i <= 1 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!)))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}

/** A rung in words: `imageTokens 70, draft off`. */
export function rungText(rung: Partial<Knobs>): string {
  const parts: string[] = [];
  if (rung.imageTokens !== undefined) parts.push(`imageTokens ${rung.imageTokens}`);
  if (rung.maxNewTokens !== undefined) parts.push(`maxNewTokens ${rung.maxNewTokens}`);
  if (rung.draft === false) parts.push('draft off');
  return parts.join(', ');
}

/** The knobs of a point in words, every knob (for the chosen point). */
export function knobsText(knobs: PointKnobs): string {
  return KNOB_NAMES.map((name) => `${name}=${knobText(name, knobs[name])}`).join(' ');
}
