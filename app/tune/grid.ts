// The grid `percept tune` sweeps: the grid file, its points and the config each point runs with.
// A point is one combination of the knobs' values. The file's schema is configs/tune-grid.schema.json.
//
//   {"knobs": {"imageTokens": [280, 140, 70], "draft": [{"kind": "none"}, {"kind": "ngram", "max": 4}], …}}
//
// A knob the file leaves out keeps the base config's value. Paths (model, draft.model) are relative
// to the grid file. Everything is checked before anything runs, each `edges` value against the config
// schema too. Each problem names its JSON path.
import { readFileSync } from 'node:fs';
import { dirname, isAbsolute, resolve } from 'node:path';
import { Ajv } from 'ajv';
import { DRAFT_MAX } from '../../native/llama.ts';
import { ConfigError, describeAjvError, loadConfig, type ConfigIssue, type PerceptConfig } from '../../pipeline/config.ts';
import type { ServiceCost } from '../../pipeline/service-time.ts';
import type { Knobs } from '../../pipeline/types.ts';
import { parseSourceSpec } from '../run/run.ts';

export type DraftChoice =
  | { readonly kind: 'none' }
  | { readonly kind: 'model' | 'mtp'; readonly model: string; readonly max?: number }
  | { readonly kind: 'ngram'; readonly max?: number };

/** One point's settings of every knob the tuner turns. */
export interface PointKnobs {
  readonly imageTokens: number;
  /** decoder.maxNewTokens. Null means the action grammar's worst case. */
  readonly maxNewTokens: number | null;
  readonly draft: DraftChoice;
  readonly kvType: 'f16' | 'q8_0';
  /** decoder.model. */
  readonly model: string;
  readonly threads: number | null;
  readonly gpuLayers: number;
  readonly edges: PerceptConfig['edges'];
}

export const KNOB_NAMES = ['model', 'kvType', 'threads', 'gpuLayers', 'draft', 'imageTokens', 'maxNewTokens', 'edges'] as const;
export type KnobName = (typeof KNOB_NAMES)[number];

export interface Grid {
  /** Per knob, the values to try: the grid file's, or the base config's value alone. */
  readonly axes: { readonly [K in KnobName]: readonly PointKnobs[K][] };
  /** The knobs the grid file lists. */
  readonly listed: readonly KnobName[];
  /** The grid file, or '(default grid)'. */
  readonly origin: string;
  /** The combinations to run, as each knob's value index, when not every one of the axes' is run.
   * The virtual mode's default grid runs only the ladder's own levels. */
  readonly combos?: readonly Readonly<Record<KnobName, number>>[];
}

export interface GridPoint {
  readonly index: number;
  readonly knobs: PointKnobs;
  /** Per knob, the index of its value in the grid's axis (a JSON path is /knobs/NAME/INDEX). */
  readonly at: Readonly<Record<KnobName, number>>;
  /** The knobs that vary across the grid, as `name=value` words. */
  readonly label: string;
}

/** A grid that cannot run: every problem, each naming its JSON path in the grid file. */
export class GridError extends Error {
  readonly issues: readonly ConfigIssue[];
  constructor(origin: string, issues: readonly ConfigIssue[]) {
    super(`invalid tune grid ${origin}:\n${issues.map((i) => `  ${i.path || '/'}: ${i.message}`).join('\n')}`);
    this.name = 'GridError';
    this.issues = issues;
  }
}

const GRID_SCHEMA = new URL('../../configs/tune-grid.schema.json', import.meta.url);

let validateGrid: ReturnType<Ajv['compile']> | undefined;
function compileGridSchema() {
  validateGrid ??= new Ajv({ strict: true, allErrors: true, discriminator: true }).compile(
    JSON.parse(readFileSync(GRID_SCHEMA, 'utf8')) as object,
  );
  return validateGrid;
}

/** A model spec from a grid file: a path relative to the file becomes absolute. `synth:` specs, URLs
 * and a remote decoder's served model ids stay as written. */
