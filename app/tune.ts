// `percept tune`: sweeps knobs on a bag and writes the config the objective picks.
//
// Each grid point (app/tune-grid.ts) is one run of the bag through app/run.ts's machinery, recorded
// and measured as `percept eval` measures (app/eval.ts): per-stage and end-to-end p50/p99,
// deadline-miss rate, schema-valid rate, accuracy against labels, and, with --reference, the token
// agreement with the reference decoder's run. Two modes:
//   virtual  the virtual clock charges each stage the service time `percept calibrate` measured for
//            the point's knobs; the bag replays in lockstep (or at its recorded pace with --pace
//            recorded, where frames wait on edges and the edge policies matter). The stages still run
//            (so quality is real), but no time is measured.
//   real     the real clock, the bag at its recorded pace: everything measured on this machine.
// Virtual mode models a point when a calibration measured it: image tokens, max new tokens and drafting
// on/off are the levels of one calibration; a decoder model, KV type, threads, GPU layers or speculator
// needs a calibration made with it. Anything else is refused before anything runs.
//
// Then (app/tune-select.ts) the Pareto table, the point the objective picks, and the config written to
// --out: the base config with the chosen knobs, the budget, and a degrade ladder ordered by measured ms
// saved per unit of quality lost, each level's stage costs as its virtualServiceMs.
//
// Resume: a state file next to --out (NAME.tune-state.json) holds each measured point under a key
// that hashes the point's whole config with the bag, labels, reference and model files; a rerun
// measures only the points it lacks. SIGINT/SIGTERM stop the point in flight, which is not kept.
import { createHash } from 'node:crypto';
import { createReadStream, existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, isAbsolute, join, relative, resolve, sep } from 'node:path';
import cliProgress from 'cli-progress';
import { LlamaModel } from '../native/llama.ts';
import { loadActionSchema, type ActionSchema } from '../nodes/action-schema.ts';
import { actionTokenBudget } from '../nodes/decoder.ts';
import { resolveModel, type ModelKind } from '../models/resolve.ts';
import { ConfigError, PATH_FIELDS, loadConfig, type ConfigIssue, type PerceptConfig } from '../pipeline/config.ts';
import type { Graph } from '../pipeline/graph/graph.ts';
import type { Knobs } from '../pipeline/types.ts';
import type { CalibrationFile } from './calibrate.ts';
import { measure, readRecording, type EvalMetrics, type Recording } from './eval.ts';
import { loadLabels, type Label } from './labels.ts';
import { DEFAULT_CONFIG, executeRun, runFailure } from './run.ts';
import {
  GridError,
  budgetsFor,
  defaultGrid,
  gridPoints,
  knobText,
  loadGrid,
  pointConfig,
  pointDecoder,
  pointLadderKnobs,
  type DraftChoice,
  type Grid,
  type GridPoint,
  type KnobName,
  type PointKnobs,
  type Replay,
} from './tune-grid.ts';
import {
  choose,
  feasible,
  formatTable,
  knobsText,
  metricOf,
  orderLadder,
  paretoFront,
  parseObjective,
  rungText,
  type LadderStep,
  type Measurable,
  type Metric,
  type PointResult,
} from './tune-select.ts';

const log = (msg: string) => process.stderr.write(`percept: ${msg}\n`);

export interface TuneOptions {
  readonly bag: string;
  readonly budgetMs: number;
  readonly grid?: string;
  readonly objective?: string;
  /** Default: BAG.labels.jsonl when it exists. */
  readonly labels?: string;
  /** A config whose decoder is the reference (e.g. the F16 model): agreement is measured against it. */
  readonly reference?: string;
  readonly config?: string;
  /** Default: virtual when a calibration is given (or named by the config), else real. */
  readonly mode?: 'virtual' | 'real';
  readonly calibration?: readonly string[];
  /** Virtual mode: lockstep (default) or the bag's recorded pace. */
  readonly pace?: 'lockstep' | 'recorded';
  readonly out: string;
  readonly progress?: boolean;
}

export interface TunedPoint extends PointResult {
  readonly pareto: boolean;
  readonly feasible: boolean;
  /** Taken from the state file (measured by an earlier run of the same tune). */
  readonly resumed: boolean;
}