function resolveSpec(spec: string, base: string, remote: boolean): string {
  if (remote || /^[a-z][a-z0-9+.-]*:/i.test(spec) || isAbsolute(spec)) return spec;
  return resolve(base, spec);
}

/** The speculation a decoder's settings name. */
export function speculatorOf(d: {
  readonly draft?: string | null;
  readonly draftMtp?: string | null;
  readonly ngram: boolean;
  readonly draftMax: number | null;
}): DraftChoice {
  const max = d.draftMax !== null ? { max: d.draftMax } : {};
  if (d.draft) return { kind: 'model', model: d.draft, ...max };
  if (d.draftMtp) return { kind: 'mtp', model: d.draftMtp, ...max };
  return d.ngram ? { kind: 'ngram', ...max } : { kind: 'none' };
}

/** The same speculation: kind, model and longest draft, where none given is the decoder's DRAFT_MAX. */
export const sameDraft = (a: DraftChoice, b: DraftChoice): boolean =>
  a.kind === b.kind &&
  ('model' in a ? a.model : null) === ('model' in b ? b.model : null) &&
  (a.kind === 'none' || (('max' in a ? a.max : undefined) ?? DRAFT_MAX) === (('max' in b ? b.max : undefined) ?? DRAFT_MAX));

/** The base config's own knobs (a grid leaves out what it does not sweep). Drafting off at the
 * ladder's first level is no speculation: no rung can turn it on. */
export function baseKnobs(config: PerceptConfig): PointKnobs {
  const { decoder, ladder } = config;
  const draft: DraftChoice = ladder.initial.draft ? speculatorOf(decoder) : { kind: 'none' };
  return {
    imageTokens: ladder.initial.imageTokens,
    maxNewTokens: decoder.maxNewTokens,
    draft,
    kvType: decoder.kvType,
    model: decoder.model,
    threads: decoder.threads,
    gpuLayers: decoder.gpuLayers,
    edges: config.edges,
  };
}

const single = (k: PointKnobs): Grid['axes'] => ({
  model: [k.model],
  kvType: [k.kvType],
  threads: [k.threads],
  gpuLayers: [k.gpuLayers],
  draft: [k.draft],
  imageTokens: [k.imageTokens],
  maxNewTokens: [k.maxNewTokens],
  edges: [k.edges],
});

/** The grid without a grid file: the image-token counts of the base ladder's levels, and drafting on
 * and off when it drafts. With `levels` false, every combination of the two, since real runs measure any.
 * With `levels` true, for virtual mode, the ladder's own levels once each. A calibration measured only those. */
export function defaultGrid(config: PerceptConfig, opts: { readonly levels?: boolean } = {}): Grid {
  const base = baseKnobs(config);
  let knobs: Knobs = config.ladder.initial;
  const levels = [knobs];
  for (const rung of config.ladder.rungs) {
    knobs = { ...knobs, ...rung };
    levels.push(knobs);
  }
  const imageTokens = [...new Set(levels.map((l) => l.imageTokens))];
  const draft: DraftChoice[] = base.draft.kind === 'none' ? [base.draft] : [base.draft, { kind: 'none' }];
  const listed: KnobName[] = imageTokens.length > 1 ? ['imageTokens'] : [];
  if (draft.length > 1) listed.push('draft');
  const axes = { ...single(base), imageTokens, draft };
  if (!opts.levels) return { axes, listed, origin: '(default grid)' };
  // Drafting on is the base speculator, draft[0], and off is the last value.
  const at = (l: Knobs) => `${imageTokens.indexOf(l.imageTokens)}:${l.draft ? 0 : draft.length - 1}`;
  const combos = [...new Set(levels.map(at))].map((key) => {
    const [i, d] = key.split(':').map(Number) as [number, number];
    return { ...Object.fromEntries(KNOB_NAMES.map((name) => [name, 0])), imageTokens: i, draft: d } as Record<KnobName, number>;
  });
  const varies = (name: KnobName) => new Set(combos.map((c) => c[name])).size > 1;
  return { axes, listed: listed.filter(varies), origin: "(default grid: the ladder's levels)", combos };
}