export interface TuneResult {
  readonly kind: 'percept.tune';
  readonly version: 1;
  readonly bag: string;
  readonly config: string;
  readonly labels: string | null;
  readonly reference: string | null;
  readonly grid: string;
  readonly mode: 'virtual' | 'real';
  readonly replay: Replay;
  readonly calibrations: readonly string[];
  readonly budgetMs: number;
  readonly objective: string;
  readonly quality: Metric;
  readonly points: readonly TunedPoint[];
  /** Points measured by this run, and taken from the state file. */
  readonly ran: number;
  readonly resumed: number;
  readonly chosen: { readonly index: number; readonly label: string; readonly knobs: PointKnobs } | null;
  readonly ladder: readonly LadderStep[];
  /** The config written, or null when no point met the objective's constraints. */
  readonly out: string | null;
  readonly state: string;
}

/** Ctrl-C or kill during a tune: the measured points are in the state file. */
export class TuneInterrupted extends Error {
  constructor(signal: string, done: number, total: number, state: string) {
    super(
      `tune interrupted by ${signal} after ${done} of ${total} points (kept in ${state}); run the same command again to measure the rest`,
    );
    this.name = 'TuneInterrupted';
  }
}

// ---- calibrations ------------------------------------------------------------------------------------

interface Calibration {
  readonly path: string;
  readonly levels: readonly Knobs[];
  readonly serviceMs: Readonly<Record<string, readonly number[]>>;
  readonly decoder: string;
  readonly encoder: string | null;
  readonly speculator: DraftChoice;
  readonly kvType: PointKnobs['kvType'];
  readonly threads: number | null;
  readonly gpuLayers: number;
}

function readCalibration(path: string): Calibration {
  let file: CalibrationFile;
  try {
    file = JSON.parse(readFileSync(path, 'utf8')) as CalibrationFile;
  } catch (err) {
    throw new Error(`--calibration ${path}: ${(err as Error).message}`, { cause: err });
  }
  const bad = (what: string) => new Error(`--calibration ${path}: ${what} (write one with percept calibrate)`);
  if (file?.kind !== 'percept.calibration' || file.version !== 1) throw bad('not a calibration file');
  if (!Array.isArray(file.levels) || file.levels.length === 0) throw bad('no levels');
  for (const [stage, values] of Object.entries(file.virtualServiceMs ?? {})) {
    if (!Array.isArray(values) || values.length !== file.levels.length || !values.every((v) => Number.isFinite(v) && v >= 0))
      throw bad(`virtualServiceMs.${stage} must hold one number >= 0 per level (${file.levels.length})`);
  }
  if (typeof file.models?.decoder !== 'string') throw bad('models.decoder is missing');
  const settings = file.decoder ?? { ngram: false, draftMax: null, kvType: 'f16', threads: null, gpuLayers: 0 };
  const max = settings.draftMax !== null ? { max: settings.draftMax } : {};
  const { draft, draftMtp } = file.models;
  const speculator: DraftChoice = draft
    ? { kind: 'model', model: draft, ...max }
    : draftMtp
      ? { kind: 'mtp', model: draftMtp, ...max }
      : settings.ngram
        ? { kind: 'ngram', ...max }
        : { kind: 'none' };
  return {
    path,
    levels: file.levels,
    serviceMs: file.virtualServiceMs,
    decoder: file.models.decoder,
    encoder: file.models.encoder ?? null,
    speculator,
    kvType: settings.kvType,
    threads: settings.threads,
    gpuLayers: settings.gpuLayers,
  };
}

const sameDraft = (a: DraftChoice, b: DraftChoice): boolean =>
  a.kind === b.kind &&
  ('model' in a ? a.model : null) === ('model' in b ? b.model : null) &&
  (('max' in a ? a.max : undefined) ?? null) === (('max' in b ? b.max : undefined) ?? null);

/** The encoder a calibration must have measured: the config's model file spec (none for projection). */
function encoderSpec(config: PerceptConfig): string | null {
  return config.encoder.kind === 'onnx' ? config.encoder.model : config.encoder.kind === 'mtmd' ? config.encoder.mmproj : null;
}

/** The calibrated service times of a point, or why no calibration measured it. */
function calibratedCost(
  calibrations: readonly Calibration[],
  knobs: PointKnobs,
  maxNewTokens: { readonly knob: number; readonly bounded: boolean },
  encoder: string | null,
): { readonly serviceMs: Record<string, number> } | { readonly knob: KnobName | 'encoder' | null; readonly why: string } {
  const on = knobs.draft.kind !== 'none';
  const settingsMatch = (c: Calibration) =>
    c.decoder === knobs.model &&
    c.encoder === encoder &&
    c.kvType === knobs.kvType &&
    c.threads === knobs.threads &&
    c.gpuLayers === knobs.gpuLayers &&
    (!on || sameDraft(c.speculator, knobs.draft));
  for (const c of calibrations.filter(settingsMatch)) {
    // A bounded grammar ends every action before any budget at or above its worst case: the cost
    // does not depend on maxNewTokens then.
    const level = c.levels.findIndex(
      (l) =>
        l.imageTokens === knobs.imageTokens &&
        (maxNewTokens.bounded || l.maxNewTokens === maxNewTokens.knob) &&
        (on ? l.draft : !l.draft || c.speculator.kind === 'none'),
    );
    if (level >= 0) return { serviceMs: Object.fromEntries(Object.entries(c.serviceMs).map(([stage, values]) => [stage, values[level]!])) };
  }
  // Why: the first knob no calibration measured at all.
  const list = (values: Iterable<unknown>) => [...new Set(values)].map(String).join(', ');
  if (!calibrations.some((c) => c.decoder === knobs.model))
    return {
      knob: 'model',
      why: `no calibration measured decoder ${knobs.model} (calibrated: ${list(calibrations.map((c) => c.decoder))})`,
    };
  if (!calibrations.some((c) => c.encoder === encoder))
    return {
      knob: 'encoder',
      why: `no calibration measured the config's encoder ${encoder ?? 'projection'} (calibrated: ${list(calibrations.map((c) => c.encoder ?? 'projection'))})`,
    };
  const settings: [KnobName, (c: Calibration) => boolean, (c: Calibration) => unknown][] = [
    ['kvType', (c) => c.kvType === knobs.kvType, (c) => c.kvType],
    ['threads', (c) => c.threads === knobs.threads, (c) => knobText('threads', c.threads)],
    ['gpuLayers', (c) => c.gpuLayers === knobs.gpuLayers, (c) => c.gpuLayers],
    ['draft', (c) => !on || sameDraft(c.speculator, knobs.draft), (c) => knobText('draft', c.speculator)],
  ];
  for (const [knob, match, show] of settings) {
    if (!calibrations.some(match))
      return {
        knob,
        why: `no calibration measured ${knob} ${knobText(knob, knobs[knob])} (calibrated: ${list(calibrations.map(show))}); it needs a calibration made with it, or --real`,
      };
  }
  if (!calibrations.some((c) => c.levels.some((l) => l.imageTokens === knobs.imageTokens)))
    return {
      knob: 'imageTokens',
      why: `no calibration measured imageTokens ${knobs.imageTokens} (calibrated: ${list(calibrations.flatMap((c) => c.levels.map((l) => l.imageTokens)))})`,
    };
  return {
    knob: null,
    why: 'no calibration measured this combination of knobs (calibrate with a config whose ladder has it, or use --real)',
  };
}

// ---- inputs, models and the state file -------------------------------------------------------------

const sha256 = (text: string): string => createHash('sha256').update(text).digest('hex');