/** Reads and checks a grid file against the base config; throws GridError naming every problem. */
export function loadGrid(path: string, config: PerceptConfig): Grid {
  let data: unknown;
  try {
    data = JSON.parse(readFileSync(path, 'utf8'));
  } catch (err) {
    throw new GridError(path, [{ path: '', message: `cannot read it as JSON (${(err as Error).message})` }]);
  }
  const validate = compileGridSchema();
  if (!validate(data)) {
    const issues = new Map<string, ConfigIssue>();
    for (const error of validate.errors ?? []) {
      const issue = describeAjvError(error);
      const unknownKnob = error.keyword === 'additionalProperties' && error.instancePath === '/knobs';
      const described = unknownKnob ? { ...issue, message: `is not a knob percept tune turns (known: ${KNOB_NAMES.join(', ')})` } : issue;
      issues.set(`${described.path}\0${described.message}`, described);
    }
    throw new GridError(path, [...issues.values()]);
  }
  const file = data as { knobs: Partial<Record<KnobName, unknown[]>> };
  const dir = dirname(resolve(path));
  const remote = config.decoder.kind === 'openai';
  const issues: ConfigIssue[] = [];
  const axes: Record<string, readonly unknown[]> = { ...single(baseKnobs(config)) };
  for (const [name, values] of Object.entries(file.knobs) as [KnobName, unknown[]][]) {
    if (name === 'model') axes.model = (values as string[]).map((spec) => resolveSpec(spec, dir, remote));
    else if (name === 'draft')
      axes.draft = (values as DraftChoice[]).map((d) => ('model' in d ? { ...d, model: resolveSpec(d.model, dir, false) } : d));
    else if (name === 'edges') axes.edges = values.map((edges, i) => checkEdges(edges, `/knobs/edges/${i}`, issues));
    else axes[name] = values;
  }
  if (remote) {
    for (const name of ['kvType', 'threads', 'gpuLayers', 'draft'] as const) {
      if (file.knobs[name])
        issues.push({ path: `/knobs/${name}`, message: 'applies to decoder.kind "local" only (the base config decodes remotely)' });
    }
  }
  if (issues.length > 0) throw new GridError(path, issues);
  return { axes: axes as unknown as Grid['axes'], listed: Object.keys(file.knobs) as KnobName[], origin: path };
}

/** An `edges` value, checked and defaulted by the config schema; its problems go to `issues`. */
function checkEdges(edges: unknown, at: string, issues: ConfigIssue[]): PerceptConfig['edges'] {
  try {
    return loadConfig({ edges }).edges;
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    for (const issue of err.issues) issues.push({ path: `${at}${issue.path.replace(/^\/edges/, '')}`, message: issue.message });
    return { default: { policy: 'latest' } };
  }
}

// ---- points --------------------------------------------------------------------------------------

const fileName = (spec: string): string => (spec.startsWith('synth:') ? spec : (spec.split('/').at(-1) ?? spec));

function edgesText(edges: PerceptConfig['edges']): string {
  const policy = (e: PerceptConfig['edges'][string]): string => (e.policy === 'queue' ? `queue${e.capacity}` : e.policy);
  return Object.entries(edges)
    .map(([stage, e]) => (stage === 'default' ? policy(e) : `${stage}:${policy(e)}`))
    .join(',');
}

/** A knob's value in words (the table's point column, error messages). */
export function knobText(name: KnobName, value: unknown): string {
  switch (name) {
    case 'draft': {
      const d = value as DraftChoice;
      if (d.kind === 'none') return 'none';
      const max = d.max !== undefined ? `/${d.max}` : '';
      return d.kind === 'ngram' ? `ngram${max}` : `${d.kind}:${fileName(d.model)}${max}`;
    }
    case 'model':
      return fileName(value as string);
    case 'maxNewTokens':
    case 'threads':
      return value === null ? 'auto' : String(value);
    case 'edges':
      return edgesText(value as PerceptConfig['edges']);
    default:
      return String(value);
  }
}

/** Every combination of the axes' values, the first knob varying slowest (or the grid's own
 * combinations, in their order). */