async function sha256File(path: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

/** A model file as the state keys see it: path, size and modification time (hashing GBs per tune is too slow). */
async function fingerprint(spec: string, kind: ModelKind): Promise<string> {
  const path = await resolveModel(spec, kind);
  const { size, mtimeMs } = statSync(path);
  return `${path}:${size}:${mtimeMs}`;
}

/** The action grammar's worst case for a decoder model (null: unbounded), from its vocabulary alone. */
async function grammarWorstCase(spec: string, schema: ActionSchema): Promise<{ maxTokens: number | null; fallback: string | null }> {
  const model = await LlamaModel.load(await resolveModel(spec, 'decoder'), { vocabOnly: true });
  try {
    const grammar = await model.grammarFromJsonSchema(schema.schema);
    return { maxTokens: grammar.maxTokens, fallback: grammar.fallback };
  } finally {
    await model.dispose();
  }
}

interface StateFile {
  readonly kind: 'percept.tune-state';
  readonly version: 1;
  readonly points: Record<string, PointResult>;
  reference?: { readonly key: string; readonly frames: readonly ReferenceFrame[] };
}

interface ReferenceFrame {
  readonly stampNs: string;
  readonly tokens?: readonly number[];
  readonly action?: Record<string, unknown>;
}

function readState(path: string): StateFile {
  const empty: StateFile = { kind: 'percept.tune-state', version: 1, points: {} };
  if (!existsSync(path)) return empty;
  try {
    const state = JSON.parse(readFileSync(path, 'utf8')) as StateFile;
    if (state?.kind === 'percept.tune-state' && state.version === 1 && typeof state.points === 'object') return state;
  } catch {
    // an unreadable state is measured anew
  }
  log(`${path} is not a tune state file; measuring every point anew`);
  return empty;
}

/** Written whole to a temporary file and renamed, so a kill leaves the old state or the new one. */
function writeState(path: string, state: StateFile): void {
  writeFileSync(`${path}.partial`, `${JSON.stringify(state)}\n`);
  renameSync(`${path}.partial`, path);
}

/** The reference run as a Recording that eval's tokenAgreement reads. */
function referenceRecording(frames: readonly ReferenceFrame[]): Recording {
  const map = new Map(
    frames.map((f, frameId) => [
      frameId,
      {
        frameId,
        stampNs: BigInt(f.stampNs),
        captureNs: 0n,
        ...(f.tokens ? { tokens: f.tokens } : {}),
        ...(f.action ? { action: f.action } : {}),
      },
    ]),
  );
  return { frames: map, spans: new Map(), summary: undefined, metadata: {}, warnings: [] };
}

// ---- signals and progress ----------------------------------------------------------------------------

/** SIGINT/SIGTERM during a tune: the run in flight stops; the caller stops after it. */
class Interruption {
  signal: NodeJS.Signals | null = null;
  #graph: Graph | undefined;
  readonly #handler = (signal: NodeJS.Signals): void => {
    this.signal ??= signal;
    void this.#graph?.stop(signal);
  };

  constructor() {
    process.on('SIGINT', this.#handler);
    process.on('SIGTERM', this.#handler);
  }

  /** The graph a signal stops; one that came while it loaded stops it as soon as it runs. */
  follow(graph: Graph | undefined): void {
    this.#graph = graph;
    const signal = this.signal;
    if (graph && signal) setImmediate(() => void graph.stop(signal));
  }

  dispose(): void {
    process.off('SIGINT', this.#handler);
    process.off('SIGTERM', this.#handler);
  }
}

/** A bar over the points (on stderr; when it is not a terminal, a line every few seconds). */
function progressBar(enabled: boolean, total: number) {
  const bar = enabled
    ? new cliProgress.SingleBar(
        {
          format: 'percept tune |{bar}| {value}/{total} points | {point} {frames}',
          stream: process.stderr,
          noTTYOutput: true,
          notTTYSchedule: 5000,
          hideCursor: true,
        },
        cliProgress.Presets.shades_classic,
      )
    : undefined;
  bar?.start(total, 0, { point: '', frames: '' });
  return {
    point(label: string) {
      bar?.update({ point: label, frames: '' });
    },
    follow(graph: Graph, frames: number | undefined) {
      let done = 0;
      graph.events.subscribe((event) => {
        if (event.type === 'output' || event.type === 'drop') bar?.update({ frames: `frame ${++done}${frames ? `/${frames}` : ''}` });
      });
    },
    done() {
      bar?.increment(1, { frames: '' });
    },
    stop() {
      bar?.stop();
    },
  };
}

// ---- one run -------------------------------------------------------------------------------------------

/** Runs `config` (recording to config.recorder.path) and reads the recording; null when interrupted. */
async function replay(
  config: PerceptConfig,
  interruption: Interruption,
  follow: (graph: Graph, frames: number | undefined) => void,
): Promise<Recording | null> {
  try {
    let run: Awaited<ReturnType<typeof executeRun>>;
    try {
      run = await executeRun(config, {
        publish: false,
        liveTable: false,
        onStart: (graph, frames) => {
          interruption.follow(graph);
          follow(graph, frames);
        },
      });
    } catch (err) {
      if (interruption.signal) return null;
      throw err;
    }
    if (interruption.signal) return null;
    const { summary, failure } = run;
    // A run that dropped every frame is a measurement; a failed source or recording is not.
    if (failure && (summary.endReason === 'source_error' || summary.frames.in === 0 || failure !== runFailure(summary)))
      throw new Error(failure);
    return await readRecording(config.recorder.path);
  } finally {
    interruption.follow(undefined);
    rmSync(config.recorder.path, { force: true });
  }
}

function resultOf(point: GridPoint, ladder: Knobs, metrics: EvalMetrics, serviceMs: Record<string, number> | null): PointResult {
  const stages = Object.fromEntries(Object.entries(metrics.stages).map(([s, q]) => [s, { p50Ms: q.p50Ms, p99Ms: q.p99Ms }]));
  const measured = Object.fromEntries(Object.entries(metrics.stages).flatMap(([s, q]) => (q.p50Ms !== null ? [[s, q.p50Ms]] : [])));
  return {
    index: point.index,
    label: point.label,
    knobs: point.knobs,
    ladder,
    status: 'ok',
    error: null,
    frames: { in: metrics.frames.in, out: metrics.frames.out, dropped: metrics.frames.dropped },
    dropsByReason: metrics.drops.byReason,
    endToEnd: { p50Ms: metrics.endToEnd.p50Ms, p99Ms: metrics.endToEnd.p99Ms },
    stages,
    missRate: metrics.deadlineMissRate,
    validRate: metrics.validRate,
    accuracy: metrics.accuracy?.action ?? null,
    iou: metrics.accuracy?.meanIoU ?? null,
    agreement: metrics.tokens?.tokenAgreement ?? null,
    serviceMs: serviceMs ?? measured,
  };
}

function failedResult(point: GridPoint, ladder: Knobs, error: string): PointResult {
  return {
    index: point.index,
    label: point.label,
    knobs: point.knobs,
    ladder,
    status: 'failed',
    error,
    frames: { in: 0, out: 0, dropped: 0 },
    dropsByReason: {},
    endToEnd: { p50Ms: null, p99Ms: null },
    stages: {},
    missRate: null,
    validRate: null,
    accuracy: null,
    iou: null,
    agreement: null,
    serviceMs: {},
  };
}

// ---- the command ---------------------------------------------------------------------------------------

/** A point ready to run: its config (loaded), its key in the state file, its ladder knobs. */
interface PlannedPoint {
  readonly point: GridPoint;
  readonly config: PerceptConfig;
  readonly key: string;
  readonly ladder: Knobs;
  /** Virtual mode: the calibrated service times. */
  readonly serviceMs: Record<string, number> | null;
}

export async function tune(opts: TuneOptions): Promise<TuneResult> {
  if (!(Number.isFinite(opts.budgetMs) && opts.budgetMs > 0))
    throw new RangeError(`--budget-ms must be a number > 0, got ${opts.budgetMs}`);
  const bag = resolve(opts.bag);
  if (!statSync(bag, { throwIfNoEntry: false })?.isFile()) throw new Error(`--bag ${opts.bag}: no such file`);
  const configPath = resolve(opts.config ?? DEFAULT_CONFIG);
  const base = loadConfig(configPath);
  if (base.cameras) throw new Error(`tune runs one camera: ${configPath} has cameras`);
  const schema = loadActionSchema(base.actions.schema);
  const defaultLabels = bag.replace(/\.mcap$/, '') + '.labels.jsonl';
  const labelsPath = opts.labels ? resolve(opts.labels) : existsSync(defaultLabels) ? defaultLabels : null;
  const labels: Label[] | undefined = labelsPath ? loadLabels(labelsPath, schema) : undefined;
  const referencePath = opts.reference ? resolve(opts.reference) : null;
  const referenceBase = referencePath ? loadConfig(referencePath) : null;
  const measurable: Measurable = { labels: labels !== undefined, reference: referenceBase !== null };
  const objective = parseObjective(opts.objective, measurable);

  // Mode: virtual needs calibrations (given, or the one the config names in virtualServiceMs).
  const named = (JSON.parse(readFileSync(configPath, 'utf8')) as { virtualServiceMs?: unknown }).virtualServiceMs;
  const calibrationPaths = (opts.calibration ?? []).length
    ? opts.calibration!.map((p) => resolve(p))
    : typeof named === 'string'
      ? [resolve(dirname(configPath), named)]
      : [];
  const mode = opts.mode ?? (calibrationPaths.length > 0 ? 'virtual' : 'real');
  if (mode === 'virtual' && calibrationPaths.length === 0)
    throw new Error(
      '--virtual needs the stage costs percept calibrate measured: --calibration FILE (or a config whose virtualServiceMs names one)',
    );
  if (mode === 'real' && opts.pace === 'lockstep') throw new Error('--pace lockstep is a virtual-clock replay: use it with --virtual');
  const calibrations = mode === 'virtual' ? calibrationPaths.map(readCalibration) : [];
  const replayKind: Replay = mode === 'real' ? 'real' : opts.pace === 'recorded' ? 'virtual-recorded' : 'lockstep';

  // The grid, checked whole before anything runs.
  const grid: Grid = opts.grid ? loadGrid(resolve(opts.grid), base) : defaultGrid(base);
  const points = gridPoints(grid);
  const where = (knob: KnobName, point: GridPoint): string =>
    grid.listed.includes(knob) ? `/knobs/${knob}/${point.at[knob]}` : `(the config's ${knob})`;
  const issues = new Map<string, ConfigIssue>();
  const issue = (path: string, message: string) => issues.set(`${path}\0${message}`, { path, message });
  if (replayKind === 'lockstep' && grid.axes.edges.length > 1)
    issue('/knobs/edges', 'edge policies change nothing in a lockstep replay (no frame waits on an edge): use --pace recorded, or --real');

  const local = base.decoder.kind === 'local';
  const worst = new Map<string, { maxTokens: number | null; fallback: string | null }>();
  const files = new Map<string, string>();
  const fileOf = async (spec: string, kind: ModelKind, path: string) => {
    if (files.has(`${kind}:${spec}`)) return;
    try {
      files.set(`${kind}:${spec}`, await fingerprint(spec, kind));
    } catch (err) {
      issue(path, (err as Error).message);
    }
  };
  if (local) {
    for (const point of points) {
      const { model, draft } = point.knobs;
      await fileOf(model, 'decoder', where('model', point));
      if ('model' in draft) await fileOf(draft.model, 'decoder', where('draft', point));
      if (files.has(`decoder:${model}`) && !worst.has(model)) worst.set(model, await grammarWorstCase(model, schema));
    }
    const encoder = encoderSpec(base);
    if (encoder) await fileOf(encoder, base.encoder.kind === 'onnx' ? 'vision' : 'mmproj', '/encoder');
  }
  const maxNewTokensOf = (point: GridPoint): number | undefined => {
    const w = worst.get(point.knobs.model);
    if (!local) return point.knobs.maxNewTokens ?? base.ladder.initial.maxNewTokens;
    if (!w) return undefined;
    try {
      return actionTokenBudget(point.knobs.maxNewTokens, w.maxTokens, schema.path, w.fallback);
    } catch (err) {
      issue(
        grid.listed.includes('maxNewTokens') ? `/knobs/maxNewTokens/${point.at.maxNewTokens}` : '/decoder/maxNewTokens',
        (err as Error).message,
      );
      return undefined;
    }
  };

  const workDir = mkdtempSync(join(tmpdir(), 'percept-tune-'));
  const bagHash = await sha256File(bag);
  const inputs = { bag: bagHash, labels: labelsPath ? await sha256File(labelsPath) : null };
  const encoderFile = files.get(`vision:${encoderSpec(base)}`) ?? files.get(`mmproj:${encoderSpec(base)}`) ?? null;
  const planned: PlannedPoint[] = [];
  for (const point of points) {
    const knob = maxNewTokensOf(point);
    if (knob === undefined) continue;
    let serviceMs: Record<string, number> | null = null;
    if (mode === 'virtual') {
      const cost = calibratedCost(
        calibrations,
        point.knobs,
        { knob, bounded: worst.get(point.knobs.model)?.maxTokens != null },
        encoderSpec(base),
      );
      if ('why' in cost) {
        issue(cost.knob === null ? `(point ${point.label})` : cost.knob === 'encoder' ? '/encoder' : where(cost.knob, point), cost.why);
        continue;
      }
      serviceMs = cost.serviceMs;
    }
    const setup = {
      bag,
      budgetMs: opts.budgetMs,
      replay: replayKind,
      serviceMs: serviceMs ?? {},
      maxNewTokensKnob: knob,
      recording: join(workDir, `point-${point.index}.mcap`),
    };
    let config: PerceptConfig;
    try {
      config = loadConfig(pointConfig(base, point.knobs, setup));
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      for (const i of err.issues) issue(`(point ${point.label}) ${i.path}`, i.message);
      continue;
    }
    const { draft, model } = point.knobs;
    const modelFiles = [files.get(`decoder:${model}`), 'model' in draft ? files.get(`decoder:${draft.model}`) : null, encoderFile];
    const key = sha256(JSON.stringify({ inputs, config: { ...config, recorder: { ...config.recorder, path: '' } }, modelFiles }));
    planned.push({ point, config, key, ladder: pointLadderKnobs(point.knobs, knob), serviceMs });
  }
  if (issues.size > 0) {
    rmSync(workDir, { recursive: true, force: true });
    throw new GridError(grid.origin, [...issues.values()]);
  }

  const out = resolve(opts.out);
  const statePath = `${out.replace(/\.json$/, '')}.tune-state.json`;
  mkdirSync(dirname(out), { recursive: true });
  const state = readState(statePath);
  const interruption = new Interruption();
  const progress = progressBar(opts.progress !== false, planned.length);
  const results: PointResult[] = [];
  const resumed = new Set<number>();
  // A point measured against another reference is measured again.
  const keyOf = (plan: PlannedPoint): string => sha256(plan.key + (state.reference?.key ?? ''));
  try {
    // The reference: its decoder at its ladder's first level, every frame decoded, nothing charged.
    let reference: Recording | undefined;
    if (!referenceBase) delete state.reference;
    else {
      const refConfig = loadConfig({
        ...referenceBase,
        source: { ...planned[0]!.config.source },
        clock: 'virtual',
        lockstep: true,
        virtualServiceMs: {},
        ladder: { ...referenceBase.ladder, enabled: false, rungs: [] },
        recorder: { ...referenceBase.recorder, enabled: true, path: join(workDir, 'reference.mcap'), frames: false },
        control: { ...referenceBase.control, enabled: false },
        telemetry: { ...referenceBase.telemetry, liveTable: 'off' },
      });
      const refKey = sha256(JSON.stringify({ bag: bagHash, config: { ...refConfig, recorder: { ...refConfig.recorder, path: '' } } }));
      if (state.reference?.key !== refKey) {
        progress.point('reference');
        const recording = await replay(refConfig, interruption, (graph, frames) => progress.follow(graph, frames));
        if (!recording) throw new TuneInterrupted(interruption.signal!, 0, planned.length, statePath);
        state.reference = {
          key: refKey,
          frames: [...recording.frames.values()].map((f) => ({
            stampNs: String(f.stampNs),
            ...(f.tokens ? { tokens: f.tokens } : {}),
            ...(f.action ? { action: f.action } : {}),
          })),
        };
        writeState(statePath, state);
      }
      reference = referenceRecording(state.reference.frames);
    }
    const names = { bag, config: configPath, labels: labelsPath };
    for (const plan of planned) {
      if (interruption.signal) throw new TuneInterrupted(interruption.signal, results.length, planned.length, statePath);
      const key = keyOf(plan);
      const kept = state.points[key];
      if (kept) {
        results.push({ ...kept, index: plan.point.index, label: plan.point.label });
        resumed.add(plan.point.index);
        progress.done();
        continue;
      }
      progress.point(plan.point.label);
      let result: PointResult;
      try {
        const recording = await replay(plan.config, interruption, (graph, frames) => progress.follow(graph, frames));
        if (!recording) throw new TuneInterrupted(interruption.signal!, results.length, planned.length, statePath);
        const { metrics } = measure(
          recording,
          labels,
          { ...names, recording: plan.config.recorder.path },
          reference ? { recording: reference, name: referencePath! } : undefined,
        );
        result = resultOf(plan.point, plan.ladder, metrics, plan.serviceMs);
        state.points[key] = result;
        writeState(statePath, state);
      } catch (err) {
        if (err instanceof TuneInterrupted) throw err;
        // A point that cannot run (a model that does not load, …) is a row with its reason; it is
        // not kept, so a rerun tries it again.
        result = failedResult(plan.point, plan.ladder, (err as Error).message);
      }
      results.push(result);
      progress.done();
    }
    if (interruption.signal) throw new TuneInterrupted(interruption.signal, results.length, planned.length, statePath);
  } finally {
    progress.stop();
    interruption.dispose();
    rmSync(workDir, { recursive: true, force: true });
  }
  // Keep only this grid's points (and its reference).
  const current = new Set(planned.map(keyOf));
  for (const key of Object.keys(state.points)) if (!current.has(key)) delete state.points[key];
  writeState(statePath, state);

  const front = paretoFront(results, objective.quality);
  const chosen = choose(results, objective, opts.budgetMs);
  const ladder = chosen ? orderLadder(results, chosen, objective.quality) : [];
  if (chosen)
    writeTunedConfig(
      out,
      base,
      chosen,
      ladder.map((s) => ({ rung: s.rung, point: results.find((r) => r.index === s.index)! })),
      opts.budgetMs,
    );
  return {
    kind: 'percept.tune',
    version: 1,
    bag,
    config: configPath,
    labels: labelsPath,
    reference: referencePath,
    grid: grid.origin,
    mode,
    replay: replayKind,
    calibrations: calibrations.map((c) => c.path),
    budgetMs: opts.budgetMs,
    objective: objective.text,
    quality: objective.quality,
    points: results.map((r) => ({
      ...r,
      pareto: front.has(r.index),
      feasible: feasible(r, objective, opts.budgetMs),
      resumed: resumed.has(r.index),
    })),
    ran: results.length - resumed.size,
    resumed: resumed.size,
    chosen: chosen ? { index: chosen.index, label: chosen.label, knobs: chosen.knobs } : null,
    ladder,
    out: chosen ? out : null,
    state: statePath,
  };
}

// ---- the written config ----------------------------------------------------------------------------------

const CONFIG_SCHEMA = new URL('../configs/percept.schema.json', import.meta.url).pathname;

/** `path` relative to `dir` when the two share a folder below the root (a config next to its models
 * and bags moves with them), else absolute. */
function relativeWithin(dir: string, path: string): string {
  const rel = relative(dir, path);
  const up = rel.split(sep).filter((part) => part === '..').length;
  return up < dir.split(sep).filter(Boolean).length ? rel : path;
}

/**
 * The base config with the chosen point's knobs, the budget and the ladder below it; each level's
 * stage costs as virtualServiceMs (so a lockstep replay charges what the tune measured). Paths are
 * written relative to the file. Validated by loadConfig once written.
 */
function writeTunedConfig(
  out: string,
  base: PerceptConfig,
  chosen: PointResult,
  rungs: readonly { rung: Partial<Knobs>; point: PointResult }[],
  budgetMs: number,
): void {
  const levels = [chosen, ...rungs.map((r) => r.point)];
  const stages = [...new Set(levels.flatMap((l) => Object.keys(l.serviceMs)))];
  const config: Record<string, unknown> = {
    $schema: relativeWithin(dirname(out), CONFIG_SCHEMA),
    ...base,
    decoder: pointDecoder(base.decoder, chosen.knobs),
    edges: chosen.knobs.edges,
    budgets: budgetsFor(base.budgets, budgetMs),
    ladder: { ...base.ladder, enabled: true, initial: chosen.ladder, rungs: rungs.map((r) => r.rung) },
    virtualServiceMs: Object.fromEntries(stages.map((s) => [s, levels.map((l) => l.serviceMs[s] ?? 0)])),
  };
  for (const keys of PATH_FIELDS) {
    const parent = keys.slice(0, -1).reduce<unknown>((node, key) => (node as Record<string, unknown> | undefined)?.[key], config) as
      Record<string, unknown> | undefined;
    const value = parent?.[keys.at(-1)!];
    if (typeof value === 'string' && isAbsolute(value)) parent![keys.at(-1)!] = relativeWithin(dirname(out), value);
  }
  const text = `${JSON.stringify(config, null, 2)}\n`;
  writeFileSync(out, text);
  try {
    loadConfig(out);
  } catch (err) {
    throw new Error(`tune wrote ${out} but it does not load: ${(err as Error).message}`, { cause: err });
  }
}

/** The report printed after a tune (the Pareto table and what was chosen). */
export function formatTune(result: TuneResult): string {
  const measurable: Measurable = { labels: result.labels !== null, reference: result.reference !== null };
  const objective = parseObjective(result.objective, measurable);
  const chosen = result.points.find((p) => p.index === result.chosen?.index);
  const table = formatTable({
    results: result.points,
    front: new Set(result.points.filter((p) => p.pareto).map((p) => p.index)),
    chosen,
    objective,
    budgetMs: result.budgetMs,
    measurable,
  });
  const q = (v: number | null) => (v === null ? '-' : v.toFixed(3));
  const lines = [
    table,
    '',
    `'*' Pareto front (${result.quality} against end-to-end p99), '>' chosen; ${result.points.length} points: ${result.ran} measured, ${result.resumed} from ${result.state}`,
    `mode       ${result.mode} (${result.replay === 'real' ? 'real clock, the bag at its recorded pace' : result.replay === 'lockstep' ? 'virtual clock, lockstep, calibrated stage costs' : 'virtual clock, recorded pace, calibrated stage costs'})${result.calibrations.length ? `: ${result.calibrations.join(', ')}` : ''}`,
    `objective  ${result.objective}, budget ${result.budgetMs} ms`,
  ];
  if (!chosen) {
    lines.push('chosen     none: no point meets the constraints; nothing written');
    return `${lines.join('\n')}\n`;
  }
  lines.push(
    `chosen     ${knobsText(chosen.knobs)} (${result.quality} ${q(metricOf(chosen, result.quality))}, p99 ${chosen.endToEnd.p99Ms?.toFixed(1)} ms)`,
  );
  result.ladder.forEach((step, i) =>
    lines.push(
      `ladder ${i + 1}   ${rungText(step.rung)}: saves ${step.savedMs.toFixed(1)} ms for ${q(step.qualityLost)} ${result.quality} (${step.msPerUnit === null ? 'no loss' : `${step.msPerUnit.toFixed(1)} ms per unit`})`,
    ),
  );
  if (result.ladder.length === 0) lines.push('ladder     no measured point is faster within reach of the ladder');
  lines.push(`wrote      ${result.out}`);
  return `${lines.join('\n')}\n`;
}