export function gridPoints(grid: Grid): GridPoint[] {
  let combos: Record<string, number>[] = [{}];
  for (const name of KNOB_NAMES) combos = combos.flatMap((c) => grid.axes[name].map((_, i) => ({ ...c, [name]: i })));
  if (grid.combos) combos = grid.combos.map((c) => ({ ...c }));
  const varying = KNOB_NAMES.filter((name) => new Set(combos.map((c) => c[name])).size > 1);
  return combos.map((at, index) => {
    const knobs = Object.fromEntries(KNOB_NAMES.map((name) => [name, grid.axes[name][at[name]!]])) as unknown as PointKnobs;
    const label = varying.map((name) => `${name}=${knobText(name, knobs[name])}`).join(' ') || 'base';
    return { index, knobs, at: at as Record<KnobName, number>, label };
  });
}

// ---- the config of a point -------------------------------------------------------------------------

/** How a point runs: lockstep or at the recorded pace on the virtual clock, or on the real clock. */
export type Replay = 'lockstep' | 'virtual-recorded' | 'real';

export interface PointSetup {
  readonly bag: string;
  readonly budgetMs: number;
  readonly replay: Replay;
  /** Virtual clock: each stage's service time in ms at this point. */
  readonly serviceMs: Readonly<Record<string, ServiceCost>>;
  /** The ladder knob maxNewTokens at this point (the decoder's effective budget). */
  readonly maxNewTokensKnob: number;
  readonly recording: string;
}

/** The ladder knobs of a point. */
export function pointLadderKnobs(knobs: PointKnobs, maxNewTokensKnob: number): Knobs {
  return { imageTokens: knobs.imageTokens, maxNewTokens: maxNewTokensKnob, draft: knobs.draft.kind !== 'none', frameSkip: 0 };
}

/** The decoder section with a point's knobs. */
export function pointDecoder(base: PerceptConfig['decoder'], knobs: PointKnobs): PerceptConfig['decoder'] {
  const { draft } = knobs;
  return {
    ...base,
    model: knobs.model,
    draft: draft.kind === 'model' ? draft.model : null,
    draftMtp: draft.kind === 'mtp' ? draft.model : null,
    ngram: draft.kind === 'ngram',
    draftMax: draft.kind !== 'none' ? (draft.max ?? null) : null,
    kvType: knobs.kvType,
    threads: knobs.threads,
    gpuLayers: knobs.gpuLayers,
    maxNewTokens: knobs.maxNewTokens,
  };
}

/** Stage budgets no larger than the end-to-end budget (a config refuses larger ones). */
export function budgetsFor(base: PerceptConfig['budgets'], endToEndMs: number): PerceptConfig['budgets'] {
  const stages = Object.fromEntries(Object.entries(base.stages).map(([stage, ms]) => [stage, Math.min(ms, endToEndMs)]));
  return { ...base, endToEndMs, stages };
}

/**
 * The config one point runs with, for loadConfig: the base config with the point's knobs and the bag as
 * its source. The ladder is held at the point, since a point measures its own knobs. The recorder is on
 * without frames, and there is no control socket.
 */
export function pointConfig(base: PerceptConfig, knobs: PointKnobs, setup: PointSetup): Record<string, unknown> {
  const source = { ...parseSourceSpec(`bag:${setup.bag}`, base.source), pace: 'recorded', loop: false };
  return {
    ...base,
    source,
    decoder: pointDecoder(base.decoder, knobs),
    edges: knobs.edges,
    budgets: budgetsFor(base.budgets, setup.budgetMs),
    ladder: { ...base.ladder, enabled: false, initial: pointLadderKnobs(knobs, setup.maxNewTokensKnob), rungs: [] },
    clock: setup.replay === 'real' ? 'real' : 'virtual',
    lockstep: setup.replay === 'lockstep',
    virtualServiceMs: setup.replay === 'real' ? {} : setup.serviceMs,
    recorder: { ...base.recorder, enabled: true, path: setup.recording, frames: false, profile: '' },
    control: { ...base.control, enabled: false },
    telemetry: { ...base.telemetry, liveTable: 'off' },
  };
}
